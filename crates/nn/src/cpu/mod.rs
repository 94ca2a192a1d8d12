//! The CPU backend of this crate's fused ops: how they run on host memory.
//!
//! An op's file (`affine.rs`, `attention.rs`, `jet.rs`, `norm.rs`) says
//! what the op means: its check into a plan, its docs and derivative
//! rules. The loops that run on host memory live here, one file per op
//! family, on the tensor crate's pool, [`tapir_tensor::cpu::pool`], and
//! vector dispatch, [`tapir_tensor::cpu::simd`]:
//!
//! - `affine`: the product through the tensor crate's fused linear sum,
//!   the residual added into the product's own buffer;
//! - `attention`: the causal softmax rows, and causal attention per
//!   (batch, head) with probabilities recomputed in the backward;
//! - `jet`: the forward-Laplacian's sum of squares over the input dims;
//! - `norm`: LayerNorm and RMSNorm rows, forward and backward.
//!
//! (The optimizers' element updates are the tensor crate's `OptimKernels`.)
//!
//! [`CpuBackend`] implements the kernel traits of [`crate::backend`], each
//! in the file named after its family, and imports the plan types only.
//! [`crate::dispatch::backend_for`] hands it to an op whose inputs live on
//! the host, so the kernels read host slices without checking the device.

mod affine;
mod attention;
mod jet;
mod norm;

use crate::backend::NnBackend;

/// The CPU backend: every fused op family's kernels on host memory.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuBackend;

impl NnBackend for CpuBackend {}
