//! Reductions over any set of axes: sum, mean, max, min, argmax, argmin,
//! logsumexp, and `sum_to`, the reduction broadcasting's backward needs.

use smallvec::SmallVec;

use crate::cpu::float_map;
use crate::cpu::iter::{fill_vec_parts, PAR_MIN, SPLIT_MIN};
use crate::cpu::pool::Disjoint;
use crate::ops::binary::BinaryOps;
use crate::ops::shape::ShapeOps;
use crate::ops::unary::UnaryOps;
use crate::ops::{one, Arity, Diff, InputGrads, Op, Saved};
use crate::storage::{try_filled, CpuElement};
use crate::{resolve_axis, with_float, DType, Error, Result, Shape, Tensor};

use crate::cpu::rows::RowKernels;

/// Axes to reduce: sorted, unique, non-negative.
pub type Axes = SmallVec<[usize; 6]>;

/// Resolves user axes (negative from the end; empty means all) for `rank`.
pub fn normalize_axes(op: &'static str, axes: &[isize], rank: usize) -> Result<Axes> {
    let mut out: Axes = if axes.is_empty() {
        (0..rank).collect()
    } else {
        axes.iter().map(|&a| resolve_axis(op, a, rank)).collect::<Result<_>>()?
    };
    out.sort_unstable();
    let before = out.len();
    out.dedup();
    if out.len() != before {
        return Err(Error::invalid_arg(op, format!("repeated axis in {axes:?}")));
    }
    Ok(out)
}

/// Checks axes that an op struct built by hand carries: each in range,
/// sorted and unique, as [`normalize_axes`] makes them.
pub(crate) fn check_axes(op: &'static str, axes: &[usize], rank: usize) -> Result<()> {
    for (i, &a) in axes.iter().enumerate() {
        crate::layout::check_axis(op, a, rank)?;
        if i > 0 && axes[i - 1] >= a {
            return Err(Error::invalid_arg(op, format!("axes {axes:?} are not sorted and unique")));
        }
    }
    Ok(())
}

/// The shape after reducing `axes`.
pub fn reduced_shape(shape: &Shape, axes: &[usize], keepdim: bool) -> Shape {
    let mut out = SmallVec::new();
    for (i, &d) in shape.dims().iter().enumerate() {
        if axes.contains(&i) {
            if keepdim {
                out.push(1);
            }
        } else {
            out.push(d);
        }
    }
    Shape(out)
}

/// A view of `x` with kept axes first and reduced axes last, and the number
/// of output rows and reduced elements per row.
fn kept_then_reduced(x: &Tensor, axes: &[usize]) -> Result<(Tensor, usize, usize)> {
    let mut perm: SmallVec<[usize; 6]> = (0..x.rank()).filter(|a| !axes.contains(a)).collect();
    perm.extend_from_slice(axes);
    let reduced: usize = axes.iter().map(|&a| x.dims()[a]).product();
    // Not numel / reduced: that is 0 when a reduced axis is empty, but the
    // output still has one row per kept index (zeros(3, 0).sum(1) is [0; 3]).
    let rows: usize = (0..x.rank()).filter(|a| !axes.contains(a)).map(|a| x.dims()[a]).product();
    Ok((x.permute_raw(&perm)?, rows, reduced))
}

/// Reduces each row of `reduced` elements with `row`, over a view whose
/// reduced axes are last. Rows are contiguous slices after at most one copy.
fn reduce_rows<T: CpuElement + Copy + Send + Sync, D: Send>(
    x: &Tensor,
    axes: &[usize],
    row: impl Fn(&[T]) -> D + Sync,
) -> Result<Vec<D>> {
    let (v, rows, reduced) = kept_then_reduced(x, axes)?;
    let v = v.contiguous()?;
    let data = &v.storage_slice::<T>()[v.layout.offset..v.layout.offset + v.numel()];
    if reduced == 0 {
        return Ok((0..rows).map(|_| row(&[])).collect());
    }
    // Few long rows (a sum over the last axis of [4096, 4096]) split by the
    // work, not by the number of outputs as fill_vec would.
    fill_vec_parts(rows, crate::cpu::pool::parts_for(rows * reduced, SPLIT_MIN), |start, out| {
        for (i, o) in out.iter_mut().enumerate() {
            let r = start + i;
            o.write(row(&data[r * reduced..(r + 1) * reduced]));
        }
    })
}

/// Elements per row block of the leading-axis sum.
const LEADING_BLOCK_ELEMS: usize = 1 << 14;

/// Columns `c0..c0 + out.len()` of rows `rows` of a row-major matrix with
/// `inner` columns, added row by row into `out`. Column blocks of
/// [`ADD_COLS`] are summed in a local array (registers) over all the rows
/// and written once: adding each row into `out` in memory made every row
/// wait for the previous row's stores (11 us for a [1024, 64] bias
/// gradient, against about 1 us). Each column still sees its rows in
/// order, so the bits are those of the plain loop.
fn add_rows<T: CpuElement + Copy + std::ops::Add<Output = T>>(
    data: &[T],
    inner: usize,
    rows: std::ops::Range<usize>,
    c0: usize,
    out: &mut [T],
) {
    crate::cpu::simd::run(
        #[inline(always)]
        || {
            let mut blocks = out.chunks_exact_mut(ADD_COLS);
            let mut c = c0;
            for o in &mut blocks {
                let mut acc: [T; ADD_COLS] = std::array::from_fn(|j| o[j]);
                for r in rows.clone() {
                    let row: &[T; ADD_COLS] = data[r * inner + c..][..ADD_COLS].try_into().expect("block width");
                    for j in 0..ADD_COLS {
                        acc[j] = acc[j] + row[j];
                    }
                }
                o.copy_from_slice(&acc);
                c += ADD_COLS;
            }
            let rest = blocks.into_remainder();
            let width = rest.len();
            for r in rows.clone() {
                for (o, &v) in rest.iter_mut().zip(&data[r * inner + c..r * inner + c + width]) {
                    *o = *o + v;
                }
            }
        },
    );
}

/// Columns per register block of [`add_rows`] (four AVX-512 registers of f32).
const ADD_COLS: usize = 64;

/// Sum over `axes`, with a fast path for a contiguous input reduced over its
/// leading axes (bias gradients: accumulate whole rows, no transposed copy).
pub(crate) fn sum_raw<T: RowKernels + CpuElement>(x: &Tensor, axes: &[usize]) -> Result<Vec<T>> {
    let leading = axes.iter().enumerate().all(|(i, &a)| i == a);
    if leading && x.is_contiguous() && !axes.is_empty() && axes.len() < x.rank() {
        let outer: usize = axes.iter().map(|&a| x.dims()[a]).product();
        let inner: usize = x.dims()[axes.len()..].iter().product();
        let data = &x.storage_slice::<T>()[x.layout.offset..x.layout.offset + x.numel()];
        // Rows in fixed blocks, each summed into its own partial row, the
        // blocks spread over the pool and their partials added in block
        // order: the same bits whatever the number of threads, and each
        // thread reads the rows the split that produced `x` gave it.
        let block = (LEADING_BLOCK_ELEMS / inner.max(1)).max(1);
        let blocks = outer.div_ceil(block);
        let sum_rows = |r0: usize, r1: usize, out: &mut [T]| add_rows(data, inner, r0..r1, 0, out);
        let mut out = try_filled(inner, T::ZERO)?;
        if blocks == 1 {
            sum_rows(0, outer, &mut out);
            return Ok(out);
        }
        if inner >= LEADING_BLOCK_ELEMS {
            // Wide rows: columns split instead (partials would copy the input).
            let shared = Disjoint::new(&mut out);
            crate::cpu::pool::ranges(inner, 2, &|cols| {
                // SAFETY: the column ranges are disjoint.
                let out = unsafe { shared.slice(cols.start, cols.len()) };
                add_rows(data, inner, 0..outer, cols.start, out);
            });
            return Ok(out);
        }
        let mut partial = try_filled(blocks * inner, T::ZERO)?;
        let shared = Disjoint::new(&mut partial);
        crate::cpu::pool::ranges(blocks, SPLIT_MIN.div_ceil(block * inner.max(1)), &|bs| {
            for b in bs {
                // SAFETY: block b's partial row is this part's alone.
                let row = unsafe { shared.slice(b * inner, inner) };
                sum_rows(b * block, ((b + 1) * block).min(outer), row);
            }
        });
        for p in partial.chunks(inner.max(1)) {
            for (o, &v) in out.iter_mut().zip(p) {
                *o += v;
            }
        }
        return Ok(out);
    }
    let (_, rows, reduced) = kept_then_reduced(x, axes)?;
    if rows == 1 && reduced >= PAR_MIN && x.is_contiguous() {
        // One big row: split it across threads.
        let data = &x.storage_slice::<T>()[x.layout.offset..x.layout.offset + x.numel()];
        // Fixed chunks, their sums added in order: the same bits whatever
        // the number of threads.
        let chunks = data.len().div_ceil(PAR_MIN / 2);
        let mut partial = vec![T::ZERO; chunks];
        let shared = Disjoint::new(&mut partial);
        crate::cpu::pool::ranges(chunks, 2, &|r| {
            // SAFETY: the ranges are disjoint.
            let out = unsafe { shared.slice(r.start, r.len()) };
            for (o, c) in out.iter_mut().zip(data[r.start * (PAR_MIN / 2)..].chunks(PAR_MIN / 2)) {
                *o = T::row_sum(c);
            }
        });
        return Ok(vec![partial.into_iter().fold(T::ZERO, |a, b| a + b)]);
    }
    let trailing = axes.iter().rev().enumerate().all(|(i, &a)| a == x.rank() - 1 - i);
    if trailing {
        // Rows are contiguous after the (identity) permutation.
        return reduce_rows(x, axes, T::row_sum);
    }
    // Any other axis set: walk the input in its own order and accumulate
    // into the output through strides that are zero on reduced axes. No
    // transposed copy, and the inner loop is unit-stride on both sides when
    // an inner axis is kept.
    let kept = reduced_shape(x.shape(), axes, true);
    let ks = kept.contiguous_strides();
    let out_strides: SmallVec<[usize; 6]> = (0..x.rank()).map(|i| if axes.contains(&i) { 0 } else { ks[i] }).collect();
    let mut out = try_filled(kept.numel(), T::ZERO)?;
    let data = x.storage_slice::<T>();
    let nd = crate::cpu::iter::Nd::new(x.dims(), [&x.layout.strides, &out_strides], [x.layout.offset, 0]);
    nd.runs(0, nd.numel(), |_, [ox, oo], len, [sx, so]| match (sx, so) {
        (1, 1) => out[oo..oo + len].iter_mut().zip(&data[ox..ox + len]).for_each(|(o, &v)| *o += v),
        (1, 0) => out[oo] += T::row_sum(&data[ox..ox + len]),
        _ => (0..len).for_each(|i| out[oo + i * so] += data[ox + i * sx]),
    });
    Ok(out)
}

/// Which reduction.
#[derive(Debug, Clone, PartialEq)]
pub enum ReduceKind {
    /// Sum.
    Sum,
    /// Maximum (gradient split evenly among ties).
    Max,
    /// Minimum (gradient split evenly among ties).
    Min,
    /// log(sum(exp(x))), stable for large and -inf inputs.
    LogSumExp,
}

/// A reduction over `axes`.
#[derive(Debug, Clone, PartialEq)]
pub struct Reduce {
    /// Which reduction.
    pub kind: ReduceKind,
    /// Sorted, unique axes.
    pub axes: Axes,
    /// Keep reduced axes as size 1.
    pub keepdim: bool,
}

impl Reduce {
    fn kernel<T: RowKernels + CpuElement>(&self, x: &Tensor) -> Result<Vec<T>> {
        match self.kind {
            ReduceKind::Sum => sum_raw::<T>(x, &self.axes),
            ReduceKind::Max => reduce_rows(x, &self.axes, T::row_max),
            ReduceKind::Min => reduce_rows(x, &self.axes, T::row_min),
            ReduceKind::LogSumExp => reduce_rows(x, &self.axes, T::row_lse),
        }
    }

    /// `y` (or a gradient of y's shape) with the reduced axes put back as 1s.
    fn keep<T: Diff>(&self, y: &T, x_shape: &Shape) -> Result<T> {
        if self.keepdim {
            Ok(y.clone())
        } else {
            y.reshape(reduced_shape(x_shape, &self.axes, true))
        }
    }

    /// For max/min: where the input attains the result, divided by the
    /// number of ties, so the gradient is split evenly.
    fn tie_weights<T: Diff>(&self, x: &T, y: &T) -> Result<T> {
        let yk = self.keep(y, &x.shape())?;
        let mask = x.eq(&yk)?;
        let count = mask.sum(&self.axes.iter().map(|&a| a as isize).collect::<Vec<_>>(), true)?;
        mask.div(&count)
    }
}

impl Op for Reduce {
    fn name(&self) -> &'static str {
        match self.kind {
            ReduceKind::Sum => "sum",
            ReduceKind::Max => "max",
            ReduceKind::Min => "min",
            ReduceKind::LogSumExp => "logsumexp",
        }
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }

    fn saves(&self) -> Saved {
        match self.kind {
            ReduceKind::Sum => Saved::NOTHING,
            ReduceKind::Max | ReduceKind::Min | ReduceKind::LogSumExp => Saved::ALL,
        }
    }

    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0];
        check_axes(self.name(), &self.axes, x.rank())?;
        if matches!(self.kind, ReduceKind::Max | ReduceKind::Min) {
            if let Some(&a) = self.axes.iter().find(|&&a| x.dims()[a] == 0) {
                return Err(Error::InvalidShape {
                    op: self.name(),
                    shape: x.shape().clone(),
                    reason: format!("cannot take {} over empty axis {a}", self.name()),
                });
            }
        }
        let shape = reduced_shape(x.shape(), &self.axes, self.keepdim);
        if self.kind == ReduceKind::Sum && x.dtype().is_int() {
            // As torch: an integer sum is an int64 sum, so counting int32
            // labels cannot overflow at 2^31, and it wraps past 2^63.
            shape.check(self.name(), DType::I64)?;
            let out = match x.dtype() {
                DType::I32 => {
                    reduce_rows(x, &self.axes, |r: &[i32]| r.iter().fold(0i64, |a, &v| a.wrapping_add(v as i64)))
                }
                _ => reduce_rows(x, &self.axes, |r: &[i64]| r.iter().fold(0i64, |a, &v| a.wrapping_add(v))),
            }?;
            return Tensor::from_vec(out, shape);
        }
        // Reducing an empty axis can leave more elements than the input
        // had: zeros([0, usize::MAX]).sum(0) would be usize::MAX zeros.
        shape.check(self.name(), x.dtype())?;
        float_map(
            self.name(),
            x,
            |x| with_float!(x.dtype(), T => Tensor::from_vec(self.kernel::<T>(x)?, shape.clone()), _ => unreachable!()),
        )
    }
    fn forward_cuda(&self, xs: &[&Tensor]) -> Result<Tensor> {
        crate::cuda::reduce::reduce(self, xs[0])
    }

    fn vjp<T: Diff>(&self, xs: &[&T], y: &T, g: &T) -> Result<InputGrads<T>> {
        let x = xs[0];
        if x.dtype().is_int() {
            return Ok(smallvec::smallvec![None]);
        }
        let xs_shape = x.shape();
        let gk = self.keep(g, &xs_shape)?;
        Ok(one(match self.kind {
            ReduceKind::Sum => gk.broadcast_to(xs_shape)?,
            ReduceKind::Max | ReduceKind::Min => self.tie_weights(x, y)?.mul(&gk)?,
            ReduceKind::LogSumExp => x.sub(&self.keep(y, &xs_shape)?)?.exp()?.mul(&gk)?,
        }))
    }

    fn jvp<T: Diff>(&self, xs: &[&T], y: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        let Some(t) = ts[0] else { return Ok(None) };
        let x = xs[0];
        if x.dtype().is_int() {
            return Ok(None);
        }
        let axes: Vec<isize> = self.axes.iter().map(|&a| a as isize).collect();
        let weighted = match self.kind {
            ReduceKind::Sum => t.clone(),
            ReduceKind::Max | ReduceKind::Min => t.mul(&self.tie_weights(x, y)?)?,
            ReduceKind::LogSumExp => t.mul(&x.sub(&self.keep(y, &x.shape())?)?.exp()?)?,
        };
        Ok(Some(weighted.sum(&axes, self.keepdim)?))
    }
}

/// Index of the largest (or smallest) element along one axis, as i64.
#[derive(Debug, Clone, PartialEq)]
pub struct ArgReduce {
    /// The axis.
    pub axis: usize,
    /// Keep the axis as size 1.
    pub keepdim: bool,
    /// argmin instead of argmax.
    pub min: bool,
}

impl Op for ArgReduce {
    fn name(&self) -> &'static str {
        if self.min {
            "argmin"
        } else {
            "argmax"
        }
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }

    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0];
        if x.dims()[crate::layout::check_axis(self.name(), self.axis, x.rank())?] == 0 {
            return Err(Error::InvalidShape { op: self.name(), shape: x.shape().clone(), reason: "empty axis".into() });
        }
        reduced_shape(x.shape(), &[self.axis], self.keepdim).check(self.name(), DType::I64)?;
        let x = if x.dtype().is_float() { x.cast_raw(x.dtype().compute())? } else { x.cast_raw(DType::F64)? };
        let min = self.min;
        let out: Vec<i64> = with_float!(x.dtype(), T => reduce_rows(&x, &[self.axis], |r: &[T]| {
            // First occurrence wins; NaN counts as the extreme, like torch.
            let mut best = 0;
            for (i, &v) in r.iter().enumerate() {
                let b = r[best];
                if b.is_nan() { break; }
                if v.is_nan() || (if min { v < b } else { v > b }) { best = i; }
            }
            best as i64
        })?, _ => unreachable!());
        Tensor::from_vec(out, reduced_shape(x.shape(), &[self.axis], self.keepdim))
    }
    fn forward_cuda(&self, xs: &[&Tensor]) -> Result<Tensor> {
        crate::cuda::reduce::arg_reduce(self, xs[0])
    }
    fn vjp<T: Diff>(&self, _: &[&T], _: &T, _: &T) -> Result<InputGrads<T>> {
        Ok(smallvec::smallvec![None])
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, _: &[Option<&T>]) -> Result<Option<T>> {
        Ok(None)
    }
    fn is_differentiable(&self) -> bool {
        false
    }
}

/// Sums a broadcast value back to `shape` (the reverse of `broadcast_to`).
#[derive(Debug, Clone, PartialEq)]
pub struct SumTo {
    /// The target shape; the input must broadcast to... from it.
    pub shape: Shape,
}

impl Op for SumTo {
    fn name(&self) -> &'static str {
        "sum_to"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }

    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0];
        let (r, tr) = (x.rank(), self.shape.rank());
        let fits = tr <= r && self.shape.dims().iter().enumerate().all(|(i, &d)| d == 1 || d == x.dims()[r - tr + i]);
        if !fits {
            return Err(Error::ShapeMismatch { op: "sum_to", lhs: x.shape().clone(), rhs: self.shape.clone() });
        }
        let axes: Axes =
            (0..r).filter(|&i| i < r - tr || (self.shape.dims()[i - (r - tr)] == 1 && x.dims()[i] != 1)).collect();
        if axes.is_empty() {
            return x.reshape_raw(self.shape.clone());
        }
        let s = super::forward(&Reduce { kind: ReduceKind::Sum, axes, keepdim: true }, &[x])?;
        s.reshape_raw(self.shape.clone())
    }
    /// The shape rule is the CPU's; the sum runs on the input's device and
    /// the reshape is a view.
    fn forward_cuda(&self, xs: &[&Tensor]) -> Result<Tensor> {
        self.forward_cpu(xs)
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        Ok(one(g.broadcast_to(xs[0].shape())?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| t.sum_to(self.shape.clone())).transpose()
    }
}

impl ReduceKind {
    /// Every reduction, once.
    pub const ALL: &'static [ReduceKind] = &[ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min, ReduceKind::LogSumExp];
}

/// This family's ops, each once (see [`crate::ops::registry`]).
pub(crate) fn family() -> Vec<Box<dyn super::DynOp>> {
    let mut ops: Vec<Box<dyn super::DynOp>> = ReduceKind::ALL
        .iter()
        .map(|kind| Box::new(Reduce { kind: kind.clone(), axes: Axes::new(), keepdim: false }) as Box<dyn super::DynOp>)
        .collect();
    for min in [false, true] {
        ops.push(Box::new(ArgReduce { axis: 0, keepdim: false, min }));
    }
    ops.push(Box::new(SumTo { shape: Shape::from(()) }));
    ops
}

/// Reductions, on tensors and graph handles alike. An empty `axes` slice
/// means every axis.
pub trait ReduceOps: Diff {
    /// Sum over `axes`.
    fn sum(&self, axes: &[isize], keepdim: bool) -> Result<Self> {
        let axes = normalize_axes("sum", axes, self.rank())?;
        Self::apply(Reduce { kind: ReduceKind::Sum, axes, keepdim }, &[self])
    }
    /// Sum of every element, as a 0-d value.
    fn sum_all(&self) -> Result<Self> {
        self.sum(&[], false)
    }
    /// Mean over `axes`.
    fn mean(&self, axes: &[isize], keepdim: bool) -> Result<Self> {
        if self.dtype().is_int() {
            // torch refuses too: the mean of integers has no integer dtype.
            return Err(Error::UnsupportedDType {
                op: "mean",
                dtype: self.dtype(),
                expected: "a float dtype; cast first, e.g. x.cast(DType::F32)?.mean(..)",
            });
        }
        let norm = normalize_axes("mean", axes, self.rank())?;
        let n: usize = norm.iter().map(|&a| self.shape().dims()[a]).product();
        self.sum(axes, keepdim)?.mul_scalar(1.0 / n as f64)
    }
    /// Mean of every element, as a 0-d value.
    fn mean_all(&self) -> Result<Self> {
        self.mean(&[], false)
    }
    /// Maximum over `axes`.
    fn max(&self, axes: &[isize], keepdim: bool) -> Result<Self> {
        let axes = normalize_axes("max", axes, self.rank())?;
        Self::apply(Reduce { kind: ReduceKind::Max, axes, keepdim }, &[self])
    }
    /// Minimum over `axes`.
    fn min(&self, axes: &[isize], keepdim: bool) -> Result<Self> {
        let axes = normalize_axes("min", axes, self.rank())?;
        Self::apply(Reduce { kind: ReduceKind::Min, axes, keepdim }, &[self])
    }
    /// log(sum(exp(x))) over `axes`, computed stably.
    fn logsumexp(&self, axes: &[isize], keepdim: bool) -> Result<Self> {
        let axes = normalize_axes("logsumexp", axes, self.rank())?;
        Self::apply(Reduce { kind: ReduceKind::LogSumExp, axes, keepdim }, &[self])
    }
    /// Index of the maximum along `axis` (i64, first occurrence).
    fn argmax(&self, axis: isize, keepdim: bool) -> Result<Self> {
        let axis = resolve_axis("argmax", axis, self.rank())?;
        Self::apply(ArgReduce { axis, keepdim, min: false }, &[self])
    }
    /// Index of the minimum along `axis` (i64, first occurrence).
    fn argmin(&self, axis: isize, keepdim: bool) -> Result<Self> {
        let axis = resolve_axis("argmin", axis, self.rank())?;
        Self::apply(ArgReduce { axis, keepdim, min: true }, &[self])
    }
    /// Sums a broadcast value back down to `shape`.
    fn sum_to(&self, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        if shape == self.shape() {
            return Ok(self.clone());
        }
        Self::apply(SumTo { shape }, &[self])
    }
}

impl<T: Diff> ReduceOps for T {}
