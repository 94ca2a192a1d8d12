//! The sparse cross-entropy: logits `[..., V]` against integer labels
//! `[...]`, with no one-hot and only a per-row log-sum-exp saved.

use std::sync::Mutex;

use smallvec::SmallVec;

use super::{
    check_labels, check_options, compute_dtype, label_dtype, lock, logits_jvp, row_scale, saved, traced_logits_grad,
    CrossEntropyOptions, Reduction,
};
use crate::backend::cross_entropy::{Logits, SparsePlan};
use crate::backend::Backend;
use crate::ops::binary::BinaryOps;
use crate::ops::{backend_for, one, Arity, Diff, InputGrads, Op, Saved};
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
    /// The count of kept rows, saved by the forward (labels on a device
    /// stay there) for the mean's backward.
    pub(super) valid: Mutex<Option<usize>>,
}

impl SparseCrossEntropy {
    /// The checks, once for every device, in the order every device
    /// reports them: the shapes, the options, the labels' dtype, the
    /// logits' dtype (the labels' values are the kernels').
    fn plan(&self, x: &Tensor) -> Result<SparsePlan> {
        let op = self.name();
        let (lead, v) = self.split(x.shape())?;
        check_options(op, &self.options)?;
        label_dtype(op, &self.labels)?;
        let compute = compute_dtype(op, x)?;
        Ok(SparsePlan { op, lead, v, compute, dtype: x.dtype(), options: self.options })
    }

    /// The forward on `backend`: saves the lse and the count of kept rows.
    fn forward_on(&self, backend: &dyn Backend, plan: &SparsePlan, x: &Tensor) -> Result<Tensor> {
        let f = backend.sparse_ce(plan, x.src(), self.labels.src())?;
        *lock(&self.lse) = Some(Tensor::from_storage(f.lse, plan.lead.clone()));
        *lock(&self.valid) = Some(f.valid);
        let shape = match plan.options.reduction {
            Reduction::None => plan.lead.clone(),
            Reduction::Sum | Reduction::Mean => Shape::from(()),
        };
        Ok(Tensor::from_storage(f.loss, shape))
    }

    /// The fused backward: `g * (softmax - onehot)` (with the smoothing
    /// terms) from the logits and the saved lse, written over the logits'
    /// own buffer when `logits` is the last handle on it (a graph hands the
    /// value over when this loss was its last reader), else into a new
    /// buffer: the only N x V buffer of the backward either way.
    fn fused_grad(&self, logits: Tensor, g: &Tensor) -> Result<Tensor> {
        let plan = self.plan(&logits)?;
        let backend = backend_for(logits.device());
        if saved(&self.lse).is_none() || lock(&self.valid).is_none() {
            self.forward_on(backend, &plan, &logits)?;
        }
        let (lse, valid) = (saved(&self.lse).expect("internal: forward saves lse"), lock(&self.valid).unwrap_or(0));
        let shape = logits.shape().clone();
        let labels = self.labels.src();
        let grad = match logits.into_sole_storage() {
            Ok(own) => backend.sparse_ce_grad(&plan, Logits::Own(own), (lse.src(), valid), labels, g.src())?,
            Err(shared) => {
                backend.sparse_ce_grad(&plan, Logits::Shared(shared.src()), (lse.src(), valid), labels, g.src())?
            }
        };
        Ok(Tensor::from_storage(grad, shape))
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

    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let plan = self.plan(xs[0])?;
        self.forward_on(backend, &plan, xs[0])
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
