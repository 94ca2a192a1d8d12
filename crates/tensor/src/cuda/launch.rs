//! The CUDA launch toolkit every family's launches share: the operand's
//! device and address, the kernels' argument list and grid, the dims and
//! strides array (`info`) the strided kernels read, and the two-operand
//! elementwise launch of `kernels/elementwise.cu`.

use std::sync::Arc;

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::buffer::{buffer_of_storage, storage_of, CudaBuffer};
use super::context::{driver_error, CudaDevice};
use crate::backend::Src;
use crate::storage::Storage;
use crate::{DType, Error, Layout, Result, Shape, Tensor};

/// Threads a block for the elementwise kernels.
pub(crate) const BLOCK: u32 = 256;
/// Blocks at most: the kernels loop over the rest with a grid stride.
const MAX_BLOCKS: usize = 4096;

/// A kernel argument by value.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg {
    I64(i64),
    I32(i32),
    Ptr(u64),
    F64(f64),
}

/// The device a CUDA op runs on, from its first input.
pub(crate) fn device_of(op: &'static str, t: &Tensor) -> Result<(Arc<CudaDevice>, u64)> {
    device_of_src(op, t.src())
}

/// The device a CUDA kernel runs on and the operand's address, from its
/// storage.
pub(crate) fn device_of_src(op: &'static str, x: Src<'_>) -> Result<(Arc<CudaDevice>, u64)> {
    // A device buffer of another backend (a test's stand-in) has no kernels here.
    let buf = buffer_of_storage(x.storage).ok_or(Error::Unsupported { op, device: x.device() })?;
    Ok((buf.dev.clone(), buf.ptr()))
}

/// Launches `name` of `file` over `n` elements with `args`.
pub(crate) fn launch(dev: &CudaDevice, file: &'static str, name: &str, n: usize, args: &[Arg]) -> Result<()> {
    launch_blocks(dev, file, name, n.div_ceil(BLOCK as usize), BLOCK, args)
}

/// Launches `name` of `file` over `n` items on at most `max_blocks` blocks
/// of [`BLOCK`] threads: for kernels whose threads share set-up work
/// across the items they grid-stride over, so that fewer threads each
/// take more items.
pub(crate) fn launch_capped(
    dev: &CudaDevice,
    file: &'static str,
    name: &str,
    n: usize,
    max_blocks: usize,
    args: &[Arg],
) -> Result<()> {
    launch_blocks(dev, file, name, n.div_ceil(BLOCK as usize).min(max_blocks), BLOCK, args)
}

/// Launches `name` of `file` on `blocks` blocks (at most [`MAX_BLOCKS`]:
/// the kernels grid-stride) of `threads` threads with `args`.
fn launch_blocks(
    dev: &CudaDevice,
    file: &'static str,
    name: &str,
    blocks: usize,
    threads: u32,
    args: &[Arg],
) -> Result<()> {
    let f = dev.function(file, name)?;
    let blocks = blocks.clamp(1, MAX_BLOCKS) as u32;
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
    let mut b = dev.stream.launch_builder(&f);
    for a in args {
        match a {
            Arg::I64(v) => b.arg(v),
            Arg::I32(v) => b.arg(v),
            Arg::Ptr(v) => b.arg(v),
            Arg::F64(v) => b.arg(v),
        };
    }
    // SAFETY: each kernel's argument list is the one its file's header
    // documents, and every pointer is a live block at least as large as
    // the kernel reads or writes (the sizes are computed from the layouts).
    unsafe { b.launch(cfg) }.map_err(|e| driver_error(&format!("launching {name}"), e))?;
    Ok(())
}

/// The longest row the row kernels give a warp instead of a block
/// (`SHORT_ROW` of `kernels/common.cuh`). The kernels pick the split
/// themselves and grid-stride, so this only sizes the grid.
const SHORT_ROW: usize = 64;

/// Launches a `(rows, cols, x, out)` kernel of `file` on the rows at
/// device address `x`: a block of [`BLOCK`] threads a row, or a warp a
/// short row, as many rows at once as the grid allows.
pub(crate) fn launch_rows(
    file: &'static str,
    name: &str,
    x: u64,
    dims: (usize, usize),
    out: &CudaBuffer,
) -> Result<()> {
    let per_row = if dims.1 <= SHORT_ROW { 32 } else { BLOCK as usize };
    launch_rows_of(file, name, x, dims, out, (per_row, BLOCK))
}

/// A `(rows, cols, x, out)` kernel of `file` with `per_row` threads a row,
/// `threads` a block.
fn launch_rows_of(
    file: &'static str,
    name: &str,
    x: u64,
    dims: (usize, usize),
    out: &CudaBuffer,
    (per_row, threads): (usize, u32),
) -> Result<()> {
    let (rows, cols) = dims;
    if rows == 0 {
        return Ok(());
    }
    let args = [Arg::I64(rows as i64), Arg::I64(cols as i64), Arg::Ptr(x), Arg::Ptr(out.ptr())];
    launch_blocks(&out.dev, file, name, rows.saturating_mul(per_row).div_ceil(threads as usize), threads, &args)
}

/// The longest row, in bytes, the warp-per-row kernels that hold a row in
/// registers take (`WARP_ROW_UNITS` 16-byte units a lane of
/// `kernels/common.cuh`: 4,096 f16 or bf16, 2,048 f32, 1,024 f64).
const WARP_ROW_BYTES: usize = 32 * 16 * 16;
/// Rows at least for them: a block of [`BLOCK`] / 32 rows for about each
/// of the 132 multiprocessors of an H100 or H200. Fewer rows keep a block
/// a row, which spreads them over more of the device.
const WARP_ROW_MIN_ROWS: usize = 1024;

/// Whether `dims` rows of `dtype` read from device address `x` and written
/// to `out` take a `*_warp_*` kernel ([`launch_warp_rows`]) instead of the
/// block-per-row one: many rows of whole 16-byte units, at most
/// [`WARP_ROW_BYTES`] long, from 16-byte aligned addresses.
pub(crate) fn warp_rows(dtype: DType, x: u64, out: u64, dims: (usize, usize)) -> bool {
    warp_rows_of(dtype, x, out, dims, WARP_ROW_BYTES)
}

/// The longest row, in bytes, the softmax warp kernels take (8 units a
/// lane: their U = 16 loop would set 128 registers for every row); longer
/// rows take the block kernels ([`block_reg_rows`]).
const SOFTMAX_WARP_ROW_BYTES: usize = WARP_ROW_BYTES / 2;

/// [`warp_rows`] for the softmax warp kernels: rows of at most
/// [`SOFTMAX_WARP_ROW_BYTES`].
pub(crate) fn softmax_warp_rows(dtype: DType, x: u64, out: u64, dims: (usize, usize)) -> bool {
    warp_rows_of(dtype, x, out, dims, SOFTMAX_WARP_ROW_BYTES)
}

fn warp_rows_of(dtype: DType, x: u64, out: u64, dims: (usize, usize), max_bytes: usize) -> bool {
    let (rows, cols) = dims;
    let bytes = cols.saturating_mul(dtype.size_in_bytes());
    rows >= WARP_ROW_MIN_ROWS
        && bytes > 0
        && bytes <= max_bytes
        && bytes.is_multiple_of(16)
        && x.is_multiple_of(16)
        && out.is_multiple_of(16)
}

/// Launches a `(rows, cols, x, out)` `*_warp_*` kernel of `file` (see
/// [`warp_rows`]): a warp a row, [`BLOCK`] / 32 rows a block, the blocks
/// striding on past [`MAX_BLOCKS`].
pub(crate) fn launch_warp_rows(
    file: &'static str,
    name: &str,
    x: u64,
    dims: (usize, usize),
    out: &CudaBuffer,
) -> Result<()> {
    launch_rows_of(file, name, x, dims, out, (32, BLOCK))
}

/// Units (16 bytes) a thread at most of the block-per-row kernels that
/// hold a row in registers (`softmax_block<U>_*` of `kernels/softmax.cu`,
/// U = 1, 2, 4 or 8).
const REG_ROW_UNITS: usize = 8;
/// Units a thread those kernels aim at: enough to amortise the block's two
/// reductions, few enough to spread a row over many warps.
const REG_ROW_TARGET_UNITS: usize = 4;

/// The threads a row and units a thread (U) of a `*_block<U>_*` kernel (a
/// block a row, the row in registers, `softmax_reg_rows` of
/// `kernels/softmax.cu`) for `dims` rows of `dtype` read from `x` and
/// written to `out`, or `None` where the block-per-row kernel that reads
/// the row twice stays: rows [`softmax_warp_rows`] does not take, longer
/// than a short row, of whole 16-byte units from 16-byte aligned addresses, at
/// most 1,024 x [`REG_ROW_UNITS`] units (128 KiB). The threads are the
/// power of two, 32 to 1,024, that gives each about
/// [`REG_ROW_TARGET_UNITS`] units; U the power of two that covers the row.
pub(crate) fn block_reg_rows(dtype: DType, x: u64, out: u64, dims: (usize, usize)) -> Option<(usize, usize)> {
    let (rows, cols) = dims;
    let bytes = cols.saturating_mul(dtype.size_in_bytes());
    let units = bytes / 16;
    let fits = rows > 0
        && !softmax_warp_rows(dtype, x, out, dims)
        && cols > SHORT_ROW
        && bytes.is_multiple_of(16)
        && units <= 1024 * REG_ROW_UNITS
        && x.is_multiple_of(16)
        && out.is_multiple_of(16);
    fits.then(|| {
        let threads = units.div_ceil(REG_ROW_TARGET_UNITS).next_power_of_two().clamp(32, 1024);
        (threads, units.div_ceil(threads).next_power_of_two())
    })
}

/// Launches a `(rows, cols, x, out)` `*_block_*` kernel of `file` with
/// `threads` a block (from [`block_reg_rows`]), a block a row.
pub(crate) fn launch_block_reg_rows(
    file: &'static str,
    name: &str,
    x: u64,
    dims: (usize, usize),
    out: &CudaBuffer,
    threads: usize,
) -> Result<()> {
    launch_rows_of(file, name, x, dims, out, (threads, threads as u32))
}

/// The kernel-name suffix of a float dtype.
pub(crate) fn float_suffix(op: &'static str, dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::F64 => Ok("f64"),
        DType::F16 => Ok("f16"),
        DType::BF16 => Ok("bf16"),
        // The CPU's words, so an error reads the same from either device.
        _ => Err(Error::UnsupportedDType { op, dtype, expected: "a float dtype" }),
    }
}

/// A view's strides (of layout `t`) as seen from `out` (numpy broadcasting: leading dims
/// missing and size-1 dims that broadcast get stride 0).
pub(crate) fn broadcast_strides_of(t: &Layout, out: &Shape) -> Vec<i64> {
    let (r, rt) = (out.rank(), t.shape.rank());
    (0..r)
        .map(|i| {
            if i < r - rt {
                return 0;
            }
            let j = i - (r - rt);
            if t.shape.dims()[j] == 1 && out.dims()[i] != 1 {
                0
            } else {
                t.strides[j] as i64
            }
        })
        .collect()
}

/// A device array of i64 (the kernels' `info`), freed when dropped.
pub(crate) fn info_array(dev: &Arc<CudaDevice>, values: &[i64]) -> Result<CudaBuffer> {
    let (buf, _) = CudaBuffer::alloc(dev, DType::I64, values.len())?;
    dev.bind()?;
    // SAFETY: the block holds `values.len()` i64s.
    unsafe { cudarc::driver::result::memcpy_htod_sync(buf.ptr(), values) }
        .map_err(|e| driver_error("copy of kernel dims", e))?;
    Ok(buf)
}

pub(crate) fn dims_i64(shape: &Shape) -> Vec<i64> {
    shape.dims().iter().map(|&d| d as i64).collect()
}

/// The `info` of a two-operand kernel (dims, a's strides, b's strides), or
/// none when both operands are contiguous in the output's shape.
pub(crate) fn pair_info(
    dev: &Arc<CudaDevice>,
    a: Src<'_>,
    b: Option<Src<'_>>,
    shape: &Shape,
) -> Result<Option<CudaBuffer>> {
    let plain = |t: Src<'_>| t.is_contiguous() && t.shape() == shape;
    if plain(a) && b.is_none_or(plain) {
        return Ok(None);
    }
    let mut v = dims_i64(shape);
    v.extend(broadcast_strides_of(a.layout, shape));
    match b {
        Some(b) => v.extend(broadcast_strides_of(b.layout, shape)),
        None => v.extend(std::iter::repeat_n(0, shape.rank())),
    }
    Ok(Some(info_array(dev, &v)?))
}

/// A two-operand kernel of elementwise.cu named `kernel`, broadcasting to `shape`.
pub(crate) fn pair(
    op: &'static str,
    kernel: &str,
    suffix: &str,
    a: Src<'_>,
    b: Src<'_>,
    shape: &Shape,
) -> Result<Storage> {
    pair_flagged(op, kernel, suffix, a, b, shape, None)
}

/// [`pair`], with the address of a flag the kernel takes after the output.
pub(crate) fn pair_flagged(
    op: &'static str,
    kernel: &str,
    suffix: &str,
    a: Src<'_>,
    b: Src<'_>,
    shape: &Shape,
    flag: Option<u64>,
) -> Result<Storage> {
    let (dev, ap) = device_of_src(op, a)?;
    let (_, bp) = device_of_src(op, b)?;
    let n = shape.numel();
    let (out, _) = CudaBuffer::alloc(&dev, a.dtype(), n)?;
    if n > 0 {
        let info = pair_info(&dev, a, Some(b), shape)?;
        let mut args = vec![
            Arg::I64(n as i64),
            Arg::I32(shape.rank() as i32),
            Arg::Ptr(info.as_ref().map_or(0, CudaBuffer::ptr)),
            Arg::Ptr(ap),
            Arg::I64(a.layout.offset as i64),
            Arg::Ptr(bp),
            Arg::I64(b.layout.offset as i64),
            Arg::Ptr(out.ptr()),
        ];
        args.extend(flag.map(Arg::Ptr));
        launch(&dev, "elementwise.cu", &format!("{kernel}_{suffix}"), n, &args)?;
    }
    Ok(storage_of(out))
}
