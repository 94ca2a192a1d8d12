//! The CPU kernels of the two-operand elementwise ops, comparisons and
//! `where` ([`crate::ops::binary`]), over operands broadcast together.

use super::float_map;
use super::iter::{map2, map3, nd2, Nd};
use crate::ops::binary::{Binary, Cmp};
use crate::storage::CpuElement;
use crate::{with_dtype, with_float, DType, Element, Error, Float, Result, Shape, Tensor};

/// `op(a, b)` at the broadcast `shape` (`b` is converted to `a`'s dtype;
/// f16/bf16 through f32).
pub(crate) fn forward(op: Binary, a: &Tensor, b: &Tensor, shape: &Shape) -> Result<Tensor> {
    let name = crate::ops::Op::name(&op);
    let b = b.cast_raw(a.dtype().compute())?;
    match a.dtype() {
        DType::I32 => return Tensor::from_vec(int_kernel::<i32>(op, a, &b, shape)?, shape.clone()),
        DType::I64 => return Tensor::from_vec(int_kernel::<i64>(op, a, &b, shape)?, shape.clone()),
        _ => {}
    }
    float_map(
        name,
        a,
        |a| with_float!(a.dtype(), T => Tensor::from_vec(kernel::<T>(op, a, &b, shape)?, shape.clone()), _ => unreachable!()),
    )
}

fn kernel<T: Float + CpuElement>(op: Binary, a: &Tensor, b: &Tensor, shape: &Shape) -> Result<Vec<T>> {
    let (x, y) = (a.storage_slice::<T>(), b.storage_slice::<T>());
    let nd = nd2(&a.layout, &b.layout, shape);
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

fn int_kernel<T: Int>(op: Binary, a: &Tensor, b: &Tensor, shape: &Shape) -> Result<Vec<T>> {
    let (x, y) = (a.storage_slice::<T>(), b.storage_slice::<T>());
    let nd = nd2(&a.layout, &b.layout, shape);
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

/// A mask of 1 where `cmp(a, b)` holds and 0 elsewhere, in `a`'s dtype.
pub(crate) fn compare(cmp: Cmp, a: &Tensor, b: &Tensor, shape: &Shape) -> Result<Tensor> {
    let nd = nd2(&a.layout, &b.layout, shape);
    let buf = with_dtype!(a.dtype(), T => {
        let (x, y) = (a.storage_slice::<T>(), b.storage_slice::<T>());
        let (one, zero) = (T::from_f64(1.0), T::from_f64(0.0));
        // In the operands' own type, so int64 values past 2^53 compare exactly.
        T::wrap(map2(x, y, &nd, move |p: T, q: T| if cmp.test(p, q) { one } else { zero })?)
    });
    Tensor::from_buffer(buf, shape.clone())
}

/// `a` where `mask` is non-zero, else `b`, all three broadcast to `shape`.
pub(crate) fn select(mask: &Tensor, a: &Tensor, b: &Tensor, shape: &Shape) -> Result<Tensor> {
    let m = mask.cast_raw(DType::F64)?;
    let (sa, sb, sm) =
        (a.layout.broadcast_strides(shape), b.layout.broadcast_strides(shape), m.layout.broadcast_strides(shape));
    let nd = Nd::new(shape.dims(), [&sa, &sb, &sm], [a.layout.offset, b.layout.offset, m.layout.offset]);
    let buf = with_dtype!(a.dtype(), T => T::wrap(map3(
        a.storage_slice::<T>(), b.storage_slice::<T>(), m.storage_slice::<f64>(), &nd,
        |p: T, q: T, c: f64| if c != 0.0 { p } else { q },
    )?));
    Tensor::from_buffer(buf, shape.clone())
}
