//! The derivatives of the elementwise functions of one tensor
//! (`ops/unary.rs`): for each, one line `dy/dx` written in differentiable
//! ops; the VJP is `g * dy/dx` and the JVP `t * dy/dx`, so both modes share
//! the line. The activations of a training step's backward have a fused
//! eager rule where the device has the pass.

use smallvec::SmallVec;

use crate::backend::unary::{FRAC_1_SQRT_2PI, GELU_C, SQRT_2_OVER_PI};
use crate::ops::methods::binary::BinaryOps;
use crate::ops::methods::reduce::ReduceOps;
use crate::ops::methods::shape::ShapeOps;
use crate::ops::methods::unary::UnaryOps;
use crate::ops::op::{one, wanted_pair, Derivative, Diff, InputGrads, Saved};
use crate::ops::unary::{TanhBackward, Unary};
use crate::tensor::backend_for;
use crate::{Result, Tensor};

impl Derivative for Unary {
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

impl Derivative for TanhBackward {
    fn saves(&self) -> Saved {
        Saved::INPUTS
    }
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, _: Tensor, gbar: Tensor) -> Result<InputGrads<Tensor>> {
        self.rule(&xs[0], &xs[1], &gbar, &tanh_second, [true, true])
    }
    /// Each input's gradient is its own pass (and `g`'s a reduction too
    /// when `g` was broadcast): a constant `g`, as the jet's `1 - y^2`
    /// (`tanh_backward(y, ones)`), costs neither.
    fn vjp_eager_wanted(
        &self,
        xs: SmallVec<[Tensor; 3]>,
        _: Tensor,
        gbar: Tensor,
        wanted: &[bool],
    ) -> Result<InputGrads<Tensor>> {
        self.rule(&xs[0], &xs[1], &gbar, &tanh_second, wanted_pair(wanted))
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, gbar: &T) -> Result<InputGrads<T>> {
        self.rule(xs[0], xs[1], gbar, &|_, _, _, _| Ok(None), [true, true])
    }
    fn jvp_eager(&self, xs: &[&Tensor], out: &Tensor, ts: &[Option<&Tensor>]) -> Result<Option<Tensor>> {
        self.tangent(xs, out, ts, &tanh_second)
    }
    fn jvp<T: Diff>(&self, xs: &[&T], out: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        self.tangent(xs, out, ts, &|_, _, _, _| Ok(None))
    }
}

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
    /// `want` says which of `y`'s and `g`'s gradients to compute (the
    /// other is `None`).
    fn rule<T: Diff>(self, y: &T, g: &T, gbar: &T, fused: Second<'_, T>, want: [bool; 2]) -> Result<InputGrads<T>> {
        let gg = if want[1] { Some(y.tanh_backward(gbar)?.sum_to(g.shape())?) } else { None };
        let gy = if want[0] {
            let d = match fused(y, g, gbar, None)? {
                Some(d) => d,
                None => y.mul(g)?.mul(gbar)?.mul_scalar(-2.0)?,
            };
            Some(d.sum_to(y.shape())?)
        } else {
            None
        };
        Ok(smallvec::smallvec![gy, gg])
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
