//! The forward-Laplacian's seam: the plans of the Jacobian's sum of
//! squares ([`SumSquaresPlan`]) and of a tanh layer's Laplacian update
//! ([`TanhJetPlan`]), and the kernels every device implements
//! ([`JetKernels`]). What the ops mean and their derivatives are
//! [`crate::jet`]'s `SumSquaresMid` and `TanhJet`.

use tapir_tensor::{Result, Tensor};

/// One checked `sum_i x[n, i, j]^2` of `x` `[n, d, w]` over the rows
/// `lo <= i < lo + len`, giving `[n, w]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SumSquaresPlan {
    /// Points.
    pub n: usize,
    /// Input dims, the axis summed over.
    pub d: usize,
    /// Width of the layer.
    pub w: usize,
    /// The first input dim summed.
    pub lo: usize,
    /// The input dims summed (`lo + len <= d`).
    pub len: usize,
}

/// One checked `(1 - a^2)(l - 2 a s)` of `a` `[n, w]`, `s` `[n, w]` or
/// `[w]` and `l` `[n, w]` (or zero), every operand of `a`'s dtype and
/// device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TanhJetPlan {
    /// Points (rows).
    pub n: usize,
    /// Width of the layer.
    pub w: usize,
    /// `s` is one row `[w]`, the same for every point (the first layer's).
    pub s_row: bool,
}

/// One checked `j (1 - a^2)` of the Jacobian `j` `[n, d, w]` (or `[1, d, w]`,
/// the same for every point) and a tanh layer's output `a` `[n, w]`,
/// broadcast over the `d` rows of each point, giving `[n, d, w]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TanhJacPlan {
    /// Points.
    pub n: usize,
    /// Input dims.
    pub d: usize,
    /// Width of the layer.
    pub w: usize,
    /// `j` is `[1, d, w]`, one Jacobian for every point (the first layer's).
    pub j_row: bool,
}

/// The forward-Laplacian's kernels.
pub(crate) trait JetKernels {
    /// The sum of squares over the middle axis in one pass, or `None`
    /// where this device has no fused kernel for `x` (the op then squares
    /// and sums).
    fn sum_squares_mid(&self, plan: &SumSquaresPlan, x: &Tensor) -> Result<Option<Tensor>>;

    /// The gradient of [`JetKernels::sum_squares_mid`] for the output's
    /// gradient `g` `[n, w]` in one pass: `2 x g` (rounded as `(x g) 2`) in
    /// the summed rows, zero in the others, `[n, d, w]`; or `None` (the
    /// rule composes it).
    fn sum_squares_mid_grad(&self, plan: &SumSquaresPlan, x: &Tensor, g: &Tensor) -> Result<Option<Tensor>>;

    /// `(1 - a^2)(l - 2 a s)` (`l` absent: zero) in one pass, `[n, w]`, or
    /// `None` where this device has no fused kernel (the op composes it).
    fn tanh_jet(&self, plan: &TanhJetPlan, a: &Tensor, s: &Tensor, l: Option<&Tensor>) -> Result<Option<Tensor>>;

    /// The gradients of [`JetKernels::tanh_jet`] for the output's gradient
    /// `g` `[n, w]`, in one pass: `[d a, d s, d l]`, each `[n, w]` (`d s`
    /// before the sum over points of a row `s`; `d l` computed with or
    /// without `l`), or `None` (the rule composes them).
    fn tanh_jet_grad(
        &self,
        plan: &TanhJetPlan,
        a: &Tensor,
        s: &Tensor,
        l: Option<&Tensor>,
        g: &Tensor,
    ) -> Result<Option<[Tensor; 3]>>;

    /// `j (1 - a^2)` in one pass, `[n, d, w]`, or `None` (the op composes
    /// it).
    fn tanh_jac(&self, plan: &TanhJacPlan, j: &Tensor, a: &Tensor) -> Result<Option<Tensor>>;

    /// The gradients of [`JetKernels::tanh_jac`] for the output's gradient
    /// `g` `[n, d, w]`: `[d j, d a]`, `d j` `[n, d, w]` (before the sum over
    /// points of a `[1, d, w]` `j`), `d a` `[n, w]`, or `None`.
    fn tanh_jac_grad(&self, plan: &TanhJacPlan, j: &Tensor, a: &Tensor, g: &Tensor) -> Result<Option<[Tensor; 2]>>;
}
