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
/// kept for the rest of the process, and on disk between processes (see
/// [`kernel_cache_dir`]): a program that finds the file's PTX there, made
/// from the same source by the same NVRTC with the same options, loads it
/// instead of compiling. A failed compilation is not cached, so its error
/// is reported on every call.
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
    let ptx: Arc<str> = kernel_via_cache(kernel_cache_dir().as_deref(), name, arch)?.into();
    Ok(cache.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_insert(ptx).clone())
}

/// The folder compiled kernels are kept in between processes:
/// `TAPIR_KERNEL_CACHE` when set (`off` or an empty value: none), else
/// `$XDG_CACHE_HOME/tapir/kernels`, else `$HOME/.cache/tapir/kernels`, else
/// none. Each file is named after the kernel file, the architecture and a
/// hash of everything the PTX depends on (the source with its prelude, the
/// options, and the NVRTC library's path, size and modification time), so
/// an edited kernel or another NVRTC never reads a stale entry; an entry is
/// written whole or not at all (a temporary file renamed into place), and
/// one that cannot be read or written costs a compilation, never an error.
/// Deleting the folder is always safe.
pub fn kernel_cache_dir() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    match std::env::var_os("TAPIR_KERNEL_CACHE") {
        Some(v) if v.is_empty() || v == "off" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache")))
            .map(|base| base.join("tapir").join("kernels")),
    }
}

/// The last line of every cache entry: an entry without it was cut short.
const CACHE_END: &str = "// tapir kernel cache: end of entry\n";

/// [`compile_kernel`] through the on-disk cache in `dir` (none: compiled).
fn kernel_via_cache(dir: Option<&Path>, name: &str, arch: &str) -> Result<String, NvrtcError> {
    let Some(dir) = dir else { return compile_kernel(name, arch) };
    let (source, options) = (full_source(name, kernel_source(name)?), options(arch));
    let library = nvrtc_library()?;
    let stamp = std::fs::metadata(library).ok().map(|m| (m.len(), m.modified().ok()));
    let hash = fnv1a(format!("{source}\0{options:?}\0{library}\0{stamp:?}").as_bytes());
    let file = dir.join(format!("{}-{arch}-{hash:016x}.ptx", name.trim_end_matches(".cu")));
    if let Ok(text) = std::fs::read_to_string(&file) {
        if let Some(ptx) = text.strip_suffix(CACHE_END) {
            return Ok(ptx.to_string());
        }
    }
    let ptx = compile_full(name, source, options)?;
    let tmp = dir.join(format!(".{}-{hash:016x}.tmp", std::process::id()));
    let written = std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&tmp, format!("{ptx}{CACHE_END}")))
        .and_then(|_| std::fs::rename(&tmp, &file));
    if written.is_err() {
        std::fs::remove_file(&tmp).ok();
    }
    Ok(ptx)
}

/// FNV-1a, 64 bits: the cache's file names (not a security boundary; a
/// collision would need two sources the cache has seen to agree).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Compiles the kernel file `name` of [`super::KERNELS`] to PTX for `arch`
/// (e.g. [`DEFAULT_ARCH`], or `compute_90` for an H100/H200).
pub fn compile_kernel(name: &str, arch: &str) -> Result<String, NvrtcError> {
    compile_source(name, kernel_source(name)?, arch)
}

/// The source of the kernel file `name` of [`super::KERNELS`].
fn kernel_source(name: &str) -> Result<&'static str, NvrtcError> {
    super::KERNELS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, src)| *src)
        .ok_or_else(|| NvrtcError::Other { kernel: name.to_string(), reason: "no such file in KERNELS".into() })
}

/// Compiles `source` (one kernel file, without the prelude) to PTX for
/// `arch`. The prelude is prepended, and a `#line` directive keeps NVRTC's
/// line numbers those of `name`.
pub fn compile_source(name: &str, source: &str, arch: &str) -> Result<String, NvrtcError> {
    nvrtc_library()?;
    compile_full(name, full_source(name, source), options(arch))
}

/// The file name NVRTC reports errors in.
fn file_name(name: &str) -> String {
    Path::new(name).file_name().map_or(name.into(), |f| f.to_string_lossy().into_owned())
}

/// The text NVRTC compiles: the prelude, then the file at its own line 1.
fn full_source(name: &str, source: &str) -> String {
    format!("{}\n#line 1 \"{}\"\n{source}", super::PRELUDE, file_name(name))
}

/// NVRTC's options for `arch`.
fn options(arch: &str) -> Vec<String> {
    vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()]
}

/// Compiles the full text (prelude included) with these options.
fn compile_full(name: &str, full: String, options: Vec<String>) -> Result<String, NvrtcError> {
    let opts = CompileOptions { options, name: Some(file_name(name)), ..Default::default() };
    match compile_ptx_with_opts(full, opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(CompileError::CompileError { options, log, .. }) => {
            Err(NvrtcError::Compile { kernel: name.to_string(), options, log: log.to_string_lossy().into_owned() })
        }
        Err(e) => Err(NvrtcError::Other { kernel: name.to_string(), reason: format!("{e:?}") }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache entry is written on a miss, read on a hit (the file's text
    /// is what comes back), and one cut short is compiled again and
    /// rewritten whole.
    #[test]
    fn the_kernel_cache_writes_reads_and_repairs_its_entries() {
        if let Err(e) = nvrtc_library() {
            assert!(std::env::var("TAPIR_REQUIRE_NVRTC").as_deref() != Ok("1"), "TAPIR_REQUIRE_NVRTC=1 but {e}");
            println!("skipped: NVRTC not found (set TAPIR_REQUIRE_NVRTC=1 to make this a failure)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("tapir-kernel-cache-test-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        let name = "cast.cu";
        let fresh = kernel_via_cache(Some(&dir), name, DEFAULT_ARCH).unwrap();
        assert_eq!(fresh, compile_kernel(name, DEFAULT_ARCH).unwrap());
        let entries: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(entries.len(), 1, "{entries:?}");
        let entry = &entries[0];
        assert!(entry.file_name().unwrap().to_string_lossy().starts_with("cast-compute_80-"), "{entry:?}");
        assert_eq!(std::fs::read_to_string(entry).unwrap(), format!("{fresh}{CACHE_END}"));
        // A hit returns the entry's text, whatever it is.
        std::fs::write(entry, format!("// marked\n{CACHE_END}")).unwrap();
        assert_eq!(kernel_via_cache(Some(&dir), name, DEFAULT_ARCH).unwrap(), "// marked\n");
        // An entry without its last line is compiled again and rewritten.
        std::fs::write(entry, &fresh[..fresh.len() / 2]).unwrap();
        assert_eq!(kernel_via_cache(Some(&dir), name, DEFAULT_ARCH).unwrap(), fresh);
        assert_eq!(std::fs::read_to_string(entry).unwrap(), format!("{fresh}{CACHE_END}"));
        // Another architecture is another entry.
        kernel_via_cache(Some(&dir), name, "compute_90").unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
        std::fs::remove_dir_all(&dir).ok();
    }
}
