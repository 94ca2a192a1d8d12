//! The CUDA backend of this crate's fused ops.
//!
//! The causal softmax and the fused causal attention have kernels of
//! their own (`kernels/softmax.cu` and `kernels/attention.cu`, launched by
//! [`tapir_tensor::cuda::attention`]), and so have a tanh layer's jet
//! updates (`kernels/jet.cu`, [`tapir_tensor::cuda::jet`]); the affine op,
//! the norms and the Jacobian's sum of squares have none on this device
//! and say so (`None`), so their ops run the composition of tensor ops,
//! each a CUDA kernel.
//!
//! [`CudaBackend`] implements the kernel traits of [`crate::backend`], each
//! in the file named after its family as in `cpu/`, and imports the plan
//! types only; [`crate::dispatch::backend_for`] hands it to an op whose
//! inputs live on a CUDA device.

mod affine;
mod attention;
mod jet;
mod norm;

use crate::backend::NnBackend;

/// The CUDA backend: every fused op family's kernels, launched on the
/// device whose buffers the operands live in.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CudaBackend;

impl NnBackend for CudaBackend {}
