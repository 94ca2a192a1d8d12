//! Instructions lowered once per function for the warp's lane loop.
//!
//! A decoded [`Inst`] names its operation by several enums (the
//! instruction, its operation, type, rounding, flush-to-zero); running it
//! through `Warp::step` matches on all of them for every warp-instruction.
//! Lowering does those matches once, when a function is first launched
//! (kept in `Func::derived`), and picks for each register-to-register
//! instruction a handler: a lane loop in which the operation is a
//! constant, with its operands resolved beside it. The interpreter calls
//! the handler directly; the instructions without one (memory, control,
//! collectives, the rare operations) take `Warp::step` as before.
//!
//! Every handler calls the `numeric` function that `Warp::alu` calls for
//! the same instruction, with `alu`'s arguments fixed at lowering, so
//! lowering changes the speed only; `alu` keeps the general forms (carry
//! chains, flush-to-zero, the rare types) and none of the loops here.
//! The instructions lowered in every form (`selp`, the predicate logic,
//! `cvta`, `prmt`) are not in `alu` at all.

use super::numeric::*;
use super::warp::{Warp, FULL, WARP};
use crate::ptx::*;

/// A lowered instruction's lane loop: applies `op` to the lanes `m` (not
/// empty) of the warp.
pub(super) type Handler = fn(&mut Warp, &Op, u32);

/// One lowered instruction.
#[derive(Debug, Clone)]
pub(super) struct Op {
    /// The lane loop, or None for the general path (`Warp::step`).
    pub(super) run: Option<Handler>,
    /// A branch's target (`bra` takes the general path's decision
    /// without its dispatch).
    pub(super) bra: Option<u32>,
    /// The guard predicate register and whether it is negated.
    pub(super) guard: Option<(u16, bool)>,
    pub(super) d: u16,
    pub(super) a: Opnd,
    pub(super) b: Opnd,
    pub(super) c: Opnd,
    /// A constant of the operation that is not worth a handler of its own
    /// (the mask of a `mov` or `selp` type, the window of a `cvta`).
    pub(super) k: u64,
}

/// The lowered instructions of `f`, one for each of `f.insts`.
pub(crate) fn lower(f: &Func) -> Vec<Op> {
    f.insts.iter().map(lower_one).collect()
}

/// A whole warp's `out[l] = f(a[l * SA], b[l * SB], c[l * SC])`, the
/// strides (1: a register's lanes, 0: an immediate) constants, so the
/// compiler sees plain array loops it can unroll and vectorise.
///
/// # Safety
/// `out` must be valid for 32 writes, each source for 32 reads at its
/// stride; a source may be `out` itself (lane `l` is read before written).
#[inline(always)]
unsafe fn full<const SA: usize, const SB: usize, const SC: usize>(
    out: *mut u64,
    (pa, pb, pc): (*const u64, *const u64, *const u64),
    f: impl Fn(u64, u64, u64) -> u64,
) {
    for l in 0..WARP {
        *out.add(l) = f(*pa.add(l * SA), *pb.add(l * SB), *pc.add(l * SC));
    }
}

/// `d = f(a, b, c)` over the lanes `m`, as `Warp::map3` computes it, with a
/// loop of its own for each register-or-immediate pattern of a whole warp.
#[inline(always)]
fn lanes3(w: &mut Warp, m: u32, o: &Op, f: impl Fn(u64, u64, u64) -> u64) {
    if m != FULL {
        return w.map3(m, o.d, &o.a, &o.b, &o.c, f);
    }
    let ((pa, sa), (pb, sb), (pc, sc)) = (w.src(&o.a), w.src(&o.b), w.src(&o.c));
    let out = w.regs[o.d as usize * WARP..][..WARP].as_mut_ptr();
    let p = (pa, pb, pc);
    // SAFETY: `src` gives a register's 32 lanes or one immediate of `o`.
    unsafe {
        match (sa, sb, sc) {
            (1, 1, 1) => full::<1, 1, 1>(out, p, f),
            (1, 1, _) => full::<1, 1, 0>(out, p, f),
            (1, _, 1) => full::<1, 0, 1>(out, p, f),
            (1, _, _) => full::<1, 0, 0>(out, p, f),
            (_, 1, 1) => full::<0, 1, 1>(out, p, f),
            (_, 1, _) => full::<0, 1, 0>(out, p, f),
            (_, _, 1) => full::<0, 0, 1>(out, p, f),
            _ => full::<0, 0, 0>(out, p, f),
        }
    }
}

/// `d = f(a, b)` over the lanes `m` (`o.c` unused).
#[inline(always)]
fn lanes2(w: &mut Warp, m: u32, o: &Op, f: impl Fn(u64, u64) -> u64) {
    if m != FULL {
        return w.map2(m, o.d, &o.a, &o.b, f);
    }
    let ((pa, sa), (pb, sb)) = (w.src(&o.a), w.src(&o.b));
    let out = w.regs[o.d as usize * WARP..][..WARP].as_mut_ptr();
    let p = (pa, pb, pa);
    let g = |x, y, _| f(x, y);
    // SAFETY: as in `lanes3`.
    unsafe {
        match (sa, sb) {
            (1, 1) => full::<1, 1, 0>(out, p, g),
            (1, _) => full::<1, 0, 0>(out, p, g),
            (_, 1) => full::<0, 1, 0>(out, p, g),
            _ => full::<0, 0, 0>(out, p, g),
        }
    }
}

/// `d = f(a)` over the lanes `m` (`o.b`, `o.c` unused).
#[inline(always)]
fn lanes1(w: &mut Warp, m: u32, o: &Op, f: impl Fn(u64) -> u64) {
    if m != FULL {
        return w.map1(m, o.d, &o.a, f);
    }
    let (pa, sa) = w.src(&o.a);
    let out = w.regs[o.d as usize * WARP..][..WARP].as_mut_ptr();
    let p = (pa, pa, pa);
    let g = |x, _, _| f(x);
    // SAFETY: as in `lanes3`.
    unsafe {
        if sa == 1 {
            full::<1, 0, 0>(out, p, g)
        } else {
            full::<0, 0, 0>(out, p, g)
        }
    }
}

/// `d = f(a)` over the lanes, `f` a closure of the operands and `o.k`.
macro_rules! h1 {
    (|$x:ident| $e:expr) => {
        Some(|w: &mut Warp, o: &Op, m: u32| lanes1(w, m, o, |$x| $e))
    };
    (|$x:ident, $k:ident| $e:expr) => {
        Some(|w: &mut Warp, o: &Op, m: u32| {
            let $k = o.k;
            lanes1(w, m, o, |$x| $e)
        })
    };
}

/// `d = f(a, b)` over the lanes.
macro_rules! h2 {
    (|$x:ident, $y:ident| $e:expr) => {
        Some(|w: &mut Warp, o: &Op, m: u32| lanes2(w, m, o, |$x, $y| $e))
    };
}

/// `d = f(a, b, c)` over the lanes.
macro_rules! h3 {
    (|$x:ident, $y:ident, $z:ident| $e:expr) => {
        Some(|w: &mut Warp, o: &Op, m: u32| lanes3(w, m, o, |$x, $y, $z| $e))
    };
    (|$x:ident, $y:ident, $z:ident, $k:ident| $e:expr) => {
        Some(|w: &mut Warp, o: &Op, m: u32| {
            let $k = o.k;
            lanes3(w, m, o, |$x, $y, $z| $e)
        })
    };
}

fn lower_one(inst: &Inst) -> Op {
    let none = Opnd::I(0);
    let mut op = Op { run: None, bra: None, guard: inst.guard, d: 0, a: none, b: none, c: none, k: 0 };
    let (run, d, a, b, c, k): (Option<Handler>, u16, Opnd, Opnd, Opnd, u64) = match inst.ins {
        Ins::Bin { op: o, t, ftz, rnd, d, a, b } => (bin_handler(o, t, ftz, rnd), d, a, b, none, 0),
        Ins::Un { op: o, t, ftz, d, a } => {
            let (run, k) = un_handler(o, t, ftz);
            (run, d, a, none, none, k)
        }
        Ins::Fma { t: Ty::F32, rnd: Rnd::Rn | Rnd::None, ftz: false, d, a, b, c } => (Some(fma_f32), d, a, b, c, 0),
        Ins::Fma { t: Ty::F64, rnd: Rnd::Rn | Rnd::None, ftz: false, d, a, b, c } => {
            (h3!(|x, y, z| fma(Ty::F64, Rnd::Rn, false, x, y, z)), d, a, b, c, 0)
        }
        Ins::Fma { t: Ty::F32, rnd, ftz: false, d, a, b, c } => (fma_f32_directed(rnd), d, a, b, c, 0),
        Ins::Mad { t, hi, wide, cc_in: false, cc_out: false, d, a, b, c } => (mad_handler(t, hi, wide), d, a, b, c, 0),
        Ins::Setp { cmp, t, ftz: false, d, dn: None, a, b, comb: None } => (setp_handler(cmp, t), d, a, b, none, 0),
        Ins::Selp { t, d, a, b, p } => {
            (h3!(|x, y, p, mk| if p != 0 { x & mk } else { y & mk }), d, a, b, p, mask_of(bits(t)))
        }
        Ins::PredBin { op: o, d, a, b } => {
            let run: Option<Handler> = match o {
                BoolOp::And => h2!(|x, y| u64::from((x != 0) & (y != 0))),
                BoolOp::Or => h2!(|x, y| u64::from((x != 0) | (y != 0))),
                BoolOp::Xor => h2!(|x, y| u64::from((x != 0) ^ (y != 0))),
            };
            (run, d, a, b, none, 0)
        }
        Ins::PredNot { d, a } => (h1!(|x| u64::from(x == 0)), d, a, none, none, 0),
        Ins::Cvt { dt, st, rnd, sat, ftz, d, a } => (cvt_handler(dt, st, rnd, sat, ftz), d, a, none, none, 0),
        Ins::Cvta { to, sp, d, a } => {
            let win = match sp {
                Space::Shared => crate::memory::SHARED_WIN,
                Space::Local => crate::memory::LOCAL_WIN,
                _ => 0,
            };
            let run: Option<Handler> =
                if to { h1!(|x, win| x.wrapping_sub(win)) } else { h1!(|x, win| x.wrapping_add(win)) };
            (run, d, a, none, none, win)
        }
        Ins::Prmt { d, a, b, c } => (h3!(|x, y, z| prmt(x, y, z)), d, a, b, c, 0),
        Ins::Lop3 { d, a, b, c, lut } => (h3!(|x, y, z, k| lop3(x, y, z, k)), d, a, b, c, u64::from(lut)),
        Ins::Bra { target } => {
            op.bra = Some(target);
            return op;
        }
        _ => return op,
    };
    (op.run, op.d, op.a, op.b, op.c, op.k) = (run, d, a, b, c, k);
    op
}

/// The loops of `bin_op`'s frequent pairs, and integer division. Others
/// (carry chains, directed rounding, flush-to-zero, the rare pairs) take
/// the general path, which also reports an unsupported pair.
fn bin_handler(op: BinOp, t: Ty, ftz: bool, rnd: Rnd) -> Option<Handler> {
    if ftz || !matches!(rnd, Rnd::Rn | Rnd::None) {
        return None;
    }
    // The operation and type are constants in each loop; signedness does
    // not change add, sub, mul.lo or the logic operations.
    macro_rules! go {
        ($op:expr, $t:expr) => {
            h2!(|x, y| bin($op, $t, false, Rnd::None, x, y, &mut false).unwrap_or(0))
        };
    }
    use BinOp as B;
    match (op, t) {
        (B::Add, Ty::F32) => go!(B::Add, Ty::F32),
        (B::Sub, Ty::F32) => go!(B::Sub, Ty::F32),
        (B::Mul, Ty::F32) => go!(B::Mul, Ty::F32),
        (B::Div, Ty::F32) => go!(B::Div, Ty::F32),
        (B::Max, Ty::F32) => go!(B::Max, Ty::F32),
        (B::Min, Ty::F32) => go!(B::Min, Ty::F32),
        (B::Add, Ty::F64) => go!(B::Add, Ty::F64),
        (B::Sub, Ty::F64) => go!(B::Sub, Ty::F64),
        (B::Mul, Ty::F64) => go!(B::Mul, Ty::F64),
        (B::Div, Ty::F64) => go!(B::Div, Ty::F64),
        (B::Add, Ty::U32 | Ty::S32 | Ty::B32) => go!(B::Add, Ty::U32),
        (B::Sub, Ty::U32 | Ty::S32 | Ty::B32) => go!(B::Sub, Ty::U32),
        (B::Mul, Ty::U32 | Ty::S32 | Ty::B32) => go!(B::Mul, Ty::U32),
        (B::Add, Ty::U64 | Ty::S64 | Ty::B64) => go!(B::Add, Ty::U64),
        (B::Sub, Ty::U64 | Ty::S64 | Ty::B64) => go!(B::Sub, Ty::U64),
        (B::Mul, Ty::U64 | Ty::S64 | Ty::B64) => go!(B::Mul, Ty::U64),
        (B::MulWide, Ty::U32) => go!(B::MulWide, Ty::U32),
        (B::MulWide, Ty::S32) => go!(B::MulWide, Ty::S32),
        (B::MulHi, Ty::U32) => go!(B::MulHi, Ty::U32),
        (B::MulHi, Ty::S32) => go!(B::MulHi, Ty::S32),
        (B::And, Ty::U32 | Ty::S32 | Ty::B32) => go!(B::And, Ty::U32),
        (B::Or, Ty::U32 | Ty::S32 | Ty::B32) => go!(B::Or, Ty::U32),
        (B::Xor, Ty::U32 | Ty::S32 | Ty::B32) => go!(B::Xor, Ty::U32),
        (B::And, Ty::U64 | Ty::S64 | Ty::B64) => go!(B::And, Ty::U64),
        (B::Or, Ty::U64 | Ty::S64 | Ty::B64) => go!(B::Or, Ty::U64),
        (B::Xor, Ty::U64 | Ty::S64 | Ty::B64) => go!(B::Xor, Ty::U64),
        (B::And, Ty::B16 | Ty::U16 | Ty::S16) => go!(B::And, Ty::U16),
        (B::Shl, Ty::U32 | Ty::S32 | Ty::B32) => go!(B::Shl, Ty::U32),
        (B::Shl, Ty::U64 | Ty::S64 | Ty::B64) => go!(B::Shl, Ty::U64),
        (B::Shr, Ty::U32 | Ty::B32) => go!(B::Shr, Ty::U32),
        (B::Shr, Ty::S32) => go!(B::Shr, Ty::S32),
        (B::Shr, Ty::U64 | Ty::B64) => go!(B::Shr, Ty::U64),
        (B::Shr, Ty::S64) => go!(B::Shr, Ty::S64),
        (B::Min, Ty::S32) => go!(B::Min, Ty::S32),
        (B::Max, Ty::S32) => go!(B::Max, Ty::S32),
        (B::Min, Ty::U32) => go!(B::Min, Ty::U32),
        (B::Max, Ty::U32) => go!(B::Max, Ty::U32),
        (B::Min, Ty::S64) => go!(B::Min, Ty::S64),
        (B::Max, Ty::S64) => go!(B::Max, Ty::S64),
        (B::Min, Ty::U64) => go!(B::Min, Ty::U64),
        (B::Max, Ty::U64) => go!(B::Max, Ty::U64),
        (B::Div, Ty::U32) => go!(B::Div, Ty::U32),
        (B::Div, Ty::S32) => go!(B::Div, Ty::S32),
        (B::Div, Ty::U64) => go!(B::Div, Ty::U64),
        (B::Div, Ty::S64) => go!(B::Div, Ty::S64),
        (B::Rem, Ty::U32) => go!(B::Rem, Ty::U32),
        (B::Rem, Ty::S32) => go!(B::Rem, Ty::S32),
        (B::Rem, Ty::U64) => go!(B::Rem, Ty::U64),
        (B::Rem, Ty::S64) => go!(B::Rem, Ty::S64),
        _ => None,
    }
}

/// `fma.f32` rounding toward zero or an infinity (`expf`'s range
/// reduction uses `fma.rm`), the rounding a constant in each loop.
fn fma_f32_directed(rnd: Rnd) -> Option<Handler> {
    match rnd {
        Rnd::Rz => h3!(|x, y, z| fma(Ty::F32, Rnd::Rz, false, x, y, z)),
        Rnd::Rm => h3!(|x, y, z| fma(Ty::F32, Rnd::Rm, false, x, y, z)),
        Rnd::Rp => h3!(|x, y, z| fma(Ty::F32, Rnd::Rp, false, x, y, z)),
        _ => None,
    }
}

/// The loops of `un_op`, and the constant (a `mov`'s mask) they read.
fn un_handler(op: UnOp, t: Ty, ftz: bool) -> (Option<Handler>, u64) {
    match (op, t) {
        (UnOp::Mov, Ty::Pred) => (h1!(|x| u64::from(x != 0)), 0),
        (UnOp::Mov, _) => (h1!(|x, mk| x & mk), mask_of(bits(t))),
        (UnOp::Neg, Ty::F32) => (h1!(|x| x ^ 0x8000_0000), 0),
        (UnOp::Abs, Ty::F32) => (h1!(|x| x & 0x7fff_ffff), 0),
        (UnOp::Not, Ty::B32 | Ty::U32 | Ty::S32) => (h1!(|x| un(UnOp::Not, Ty::B32, false, x)), 0),
        (UnOp::Not, Ty::B64 | Ty::U64 | Ty::S64) => (h1!(|x| un(UnOp::Not, Ty::B64, false, x)), 0),
        (UnOp::Neg, Ty::S32) => (h1!(|x| un(UnOp::Neg, Ty::S32, false, x)), 0),
        (UnOp::Neg, Ty::S64) => (h1!(|x| un(UnOp::Neg, Ty::S64, false, x)), 0),
        // As `un` computes them, without its dispatch for every lane.
        (UnOp::Ex2, Ty::F32) if !ftz => (h1!(|x| bf32(f32b(x).exp2())), 0),
        (UnOp::Ex2, Ty::F32) => (h1!(|x| bf32(ftz32(ftz32(f32b(x)).exp2()))), 0),
        (UnOp::Lg2, Ty::F32) if !ftz => (h1!(|x| bf32(f32b(x).log2())), 0),
        (UnOp::Lg2, Ty::F32) => (h1!(|x| bf32(ftz32(ftz32(f32b(x)).log2()))), 0),
        // `un` divides for `rcp.f32`, approximate or not.
        (UnOp::Rcp { .. }, Ty::F32) if !ftz => (h1!(|x| un(UnOp::Rcp { approx: true }, Ty::F32, false, x)), 0),
        _ => (None, 0),
    }
}

/// Integer `mad` without carries, for the frequent types.
fn mad_handler(t: Ty, hi: bool, wide: bool) -> Option<Handler> {
    macro_rules! go {
        ($t:expr, $hi:expr, $wide:expr) => {
            h3!(|x, y, z| mad($t, $hi, $wide, false, false, x, y, z, &mut false))
        };
    }
    match (t, hi, wide) {
        (Ty::S32, false, false) => go!(Ty::S32, false, false),
        (Ty::U32, false, false) => go!(Ty::U32, false, false),
        (Ty::S32, false, true) => go!(Ty::S32, false, true),
        (Ty::U32, false, true) => go!(Ty::U32, false, true),
        (Ty::S64, false, false) => go!(Ty::S64, false, false),
        (Ty::U64, false, false) => go!(Ty::U64, false, false),
        _ => None,
    }
}

/// `setp` without a second destination, a combining predicate or
/// flush-to-zero, the comparison and type constants in each loop.
fn setp_handler(cmp: Cmp, t: Ty) -> Option<Handler> {
    macro_rules! go {
        ($c:expr, $t:expr) => {
            h2!(|x, y| u64::from(setp($c, $t, false, x, y)))
        };
    }
    macro_rules! cmps {
        ($t:expr) => {
            match cmp {
                Cmp::Eq => go!(Cmp::Eq, $t),
                Cmp::Ne => go!(Cmp::Ne, $t),
                Cmp::Lt => go!(Cmp::Lt, $t),
                Cmp::Le => go!(Cmp::Le, $t),
                Cmp::Gt => go!(Cmp::Gt, $t),
                Cmp::Ge => go!(Cmp::Ge, $t),
                Cmp::Lo => go!(Cmp::Lo, $t),
                Cmp::Ls => go!(Cmp::Ls, $t),
                Cmp::Hi => go!(Cmp::Hi, $t),
                Cmp::Hs => go!(Cmp::Hs, $t),
                _ => None,
            }
        };
    }
    macro_rules! fcmps {
        ($t:expr) => {
            match cmp {
                Cmp::Eq => go!(Cmp::Eq, $t),
                Cmp::Ne => go!(Cmp::Ne, $t),
                Cmp::Lt => go!(Cmp::Lt, $t),
                Cmp::Le => go!(Cmp::Le, $t),
                Cmp::Gt => go!(Cmp::Gt, $t),
                Cmp::Ge => go!(Cmp::Ge, $t),
                Cmp::Equ => go!(Cmp::Equ, $t),
                Cmp::Neu => go!(Cmp::Neu, $t),
                Cmp::Ltu => go!(Cmp::Ltu, $t),
                Cmp::Leu => go!(Cmp::Leu, $t),
                Cmp::Gtu => go!(Cmp::Gtu, $t),
                Cmp::Geu => go!(Cmp::Geu, $t),
                Cmp::Num => go!(Cmp::Num, $t),
                Cmp::Nan => go!(Cmp::Nan, $t),
                _ => None,
            }
        };
    }
    match t {
        Ty::S32 => cmps!(Ty::S32),
        Ty::U32 | Ty::B32 => cmps!(Ty::U32),
        Ty::S64 => cmps!(Ty::S64),
        Ty::U64 | Ty::B64 => cmps!(Ty::U64),
        Ty::S16 => cmps!(Ty::S16),
        Ty::U16 | Ty::B16 => cmps!(Ty::U16),
        Ty::F32 => fcmps!(Ty::F32),
        Ty::F64 => fcmps!(Ty::F64),
        _ => None,
    }
}

/// The loops of `cvt_op`.
fn cvt_handler(dt: Ty, st: Ty, rnd: Rnd, sat: bool, ftz: bool) -> Option<Handler> {
    macro_rules! go {
        ($dt:expr, $st:expr, $rnd:expr) => {
            h1!(|x| cvt($dt, $st, $rnd, false, false, x))
        };
    }
    // A conversion to an integer or between floats of different widths
    // rounds by `rnd`: each rounding is a loop of its own.
    macro_rules! rnds {
        ($dt:expr, $st:expr) => {
            match rnd {
                Rnd::None => go!($dt, $st, Rnd::None),
                Rnd::Rn => go!($dt, $st, Rnd::Rn),
                Rnd::Rz => go!($dt, $st, Rnd::Rz),
                Rnd::Rm => go!($dt, $st, Rnd::Rm),
                Rnd::Rp => go!($dt, $st, Rnd::Rp),
                Rnd::Rni => go!($dt, $st, Rnd::Rni),
                Rnd::Rzi => go!($dt, $st, Rnd::Rzi),
                Rnd::Rmi => go!($dt, $st, Rnd::Rmi),
                Rnd::Rpi => go!($dt, $st, Rnd::Rpi),
            }
        };
    }
    match (dt, st) {
        (Ty::F32, Ty::F32) if sat && !ftz && !matches!(rnd, Rnd::Rni | Rnd::Rzi | Rnd::Rmi | Rnd::Rpi) => h1!(|x| {
            let v = f32b(x);
            bf32(if v.is_nan() { 0.0 } else { v.clamp(0.0, 1.0) })
        }),
        _ if sat || ftz => None,
        (Ty::F32, Ty::F64) if matches!(rnd, Rnd::Rn | Rnd::None) => h1!(|x| bf32(f64b(x) as f32)),
        (Ty::U64, Ty::U32) => rnds!(Ty::U64, Ty::U32),
        (Ty::S64, Ty::S32) => rnds!(Ty::S64, Ty::S32),
        (Ty::U32, Ty::U64) => rnds!(Ty::U32, Ty::U64),
        (Ty::S32, Ty::S64) => rnds!(Ty::S32, Ty::S64),
        (Ty::U64, Ty::U16) => rnds!(Ty::U64, Ty::U16),
        (Ty::U32, Ty::U16) => rnds!(Ty::U32, Ty::U16),
        (Ty::U16, Ty::U32) => rnds!(Ty::U16, Ty::U32),
        (Ty::F32, Ty::S32) => rnds!(Ty::F32, Ty::S32),
        (Ty::F32, Ty::U32) => rnds!(Ty::F32, Ty::U32),
        (Ty::F32, Ty::S64) => rnds!(Ty::F32, Ty::S64),
        (Ty::F32, Ty::U64) => rnds!(Ty::F32, Ty::U64),
        (Ty::S32, Ty::F32) => rnds!(Ty::S32, Ty::F32),
        (Ty::U32, Ty::F32) => rnds!(Ty::U32, Ty::F32),
        (Ty::S64, Ty::F32) => rnds!(Ty::S64, Ty::F32),
        (Ty::F64, Ty::F32) => rnds!(Ty::F64, Ty::F32),
        (Ty::F32, Ty::F16) => rnds!(Ty::F32, Ty::F16),
        (Ty::F32, Ty::Bf16) => rnds!(Ty::F32, Ty::Bf16),
        (Ty::F16, Ty::F32) => rnds!(Ty::F16, Ty::F32),
        (Ty::Bf16, Ty::F32) => rnds!(Ty::Bf16, Ty::F32),
        _ => None,
    }
}

/// `fma.rn.f32` of the lanes `m`, on the host's FMA unit when it has one:
/// built without that target feature, `f32::mul_add` is a call into libm
/// for each lane. The result is the same either way (one rounding of the
/// exact product and sum).
fn fma_f32(w: &mut Warp, o: &Op, m: u32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the feature.
        unsafe { fma_f32_hw(w, o, m) };
        return;
    }
    w.map3(m, o.d, &o.a, &o.b, &o.c, |x, y, z| bf32(f32b(x).mul_add(f32b(y), f32b(z))));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
fn fma_f32_hw(w: &mut Warp, o: &Op, m: u32) {
    w.map3(m, o.d, &o.a, &o.b, &o.c, |x, y, z| bf32(f32b(x).mul_add(f32b(y), f32b(z))));
}
