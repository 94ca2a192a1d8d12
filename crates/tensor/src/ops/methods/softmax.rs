//! softmax and log_softmax (`ops/softmax.rs`) as methods of every
//! [`Diff`] value.

use crate::ops::op::Diff;
use crate::ops::softmax::Softmax;
use crate::{resolve_axis, Result};

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
