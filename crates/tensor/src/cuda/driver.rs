//! A probe of the CUDA driver, without cudarc (whose driver module panics
//! when libcuda is missing): open the driver, call cuInit and
//! cuDeviceGetCount. Enough for `Device::cuda` to say precisely why it
//! cannot give a device, before cudarc is asked for a context.
//!
//! The driver is the system's libcuda unless the emulated device is
//! selected with `TAPIR_CUDA=emulated`: then the emulator's library (from
//! `TAPIR_CUDA_EMU_LIB`, else beside the running executable) is opened by
//! path first, and so is its cuBLAS stand-in. Their sonames are the names
//! cudarc opens (`libcuda.so`, `libcublas.so`), so the dynamic loader
//! hands cudarc's later open by name the objects already loaded.

use std::path::{Path, PathBuf};
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
type CuDriverGetVersion = unsafe extern "C" fn(version: *mut i32) -> u32;
type CuDeviceGetCount = unsafe extern "C" fn(count: *mut i32) -> u32;

/// The file names of the emulator's two libraries, as cargo builds them.
const EMU_DRIVER: &str = "libtapir_cuda_emu.so";
const EMU_CUBLAS: &str = "libtapir_cuda_emu_cublas.so";
/// The emulator's NCCL stand-in, built beside the other two.
#[cfg(feature = "nccl")]
const EMU_NCCL: &str = "libtapir_cuda_emu_nccl.so";

/// How many CUDA devices the driver reports (0 when there is no driver,
/// or it does not initialise).
pub fn device_count() -> usize {
    match probe() {
        DriverProbe::Devices(n) => *n,
        _ => 0,
    }
}

/// Whether the emulated device is selected (`TAPIR_CUDA=emulated`).
pub fn emulated_selected() -> bool {
    std::env::var("TAPIR_CUDA").is_ok_and(|v| v == "emulated")
}

/// Where to look for one of the emulator's libraries: the path variable
/// (a file, or a folder holding it), then the running executable's folder,
/// its parent and its `deps/` (cargo puts test binaries in
/// `target/<profile>/deps`, the libraries there when a test build made
/// them, and in `target/<profile>` too when `cargo build` did).
fn emu_candidates(var: &str, file: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os(var).map(PathBuf::from) {
        out.push(if p.is_dir() { p.join(file) } else { p });
        return out;
    }
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(2) {
            out.push(dir.join(file));
        }
        // A program beside `deps/` (target/debug/tapir) finds the libraries
        // that `cargo test --workspace` built there, with the test binaries.
        if let Some(dir) = exe.parent() {
            out.push(dir.join("deps").join(file));
        }
    }
    out
}

/// Opens a library and leaks the handle, so it stays loaded for cudarc;
/// the loader's reason when it cannot.
fn open_leaked(name: &std::ffi::OsStr) -> Result<(), String> {
    // SAFETY: opening the driver (or the emulator) runs its initialisers,
    // which have no preconditions.
    match unsafe { libloading::Library::new(name) } {
        Ok(lib) => {
            std::mem::forget(lib);
            Ok(())
        }
        // libloading's message is "dlopen failed"; the loader's reason is its source.
        Err(e) => Err(std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string())),
    }
}

/// Opens the first candidate that exists.
fn open_first(candidates: &[PathBuf], tried: &mut Vec<String>) -> Option<PathBuf> {
    for path in candidates {
        if !path.is_file() {
            tried.push(format!("{} (no such file)", path.display()));
            continue;
        }
        match open_leaked(path.as_os_str()) {
            Ok(()) => return Some(path.clone()),
            Err(why) => tried.push(format!("{} ({why})", path.display())),
        }
    }
    None
}

/// The command that builds both of the emulator's libraries where the
/// running executable looks for them: the release profile for an
/// executable under a `release` folder (`cargo run --release`), else the
/// default one. The two must come from the same build.
fn emu_build_command() -> String {
    let release = std::env::current_exe().is_ok_and(|exe| exe.ancestors().any(|d| d.ends_with("release")));
    let profile = if release { " --release" } else { "" };
    format!("cargo build{profile} -p tapir-cuda-emu -p tapir-cuda-emu-cublas")
}

/// Opens the emulator's libraries by path; the driver's path or why not.
fn load_emulator() -> Result<PathBuf, String> {
    let mut tried = Vec::new();
    let Some(driver) = open_first(&emu_candidates("TAPIR_CUDA_EMU_LIB", EMU_DRIVER), &mut tried) else {
        return Err(format!(
            "TAPIR_CUDA=emulated but the emulator library was not found: build both of its libraries \
             with `{}` in the tapir repository, or point TAPIR_CUDA_EMU_LIB at the folder that holds \
             them; tried {}",
            emu_build_command(),
            tried.join(", ")
        ));
    };
    // Check that cudarc's lookup by name will find this object, not a system driver.
    // SAFETY: opening by name returns the object already loaded (its soname matches).
    let by_name = unsafe { libloading::Library::new("libcuda.so") };
    // SAFETY: only probes for the emulator's own symbol.
    let ours = by_name
        .as_ref()
        .is_ok_and(|l| unsafe { l.get::<unsafe extern "C" fn() -> u64>(b"tapirEmuInstructions\0") }.is_ok());
    if !ours {
        return Err(format!(
            "{} opened, but its soname is not libcuda.so, so cudarc would not find it",
            driver.display()
        ));
    }
    let cublas_dir = driver.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut cublas = emu_candidates("TAPIR_CUDA_EMU_CUBLAS_LIB", EMU_CUBLAS);
    cublas.insert(0, cublas_dir.join(EMU_CUBLAS));
    // cuBLAS is optional for the driver: without its stand-in only matmul
    // fails, with the reason kept here for `cublas_library`.
    let mut tried = Vec::new();
    let found = open_first(&cublas, &mut tried).map(|p| p.display().to_string()).ok_or_else(|| {
        format!(
            "the emulator's cuBLAS stand-in was not found: build both of the emulator's libraries \
             with `{}`, or set TAPIR_CUDA_EMU_CUBLAS_LIB; tried {}",
            emu_build_command(),
            tried.join(", ")
        )
    });
    let _ = EMU_CUBLAS_FOUND.set(found);
    Ok(driver)
}

/// Where the emulator's cuBLAS stand-in was opened from, or why not; set
/// when the emulator loads.
static EMU_CUBLAS_FOUND: OnceLock<Result<String, String>> = OnceLock::new();

/// The cuBLAS library in use, opened (and kept loaded) before cudarc looks
/// it up, or why there is none. cudarc panics when it finds no cuBLAS, so
/// the backend asks here first and makes a missing library an error. The
/// library is CUDA 13's or 12's, the newest the driver runs, found by path
/// or name (see `cuda/libs.rs`) and checked to be the object cudarc's
/// later open by name finds; with the emulator selected it is the stand-in,
/// whose soname is the first of cudarc's names.
pub fn cublas_library() -> Result<String, String> {
    static LIB: OnceLock<Result<String, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        if emulated_selected() {
            driver_library()?;
            return EMU_CUBLAS_FOUND.get().cloned().unwrap_or_else(|| Err("the emulator did not load".into()));
        }
        let roots = super::libs::Roots::from_env(&super::libs::CUBLAS);
        let majors = super::libs::major_order(driver_version());
        let candidates = super::libs::candidates(&super::libs::CUBLAS, &roots, &majors);
        super::libs::open_for_cudarc(&candidates, &cudarc::get_lib_name_candidates("cublas"), b"cublasCreate_v2\0", &[])
            .map_err(|tried| {
                format!(
                    "no cuBLAS library (CUDA 13 or 12) found: install the nvidia-cublas wheel (or -cu12), or set \
                     TAPIR_CUBLAS_LIB to the library or its folder; tried {}",
                    tried.join(", ")
                )
            })
    })
    .clone()
}

/// The NCCL library to use, opened (and kept loaded) before cudarc looks
/// it up by name, or why there is none. With the emulator selected it is
/// the emulator's NCCL stand-in (`TAPIR_CUDA_EMU_NCCL_LIB`, else beside the
/// emulator's library, else where the emulator's libraries are looked
/// for); otherwise `TAPIR_NCCL_LIB`, the `nvidia-nccl` wheels' and the
/// toolkits' `libnccl.so.2`, then the loader's path, each checked to be the
/// object cudarc's open by name (`libnccl.so`, ...) will find.
#[cfg(feature = "nccl")]
pub fn nccl_library() -> Result<String, String> {
    if emulated_selected() {
        let driver = driver_library()?;
        let dir = Path::new(&driver).parent().map(Path::to_path_buf).unwrap_or_default();
        let mut candidates = emu_candidates("TAPIR_CUDA_EMU_NCCL_LIB", EMU_NCCL);
        if std::env::var_os("TAPIR_CUDA_EMU_NCCL_LIB").is_none() {
            candidates.insert(0, dir.join(EMU_NCCL));
        }
        let mut tried = Vec::new();
        return match open_first(&candidates, &mut tried) {
            Some(p) => Ok(p.display().to_string()),
            None => Err(format!(
                "the emulator's NCCL stand-in was not found: build it with `{} -p tapir-cuda-emu-nccl`, or set \
                 TAPIR_CUDA_EMU_NCCL_LIB; tried {}",
                emu_build_command(),
                tried.join(", ")
            )),
        };
    }
    let roots = super::libs::Roots::from_env(&super::libs::NCCL);
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = &roots.explicit {
        candidates.push(if p.is_dir() { p.join("libnccl.so.2") } else { p.clone() });
    }
    for site in &roots.site_packages {
        for sub in ["nvidia/nccl/lib", "nvidia/cu13/lib"] {
            for file in ["libnccl.so", "libnccl.so.2"] {
                let p = site.join(sub).join(file);
                if p.is_file() {
                    candidates.push(p);
                }
            }
        }
    }
    for dir in &roots.toolkits {
        let p = dir.join("libnccl.so.2");
        if p.is_file() {
            candidates.push(p);
        }
    }
    candidates.extend(["libnccl.so", "libnccl.so.2"].map(PathBuf::from));
    super::libs::open_for_cudarc(&candidates, &cudarc::get_lib_name_candidates("nccl"), b"ncclGetVersion\0", &[])
        .map_err(|tried| {
            format!(
                "install NCCL (the libnccl2 package, or the nvidia-nccl-cu12 wheel with its folder's libnccl.so.2 \
                 linked as libnccl.so on the loader's path), or set TAPIR_NCCL_LIB; tried {}",
                tried.join(", ")
            )
        })
}

/// The driver library in use: the emulator's path when it is selected,
/// else the name the system's driver opened under; or why none opened.
pub fn driver_library() -> Result<String, String> {
    static LIB: OnceLock<Result<String, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        if emulated_selected() {
            return load_emulator().map(|p| p.display().to_string());
        }
        // By name (the loader's path), then where drivers are mounted or
        // installed when that path lacks them; libcuda.so.1 is the soname,
        // one of the names cudarc opens.
        let mut tried = Vec::new();
        for name in [
            "libcuda.so",
            "libcuda.so.1",
            "/usr/local/nvidia/lib64/libcuda.so.1",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "/usr/lib64/libcuda.so.1",
        ] {
            if name.starts_with('/') && !Path::new(name).exists() {
                continue;
            }
            match open_leaked(name.as_ref()) {
                Ok(()) => return Ok(name.to_string()),
                Err(why) => tried.push(format!("{name}: {why}")),
            }
        }
        Err(tried.join("; "))
    })
    .clone()
}

/// The CUDA version of the driver (cuDriverGetVersion: 13000 for 13.0,
/// 12090 for 12.9), or `None` when no driver opened.
pub fn driver_version() -> Option<i32> {
    probe();
    DRIVER_VERSION.get().copied()
}

static DRIVER_VERSION: OnceLock<i32> = OnceLock::new();

/// Probes the driver the first time it is called.
pub(crate) fn probe() -> &'static DriverProbe {
    static PROBE: OnceLock<DriverProbe> = OnceLock::new();
    PROBE.get_or_init(|| {
        let mut tried = Vec::new();
        let names: Vec<String> = match driver_library() {
            Ok(name) => vec![name],
            Err(why) => return DriverProbe::NoDriver(why),
        };
        for name in &names {
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
                // The CUDA version the driver runs (13000 for 13.0), which
                // picks the NVRTC and cuBLAS to load; asked before cuInit,
                // which it does not need.
                if let Ok(get_version) = lib.get::<CuDriverGetVersion>(b"cuDriverGetVersion\0") {
                    let mut v = 0i32;
                    if get_version(&mut v) == 0 && v > 0 {
                        let _ = DRIVER_VERSION.set(v);
                    }
                }
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
        DriverProbe::Devices(n) => {
            format!("the CUDA driver reports {n} device(s), but tapir addresses at most 16 (no device {ordinal})")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, Error};

    #[test]
    fn device_cuda_says_what_is_missing_on_this_machine() {
        let Err(Error::DeviceUnavailable { device, reason }) = Device::cuda(7) else {
            panic!("no machine here has 8 CUDA devices");
        };
        assert_eq!(device, Device::Cuda(7));
        println!("{reason}");
        match probe() {
            DriverProbe::NoDriver(_) => assert!(reason.starts_with("no CUDA driver found"), "{reason}"),
            DriverProbe::InitFailed(_) => assert!(reason.contains("cuInit"), "{reason}"),
            DriverProbe::Devices(n) if *n <= 7 => assert!(reason.contains("no device 7"), "{reason}"),
            DriverProbe::Devices(_) => assert!(reason.contains("no device 7"), "{reason}"),
        }
    }
}
