//! Collectives among CUDA devices through NCCL (cudarc's `nccl` module),
//! on tensors where they live: nothing goes through the host. One
//! [`NcclComm`] is one rank; the communicators of a process's devices
//! come from [`NcclComm::from_devices`] (`ncclCommInitAll`), those of
//! separate processes or threads from [`NcclComm::from_rank`] with an id
//! made once by [`NcclId::new`] and shared (over MPI, say).
//!
//! Every collective is queued on the device's stream, after the kernels
//! that produced its input, so it needs no synchronisation of its own; it
//! is called by every rank of the communicator, in the same order, with
//! tensors of the same shape and dtype (NCCL's rule: it cannot check it,
//! and a rank missing a collective leaves the others waiting). Every dtype
//! tapir has is one NCCL reduces natively (f32, f64, f16, bf16, i32, i64).
//!
//! NCCL is found at run time: the system's `libnccl.so` (or the file
//! `TAPIR_NCCL_LIB` names, or the `nvidia-nccl-cu12` wheel's when its
//! folder holds a `libnccl.so`), or, with `TAPIR_CUDA=emulated`, the
//! emulated device's NCCL stand-in (`libtapir_cuda_emu_nccl.so`, beside
//! the emulator's library), which runs the collectives among the emulated
//! devices of the process. Without one every function returns an
//! [`Error::Nccl`] saying what was tried, never cudarc's panic.

use std::ffi::{c_int, c_void, CStr};
use std::sync::{Arc, OnceLock};

use cudarc::nccl::{result, sys};

use super::buffer::{tensor_of, CudaBuffer};
use super::context::{driver_error, CudaDevice};
use crate::{DType, Device, Error, Result, Tensor};

/// How an NCCL reduction combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclOp {
    /// The element-wise sum.
    Sum,
    /// The element-wise product.
    Prod,
    /// The element-wise maximum.
    Max,
    /// The element-wise minimum.
    Min,
    /// The element-wise mean (the sum divided by the number of ranks).
    Avg,
}

impl NcclOp {
    fn raw(self) -> sys::ncclRedOp_t {
        match self {
            NcclOp::Sum => sys::ncclRedOp_t::ncclSum,
            NcclOp::Prod => sys::ncclRedOp_t::ncclProd,
            NcclOp::Max => sys::ncclRedOp_t::ncclMax,
            NcclOp::Min => sys::ncclRedOp_t::ncclMin,
            NcclOp::Avg => sys::ncclRedOp_t::ncclAvg,
        }
    }
}

fn nccl_dtype(d: DType) -> sys::ncclDataType_t {
    match d {
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        DType::F64 => sys::ncclDataType_t::ncclFloat64,
        DType::F16 => sys::ncclDataType_t::ncclFloat16,
        DType::BF16 => sys::ncclDataType_t::ncclBfloat16,
        DType::I32 => sys::ncclDataType_t::ncclInt32,
        DType::I64 => sys::ncclDataType_t::ncclInt64,
    }
}

/// The NCCL library in use, loaded once (before cudarc looks it up by
/// name), or why there is none.
pub fn nccl_library() -> Result<String> {
    static LIB: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    LIB.get_or_init(super::driver::nccl_library)
        .clone()
        .map_err(|reason| Error::Nccl { op: "nccl", reason: format!("no NCCL library: {reason}") })
}

/// NCCL's version (`NCCL_VERSION_CODE`: 22703 for 2.27.3).
pub fn nccl_version() -> Result<i32> {
    nccl_library()?;
    result::get_nccl_version().map_err(|e| nccl_error("ncclGetVersion", e, None))
}

/// An NCCL error in words: NCCL's name for the code and its last message.
fn nccl_error(op: &'static str, e: result::NcclError, comm: Option<sys::ncclComm_t>) -> Error {
    // SAFETY: both return static (or thread-local) NUL-terminated strings.
    let (name, last) = unsafe {
        let name = CStr::from_ptr(sys::ncclGetErrorString(e.0)).to_string_lossy().into_owned();
        let last =
            CStr::from_ptr(sys::ncclGetLastError(comm.unwrap_or(std::ptr::null_mut()))).to_string_lossy().into_owned();
        (name, last)
    };
    let reason = if last.is_empty() { format!("{:?}: {name}", e.0) } else { format!("{:?}: {name}: {last}", e.0) };
    Error::Nccl { op, reason }
}

/// A communicator's id, made by one rank and given to every other before
/// [`NcclComm::from_rank`] (128 opaque bytes, NCCL's `ncclUniqueId`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclId(pub [u8; 128]);

impl NcclId {
    /// A fresh id (`ncclGetUniqueId`).
    pub fn new() -> Result<NcclId> {
        nccl_library()?;
        let id = result::get_uniqueid().map_err(|e| nccl_error("ncclGetUniqueId", e, None))?;
        Ok(NcclId(id.internal.map(|c| c as u8)))
    }
}

/// One rank of an NCCL communicator, on one CUDA device. It may move to
/// another thread (one thread per device is the usual layout); its drop
/// waits for the device's queued work, then destroys the communicator.
#[derive(Debug)]
pub struct NcclComm {
    comm: sys::ncclComm_t,
    dev: Arc<CudaDevice>,
    rank: usize,
    world: usize,
}

// SAFETY: an NCCL communicator may be used from any thread, one at a time;
// `NcclComm` is moved, not shared (no `Sync`), and every call goes
// through `&self` on the thread that owns it.
unsafe impl Send for NcclComm {}

fn cuda_ordinal(op: &'static str, d: Device) -> Result<usize> {
    match d {
        Device::Cuda(i) => Ok(i),
        Device::Cpu => Err(Error::invalid_arg(op, "NCCL communicates among CUDA devices; cpu is not one")),
    }
}

impl NcclComm {
    /// One communicator per device of `devices`, ranks in that order
    /// (`ncclCommInitAll`): a process driving several GPUs. The devices
    /// must be distinct.
    pub fn from_devices(devices: &[Device]) -> Result<Vec<NcclComm>> {
        const OP: &str = "NcclComm::from_devices";
        if devices.is_empty() {
            return Err(Error::invalid_arg(OP, "no devices"));
        }
        let mut ordinals = Vec::with_capacity(devices.len());
        for &d in devices {
            let i = cuda_ordinal(OP, d)?;
            if ordinals.contains(&(i as c_int)) {
                return Err(Error::invalid_arg(OP, format!("{d} is listed twice")));
            }
            ordinals.push(i as c_int);
        }
        let devs: Vec<Arc<CudaDevice>> =
            ordinals.iter().map(|&i| CudaDevice::get(i as usize)).collect::<Result<_>>()?;
        nccl_library()?;
        let mut comms = vec![std::ptr::null_mut(); devs.len()];
        // SAFETY: `comms` has room for one handle per device of the list.
        unsafe { result::comm_init_all(comms.as_mut_ptr(), devs.len() as c_int, ordinals.as_ptr()) }
            .map_err(|e| nccl_error("ncclCommInitAll", e, None))?;
        let world = devs.len();
        Ok(comms
            .into_iter()
            .zip(devs)
            .enumerate()
            .map(|(rank, (comm, dev))| NcclComm { comm, dev, rank, world })
            .collect())
    }

    /// Rank `rank` of `world` on `device`, in the communicator of `id`
    /// (`ncclCommInitRank`): returns once every rank has joined, so each
    /// rank calls it on a thread or process of its own.
    pub fn from_rank(device: Device, rank: usize, world: usize, id: NcclId) -> Result<NcclComm> {
        const OP: &str = "NcclComm::from_rank";
        if rank >= world {
            return Err(Error::invalid_arg(OP, format!("rank {rank} in a world of {world}")));
        }
        let dev = CudaDevice::get(cuda_ordinal(OP, device)?)?;
        nccl_library()?;
        dev.bind()?;
        let raw = sys::ncclUniqueId { internal: id.0.map(|b| b as std::ffi::c_char) };
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: a valid out-pointer; the id came from ncclGetUniqueId.
        unsafe { result::comm_init_rank(comm.as_mut_ptr(), world as c_int, raw, rank as c_int) }
            .map_err(|e| nccl_error("ncclCommInitRank", e, None))?;
        // SAFETY: initialised by the successful call.
        let comm = unsafe { comm.assume_init() };
        Ok(NcclComm { comm, dev, rank, world })
    }

    /// This communicator's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The device this rank's tensors live on.
    pub fn device(&self) -> Device {
        self.dev.device
    }

    /// An error unless `t` is on this rank's device.
    fn check(&self, op: &'static str, t: &Tensor) -> Result<()> {
        if t.device() != self.device() {
            return Err(Error::DeviceMismatch { op, lhs: t.device(), rhs: self.device() });
        }
        Ok(())
    }

    fn stream(&self) -> sys::cudaStream_t {
        self.dev.stream.cu_stream() as sys::cudaStream_t
    }

    /// Runs one NCCL call with the device bound to the thread.
    fn call(
        &self,
        op: &'static str,
        f: impl FnOnce() -> std::result::Result<result::NcclStatus, result::NcclError>,
    ) -> Result<()> {
        self.dev.bind()?;
        f().map(|_| ()).map_err(|e| nccl_error(op, e, Some(self.comm)))
    }

    /// Replaces `t` on every rank by the element-wise `op` of every rank's
    /// `t`, in place on the device (`ncclAllReduce`).
    pub fn all_reduce(&self, t: &mut Tensor, op: NcclOp) -> Result<()> {
        const OP: &str = "ncclAllReduce";
        self.check(OP, t)?;
        if t.numel() == 0 {
            return Ok(());
        }
        let p = super::optim::owned(OP, t)?;
        let (n, dt) = (t.numel(), nccl_dtype(t.dtype()));
        // SAFETY: `p` is the address of `t`'s own buffer of `n` elements,
        // read and written in stream order on the device's stream.
        self.call(OP, || unsafe {
            result::all_reduce(p as *const c_void, p as *mut c_void, n, dt, op.raw(), self.comm, self.stream())
        })
    }

    /// Replaces `t` on every rank by rank `root`'s (`ncclBroadcast`, in place).
    pub fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<()> {
        const OP: &str = "ncclBroadcast";
        self.check(OP, t)?;
        if root >= self.world {
            return Err(Error::invalid_arg(OP, format!("root rank {root} in a world of {}", self.world)));
        }
        if t.numel() == 0 {
            return Ok(());
        }
        let p = super::optim::owned(OP, t)?;
        let (n, dt) = (t.numel(), nccl_dtype(t.dtype()));
        // SAFETY: as in all_reduce.
        self.call(OP, || unsafe {
            result::broadcast(p as *const c_void, p as *mut c_void, n, dt, root as c_int, self.comm, self.stream())
        })
    }

    /// Every rank's `t`, concatenated in rank order into a new flat tensor
    /// of `world * t.numel()` elements on the device (`ncclAllGather`).
    pub fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        const OP: &str = "ncclAllGather";
        self.check(OP, t)?;
        let send = t.contiguous()?;
        let n = send.numel();
        let (buf, _) = CudaBuffer::alloc(&self.dev, t.dtype(), n * self.world)?;
        if n > 0 {
            let sp = super::shape::first_element(OP, &send)?;
            let rp = buf.ptr();
            let dt = nccl_dtype(t.dtype());
            // SAFETY: `sp` holds `n` elements, `rp` `world * n`.
            self.call(OP, || unsafe {
                result::all_gather(sp as *const c_void, rp as *mut c_void, n, dt, self.comm, self.stream())
            })?;
        }
        Ok(tensor_of(buf, crate::Shape::from([n * self.world])))
    }

    /// The element-wise `op` over ranks of the flat `t`, of which this rank
    /// gets block `rank` of `t.numel() / world` elements, as a new flat
    /// tensor (`ncclReduceScatter`). `t.numel()` must be a multiple of the
    /// world size.
    pub fn reduce_scatter(&self, t: &Tensor, op: NcclOp) -> Result<Tensor> {
        const OP: &str = "ncclReduceScatter";
        self.check(OP, t)?;
        if !t.numel().is_multiple_of(self.world) {
            return Err(Error::InvalidShape {
                op: OP,
                shape: Box::new(t.shape().clone()),
                reason: format!("{} elements do not split into {} equal blocks", t.numel(), self.world),
            });
        }
        let send = t.contiguous()?;
        let n = send.numel() / self.world;
        let (buf, _) = CudaBuffer::alloc(&self.dev, t.dtype(), n)?;
        if n > 0 {
            let sp = super::shape::first_element(OP, &send)?;
            let rp = buf.ptr();
            let dt = nccl_dtype(t.dtype());
            // SAFETY: `sp` holds `world * n` elements, `rp` `n`.
            self.call(OP, || unsafe {
                result::reduce_scatter(
                    sp as *const c_void,
                    rp as *mut c_void,
                    n,
                    dt,
                    op.raw(),
                    self.comm,
                    self.stream(),
                )
            })?;
        }
        Ok(tensor_of(buf, crate::Shape::from([n])))
    }

    /// Waits for this rank's queued collectives (and every other work of
    /// its device's stream).
    pub fn synchronize(&self) -> Result<()> {
        self.dev.bind()?;
        self.dev.stream.synchronize().map_err(|e| driver_error("synchronize", e))
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // The collectives queued on the stream still use the communicator.
        let _ = self.synchronize();
        // SAFETY: made by comm_init_*, destroyed once.
        let _ = unsafe { result::comm_destroy(self.comm) };
    }
}
