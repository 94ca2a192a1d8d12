//! The causal attention family on CUDA, through the tensor crate's
//! launches ([`tapir_tensor::cuda::attention`]): the causal softmax of
//! `kernels/softmax.cu`, which computes the mask from the row and column it
//! is at, and the fused FlashAttention-2-style forward and backward of
//! `kernels/attention.cu`, f32 arithmetic for f32, f16 and bf16 inputs,
//! neither holding a `[T, T]` tensor. The fused kernels take f32, f16 and
//! bf16 heads up to 128 wide and f64 up to 64; for other plans the op
//! composes the attention from matmuls and the causal softmax.

use tapir_tensor::cuda::attention as flash;
use tapir_tensor::{Result, Tensor};

use super::CudaBackend;
use crate::backend::{AttentionKernels, AttentionPlan, CausalSoftmaxPlan};

impl AttentionKernels for CudaBackend {
    fn causal_softmax(&self, plan: &CausalSoftmaxPlan, x: &Tensor) -> Result<Tensor> {
        flash::causal_softmax(x, plan.scale)
    }
    fn causal_attention(&self, plan: &AttentionPlan, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Option<Tensor>> {
        if !flash::flash_applies(q, plan.heads) {
            return Ok(None);
        }
        // The log-sum-exp is dropped: the op has one output, and the
        // backward recomputes it with one pass of the forward kernel that
        // writes no output ([B, H, T], never [T, T]).
        let (y, _lse) = flash::flash_forward(q, k, v, plan.heads, plan.scale)?;
        Ok(Some(y))
    }
    fn causal_attention_grad(
        &self,
        plan: &AttentionPlan,
        [q, k, v]: [&Tensor; 3],
        y: &Tensor,
        g: &Tensor,
    ) -> Result<Option<[Tensor; 3]>> {
        if !flash::flash_applies(q, plan.heads) {
            return Ok(None);
        }
        flash::flash_backward(q, k, v, y, g, None, plan.heads, plan.scale).map(Some)
    }
}
