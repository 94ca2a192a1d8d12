//! The CUDA launches of the indexing and selection ops: index_select (and
//! so embedding, which is an index_select of rows), index_add, gather,
//! scatter_add (`where` is the binary family's, in `binary.rs`).
//!
//! Indices are checked on the device, by the kernels that read them: each
//! records the lowest flat position of a bad index in a one-word flag,
//! which the host reads once per call, the only wait these ops make. A set
//! flag becomes the CPU's `Error::IndexOutOfRange` with the same position
//! and value (read back from the index tensor), and what the call allocated
//! is freed. The shape and dtype checks run on the host first, in the
//! CPU's order, so every error is the one the CPU returns.

use std::sync::Arc;

use cudarc::driver::result;
use smallvec::SmallVec;

use super::buffer::{tensor_of, CudaBuffer};
use super::context::{driver_error, CudaDevice};
use super::launch::{device_of, dims_i64, info_array, launch, Arg};
use super::shape::contiguous;
use super::shape::{fill_bytes, first_element, place};
use crate::layout::check_axis;
use crate::ops::index::split;
use crate::{DType, Error, Result, Shape, Tensor};

const FILE: &str = "index.cu";

/// Every dtype, for the kernel lists.
const DTYPES: [DType; 6] = [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64];

/// Rows at least this long are picked by the embedding kernel (a block a
/// row, no division per element); shorter ones would leave most of a
/// block idle, so they go through index_select's flat loop.
const EMBEDDING_ROW: usize = 128;

/// The indexing kernel `name` for values of `dtype` and indices of `idx`.
fn kernel(name: &str, dtype: DType, idx: DType) -> String {
    format!("{name}_{}_{}", dtype.cuda_suffix(), idx.cuda_suffix())
}

/// The kernel that only checks indices of `idx`.
fn check_kernel(idx: DType) -> String {
    format!("check_index_{}", idx.cuda_suffix())
}

/// Every kernel this module launches, as `(file, entry)`.
pub(crate) fn kernels() -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for idx in [DType::I32, DType::I64] {
        out.push((FILE, check_kernel(idx)));
        for dt in DTYPES {
            for name in ["index_select", "embedding", "index_add", "gather", "scatter_add"] {
                out.push((FILE, kernel(name, dt, idx)));
            }
        }
    }
    out
}

/// The index dtype, or the CPU's error for any other.
fn index_dtype(op: &'static str, idx: &Tensor) -> Result<DType> {
    match idx.dtype() {
        d @ (DType::I32 | DType::I64) => Ok(d),
        dtype => Err(Error::UnsupportedDType { op, dtype, expected: "int32 or int64 indices" }),
    }
}

/// The flat index at `pos` of the contiguous device tensor `idx`.
fn index_at(idx: &Tensor, pos: usize) -> Result<i64> {
    let at = first_element("index", idx)? + (pos * idx.dtype().size_in_bytes()) as u64;
    // SAFETY: `pos` is a position of `idx` (a kernel recorded it), so the
    // element lies in its buffer; the context is bound by the caller.
    unsafe {
        if idx.dtype() == DType::I32 {
            let mut v = [0i32];
            result::memcpy_dtoh_sync(&mut v, at).map(|_| i64::from(v[0]))
        } else {
            let mut v = [0i64];
            result::memcpy_dtoh_sync(&mut v, at).map(|_| v[0])
        }
    }
    .map_err(|e| driver_error("reading an index", e))
}

/// Checks the indices `idx` (contiguous, on `dev`) against `size` on the
/// device: `main` launches the op's kernel, given the flag's address, when
/// it reads every index; with `None` a check-only kernel does. The flag is
/// then read once; nothing is launched or read for no indices.
fn checked(
    op: &'static str,
    dev: &Arc<CudaDevice>,
    idx: &Tensor,
    size: usize,
    main: Option<&dyn Fn(u64) -> Result<()>>,
) -> Result<()> {
    let n = idx.numel();
    if n == 0 {
        return main.map_or(Ok(()), |f| f(0));
    }
    let (flag, _) = CudaBuffer::alloc(dev, DType::I64, 1)?;
    // All ones: no bad position yet (the kernels take the minimum).
    fill_bytes(dev, flag.ptr(), 0xff, 8)?;
    match main {
        Some(f) => f(flag.ptr())?,
        None => {
            let ip = first_element(op, idx)?;
            let args = [Arg::I64(n as i64), Arg::Ptr(ip), Arg::I64(size as i64), Arg::Ptr(flag.ptr())];
            launch(dev, FILE, &check_kernel(idx.dtype()), n, &args)?;
        }
    }
    dev.bind()?;
    let mut bad = [0u64];
    // SAFETY: the flag is one u64; the synchronous copy waits for the
    // kernels queued before it on the device's (default) stream.
    unsafe { result::memcpy_dtoh_sync(&mut bad, flag.ptr()) }.map_err(|e| driver_error("reading the index flag", e))?;
    if bad[0] == u64::MAX {
        return Ok(());
    }
    let position = bad[0] as usize;
    Err(Error::IndexOutOfRange { op, index: index_at(idx, position)?, position, size })
}

/// `shape` checked as the CPU checks it, after the indices: a shape error
/// is returned only when every index is in range, as the CPU's order has it.
fn check_shape_after_indices(
    op: &'static str,
    dev: &Arc<CudaDevice>,
    idx: &Tensor,
    size: usize,
    shape: &Shape,
    dtype: DType,
) -> Result<usize> {
    shape.check(op, dtype).or_else(|e| checked(op, dev, idx, size, None).and(Err(e)))
}

/// Launches the index_select, embedding or index_add kernel `name` over
/// `count` elements with the arguments all three take: the sizes around
/// the axis (`[outer, size, inner, n]`, or `[size, inner, n]` for
/// embedding, which runs on axis 0 only), then the addresses of the input,
/// the indices, the output and the flag.
fn launch_split(dev: &CudaDevice, name: &str, count: usize, sizes: &[usize], ptrs: [u64; 4]) -> Result<()> {
    let args: SmallVec<[Arg; 8]> = sizes.iter().map(|&s| Arg::I64(s as i64)).chain(ptrs.map(Arg::Ptr)).collect();
    launch(dev, FILE, name, count, &args)
}

/// Entries `idx` (1-D) of `x` along `axis`.
pub(crate) fn index_select(axis: usize, x: &Tensor, idx: &Tensor) -> Result<Tensor> {
    let op = "index_select";
    let x = contiguous(x)?;
    let (outer, size, inner) = split(op, x.shape(), axis, idx)?;
    let ld = index_dtype(op, idx)?;
    let (dev, _) = device_of(op, &x)?;
    let idx = contiguous(idx)?;
    let ip = first_element(op, &idx)?;
    let n = idx.numel();
    let mut shape = x.shape().clone();
    shape.0[axis] = n;
    let count = check_shape_after_indices(op, &dev, &idx, size, &shape, x.dtype())?;
    let (out, _) = CudaBuffer::alloc(&dev, x.dtype(), count)?;
    let xp = first_element(op, &x)?;
    let main = |bad: u64| {
        let ptrs = [xp, ip, out.ptr(), bad];
        if axis == 0 && inner >= EMBEDDING_ROW {
            launch_split(&dev, &kernel("embedding", x.dtype(), ld), count, &[size, inner, n], ptrs)
        } else {
            launch_split(&dev, &kernel("index_select", x.dtype(), ld), count, &[outer, size, inner, n], ptrs)
        }
    };
    // With no rows around the axis the kernel visits no index: check them alone.
    checked(op, &dev, &idx, size, (count > 0).then_some(&main as &dyn Fn(u64) -> Result<()>))?;
    Ok(tensor_of(out, shape))
}

/// Zeros with `size` entries along `axis`, to whose entry `idx[j]` slice
/// `j` of `g` is added.
pub(crate) fn index_add(axis: usize, size: usize, g: &Tensor, idx: &Tensor) -> Result<Tensor> {
    let op = "index_add";
    let g = contiguous(g)?;
    let (outer, n, inner) = split(op, g.shape(), axis, idx)?;
    let ld = index_dtype(op, idx)?;
    let (dev, _) = device_of(op, &g)?;
    let idx = contiguous(idx)?;
    let ip = first_element(op, &idx)?;
    if n != idx.numel() {
        checked(op, &dev, &idx, size, None)?;
        return Err(Error::ShapeMismatch { op, lhs: Box::new(g.shape().clone()), rhs: Box::new(idx.shape().clone()) });
    }
    let mut shape = g.shape().clone();
    shape.0[axis] = size;
    let count = check_shape_after_indices(op, &dev, &idx, size, &shape, g.dtype())?;
    let (out, _) = CudaBuffer::alloc(&dev, g.dtype(), count)?;
    fill_bytes(&dev, out.ptr(), 0, count * g.dtype().size_in_bytes())?;
    let gp = first_element(op, &g)?;
    let total = g.numel();
    let main = |bad: u64| {
        let sizes = [outer, size, inner, n];
        launch_split(&dev, &kernel("index_add", g.dtype(), ld), total, &sizes, [gp, ip, out.ptr(), bad])
    };
    checked(op, &dev, &idx, size, (total > 0).then_some(&main as &dyn Fn(u64) -> Result<()>))?;
    Ok(tensor_of(out, shape))
}

/// The CPU's check that `idx` fits `target` for gather and scatter_add:
/// the same rank, and no larger on the axes other than `axis`.
fn check_fits(op: &'static str, target: &Shape, axis: usize, idx: &Tensor) -> Result<()> {
    check_axis(op, axis, target.rank())?;
    let fits = idx.rank() == target.rank()
        && idx.dims().iter().zip(target.dims()).enumerate().all(|(a, (&i, &t))| a == axis || i <= t);
    if fits {
        Ok(())
    } else {
        Err(Error::ShapeMismatch { op, lhs: Box::new(target.clone()), rhs: Box::new(idx.shape().clone()) })
    }
}

/// Runs gather or scatter_add (`name`, on values of `dtype`) over the
/// contiguous indices `idx` along `axis`: the indexed tensor has `strides`
/// and `dims`, `from` and `to` are the kernel's input and output.
#[allow(clippy::too_many_arguments)]
fn along_axis(
    op: &'static str,
    dev: &Arc<CudaDevice>,
    dtype: DType,
    axis: usize,
    idx: &Tensor,
    (strides, dims): (&[usize], &[usize]),
    from: u64,
    to: u64,
) -> Result<()> {
    let n = idx.numel();
    if n == 0 {
        return Ok(());
    }
    let mut v = dims_i64(idx.shape());
    v.extend(strides.iter().map(|&s| s as i64));
    v.extend(dims.iter().map(|&d| d as i64));
    let info = info_array(dev, &v)?;
    let ip = first_element(op, idx)?;
    let main = |bad: u64| {
        let args = [
            Arg::I64(n as i64),
            Arg::I32(idx.rank() as i32),
            Arg::I32(axis as i32),
            Arg::Ptr(info.ptr()),
            Arg::Ptr(from),
            Arg::Ptr(ip),
            Arg::Ptr(to),
            Arg::Ptr(bad),
        ];
        launch(dev, FILE, &kernel(op, dtype, idx.dtype()), n, &args)
    };
    checked(op, dev, idx, dims[axis], Some(&main))
}

/// torch.gather: `x`'s elements with their `axis` coordinate taken from `idx`.
pub(crate) fn gather(axis: usize, x: &Tensor, idx: &Tensor) -> Result<Tensor> {
    let op = "gather";
    check_fits(op, x.shape(), axis, idx)?;
    index_dtype(op, idx)?;
    let (dev, _) = device_of(op, x)?;
    let idx = contiguous(idx)?;
    let (out, _) = CudaBuffer::alloc(&dev, x.dtype(), idx.numel())?;
    // x is read through its strides, so a view needs no copy.
    let xp = first_element(op, x)?;
    along_axis(op, &dev, x.dtype(), axis, &idx, (x.strides(), x.dims()), xp, out.ptr())?;
    Ok(tensor_of(out, idx.shape().clone()))
}

/// torch.scatter_add: a copy of `base` with `src` added at `idx` along `axis`.
pub(crate) fn scatter_add(axis: usize, base: &Tensor, src: &Tensor, idx: &Tensor) -> Result<Tensor> {
    let op = "scatter_add";
    if base.dtype() != src.dtype() {
        return Err(Error::DTypeMismatch { op, lhs: base.dtype(), rhs: src.dtype() });
    }
    if src.shape() != idx.shape() {
        return Err(Error::ShapeMismatch {
            op,
            lhs: Box::new(src.shape().clone()),
            rhs: Box::new(idx.shape().clone()),
        });
    }
    check_fits(op, base.shape(), axis, idx)?;
    index_dtype(op, idx)?;
    let (dev, _) = device_of(op, base)?;
    let src = contiguous(src)?;
    let idx = contiguous(idx)?;
    let strides = base.shape().contiguous_strides();
    let (out, _) = CudaBuffer::alloc(&dev, base.dtype(), base.numel())?;
    place(op, &dev, base, out.ptr(), &strides)?;
    let sp = first_element(op, &src)?;
    along_axis(op, &dev, base.dtype(), axis, &idx, (&strides, base.dims()), sp, out.ptr())?;
    Ok(tensor_of(out, base.shape().clone()))
}
