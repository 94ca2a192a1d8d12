//! The CPU kernels of the optimizers ([`crate::backend::optim`]): each
//! element's update, independent of every other, so large parameters are
//! split over the pool's threads and the split changes no bits.

use std::borrow::Cow;

use half::{bf16, f16};

use super::host;
use super::iter::{map1, nd1, SPLIT_MIN};
use super::pool::{self, Disjoint};
use super::simd;
use super::CpuBackend;
use crate::backend::optim::{AdamStep, OptimKernels, SgdStep};
use crate::backend::Src;
use crate::storage::{CpuElement, Storage};
use crate::{DType, Element, Error, Float, Result};

/// A parameter or state storage as the mutable slice of `T` it holds.
fn slice_mut<T: CpuElement>(s: &mut Storage) -> &mut [T] {
    T::slice_mut(s.host_mut().expect("internal: a CPU kernel was given a device operand")).expect("internal: dtype")
}

/// The gradient's elements in row-major order: its own when contiguous.
fn dense<T: CpuElement>(g: Src<'_>) -> Result<Cow<'_, [T]>> {
    if g.is_contiguous() {
        let at = g.layout.offset;
        return Ok(Cow::Borrowed(&host::<T>(g)[at..at + g.numel()]));
    }
    Ok(Cow::Owned(map1(host::<T>(g), &nd1(g.layout), |v: T| v)?))
}

/// Runs `body(param, grad)` on f32 or f64 slices of the parameter `p` and
/// its gradient `g`. Parameters stored in f16 or bf16 are updated in f32,
/// the dtype their state is kept in: the parameter and its gradient are
/// widened, the body runs, and the result is rounded back once. Keeping
/// the moments in the storage dtype instead would lose Adam's second
/// moment to underflow (a squared gradient of 1e-4 is below f16's
/// smallest normal number).
macro_rules! on_param {
    ($p:expr, $g:expr, |$ps:ident, $gs:ident| $body:expr) => {{
        macro_rules! typed {
            ($F:ty) => {{
                #[allow(dead_code)]
                type F = $F;
                let gv = dense::<$F>($g)?;
                let $gs: &[$F] = &gv;
                let $ps: &mut [$F] = slice_mut::<$F>($p);
                $body
            }};
        }
        macro_rules! widened {
            ($H:ty) => {{
                #[allow(dead_code)]
                type F = f32;
                let gv: Vec<f32> = dense::<$H>($g)?.iter().map(|x| x.to_f32()).collect();
                let $gs: &[f32] = &gv;
                let mut wide: Vec<f32> = slice_mut::<$H>($p).iter().map(|x| x.to_f32()).collect();
                {
                    let $ps: &mut [f32] = &mut wide;
                    $body
                }
                for (dst, &w) in slice_mut::<$H>($p).iter_mut().zip(&wide) {
                    *dst = <$H>::from_f32(w);
                }
            }};
        }
        match $p.dtype() {
            DType::F32 => typed!(f32),
            DType::F64 => typed!(f64),
            DType::F16 => widened!(f16),
            DType::BF16 => widened!(bf16),
            dtype => return Err(Error::UnsupportedDType { op: "optimizer step", dtype, expected: "float parameters" }),
        }
    }};
}

impl OptimKernels for CpuBackend {
    fn sgd_step(&self, p: &mut Storage, g: Src<'_>, mut buf: Option<&mut Storage>, k: &SgdStep) -> Result<()> {
        on_param!(p, g, |ps, gs| {
            let c = Sgd {
                lr: F::from_f64(k.lr),
                momentum: F::from_f64(k.momentum),
                weight_decay: F::from_f64(k.weight_decay),
                nesterov: k.nesterov,
                first: k.first,
            };
            sgd(ps, gs, buf.as_deref_mut().map(slice_mut::<F>), c)
        });
        Ok(())
    }

    fn adam_step(&self, p: &mut Storage, m: &mut Storage, v: &mut Storage, g: Src<'_>, k: &AdamStep) -> Result<()> {
        on_param!(p, g, |ps, gs| {
            let c = Adam {
                lr: F::from_f64(k.lr),
                weight_decay: F::from_f64(k.weight_decay),
                beta1: F::from_f64(k.beta1),
                beta2: F::from_f64(k.beta2),
                step: F::from_f64(k.step),
                inv_bc2_sqrt: F::from_f64(k.inv_bc2_sqrt),
                eps: F::from_f64(k.eps),
                decoupled: k.decoupled,
            };
            adam(ps, slice_mut::<F>(m), slice_mut::<F>(v), gs, c)
        });
        Ok(())
    }
}

/// One SGD step's constants, in the parameter's compute type.
#[derive(Clone, Copy)]
struct Sgd<F> {
    lr: F,
    momentum: F,
    weight_decay: F,
    nesterov: bool,
    /// The first step: the momentum buffer becomes the gradient itself.
    first: bool,
}

/// `p -= lr * d` with `d` the decayed gradient, through the momentum
/// buffer `buf` when there is one and the momentum is not zero.
fn sgd<F: Float>(p: &mut [F], g: &[F], buf: Option<&mut [F]>, k: Sgd<F>) {
    let Sgd { lr, momentum: mu, weight_decay: wd, nesterov, first } = k;
    let p = Disjoint::new(p);
    let buf = buf.map(Disjoint::new);
    pool::ranges(g.len(), SPLIT_MIN, &|r| {
        // SAFETY: the ranges are disjoint; p and the buffer have g's length.
        let p = unsafe { p.slice(r.start, r.len()) };
        let buf = buf.as_ref().filter(|_| mu != F::ZERO).map(|b| unsafe { b.slice(r.start, r.len()) });
        let g = &g[r];
        simd::run(
            #[inline(always)]
            || match buf {
                Some(buf) => {
                    for i in 0..p.len() {
                        let mut d = g[i] + wd * p[i];
                        let b = &mut buf[i];
                        // torch: the first step's buffer is the gradient itself.
                        *b = if first { d } else { mu * *b + d };
                        d = if nesterov { d + mu * *b } else { *b };
                        p[i] = p[i] - lr * d;
                    }
                }
                None => {
                    for i in 0..p.len() {
                        p[i] = p[i] - lr * (g[i] + wd * p[i]);
                    }
                }
            },
        );
    });
}

/// One Adam step's constants, in the parameter's compute type.
#[derive(Clone, Copy)]
struct Adam<F> {
    lr: F,
    weight_decay: F,
    beta1: F,
    beta2: F,
    /// `lr / (1 - beta1^t)`.
    step: F,
    /// `1 / sqrt(1 - beta2^t)`.
    inv_bc2_sqrt: F,
    eps: F,
    /// AdamW: the decay is applied to the parameter, not the gradient.
    decoupled: bool,
}

/// Adam's update of `p` and its moments `m` and `v` from the gradient `g`.
fn adam<F: Float>(p: &mut [F], m: &mut [F], v: &mut [F], g: &[F], k: Adam<F>) {
    let Adam { lr, weight_decay: wd, beta1: b1, beta2: b2, step, inv_bc2_sqrt, eps, decoupled } = k;
    let (p, m, v) = (Disjoint::new(p), Disjoint::new(m), Disjoint::new(v));
    pool::ranges(g.len(), SPLIT_MIN, &|r| {
        // SAFETY: the ranges are disjoint; p, m, v have g's length.
        let (p, m, v) = unsafe { (p.slice(r.start, r.len()), m.slice(r.start, r.len()), v.slice(r.start, r.len())) };
        let g = &g[r];
        simd::run(
            #[inline(always)]
            || {
                for i in 0..p.len() {
                    let mut gi = g[i];
                    if decoupled {
                        p[i] = p[i] - lr * wd * p[i];
                    } else {
                        gi += wd * p[i];
                    }
                    m[i] = b1 * m[i] + (F::ONE - b1) * gi;
                    v[i] = b2 * v[i] + (F::ONE - b2) * gi * gi;
                    p[i] = p[i] - step * m[i] / (v[i].sqrt() * inv_bc2_sqrt + eps);
                }
            },
        );
    });
}
