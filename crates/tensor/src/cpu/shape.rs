//! The CPU kernels of the layout ops that copy ([`crate::ops::shape`]):
//! pad and concat place their inputs into a zeroed contiguous output.

use super::iter::Nd;
use crate::storage::{try_filled, CpuElement};
use crate::{with_dtype, Element, Result, Shape, Tensor};

/// A zeroed contiguous tensor of `shape` with each `(tensor, offset)`
/// copied in at that element offset, at `shape`'s strides (the pieces share
/// the first one's dtype).
pub(crate) fn place(parts: &[(&Tensor, usize)], shape: Shape) -> Result<Tensor> {
    let dtype = parts[0].0.dtype();
    let n = shape.numel();
    let buf = with_dtype!(dtype, T => {
        let mut out = try_filled(n, T::from_f64(0.0))?;
        for &(x, offset) in parts {
            copy_into(&mut out, &shape, offset, x);
        }
        T::wrap(out)
    });
    Tensor::from_buffer(buf, shape)
}

/// Copies `src` into the contiguous buffer `dst` (of shape `dst_shape`) at
/// element `offset`, placing `src`'s elements at `dst_shape`'s strides.
fn copy_into<T: CpuElement>(dst: &mut [T], dst_shape: &Shape, offset: usize, src: &Tensor) {
    let ds = dst_shape.contiguous_strides();
    let data = src.storage_slice::<T>();
    let nd = Nd::new(src.dims(), [&ds, &src.layout.strides], [offset, src.layout.offset]);
    nd.runs(0, nd.numel(), |_, [od, os], len, [sd, ss]| {
        for i in 0..len {
            dst[od + i * sd] = data[os + i * ss];
        }
    });
}
