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
//! - `matmul_tn`: the weight-gradient product kernel;
//! - `optim`: the SGD and Adam element updates.
//!
//! [`CpuBackend`] is this device's face to the ops: it implements the
//! kernel traits of [`crate::backend`], one per family, each in the file
//! named after the family. [`crate::ops::forward`] hands it CPU operands
//! only, so the kernels read host slices without checking the device.

pub(crate) mod binary;
pub(crate) mod cross_entropy;
pub(crate) mod index;
pub mod iter;
pub mod math;
pub(crate) mod matmul;
pub(crate) mod matmul_narrow;
pub(crate) mod matmul_tn;
pub(crate) mod optim;
pub mod pool;
pub(crate) mod random;
pub(crate) mod reduce;
pub(crate) mod rows;
pub(crate) mod shape;
pub mod simd;
pub(crate) mod softmax;
pub(crate) mod unary;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vector256;
pub(crate) mod vector512;

use crate::backend::{Backend, Src};
use crate::storage::{CpuElement, Storage};
use crate::{DType, Error, Layout, Result, Shape};

/// The CPU backend: every family's kernels on host memory.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    fn is_host(&self) -> bool {
        true
    }
}

/// A host operand's whole storage as a typed slice (its layout says which
/// elements the view reads).
pub(crate) fn host<'a, T: CpuElement>(x: Src<'a>) -> &'a [T] {
    let buf = x.storage.host().expect("internal: a CPU kernel was given a device operand");
    T::slice(buf).expect("internal: dtype matches storage")
}

/// Runs a float kernel on `x`: f32 and f64 directly, f16 and bf16 through
/// an f32 copy (the result, contiguous and of any length, is cast back:
/// a broadcasting kernel's output is larger than `x`), integers rejected.
pub(crate) fn float_src(op: &'static str, x: Src<'_>, f: impl FnOnce(Src<'_>) -> Result<Storage>) -> Result<Storage> {
    match x.dtype() {
        DType::F32 | DType::F64 => f(x),
        dtype @ (DType::F16 | DType::BF16) => {
            let layout = Layout::contiguous(x.shape().clone());
            let wide = Storage::cpu(shape::cast(x, DType::F32)?);
            let out = f(Src { storage: &wide, layout: &layout })?;
            drop(wide);
            let flat = Layout::contiguous(Shape::from([out.len()]));
            Ok(Storage::cpu(shape::cast(Src { storage: &out, layout: &flat }, dtype)?))
        }
        dtype => Err(Error::UnsupportedDType { op, dtype, expected: "a float dtype" }),
    }
}
