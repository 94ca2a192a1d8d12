//! The CPU kernels of the elementwise functions of one tensor
//! ([`crate::ops::unary`]): one closure per function, run by the strided
//! loop nest of [`super::iter`], and the fused derivative passes the eager
//! rules use.

use super::float_map;
use super::iter::{map1, map2, nd2};
use crate::ops::unary::{Unary, FRAC_1_SQRT_2PI, GELU_C, SQRT_2_OVER_PI};
use crate::storage::CpuElement;
use crate::{with_float, DType, Device, Float, Result, Shape, Tensor};

/// `op` applied to every element of `x` (f16/bf16 through f32).
pub(crate) fn forward(op: Unary, x: &Tensor) -> Result<Tensor> {
    if x.dtype().is_int() && matches!(op, Unary::Neg | Unary::Abs) {
        return int_sign_op(op, x);
    }
    float_map(
        op.name(),
        x,
        |x| with_float!(x.dtype(), T => Tensor::from_vec(kernel::<T>(op, x)?, x.shape().clone()), _ => unreachable!()),
    )
}

/// `neg` and `abs` of an integer tensor, exact and in its dtype. They wrap
/// at the most negative value as torch's do (-(-2^31) is -2^31 in int32).
fn int_sign_op(op: Unary, x: &Tensor) -> Result<Tensor> {
    let nd = x.nd();
    let neg = op == Unary::Neg;
    match x.dtype() {
        DType::I32 => {
            let f = move |v: i32| if neg { v.wrapping_neg() } else { v.wrapping_abs() };
            Tensor::from_vec(map1(x.storage_slice::<i32>(), &nd, f)?, x.shape().clone())
        }
        _ => {
            let f = move |v: i64| if neg { v.wrapping_neg() } else { v.wrapping_abs() };
            Tensor::from_vec(map1(x.storage_slice::<i64>(), &nd, f)?, x.shape().clone())
        }
    }
}

fn kernel<T: Float + CpuElement>(op: Unary, x: &Tensor) -> Result<Vec<T>> {
    let src = x.storage_slice::<T>();
    let nd = x.nd();
    let c = |v: f64| T::from_f64(v);
    match op {
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
        // max(x, 0) + ln(1 + e^-|x|): no overflow, and e^x kept for x << 0.
        Unary::Softplus => map1(src, &nd, |v: T| v.max(T::ZERO) + (-v.abs()).exp().ln_1p()),
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

/// `g * dy/dx` in one pass, for the activations whose derivative line
/// would otherwise take several passes and as many temporaries (a
/// training step's backward; `Unary::vjp_eager`). `None` for the other
/// functions, and for operands the loop does not cover.
pub(crate) fn fused_grad(op: Unary, x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
    let on_cpu = [x, y, g].iter().all(|t| t.device() == Device::Cpu);
    if !on_cpu || x.shape() != g.shape() || x.dtype() != g.dtype() {
        return Ok(None);
    }
    let shape = x.shape().clone();
    with_float!(x.dtype(), T => {
        let c = |v: f64| <T as crate::Element>::from_f64(v);
        let (xs, ys, gs) = (x.storage_slice::<T>(), y.storage_slice::<T>(), g.storage_slice::<T>());
        let (nx, ny) = (nd2(x, g, &shape), nd2(y, g, &shape));
        let out: Result<Vec<T>> = match op {
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

/// `g * (1 - y^2)` over `y` and `g` broadcast to `shape`.
pub(crate) fn tanh_backward(y: &Tensor, g: &Tensor, shape: &Shape) -> Result<Tensor> {
    float_map("tanh_backward", y, |y| {
        let g = g.cast_raw(y.dtype())?;
        with_float!(y.dtype(), T => {
            let nd = nd2(y, &g, shape);
            let out = map2(y.storage_slice::<T>(), g.storage_slice::<T>(), &nd, |y: T, g: T| g * (T::ONE - y * y))?;
            Tensor::from_vec(out, shape.clone())
        }, _ => unreachable!())
    })
}

/// `-2 y g s + tg (1 - y^2)` (the last term only with `tg`) in one pass,
/// for `TanhBackward`'s eager rules when every operand is a contiguous CPU
/// f32/f64 tensor of one shape; `None` otherwise, and the rule composes it
/// from differentiable ops.
pub(crate) fn tanh_second(y: &Tensor, g: &Tensor, s: &Tensor, tg: Option<&Tensor>) -> Result<Option<Tensor>> {
    let (yv, gv, sv) = (y, g, s);
    let tv = tg;
    let all: Vec<&Tensor> = [yv, gv, sv].into_iter().chain(tv).collect();
    let same = all
        .iter()
        .all(|t| t.device() == Device::Cpu && t.dtype() == yv.dtype() && t.shape() == yv.shape() && t.is_contiguous());
    if !same {
        return Ok(None);
    }
    let shape = yv.shape().clone();
    with_float!(yv.dtype(), F => {
        fn sl<F: CpuElement>(t: &Tensor) -> &[F] {
            t.as_slice::<F>().expect("internal: contiguous of this dtype")
        }
        let (ys, gs, ss) = (sl::<F>(yv), sl::<F>(gv), sl::<F>(sv));
        let two = <F as crate::Element>::from_f64(2.0);
        let ts = tv.map(sl::<F>);
        let out: Vec<F> = super::iter::fill_vec(ys.len(), |start, out| {
            let end = start + out.len();
            let (ys, gs, ss) = (&ys[start..end], &gs[start..end], &ss[start..end]);
            super::simd::run(
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
        Tensor::from_vec(out, shape).map(Some)
    }, _ => Ok(None))
}
