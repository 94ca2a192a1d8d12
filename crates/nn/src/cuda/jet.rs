//! The forward-Laplacian's kernels on CUDA: none fused yet, so the sum of
//! squares squares and sums (two kernels, the reduction's own) and the
//! tanh layer's Laplacian and Jacobian updates and their gradients run as
//! the composition of elementwise kernels.

use tapir_tensor::{Result, Tensor};

use super::CudaBackend;
use crate::backend::{JetKernels, SumSquaresPlan, TanhJacPlan, TanhJetPlan};

impl JetKernels for CudaBackend {
    fn sum_squares_mid(&self, _: &SumSquaresPlan, _: &Tensor) -> Result<Option<Tensor>> {
        Ok(None)
    }
    fn tanh_jet(&self, _: &TanhJetPlan, _: &Tensor, _: &Tensor, _: Option<&Tensor>) -> Result<Option<Tensor>> {
        Ok(None)
    }
    fn tanh_jet_grad(
        &self,
        _: &TanhJetPlan,
        _: &Tensor,
        _: &Tensor,
        _: Option<&Tensor>,
        _: &Tensor,
    ) -> Result<Option<[Tensor; 3]>> {
        Ok(None)
    }
    fn tanh_jac(&self, _: &TanhJacPlan, _: &Tensor, _: &Tensor) -> Result<Option<Tensor>> {
        Ok(None)
    }
    fn tanh_jac_grad(&self, _: &TanhJacPlan, _: &Tensor, _: &Tensor, _: &Tensor) -> Result<Option<[Tensor; 2]>> {
        Ok(None)
    }
}
