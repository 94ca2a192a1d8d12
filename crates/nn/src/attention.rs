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
//! On CUDA both ops have kernels (launched by
//! `tapir_tensor::cuda::attention`): the causal softmax computes its mask
//! from the row and column, and the attention is fused in the manner of
//! FlashAttention-2 (query tiles, keys and values streamed through shared
//! memory, an online softmax, and a backward that recomputes the
//! probabilities tile by tile from each row's log-sum-exp), f32 arithmetic
//! for f32, f16 and bf16 inputs. Neither holds a `[T, T]` tensor. A graph
//! that records through the attention (second order, forward mode) uses
//! the composed rule, as on the CPU.

use crate::cpu::attention::Heads;
use smallvec::SmallVec;
use tapir_autograd::Var;
use tapir_tensor::cuda::attention as flash;
use tapir_tensor::ops::{add_opt, one, Arity, InputGrads, Op, Saved};
use tapir_tensor::{
    BinaryOps, DType, Device, Diff, Error, MatmulOps, ReduceOps, Result, Rng, ShapeOps, Tensor, UnaryOps,
};

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

    fn saves(&self) -> Saved {
        Saved::OUTPUT
    }
    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let (tq, tk) = self.check(xs[0])?;
        crate::cpu::attention::causal_softmax(self.scale, xs[0], tq, tk)
    }
    /// On CUDA, the kernel of `kernels/softmax.cu`, which computes the mask
    /// from the row and column it is at: no mask tensor exists.
    fn forward_cuda(&self, xs: &[&Tensor]) -> Result<Tensor> {
        self.check(xs[0])?;
        tapir_tensor::cuda::attention::causal_softmax(xs[0], self.scale)
    }
    fn vjp<T: Diff>(&self, _: &[&T], y: &T, g: &T) -> Result<InputGrads<T>> {
        Ok(one(self.pushforward(y, g)?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], y: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| self.pushforward(y, t)).transpose()
    }
}

impl CausalSoftmax {
    /// The query and key counts of scores `[..., Tq, Tk]` (`Tq <= Tk`).
    fn check(&self, x: &Tensor) -> Result<(usize, usize)> {
        let dims = x.dims();
        if dims.len() < 2 || dims[dims.len() - 2] > dims[dims.len() - 1] {
            return Err(Error::InvalidShape {
                op: "causal_softmax",
                shape: Box::new(x.shape().clone()),
                reason: "needs [..., queries, keys] with queries <= keys".into(),
            });
        }
        Ok((dims[dims.len() - 2], dims[dims.len() - 1]))
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
    fn check(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Heads> {
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
        Ok(Heads { heads: self.heads, scale: self.scale, t, c, d: c / self.heads })
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

    fn vjp_kernel(&self, xs: [&Tensor; 3], y: &Tensor, g: &Tensor) -> Result<Option<[Tensor; 3]>> {
        let hs = self.check(xs[0], xs[1], xs[2])?;
        let devices = xs.iter().chain([&y, &g]).map(|t| t.device());
        match xs[0].device() {
            Device::Cpu if devices.clone().all(|d| d == Device::Cpu) => crate::cpu::attention::backward(&hs, xs, y, g),
            Device::Cuda(_)
                if devices.clone().all(|d| d == xs[0].device())
                    && g.dtype() == xs[0].dtype()
                    && y.dtype() == xs[0].dtype()
                    && flash::flash_applies(xs[0], self.heads) =>
            {
                let [q, k, v] = xs;
                flash::flash_backward(q, k, v, y, g, None, self.heads, self.scale).map(Some)
            }
            _ => Ok(None),
        }
    }
}

impl Op for CausalAttention {
    fn name(&self) -> &'static str {
        "causal_attention"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(3)
    }
    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let hs = self.check(xs[0], xs[1], xs[2])?;
        crate::cpu::attention::forward(&hs, xs)
    }
    /// On CUDA, the fused kernel of `kernels/attention.cu` where it applies
    /// (f32, f16, bf16 heads up to 128 wide, f64 up to 64), else the
    /// composition.
    fn forward_cuda(&self, xs: &[&Tensor]) -> Result<Tensor> {
        self.check(xs[0], xs[1], xs[2])?;
        if flash::flash_applies(xs[0], self.heads) {
            // The log-sum-exp is dropped: the op has one output, and the
            // backward recomputes it with one pass of the forward kernel
            // that writes no output ([B, H, T], never [T, T]).
            let (y, _lse) = flash::flash_forward(xs[0], xs[1], xs[2], self.heads, self.scale)?;
            return Ok(y);
        }
        self.composed(xs[0], xs[1], xs[2])
    }
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
