//! Stage three: raw statements to decoded instructions, with registers,
//! labels, parameters and symbols resolved.

use std::collections::HashMap;

use super::parse::{parse, Raw, RawFunc, RawInst, Stmt};
use super::*;

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
    params: HashMap<String, u32>,
    depot: Option<String>,
    syms: &'a Syms<'a>,
    shared_dyn_off: u32,
    shared_local: HashMap<String, u32>,
    /// Declared register width in bytes, by name or by range prefix.
    widths: HashMap<String, u32>,
}

impl FnCtx<'_> {
    /// The declared width in bytes of register `name` (4 when undeclared):
    /// `%rd7` is found through its range prefix `%rd`.
    fn width(&self, name: &str) -> u32 {
        if let Some(&w) = self.widths.get(name) {
            return w;
        }
        let prefix = name.trim_end_matches(|c: char| c.is_ascii_digit());
        self.widths.get(prefix).copied().unwrap_or(4)
    }

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
    let mut widths = HashMap::new();
    let body = raw.body.as_deref().unwrap_or(&[]);
    for st in body {
        match st {
            Stmt::Regs(w, names) => {
                for n in names {
                    widths.insert(n.clone(), *w);
                }
            }
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
    let mut cx = FnCtx { regs: HashMap::new(), params, depot, syms, shared_dyn_off, shared_local, widths };
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
    let zeroed = read_before_written(&insts, cx.regs.len() + NSPECIAL as usize);
    Ok(Func {
        zeroed,
        derived: Derived::default(),
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

/// The registers that some path from the entry may read before any
/// unguarded instruction on it has written them. A forward must-write
/// dataflow: at each instruction, the registers written on every path
/// that reaches it (the special registers from the start); a guarded
/// write counts on no path, since its guard may be false. Device-function
/// calls touch no register of the caller.
fn read_before_written(insts: &[Inst], nregs: usize) -> Vec<u16> {
    let words = nregs.div_ceil(64);
    let n = insts.len();
    // `written[i]`: the registers written on every path into instruction i;
    // None until a path reaches it.
    let mut written: Vec<Option<Vec<u64>>> = vec![None; n];
    let mut start = vec![0u64; words];
    for r in 0..NSPECIAL as usize {
        start[r / 64] |= 1 << (r % 64);
    }
    written[0] = Some(start);
    let mut work: Vec<usize> = vec![0];
    let mut queued = vec![false; n];
    queued[0] = true;
    while let Some(i) = work.pop() {
        queued[i] = false;
        let mut out = written[i].clone().expect("internal: a reached instruction");
        if insts[i].guard.is_none() {
            insts[i].ins.for_each_reg(|r, w| {
                if w {
                    out[r as usize / 64] |= 1 << (r % 64);
                }
            });
        }
        let guarded = insts[i].guard.is_some();
        let mut succ = [None, None];
        match insts[i].ins {
            Ins::Bra { target } => {
                succ[0] = Some(target as usize);
                if guarded {
                    succ[1] = Some(i + 1);
                }
            }
            Ins::Ret | Ins::Exit => {
                if guarded {
                    succ[0] = Some(i + 1);
                }
            }
            _ => succ[0] = Some(i + 1),
        }
        for s in succ.into_iter().flatten().filter(|&s| s < n) {
            let changed = match &mut written[s] {
                None => {
                    written[s] = Some(out.clone());
                    true
                }
                Some(w) => {
                    let mut c = false;
                    for (a, b) in w.iter_mut().zip(&out) {
                        let m = *a & *b;
                        c |= m != *a;
                        *a = m;
                    }
                    c
                }
            };
            if changed && !queued[s] {
                queued[s] = true;
                work.push(s);
            }
        }
    }
    let mut need = vec![0u64; words];
    for (inst, w) in insts.iter().zip(&written) {
        let Some(w) = w else { continue };
        let mut mark = |r: u16| {
            if w[r as usize / 64] >> (r % 64) & 1 == 0 {
                need[r as usize / 64] |= 1 << (r % 64);
            }
        };
        if let Some((p, _)) = inst.guard {
            mark(p);
        }
        inst.ins.for_each_reg(|r, wr| {
            if !wr {
                mark(r);
            }
        });
    }
    (0..nregs as u16).filter(|&r| need[r as usize / 64] >> (r % 64) & 1 == 1).collect()
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
        "shared" | "shared::cta" => Space::Shared,
        "local" => Space::Local,
        "param" => Space::Param,
        "const" => Space::Const,
        _ => return None,
    })
}

/// One instruction being decoded: its opcode split at the dots, and the
/// properties most arms read.
#[derive(Clone, Copy)]
struct Op<'r> {
    base: &'r str,
    mods: &'r [&'r str],
    /// The last type modifier (b32 when none).
    t: Ty,
    rnd: Rnd,
    ftz: bool,
    args: &'r [Raw],
}

impl Op<'_> {
    fn has(&self, m: &str) -> bool {
        self.mods.contains(&m)
    }

    fn arg(&self, k: usize) -> Result<&Raw, String> {
        self.args.get(k).ok_or_else(|| format!("missing operand {k}"))
    }

    /// Operand `k` as a destination register.
    fn dst(&self, cx: &mut FnCtx, k: usize) -> Result<u16, String> {
        match self.arg(k)? {
            Raw::Reg(r) => Ok(cx.reg(r)),
            o => Err(format!("operand {k} is not a register: {o:?}")),
        }
    }

    /// Operand `k` as a source.
    fn src(&self, cx: &mut FnCtx, k: usize) -> Result<Opnd, String> {
        opnd(self.arg(k)?, cx)
    }

    fn bin(&self, op: BinOp, cx: &mut FnCtx) -> Result<Option<Ins>, String> {
        let d = match self.arg(0)? {
            Raw::Reg(r) => cx.reg(r),
            o => return Err(format!("bad destination {o:?}")),
        };
        let (t, ftz, rnd) = (self.t, self.ftz, self.rnd);
        Ok(Some(Ins::Bin { op, t, ftz, rnd, d, a: self.src(cx, 1)?, b: self.src(cx, 2)? }))
    }

    fn un(&self, op: UnOp, cx: &mut FnCtx) -> Result<Option<Ins>, String> {
        let d = match self.arg(0)? {
            Raw::Reg(r) => cx.reg(r),
            o => return Err(format!("bad destination {o:?}")),
        };
        let (t, ftz) = (self.t, self.ftz);
        Ok(Some(Ins::Un { op, t, ftz, d, a: self.src(cx, 1)? }))
    }
}

/// Decodes one instruction; `Ok(None)` for an opcode the interpreter lacks.
fn decode(ri: &RawInst, cx: &mut FnCtx, labels: &HashMap<String, u32>) -> Result<Option<Ins>, String> {
    let parts: Vec<&str> = ri.op.split('.').collect();
    let mods = &parts[1..];
    let o = Op {
        base: parts[0],
        mods,
        t: mods.iter().rev().find_map(|m| Ty::parse(m)).unwrap_or(Ty::B32),
        rnd: mods.iter().find_map(|m| rnd_of(m)).unwrap_or(Rnd::None),
        ftz: mods.contains(&"ftz"),
        args: &ri.args,
    };
    // The tensor-core instructions name packed shapes (`.x4`) of their own.
    match o.base {
        "mma" => return mma(&o, cx),
        "ldmatrix" => return ldmatrix(&o, cx),
        _ => {}
    }
    // Of the packed types, the conversion of two f32 to f16x2 or bf16x2
    // and their atomic add; the others (f16x2 arithmetic, u16x2) and
    // special registers the interpreter does not provide are unsupported,
    // not silently wrong.
    let half2 = |m: &&str| matches!(*m, "f16x2" | "bf16x2");
    match o.base {
        "cvt" if mods.get(1).is_some_and(half2) => return cvt_pack(&o, cx),
        "atom" | "red" if mods.iter().any(half2) && !uses_unknown_special(&ri.args) => return memory(&o, cx),
        _ => {}
    }
    if mods.iter().any(|m| m.ends_with("x2") || m.ends_with("x4")) || uses_unknown_special(&ri.args) {
        return Ok(None);
    }
    // Half-precision arithmetic (add.f16, fma.rn.bf16, ...) is not emitted
    // for these kernels, which compute in f32; only moves, negation,
    // absolute value, comparisons, selects and conversions are.
    let half = matches!(o.t, Ty::F16 | Ty::Bf16);
    if half && !matches!(o.base, "mov" | "neg" | "abs" | "setp" | "selp" | "cvt" | "ld" | "st") {
        return Ok(None);
    }
    match o.base {
        "mov" | "setp" | "selp" | "cvt" | "cvta" => moves(&o, cx),
        "ld" | "st" | "atom" | "red" => memory(&o, cx),
        "bra" | "bar" | "barrier" | "shfl" | "vote" | "call" | "ret" | "exit" | "trap" | "membar" | "fence"
        | "prefetch" | "prefetchu" => control(&o, cx, labels),
        _ => arith(&o, cx),
    }
}

/// Integer and float arithmetic, logic, shifts and bit fields.
fn arith(o: &Op, cx: &mut FnCtx) -> Result<Option<Ins>, String> {
    let Op { base, mods, t, rnd, ftz, .. } = *o;
    let has = |m: &str| o.has(m);
    let ins = match base {
        "add" | "sub" => {
            let op = match (base, has("cc")) {
                ("add", true) => BinOp::AddCc { carry_in: false, carry_out: true },
                ("sub", true) => BinOp::SubCc { carry_in: false, carry_out: true },
                ("add", false) => BinOp::Add,
                _ => BinOp::Sub,
            };
            return o.bin(op, cx);
        }
        "addc" | "subc" => {
            let co = has("cc");
            return o.bin(
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
                return o.bin(BinOp::Mul, cx);
            }
            if has("hi") {
                return o.bin(BinOp::MulHi, cx);
            }
            if has("wide") {
                return o.bin(BinOp::MulWide, cx);
            }
            return o.bin(BinOp::Mul, cx);
        }
        "mad" | "madc" | "fma" => {
            if t.float() {
                Ins::Fma { t, rnd, ftz, d: o.dst(cx, 0)?, a: o.src(cx, 1)?, b: o.src(cx, 2)?, c: o.src(cx, 3)? }
            } else {
                Ins::Mad {
                    t,
                    hi: has("hi"),
                    wide: has("wide"),
                    cc_in: base == "madc",
                    cc_out: has("cc"),
                    d: o.dst(cx, 0)?,
                    a: o.src(cx, 1)?,
                    b: o.src(cx, 2)?,
                    c: o.src(cx, 3)?,
                }
            }
        }
        "div" => return o.bin(BinOp::Div, cx),
        "rem" => return o.bin(BinOp::Rem, cx),
        "min" => return o.bin(BinOp::Min, cx),
        "max" => return o.bin(BinOp::Max, cx),
        "copysign" => return o.bin(BinOp::CopySign, cx),
        "and" | "or" | "xor" if t == Ty::Pred => {
            let op = match base {
                "and" => BoolOp::And,
                "or" => BoolOp::Or,
                _ => BoolOp::Xor,
            };
            Ins::PredBin { op, d: o.dst(cx, 0)?, a: o.src(cx, 1)?, b: o.src(cx, 2)? }
        }
        "not" if t == Ty::Pred => Ins::PredNot { d: o.dst(cx, 0)?, a: o.src(cx, 1)? },
        "and" => return o.bin(BinOp::And, cx),
        "or" => return o.bin(BinOp::Or, cx),
        "xor" => return o.bin(BinOp::Xor, cx),
        "shl" => return o.bin(BinOp::Shl, cx),
        "shr" => return o.bin(BinOp::Shr, cx),
        "neg" => return o.un(UnOp::Neg, cx),
        "not" => return o.un(UnOp::Not, cx),
        "abs" => return o.un(UnOp::Abs, cx),
        "rcp" => return o.un(UnOp::Rcp { approx: has("approx") }, cx),
        "sqrt" => return o.un(UnOp::Sqrt { approx: has("approx") }, cx),
        "rsqrt" => return o.un(UnOp::Rsqrt, cx),
        "ex2" => return o.un(UnOp::Ex2, cx),
        "lg2" => return o.un(UnOp::Lg2, cx),
        "sin" => return o.un(UnOp::Sin, cx),
        "cos" => return o.un(UnOp::Cos, cx),
        "clz" => return o.un(UnOp::Clz, cx),
        "popc" => return o.un(UnOp::Popc, cx),
        "brev" => return o.un(UnOp::Brev, cx),
        "prmt" => {
            if mods.len() != 1 {
                return Ok(None);
            }
            Ins::Prmt { d: o.dst(cx, 0)?, a: o.src(cx, 1)?, b: o.src(cx, 2)?, c: o.src(cx, 3)? }
        }
        "bfi" => {
            Ins::Bfi { t, d: o.dst(cx, 0)?, a: o.src(cx, 1)?, b: o.src(cx, 2)?, pos: o.src(cx, 3)?, len: o.src(cx, 4)? }
        }
        "lop3" => {
            // The optional `.op.p` predicate form is not decoded.
            if t != Ty::B32 || mods.len() != 1 {
                return Ok(None);
            }
            let lut = match o.src(cx, 4)? {
                Opnd::I(v) if v <= 0xff => v as u8,
                x => return Err(format!("lop3 needs an immediate truth table below 256, not {x:?}")),
            };
            Ins::Lop3 { d: o.dst(cx, 0)?, a: o.src(cx, 1)?, b: o.src(cx, 2)?, c: o.src(cx, 3)?, lut }
        }
        "bfe" => Ins::Bfe { t, d: o.dst(cx, 0)?, a: o.src(cx, 1)?, pos: o.src(cx, 2)?, len: o.src(cx, 3)? },
        _ => return Ok(None),
    };
    Ok(Some(ins))
}

/// Moves (and vector packing), comparisons, selects and conversions.
fn moves(o: &Op, cx: &mut FnCtx) -> Result<Option<Ins>, String> {
    let Op { base, mods, t, rnd, ftz, .. } = *o;
    let has = |m: &str| o.has(m);
    let ins = match base {
        "mov" if matches!(o.arg(0)?, Raw::Vec(_)) => {
            let Raw::Vec(v) = o.arg(0)? else { unreachable!() };
            let mut d = [0u16; 4];
            for (k, r) in v.iter().enumerate().take(4) {
                d[k] = match r {
                    Raw::Reg(r) => cx.reg(r),
                    Raw::Sym(s) if s == "_" => cx.reg("%_sink"),
                    o => return Err(format!("bad vector element {o:?}")),
                };
            }
            let n = v.len().min(4) as u8;
            Ins::Unpack { d, n, w: (bits_of(t) / u32::from(n)) as u8, a: o.src(cx, 1)? }
        }
        "mov" if matches!(o.arg(1)?, Raw::Vec(_)) => {
            let Raw::Vec(vs) = o.arg(1)? else { unreachable!() };
            let mut v = [Opnd::I(0); 4];
            for (k, r) in vs.iter().enumerate().take(4) {
                v[k] = opnd(r, cx)?;
            }
            let n = vs.len().min(4) as u8;
            Ins::Pack { d: o.dst(cx, 0)?, n, w: (bits_of(t) / u32::from(n)) as u8, v }
        }
        "mov" => {
            let d = o.dst(cx, 0)?;
            match o.arg(1)? {
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
            let (d, dn) = match o.arg(0)? {
                Raw::Reg(r) => (cx.reg(r), None),
                Raw::Pair(r, q) => (cx.reg(r), Some(cx.reg(q))),
                o => return Err(format!("bad setp destination {o:?}")),
            };
            let comb = match comb {
                Some(op) => {
                    let (neg, o) = match o.arg(3)? {
                        Raw::Not(o) => (true, opnd(o, cx)?),
                        o => (false, opnd(o, cx)?),
                    };
                    Some((op, o, neg))
                }
                None => None,
            };
            Ins::Setp { cmp, t, ftz, d, dn, a: o.src(cx, 1)?, b: o.src(cx, 2)?, comb }
        }
        "selp" => Ins::Selp { t, d: o.dst(cx, 0)?, a: o.src(cx, 1)?, b: o.src(cx, 2)?, p: o.src(cx, 3)? },
        "cvt" => {
            let tys: Vec<Ty> = mods.iter().filter_map(|m| Ty::parse(m)).collect();
            if tys.len() != 2 {
                return Ok(None);
            }
            Ins::Cvt { dt: tys[0], st: tys[1], rnd, sat: has("sat"), ftz, d: o.dst(cx, 0)?, a: o.src(cx, 1)? }
        }
        "cvta" => {
            let to = has("to");
            let Some(sp) = mods.iter().find_map(|m| space_of(m)) else { return Ok(None) };
            let d = o.dst(cx, 0)?;
            let a = match o.arg(1)? {
                Raw::Sym(s) if cx.depot.as_deref() == Some(s.as_str()) => {
                    return Err("cvta of the local depot symbol is not supported".into())
                }
                o => opnd(o, cx)?,
            };
            Ins::Cvta { to, sp, d, a }
        }
        _ => return Ok(None),
    };
    Ok(Some(ins))
}

/// Loads, stores and atomics.
fn memory(o: &Op, cx: &mut FnCtx) -> Result<Option<Ins>, String> {
    let Op { base, mods, t, .. } = *o;
    let ins = match base {
        "ld" | "st" => {
            let sp = mods.iter().find_map(|m| space_of(m)).unwrap_or(Space::Generic);
            let n = mods.iter().find_map(|m| m.strip_prefix('v').and_then(|v| v.parse::<u8>().ok())).unwrap_or(1);
            let (mk, mv) = if base == "ld" { (1, 0) } else { (0, 1) };
            let addr = addr_of(o.arg(mk)?, sp, cx)?;
            if base == "ld" {
                let mut d = [0u16; 4];
                match o.arg(mv)? {
                    Raw::Vec(v) => {
                        for (k, r) in v.iter().enumerate().take(4) {
                            d[k] = match r {
                                Raw::Reg(r) => cx.reg(r),
                                o => return Err(format!("bad vector element {o:?}")),
                            };
                        }
                    }
                    Raw::Reg(r) => d[0] = cx.reg(r),
                    o => return Err(format!("bad load destination {o:?}")),
                }
                let wide = match o.arg(mv)? {
                    Raw::Reg(r) => cx.width(r) == 8,
                    Raw::Vec(v) => v.iter().any(|r| matches!(r, Raw::Reg(r) if cx.width(r) == 8)),
                    _ => false,
                };
                Ins::Ld { sp, t, n, d, addr, wide }
            } else {
                let mut v = [Opnd::I(0); 4];
                match o.arg(mv)? {
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
            // A pair of halves in a 32-bit word: an add only.
            let bf16 = o.has("bf16x2");
            let (op, t) = match (op, bf16 || o.has("f16x2")) {
                (AtomOp::Add, true) => (AtomOp::AddHalf2 { bf16 }, Ty::B32),
                (_, true) => return Ok(None),
                _ => (op, t),
            };
            // 8- and 16-bit atomics are not emitted for these kernels.
            if t.size() < 4 {
                return Ok(None);
            }
            // A vector (`.v2`, `.v4`, sm_90) of f32 or packed halves,
            // without `cas`.
            let n = mods.iter().find_map(|m| m.strip_prefix('v').and_then(|v| v.parse::<u8>().ok())).unwrap_or(1);
            if !matches!(n, 1 | 2 | 4) || n > 1 && (op == AtomOp::Cas || !matches!(t, Ty::F32 | Ty::B32)) {
                return Ok(None);
            }
            let (dk, ak) = if base == "atom" { (Some(0), 1) } else { (None, 0) };
            let addr = addr_of(o.arg(ak)?, sp, cx)?;
            let d = match dk {
                Some(k) => Some(match o.arg(k)? {
                    Raw::Vec(v) if v.len() == n as usize => {
                        let mut d = [0u16; 4];
                        for (x, r) in d.iter_mut().zip(v) {
                            *x = match r {
                                Raw::Reg(r) => cx.reg(r),
                                o => return Err(format!("bad vector element {o:?}")),
                            };
                        }
                        d
                    }
                    Raw::Reg(r) if n == 1 => [cx.reg(r), 0, 0, 0],
                    o => return Err(format!("bad atomic destination {o:?} for {n} elements")),
                }),
                None => None,
            };
            let mut b = [Opnd::I(0); 4];
            match o.arg(ak + 1)? {
                Raw::Vec(v) if v.len() == n as usize => {
                    for (x, r) in b.iter_mut().zip(v) {
                        *x = opnd(r, cx)?;
                    }
                }
                Raw::Vec(v) => return Err(format!("{} values for an atomic of {n} elements", v.len())),
                r if n == 1 => b[0] = opnd(r, cx)?,
                r => return Err(format!("bad atomic operand {r:?} for {n} elements")),
            }
            let c = if op == AtomOp::Cas { o.src(cx, ak + 2)? } else { Opnd::I(0) };
            Ins::Atom { sp, op, t, n, d, addr, b, c }
        }
        _ => return Ok(None),
    };
    Ok(Some(ins))
}

/// `cvt.rn.{f16x2,bf16x2}.f32 d, a, b`: `a` to the upper half, `b` to the
/// lower (`.rz`, `.rs`, `.relu` and `.satfinite` are not supported).
fn cvt_pack(o: &Op, cx: &mut FnCtx) -> Result<Option<Ins>, String> {
    let rnd = match o.mods {
        ["rn", _, "f32"] => Rnd::Rn,
        _ => return Ok(None),
    };
    let bf16 = o.has("bf16x2");
    Ok(Some(Ins::CvtPack { bf16, rnd, d: o.dst(cx, 0)?, a: o.src(cx, 1)?, b: o.src(cx, 2)? }))
}

/// Branches, barriers, warp collectives, calls and returns.
fn control(o: &Op, cx: &mut FnCtx, labels: &HashMap<String, u32>) -> Result<Option<Ins>, String> {
    let Op { base, mods, .. } = *o;
    let has = |m: &str| o.has(m);
    let ins = match base {
        "bra" => {
            let Raw::Sym(l) = o.arg(0)? else { return Err("bad branch target".into()) };
            let target = *labels.get(l).ok_or_else(|| format!("no label {l}"))?;
            Ins::Bra { target }
        }
        "bar" | "barrier" => {
            if has("warp") {
                Ins::WarpSync { mask: o.src(cx, 0)? }
            } else if o.args.len() > 1 {
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
            let (d, dp) = match o.arg(0)? {
                Raw::Reg(r) => (cx.reg(r), None),
                Raw::Pair(r, q) => (cx.reg(r), Some(cx.reg(q))),
                o => return Err(format!("bad shfl destination {o:?}")),
            };
            Ins::Shfl { mode, d, dp, a: o.src(cx, 1)?, b: o.src(cx, 2)?, c: o.src(cx, 3)?, mask: o.src(cx, 4)? }
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
            let d = o.dst(cx, 0)?;
            let (neg, a) = match o.arg(1)? {
                Raw::Not(x) => (true, opnd(x, cx)?),
                x => (false, opnd(x, cx)?),
            };
            Ins::Vote { mode, d, a, neg, mask: o.src(cx, 2)? }
        }
        "call" => {
            let ret = match &o.args[0] {
                Raw::Sym(r) => Some(*cx.params.get(r).ok_or_else(|| format!("no param {r}"))?),
                _ => None,
            };
            let Raw::Sym(f) = &o.args[1] else { return Err("bad call target".into()) };
            let func = *cx.syms.funcs.get(f).ok_or_else(|| format!("no function {f}"))?;
            let mut args = Vec::new();
            for x in &o.args[2..] {
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

/// The registers of a vector operand `{%r1, %r2, ...}` of exactly `n`.
fn reg_vec<const N: usize>(o: &Op, cx: &mut FnCtx, k: usize) -> Result<[u16; N], String> {
    let regs: Vec<&Raw> = match o.arg(k)? {
        Raw::Vec(v) => v.iter().collect(),
        r @ Raw::Reg(_) => vec![r],
        x => return Err(format!("operand {k} is not a vector of registers: {x:?}")),
    };
    if regs.len() != N {
        return Err(format!("operand {k} has {} registers, expected {N}", regs.len()));
    }
    let mut out = [0u16; N];
    for (slot, r) in out.iter_mut().zip(regs) {
        *slot = match r {
            Raw::Reg(r) => cx.reg(r),
            x => return Err(format!("operand {k} holds {x:?}, not a register")),
        };
    }
    Ok(out)
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.X.X.f32` with X f16 or bf16:
/// the one shape and layout the interpreter has (others are unsupported).
fn mma(o: &Op, cx: &mut FnCtx) -> Result<Option<Ins>, String> {
    let tys: Vec<Ty> = o.mods.iter().filter_map(|m| Ty::parse(m)).collect();
    let shape_ok = ["sync", "aligned", "m16n8k16", "row", "col"].iter().all(|m| o.has(m));
    let bf16 = match tys.as_slice() {
        [Ty::F32, Ty::F16, Ty::F16, Ty::F32] => false,
        [Ty::F32, Ty::Bf16, Ty::Bf16, Ty::F32] => true,
        _ => return Ok(None),
    };
    if !shape_ok || o.mods.len() != 9 {
        return Ok(None);
    }
    Ok(Some(Ins::Mma {
        bf16,
        d: reg_vec::<4>(o, cx, 0)?,
        a: reg_vec::<4>(o, cx, 1)?,
        b: reg_vec::<2>(o, cx, 2)?,
        c: reg_vec::<4>(o, cx, 3)?,
    }))
}

/// `ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared{::cta}.b16`.
fn ldmatrix(o: &Op, cx: &mut FnCtx) -> Result<Option<Ins>, String> {
    let n: u8 = match o.mods.iter().find_map(|m| match *m {
        "x1" => Some(1),
        "x2" => Some(2),
        "x4" => Some(4),
        _ => None,
    }) {
        Some(n) => n,
        None => return Ok(None),
    };
    let trans = o.has("trans");
    let known = |m: &&str| matches!(*m, "sync" | "aligned" | "m8n8" | "x1" | "x2" | "x4" | "trans" | "b16");
    let shared = o.mods.iter().any(|m| matches!(*m, "shared" | "shared::cta"));
    if !["sync", "aligned", "m8n8", "b16"].iter().all(|m| o.has(m))
        || !shared
        || o.mods.iter().filter(|m| !known(m)).count() != 1
    {
        return Ok(None);
    }
    let mut d = [0u16; 4];
    match n {
        1 => d[..1].copy_from_slice(&reg_vec::<1>(o, cx, 0)?),
        2 => d[..2].copy_from_slice(&reg_vec::<2>(o, cx, 0)?),
        _ => d = reg_vec::<4>(o, cx, 0)?,
    }
    let addr = addr_of(o.arg(1)?, Space::Shared, cx)?;
    Ok(Some(Ins::Ldmatrix { n, trans, d, addr }))
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
