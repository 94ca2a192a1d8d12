//! The one place a device is mapped to this crate's kernels, as
//! `tapir_tensor::ops::forward` maps it to the tensor crate's: an op file
//! asks here for the backend of its (checked, shared) inputs' device and
//! never names a device module itself.

use tapir_tensor::Device;

use crate::backend::NnBackend;
use crate::cpu::CpuBackend;
use crate::cuda::CudaBackend;

/// The backend of `device`'s kind (a CUDA kernel finds its ordinal in its
/// operands).
pub(crate) fn backend_for(device: Device) -> &'static dyn NnBackend {
    match device {
        Device::Cpu => &CpuBackend,
        Device::Cuda(_) => &CudaBackend,
    }
}
