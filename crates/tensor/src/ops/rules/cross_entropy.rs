//! The derivatives of the cross-entropy losses (`ops/cross_entropy/`).
//!
//! A first-order backward runs each loss's fused kernel: `softmax - target`
//! straight from the logits and the saved log-sum-exp (the sparse loss), or
//! the head's chunked gradient (the linear head). Under `create_graph` the
//! rules switch to a differentiable formulation, so second derivatives
//! through the loss (Hessian-vector products of a classifier) work.

use smallvec::SmallVec;

use crate::backend::cross_entropy::{CrossEntropyOptions, Reduction};
use crate::backend::Src;
use crate::ops::cross_entropy::checks::{check_labels, lock, saved, tensors};
use crate::ops::cross_entropy::linear::LinearCrossEntropy;
use crate::ops::cross_entropy::sparse::SparseCrossEntropy;
use crate::ops::methods::binary::BinaryOps;
use crate::ops::methods::index::IndexOps;
use crate::ops::methods::matmul::MatmulOps;
use crate::ops::methods::reduce::ReduceOps;
use crate::ops::methods::shape::ShapeOps;
use crate::ops::methods::softmax::SoftmaxOps;
use crate::ops::methods::unary::UnaryOps;
use crate::ops::op::{one, Derivative, Diff, InputGrads, Op, Saved};
use crate::tensor::backend_for;
use crate::{DType, Device, Error, Result, Shape, Tensor};

impl Derivative for SparseCrossEntropy {
    fn saves(&self) -> Saved {
        Saved::input(0)
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

impl Derivative for LinearCrossEntropy {
    fn saves(&self) -> Saved {
        Saved::INPUTS
    }
    /// The differentiable formulation (`linear`, then the cross-entropy's
    /// gradient in differentiable ops), which records the `[N, V]` logits.
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let (h, w) = (xs[0], xs[1]);
        // The precomputed gradients are constants to a recorded rule; free
        // them rather than hold them to the end of the scope.
        drop(self.take_grads());
        let n = h.shape().dims()[0];
        let v = w.shape().dims()[0];
        let labels = check_labels(self.name(), &self.labels, self.options.ignore_index, v)?;
        let lead = Shape::from([n]);
        let logits = h.linear(w, xs.get(2).copied())?;
        let scale = h.lift(row_scale(&labels, self.options.reduction, lead.clone(), h.dtype(), h.device())?);
        let gl = traced_logits_grad(&logits, &g.mul(&scale)?, &labels, &lead, self.options.label_smoothing)?;
        let mut out: InputGrads<T> = smallvec::smallvec![Some(gl.matmul(w)?), Some(gl.t()?.matmul(h)?)];
        if xs.len() > 2 {
            out.push(Some(gl.sum(&[0], false)?));
        }
        Ok(out)
    }
    /// The chunked kernel: the forward's precomputed gradients scaled by
    /// the upstream scalar, or each chunk's logits recomputed and turned
    /// into its gradient in place.
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, _: Tensor, g: Tensor) -> Result<InputGrads<Tensor>> {
        let backend = backend_for(xs[0].device());
        let dt = xs[0].dtype();
        if let Some(grads) = self.take_grads() {
            // Made by the forward for a unit upstream gradient of a sum or
            // mean; `g` is that scalar.
            let s = g.item()?;
            let shapes: Vec<Shape> = grads.iter().map(|t| t.shape().clone()).collect();
            let own = grads
                .into_iter()
                .map(|t| t.into_sole_storage().unwrap_or_else(|_| panic!("internal: precomputed gradients are shared")))
                .collect();
            return Ok(tensors(backend.scale_ce_grads(own, s, dt)?, &shapes).into_iter().map(Some).collect());
        }
        let refs: Vec<&Tensor> = xs.iter().collect();
        let plan = self.plan(&refs)?;
        if saved(&self.lse).is_none() || lock(&self.valid).is_none() {
            self.forward_on(backend, &plan, &refs, false)?;
        }
        let (lse, valid) = (saved(&self.lse).expect("internal: forward saves lse"), lock(&self.valid).unwrap_or(0));
        let ins: Vec<Src<'_>> = xs.iter().map(|t| t.src()).collect();
        let grads = backend.linear_ce_grad(&plan, &ins, (lse.src(), valid), self.labels.src(), g.src())?;
        Ok(tensors(grads, &Self::grad_shapes(&plan, xs.len() > 2)).into_iter().map(Some).collect())
    }
    fn jvp<T: Diff>(&self, xs: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        if ts.iter().all(|t| t.is_none()) {
            return Ok(None);
        }
        let (h, w) = (xs[0], xs[1]);
        let n = h.shape().dims()[0];
        let v = w.shape().dims()[0];
        let labels = check_labels(self.name(), &self.labels, self.options.ignore_index, v)?;
        let logits = h.linear(w, xs.get(2).copied())?;
        let mut t: Option<T> = None;
        let mut add = |x: T| -> Result<()> {
            t = Some(match t.take() {
                Some(a) => a.add(&x)?,
                None => x,
            });
            Ok(())
        };
        if let Some(th) = ts[0] {
            add(th.matmul(&w.t()?)?)?;
        }
        if let Some(tw) = ts[1] {
            add(h.matmul(&tw.t()?)?)?;
        }
        if let Some(Some(tb)) = ts.get(2) {
            add(tb.broadcast_to([n, v])?)?;
        }
        let t = t.expect("internal: some tangent");
        logits_jvp(&logits, &t, &labels, &Shape::from([n]), &self.options).map(Some)
    }
}

/// The gradient of the loss with respect to the logits, in differentiable
/// ops: `w_r * (softmax(x) - target)`. Used when recording.
fn traced_logits_grad<T: Diff>(x: &T, w_rows: &T, labels: &[Option<usize>], lead: &Shape, eps: f64) -> Result<T> {
    let v = x.shape().dims()[x.rank() - 1];
    let w = w_rows.unsqueeze(-1)?; // [..., 1]
    let p = x.softmax(-1)?.mul(&w)?;
    let idx = safe_index(labels, lead, x.device())?;
    let on = w.mul_scalar(-(1.0 - eps))?;
    let g = p.scatter_add(-1, &idx, &on)?;
    if eps > 0.0 {
        g.sub(&w.mul_scalar(eps / v as f64)?)
    } else {
        Ok(g)
    }
}

/// The loss's tangent from a tangent `t` of the logits, in differentiable ops.
fn logits_jvp<T: Diff>(x: &T, t: &T, labels: &[Option<usize>], lead: &Shape, o: &CrossEntropyOptions) -> Result<T> {
    let eps = o.label_smoothing;
    let p = x.softmax(-1)?;
    let idx = safe_index(labels, lead, x.device())?;
    let per_row = p
        .mul(t)?
        .sum(&[-1], false)?
        .sub(&t.gather(-1, &idx)?.squeeze(-1)?.mul_scalar(1.0 - eps)?)?
        .sub(&t.mean(&[-1], false)?.mul_scalar(eps)?)?;
    let scale = x.lift(row_scale(labels, o.reduction, lead.clone(), x.dtype(), x.device())?);
    let scaled = per_row.mul(&scale)?;
    match o.reduction {
        Reduction::None => Ok(scaled),
        _ => scaled.sum_all(),
    }
}

/// The constant per-row mask (1 for kept rows), scaled for the reduction.
/// Made on `device`, the logits' (a constant of their graph).
fn row_scale(labels: &[Option<usize>], red: Reduction, shape: Shape, dtype: DType, device: Device) -> Result<Tensor> {
    let valid = labels.iter().filter(|l| l.is_some()).count();
    let k = if red == Reduction::Mean && valid > 0 { 1.0 / valid as f64 } else { 1.0 };
    let v: Vec<f64> = labels.iter().map(|l| if l.is_some() { k } else { 0.0 }).collect();
    Tensor::from_vec(v, shape)?.cast(dtype)?.to_device(device)
}

/// Labels with ignored rows replaced by 0, shaped `[..., 1]`, for gathers,
/// on `device` (the logits').
fn safe_index(labels: &[Option<usize>], shape: &Shape, device: Device) -> Result<Tensor> {
    let mut s = shape.clone();
    s.0.push(1);
    Tensor::from_vec(labels.iter().map(|l| l.unwrap_or(0) as i64).collect::<Vec<_>>(), s)?.to_device(device)
}
