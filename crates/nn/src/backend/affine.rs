//! The affine family's seam: its plans ([`AffinePlan`], [`LowAffinePlan`])
//! and the kernels every device implements ([`AffineKernels`]). What the
//! ops mean, their shape rules and derivatives are [`crate::Affine`]'s and
//! [`crate::LowPrecisionAffine`]'s.

use tapir_tensor::{DType, Result, Tensor};

/// One checked `x @ w^T + b + r`: `x` `[N, in]`, `w` `[out, in]`, the bias
/// `[out]` and the residual `[N, out]` where the op has them, one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AffinePlan {
    /// Return `tanh` of the result.
    pub tanh: bool,
}

/// One checked mixed-precision `x @ w^T + b (+ r)`: `x` `[..., in]`, `w`
/// `[out, in]`, the bias `[out]` and the residual (the product's shape)
/// where the op has them, one device; `x`, `w` and the bias are cast to
/// `dtype` inside the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LowAffinePlan {
    /// The dtype the product and the bias run in (bf16 or f16).
    pub dtype: DType,
    /// Return `tanh` of the result.
    pub tanh: bool,
}

/// The affine family's kernels.
pub(crate) trait AffineKernels {
    /// `x @ w^T + bias + residual` (each term where given), then `tanh`
    /// when the plan says so, for operands the op checked; `None` where
    /// this device has no fused kernel (the op then composes it).
    fn affine(
        &self,
        plan: &AffinePlan,
        x: &Tensor,
        w: &Tensor,
        bias: Option<&Tensor>,
        residual: Option<&Tensor>,
    ) -> Result<Option<Tensor>>;

    /// [`crate::LowPrecisionAffine`]'s forward for operands the op checked:
    /// the casts as temporaries freed before it returns, and the same
    /// roundings as the op's composition (the product rounded to the low
    /// dtype, then the bias added and rounded again); `None` where this
    /// device has no fused kernel (the op then composes it).
    fn low_affine(
        &self,
        plan: &LowAffinePlan,
        x: &Tensor,
        w: &Tensor,
        bias: Option<&Tensor>,
        residual: Option<&Tensor>,
    ) -> Result<Option<Tensor>>;
}
