//! Sparse cross-entropy that never builds a one-hot, and a fused linear +
//! cross-entropy head that never holds the full logits.
//!
//! Seed 000: Keras on PyTorch computed `one_hot(y) * log(softmax(x))` and
//! ran a 40 GiB GPU out of memory. Here the forward makes one pass per row
//! with an online max and sum (log-sum-exp) and saves only the per-row
//! log-sum-exp (N floats); the backward writes `softmax - target` straight
//! from the logits and that saved value. Under `create_graph` the rules
//! switch to a differentiable formulation, so second derivatives through
//! the loss (Hessian-vector products of a classifier) work.

use std::sync::Mutex;

use rayon::prelude::*;

use crate::cpu::math::exp_f32;
use crate::cpu::matmul::{gemm_into, MatRef};
use crate::ops::binary::BinaryOps;
use crate::ops::index::IndexOps;
use crate::ops::matmul::MatmulOps;
use crate::ops::reduce::ReduceOps;
use crate::ops::shape::ShapeOps;
use crate::ops::softmax::SoftmaxOps;
use crate::ops::unary::UnaryOps;
use crate::ops::{one, Arity, Diff, InputGrads, Op, Saved};
use crate::storage::CpuElement;
use crate::{DType, Error, Float, Result, Shape, Tensor};
use smallvec::SmallVec;

/// A value an op saves for its backward, behind a lock (ops are shared).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The saved tensor, if the forward made it and no spent backward freed it.
fn saved(m: &Mutex<Option<Tensor>>) -> Option<Tensor> {
    lock(m).clone()
}

/// How per-row losses are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// One loss per row, shaped like the labels.
    None,
    /// The sum over non-ignored rows.
    Sum,
    /// The mean over non-ignored rows. With every row ignored this is NaN
    /// (0/0, as in torch) and its gradient is zero.
    #[default]
    Mean,
}

/// Options of the cross-entropy losses (torch's defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CrossEntropyOptions {
    /// Rows whose label equals this get zero loss and zero gradient.
    pub ignore_index: i64,
    /// Mass spread uniformly over all classes, in `[0, 1]`.
    pub label_smoothing: f64,
    /// How rows are combined.
    pub reduction: Reduction,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions { ignore_index: -100, label_smoothing: 0.0, reduction: Reduction::Mean }
    }
}

/// Labels as row indices (`None` for ignored rows), checked against `classes`.
fn check_labels(op: &'static str, labels: &Tensor, ignore: i64, classes: usize) -> Result<Vec<Option<usize>>> {
    let raw: Vec<i64> = match labels.dtype() {
        DType::I64 => labels.to_vec::<i64>()?,
        DType::I32 => labels.to_vec::<i32>()?.into_iter().map(i64::from).collect(),
        dtype => return Err(Error::UnsupportedDType { op, dtype, expected: "int32 or int64 labels" }),
    };
    raw.iter()
        .enumerate()
        .map(|(row, &l)| {
            if l == ignore {
                Ok(None)
            } else if l >= 0 && (l as usize) < classes {
                Ok(Some(l as usize))
            } else {
                Err(Error::LabelOutOfRange { op, label: l, row, classes })
            }
        })
        .collect()
}

fn check_options(op: &'static str, o: &CrossEntropyOptions) -> Result<()> {
    if !(0.0..=1.0).contains(&o.label_smoothing) {
        return Err(Error::invalid_arg(op, format!("label_smoothing {} is outside [0, 1]", o.label_smoothing)));
    }
    Ok(())
}

/// The float types the fused kernels run in. The f32 row kernels are
/// compiled a second time with AVX2 enabled and picked at run time, so the
/// exponentials vectorise 8 wide where the processor allows.
trait CeFloat: Float + CpuElement {
    fn fexp(self) -> Self;
    fn lse_row(x: &[Self], want_sum: bool) -> (Self, Self) {
        row_lse(x, want_sum)
    }
    fn grad_row(xr: &mut [Self], k: GradRow<Self>) {
        grad_row(xr, k)
    }
}

impl CeFloat for f32 {
    #[inline(always)]
    fn fexp(self) -> Self {
        exp_f32(self)
    }
    fn lse_row(x: &[f32], want_sum: bool) -> (f32, f32) {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if std::arch::is_x86_feature_detected!("avx2") {
            #[target_feature(enable = "avx2")]
            unsafe fn avx2(x: &[f32], want_sum: bool) -> (f32, f32) {
                row_lse(x, want_sum)
            }
            // SAFETY: AVX2 is present (checked above).
            return unsafe { avx2(x, want_sum) };
        }
        row_lse(x, want_sum)
    }
    fn grad_row(xr: &mut [f32], k: GradRow<f32>) {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if std::arch::is_x86_feature_detected!("avx2") {
            #[target_feature(enable = "avx2")]
            unsafe fn avx2(xr: &mut [f32], k: GradRow<f32>) {
                grad_row(xr, k)
            }
            // SAFETY: AVX2 is present (checked above).
            return unsafe { avx2(xr, k) };
        }
        grad_row(xr, k)
    }
}

impl CeFloat for f64 {
    #[inline(always)]
    fn fexp(self) -> Self {
        self.exp()
    }
}

/// What the gradient of one row needs besides the row.
#[derive(Clone, Copy)]
struct GradRow<T> {
    lse: T,
    weight: T,
    eps_v: T,
    on: T,
    label: Option<usize>,
}

/// Overwrites one row of logits with `w * (softmax - target)`.
#[inline(always)]
fn grad_row<T: CeFloat>(xr: &mut [T], k: GradRow<T>) {
    match k.label {
        None => xr.iter_mut().for_each(|e| *e = T::ZERO),
        Some(y) => {
            for e in xr.iter_mut() {
                *e = k.weight * ((*e - k.lse).fexp() - k.eps_v);
            }
            xr[y] = xr[y] - k.weight * k.on;
        }
    }
}

/// Independent accumulators per reduction. A float sum or max folded one
/// element at a time is a chain of dependent operations the compiler may not
/// reorder (it would change the rounding), so it runs at one element per
/// add latency; this many separate lanes let it vectorise and overlap.
const LANES: usize = 16;

/// The max of a slice, NaN if it holds one (the lane update keeps a NaN once
/// it has one, so no separate pass looks for them).
#[inline(always)]
fn lane_max<T: CeFloat>(b: &[T]) -> T {
    #[inline(always)]
    fn step<T: CeFloat>(a: T, v: T) -> T {
        #[allow(clippy::eq_op)] // v != v: NaN, in a form that vectorises
        let nan = v != v;
        if v > a || nan {
            v
        } else {
            a
        }
    }
    let mut acc = [T::NEG_INF; LANES];
    let mut it = b.chunks_exact(LANES);
    for c in &mut it {
        for i in 0..LANES {
            acc[i] = step(acc[i], c[i]);
        }
    }
    let m = it.remainder().iter().fold(T::NEG_INF, |a, &v| step(a, v));
    acc.iter().fold(m, |a, &v| step(a, v))
}

/// `sum(exp(b - m))`, and `sum(b)` when `want_sum`.
#[inline(always)]
fn lane_sums<T: CeFloat>(b: &[T], m: T, want_sum: bool) -> (T, T) {
    let mut se = [T::ZERO; LANES];
    let mut sx = [T::ZERO; LANES];
    let mut it = b.chunks_exact(LANES);
    for c in &mut it {
        for i in 0..LANES {
            se[i] += (c[i] - m).fexp();
        }
        if want_sum {
            for i in 0..LANES {
                sx[i] += c[i];
            }
        }
    }
    for (i, &v) in it.remainder().iter().enumerate() {
        se[i] += (v - m).fexp();
        sx[i] += v;
    }
    let sx = if want_sum { sx.iter().copied().sum() } else { T::ZERO };
    (se.iter().copied().sum(), sx)
}

/// One pass over a row: an online max and sum of exponentials, block by
/// block (each block's max, then its exponentials, vectorised), and the sum
/// of the row when label smoothing needs it. Returns (lse, sum of row); a
/// row holding a NaN has a NaN lse.
#[inline(always)]
fn row_lse<T: CeFloat>(x: &[T], want_sum: bool) -> (T, T) {
    const BLOCK: usize = 512;
    let (mut m, mut s, mut sx) = (T::NEG_INF, T::ZERO, T::ZERO);
    for b in x.chunks(BLOCK) {
        let bm = lane_max(b);
        if bm.is_nan() {
            let nan = T::from_f64(f64::NAN);
            return (nan, nan);
        }
        if bm > m {
            s = if m == T::NEG_INF { T::ZERO } else { s * (m - bm).fexp() };
            m = bm;
        }
        if m == T::NEG_INF {
            // Every element so far is -inf: no exponential to add, but the
            // row's sum (for smoothing) still sees them.
            if want_sum {
                sx += b.iter().copied().sum::<T>();
            }
            continue;
        }
        let (e, bx) = lane_sums(b, m, want_sum);
        s += e;
        sx += bx;
    }
    // A +inf logit makes the row's log-softmax NaN in torch (inf - inf), so
    // its loss and every entry of its gradient are NaN here too.
    let lse = if m == T::INF {
        T::from_f64(f64::NAN)
    } else if m == T::NEG_INF {
        m
    } else {
        m + s.ln()
    };
    (lse, sx)
}

/// Per-row (lse, loss) of a contiguous `[rows, v]` block.
fn forward_rows<T: CeFloat>(x: &[T], v: usize, labels: &[Option<usize>], smoothing: f64) -> (Vec<T>, Vec<T>) {
    let eps = T::from_f64(smoothing);
    let inv_v = T::from_f64(1.0 / v as f64);
    let row = |(r, xr): (usize, &[T])| {
        let (lse, sx) = T::lse_row(xr, smoothing > 0.0);
        let loss = match labels[r] {
            None => T::ZERO,
            Some(y) => lse - (T::ONE - eps) * xr[y] - eps * sx * inv_v,
        };
        (lse, loss)
    };
    if x.len() >= crate::cpu::iter::PAR_MIN {
        x.par_chunks(v).enumerate().map(row).unzip()
    } else {
        x.chunks(v).enumerate().map(row).unzip()
    }
}

/// Overwrites a contiguous `[rows, v]` block of logits with the gradient
/// `w_r * (softmax - target)`, row by row; ignored rows become zero.
fn grad_rows_in_place<T: CeFloat>(x: &mut [T], v: usize, lse: &[T], labels: &[Option<usize>], w: &[T], smoothing: f64) {
    let eps_v = T::from_f64(smoothing / v as f64);
    let on = T::from_f64(1.0 - smoothing);
    let row = |(r, xr): (usize, &mut [T])| {
        T::grad_row(xr, GradRow { lse: lse[r], weight: w[r], eps_v, on, label: labels[r] })
    };
    if x.len() >= crate::cpu::iter::PAR_MIN {
        x.par_chunks_mut(v).enumerate().for_each(row);
    } else {
        x.chunks_mut(v).enumerate().for_each(row);
    }
}

/// Per row of a contiguous `[rows, v]` block: its (lse, loss), then the row
/// overwritten by `w * (softmax - target)` while it is still in cache (one
/// row of logits is at most a few hundred KiB, so the second pass over it
/// reads the core's own cache, not memory). Ignored rows become zero.
fn forward_grad_rows<T: CeFloat>(
    x: &mut [T],
    v: usize,
    labels: &[Option<usize>],
    w: T,
    smoothing: f64,
) -> (Vec<T>, Vec<T>) {
    let eps = T::from_f64(smoothing);
    let inv_v = T::from_f64(1.0 / v as f64);
    let eps_v = T::from_f64(smoothing / v as f64);
    let on = T::from_f64(1.0 - smoothing);
    let row = |(r, xr): (usize, &mut [T])| {
        let (lse, sx) = T::lse_row(xr, smoothing > 0.0);
        let loss = match labels[r] {
            None => T::ZERO,
            Some(y) => lse - (T::ONE - eps) * xr[y] - eps * sx * inv_v,
        };
        T::grad_row(xr, GradRow { lse, weight: w, eps_v, on, label: labels[r] });
        (lse, loss)
    };
    if x.len() >= crate::cpu::iter::PAR_MIN {
        x.par_chunks_mut(v).enumerate().map(row).unzip()
    } else {
        x.chunks_mut(v).enumerate().map(row).unzip()
    }
}

/// Per-row gradient weights from the incoming gradient `g`.
fn row_weights(g: &Tensor, labels: &[Option<usize>], reduction: Reduction) -> Result<Vec<f64>> {
    let valid = labels.iter().filter(|l| l.is_some()).count();
    Ok(match reduction {
        Reduction::None => g.to_vec_f64(),
        Reduction::Sum => vec![g.item()?; labels.len()],
        Reduction::Mean => {
            let w = if valid == 0 { 0.0 } else { g.item()? / valid as f64 };
            vec![w; labels.len()]
        }
    })
}

/// Combines per-row losses into the op's output. The sum is accumulated
/// in f64 whatever `T` (summed in f32, a mean over many rows lands a few
/// ulp from the exact value), and from +0.0, so a sum over no rows is +0.0
/// as in torch (`Iterator::sum` starts from -0.0).
fn reduce_losses<T: CeFloat>(loss: Vec<T>, labels: &[Option<usize>], red: Reduction, shape: Shape) -> Result<Tensor> {
    let valid = labels.iter().filter(|l| l.is_some()).count();
    let total = || loss.iter().fold(0.0f64, |a, &l| a + l.to_f64());
    match red {
        Reduction::None => Tensor::from_vec(loss, shape),
        Reduction::Sum => Tensor::from_vec(vec![T::from_f64(total())], ()),
        Reduction::Mean => Tensor::from_vec(vec![T::from_f64(total() / valid as f64)], ()),
    }
}

/// The constant per-row mask (1 for kept rows), scaled for the reduction.
fn row_scale(labels: &[Option<usize>], red: Reduction, shape: Shape, dtype: DType) -> Result<Tensor> {
    let valid = labels.iter().filter(|l| l.is_some()).count();
    let k = if red == Reduction::Mean && valid > 0 { 1.0 / valid as f64 } else { 1.0 };
    let v: Vec<f64> = labels.iter().map(|l| if l.is_some() { k } else { 0.0 }).collect();
    Tensor::from_vec(v, shape)?.cast(dtype)
}

/// Labels with ignored rows replaced by 0, shaped `[..., 1]`, for gathers.
fn safe_index(labels: &[Option<usize>], shape: &Shape) -> Result<Tensor> {
    let mut s = shape.clone();
    s.0.push(1);
    Tensor::from_vec(labels.iter().map(|l| l.unwrap_or(0) as i64).collect::<Vec<_>>(), s)
}

/// The gradient of the loss with respect to the logits, in differentiable
/// ops: `w_r * (softmax(x) - target)`. Used when recording.
fn traced_logits_grad<T: Diff>(x: &T, w_rows: &T, labels: &[Option<usize>], lead: &Shape, eps: f64) -> Result<T> {
    let v = x.shape().dims()[x.rank() - 1];
    let w = w_rows.unsqueeze(-1)?; // [..., 1]
    let p = x.softmax(-1)?.mul(&w)?;
    let idx = safe_index(labels, lead)?;
    let on = w.mul_scalar(-(1.0 - eps))?;
    let g = p.scatter_add(-1, &idx, &on)?;
    if eps > 0.0 {
        g.sub(&w.mul_scalar(eps / v as f64)?)
    } else {
        Ok(g)
    }
}

/// The loss's tangent from a tangent `t` of the logits, in differentiable ops.
fn logits_jvp<T: Diff>(x: &T, t: &T, labels: &[Option<usize>], lead: &Shape, o: &CrossEntropyOptions) -> Result<T> {
    let eps = o.label_smoothing;
    let p = x.softmax(-1)?;
    let idx = safe_index(labels, lead)?;
    let per_row = p
        .mul(t)?
        .sum(&[-1], false)?
        .sub(&t.gather(-1, &idx)?.squeeze(-1)?.mul_scalar(1.0 - eps)?)?
        .sub(&t.mean(&[-1], false)?.mul_scalar(eps)?)?;
    let scale = x.lift(row_scale(labels, o.reduction, lead.clone(), x.dtype())?);
    let scaled = per_row.mul(&scale)?;
    match o.reduction {
        Reduction::None => Ok(scaled),
        _ => scaled.sum_all(),
    }
}

/// Sparse cross-entropy of logits `[..., V]` against integer labels `[...]`.
#[derive(Debug)]
pub struct SparseCrossEntropy {
    /// Class indices (i32 or i64), one per row.
    pub labels: Tensor,
    /// Options.
    pub options: CrossEntropyOptions,
    /// The per-row log-sum-exp, saved by the forward (N floats).
    lse: Mutex<Option<Tensor>>,
}

impl SparseCrossEntropy {
    /// The fused backward: `g * (softmax - onehot)` (with the smoothing
    /// terms) from the logits and the saved lse, written over the logits'
    /// own buffer when `logits` is the last handle on it (a graph hands the
    /// value over when this loss was its last reader), else over a private
    /// copy: the only N x V buffer of the backward either way.
    fn fused_grad(&self, logits: Tensor, g: &Tensor) -> Result<Tensor> {
        let (_, v) = self.split(logits.shape())?;
        let labels = check_labels(self.name(), &self.labels, self.options.ignore_index, v)?;
        let (dtype, cd) = (logits.dtype(), compute_dtype(self.name(), &logits)?);
        let lse = match saved(&self.lse) {
            Some(l) => l,
            None => {
                self.forward_cpu(&[&logits])?;
                saved(&self.lse).expect("internal: forward saves lse")
            }
        };
        let w = row_weights(g, &labels, self.options.reduction)?;
        let mut grad = logits.cast_raw(cd)?.contiguous()?;
        drop(logits);
        macro_rules! run {
            ($T:ty) => {{
                let l = lse.as_slice::<$T>().expect("internal: lse contiguous").to_vec();
                let w: Vec<$T> = w.iter().map(|&v| v as $T).collect();
                let buf = grad.make_mut::<$T>()?;
                if v > 0 {
                    grad_rows_in_place::<$T>(buf, v, &l, &labels, &w, self.options.label_smoothing);
                }
            }};
        }
        if cd == DType::F64 {
            run!(f64)
        } else {
            run!(f32)
        }
        grad.cast_raw(dtype)
    }

    fn split(&self, x_shape: &Shape) -> Result<(Shape, usize)> {
        let d = x_shape.dims();
        let v = *d.last().ok_or_else(|| Error::InvalidShape {
            op: "sparse_cross_entropy",
            shape: x_shape.clone(),
            reason: "logits need a class axis".into(),
        })?;
        let lead = Shape::from(&d[..d.len() - 1]);
        if self.labels.shape() != &lead {
            return Err(Error::ShapeMismatch {
                op: "sparse_cross_entropy",
                lhs: x_shape.clone(),
                rhs: self.labels.shape().clone(),
            });
        }
        Ok((lead, v))
    }
}

fn compute_dtype(op: &'static str, x: &Tensor) -> Result<DType> {
    match x.dtype() {
        DType::F64 => Ok(DType::F64),
        DType::F32 | DType::F16 | DType::BF16 => Ok(DType::F32),
        dtype => Err(Error::UnsupportedDType { op, dtype, expected: "float logits" }),
    }
}

impl Op for SparseCrossEntropy {
    fn name(&self) -> &'static str {
        "sparse_cross_entropy"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }

    fn operands(&self) -> smallvec::SmallVec<[&Tensor; 2]> {
        smallvec::smallvec![&self.labels]
    }

    fn saves(&self) -> Saved {
        Saved::input(0)
    }

    fn release(&self) {
        *lock(&self.lse) = None;
    }

    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0];
        let (lead, v) = self.split(x.shape())?;
        check_options(self.name(), &self.options)?;
        let labels = check_labels(self.name(), &self.labels, self.options.ignore_index, v)?;
        let cd = compute_dtype(self.name(), x)?;
        let xc = x.cast_raw(cd)?.contiguous()?;
        macro_rules! run {
            ($T:ty) => {{
                let data = xc.as_slice::<$T>().expect("internal: contiguous");
                let (lse, loss) = if v == 0 {
                    (vec![], vec![])
                } else {
                    forward_rows::<$T>(data, v, &labels, self.options.label_smoothing)
                };
                *lock(&self.lse) = Some(Tensor::from_vec(lse, lead.clone())?);
                reduce_losses::<$T>(loss, &labels, self.options.reduction, lead.clone())?
            }};
        }
        let out = if cd == DType::F64 { run!(f64) } else { run!(f32) };
        out.cast_raw(x.dtype())
    }

    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let x = xs[0];
        let (lead, v) = self.split(&x.shape())?;
        let labels = check_labels(self.name(), &self.labels, self.options.ignore_index, v)?;
        let scale = x.lift(row_scale(&labels, self.options.reduction, lead.clone(), x.dtype())?);
        let w_rows = g.mul(&scale)?;
        Ok(one(traced_logits_grad(x, &w_rows, &labels, &lead, self.options.label_smoothing)?))
    }

    /// The fused kernel: `softmax - target` from the logits and the saved
    /// log-sum-exp, written over the logits when this rule is their last
    /// reader.
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, _: Tensor, g: Tensor) -> Result<InputGrads<Tensor>> {
        let x = xs.into_iter().next().ok_or_else(|| Error::invalid_arg(self.name(), "no logits"))?;
        Ok(one(self.fused_grad(x, &g)?))
    }

    fn jvp<T: Diff>(&self, xs: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        let Some(t) = ts[0] else { return Ok(None) };
        let x = xs[0];
        let (lead, v) = self.split(&x.shape())?;
        let labels = check_labels(self.name(), &self.labels, self.options.ignore_index, v)?;
        logits_jvp(x, t, &labels, &lead, &self.options).map(Some)
    }
}

/// The fused classifier head `cross_entropy(hidden @ weight^T + bias)`,
/// processed in chunks of rows so the `[N, V]` logits never exist at once.
///
/// The forward computes one chunk of logits at a time and keeps only the
/// per-row log-sum-exp (N floats). The first-order gradient is made in one
/// of two ways:
///
/// - **In the forward**, when the op is recorded on a graph and the
///   reduction is sum or mean (so the upstream gradient is one scalar):
///   each row of a chunk is turned into its gradient `softmax - target`
///   (smoothing terms included, ignored rows zero) right after its
///   log-sum-exp, while it is still in cache, and the chunk is pushed into
///   `d_hidden`, `d_weight` and `d_bias` for a unit upstream gradient. The
///   op keeps these; a backward takes them out and only scales them by the
///   upstream scalar. That is three `N x V x D` products in all, as many as
///   `linear` followed by a cross-entropy and its backward. Because the
///   backward takes them, a pass without `retain_graph` leaves nothing
///   behind in the op but the log-sum-exp; a second pass recomputes.
/// - **In the backward**, otherwise (reduction none, eager calls on plain
///   tensors, a second backward): each chunk's logits are recomputed from
///   the inputs, turned into the gradient in place from the saved
///   log-sum-exp, and accumulated: four products.
///
/// Under `create_graph` the rule is a differentiable formulation (`linear`
/// and the cross-entropy's gradient in differentiable ops), which records
/// the `[N, V]` logits on the graph; the precomputed gradients, which could
/// not be differentiated again, are dropped then.
///
/// **Memory.** Above its inputs and output, the op's peak is at most one
/// chunk of logits (`chunk x V` elements) plus the gradients of its inputs
/// (`N x D + V x D`, `+ V` with a bias) plus `O(N)` (the log-sum-exp and
/// per-row losses), all in the compute dtype (f32 for f16/bf16 inputs,
/// whose f32 copies are also made). Precomputed gradients are the
/// gradients of the inputs, made earlier: a recorded forward with a sum or
/// mean reaches that whole bound by itself, and the backward adds nothing
/// when the upstream gradient is a plain scalar.
#[derive(Debug)]
pub struct LinearCrossEntropy {
    /// Class indices (i32 or i64), one per row of `hidden`.
    pub labels: Tensor,
    /// Options.
    pub options: CrossEntropyOptions,
    /// Rows per chunk; `None` picks one automatically.
    pub chunk: Option<usize>,
    /// Whether the forward also makes the gradients (see above).
    precompute: bool,
    lse: Mutex<Option<Tensor>>,
    /// `[d_hidden, d_weight, d_bias?]` for a unit upstream gradient, in the
    /// compute dtype, from the forward until a backward takes them.
    grads: Mutex<Option<Vec<Tensor>>>,
}

/// The automatic chunk: rows whose logits take about 32 MiB, or as many
/// bytes as `hidden`'s gradient will take anyway if that is more.
pub fn auto_chunk(n: usize, d: usize, v: usize) -> usize {
    let budget = (32usize << 20).max(n * d * 4);
    (budget / (v.max(1) * 4)).clamp(1, n.max(1))
}

/// `d_hidden`, `d_weight` and `d_bias`, filled chunk by chunk.
struct HeadGrads {
    dh: Tensor,
    dw: Tensor,
    db: Option<Tensor>,
}

impl HeadGrads {
    fn zeros(n: usize, d: usize, v: usize, bias: bool, dtype: DType) -> Result<Self> {
        Ok(HeadGrads {
            dh: Tensor::zeros([n, d], dtype)?,
            dw: Tensor::zeros([v, d], dtype)?,
            db: bias.then(|| Tensor::zeros([v], dtype)).transpose()?,
        })
    }

    /// The three buffers, writable at once.
    #[allow(clippy::type_complexity)]
    fn slices<T: CeFloat>(&mut self) -> Result<(&mut [T], &mut [T], Option<&mut [T]>)> {
        let db = match self.db.as_mut() {
            Some(t) => Some(t.make_mut::<T>()?),
            None => None,
        };
        Ok((self.dh.make_mut::<T>()?, self.dw.make_mut::<T>()?, db))
    }

    fn into_vec(self) -> Vec<Tensor> {
        let mut out = vec![self.dh, self.dw];
        out.extend(self.db);
        out
    }
}

/// The logits' gradient of each row for a unit upstream gradient of a sum
/// or mean: 1, or one over the number of kept rows (0 when none is kept).
fn unit_weight(labels: &[Option<usize>], reduction: Reduction) -> f64 {
    let valid = labels.iter().filter(|l| l.is_some()).count();
    match reduction {
        Reduction::Mean if valid == 0 => 0.0,
        Reduction::Mean => 1.0 / valid as f64,
        Reduction::None | Reduction::Sum => 1.0,
    }
}

/// Multiplies a gradient by the upstream scalar, in place (the tensor was
/// taken from the op, so nothing else shares it).
fn scale_in_place(mut t: Tensor, s: f64) -> Result<Tensor> {
    fn run<T: CeFloat>(t: &mut Tensor, s: T) -> Result<()> {
        let x = t.make_mut::<T>()?;
        if x.len() >= crate::cpu::iter::PAR_MIN {
            x.par_chunks_mut(1 << 14).for_each(|c| c.iter_mut().for_each(|e| *e *= s));
        } else {
            x.iter_mut().for_each(|e| *e *= s);
        }
        Ok(())
    }
    if s != 1.0 {
        match t.dtype() {
            DType::F64 => run::<f64>(&mut t, s)?,
            _ => run::<f32>(&mut t, s as f32)?,
        }
    }
    Ok(t)
}

impl LinearCrossEntropy {
    fn check(&self, xs: &[&Tensor]) -> Result<(usize, usize, usize, Vec<Option<usize>>)> {
        let (h, w) = (xs[0], xs[1]);
        let op = "linear_cross_entropy";
        if h.rank() != 2 || w.rank() != 2 || h.dims()[1] != w.dims()[1] {
            return Err(Error::ShapeMismatch { op, lhs: h.shape().clone(), rhs: w.shape().clone() });
        }
        let (n, d, v) = (h.dims()[0], h.dims()[1], w.dims()[0]);
        if let Some(b) = xs.get(2) {
            if b.dims() != [v] {
                return Err(Error::ShapeMismatch { op, lhs: w.shape().clone(), rhs: b.shape().clone() });
            }
        }
        if self.labels.dims() != [n] {
            return Err(Error::ShapeMismatch { op, lhs: h.shape().clone(), rhs: self.labels.shape().clone() });
        }
        for t in &xs[1..] {
            if t.dtype() != h.dtype() {
                return Err(Error::DTypeMismatch { op, lhs: h.dtype(), rhs: t.dtype() });
            }
        }
        if self.chunk == Some(0) {
            return Err(Error::invalid_arg(op, "chunk must be at least 1"));
        }
        check_options(op, &self.options)?;
        Ok((n, d, v, check_labels(op, &self.labels, self.options.ignore_index, v)?))
    }

    fn chunk_rows(&self, n: usize, d: usize, v: usize) -> usize {
        self.chunk.unwrap_or_else(|| auto_chunk(n, d, v)).min(n.max(1))
    }

    /// Takes the precomputed gradients out of the op (`None` when the
    /// forward made none or a backward already took them).
    fn take_grads(&self) -> Option<Vec<Tensor>> {
        lock(&self.grads).take()
    }

    /// Logits of rows `r0..r0+c` into `buf` (`c x v`), bias included.
    #[allow(clippy::too_many_arguments)]
    fn chunk_logits<T: CeFloat>(
        buf: &mut [T],
        h: &[T],
        w: &[T],
        b: Option<&[T]>,
        r0: usize,
        c: usize,
        d: usize,
        v: usize,
    ) {
        gemm_into(
            buf,
            c,
            v,
            d,
            MatRef { data: &h[r0 * d..(r0 + c) * d], rs: d, cs: 1 },
            MatRef { data: w, rs: 1, cs: d },
            false,
        );
        if let Some(b) = b {
            for row in buf[..c * v].chunks_mut(v) {
                for (e, &bb) in row.iter_mut().zip(b) {
                    *e += bb;
                }
            }
        }
    }

    /// Pushes the logits' gradient `g` (`c x v`) of rows `r0..r0+c` into
    /// those rows of `d_hidden` (`g @ w`), into `d_weight` (`+= g^T @ h`)
    /// and into `d_bias` (`+=` column sums of `g`).
    #[allow(clippy::too_many_arguments)]
    fn backprop_chunk<T: CeFloat>(
        g: &[T],
        h: &[T],
        w: &[T],
        r0: usize,
        c: usize,
        d: usize,
        v: usize,
        (dh, dw, db): (&mut [T], &mut [T], Option<&mut [T]>),
    ) {
        gemm_into(
            &mut dh[r0 * d..(r0 + c) * d],
            c,
            d,
            v,
            MatRef { data: g, rs: v, cs: 1 },
            MatRef { data: w, rs: d, cs: 1 },
            false,
        );
        gemm_into(
            dw,
            v,
            d,
            c,
            MatRef { data: g, rs: 1, cs: v },
            MatRef { data: &h[r0 * d..(r0 + c) * d], rs: d, cs: 1 },
            true,
        );
        if let Some(db) = db {
            // Column blocks in parallel, each summing down the chunk's rows.
            const COLS: usize = 2048;
            db.par_chunks_mut(COLS).enumerate().for_each(|(j, acc)| {
                for row in g.chunks(v) {
                    for (a, &e) in acc.iter_mut().zip(&row[j * COLS..]) {
                        *a += e;
                    }
                }
            });
        }
    }

    /// The chunked forward. With `precompute`, each chunk's gradient is
    /// made too and the op keeps `[d_hidden, d_weight, d_bias?]`.
    #[allow(clippy::too_many_arguments)]
    fn run_forward<T: CeFloat>(
        &self,
        xs: &[Tensor],
        n: usize,
        d: usize,
        v: usize,
        labels: &[Option<usize>],
        precompute: bool,
    ) -> Result<Tensor> {
        let chunk = self.chunk_rows(n, d, v);
        let smoothing = self.options.label_smoothing;
        let (h, w) = (xs[0].as_slice::<T>().expect("contiguous"), xs[1].as_slice::<T>().expect("contiguous"));
        let b = xs.get(2).map(|b| b.as_slice::<T>().expect("contiguous"));
        let mut lse = Vec::with_capacity(n);
        let mut loss = Vec::with_capacity(n);
        let mut grads = precompute.then(|| HeadGrads::zeros(n, d, v, b.is_some(), T::DTYPE)).transpose()?;
        let unit = T::from_f64(unit_weight(labels, self.options.reduction));
        let mut buf_t = Tensor::zeros([chunk, v], T::DTYPE)?;
        {
            let buf = buf_t.make_mut::<T>()?;
            let mut acc = match grads.as_mut() {
                Some(g) => Some(g.slices::<T>()?),
                None => None,
            };
            let mut r0 = 0;
            while r0 < n {
                let c = chunk.min(n - r0);
                let rows = &labels[r0..r0 + c];
                Self::chunk_logits(buf, h, w, b, r0, c, d, v);
                let g = &mut buf[..c * v];
                let (l, s) = match acc.as_mut() {
                    None => forward_rows::<T>(g, v, rows, smoothing),
                    Some((dh, dw, db)) => {
                        let ls = forward_grad_rows::<T>(g, v, rows, unit, smoothing);
                        Self::backprop_chunk(g, h, w, r0, c, d, v, (dh, dw, db.as_deref_mut()));
                        ls
                    }
                };
                lse.extend(l);
                loss.extend(s);
                r0 += c;
            }
        }
        drop(buf_t);
        *lock(&self.lse) = Some(Tensor::from_vec(lse, [n])?);
        if let Some(g) = grads {
            *lock(&self.grads) = Some(g.into_vec());
        }
        reduce_losses::<T>(loss, labels, self.options.reduction, Shape::from([n]))
    }

    /// The recomputing backward: each chunk's logits again, turned into the
    /// gradient in place with the per-row weights, then accumulated.
    #[allow(clippy::too_many_arguments)]
    fn run_backward<T: CeFloat>(
        &self,
        xs: &[Tensor],
        n: usize,
        d: usize,
        v: usize,
        labels: &[Option<usize>],
        weights: &[f64],
    ) -> Result<Vec<Tensor>> {
        let chunk = self.chunk_rows(n, d, v);
        let (h, w) = (xs[0].as_slice::<T>().expect("contiguous"), xs[1].as_slice::<T>().expect("contiguous"));
        let b = xs.get(2).map(|b| b.as_slice::<T>().expect("contiguous"));
        let lse_t = match saved(&self.lse) {
            Some(l) => l,
            None => {
                self.run_forward::<T>(xs, n, d, v, labels, false)?;
                saved(&self.lse).expect("internal: forward saves lse")
            }
        };
        let lse = lse_t.as_slice::<T>().expect("contiguous");
        let wts: Vec<T> = weights.iter().map(|&x| T::from_f64(x)).collect();
        let mut grads = HeadGrads::zeros(n, d, v, b.is_some(), T::DTYPE)?;
        let mut buf_t = Tensor::zeros([chunk, v], T::DTYPE)?;
        {
            let (dh, dw, mut db) = grads.slices::<T>()?;
            let buf = buf_t.make_mut::<T>()?;
            let mut r0 = 0;
            while r0 < n {
                let c = chunk.min(n - r0);
                Self::chunk_logits(buf, h, w, b, r0, c, d, v);
                let g = &mut buf[..c * v];
                grad_rows_in_place::<T>(
                    g,
                    v,
                    &lse[r0..r0 + c],
                    &labels[r0..r0 + c],
                    &wts[r0..r0 + c],
                    self.options.label_smoothing,
                );
                Self::backprop_chunk(g, h, w, r0, c, d, v, (&mut *dh, &mut *dw, db.as_deref_mut()));
                r0 += c;
            }
        }
        drop(buf_t);
        Ok(grads.into_vec())
    }
}

impl Op for LinearCrossEntropy {
    fn name(&self) -> &'static str {
        "linear_cross_entropy"
    }
    fn arity(&self) -> Arity {
        Arity::between(2, 3)
    }

    fn operands(&self) -> smallvec::SmallVec<[&Tensor; 2]> {
        smallvec::smallvec![&self.labels]
    }

    fn saves(&self) -> Saved {
        Saved::INPUTS
    }

    fn release(&self) {
        *lock(&self.lse) = None;
        *lock(&self.grads) = None;
    }

    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let (n, d, v, labels) = self.check(xs)?;
        let cd = compute_dtype(self.name(), xs[0])?;
        let ins: Vec<Tensor> = xs.iter().map(|t| t.cast_raw(cd)?.contiguous()).collect::<Result<_>>()?;
        let pre = self.precompute && self.options.reduction != Reduction::None;
        let out = if cd == DType::F64 {
            self.run_forward::<f64>(&ins, n, d, v, &labels, pre)?
        } else {
            self.run_forward::<f32>(&ins, n, d, v, &labels, pre)?
        };
        out.cast_raw(xs[0].dtype())
    }

    /// The differentiable formulation (`linear`, then the cross-entropy's
    /// gradient in differentiable ops), which records the `[N, V]` logits.
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let (h, w) = (xs[0], xs[1]);
        // The precomputed gradients are constants to a recorded rule; free
        // them rather than hold them to the end of the scope.
        drop(self.take_grads());
        let n = h.shape().dims()[0];
        let v = w.shape().dims()[0];
        let labels = check_labels(self.name(), &self.labels, self.options.ignore_index, v)?;
        let lead = Shape::from([n]);
        let logits = h.linear(w, xs.get(2).copied())?;
        let scale = h.lift(row_scale(&labels, self.options.reduction, lead.clone(), h.dtype())?);
        let gl = traced_logits_grad(&logits, &g.mul(&scale)?, &labels, &lead, self.options.label_smoothing)?;
        let mut out: InputGrads<T> = smallvec::smallvec![Some(gl.matmul(w)?), Some(gl.t()?.matmul(h)?)];
        if xs.len() > 2 {
            out.push(Some(gl.sum(&[0], false)?));
        }
        Ok(out)
    }

    /// The chunked kernel: the forward's precomputed gradients scaled by
    /// the upstream scalar, or each chunk's logits recomputed and turned
    /// into its gradient in place.
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, _: Tensor, g: Tensor) -> Result<InputGrads<Tensor>> {
        let dt = xs[0].dtype();
        if let Some(grads) = self.take_grads() {
            // Made by the forward for a unit upstream gradient of a sum or
            // mean; `g` is that scalar.
            let s = g.item()?;
            return grads.into_iter().map(|t| Ok(Some(scale_in_place(t, s)?.cast_raw(dt)?))).collect();
        }
        let refs: Vec<&Tensor> = xs.iter().collect();
        let (n, d, v, labels) = self.check(&refs)?;
        let cd = compute_dtype(self.name(), &xs[0])?;
        let ins: Vec<Tensor> = xs.iter().map(|t| t.cast_raw(cd)?.contiguous()).collect::<Result<_>>()?;
        let weights = row_weights(&g, &labels, self.options.reduction)?;
        let grads = if cd == DType::F64 {
            self.run_backward::<f64>(&ins, n, d, v, &labels, &weights)?
        } else {
            self.run_backward::<f32>(&ins, n, d, v, &labels, &weights)?
        };
        grads.into_iter().map(|t| Ok(Some(t.cast_raw(dt)?))).collect()
    }

    fn jvp<T: Diff>(&self, xs: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        if ts.iter().all(|t| t.is_none()) {
            return Ok(None);
        }
        let (h, w) = (xs[0], xs[1]);
        let n = h.shape().dims()[0];
        let v = w.shape().dims()[0];
        let labels = check_labels(self.name(), &self.labels, self.options.ignore_index, v)?;
        let logits = h.linear(w, xs.get(2).copied())?;
        let mut t: Option<T> = None;
        let mut add = |x: T| -> Result<()> {
            t = Some(match t.take() {
                Some(a) => a.add(&x)?,
                None => x,
            });
            Ok(())
        };
        if let Some(th) = ts[0] {
            add(th.matmul(&w.t()?)?)?;
        }
        if let Some(tw) = ts[1] {
            add(h.matmul(&tw.t()?)?)?;
        }
        if let Some(Some(tb)) = ts.get(2) {
            add(tb.broadcast_to([n, v])?)?;
        }
        let t = t.expect("internal: some tangent");
        logits_jvp(&logits, &t, &labels, &Shape::from([n]), &self.options).map(Some)
    }
}

/// This family's ops, each once (see [`crate::ops::registry`]).
pub(crate) fn family() -> Vec<Box<dyn crate::ops::DynOp>> {
    let labels = || Tensor::scalar_of(0.0, DType::I64);
    let options = CrossEntropyOptions::default();
    vec![
        Box::new(SparseCrossEntropy { labels: labels(), options, lse: Mutex::new(None) }),
        Box::new(LinearCrossEntropy {
            labels: labels(),
            options,
            chunk: None,
            precompute: false,
            lse: Mutex::new(None),
            grads: Mutex::new(None),
        }),
    ]
}

/// Cross-entropy losses, on tensors and graph handles alike.
pub trait CrossEntropyOps: Diff {
    /// Cross-entropy of logits `[..., V]` against integer `labels` `[...]`
    /// (i32 or i64), with torch's defaults (mean, ignore_index -100). Never
    /// builds a one-hot: the forward saves only a per-row log-sum-exp.
    fn sparse_cross_entropy(&self, labels: &Tensor) -> Result<Self> {
        self.sparse_cross_entropy_with(labels, CrossEntropyOptions::default())
    }
    /// [`CrossEntropyOps::sparse_cross_entropy`] with options.
    fn sparse_cross_entropy_with(&self, labels: &Tensor, options: CrossEntropyOptions) -> Result<Self> {
        Self::apply(SparseCrossEntropy { labels: labels.clone(), options, lse: Mutex::new(None) }, &[self])
    }
    /// Cross-entropy of `self @ weight^T + bias` (`self` is `[N, D]`,
    /// `weight` `[V, D]`) against `labels` `[N]`, computed in chunks of rows
    /// so the `[N, V]` logits never exist. `chunk` overrides the automatic
    /// rows-per-chunk.
    ///
    /// On graph handles with a sum or mean, the forward also makes the
    /// gradients of `self`, `weight` and `bias` (while each chunk of logits
    /// is in cache) and the backward only scales them: see
    /// [`LinearCrossEntropy`] for the two paths and the memory bound.
    fn linear_cross_entropy(
        &self,
        weight: &Self,
        bias: Option<&Self>,
        labels: &Tensor,
        options: CrossEntropyOptions,
        chunk: Option<usize>,
    ) -> Result<Self> {
        let op = LinearCrossEntropy {
            labels: labels.clone(),
            options,
            chunk,
            // Recorded with a scalar output and an input gradients flow to:
            // a backward will most likely follow, and it then needs no
            // second pass over the logits.
            precompute: (self.requires_grad() || weight.requires_grad() || bias.is_some_and(|b| b.requires_grad()))
                && options.reduction != Reduction::None,
            lse: Mutex::new(None),
            grads: Mutex::new(None),
        };
        match bias {
            Some(b) => Self::apply(op, &[self, weight, b]),
            None => Self::apply(op, &[self, weight]),
        }
    }
}

impl<T: Diff> CrossEntropyOps for T {}
