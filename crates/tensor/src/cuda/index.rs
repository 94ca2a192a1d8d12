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

use cudarc::driver::{result, LaunchConfig, PushKernelArg};
use smallvec::SmallVec;

use super::buffer::{storage_of, CudaBuffer};
use super::context::{driver_error, CudaDevice};
use super::launch::{device_of_src, dims_i64, info_array, launch, Arg, BLOCK};
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

/// The threads of a block that copy one row of `units` 16-byte units (or
/// elements) in the embedding kernel: `embedding_span` of
/// `kernels/index.cu`, which the grid is sized by (a block takes
/// [`BLOCK`] / span rows at once).
fn embedding_span(units: usize) -> usize {
    units.next_power_of_two().clamp(32, BLOCK as usize)
}

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
            for name in
                ["index_select", "embedding", "index_add", "gather", "scatter_add", "gather_split", "scatter_add_split"]
            {
                out.push((FILE, kernel(name, dt, idx)));
            }
            if matches!(dt, DType::F32 | DType::F16 | DType::BF16) {
                out.push((FILE, kernel("index_add_rows", dt, idx)));
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

/// Shared accumulators of `index_add_rows` a block, in floats (`IA_ACC`
/// of `kernels/index.cu`), the ids it reads at a time (`IA_IDS`) and its
/// slot flags (`IA_SLOTS`).
const IA_ACC: usize = 6144;
const IA_IDS: usize = 256;
const IA_SLOTS: usize = 48;
/// The ids a block of the row kernel's `group = 0` mode takes.
const IA_CHUNK: usize = 4;
/// Blocks the row kernel's owning mode (`group > 0`) aims at (8 an SM of an H200's
/// 132): its chunks of ids are cut to give about this many.
const IA_TARGET_BLOCKS: usize = 1056;
/// The fewest ids an owning block takes, so its one atomic a column and
/// target row is spread over at least this many rows of g.
const IA_MIN_OWNED_CHUNK: usize = 64;

/// How `index_add_rows` runs a call (see `kernels/index.cu`): threads a
/// block, ids a block, the output rows a block owns, the grid.
#[derive(Debug, Clone, PartialEq)]
struct RowsPlan {
    dtype: DType,
    sizes: [usize; 4],
    threads: u32,
    chunk: usize,
    /// Output rows a block owns (0: none, ids in chunks of `chunk`).
    group: usize,
    grid: (u32, u32),
}

impl RowsPlan {
    /// The plan for g of `dtype` at address `gp`, split as
    /// `(outer, n, inner)` into an output of `size` rows; `None` when the
    /// row kernel does not apply (another dtype, rows not a multiple of
    /// 16 bytes, an unaligned g, or no work).
    fn new(dtype: DType, gp: u64, outer: usize, size: usize, inner: usize, n: usize) -> Option<RowsPlan> {
        let e = match dtype {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 8,
            _ => return None,
        };
        if inner == 0 || !inner.is_multiple_of(e) || !gp.is_multiple_of(16) || outer * n == 0 || size == 0 {
            return None;
        }
        let units = inner / e;
        let threads = units.div_ceil(32).clamp(1, 8) * 32;
        let tile = threads * e;
        let tiles = inner.div_ceil(tile);
        // Owning output rows pays when ids outnumber a few rows: the rows
        // go to groups whose sums fit in shared memory, each block taking
        // one group's ids of its chunk (and reading the chunk's ids again
        // for each group).
        let (chunk, group) = if n > size && size <= IA_SLOTS {
            let group = (IA_ACC / tile).min(size);
            let groups = size.div_ceil(group);
            let chunks =
                (IA_TARGET_BLOCKS / (outer * tiles * groups).max(1)).clamp(1, n.div_ceil(IA_MIN_OWNED_CHUNK).max(1));
            (n.div_ceil(chunks), group)
        } else {
            (IA_CHUNK.min(IA_ACC / tile).min(IA_IDS), 0)
        };
        let groups = if group > 0 { size.div_ceil(group) } else { 1 };
        let blocks = outer * n.div_ceil(chunk) * groups;
        let grid = (blocks.clamp(1, 1 << 20) as u32, tiles.clamp(1, 65_535) as u32);
        Some(RowsPlan { dtype, sizes: [outer, size, inner, n], threads: threads as u32, chunk, group, grid })
    }

    /// Launches the plan: `ptrs` are g, the indices (of `idx`), the zeroed
    /// output and the flag.
    fn launch(&self, dev: &CudaDevice, idx: DType, ptrs: [u64; 4]) -> Result<()> {
        let name = kernel("index_add_rows", self.dtype, idx);
        let f = dev.function(FILE, &name)?;
        let cfg = LaunchConfig {
            grid_dim: (self.grid.0, self.grid.1, 1),
            block_dim: (self.threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let [outer, size, inner, n] = self.sizes.map(|v| v as i64);
        let (chunk, group) = (self.chunk as i64, self.group as i32);
        let mut b = dev.stream.launch_builder(&f);
        b.arg(&outer).arg(&size).arg(&inner).arg(&n).arg(&chunk).arg(&group);
        for p in &ptrs {
            b.arg(p);
        }
        // SAFETY: the argument list is index_add_rows's (kernels/index.cu);
        // g holds outer * n * inner elements and the output outer * size *
        // inner (the plan's sizes), the indices n, the flag one u64.
        unsafe { b.launch(cfg) }.map_err(|e| driver_error(&format!("launching {name}"), e))?;
        Ok(())
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

/// `[outer, size, inner, nax]` of a gather or scatter along `axis` of a
/// contiguous tensor of `dims` by an index of `idims` that has its dims
/// off the axis (`nax` along it), or `None` when they differ (torch lets
/// the index be smaller; the strided kernels take those).
fn split_of(axis: usize, dims: &[usize], idims: &[usize]) -> Option<[usize; 4]> {
    let same = dims.len() == idims.len() && dims.iter().zip(idims).enumerate().all(|(d, (a, b))| d == axis || a == b);
    same.then(|| {
        let outer = dims[..axis].iter().product();
        let inner = dims[axis + 1..].iter().product();
        [outer, dims[axis], inner, idims[axis]]
    })
}

/// Runs gather_split or scatter_add_split (`name`, on values of `dtype`)
/// over the contiguous indices `idx`, split as `split`; `from` and `to`
/// are the kernel's input and output. Gather takes 2 or 4 elements a
/// thread when rows allow, the 16-bit scatter 2, so the grid is sized for them
/// (the kernels grid-stride, so any grid is correct).
#[allow(clippy::too_many_arguments)]
fn along_split(
    op: &'static str,
    dev: &Arc<CudaDevice>,
    name: &str,
    dtype: DType,
    split: [usize; 4],
    idx: Src<'_>,
    from: u64,
    to: u64,
) -> Result<()> {
    let n = idx.numel();
    if n == 0 {
        return Ok(());
    }
    let inner = split[2];
    // gather_split's elements a thread (GatherVec of kernels/index.cu).
    let v = (16 / dtype.size_in_bytes().max(idx.dtype().size_in_bytes())).min(4);
    let per_thread = if name == "gather_split" && inner.is_multiple_of(v) {
        v
    } else if name != "gather_split" && matches!(dtype, DType::F16 | DType::BF16) && inner.is_multiple_of(2) {
        2
    } else {
        1
    };
    let ip = first_element_src(op, idx)?;
    let main =
        |bad: u64| launch_split(dev, &kernel(name, dtype, idx.dtype()), n / per_thread, &split, [from, ip, to, bad]);
    checked(op, dev, idx, split[1], Some(&main))
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
                // Threads for a block a group of ids (`embedding_span`), not a block an id.
                let bytes = inner * x.dtype().size_in_bytes();
                let vec16 = bytes.is_multiple_of(16) && xp.is_multiple_of(16) && out.ptr().is_multiple_of(16);
                let units = if vec16 { bytes / 16 } else { inner };
                let threads = n.div_ceil(BLOCK as usize / embedding_span(units)) * BLOCK as usize;
                launch_split(&dev, &kernel("embedding", x.dtype(), idx.dtype()), threads, &[size, inner, n], ptrs)
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
        let rows = RowsPlan::new(g.dtype(), gp, outer, size, inner, n);
        let main = |bad: u64| match &rows {
            Some(r) => r.launch(&dev, idx.dtype(), [gp, ip, out.ptr(), bad]),
            None => {
                let sizes = [outer, size, inner, n];
                launch_split(
                    &dev,
                    &kernel("index_add", g.dtype(), idx.dtype()),
                    total,
                    &sizes,
                    [gp, ip, out.ptr(), bad],
                )
            }
        };
        checked(op, &dev, idx, size, (total > 0).then_some(&main as &dyn Fn(u64) -> Result<()>))?;
        Ok(storage_of(out))
    }

    /// `x` is read through its strides, so a view needs no copy; a
    /// contiguous `x` whose index has its dims off the axis takes the split
    /// kernel.
    fn gather(&self, plan: &AxisPlan, x: Src<'_>, idx: Src<'_>) -> Result<Storage> {
        let (dev, _) = device_of_src(plan.op, x)?;
        let (out, _) = CudaBuffer::alloc(&dev, x.dtype(), idx.numel())?;
        let xp = first_element_src(plan.op, x)?;
        if let Some(split) =
            x.is_contiguous().then(|| split_of(plan.axis, x.shape().dims(), idx.shape().dims())).flatten()
        {
            along_split(plan.op, &dev, "gather_split", x.dtype(), split, idx, xp, out.ptr())?;
            return Ok(storage_of(out));
        }
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
        if let Some(split) = split_of(plan.axis, base.shape().dims(), idx.shape().dims()) {
            along_split(plan.op, &dev, "scatter_add_split", base.dtype(), split, idx, sp, out.ptr())?;
            return Ok(storage_of(out));
        }
        let target = (&strides[..], base.shape().dims());
        along_axis(plan.op, &dev, base.dtype(), plan.axis, idx, target, sp, out.ptr())?;
        Ok(storage_of(out))
    }
}
