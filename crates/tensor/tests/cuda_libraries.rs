//! Which NVRTC and cuBLAS tapir opens (src/cuda/libs.rs): a fake Python
//! environment whose `site-packages` holds both the CUDA 13 wheels' layout
//! (`nvidia/cu13/lib/libnvrtc.so.13`) and the CUDA 12 wheels'
//! (`nvidia/cuda_nvrtc/lib/libnvrtc.so.12`), its files links to the
//! libraries this process uses, is put first on `PATH` of a child process
//! (the libraries are found once per process), which must pick the major
//! version its driver runs (the emulated device reports CUDA 12.9, the
//! lent H200's driver 13.0, no driver at all: 13) and then run a kernel and
//! a matrix product with it.

#[path = "support/cuda.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use tapir_tensor::prelude::*;

/// Set in a child process: which layout it runs under.
const CHILD: &str = "TAPIR_LIBS_TEST_CHILD";

/// The file of the loaded library whose name starts with `prefix`
/// (`libnvrtc.so`), read from this process's memory map.
fn loaded_file(prefix: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(PathBuf::from)
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix)))
}

fn link(target: &Path, at: &Path) {
    std::fs::create_dir_all(at.parent().expect("parent")).expect("mkdir");
    std::os::unix::fs::symlink(target, at).expect("symlink");
}

/// Runs this test binary's child test under `layout` (the fake
/// environment's root) and returns its stdout; the child must succeed.
fn child(kind: &str, layout: &Path, extra_env: &[(&str, &Path)]) -> String {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![layout.join("venv/bin")];
    // No other Python environment on PATH either (a virtual environment
    // with the real wheels, as the GPU check's rehearsal puts first).
    dirs.extend(std::env::split_paths(&path).filter(|d| !d.join("python3").exists()));
    let mut c = Command::new(std::env::current_exe().expect("test binary"));
    c.args(["cuda_libraries_child_process", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, kind)
        .env("PATH", std::env::join_paths(dirs).expect("PATH"))
        // No other Python or toolkit of the variables' kind: HOME's pyenv
        // and ~/.local would hold the real wheels.
        .env("HOME", layout)
        .env_remove("TAPIR_NVRTC_LIB")
        .env_remove("TAPIR_CUBLAS_LIB")
        .env_remove("VIRTUAL_ENV")
        .env_remove("CONDA_PREFIX")
        .env_remove("CUDA_HOME")
        .env_remove("CUDA_PATH");
    for (k, v) in extra_env {
        c.env(k, v);
    }
    let out = c.output().expect("running the child");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "child {kind} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The value the child printed as `key=value` (the harness may print its
/// "test ... " before the first, on the same line).
fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.split_once(&format!("{key}=")).map(|(_, v)| v))
        .unwrap_or_else(|| panic!("the child printed no {key}=:\n{out}"))
}

#[test]
fn cuda_libraries_are_found_in_python_wheel_layouts() {
    const TEST: &str = "cuda_libraries_are_found_in_python_wheel_layouts";
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let Some(dev) = support::cuda(TEST) else { return };
    // What this process uses, found as the suite finds it.
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap().to_device(dev).unwrap();
    x.add(&x).unwrap().matmul(&x).unwrap().to_vec::<f32>().unwrap();
    let nvrtc = loaded_file("libnvrtc.so").expect("NVRTC is loaded after a kernel ran");
    let cublas =
        loaded_file(if tapir_tensor::cuda::emulated_selected() { "libtapir_cuda_emu_cublas" } else { "libcublas.so" })
            .expect("cuBLAS is loaded after a product ran");
    // For the GPU check's record (scripts/gpu-check.sh reads this line).
    println!(
        "in use: driver={:?} nvrtc={} cublas={}",
        tapir_tensor::cuda::driver_version(),
        nvrtc.display(),
        cublas.display()
    );

    let root = std::env::temp_dir().join(format!("tapir-cuda-libraries-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let venv = root.join("venv");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    // A python3 on PATH marks the environment, as a real one's does.
    std::fs::write(venv.join("bin/python3"), b"").unwrap();
    let site = venv.join("lib/python3.12/site-packages/nvidia");
    let fake = |major: u32, stem: &str, package: &str| {
        if major == 13 {
            site.join(format!("cu13/lib/lib{stem}.so.13"))
        } else {
            site.join(format!("{package}/lib/lib{stem}.so.12"))
        }
    };
    // NVRTC opens its builtins library from the folder it was opened from.
    let builtins: Vec<PathBuf> = std::fs::read_dir(nvrtc.parent().expect("a folder"))
        .expect("NVRTC's folder")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libnvrtc-builtins")))
        .collect();
    for major in [13, 12] {
        let at = fake(major, "nvrtc", "cuda_nvrtc");
        link(&nvrtc, &at);
        for b in &builtins {
            link(b, &at.with_file_name(b.file_name().expect("a file")));
        }
        link(&cublas, &fake(major, "cublas", "cublas"));
    }

    // The newest major the driver runs: 12 on the emulated device (CUDA
    // 12.9), 13 on a CUDA 13 driver.
    let driver = tapir_tensor::cuda::driver_version();
    let want = if driver.is_none_or(|v| v >= 13000) { 13 } else { 12 };
    let out = child("both", &root, &[]);
    println!("{out}");
    assert_eq!(field(&out, "driver"), format!("{driver:?}"));
    assert_eq!(field(&out, "nvrtc"), fake(want, "nvrtc", "cuda_nvrtc").display().to_string());
    if !tapir_tensor::cuda::emulated_selected() {
        assert_eq!(field(&out, "cublas"), fake(want, "cublas", "cublas").display().to_string());
    }

    // Only the other major present: it is taken rather than nothing,
    // unless the machine keeps the preferred one in a system-wide Python
    // (/usr/local, /usr), which is then rightly preferred.
    let other = if want == 13 { 12 } else { 13 };
    std::fs::remove_file(fake(want, "nvrtc", "cuda_nvrtc")).unwrap();
    let out = child("both", &root, &[]);
    let got = field(&out, "nvrtc");
    if got.starts_with(root.to_string_lossy().as_ref()) || !got.ends_with(&format!(".so.{want}")) {
        assert_eq!(got, fake(other, "nvrtc", "cuda_nvrtc").display().to_string());
    } else {
        println!("the machine's own CUDA {want} NVRTC ({got}) was preferred to the layout's CUDA {other} one");
    }

    // Nothing in the layout and a named file that does not exist: the
    // error names what was tried, the named file first. (A library the
    // machine keeps elsewhere, on the loader's path or in a toolkit, may
    // still be found; then it is not one of the layout's.)
    std::fs::remove_file(fake(other, "nvrtc", "cuda_nvrtc")).unwrap();
    let missing = root.join("missing/libnvrtc.so.13");
    let out = child("none", &root, &[("TAPIR_NVRTC_LIB", &missing)]);
    let found = field(&out, "nvrtc");
    if let Some(err) = found.strip_prefix("error: ") {
        assert!(err.contains("NVRTC (CUDA 13 or 12) not found"), "{err}");
        assert!(err.contains(&format!("{} (no such file)", missing.display())), "{err}");
        assert!(err.contains("libnvrtc.so.13 (") && err.contains("libnvrtc.so.12 ("), "{err}");
    } else {
        assert!(!found.starts_with(&root.display().to_string()), "{found} was removed");
        println!("{TEST}: with the layout empty, the machine's own NVRTC was found: {found}");
    }
    std::fs::remove_dir_all(&root).unwrap();
}

/// The child half of the test above; does nothing unless started by it.
#[test]
fn cuda_libraries_child_process() {
    let Ok(kind) = std::env::var(CHILD) else { return };
    println!("driver={:?}", tapir_tensor::cuda::driver_version());
    match tapir_tensor::cuda::nvrtc_library() {
        Ok(p) => println!("nvrtc={p}"),
        Err(e) => println!("nvrtc=error: {e}"),
    }
    if kind == "none" {
        return;
    }
    // The chosen libraries work: a kernel and a product on the device.
    let dev = Device::cuda(0).expect("the parent had a device");
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap().to_device(dev).unwrap();
    assert_eq!(x.add(&x).unwrap().to_vec::<f32>().unwrap(), [2.0, 4.0, 6.0, 8.0]);
    assert_eq!(x.matmul(&x).unwrap().to_vec::<f32>().unwrap(), [7.0, 10.0, 15.0, 22.0]);
    println!("cublas={}", tapir_tensor::cuda::cublas_library().expect("cuBLAS after a product"));
}
