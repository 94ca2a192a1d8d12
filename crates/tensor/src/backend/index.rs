//! The indexing family's seam: the plans its kernels take ([`SplitPlan`]
//! for index_select and index_add, [`AxisPlan`] for gather and
//! scatter_add) and the kernels every device implements
//! ([`IndexKernels`]). The ops, their shape and dtype checks and their
//! derivatives are [`crate::ops::index`]'s.
//!
//! Indices are checked for range by the kernels that read them, where they
//! live (the CPU reads them, a device checks them as it runs): a bad index
//! is [`crate::Error::IndexOutOfRange`] with the lowest flat position of a
//! bad index and its value, from every device.

use super::Src;
use crate::storage::Storage;
use crate::{Result, Shape};

/// index_select or index_add over 1-D indices along one axis of a
/// contiguous operand viewed as `[outer, size, inner]` (index_select) or
/// `[outer, n, inner]` (index_add, whose output has `size` there).
#[derive(Debug, Clone, PartialEq)]
pub struct SplitPlan {
    /// The op, as errors name it.
    pub op: &'static str,
    /// The axis.
    pub axis: usize,
    /// Elements before the axis.
    pub outer: usize,
    /// The indexed tensor's size along the axis: every index is below it.
    pub size: usize,
    /// Elements after the axis.
    pub inner: usize,
    /// How many indices.
    pub n: usize,
    /// The output's shape.
    pub shape: Shape,
}

/// gather or scatter_add along `axis`: the indices have the indexed
/// tensor's rank and fit inside it on every other axis.
#[derive(Debug, Clone, PartialEq)]
pub struct AxisPlan {
    /// The op, as errors name it.
    pub op: &'static str,
    /// The axis.
    pub axis: usize,
}

/// The indexing family's kernels. Indices are i32 or i64 (the ops check);
/// every output is a new contiguous buffer.
pub trait IndexKernels {
    /// Only the range check: `Ok` when every index of `idx` is in
    /// `0..size`, else the error for the first that is not (the ops call
    /// it to report a bad index before a shape error, as reading the
    /// indices first would).
    fn check_indices(&self, op: &'static str, idx: Src<'_>, size: usize) -> Result<()>;
    /// Entries `idx` along the axis of the contiguous `x`, of the plan's shape.
    fn index_select(&self, plan: &SplitPlan, x: Src<'_>, idx: Src<'_>) -> Result<Storage>;
    /// Zeros of the plan's shape, to whose entry `idx[j]` along the axis
    /// slice `j` of the contiguous `g` is added.
    fn index_add(&self, plan: &SplitPlan, g: Src<'_>, idx: Src<'_>) -> Result<Storage>;
    /// torch.gather: `x`'s elements (any view) with their axis coordinate
    /// taken from `idx`, shaped as `idx`.
    fn gather(&self, plan: &AxisPlan, x: Src<'_>, idx: Src<'_>) -> Result<Storage>;
    /// torch.scatter_add: a contiguous copy of `base` with `src` (shaped
    /// as `idx`, in `base`'s dtype) added at `idx` along the axis.
    fn scatter_add(&self, plan: &AxisPlan, base: Src<'_>, src: Src<'_>, idx: Src<'_>) -> Result<Storage>;
}
