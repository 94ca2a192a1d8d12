//! The CPU kernels of the two-operand elementwise ops, comparisons and
//! `where` ([`crate::ops::binary`]), over operands broadcast together.

use super::iter::{map1, map2, map3, nd1, nd2, Nd};
use super::{float_src, host, CpuBackend};
use crate::backend::binary::{Binary, BinaryKernels, Cmp, Rhs};
use crate::backend::Src;
use crate::storage::{CpuElement, Storage};
use crate::{with_dtype, with_float, DType, Element, Error, Float, Layout, Result, Shape};

impl BinaryKernels for CpuBackend {
    /// `b` is read in `a`'s compute dtype; f16/bf16 through f32.
    fn binary(&self, f: Binary, a: Src<'_>, b: Src<'_>, shape: &Shape) -> Result<Storage> {
        let wide;
        let b = match a.dtype().compute() {
            dtype if dtype == b.dtype() => b,
            dtype => {
                wide = (Storage::cpu(super::shape::cast(b, dtype)?), Layout::contiguous(b.shape().clone()));
                Src { storage: &wide.0, layout: &wide.1 }
            }
        };
        match a.dtype() {
            DType::I32 => return Ok(Storage::cpu(i32::wrap(int_kernel::<i32>(f, a, b, shape)?))),
            DType::I64 => return Ok(Storage::cpu(i64::wrap(int_kernel::<i64>(f, a, b, shape)?))),
            _ => {}
        }
        float_src(
            f.name(),
            a,
            |a| with_float!(a.dtype(), T => Ok(Storage::cpu(T::wrap(kernel::<T>(f, a, b, shape)?))), _ => unreachable!()),
        )
    }

    fn compare(&self, cmp: Cmp, a: Src<'_>, rhs: Rhs<'_>, shape: &Shape) -> Result<Storage> {
        compare(cmp, a, rhs, shape)
    }

    fn select(&self, mask: Src<'_>, a: Src<'_>, b: Src<'_>, shape: &Shape) -> Result<Storage> {
        select(mask, a, b, shape)
    }
}

fn kernel<T: Float + CpuElement>(op: Binary, a: Src<'_>, b: Src<'_>, shape: &Shape) -> Result<Vec<T>> {
    let (x, y) = (host::<T>(a), host::<T>(b));
    let nd = nd2(a.layout, b.layout, shape);
    match op {
        Binary::Add => map2(x, y, &nd, |p: T, q: T| p + q),
        Binary::Sub => map2(x, y, &nd, |p: T, q: T| p - q),
        Binary::Mul => map2(x, y, &nd, |p: T, q: T| p * q),
        Binary::Div => map2(x, y, &nd, |p: T, q: T| p / q),
        Binary::Pow => map2(x, y, &nd, |p: T, q: T| p.powf(q)),
        Binary::Maximum => map2(x, y, &nd, |p: T, q: T| p.max(q)),
        Binary::Minimum => map2(x, y, &nd, |p: T, q: T| p.min(q)),
    }
}

/// Integer arithmetic as torch's: it wraps on overflow, and a negative
/// exponent is an error (no integer holds the result). Division never
/// gets here: the op divides integers in float32.
trait Int: CpuElement + Copy + Ord + Sync + Send {
    fn wrapping_add(self, o: Self) -> Self;
    fn wrapping_sub(self, o: Self) -> Self;
    fn wrapping_mul(self, o: Self) -> Self;
    fn as_i64(self) -> i64;
    fn one() -> Self;
}

macro_rules! int_impl {
    ($t:ty) => {
        impl Int for $t {
            fn wrapping_add(self, o: Self) -> Self {
                <$t>::wrapping_add(self, o)
            }
            fn wrapping_sub(self, o: Self) -> Self {
                <$t>::wrapping_sub(self, o)
            }
            fn wrapping_mul(self, o: Self) -> Self {
                <$t>::wrapping_mul(self, o)
            }
            fn as_i64(self) -> i64 {
                self as i64
            }
            fn one() -> Self {
                1
            }
        }
    };
}
int_impl!(i32);
int_impl!(i64);

/// `p^q` by squaring, wrapping; `q >= 0`.
fn int_pow<T: Int>(p: T, q: i64) -> T {
    let (mut base, mut e, mut acc) = (p, q as u64, T::one());
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        e >>= 1;
    }
    acc
}

fn int_kernel<T: Int>(op: Binary, a: Src<'_>, b: Src<'_>, shape: &Shape) -> Result<Vec<T>> {
    let (x, y) = (host::<T>(a), host::<T>(b));
    let nd = nd2(a.layout, b.layout, shape);
    match op {
        Binary::Add => map2(x, y, &nd, |p: T, q: T| p.wrapping_add(q)),
        Binary::Sub => map2(x, y, &nd, |p: T, q: T| p.wrapping_sub(q)),
        Binary::Mul => map2(x, y, &nd, |p: T, q: T| p.wrapping_mul(q)),
        Binary::Maximum => map2(x, y, &nd, |p: T, q: T| p.max(q)),
        Binary::Minimum => map2(x, y, &nd, |p: T, q: T| p.min(q)),
        Binary::Pow => {
            if let Some(q) = map2(x, y, &nd, |_, q: T| q.as_i64())?.into_iter().find(|&q| q < 0) {
                return Err(Binary::negative_int_power(q));
            }
            map2(x, y, &nd, |p: T, q: T| int_pow(p, q.as_i64()))
        }
        Binary::Div => Err(Error::UnsupportedDType {
            op: "div",
            dtype: a.dtype(),
            expected: "a float dtype (the op divides integers in float32)",
        }),
    }
}

/// A mask of 1 where `cmp(a, rhs)` holds and 0 elsewhere, in `a`'s dtype.
fn compare(cmp: Cmp, a: Src<'_>, rhs: Rhs<'_>, shape: &Shape) -> Result<Storage> {
    let buf = with_dtype!(a.dtype(), T => {
        let (one, zero) = (T::from_f64(1.0), T::from_f64(0.0));
        let x = host::<T>(a);
        // In the operands' own type, so int64 values past 2^53 compare exactly.
        T::wrap(match rhs {
            Rhs::Operand(b) => {
                let nd = nd2(a.layout, b.layout, shape);
                map2(x, host::<T>(b), &nd, move |p: T, q: T| if cmp.test(p, q) { one } else { zero })?
            }
            Rhs::Scalar(s) => {
                let q = T::from_f64(s);
                map1(x, &nd1(a.layout), move |p: T| if cmp.test(p, q) { one } else { zero })?
            }
        })
    });
    Ok(Storage::cpu(buf))
}

/// `a` where `mask` is non-zero, else `b`, all three broadcast to `shape`.
fn select(mask: Src<'_>, a: Src<'_>, b: Src<'_>, shape: &Shape) -> Result<Storage> {
    let wide;
    let m = if mask.dtype() == DType::F64 {
        mask
    } else {
        wide = (Storage::cpu(super::shape::cast(mask, DType::F64)?), Layout::contiguous(mask.shape().clone()));
        Src { storage: &wide.0, layout: &wide.1 }
    };
    let (sa, sb, sm) =
        (a.layout.broadcast_strides(shape), b.layout.broadcast_strides(shape), m.layout.broadcast_strides(shape));
    let nd = Nd::new(shape.dims(), [&sa, &sb, &sm], [a.layout.offset, b.layout.offset, m.layout.offset]);
    let buf = with_dtype!(a.dtype(), T => T::wrap(map3(
        host::<T>(a), host::<T>(b), host::<f64>(m), &nd,
        |p: T, q: T, c: f64| if c != 0.0 { p } else { q },
    )?));
    Ok(Storage::cpu(buf))
}
