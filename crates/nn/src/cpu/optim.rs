//! The CPU kernels of the optimizers: each element's update, independent
//! of every other, so large parameters are split over the pool's threads
//! and the split changes no bits.

use tapir_tensor::cpu::iter::SPLIT_MIN;
use tapir_tensor::cpu::pool::{self, Disjoint};
use tapir_tensor::cpu::simd;
use tapir_tensor::Float;

/// One SGD step's constants, in the parameter's compute type.
#[derive(Clone, Copy)]
pub(crate) struct SgdStep<F> {
    pub lr: F,
    pub momentum: F,
    pub weight_decay: F,
    pub nesterov: bool,
    /// The first step: the momentum buffer becomes the gradient itself.
    pub first: bool,
}

/// `p -= lr * d` with `d` the decayed gradient, through the momentum
/// buffer `buf` when there is one and the momentum is not zero.
pub(crate) fn sgd<F: Float>(p: &mut [F], g: &[F], buf: Option<&mut [F]>, k: SgdStep<F>) {
    let SgdStep { lr, momentum: mu, weight_decay: wd, nesterov, first } = k;
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
pub(crate) struct AdamStep<F> {
    pub lr: F,
    pub weight_decay: F,
    pub beta1: F,
    pub beta2: F,
    /// `lr / (1 - beta1^t)`.
    pub step: F,
    /// `1 / sqrt(1 - beta2^t)`.
    pub inv_bc2_sqrt: F,
    pub eps: F,
    /// AdamW: the decay is applied to the parameter, not the gradient.
    pub decoupled: bool,
}

/// Adam's update of `p` and its moments `m` and `v` from the gradient `g`.
pub(crate) fn adam<F: Float>(p: &mut [F], m: &mut [F], v: &mut [F], g: &[F], k: AdamStep<F>) {
    let AdamStep { lr, weight_decay: wd, beta1: b1, beta2: b2, step, inv_bc2_sqrt, eps, decoupled } = k;
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
