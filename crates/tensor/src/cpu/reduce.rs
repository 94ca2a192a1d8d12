//! The CPU kernels of the reductions ([`crate::backend::reduce`]): rows of the
//! reduced elements handed to the row kernels of [`crate::cpu::rows`], and
//! a sum that reads its input in place when the reduced axes lead (a bias
//! gradient) or are scattered.

use smallvec::SmallVec;

use super::{float_src, host, CpuBackend};
use crate::backend::reduce::{ArgReducePlan, ReduceKind, ReducePlan, Rows};
use crate::backend::{ReduceKernels, Src};
use crate::cpu::iter::{fill_vec_parts, PAR_MIN, SPLIT_MIN};
use crate::cpu::pool::Disjoint;
use crate::cpu::rows::RowKernels;
use crate::storage::{try_filled, CpuBuffer, CpuElement, Storage};
use crate::{with_float, DType, Layout, Result};

impl ReduceKernels for CpuBackend {
    /// f16 and bf16 through an f32 copy.
    fn reduce(&self, plan: &ReducePlan, x: Src<'_>) -> Result<Storage> {
        if plan.int_sum {
            // An integer sum is an int64 sum, wrapping past 2^63.
            let out = match x.dtype() {
                DType::I32 => {
                    reduce_rows(x, &plan.rows, |r: &[i32]| r.iter().fold(0i64, |a, &v| a.wrapping_add(v as i64)))
                }
                _ => reduce_rows(x, &plan.rows, |r: &[i64]| r.iter().fold(0i64, |a, &v| a.wrapping_add(v))),
            }?;
            return Ok(Storage::cpu(CpuBuffer::I64(out)));
        }
        float_src(
            plan.kind.name(),
            x,
            |x| with_float!(x.dtype(), T => Ok(Storage::cpu(T::wrap(float_kernel::<T>(plan, x)?))), _ => unreachable!()),
        )
    }

    /// Floats compared in their compute type, integers through f64.
    fn arg_reduce(&self, plan: &ArgReducePlan, x: Src<'_>) -> Result<Storage> {
        let to = if x.dtype().is_float() { x.dtype().compute() } else { DType::F64 };
        let (wide, layout);
        let x = if to == x.dtype() {
            x
        } else {
            wide = Storage::cpu(super::shape::cast(x, to)?);
            layout = Layout::contiguous(x.shape().clone());
            Src { storage: &wide, layout: &layout }
        };
        let min = plan.min;
        let out: Vec<i64> = with_float!(x.dtype(), T => reduce_rows(x, &plan.rows, |r: &[T]| {
            // First occurrence wins; NaN counts as the extreme, like torch.
            let mut best = 0;
            for (i, &v) in r.iter().enumerate() {
                let b = r[best];
                if b.is_nan() { break; }
                if v.is_nan() || (if min { v < b } else { v > b }) { best = i; }
            }
            best as i64
        })?, _ => unreachable!());
        Ok(Storage::cpu(CpuBuffer::I64(out)))
    }
}

fn float_kernel<T: RowKernels + CpuElement>(plan: &ReducePlan, x: Src<'_>) -> Result<Vec<T>> {
    match plan.kind {
        ReduceKind::Sum => sum_raw::<T>(x, plan),
        ReduceKind::Max => reduce_rows(x, &plan.rows, T::row_max),
        ReduceKind::Min => reduce_rows(x, &plan.rows, T::row_min),
        ReduceKind::LogSumExp => reduce_rows(x, &plan.rows, T::row_lse),
    }
}

/// Reduces each row of `x` (grouped as `rows` says) with `row`. Rows are
/// contiguous slices after at most one copy.
fn reduce_rows<T: CpuElement + Copy + Send + Sync, D: Send>(
    x: Src<'_>,
    rows: &Rows,
    row: impl Fn(&[T]) -> D + Sync,
) -> Result<Vec<D>> {
    let view = rows.view(x.layout);
    let copied;
    let data = if view.is_contiguous() {
        &host::<T>(x)[view.offset..view.offset + view.numel()]
    } else {
        copied = Storage::cpu(super::shape::copy(Src { storage: x.storage, layout: &view })?);
        host::<T>(Src { storage: &copied, layout: &view })
    };
    let (rows, reduced) = (rows.rows, rows.cols);
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
pub(crate) fn add_rows<T: CpuElement + Copy + std::ops::Add<Output = T>>(
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

/// Sum over the plan's axes, with a fast path for a contiguous input
/// reduced over its leading axes (bias gradients: accumulate whole rows, no
/// transposed copy).
fn sum_raw<T: RowKernels + CpuElement>(x: Src<'_>, plan: &ReducePlan) -> Result<Vec<T>> {
    let (axes, rank) = (&plan.axes[..], x.shape().rank());
    if plan.leading && x.is_contiguous() {
        // The reduced (leading) indices are the rows here, the kept ones
        // the columns.
        let (outer, inner) = (plan.rows.cols, plan.rows.rows);
        let data = &host::<T>(x)[x.layout.offset..x.layout.offset + x.numel()];
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
    let (rows, reduced) = (plan.rows.rows, plan.rows.cols);
    if rows == 1 && reduced >= PAR_MIN && x.is_contiguous() {
        // One big row: split it across threads.
        let data = &host::<T>(x)[x.layout.offset..x.layout.offset + x.numel()];
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
    let trailing = axes.iter().rev().enumerate().all(|(i, &a)| a == rank - 1 - i);
    if trailing {
        // Rows are contiguous after the (identity) permutation.
        return reduce_rows(x, &plan.rows, T::row_sum);
    }
    // Any other axis set: walk the input in its own order and accumulate
    // into the output through strides that are zero on reduced axes. No
    // transposed copy, and the inner loop is unit-stride on both sides when
    // an inner axis is kept.
    let dims = x.shape().dims();
    let mut out_strides: SmallVec<[usize; 6]> = SmallVec::from_elem(0, rank);
    let mut step = 1;
    for i in (0..rank).rev().filter(|i| !axes.contains(i)) {
        out_strides[i] = step;
        step *= dims[i];
    }
    let mut out = try_filled(rows, T::ZERO)?;
    let data = host::<T>(x);
    let nd = crate::cpu::iter::Nd::new(dims, [&x.layout.strides, &out_strides], [x.layout.offset, 0]);
    nd.runs(0, nd.numel(), |_, [ox, oo], len, [sx, so]| match (sx, so) {
        (1, 1) => out[oo..oo + len].iter_mut().zip(&data[ox..ox + len]).for_each(|(o, &v)| *o += v),
        (1, 0) => out[oo] += T::row_sum(&data[ox..ox + len]),
        _ => (0..len).for_each(|i| out[oo + i * so] += data[ox + i * sx]),
    });
    Ok(out)
}
