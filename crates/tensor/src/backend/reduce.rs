//! The reductions' seam: which reduction ([`ReduceKind`]), the plans its
//! kernels take ([`ReducePlan`], [`ArgReducePlan`], both grouping the
//! input into [`Rows`]) and the kernels every device implements
//! ([`ReduceKernels`]). The ops, their checks and derivatives are
//! [`crate::ops::reduce`]'s.

use smallvec::SmallVec;

use super::Src;
use crate::storage::Storage;
use crate::{DType, Layout, Result, Shape};

/// Axes to reduce: sorted, unique, non-negative.
pub type Axes = SmallVec<[usize; 6]>;

/// Which reduction.
#[derive(Debug, Clone, PartialEq)]
pub enum ReduceKind {
    /// Sum.
    Sum,
    /// Maximum (gradient split evenly among ties).
    Max,
    /// Minimum (gradient split evenly among ties).
    Min,
    /// log(sum(exp(x))), stable for large and -inf inputs.
    LogSumExp,
}

impl ReduceKind {
    /// Every reduction, once.
    pub const ALL: &'static [ReduceKind] = &[ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min, ReduceKind::LogSumExp];

    /// The reduction's name, as errors, graph diagnostics and the CUDA
    /// kernels (`sum_last_f32`...) show it.
    pub fn name(&self) -> &'static str {
        match self {
            ReduceKind::Sum => "sum",
            ReduceKind::Max => "max",
            ReduceKind::Min => "min",
            ReduceKind::LogSumExp => "logsumexp",
        }
    }
}

/// An input grouped into rows for a reduction: the kept axes first, the
/// reduced axes last, so each output element reduces one row.
#[derive(Debug, Clone, PartialEq)]
pub struct Rows {
    /// The permutation putting the kept axes first and the reduced last.
    pub perm: Axes,
    /// One row per kept index (not numel / cols: that is 0 for an empty
    /// reduced axis, which still leaves one output per kept index).
    pub rows: usize,
    /// The reduced elements of each row.
    pub cols: usize,
}

impl Rows {
    /// The rows of an input of `shape` reduced over `axes` (sorted, unique,
    /// in range).
    pub fn of(shape: &Shape, axes: &[usize]) -> Rows {
        let kept = || (0..shape.rank()).filter(|a| !axes.contains(a));
        let mut perm: Axes = kept().collect();
        perm.extend_from_slice(axes);
        let rows = kept().map(|a| shape.dims()[a]).product();
        let cols = axes.iter().map(|&a| shape.dims()[a]).product();
        Rows { perm, rows, cols }
    }

    /// The view `layout` with its axes in [`Rows::perm`]'s order: its rows
    /// are then the last axes (contiguous after at most one copy).
    pub fn view(&self, layout: &Layout) -> Layout {
        Layout {
            shape: Shape(self.perm.iter().map(|&p| layout.shape.dims()[p]).collect()),
            strides: self.perm.iter().map(|&p| layout.strides[p]).collect(),
            offset: layout.offset,
        }
    }
}

/// What a reduction of one input makes, checked once for every device.
#[derive(Debug, Clone, PartialEq)]
pub struct ReducePlan {
    /// Which reduction.
    pub kind: ReduceKind,
    /// The reduced axes, sorted and unique.
    pub axes: Axes,
    /// The output's shape.
    pub shape: Shape,
    /// The output's dtype: the input's, or i64 for an integer sum.
    pub dtype: DType,
    /// An integer sum (in i64, wrapping); every other reduction is of floats.
    pub int_sum: bool,
    /// The input as rows, one an output element.
    pub rows: Rows,
    /// The reduced axes lead and some axes are kept (a bias gradient): a
    /// contiguous input is then `[cols, rows]`, summed column by column
    /// in place.
    pub leading: bool,
}

/// What an argmax or argmin makes (i64 indices of `shape`).
#[derive(Debug, Clone, PartialEq)]
pub struct ArgReducePlan {
    /// argmin instead of argmax.
    pub min: bool,
    /// The output's shape.
    pub shape: Shape,
    /// The input as rows, the one reduced axis last.
    pub rows: Rows,
}

/// The reductions' kernels; every output is a new contiguous buffer of the
/// plan's shape.
pub trait ReduceKernels {
    /// The reduction `plan` of `x`: an integer sum in i64, floats in their
    /// own dtype (f16 and bf16 accumulate in f32).
    fn reduce(&self, plan: &ReducePlan, x: Src<'_>) -> Result<Storage>;
    /// The index of each row's first largest (or smallest) element, as
    /// i64; NaN counts as the extreme, integers compare as f64.
    fn arg_reduce(&self, plan: &ArgReducePlan, x: Src<'_>) -> Result<Storage>;
}
