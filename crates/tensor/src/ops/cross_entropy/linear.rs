//! The fused classifier head: `cross_entropy(hidden @ weight^T + bias)`
//! in chunks of rows, so the `[N, V]` logits never exist at once.

use std::sync::Mutex;

use crate::backend::cross_entropy::{CrossEntropyOptions, HeadPlan, Reduction};
use crate::backend::{Backend, Src};
use crate::ops::cross_entropy::checks::{check_options, compute_dtype, label_dtype, lock, tensors};
use crate::ops::op::{Arity, Op};
use crate::{Error, Result, Shape, Tensor};

/// The fused classifier head `cross_entropy(hidden @ weight^T + bias)`,
/// processed in chunks of rows so the `[N, V]` logits never exist at once.
///
/// The forward computes one chunk of logits at a time and keeps only the
/// per-row log-sum-exp (N floats). The first-order gradient is made in one
/// of two ways:
///
/// - **In the forward**, when the op is recorded on a graph and the
///   reduction is sum or mean (so the upstream gradient is one scalar):
///   each row of a chunk is turned into its gradient `softmax - target`
///   (smoothing terms included, ignored rows zero) right after its
///   log-sum-exp, while it is still in cache, and the chunk is pushed into
///   `d_hidden`, `d_weight` and `d_bias` for a unit upstream gradient. The
///   op keeps these; a backward takes them out and only scales them by the
///   upstream scalar. That is three `N x V x D` products in all, as many as
///   `linear` followed by a cross-entropy and its backward. Because the
///   backward takes them, a pass without `retain_graph` leaves nothing
///   behind in the op but the log-sum-exp; a second pass recomputes.
/// - **In the backward**, otherwise (reduction none, eager calls on plain
///   tensors, a second backward): each chunk's logits are recomputed from
///   the inputs, turned into the gradient in place from the saved
///   log-sum-exp, and accumulated: four products.
///
/// Under `create_graph` the rule is a differentiable formulation (`linear`
/// and the cross-entropy's gradient in differentiable ops), which records
/// the `[N, V]` logits on the graph; the precomputed gradients, which could
/// not be differentiated again, are dropped then.
///
/// **Memory.** Above its inputs and output, the op's peak is at most one
/// chunk of logits (`chunk x V` elements) plus the gradients of its inputs
/// (`N x D + V x D`, `+ V` with a bias) plus `O(N)` (the log-sum-exp and
/// per-row losses), all in the compute dtype (f32 for f16/bf16 inputs,
/// whose f32 copies are also made). Precomputed gradients are the
/// gradients of the inputs, made earlier: a recorded forward with a sum or
/// mean reaches that whole bound by itself, and the backward adds nothing
/// when the upstream gradient is a plain scalar.
#[derive(Debug)]
pub struct LinearCrossEntropy {
    /// Class indices (i32 or i64), one per row of `hidden`.
    pub labels: Tensor,
    /// Options.
    pub options: CrossEntropyOptions,
    /// Rows per chunk; `None` picks one automatically.
    pub chunk: Option<usize>,
    /// Whether the forward also makes the gradients (see above).
    pub(crate) precompute: bool,
    pub(crate) lse: Mutex<Option<Tensor>>,
    /// The count of kept rows, saved by the forward (labels on a device
    /// stay there) for the mean's backward.
    pub(crate) valid: Mutex<Option<usize>>,
    /// `[d_hidden, d_weight, d_bias?]` for a unit upstream gradient, in the
    /// compute dtype, from the forward until a backward takes them.
    pub(crate) grads: Mutex<Option<Vec<Tensor>>>,
}

/// The automatic chunk: rows whose logits take about 128 MiB, or as many
/// bytes as `hidden`'s gradient will take anyway if that is more. Of each
/// chunk's three products, two read all of `weight` (the gemm packs it anew
/// each time) and one adds into all of `weight`'s gradient, so fewer,
/// larger chunks are faster: at N = 4,096, V = 32,000, D = 768 on a 2-core
/// Zen 4, 1,048-row chunks took 3.31-3.37 s a step where 32 MiB's 262 rows
/// took 3.77-4.06 s (docs/performance.md), for 96 MiB more of logits.
pub fn auto_chunk(n: usize, d: usize, v: usize) -> usize {
    let budget = (128usize << 20).max(n * d * 4);
    (budget / (v.max(1) * 4)).clamp(1, n.max(1))
}

impl LinearCrossEntropy {
    /// The shapes, dtypes, chunk and options, checked once for every device.
    fn check_shapes(&self, xs: &[&Tensor]) -> Result<(usize, usize, usize)> {
        let (h, w) = (xs[0], xs[1]);
        let op = "linear_cross_entropy";
        if h.rank() != 2 || w.rank() != 2 || h.dims()[1] != w.dims()[1] {
            return Err(Error::ShapeMismatch {
                op,
                lhs: Box::new(h.shape().clone()),
                rhs: Box::new(w.shape().clone()),
            });
        }
        let (n, d, v) = (h.dims()[0], h.dims()[1], w.dims()[0]);
        if let Some(b) = xs.get(2) {
            if b.dims() != [v] {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: Box::new(w.shape().clone()),
                    rhs: Box::new(b.shape().clone()),
                });
            }
        }
        if self.labels.dims() != [n] {
            return Err(Error::ShapeMismatch {
                op,
                lhs: Box::new(h.shape().clone()),
                rhs: Box::new(self.labels.shape().clone()),
            });
        }
        for t in &xs[1..] {
            if t.dtype() != h.dtype() {
                return Err(Error::DTypeMismatch { op, lhs: h.dtype(), rhs: t.dtype() });
            }
        }
        if self.chunk == Some(0) {
            return Err(Error::invalid_arg(op, "chunk must be at least 1"));
        }
        check_options(op, &self.options)?;
        Ok((n, d, v))
    }

    pub(crate) fn chunk_rows(&self, n: usize, d: usize, v: usize) -> usize {
        self.chunk.unwrap_or_else(|| auto_chunk(n, d, v)).min(n.max(1))
    }

    /// Takes the precomputed gradients out of the op (`None` when the
    /// forward made none or a backward already took them).
    pub(crate) fn take_grads(&self) -> Option<Vec<Tensor>> {
        lock(&self.grads).take()
    }

    /// The plan, once for every device: the shapes, dtypes, chunk and
    /// options, then the labels' dtype, then the inputs' compute dtype (the
    /// labels' values are the kernels').
    pub(crate) fn plan(&self, xs: &[&Tensor]) -> Result<HeadPlan> {
        let op = self.name();
        let (n, d, v) = self.check_shapes(xs)?;
        label_dtype(op, &self.labels)?;
        let compute = compute_dtype(op, xs[0])?;
        let chunk = self.chunk_rows(n, d, v);
        Ok(HeadPlan { op, n, d, v, chunk, compute, dtype: xs[0].dtype(), options: self.options })
    }

    /// The shapes of `[d_hidden, d_weight, d_bias?]`.
    pub(crate) fn grad_shapes(plan: &HeadPlan, bias: bool) -> Vec<Shape> {
        let mut out = vec![Shape::from([plan.n, plan.d]), Shape::from([plan.v, plan.d])];
        if bias {
            out.push(Shape::from([plan.v]));
        }
        out
    }

    /// The chunked forward on `backend`. With `precompute`, each chunk's
    /// gradient is made too and the op keeps `[d_hidden, d_weight, d_bias?]`.
    pub(crate) fn forward_on(
        &self,
        backend: &dyn Backend,
        plan: &HeadPlan,
        xs: &[&Tensor],
        precompute: bool,
    ) -> Result<Tensor> {
        let ins: Vec<Src<'_>> = xs.iter().map(|t| t.src()).collect();
        let f = backend.linear_ce(plan, &ins, self.labels.src(), precompute)?;
        *lock(&self.lse) = Some(Tensor::from_storage(f.lse, Shape::from([plan.n])));
        *lock(&self.valid) = Some(f.valid);
        if let Some(g) = f.grads {
            *lock(&self.grads) = Some(tensors(g, &Self::grad_shapes(plan, xs.len() > 2)));
        }
        let shape = match plan.options.reduction {
            Reduction::None => Shape::from([plan.n]),
            Reduction::Sum | Reduction::Mean => Shape::from(()),
        };
        Ok(Tensor::from_storage(f.loss, shape))
    }
}

impl Op for LinearCrossEntropy {
    fn name(&self) -> &'static str {
        "linear_cross_entropy"
    }
    fn arity(&self) -> Arity {
        Arity::between(2, 3)
    }
    fn operands(&self) -> smallvec::SmallVec<[&Tensor; 2]> {
        smallvec::smallvec![&self.labels]
    }
    fn release(&self) {
        *lock(&self.lse) = None;
        *lock(&self.valid) = None;
        *lock(&self.grads) = None;
    }
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let plan = self.plan(xs)?;
        self.forward_on(backend, &plan, xs, self.precompute && self.options.reduction != Reduction::None)
    }
}
