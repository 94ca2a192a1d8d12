//! The shared library as `benches/torch/*.py` load it (ctypes opens the
//! `.so` and calls the C entry points by name): built beside this test by
//! cargo (the crate is a `cdylib` too), opened by path, its symbols
//! resolved and called. Building this test is also what makes `cargo test`
//! build the `.so` that scripts/gpu-prepare.sh bundles.

use std::ffi::{c_char, CString};
use std::path::PathBuf;

/// `libtapir_bench_ffi.so` where cargo puts it: beside this test binary
/// (`target/<profile>/deps`).
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe.parent().expect("the test binary's folder");
    let lib = dir.join(format!("{}tapir_bench_ffi{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX));
    assert!(lib.is_file(), "{} was not built beside the test", lib.display());
    lib
}

#[test]
fn the_entry_points_answer_through_the_shared_library() {
    // SAFETY: the library's initialisers have no preconditions.
    let lib = unsafe { libloading::Library::new(library()) }.expect("the library opens");
    // SAFETY: the signatures are those of src/lib.rs.
    let mean_ns = unsafe { lib.get::<unsafe extern "C" fn(*const c_char, f64) -> f64>(b"tapir_bench_mean_ns\0") }
        .expect("tapir_bench_mean_ns is exported");
    // SAFETY: as above.
    let allocs = unsafe { lib.get::<extern "C" fn() -> u64>(b"tapir_bench_cuda_system_allocs\0") }
        .expect("tapir_bench_cuda_system_allocs is exported");
    let known = CString::new("matmul_f32/256").unwrap();
    let unknown = CString::new("no_such/1").unwrap();
    // SAFETY: valid C strings, as the entry point requires.
    let (t, bad) = unsafe { (mean_ns(known.as_ptr(), 0.0), mean_ns(unknown.as_ptr(), 0.0)) };
    assert!(t > 0.0, "a known id is timed: {t}");
    assert!(bad < 0.0, "an unknown id is refused: {bad}");
    assert_eq!(allocs(), 0, "no CUDA benchmark ran, so no driver allocation was counted");
}
