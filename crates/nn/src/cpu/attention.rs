//! The CPU kernels of the causal softmax and the causal attention: rows
//! that visit only the keys `j <= i`, and attention run per (batch, head)
//! over the pool, with the heads addressed in place inside `[B, T, C]`
//! and the probabilities recomputed in the backward.

use tapir_tensor::cpu::pool::Disjoint;
use tapir_tensor::{DType, Error, Result, ShapeOps, Tensor};

use super::CpuBackend;
use crate::backend::{AttentionKernels, AttentionPlan, CausalSoftmaxPlan};

impl AttentionKernels for CpuBackend {
    fn causal_softmax(&self, plan: &CausalSoftmaxPlan, x: &Tensor) -> Result<Tensor> {
        causal_softmax(plan, x)
    }
    fn causal_attention(&self, plan: &AttentionPlan, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Option<Tensor>> {
        forward(plan, [q, k, v]).map(Some)
    }
    fn causal_attention_grad(
        &self,
        plan: &AttentionPlan,
        qkv: [&Tensor; 3],
        y: &Tensor,
        g: &Tensor,
    ) -> Result<Option<[Tensor; 3]>> {
        backward(plan, qkv, y, g)
    }
}

fn causal_rows<T: tapir_tensor::Float + tapir_tensor::CpuElement>(
    x: &[T],
    out: &mut [T],
    tq: usize,
    tk: usize,
    scale: T,
) {
    if tk == 0 {
        // No keys, so no queries either: nothing to write (chunks of zero
        // elements do not exist).
        return;
    }
    for (r, (xi, oi)) in x.chunks(tk).zip(out.chunks_mut(tk)).enumerate() {
        let i = r % tq;
        let n = (i + 1 + tk - tq).min(tk);
        let (xa, (oa, om)) = (&xi[..n], oi.split_at_mut(n));
        let m = xa.iter().fold(T::NEG_INF, |a, &b| a.max(b * scale));
        let mut s = T::ZERO;
        for (o, &v) in oa.iter_mut().zip(xa) {
            let e = (v * scale - m).exp();
            *o = e;
            s += e;
        }
        let inv = T::ONE / s;
        oa.iter_mut().for_each(|o| *o *= inv);
        om.iter_mut().for_each(|o| *o = T::ZERO);
    }
}

/// The causal softmax of host scores `x` (checked by the op into `plan`);
/// f16 and bf16 run through f32.
fn causal_softmax(plan: &CausalSoftmaxPlan, x: &Tensor) -> Result<Tensor> {
    let x = x.contiguous()?;
    let (tq, tk) = (plan.queries, plan.keys);
    match x.dtype() {
        DType::F32 => {
            let src = x.as_slice::<f32>().expect("internal: contiguous");
            let mut out = tapir_tensor::cache::filled(src.len(), 0.0f32)?;
            causal_rows(src, &mut out, tq, tk, plan.scale as f32);
            Tensor::from_vec(out, x.shape().clone())
        }
        DType::F64 => {
            let src = x.as_slice::<f64>().expect("internal: contiguous");
            let mut out = tapir_tensor::cache::filled(src.len(), 0.0f64)?;
            causal_rows(src, &mut out, tq, tk, plan.scale);
            Tensor::from_vec(out, x.shape().clone())
        }
        DType::F16 | DType::BF16 => causal_softmax(plan, &x.cast(DType::F32)?)?.cast(x.dtype()),
        dtype => Err(Error::UnsupportedDType { op: "causal_softmax", dtype, expected: "a float dtype" }),
    }
}

/// The CPU's loops over one (batch, head) of a plan (private to this
/// file): the head's rows start at `base`, and its row `t` is
/// `base + t * c .. base + t * c + d`.
impl AttentionPlan {
    /// Probabilities of query `i` over keys `0..=i` into `p`.
    #[inline]
    fn probs<F: tapir_tensor::Float>(&self, q: &[F], k: &[F], base: usize, i: usize, scale: F, p: &mut [F]) {
        let qi = &q[base + i * self.c..base + i * self.c + self.d];
        let mut m = F::NEG_INF;
        for (j, pj) in p.iter_mut().enumerate().take(i + 1) {
            let kj = &k[base + j * self.c..base + j * self.c + self.d];
            let mut s = F::ZERO;
            for (a, b) in qi.iter().zip(kj) {
                s += *a * *b;
            }
            *pj = s * scale;
            m = m.max(*pj);
        }
        let mut z = F::ZERO;
        for pj in p.iter_mut().take(i + 1) {
            *pj = (*pj - m).exp();
            z += *pj;
        }
        let inv = F::ONE / z;
        p.iter_mut().take(i + 1).for_each(|pj| *pj *= inv);
    }

    /// One (batch, head) of the output, the rows of `y` at `base`.
    ///
    /// # Safety
    /// `y` has the shape of `q`, and no one else touches this head's
    /// elements of it meanwhile.
    unsafe fn forward_head<F: tapir_tensor::Float>(
        &self,
        q: &[F],
        k: &[F],
        v: &[F],
        y: &Disjoint<F>,
        base: usize,
        scale: F,
    ) {
        let mut p = vec![F::ZERO; self.t];
        for i in 0..self.t {
            self.probs(q, k, base, i, scale, &mut p);
            // SAFETY: row i of this head, inside `y` (same shape as `q`),
            // ours alone by the caller's promise.
            let yi = unsafe { y.slice(base + i * self.c, self.d) };
            for (j, &pj) in p.iter().enumerate().take(i + 1) {
                let vj = &v[base + j * self.c..base + j * self.c + self.d];
                for (o, &x) in yi.iter_mut().zip(vj) {
                    *o += pj * x;
                }
            }
        }
    }

    /// One (batch, head) of the gradients, at `base`.
    ///
    /// # Safety
    /// `dq`, `dk` and `dv` have the shape of `q`, and no one else touches
    /// this head's elements of them meanwhile.
    unsafe fn backward_head<F: tapir_tensor::Float>(
        &self,
        [q, k, v, y, g]: [&[F]; 5],
        [dq, dk, dv]: [&Disjoint<F>; 3],
        base: usize,
        scale: F,
    ) {
        let (c, d) = (self.c, self.d);
        let mut p = vec![F::ZERO; self.t];
        for i in 0..self.t {
            self.probs(q, k, base, i, scale, &mut p);
            let (gi, yi) = (&g[base + i * c..base + i * c + d], &y[base + i * c..base + i * c + d]);
            // sum_j p_ij dP_ij = g_i . y_i
            let mut gy = F::ZERO;
            for (a, b) in gi.iter().zip(yi) {
                gy += *a * *b;
            }
            // SAFETY (of each `slice`): rows i and j of this head, inside
            // buffers shaped like `q`, ours alone by the caller's promise;
            // the three buffers are distinct, and each row reference ends
            // before the next of the same buffer is made.
            let dqi = unsafe { dq.slice(base + i * c, d) };
            let qi = &q[base + i * c..base + i * c + d];
            for (j, &pj) in p.iter().enumerate().take(i + 1) {
                let jb = base + j * c;
                let (kj, vj) = (&k[jb..jb + d], &v[jb..jb + d]);
                let (dkj, dvj) = unsafe { (dk.slice(jb, d), dv.slice(jb, d)) };
                let mut dp = F::ZERO;
                for x in 0..d {
                    dvj[x] += pj * gi[x];
                    dp += gi[x] * vj[x];
                }
                let ds = pj * (dp - gy) * scale;
                for x in 0..d {
                    dqi[x] += ds * kj[x];
                    dkj[x] += ds * qi[x];
                }
            }
        }
    }
}

/// The causal attention of host `q`, `k`, `v` (checked by the op into
/// `hs`); f16 and bf16 run through f32.
fn forward(hs: &AttentionPlan, [q, k, v]: [&Tensor; 3]) -> Result<Tensor> {
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    let b = hs.batch;
    macro_rules! run {
        ($F:ty) => {{
            fn sl(t: &Tensor) -> &[$F] {
                t.as_slice::<$F>().expect("internal: contiguous dtype")
            }
            let (qs, ks, vs) = (sl(&q), sl(&k), sl(&v));
            let mut y = tapir_tensor::cache::filled(q.numel(), 0.0 as $F)?;
            let out = Disjoint::new(&mut y);
            let heads = hs.heads;
            // One part per (batch, head), spread over the pool.
            tapir_tensor::cpu::pool::split(b * heads, &|part| {
                let base = (part / heads) * hs.t * hs.c + (part % heads) * hs.d;
                // SAFETY: `y` is shaped like `q`; each part writes only
                // its own (batch, head).
                unsafe { hs.forward_head(qs, ks, vs, &out, base, hs.scale as $F) };
            });
            Tensor::from_vec(y, q.shape().clone())
        }};
    }
    match q.dtype() {
        DType::F32 => run!(f32),
        DType::F64 => run!(f64),
        DType::F16 | DType::BF16 => {
            let up = [&q, &k, &v].map(|t| t.cast(DType::F32));
            let [a, b2, c] = up;
            forward(hs, [&a?, &b2?, &c?])?.cast(q.dtype())
        }
        dtype => Err(Error::UnsupportedDType { op: "causal_attention", dtype, expected: "a float dtype" }),
    }
}

/// The gradients of `q`, `k` and `v` from host inputs, output `y` and
/// upstream gradient `g` (one dtype, as the op checked); f16 and bf16 run
/// through f32, as the forward does.
fn backward(hs: &AttentionPlan, xs: [&Tensor; 3], y: &Tensor, g: &Tensor) -> Result<Option<[Tensor; 3]>> {
    let [q, k, v] = [xs[0].contiguous()?, xs[1].contiguous()?, xs[2].contiguous()?];
    let (y, g) = (y.contiguous()?, g.contiguous()?);
    let b = hs.batch;
    macro_rules! run {
        ($F:ty) => {{
            fn sl(t: &Tensor) -> &[$F] {
                t.as_slice::<$F>().expect("internal: contiguous dtype")
            }
            let ins = [sl(&q), sl(&k), sl(&v), sl(&y), sl(&g)];
            let n = q.numel();
            let filled = || tapir_tensor::cache::filled(n, 0.0 as $F);
            let (mut dq, mut dk, mut dv) = (filled()?, filled()?, filled()?);
            let outs = [Disjoint::new(&mut dq), Disjoint::new(&mut dk), Disjoint::new(&mut dv)];
            let heads = hs.heads;
            // One part per (batch, head), spread over the pool.
            tapir_tensor::cpu::pool::split(b * heads, &|part| {
                let base = (part / heads) * hs.t * hs.c + (part % heads) * hs.d;
                // SAFETY: the buffers are shaped like `q`; each part
                // touches only its own (batch, head).
                unsafe { hs.backward_head(ins, [&outs[0], &outs[1], &outs[2]], base, hs.scale as $F) };
            });
            let shape = q.shape().clone();
            Ok(Some([
                Tensor::from_vec(dq, shape.clone())?,
                Tensor::from_vec(dk, shape.clone())?,
                Tensor::from_vec(dv, shape)?,
            ]))
        }};
    }
    match q.dtype() {
        DType::F32 => run!(f32),
        DType::F64 => run!(f64),
        DType::F16 | DType::BF16 => {
            // Without this the op fell back to its composed rule, whose
            // [B, H, T, T] probabilities and their gradients (a handful of
            // low-precision T x T temporaries) set a bf16 training step's
            // peak above the f32 step's. Through f32 the temporaries are
            // five [B, T, C] copies: the up-casts are exact, and the
            // gradients are rounded once, at the end.
            let dtype = q.dtype();
            let up = |t: &Tensor| t.cast(DType::F32);
            let (qf, kf, vf, yf, gf) = (up(&q)?, up(&k)?, up(&v)?, up(&y)?, up(&g)?);
            drop((q, k, v, y, g));
            let Some(d) = backward(hs, [&qf, &kf, &vf], &yf, &gf)? else { return Ok(None) };
            drop((qf, kf, vf, yf, gf));
            let [dq, dk, dv] = d;
            Ok(Some([dq.cast(dtype)?, dk.cast(dtype)?, dv.cast(dtype)?]))
        }
        _ => Ok(None),
    }
}
