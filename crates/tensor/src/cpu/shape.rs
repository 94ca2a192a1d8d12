//! The CPU kernels of the layout ops that copy ([`crate::ops::shape`]):
//! a view's contiguous copy, its cast to another dtype, and pad and concat,
//! which place their inputs into a zeroed contiguous output.

use half::{bf16, f16};

use super::iter::{map1, nd1, Nd};
use super::{host, CpuBackend};
use crate::backend::{ShapeKernels, Src};
use crate::storage::{try_filled, CpuBuffer, CpuElement, Storage};
use crate::{with_dtype, DType, Element, Result, Shape};

impl ShapeKernels for CpuBackend {
    fn copy(&self, _: &'static str, x: Src<'_>) -> Result<Storage> {
        copy(x).map(Storage::cpu)
    }

    fn cast(&self, x: Src<'_>, dtype: DType) -> Result<Storage> {
        cast(x, dtype).map(Storage::cpu)
    }

    /// The output is zeroed whether or not the parts tile it.
    fn place(&self, _: &'static str, parts: &[(Src<'_>, usize)], shape: &Shape, _: bool) -> Result<Storage> {
        place(parts, shape).map(Storage::cpu)
    }
}

/// The elements of the view `x`, in row-major order, in a new buffer.
pub(crate) fn copy(x: Src<'_>) -> Result<CpuBuffer> {
    Ok(with_dtype!(x.dtype(), T => T::wrap(map1(host::<T>(x), &nd1(x.layout), |v: T| v)?)))
}

/// The elements of the view `x` converted to `dtype`, in row-major order,
/// in a new buffer (a copy when `dtype` is `x`'s own).
pub(crate) fn cast(x: Src<'_>, dtype: DType) -> Result<CpuBuffer> {
    if dtype == x.dtype() {
        return copy(x);
    }
    let nd = nd1(x.layout);
    Ok(with_dtype!(x.dtype(), S => {
        let src = host::<S>(x);
        match dtype {
            DType::F32 => CpuBuffer::F32(map1(src, &nd, |x: S| x.to_f64() as f32)?),
            DType::F64 => CpuBuffer::F64(map1(src, &nd, |x: S| x.to_f64())?),
            DType::F16 => CpuBuffer::F16(map1(src, &nd, |x: S| f16::from_f64(x.to_f64()))?),
            DType::BF16 => CpuBuffer::BF16(map1(src, &nd, |x: S| bf16::from_f64(x.to_f64()))?),
            DType::I32 => CpuBuffer::I32(map1(src, &nd, |x: S| x.to_f64() as i32)?),
            DType::I64 => CpuBuffer::I64(map1(src, &nd, |x: S| x.to_f64() as i64)?),
        }
    }))
}

/// A zeroed contiguous buffer of `shape` with each `(part, offset)`
/// copied in at that element offset, at `shape`'s strides (the parts share
/// the first one's dtype).
fn place(parts: &[(Src<'_>, usize)], shape: &Shape) -> Result<CpuBuffer> {
    let dtype = parts[0].0.dtype();
    let n = shape.numel();
    Ok(with_dtype!(dtype, T => {
        let mut out = try_filled(n, T::from_f64(0.0))?;
        for &(x, offset) in parts {
            copy_into(&mut out, shape, offset, x);
        }
        T::wrap(out)
    }))
}

/// Copies `src` into the contiguous buffer `dst` (of shape `dst_shape`) at
/// element `offset`, placing `src`'s elements at `dst_shape`'s strides.
fn copy_into<T: CpuElement>(dst: &mut [T], dst_shape: &Shape, offset: usize, src: Src<'_>) {
    let ds = dst_shape.contiguous_strides();
    let data = host::<T>(src);
    let nd = Nd::new(src.shape().dims(), [&ds, &src.layout.strides], [offset, src.layout.offset]);
    nd.runs(0, nd.numel(), |_, [od, os], len, [sd, ss]| {
        for i in 0..len {
            dst[od + i * sd] = data[os + i * ss];
        }
    });
}
