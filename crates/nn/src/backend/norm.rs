//! The normalisations' seam: the plan of a LayerNorm or RMSNorm over the
//! last axis ([`NormPlan`]) and the kernels every device implements
//! ([`NormKernels`]). What the op means, its shape rule and derivatives
//! are [`crate::NormOp`]'s.

use tapir_tensor::{Result, Tensor};

/// One checked normalisation of rows of `d` elements, with a scale and a
/// shift `[d]` of the input's dtype where the op has them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct NormPlan {
    /// The op's name, for errors.
    pub op: &'static str,
    /// Added to the variance (mean square).
    pub eps: f64,
    /// RMSNorm (no centring) rather than LayerNorm.
    pub rms: bool,
    /// The row width, the input's last dim (never 0).
    pub d: usize,
}

/// The normalisations' kernels; every output is a new tensor.
pub(crate) trait NormKernels {
    /// `(x - mean) * rstd * w + b` per row, or `None` where this device has
    /// no fused kernel (the op then composes it).
    fn norm(&self, plan: &NormPlan, x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>) -> Result<Option<Tensor>>;
    /// `(dx, dw, db)` from the input, the scale and the output's gradient
    /// `g` in one pass per row (`dw` and `db` `[d]` even where the op has
    /// no scale or shift), or `None` where this device has no fused kernel
    /// for them (the op then runs its rule).
    fn norm_grad(&self, plan: &NormPlan, x: &Tensor, w: Option<&Tensor>, g: &Tensor) -> Result<Option<[Tensor; 3]>>;
}
