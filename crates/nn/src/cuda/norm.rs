//! LayerNorm and RMSNorm on CUDA: no fused kernel yet, so the op runs its
//! composition forward and its differentiable rule backward.

use tapir_tensor::{Result, Tensor};

use super::CudaBackend;
use crate::backend::{NormKernels, NormPlan};

impl NormKernels for CudaBackend {
    fn norm(&self, _: &NormPlan, _: &Tensor, _: Option<&Tensor>, _: Option<&Tensor>) -> Result<Option<Tensor>> {
        Ok(None)
    }
    fn norm_grad(&self, _: &NormPlan, _: &Tensor, _: Option<&Tensor>, _: &Tensor) -> Result<Option<[Tensor; 3]>> {
        Ok(None)
    }
}
