//! The elementwise functions of one tensor (`ops/unary.rs`) as methods of
//! every [`Diff`] value.

use crate::ops::op::Diff;
use crate::ops::unary::{TanhBackward, Unary};
use crate::{Error, Result};

/// Elementwise functions, on tensors and graph handles alike.
pub trait UnaryOps: Diff {
    /// -x
    fn neg(&self) -> Result<Self> {
        Self::apply(Unary::Neg, &[self])
    }
    /// |x|
    fn abs(&self) -> Result<Self> {
        Self::apply(Unary::Abs, &[self])
    }
    /// e^x
    fn exp(&self) -> Result<Self> {
        Self::apply(Unary::Exp, &[self])
    }
    /// Natural log.
    fn log(&self) -> Result<Self> {
        Self::apply(Unary::Log, &[self])
    }
    /// Square root.
    fn sqrt(&self) -> Result<Self> {
        Self::apply(Unary::Sqrt, &[self])
    }
    /// 1 / sqrt(x).
    fn rsqrt(&self) -> Result<Self> {
        Self::apply(Unary::Rsqrt, &[self])
    }
    /// Hyperbolic tangent.
    fn tanh(&self) -> Result<Self> {
        Self::apply(Unary::Tanh, &[self])
    }
    /// `g * (1 - self^2)`: for `self = tanh(x)`, the gradient (or tangent)
    /// `g` of `self` carried back to `x`, as one [`TanhBackward`] op.
    fn tanh_backward(&self, g: &Self) -> Result<Self> {
        Self::apply(TanhBackward, &[self, g])
    }
    /// Logistic sigmoid.
    fn sigmoid(&self) -> Result<Self> {
        Self::apply(Unary::Sigmoid, &[self])
    }
    /// max(x, 0).
    fn relu(&self) -> Result<Self> {
        Self::apply(Unary::Relu, &[self])
    }
    /// GELU, exact (erf) form, as torch's default.
    fn gelu(&self) -> Result<Self> {
        Self::apply(Unary::GeluErf, &[self])
    }
    /// GELU, tanh approximation (torch's approximate="tanh").
    fn gelu_tanh(&self) -> Result<Self> {
        Self::apply(Unary::GeluTanh, &[self])
    }
    /// Sine.
    fn sin(&self) -> Result<Self> {
        Self::apply(Unary::Sin, &[self])
    }
    /// Cosine.
    fn cos(&self) -> Result<Self> {
        Self::apply(Unary::Cos, &[self])
    }
    /// x^2.
    fn square(&self) -> Result<Self> {
        Self::apply(Unary::Square, &[self])
    }
    /// x^p for a scalar p.
    fn powf(&self, p: f64) -> Result<Self> {
        Self::apply(Unary::Powf(p), &[self])
    }
    /// 1 / x.
    fn recip(&self) -> Result<Self> {
        Self::apply(Unary::Recip, &[self])
    }
    /// x + c.
    fn add_scalar(&self, c: f64) -> Result<Self> {
        Self::apply(Unary::AddScalar(c), &[self])
    }
    /// x - c.
    fn sub_scalar(&self, c: f64) -> Result<Self> {
        Self::apply(Unary::AddScalar(-c), &[self])
    }
    /// x * c.
    fn mul_scalar(&self, c: f64) -> Result<Self> {
        Self::apply(Unary::MulScalar(c), &[self])
    }
    /// x / c.
    fn div_scalar(&self, c: f64) -> Result<Self> {
        Self::apply(Unary::MulScalar(1.0 / c), &[self])
    }
    /// Clamps into `[lo, hi]`; the gradient is 1 inside and 0 outside.
    fn clamp(&self, lo: f64, hi: f64) -> Result<Self> {
        if lo > hi || lo.is_nan() || hi.is_nan() {
            return Err(Error::invalid_arg("clamp", format!("min {lo} is not <= max {hi}")));
        }
        Self::apply(Unary::Clamp(lo, hi), &[self])
    }
    /// The error function.
    fn erf(&self) -> Result<Self> {
        Self::apply(Unary::Erf, &[self])
    }
    /// ln(1 + e^x) (torch.nn.functional.softplus), computed without
    /// overflow for large x and without losing small values for very
    /// negative x; its derivative is sigmoid(x).
    fn softplus(&self) -> Result<Self> {
        Self::apply(Unary::Softplus, &[self])
    }
    /// -1, 0 or 1 (zero gradient).
    fn sign(&self) -> Result<Self> {
        Self::apply(Unary::Sign, &[self])
    }
    /// ln(1 + x) (torch.log1p), accurate where x is small.
    fn log1p(&self) -> Result<Self> {
        Self::apply(Unary::Log1p, &[self])
    }
    /// e^x - 1 (torch.expm1), accurate where x is small.
    fn expm1(&self) -> Result<Self> {
        Self::apply(Unary::Expm1, &[self])
    }
}

impl<T: Diff> UnaryOps for T {}
