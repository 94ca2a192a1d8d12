//! NVRTC, opened at run time.
//!
//! cudarc (with `dynamic-loading`) opens `libnvrtc` by name on first use and
//! panics when no candidate opens. So before any cudarc call this module
//! opens the library itself, by path where it knows one, and keeps it open:
//! the dynamic loader then resolves cudarc's later lookup of the same soname
//! (`libnvrtc.so.12`) to the library already loaded. If nothing opens, every
//! function here returns [`NvrtcError::NotFound`] and cudarc is never called.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};

/// The architecture kernels are compiled for when no device says otherwise
/// (Ampere; PTX for it is JIT-compiled by the driver for any newer GPU).
pub const DEFAULT_ARCH: &str = "compute_80";

/// Why a kernel could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NvrtcError {
    /// No NVRTC library could be opened.
    #[error("NVRTC not found; tried {}", tried.join(", "))]
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
/// process.
fn loaded() -> &'static Result<String, Vec<String>> {
    static LOADED: OnceLock<Result<String, Vec<String>>> = OnceLock::new();
    LOADED.get_or_init(|| {
        let mut tried = Vec::new();
        for candidate in candidates() {
            // SAFETY: opening NVRTC runs its initialisers, which have no
            // preconditions; the handle is leaked so the library stays
            // loaded for the rest of the process, as cudarc expects.
            match unsafe { libloading::Library::new(&candidate) } {
                Ok(lib) => {
                    std::mem::forget(lib);
                    // SAFETY: only probes names with dlopen.
                    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                        return Ok(candidate.display().to_string());
                    }
                    tried.push(format!(
                        "{} (opened, but its soname is not one cudarc looks up, e.g. libnvrtc.so.12)",
                        candidate.display()
                    ));
                }
                Err(e) => {
                    // libloading's message is "dlopen failed"; the loader's reason is its source.
                    let why = std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
                    tried.push(format!("{} ({why})", candidate.display()))
                }
            }
        }
        Err(tried)
    })
}

/// The library names and paths to try, most specific first: `$TAPIR_NVRTC_LIB`
/// (a file, or a folder holding libnvrtc.so.12), the loader's search path,
/// then the pip package `nvidia-cuda-nvrtc-cu12` in the usual Python
/// site-packages folders.
fn candidates() -> Vec<PathBuf> {
    const NAMES: [&str; 2] = ["libnvrtc.so.12", "libnvrtc.so"];
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("TAPIR_NVRTC_LIB").map(PathBuf::from) {
        if p.is_dir() {
            out.extend(NAMES.iter().map(|n| p.join(n)));
        } else {
            out.push(p);
        }
    }
    out.extend(NAMES.iter().map(PathBuf::from));
    for site in site_packages() {
        let lib = site.join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
        if lib.is_file() {
            out.push(lib);
        }
    }
    out
}

/// Python site-packages folders found without running Python: the active
/// virtualenv, pyenv's versions, the user's and the system's.
fn site_packages() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
        roots.push(PathBuf::from(v).join("lib"));
    }
    if let Some(home) = std::env::var_os("HOME").map(PathBuf::from) {
        roots.push(home.join(".local/lib"));
        if let Ok(versions) = std::fs::read_dir(home.join(".pyenv/versions")) {
            roots.extend(versions.flatten().map(|v| v.path().join("lib")));
        }
    }
    roots.extend(["/usr/local/lib", "/usr/lib", "/opt/conda/lib"].map(PathBuf::from));
    let mut out = Vec::new();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(&root) else { continue };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("python3") {
                out.extend(["site-packages", "dist-packages"].map(|s| e.path().join(s)));
            }
        }
    }
    out
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
