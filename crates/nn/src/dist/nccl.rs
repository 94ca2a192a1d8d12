//! The NCCL backend: ranks on CUDA devices, their tensors reduced in place
//! on the device by NCCL (through `tapir_tensor::cuda::nccl`, cudarc's
//! bindings). One process may drive several devices (one communicator per
//! device, from [`Communicator::nccl_devices`], each on a thread of its
//! own), or each process one device of a job whose ranks share an
//! [`NcclId`] ([`Communicator::nccl`]).

use super::{Backend, Communicator, DeviceCollectives, HostBuf, ReduceOp};
use tapir_tensor::cuda::nccl::{NcclComm, NcclId, NcclOp};
use tapir_tensor::{Device, Error, Result, ShapeOps, Tensor};

/// One rank of an NCCL communicator.
pub(super) struct Nccl {
    pub(super) comm: NcclComm,
}

impl Communicator {
    /// One communicator per device of `devices` (distinct CUDA devices of
    /// this process), ranks in that order (`ncclCommInitAll`). Move each
    /// to the thread that drives its device: every rank must call the
    /// same collectives in the same order, so one thread cannot run the
    /// ranks one after the other.
    pub fn nccl_devices(devices: &[Device]) -> Result<Vec<Communicator>> {
        let comms = NcclComm::from_devices(devices)?;
        Ok(comms.into_iter().map(|comm| Communicator::from_backend(Box::new(Nccl { comm }))).collect())
    }

    /// Rank `rank` of `world` on `device`, in the NCCL job of `id` (made
    /// once by [`NcclId::new`] and given to every rank): returns once every
    /// rank has joined.
    pub fn nccl(device: Device, rank: usize, world: usize, id: NcclId) -> Result<Communicator> {
        let comm = NcclComm::from_rank(device, rank, world, id)?;
        Ok(Communicator::from_backend(Box::new(Nccl { comm })))
    }
}

fn nccl_op(op: ReduceOp) -> NcclOp {
    match op {
        ReduceOp::Sum => NcclOp::Sum,
        ReduceOp::Average => NcclOp::Avg,
        ReduceOp::Max => NcclOp::Max,
        ReduceOp::Min => NcclOp::Min,
    }
}

impl Nccl {
    /// A host buffer on this rank's device.
    fn upload(&self, buf: &HostBuf<'_>) -> Result<Tensor> {
        let t = match buf {
            HostBuf::F32(s) => Tensor::from_vec(s.to_vec(), [s.len()])?,
            HostBuf::F64(s) => Tensor::from_vec(s.to_vec(), [s.len()])?,
        };
        t.to_device(self.comm.device())
    }

    /// A device tensor's elements back into a host buffer of its length.
    fn download(t: &Tensor, buf: HostBuf<'_>) -> Result<()> {
        match buf {
            HostBuf::F32(s) => s.copy_from_slice(&t.to_vec::<f32>()?),
            HostBuf::F64(s) => s.copy_from_slice(&t.to_vec::<f64>()?),
        }
        Ok(())
    }
}

/// The host-buffer collectives (shape agreement, ZeRO's flat buffers)
/// staged through the device: NCCL reduces only device memory.
impl Backend for Nccl {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    fn all_reduce_sum(&self, buf: HostBuf<'_>) -> Result<()> {
        let mut t = self.upload(&buf)?;
        self.comm.all_reduce(&mut t, NcclOp::Sum)?;
        Self::download(&t, buf)
    }

    fn broadcast(&self, buf: HostBuf<'_>, root: usize) -> Result<()> {
        let mut t = self.upload(&buf)?;
        self.comm.broadcast(&mut t, root)?;
        Self::download(&t, buf)
    }

    fn all_gather(&self, send: HostBuf<'_>, recv: HostBuf<'_>) -> Result<()> {
        if send.len() * self.world_size() != recv.len() {
            return Err(Error::invalid_arg(
                "all_gather",
                format!("buffers of {} and {} elements", send.len(), recv.len()),
            ));
        }
        let t = self.upload(&send)?;
        let all = self.comm.all_gather(&t)?;
        Self::download(&all, recv)
    }

    fn reduce_scatter_sum(&self, send: HostBuf<'_>, recv: HostBuf<'_>) -> Result<()> {
        if send.len() != recv.len() * self.world_size() {
            return Err(Error::invalid_arg(
                "reduce_scatter",
                format!("buffers of {} and {} elements", send.len(), recv.len()),
            ));
        }
        let t = self.upload(&send)?;
        let mine = self.comm.reduce_scatter(&t, NcclOp::Sum)?;
        Self::download(&mine, recv)
    }

    fn barrier(&self) -> Result<()> {
        let mut t = Tensor::zeros([1], tapir_tensor::DType::F32)?.to_device(self.comm.device())?;
        self.comm.all_reduce(&mut t, NcclOp::Sum)?;
        self.comm.synchronize()
    }

    fn abort(&self, message: &str) -> ! {
        // The ranks of one process end with it; those of other processes
        // end when their launcher sees this one exit.
        eprintln!("tapir: NCCL rank {} of {} aborting: {message}", self.rank(), self.world_size());
        std::process::exit(1)
    }

    fn device(&self) -> Option<&dyn DeviceCollectives> {
        Some(self)
    }
}

impl DeviceCollectives for Nccl {
    fn device(&self) -> Device {
        self.comm.device()
    }

    fn all_reduce(&self, t: &mut Tensor, op: ReduceOp) -> Result<()> {
        self.comm.all_reduce(t, nccl_op(op))
    }

    fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<()> {
        self.comm.broadcast(t, root)
    }

    fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        self.comm.all_gather(t)
    }

    fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.comm.reduce_scatter(&t.flatten()?, nccl_op(op))
    }
}
