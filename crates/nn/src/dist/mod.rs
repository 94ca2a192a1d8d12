//! Training past one process or one device: a communicator over an
//! existing engine (MPI for CPU ranks, NCCL for CUDA devices), data
//! parallelism after
//! PyTorch's DistributedDataParallel ([`DataParallel`]), the optimizer state
//! sharded across ranks ([`ShardedAdam`], ZeRO stage 1), and each rank's
//! part of the data ([`DataLoader::shard`](crate::DataLoader::shard)).
//!
//! tapir writes no transport of its own: a [`Backend`] moves host buffers
//! with the engine's collectives, and [`Communicator`] puts tapir tensors of
//! any float dtype, on any device, through it (f16 and bf16 are reduced in
//! f32). A backend that reduces on the device ([`DeviceCollectives`], the
//! NCCL one) takes CUDA tensors where they live, in place, of every dtype,
//! with no copy through the host.
//!
//! ```
//! use tapir::prelude::*;
//! use tapir::nn::dist::{Communicator, ReduceOp};
//!
//! // A world of one process: every collective is the identity, so the same
//! // training code runs with or without `mpirun`.
//! let comm = Communicator::single();
//! let mut t = Tensor::from_vec(vec![1.0f32, 2.0], [2])?;
//! comm.all_reduce(&mut t, ReduceOp::Average)?;
//! assert_eq!(t.to_vec::<f32>()?, vec![1.0, 2.0]);
//! # Ok::<(), Error>(())
//! ```
//!
//! With the `mpi` feature, `Communicator::mpi()` joins the job `mpirun`
//! started (`mpirun -np 2 ./train`). With the `nccl` feature,
//! `Communicator::nccl_devices(&[Device::Cuda(0), Device::Cuda(1)])` makes
//! one communicator per GPU of this process (each moved to a thread of its
//! own), and `Communicator::nccl(device, rank, world, id)` joins a job
//! whose ranks share an `NcclId` (made by one rank, sent to the others
//! over MPI, say). On the emulated device (`TAPIR_CUDA=emulated`,
//! `TAPIR_CUDA_EMU_DEVICES=2`) NCCL is the emulator's stand-in, so the same
//! code runs in tests without a GPU.

mod ddp;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "nccl")]
mod nccl;
mod zero;

pub use ddp::{DataParallel, DdpEvent, DdpOptions};
#[cfg(feature = "nccl")]
pub use tapir_tensor::cuda::nccl::NcclId;
pub use zero::ShardedAdam;

use tapir_tensor::{DType, Device, Error, Result, ShapeOps, Tensor};

/// How a collective combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReduceOp {
    /// The element-wise sum over ranks.
    Sum,
    /// The element-wise mean over ranks (the sum divided by the world size).
    Average,
    /// The element-wise maximum over ranks.
    Max,
    /// The element-wise minimum over ranks.
    Min,
}

/// Collectives a backend runs on device tensors, in place where they
/// live (NCCL on CUDA tensors), for every dtype; [`Communicator`] sends a
/// tensor here when the backend has them ([`Backend::device`]) and through
/// the host buffers otherwise. Every tensor must be on [`device`](Self::device).
pub trait DeviceCollectives {
    /// The device this rank's tensors live on.
    fn device(&self) -> Device;
    /// `t` replaced by the element-wise `op` over ranks, in place.
    fn all_reduce(&self, t: &mut Tensor, op: ReduceOp) -> Result<()>;
    /// `t` replaced by rank `root`'s, in place.
    fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<()>;
    /// Every rank's `t`, concatenated in rank order, flat.
    fn all_gather(&self, t: &Tensor) -> Result<Tensor>;
    /// The element-wise `op` over ranks of the flat `t`, of which this
    /// rank gets block `rank` (`t.numel() / world` elements), flat.
    fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor>;
}

/// A host buffer a collective reads or writes: the two element types the
/// engines reduce natively (f16 and bf16 travel as f32).
#[derive(Debug)]
pub enum HostBuf<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// f64 elements.
    F64(&'a mut [f64]),
}

impl HostBuf<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostBuf::F32(s) => s.len(),
            HostBuf::F64(s) => s.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a collective engine provides, on host buffers. Every rank calls the
/// same collectives in the same order with buffers of the same lengths (the
/// engines' own rule); [`Communicator`] checks shapes and dtypes across ranks
/// before it relies on that.
pub trait Backend: Send {
    /// This process's rank, `0..world_size()`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// The element-wise sum over ranks, in place.
    fn all_reduce_sum(&self, buf: HostBuf<'_>) -> Result<()>;
    /// Rank `root`'s buffer, copied into every rank's.
    fn broadcast(&self, buf: HostBuf<'_>, root: usize) -> Result<()>;
    /// Every rank's `send` (of one length), concatenated in rank order into
    /// `recv` (`world_size()` times as long).
    fn all_gather(&self, send: HostBuf<'_>, recv: HostBuf<'_>) -> Result<()>;
    /// The element-wise sum over ranks of `send`, of which this rank keeps
    /// its block: `recv` is `send.len() / world_size()` long and gets
    /// elements `rank * recv.len()..` of the sum.
    fn reduce_scatter_sum(&self, send: HostBuf<'_>, recv: HostBuf<'_>) -> Result<()>;
    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()>;
    /// Ends every rank of the job at once, after printing `message`: what a
    /// rank that failed calls, so that the others end with an error instead
    /// of waiting for it forever.
    fn abort(&self, message: &str) -> !;
    /// The collectives this engine runs on device tensors in place, if it
    /// has them (NCCL); `None` (the default) sends every tensor through
    /// the host buffers above.
    fn device(&self) -> Option<&dyn DeviceCollectives> {
        None
    }
}

/// One process alone: every collective is the identity.
#[derive(Debug, Default)]
struct Single;

impl Backend for Single {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce_sum(&self, _buf: HostBuf<'_>) -> Result<()> {
        Ok(())
    }
    fn broadcast(&self, _buf: HostBuf<'_>, root: usize) -> Result<()> {
        check_root(root, 1)
    }
    fn all_gather(&self, send: HostBuf<'_>, recv: HostBuf<'_>) -> Result<()> {
        match (send, recv) {
            (HostBuf::F32(s), HostBuf::F32(r)) if s.len() == r.len() => r.copy_from_slice(s),
            (HostBuf::F64(s), HostBuf::F64(r)) if s.len() == r.len() => r.copy_from_slice(s),
            _ => return Err(Error::invalid_arg("all_gather", "send and recv differ in type or length")),
        }
        Ok(())
    }
    fn reduce_scatter_sum(&self, send: HostBuf<'_>, recv: HostBuf<'_>) -> Result<()> {
        self.all_gather(send, recv)
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn abort(&self, message: &str) -> ! {
        eprintln!("tapir: aborting: {message}");
        std::process::exit(1)
    }
}

fn check_root(root: usize, world: usize) -> Result<()> {
    if root >= world {
        return Err(Error::invalid_arg("broadcast", format!("root rank {root} in a world of {world}")));
    }
    Ok(())
}

/// A group of processes that reduce, share and gather tapir tensors.
///
/// Each collective is called by every rank, in the same order. Before it
/// relies on the engine, a collective compares the ranks' shapes and dtypes
/// (one small all-gather) and fails on every rank with an error naming the
/// tensor's shape on each rank when they differ, where the engine would
/// read past a buffer or hang. [`DataParallel`] checks its buckets once, at
/// construction, and then runs unchecked.
pub struct Communicator {
    backend: Box<dyn Backend>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Communicator(rank {} of {})", self.rank(), self.world_size())
    }
}

impl Communicator {
    /// A world of one process.
    pub fn single() -> Self {
        Communicator { backend: Box::new(Single) }
    }

    /// A communicator over any engine.
    pub fn from_backend(backend: Box<dyn Backend>) -> Self {
        Communicator { backend }
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.backend.rank()
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.backend.world_size()
    }

    /// The engine underneath.
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// Returns once every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        self.backend.barrier()
    }

    /// Ends the whole job after printing `message` (every rank, not only
    /// this one): call it when a rank fails, so that no other rank waits
    /// forever in a collective this one will never join.
    pub fn abort(&self, message: &str) -> ! {
        self.backend.abort(message)
    }

    /// The backend's device collectives, when it has them: then `t` must
    /// be on their device (an [`Error::DeviceMismatch`] otherwise, a CPU
    /// tensor given to an NCCL communicator, say).
    fn on_device(&self, op: &'static str, t: &Tensor) -> Result<Option<&dyn DeviceCollectives>> {
        match self.backend.device() {
            Some(d) if t.device() != d.device() => Err(Error::DeviceMismatch { op, lhs: t.device(), rhs: d.device() }),
            other => Ok(other),
        }
    }

    /// Replaces `t` on every rank by the element-wise sum (mean, maximum,
    /// minimum) of its values over ranks. `t` keeps its shape, dtype and
    /// device; on a device backend it is reduced in place there.
    pub fn all_reduce(&self, t: &mut Tensor, op: ReduceOp) -> Result<()> {
        let device = self.on_device("all_reduce", t)?;
        self.agree("all_reduce", t)?;
        if let Some(d) = device {
            return d.all_reduce(t, op);
        }
        let world = self.world_size();
        if matches!(op, ReduceOp::Max | ReduceOp::Min) {
            // Every rank's values, then the extreme of each element here:
            // the host engines are asked for sums only.
            let mut send = Staged::from(t)?;
            let mut all = Staged::zeros(send.dtype(), t.numel() * world);
            self.backend.all_gather(send.as_buf(), all.as_buf())?;
            let pick = |a: f64, b: f64| if op == ReduceOp::Max { a.max(b) } else { a.min(b) };
            let n = t.numel();
            let out = match all {
                Staged::F32(v) => Staged::F32(
                    (0..n)
                        .map(|i| (1..world).fold(v[i], |acc, r| pick(acc as f64, v[r * n + i] as f64) as f32))
                        .collect(),
                ),
                Staged::F64(v) => {
                    Staged::F64((0..n).map(|i| (1..world).fold(v[i], |acc, r| pick(acc, v[r * n + i]))).collect())
                }
            };
            *t = out.into_tensor(t.dims().to_vec(), t.dtype(), t.device())?;
            return Ok(());
        }
        let scale = (op == ReduceOp::Average).then(|| 1.0 / world as f64);
        // A host tensor of a type the engines reduce is reduced where it
        // lies (copied first only if shared or strided): no staging copy
        // there and back.
        match (t.device(), t.dtype()) {
            (Device::Cpu, DType::F32) => {
                let s = t.make_mut::<f32>()?;
                self.backend.all_reduce_sum(HostBuf::F32(&mut *s))?;
                if let Some(k) = scale {
                    s.iter_mut().for_each(|x| *x = (*x as f64 * k) as f32);
                }
            }
            (Device::Cpu, DType::F64) => {
                let s = t.make_mut::<f64>()?;
                self.backend.all_reduce_sum(HostBuf::F64(&mut *s))?;
                if let Some(k) = scale {
                    s.iter_mut().for_each(|x| *x *= k);
                }
            }
            _ => {
                *t = through_host(t, t.shape().dims().to_vec(), |buf| {
                    self.backend.all_reduce_sum(buf.as_buf())?;
                    if let Some(k) = scale {
                        buf.scale(k);
                    }
                    Ok(())
                })?;
            }
        }
        Ok(())
    }

    /// Replaces `t` on every rank by rank `root`'s value.
    pub fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<()> {
        check_root(root, self.world_size())?;
        let device = self.on_device("broadcast", t)?;
        self.agree("broadcast", t)?;
        if let Some(d) = device {
            return d.broadcast(t, root);
        }
        *t = through_host(t, t.shape().dims().to_vec(), |buf| self.backend.broadcast(buf.as_buf(), root))?;
        Ok(())
    }

    /// Every rank's `t` stacked along a new leading axis, in rank order:
    /// `[world, ...t.shape]` (torch's `all_gather_into_tensor`, stacked).
    pub fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        let device = self.on_device("all_gather", t)?;
        self.agree("all_gather", t)?;
        let mut dims = vec![self.world_size()];
        dims.extend_from_slice(t.dims());
        if let Some(d) = device {
            return d.all_gather(t)?.reshape(dims);
        }
        let mut send = Staged::from(t)?;
        let mut recv = Staged::zeros(send.dtype(), t.numel() * self.world_size());
        self.backend.all_gather(send.as_buf(), recv.as_buf())?;
        recv.into_tensor(dims, t.dtype(), t.device())
    }

    /// The element-wise sum (mean, maximum, minimum) over ranks of `t`, of
    /// which rank `r` gets block `r` along the first axis: `t`'s first
    /// dimension must be a multiple of the world size, and the result is
    /// `[d0 / world, ...]`.
    pub fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let world = self.world_size();
        let d0 = t.dims().first().copied().unwrap_or(0);
        if t.rank() == 0 || d0 % world != 0 {
            return Err(Error::InvalidShape {
                op: "reduce_scatter",
                shape: Box::new(t.shape().clone()),
                reason: format!("the first dimension must be a multiple of the world size {world}"),
            });
        }
        let device = self.on_device("reduce_scatter", t)?;
        self.agree("reduce_scatter", t)?;
        let mut dims = t.dims().to_vec();
        dims[0] /= world;
        if let Some(d) = device {
            return d.reduce_scatter(t, op)?.reshape(dims);
        }
        if matches!(op, ReduceOp::Max | ReduceOp::Min) {
            let mut full = t.clone();
            self.all_reduce(&mut full, op)?;
            return full.narrow(0, self.rank() * dims[0], dims[0]);
        }
        let mut send = Staged::from(t)?;
        let mut recv = Staged::zeros(send.dtype(), t.numel() / world);
        self.backend.reduce_scatter_sum(send.as_buf(), recv.as_buf())?;
        if op == ReduceOp::Average {
            recv.scale(1.0 / world as f64);
        }
        recv.into_tensor(dims, t.dtype(), t.device())
    }

    /// An error on every rank unless every rank passes a tensor of the same
    /// shape and dtype to collective `op` (one all-gather of a few numbers).
    pub(crate) fn agree(&self, op: &'static str, t: &Tensor) -> Result<()> {
        self.agree_on(op, t.dtype(), t.dims())
    }

    /// [`agree`](Self::agree) for a described buffer.
    pub(crate) fn agree_on(&self, op: &'static str, dtype: DType, dims: &[usize]) -> Result<()> {
        let world = self.world_size();
        if world == 1 {
            return Ok(());
        }
        // A fixed-size descriptor: dtype, rank, and up to 6 dimensions
        // (exact in f64 below 2^53), so ranks of any shape exchange the same
        // number of values.
        const SLOTS: usize = 8;
        let mut mine = [0f64; SLOTS];
        mine[0] = dtype_code(dtype);
        mine[1] = dims.len() as f64;
        for (k, &d) in dims.iter().take(SLOTS - 2).enumerate() {
            mine[2 + k] = d as f64;
        }
        if dims.len() > SLOTS - 2 {
            // Longer shapes: the remaining dimensions folded into the last slot.
            mine[SLOTS - 1] = dims[SLOTS - 3..].iter().fold(0f64, |acc, &d| (acc * 1_000_003.0 + d as f64) % 9.0e15);
        }
        let mut all = vec![0f64; SLOTS * world];
        self.backend.all_gather(HostBuf::F64(&mut mine), HostBuf::F64(&mut all))?;
        let first = &all[..SLOTS];
        if all.chunks(SLOTS).all(|c| c == first) {
            return Ok(());
        }
        let describe = |c: &[f64]| {
            let n = c[1] as usize;
            let shown: Vec<String> = c[2..2 + n.min(SLOTS - 2)].iter().map(|d| (*d as usize).to_string()).collect();
            format!("{} [{}]", dtype_name(c[0]), shown.join(", "))
        };
        let per_rank: Vec<String> =
            all.chunks(SLOTS).enumerate().map(|(r, c)| format!("rank {r}: {}", describe(c))).collect();
        Err(Error::invalid_arg(
            op,
            format!("the ranks passed tensors of different shapes or dtypes ({})", per_rank.join("; ")),
        ))
    }
}

/// The dtypes a descriptor names, by position.
const DTYPES: [DType; 6] = [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64];

fn dtype_code(d: DType) -> f64 {
    DTYPES.iter().position(|&x| x == d).map_or(-1.0, |p| p as f64)
}

fn dtype_name(code: f64) -> String {
    DTYPES.get(code as usize).map_or_else(|| "?".to_string(), |d| d.to_string())
}

/// A tensor's elements on the host, in the type the engines reduce.
pub(crate) enum Staged {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl Staged {
    /// The buffer type `dtype` travels as: f64 as itself, every other float
    /// as f32.
    pub(crate) fn carrier(dtype: DType) -> Result<DType> {
        match dtype {
            DType::F64 => Ok(DType::F64),
            DType::F32 | DType::F16 | DType::BF16 => Ok(DType::F32),
            other => Err(Error::UnsupportedDType { op: "collective", dtype: other, expected: "a float dtype" }),
        }
    }

    pub(crate) fn zeros(carrier: DType, n: usize) -> Self {
        match carrier {
            DType::F64 => Staged::F64(vec![0.0; n]),
            _ => Staged::F32(vec![0.0; n]),
        }
    }

    pub(crate) fn from(t: &Tensor) -> Result<Self> {
        Ok(match Self::carrier(t.dtype())? {
            DType::F64 => Staged::F64(t.to_vec::<f64>()?),
            _ if t.dtype() == DType::F32 => Staged::F32(t.to_vec::<f32>()?),
            _ => Staged::F32(t.cast(DType::F32)?.to_vec::<f32>()?),
        })
    }

    pub(crate) fn dtype(&self) -> DType {
        match self {
            Staged::F32(_) => DType::F32,
            Staged::F64(_) => DType::F64,
        }
    }

    pub(crate) fn as_buf(&mut self) -> HostBuf<'_> {
        match self {
            Staged::F32(v) => HostBuf::F32(v),
            Staged::F64(v) => HostBuf::F64(v),
        }
    }

    /// A copy of elements `start..start + len`.
    pub(crate) fn range(&self, start: usize, len: usize) -> Self {
        match self {
            Staged::F32(v) => Staged::F32(v[start..start + len].to_vec()),
            Staged::F64(v) => Staged::F64(v[start..start + len].to_vec()),
        }
    }

    pub(crate) fn scale(&mut self, k: f64) {
        match self {
            Staged::F32(v) => v.iter_mut().for_each(|x| *x = (*x as f64 * k) as f32),
            Staged::F64(v) => v.iter_mut().for_each(|x| *x *= k),
        }
    }

    /// Back into a tensor of `dtype` on `device`.
    pub(crate) fn into_tensor(self, dims: Vec<usize>, dtype: DType, device: Device) -> Result<Tensor> {
        let t = match self {
            Staged::F32(v) => Tensor::from_vec(v, dims)?,
            Staged::F64(v) => Tensor::from_vec(v, dims)?,
        };
        let t = if t.dtype() == dtype { t } else { t.cast(dtype)? };
        t.to_device(device)
    }
}

/// `t`'s elements through `f` on the host, back as a tensor like `t`.
fn through_host(t: &Tensor, dims: Vec<usize>, f: impl FnOnce(&mut Staged) -> Result<()>) -> Result<Tensor> {
    let mut staged = Staged::from(t)?;
    f(&mut staged)?;
    staged.into_tensor(dims, t.dtype(), t.device())
}
