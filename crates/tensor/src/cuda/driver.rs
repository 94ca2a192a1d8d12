//! A probe of the CUDA driver, without cudarc (whose driver module panics
//! when libcuda is missing): open libcuda.so.1, call cuInit and
//! cuDeviceGetCount. Enough for `Device::cuda` to say precisely why it
//! cannot give a device until the backend exists.

use std::sync::OnceLock;

/// What the machine offers, found once per process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DriverProbe {
    /// libcuda could not be opened; the loader's reasons.
    NoDriver(String),
    /// The driver opened but did not initialise (no device, or a driver
    /// too old for the GPU); the CUresult.
    InitFailed(u32),
    /// The driver initialised and reports this many devices.
    Devices(usize),
}

type CuInit = unsafe extern "C" fn(flags: u32) -> u32;
type CuDeviceGetCount = unsafe extern "C" fn(count: *mut i32) -> u32;

/// Probes the driver the first time it is called.
pub(crate) fn probe() -> &'static DriverProbe {
    static PROBE: OnceLock<DriverProbe> = OnceLock::new();
    PROBE.get_or_init(|| {
        let mut tried = Vec::new();
        for name in ["libcuda.so.1", "libcuda.so"] {
            // SAFETY: opening the driver runs its initialisers, which have no
            // preconditions. The handle is leaked: the driver stays loaded
            // for the process, as it would once the backend uses it.
            let lib = match unsafe { libloading::Library::new(name) } {
                Ok(lib) => Box::leak(Box::new(lib)),
                Err(e) => {
                    let why = std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
                    tried.push(why);
                    continue;
                }
            };
            // SAFETY: the signatures are those of cuda.h (CUresult is a C
            // enum, 32 bits); cuInit(0) may be called any number of times.
            unsafe {
                let (Ok(init), Ok(count)) =
                    (lib.get::<CuInit>(b"cuInit\0"), lib.get::<CuDeviceGetCount>(b"cuDeviceGetCount\0"))
                else {
                    tried.push(format!("{name} lacks cuInit or cuDeviceGetCount"));
                    continue;
                };
                let rc = init(0);
                if rc != 0 {
                    return DriverProbe::InitFailed(rc);
                }
                let mut n = 0i32;
                let rc = count(&mut n);
                if rc != 0 {
                    return DriverProbe::InitFailed(rc);
                }
                return DriverProbe::Devices(n.max(0) as usize);
            }
        }
        DriverProbe::NoDriver(tried.join("; "))
    })
}

/// Why `Device::cuda(ordinal)` cannot be had, in words.
pub(crate) fn unavailable_reason(ordinal: usize) -> String {
    match probe() {
        DriverProbe::NoDriver(why) => format!("no CUDA driver found ({why}); tensors run on the CPU"),
        DriverProbe::InitFailed(100) => {
            "the CUDA driver is installed but reports no device (cuInit: error 100, CUDA_ERROR_NO_DEVICE)".into()
        }
        DriverProbe::InitFailed(rc) => format!("the CUDA driver is installed but cuInit failed with CUresult {rc}"),
        DriverProbe::Devices(n) if ordinal >= *n => {
            format!("the CUDA driver reports {n} device(s), so there is no device {ordinal}")
        }
        DriverProbe::Devices(n) => format!(
            "the CUDA driver reports {n} device(s), but this build of tapir has no CUDA backend yet; \
             tensors run on the CPU"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, Error};

    #[test]
    fn device_cuda_says_what_is_missing_on_this_machine() {
        let Err(Error::DeviceUnavailable { device, reason }) = Device::cuda(7) else {
            panic!("Device::cuda must be an error until the backend exists");
        };
        assert_eq!(device, Device::Cuda(7));
        println!("{reason}");
        match probe() {
            DriverProbe::NoDriver(_) => assert!(reason.starts_with("no CUDA driver found"), "{reason}"),
            DriverProbe::InitFailed(_) => assert!(reason.contains("cuInit"), "{reason}"),
            DriverProbe::Devices(n) if *n <= 7 => assert!(reason.contains("no device 7"), "{reason}"),
            DriverProbe::Devices(_) => assert!(reason.contains("no CUDA backend yet"), "{reason}"),
        }
    }
}
