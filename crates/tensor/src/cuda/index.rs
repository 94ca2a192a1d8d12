//! The CUDA launches of the indexing and selection ops: index_select (and
//! so embedding, which is an index_select of rows), index_add, gather,
//! scatter_add (`where` is the binary family's, in `binary.rs`).
//!
//! Indices are checked on the device, by the kernels that read them: each
//! records the lowest flat position of a bad index in a one-word flag,
//! which the host reads once per call, the only wait these ops make. A set
//! flag becomes the CPU's `Error::IndexOutOfRange` with the same position
//! and value (read back from the index tensor), and what the call allocated
//! is freed. The op has checked shapes and dtypes, once for every device.

use std::sync::Arc;

use cudarc::driver::result;
use smallvec::SmallVec;

use super::buffer::{storage_of, CudaBuffer};
use super::context::{driver_error, CudaDevice};
use super::launch::{device_of_src, dims_i64, info_array, launch, Arg};
use super::shape::{fill_bytes, first_element_src, place_src};
use super::CudaBackend;
use crate::backend::index::{AxisPlan, SplitPlan};
use crate::backend::{IndexKernels, Src};
use crate::storage::Storage;
use crate::{DType, Error, Result};

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

/// The integer (i32 or i64) at flat position `pos` of the contiguous
/// device operand `idx`: the value of a bad index or label a kernel
/// flagged, read back for the error (`what` names the read if it fails).
pub(crate) fn int_at(what: &'static str, idx: Src<'_>, pos: usize) -> Result<i64> {
    let at = first_element_src("index", idx)? + (pos * idx.dtype().size_in_bytes()) as u64;
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
    .map_err(|e| driver_error(what, e))
}

/// Checks the indices `idx` (contiguous, on `dev`) against `size` on the
/// device: `main` launches the op's kernel, given the flag's address, when
/// it reads every index; with `None` a check-only kernel does. The flag is
/// then read once; nothing is launched or read for no indices.
fn checked(
    op: &'static str,
    dev: &Arc<CudaDevice>,
    idx: Src<'_>,
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
            let ip = first_element_src(op, idx)?;
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
    Err(Error::IndexOutOfRange { op, index: int_at("reading an index", idx, position)?, position, size })
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

/// Runs gather or scatter_add (`name`, on values of `dtype`) over the
/// contiguous indices `idx` along `axis`: the indexed tensor has `strides`
/// and `dims`, `from` and `to` are the kernel's input and output.
#[allow(clippy::too_many_arguments)]
fn along_axis(
    op: &'static str,
    dev: &Arc<CudaDevice>,
    dtype: DType,
    axis: usize,
    idx: Src<'_>,
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
    let ip = first_element_src(op, idx)?;
    let main = |bad: u64| {
        let args = [
            Arg::I64(n as i64),
            Arg::I32(idx.shape().rank() as i32),
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

impl IndexKernels for CudaBackend {
    fn check_indices(&self, op: &'static str, idx: Src<'_>, size: usize) -> Result<()> {
        let (dev, _) = device_of_src(op, idx)?;
        checked(op, &dev, idx, size, None)
    }

    fn index_select(&self, plan: &SplitPlan, x: Src<'_>, idx: Src<'_>) -> Result<Storage> {
        let SplitPlan { op, axis, outer, size, inner, n, .. } = *plan;
        let (dev, _) = device_of_src(op, x)?;
        let ip = first_element_src(op, idx)?;
        let count = plan.shape.numel();
        let (out, _) = CudaBuffer::alloc(&dev, x.dtype(), count)?;
        let xp = first_element_src(op, x)?;
        let main = |bad: u64| {
            let ptrs = [xp, ip, out.ptr(), bad];
            if axis == 0 && inner >= EMBEDDING_ROW {
                launch_split(&dev, &kernel("embedding", x.dtype(), idx.dtype()), count, &[size, inner, n], ptrs)
            } else {
                let sizes = [outer, size, inner, n];
                launch_split(&dev, &kernel("index_select", x.dtype(), idx.dtype()), count, &sizes, ptrs)
            }
        };
        // With no rows around the axis the kernel visits no index: check them alone.
        checked(op, &dev, idx, size, (count > 0).then_some(&main as &dyn Fn(u64) -> Result<()>))?;
        Ok(storage_of(out))
    }

    fn index_add(&self, plan: &SplitPlan, g: Src<'_>, idx: Src<'_>) -> Result<Storage> {
        let SplitPlan { op, outer, size, inner, n, .. } = *plan;
        let (dev, _) = device_of_src(op, g)?;
        let ip = first_element_src(op, idx)?;
        let count = plan.shape.numel();
        let (out, _) = CudaBuffer::alloc(&dev, g.dtype(), count)?;
        fill_bytes(&dev, out.ptr(), 0, count * g.dtype().size_in_bytes())?;
        let gp = first_element_src(op, g)?;
        let total = g.numel();
        let main = |bad: u64| {
            let sizes = [outer, size, inner, n];
            launch_split(&dev, &kernel("index_add", g.dtype(), idx.dtype()), total, &sizes, [gp, ip, out.ptr(), bad])
        };
        checked(op, &dev, idx, size, (total > 0).then_some(&main as &dyn Fn(u64) -> Result<()>))?;
        Ok(storage_of(out))
    }

    /// `x` is read through its strides, so a view needs no copy.
    fn gather(&self, plan: &AxisPlan, x: Src<'_>, idx: Src<'_>) -> Result<Storage> {
        let (dev, _) = device_of_src(plan.op, x)?;
        let (out, _) = CudaBuffer::alloc(&dev, x.dtype(), idx.numel())?;
        let xp = first_element_src(plan.op, x)?;
        let target = (&x.layout.strides[..], x.shape().dims());
        along_axis(plan.op, &dev, x.dtype(), plan.axis, idx, target, xp, out.ptr())?;
        Ok(storage_of(out))
    }

    fn scatter_add(&self, plan: &AxisPlan, base: Src<'_>, src: Src<'_>, idx: Src<'_>) -> Result<Storage> {
        let (dev, _) = device_of_src(plan.op, base)?;
        let strides = base.shape().contiguous_strides();
        let (out, _) = CudaBuffer::alloc(&dev, base.dtype(), base.numel())?;
        place_src(plan.op, &dev, base, out.ptr(), &strides)?;
        let sp = first_element_src(plan.op, src)?;
        let target = (&strides[..], base.shape().dims());
        along_axis(plan.op, &dev, base.dtype(), plan.axis, idx, target, sp, out.ptr())?;
        Ok(storage_of(out))
    }
}
