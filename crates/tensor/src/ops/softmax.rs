//! softmax and log_softmax along any axis, max-shifted so inputs like 1e4
//! and -inf are handled.

use crate::cpu::float_map;
use crate::ops::binary::BinaryOps;
use crate::ops::reduce::ReduceOps;
use crate::ops::unary::UnaryOps;
use crate::ops::{one, Arity, Diff, InputGrads, Op, Saved};
use crate::storage::CpuElement;
use crate::{resolve_axis, with_float, Float, Result, Tensor};

/// softmax (or log_softmax) along `axis`.
#[derive(Debug, Clone, Copy)]
pub struct Softmax {
    /// The axis (non-negative).
    pub axis: usize,
    /// log_softmax instead of softmax.
    pub log: bool,
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
            use rayon::prelude::*;
            if rows * v >= crate::cpu::iter::PAR_MIN {
                out.par_chunks_mut(v).zip(data.par_chunks(v)).for_each(|(o, i)| row(i, o));
            } else {
                out.chunks_mut(v).zip(data.chunks(v)).for_each(|(o, i)| row(i, o));
            }
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

impl Op for Softmax {
    fn name(&self) -> &'static str {
        if self.log {
            "log_softmax"
        } else {
            "softmax"
        }
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }

    fn saves(&self) -> Saved {
        Saved::OUTPUT
    }
    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let log = self.log;
        crate::layout::check_axis(self.name(), self.axis, xs[0].rank())?;
        float_map(self.name(), xs[0], |x| {
            with_float!(x.dtype(), T => rowwise::<T>(x, self.axis, |i, o| {
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
    fn vjp<T: Diff>(&self, _: &[&T], y: &T, g: &T) -> Result<InputGrads<T>> {
        Ok(one(self.pushforward(y, g)?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], y: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| self.pushforward_jvp(y, t)).transpose()
    }
}

impl Softmax {
    /// softmax's Jacobian is symmetric, so one formula serves both modes:
    /// y * (v - sum(v * y)). log_softmax's VJP is g - softmax * sum(g).
    fn pushforward<T: Diff>(&self, y: &T, v: &T) -> Result<T> {
        let ax = [self.axis as isize];
        if self.log {
            v.sub(&y.exp()?.mul(&v.sum(&ax, true)?)?)
        } else {
            y.mul(&v.sub(&v.mul(y)?.sum(&ax, true)?)?)
        }
    }
    /// log_softmax's JVP is t - sum(softmax * t).
    fn pushforward_jvp<T: Diff>(&self, y: &T, t: &T) -> Result<T> {
        let ax = [self.axis as isize];
        if self.log {
            t.sub(&y.exp()?.mul(t)?.sum(&ax, true)?)
        } else {
            self.pushforward(y, t)
        }
    }
}

/// softmax and log_softmax, on tensors and graph handles alike.
pub trait SoftmaxOps: Diff {
    /// softmax along `axis`.
    fn softmax(&self, axis: isize) -> Result<Self> {
        let axis = resolve_axis("softmax", axis, self.rank())?;
        Self::apply(Softmax { axis, log: false }, &[self])
    }
    /// log_softmax along `axis`.
    fn log_softmax(&self, axis: isize) -> Result<Self> {
        let axis = resolve_axis("log_softmax", axis, self.rank())?;
        Self::apply(Softmax { axis, log: true }, &[self])
    }
}

impl<T: Diff> SoftmaxOps for T {}

/// This family's ops, each once (see [`crate::ops::registry`]).
pub(crate) fn family() -> Vec<Box<dyn super::DynOp>> {
    vec![Box::new(Softmax { axis: 0, log: false }), Box::new(Softmax { axis: 0, log: true })]
}
