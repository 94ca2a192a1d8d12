//! softmax and log_softmax along any axis, max-shifted so inputs like 1e4
//! and -inf are handled. The op puts the axis last and the rows in one
//! contiguous block, once, for every device; the device's
//! [`SoftmaxKernels`](crate::backend::SoftmaxKernels) normalises the rows.
//! The derivatives are in `ops/rules/softmax.rs`, the methods in
//! `ops/methods/softmax.rs`.

use crate::backend::Backend;
use crate::ops::op::{Arity, Op};
use crate::{Error, Result, Tensor};

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
}

/// This family's ops, each once (see [`crate::ops::registry`]).
pub(crate) fn family() -> Vec<Box<dyn crate::ops::op::DynOp>> {
    vec![Box::new(Softmax { axis: 0, log: false }), Box::new(Softmax { axis: 0, log: true })]
}
