//! The CPU backend: how every op runs on host memory.
//!
//! An op's file under [`crate::ops`] says what the op means (its shape
//! rule, docs and derivative rules); the loops that compute it on the CPU
//! live here, beside the machinery they share:
//!
//! - [`iter`]: the one strided loop nest every elementwise kernel runs on,
//!   splitting large outputs over the pool;
//! - [`pool`]: the thread pool of the medium kernels, and the helpers
//!   (`ranges`, `Disjoint`) other crates' kernels split their loops with;
//! - [`simd`]: a kernel body compiled for AVX-512 or AVX2 + FMA when the
//!   processor has them, picked at run time;
//! - [`math`]: vectorisable `exp`, `tanh` and `erf` for those bodies;
//! - `rows`: the row reductions (sum, max, min, log-sum-exp) the
//!   reductions, softmax and cross-entropies share;
//! - `matmul_tn`: the weight-gradient product kernel.
//!
//! [`crate::ops::forward`] calls an op's `forward_cpu` only with CPU
//! tensors, so the kernels read host slices without checking the device.

pub mod iter;
pub mod math;
pub(crate) mod matmul_tn;
pub mod pool;
pub(crate) mod rows;
pub mod simd;
