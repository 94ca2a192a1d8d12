//! The cross-entropy losses (`ops/cross_entropy/`) as methods of every
//! [`Diff`] value.

use std::sync::Mutex;

use crate::ops::cross_entropy::{CrossEntropyOptions, LinearCrossEntropy, Reduction, SparseCrossEntropy};
use crate::ops::methods::shape::ShapeOps;
use crate::ops::op::Diff;
use crate::{Error, Result, Shape, Tensor};

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
