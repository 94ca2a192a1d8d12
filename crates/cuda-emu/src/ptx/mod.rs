//! PTX text to a decoded module: every function's instructions with
//! register names resolved to slot numbers, labels to instruction indices,
//! and symbols to addresses, so the interpreter never looks at a string.
//!
//! Three stages: `lex` turns text into tokens, `parse` turns tokens
//! into functions of raw statements (names still strings), and `decode`
//! resolves the names and turns each statement into an [`Ins`].

mod decode;
mod lex;
mod parse;

pub use decode::load;

/// A PTX type of an instruction or register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ty {
    B8,
    B16,
    B32,
    B64,
    U8,
    U16,
    U32,
    U64,
    S8,
    S16,
    S32,
    S64,
    F16,
    Bf16,
    F32,
    F64,
    Pred,
}

impl Ty {
    fn parse(s: &str) -> Option<Ty> {
        Some(match s {
            "b8" => Ty::B8,
            "b16" => Ty::B16,
            "b32" => Ty::B32,
            "b64" => Ty::B64,
            "u8" => Ty::U8,
            "u16" => Ty::U16,
            "u32" => Ty::U32,
            "u64" => Ty::U64,
            "s8" => Ty::S8,
            "s16" => Ty::S16,
            "s32" => Ty::S32,
            "s64" => Ty::S64,
            "f16" => Ty::F16,
            "bf16" => Ty::Bf16,
            "f32" => Ty::F32,
            "f64" => Ty::F64,
            "pred" => Ty::Pred,
            _ => return None,
        })
    }

    /// Size in bytes in memory.
    pub fn size(self) -> u32 {
        match self {
            Ty::B8 | Ty::U8 | Ty::S8 | Ty::Pred => 1,
            Ty::B16 | Ty::U16 | Ty::S16 | Ty::F16 | Ty::Bf16 => 2,
            Ty::B32 | Ty::U32 | Ty::S32 | Ty::F32 => 4,
            Ty::B64 | Ty::U64 | Ty::S64 | Ty::F64 => 8,
        }
    }

    /// Whether the type is a signed integer.
    pub fn signed(self) -> bool {
        matches!(self, Ty::S8 | Ty::S16 | Ty::S32 | Ty::S64)
    }

    /// Whether the type is a float.
    pub fn float(self) -> bool {
        matches!(self, Ty::F16 | Ty::Bf16 | Ty::F32 | Ty::F64)
    }
}

/// An operand: a register slot or an immediate (symbols are resolved to
/// immediates at decode time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opnd {
    R(u16),
    I(u64),
}

/// A state space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    Global,
    Shared,
    Local,
    Param,
    Const,
    Generic,
}

/// `[base + off]`.
#[derive(Debug, Clone, Copy)]
pub struct Addr {
    pub base: Opnd,
    pub off: i64,
}

/// Rounding modes of float arithmetic and conversions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rnd {
    /// No modifier (the default for the type).
    None,
    Rn,
    Rz,
    Rm,
    Rp,
    Rni,
    Rzi,
    Rmi,
    Rpi,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    MulHi,
    MulWide,
    Div,
    Rem,
    Min,
    Max,
    /// `copysign.f32/f64 d, a, b`: the magnitude of `b` with the sign of `a`.
    CopySign,
    And,
    Or,
    Xor,
    Shl,
    Shr,
    /// `add.cc` / `sub.cc` / `addc` / `subc` with their carry flags.
    AddCc {
        carry_in: bool,
        carry_out: bool,
    },
    SubCc {
        carry_in: bool,
        carry_out: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnOp {
    Neg,
    Not,
    Abs,
    Mov,
    Rcp { approx: bool },
    Sqrt { approx: bool },
    Rsqrt,
    Ex2,
    Lg2,
    Sin,
    Cos,
    Clz,
    Popc,
    Brev,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Equ,
    Neu,
    Ltu,
    Leu,
    Gtu,
    Geu,
    Num,
    Nan,
    Lo,
    Ls,
    Hi,
    Hs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoolOp {
    And,
    Or,
    Xor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomOp {
    Add,
    /// `add.noftz.f16x2` / `add.noftz.bf16x2`: two halves of a 32-bit word
    /// (`t` is `b32`), each the sum rounded to nearest, ties to even.
    AddHalf2 {
        bf16: bool,
    },
    Min,
    Max,
    Inc,
    Dec,
    And,
    Or,
    Xor,
    Exch,
    Cas,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShflMode {
    Up,
    Down,
    Bfly,
    Idx,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoteMode {
    All,
    Any,
    Uni,
    Ballot,
}

/// One decoded instruction.
#[derive(Debug, Clone)]
pub enum Ins {
    Bin {
        op: BinOp,
        t: Ty,
        ftz: bool,
        rnd: Rnd,
        d: u16,
        a: Opnd,
        b: Opnd,
    },
    Un {
        op: UnOp,
        t: Ty,
        ftz: bool,
        d: u16,
        a: Opnd,
    },
    /// `fma` / `mad` on floats.
    Fma {
        t: Ty,
        rnd: Rnd,
        ftz: bool,
        d: u16,
        a: Opnd,
        b: Opnd,
        c: Opnd,
    },
    /// Integer `mad.lo/hi/wide`, optionally with carry.
    Mad {
        t: Ty,
        hi: bool,
        wide: bool,
        cc_in: bool,
        cc_out: bool,
        d: u16,
        a: Opnd,
        b: Opnd,
        c: Opnd,
    },
    Setp {
        cmp: Cmp,
        t: Ty,
        ftz: bool,
        d: u16,
        dn: Option<u16>,
        a: Opnd,
        b: Opnd,
        comb: Option<(BoolOp, Opnd, bool)>,
    },
    Selp {
        t: Ty,
        d: u16,
        a: Opnd,
        b: Opnd,
        p: Opnd,
    },
    /// Logical ops on predicates.
    PredBin {
        op: BoolOp,
        d: u16,
        a: Opnd,
        b: Opnd,
    },
    PredNot {
        d: u16,
        a: Opnd,
    },
    Cvt {
        dt: Ty,
        st: Ty,
        rnd: Rnd,
        sat: bool,
        ftz: bool,
        d: u16,
        a: Opnd,
    },
    /// `cvt.rn.f16x2.f32` / `cvt.rn.bf16x2.f32 d, a, b`: `a` converted to
    /// the upper half of `d`, `b` to the lower.
    CvtPack {
        bf16: bool,
        rnd: Rnd,
        d: u16,
        a: Opnd,
        b: Opnd,
    },
    /// `cvta` between a state space and generic addresses.
    Cvta {
        to: bool,
        sp: Space,
        d: u16,
        a: Opnd,
    },
    Ld {
        sp: Space,
        t: Ty,
        n: u8,
        d: [u16; 4],
        addr: Addr,
        /// The destination is a 64-bit register: a signed load narrower
        /// than that sign-extends to 64 bits, not 32.
        wide: bool,
    },
    St {
        sp: Space,
        t: Ty,
        n: u8,
        v: [Opnd; 4],
        addr: Addr,
    },
    /// `atom` (with destinations) or `red` (without): `n` (1, 2 or 4)
    /// elements of type `t` side by side, each an atomic of its own with
    /// operand `b[k]` (and `c`, a `cas`'s new value), `d[k]` its old value.
    Atom {
        sp: Space,
        op: AtomOp,
        t: Ty,
        n: u8,
        d: Option<[u16; 4]>,
        addr: Addr,
        b: [Opnd; 4],
        c: Opnd,
    },
    Prmt {
        d: u16,
        a: Opnd,
        b: Opnd,
        c: Opnd,
    },
    /// `lop3.b32`: any function of three inputs, bit by bit, given by its
    /// truth table `lut` (the immediate operand).
    Lop3 {
        d: u16,
        a: Opnd,
        b: Opnd,
        c: Opnd,
        lut: u8,
    },
    Bfi {
        t: Ty,
        d: u16,
        a: Opnd,
        b: Opnd,
        pos: Opnd,
        len: Opnd,
    },
    Bfe {
        t: Ty,
        d: u16,
        a: Opnd,
        pos: Opnd,
        len: Opnd,
    },
    Bra {
        target: u32,
    },
    Bar,
    /// `bar.warp.sync`: orders the lanes of the mask, as a shuffle does.
    WarpSync {
        mask: Opnd,
    },
    Shfl {
        mode: ShflMode,
        d: u16,
        dp: Option<u16>,
        a: Opnd,
        b: Opnd,
        c: Opnd,
        mask: Opnd,
    },
    Vote {
        mode: VoteMode,
        d: u16,
        a: Opnd,
        neg: bool,
        mask: Opnd,
    },
    /// `mov` of a vector into one wider register: element `k` at bits `k * w`.
    Pack {
        d: u16,
        n: u8,
        w: u8,
        v: [Opnd; 4],
    },
    /// `mov` of a register into a vector of narrower registers.
    Unpack {
        d: [u16; 4],
        n: u8,
        w: u8,
        a: Opnd,
    },
    /// `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32`:
    /// the warp's fragments of A (16 x 16, four b32 registers a lane, two
    /// halves each), B (16 x 8, two) and C (16 x 8 f32, four) give
    /// D = A B + C (four f32 a lane), in the PTX ISA's fragment layouts. A
    /// warp collective: every lane of the warp must execute it together.
    Mma {
        bf16: bool,
        d: [u16; 4],
        a: [u16; 4],
        b: [u16; 2],
        c: [u16; 4],
    },
    /// `ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16`: `n`
    /// 8 x 8 matrices of 16-bit elements, each row 16 bytes at the address
    /// one lane gives (lanes 8i..8i+7 the rows of matrix i), spread over
    /// the warp as mma fragments (lane l gets row l / 4, elements 2 (l % 4)
    /// and 2 (l % 4) + 1, of each matrix, or of its transpose). A warp
    /// collective, like `Mma`.
    Ldmatrix {
        n: u8,
        trans: bool,
        d: [u16; 4],
        addr: Addr,
    },
    /// Writes the address of the frame's `.local` depot.
    Depot {
        d: u16,
    },
    Call {
        func: u32,
        ret: Option<u32>,
        args: Vec<u32>,
    },
    Ret,
    Exit,
    /// Memory fences and other instructions with no effect in this
    /// sequentially consistent machine.
    Nop,
}

impl Ins {
    /// Calls `f(register, written)` for each register the instruction
    /// reads (`false`) and writes (`true`), reads first. Exhaustive, so a
    /// new instruction cannot be left out of the decoder's dataflow.
    pub fn for_each_reg(&self, mut f: impl FnMut(u16, bool)) {
        let mut r = |o: &Opnd| {
            if let Opnd::R(x) = o {
                f(*x, false);
            }
        };
        match self {
            Ins::Bin { a, b, .. } | Ins::PredBin { a, b, .. } | Ins::CvtPack { a, b, .. } => {
                r(a);
                r(b);
            }
            Ins::Un { a, .. } | Ins::PredNot { a, .. } | Ins::Cvt { a, .. } | Ins::Cvta { a, .. } => r(a),
            Ins::Unpack { a, .. } => r(a),
            Ins::Fma { a, b, c, .. }
            | Ins::Mad { a, b, c, .. }
            | Ins::Prmt { a, b, c, .. }
            | Ins::Lop3 { a, b, c, .. } => {
                r(a);
                r(b);
                r(c);
            }
            Ins::Setp { a, b, comb, .. } => {
                r(a);
                r(b);
                if let Some((_, c, _)) = comb {
                    r(c);
                }
            }
            Ins::Selp { a, b, p, .. } => {
                r(a);
                r(b);
                r(p);
            }
            Ins::Bfi { a, b, pos, len, .. } => {
                r(a);
                r(b);
                r(pos);
                r(len);
            }
            Ins::Bfe { a, pos, len, .. } => {
                r(a);
                r(pos);
                r(len);
            }
            Ins::Ld { addr, .. } => r(&addr.base),
            Ins::St { v, n, addr, .. } => {
                r(&addr.base);
                v.iter().take(*n as usize).for_each(&mut r);
            }
            Ins::Atom { addr, n, b, c, .. } => {
                r(&addr.base);
                b.iter().take(*n as usize).for_each(&mut r);
                r(c);
            }
            Ins::WarpSync { mask } => r(mask),
            Ins::Shfl { a, b, c, mask, .. } => {
                r(a);
                r(b);
                r(c);
                r(mask);
            }
            Ins::Vote { a, mask, .. } => {
                r(a);
                r(mask);
            }
            Ins::Pack { v, n, .. } => v.iter().take(*n as usize).for_each(&mut r),
            Ins::Mma { a, b, c, .. } => {
                for x in a.iter().chain(b).chain(c) {
                    f(*x, false);
                }
            }
            Ins::Ldmatrix { addr, .. } => r(&addr.base),
            Ins::Depot { .. } | Ins::Bra { .. } | Ins::Bar | Ins::Call { .. } | Ins::Ret | Ins::Exit | Ins::Nop => {}
        }
        match self {
            Ins::Bin { d, .. }
            | Ins::Un { d, .. }
            | Ins::Fma { d, .. }
            | Ins::Mad { d, .. }
            | Ins::Selp { d, .. }
            | Ins::PredBin { d, .. }
            | Ins::PredNot { d, .. }
            | Ins::Cvt { d, .. }
            | Ins::CvtPack { d, .. }
            | Ins::Cvta { d, .. }
            | Ins::Prmt { d, .. }
            | Ins::Lop3 { d, .. }
            | Ins::Bfi { d, .. }
            | Ins::Bfe { d, .. }
            | Ins::Vote { d, .. }
            | Ins::Pack { d, .. }
            | Ins::Depot { d } => f(*d, true),
            Ins::Setp { d, dn, .. } | Ins::Shfl { d, dp: dn, .. } => {
                f(*d, true);
                if let Some(x) = dn {
                    f(*x, true);
                }
            }
            Ins::Ld { d, n, .. } | Ins::Unpack { d, n, .. } | Ins::Ldmatrix { d, n, .. } => {
                d.iter().take(*n as usize).for_each(|&x| f(x, true))
            }
            Ins::Mma { d, .. } => d.iter().for_each(|&x| f(x, true)),
            Ins::Atom { d, n, .. } => {
                if let Some(d) = d {
                    d.iter().take(*n as usize).for_each(|&x| f(x, true));
                }
            }
            Ins::St { .. }
            | Ins::WarpSync { .. }
            | Ins::Bra { .. }
            | Ins::Bar
            | Ins::Call { .. }
            | Ins::Ret
            | Ins::Exit
            | Ins::Nop => {}
        }
    }
}

/// An instruction with its guard predicate (`@%p` / `@!%p`).
#[derive(Debug, Clone)]
pub struct Inst {
    pub guard: Option<(u16, bool)>,
    pub ins: Ins,
    /// The source line, for messages.
    pub line: u32,
}

/// A parameter of an entry or function.
#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    /// Byte offset in the frame's parameter area.
    pub offset: u32,
    pub size: u32,
    pub align: u32,
}

/// A decoded function or kernel.
#[derive(Debug, Clone)]
pub struct Func {
    pub name: String,
    pub entry: bool,
    pub params: Vec<Param>,
    pub ret: Option<Param>,
    pub insts: Vec<Inst>,
    pub nregs: usize,
    /// Size of the parameter area (own params, return value, call-site params).
    pub param_size: u32,
    pub local_size: u32,
    pub local_align: u32,
    /// Static shared memory of a launch of this function: the module's
    /// variables and the function's own.
    pub shared_size: u32,
    /// Whether the body has a body (a `.func` declaration has none).
    pub defined: bool,
    /// `.maxntid` when given.
    pub maxntid: Option<u32>,
    /// The registers some lane may read before writing them on its path
    /// from the entry (found at decode, by a must-write dataflow over the
    /// control flow graph): the only ones a block must zero at its start,
    /// so a later block never sees an earlier block's values. The others
    /// keep whatever the worker's previous block left, unread.
    pub zeroed: Vec<u16>,
    /// What a later stage derives from the function once and keeps with
    /// it: the interpreter's lowered instructions (`exec::lower`), made
    /// when the function first runs.
    pub derived: Derived,
}

/// A value a later stage derives from a [`Func`] once, opaque here so that
/// the parser depends on nothing above it. A clone starts empty (it is a
/// cache: the clone derives its own).
#[derive(Default)]
pub struct Derived(std::sync::OnceLock<Box<dyn std::any::Any + Send + Sync>>);

impl Derived {
    /// The value kept, made by `make` at the first call; None when the
    /// value kept is of another type than `T`.
    pub fn get_or_init<T: std::any::Any + Send + Sync>(&self, make: impl FnOnce() -> T) -> Option<&T> {
        self.0.get_or_init(|| Box::new(make())).downcast_ref()
    }
}

impl Clone for Derived {
    fn clone(&self) -> Derived {
        Derived::default()
    }
}

impl std::fmt::Debug for Derived {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() { "Derived(made)" } else { "Derived(empty)" })
    }
}

/// Module-scope data (`.global`, `.const`): bytes with an initialiser.
#[derive(Debug, Clone)]
pub struct Global {
    pub name: String,
    pub space: Space,
    pub align: u32,
    pub init: Vec<u8>,
}

/// A parsed and decoded module.
#[derive(Debug, Clone, Default)]
pub struct Module {
    pub funcs: Vec<Func>,
    pub globals: Vec<Global>,
    /// Static shared memory: `(name, offset)`; `shared_size` in total.
    pub shared: Vec<(String, u32)>,
    pub shared_size: u32,
    /// Offset of the `.extern .shared` array, the start of dynamic shared memory.
    pub dyn_shared: Option<String>,
    /// Opcodes (with their type suffixes) that the decoder does not know.
    pub unsupported: Vec<String>,
    /// The device address given to each of `globals`, in order.
    pub global_addrs: Vec<u64>,
}

/// Number of register slots reserved for special registers.
pub const NSPECIAL: u16 = 16;
/// Slots of the special registers, in order.
pub const SPECIALS: [&str; 16] = [
    "%tid.x",
    "%tid.y",
    "%tid.z",
    "%ntid.x",
    "%ntid.y",
    "%ntid.z",
    "%ctaid.x",
    "%ctaid.y",
    "%ctaid.z",
    "%nctaid.x",
    "%nctaid.y",
    "%nctaid.z",
    "%laneid",
    "%warpid",
    "%nwarpid",
    "%warpsize",
];
