//! Every kernel file compiles under NVRTC, so a kernel that does not
//! compile fails CI.
//!
//! NVRTC needs no GPU, so CI runs this everywhere: .ci/run installs the
//! library from PyPI and sets TAPIR_REQUIRE_NVRTC=1. Elsewhere, without the
//! library, the test says it was skipped and passes.
//!
//! NVRTC stops at PTX and does not read inline `asm`; with `TAPIR_PTXAS`
//! naming a ptxas binary (the nvidia-cuda-nvcc-cu12 wheel has one) the PTX
//! is also assembled for sm_80 and sm_90, which checks that too.

use tapir_tensor::cuda::{
    cached_ptx, compile_kernel, compile_source, nvrtc_library, NvrtcError, DEFAULT_ARCH, KERNELS,
};

/// Whether NVRTC can be used; panics when it cannot but is required.
fn nvrtc_or_skip() -> bool {
    match nvrtc_library() {
        Ok(lib) => {
            println!("NVRTC: {lib}");
            true
        }
        Err(e) => {
            assert!(std::env::var("TAPIR_REQUIRE_NVRTC").as_deref() != Ok("1"), "TAPIR_REQUIRE_NVRTC=1 but {e}");
            println!("skipped: NVRTC not found (set TAPIR_REQUIRE_NVRTC=1 to make this a failure)");
            false
        }
    }
}

/// Assembles `ptx` with `$TAPIR_PTXAS` when it is set; Ok otherwise.
fn assemble(name: &str, arch: &str, ptx: &str) -> Result<(), String> {
    let Some(ptxas) = std::env::var_os("TAPIR_PTXAS") else { return Ok(()) };
    let sm = arch.replace("compute_", "sm_");
    let path = std::env::temp_dir().join(format!("tapir-{}-{name}-{arch}.ptx", std::process::id()));
    std::fs::write(&path, ptx).map_err(|e| format!("{name}: writing {}: {e}", path.display()))?;
    let out = std::process::Command::new(&ptxas)
        .args([&format!("-arch={sm}"), path.to_str().expect("utf-8 temp path"), "-o", "/dev/null"])
        .output()
        .map_err(|e| format!("{name}: running {}: {e}", ptxas.to_string_lossy()))?;
    let _ = std::fs::remove_file(&path);
    if out.status.success() {
        println!("{name} ({sm}): assembled by ptxas");
        Ok(())
    } else {
        Err(format!("ptxas -arch={sm} rejected {name}:\n{}", String::from_utf8_lossy(&out.stderr)))
    }
}

#[test]
fn kernels_lists_every_file_of_the_kernels_folder() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .expect("kernels/ exists")
        .map(|e| e.expect("readable entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cu"))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = KERNELS.iter().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed);
}

#[test]
fn every_kernel_compiles_with_nvrtc() {
    if !nvrtc_or_skip() {
        return;
    }
    let mut failures = Vec::new();
    for (name, src) in KERNELS {
        for arch in [DEFAULT_ARCH, "compute_90"] {
            match compile_kernel(name, arch) {
                Ok(ptx) => {
                    // Every `extern "C" __global__` function is an entry of the PTX.
                    let entries = ptx.matches(".entry").count();
                    let declared = src.matches("extern \"C\" __global__").count();
                    println!("{name} ({arch}): {} bytes of PTX, {entries} entries", ptx.len());
                    assert!(entries >= declared.max(1), "{name}: {entries} PTX entries for {declared} kernels");
                    if let Err(e) = assemble(name, arch, &ptx) {
                        failures.push(e);
                    }
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_kernels_the_backend_will_launch_are_entries() {
    if !nvrtc_or_skip() {
        return;
    }
    let expected: &[(&str, &[&str])] = &[
        (
            "elementwise.cu",
            &["add_f32", "gelu_f16", "clamp_bf16", "gelu_tanh_bwd_f64", "compare_f32", "copy_strided_i64"],
        ),
        ("reduce.cu", &["sum_last_f32", "max_last_bf16", "min_last_f64", "sum_cols_f16", "argmax_last_f32"]),
        ("softmax.cu", &["softmax_f32", "log_softmax_bf16", "log_softmax_f64"]),
        ("cross_entropy.cu", &["ce_fwd_f32_i64", "ce_bwd_bf16_i64", "ce_fwd_f64_i32", "ce_bwd_f16_i32"]),
        (
            "index.cu",
            &[
                "index_select_f32_i64",
                "embedding_bf16_i32",
                "index_add_f16_i64",
                "gather_f64_i32",
                "scatter_add_bf16_i64",
            ],
        ),
        ("cast.cu", &["cast_f32_bf16", "cast_f64_f16", "cast_i64_f32", "cast_bf16_i32"]),
    ];
    for (file, names) in expected {
        let ptx = compile_kernel(file, DEFAULT_ARCH).unwrap_or_else(|e| panic!("{e}"));
        for name in *names {
            assert!(ptx.contains(&format!(".entry {name}(")), "{file}: no entry {name}");
        }
    }
}

/// Every kernel name the op families give (`cuda::kernel_entries`, made from
/// `Unary::ALL`, `Binary::ALL` and the comparisons) is an entry of its
/// file: a function added to a family without its `.cu` line fails here.
#[test]
fn every_kernel_an_op_family_names_is_an_entry() {
    if !nvrtc_or_skip() {
        return;
    }
    let names = tapir_tensor::cuda::kernel_entries();
    assert!(names.len() > 100, "{} names", names.len());
    let mut missing = Vec::new();
    for file in names.iter().map(|(f, _)| *f).collect::<std::collections::BTreeSet<_>>() {
        let ptx = cached_ptx(file, DEFAULT_ARCH).unwrap_or_else(|e| panic!("{e}"));
        missing.extend(names.iter().filter(|(f, n)| *f == file && !ptx.contains(&format!(".entry {n}("))).cloned());
    }
    assert!(missing.is_empty(), "kernels named by ops but not in kernels/: {missing:?}");
}

#[test]
fn ptx_is_compiled_once_per_process() {
    if !nvrtc_or_skip() {
        return;
    }
    let a = cached_ptx("softmax.cu", DEFAULT_ARCH).unwrap_or_else(|e| panic!("{e}"));
    let b = cached_ptx("softmax.cu", DEFAULT_ARCH).unwrap_or_else(|e| panic!("{e}"));
    assert!(std::sync::Arc::ptr_eq(&a, &b));
    assert!(matches!(cached_ptx("nope.cu", DEFAULT_ARCH), Err(NvrtcError::Other { .. })));
}

#[test]
fn a_bad_kernel_returns_nvrtcs_log() {
    if !nvrtc_or_skip() {
        return;
    }
    let err = compile_source("broken.cu", "extern \"C\" __global__ void k() { undeclared = 1; }\n", DEFAULT_ARCH)
        .expect_err("does not compile");
    match err {
        NvrtcError::Compile { kernel, log, .. } => {
            assert_eq!(kernel, "broken.cu");
            assert!(log.contains("broken.cu(1)") && log.contains("undeclared"), "{log}");
        }
        other => panic!("expected a compile error, got {other}"),
    }
}

#[test]
fn missing_kernel_name_is_an_error() {
    assert!(matches!(
        compile_kernel("nope.cu", DEFAULT_ARCH),
        Err(NvrtcError::Other { .. } | NvrtcError::NotFound { .. })
    ));
}
