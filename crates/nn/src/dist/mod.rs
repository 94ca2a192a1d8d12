//! Training past one process: a communicator over an existing engine (MPI
//! for CPU ranks; NCCL for GPUs is the next backend), data parallelism after
//! PyTorch's DistributedDataParallel ([`DataParallel`]), the optimizer state
//! sharded across ranks ([`ShardedAdam`], ZeRO stage 1), and each rank's
//! part of the data ([`DataLoader::shard`](crate::DataLoader::shard)).
//!
//! tapir writes no transport of its own: a [`Backend`] moves host buffers
//! with the engine's collectives, and [`Communicator`] puts tapir tensors of
//! any float dtype, on any device, through it (f16 and bf16 are reduced in
//! f32; a device tensor is staged through the host until the NCCL backend
//! reduces it where it lives).
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
//! started (`mpirun -np 2 ./train`).

mod ddp;
#[cfg(feature = "mpi")]
mod mpi;
mod zero;

pub use ddp::{DataParallel, DdpEvent, DdpOptions};
pub use zero::ShardedAdam;

use tapir_tensor::{DType, Device, Error, Result, ShapeOps, Tensor};

/// How a collective combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// The element-wise sum over ranks.
    Sum,
    /// The element-wise mean over ranks (the sum divided by the world size).
    Average,
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

    /// Replaces `t` on every rank by the element-wise sum (or mean) of its
    /// values over ranks. `t` keeps its shape, dtype and device.
    pub fn all_reduce(&self, t: &mut Tensor, op: ReduceOp) -> Result<()> {
        self.agree("all_reduce", t)?;
        let world = self.world_size() as f64;
        *t = through_host(t, t.shape().dims().to_vec(), |buf| {
            self.backend.all_reduce_sum(buf.as_buf())?;
            if op == ReduceOp::Average {
                buf.scale(1.0 / world);
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Replaces `t` on every rank by rank `root`'s value.
    pub fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<()> {
        check_root(root, self.world_size())?;
        self.agree("broadcast", t)?;
        *t = through_host(t, t.shape().dims().to_vec(), |buf| self.backend.broadcast(buf.as_buf(), root))?;
        Ok(())
    }

    /// Every rank's `t` stacked along a new leading axis, in rank order:
    /// `[world, ...t.shape]` (torch's `all_gather_into_tensor`, stacked).
    pub fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        self.agree("all_gather", t)?;
        let mut dims = vec![self.world_size()];
        dims.extend_from_slice(t.dims());
        let mut send = Staged::from(t)?;
        let mut recv = Staged::zeros(send.dtype(), t.numel() * self.world_size());
        self.backend.all_gather(send.as_buf(), recv.as_buf())?;
        recv.into_tensor(dims, t.dtype(), t.device())
    }

    /// The element-wise sum (or mean) over ranks of `t`, of which rank `r`
    /// gets block `r` along the first axis: `t`'s first dimension must be a
    /// multiple of the world size, and the result is `[d0 / world, ...]`.
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
        self.agree("reduce_scatter", t)?;
        let mut dims = t.dims().to_vec();
        dims[0] /= world;
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

    fn dtype(&self) -> DType {
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
