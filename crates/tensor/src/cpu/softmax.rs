//! The CPU kernel of softmax and log_softmax ([`crate::backend::softmax`]):
//! one max-shifted pass per row, rows split over the pool when large.

use super::{float_src, host, CpuBackend};
use crate::backend::{SoftmaxKernels, Src};
use crate::cpu::iter::PAR_MIN;
use crate::cpu::pool::{self, Disjoint};
use crate::storage::{CpuElement, Storage};
use crate::{with_float, Float, Result};

impl SoftmaxKernels for CpuBackend {
    /// f16/bf16 through f32.
    fn softmax_rows(&self, log: bool, x: Src<'_>, cols: usize) -> Result<Storage> {
        let name = if log { "log_softmax" } else { "softmax" };
        float_src(name, x, |x| {
            with_float!(x.dtype(), T => rowwise::<T>(x, cols, |i, o| {
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
}

/// Runs `row(input_row, output_row)` over every row of `v` elements of the
/// contiguous `x`, into a new buffer of its size.
fn rowwise<T: Float + CpuElement>(x: Src<'_>, v: usize, row: impl Fn(&[T], &mut [T]) + Sync) -> Result<Storage> {
    let at = x.layout.offset;
    let data = &host::<T>(x)[at..at + x.numel()];
    let out = match x.numel().checked_div(v) {
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
    Ok(Storage::cpu(T::wrap(out)))
}
