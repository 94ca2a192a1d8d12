//! The forward-Laplacian's kernels on CUDA: a tanh layer's Laplacian and
//! Jacobian updates and their gradients through the tensor crate's
//! launches ([`tapir_tensor::cuda::jet`], `kernels/jet.cu`), one kernel
//! each; the sum of squares has no fused kernel here, so its op squares and
//! sums (two kernels, the reduction's own) and its rule composes the
//! gradient.

use tapir_tensor::cuda::jet as kernels;
use tapir_tensor::{Result, Tensor};

use super::CudaBackend;
use crate::backend::{JetKernels, SumSquaresPlan, TanhJacPlan, TanhJetPlan};

impl JetKernels for CudaBackend {
    fn sum_squares_mid(&self, _: &SumSquaresPlan, _: &Tensor) -> Result<Option<Tensor>> {
        Ok(None)
    }
    fn sum_squares_mid_grad(&self, _: &SumSquaresPlan, _: &Tensor, _: &Tensor) -> Result<Option<Tensor>> {
        Ok(None)
    }
    fn tanh_jet(&self, plan: &TanhJetPlan, a: &Tensor, s: &Tensor, l: Option<&Tensor>) -> Result<Option<Tensor>> {
        kernels::tanh_jet(a, s, l, plan.s_row).map(Some)
    }
    fn tanh_jet_grad(
        &self,
        plan: &TanhJetPlan,
        a: &Tensor,
        s: &Tensor,
        l: Option<&Tensor>,
        g: &Tensor,
    ) -> Result<Option<[Tensor; 3]>> {
        if g.dtype() != a.dtype() || g.dims() != a.dims() {
            return Ok(None);
        }
        kernels::tanh_jet_grad(a, s, l, g, plan.s_row).map(Some)
    }
    fn tanh_jac(&self, plan: &TanhJacPlan, j: &Tensor, a: &Tensor) -> Result<Option<Tensor>> {
        kernels::tanh_jac(j, a, plan.d, plan.j_row).map(Some)
    }
    fn tanh_jac_grad(&self, plan: &TanhJacPlan, j: &Tensor, a: &Tensor, g: &Tensor) -> Result<Option<[Tensor; 2]>> {
        if g.dtype() != a.dtype() || g.dims() != [plan.n, plan.d, plan.w] {
            return Ok(None);
        }
        kernels::tanh_jac_grad(j, a, g, plan.d, plan.j_row).map(Some)
    }
}
