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

use super::buffer::{storage_of, CudaBuffer};
use super::launch::{device_of_src, launch, launch_rows, launch_warp_rows, warp_rows, Arg, BLOCK};
use super::shape::{cast_src, copy, first_element_src};
use super::CudaBackend;
use crate::backend::reduce::{ArgReducePlan, ReduceKind, ReducePlan, Rows};
use crate::backend::{ReduceKernels, Src};
use crate::storage::Storage;
use crate::{DType, Layout, Result};

const REDUCE: &str = "reduce.cu";

/// The float dtypes every kernel here has a copy for.
const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// A kernel of `kind` on `dtype`: `stage` is "last" for the row kernels
/// (for an integer sum `dtype` is the one read; the sum is i64), "part" and
/// "merge" for the two launches of a few long rows.
fn reduce_kernel(kind: &ReduceKind, stage: &str, dtype: DType) -> String {
    format!("{}_{stage}_{}", kind.name(), dtype.cuda_suffix())
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

/// The warp-per-row sum of many rows of at most 8 KiB (`warp_rows`).
fn sum_warp_kernel(dtype: DType) -> String {
    format!("sum_warp_{}", dtype.cuda_suffix())
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
        out.push((REDUCE, sum_warp_kernel(dt)));
    }
    out.extend([DType::I32, DType::I64].map(|dt| (REDUCE, reduce_kernel(&ReduceKind::Sum, "last", dt))));
    out
}

/// The device address of the first row of `x` grouped as `rows` says,
/// with the contiguous copy holding them when the view is strided (kept
/// alive by the caller until the launches are queued).
fn rows_last(op: &'static str, x: Src<'_>, rows: &Rows) -> Result<(u64, Option<Storage>)> {
    let view = rows.view(x.layout);
    let v = Src { storage: x.storage, layout: &view };
    if view.is_contiguous() {
        return Ok((first_element_src(op, v)?, None));
    }
    let dense = copy(op, v)?;
    let at = first_element_src(op, Src { storage: &dense, layout: &Layout::contiguous(view.shape.clone()) })?;
    Ok((at, Some(dense)))
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
fn sum_leading(x: Src<'_>, dims: (usize, usize), out: &CudaBuffer) -> Result<()> {
    let (rows, cols) = dims;
    if cols == 0 {
        return Ok(());
    }
    let at = first_element_src("sum", x)?;
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

/// A few long rows of `dtype` from device address `at`: each chunk's
/// reduction, a block a chunk, into partials in the accumulation type
/// (freed on return), then the partials of each row merged into `out`.
fn reduce_split(kind: &ReduceKind, dtype: DType, at: u64, dims: (usize, usize), out: &CudaBuffer) -> Result<()> {
    let (rows, cols) = dims;
    let parts = cols.div_ceil(CHUNK);
    let kernel = reduce_kernel(kind, "part", dtype);
    let partial = launch_part(out, &kernel, dtype, at, [rows, cols, CHUNK], rows * parts, rows * parts)?;
    launch_rows(REDUCE, &reduce_kernel(kind, "merge", dtype), partial.ptr(), (rows, parts), out)
}

impl ReduceKernels for CudaBackend {
    fn reduce(&self, plan: &ReducePlan, x: Src<'_>) -> Result<Storage> {
        let name = plan.kind.name();
        let (dev, _) = device_of_src(name, x)?;
        let (out, _) = CudaBuffer::alloc(&dev, plan.dtype, plan.shape.numel())?;
        let (rows, cols) = (plan.rows.rows, plan.rows.cols);
        if plan.kind == ReduceKind::Sum && !plan.int_sum && plan.leading && x.is_contiguous() {
            // Rows are the reduced (leading) indices, columns the kept ones.
            sum_leading(x, (cols, rows), &out)?;
        } else {
            let (at, _dense) = rows_last(name, x, &plan.rows)?;
            let dims = (rows, cols);
            if !plan.int_sum && rows <= SPLIT_ROWS && cols >= 2 * CHUNK {
                reduce_split(&plan.kind, x.dtype(), at, (rows, cols), &out)?;
            } else if plan.kind == ReduceKind::Sum && !plan.int_sum && warp_rows(x.dtype(), at, out.ptr(), dims) {
                launch_warp_rows(REDUCE, &sum_warp_kernel(x.dtype()), at, (rows, cols), &out)?;
            } else {
                launch_rows(REDUCE, &reduce_kernel(&plan.kind, "last", x.dtype()), at, (rows, cols), &out)?;
            }
        }
        Ok(storage_of(out))
    }

    /// Integers are compared as f64, as the CPU does.
    fn arg_reduce(&self, plan: &ArgReducePlan, x: Src<'_>) -> Result<Storage> {
        let name = if plan.min { "argmin" } else { "argmax" };
        let (wide, layout);
        let x = if x.dtype().is_int() {
            wide = cast_src(x, DType::F64)?;
            layout = Layout::contiguous(x.shape().clone());
            Src { storage: &wide, layout: &layout }
        } else {
            x
        };
        let (dev, _) = device_of_src(name, x)?;
        let (out, _) = CudaBuffer::alloc(&dev, DType::I64, plan.shape.numel())?;
        let (at, _dense) = rows_last(name, x, &plan.rows)?;
        let dims = (plan.rows.rows, plan.rows.cols);
        launch_rows(REDUCE, &arg_kernel(plan.min, x.dtype()), at, dims, &out)?;
        Ok(storage_of(out))
    }
}
