//! The fused classifier head: `cross_entropy(hidden @ weight^T + bias)`
//! in chunks of rows, so the `[N, V]` logits never exist at once.

use std::sync::Mutex;

use smallvec::SmallVec;

use super::{
    check_labels, check_options, compute_dtype, lock, logits_jvp, row_scale, row_weights, saved, traced_logits_grad,
    CrossEntropyOptions, Reduction,
};
use crate::cpu::cross_entropy::{self as kernels, Head};
use crate::ops::binary::BinaryOps;
use crate::ops::matmul::MatmulOps;
use crate::ops::reduce::ReduceOps;
use crate::ops::shape::ShapeOps;
use crate::ops::{Arity, Diff, InputGrads, Op, Saved};
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
    pub(super) precompute: bool,
    pub(super) lse: Mutex<Option<Tensor>>,
    /// The count of kept rows, saved by a CUDA forward (whose labels stay
    /// on the device) for the mean's backward.
    pub(super) valid: Mutex<Option<usize>>,
    /// `[d_hidden, d_weight, d_bias?]` for a unit upstream gradient, in the
    /// compute dtype, from the forward until a backward takes them.
    pub(super) grads: Mutex<Option<Vec<Tensor>>>,
}

/// The automatic chunk: rows whose logits take about 32 MiB, or as many
/// bytes as `hidden`'s gradient will take anyway if that is more.
pub fn auto_chunk(n: usize, d: usize, v: usize) -> usize {
    let budget = (32usize << 20).max(n * d * 4);
    (budget / (v.max(1) * 4)).clamp(1, n.max(1))
}

impl LinearCrossEntropy {
    fn check(&self, xs: &[&Tensor]) -> Result<(usize, usize, usize, Vec<Option<usize>>)> {
        let (n, d, v) = self.check_shapes(xs)?;
        Ok((n, d, v, check_labels(self.name(), &self.labels, self.options.ignore_index, v)?))
    }

    /// The checks of [`LinearCrossEntropy::check`] but the labels' values
    /// (which the CUDA kernels check on the device).
    pub(crate) fn check_shapes(&self, xs: &[&Tensor]) -> Result<(usize, usize, usize)> {
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

    /// Saves a CUDA forward's lse, count of kept rows and gradients.
    pub(crate) fn save_cuda(&self, lse: Tensor, valid: usize, grads: Option<Vec<Tensor>>) {
        *lock(&self.lse) = Some(lse);
        *lock(&self.valid) = Some(valid);
        if let Some(g) = grads {
            *lock(&self.grads) = Some(g);
        }
    }

    /// The lse and count of kept rows a CUDA forward saved, while both are there.
    pub(crate) fn saved_lse(&self) -> Option<(Tensor, usize)> {
        Some((saved(&self.lse)?, (*lock(&self.valid))?))
    }

    pub(crate) fn chunk_rows(&self, n: usize, d: usize, v: usize) -> usize {
        self.chunk.unwrap_or_else(|| auto_chunk(n, d, v)).min(n.max(1))
    }

    /// Takes the precomputed gradients out of the op (`None` when the
    /// forward made none or a backward already took them).
    pub(crate) fn take_grads(&self) -> Option<Vec<Tensor>> {
        lock(&self.grads).take()
    }

    /// What the kernels need to know of this op and inputs of these sizes.
    fn head<'a>(&self, n: usize, d: usize, v: usize, labels: &'a [Option<usize>]) -> Head<'a> {
        Head {
            n,
            d,
            v,
            labels,
            chunk: self.chunk_rows(n, d, v),
            smoothing: self.options.label_smoothing,
            reduction: self.options.reduction,
        }
    }

    /// The chunked forward. With `precompute`, each chunk's gradient is
    /// made too and the op keeps `[d_hidden, d_weight, d_bias?]`.
    fn run_forward(&self, xs: &[&Tensor], precompute: bool) -> Result<Tensor> {
        let (n, d, v, labels) = self.check(xs)?;
        let cd = compute_dtype(self.name(), xs[0])?;
        let (out, lse, grads) = kernels::linear_forward(&self.head(n, d, v, &labels), xs, cd, precompute)?;
        *lock(&self.lse) = Some(lse);
        if let Some(g) = grads {
            *lock(&self.grads) = Some(g);
        }
        out.cast_raw(xs[0].dtype())
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

    fn saves(&self) -> Saved {
        Saved::INPUTS
    }

    fn release(&self) {
        *lock(&self.lse) = None;
        *lock(&self.valid) = None;
        *lock(&self.grads) = None;
    }

    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        self.run_forward(xs, self.precompute && self.options.reduction != Reduction::None)
    }

    fn forward_cuda(&self, xs: &[&Tensor]) -> Result<Tensor> {
        crate::cuda::cross_entropy::linear_forward(
            self,
            xs,
            self.precompute && self.options.reduction != Reduction::None,
        )
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
        if matches!(xs[0].device(), crate::Device::Cuda(_)) {
            return Ok(crate::cuda::cross_entropy::linear_backward(self, &xs, &g)?.into_iter().map(Some).collect());
        }
        let dt = xs[0].dtype();
        if let Some(grads) = self.take_grads() {
            // Made by the forward for a unit upstream gradient of a sum or
            // mean; `g` is that scalar.
            let s = g.item()?;
            return grads.into_iter().map(|t| Ok(Some(kernels::scale_in_place(t, s)?.cast_raw(dt)?))).collect();
        }
        let refs: Vec<&Tensor> = xs.iter().collect();
        let (n, d, v, labels) = self.check(&refs)?;
        let cd = compute_dtype(self.name(), &xs[0])?;
        let ins: Vec<Tensor> = xs.iter().map(|t| t.cast_raw(cd)?.contiguous()).collect::<Result<_>>()?;
        let weights = row_weights(&g, &labels, self.options.reduction)?;
        let lse = match saved(&self.lse) {
            Some(l) => l,
            None => {
                let ins: Vec<&Tensor> = ins.iter().collect();
                self.run_forward(&ins, false)?;
                saved(&self.lse).expect("internal: forward saves lse")
            }
        };
        let grads = kernels::linear_backward(&self.head(n, d, v, &labels), &ins, &lse, &weights)?;
        grads.into_iter().map(|t| Ok(Some(t.cast_raw(dt)?))).collect()
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
