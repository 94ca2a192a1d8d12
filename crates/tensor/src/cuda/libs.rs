//! Finding CUDA's user-space libraries (NVRTC, cuBLAS) at run time, of
//! CUDA 13 or CUDA 12, wherever a machine keeps them.
//!
//! cudarc (built for CUDA 13.0, see `crates/tensor/Cargo.toml`) opens each
//! library by name only: `libnvrtc.so`, then `libnvrtc.so.13`, then
//! `libnvrtc.so.12`, ... through the loader's search path, and panics when
//! none opens. The libraries a machine has are often off that path: the
//! Python wheels keep them in `site-packages/nvidia/cu13/lib` (CUDA 13) or
//! `site-packages/nvidia/<package>/lib` (CUDA 12), found by PyTorch through
//! its own RPATH, and a toolkit keeps them in `lib64`. So tapir opens one by
//! path first and keeps it loaded; its soname (`libnvrtc.so.13`) is one of
//! the names cudarc asks for, and the loader hands cudarc the object already
//! loaded.
//!
//! Which one: the newest major version the driver can run. NVRTC 13 writes
//! PTX that a CUDA 12 driver cannot load, and cuBLAS 13 needs a CUDA 13
//! driver; a CUDA 13 driver runs either. Without a driver (NVRTC alone
//! compiles kernels on a machine with no GPU) the newest is preferred.
//! Libraries of other majors stay in the list, after those, so a machine
//! with only those still gets one (and the error, when there is one, says
//! what happened).

use std::path::{Path, PathBuf};

/// The CUDA major versions tapir's bindings can use, newest first.
pub(crate) const MAJORS: [u32; 2] = [13, 12];

/// One CUDA library tapir looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lib {
    /// The file stem: `nvrtc` for `libnvrtc.so.13`.
    pub stem: &'static str,
    /// The CUDA 12 wheel's package folder under `site-packages/nvidia`
    /// (CUDA 13 wheels share `nvidia/cu13`).
    pub package: &'static str,
    /// The variable naming a file (or a folder holding it) to use first.
    pub var: &'static str,
}

/// NVRTC: `nvidia-cuda-nvrtc` (13) or `nvidia-cuda-nvrtc-cu12`.
pub(crate) const NVRTC: Lib = Lib { stem: "nvrtc", package: "cuda_nvrtc", var: "TAPIR_NVRTC_LIB" };
/// cuBLAS: `nvidia-cublas` (13) or `nvidia-cublas-cu12`.
pub(crate) const CUBLAS: Lib = Lib { stem: "cublas", package: "cublas", var: "TAPIR_CUBLAS_LIB" };

/// NCCL: `nvidia-nccl-cu12` (its folder, `nvidia/nccl/lib`), found by
/// `driver::nccl_library` (NCCL's soname is `libnccl.so.2` whatever the CUDA
/// version, so only the roots are shared).
#[cfg(feature = "nccl")]
pub(crate) const NCCL: Lib = Lib { stem: "nccl", package: "nccl", var: "TAPIR_NCCL_LIB" };

/// Where a machine keeps CUDA libraries, gathered once from the
/// environment ([`Roots::from_env`]) or given by a test.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Roots {
    /// The value of the library's variable, if set.
    pub explicit: Option<PathBuf>,
    /// Python `site-packages` (or `dist-packages`) folders.
    pub site_packages: Vec<PathBuf>,
    /// Toolkit library folders (`lib64`).
    pub toolkits: Vec<PathBuf>,
}

impl Roots {
    /// The roots of this machine, found without running Python: the
    /// variable, the site-packages of every Python on `PATH` (a virtual
    /// environment's `bin/python3` beside its `lib/python3.X`), of
    /// `$VIRTUAL_ENV` and `$CONDA_PREFIX`, the user's, pyenv's and the
    /// system's; the toolkits of `$CUDA_HOME`, `$CUDA_PATH` and
    /// `/usr/local/cuda*`.
    pub fn from_env(lib: &Lib) -> Roots {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let mut prefixes: Vec<PathBuf> = Vec::new();
        if let Some(path) = std::env::var_os("PATH") {
            for dir in std::env::split_paths(&path) {
                if dir.join("python3").exists() {
                    if let Some(prefix) = dir.parent() {
                        prefixes.push(prefix.to_path_buf());
                    }
                }
            }
        }
        prefixes.extend(["VIRTUAL_ENV", "CONDA_PREFIX"].iter().filter_map(|v| var(v)));
        if let Some(home) = var("HOME") {
            prefixes.push(home.join(".local"));
            if let Ok(versions) = std::fs::read_dir(home.join(".pyenv/versions")) {
                let mut v: Vec<PathBuf> = versions.flatten().map(|e| e.path()).collect();
                v.sort();
                prefixes.extend(v);
            }
        }
        prefixes.extend(["/usr/local", "/usr", "/opt/conda"].map(PathBuf::from));
        let mut site_packages = Vec::new();
        for prefix in prefixes {
            let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else { continue };
            let mut pythons: Vec<PathBuf> = entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
                .map(|e| e.path())
                .collect();
            pythons.sort();
            for py in pythons {
                for sub in ["site-packages", "dist-packages"] {
                    push_unique(&mut site_packages, py.join(sub));
                }
            }
        }
        let mut cuda_roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"].iter().filter_map(|v| var(v)).collect();
        cuda_roots.push("/usr/local/cuda".into());
        if let Ok(entries) = std::fs::read_dir("/usr/local") {
            let mut versioned: Vec<PathBuf> = entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("cuda-"))
                .map(|e| e.path())
                .collect();
            // Newest first (cuda-13.0 before cuda-12.9), as the string sorts.
            versioned.sort();
            versioned.reverse();
            cuda_roots.extend(versioned);
        }
        let mut toolkits = Vec::new();
        for root in cuda_roots {
            for sub in ["lib64", "targets/x86_64-linux/lib", "lib"] {
                push_unique(&mut toolkits, root.join(sub));
            }
        }
        Roots { explicit: var(lib.var), site_packages, toolkits }
    }
}

fn push_unique(v: &mut Vec<PathBuf>, p: PathBuf) {
    if !v.contains(&p) {
        v.push(p);
    }
}

/// The majors in the order to try them for a driver of `driver_version`
/// (cuDriverGetVersion's 1000 × major + 10 × minor, or `None` without a
/// driver): those the driver runs, newest first, then the rest, oldest
/// first (the nearest to what the driver runs).
pub(crate) fn major_order(driver_version: Option<i32>) -> Vec<u32> {
    let Some(v) = driver_version else { return MAJORS.to_vec() };
    let driver_major = (v / 1000).max(0) as u32;
    let mut runs: Vec<u32> = MAJORS.iter().copied().filter(|&m| m <= driver_major).collect();
    let mut rest: Vec<u32> = MAJORS.iter().copied().filter(|&m| m > driver_major).collect();
    rest.reverse();
    runs.append(&mut rest);
    runs
}

/// Every path or name to try for `lib`, in order: the variable's file (or
/// that folder's libraries), then, for each major in `majors`, the files of
/// the wheel folders and toolkits that exist, then the names alone (the
/// loader's search path), the unversioned name last.
pub(crate) fn candidates(lib: &Lib, roots: &Roots, majors: &[u32]) -> Vec<PathBuf> {
    let file = |major: u32| format!("lib{}.so.{major}", lib.stem);
    let mut out = Vec::new();
    if let Some(p) = &roots.explicit {
        if p.is_dir() {
            out.extend(majors.iter().map(|&m| p.join(file(m))));
            out.push(p.join(format!("lib{}.so", lib.stem)));
        } else {
            out.push(p.clone());
        }
    }
    for &major in majors {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for site in &roots.site_packages {
            dirs.push(site.join(format!("nvidia/cu{major}/lib")));
            dirs.push(site.join("nvidia").join(lib.package).join("lib"));
        }
        dirs.extend(roots.toolkits.iter().cloned());
        for dir in dirs {
            let p = dir.join(file(major));
            if p.is_file() {
                push_unique(&mut out, p);
            }
        }
    }
    out.extend(majors.iter().map(|&m| PathBuf::from(file(m))));
    out.push(PathBuf::from(format!("lib{}.so", lib.stem)));
    out
}

/// The dynamic loader's reason from a libloading error.
pub(crate) fn loader_reason(e: &libloading::Error) -> String {
    // libloading's message is "dlopen failed"; the loader's reason is its source.
    std::error::Error::source(e).map_or_else(|| e.to_string(), |s| s.to_string())
}

/// Opens the first of `candidates` that loads and is the object cudarc
/// will find by name, and keeps it loaded for the process. `symbol` is a
/// function every version exports, compared between the object opened here
/// and the one cudarc's first name opens: they must be one object. Returns
/// the path or name that opened, or every candidate with its reason.
///
/// Files of the chosen library's folder whose names start with one of
/// `companions` are opened too, first: NVRTC 13 opens its builtins
/// (`libnvrtc-builtins.so.13.0`) by name, through the loader's path, which
/// a wheel's folder is not on; loaded already, they are found by soname.
pub(crate) fn open_for_cudarc(
    candidates: &[PathBuf],
    cudarc_names: &[String],
    symbol: &[u8],
    companions: &[&str],
) -> Result<String, Vec<String>> {
    let mut tried = Vec::new();
    for candidate in candidates {
        if candidate.components().count() > 1 && !candidate.exists() {
            tried.push(format!("{} (no such file)", candidate.display()));
            continue;
        }
        if candidate.components().count() > 1 {
            open_companions(candidate, companions);
        }
        // SAFETY: opening a CUDA library runs its initialisers, which have
        // no preconditions.
        let ours = match unsafe { libloading::Library::new(candidate) } {
            Ok(lib) => lib,
            Err(e) => {
                tried.push(format!("{} ({})", candidate.display(), loader_reason(&e)));
                continue;
            }
        };
        match cudarc_would_open(cudarc_names, &ours, symbol) {
            Ok(()) => {
                // Kept loaded for the rest of the process, as cudarc expects.
                std::mem::forget(ours);
                return Ok(candidate.display().to_string());
            }
            Err(why) => tried.push(format!("{} ({why})", candidate.display())),
        }
    }
    Err(tried)
}

/// Opens, and keeps loaded, the files beside `lib` (in the folder named and
/// in the folder of the file a link points to) whose names start with one
/// of `prefixes` and are no `.alt.` variant; one that fails is left alone
/// (the library's own error then says what it missed).
fn open_companions(lib: &Path, prefixes: &[&str]) {
    if prefixes.is_empty() {
        return;
    }
    let mut dirs: Vec<PathBuf> = lib.parent().map(Path::to_path_buf).into_iter().collect();
    if let Some(real) = std::fs::canonicalize(lib).ok().and_then(|p| p.parent().map(Path::to_path_buf)) {
        push_unique(&mut dirs, real);
    }
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .is_some_and(|n| prefixes.iter().any(|pre| n.starts_with(pre)) && !n.contains(".alt."))
            })
            .collect();
        files.sort();
        for f in files {
            // SAFETY: as for the library itself.
            if let Ok(l) = unsafe { libloading::Library::new(&f) } {
                std::mem::forget(l);
            }
        }
    }
}

/// Whether cudarc's open by name, which takes the first of `names` that
/// opens, gets the object `ours`.
fn cudarc_would_open(names: &[String], ours: &libloading::Library, symbol: &[u8]) -> Result<(), String> {
    // SAFETY: only an address is read, never called.
    let addr = |l: &libloading::Library| unsafe { l.get::<*const ()>(symbol).ok().map(|s| *s as usize) };
    let Some(want) = addr(ours) else {
        return Err(format!("opened, but it lacks {}", String::from_utf8_lossy(symbol).trim_end_matches('\0')));
    };
    for name in names {
        // SAFETY: as above; a name already loaded returns that object.
        if let Ok(by_name) = unsafe { libloading::Library::new(name) } {
            return if addr(&by_name) == Some(want) {
                Ok(())
            } else {
                Err(format!("opened, but cudarc's lookup by name would load {name} instead"))
            };
        }
    }
    Err(format!(
        "opened, but its soname is none of the names cudarc looks up ({} ... {})",
        names.first().map_or("", String::as_str),
        names.last().map_or("", String::as_str)
    ))
}

/// The site-packages folder of a virtual environment rooted at `prefix`
/// for Python 3.`minor` (tests build fake ones).
#[cfg(test)]
pub(crate) fn venv_site(prefix: &Path, minor: u32) -> PathBuf {
    prefix.join(format!("lib/python3.{minor}/site-packages"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh, empty temporary folder for one test.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tapir-libs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, b"").expect("write");
    }

    #[test]
    fn major_order_prefers_the_newest_the_driver_runs() {
        assert_eq!(major_order(None), vec![13, 12]);
        assert_eq!(major_order(Some(13000)), vec![13, 12]);
        assert_eq!(major_order(Some(13020)), vec![13, 12]);
        // A CUDA 12 driver cannot load NVRTC 13's PTX: 12 first, 13 last.
        assert_eq!(major_order(Some(12090)), vec![12, 13]);
        assert_eq!(major_order(Some(11080)), vec![12, 13]);
    }

    #[test]
    fn candidates_follow_the_wheel_and_toolkit_layouts() {
        let root = scratch("layout");
        let site = venv_site(&root.join("venv"), 12);
        let cu13 = site.join("nvidia/cu13/lib/libnvrtc.so.13");
        let cu12 = site.join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
        let toolkit = root.join("cuda/lib64");
        let tk13 = toolkit.join("libnvrtc.so.13");
        for p in [&cu13, &cu12, &tk13] {
            touch(p);
        }
        // A cuBLAS file must not be offered for NVRTC.
        touch(&site.join("nvidia/cu13/lib/libcublas.so.13"));
        let roots = Roots { explicit: None, site_packages: vec![site.clone()], toolkits: vec![toolkit.clone()] };

        let for13 = candidates(&NVRTC, &roots, &major_order(Some(13000)));
        let names: Vec<PathBuf> =
            ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"].iter().map(PathBuf::from).collect();
        assert_eq!(for13, [vec![cu13.clone(), tk13.clone(), cu12.clone()], names.clone()].concat());

        let for12 = candidates(&NVRTC, &roots, &major_order(Some(12080)));
        assert_eq!(&for12[..3], &[cu12.clone(), cu13.clone(), tk13.clone()]);

        // The variable's file comes first whatever the driver; a folder
        // stands for the library files in it.
        let explicit = Roots { explicit: Some(root.join("mine.so")), ..roots.clone() };
        assert_eq!(candidates(&NVRTC, &explicit, &[13, 12])[0], root.join("mine.so"));
        let folder = Roots { explicit: Some(toolkit.clone()), ..roots.clone() };
        assert_eq!(candidates(&NVRTC, &folder, &[13, 12])[..2], [tk13.clone(), toolkit.join("libnvrtc.so.12")]);

        // cuBLAS: the same folders, its own files.
        let cublas = candidates(&CUBLAS, &roots, &[13, 12]);
        assert_eq!(cublas[0], site.join("nvidia/cu13/lib/libcublas.so.13"));
        assert_eq!(cublas.len(), 1 + 3);
        std::fs::remove_dir_all(&root).expect("cleanup");
    }

    #[test]
    fn roots_include_the_venv_of_the_python_on_path() {
        // Read, not changed: PATH belongs to every test of this process.
        let roots = Roots::from_env(&NVRTC);
        if let Some(path) = std::env::var_os("PATH") {
            for dir in std::env::split_paths(&path).filter(|d| d.join("python3").exists()) {
                let prefix = dir.parent().expect("a bin folder has a parent");
                let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else { continue };
                for e in entries.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("python3")) {
                    assert!(roots.site_packages.contains(&e.path().join("site-packages")), "{:?}", e.path());
                }
            }
        }
        assert!(roots.toolkits.contains(&PathBuf::from("/usr/local/cuda/lib64")));
    }

    #[test]
    fn open_for_cudarc_names_every_candidate_it_tried() {
        let root = scratch("open");
        let fake = root.join("nvidia/cu13/lib/libnvrtc.so.13");
        touch(&fake);
        let missing = root.join("absent/libnvrtc.so.13");
        let names = vec!["libtapir-no-such-library.so".to_string()];
        let Err(tried) = open_for_cudarc(&[missing.clone(), fake.clone()], &names, b"nvrtcVersion\0", &[]) else {
            panic!("an empty file is no library");
        };
        assert_eq!(tried.len(), 2, "{tried:?}");
        assert!(tried[0].starts_with(&format!("{} (no such file)", missing.display())), "{tried:?}");
        assert!(tried[1].starts_with(&fake.display().to_string()), "{tried:?}");
        std::fs::remove_dir_all(&root).expect("cleanup");
    }
}
