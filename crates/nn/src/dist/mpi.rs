//! The MPI backend (Open MPI or any MPI through the `mpi` crate): CPU ranks
//! started by `mpirun`, and the way an NCCL job across nodes shares its id
//! (with the `nccl` feature: [`Communicator::mpi_nccl`]).

use super::{Backend, Communicator, HostBuf};
use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::environment::Universe;
use mpi::topology::{Communicator as _, SimpleCommunicator};
use tapir_tensor::{Error, Result};

/// MPI's world communicator, for as long as this value lives (MPI is
/// finalized when it drops). MPI's default error handler stays in place: an
/// error inside the engine ends the whole job rather than leaving ranks
/// waiting, and `mpirun` ends every rank when one exits without finalizing.
struct Mpi {
    world: SimpleCommunicator,
    /// The copy of an all-reduce's input (MPI_IN_PLACE has no portable
    /// value in the bindings), kept between calls: a fresh buffer of a
    /// mebibyte or more is fresh pages from the kernel each call, which
    /// cost more than the reduction (seen: 7-13 ms against MPI's 0.3-1.5
    /// ms for 1 MiB on 2 ranks).
    scratch: std::cell::RefCell<(Vec<f32>, Vec<f64>)>,
    // Declared after `world`: fields drop in order, and finalizing must
    // come last.
    _universe: Universe,
}

// SAFETY: MPI is initialized at the default threading level (single or
// funneled), under which only the thread that calls the collectives may use
// MPI; the communicator is moved between threads only as a whole, never
// shared, and each call goes through `&self` on the owning thread.
unsafe impl Send for Mpi {}

impl Communicator {
    /// Joins the MPI job this process belongs to (started by `mpirun -np N`;
    /// a process started alone is a world of one). An error when MPI was
    /// already initialized in this process.
    pub fn mpi() -> Result<Self> {
        let universe = mpi::initialize()
            .ok_or_else(|| Error::invalid_arg("Communicator::mpi", "MPI is already initialized in this process"))?;
        let world = universe.world();
        Ok(Communicator::from_backend(Box::new(Mpi { world, scratch: Default::default(), _universe: universe })))
    }
}

fn same_len(op: &'static str, a: usize, b: usize) -> Result<()> {
    if a != b {
        return Err(Error::invalid_arg(op, format!("buffers of {a} and {b} elements")));
    }
    Ok(())
}

impl Backend for Mpi {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn world_size(&self) -> usize {
        self.world.size() as usize
    }

    fn all_reduce_sum(&self, buf: HostBuf<'_>) -> Result<()> {
        // MPI_IN_PLACE has no portable value in the bindings: reduce from a
        // copy of the input into the caller's buffer.
        let mut scratch = self.scratch.borrow_mut();
        match buf {
            HostBuf::F32(b) => {
                let send = &mut scratch.0;
                send.clear();
                send.extend_from_slice(b);
                self.world.all_reduce_into(&send[..], b, SystemOperation::sum());
            }
            HostBuf::F64(b) => {
                let send = &mut scratch.1;
                send.clear();
                send.extend_from_slice(b);
                self.world.all_reduce_into(&send[..], b, SystemOperation::sum());
            }
        }
        Ok(())
    }

    fn broadcast(&self, buf: HostBuf<'_>, root: usize) -> Result<()> {
        super::check_root(root, self.world_size())?;
        let root = self.world.process_at_rank(root as i32);
        match buf {
            HostBuf::F32(b) => root.broadcast_into(b),
            HostBuf::F64(b) => root.broadcast_into(b),
        }
        Ok(())
    }

    fn all_gather(&self, send: HostBuf<'_>, recv: HostBuf<'_>) -> Result<()> {
        same_len("all_gather", send.len() * self.world_size(), recv.len())?;
        match (send, recv) {
            (HostBuf::F32(s), HostBuf::F32(r)) => self.world.all_gather_into(&s[..], r),
            (HostBuf::F64(s), HostBuf::F64(r)) => self.world.all_gather_into(&s[..], r),
            _ => return Err(Error::invalid_arg("all_gather", "send and recv differ in element type")),
        }
        Ok(())
    }

    fn reduce_scatter_sum(&self, send: HostBuf<'_>, recv: HostBuf<'_>) -> Result<()> {
        same_len("reduce_scatter", send.len(), recv.len() * self.world_size())?;
        match (send, recv) {
            (HostBuf::F32(s), HostBuf::F32(r)) => {
                self.world.reduce_scatter_block_into(&s[..], r, SystemOperation::sum())
            }
            (HostBuf::F64(s), HostBuf::F64(r)) => {
                self.world.reduce_scatter_block_into(&s[..], r, SystemOperation::sum())
            }
            _ => return Err(Error::invalid_arg("reduce_scatter", "send and recv differ in element type")),
        }
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.world.barrier();
        Ok(())
    }

    fn abort(&self, message: &str) -> ! {
        eprintln!("tapir: rank {} of {} aborting the job: {message}", self.rank(), self.world_size());
        self.world.abort(1)
    }
}

/// The ranks of an MPI job reducing their CUDA tensors with NCCL: NCCL for
/// the device collectives, MPI for the host buffers (shape agreement,
/// ZeRO's flat buffers, L-BFGS's scalars) and to end the whole job.
#[cfg(feature = "nccl")]
struct MpiNccl {
    nccl: super::nccl::Nccl,
    mpi: Mpi,
}

#[cfg(feature = "nccl")]
impl Communicator {
    /// Joins the MPI job this process belongs to and forms an NCCL
    /// communicator over its ranks, one GPU each: rank 0 makes the NCCL
    /// id and sends it to every rank over MPI (the bootstrap NCCL leaves
    /// to its launcher). Each rank drives `cuda:(first + local rank) mod
    /// count`, its local rank being its place among the ranks of its
    /// node, so `mpirun -np 2` on a machine of two GPUs puts one rank on
    /// each. Returns the communicator and that device.
    pub fn mpi_nccl(first: usize) -> Result<(Self, tapir_tensor::Device)> {
        let universe = mpi::initialize().ok_or_else(|| {
            Error::invalid_arg("Communicator::mpi_nccl", "MPI is already initialized in this process")
        })?;
        let world = universe.world();
        let mpi = Mpi { world, scratch: Default::default(), _universe: universe };
        let node = mpi.world.split_shared(mpi.world.rank());
        let count = tapir_tensor::cuda::device_count();
        if count == 0 {
            return Err(Error::invalid_arg(
                "Communicator::mpi_nccl",
                format!("rank {} sees no CUDA device", mpi.world.rank()),
            ));
        }
        let device = tapir_tensor::Device::Cuda((first + node.rank() as usize) % count);
        // Rank 0's id, or the reason it could not make one (every rank must
        // take part in the broadcast either way, or the others would hang).
        let mut id = [0u8; 129];
        if mpi.world.rank() == 0 {
            match tapir_tensor::cuda::nccl::NcclId::new() {
                Ok(made) => {
                    id[0] = 1;
                    id[1..].copy_from_slice(&made.0);
                }
                Err(e) => {
                    eprintln!("tapir: rank 0 could not make the NCCL id: {e}");
                }
            }
        }
        mpi.world.process_at_rank(0).broadcast_into(&mut id[..]);
        if id[0] != 1 {
            return Err(Error::invalid_arg(
                "Communicator::mpi_nccl",
                "rank 0 could not make the NCCL id (see its error)",
            ));
        }
        let mut raw = [0u8; 128];
        raw.copy_from_slice(&id[1..]);
        let (rank, size) = (mpi.world.rank() as usize, mpi.world.size() as usize);
        let comm =
            tapir_tensor::cuda::nccl::NcclComm::from_rank(device, rank, size, tapir_tensor::cuda::nccl::NcclId(raw))?;
        let backend = MpiNccl { nccl: super::nccl::Nccl { comm }, mpi };
        Ok((Communicator::from_backend(Box::new(backend)), device))
    }
}

#[cfg(feature = "nccl")]
impl Backend for MpiNccl {
    fn rank(&self) -> usize {
        self.mpi.rank()
    }

    fn world_size(&self) -> usize {
        self.mpi.world_size()
    }

    fn all_reduce_sum(&self, buf: HostBuf<'_>) -> Result<()> {
        self.mpi.all_reduce_sum(buf)
    }

    fn broadcast(&self, buf: HostBuf<'_>, root: usize) -> Result<()> {
        self.mpi.broadcast(buf, root)
    }

    fn all_gather(&self, send: HostBuf<'_>, recv: HostBuf<'_>) -> Result<()> {
        self.mpi.all_gather(send, recv)
    }

    fn reduce_scatter_sum(&self, send: HostBuf<'_>, recv: HostBuf<'_>) -> Result<()> {
        self.mpi.reduce_scatter_sum(send, recv)
    }

    fn barrier(&self) -> Result<()> {
        // NCCL's queued work first, so a barrier also orders the devices.
        self.nccl.comm.synchronize()?;
        self.mpi.barrier()
    }

    fn abort(&self, message: &str) -> ! {
        self.mpi.abort(message)
    }

    fn device(&self) -> Option<&dyn super::DeviceCollectives> {
        Some(&self.nccl)
    }
}
