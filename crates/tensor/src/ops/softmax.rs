//! softmax and log_softmax along any axis, max-shifted so inputs like 1e4
//! and -inf are handled. The op puts the axis last and the rows in one
//! contiguous block, once, for every device; the device's
//! [`SoftmaxKernels`](crate::backend::SoftmaxKernels) normalises the rows.

use crate::backend::Backend;
use crate::ops::binary::BinaryOps;
use crate::ops::reduce::ReduceOps;
use crate::ops::unary::UnaryOps;
use crate::ops::{one, Arity, Diff, InputGrads, Op, Saved};
use crate::{resolve_axis, Error, Result, Tensor};

/// softmax (or log_softmax) along `axis`.
#[derive(Debug, Clone, Copy)]
pub struct Softmax {
    /// The axis (non-negative).
    pub axis: usize,
    /// log_softmax instead of softmax.
    pub log: bool,
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
    /// The axis is swapped last and the rows made contiguous (a copy
    /// unless they are already), normalised, and swapped back (a copy
    /// unless the axis is last).
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0];
        crate::layout::check_axis(self.name(), self.axis, x.rank())?;
        if !x.dtype().is_float() {
            return Err(Error::UnsupportedDType { op: self.name(), dtype: x.dtype(), expected: "a float dtype" });
        }
        let last = x.rank() - 1;
        let mut perm: Vec<usize> = (0..x.rank()).collect();
        perm.swap(self.axis, last);
        let xt = if self.axis == last { x.contiguous()? } else { x.permute_raw(&perm)?.contiguous()? };
        let rows = backend.softmax_rows(self.log, xt.src(), xt.dims()[last])?;
        let y = Tensor::from_storage(rows, xt.shape().clone());
        if self.axis == last {
            Ok(y)
        } else {
            y.permute_raw(&perm)?.contiguous()
        }
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
