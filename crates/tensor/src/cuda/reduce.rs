//! The CUDA launches of the reductions (sum, max, min, logsumexp, argmax,
//! argmin, sum_to).
//!
//! Every kernel of `kernels/reduce.cu` works on the
//! last axis of a contiguous `[rows, cols]` buffer, so an axis set is
//! handled by a view that puts the kept axes first and the reduced ones
//! last, made contiguous by the copy kernel when it is not already (no copy
//! for trailing axes of a contiguous tensor). A sum over the leading axes
//! of a contiguous tensor, a bias gradient, reads it in place with the
//! column-sum kernel instead. One launch per op after that copy, or two
//! for a few long rows (chunks, then their merge); the results match the
//! CPU's, checked element by element in the tests.

use smallvec::SmallVec;

use super::buffer::{tensor_of, CudaBuffer};
use super::launch::{device_of, launch, launch_rows, Arg, BLOCK};
use super::shape::first_element;
use super::shape::{cast, contiguous};
use crate::ops::reduce::{ArgReduce, Reduce, ReduceKind, ReducePlan};
use crate::ops::Op;
use crate::{DType, Result, Shape, Tensor};

const REDUCE: &str = "reduce.cu";

/// The float dtypes every kernel here has a copy for.
const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// A kernel of `kind` on `dtype`: `stage` is "last" for the row kernels
/// (for an integer sum `dtype` is the one read; the sum is i64), "part" and
/// "merge" for the two launches of a few long rows.
fn reduce_kernel(kind: &ReduceKind, stage: &str, dtype: DType) -> String {
    let op = match kind {
        ReduceKind::Sum => "sum",
        ReduceKind::Max => "max",
        ReduceKind::Min => "min",
        ReduceKind::LogSumExp => "logsumexp",
    };
    format!("{op}_{stage}_{}", dtype.cuda_suffix())
}

/// Elements of a row each block of a split reduction takes.
const CHUNK: usize = 4096;
/// At most this many rows, each of at least two chunks, are split: fewer
/// rows than a device has multiprocessors (132 on an H100 or H200) would
/// leave most of them idle with a block per row.
const SPLIT_ROWS: usize = 128;
/// Rows a block of a split column sum takes at least.
const PART_ROWS: usize = 256;
/// Blocks a split column sum aims for: a few per multiprocessor.
const PART_BLOCKS: usize = 1024;

/// A column-sum kernel: `stage` is "" for the one launch, "part_" and
/// "merge_" for the two of many rows.
fn sum_cols_kernel(stage: &str, dtype: DType) -> String {
    format!("sum_cols_{stage}{}", dtype.cuda_suffix())
}

fn arg_kernel(min: bool, dtype: DType) -> String {
    format!("{}_last_{}", if min { "argmin" } else { "argmax" }, dtype.cuda_suffix())
}

/// Every kernel this module launches, as `(file, entry)`, made by the
/// functions the launches name them with.
pub(crate) fn kernels() -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for dt in FLOATS {
        for stage in ["last", "part", "merge"] {
            out.extend(ReduceKind::ALL.iter().map(|k| (REDUCE, reduce_kernel(k, stage, dt))));
        }
        out.extend(["", "part_", "merge_"].map(|stage| (REDUCE, sum_cols_kernel(stage, dt))));
        out.extend([false, true].map(|min| (REDUCE, arg_kernel(min, dt))));
    }
    out.extend([DType::I32, DType::I64].map(|dt| (REDUCE, reduce_kernel(&ReduceKind::Sum, "last", dt))));
    out
}

/// `x` with the kept axes first and `axes` last, contiguous, with the
/// number of rows (one per kept index) and of elements in each.
fn rows_last(x: &Tensor, axes: &[usize]) -> Result<(Tensor, usize, usize)> {
    let kept = || (0..x.rank()).filter(|a| !axes.contains(a));
    let mut perm: SmallVec<[usize; 6]> = kept().collect();
    perm.extend_from_slice(axes);
    // Not numel / cols: that is 0 for an empty reduced axis, which still
    // leaves one output per kept index.
    let rows = kept().map(|a| x.dims()[a]).product();
    let cols = axes.iter().map(|&a| x.dims()[a]).product();
    Ok((contiguous(&x.permute_raw(&perm)?)?, rows, cols))
}

/// The first launch of a split reduction: the `(rows, cols, n, x,
/// partial)` kernel `name` of `reduce.cu` on the rows at device address
/// `x`, on `blocks` blocks of [`BLOCK`] threads, into `len` partials in the
/// accumulation type of `dtype` (f64 for f64, f32 otherwise), which it
/// returns for the merge to read.
fn launch_part(
    out: &CudaBuffer,
    name: &str,
    dtype: DType,
    x: u64,
    [rows, cols, n]: [usize; 3],
    len: usize,
    blocks: usize,
) -> Result<CudaBuffer> {
    let acc = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
    let (partial, _) = CudaBuffer::alloc(&out.dev, acc, len)?;
    let args = [Arg::I64(rows as i64), Arg::I64(cols as i64), Arg::I64(n as i64), Arg::Ptr(x), Arg::Ptr(partial.ptr())];
    launch(&out.dev, REDUCE, name, blocks.saturating_mul(BLOCK as usize), &args)?;
    Ok(partial)
}

/// The sum over the leading `rows` of contiguous `x`, viewed as `[rows,
/// cols]`, into `out`: one launch, a block per tile of 32 columns, or, when
/// that makes few blocks over many rows, partial sums of row ranges (freed
/// on return) and their merge.
fn sum_leading(x: &Tensor, dims: (usize, usize), out: &CudaBuffer) -> Result<()> {
    let (rows, cols) = dims;
    if cols == 0 {
        return Ok(());
    }
    let at = first_element("sum", x)?;
    let tiles = cols.div_ceil(32);
    let parts = rows.div_ceil(PART_ROWS).min(PART_BLOCKS.div_ceil(tiles));
    if parts < 2 {
        let args = [Arg::I64(rows as i64), Arg::I64(cols as i64), Arg::Ptr(at), Arg::Ptr(out.ptr())];
        return launch(&out.dev, REDUCE, &sum_cols_kernel("", x.dtype()), tiles * BLOCK as usize, &args);
    }
    let part_rows = rows.div_ceil(parts);
    let parts = rows.div_ceil(part_rows);
    let kernel = sum_cols_kernel("part_", x.dtype());
    let partial = launch_part(out, &kernel, x.dtype(), at, [rows, cols, part_rows], parts * cols, tiles * parts)?;
    let args = [Arg::I64(parts as i64), Arg::I64(cols as i64), Arg::Ptr(partial.ptr()), Arg::Ptr(out.ptr())];
    launch(&out.dev, REDUCE, &sum_cols_kernel("merge_", x.dtype()), tiles * BLOCK as usize, &args)
}

/// A few long rows of contiguous `v`: each chunk's reduction, a block a
/// chunk, into partials in the accumulation type (freed on return), then
/// the partials of each row merged into `out`.
fn reduce_split(op: &Reduce, v: &Tensor, dims: (usize, usize), out: &CudaBuffer) -> Result<()> {
    let (rows, cols) = dims;
    let parts = cols.div_ceil(CHUNK);
    let kernel = reduce_kernel(&op.kind, "part", v.dtype());
    let at = first_element(op.name(), v)?;
    let partial = launch_part(out, &kernel, v.dtype(), at, [rows, cols, CHUNK], rows * parts, rows * parts)?;
    launch_rows(REDUCE, &reduce_kernel(&op.kind, "merge", v.dtype()), partial.ptr(), (rows, parts), out)
}

/// A reduction over `op.axes` of `x`, which the op's plan checked.
pub(crate) fn reduce(op: &Reduce, x: &Tensor, plan: &ReducePlan) -> Result<Tensor> {
    let name = op.name();
    let (shape, dtype, int_sum) = (plan.shape.clone(), plan.dtype, plan.int_sum);
    let (dev, _) = device_of(name, x)?;
    let (out, _) = CudaBuffer::alloc(&dev, dtype, shape.numel())?;
    let k = op.axes.len();
    let leading = op.axes.iter().enumerate().all(|(i, &a)| i == a) && k > 0 && k < x.rank();
    if op.kind == ReduceKind::Sum && !int_sum && leading && x.is_contiguous() {
        // Rows are the reduced (leading) indices, columns the kept ones.
        let rows: usize = x.dims()[..k].iter().product();
        let cols: usize = x.dims()[k..].iter().product();
        sum_leading(x, (rows, cols), &out)?;
    } else {
        let (v, rows, cols) = rows_last(x, &op.axes)?;
        if !int_sum && rows <= SPLIT_ROWS && cols >= 2 * CHUNK {
            reduce_split(op, &v, (rows, cols), &out)?;
        } else {
            let kernel = reduce_kernel(&op.kind, "last", x.dtype());
            launch_rows(REDUCE, &kernel, first_element(name, &v)?, (rows, cols), &out)?;
        }
    }
    Ok(tensor_of(out, shape))
}

/// argmax or argmin along `op.axis` into `shape` (the op checked both),
/// as i64 indices; integers are compared as f64, as the CPU does.
pub(crate) fn arg_reduce(op: &ArgReduce, x: &Tensor, shape: Shape) -> Result<Tensor> {
    let name = op.name();
    let x = if x.dtype().is_int() { cast(x, DType::F64)? } else { x.clone() };
    let (dev, _) = device_of(name, &x)?;
    let (out, _) = CudaBuffer::alloc(&dev, DType::I64, shape.numel())?;
    let (v, rows, cols) = rows_last(&x, &[op.axis])?;
    launch_rows(REDUCE, &arg_kernel(op.min, x.dtype()), first_element(name, &v)?, (rows, cols), &out)?;
    Ok(tensor_of(out, shape))
}
