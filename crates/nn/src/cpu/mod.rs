//! The CPU kernels of this crate's fused ops.
//!
//! An op's file (`affine.rs`, `attention.rs`, `norm.rs`) says what the op
//! means: its shape rule, docs and derivative rules, and its
//! `forward_cpu` / `forward_cuda` hand the work to a device. The loops that
//! run on host memory live here, one file per op family, on the tensor
//! crate's pool, [`tapir_tensor::cpu::pool`], and vector dispatch,
//! [`tapir_tensor::cpu::simd`]:
//!
//! - `affine`: the residual added into the product's own buffer;
//! - `attention`: the causal softmax rows, and causal attention per
//!   (batch, head) with probabilities recomputed in the backward;
//! - `norm`: LayerNorm and RMSNorm rows, forward and backward.
//!
//! (The optimizers' element updates are the tensor crate's `OptimKernels`.)
//!
//! An op calls these only with host tensors: the tensor crate's dispatch
//! calls `forward_cpu` for CPU inputs alone, and each eager backward checks
//! the device before it runs a kernel here.

pub(crate) mod affine;
pub(crate) mod attention;
pub(crate) mod norm;
