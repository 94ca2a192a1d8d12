//! The CPU kernels of LayerNorm and RMSNorm: one pass per row forward, and one
//! pass per row backward that recomputes the row's mean and reciprocal
//! deviation and writes the three gradients.

use tapir_tensor::cpu::pool::{self, Disjoint};
use tapir_tensor::{DType, Error, Float, Result, ShapeOps, Tensor};

use super::CpuBackend;
use crate::backend::{NormKernels, NormPlan};

impl NormKernels for CpuBackend {
    fn norm(&self, plan: &NormPlan, x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>) -> Result<Option<Tensor>> {
        forward(plan, x, w, b).map(Some)
    }
    fn norm_grad(&self, plan: &NormPlan, x: &Tensor, w: Option<&Tensor>, g: &Tensor) -> Result<Option<[Tensor; 3]>> {
        backward(plan, x, w, g)
    }
}

/// From this many elements on, the row kernels split their rows over the
/// pool's threads.
const SPLIT_ROWS_MIN_ELEMS: usize = tapir_tensor::cpu::iter::SPLIT_MIN;

/// Mean (0 for RMS) and reciprocal deviation of one row.
#[inline]
fn row_stats<F: Float>(r: &[F], eps: F, rms: bool) -> (F, F) {
    let n = F::from_f64(r.len() as f64);
    let mean = if rms { F::ZERO } else { r.iter().copied().sum::<F>() / n };
    let var = r.iter().map(|&v| (v - mean) * (v - mean)).sum::<F>() / n;
    (mean, F::ONE / (var + eps).sqrt())
}

/// The forward kernel on contiguous rows of width `d`, its rows split over
/// the pool's threads.
fn forward_rows<F: Float>(x: &[F], w: Option<&[F]>, b: Option<&[F]>, d: usize, eps: F, rms: bool) -> Result<Vec<F>> {
    let mut out = tapir_tensor::cache::filled(x.len(), F::ZERO)?;
    let shared = Disjoint::new(&mut out);
    let rows = x.len() / d.max(1);
    pool::ranges(rows, SPLIT_ROWS_MIN_ELEMS / d.max(1), &|part| {
        // SAFETY: the parts' row ranges are disjoint.
        let out = unsafe { shared.slice(part.start * d, part.len() * d) };
        for (r, o) in x[part.start * d..part.end * d].chunks(d).zip(out.chunks_mut(d)) {
            let (mean, rstd) = row_stats(r, eps, rms);
            for i in 0..d {
                let h = (r[i] - mean) * rstd;
                o[i] = h * w.map_or(F::ONE, |w| w[i]) + b.map_or(F::ZERO, |b| b[i]);
            }
        }
    });
    Ok(out)
}

/// Rows per block of the backward kernel's partial sums of dw and db.
const BLOCK_ROWS: usize = 64;

/// The backward kernel: (dx, dw, db) from x, w and g in one pass per row.
/// Rows go in blocks of [`BLOCK_ROWS`], each summing its own dw and db, the
/// blocks spread over the pool's threads; the blocks' sums are then added in
/// order, so no bit depends on the number of threads.
fn backward_rows<F: Float>(x: &[F], w: Option<&[F]>, g: &[F], d: usize, eps: F, rms: bool) -> Result<[Vec<F>; 3]> {
    let mut dx = tapir_tensor::cache::filled(x.len(), F::ZERO)?;
    let rows = x.len() / d.max(1);
    let blocks = rows.div_ceil(BLOCK_ROWS);
    let mut sums = vec![F::ZERO; 2 * d * blocks];
    let (shared, shared_sums) = (Disjoint::new(&mut dx), Disjoint::new(&mut sums));
    let inv_d = F::ONE / F::from_f64(d as f64);
    let block = |k: usize| {
        let (r0, r1) = (k * BLOCK_ROWS, ((k + 1) * BLOCK_ROWS).min(rows));
        // SAFETY: block k alone writes rows r0..r1 of dx and its own sums.
        let (dx, sums) = unsafe { (shared.slice(r0 * d, (r1 - r0) * d), shared_sums.slice(2 * d * k, 2 * d)) };
        let (dw, db) = sums.split_at_mut(d);
        let mut h = vec![F::ZERO; d];
        for ((r, gr), o) in x[r0 * d..r1 * d].chunks(d).zip(g[r0 * d..r1 * d].chunks(d)).zip(dx.chunks_mut(d)) {
            let (mean, rstd) = row_stats(r, eps, rms);
            let (mut s1, mut s2) = (F::ZERO, F::ZERO);
            for i in 0..d {
                h[i] = (r[i] - mean) * rstd;
                dw[i] += gr[i] * h[i];
                db[i] += gr[i];
                let gh = gr[i] * w.map_or(F::ONE, |w| w[i]);
                s1 += gh;
                s2 += gh * h[i];
            }
            let (m1, m2) = (if rms { F::ZERO } else { s1 * inv_d }, s2 * inv_d);
            for i in 0..d {
                let gh = gr[i] * w.map_or(F::ONE, |w| w[i]);
                o[i] = rstd * (gh - m1 - h[i] * m2);
            }
        }
    };
    pool::ranges(blocks, SPLIT_ROWS_MIN_ELEMS.div_ceil(BLOCK_ROWS * d.max(1)), &|r| r.for_each(block));
    let (mut dw, mut db) = (vec![F::ZERO; d], vec![F::ZERO; d]);
    for part in sums.chunks(2 * d) {
        for i in 0..d {
            dw[i] += part[i];
            db[i] += part[d + i];
        }
    }
    Ok([dx, dw, db])
}

/// The forward over `x` with the scale `w` and shift `b` the op has, host
/// tensors whose shapes and dtypes the op checked into `op`. f16 and bf16
/// run through f32.
fn forward(op: &NormPlan, x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>) -> Result<Tensor> {
    let d = op.d;
    let (xc, wc, bc) =
        (x.contiguous()?, w.map(|t| t.contiguous()).transpose()?, b.map(|t| t.contiguous()).transpose()?);
    macro_rules! run {
        ($F:ty) => {{
            fn s(t: &Option<Tensor>) -> Option<&[$F]> {
                t.as_ref().map(|t| t.as_slice::<$F>().expect("internal: contiguous"))
            }
            let out = forward_rows(
                xc.as_slice::<$F>().expect("internal: contiguous"),
                s(&wc),
                s(&bc),
                d,
                op.eps as $F,
                op.rms,
            )?;
            Tensor::from_vec(out, x.shape().clone())
        }};
    }
    match x.dtype() {
        DType::F32 => run!(f32),
        DType::F64 => run!(f64),
        DType::F16 | DType::BF16 => {
            let up = |t: Option<&Tensor>| t.map(|t| t.cast(DType::F32)).transpose();
            let (x32, w32, b32) = (x.cast(DType::F32)?, up(w)?, up(b)?);
            forward(op, &x32, w32.as_ref(), b32.as_ref())?.cast(x.dtype())
        }
        dtype => Err(Error::UnsupportedDType { op: op.op, dtype, expected: "a float dtype" }),
    }
}

/// The backward's `(dx, dw, db)` from host tensors `x`, `w` and `g`, or
/// `None` where the kernel does not apply (other dtypes, mixed dtypes).
fn backward(op: &NormPlan, x: &Tensor, w: Option<&Tensor>, g: &Tensor) -> Result<Option<[Tensor; 3]>> {
    let d = op.d;
    let (x, g, w) = (x.contiguous()?, g.contiguous()?, w.map(|w| w.contiguous()).transpose()?);
    macro_rules! run {
        ($F:ty) => {{
            let (Some(xv), Some(gv)) = (x.as_slice::<$F>(), g.as_slice::<$F>()) else { return Ok(None) };
            let wv = match &w {
                Some(w) => match w.as_slice::<$F>() {
                    Some(s) => Some(s),
                    None => return Ok(None),
                },
                None => None,
            };
            let [dx, dw, db] = backward_rows(xv, wv, gv, d, op.eps as $F, op.rms)?;
            Ok(Some([Tensor::from_vec(dx, x.shape().clone())?, Tensor::from_vec(dw, [d])?, Tensor::from_vec(db, [d])?]))
        }};
    }
    match x.dtype() {
        DType::F32 => run!(f32),
        DType::F64 => run!(f64),
        _ => Ok(None),
    }
}
