//! The Jacobian's sum of squares on CUDA: no fused kernel, so the op
//! squares and sums (two kernels, the reduction's own).

use tapir_tensor::{Result, Tensor};

use super::CudaBackend;
use crate::backend::{JetKernels, SumSquaresPlan};

impl JetKernels for CudaBackend {
    fn sum_squares_mid(&self, _: &SumSquaresPlan, _: &Tensor) -> Result<Option<Tensor>> {
        Ok(None)
    }
}
