//! The CPU kernels of the indexing ops ([`crate::ops::index`]). Their
//! indices arrive checked (in range, as offsets), so the loops index
//! without bounds errors to report.

use crate::storage::{try_filled, try_vec, CpuElement};
use crate::{with_dtype, Element, Result, Shape, Tensor};

/// `index_select`: for each of `outer` blocks of the contiguous `x`, the
/// rows `ids` (each `inner` long) of its `size`.
pub(crate) fn select(x: &Tensor, ids: &[usize], [outer, size, inner]: [usize; 3], shape: Shape) -> Result<Tensor> {
    let buf = with_dtype!(x.dtype(), T => {
        let src = x.as_slice::<T>().expect("internal: contiguous");
        let mut out = try_vec(shape.numel())?;
        for o in 0..outer {
            for &i in ids {
                let at = (o * size + i) * inner;
                out.extend_from_slice(&src[at..at + inner]);
            }
        }
        T::wrap(out)
    });
    Tensor::from_buffer(buf, shape)
}

/// `index_add`: zeros of `shape`, to whose entry `ids[j]` along the axis
/// row `j` of the contiguous `g` (`n` rows a block) is added.
pub(crate) fn add(g: &Tensor, ids: &[usize], [outer, n, inner]: [usize; 3], shape: Shape) -> Result<Tensor> {
    let size = shape.numel().checked_div(outer * inner).unwrap_or(0);
    let buf = with_dtype!(g.dtype(), T => {
        let src = g.as_slice::<T>().expect("internal: contiguous");
        let mut out = try_filled(shape.numel(), T::from_f64(0.0))?;
        for o in 0..outer {
            for (j, &i) in ids.iter().enumerate() {
                let (d, s) = ((o * size + i) * inner, (o * n + j) * inner);
                for k in 0..inner {
                    out[d + k] = T::from_f64(out[d + k].to_f64() + src[s + k].to_f64());
                }
            }
        }
        T::wrap(out)
    });
    Tensor::from_buffer(buf, shape)
}

/// `gather`: the contiguous `x`'s elements at the flat offsets `offs`.
pub(crate) fn gather(x: &Tensor, offs: &[usize], shape: Shape) -> Result<Tensor> {
    let buf = with_dtype!(x.dtype(), T => {
        let src = x.as_slice::<T>().expect("internal: contiguous");
        T::wrap(offs.iter().map(|&o| src[o]).collect())
    });
    Tensor::from_buffer(buf, shape)
}

/// `scatter_add`: a copy of `base` with element `j` of the contiguous
/// `src` added at flat offset `offs[j]`.
pub(crate) fn scatter_add(base: &Tensor, src: &Tensor, offs: &[usize]) -> Result<Tensor> {
    let buf = with_dtype!(base.dtype(), T => {
        let mut out = base.to_vec::<T>()?;
        let s = src.as_slice::<T>().expect("internal: contiguous");
        for (&o, &v) in offs.iter().zip(s) {
            out[o] = T::from_f64(out[o].to_f64() + v.to_f64());
        }
        T::wrap(out)
    });
    Tensor::from_buffer(buf, base.shape().clone())
}
