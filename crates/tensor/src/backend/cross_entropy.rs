//! The cross-entropy family's seam: the options both losses take, the
//! label rule (a label is a class or the ignored index), the plans of the
//! sparse loss ([`SparsePlan`]) and of the fused linear head
//! ([`HeadPlan`]), and the kernels every device implements
//! ([`CrossEntropyKernels`]). The ops, their shape checks and derivative
//! rules are [`crate::ops::cross_entropy`]'s.
//!
//! Labels are checked for range by the kernels that read them, where they
//! live (the CPU reads them, a device checks them as it runs), against
//! [`label_row`]: a bad label is [`Error::LabelOutOfRange`] with the
//! lowest bad row and its value, from every device.

use super::Src;
use crate::storage::Storage;
use crate::{DType, Error, Result, Shape};

/// How per-row losses are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// One loss per row, shaped like the labels.
    None,
    /// The sum over non-ignored rows.
    Sum,
    /// The mean over non-ignored rows. With every row ignored this is NaN
    /// (0/0, as in torch) and its gradient is zero.
    #[default]
    Mean,
}

/// Options of the cross-entropy losses (torch's defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CrossEntropyOptions {
    /// Rows whose label equals this get zero loss and zero gradient.
    pub ignore_index: i64,
    /// Mass spread uniformly over all classes, in `[0, 1]`.
    pub label_smoothing: f64,
    /// How rows are combined.
    pub reduction: Reduction,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions { ignore_index: -100, label_smoothing: 0.0, reduction: Reduction::Mean }
    }
}

/// The label rule, once for every device: the class of row `row` (`None`
/// for an ignored row), or the error naming the row and the value.
pub fn label_row(op: &'static str, row: usize, label: i64, ignore: i64, classes: usize) -> Result<Option<usize>> {
    if label == ignore {
        Ok(None)
    } else if label >= 0 && (label as usize) < classes {
        Ok(Some(label as usize))
    } else {
        Err(Error::LabelOutOfRange { op, label, row, classes })
    }
}

/// The sparse loss over logits `[..., v]` (any float dtype, any view)
/// against labels shaped `lead` (i32 or i64, checked by the op).
#[derive(Debug, Clone, PartialEq)]
pub struct SparsePlan {
    /// The op, as errors name it.
    pub op: &'static str,
    /// The labels' shape: the logits' without the class axis.
    pub lead: Shape,
    /// Classes.
    pub v: usize,
    /// The dtype the rows are computed in: f64 for f64 logits, else f32.
    pub compute: DType,
    /// The logits' dtype, the loss's and the gradient's.
    pub dtype: DType,
    /// The options, checked.
    pub options: CrossEntropyOptions,
}

/// The fused head `cross_entropy(hidden @ weight^T + bias)` over `hidden`
/// `[n, d]`, `weight` `[v, d]` and the optional `bias` `[v]` (one float
/// dtype, checked by the op) against labels `[n]`, `chunk` rows of logits
/// at a time.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadPlan {
    /// The op, as errors name it.
    pub op: &'static str,
    /// Rows of `hidden`.
    pub n: usize,
    /// Width of `hidden` and of `weight`.
    pub d: usize,
    /// Classes (rows of `weight`).
    pub v: usize,
    /// Rows per chunk of logits (at least 1).
    pub chunk: usize,
    /// The dtype the chunks are computed in: f64 for f64 inputs, else f32.
    pub compute: DType,
    /// The inputs' dtype, the loss's and the gradients'.
    pub dtype: DType,
    /// The options, checked.
    pub options: CrossEntropyOptions,
}

/// What a forward kernel hands back for the op to keep.
pub struct CeForward {
    /// The loss in the plan's dtype: per row (shaped like the labels) for
    /// [`Reduction::None`], else a scalar.
    pub loss: Storage,
    /// Each row's log-sum-exp, in the compute dtype, one per label.
    pub lse: Storage,
    /// How many rows are kept (not ignored).
    pub valid: usize,
    /// The fused head's `[d_hidden, d_weight, d_bias?]` for a unit upstream
    /// gradient, in the compute dtype, when asked for.
    pub grads: Option<Vec<Storage>>,
}

/// The logits a sparse backward turns into their gradient.
pub enum Logits<'a> {
    /// The whole, contiguous storage of logits no one else holds: the
    /// gradient may be written over it.
    Own(Storage),
    /// Logits others still read: the gradient goes to a new buffer.
    Shared(Src<'a>),
}

/// The cross-entropy family's kernels. Labels are i32 or i64 (the op
/// checked), in range or the error of [`label_row`] for the lowest bad row.
pub trait CrossEntropyKernels {
    /// The sparse loss: each row's log-sum-exp and loss, combined as the
    /// plan's reduction says.
    fn sparse_ce(&self, plan: &SparsePlan, x: Src<'_>, labels: Src<'_>) -> Result<CeForward>;
    /// The sparse loss's gradient `w_r * (softmax - target)`, from the
    /// logits and their saved log-sum-exp, with row weights from the
    /// upstream gradient `g` (shaped like the labels for
    /// [`Reduction::None`], else a scalar; a mean's divided by `valid`),
    /// contiguous in the logits' shape and dtype.
    fn sparse_ce_grad(
        &self,
        plan: &SparsePlan,
        logits: Logits<'_>,
        saved: (Src<'_>, usize),
        labels: Src<'_>,
        g: Src<'_>,
    ) -> Result<Storage>;
    /// The fused head's forward over `[hidden, weight, bias?]`, chunk by
    /// chunk; with `precompute` also the gradients for a unit upstream
    /// gradient of a sum or mean.
    fn linear_ce(&self, plan: &HeadPlan, ins: &[Src<'_>], labels: Src<'_>, precompute: bool) -> Result<CeForward>;
    /// The fused head's recomputing backward: each chunk's logits again,
    /// turned into their gradient from the saved log-sum-exp and count of
    /// kept rows, pushed into `[d_hidden, d_weight, d_bias?]` (in the
    /// plan's dtype).
    fn linear_ce_grad(
        &self,
        plan: &HeadPlan,
        ins: &[Src<'_>],
        saved: (Src<'_>, usize),
        labels: Src<'_>,
        g: Src<'_>,
    ) -> Result<Vec<Storage>>;
    /// The gradients a head's forward precomputed (whole, unshared, in the
    /// compute dtype), each scaled by the upstream scalar `s` in place and
    /// then cast to `dtype`.
    fn scale_ce_grads(&self, grads: Vec<Storage>, s: f64, dtype: DType) -> Result<Vec<Storage>>;
}
