//! NVRTC, opened at run time.
//!
//! cudarc (with `dynamic-loading`) opens `libnvrtc` by name on first use and
//! panics when no candidate opens. So before any cudarc call this module
//! opens the library itself, by path where it knows one (CUDA 13's or
//! CUDA 12's, see [`super::libs`]), and keeps it open: the dynamic loader
//! then resolves cudarc's later lookup of the same soname (`libnvrtc.so.13`
//! or `libnvrtc.so.12`) to the library already loaded. If nothing opens,
//! every function here returns [`NvrtcError::NotFound`] and cudarc is never
//! called.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};

use super::libs;

/// The architecture kernels are compiled for when no device says otherwise
/// (Ampere; PTX for it is JIT-compiled by the driver for any newer GPU,
/// and both NVRTC 12 and 13 know it).
pub const DEFAULT_ARCH: &str = "compute_80";

/// Why a kernel could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NvrtcError {
    /// No NVRTC library could be opened.
    #[error(
        "NVRTC (CUDA 13 or 12) not found: install the nvidia-cuda-nvrtc wheel (or -cu12), or set \
         TAPIR_NVRTC_LIB to the library or its folder; tried {}",
        tried.join(", ")
    )]
    NotFound {
        /// Every path or name tried, with the loader's reason.
        tried: Vec<String>,
    },
    /// NVRTC rejected the source; `log` is its compile log.
    #[error("NVRTC failed to compile {kernel} with {options:?}:\n{log}")]
    Compile {
        /// The kernel file.
        kernel: String,
        /// The options passed.
        options: Vec<String>,
        /// NVRTC's program log.
        log: String,
    },
    /// Any other NVRTC failure (creating the program, reading the PTX).
    #[error("NVRTC failed on {kernel}: {reason}")]
    Other {
        /// The kernel file.
        kernel: String,
        /// What NVRTC returned.
        reason: String,
    },
}

impl From<NvrtcError> for crate::Error {
    fn from(e: NvrtcError) -> Self {
        crate::Error::Cuda(e.to_string())
    }
}

/// Where NVRTC was loaded from, or every place tried. Searched once per
/// process, among the CUDA 13 and CUDA 12 libraries the machine has (see
/// [`super::libs`]), the newest the driver runs first.
fn loaded() -> &'static Result<String, Vec<String>> {
    static LOADED: OnceLock<Result<String, Vec<String>>> = OnceLock::new();
    LOADED.get_or_init(|| {
        let roots = libs::Roots::from_env(&libs::NVRTC);
        let majors = libs::major_order(super::driver::driver_version());
        let candidates = libs::candidates(&libs::NVRTC, &roots, &majors);
        libs::open_for_cudarc(
            &candidates,
            &cudarc::get_lib_name_candidates("nvrtc"),
            b"nvrtcVersion\0",
            &["libnvrtc-builtins.so."],
        )
    })
}

/// The NVRTC library in use (the path or name that opened), or
/// [`NvrtcError::NotFound`] listing everything tried. Never panics.
pub fn nvrtc_library() -> Result<&'static str, NvrtcError> {
    match loaded() {
        Ok(p) => Ok(p),
        Err(tried) => Err(NvrtcError::NotFound { tried: tried.clone() }),
    }
}

/// The PTX of the kernel file `name` for `arch`, compiled on first use and
/// kept for the rest of the process. A failed
/// compilation is not cached, so its error is reported on every call.
pub fn cached_ptx(name: &str, arch: &str) -> Result<Arc<str>, NvrtcError> {
    type Cache = Mutex<HashMap<(String, String), Arc<str>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Cache::default);
    let key = (name.to_string(), arch.to_string());
    if let Some(ptx) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(ptx.clone());
    }
    // Compiled outside the lock: two threads may both compile a kernel the
    // first time, and the first to finish wins; nothing waits on NVRTC.
    let ptx: Arc<str> = compile_kernel(name, arch)?.into();
    Ok(cache.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_insert(ptx).clone())
}

/// Compiles the kernel file `name` of [`super::KERNELS`] to PTX for `arch`
/// (e.g. [`DEFAULT_ARCH`], or `compute_90` for an H100/H200).
pub fn compile_kernel(name: &str, arch: &str) -> Result<String, NvrtcError> {
    let (_, src) = super::KERNELS
        .iter()
        .find(|(n, _)| *n == name)
        .ok_or_else(|| NvrtcError::Other { kernel: name.to_string(), reason: "no such file in KERNELS".into() })?;
    compile_source(name, src, arch)
}

/// Compiles `source` (one kernel file, without the prelude) to PTX for
/// `arch`. The prelude is prepended, and a `#line` directive keeps NVRTC's
/// line numbers those of `name`.
pub fn compile_source(name: &str, source: &str, arch: &str) -> Result<String, NvrtcError> {
    nvrtc_library()?;
    let file = Path::new(name).file_name().map_or(name.into(), |f| f.to_string_lossy());
    let full = format!("{}\n#line 1 \"{file}\"\n{source}", super::PRELUDE);
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        name: Some(file.to_string()),
        ..Default::default()
    };
    match compile_ptx_with_opts(full, opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(CompileError::CompileError { options, log, .. }) => {
            Err(NvrtcError::Compile { kernel: name.to_string(), options, log: log.to_string_lossy().into_owned() })
        }
        Err(e) => Err(NvrtcError::Other { kernel: name.to_string(), reason: format!("{e:?}") }),
    }
}
