//! The optimizers' updates on a CUDA device, one launch of `kernels/optim.cu`
//! per parameter tensor. The parameter and its state are updated in place;
//! the update is the CPU's, operation for operation, so the two devices
//! agree bit for bit.
//!
//! This is the CUDA backend's `OptimKernels`; the optimizers themselves
//! live in tapir-nn and reach it through the device-free steps of
//! [`crate::ops::optim`]. [`sgd_step`] and [`adam_step`] here are the
//! earlier CUDA-only entry points, kept for callers that hold CUDA tensors.

use std::sync::Arc;

use super::buffer::{buffer_of_storage, tensor_of, CudaBuffer};
use super::context::CudaDevice;
use super::launch::{device_of, device_of_src, float_suffix, launch, Arg};
use super::shape::{first_element_src, place};
use super::CudaBackend;
use crate::backend::optim::{check, OptimKernels};
use crate::backend::Src;
use crate::storage::Storage;
use crate::{Error, Result, Tensor};

/// Every kernel this module launches, as `(file, entry)`.
pub(crate) fn kernels() -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for suffix in ["f32", "f64", "f16", "bf16"] {
        out.push(("optim.cu", format!("sgd_{suffix}")));
        out.push(("optim.cu", format!("adam_{suffix}")));
    }
    out
}

pub use crate::backend::optim::{AdamStep, SgdStep};

/// The device address of `t`'s elements once `t` owns a whole, contiguous
/// buffer no other tensor shares (a copy on the device is made first when
/// it does not), so the kernel's in-place write is seen by nobody else.
pub(crate) fn owned(op: &'static str, t: &mut Tensor) -> Result<u64> {
    let (dev, ptr) = device_of(op, t)?;
    let whole = t.is_contiguous() && t.layout.offset == 0 && t.numel() == t.storage.len();
    if whole && Arc::strong_count(&t.storage) == 1 {
        return Ok(ptr);
    }
    let (buf, _) = CudaBuffer::alloc(&dev, t.dtype(), t.numel())?;
    let strides = t.shape().contiguous_strides();
    place(op, &dev, t, buf.ptr(), &strides)?;
    let at = buf.ptr();
    *t = tensor_of(buf, t.shape().clone());
    Ok(at)
}

/// The device address of `t`'s first element, for a read.
fn read_ptr(op: &'static str, t: &Tensor) -> Result<u64> {
    super::shape::first_element(op, t)
}

/// Updates `p` in place by one SGD step from its gradient `g`, through the
/// momentum buffer `buf` (in `p`'s accumulation dtype) when there is one.
/// Every tensor must be on the same CUDA device with `p`'s shape.
pub fn sgd_step(p: &mut Tensor, g: &Tensor, buf: Option<&mut Tensor>, k: SgdStep) -> Result<()> {
    const OP: &str = "sgd_step";
    let suffix = float_suffix(OP, p.dtype())?;
    check(OP, p.src(), g.src(), p.dtype())?;
    if let Some(b) = buf.as_deref() {
        check(OP, p.src(), b.src(), p.dtype().compute())?;
    }
    let (dev, _) = device_of(OP, p)?;
    let n = p.numel();
    if n == 0 {
        return Ok(());
    }
    // The kernel reads the gradient as n consecutive elements.
    let g = &g.contiguous()?;
    let gp = read_ptr(OP, g)?;
    let pp = owned(OP, p)?;
    let bp = match buf {
        Some(b) => owned(OP, b)?,
        None => 0,
    };
    launch_sgd(&dev, suffix, n, (pp, gp, bp), &k)
}

/// The SGD kernel over `n` elements: parameter, gradient and momentum
/// buffer (0: none) addresses.
fn launch_sgd(dev: &CudaDevice, suffix: &str, n: usize, (pp, gp, bp): (u64, u64, u64), k: &SgdStep) -> Result<()> {
    let args = [
        Arg::I64(n as i64),
        Arg::Ptr(pp),
        Arg::Ptr(gp),
        Arg::Ptr(bp),
        Arg::F64(k.lr),
        Arg::F64(k.momentum),
        Arg::F64(k.weight_decay),
        Arg::I32(k.nesterov as i32),
        Arg::I32(k.first as i32),
    ];
    launch(dev, "optim.cu", &format!("sgd_{suffix}"), threads(n, suffix), &args)
}

/// Updates `p` and its moments `m` and `v` (in `p`'s accumulation dtype)
/// in place by one Adam step from the gradient `g`. Every tensor must be on
/// the same CUDA device with `p`'s shape.
pub fn adam_step(p: &mut Tensor, m: &mut Tensor, v: &mut Tensor, g: &Tensor, k: AdamStep) -> Result<()> {
    const OP: &str = "adam_step";
    let suffix = float_suffix(OP, p.dtype())?;
    check(OP, p.src(), g.src(), p.dtype())?;
    check(OP, p.src(), m.src(), p.dtype().compute())?;
    check(OP, p.src(), v.src(), p.dtype().compute())?;
    let (dev, _) = device_of(OP, p)?;
    let n = p.numel();
    if n == 0 {
        return Ok(());
    }
    let g = &g.contiguous()?;
    let gp = read_ptr(OP, g)?;
    let (pp, mp, vp) = (owned(OP, p)?, owned(OP, m)?, owned(OP, v)?);
    launch_adam(&dev, suffix, n, (pp, mp, vp, gp), &k)
}

/// The Adam kernel over `n` elements: parameter, moments and gradient
/// addresses.
fn launch_adam(
    dev: &CudaDevice,
    suffix: &str,
    n: usize,
    (pp, mp, vp, gp): (u64, u64, u64, u64),
    k: &AdamStep,
) -> Result<()> {
    let args = [
        Arg::I64(n as i64),
        Arg::Ptr(pp),
        Arg::Ptr(mp),
        Arg::Ptr(vp),
        Arg::Ptr(gp),
        Arg::F64(k.lr),
        Arg::F64(k.weight_decay),
        Arg::F64(k.beta1),
        Arg::F64(k.beta2),
        Arg::F64(k.step),
        Arg::F64(k.inv_bc2_sqrt),
        Arg::F64(k.eps),
        Arg::I32(k.decoupled as i32),
    ];
    launch(dev, "optim.cu", &format!("adam_{suffix}"), threads(n, suffix), &args)
}

/// The threads an update of `n` elements of the dtype named `suffix` is
/// launched with: one for each 16-byte unit of the state the kernel takes
/// at a time (2 elements for f64, 4 for the others, whose state is f32),
/// so that a grid sized for single elements does not leave most of its
/// threads idle. Operands the kernel cannot take that way are still all
/// updated, since it strides over the grid.
fn threads(n: usize, suffix: &str) -> usize {
    n.div_ceil(if suffix == "f64" { 2 } else { 4 })
}

/// The address of a whole storage the caller updates in place.
fn storage_ptr(op: &'static str, s: &Storage) -> Result<u64> {
    buffer_of_storage(s).map(|b| b.ptr()).ok_or(Error::Unsupported { op, device: s.device() })
}

impl OptimKernels for CudaBackend {
    fn sgd_step(&self, p: &mut Storage, g: Src<'_>, buf: Option<&mut Storage>, k: &SgdStep) -> Result<()> {
        const OP: &str = "sgd_step";
        let suffix = float_suffix(OP, p.dtype())?;
        let (dev, _) = device_of_src(OP, g)?;
        let bp = match buf {
            Some(b) => storage_ptr(OP, b)?,
            None => 0,
        };
        let ptrs = (storage_ptr(OP, p)?, first_element_src(OP, g)?, bp);
        launch_sgd(&dev, suffix, g.numel(), ptrs, k)
    }

    fn adam_step(&self, p: &mut Storage, m: &mut Storage, v: &mut Storage, g: Src<'_>, k: &AdamStep) -> Result<()> {
        const OP: &str = "adam_step";
        let suffix = float_suffix(OP, p.dtype())?;
        let (dev, _) = device_of_src(OP, g)?;
        let ptrs = (storage_ptr(OP, p)?, storage_ptr(OP, m)?, storage_ptr(OP, v)?, first_element_src(OP, g)?);
        launch_adam(&dev, suffix, g.numel(), ptrs, k)
    }
}
