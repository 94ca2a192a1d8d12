//! The affine op on CUDA: no fused kernel. The product through cuBLAS and
//! the bias, residual and tanh as elementwise kernels are the op's
//! composition; the CPU's fused job reads host memory.

use tapir_tensor::{Result, Tensor};

use super::CudaBackend;
use crate::backend::{AffineKernels, AffinePlan, LowAffinePlan};

impl AffineKernels for CudaBackend {
    fn affine(
        &self,
        _: &AffinePlan,
        _: &Tensor,
        _: &Tensor,
        _: Option<&Tensor>,
        _: Option<&Tensor>,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }

    fn low_affine(
        &self,
        _: &LowAffinePlan,
        _: &Tensor,
        _: &Tensor,
        _: Option<&Tensor>,
        _: Option<&Tensor>,
    ) -> Result<Option<Tensor>> {
        // No fused kernel yet: cuBLAS and the elementwise kernels run the
        // op's composition, its casts temporaries of the op's `run`.
        Ok(None)
    }
}
