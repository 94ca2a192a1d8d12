//! The CPU kernels of softmax and log_softmax ([`crate::ops::softmax`]):
//! one max-shifted pass per row, rows split over the pool when large.

use super::float_map;
use crate::cpu::iter::PAR_MIN;
use crate::cpu::pool::{self, Disjoint};
use crate::ops::softmax::Softmax;
use crate::ops::Op;
use crate::storage::CpuElement;
use crate::{with_float, Float, Result, Tensor};

/// softmax (or log_softmax) of `x` along `op.axis` (f16/bf16 through f32).
pub(crate) fn forward(op: Softmax, x: &Tensor) -> Result<Tensor> {
    let log = op.log;
    float_map(Op::name(&op), x, |x| {
        with_float!(x.dtype(), T => rowwise::<T>(x, op.axis, |i, o| {
            let m = i.iter().fold(T::NEG_INF, |a, &b| a.max(b));
            if log {
                // (v - m) - ln s, not v - (m + ln s): m + ln s rounds to
                // m's ulp, which is 1e-3 for m = 1e4 in f32.
                let s: T = i.iter().map(|&v| (v - m).exp()).sum();
                let ls = s.ln();
                for (o, &v) in o.iter_mut().zip(i) { *o = (v - m) - ls; }
            } else {
                let mut s = T::ZERO;
                for (o, &v) in o.iter_mut().zip(i) { let e = (v - m).exp(); *o = e; s += e; }
                let inv = T::ONE / s;
                for o in o.iter_mut() { *o *= inv; }
            }
        }), _ => unreachable!())
    })
}

/// Runs `row(input_row, output_row)` over every row along `axis`, and
/// returns the output in `x`'s shape.
pub(crate) fn rowwise<T: Float + CpuElement>(
    x: &Tensor,
    axis: usize,
    row: impl Fn(&[T], &mut [T]) + Sync,
) -> Result<Tensor> {
    let last = x.rank() - 1;
    let mut perm: Vec<usize> = (0..x.rank()).collect();
    perm.swap(axis, last);
    let xt = if axis == last { x.contiguous()? } else { x.permute_raw(&perm)?.contiguous()? };
    let v = xt.dims()[last];
    let data = &xt.storage_slice::<T>()[xt.layout.offset..xt.layout.offset + xt.numel()];
    let out = match xt.numel().checked_div(v) {
        None => Vec::new(),
        Some(rows) => {
            let mut out = crate::storage::try_filled(rows * v, T::ZERO)?;
            let shared = Disjoint::new(&mut out);
            pool::ranges(rows, PAR_MIN.div_ceil(v), &|r| {
                // SAFETY: the row ranges are disjoint.
                let o = unsafe { shared.slice(r.start * v, r.len() * v) };
                o.chunks_mut(v).zip(data[r.start * v..r.end * v].chunks(v)).for_each(|(o, i)| row(i, o));
            });
            out
        }
    };
    let y = Tensor::from_vec(out, xt.shape().clone())?;
    if axis == last {
        Ok(y)
    } else {
        y.permute_raw(&perm)?.contiguous()
    }
}
