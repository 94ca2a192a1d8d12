//! The CPU kernels of the cross-entropy losses ([`crate::ops::cross_entropy`]).
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

use crate::cpu::iter::{fill_vec, SPLIT_MIN};
use crate::cpu::math::exp_f32;
use crate::cpu::matmul::{gemm_into, MatRef};
use crate::cpu::pool::{self, Disjoint};
use crate::cpu::reduce::add_rows;
use crate::cpu::rows::RowKernels;
use crate::cpu::simd::{self, Isa};
use crate::ops::cross_entropy::Reduction;
use crate::storage::CpuElement;
use crate::{DType, Result, Shape, Tensor};

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

/// The sparse loss's forward over logits `x` (`[..., v]`, any float dtype)
/// computed in `cd`: the per-row log-sum-exp (shaped `lead`, in `cd`) and
/// the loss (in `x`'s dtype).
pub(crate) fn sparse_forward(
    x: &Tensor,
    cd: DType,
    lead: &Shape,
    v: usize,
    labels: &[Option<usize>],
    smoothing: f64,
    reduction: Reduction,
) -> Result<(Tensor, Tensor)> {
    fn run<T: CeFloat>(
        x: &Tensor,
        lead: &Shape,
        v: usize,
        labels: &[Option<usize>],
        smoothing: f64,
        reduction: Reduction,
    ) -> Result<(Tensor, Tensor)> {
        let data = x.as_slice::<T>().expect("internal: contiguous");
        let (lse, loss) = if v == 0 { (vec![], vec![]) } else { forward_rows::<T>(data, v, labels, smoothing) };
        let lse = Tensor::from_vec(lse, lead.clone())?;
        Ok((lse, reduce_losses::<T>(loss, labels, reduction, lead.clone())?))
    }
    let xc = x.cast_raw(cd)?.contiguous()?;
    let (lse, out) = if cd == DType::F64 {
        run::<f64>(&xc, lead, v, labels, smoothing, reduction)?
    } else {
        run::<f32>(&xc, lead, v, labels, smoothing, reduction)?
    };
    Ok((lse, out.cast_raw(x.dtype())?))
}

/// Whether `t` is the only handle on all of its storage, so a kernel may
/// write over it (what [`Tensor::make_mut`] would do without copying).
fn sole_owner(t: &Tensor) -> bool {
    t.is_contiguous()
        && t.layout.offset == 0
        && t.numel() == t.storage.len()
        && std::sync::Arc::strong_count(&t.storage) == 1
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

/// The sparse loss's gradient `w_r * (softmax - target)` from the logits
/// and their saved log-sum-exp (in `cd`), returned in the logits' dtype.
/// Written over the logits' buffer when `logits` is the only handle on it;
/// else read from the logits and written into a fresh buffer in the same
/// pass (one read and one write of the `N x V` block either way, where a
/// private copy first would cost a second read and write).
pub(crate) fn sparse_grad(
    logits: Tensor,
    cd: DType,
    lse: &Tensor,
    labels: &[Option<usize>],
    weights: &[f64],
    smoothing: f64,
) -> Result<Tensor> {
    fn run<T: CeFloat>(
        x: Tensor,
        lse: &Tensor,
        labels: &[Option<usize>],
        weights: &[f64],
        smoothing: f64,
    ) -> Result<Tensor> {
        let v = x.dims().last().copied().unwrap_or(0);
        if v == 0 || x.numel() == 0 {
            return Ok(x);
        }
        let l = lse.as_slice::<T>().expect("internal: lse contiguous");
        let w: Vec<T> = weights.iter().map(|&x| T::from_f64(x)).collect();
        if sole_owner(&x) {
            let mut x = x;
            grad_rows_in_place::<T>(x.make_mut::<T>()?, v, l, labels, &w, smoothing);
            return Ok(x);
        }
        let src = x.as_slice::<T>().expect("internal: contiguous");
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
        Tensor::from_vec(out, x.shape().clone())
    }
    let dtype = logits.dtype();
    let x = logits.cast_raw(cd)?.contiguous()?;
    drop(logits);
    let grad = if cd == DType::F64 {
        run::<f64>(x, lse, labels, weights, smoothing)?
    } else {
        run::<f32>(x, lse, labels, weights, smoothing)?
    };
    grad.cast_raw(dtype)
}

/// What the fused head's kernels need to know of the op and its inputs.
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
pub(crate) fn linear_forward(
    head: &Head<'_>,
    xs: &[&Tensor],
    cd: DType,
    precompute: bool,
) -> Result<(Tensor, Tensor, Option<Vec<Tensor>>)> {
    let ins: Vec<Tensor> = xs.iter().map(|t| t.cast_raw(cd)?.contiguous()).collect::<Result<_>>()?;
    if cd == DType::F64 {
        linear_forward_in::<f64>(head, &ins, precompute)
    } else {
        linear_forward_in::<f32>(head, &ins, precompute)
    }
}

fn linear_forward_in<T: CeFloat>(
    head: &Head<'_>,
    xs: &[Tensor],
    precompute: bool,
) -> Result<(Tensor, Tensor, Option<Vec<Tensor>>)> {
    let Head { n, d, v, labels, chunk, smoothing, reduction } = *head;
    let (h, w) = (xs[0].as_slice::<T>().expect("contiguous"), xs[1].as_slice::<T>().expect("contiguous"));
    let b = xs.get(2).map(|b| b.as_slice::<T>().expect("contiguous"));
    let mut lse = Vec::with_capacity(n);
    let mut loss = Vec::with_capacity(n);
    let mut grads = precompute.then(|| HeadGrads::zeros(n, d, v, b.is_some(), T::DTYPE)).transpose()?;
    let unit = T::from_f64(unit_weight(labels, reduction));
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
pub(crate) fn linear_backward(head: &Head<'_>, xs: &[Tensor], lse: &Tensor, weights: &[f64]) -> Result<Vec<Tensor>> {
    if xs[0].dtype() == DType::F64 {
        linear_backward_in::<f64>(head, xs, lse, weights)
    } else {
        linear_backward_in::<f32>(head, xs, lse, weights)
    }
}

fn linear_backward_in<T: CeFloat>(
    head: &Head<'_>,
    xs: &[Tensor],
    lse: &Tensor,
    weights: &[f64],
) -> Result<Vec<Tensor>> {
    let Head { n, d, v, labels, chunk, smoothing, .. } = *head;
    let (h, w) = (xs[0].as_slice::<T>().expect("contiguous"), xs[1].as_slice::<T>().expect("contiguous"));
    let b = xs.get(2).map(|b| b.as_slice::<T>().expect("contiguous"));
    let lse = lse.as_slice::<T>().expect("contiguous");
    let wts: Vec<T> = weights.iter().map(|&x| T::from_f64(x)).collect();
    let mut grads = HeadGrads::zeros(n, d, v, b.is_some(), T::DTYPE)?;
    let mut buf_t = Tensor::zeros([chunk, v], T::DTYPE)?;
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
                let copied = sparse_grad(t.clone(), DType::F32, &lse, &labels, &w, smoothing).unwrap();
                let copied = copied.as_slice::<f32>().unwrap().to_vec();
                // (One class: softmax is 1, so the gradient is all zero.)
                assert!(v == 1 || copied.iter().any(|&g| g != 0.0));
                let own = sparse_grad(t, DType::F32, &lse, &labels, &w, smoothing).unwrap();
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
