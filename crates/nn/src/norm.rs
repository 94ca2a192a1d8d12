//! Normalisation over the last axis: LayerNorm and RMSNorm.
//!
//! Each runs as one op, [`NormOp`]: a one-pass forward per row, and a
//! backward that (when not recording) recomputes the row's mean and
//! reciprocal deviation from the input and writes the three gradients in
//! one pass. Composed from mean, sub, square, rsqrt and mul instead, a
//! LayerNorm records about ten nodes whose values all stay alive until the
//! backward pass, and its backward makes some twenty passes. Under
//! `create_graph` the rule switches to that composed, differentiable
//! formulation, so derivatives of every order still work;
//! [`LayerNorm::forward_composed`] is the composition itself, kept as the
//! reference the op is tested against.

use smallvec::SmallVec;
use tapir_autograd::Var;
use tapir_tensor::backend::Backend;
use tapir_tensor::ops::{add_opt, Arity, Derivative, InputGrads, Op, Saved};
use tapir_tensor::{BinaryOps, DType, Diff, Error, ReduceOps, Result, ShapeOps, Tensor, UnaryOps};

use crate::backend::NormPlan;
use crate::dispatch::backend_for;
use crate::params::{Bound, ParamId, ParamStore};

/// torch.nn.LayerNorm over the last axis:
/// `(x - mean) / sqrt(var + eps) * weight + bias`, with the biased variance.
#[derive(Debug, Clone, Copy)]
pub struct LayerNorm {
    /// Scale `[dim]` (ones at init), if affine.
    pub weight: Option<ParamId>,
    /// Shift `[dim]` (zeros at init), if affine with bias.
    pub bias: Option<ParamId>,
    /// Added to the variance.
    pub eps: f64,
}

impl LayerNorm {
    /// A LayerNorm of width `dim` with a scale and, if `bias`, a shift. Both
    /// go in the "no_decay" group.
    pub fn new(store: &mut ParamStore, name: &str, dim: usize, bias: bool, dtype: DType) -> Result<Self> {
        let weight = Some(store.add_to_group(format!("{name}.weight"), "no_decay", Tensor::ones([dim], dtype)?)?);
        let bias = if bias {
            Some(store.add_to_group(format!("{name}.bias"), "no_decay", Tensor::zeros([dim], dtype)?)?)
        } else {
            None
        };
        Ok(LayerNorm { weight, bias, eps: 1e-5 })
    }

    /// Normalises `x` over its last axis (one [`NormOp`]).
    pub fn forward<'g>(&self, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
        let (w, b) = (self.weight.map(|w| p.var(w)).transpose()?, self.bias.map(|b| p.var(b)).transpose()?);
        norm(&x, w.as_ref(), b.as_ref(), self.eps, false)
    }

    /// [`LayerNorm::forward`] for a norm whose output feeds only
    /// [`Linear`](crate::Linear) layers: under a low [`crate::Precision`]
    /// the output is stored in the compute dtype, which those layers round
    /// their input to anyway, so the numbers are the same and the node
    /// keeps 2 bytes an element instead of 4 (under autocast PyTorch keeps
    /// the Linear's bf16 copy and frees the norm's f32 output, to the same
    /// effect). In full precision, the same as `forward`.
    pub fn forward_into_linear<'g>(&self, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
        let (w, b) = (self.weight.map(|w| p.var(w)).transpose()?, self.bias.map(|b| p.var(b)).transpose()?);
        let op = NormOp {
            eps: self.eps,
            rms: false,
            has_weight: w.is_some(),
            has_bias: b.is_some(),
            out: p.precision().compute_dtype(),
        };
        norm_with(op, &x, w.as_ref(), b.as_ref())
    }

    /// The same function composed from mean, sub, square, rsqrt and mul: the
    /// reference [`LayerNorm::forward`] is tested against.
    pub fn forward_composed<'g>(&self, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
        let xc = x.sub(&x.mean(&[-1], true)?)?;
        let rstd = xc.square()?.mean(&[-1], true)?.add_scalar(self.eps)?.rsqrt()?;
        affine(p, xc.mul(&rstd)?, self.weight, self.bias)
    }
}

/// RMSNorm over the last axis: `x / sqrt(mean(x^2) + eps) * weight`.
#[derive(Debug, Clone, Copy)]
pub struct RmsNorm {
    /// Scale `[dim]` (ones at init).
    pub weight: Option<ParamId>,
    /// Added to the mean square.
    pub eps: f64,
}

impl RmsNorm {
    /// An RMSNorm of width `dim` with a scale in the "no_decay" group.
    pub fn new(store: &mut ParamStore, name: &str, dim: usize, dtype: DType) -> Result<Self> {
        let weight = Some(store.add_to_group(format!("{name}.weight"), "no_decay", Tensor::ones([dim], dtype)?)?);
        Ok(RmsNorm { weight, eps: 1e-6 })
    }

    /// Normalises `x` over its last axis (one [`NormOp`]).
    pub fn forward<'g>(&self, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
        norm(&x, self.weight.map(|w| p.var(w)).transpose()?.as_ref(), None, self.eps, true)
    }

    /// The same function composed from square, mean, rsqrt and mul.
    pub fn forward_composed<'g>(&self, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
        let rms = x.square()?.mean(&[-1], true)?.add_scalar(self.eps)?.rsqrt()?;
        affine(p, x.mul(&rms)?, self.weight, None)
    }
}

fn affine<'g>(p: &Bound<'g>, y: Var<'g>, w: Option<ParamId>, b: Option<ParamId>) -> Result<Var<'g>> {
    let y = match w {
        Some(w) => y.mul(&p.var(w)?)?,
        None => y,
    };
    match b {
        Some(b) => y.add(&p.var(b)?),
        None => Ok(y),
    }
}

/// `(x - mean) * rstd * w + b` over the last axis, `rstd = 1 / sqrt(var +
/// eps)` (LayerNorm), or with `rms` no mean and `rstd = 1 / sqrt(mean(x^2) +
/// eps)` (RMSNorm). Inputs: `x`, then the scale `w` if `has_weight`, then
/// the shift `b` if `has_bias`, each `[dim]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormOp {
    /// Added to the variance (mean square).
    pub eps: f64,
    /// RMSNorm: no centring.
    pub rms: bool,
    /// A scale input follows `x`.
    pub has_weight: bool,
    /// A shift input follows (after the scale, if any).
    pub has_bias: bool,
    /// The float dtype the output is stored in (`None`: the input's): the
    /// row is computed as ever and rounded once. Its gradient arrives in
    /// that dtype and is widened exactly to the input's before the rule.
    pub out: Option<DType>,
}

/// Applies [`NormOp`] over the last axis of `x`.
pub fn norm<T: Diff>(x: &T, w: Option<&T>, b: Option<&T>, eps: f64, rms: bool) -> Result<T> {
    norm_with(NormOp { eps, rms, has_weight: w.is_some(), has_bias: b.is_some(), out: None }, x, w, b)
}

/// Applies `op` (whose `has_weight` and `has_bias` say which of `w`, `b`
/// are given) over the last axis of `x`.
pub fn norm_with<T: Diff>(op: NormOp, x: &T, w: Option<&T>, b: Option<&T>) -> Result<T> {
    let mut inputs = vec![x];
    inputs.extend(w);
    inputs.extend(b);
    T::apply(op, &inputs)
}

impl NormOp {
    /// The normalised input `(x - mean) * rstd` and `rstd`, in differentiable ops.
    fn normalized<T: Diff>(&self, x: &T) -> Result<(T, T)> {
        let xc = if self.rms { x.clone() } else { x.sub(&x.mean(&[-1], true)?)? };
        let rstd = xc.square()?.mean(&[-1], true)?.add_scalar(self.eps)?.rsqrt()?;
        Ok((xc.mul(&rstd)?, rstd))
    }

    /// `rstd * (v - mean(v) - h * mean(v * h))` (no `mean(v)` for RMS): the
    /// normalisation's Jacobian applied to `v` (it is symmetric).
    fn project<T: Diff>(&self, h: &T, rstd: &T, v: &T) -> Result<T> {
        let mut u = v.sub(&h.mul(&v.mul(h)?.mean(&[-1], true)?)?)?;
        if !self.rms {
            u = u.sub(&v.mean(&[-1], true)?)?;
        }
        u.mul(rstd)
    }

    /// Checks the inputs' shapes and dtypes into the kernels' plan.
    fn check(&self, xs: &[&Tensor]) -> Result<NormPlan> {
        let x = xs[0];
        let d = match x.dims().last() {
            Some(&d) if d > 0 => d,
            _ => {
                return Err(Error::InvalidShape {
                    op: self.name(),
                    shape: Box::new(x.shape().clone()),
                    reason: "needs a non-empty last axis".into(),
                })
            }
        };
        if let Some(dtype) = self.out.filter(|d| !d.is_float()) {
            return Err(Error::UnsupportedDType { op: self.name(), dtype, expected: "a float output dtype" });
        }
        let (w, b) = self.params_of(xs);
        for p in w.iter().chain(b.iter()) {
            if p.dims() != [d] {
                return Err(Error::ShapeMismatch {
                    op: self.name(),
                    lhs: Box::new(x.shape().clone()),
                    rhs: Box::new(p.shape().clone()),
                });
            }
            if p.dtype() != x.dtype() {
                return Err(Error::DTypeMismatch { op: self.name(), lhs: x.dtype(), rhs: p.dtype() });
            }
        }
        Ok(self.plan(d))
    }

    /// What the kernels compute over rows of `d` elements.
    fn plan(&self, d: usize) -> NormPlan {
        NormPlan { op: self.name(), eps: self.eps, rms: self.rms, d }
    }

    /// The scale and the shift, where the op has them.
    fn params_of<'a, T>(&self, xs: &[&'a T]) -> (Option<&'a T>, Option<&'a T>) {
        (self.has_weight.then(|| xs[1]), self.has_bias.then(|| xs[xs.len() - 1]))
    }

    /// The op from tensor ops, for a device without a fused kernel.
    fn composed(&self, x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>) -> Result<Tensor> {
        let (h, _) = self.normalized(x)?;
        let h = match w {
            Some(w) => h.mul(w)?,
            None => h,
        };
        match b {
            Some(b) => h.add(b),
            None => Ok(h),
        }
    }

    /// The eager backward: the device's one pass per row where it has one
    /// (on the CPU, f32 or f64 rows), else `None`. The inputs are those
    /// the forward checked, so the plan needs only their row width (a
    /// scalar, which no forward let through, goes to the rule).
    fn vjp_kernel(&self, x: &Tensor, w: Option<&Tensor>, g: &Tensor) -> Result<Option<[Tensor; 3]>> {
        let Some(&d) = x.dims().last() else { return Ok(None) };
        backend_for(x.device()).norm_grad(&self.plan(d), x, w, g)
    }
}

impl Op for NormOp {
    fn name(&self) -> &'static str {
        if self.rms {
            "rms_norm"
        } else {
            "layer_norm"
        }
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1 + self.has_weight as usize + self.has_bias as usize)
    }
    /// The device's fused kernel where it has one, else the composition.
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let plan = self.check(xs)?;
        let (w, b) = self.params_of(xs);
        let y = match backend_for(xs[0].device()).norm(&plan, xs[0], w, b)? {
            Some(y) => y,
            None => self.composed(xs[0], w, b)?,
        };
        // The computed output is a temporary when stored narrower.
        match self.out {
            Some(dtype) => y.cast(dtype),
            None => Ok(y),
        }
    }
}

impl Derivative for NormOp {
    fn saves(&self) -> Saved {
        // x and the weight (when there is one); never the bias or the output.
        if self.has_weight {
            Saved::input(0).and_input(1)
        } else {
            Saved::input(0)
        }
    }
    /// The fused backward kernel where it applies, else the differentiable rule.
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, y: Tensor, g: Tensor) -> Result<InputGrads<Tensor>> {
        let g = g.cast(xs[0].dtype())?;
        let w = self.has_weight.then(|| &xs[1]);
        if let Some([dx, dw, db]) = self.vjp_kernel(&xs[0], w, &g)? {
            let mut out: InputGrads<Tensor> = smallvec::smallvec![Some(dx)];
            if self.has_weight {
                out.push(Some(dw));
            }
            if self.has_bias {
                out.push(Some(db));
            }
            return Ok(out);
        }
        let refs: SmallVec<[&Tensor; 3]> = xs.iter().collect();
        self.vjp(&refs, &y, &g)
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let x = xs[0];
        let g = &g.cast(x.dtype())?;
        let w = self.has_weight.then(|| xs[1]);
        let mut out = InputGrads::new();
        // The differentiable formulation (also where the kernel does not apply).
        let (h, rstd) = self.normalized(x)?;
        let gh = match w {
            Some(w) => g.mul(w)?,
            None => g.clone(),
        };
        out.push(Some(self.project(&h, &rstd, &gh)?));
        if let Some(w) = w {
            out.push(Some(g.mul(&h)?.sum_to(w.shape())?));
        }
        if self.has_bias {
            out.push(Some(g.sum_to(xs[xs.len() - 1].shape())?));
        }
        Ok(out)
    }
    fn jvp<T: Diff>(&self, xs: &[&T], y: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        let x = xs[0];
        let w = self.has_weight.then(|| xs[1]);
        let (tw, tb) =
            (if self.has_weight { ts[1] } else { None }, if self.has_bias { ts[ts.len() - 1] } else { None });
        let (h, rstd) = self.normalized(x)?;
        let th = ts[0].map(|t| self.project(&h, &rstd, t)).transpose()?;
        let th = match (th, w) {
            (Some(t), Some(w)) => Some(t.mul(w)?),
            (t, _) => t,
        };
        let tw = tw.map(|t| h.mul(t)).transpose()?;
        let tb = tb.map(|t| t.broadcast_to(y.shape())).transpose()?;
        let t = add_opt(add_opt(th, tw)?, tb)?;
        // The tangent of the rounding to `out` is the tangent rounded.
        t.map(|t| t.cast(y.dtype())).transpose()
    }
}
