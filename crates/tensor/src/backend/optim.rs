//! The optimizers' seam: one step's settings ([`SgdStep`], [`AdamStep`]),
//! the checks every device's step makes of its operands ([`check`]), and
//! the kernels every device implements ([`OptimKernels`]). What an
//! optimizer means (its state, its schedule, which parameters decay) is
//! tapir-nn's; the device-free entry points are [`crate::ops::optim`]'s.

use super::Src;
use crate::storage::Storage;
use crate::{DType, Error, Result};

/// One SGD step's settings, as the optimizer holds them (f64); a kernel
/// rounds them to the accumulation type, as the CPU does.
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

/// Checks that `t` (a gradient or a state tensor) is on `p`'s device with
/// `p`'s shape, in `dtype`.
pub fn check(op: &'static str, p: Src<'_>, t: Src<'_>, dtype: DType) -> Result<()> {
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

/// The optimizers' kernels: each updates a parameter (f32, f64, f16 or
/// bf16) and its state (in the parameter's compute dtype) in place, from a
/// gradient of the parameter's shape and dtype, contiguous from any offset
/// (the entry points copy a strided one: the CUDA kernels read it as `n`
/// consecutive elements). The parameter and state storages are whole and
/// held by nothing else (the entry point made them so), of `n` elements;
/// the update of f16 and bf16 parameters runs in f32 and is rounded back
/// once, identically on every device.
pub trait OptimKernels {
    /// One SGD step, through the momentum buffer `buf` when there is one.
    fn sgd_step(&self, p: &mut Storage, g: Src<'_>, buf: Option<&mut Storage>, k: &SgdStep) -> Result<()>;
    /// One Adam (or AdamW) step of `p` and its moments `m` and `v`.
    fn adam_step(&self, p: &mut Storage, m: &mut Storage, v: &mut Storage, g: Src<'_>, k: &AdamStep) -> Result<()>;
}
