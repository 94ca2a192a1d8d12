//! The optimizers' updates on a CUDA device, one launch of `kernels/optim.cu`
//! per parameter tensor. The parameter and its state are updated in place;
//! the update is the CPU's, operation for operation, so the two devices
//! agree bit for bit.
//!
//! The optimizers themselves live in tapir-nn, which sees only this narrow
//! API: a parameter tensor, its gradient and its state tensors, all on one
//! CUDA device.

use std::sync::Arc;

use super::buffer::{tensor_of, CudaBuffer};
use super::launch::{device_of, float_suffix, launch, Arg};
use super::shape::place;
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

/// One SGD step's settings, as the optimizer holds them (f64); the kernel
/// rounds them to the accumulation type as the CPU does.
#[derive(Debug, Clone, Copy)]
pub struct SgdStep {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0: no buffer is read or written).
    pub momentum: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// The first step: the momentum buffer becomes the gradient itself.
    pub first: bool,
}

/// One Adam step's settings, with the bias corrections computed in f64 by
/// the caller as the CPU computes them.
#[derive(Debug, Clone, Copy)]
pub struct AdamStep {
    /// Learning rate.
    pub lr: f64,
    /// Weight decay (L2 on the gradient, or decoupled).
    pub weight_decay: f64,
    /// Decay of the first moment.
    pub beta1: f64,
    /// Decay of the second moment.
    pub beta2: f64,
    /// `lr / (1 - beta1^t)`.
    pub step: f64,
    /// `1 / sqrt(1 - beta2^t)`.
    pub inv_bc2_sqrt: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// AdamW: the decay is applied to the parameter, not the gradient.
    pub decoupled: bool,
}

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

/// Checks that `t` is on `p`'s device with `p`'s shape, in `dtype`.
fn check(op: &'static str, p: &Tensor, t: &Tensor, dtype: crate::DType) -> Result<()> {
    if t.device() != p.device() {
        return Err(Error::DeviceMismatch { op, lhs: p.device(), rhs: t.device() });
    }
    if t.shape() != p.shape() {
        return Err(Error::ShapeMismatch { op, lhs: Box::new(p.shape().clone()), rhs: Box::new(t.shape().clone()) });
    }
    if t.dtype() != dtype {
        return Err(Error::DTypeMismatch { op, lhs: dtype, rhs: t.dtype() });
    }
    Ok(())
}

/// Updates `p` in place by one SGD step from its gradient `g`, through the
/// momentum buffer `buf` (in `p`'s accumulation dtype) when there is one.
/// Every tensor must be on the same CUDA device with `p`'s shape.
pub fn sgd_step(p: &mut Tensor, g: &Tensor, buf: Option<&mut Tensor>, k: SgdStep) -> Result<()> {
    const OP: &str = "sgd_step";
    let suffix = float_suffix(OP, p.dtype())?;
    check(OP, p, g, p.dtype())?;
    if let Some(b) = buf.as_deref() {
        check(OP, p, b, p.dtype().compute())?;
    }
    let (dev, _) = device_of(OP, p)?;
    let n = p.numel();
    if n == 0 {
        return Ok(());
    }
    let gp = read_ptr(OP, g)?;
    let pp = owned(OP, p)?;
    let bp = match buf {
        Some(b) => owned(OP, b)?,
        None => 0,
    };
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
    launch(&dev, "optim.cu", &format!("sgd_{suffix}"), n, &args)
}

/// Updates `p` and its moments `m` and `v` (in `p`'s accumulation dtype)
/// in place by one Adam step from the gradient `g`. Every tensor must be on
/// the same CUDA device with `p`'s shape.
pub fn adam_step(p: &mut Tensor, m: &mut Tensor, v: &mut Tensor, g: &Tensor, k: AdamStep) -> Result<()> {
    const OP: &str = "adam_step";
    let suffix = float_suffix(OP, p.dtype())?;
    check(OP, p, g, p.dtype())?;
    check(OP, p, m, p.dtype().compute())?;
    check(OP, p, v, p.dtype().compute())?;
    let (dev, _) = device_of(OP, p)?;
    let n = p.numel();
    if n == 0 {
        return Ok(());
    }
    let gp = read_ptr(OP, g)?;
    let (pp, mp, vp) = (owned(OP, p)?, owned(OP, m)?, owned(OP, v)?);
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
    launch(&dev, "optim.cu", &format!("adam_{suffix}"), n, &args)
}
