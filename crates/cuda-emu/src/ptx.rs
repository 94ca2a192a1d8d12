//! PTX text to a decoded module: every function's instructions with
//! register names resolved to slot numbers, labels to instruction indices,
//! and symbols to addresses, so the interpreter never looks at a string.

use std::collections::HashMap;

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
        /// A signed load narrower than 64 bits into 64-bit registers,
        /// which PTX sign-extends to the register's width.
        sext64: bool,
    },
    St {
        sp: Space,
        t: Ty,
        n: u8,
        v: [Opnd; 4],
        addr: Addr,
    },
    Atom {
        sp: Space,
        op: AtomOp,
        t: Ty,
        d: Option<u16>,
        addr: Addr,
        b: Opnd,
        c: Opnd,
    },
    Prmt {
        d: u16,
        a: Opnd,
        b: Opnd,
        c: Opnd,
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
/// `WARP_SZ`, the one constant PTX names.
const WARP_SZ: &str = "WARP_SZ";

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Id(String),
    Num(String),
    Str,
    P(char),
}

struct Lexed {
    toks: Vec<Tok>,
    lines: Vec<u32>,
}

fn lex(src: &str) -> Result<Lexed, String> {
    let b = src.as_bytes();
    let mut i = 0;
    let mut line = 1u32;
    let mut toks = Vec::new();
    let mut lines = Vec::new();
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                if b[i] == b'\n' {
                    line += 1;
                }
                i += 1;
            }
            i += 2;
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += 1;
            }
            i += 1;
            toks.push(Tok::Str);
            lines.push(line);
        } else if c.is_ascii_digit() {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                i += 1;
            }
            toks.push(Tok::Num(src[s..i].to_string()));
            lines.push(line);
        } else if c.is_ascii_alphabetic() || matches!(c, b'_' | b'%' | b'$' | b'.') {
            let s = i;
            i += 1;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || matches!(b[i], b'_' | b'$' | b'.')) {
                i += 1;
            }
            toks.push(Tok::Id(src[s..i].to_string()));
            lines.push(line);
        } else if b",;:[](){}+-|!@<>=".contains(&c) {
            toks.push(Tok::P(c as char));
            lines.push(line);
            i += 1;
        } else {
            return Err(format!("line {line}: unexpected character {:?}", c as char));
        }
    }
    Ok(Lexed { toks, lines })
}

/// Parses an integer literal (decimal, hex, octal) or a PTX float literal
/// (`0fXXXXXXXX`, `0dXXXXXXXXXXXXXXXX`) to its bits.
fn parse_num(s: &str) -> Option<u64> {
    let s = s.strip_suffix('U').unwrap_or(s);
    if let Some(h) = s.strip_prefix("0f").or_else(|| s.strip_prefix("0F")) {
        return u32::from_str_radix(h, 16).ok().map(u64::from);
    }
    if let Some(h) = s.strip_prefix("0d").or_else(|| s.strip_prefix("0D")) {
        return u64::from_str_radix(h, 16).ok();
    }
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return u64::from_str_radix(h, 16).ok();
    }
    if s.contains('.') || s.contains('e') {
        return s.parse::<f64>().ok().map(f64::to_bits);
    }
    if s.len() > 1 && s.starts_with('0') {
        return u64::from_str_radix(&s[1..], 8).ok();
    }
    s.parse::<u64>().ok()
}

/// A raw operand before symbol resolution.
#[derive(Debug, Clone)]
enum Raw {
    Reg(String),
    Num(u64),
    Sym(String),
    Mem(Box<Raw>, i64),
    Vec(Vec<Raw>),
    Pair(String, String),
    Not(Box<Raw>),
}

struct RawInst {
    guard: Option<(String, bool)>,
    op: String,
    args: Vec<Raw>,
    line: u32,
}

enum Stmt {
    Label(String),
    Inst(RawInst),
    /// A `.param` declared in the body (call sites): name, size, align.
    Param(String, u32, u32),
    Local(String, u32, u32),
    Shared(String, u32, u32),
    /// Registers declared 64-bit: a name, or a prefix and the count of a
    /// `%rd<N>` range.
    Wide(String, Option<u32>),
}

struct RawFunc {
    name: String,
    entry: bool,
    params: Vec<(String, u32, u32)>,
    ret: Option<(String, u32, u32)>,
    body: Option<Vec<Stmt>>,
    maxntid: Option<u32>,
}

struct Parser {
    toks: Vec<Tok>,
    lines: Vec<u32>,
    i: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.i)
    }
    fn line(&self) -> u32 {
        self.lines.get(self.i).or(self.lines.last()).copied().unwrap_or(0)
    }
    fn next(&mut self) -> Result<Tok, String> {
        let t = self.toks.get(self.i).cloned().ok_or("unexpected end of PTX")?;
        self.i += 1;
        Ok(t)
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::P(c)) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("line {}: expected {c:?}, found {:?}", self.line(), self.peek()))
        }
    }
    fn id(&mut self) -> Result<String, String> {
        match self.next()? {
            Tok::Id(s) => Ok(s),
            t => Err(format!("line {}: expected a name, found {t:?}", self.line())),
        }
    }
    fn num(&mut self) -> Result<u64, String> {
        let neg = self.eat('-');
        match self.next()? {
            Tok::Num(s) => {
                let v = parse_num(&s).ok_or_else(|| format!("line {}: bad number {s}", self.line()))?;
                Ok(if neg { v.wrapping_neg() } else { v })
            }
            t => Err(format!("line {}: expected a number, found {t:?}", self.line())),
        }
    }
    fn skip_to_semi(&mut self) -> Result<(), String> {
        while !self.eat(';') {
            self.next()?;
        }
        Ok(())
    }

    /// `.align N? .type name ([N])?` after a state space; returns
    /// (name, element type, count or None, align).
    fn var_decl(&mut self) -> Result<(String, Ty, Option<u64>, u32), String> {
        let mut align = 0u32;
        let mut ty = None;
        loop {
            match self.peek() {
                Some(Tok::Id(s)) if s == ".align" => {
                    self.i += 1;
                    align = self.num()? as u32;
                }
                Some(Tok::Id(s)) if s.starts_with('.') => {
                    let s = s.clone();
                    self.i += 1;
                    if let Some(t) = Ty::parse(&s[1..]) {
                        ty = Some(t);
                    } else if s.starts_with(".v") {
                        // Vector variables are not emitted by NVRTC for these kernels.
                        return Err(format!("line {}: vector variables are not supported", self.line()));
                    }
                }
                _ => break,
            }
        }
        let ty = ty.ok_or_else(|| format!("line {}: declaration without a type", self.line()))?;
        let name = self.id()?;
        let count = if self.eat('[') {
            if self.eat(']') {
                Some(0)
            } else {
                let n = self.num()?;
                self.expect(']')?;
                Some(n)
            }
        } else {
            None
        };
        if align == 0 {
            align = ty.size();
        }
        Ok((name, ty, count, align))
    }

    fn param_list(&mut self) -> Result<Vec<(String, u32, u32)>, String> {
        let mut out = Vec::new();
        self.expect('(')?;
        if self.eat(')') {
            return Ok(out);
        }
        loop {
            let sp = self.id()?;
            if sp != ".param" && sp != ".reg" {
                return Err(format!("line {}: expected .param, found {sp}", self.line()));
            }
            let (name, ty, count, align) = self.var_decl()?;
            let size = ty.size() * count.unwrap_or(1).max(1) as u32;
            out.push((name, size, align));
            if self.eat(')') {
                return Ok(out);
            }
            self.expect(',')?;
        }
    }

    fn operand(&mut self) -> Result<Raw, String> {
        if self.eat('[') {
            let base = if matches!(self.peek(), Some(Tok::Num(_)) | Some(Tok::P('-'))) {
                Raw::Num(self.num()?)
            } else {
                let n = self.id()?;
                if n.starts_with('%') {
                    Raw::Reg(n)
                } else {
                    Raw::Sym(n)
                }
            };
            let mut off = 0i64;
            // `[r+8]` or `[r+-4]` (num() reads the sign), or `[r-4]`.
            if self.eat('+') || matches!(self.peek(), Some(Tok::P('-'))) {
                off = self.num()? as i64;
            }
            self.expect(']')?;
            return Ok(Raw::Mem(Box::new(base), off));
        }
        if self.eat('{') {
            let mut v = Vec::new();
            loop {
                v.push(self.operand()?);
                if self.eat('}') {
                    return Ok(Raw::Vec(v));
                }
                self.expect(',')?;
            }
        }
        if self.eat('!') {
            return Ok(Raw::Not(Box::new(self.operand()?)));
        }
        if matches!(self.peek(), Some(Tok::Num(_)) | Some(Tok::P('-'))) {
            return Ok(Raw::Num(self.num()?));
        }
        let n = self.id()?;
        if n.starts_with('%') {
            if self.eat('|') {
                let p = self.id()?;
                return Ok(Raw::Pair(n, p));
            }
            Ok(Raw::Reg(n))
        } else if n == WARP_SZ {
            Ok(Raw::Num(32))
        } else {
            Ok(Raw::Sym(n))
        }
    }

    fn body(&mut self) -> Result<Vec<Stmt>, String> {
        let mut out = Vec::new();
        // Registers declared in a nested `{ }` scope (inline asm declares
        // `%r1` there, shadowing the function's `%r1`) get a name of their own.
        let mut scopes: Vec<HashMap<String, String>> = vec![HashMap::new()];
        let mut nscopes = 0usize;
        let rename = |scopes: &[HashMap<String, String>], mut ri: RawInst| -> RawInst {
            fn walk(r: &mut Raw, scopes: &[HashMap<String, String>]) {
                let look = |n: &mut String| {
                    if let Some(m) = scopes.iter().rev().find_map(|s| s.get(n.as_str())) {
                        *n = m.clone();
                    }
                };
                match r {
                    Raw::Reg(n) => look(n),
                    Raw::Pair(a, b) => {
                        look(a);
                        look(b);
                    }
                    Raw::Mem(b, _) | Raw::Not(b) => walk(b, scopes),
                    Raw::Vec(v) => v.iter_mut().for_each(|x| walk(x, scopes)),
                    Raw::Num(_) | Raw::Sym(_) => {}
                }
            }
            if scopes.len() > 1 {
                for a in &mut ri.args {
                    walk(a, scopes);
                }
                if let Some((p, _)) = &mut ri.guard {
                    if let Some(m) = scopes.iter().rev().find_map(|s| s.get(p.as_str())) {
                        *p = m.clone();
                    }
                }
            }
            ri
        };
        loop {
            let line = self.line();
            match self.next()? {
                Tok::P('{') => {
                    scopes.push(HashMap::new());
                }
                Tok::P('}') => {
                    scopes.pop();
                    if scopes.is_empty() {
                        return Ok(out);
                    }
                }
                Tok::P('@') => {
                    let neg = self.eat('!');
                    let p = self.id()?;
                    let op = self.id()?;
                    let ri = self.inst_rest(Some((p, neg)), op, line)?;
                    out.push(Stmt::Inst(rename(&scopes, ri)));
                }
                Tok::Id(s) if s == ".reg" => {
                    let nested = scopes.len() > 1;
                    if nested {
                        nscopes += 1;
                    }
                    let mut wide = false;
                    while !self.eat(';') {
                        match self.next()? {
                            Tok::Id(t) if matches!(t.as_str(), ".b64" | ".s64" | ".u64") => wide = true,
                            Tok::Id(n) if n.starts_with('%') => {
                                let n = if nested {
                                    let unique = format!("{n}#{nscopes}");
                                    scopes.last_mut().expect("internal: a scope").insert(n, unique.clone());
                                    unique
                                } else {
                                    n
                                };
                                let count = if self.eat('<') {
                                    let c = self.num()? as u32;
                                    self.expect('>')?;
                                    Some(c)
                                } else {
                                    None
                                };
                                if wide {
                                    out.push(Stmt::Wide(n, count));
                                }
                            }
                            _ => {}
                        }
                    }
                }
                Tok::Id(s) if s == ".pragma" || s == ".loc" || s == ".file" => self.skip_to_semi()?,
                Tok::Id(s) if s == ".param" => {
                    let (name, ty, count, align) = self.var_decl()?;
                    self.expect(';')?;
                    out.push(Stmt::Param(name, ty.size() * count.unwrap_or(1).max(1) as u32, align));
                }
                Tok::Id(s) if s == ".local" => {
                    let (name, ty, count, align) = self.var_decl()?;
                    self.expect(';')?;
                    out.push(Stmt::Local(name, ty.size() * count.unwrap_or(1).max(1) as u32, align));
                }
                Tok::Id(s) if s == ".shared" => {
                    // A "demoted" variable: a function-scope static __shared__.
                    let (name, ty, count, align) = self.var_decl()?;
                    self.expect(';')?;
                    out.push(Stmt::Shared(name, ty.size() * count.unwrap_or(1).max(1) as u32, align));
                }
                Tok::Id(s) => {
                    if self.eat(':') {
                        out.push(Stmt::Label(s));
                    } else {
                        let ri = self.inst_rest(None, s, line)?;
                        out.push(Stmt::Inst(rename(&scopes, ri)));
                    }
                }
                t => return Err(format!("line {line}: unexpected {t:?} in a function body")),
            }
        }
    }

    fn inst_rest(&mut self, guard: Option<(String, bool)>, op: String, line: u32) -> Result<RawInst, String> {
        let mut args = Vec::new();
        if op.starts_with("call") {
            // call(.uni)? ((ret),)? func, (args)?;
            if self.eat('(') {
                let r = self.id()?;
                self.expect(')')?;
                self.expect(',')?;
                args.push(Raw::Sym(r));
            } else {
                args.push(Raw::Num(u64::MAX));
            }
            let f = self.id()?;
            args.push(Raw::Sym(f));
            if self.eat(',') {
                self.expect('(')?;
                if !self.eat(')') {
                    loop {
                        let a = self.id()?;
                        args.push(Raw::Sym(a));
                        if self.eat(')') {
                            break;
                        }
                        self.expect(',')?;
                    }
                }
            }
            self.expect(';')?;
            return Ok(RawInst { guard, op, args, line });
        }
        if !self.eat(';') {
            loop {
                args.push(self.operand()?);
                if self.eat(';') {
                    break;
                }
                self.expect(',')?;
            }
        }
        Ok(RawInst { guard, op, args, line })
    }
}

fn parse(src: &str) -> Result<(Vec<RawFunc>, Module), String> {
    let lexed = lex(src)?;
    let mut p = Parser { toks: lexed.toks, lines: lexed.lines, i: 0 };
    let mut funcs = Vec::new();
    let mut m = Module::default();
    while let Some(t) = p.peek().cloned() {
        let Tok::Id(s) = t else {
            return Err(format!("line {}: unexpected {t:?} at module scope", p.line()));
        };
        match s.as_str() {
            ".version" | ".target" | ".address_size" | ".file" | ".section" => {
                p.i += 1;
                // These directives end at the line's end, not at a semicolon.
                let l = p.lines[p.i - 1];
                while p.i < p.toks.len() && p.lines[p.i] == l {
                    p.i += 1;
                }
            }
            ".visible" | ".weak" | ".extern" => {
                p.i += 1;
                if s == ".extern" {
                    if let Some(Tok::Id(n)) = p.peek() {
                        if n == ".shared" {
                            p.i += 1;
                            let (name, _, _, _) = p.var_decl()?;
                            p.expect(';')?;
                            m.dyn_shared = Some(name);
                        }
                    }
                }
            }
            ".entry" | ".func" => {
                p.i += 1;
                let entry = s == ".entry";
                let ret =
                    if !entry && p.peek() == Some(&Tok::P('(')) { p.param_list()?.into_iter().next() } else { None };
                let name = p.id()?;
                let params = if p.peek() == Some(&Tok::P('(')) { p.param_list()? } else { Vec::new() };
                let mut maxntid = None;
                while let Some(Tok::Id(d)) = p.peek().cloned() {
                    p.i += 1;
                    let mut vals = vec![p.num()?];
                    while p.eat(',') {
                        vals.push(p.num()?);
                    }
                    if d == ".maxntid" || d == ".reqntid" {
                        maxntid = Some(vals.iter().product::<u64>() as u32);
                    }
                }
                let body = if p.eat(';') {
                    None
                } else {
                    p.expect('{')?;
                    Some(p.body()?)
                };
                funcs.push(RawFunc { name, entry, params, ret, body, maxntid });
            }
            ".global" | ".const" | ".shared" => {
                p.i += 1;
                let (name, ty, count, align) = p.var_decl()?;
                let n = count.unwrap_or(1) as usize;
                let esz = ty.size() as usize;
                let mut init = vec![0u8; n * esz];
                if p.eat('=') {
                    let mut vals = Vec::new();
                    if p.eat('{') {
                        loop {
                            vals.push(p.num()?);
                            if p.eat('}') {
                                break;
                            }
                            p.expect(',')?;
                        }
                    } else {
                        vals.push(p.num()?);
                    }
                    for (k, v) in vals.iter().enumerate().take(n) {
                        init[k * esz..(k + 1) * esz].copy_from_slice(&v.to_le_bytes()[..esz]);
                    }
                }
                p.expect(';')?;
                if s == ".shared" {
                    let off = m.shared_size.div_ceil(align) * align;
                    m.shared.push((name, off));
                    m.shared_size = off + init.len() as u32;
                } else {
                    let space = if s == ".global" { Space::Global } else { Space::Const };
                    m.globals.push(Global { name, space, align, init });
                }
            }
            _ => return Err(format!("line {}: unexpected {s} at module scope", p.line())),
        }
    }
    Ok((funcs, m))
}

/// The symbol tables the decoder resolves against.
struct Syms<'a> {
    /// Global and const data: name to device address.
    globals: &'a HashMap<String, u64>,
    shared: &'a HashMap<String, u32>,
    funcs: &'a HashMap<String, u32>,
    dyn_shared: Option<&'a str>,
    /// Size of the module-scope shared variables.
    shared_size: u32,
}

/// Parses and decodes `src`. `global_addr` gives the device address of
/// each module-scope `.global`/`.const` variable, in order (the caller
/// allocates them after a first parse); pass an empty slice to get the
/// variables' sizes first.
pub fn load(src: &str, global_addr: &dyn Fn(&[Global]) -> Vec<u64>) -> Result<Module, String> {
    let (raws, mut m) = parse(src)?;
    let addrs = global_addr(&m.globals);
    let globals: HashMap<String, u64> = m.globals.iter().map(|g| g.name.clone()).zip(addrs.iter().copied()).collect();
    m.global_addrs = addrs;
    let shared: HashMap<String, u32> = m.shared.iter().cloned().collect();
    let mut func_ix: HashMap<String, u32> = HashMap::new();
    // Declarations and definitions share one slot per name.
    let mut order: Vec<usize> = Vec::new();
    for (k, f) in raws.iter().enumerate() {
        match func_ix.get(&f.name) {
            Some(&ix) => {
                if f.body.is_some() {
                    order[ix as usize] = k;
                }
            }
            None => {
                func_ix.insert(f.name.clone(), order.len() as u32);
                order.push(k);
            }
        }
    }
    let dyn_name = m.dyn_shared.clone();
    let syms = Syms {
        globals: &globals,
        shared: &shared,
        funcs: &func_ix,
        dyn_shared: dyn_name.as_deref(),
        shared_size: m.shared_size,
    };
    let mut unsupported = Vec::new();
    for &k in &order {
        let f = decode_func(&raws[k], &syms, &mut unsupported)?;
        m.funcs.push(f);
    }
    unsupported.sort();
    unsupported.dedup();
    m.unsupported = unsupported;
    Ok(m)
}

struct FnCtx<'a> {
    regs: HashMap<String, u16>,
    /// The registers declared 64-bit.
    wide: std::collections::HashSet<String>,
    params: HashMap<String, u32>,
    depot: Option<String>,
    syms: &'a Syms<'a>,
    shared_dyn_off: u32,
    shared_local: HashMap<String, u32>,
}

impl FnCtx<'_> {
    fn reg(&mut self, name: &str) -> u16 {
        if let Some(k) = SPECIALS.iter().position(|s| *s == name) {
            return k as u16;
        }
        let n = self.regs.len() as u16 + NSPECIAL;
        *self.regs.entry(name.to_string()).or_insert(n)
    }
}

fn decode_func(raw: &RawFunc, syms: &Syms, unsupported: &mut Vec<String>) -> Result<Func, String> {
    let mut params = HashMap::new();
    let mut off = 0u32;
    let mut place = |name: &str, size: u32, align: u32, params: &mut HashMap<String, u32>| -> Param {
        let align = align.max(1);
        let o = off.div_ceil(align) * align;
        off = o + size;
        params.insert(name.to_string(), o);
        Param { name: name.to_string(), offset: o, size, align }
    };
    let ps: Vec<Param> = raw.params.iter().map(|(n, s, a)| place(n, *s, *a, &mut params)).collect();
    let ret = raw.ret.as_ref().map(|(n, s, a)| place(n, *s, *a, &mut params));
    let mut local_size = 0u32;
    let mut local_align = 1u32;
    let mut depot = None;
    let mut shared_size = syms.shared_size;
    let mut shared_local = HashMap::new();
    let mut wide = std::collections::HashSet::new();
    let body = raw.body.as_deref().unwrap_or(&[]);
    for st in body {
        match st {
            Stmt::Wide(n, None) => {
                wide.insert(n.clone());
            }
            Stmt::Wide(n, Some(c)) => wide.extend((0..*c).map(|k| format!("{n}{k}"))),
            Stmt::Param(n, s, a) => {
                place(n, *s, *a, &mut params);
            }
            Stmt::Shared(n, s, a) => {
                let a = (*a).max(1);
                let o = shared_size.div_ceil(a) * a;
                shared_local.insert(n.clone(), o);
                shared_size = o + s;
            }
            Stmt::Local(n, s, a) => {
                if depot.is_some() {
                    return Err(format!("{}: more than one .local variable", raw.name));
                }
                depot = Some(n.clone());
                local_size = *s;
                local_align = (*a).max(1);
            }
            _ => {}
        }
    }
    let shared_dyn_off = shared_size.div_ceil(16) * 16;
    let mut cx = FnCtx { regs: HashMap::new(), wide, params, depot, syms, shared_dyn_off, shared_local };
    // Labels first, so forward branches resolve.
    let mut labels = HashMap::new();
    let mut n = 0u32;
    for st in body {
        match st {
            Stmt::Label(l) => {
                labels.insert(l.clone(), n);
            }
            Stmt::Inst(_) => n += 1,
            _ => {}
        }
    }
    let mut insts = Vec::with_capacity(n as usize + 1);
    for st in body {
        if let Stmt::Inst(ri) = st {
            let guard = ri.guard.as_ref().map(|(p, neg)| (cx.reg(p), *neg));
            let ins = match decode(ri, &mut cx, &labels) {
                Ok(Some(ins)) => ins,
                Ok(None) => {
                    unsupported.push(ri.op.clone());
                    Ins::Exit
                }
                Err(e) => return Err(format!("{} line {}: {} ({e})", raw.name, ri.line, ri.op)),
            };
            insts.push(Inst { guard, ins, line: ri.line });
        }
    }
    // Falling off the end returns.
    insts.push(Inst { guard: None, ins: Ins::Ret, line: 0 });
    Ok(Func {
        name: raw.name.clone(),
        entry: raw.entry,
        params: ps,
        ret,
        insts,
        nregs: cx.regs.len() + NSPECIAL as usize,
        param_size: off,
        local_size,
        local_align,
        shared_size,
        defined: raw.body.is_some(),
        maxntid: raw.maxntid,
    })
}

fn bits_of(t: Ty) -> u32 {
    t.size() * 8
}

fn rnd_of(m: &str) -> Option<Rnd> {
    Some(match m {
        "rn" => Rnd::Rn,
        "rz" => Rnd::Rz,
        "rm" => Rnd::Rm,
        "rp" => Rnd::Rp,
        "rni" => Rnd::Rni,
        "rzi" => Rnd::Rzi,
        "rmi" => Rnd::Rmi,
        "rpi" => Rnd::Rpi,
        _ => return None,
    })
}

fn space_of(m: &str) -> Option<Space> {
    Some(match m {
        "global" => Space::Global,
        "shared" => Space::Shared,
        "local" => Space::Local,
        "param" => Space::Param,
        "const" => Space::Const,
        _ => return None,
    })
}

/// Decodes one instruction; `Ok(None)` for an opcode the interpreter lacks.
fn decode(ri: &RawInst, cx: &mut FnCtx, labels: &HashMap<String, u32>) -> Result<Option<Ins>, String> {
    let parts: Vec<&str> = ri.op.split('.').collect();
    let base = parts[0];
    let mods = &parts[1..];
    let ty = mods.iter().rev().find_map(|m| Ty::parse(m));
    let has = |m: &str| mods.contains(&m);
    let rnd = mods.iter().find_map(|m| rnd_of(m)).unwrap_or(Rnd::None);
    let ftz = has("ftz");
    let a = &ri.args;
    let arg = |k: usize| a.get(k).ok_or_else(|| format!("missing operand {k}"));
    macro_rules! dst {
        ($k:expr) => {
            match arg($k)? {
                Raw::Reg(r) => cx.reg(r),
                o => return Err(format!("operand {} is not a register: {o:?}", $k)),
            }
        };
    }
    macro_rules! src {
        ($k:expr) => {
            opnd(arg($k)?, cx)?
        };
    }
    let t = ty.unwrap_or(Ty::B32);
    let bin = |op: BinOp, cx: &mut FnCtx| -> Result<Option<Ins>, String> {
        let d = match arg(0)? {
            Raw::Reg(r) => cx.reg(r),
            o => return Err(format!("bad destination {o:?}")),
        };
        Ok(Some(Ins::Bin { op, t, ftz, rnd, d, a: opnd(arg(1)?, cx)?, b: opnd(arg(2)?, cx)? }))
    };
    let un = |op: UnOp, cx: &mut FnCtx| -> Result<Option<Ins>, String> {
        let d = match arg(0)? {
            Raw::Reg(r) => cx.reg(r),
            o => return Err(format!("bad destination {o:?}")),
        };
        Ok(Some(Ins::Un { op, t, ftz, d, a: opnd(arg(1)?, cx)? }))
    };
    // Packed types (f16x2, bf16x2, u16x2) and special registers the
    // interpreter does not provide are unsupported, not silently wrong.
    if mods.iter().any(|m| m.ends_with("x2") || m.ends_with("x4")) || uses_unknown_special(&ri.args) {
        return Ok(None);
    }
    // Half-precision arithmetic (add.f16, fma.rn.bf16, ...) is not emitted
    // for these kernels, which compute in f32; only moves, negation,
    // absolute value, comparisons, selects and conversions are.
    let half = matches!(t, Ty::F16 | Ty::Bf16);
    if half && !matches!(base, "mov" | "neg" | "abs" | "setp" | "selp" | "cvt" | "ld" | "st") {
        return Ok(None);
    }
    let ins = match base {
        "add" | "sub" => {
            let op = match (base, has("cc")) {
                ("add", true) => BinOp::AddCc { carry_in: false, carry_out: true },
                ("sub", true) => BinOp::SubCc { carry_in: false, carry_out: true },
                ("add", false) => BinOp::Add,
                _ => BinOp::Sub,
            };
            return bin(op, cx);
        }
        "addc" | "subc" => {
            let co = has("cc");
            return bin(
                if base == "addc" {
                    BinOp::AddCc { carry_in: true, carry_out: co }
                } else {
                    BinOp::SubCc { carry_in: true, carry_out: co }
                },
                cx,
            );
        }
        "mul" => {
            if t.float() {
                return bin(BinOp::Mul, cx);
            }
            if has("hi") {
                return bin(BinOp::MulHi, cx);
            }
            if has("wide") {
                return bin(BinOp::MulWide, cx);
            }
            return bin(BinOp::Mul, cx);
        }
        "mad" | "madc" | "fma" => {
            if t.float() {
                Ins::Fma { t, rnd, ftz, d: dst!(0), a: src!(1), b: src!(2), c: src!(3) }
            } else {
                Ins::Mad {
                    t,
                    hi: has("hi"),
                    wide: has("wide"),
                    cc_in: base == "madc",
                    cc_out: has("cc"),
                    d: dst!(0),
                    a: src!(1),
                    b: src!(2),
                    c: src!(3),
                }
            }
        }
        "div" => return bin(BinOp::Div, cx),
        "rem" => return bin(BinOp::Rem, cx),
        "min" => return bin(BinOp::Min, cx),
        "max" => return bin(BinOp::Max, cx),
        "and" | "or" | "xor" if t == Ty::Pred => {
            let op = match base {
                "and" => BoolOp::And,
                "or" => BoolOp::Or,
                _ => BoolOp::Xor,
            };
            Ins::PredBin { op, d: dst!(0), a: src!(1), b: src!(2) }
        }
        "not" if t == Ty::Pred => Ins::PredNot { d: dst!(0), a: src!(1) },
        "and" => return bin(BinOp::And, cx),
        "or" => return bin(BinOp::Or, cx),
        "xor" => return bin(BinOp::Xor, cx),
        "shl" => return bin(BinOp::Shl, cx),
        "shr" => return bin(BinOp::Shr, cx),
        "neg" => return un(UnOp::Neg, cx),
        "not" => return un(UnOp::Not, cx),
        "abs" => return un(UnOp::Abs, cx),
        "rcp" => return un(UnOp::Rcp { approx: has("approx") }, cx),
        "sqrt" => return un(UnOp::Sqrt { approx: has("approx") }, cx),
        "rsqrt" => return un(UnOp::Rsqrt, cx),
        "ex2" => return un(UnOp::Ex2, cx),
        "lg2" => return un(UnOp::Lg2, cx),
        "sin" => return un(UnOp::Sin, cx),
        "cos" => return un(UnOp::Cos, cx),
        "clz" => return un(UnOp::Clz, cx),
        "popc" => return un(UnOp::Popc, cx),
        "brev" => return un(UnOp::Brev, cx),
        "mov" if matches!(arg(0)?, Raw::Vec(_)) => {
            let Raw::Vec(v) = arg(0)? else { unreachable!() };
            let mut d = [0u16; 4];
            for (k, r) in v.iter().enumerate().take(4) {
                d[k] = match r {
                    Raw::Reg(r) => cx.reg(r),
                    Raw::Sym(s) if s == "_" => cx.reg("%_sink"),
                    o => return Err(format!("bad vector element {o:?}")),
                };
            }
            let n = v.len().min(4) as u8;
            Ins::Unpack { d, n, w: (bits_of(t) / u32::from(n)) as u8, a: src!(1) }
        }
        "mov" if matches!(arg(1)?, Raw::Vec(_)) => {
            let Raw::Vec(vs) = arg(1)? else { unreachable!() };
            let mut v = [Opnd::I(0); 4];
            for (k, r) in vs.iter().enumerate().take(4) {
                v[k] = opnd(r, cx)?;
            }
            let n = vs.len().min(4) as u8;
            Ins::Pack { d: dst!(0), n, w: (bits_of(t) / u32::from(n)) as u8, v }
        }
        "mov" => {
            let d = dst!(0);
            match arg(1)? {
                Raw::Sym(s) if cx.depot.as_deref() == Some(s.as_str()) => Ins::Depot { d },
                o => {
                    let a = opnd(o, cx)?;
                    Ins::Un { op: UnOp::Mov, t, ftz: false, d, a }
                }
            }
        }
        "setp" => {
            let cmp = match mods.first().copied() {
                Some("eq") => Cmp::Eq,
                Some("ne") => Cmp::Ne,
                Some("lt") => Cmp::Lt,
                Some("le") => Cmp::Le,
                Some("gt") => Cmp::Gt,
                Some("ge") => Cmp::Ge,
                Some("equ") => Cmp::Equ,
                Some("neu") => Cmp::Neu,
                Some("ltu") => Cmp::Ltu,
                Some("leu") => Cmp::Leu,
                Some("gtu") => Cmp::Gtu,
                Some("geu") => Cmp::Geu,
                Some("num") => Cmp::Num,
                Some("nan") => Cmp::Nan,
                Some("lo") => Cmp::Lo,
                Some("ls") => Cmp::Ls,
                Some("hi") => Cmp::Hi,
                Some("hs") => Cmp::Hs,
                _ => return Ok(None),
            };
            let comb = mods.get(1).and_then(|m| match *m {
                "and" => Some(BoolOp::And),
                "or" => Some(BoolOp::Or),
                "xor" => Some(BoolOp::Xor),
                _ => None,
            });
            let (d, dn) = match arg(0)? {
                Raw::Reg(r) => (cx.reg(r), None),
                Raw::Pair(r, q) => (cx.reg(r), Some(cx.reg(q))),
                o => return Err(format!("bad setp destination {o:?}")),
            };
            let comb = match comb {
                Some(op) => {
                    let (neg, o) = match arg(3)? {
                        Raw::Not(o) => (true, opnd(o, cx)?),
                        o => (false, opnd(o, cx)?),
                    };
                    Some((op, o, neg))
                }
                None => None,
            };
            Ins::Setp { cmp, t, ftz, d, dn, a: src!(1), b: src!(2), comb }
        }
        "selp" => Ins::Selp { t, d: dst!(0), a: src!(1), b: src!(2), p: src!(3) },
        "cvt" => {
            let tys: Vec<Ty> = mods.iter().filter_map(|m| Ty::parse(m)).collect();
            if tys.len() != 2 {
                return Ok(None);
            }
            Ins::Cvt { dt: tys[0], st: tys[1], rnd, sat: has("sat"), ftz, d: dst!(0), a: src!(1) }
        }
        "cvta" => {
            let to = has("to");
            let Some(sp) = mods.iter().find_map(|m| space_of(m)) else { return Ok(None) };
            let d = dst!(0);
            let a = match arg(1)? {
                Raw::Sym(s) if cx.depot.as_deref() == Some(s.as_str()) => {
                    return Err("cvta of the local depot symbol is not supported".into())
                }
                o => opnd(o, cx)?,
            };
            Ins::Cvta { to, sp, d, a }
        }
        "ld" | "st" => {
            let sp = mods.iter().find_map(|m| space_of(m)).unwrap_or(Space::Generic);
            let n = mods.iter().find_map(|m| m.strip_prefix('v').and_then(|v| v.parse::<u8>().ok())).unwrap_or(1);
            let (mk, mv) = if base == "ld" { (1, 0) } else { (0, 1) };
            let addr = addr_of(arg(mk)?, sp, cx)?;
            if base == "ld" {
                let mut d = [0u16; 4];
                let mut sext64 = false;
                let mut wide = |r: &str, cx: &FnCtx| sext64 |= t.signed() && t.size() < 8 && cx.wide.contains(r);
                match arg(mv)? {
                    Raw::Vec(v) => {
                        for (k, r) in v.iter().enumerate().take(4) {
                            d[k] = match r {
                                Raw::Reg(r) => {
                                    wide(r, cx);
                                    cx.reg(r)
                                }
                                o => return Err(format!("bad vector element {o:?}")),
                            };
                        }
                    }
                    Raw::Reg(r) => {
                        wide(r, cx);
                        d[0] = cx.reg(r)
                    }
                    o => return Err(format!("bad load destination {o:?}")),
                }
                Ins::Ld { sp, t, n, d, addr, sext64 }
            } else {
                let mut v = [Opnd::I(0); 4];
                match arg(mv)? {
                    Raw::Vec(vs) => {
                        for (k, r) in vs.iter().enumerate().take(4) {
                            v[k] = opnd(r, cx)?;
                        }
                    }
                    o => v[0] = opnd(o, cx)?,
                }
                Ins::St { sp, t, n, v, addr }
            }
        }
        "atom" | "red" => {
            let sp = mods.iter().find_map(|m| space_of(m)).unwrap_or(Space::Generic);
            let op = match mods.iter().find_map(|m| match *m {
                "add" => Some(AtomOp::Add),
                "min" => Some(AtomOp::Min),
                "max" => Some(AtomOp::Max),
                "inc" => Some(AtomOp::Inc),
                "dec" => Some(AtomOp::Dec),
                "and" => Some(AtomOp::And),
                "or" => Some(AtomOp::Or),
                "xor" => Some(AtomOp::Xor),
                "exch" => Some(AtomOp::Exch),
                "cas" => Some(AtomOp::Cas),
                _ => None,
            }) {
                Some(op) => op,
                None => return Ok(None),
            };
            // 8- and 16-bit atomics are not emitted for these kernels.
            if t.size() < 4 {
                return Ok(None);
            }
            if base == "atom" {
                let d = dst!(0);
                let addr = addr_of(arg(1)?, sp, cx)?;
                let b = src!(2);
                let c = if op == AtomOp::Cas { src!(3) } else { Opnd::I(0) };
                Ins::Atom { sp, op, t, d: Some(d), addr, b, c }
            } else {
                let addr = addr_of(arg(0)?, sp, cx)?;
                Ins::Atom { sp, op, t, d: None, addr, b: src!(1), c: Opnd::I(0) }
            }
        }
        "prmt" => {
            if mods.len() != 1 {
                return Ok(None);
            }
            Ins::Prmt { d: dst!(0), a: src!(1), b: src!(2), c: src!(3) }
        }
        "bfi" => Ins::Bfi { t, d: dst!(0), a: src!(1), b: src!(2), pos: src!(3), len: src!(4) },
        "bfe" => Ins::Bfe { t, d: dst!(0), a: src!(1), pos: src!(2), len: src!(3) },
        "bra" => {
            let Raw::Sym(l) = arg(0)? else { return Err("bad branch target".into()) };
            let target = *labels.get(l).ok_or_else(|| format!("no label {l}"))?;
            Ins::Bra { target }
        }
        "bar" | "barrier" => {
            if has("warp") {
                Ins::WarpSync { mask: src!(0) }
            } else if a.len() > 1 {
                // Named barriers with a thread count are not emitted for these kernels.
                return Ok(None);
            } else {
                Ins::Bar
            }
        }
        "shfl" => {
            let mode = match mods.iter().find_map(|m| match *m {
                "up" => Some(ShflMode::Up),
                "down" => Some(ShflMode::Down),
                "bfly" => Some(ShflMode::Bfly),
                "idx" => Some(ShflMode::Idx),
                _ => None,
            }) {
                Some(m) => m,
                None => return Ok(None),
            };
            if !has("sync") {
                return Ok(None);
            }
            let (d, dp) = match arg(0)? {
                Raw::Reg(r) => (cx.reg(r), None),
                Raw::Pair(r, q) => (cx.reg(r), Some(cx.reg(q))),
                o => return Err(format!("bad shfl destination {o:?}")),
            };
            Ins::Shfl { mode, d, dp, a: src!(1), b: src!(2), c: src!(3), mask: src!(4) }
        }
        "vote" => {
            let mode = match mods.iter().find_map(|m| match *m {
                "all" => Some(VoteMode::All),
                "any" => Some(VoteMode::Any),
                "uni" => Some(VoteMode::Uni),
                "ballot" => Some(VoteMode::Ballot),
                _ => None,
            }) {
                Some(m) => m,
                None => return Ok(None),
            };
            if !has("sync") {
                return Ok(None);
            }
            let d = dst!(0);
            let (neg, o) = match arg(1)? {
                Raw::Not(o) => (true, opnd(o, cx)?),
                o => (false, opnd(o, cx)?),
            };
            Ins::Vote { mode, d, a: o, neg, mask: src!(2) }
        }
        "call" => {
            let ret = match &a[0] {
                Raw::Sym(r) => Some(*cx.params.get(r).ok_or_else(|| format!("no param {r}"))?),
                _ => None,
            };
            let Raw::Sym(f) = &a[1] else { return Err("bad call target".into()) };
            let func = *cx.syms.funcs.get(f).ok_or_else(|| format!("no function {f}"))?;
            let mut args = Vec::new();
            for x in &a[2..] {
                let Raw::Sym(p) = x else { return Err("bad call argument".into()) };
                args.push(*cx.params.get(p).ok_or_else(|| format!("no param {p}"))?);
            }
            Ins::Call { func, ret, args }
        }
        "ret" => Ins::Ret,
        "exit" | "trap" => Ins::Exit,
        "membar" | "fence" | "prefetch" | "prefetchu" => Ins::Nop,
        _ => return Ok(None),
    };
    Ok(Some(ins))
}

/// Special registers of PTX that the interpreter does not model (clocks,
/// SM ids, lane masks, timers, cluster ids).
const UNKNOWN_SPECIALS: [&str; 11] = [
    "%clock",
    "%smid",
    "%nsmid",
    "%gridid",
    "%lanemask",
    "%globaltimer",
    "%envreg",
    "%dynamic_smem_size",
    "%total_smem_size",
    "%cluster",
    "%is_explicit_cluster",
];

fn uses_unknown_special(args: &[Raw]) -> bool {
    let perf = |n: &str| n.strip_prefix("%pm").is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()));
    args.iter().any(|a| match a {
        Raw::Reg(n) => UNKNOWN_SPECIALS.iter().any(|s| n.starts_with(s)) || perf(n),
        Raw::Mem(b, _) | Raw::Not(b) => uses_unknown_special(std::slice::from_ref(b)),
        Raw::Vec(v) => uses_unknown_special(v),
        _ => false,
    })
}

fn opnd(r: &Raw, cx: &mut FnCtx) -> Result<Opnd, String> {
    Ok(match r {
        Raw::Reg(r) => Opnd::R(cx.reg(r)),
        Raw::Num(n) => Opnd::I(*n),
        Raw::Sym(s) => Opnd::I(sym_value(s, cx)?),
        o => return Err(format!("unexpected operand {o:?}")),
    })
}

fn sym_value(s: &str, cx: &FnCtx) -> Result<u64, String> {
    if let Some(a) = cx.syms.globals.get(s) {
        return Ok(*a);
    }
    if let Some(o) = cx.shared_local.get(s) {
        return Ok(u64::from(*o));
    }
    if let Some(o) = cx.syms.shared.get(s) {
        return Ok(u64::from(*o));
    }
    if cx.syms.dyn_shared == Some(s) {
        return Ok(u64::from(cx.shared_dyn_off));
    }
    if let Some(o) = cx.params.get(s) {
        return Ok(u64::from(*o));
    }
    Err(format!("unknown symbol {s}"))
}

fn addr_of(r: &Raw, _sp: Space, cx: &mut FnCtx) -> Result<Addr, String> {
    let Raw::Mem(base, off) = r else { return Err(format!("expected an address, found {r:?}")) };
    let base = match &**base {
        Raw::Reg(r) => Opnd::R(cx.reg(r)),
        Raw::Num(n) => Opnd::I(*n),
        Raw::Sym(s) => Opnd::I(sym_value(s, cx)?),
        o => return Err(format!("bad address base {o:?}")),
    };
    Ok(Addr { base, off: *off })
}
