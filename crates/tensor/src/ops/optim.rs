//! The optimizers' steps on any device: what one SGD or Adam step of a
//! parameter checks and updates, once for every device. tapir-nn's
//! optimizers hold the settings and state and call these; each device
//! runs the update in its `OptimKernels` (the CPU's loops in
//! `cpu/optim.rs`, the CUDA launches of `kernels/optim.cu` in
//! `cuda/optim.rs`), which agree bit for bit.

use std::sync::Arc;

use crate::backend::optim::check;
pub use crate::backend::optim::{AdamStep, SgdStep};
use crate::storage::Storage;
use crate::tensor::backend_for;
use crate::{DType, Error, Result, Tensor};

/// Parameters a step updates are floats; the error names the optimizer
/// step, as before the steps had a device-free entry point.
fn check_float(p: &Tensor) -> Result<()> {
    match p.dtype() {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => Ok(()),
        dtype => Err(Error::UnsupportedDType { op: "optimizer step", dtype, expected: "float parameters" }),
    }
}

/// `t`'s whole storage to update in place: its own when `t` is contiguous
/// over all of it and the only handle on it, else a fresh copy `t` then
/// holds (a state tensor shared with a saved state dict is copied once, so
/// the saved one keeps its values).
fn private<'a>(op: &'static str, t: &'a mut Tensor) -> Result<&'a mut Storage> {
    let whole = t.is_contiguous() && t.layout.offset == 0 && t.numel() == t.storage.len();
    if !whole || Arc::strong_count(&t.storage) != 1 {
        let copy = backend_for(t.device()).copy(op, t.src())?;
        *t = Tensor::from_storage(copy, t.shape().clone());
    }
    Ok(Arc::get_mut(&mut t.storage).expect("internal: a private storage has one handle"))
}

/// Updates `p` in place by one SGD step from its gradient `g`, through the
/// momentum buffer `buf` (in `p`'s compute dtype) when there is one. Every
/// tensor must be on `p`'s device with `p`'s shape.
pub fn sgd_step(p: &mut Tensor, g: &Tensor, buf: Option<&mut Tensor>, k: SgdStep) -> Result<()> {
    const OP: &str = "sgd_step";
    check_float(p)?;
    check(OP, p.src(), g.src(), p.dtype())?;
    if let Some(b) = buf.as_deref() {
        check(OP, p.src(), b.src(), p.dtype().compute())?;
    }
    if p.numel() == 0 {
        return Ok(());
    }
    let g = g.contiguous()?;
    let backend = backend_for(p.device());
    let p = private(OP, p)?;
    let buf = match buf {
        Some(b) => Some(private(OP, b)?),
        None => None,
    };
    backend.sgd_step(p, g.src(), buf, &k)
}

/// Updates `p` and its moments `m` and `v` (in `p`'s compute dtype) in
/// place by one Adam step from the gradient `g`. Every tensor must be on
/// `p`'s device with `p`'s shape.
pub fn adam_step(p: &mut Tensor, m: &mut Tensor, v: &mut Tensor, g: &Tensor, k: AdamStep) -> Result<()> {
    const OP: &str = "adam_step";
    check_float(p)?;
    check(OP, p.src(), g.src(), p.dtype())?;
    check(OP, p.src(), m.src(), p.dtype().compute())?;
    check(OP, p.src(), v.src(), p.dtype().compute())?;
    if p.numel() == 0 {
        return Ok(());
    }
    let g = g.contiguous()?;
    let backend = backend_for(p.device());
    let p = private(OP, p)?;
    let (m, v) = (private(OP, m)?, private(OP, v)?);
    backend.adam_step(p, m, v, g.src(), &k)
}
