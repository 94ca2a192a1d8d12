//! Causal multi-head self-attention.
//!
//! The causal mask is never a tensor, not even a cached one. Attention runs
//! as one op, [`CausalAttention`], that visits only the keys `j <= i` of
//! each query, addresses the heads in place inside `[B, T, C]` (no split or
//! merge copies), and keeps neither scores nor probabilities for the
//! backward pass (it recomputes them per row, as flash attention does).
//! With attention dropout, which needs the probabilities themselves, the
//! layer takes the composed path: scores from a matmul, then
//! [`CausalSoftmax`], which computes `softmax(scale * s)` over the allowed
//! keys and writes exact zeros above the diagonal. Compared with adding a
//! `[T, T]` `-inf` mask, that allocates no mask, makes one pass instead of
//! three, and never computes the gradient of a mask nobody asked for. Both
//! ops' rules are written in differentiable ops (masked entries have
//! `p = 0`, so they get zero gradient with no special case), so every
//! derivative order works.
//!
//! How a device runs them is its backend's business (the kernels of
//! `crate::backend::AttentionKernels`): on the CPU, rows over the pool; on
//! CUDA, a causal softmax that computes its mask from the row and column,
//! and attention fused in the manner of FlashAttention-2 (query tiles,
//! keys and values streamed through shared memory, an online softmax, and
//! a backward that recomputes the probabilities tile by tile from each
//! row's log-sum-exp). Neither holds a `[T, T]` tensor. Where a device has
//! no fused attention for the inputs, the op composes it from matmuls and
//! [`CausalSoftmax`]; a graph that records through the attention (second
//! order, forward mode) uses the composed rule on every device.

use smallvec::SmallVec;
use tapir_autograd::Var;
use tapir_tensor::backend::Backend;
use tapir_tensor::ops::{add_opt, one, Arity, Derivative, InputGrads, Op, Saved};
use tapir_tensor::{BinaryOps, DType, Diff, Error, MatmulOps, ReduceOps, Result, Rng, ShapeOps, Tensor, UnaryOps};

use crate::backend::{AttentionPlan, CausalSoftmaxPlan};
use crate::dispatch::backend_for;

use crate::layers::{Dropout, Linear};
use crate::params::{Bound, ParamStore};

/// `softmax(scale * x)` along the last axis of `x` `[..., Tq, Tk]`, with
/// query `i` attending to keys `j <= i + (Tk - Tq)` only (the causal mask
/// of a query block at the end of the key sequence); masked entries are 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CausalSoftmax {
    /// Multiplies the scores before the softmax (`1 / sqrt(head_dim)`).
    pub scale: f64,
}

impl Op for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal_softmax"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let plan = self.check(xs[0])?;
        backend_for(xs[0].device()).causal_softmax(&plan, xs[0])
    }
}

impl Derivative for CausalSoftmax {
    fn saves(&self) -> Saved {
        Saved::OUTPUT
    }
    fn vjp<T: Diff>(&self, _: &[&T], y: &T, g: &T) -> Result<InputGrads<T>> {
        Ok(one(self.pushforward(y, g)?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], y: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| self.pushforward(y, t)).transpose()
    }
}

impl CausalSoftmax {
    /// The plan of scores `[..., Tq, Tk]` (`Tq <= Tk`).
    fn check(&self, x: &Tensor) -> Result<CausalSoftmaxPlan> {
        let dims = x.dims();
        if dims.len() < 2 || dims[dims.len() - 2] > dims[dims.len() - 1] {
            return Err(Error::InvalidShape {
                op: "causal_softmax",
                shape: Box::new(x.shape().clone()),
                reason: "needs [..., queries, keys] with queries <= keys".into(),
            });
        }
        Ok(CausalSoftmaxPlan { scale: self.scale, queries: dims[dims.len() - 2], keys: dims[dims.len() - 1] })
    }

    /// The Jacobian is `scale * (diag(y) - y y^T)` per row, symmetric, so
    /// one formula serves both modes: `scale * y * (v - sum(v * y))`.
    fn pushforward<T: Diff>(&self, y: &T, v: &T) -> Result<T> {
        y.mul(&v.sub(&v.mul(y)?.sum(&[-1], true)?)?)?.mul_scalar(self.scale)
    }
}

/// Applies [`CausalSoftmax`] to any differentiable value.
pub fn causal_softmax<T: Diff>(scores: &T, scale: f64) -> Result<T> {
    T::apply(CausalSoftmax { scale }, &[scores])
}

/// Causal multi-head attention as one op: for `q`, `k`, `v` `[B, T, C]`
/// with `heads` heads of width `D = C / heads` (head `h` is channels
/// `h*D..(h+1)*D`), `y[b, i, h] = sum_{j <= i} softmax_j(scale q_i . k_j) v_j`,
/// `[B, T, C]`.
///
/// The heads are addressed in place, so no split or merge copies exist,
/// and neither the scores nor the probabilities are kept: the backward
/// pass recomputes them per row from `q` and `k` (the memory-saving trick
/// of flash attention). When recording, the rule is the composition of
/// matmuls and [`CausalSoftmax`], so every order works.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CausalAttention {
    /// Number of heads.
    pub heads: usize,
    /// Multiplies `q . k` (`1 / sqrt(D)`).
    pub scale: f64,
}

impl CausalAttention {
    fn check(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<AttentionPlan> {
        let bad =
            |reason: String| Error::InvalidShape { op: "causal_attention", shape: Box::new(q.shape().clone()), reason };
        if q.rank() != 3 || k.shape() != q.shape() || v.shape() != q.shape() {
            return Err(bad(format!(
                "q, k, v must be equal [batch, time, channels]; k {}, v {}",
                k.shape(),
                v.shape()
            )));
        }
        let (t, c) = (q.dims()[1], q.dims()[2]);
        if self.heads == 0 || !c.is_multiple_of(self.heads) {
            return Err(bad(format!("{c} channels do not split into {} heads", self.heads)));
        }
        if k.dtype() != q.dtype() || v.dtype() != q.dtype() {
            return Err(Error::DTypeMismatch { op: "causal_attention", lhs: q.dtype(), rhs: k.dtype() });
        }
        Ok(AttentionPlan { batch: q.dims()[0], heads: self.heads, scale: self.scale, t, c, d: c / self.heads })
    }

    /// `[B, T, C]` -> `[B, H, T, D]` (views).
    fn split<T: Diff>(&self, x: &T) -> Result<T> {
        let s = x.shape();
        let (b, t, c) = (s.dims()[0], s.dims()[1], s.dims()[2]);
        x.reshape([b, t, self.heads, c / self.heads])?.permute(&[0, 2, 1, 3])
    }

    /// `[B, H, T, D]` -> `[B, T, C]`.
    fn merge<T: Diff>(&self, x: &T) -> Result<T> {
        let s = x.shape();
        let (b, h, t, d) = (s.dims()[0], s.dims()[1], s.dims()[2], s.dims()[3]);
        x.permute(&[0, 2, 1, 3])?.reshape([b, t, h * d])
    }

    /// The probabilities `[B, H, T, T]`, in differentiable ops.
    fn probs<T: Diff>(&self, qh: &T, kh: &T) -> Result<T> {
        causal_softmax(&qh.matmul(&kh.t()?)?, self.scale)
    }

    /// The same function composed from matmul and [`CausalSoftmax`].
    pub fn composed<T: Diff>(&self, q: &T, k: &T, v: &T) -> Result<T> {
        let (qh, kh, vh) = (self.split(q)?, self.split(k)?, self.split(v)?);
        self.merge(&self.probs(&qh, &kh)?.matmul(&vh)?)
    }

    /// The device's fused gradients where it has them for these values,
    /// else `None` (the rule runs). The kernels read `y` and `g` as they
    /// read the inputs: one device and one dtype, else the rule.
    fn vjp_kernel(&self, xs: [&Tensor; 3], y: &Tensor, g: &Tensor) -> Result<Option<[Tensor; 3]>> {
        let plan = self.check(xs[0], xs[1], xs[2])?;
        let q = xs[0];
        let alike = |t: &&Tensor| t.device() == q.device() && t.dtype() == q.dtype();
        if !xs.iter().chain([&y, &g]).all(alike) {
            return Ok(None);
        }
        backend_for(q.device()).causal_attention_grad(&plan, xs, y, g)
    }
}

impl Op for CausalAttention {
    fn name(&self) -> &'static str {
        "causal_attention"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(3)
    }
    /// The device's fused kernel where it has one for the inputs, else
    /// the composition.
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let plan = self.check(xs[0], xs[1], xs[2])?;
        match backend_for(xs[0].device()).causal_attention(&plan, xs[0], xs[1], xs[2])? {
            Some(y) => Ok(y),
            None => self.composed(xs[0], xs[1], xs[2]),
        }
    }
}

impl Derivative for CausalAttention {
    /// The fused backward kernel where it applies, else the composed rule.
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, y: Tensor, g: Tensor) -> Result<InputGrads<Tensor>> {
        if let Some(d) = self.vjp_kernel([&xs[0], &xs[1], &xs[2]], &y, &g)? {
            return Ok(d.into_iter().map(Some).collect());
        }
        self.vjp(&[&xs[0], &xs[1], &xs[2]], &y, &g)
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        // The composed rule: P = softmax, dV = P^T dY, dS = scale P (dP - rowsum(P dP)).
        let (qh, kh, vh, gh) = (self.split(xs[0])?, self.split(xs[1])?, self.split(xs[2])?, self.split(g)?);
        let p = self.probs(&qh, &kh)?;
        let dv = p.t()?.matmul(&gh)?;
        let dp = gh.matmul(&vh.t()?)?;
        let ds = p.mul(&dp.sub(&dp.mul(&p)?.sum(&[-1], true)?)?)?.mul_scalar(self.scale)?;
        let (dq, dk) = (ds.matmul(&kh)?, ds.t()?.matmul(&qh)?);
        [dq, dk, dv].iter().map(|t| self.merge(t).map(Some)).collect()
    }
    fn jvp<T: Diff>(&self, xs: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        if ts.iter().all(|t| t.is_none()) {
            return Ok(None);
        }
        let (qh, kh, vh) = (self.split(xs[0])?, self.split(xs[1])?, self.split(xs[2])?);
        let p = self.probs(&qh, &kh)?;
        let tq = ts[0].map(|t| self.split(t)?.matmul(&kh.t()?)).transpose()?;
        let tk = ts[1].map(|t| qh.matmul(&self.split(t)?.t()?)).transpose()?;
        let ty_p = match add_opt(tq, tk)? {
            Some(tsc) => {
                let tsc = tsc.mul_scalar(self.scale)?;
                let tp = p.mul(&tsc.sub(&tsc.mul(&p)?.sum(&[-1], true)?)?)?;
                Some(tp.matmul(&vh)?)
            }
            None => None,
        };
        let ty_v = ts[2].map(|t| p.matmul(&self.split(t)?)).transpose()?;
        add_opt(ty_p, ty_v)?.map(|t| self.merge(&t)).transpose()
    }
}

/// Applies [`CausalAttention`] to `q`, `k`, `v` `[B, T, C]`.
pub fn causal_attention<T: Diff>(q: &T, k: &T, v: &T, heads: usize) -> Result<T> {
    let c = q.shape().dims().last().copied().unwrap_or(0);
    let scale = 1.0 / ((c / heads.max(1)).max(1) as f64).sqrt();
    T::apply(CausalAttention { heads, scale }, &[q, k, v])
}

/// Multi-head self-attention where each position sees only itself and the
/// positions before it (GPT-2's attention, with separate q, k, v
/// projections so their gradients need no split and re-join).
#[derive(Debug, Clone)]
pub struct CausalSelfAttention {
    /// Query projection.
    pub q: Linear,
    /// Key projection.
    pub k: Linear,
    /// Value projection.
    pub v: Linear,
    /// Output projection.
    pub proj: Linear,
    /// Number of heads; `d_model` must be a multiple.
    pub heads: usize,
    /// Dropout on the attention weights.
    pub attn_drop: Dropout,
}

impl CausalSelfAttention {
    /// A new layer of width `d_model` with `heads` heads, weights N(0, std^2)
    /// (the output projection's `std` is `proj_std`), zero biases.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: &mut ParamStore,
        name: &str,
        d_model: usize,
        heads: usize,
        std: f64,
        proj_std: f64,
        rng: &mut Rng,
        dtype: DType,
    ) -> Result<Self> {
        if heads == 0 || !d_model.is_multiple_of(heads) {
            return Err(Error::invalid_arg(
                "CausalSelfAttention::new",
                format!("d_model {d_model} is not a multiple of {heads} heads"),
            ));
        }
        let mut lin = |n: &str, s: f64| Linear::normal(store, &format!("{name}.{n}"), d_model, d_model, s, rng, dtype);
        Ok(CausalSelfAttention {
            q: lin("q", std)?,
            k: lin("k", std)?,
            v: lin("v", std)?,
            proj: lin("proj", proj_std)?,
            heads,
            attn_drop: Dropout { p: 0.0 },
        })
    }

    /// Attends over `x` `[B, T, C]`; returns `[B, T, C]`. `rng` is the
    /// dropout generator in training, `None` in evaluation.
    pub fn forward<'g>(&self, p: &Bound<'g>, x: Var<'g>, rng: Option<&mut Rng>) -> Result<Var<'g>> {
        self.forward_inner(p, x, None, rng)
    }

    /// `r + attention(x)`, the residual added inside the output projection.
    pub fn forward_residual<'g>(
        &self,
        p: &Bound<'g>,
        x: Var<'g>,
        r: Var<'g>,
        rng: Option<&mut Rng>,
    ) -> Result<Var<'g>> {
        self.forward_inner(p, x, Some(r), rng)
    }

    fn forward_inner<'g>(
        &self,
        p: &Bound<'g>,
        x: Var<'g>,
        residual: Option<Var<'g>>,
        rng: Option<&mut Rng>,
    ) -> Result<Var<'g>> {
        let s = x.shape();
        let d = s.dims();
        if d.len() != 3 {
            return Err(Error::InvalidShape {
                op: "CausalSelfAttention",
                shape: Box::new(s.clone()),
                reason: "input must be [batch, time, d_model]".into(),
            });
        }
        let (b, t, c) = (d[0], d[1], d[2]);
        let (h, hd) = (self.heads, c / self.heads);
        let (q, k, v) = (self.q.forward(p, x)?, self.k.forward(p, x)?, self.v.forward(p, x)?);
        let y = match rng {
            // Attention dropout needs the probabilities themselves: the
            // composed path, [B, T, C] -> [B, H, T, hd] by views.
            Some(rng) if self.attn_drop.p > 0.0 => {
                let split = |v: Var<'g>| -> Result<Var<'g>> { v.reshape([b, t, h, hd])?.permute(&[0, 2, 1, 3]) };
                let att = causal_softmax(&split(q)?.matmul(&split(k)?.t()?)?, 1.0 / (hd as f64).sqrt())?;
                let att = self.attn_drop.forward(att, Some(rng))?;
                att.matmul(&split(v)?)?.permute(&[0, 2, 1, 3])?.reshape([b, t, c])?
            }
            _ => causal_attention(&q, &k, &v, h)?,
        };
        match residual {
            Some(r) => self.proj.forward_residual(p, y, r),
            None => self.proj.forward(p, y),
        }
    }
}
