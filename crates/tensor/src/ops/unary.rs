//! Elementwise functions of one tensor, and their derivatives.
//!
//! Each function is a variant of [`Unary`] (listed once more in
//! [`Unary::ALL`]), a name, and one line of derivative `dy/dx` written in
//! differentiable ops; the VJP is `g * dy/dx` and the JVP `t * dy/dx`, so
//! both modes share the line. The op checks its operand once, for every
//! device, and hands the device's [`UnaryKernels`](crate::backend::UnaryKernels) the function and the
//! operand: its CPU kernel is one closure in `cpu/unary.rs`, its CUDA
//! kernel one line of `kernels/elementwise.cu` (named by
//! [`Unary::cuda_kernel`]).

use smallvec::SmallVec;

pub use crate::backend::unary::Unary;
use crate::backend::unary::{FRAC_1_SQRT_2PI, GELU_C, SQRT_2_OVER_PI};
use crate::backend::Backend;
use crate::ops::{backend_for, check_pair, one, Arity, Diff, InputGrads, Op, Saved};
use crate::{Error, Result, Tensor};

use super::binary::BinaryOps;
use super::reduce::ReduceOps;
use super::shape::ShapeOps;

/// The derivative of a unary function, as a factor.
enum Deriv<T> {
    One,
    Const(f64),
    Tensor(T),
}

impl Unary {
    /// dy/dx in differentiable ops, given x and y = f(x).
    fn deriv<T: Diff>(self, x: &T, y: &T) -> Result<Deriv<T>> {
        use Deriv::*;
        Ok(match self {
            Unary::Neg => Const(-1.0),
            Unary::Abs => Tensor(x.sign()?),
            Unary::Exp => Tensor(y.clone()),
            Unary::Log => Tensor(x.recip()?),
            Unary::Sqrt => Tensor(y.recip()?.mul_scalar(0.5)?),
            Unary::Rsqrt => Tensor(y.powf(3.0)?.mul_scalar(-0.5)?),
            Unary::Tanh => Tensor(y.square()?.neg()?.add_scalar(1.0)?),
            Unary::Sigmoid => Tensor(y.mul(&y.neg()?.add_scalar(1.0)?)?),
            Unary::Relu => Tensor(y.gt_scalar(0.0)?), // y > 0 exactly where x > 0
            Unary::GeluTanh => {
                // d/dx 0.5 x (1 + tanh u), u = k (x + c x^3)
                let x2 = x.square()?;
                let u = x.mul(&x2.mul_scalar(GELU_C)?.add_scalar(1.0)?)?.mul_scalar(SQRT_2_OVER_PI)?;
                let t = u.tanh()?;
                let du = x2.mul_scalar(3.0 * GELU_C * SQRT_2_OVER_PI)?.add_scalar(SQRT_2_OVER_PI)?;
                let sech2 = t.square()?.neg()?.add_scalar(1.0)?;
                let a = t.add_scalar(1.0)?.mul_scalar(0.5)?;
                Tensor(a.add(&x.mul(&sech2)?.mul(&du)?.mul_scalar(0.5)?)?)
            }
            Unary::GeluErf => {
                // Phi(x) + x phi(x)
                let cdf = x.mul_scalar(std::f64::consts::FRAC_1_SQRT_2)?.erf()?.add_scalar(1.0)?.mul_scalar(0.5)?;
                let pdf = x.square()?.mul_scalar(-0.5)?.exp()?.mul_scalar(FRAC_1_SQRT_2PI)?;
                Tensor(cdf.add(&x.mul(&pdf)?)?)
            }
            Unary::Sin => Tensor(x.cos()?),
            Unary::Cos => Tensor(x.sin()?.neg()?),
            Unary::Square => Tensor(x.mul_scalar(2.0)?),
            Unary::Powf(p) => Tensor(x.powf(p - 1.0)?.mul_scalar(p)?),
            Unary::Recip => Tensor(y.square()?.neg()?),
            Unary::AddScalar(_) => One,
            Unary::MulScalar(c) => Const(c),
            Unary::Clamp(lo, hi) => Tensor(x.ge_scalar(lo)?.mul(&x.le_scalar(hi)?)?),
            Unary::Erf => Tensor(x.square()?.neg()?.exp()?.mul_scalar(std::f64::consts::FRAC_2_SQRT_PI)?),
            Unary::Sign => Const(0.0),
            Unary::Softplus => Tensor(x.sigmoid()?),
            Unary::Log1p => Tensor(x.add_scalar(1.0)?.recip()?),
            Unary::Expm1 => Tensor(y.add_scalar(1.0)?),
        })
    }
}

impl Op for Unary {
    fn name(&self) -> &'static str {
        Unary::name(*self)
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }

    fn saves(&self) -> Saved {
        match self {
            Unary::Neg | Unary::AddScalar(_) | Unary::MulScalar(_) | Unary::Sign => Saved::NOTHING,
            Unary::Exp
            | Unary::Sqrt
            | Unary::Rsqrt
            | Unary::Tanh
            | Unary::Sigmoid
            | Unary::Relu
            | Unary::Recip
            | Unary::Expm1 => Saved::OUTPUT,
            Unary::Abs
            | Unary::Log
            | Unary::GeluTanh
            | Unary::GeluErf
            | Unary::Sin
            | Unary::Cos
            | Unary::Square
            | Unary::Powf(_)
            | Unary::Clamp(..)
            | Unary::Erf
            | Unary::Softplus
            | Unary::Log1p => Saved::input(0),
        }
    }

    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0];
        let dtype = x.dtype();
        if dtype.is_int() && !Unary::INT_KERNELS.contains(self) {
            return Err(Error::UnsupportedDType { op: self.name(), dtype, expected: "a float dtype" });
        }
        Ok(Tensor::from_storage(backend.unary(*self, x.src())?, x.shape().clone()))
    }

    /// `g * dy/dx` in one pass for the activations whose derivative line
    /// takes several passes and as many temporaries (a training step's
    /// backward): relu, tanh, sigmoid, both GELUs, where the device has
    /// the pass and `g` matches `x` in shape, dtype and device.
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, y: Tensor, g: Tensor) -> Result<InputGrads<Tensor>> {
        let x = &xs[0];
        let device = x.device();
        let fits = x.shape() == g.shape() && x.dtype() == g.dtype() && [&y, &g].iter().all(|t| t.device() == device);
        if fits {
            if let Some(d) = backend_for(device).unary_grad(*self, x.src(), y.src(), g.src())? {
                return Ok(one(Tensor::from_storage(d, x.shape().clone())));
            }
        }
        self.vjp(&[x], &y, &g)
    }

    fn vjp<T: Diff>(&self, xs: &[&T], y: &T, g: &T) -> Result<InputGrads<T>> {
        if xs[0].dtype().is_int() {
            // neg and abs run on integers; integers carry no gradient.
            return Ok(smallvec::smallvec![None]);
        }
        if *self == Unary::Tanh {
            // One recorded node instead of the four of `deriv`'s line.
            return Ok(one(y.tanh_backward(g)?));
        }
        Ok(one(match self.deriv(xs[0], y)? {
            Deriv::One => g.clone(),
            Deriv::Const(c) => g.mul_scalar(c)?,
            Deriv::Tensor(d) => g.mul(&d)?,
        }))
    }

    fn jvp<T: Diff>(&self, xs: &[&T], y: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        let Some(t) = ts[0] else { return Ok(None) };
        if xs[0].dtype().is_int() {
            return Ok(None);
        }
        if *self == Unary::Tanh {
            return Ok(Some(y.tanh_backward(t)?));
        }
        Ok(Some(match self.deriv(xs[0], y)? {
            Deriv::One => t.clone(),
            Deriv::Const(c) => t.mul_scalar(c)?,
            Deriv::Tensor(d) => t.mul(&d)?,
        }))
    }

    fn is_differentiable(&self) -> bool {
        !matches!(self, Unary::Sign)
    }
}

/// `g * (1 - y^2)`: tanh's derivative, given its output `y = tanh x`,
/// applied to a gradient or tangent `g` (inputs `y`, `g`, broadcasting).
///
/// As one op this is one pass and one recorded node where the composed line
/// (`square`, `neg`, `add_scalar`, `mul`) is four of each: tanh's VJP and
/// JVP use it, so a gradient recorded under `create_graph` (a Hessian-vector
/// product, a PDE residual's second derivative) holds one node per tanh.
/// Its own rules are written in differentiable ops (itself among them), so
/// any order works:
///
/// - `d/dg`: `gbar * (1 - y^2)`, this op again;
/// - `d/dy`: `-2 y g gbar`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TanhBackward;

impl Op for TanhBackward {
    fn name(&self) -> &'static str {
        "tanh_backward"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(2)
    }

    fn saves(&self) -> Saved {
        Saved::INPUTS
    }

    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let shape = check_pair("tanh_backward", xs[0], xs[1])?;
        let dtype = xs[0].dtype();
        if dtype.is_int() {
            return Err(Error::UnsupportedDType { op: "tanh_backward", dtype, expected: "a float dtype" });
        }
        Ok(Tensor::from_storage(backend.tanh_backward(xs[0].src(), xs[1].src(), &shape)?, shape))
    }

    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, _: Tensor, gbar: Tensor) -> Result<InputGrads<Tensor>> {
        self.rule(&xs[0], &xs[1], &gbar, &tanh_second)
    }

    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, gbar: &T) -> Result<InputGrads<T>> {
        self.rule(xs[0], xs[1], gbar, &|_, _, _, _| Ok(None))
    }

    fn jvp_eager(&self, xs: &[&Tensor], out: &Tensor, ts: &[Option<&Tensor>]) -> Result<Option<Tensor>> {
        self.tangent(xs, out, ts, &tanh_second)
    }

    fn jvp<T: Diff>(&self, xs: &[&T], out: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        self.tangent(xs, out, ts, &|_, _, _, _| Ok(None))
    }
}

/// `-2 y g s + tg (1 - y^2)` in one pass when a kernel has it (`None`: compose it).
type Second<'a, T> = &'a dyn Fn(&T, &T, &T, Option<&T>) -> Result<Option<T>>;

/// The device's one-pass [`Second`] on plain tensors, when every operand
/// is a contiguous tensor of `y`'s dtype, shape and device.
fn tanh_second(y: &Tensor, g: &Tensor, s: &Tensor, tg: Option<&Tensor>) -> Result<Option<Tensor>> {
    let device = y.device();
    let same = [g, s]
        .into_iter()
        .chain(tg)
        .chain([y])
        .all(|t| t.device() == device && t.dtype() == y.dtype() && t.shape() == y.shape() && t.is_contiguous());
    if !same {
        return Ok(None);
    }
    let out = backend_for(device).tanh_second(y.src(), g.src(), s.src(), tg.map(Tensor::src))?;
    Ok(out.map(|d| Tensor::from_storage(d, y.shape().clone())))
}

impl TanhBackward {
    /// The reverse rule; `fused` may compute `-2 y g gbar` in one pass.
    fn rule<T: Diff>(self, y: &T, g: &T, gbar: &T, fused: Second<'_, T>) -> Result<InputGrads<T>> {
        let gg = y.tanh_backward(gbar)?.sum_to(g.shape())?;
        let gy = match fused(y, g, gbar, None)? {
            Some(d) => d,
            None => y.mul(g)?.mul(gbar)?.mul_scalar(-2.0)?,
        };
        Ok(smallvec::smallvec![Some(gy.sum_to(y.shape())?), Some(gg)])
    }

    /// The forward rule; `fused` may compute `-2 y g ty + tg (1 - y^2)` in
    /// one pass.
    fn tangent<T: Diff>(self, xs: &[&T], out: &T, ts: &[Option<&T>], fused: Second<'_, T>) -> Result<Option<T>> {
        let (y, g) = (xs[0], xs[1]);
        let t = match (ts[0], ts[1]) {
            (None, None) => return Ok(None),
            (None, Some(tg)) => y.tanh_backward(tg)?,
            (Some(ty), tg) => match fused(y, g, ty, tg)? {
                Some(d) => d,
                None => {
                    let dy = y.mul(g)?.mul(ty)?.mul_scalar(-2.0)?;
                    match tg {
                        Some(tg) => y.tanh_backward(tg)?.add(&dy)?,
                        None => dy,
                    }
                }
            },
        };
        let shape = out.shape();
        Ok(Some(if t.shape() == shape { t } else { t.broadcast_to(shape)? }))
    }
}

/// This family's ops, each once (see [`crate::ops::registry`]).
pub(crate) fn family() -> Vec<Box<dyn super::DynOp>> {
    let mut ops: Vec<Box<dyn super::DynOp>> =
        Unary::ALL.iter().map(|&u| Box::new(u) as Box<dyn super::DynOp>).collect();
    ops.push(Box::new(TanhBackward));
    ops
}

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

#[cfg(test)]
mod tests {
    use super::Unary;

    /// `ALL` is made from the same declaration as the enum, so it lists
    /// every variant; what is left to check is that no two share a name
    /// (the name is the CUDA kernel's and the gradient-check case's).
    #[test]
    fn every_function_has_its_own_name() {
        let mut names: Vec<&str> = Unary::ALL.iter().map(|u| u.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Unary::ALL.len(), "every function has its own name");
    }
}
