//! Devices.

use crate::Result;

/// Where a tensor's storage lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory; always available.
    #[default]
    Cpu,
    /// The CUDA device with this ordinal.
    Cuda(usize),
}

impl Device {
    /// The CUDA device `ordinal`, or an error when no driver or device is
    /// present. Never panics.
    ///
    /// The device's context and default stream are created on the first
    /// call, once per process. When it cannot be had, the error is
    /// [`Error::DeviceUnavailable`](crate::Error::DeviceUnavailable), whose reason says which of "no CUDA
    /// driver found", "no device" or "no device `ordinal`" holds on this
    /// machine (or why the context could not be created).
    pub fn cuda(ordinal: usize) -> Result<Device> {
        crate::cuda::CudaDevice::get(ordinal).map(|_| Device::Cuda(ordinal))
    }

    /// The fastest device present: CUDA 0 when it can be used, else the CPU.
    ///
    /// With the emulated device selected (`TAPIR_CUDA=emulated`) but not
    /// loadable, the CPU it falls back to is announced on stderr, once per
    /// process, with the reason: asking for the emulator and silently
    /// running on the CPU would hide a missing build step.
    pub fn best() -> Device {
        match Device::cuda(0) {
            Ok(d) => d,
            Err(e) => {
                if crate::cuda::emulated_selected() {
                    static WARNED: std::sync::Once = std::sync::Once::new();
                    WARNED.call_once(|| eprintln!("tapir: TAPIR_CUDA=emulated, but {e}; Device::best() uses the CPU"));
                }
                Device::Cpu
            }
        }
    }

    /// True for [`Device::Cpu`].
    pub fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu)
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}
