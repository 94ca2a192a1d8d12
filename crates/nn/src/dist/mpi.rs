//! The MPI backend (Open MPI or any MPI through the `mpi` crate): CPU ranks
//! started by `mpirun`, and the way an NCCL job across nodes shares its id.

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
        Ok(Communicator::from_backend(Box::new(Mpi { world, _universe: universe })))
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
        match buf {
            HostBuf::F32(b) => {
                let send = b.to_vec();
                self.world.all_reduce_into(&send[..], b, SystemOperation::sum());
            }
            HostBuf::F64(b) => {
                let send = b.to_vec();
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
