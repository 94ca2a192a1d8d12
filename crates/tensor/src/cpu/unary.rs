//! The CPU kernels of the elementwise functions of one tensor
//! ([`crate::ops::unary`]): one closure per function, run by the strided
//! loop nest of [`super::iter`], and the fused derivative passes the eager
//! rules use.

use super::iter::{map1, map2, nd1, nd2};
use super::{float_src, host, CpuBackend};
use crate::backend::unary::{Unary, UnaryKernels, FRAC_1_SQRT_2PI, GELU_C, SQRT_2_OVER_PI};
use crate::backend::Src;
use crate::storage::{CpuBuffer, CpuElement, Storage};
use half::{bf16, f16};

use crate::{with_float, DType, Float, Result, Shape};

impl UnaryKernels for CpuBackend {
    /// f16/bf16 through f32; neg and abs of integers exact in their dtype.
    fn unary(&self, f: Unary, x: Src<'_>) -> Result<Storage> {
        if x.dtype().is_int() && matches!(f, Unary::Neg | Unary::Abs) {
            return int_sign_op(f, x);
        }
        float_src(
            f.name(),
            x,
            |x| with_float!(x.dtype(), T => Ok(Storage::cpu(T::wrap(kernel::<T>(f, x)?))), _ => unreachable!()),
        )
    }

    fn tanh_backward(&self, y: Src<'_>, g: Src<'_>, shape: &Shape) -> Result<Storage> {
        tanh_backward(y, g, shape)
    }

    fn unary_grad(&self, f: Unary, x: Src<'_>, y: Src<'_>, g: Src<'_>) -> Result<Option<Storage>> {
        fused_grad(f, x, y, g)
    }

    fn tanh_second(&self, y: Src<'_>, g: Src<'_>, s: Src<'_>, tg: Option<Src<'_>>) -> Result<Option<Storage>> {
        tanh_second(y, g, s, tg)
    }
}

/// `neg` and `abs` of an integer tensor, exact and in its dtype. They wrap
/// at the most negative value as torch's do (-(-2^31) is -2^31 in int32).
fn int_sign_op(op: Unary, x: Src<'_>) -> Result<Storage> {
    let nd = nd1(x.layout);
    let neg = op == Unary::Neg;
    Ok(Storage::cpu(match x.dtype() {
        DType::I32 => {
            let f = move |v: i32| if neg { v.wrapping_neg() } else { v.wrapping_abs() };
            CpuBuffer::I32(map1(host::<i32>(x), &nd, f)?)
        }
        _ => {
            let f = move |v: i64| if neg { v.wrapping_neg() } else { v.wrapping_abs() };
            CpuBuffer::I64(map1(host::<i64>(x), &nd, f)?)
        }
    }))
}

fn kernel<T: Float + CpuElement>(op: Unary, x: Src<'_>) -> Result<Vec<T>> {
    let src = host::<T>(x);
    let nd = nd1(x.layout);
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
        Unary::Log1p => map1(src, &nd, |v: T| v.ln_1p()),
        Unary::Expm1 => map1(src, &nd, |v: T| v.exp_m1()),
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
/// training step's backward; `Unary::vjp_eager`, which has checked that
/// `x` and `g` share their shape and dtype). f16 and bf16 are computed in
/// f32 element by element and rounded once: their composed line kept
/// about eight low-precision temporaries of the activation's size alive
/// at once, which set a bf16 training step's peak (a GELU over a
/// transformer's MLP) above the f32 step's. `None` for the other
/// functions and dtypes.
fn fused_grad(op: Unary, x: Src<'_>, y: Src<'_>, g: Src<'_>) -> Result<Option<Storage>> {
    match x.dtype() {
        DType::F32 => Ok(grad_line::<f32, f32>(op, x, y, g, |v| v, |v| v)?.map(|v| Storage::cpu(CpuBuffer::F32(v)))),
        DType::F64 => Ok(grad_line::<f64, f64>(op, x, y, g, |v| v, |v| v)?.map(|v| Storage::cpu(CpuBuffer::F64(v)))),
        DType::BF16 => Ok(grad_line::<bf16, f32>(op, x, y, g, bf16::to_f32, bf16::from_f32)?
            .map(|v| Storage::cpu(CpuBuffer::BF16(v)))),
        DType::F16 => {
            Ok(grad_line::<f16, f32>(op, x, y, g, f16::to_f32, f16::from_f32)?.map(|v| Storage::cpu(CpuBuffer::F16(v))))
        }
        _ => Ok(None),
    }
}

/// [`fused_grad`]'s loop over elements stored as `S`, computed in `T`
/// (`up` and `down` convert); `None` for functions without a one-pass line.
fn grad_line<S, T>(
    op: Unary,
    x: Src<'_>,
    y: Src<'_>,
    g: Src<'_>,
    up: fn(S) -> T,
    down: fn(T) -> S,
) -> Result<Option<Vec<S>>>
where
    S: CpuElement + Copy + Send + Sync,
    T: Float,
{
    let shape = x.shape();
    let c = |v: f64| <T as crate::Element>::from_f64(v);
    let (xs, ys, gs) = (host::<S>(x), host::<S>(y), host::<S>(g));
    let (nx, ny) = (nd2(x.layout, g.layout, shape), nd2(y.layout, g.layout, shape));
    let out = match op {
        Unary::Relu => map2(ys, gs, &ny, move |y: S, g: S| down(if up(y) > T::ZERO { up(g) } else { T::ZERO })),
        Unary::Tanh => map2(ys, gs, &ny, move |y: S, g: S| {
            let (y, g) = (up(y), up(g));
            down(g * (T::ONE - y * y))
        }),
        Unary::Sigmoid => map2(ys, gs, &ny, move |y: S, g: S| {
            let (y, g) = (up(y), up(g));
            down(g * y * (T::ONE - y))
        }),
        Unary::GeluTanh => {
            let (k, gc, k3, half) = (c(SQRT_2_OVER_PI), c(GELU_C), c(3.0 * GELU_C * SQRT_2_OVER_PI), c(0.5));
            map2(xs, gs, &nx, move |x: S, g: S| {
                let (x, g) = (up(x), up(g));
                let x2 = x * x;
                let t = Float::tanh(k * x * (T::ONE + gc * x2));
                down(g * (half * (T::ONE + t) + half * x * (T::ONE - t * t) * (k + k3 * x2)))
            })
        }
        Unary::GeluErf => {
            let (r, half, p) = (c(std::f64::consts::FRAC_1_SQRT_2), c(0.5), c(FRAC_1_SQRT_2PI));
            map2(xs, gs, &nx, move |x: S, g: S| {
                let (x, g) = (up(x), up(g));
                down(g * (half * (T::ONE + Float::erf(x * r)) + x * p * Float::exp(-half * x * x)))
            })
        }
        _ => return Ok(None),
    };
    out.map(Some)
}

/// `g * (1 - y^2)` over `y` and `g` broadcast to `shape` (`g` read in
/// `y`'s compute dtype).
fn tanh_backward(y: Src<'_>, g: Src<'_>, shape: &Shape) -> Result<Storage> {
    float_src("tanh_backward", y, |y| {
        let wide;
        let g = if g.dtype() == y.dtype() {
            g
        } else {
            wide = (Storage::cpu(super::shape::cast(g, y.dtype())?), crate::Layout::contiguous(g.shape().clone()));
            Src { storage: &wide.0, layout: &wide.1 }
        };
        with_float!(y.dtype(), T => {
            let nd = nd2(y.layout, g.layout, shape);
            let out = map2(host::<T>(y), host::<T>(g), &nd, |y: T, g: T| g * (T::ONE - y * y))?;
            Ok(Storage::cpu(T::wrap(out)))
        }, _ => unreachable!())
    })
}

/// `-2 y g s + tg (1 - y^2)` (the last term only with `tg`) in one pass,
/// for `TanhBackward`'s eager rules, which have checked that every operand
/// is contiguous and shares `y`'s dtype and shape; `None` for dtypes other
/// than f32 and f64, and the rule composes it from differentiable ops.
fn tanh_second(yv: Src<'_>, gv: Src<'_>, sv: Src<'_>, tv: Option<Src<'_>>) -> Result<Option<Storage>> {
    with_float!(yv.dtype(), F => {
        fn sl<F: CpuElement>(t: Src<'_>) -> &[F] {
            let at = t.layout.offset;
            &host::<F>(t)[at..at + t.numel()]
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
        Ok(Some(Storage::cpu(F::wrap(out))))
    }, _ => Ok(None))
}
