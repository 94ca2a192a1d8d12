//! The causal attention family's seam: the plans of the causal softmax
//! ([`CausalSoftmaxPlan`]) and of the fused attention ([`AttentionPlan`]),
//! and the kernels every device implements ([`AttentionKernels`]). What the
//! ops mean, their shape rules and derivatives are [`crate::CausalSoftmax`]'s
//! and [`crate::CausalAttention`]'s.

use tapir_tensor::{Result, Tensor};

/// One checked causal softmax of scores `[..., queries, keys]`
/// (`queries <= keys`): query `i` sees keys `j <= i + keys - queries`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CausalSoftmaxPlan {
    /// Multiplies the scores before the softmax.
    pub scale: f64,
    /// Rows of one score matrix.
    pub queries: usize,
    /// Columns of one score matrix.
    pub keys: usize,
}

/// One checked causal attention of `q`, `k`, `v` `[B, T, C]` (one shape,
/// one dtype) in `heads` heads of `d = C / heads` channels: element
/// `(t, j)` of head `h` of batch `b` is at `b * t * c + t * c + h * d + j`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AttentionPlan {
    /// Batches.
    pub batch: usize,
    /// Heads.
    pub heads: usize,
    /// Multiplies `q . k`.
    pub scale: f64,
    /// Time steps.
    pub t: usize,
    /// Channels (all heads).
    pub c: usize,
    /// Channels of one head.
    pub d: usize,
}

/// The causal attention family's kernels; every output is a new tensor.
pub(crate) trait AttentionKernels {
    /// `softmax(scale * x)` over the allowed keys of each row, the others
    /// exact zeros; the mask is never a tensor.
    fn causal_softmax(&self, plan: &CausalSoftmaxPlan, x: &Tensor) -> Result<Tensor>;
    /// The attention's output `[B, T, C]`, or `None` where this device has
    /// no fused kernel for the plan (the op then composes it).
    fn causal_attention(&self, plan: &AttentionPlan, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Option<Tensor>>;
    /// The gradients of `q`, `k` and `v` from the output `y` and its
    /// gradient `g` (`[B, T, C]`, the inputs' device and dtype, as the op
    /// checked), or `None` where this device has no fused kernel for them
    /// (the op then runs its rule).
    fn causal_attention_grad(
        &self,
        plan: &AttentionPlan,
        qkv: [&Tensor; 3],
        y: &Tensor,
        g: &Tensor,
    ) -> Result<Option<[Tensor; 3]>>;
}
