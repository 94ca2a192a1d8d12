//! Elementwise functions of one tensor, and their derivatives.
//!
//! Each function is one line of forward kernel and one line of derivative
//! `dy/dx`, written in differentiable ops; the VJP is `g * dy/dx` and the
//! JVP `t * dy/dx`, so both modes share the line.

use crate::cpu::iter::{map1, map2};
use crate::ops::{one, Arity, Diff, InputGrads, Op, Saved};
use crate::storage::CpuElement;
use crate::{with_float, DType, Error, Float, Result, Tensor};

use super::binary::{nd2, BinaryOps};
use super::reduce::ReduceOps;
use super::shape::ShapeOps;

/// Which elementwise function.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unary {
    /// -x
    Neg,
    /// |x|
    Abs,
    /// e^x
    Exp,
    /// ln x
    Log,
    /// sqrt x
    Sqrt,
    /// 1 / sqrt x
    Rsqrt,
    /// tanh x
    Tanh,
    /// 1 / (1 + e^-x)
    Sigmoid,
    /// max(x, 0)
    Relu,
    /// GELU, tanh approximation (torch's approximate="tanh")
    GeluTanh,
    /// GELU, exact erf form
    GeluErf,
    /// sin x
    Sin,
    /// cos x
    Cos,
    /// x^2
    Square,
    /// x^p
    Powf(f64),
    /// 1 / x
    Recip,
    /// x + c
    AddScalar(f64),
    /// x * c
    MulScalar(f64),
    /// min(max(x, lo), hi)
    Clamp(f64, f64),
    /// erf x
    Erf,
    /// sign x (no derivative)
    Sign,
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_C: f64 = 0.044_715;
const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// The derivative of a unary function, as a factor.
enum Deriv<T> {
    One,
    Const(f64),
    Tensor(T),
}

impl Unary {
    fn name(self) -> &'static str {
        match self {
            Unary::Neg => "neg",
            Unary::Abs => "abs",
            Unary::Exp => "exp",
            Unary::Log => "log",
            Unary::Sqrt => "sqrt",
            Unary::Rsqrt => "rsqrt",
            Unary::Tanh => "tanh",
            Unary::Sigmoid => "sigmoid",
            Unary::Relu => "relu",
            Unary::GeluTanh => "gelu_tanh",
            Unary::GeluErf => "gelu",
            Unary::Sin => "sin",
            Unary::Cos => "cos",
            Unary::Square => "square",
            Unary::Powf(_) => "powf",
            Unary::Recip => "recip",
            Unary::AddScalar(_) => "add_scalar",
            Unary::MulScalar(_) => "mul_scalar",
            Unary::Clamp(..) => "clamp",
            Unary::Erf => "erf",
            Unary::Sign => "sign",
        }
    }

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
        })
    }

    fn kernel<T: Float + CpuElement>(self, x: &Tensor) -> Result<Vec<T>> {
        let src = x.storage_slice::<T>();
        let nd = x.nd();
        let c = |v: f64| T::from_f64(v);
        match self {
            Unary::Neg => map1(src, &nd, |v: T| -v),
            Unary::Abs => map1(src, &nd, |v: T| v.abs()),
            Unary::Exp => map1(src, &nd, |v: T| v.exp()),
            Unary::Log => map1(src, &nd, |v: T| v.ln()),
            Unary::Sqrt => map1(src, &nd, |v: T| v.sqrt()),
            Unary::Rsqrt => map1(src, &nd, |v: T| T::ONE / v.sqrt()),
            Unary::Tanh => map1(src, &nd, |v: T| v.tanh()),
            Unary::Sigmoid => map1(src, &nd, |v: T| T::ONE / (T::ONE + (-v).exp())),
            // `v < 0`, not `v > 0`, so NaN passes through as in torch.
            Unary::Relu => map1(src, &nd, |v: T| if v < T::ZERO { T::ZERO } else { v }),
            Unary::GeluTanh => {
                let (k, gc, half) = (c(SQRT_2_OVER_PI), c(GELU_C), c(0.5));
                map1(src, &nd, move |v: T| half * v * (T::ONE + (k * (v + gc * v * v * v)).tanh()))
            }
            Unary::GeluErf => {
                let (r, half) = (c(std::f64::consts::FRAC_1_SQRT_2), c(0.5));
                map1(src, &nd, move |v: T| half * v * (T::ONE + (v * r).erf()))
            }
            Unary::Sin => map1(src, &nd, |v: T| v.sin()),
            Unary::Cos => map1(src, &nd, |v: T| v.cos()),
            Unary::Square => map1(src, &nd, |v: T| v * v),
            Unary::Powf(p) => {
                let p = c(p);
                map1(src, &nd, move |v: T| v.powf(p))
            }
            Unary::Recip => map1(src, &nd, |v: T| T::ONE / v),
            Unary::AddScalar(s) => {
                let s = c(s);
                map1(src, &nd, move |v: T| v + s)
            }
            Unary::MulScalar(s) => {
                let s = c(s);
                map1(src, &nd, move |v: T| v * s)
            }
            Unary::Clamp(lo, hi) => {
                let (lo, hi) = (c(lo), c(hi));
                map1(src, &nd, move |v: T| {
                    if v < lo {
                        lo
                    } else if v > hi {
                        hi
                    } else {
                        v
                    }
                })
            }
            Unary::Erf => map1(src, &nd, |v: T| v.erf()),
            Unary::Sign => map1(src, &nd, |v: T| {
                if v > T::ZERO {
                    T::ONE
                } else if v < T::ZERO {
                    -T::ONE
                } else {
                    v
                }
            }),
        }
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
            Unary::Exp | Unary::Sqrt | Unary::Rsqrt | Unary::Tanh | Unary::Sigmoid | Unary::Relu | Unary::Recip => {
                Saved::OUTPUT
            }
            Unary::Abs
            | Unary::Log
            | Unary::GeluTanh
            | Unary::GeluErf
            | Unary::Sin
            | Unary::Cos
            | Unary::Square
            | Unary::Powf(_)
            | Unary::Clamp(..)
            | Unary::Erf => Saved::input(0),
        }
    }

    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        float_map(
            self.name(),
            xs[0],
            |x| with_float!(x.dtype(), T => Tensor::from_vec(self.kernel::<T>(x)?, x.shape().clone()), _ => unreachable!()),
        )
    }

    fn vjp<T: Diff>(&self, xs: &[&T], y: &T, g: &T) -> Result<InputGrads<T>> {
        if !g.is_recording() {
            if let Some(d) = self.eager_vjp(&xs[0].eval()?, &y.eval()?, &g.eval()?)? {
                return Ok(one(g.lift(d)));
            }
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

impl Unary {
    /// `g * dy/dx` in one pass, for the activations whose derivative line
    /// would otherwise take several passes and as many temporaries (a
    /// training step's backward). Only when nothing is recorded: under
    /// `create_graph` the differentiable line in `deriv` is used. `None`
    /// for the other functions, and for operands the loop does not cover.
    fn eager_vjp(self, x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let on_cpu = [x, y, g].iter().all(|t| t.device() == crate::Device::Cpu);
        if !on_cpu || x.shape() != g.shape() || x.dtype() != g.dtype() {
            return Ok(None);
        }
        let shape = x.shape().clone();
        with_float!(x.dtype(), T => {
            let c = |v: f64| <T as crate::Element>::from_f64(v);
            let (xs, ys, gs) = (x.storage_slice::<T>(), y.storage_slice::<T>(), g.storage_slice::<T>());
            let (nx, ny) = (nd2(x, g, &shape), nd2(y, g, &shape));
            let out: Result<Vec<T>> = match self {
                Unary::Relu => map2(ys, gs, &ny, |y: T, g: T| if y > T::ZERO { g } else { T::ZERO }),
                Unary::Tanh => map2(ys, gs, &ny, |y: T, g: T| g * (T::ONE - y * y)),
                Unary::Sigmoid => map2(ys, gs, &ny, |y: T, g: T| g * y * (T::ONE - y)),
                Unary::GeluTanh => {
                    let (k, gc, k3, half) = (c(SQRT_2_OVER_PI), c(GELU_C), c(3.0 * GELU_C * SQRT_2_OVER_PI), c(0.5));
                    map2(xs, gs, &nx, move |x: T, g: T| {
                        let x2 = x * x;
                        let t = Float::tanh(k * x * (T::ONE + gc * x2));
                        g * (half * (T::ONE + t) + half * x * (T::ONE - t * t) * (k + k3 * x2))
                    })
                }
                Unary::GeluErf => {
                    let (r, half, p) = (c(std::f64::consts::FRAC_1_SQRT_2), c(0.5), c(FRAC_1_SQRT_2PI));
                    map2(xs, gs, &nx, move |x: T, g: T| {
                        g * (half * (T::ONE + Float::erf(x * r)) + x * p * Float::exp(-half * x * x))
                    })
                }
                _ => return Ok(None),
            };
            Tensor::from_vec(out?, shape).map(Some)
        }, _ => Ok(None))
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

    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let shape = super::binary::check_pair("tanh_backward", xs[0], xs[1])?;
        float_map("tanh_backward", xs[0], |y| {
            let g = xs[1].cast_raw(y.dtype())?;
            with_float!(y.dtype(), T => {
                let nd = nd2(y, &g, &shape);
                let out = map2(y.storage_slice::<T>(), g.storage_slice::<T>(), &nd, |y: T, g: T| g * (T::ONE - y * y))?;
                Tensor::from_vec(out, shape.clone())
            }, _ => unreachable!())
        })
    }

    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, gbar: &T) -> Result<InputGrads<T>> {
        let (y, g) = (xs[0], xs[1]);
        let gg = y.tanh_backward(gbar)?.sum_to(g.shape())?;
        let gy = match fused_tanh_second(y, g, gbar, None)? {
            Some(d) => d,
            None => y.mul(g)?.mul(gbar)?.mul_scalar(-2.0)?,
        };
        Ok(smallvec::smallvec![Some(gy.sum_to(y.shape())?), Some(gg)])
    }

    fn jvp<T: Diff>(&self, xs: &[&T], out: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        let (y, g) = (xs[0], xs[1]);
        let t = match (ts[0], ts[1]) {
            (None, None) => return Ok(None),
            (None, Some(tg)) => y.tanh_backward(tg)?,
            (Some(ty), tg) => match fused_tanh_second(y, g, ty, tg)? {
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

/// `-2 y g s + tg (1 - y^2)` (the last term only with `tg`) in one pass,
/// for [`TanhBackward`]'s rules when nothing is recorded and every operand
/// is a contiguous CPU f32/f64 tensor of one shape; `None` otherwise, and
/// the rule composes it from differentiable ops.
fn fused_tanh_second<T: Diff>(y: &T, g: &T, s: &T, tg: Option<&T>) -> Result<Option<T>> {
    if y.is_recording() {
        return Ok(None);
    }
    let (yv, gv, sv) = (y.eval()?, g.eval()?, s.eval()?);
    let tv = tg.map(|t| t.eval()).transpose()?;
    let all: Vec<&Tensor> = [&yv, &gv, &sv].into_iter().chain(tv.as_ref()).collect();
    let same = all.iter().all(|t| {
        t.device() == crate::Device::Cpu && t.dtype() == yv.dtype() && t.shape() == yv.shape() && t.is_contiguous()
    });
    if !same {
        return Ok(None);
    }
    let shape = yv.shape().clone();
    with_float!(yv.dtype(), F => {
        fn sl<F: CpuElement>(t: &Tensor) -> &[F] {
            t.as_slice::<F>().expect("internal: contiguous of this dtype")
        }
        let (ys, gs, ss) = (sl::<F>(&yv), sl::<F>(&gv), sl::<F>(&sv));
        let two = <F as crate::Element>::from_f64(2.0);
        let ts = tv.as_ref().map(sl::<F>);
        let out: Vec<F> = crate::cpu::iter::fill_vec(ys.len(), |start, out| {
            let end = start + out.len();
            let (ys, gs, ss) = (&ys[start..end], &gs[start..end], &ss[start..end]);
            crate::cpu::simd::run(
                #[inline(always)]
                || match ts {
                    Some(ts) => {
                        let ts = &ts[start..end];
                        for (i, o) in out.iter_mut().enumerate() {
                            o.write(ts[i] * (F::ONE - ys[i] * ys[i]) - two * ys[i] * gs[i] * ss[i]);
                        }
                    }
                    None => {
                        for (i, o) in out.iter_mut().enumerate() {
                            o.write(-two * ys[i] * gs[i] * ss[i]);
                        }
                    }
                },
            )
        })?;
        Tensor::from_vec(out, shape).map(|t| Some(y.lift(t)))
    }, _ => Ok(None))
}

/// Runs a float kernel on `x`: f32 and f64 directly, f16 and bf16 through
/// f32 (the result is cast back), integers rejected.
pub(crate) fn float_map(op: &'static str, x: &Tensor, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    match x.dtype() {
        DType::F32 | DType::F64 => f(x),
        DType::F16 | DType::BF16 => f(&x.cast_raw(DType::F32)?)?.cast_raw(x.dtype()),
        dtype => Err(Error::UnsupportedDType { op, dtype, expected: "a float dtype" }),
    }
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
    /// -1, 0 or 1 (zero gradient).
    fn sign(&self) -> Result<Self> {
        Self::apply(Unary::Sign, &[self])
    }
}

impl<T: Diff> UnaryOps for T {}

/// The error function to about 1e-14, by its Maclaurin series near zero and
/// its asymptotic expansion in the tails.
pub(crate) fn erf(x: f64) -> f64 {
    let a = x.abs();
    if a.is_nan() {
        return f64::NAN;
    }
    let r = if a < 4.0 {
        // erf x = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))
        let x2 = a * a;
        let (mut term, mut sum, mut n) = (a, a, 0.0);
        loop {
            n += 1.0;
            term *= -x2 / n;
            let add = term / (2.0 * n + 1.0);
            sum += add;
            // `<=` so that x = 0 (every term zero) terminates too.
            if add.abs() <= 1e-17 * sum.abs() {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if a < 6.0 {
        // erfc x ~ e^(-x^2) / (x sqrt(pi)) * sum (-1)^n (2n-1)!! / (2x^2)^n
        let x2 = a * a;
        let (mut term, mut sum) = (1.0, 1.0);
        for n in 1..12 {
            term *= -((2 * n - 1) as f64) / (2.0 * x2);
            sum += term;
        }
        1.0 - (-x2).exp() / (a * std::f64::consts::PI.sqrt()) * sum
    } else {
        1.0
    };
    r.copysign(x)
}
