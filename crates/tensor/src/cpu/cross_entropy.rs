//! The CPU kernels of the cross-entropy losses
//! ([`crate::backend::cross_entropy`]'s `CrossEntropyKernels`).
//!
//! A row's log-sum-exp comes from the row kernels of `cpu::rows` (one pass
//! over memory: block by block, its maximum and the rescaled sum of the
//! shifted exponentials; and the row's sum when label smoothing needs it),
//! and the gradient `w * (softmax - target)` is one more pass, reading each
//! logit once and writing its gradient (over the logits when nothing else
//! holds them), a loop compiled for the processor's vector instructions
//! through [`crate::cpu::simd`]. Two reads and one write of the `N x V`
//! block in all, the floor for a forward that keeps no `N x V` state. Rows are
//! split over the pool; each row's result does not depend on the split or
//! on the instruction set. The fused linear head runs the same rows over
//! one chunk of logits at a time, made and consumed by matrix products.

use super::iter::{map1, nd1};
use super::shape::{cast, copy};
use super::{host, CpuBackend};
use crate::backend::cross_entropy::{
    label_row, CeForward, CrossEntropyKernels, HeadPlan, Logits, Reduction, SparsePlan,
};
use crate::backend::Src;
use crate::cpu::iter::{fill_vec, SPLIT_MIN};
use crate::cpu::math::exp_f32;
use crate::cpu::matmul::{gemm_into, MatRef};
use crate::cpu::pool::{self, Disjoint};
use crate::cpu::reduce::add_rows;
use crate::cpu::rows::RowKernels;
use crate::cpu::simd::{self, Isa};
use crate::storage::{CpuElement, Storage};
use crate::{with_dtype, DType, Element, Result, Shape, Tensor};

/// The float types the kernels run in (f16 and bf16 run through f32).
pub(crate) trait CeFloat: RowKernels + CpuElement {
    /// An exponential that vectorises inside a [`simd::run`] body.
    fn fexp(self) -> Self;
}

impl CeFloat for f32 {
    #[inline(always)]
    fn fexp(self) -> Self {
        exp_f32(self)
    }
}

impl CeFloat for f64 {
    #[inline(always)]
    fn fexp(self) -> Self {
        self.exp()
    }
}

/// A row's log-sum-exp and, when `want_sum`, the sum of the row. A row
/// holding a NaN has a NaN lse, and so does a row holding +inf: torch's
/// log-softmax of it is NaN (inf - inf), so its loss and every entry of its
/// gradient are NaN too. A row of -inf only has an lse of -inf.
#[inline]
fn row_stats<T: CeFloat>(xr: &[T], want_sum: bool) -> (T, T) {
    let lse = T::row_lse(xr);
    let lse = if lse == T::INF { T::from_f64(f64::NAN) } else { lse };
    (lse, if want_sum { T::row_sum(xr) } else { T::ZERO })
}

/// The label-smoothing constants of rows of `v` classes.
#[derive(Clone, Copy)]
struct Smoothing<T> {
    /// Whether any mass is spread (the row sums are needed).
    on: bool,
    /// The smoothing mass `eps`.
    eps: T,
    /// `1 / v`.
    inv_v: T,
    /// `eps / v`, the target of every class.
    eps_v: T,
    /// `1 - eps`, the extra target of the label.
    label: T,
}

impl<T: CeFloat> Smoothing<T> {
    fn new(smoothing: f64, v: usize) -> Self {
        Smoothing {
            on: smoothing > 0.0,
            eps: T::from_f64(smoothing),
            inv_v: T::from_f64(1.0 / v as f64),
            eps_v: T::from_f64(smoothing / v as f64),
            label: T::from_f64(1.0 - smoothing),
        }
    }

    /// The loss of a row from its lse and sum; zero for an ignored row.
    #[inline]
    fn loss(&self, xr: &[T], label: Option<usize>, lse: T, sx: T) -> T {
        match label {
            None => T::ZERO,
            Some(y) => lse - (T::ONE - self.eps) * xr[y] - self.eps * sx * self.inv_v,
        }
    }
}

/// Overwrites one row of logits with `weight * (softmax - target)` (zero
/// for an ignored row).
#[inline]
fn grad_row<T: CeFloat>(xr: &mut [T], lse: T, weight: T, s: &Smoothing<T>, label: Option<usize>) {
    grad_row_on(simd::isa(), xr, lse, weight, s, label)
}

/// [`grad_row`] on the compiled copy for `isa` (the tests compare them).
#[inline]
fn grad_row_on<T: CeFloat>(isa: Isa, xr: &mut [T], lse: T, weight: T, s: &Smoothing<T>, label: Option<usize>) {
    match label {
        None => xr.iter_mut().for_each(|e| *e = T::ZERO),
        Some(y) => {
            simd::run_on(
                isa,
                #[inline(always)]
                || {
                    for e in xr.iter_mut() {
                        *e = weight * ((*e - lse).fexp() - s.eps_v);
                    }
                },
            );
            xr[y] = xr[y] - weight * s.label;
        }
    }
}

/// Runs `row(r, row_r)` over the `rows` rows of a contiguous `[rows, v]`
/// block, split over the pool when the block is large, and returns the
/// results in row order (`init` fills the vector first).
fn each_row<T: CeFloat, O: Copy + Send>(
    x: &mut [T],
    rows: usize,
    v: usize,
    init: O,
    row: impl Fn(usize, &mut [T]) -> O + Sync,
) -> Vec<O> {
    let mut out = vec![init; rows];
    let (xs, os) = (Disjoint::new(x), Disjoint::new(&mut out));
    pool::ranges(rows, SPLIT_MIN.div_ceil(v.max(1)), &|r| {
        // SAFETY: the row ranges are disjoint, and so are their rows of `x`.
        let (xr, o) = unsafe { (xs.slice(r.start * v, r.len() * v), os.slice(r.start, r.len())) };
        for (i, o) in o.iter_mut().enumerate() {
            *o = row(r.start + i, &mut xr[i * v..(i + 1) * v]);
        }
    });
    out
}

/// Per-row (lse, loss) of a contiguous `[labels.len(), v]` block.
fn forward_rows<T: CeFloat>(x: &[T], v: usize, labels: &[Option<usize>], smoothing: f64) -> (Vec<T>, Vec<T>) {
    let s = Smoothing::<T>::new(smoothing, v);
    let rows = labels.len();
    let (mut lse, mut loss) = (vec![T::ZERO; rows], vec![T::ZERO; rows]);
    let (ls, lo) = (Disjoint::new(&mut lse), Disjoint::new(&mut loss));
    pool::ranges(rows, SPLIT_MIN.div_ceil(v.max(1)), &|r| {
        // SAFETY: the row ranges are disjoint.
        let (ls, lo) = unsafe { (ls.slice(r.start, r.len()), lo.slice(r.start, r.len())) };
        for (i, (ls, lo)) in ls.iter_mut().zip(lo).enumerate() {
            let row = r.start + i;
            let xr = &x[row * v..(row + 1) * v];
            let (l, sx) = row_stats(xr, s.on);
            *ls = l;
            *lo = s.loss(xr, labels[row], l, sx);
        }
    });
    (lse, loss)
}

/// Overwrites a contiguous `[labels.len(), v]` block of logits with the gradient
/// `w_r * (softmax - target)`, row by row; ignored rows become zero.
fn grad_rows_in_place<T: CeFloat>(x: &mut [T], v: usize, lse: &[T], labels: &[Option<usize>], w: &[T], smoothing: f64) {
    let s = Smoothing::<T>::new(smoothing, v);
    each_row(x, labels.len(), v, (), |r, xr| grad_row(xr, lse[r], w[r], &s, labels[r]));
}

/// Per row of a contiguous `[labels.len(), v]` block: its (lse, loss), then the row
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
    let s = Smoothing::<T>::new(smoothing, v);
    each_row(x, labels.len(), v, (T::ZERO, T::ZERO), |r, xr| {
        let (lse, sx) = row_stats(xr, s.on);
        let loss = s.loss(xr, labels[r], lse, sx);
        grad_row(xr, lse, w, &s, labels[r]);
        (lse, loss)
    })
    .into_iter()
    .unzip()
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

/// A fresh tensor's storage (nothing else holds a tensor a kernel made).
fn storage(t: Tensor) -> Storage {
    t.into_sole_storage().unwrap_or_else(|_| panic!("internal: a kernel's own tensor is shared"))
}

/// A fresh tensor converted to `dtype`, as a storage (itself when it has
/// the dtype already).
fn cast_into(t: Tensor, dtype: DType) -> Result<Storage> {
    let out = t.cast_raw(dtype)?;
    drop(t);
    Ok(storage(out))
}

/// An operand as a dense slice of `T`: the operand's own elements when it
/// is contiguous in `T`, else a counted copy converted to `T`.
enum Dense<'a> {
    Borrowed(Src<'a>),
    Owned(Storage),
}

impl<'a> Dense<'a> {
    fn of(x: Src<'a>, dtype: DType) -> Result<Self> {
        if x.dtype() == dtype && x.is_contiguous() {
            return Ok(Dense::Borrowed(x));
        }
        Ok(Dense::Owned(Storage::cpu(cast(x, dtype)?)))
    }

    fn slice<T: CpuElement>(&self) -> &[T] {
        match self {
            Dense::Borrowed(x) => &host::<T>(*x)[x.layout.offset..x.layout.offset + x.numel()],
            Dense::Owned(s) => T::slice(s.host().expect("internal: host storage")).expect("internal: dtype"),
        }
    }
}

/// The elements of a host operand as f64, in row-major order.
fn values_f64(x: Src<'_>) -> Result<Vec<f64>> {
    with_dtype!(x.dtype(), T => map1(host::<T>(x), &nd1(x.layout), |v: T| v.to_f64()))
}

/// The labels (i32 or i64, the op checked) as rows' classes, by the label
/// rule of [`label_row`]: the lowest bad row is the error.
pub(crate) fn host_labels(
    op: &'static str,
    labels: Src<'_>,
    ignore: i64,
    classes: usize,
) -> Result<Vec<Option<usize>>> {
    let raw: Vec<i64> =
        with_dtype!(labels.dtype(), T => map1(host::<T>(labels), &nd1(labels.layout), |v: T| v.to_f64() as i64))?;
    raw.iter().enumerate().map(|(row, &l)| label_row(op, row, l, ignore, classes)).collect()
}

/// Per-row gradient weights from the incoming gradient `g` (per row for
/// [`Reduction::None`], else a scalar), a mean's divided by `valid`.
fn row_weights(g: Src<'_>, rows: usize, valid: usize, reduction: Reduction) -> Result<Vec<f64>> {
    let g = values_f64(g)?;
    let item = || g.first().copied().ok_or_else(|| crate::Error::invalid_arg("cross_entropy", "no upstream gradient"));
    Ok(match reduction {
        Reduction::None => g,
        Reduction::Sum => vec![item()?; rows],
        Reduction::Mean => {
            let w = if valid == 0 { 0.0 } else { item()? / valid as f64 };
            vec![w; rows]
        }
    })
}

impl CrossEntropyKernels for CpuBackend {
    fn sparse_ce(&self, plan: &SparsePlan, x: Src<'_>, labels: Src<'_>) -> Result<CeForward> {
        let o = &plan.options;
        let labels = host_labels(plan.op, labels, o.ignore_index, plan.v)?;
        let (lse, loss) = sparse_forward(plan, x, &labels)?;
        let valid = labels.iter().filter(|l| l.is_some()).count();
        Ok(CeForward { loss: storage(loss), lse: storage(lse), valid, grads: None })
    }

    fn sparse_ce_grad(
        &self,
        plan: &SparsePlan,
        logits: Logits<'_>,
        (lse, valid): (Src<'_>, usize),
        labels: Src<'_>,
        g: Src<'_>,
    ) -> Result<Storage> {
        let o = &plan.options;
        let labels = host_labels(plan.op, labels, o.ignore_index, plan.v)?;
        let w = row_weights(g, labels.len(), valid, o.reduction)?;
        sparse_grad(plan, logits, lse, &labels, &w).map(storage)
    }

    fn linear_ce(&self, plan: &HeadPlan, ins: &[Src<'_>], labels: Src<'_>, precompute: bool) -> Result<CeForward> {
        let o = &plan.options;
        let labels = host_labels(plan.op, labels, o.ignore_index, plan.v)?;
        let (loss, lse, grads) = linear_forward(&head(plan, &labels), ins, plan.compute, precompute)?;
        let valid = labels.iter().filter(|l| l.is_some()).count();
        Ok(CeForward {
            loss: cast_into(loss, plan.dtype)?,
            lse: storage(lse),
            valid,
            grads: grads.map(|g| g.into_iter().map(storage).collect()),
        })
    }

    fn linear_ce_grad(
        &self,
        plan: &HeadPlan,
        ins: &[Src<'_>],
        (lse, valid): (Src<'_>, usize),
        labels: Src<'_>,
        g: Src<'_>,
    ) -> Result<Vec<Storage>> {
        let o = &plan.options;
        let labels = host_labels(plan.op, labels, o.ignore_index, plan.v)?;
        let weights = row_weights(g, labels.len(), valid, o.reduction)?;
        let ins = ins.iter().map(|&x| Dense::of(x, plan.compute)).collect::<Result<Vec<_>>>()?;
        let grads = linear_backward(&head(plan, &labels), &ins, lse, &weights)?;
        grads.into_iter().map(|t| cast_into(t, plan.dtype)).collect()
    }

    fn scale_ce_grads(&self, grads: Vec<Storage>, s: f64, dtype: DType) -> Result<Vec<Storage>> {
        grads
            .into_iter()
            .map(|g| {
                let n = g.len();
                let t = scale_in_place(Tensor::from_storage(g, Shape::from([n])), s)?;
                cast_into(t, dtype)
            })
            .collect()
    }
}

/// The sparse loss's forward over logits `x` (`[..., v]`, any float dtype)
/// computed in the plan's compute dtype: the per-row log-sum-exp (shaped
/// like the labels, in that dtype) and the loss (in `x`'s dtype).
fn sparse_forward(plan: &SparsePlan, x: Src<'_>, labels: &[Option<usize>]) -> Result<(Tensor, Tensor)> {
    fn run<T: CeFloat>(x: &Dense<'_>, plan: &SparsePlan, labels: &[Option<usize>]) -> Result<(Tensor, Tensor)> {
        let (v, o) = (plan.v, &plan.options);
        let data = x.slice::<T>();
        let (lse, loss) = if v == 0 { (vec![], vec![]) } else { forward_rows::<T>(data, v, labels, o.label_smoothing) };
        let lse = Tensor::from_vec(lse, plan.lead.clone())?;
        Ok((lse, reduce_losses::<T>(loss, labels, o.reduction, plan.lead.clone())?))
    }
    let xc = Dense::of(x, plan.compute)?;
    let (lse, out) =
        if plan.compute == DType::F64 { run::<f64>(&xc, plan, labels)? } else { run::<f32>(&xc, plan, labels)? };
    drop(xc);
    Ok((lse, out.cast_raw(plan.dtype)?))
}

/// Writes the gradient of elements `j0..j0 + src.len()` of one row into
/// `dst`: [`grad_row`]'s expression, element for element, so both give the
/// same bits.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn grad_segment<T: CeFloat>(
    src: &[T],
    dst: &mut [std::mem::MaybeUninit<T>],
    j0: usize,
    lse: T,
    weight: T,
    s: &Smoothing<T>,
    label: Option<usize>,
) {
    match label {
        None => dst.iter_mut().for_each(|e| {
            e.write(T::ZERO);
        }),
        Some(y) => {
            simd::run(
                #[inline(always)]
                || {
                    for (o, &x) in dst.iter_mut().zip(src) {
                        o.write(weight * ((x - lse).fexp() - s.eps_v));
                    }
                },
            );
            if (j0..j0 + src.len()).contains(&y) {
                // SAFETY: written just above.
                let e = unsafe { dst[y - j0].assume_init_mut() };
                *e = *e - weight * s.label;
            }
        }
    }
}

/// The logits in the compute dtype: a tensor the gradient may be written
/// over, or elements others hold, read once.
enum GradIn<'a> {
    Sole(Tensor),
    Read(Src<'a>),
}

/// The sparse loss's gradient `w_r * (softmax - target)` from the logits
/// and their saved log-sum-exp (in the compute dtype), returned in the
/// logits' dtype. Written over the logits' buffer when the caller gave it
/// up ([`Logits::Own`]) or over their private copy in the compute dtype;
/// else read from the logits and written into a fresh buffer in the same
/// pass (one read and one write of the `N x V` block either way, where a
/// private copy first would cost a second read and write).
fn sparse_grad(
    plan: &SparsePlan,
    logits: Logits<'_>,
    lse: Src<'_>,
    labels: &[Option<usize>],
    weights: &[f64],
) -> Result<Tensor> {
    fn run<T: CeFloat>(
        x: GradIn<'_>,
        lse: Src<'_>,
        labels: &[Option<usize>],
        weights: &[f64],
        smoothing: f64,
    ) -> Result<Tensor> {
        let shape = match &x {
            GradIn::Sole(t) => t.shape().clone(),
            GradIn::Read(s) => s.shape().clone(),
        };
        let v = shape.dims().last().copied().unwrap_or(0);
        if v == 0 || shape.numel() == 0 {
            return match x {
                GradIn::Sole(t) => Ok(t),
                GradIn::Read(s) => Ok(Tensor::from_storage(Storage::cpu(copy(s)?), shape)),
            };
        }
        let lse = Dense::of(lse, T::DTYPE)?;
        let l = lse.slice::<T>();
        let w: Vec<T> = weights.iter().map(|&x| T::from_f64(x)).collect();
        let src = match x {
            GradIn::Sole(mut x) => {
                grad_rows_in_place::<T>(x.make_mut::<T>()?, v, l, labels, &w, smoothing);
                return Ok(x);
            }
            GradIn::Read(s) => s,
        };
        let src = &host::<T>(src)[src.layout.offset..src.layout.offset + src.numel()];
        let s = Smoothing::<T>::new(smoothing, v);
        // The gradient is elementwise given its row's statistics, so the
        // output splits anywhere: each part walks the row segments it covers.
        let out = fill_vec(src.len(), |start, mut part| {
            let mut at = start;
            while !part.is_empty() {
                let (r, j0) = (at / v, at % v);
                let len = (v - j0).min(part.len());
                let (head, tail) = part.split_at_mut(len);
                grad_segment(&src[at..at + len], head, j0, l[r], w[r], &s, labels[r]);
                at += len;
                part = tail;
            }
        })?;
        Tensor::from_vec(out, shape)
    }
    let (cd, smoothing) = (plan.compute, plan.options.label_smoothing);
    let x = match logits {
        Logits::Own(s) => {
            let mut shape = plan.lead.clone();
            shape.0.push(plan.v);
            let t = Tensor::from_storage(s, shape);
            let x = t.cast_raw(cd)?;
            drop(t);
            GradIn::Sole(x)
        }
        Logits::Shared(s) if s.dtype() == cd && s.is_contiguous() => GradIn::Read(s),
        Logits::Shared(s) => GradIn::Sole(Tensor::from_storage(Storage::cpu(cast(s, cd)?), s.shape().clone())),
    };
    let grad = if cd == DType::F64 {
        run::<f64>(x, lse, labels, weights, smoothing)?
    } else {
        run::<f32>(x, lse, labels, weights, smoothing)?
    };
    grad.cast_raw(plan.dtype)
}

/// What the fused head's kernels need to know of the plan and the labels.
pub(crate) struct Head<'a> {
    /// Rows of `hidden`.
    pub n: usize,
    /// Width of `hidden` and of `weight`.
    pub d: usize,
    /// Classes (rows of `weight`).
    pub v: usize,
    /// Checked labels, one per row.
    pub labels: &'a [Option<usize>],
    /// Rows per chunk of logits (at least 1).
    pub chunk: usize,
    /// Label smoothing.
    pub smoothing: f64,
    /// How rows are combined.
    pub reduction: Reduction,
}

fn head<'a>(plan: &HeadPlan, labels: &'a [Option<usize>]) -> Head<'a> {
    Head {
        n: plan.n,
        d: plan.d,
        v: plan.v,
        labels,
        chunk: plan.chunk,
        smoothing: plan.options.label_smoothing,
        reduction: plan.options.reduction,
    }
}

/// `d_hidden`, `d_weight` and `d_bias`, filled chunk by chunk.
struct HeadGrads {
    dh: Tensor,
    dw: Tensor,
    db: Option<Tensor>,
}

/// A zeroed `T` tensor of `shape` in a buffer the cache kept, when it kept
/// one of this size: the fused head's chunk of logits and weight gradient
/// are the same sizes every step. [`Tensor::zeros`] of that size takes
/// fresh pages from the system (zero already), which the kernel then faults
/// in and clears one by one as the first product writes them: about 57,000
/// faults a step at N = 4,096, V = 32,000, D = 768 (4 KiB pages), where
/// writing zeros into a kept buffer is one pass at memory speed. A
/// `tapir bench` run of that head spent 1.45-1.51 s in the kernel before,
/// 0.43-0.58 s after (docs/performance.md).
fn cached_zeros<T: CeFloat>(shape: impl Into<Shape>) -> Result<Tensor> {
    let shape = shape.into();
    Tensor::from_vec(crate::cache::filled(shape.numel(), T::ZERO)?, shape)
}

impl HeadGrads {
    fn zeros<T: CeFloat>(n: usize, d: usize, v: usize, bias: bool) -> Result<Self> {
        Ok(HeadGrads {
            dh: cached_zeros::<T>([n, d])?,
            dw: cached_zeros::<T>([v, d])?,
            db: bias.then(|| cached_zeros::<T>([v])).transpose()?,
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
pub(crate) fn scale_in_place(mut t: Tensor, s: f64) -> Result<Tensor> {
    fn run<T: CeFloat>(t: &mut Tensor, s: T) -> Result<()> {
        let x = t.make_mut::<T>()?;
        let n = x.len();
        let shared = Disjoint::new(x);
        pool::ranges(n, SPLIT_MIN, &|r| {
            // SAFETY: the ranges are disjoint.
            let x = unsafe { shared.slice(r.start, r.len()) };
            crate::cpu::simd::run(
                #[inline(always)]
                || x.iter_mut().for_each(|e| *e *= s),
            );
        });
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

/// Logits of rows `r0..r0+c` into `buf` (`c x v`), bias included.
#[allow(clippy::too_many_arguments)]
fn chunk_logits<T: CeFloat>(buf: &mut [T], h: &[T], w: &[T], b: Option<&[T]>, r0: usize, c: usize, d: usize, v: usize) {
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
        // Column ranges over the pool, each summed down the chunk's rows in
        // row order (the bias-gradient kernel of the reductions).
        let shared = Disjoint::new(db);
        pool::ranges(v, SPLIT_MIN.div_ceil(c.max(1)), &|cols| {
            // SAFETY: the column ranges are disjoint.
            let acc = unsafe { shared.slice(cols.start, cols.len()) };
            add_rows(g, v, 0..c, cols.start, acc);
        });
    }
}

/// The fused head's forward over `xs` (`hidden`, `weight`, `bias?`, any
/// float dtype) computed in `cd`, chunk by chunk: the loss (in `cd`), the
/// per-row log-sum-exp, and with `precompute` the gradients
/// `[d_hidden, d_weight, d_bias?]` for a unit upstream gradient.
fn linear_forward(
    head: &Head<'_>,
    xs: &[Src<'_>],
    cd: DType,
    precompute: bool,
) -> Result<(Tensor, Tensor, Option<Vec<Tensor>>)> {
    let ins = xs.iter().map(|&x| Dense::of(x, cd)).collect::<Result<Vec<_>>>()?;
    if cd == DType::F64 {
        linear_forward_in::<f64>(head, &ins, precompute)
    } else {
        linear_forward_in::<f32>(head, &ins, precompute)
    }
}

fn linear_forward_in<T: CeFloat>(
    head: &Head<'_>,
    xs: &[Dense<'_>],
    precompute: bool,
) -> Result<(Tensor, Tensor, Option<Vec<Tensor>>)> {
    let Head { n, d, v, labels, chunk, smoothing, reduction } = *head;
    let (h, w) = (xs[0].slice::<T>(), xs[1].slice::<T>());
    let b = xs.get(2).map(|b| b.slice::<T>());
    let mut lse = Vec::with_capacity(n);
    let mut loss = Vec::with_capacity(n);
    let mut grads = precompute.then(|| HeadGrads::zeros::<T>(n, d, v, b.is_some())).transpose()?;
    let unit = T::from_f64(unit_weight(labels, reduction));
    let mut buf_t = cached_zeros::<T>([chunk, v])?;
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
            chunk_logits(buf, h, w, b, r0, c, d, v);
            let g = &mut buf[..c * v];
            let (l, s) = match acc.as_mut() {
                None => forward_rows::<T>(g, v, rows, smoothing),
                Some((dh, dw, db)) => {
                    let ls = forward_grad_rows::<T>(g, v, rows, unit, smoothing);
                    backprop_chunk(g, h, w, r0, c, d, v, (dh, dw, db.as_deref_mut()));
                    ls
                }
            };
            lse.extend(l);
            loss.extend(s);
            r0 += c;
        }
    }
    drop(buf_t);
    let lse = Tensor::from_vec(lse, [n])?;
    let grads = grads.map(HeadGrads::into_vec);
    let out = reduce_losses::<T>(loss, labels, reduction, Shape::from([n]))?;
    Ok((out, lse, grads))
}

/// The fused head's recomputing backward over `xs` (`hidden`, `weight`,
/// `bias?`, contiguous in the compute dtype): each chunk's logits again,
/// turned into the gradient in place from the saved log-sum-exp `lse` and
/// the per-row weights, then accumulated into `[d_hidden, d_weight,
/// d_bias?]` (in the compute dtype).
fn linear_backward(head: &Head<'_>, xs: &[Dense<'_>], lse: Src<'_>, weights: &[f64]) -> Result<Vec<Tensor>> {
    if lse.dtype() == DType::F64 {
        linear_backward_in::<f64>(head, xs, lse, weights)
    } else {
        linear_backward_in::<f32>(head, xs, lse, weights)
    }
}

fn linear_backward_in<T: CeFloat>(
    head: &Head<'_>,
    xs: &[Dense<'_>],
    lse: Src<'_>,
    weights: &[f64],
) -> Result<Vec<Tensor>> {
    let Head { n, d, v, labels, chunk, smoothing, .. } = *head;
    let (h, w) = (xs[0].slice::<T>(), xs[1].slice::<T>());
    let b = xs.get(2).map(|b| b.slice::<T>());
    let lse = Dense::of(lse, T::DTYPE)?;
    let lse = lse.slice::<T>();
    let wts: Vec<T> = weights.iter().map(|&x| T::from_f64(x)).collect();
    let mut grads = HeadGrads::zeros::<T>(n, d, v, b.is_some())?;
    let mut buf_t = cached_zeros::<T>([chunk, v])?;
    {
        let (dh, dw, mut db) = grads.slices::<T>()?;
        let buf = buf_t.make_mut::<T>()?;
        let mut r0 = 0;
        while r0 < n {
            let c = chunk.min(n - r0);
            chunk_logits(buf, h, w, b, r0, c, d, v);
            let g = &mut buf[..c * v];
            grad_rows_in_place::<T>(g, v, &lse[r0..r0 + c], &labels[r0..r0 + c], &wts[r0..r0 + c], smoothing);
            backprop_chunk(g, h, w, r0, c, d, v, (&mut *dh, &mut *dw, db.as_deref_mut()));
            r0 += c;
        }
    }
    drop(buf_t);
    Ok(grads.into_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row with the extremes the loss meets: a wide range, -inf, ties.
    fn row(v: usize) -> Vec<f32> {
        let mut x: Vec<f32> = (0..v).map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 23.0).collect();
        x[v / 3] = f32::NEG_INFINITY;
        x[v / 2] = x[v / 5];
        x
    }

    /// Every compiled copy of the gradient row the processor can run gives
    /// the portable copy's bits, so results do not depend on the processor.
    #[test]
    fn gradient_rows_are_bit_identical_on_every_instruction_set() {
        for v in [1usize, 7, 16, 17, 255, 1000, 32_001] {
            for smoothing in [0.0, 0.1] {
                let s = Smoothing::<f32>::new(smoothing, v);
                let x = row(v.max(4));
                let x = &x[..v];
                let (lse, _) = row_stats(x, s.on);
                let run = |isa| {
                    let mut g = x.to_vec();
                    grad_row_on(isa, &mut g, lse, 0.25, &s, Some(v - 1));
                    g.iter().map(|e| e.to_bits()).collect::<Vec<_>>()
                };
                let base = run(Isa::Portable);
                for isa in [Isa::Avx2, Isa::Avx512] {
                    assert_eq!(run(isa), base, "v {v} smoothing {smoothing} {isa:?}");
                }
            }
        }
    }

    /// Shared logits get their gradient in a fresh buffer, read and written
    /// in one pass split anywhere over the pool; sole-owner logits get it in
    /// place. Both give the same bits, ignored rows and smoothing included.
    #[test]
    fn gradient_of_shared_logits_equals_the_in_place_one() {
        for (n, v) in [(3usize, 1usize), (5, 17), (40, 1000), (9, 70_001)] {
            for smoothing in [0.0, 0.1] {
                let x: Vec<f32> = (0..n * v).map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 23.0).collect();
                let labels: Vec<Option<usize>> = (0..n).map(|r| (r % 4 != 3).then_some(r * 7 % v)).collect();
                let (lse, _) = forward_rows::<f32>(&x, v, &labels, smoothing);
                let lse = Tensor::from_vec(lse, [n]).unwrap();
                let w: Vec<f64> = (0..n).map(|r| 0.25 + r as f64 / 8.0).collect();
                let t = Tensor::from_vec(x, [n, v]).unwrap();
                let at = t.as_slice::<f32>().unwrap().as_ptr();
                let plan = SparsePlan {
                    op: "sparse_cross_entropy",
                    lead: Shape::from([n]),
                    v,
                    compute: DType::F32,
                    dtype: DType::F32,
                    options: crate::backend::cross_entropy::CrossEntropyOptions {
                        label_smoothing: smoothing,
                        ..Default::default()
                    },
                };
                let copied = sparse_grad(&plan, Logits::Shared(t.src()), lse.src(), &labels, &w).unwrap();
                let copied = copied.as_slice::<f32>().unwrap().to_vec();
                // (One class: softmax is 1, so the gradient is all zero.)
                assert!(v == 1 || copied.iter().any(|&g| g != 0.0));
                let own = t.into_sole_storage().unwrap_or_else(|_| panic!("sole owner"));
                let own = sparse_grad(&plan, Logits::Own(own), lse.src(), &labels, &w).unwrap();
                assert_eq!(own.as_slice::<f32>().unwrap().as_ptr(), at, "sole owner: written in place");
                let bits = |g: &[f32]| g.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&copied), bits(own.as_slice::<f32>().unwrap()), "n {n} v {v} smoothing {smoothing}");
            }
        }
    }

    /// The row statistics against an f64 reference, and torch's special
    /// cases: +inf or NaN in a row gives a NaN lse, all -inf gives -inf.
    #[test]
    fn row_statistics_match_an_f64_reference() {
        for v in [1usize, 3, 64, 1000, 50_257] {
            let x: Vec<f32> = (0..v).map(|i| ((i * 31 % 977) as f32).sin() * 9.0).collect();
            let m = x.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
            let lse = m + x.iter().map(|&e| (e as f64 - m).exp()).sum::<f64>().ln();
            let sum: f64 = x.iter().map(|&e| e as f64).sum();
            let (got, sx) = row_stats(&x, true);
            assert!((got as f64 - lse).abs() <= 1e-6 * (1.0 + lse.abs()), "v {v}: {got} vs {lse}");
            assert!((sx as f64 - sum).abs() <= 1e-4 * (1.0 + sum.abs()), "v {v}: {sx} vs {sum}");
        }
        assert!(row_stats(&[1.0f32, f32::INFINITY, 2.0], false).0.is_nan());
        assert!(row_stats(&[1.0f32, f32::NAN], false).0.is_nan());
        assert_eq!(row_stats(&[f32::NEG_INFINITY; 5], false).0, f32::NEG_INFINITY);
    }
}
