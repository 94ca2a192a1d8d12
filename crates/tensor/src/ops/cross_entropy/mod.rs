//! Sparse cross-entropy that never builds a one-hot, and a fused linear +
//! cross-entropy head that never holds the full logits.
//!
//! Seed 000: Keras on PyTorch computed `one_hot(y) * log(softmax(x))` and
//! ran a 40 GiB GPU out of memory. Here the forward takes each row's
//! max-shifted log-sum-exp and saves only that (N floats); the backward
//! writes `softmax - target` straight from the logits and that saved
//! value. Under `create_graph` the rules switch to a differentiable
//! formulation, so second derivatives through the loss (Hessian-vector
//! products of a classifier) work.
//!
//! This folder holds what the losses mean: the options and the label
//! checks they share (here), the sparse loss (`sparse`) and the fused head
//! (`linear`), each with its checks (once, for every device, into the
//! plans of [`crate::backend::cross_entropy`]) and derivative rules. The
//! kernels are each device's `CrossEntropyKernels`: the CPU's row loops and
//! chunk loop in `cpu/cross_entropy.rs`, the CUDA launches in
//! `cuda/cross_entropy.rs`. This folder imports neither device.

use std::sync::Mutex;

use crate::backend::cross_entropy::label_row;
use crate::ops::binary::BinaryOps;
use crate::ops::index::IndexOps;
use crate::ops::reduce::ReduceOps;
use crate::ops::shape::ShapeOps;
use crate::ops::softmax::SoftmaxOps;
use crate::ops::unary::UnaryOps;
use crate::ops::Diff;
use crate::storage::Storage;
use crate::{DType, Device, Error, Result, Shape, Tensor};

mod linear;
mod sparse;

pub use crate::backend::cross_entropy::{CrossEntropyOptions, Reduction};
pub use linear::{auto_chunk, LinearCrossEntropy};
pub use sparse::SparseCrossEntropy;

/// A value an op saves for its backward, behind a lock (ops are shared).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The saved tensor, if the forward made it and no spent backward freed it.
fn saved(m: &Mutex<Option<Tensor>>) -> Option<Tensor> {
    lock(m).clone()
}

/// Labels as row indices (`None` for ignored rows), checked against
/// `classes` by the label rule of [`label_row`], for the derivative rules
/// (which read them on the host; the kernels check them where they live).
fn check_labels(op: &'static str, labels: &Tensor, ignore: i64, classes: usize) -> Result<Vec<Option<usize>>> {
    label_dtype(op, labels)?;
    let raw: Vec<i64> = match labels.dtype() {
        DType::I64 => labels.to_vec::<i64>()?,
        _ => labels.to_vec::<i32>()?.into_iter().map(i64::from).collect(),
    };
    raw.iter().enumerate().map(|(row, &l)| label_row(op, row, l, ignore, classes)).collect()
}

/// The labels' dtype, i32 or i64, checked once for every device.
fn label_dtype(op: &'static str, labels: &Tensor) -> Result<DType> {
    match labels.dtype() {
        d @ (DType::I32 | DType::I64) => Ok(d),
        dtype => Err(Error::UnsupportedDType { op, dtype, expected: "int32 or int64 labels" }),
    }
}

/// The gradients a head's forward precomputed, or the gradient a backward
/// made, as tensors of their inputs' shapes.
fn tensors(storages: Vec<Storage>, shapes: &[Shape]) -> Vec<Tensor> {
    storages.into_iter().zip(shapes).map(|(s, shape)| Tensor::from_storage(s, shape.clone())).collect()
}

fn check_options(op: &'static str, o: &CrossEntropyOptions) -> Result<()> {
    if !(0.0..=1.0).contains(&o.label_smoothing) {
        return Err(Error::invalid_arg(op, format!("label_smoothing {} is outside [0, 1]", o.label_smoothing)));
    }
    Ok(())
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

/// The dtype the kernels compute in: f64 for f64, f32 for the other floats.
fn compute_dtype(op: &'static str, x: &Tensor) -> Result<DType> {
    match x.dtype() {
        DType::F64 => Ok(DType::F64),
        DType::F32 | DType::F16 | DType::BF16 => Ok(DType::F32),
        dtype => Err(Error::UnsupportedDType { op, dtype, expected: "float logits" }),
    }
}

/// This family's ops, each once (see [`crate::ops::registry`]).
pub(crate) fn family() -> Vec<Box<dyn crate::ops::DynOp>> {
    let labels = || Tensor::scalar_of(0.0, DType::I64);
    let options = CrossEntropyOptions::default();
    vec![
        Box::new(SparseCrossEntropy { labels: labels(), options, lse: Mutex::new(None), valid: Mutex::new(None) }),
        Box::new(LinearCrossEntropy {
            labels: labels(),
            options,
            chunk: None,
            precompute: false,
            lse: Mutex::new(None),
            valid: Mutex::new(None),
            grads: Mutex::new(None),
        }),
    ]
}

/// Cross-entropy losses, on tensors and graph handles alike.
pub trait CrossEntropyOps: Diff {
    /// Cross-entropy of logits `[..., V]` against integer `labels` `[...]`
    /// (i32 or i64), with torch's defaults (mean, ignore_index -100). Never
    /// builds a one-hot: the forward saves only a per-row log-sum-exp.
    fn sparse_cross_entropy(&self, labels: &Tensor) -> Result<Self> {
        self.sparse_cross_entropy_with(labels, CrossEntropyOptions::default())
    }
    /// [`CrossEntropyOps::sparse_cross_entropy`] with options.
    fn sparse_cross_entropy_with(&self, labels: &Tensor, options: CrossEntropyOptions) -> Result<Self> {
        let op = SparseCrossEntropy { labels: labels.clone(), options, lse: Mutex::new(None), valid: Mutex::new(None) };
        Self::apply(op, &[self])
    }
    /// Cross-entropy of `self @ weight^T + bias` (`self` is `[N, D]`,
    /// `weight` `[V, D]`) against `labels` `[N]`, computed in chunks of rows
    /// so the `[N, V]` logits never exist. `chunk` overrides the automatic
    /// rows-per-chunk.
    ///
    /// Hidden states with more leading axes (`[B, S, D]` against labels
    /// `[B, S]`, as a language model's) are the `[B * S, D]` rows of the
    /// same head: the per-row losses of [`Reduction::None`] come back
    /// shaped like the labels, and the gradient of `self` like `self`.
    ///
    /// On graph handles with a sum or mean, the forward also makes the
    /// gradients of `self`, `weight` and `bias` (while each chunk of logits
    /// is in cache) and the backward only scales them: see
    /// [`LinearCrossEntropy`] for the two paths and the memory bound.
    fn linear_cross_entropy(
        &self,
        weight: &Self,
        bias: Option<&Self>,
        labels: &Tensor,
        options: CrossEntropyOptions,
        chunk: Option<usize>,
    ) -> Result<Self> {
        if self.rank() > 2 {
            let shape = self.shape();
            let (lead, d) = shape.dims().split_at(shape.rank() - 1);
            if labels.dims() != lead {
                return Err(Error::ShapeMismatch {
                    op: "linear_cross_entropy",
                    lhs: Box::new(shape.clone()),
                    rhs: Box::new(labels.shape().clone()),
                });
            }
            let rows: usize = lead.iter().product();
            let flat = self.reshape([rows, d[0]])?;
            let loss = flat.linear_cross_entropy(weight, bias, &labels.reshape([rows])?, options, chunk)?;
            return match options.reduction {
                Reduction::None => loss.reshape(Shape::from(lead)),
                Reduction::Sum | Reduction::Mean => Ok(loss),
            };
        }
        let op = LinearCrossEntropy {
            labels: labels.clone(),
            options,
            chunk,
            // Recorded with a scalar output and an input gradients flow to:
            // a backward will most likely follow, and it then needs no
            // second pass over the logits.
            precompute: (self.requires_grad() || weight.requires_grad() || bias.is_some_and(|b| b.requires_grad()))
                && options.reduction != Reduction::None,
            lse: Mutex::new(None),
            valid: Mutex::new(None),
            grads: Mutex::new(None),
        };
        match bias {
            Some(b) => Self::apply(op, &[self, weight, b]),
            None => Self::apply(op, &[self, weight]),
        }
    }
}

impl<T: Diff> CrossEntropyOps for T {}
