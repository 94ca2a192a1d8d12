//! Causal multi-head self-attention.
//!
//! The causal mask is not a tensor. Attention scores go through one op,
//! [`CausalSoftmax`], that computes `softmax(scale * s)` over the allowed
//! keys of each query row (`j <= i`) and writes exact zeros above the
//! diagonal. Compared with adding a cached `[T, T]` `-inf` mask this
//! allocates no mask (not even once), makes one pass instead of three
//! (scale, add, softmax), and its backward never computes the gradient of a
//! mask that nobody asked for. Its derivative rules are the softmax rules,
//! written in differentiable ops: masked entries have `y = 0`, so they get
//! zero gradient with no special case, and higher orders work as for any op.

use tapir_autograd::Var;
use tapir_tensor::ops::{one, InputGrads, Op};
use tapir_tensor::{BinaryOps, DType, Diff, Error, MatmulOps, ReduceOps, Result, Rng, ShapeOps, Tensor, UnaryOps};

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

fn causal_rows<T: tapir_tensor::Float + tapir_tensor::CpuElement>(
    x: &[T],
    out: &mut [T],
    tq: usize,
    tk: usize,
    scale: T,
) {
    for (r, (xi, oi)) in x.chunks(tk).zip(out.chunks_mut(tk)).enumerate() {
        let i = r % tq;
        let n = (i + 1 + tk - tq).min(tk);
        let (xa, (oa, om)) = (&xi[..n], oi.split_at_mut(n));
        let m = xa.iter().fold(T::NEG_INF, |a, &b| a.max(b * scale));
        let mut s = T::ZERO;
        for (o, &v) in oa.iter_mut().zip(xa) {
            let e = (v * scale - m).exp();
            *o = e;
            s += e;
        }
        let inv = T::ONE / s;
        oa.iter_mut().for_each(|o| *o *= inv);
        om.iter_mut().for_each(|o| *o = T::ZERO);
    }
}

impl Op for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal_softmax"
    }
    fn forward(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0];
        let dims = x.dims();
        if dims.len() < 2 || dims[dims.len() - 2] > dims[dims.len() - 1] {
            return Err(Error::InvalidShape {
                op: "causal_softmax",
                shape: x.shape().clone(),
                reason: "needs [..., queries, keys] with queries <= keys".into(),
            });
        }
        let (tq, tk) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        let x = x.contiguous();
        match x.dtype() {
            DType::F32 => {
                let src = x.as_slice::<f32>().expect("internal: contiguous");
                let mut out = vec![0.0f32; src.len()];
                causal_rows(src, &mut out, tq, tk, self.scale as f32);
                Tensor::from_vec(out, x.shape().clone())
            }
            DType::F64 => {
                let src = x.as_slice::<f64>().expect("internal: contiguous");
                let mut out = vec![0.0f64; src.len()];
                causal_rows(src, &mut out, tq, tk, self.scale);
                Tensor::from_vec(out, x.shape().clone())
            }
            DType::F16 | DType::BF16 => self.forward(&[&x.cast(DType::F32)?])?.cast(x.dtype()),
            dtype => Err(Error::UnsupportedDType { op: "causal_softmax", dtype, expected: "a float dtype" }),
        }
    }
    fn vjp<T: Diff>(&self, _: &[&T], y: &T, g: &T) -> Result<InputGrads<T>> {
        Ok(one(self.pushforward(y, g)?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], y: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| self.pushforward(y, t)).transpose()
    }
}

impl CausalSoftmax {
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
                shape: s.clone(),
                reason: "input must be [batch, time, d_model]".into(),
            });
        }
        let (b, t, c) = (d[0], d[1], d[2]);
        let (h, hd) = (self.heads, c / self.heads);
        // [B, T, C] -> [B, H, T, hd]: a reshape and a permute, both views.
        let split = |l: &Linear| -> Result<Var<'g>> { l.forward(p, x)?.reshape([b, t, h, hd])?.permute(&[0, 2, 1, 3]) };
        let (q, k, v) = (split(&self.q)?, split(&self.k)?, split(&self.v)?);
        let att = causal_softmax(&q.matmul(&k.t()?)?, 1.0 / (hd as f64).sqrt())?;
        let att = self.attn_drop.forward(att, rng)?;
        let y = att.matmul(&v)?.permute(&[0, 2, 1, 3])?.reshape([b, t, c])?;
        match residual {
            Some(r) => self.proj.forward_residual(p, y, r),
            None => self.proj.forward(p, y),
        }
    }
}
