//! The arithmetic of PTX: integer widths, float rounding modes,
//! comparisons, conversions and atomic read-modify-writes.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use half::{bf16, f16};

use crate::ptx::*;

pub(super) fn f32b(v: u64) -> f32 {
    f32::from_bits(v as u32)
}
pub(super) fn f64b(v: u64) -> f64 {
    f64::from_bits(v)
}
pub(super) fn bf32(v: f32) -> u64 {
    u64::from(v.to_bits())
}

pub(super) fn ftz32(x: f32) -> f32 {
    if x.is_subnormal() {
        f32::from_bits(x.to_bits() & 0x8000_0000)
    } else {
        x
    }
}
pub(super) fn ftz64(x: f64) -> f64 {
    if x.is_subnormal() {
        f64::from_bits(x.to_bits() & (1 << 63))
    } else {
        x
    }
}

/// Width in bits of an integer type (pred counts as 1 byte).
pub(super) fn bits(t: Ty) -> u32 {
    t.size() * 8
}
pub(super) fn mask_of(w: u32) -> u64 {
    if w >= 64 {
        u64::MAX
    } else {
        (1u64 << w) - 1
    }
}
/// Sign-extends the low `w` bits.
pub(super) fn sext(v: u64, w: u32) -> i64 {
    if w >= 64 {
        v as i64
    } else {
        ((v << (64 - w)) as i64) >> (64 - w)
    }
}

/// `$name(x, up)`: the next `$t` after `x` toward +inf (`up`) or -inf.
macro_rules! next_float {
    ($name:ident, $t:ty) => {
        fn $name(x: $t, up: bool) -> $t {
            if x.is_nan() || (x.is_infinite() && (x > 0.0) == up) {
                return x;
            }
            if x == 0.0 {
                let tiny = <$t>::from_bits(1);
                return if up { tiny } else { -tiny };
            }
            let b = x.to_bits();
            let b = if (x > 0.0) == up { b + 1 } else { b - 1 };
            <$t>::from_bits(b)
        }
    };
}
next_float!(next_f32, f32);
next_float!(next_f64, f64);

/// Rounds the exact value `s + e` (an f64 and its error term) to f32 with
/// a directed mode; the nearest mode is the plain cast.
pub(super) fn round_f32(s: f64, e: f64, rnd: Rnd) -> f32 {
    let r = s as f32;
    if matches!(rnd, Rnd::None | Rnd::Rn) || !r.is_finite() && s.is_nan() {
        return r;
    }
    // The sign of (exact - r), computed without rounding it away.
    let diff = if r.is_infinite() {
        if s.is_infinite() {
            0.0
        } else {
            -f64::from(r.signum())
        }
    } else {
        (s - f64::from(r)) + e
    };
    let want_up = match rnd {
        Rnd::Rp => true,
        Rnd::Rm => false,
        // Toward zero: down when positive.
        _ => r < 0.0 || (r == 0.0 && (s < 0.0 || (s == 0.0 && e < 0.0))),
    };
    if diff > 0.0 && want_up {
        next_f32(r, true)
    } else if diff < 0.0 && !want_up {
        next_f32(r, false)
    } else if r.is_infinite() && diff != 0.0 {
        // Overflowed to infinity though the exact value is finite.
        if (r > 0.0) != want_up {
            next_f32(r, r < 0.0)
        } else {
            r
        }
    } else {
        r
    }
}

/// Rounds `s + e` (exact as a pair) to f64 with a directed mode.
pub(super) fn round_f64(s: f64, e: f64, rnd: Rnd) -> f64 {
    if matches!(rnd, Rnd::None | Rnd::Rn) || e == 0.0 || !s.is_finite() {
        return s;
    }
    let up = match rnd {
        Rnd::Rp => true,
        Rnd::Rm => false,
        _ => s < 0.0,
    };
    if e > 0.0 && up {
        next_f64(s, true)
    } else if e < 0.0 && !up {
        next_f64(s, false)
    } else {
        s
    }
}

pub(super) fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    let e = (a - (s - bb)) + (b - bb);
    (s, if s.is_finite() { e } else { 0.0 })
}

#[inline(always)]
pub(super) fn cmp_f(cmp: Cmp, a: f64, b: f64) -> bool {
    let un = a.is_nan() || b.is_nan();
    match cmp {
        Cmp::Eq => !un && a == b,
        Cmp::Ne => !un && a != b,
        Cmp::Lt => !un && a < b,
        Cmp::Le => !un && a <= b,
        Cmp::Gt => !un && a > b,
        Cmp::Ge => !un && a >= b,
        Cmp::Equ => un || a == b,
        Cmp::Neu => un || a != b,
        Cmp::Ltu => un || a < b,
        Cmp::Leu => un || a <= b,
        Cmp::Gtu => un || a > b,
        Cmp::Geu => un || a >= b,
        Cmp::Num => !un,
        Cmp::Nan => un,
        Cmp::Lo => a < b,
        Cmp::Ls => a <= b,
        Cmp::Hi => a > b,
        Cmp::Hs => a >= b,
    }
}

#[inline(always)]
pub(super) fn cmp_i(cmp: Cmp, t: Ty, a: u64, b: u64) -> bool {
    let w = bits(t);
    let (ua, ub) = (a & mask_of(w), b & mask_of(w));
    let (sa, sb) = (sext(a, w), sext(b, w));
    let s = t.signed();
    match cmp {
        Cmp::Eq | Cmp::Equ => ua == ub,
        Cmp::Ne | Cmp::Neu => ua != ub,
        Cmp::Lt | Cmp::Ltu => {
            if s {
                sa < sb
            } else {
                ua < ub
            }
        }
        Cmp::Le | Cmp::Leu => {
            if s {
                sa <= sb
            } else {
                ua <= ub
            }
        }
        Cmp::Gt | Cmp::Gtu => {
            if s {
                sa > sb
            } else {
                ua > ub
            }
        }
        Cmp::Ge | Cmp::Geu => {
            if s {
                sa >= sb
            } else {
                ua >= ub
            }
        }
        Cmp::Lo => ua < ub,
        Cmp::Ls => ua <= ub,
        Cmp::Hi => ua > ub,
        Cmp::Hs => ua >= ub,
        Cmp::Num => true,
        Cmp::Nan => false,
    }
}

/// min/max of floats as PTX defines them: a NaN operand yields the other
/// operand, and -0 orders below +0.
pub(super) fn fminmax(a: f64, b: f64, max: bool) -> f64 {
    if a.is_nan() {
        return b;
    }
    if b.is_nan() {
        return a;
    }
    if a == b {
        // Both zero, maybe of different signs.
        let (x, y) = (a.to_bits(), b.to_bits());
        return f64::from_bits(if max { x & y } else { x | y });
    }
    if (a > b) == max {
        a
    } else {
        b
    }
}

pub(super) fn fminmax32(a: f32, b: f32, max: bool) -> f32 {
    if a.is_nan() && b.is_nan() {
        return f32::from_bits(0x7fff_ffff);
    }
    fminmax(f64::from(a), f64::from(b), max) as f32
}

/// Reads an f16/bf16/f32/f64 source as f64.
#[inline(always)]
pub(super) fn to_f64(t: Ty, v: u64) -> f64 {
    match t {
        Ty::F16 => f64::from(f16::from_bits(v as u16).to_f32()),
        Ty::Bf16 => f64::from(bf16::from_bits(v as u16).to_f32()),
        Ty::F32 => f64::from(f32b(v)),
        _ => f64b(v),
    }
}

/// `x` rounded to f16 (or bf16) to nearest, ties to even. The `half`
/// crate's `from_f64` drops the low 32 bits of the f64's significand
/// before rounding (so 1 + 2^-8 + 2^-23 rounds down to 1 as a bf16, a tie
/// where there is none); its `from_f32` rounds correctly. So `x` goes to
/// f32 rounded to odd (truncated, the lowest bit set where inexact), which
/// keeps the nearest half the same: f32 has more than two bits beyond
/// either half's significand, at every exponent.
pub(super) fn half_of(bf: bool, x: f64) -> u16 {
    let f = x as f32;
    let f = if f64::from(f) == x || x.is_nan() {
        f
    } else {
        let mut b = f.to_bits();
        if f64::from(f).abs() > x.abs() {
            b -= 1;
        }
        f32::from_bits(b | 1)
    };
    if bf {
        bf16::from_f32(f).to_bits()
    } else {
        f16::from_f32(f).to_bits()
    }
}

#[inline(always)]
pub(super) fn cvt(dt: Ty, st: Ty, rnd: Rnd, sat: bool, ftz: bool, v: u64) -> u64 {
    if st.float() {
        let x = to_f64(st, v);
        let x = if ftz && st == Ty::F32 { f64::from(ftz32(x as f32)) } else { x };
        if dt.float() {
            // Float to float: rounding to an integer (rni/rzi/rmi/rpi),
            // or to the destination's precision (rn/rz/rm/rp).
            let x = match rnd {
                Rnd::Rni => x.round_ties_even(),
                Rnd::Rzi => x.trunc(),
                Rnd::Rmi => x.floor(),
                Rnd::Rpi => x.ceil(),
                _ => x,
            };
            let x = if sat {
                if x.is_nan() {
                    0.0
                } else {
                    x.clamp(0.0, 1.0)
                }
            } else {
                x
            };
            return match dt {
                Ty::F64 => x.to_bits(),
                Ty::F32 => {
                    let r = if st == Ty::F64 { round_f32(x, 0.0, rnd) } else { x as f32 };
                    bf32(if ftz { ftz32(r) } else { r })
                }
                Ty::F16 => u64::from(half_of(false, x)),
                _ => u64::from(half_of(true, x)),
            };
        }
        // Float to integer: round, then saturate; NaN becomes 0.
        let x = match rnd {
            Rnd::Rni | Rnd::Rn => x.round_ties_even(),
            Rnd::Rmi | Rnd::Rm => x.floor(),
            Rnd::Rpi | Rnd::Rp => x.ceil(),
            _ => x.trunc(),
        };
        let w = bits(dt);
        return if dt.signed() {
            let lo = -(2f64.powi(w as i32 - 1));
            let hi = 2f64.powi(w as i32 - 1) - 1.0;
            let r = if x.is_nan() { 0.0 } else { x.clamp(lo, hi) };
            (r as i64 as u64) & mask_of(w)
        } else {
            let hi = 2f64.powi(w as i32) - 1.0;
            let r = if x.is_nan() { 0.0 } else { x.clamp(0.0, hi) };
            (r as u64) & mask_of(w)
        };
    }
    // Integer source.
    let sw = bits(st);
    if dt.float() {
        let x = if st.signed() { sext(v, sw) as f64 } else { (v & mask_of(sw)) as f64 };
        // 64-bit sources may not be exact in f64; casting the integer directly rounds once.
        return match dt {
            Ty::F64 => {
                if st.signed() {
                    (sext(v, sw) as f64).to_bits()
                } else {
                    ((v & mask_of(sw)) as f64).to_bits()
                }
            }
            Ty::F32 => {
                let r = if sw == 64 {
                    if st.signed() {
                        v as i64 as f32
                    } else {
                        v as f32
                    }
                } else {
                    round_f32(x, 0.0, rnd)
                };
                bf32(r)
            }
            Ty::F16 => u64::from(half_of(false, x)),
            _ => u64::from(half_of(true, x)),
        };
    }
    let dw = bits(dt);
    if sat {
        let x: i128 = if st.signed() { i128::from(sext(v, sw)) } else { i128::from(v & mask_of(sw)) };
        let (lo, hi): (i128, i128) =
            if dt.signed() { (-(1i128 << (dw - 1)), (1i128 << (dw - 1)) - 1) } else { (0, (1i128 << dw) - 1) };
        return (x.clamp(lo, hi) as u64) & mask_of(dw);
    }
    let x = if st.signed() { sext(v, sw) as u64 } else { v & mask_of(sw) };
    x & mask_of(dw)
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn bin(op: BinOp, t: Ty, ftz: bool, rnd: Rnd, a: u64, b: u64, cc: &mut bool) -> Option<u64> {
    if t.float() {
        return Some(match t {
            Ty::F32 => {
                let (x, y) = (f32b(a), f32b(b));
                let (x, y) = if ftz { (ftz32(x), ftz32(y)) } else { (x, y) };
                let directed = !matches!(rnd, Rnd::Rn | Rnd::None);
                let r = match op {
                    BinOp::Add if directed => {
                        let (s, e) = two_sum(f64::from(x), f64::from(y));
                        round_f32(s, e, rnd)
                    }
                    BinOp::Sub if directed => {
                        let (s, e) = two_sum(f64::from(x), -f64::from(y));
                        round_f32(s, e, rnd)
                    }
                    BinOp::Mul if directed => round_f32(f64::from(x) * f64::from(y), 0.0, rnd),
                    BinOp::Div if directed => {
                        let q = f64::from(x) / f64::from(y);
                        let r = (-q).mul_add(f64::from(y), f64::from(x));
                        round_f32(q, if y > 0.0 { r } else { -r }, rnd)
                    }
                    BinOp::Add => x + y,
                    BinOp::Sub => x - y,
                    BinOp::Mul => x * y,
                    BinOp::Div => x / y,
                    BinOp::Min => fminmax32(x, y, false),
                    BinOp::Max => fminmax32(x, y, true),
                    // `copysign d, a, b`: b's magnitude with a's sign.
                    BinOp::CopySign => y.copysign(x),
                    _ => return None,
                };
                bf32(if ftz { ftz32(r) } else { r })
            }
            Ty::F64 => {
                let (x, y) = (f64b(a), f64b(b));
                let directed = !matches!(rnd, Rnd::Rn | Rnd::None);
                match op {
                    BinOp::Add if directed => {
                        let (s, e) = two_sum(x, y);
                        round_f64(s, e, rnd)
                    }
                    BinOp::Sub if directed => {
                        let (s, e) = two_sum(x, -y);
                        round_f64(s, e, rnd)
                    }
                    BinOp::Mul if directed => {
                        let p = x * y;
                        round_f64(p, x.mul_add(y, -p), rnd)
                    }
                    BinOp::Add => x + y,
                    BinOp::Sub => x - y,
                    BinOp::Mul => x * y,
                    BinOp::Div => x / y,
                    BinOp::Min => {
                        if x.is_nan() && y.is_nan() {
                            f64::from_bits(0x7fff_ffff_ffff_ffff)
                        } else {
                            fminmax(x, y, false)
                        }
                    }
                    BinOp::Max => {
                        if x.is_nan() && y.is_nan() {
                            f64::from_bits(0x7fff_ffff_ffff_ffff)
                        } else {
                            fminmax(x, y, true)
                        }
                    }
                    BinOp::CopySign => y.copysign(x),
                    _ => return None,
                }
                .to_bits()
            }
            _ => return None,
        });
    }
    let w = bits(t);
    let m = mask_of(w);
    let (ua, ub) = (a & m, b & m);
    let (sa, sb) = (sext(a, w), sext(b, w));
    let s = t.signed();
    Some(match op {
        // Float only.
        BinOp::CopySign => return None,
        BinOp::Add => ua.wrapping_add(ub) & m,
        BinOp::Sub => ua.wrapping_sub(ub) & m,
        BinOp::Mul => ua.wrapping_mul(ub) & m,
        BinOp::MulHi => {
            if s {
                ((i128::from(sa) * i128::from(sb)) >> w) as u64 & m
            } else {
                ((u128::from(ua) * u128::from(ub)) >> w) as u64 & m
            }
        }
        BinOp::MulWide => {
            if s {
                (sa.wrapping_mul(sb) as u64) & mask_of(2 * w)
            } else {
                ua.wrapping_mul(ub) & mask_of(2 * w)
            }
        }
        // Division by zero has no defined result in PTX; this gives
        // what the hardware does for unsigned (all ones) and -1 / the
        // dividend for signed quotients / remainders.
        BinOp::Div => {
            if ub == 0 {
                m
            } else if s {
                (sa.wrapping_div(sb) as u64) & m
            } else {
                ua / ub
            }
        }
        BinOp::Rem => {
            if ub == 0 {
                ua
            } else if s {
                (sa.wrapping_rem(sb) as u64) & m
            } else {
                ua % ub
            }
        }
        BinOp::Min => {
            if s {
                (sa.min(sb) as u64) & m
            } else {
                ua.min(ub)
            }
        }
        BinOp::Max => {
            if s {
                (sa.max(sb) as u64) & m
            } else {
                ua.max(ub)
            }
        }
        BinOp::And => ua & ub,
        BinOp::Or => ua | ub,
        BinOp::Xor => ua ^ ub,
        // Shift amounts past the width clamp to the width.
        BinOp::Shl => {
            let n = (b & 0xffff_ffff) as u32;
            if n >= w {
                0
            } else {
                (ua << n) & m
            }
        }
        BinOp::Shr => {
            let n = ((b & 0xffff_ffff) as u32).min(w);
            if s {
                ((sa >> n.min(63)) as u64) & m
            } else if n >= w {
                0
            } else {
                ua >> n
            }
        }
        BinOp::AddCc { carry_in, carry_out } => {
            let sum = u128::from(ua) + u128::from(ub) + u128::from(carry_in && *cc);
            if carry_out {
                *cc = (sum >> w) & 1 == 1;
            }
            (sum as u64) & m
        }
        BinOp::SubCc { carry_in, carry_out } => {
            let bin = u128::from(carry_in && *cc);
            let diff = u128::from(ua).wrapping_sub(u128::from(ub)).wrapping_sub(bin);
            if carry_out {
                *cc = (diff >> w) & 1 == 1;
            }
            (diff as u64) & m
        }
    })
}

pub(super) fn un(op: UnOp, t: Ty, ftz: bool, a: u64) -> u64 {
    let w = bits(t);
    let m = mask_of(w);
    match (op, t) {
        (UnOp::Mov, _) => {
            if t == Ty::Pred {
                u64::from(a != 0)
            } else {
                a & m
            }
        }
        (UnOp::Neg, Ty::F32) => a ^ 0x8000_0000,
        (UnOp::Neg, Ty::F64) => a ^ (1 << 63),
        (UnOp::Neg, Ty::F16 | Ty::Bf16) => a ^ 0x8000,
        (UnOp::Neg, _) => a.wrapping_neg() & m,
        (UnOp::Abs, Ty::F32) => a & 0x7fff_ffff,
        (UnOp::Abs, Ty::F64) => a & !(1 << 63),
        (UnOp::Abs, Ty::F16 | Ty::Bf16) => a & 0x7fff,
        (UnOp::Abs, _) => (sext(a, w).wrapping_abs() as u64) & m,
        (UnOp::Not, _) => !a & m,
        (UnOp::Clz, _) => u64::from(((a & m) << (64 - w)).leading_zeros().min(w)),
        (UnOp::Popc, _) => u64::from((a & m).count_ones()),
        (UnOp::Brev, _) => ((a & m).reverse_bits() >> (64 - w)) & m,
        (op, Ty::F32) => {
            let x = f32b(a);
            let x = if ftz { ftz32(x) } else { x };
            let r = match op {
                UnOp::Rcp { .. } => 1.0 / x,
                UnOp::Sqrt { .. } => x.sqrt(),
                UnOp::Rsqrt => rsqrt_f32(x),
                UnOp::Ex2 => x.exp2(),
                UnOp::Lg2 => x.log2(),
                UnOp::Sin => x.sin(),
                UnOp::Cos => x.cos(),
                _ => x,
            };
            bf32(if ftz { ftz32(r) } else { r })
        }
        (op, _) => {
            let x = f64b(a);
            let x = if ftz { ftz64(x) } else { x };
            let r = match op {
                UnOp::Rcp { approx } => {
                    let r = 1.0 / x;
                    if approx {
                        ftz64(r)
                    } else {
                        r
                    }
                }
                UnOp::Sqrt { .. } => x.sqrt(),
                UnOp::Rsqrt => 1.0 / x.sqrt(),
                UnOp::Ex2 => x.exp2(),
                UnOp::Lg2 => x.log2(),
                UnOp::Sin => x.sin(),
                UnOp::Cos => x.cos(),
                _ => x,
            };
            r.to_bits()
        }
    }
}

/// The new value of an atomic read-modify-write on `old` (`t`'s width).
pub(super) fn rmw(op: AtomOp, t: Ty, old: u64, b: u64, c: u64) -> u64 {
    let w = bits(t);
    let m = mask_of(w);
    let (so, sb) = (sext(old, w), sext(b, w));
    let float = |f: fn(f64, f64) -> f64| -> u64 {
        if t == Ty::F32 {
            u64::from((f(to_f64(t, old), to_f64(t, b)) as f32).to_bits())
        } else {
            f(f64b(old), f64b(b)).to_bits()
        }
    };
    let v = match op {
        AtomOp::AddHalf2 { bf16 } => add_half2(bf16, old, b),
        AtomOp::Add if t.float() => float(|x, y| x + y),
        AtomOp::Min if t.float() => float(|x, y| fminmax(x, y, false)),
        AtomOp::Max if t.float() => float(|x, y| fminmax(x, y, true)),
        AtomOp::Add => old.wrapping_add(b),
        AtomOp::Min if t.signed() => so.min(sb) as u64,
        AtomOp::Max if t.signed() => so.max(sb) as u64,
        AtomOp::Min => (old & m).min(b & m),
        AtomOp::Max => (old & m).max(b & m),
        AtomOp::And => old & b,
        AtomOp::Or => old | b,
        AtomOp::Xor => old ^ b,
        AtomOp::Exch => b,
        AtomOp::Cas => {
            if old & m == b & m {
                c
            } else {
                old
            }
        }
        AtomOp::Inc => {
            if old & m >= b & m {
                0
            } else {
                old + 1
            }
        }
        AtomOp::Dec => {
            if old & m == 0 || old & m > b & m {
                b
            } else {
                old - 1
            }
        }
    };
    v & m
}

/// Performs an atomic read-modify-write at `p`, returning the old value.
///
/// # Safety
/// `p` must be valid and aligned for the type's size.
pub(super) unsafe fn atomic(p: *mut u8, op: AtomOp, t: Ty, b: u64, c: u64) -> u64 {
    let f = |old: u64| Some(rmw(op, t, old, b, c));
    match t.size() {
        // SAFETY: the caller guarantees alignment and validity.
        8 => unsafe { AtomicU64::from_ptr(p.cast()) }
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, f)
            .unwrap_or_else(|o| o),
        // SAFETY: as above.
        4 => u64::from(
            unsafe { AtomicU32::from_ptr(p.cast()) }
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| f(u64::from(o)).map(|v| v as u32))
                .unwrap_or_else(|o| o),
        ),
        // The decoder rejects narrower atomics.
        _ => unreachable!("internal: a {}-byte atomic", t.size()),
    }
}

/// The two 16-bit halves of `x` and `y` (f16, or bf16 if `bf16`) added
/// pairwise, each sum rounded once to nearest, ties to even: the sum in
/// f64 is exact for f16, and for bf16 rounds only where one addend is
/// below 2^-45 of the other, where the half's rounding cannot land on a
/// tie, so rounding it again gives the correctly rounded sum.
pub(super) fn add_half2(bf16: bool, x: u64, y: u64) -> u64 {
    let ty = if bf16 { Ty::Bf16 } else { Ty::F16 };
    let half = |k: u32| {
        let s = to_f64(ty, (x >> (16 * k)) & 0xffff) + to_f64(ty, (y >> (16 * k)) & 0xffff);
        cvt(ty, Ty::F64, Rnd::Rn, false, false, s.to_bits()) & 0xffff
    };
    half(0) | half(1) << 16
}

/// `cvt.rn` of two f32 into one f16x2 or bf16x2 word (`rnd` as `cvt`
/// takes it): `a` in the upper half, `b` in the lower.
pub(super) fn cvt_pack(bf16: bool, rnd: Rnd, a: u64, b: u64) -> u64 {
    let ty = if bf16 { Ty::Bf16 } else { Ty::F16 };
    let one = |v: u64| cvt(ty, Ty::F32, rnd, false, false, v & 0xffff_ffff) & 0xffff;
    one(a) << 16 | one(b)
}

/// `fma` / `mad` on floats.
#[inline]
pub(super) fn fma(t: Ty, rnd: Rnd, ftz: bool, a: u64, b: u64, c: u64) -> u64 {
    match t {
        Ty::F32 => {
            let (x, y, z) = (f32b(a), f32b(b), f32b(c));
            let (x, y, z) = if ftz { (ftz32(x), ftz32(y), ftz32(z)) } else { (x, y, z) };
            let r = if matches!(rnd, Rnd::Rn | Rnd::None) {
                x.mul_add(y, z)
            } else {
                let p = f64::from(x) * f64::from(y);
                let (s, e) = two_sum(p, f64::from(z));
                round_f32(s, e, rnd)
            };
            bf32(if ftz { ftz32(r) } else { r })
        }
        _ => f64b(a).mul_add(f64b(b), f64b(c)).to_bits(),
    }
}

/// Integer `mad.lo/hi/wide`, with the carry flag `cc`.
#[allow(clippy::too_many_arguments)]
pub(super) fn mad(
    t: Ty,
    hi: bool,
    wide: bool,
    cc_in: bool,
    cc_out: bool,
    a: u64,
    b: u64,
    c: u64,
    cc: &mut bool,
) -> u64 {
    let w = bits(t);
    let cin = u128::from(cc_in && *cc);
    let prod: u128 = if t.signed() {
        (i128::from(sext(a, w)) * i128::from(sext(b, w))) as u128
    } else {
        u128::from(a & mask_of(w)) * u128::from(b & mask_of(w))
    };
    let (part, ow) = if wide {
        (prod & u128::from(mask_of(2 * w)), 2 * w)
    } else if hi {
        ((prod >> w) & u128::from(mask_of(w)), w)
    } else {
        (prod & u128::from(mask_of(w)), w)
    };
    let addend = if t.signed() && wide { sext(c, ow) as u128 } else { u128::from(c & mask_of(ow)) };
    let sum = part.wrapping_add(addend).wrapping_add(cin);
    if cc_out {
        *cc = (sum >> ow) & 1 == 1;
    }
    (sum as u64) & mask_of(ow)
}

/// The comparison of `setp` (before any combining predicate).
#[inline(always)]
pub(super) fn setp(cmp: Cmp, t: Ty, ftz: bool, a: u64, b: u64) -> bool {
    if t.float() {
        let (x, y) = (to_f64(t, a), to_f64(t, b));
        let (x, y) =
            if ftz && t == Ty::F32 { (f64::from(ftz32(x as f32)), f64::from(ftz32(y as f32))) } else { (x, y) };
        cmp_f(cmp, x, y)
    } else {
        cmp_i(cmp, t, a, b)
    }
}

/// `prmt.b32`: bytes of `b:a` picked by the selectors in `c`.
pub(super) fn prmt(a: u64, b: u64, c: u64) -> u64 {
    let (a, b, c) = (a as u32, b as u32, c as u32);
    let bytes = (u64::from(b) << 32 | u64::from(a)).to_le_bytes();
    let mut r = 0u32;
    for k in 0..4 {
        let sel = (c >> (4 * k)) & 0xf;
        let mut byte = bytes[(sel & 7) as usize];
        if sel & 8 != 0 {
            byte = if byte & 0x80 != 0 { 0xff } else { 0 };
        }
        r |= u32::from(byte) << (8 * k);
    }
    u64::from(r)
}

/// `lop3.b32`: bit `i` of the result is bit `(a_i << 2) | (b_i << 1) | c_i`
/// of the truth table `lut` (PTX ISA: `lut` is `f(0xF0, 0xCC, 0xAA)`).
pub(super) fn lop3(a: u64, b: u64, c: u64, lut: u64) -> u64 {
    let (a, b, c) = (a as u32, b as u32, c as u32);
    let mut r = 0u32;
    for k in 0..8u32 {
        if lut >> k & 1 != 0 {
            let pick = |x: u32, bit: u32| if bit != 0 { x } else { !x };
            r |= pick(a, k & 4) & pick(b, k & 2) & pick(c, k & 1);
        }
    }
    u64::from(r)
}

/// `bfi`: the low `len` bits of `a` inserted into `b` at `pos`.
pub(super) fn bfi(t: Ty, a: u64, b: u64, pos: u64, len: u64) -> u64 {
    let w = bits(t);
    let (pos, len) = ((pos & 0xff) as u32, (len & 0xff) as u32);
    let mut r = b;
    for k in 0..len {
        if pos + k >= w {
            break;
        }
        let bit = (a >> k) & 1;
        r = (r & !(1u64 << (pos + k))) | (bit << (pos + k));
    }
    r & mask_of(w)
}

/// `bfe`: `len` bits of `a` from `pos`, sign-extended for signed types.
pub(super) fn bfe(t: Ty, a: u64, pos: u64, len: u64) -> u64 {
    let w = bits(t);
    let (pos, len) = ((pos & 0xff) as u32, (len & 0xff) as u32);
    let mut r = 0u64;
    let msb = if pos + len == 0 || pos >= w { 0 } else { (a >> (pos + len - 1).min(w - 1)) & 1 };
    for k in 0..w {
        let bit = if k < len && pos + k < w {
            (a >> (pos + k)) & 1
        } else if t.signed() {
            msb
        } else {
            0
        };
        r |= bit << k;
    }
    r & mask_of(w)
}

/// `1 / sqrt(x)` correctly rounded to f32: computed in f64, then moved
/// to the neighbour when the exact value lies beyond a midpoint. The
/// midpoints have 25 significant bits, so their squares are exact in f64,
/// and `fma(mid^2, x, -1)` has the sign of the exact `mid^2 x - 1`.
pub(super) fn rsqrt_f32(x: f32) -> f32 {
    let r = (1.0 / f64::from(x).sqrt()) as f32;
    if !(x > 0.0 && x.is_finite() && r.is_finite()) || r == 0.0 {
        return r;
    }
    let xd = f64::from(x);
    let (lo, hi) = (next_f32(r, false), next_f32(r, true));
    let above = |m: f64| (m * m).mul_add(xd, -1.0);
    let mid_hi = (f64::from(r) + f64::from(hi)) / 2.0;
    let mid_lo = (f64::from(r) + f64::from(lo)) / 2.0;
    let even = |a: f32, b: f32| if a.to_bits() & 1 == 0 { a } else { b };
    let (dh, dl) = (above(mid_hi), above(mid_lo));
    if dh < 0.0 {
        hi
    } else if dh == 0.0 {
        even(r, hi)
    } else if dl > 0.0 {
        lo
    } else if dl == 0.0 {
        even(r, lo)
    } else {
        r
    }
}
