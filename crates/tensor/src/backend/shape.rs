//! The shape family's seam: the kernels of the layout ops that copy
//! ([`ShapeKernels`]). Views (reshape, permute, narrow, broadcast) need no
//! kernel; the ops, their shape rules and derivatives are
//! [`crate::ops::shape`]'s.

use super::Src;
use crate::storage::Storage;
use crate::{DType, Result, Shape};

/// The shape family's kernels; every output is a new contiguous buffer.
pub trait ShapeKernels {
    /// The elements of the view `x` in row-major order (`op` names the
    /// op in errors).
    fn copy(&self, op: &'static str, x: Src<'_>) -> Result<Storage>;
    /// The elements of the view `x` converted to `dtype` (another dtype
    /// than `x`'s), in row-major order.
    fn cast(&self, x: Src<'_>, dtype: DType) -> Result<Storage>;
    /// A buffer of the contiguous `shape` in the parts' dtype, each part
    /// copied in from its element offset at `shape`'s strides; zero where
    /// no part lands when `zeroed` (the parts of a concat tile the output,
    /// a pad's do not). The op has checked that every part fits.
    fn place(&self, op: &'static str, parts: &[(Src<'_>, usize)], shape: &Shape, zeroed: bool) -> Result<Storage>;
}
