//! The sparse cross-entropy: logits `[..., V]` against integer labels
//! `[...]`, with no one-hot and only a per-row log-sum-exp saved.

use std::sync::Mutex;

use crate::backend::cross_entropy::{CrossEntropyOptions, Logits, Reduction, SparsePlan};
use crate::backend::Backend;
use crate::ops::cross_entropy::checks::{check_options, compute_dtype, label_dtype, lock, saved};
use crate::ops::op::{Arity, Op};
use crate::tensor::backend_for;
use crate::{Error, Result, Shape, Tensor};

/// Sparse cross-entropy of logits `[..., V]` against integer labels `[...]`.
#[derive(Debug)]
pub struct SparseCrossEntropy {
    /// Class indices (i32 or i64), one per row.
    pub labels: Tensor,
    /// Options.
    pub options: CrossEntropyOptions,
    /// The per-row log-sum-exp, saved by the forward (N floats).
    pub(crate) lse: Mutex<Option<Tensor>>,
    /// The count of kept rows, saved by the forward (labels on a device
    /// stay there) for the mean's backward.
    pub(crate) valid: Mutex<Option<usize>>,
}

impl SparseCrossEntropy {
    /// The checks, once for every device, in the order every device
    /// reports them: the shapes, the options, the labels' dtype, the
    /// logits' dtype (the labels' values are the kernels').
    pub(crate) fn plan(&self, x: &Tensor) -> Result<SparsePlan> {
        let op = self.name();
        let (lead, v) = self.split(x.shape())?;
        check_options(op, &self.options)?;
        label_dtype(op, &self.labels)?;
        let compute = compute_dtype(op, x)?;
        Ok(SparsePlan { op, lead, v, compute, dtype: x.dtype(), options: self.options })
    }

    /// The forward on `backend`: saves the lse and the count of kept rows.
    pub(crate) fn forward_on(&self, backend: &dyn Backend, plan: &SparsePlan, x: &Tensor) -> Result<Tensor> {
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
    pub(crate) fn fused_grad(&self, logits: Tensor, g: &Tensor) -> Result<Tensor> {
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
    fn release(&self) {
        *lock(&self.lse) = None;
        *lock(&self.valid) = None;
    }
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let plan = self.plan(xs[0])?;
        self.forward_on(backend, &plan, xs[0])
    }
}
