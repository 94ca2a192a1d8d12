//! Normalisation over the last axis: LayerNorm and RMSNorm, composed from
//! differentiable ops (mean, sub, square, rsqrt, mul), so their derivatives
//! of every order come from those ops' rules with no rule of their own.

use tapir_autograd::Var;
use tapir_tensor::{BinaryOps, DType, ReduceOps, Result, Tensor, UnaryOps};

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
        let weight = Some(store.add_to_group(format!("{name}.weight"), "no_decay", Tensor::ones([dim], dtype))?);
        let bias = if bias {
            Some(store.add_to_group(format!("{name}.bias"), "no_decay", Tensor::zeros([dim], dtype))?)
        } else {
            None
        };
        Ok(LayerNorm { weight, bias, eps: 1e-5 })
    }

    /// Normalises `x` over its last axis.
    pub fn forward<'g>(&self, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
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
        let weight = Some(store.add_to_group(format!("{name}.weight"), "no_decay", Tensor::ones([dim], dtype))?);
        Ok(RmsNorm { weight, eps: 1e-6 })
    }

    /// Normalises `x` over its last axis.
    pub fn forward<'g>(&self, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
        let rms = x.square()?.mean(&[-1], true)?.add_scalar(self.eps)?.rsqrt()?;
        affine(p, x.mul(&rms)?, self.weight, None)
    }
}

fn affine<'g>(p: &Bound<'g>, y: Var<'g>, w: Option<ParamId>, b: Option<ParamId>) -> Result<Var<'g>> {
    let y = match w {
        Some(w) => y.mul(&p.var(w))?,
        None => y,
    };
    match b {
        Some(b) => y.add(&p.var(b)),
        None => Ok(y),
    }
}
