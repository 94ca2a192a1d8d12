//! The softmax family's seam: the row kernel every device implements
//! ([`SoftmaxKernels`]). The op ([`crate::ops::softmax`]) swaps the axis
//! last and makes the rows contiguous, once, for every device.

use super::Src;
use crate::storage::Storage;
use crate::Result;

/// The softmax family's kernels.
pub trait SoftmaxKernels {
    /// softmax (or log_softmax with `log`) of every row of `cols` elements
    /// of the contiguous float operand `x`, max-shifted, into a new buffer
    /// of `x`'s shape and dtype.
    fn softmax_rows(&self, log: bool, x: Src<'_>, cols: usize) -> Result<Storage>;
}
