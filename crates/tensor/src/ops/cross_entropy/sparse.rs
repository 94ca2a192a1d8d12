//! The sparse cross-entropy: logits `[..., V]` against integer labels
//! `[...]`, with no one-hot and only a per-row log-sum-exp saved.

use std::sync::Mutex;

use smallvec::SmallVec;

use super::{
    check_labels, check_options, compute_dtype, lock, logits_jvp, row_scale, row_weights, saved, traced_logits_grad,
    CrossEntropyOptions,
};
use crate::ops::binary::BinaryOps;
use crate::ops::{one, Arity, Diff, InputGrads, Op, Saved};
use crate::{Error, Result, Shape, Tensor};

/// Sparse cross-entropy of logits `[..., V]` against integer labels `[...]`.
#[derive(Debug)]
pub struct SparseCrossEntropy {
    /// Class indices (i32 or i64), one per row.
    pub labels: Tensor,
    /// Options.
    pub options: CrossEntropyOptions,
    /// The per-row log-sum-exp, saved by the forward (N floats).
    pub(super) lse: Mutex<Option<Tensor>>,
    /// The count of kept rows, saved by a CUDA forward (whose labels stay
    /// on the device) for the mean's backward.
    pub(super) valid: Mutex<Option<usize>>,
}

impl SparseCrossEntropy {
    /// The fused backward: `g * (softmax - onehot)` (with the smoothing
    /// terms) from the logits and the saved lse, written over the logits'
    /// own buffer when `logits` is the last handle on it (a graph hands the
    /// value over when this loss was its last reader), else over a private
    /// copy: the only N x V buffer of the backward either way.
    fn fused_grad(&self, logits: Tensor, g: &Tensor) -> Result<Tensor> {
        if matches!(logits.device(), crate::Device::Cuda(_)) {
            return crate::cuda::cross_entropy::sparse_grad(self, logits, g);
        }
        let (_, v) = self.split(logits.shape())?;
        let labels = check_labels(self.name(), &self.labels, self.options.ignore_index, v)?;
        let cd = compute_dtype(self.name(), &logits)?;
        let lse = match saved(&self.lse) {
            Some(l) => l,
            None => {
                self.forward_cpu(&[&logits])?;
                saved(&self.lse).expect("internal: forward saves lse")
            }
        };
        let w = row_weights(g, &labels, self.options.reduction)?;
        crate::cpu::cross_entropy::sparse_grad(logits, cd, &lse, &labels, &w, self.options.label_smoothing)
    }

    /// Saves a CUDA forward's lse and count of kept rows.
    pub(crate) fn save_cuda(&self, lse: Tensor, valid: usize) {
        *lock(&self.lse) = Some(lse);
        *lock(&self.valid) = Some(valid);
    }

    /// What [`SparseCrossEntropy::save_cuda`] saved, while both are there.
    pub(crate) fn saved_cuda(&self) -> Option<(Tensor, usize)> {
        Some((saved(&self.lse)?, (*lock(&self.valid))?))
    }

    pub(crate) fn split(&self, x_shape: &Shape) -> Result<(Shape, usize)> {
        let d = x_shape.dims();
        let v = *d.last().ok_or_else(|| Error::InvalidShape {
            op: "sparse_cross_entropy",
            shape: Box::new(x_shape.clone()),
            reason: "logits need a class axis".into(),
        })?;
        let lead = Shape::from(&d[..d.len() - 1]);
        if self.labels.shape() != &lead {
            return Err(Error::ShapeMismatch {
                op: "sparse_cross_entropy",
                lhs: Box::new(x_shape.clone()),
                rhs: Box::new(self.labels.shape().clone()),
            });
        }
        Ok((lead, v))
    }
}

impl Op for SparseCrossEntropy {
    fn name(&self) -> &'static str {
        "sparse_cross_entropy"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }

    fn operands(&self) -> smallvec::SmallVec<[&Tensor; 2]> {
        smallvec::smallvec![&self.labels]
    }

    fn saves(&self) -> Saved {
        Saved::input(0)
    }

    fn release(&self) {
        *lock(&self.lse) = None;
        *lock(&self.valid) = None;
    }

    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0];
        let (lead, v) = self.split(x.shape())?;
        check_options(self.name(), &self.options)?;
        let labels = check_labels(self.name(), &self.labels, self.options.ignore_index, v)?;
        let cd = compute_dtype(self.name(), x)?;
        let (lse, out) = crate::cpu::cross_entropy::sparse_forward(
            x,
            cd,
            &lead,
            v,
            &labels,
            self.options.label_smoothing,
            self.options.reduction,
        )?;
        *lock(&self.lse) = Some(lse);
        Ok(out)
    }

    fn forward_cuda(&self, xs: &[&Tensor]) -> Result<Tensor> {
        crate::cuda::cross_entropy::sparse_forward(self, xs[0])
    }

    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let x = xs[0];
        let (lead, v) = self.split(&x.shape())?;
        let labels = check_labels(self.name(), &self.labels, self.options.ignore_index, v)?;
        let scale = x.lift(row_scale(&labels, self.options.reduction, lead.clone(), x.dtype(), x.device())?);
        let w_rows = g.mul(&scale)?;
        Ok(one(traced_logits_grad(x, &w_rows, &labels, &lead, self.options.label_smoothing)?))
    }

    /// The fused kernel: `softmax - target` from the logits and the saved
    /// log-sum-exp, written over the logits when this rule is their last
    /// reader.
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, _: Tensor, g: Tensor) -> Result<InputGrads<Tensor>> {
        let x = xs.into_iter().next().ok_or_else(|| Error::invalid_arg(self.name(), "no logits"))?;
        Ok(one(self.fused_grad(x, &g)?))
    }

    fn jvp<T: Diff>(&self, xs: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        let Some(t) = ts[0] else { return Ok(None) };
        let x = xs[0];
        let (lead, v) = self.split(&x.shape())?;
        let labels = check_labels(self.name(), &self.labels, self.options.ignore_index, v)?;
        logits_jvp(x, t, &labels, &lead, &self.options).map(Some)
    }
}
