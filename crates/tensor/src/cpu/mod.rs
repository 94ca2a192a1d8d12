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
//! - `cross_entropy`: the losses' row loops (log-sum-exp, loss, and the
//!   row overwritten by its gradient) and the fused head's chunk loop;
//! - `reduce`: the reductions over any axes, on the row kernels;
//! - `matmul_tn`: the weight-gradient product kernel.
//!
//! [`crate::ops::forward`] calls an op's `forward_cpu` only with CPU
//! tensors, so the kernels read host slices without checking the device.

pub(crate) mod binary;
pub(crate) mod cross_entropy;
pub(crate) mod index;
pub mod iter;
pub mod math;
pub(crate) mod matmul;
pub(crate) mod matmul_tn;
pub mod pool;
pub(crate) mod reduce;
pub(crate) mod rows;
pub(crate) mod shape;
pub mod simd;
pub(crate) mod softmax;
pub(crate) mod unary;

use crate::{DType, Error, Result, Tensor};

/// Runs a float kernel on `x`: f32 and f64 directly, f16 and bf16 through
/// f32 (the result is cast back), integers rejected.
pub(crate) fn float_map(op: &'static str, x: &Tensor, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    match x.dtype() {
        DType::F32 | DType::F64 => f(x),
        DType::F16 | DType::BF16 => f(&x.cast_raw(DType::F32)?)?.cast_raw(x.dtype()),
        dtype => Err(Error::UnsupportedDType { op, dtype, expected: "a float dtype" }),
    }
}
