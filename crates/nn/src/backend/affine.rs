//! The affine op's seam: its plan ([`AffinePlan`]) and the kernel every
//! device implements ([`AffineKernels`]). What the op means, its shape rule
//! and derivatives are [`crate::Affine`]'s.

use tapir_tensor::{Result, Tensor};

/// One checked `x @ w^T + b + r`: `x` `[N, in]`, `w` `[out, in]`, the bias
/// `[out]` and the residual `[N, out]` where the op has them, one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AffinePlan {
    /// Return `tanh` of the result.
    pub tanh: bool,
}

/// The affine op's kernel.
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
}
