//! The forward-Laplacian's seam: the plan of the Jacobian's sum of squares
//! ([`SumSquaresPlan`]) and the kernel every device implements
//! ([`JetKernels`]). What the op means and its derivatives are
//! [`crate::jet`]'s `SumSquaresMid`.

use tapir_tensor::{Result, Tensor};

/// One checked `sum_i x[n, i, j]^2` of `x` `[n, d, w]`, giving `[n, w]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SumSquaresPlan {
    /// Points.
    pub n: usize,
    /// Input dims, the axis summed over.
    pub d: usize,
    /// Width of the layer.
    pub w: usize,
}

/// The forward-Laplacian's kernel.
pub(crate) trait JetKernels {
    /// The sum of squares over the middle axis in one pass, or `None`
    /// where this device has no fused kernel for `x` (the op then squares
    /// and sums).
    fn sum_squares_mid(&self, plan: &SumSquaresPlan, x: &Tensor) -> Result<Option<Tensor>>;
}
