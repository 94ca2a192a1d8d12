//! The CPU kernels of the causal softmax and the causal attention: rows
//! that visit only the keys `j <= i`, and attention run per (batch, head)
//! over the pool, with the heads addressed in place inside `[B, T, C]`
//! and the probabilities recomputed in the backward.

use half::{bf16, f16};
use tapir_tensor::cpu::pool::Disjoint;
use tapir_tensor::{CpuElement, DType, Error, Result, Tensor};

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
        DType::F16 => low_causal_softmax::<f16>(plan, &x),
        DType::BF16 => low_causal_softmax::<bf16>(plan, &x),
        dtype => Err(Error::UnsupportedDType { op: "causal_softmax", dtype, expected: "a float dtype" }),
    }
}

/// A 16-bit float the kernels compute in f32: widened exactly, each
/// result rounded once to the nearest (ties to even), as a cast would.
trait Low: CpuElement {
    fn up(self) -> f32;
    fn down(v: f32) -> Self;
}

impl Low for bf16 {
    #[inline]
    fn up(self) -> f32 {
        self.to_f32()
    }
    #[inline]
    fn down(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl Low for f16 {
    #[inline]
    fn up(self) -> f32 {
        self.to_f32()
    }
    #[inline]
    fn down(v: f32) -> Self {
        f16::from_f32(v)
    }
}

/// The causal softmax of contiguous 16-bit scores, one `[queries, keys]`
/// block at a time through f32: the same numbers as casting the whole
/// tensor up and the result down, with one block's f32 copies at a time.
fn low_causal_softmax<S: Low>(plan: &CausalSoftmaxPlan, x: &Tensor) -> Result<Tensor> {
    let src = x.as_slice::<S>().expect("internal: contiguous");
    let (tq, tk) = (plan.queries, plan.keys);
    let mut out = tapir_tensor::cache::filled(src.len(), S::down(0.0))?;
    let block = tq * tk;
    if block > 0 {
        let (mut up, mut res) = (vec![0f32; block], vec![0f32; block]);
        for (xb, ob) in src.chunks(block).zip(out.chunks_mut(block)) {
            up.iter_mut().zip(xb).for_each(|(u, &v)| *u = v.up());
            causal_rows(&up, &mut res, tq, tk, plan.scale as f32);
            ob.iter_mut().zip(&res).for_each(|(o, &v)| *o = S::down(v));
        }
    }
    Tensor::from_vec(out, x.shape().clone())
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
        DType::F16 => low_forward::<f16>(hs, [&q, &k, &v]),
        DType::BF16 => low_forward::<bf16>(hs, [&q, &k, &v]),
        dtype => Err(Error::UnsupportedDType { op: "causal_attention", dtype, expected: "a float dtype" }),
    }
}

/// The rows of one (batch, head) at `base` of a 16-bit `[B, T, C]`
/// buffer, widened into `out` as a contiguous `[T, d]` (exact).
fn gather<S: Low>(hs: &AttentionPlan, src: &[S], base: usize, out: &mut Vec<f32>) {
    out.clear();
    for t in 0..hs.t {
        out.extend(src[base + t * hs.c..base + t * hs.c + hs.d].iter().map(|&v| v.up()));
    }
}

/// Rounds a contiguous `[T, d]` head into its rows at `base` of `dst`.
///
/// # Safety
/// `dst` is shaped like the plan's `[B, T, C]`, and no one else touches
/// this head's elements of it meanwhile.
unsafe fn scatter<S: Low>(hs: &AttentionPlan, head: &[f32], dst: &Disjoint<S>, base: usize) {
    for (t, row) in head.chunks(hs.d).enumerate() {
        // SAFETY: row t of this head, inside `dst`, ours by the promise.
        let out = unsafe { dst.slice(base + t * hs.c, hs.d) };
        out.iter_mut().zip(row).for_each(|(o, &v)| *o = S::down(v));
    }
}

/// 16-bit attention: each (batch, head) widened into f32 scratch of its
/// own, run by the f32 loops over a contiguous head (`c = d`), and rounded
/// once into the output. The numbers are those of casting q, k and v up and
/// the output down, without any `[B, T, C]` f32 copy.
fn low_forward<S: Low>(hs: &AttentionPlan, [q, k, v]: [&Tensor; 3]) -> Result<Tensor> {
    let [qs, ks, vs] = [q, k, v].map(|t| t.as_slice::<S>().expect("internal: contiguous dtype"));
    let mut y = tapir_tensor::cache::filled(q.numel(), S::down(0.0))?;
    let out = Disjoint::new(&mut y);
    let head = AttentionPlan { c: hs.d, ..*hs };
    tapir_tensor::cpu::pool::split(hs.batch * hs.heads, &|part| {
        let base = (part / hs.heads) * hs.t * hs.c + (part % hs.heads) * hs.d;
        let (mut qf, mut kf, mut vf) = (Vec::new(), Vec::new(), Vec::new());
        gather(hs, qs, base, &mut qf);
        gather(hs, ks, base, &mut kf);
        gather(hs, vs, base, &mut vf);
        let mut yf = vec![0f32; hs.t * hs.d];
        let yd = Disjoint::new(&mut yf);
        // SAFETY: `yf` is this part's own contiguous head; `y` is shaped
        // like `q`, and each part writes only its own (batch, head).
        unsafe {
            head.forward_head(&qf, &kf, &vf, &yd, 0, hs.scale as f32);
            scatter(hs, &yf, &out, base);
        }
    });
    Tensor::from_vec(y, q.shape().clone())
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
        // Without this the op fell back to its composed rule, whose
        // [B, H, T, T] probabilities and their gradients set a bf16 training
        // step's peak above the f32 step's.
        DType::F16 => low_backward::<f16>(hs, [&q, &k, &v, &y, &g]).map(Some),
        DType::BF16 => low_backward::<bf16>(hs, [&q, &k, &v, &y, &g]).map(Some),
        _ => Ok(None),
    }
}

/// The 16-bit backward as [`low_forward`] runs the forward: per (batch,
/// head), its five operands widened into f32 scratch, the f32 loops, and
/// the three gradients rounded once (the numbers of casting the five up
/// and the gradients down, without their `[B, T, C]` f32 copies).
fn low_backward<S: Low>(hs: &AttentionPlan, xs: [&Tensor; 5]) -> Result<[Tensor; 3]> {
    let ins = xs.map(|t| t.as_slice::<S>().expect("internal: contiguous dtype"));
    let n = xs[0].numel();
    let filled = || tapir_tensor::cache::filled(n, S::down(0.0));
    let (mut dq, mut dk, mut dv) = (filled()?, filled()?, filled()?);
    let outs = [Disjoint::new(&mut dq), Disjoint::new(&mut dk), Disjoint::new(&mut dv)];
    let head = AttentionPlan { c: hs.d, ..*hs };
    tapir_tensor::cpu::pool::split(hs.batch * hs.heads, &|part| {
        let base = (part / hs.heads) * hs.t * hs.c + (part % hs.heads) * hs.d;
        let mut up: [Vec<f32>; 5] = Default::default();
        for (u, src) in up.iter_mut().zip(ins) {
            gather(hs, src, base, u);
        }
        let mut grads = [(); 3].map(|_| vec![0f32; hs.t * hs.d]);
        let [gq, gk, gv] = &mut grads;
        let gd = [Disjoint::new(gq), Disjoint::new(gk), Disjoint::new(gv)];
        let [a, b, c, d, e] = &up;
        // SAFETY: the scratch is this part's own contiguous head; the
        // outputs are shaped like `q`, and each part writes only its own
        // (batch, head).
        unsafe {
            head.backward_head([a, b, c, d, e], [&gd[0], &gd[1], &gd[2]], 0, hs.scale as f32);
            for (g, out) in grads.iter().zip(&outs) {
                scatter(hs, g, out, base);
            }
        }
    });
    let shape = xs[0].shape().clone();
    Ok([Tensor::from_vec(dq, shape.clone())?, Tensor::from_vec(dk, shape.clone())?, Tensor::from_vec(dv, shape)?])
}
