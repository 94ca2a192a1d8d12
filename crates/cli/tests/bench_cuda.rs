//! `tapir bench --device cuda`: a case runs on a CUDA device (the emulated
//! one in CI) and the report names the device.

use tapir::prelude::*;
use tapir_cli::bench::{run, Args};
use tapir_cli::device::DeviceArg;

/// One repetition of the case `only` on `device`, tapir's side alone, its
/// figures written under `dir`.
fn one_case(only: &str, device: DeviceArg, dir: &std::path::Path) -> Args {
    Args {
        only: vec![only.into()],
        reps: 1,
        no_torch: true,
        rounds: 1,
        python: "python3".into(),
        json: dir.join("b.json"),
        plot: dir.join("b.png"),
        device,
    }
}

#[tapir_testing::cuda_test]
fn bench_on_cuda_runs_a_case_and_names_the_device() {
    if let Err(e) = Device::cuda(0) {
        assert!(std::env::var("TAPIR_REQUIRE_CUDA").as_deref() != Ok("1"), "TAPIR_REQUIRE_CUDA=1 but {e}");
        println!("SKIPPED bench_on_cuda_runs_a_case_and_names_the_device: no CUDA device ({e})");
        return;
    }
    let dir = std::env::temp_dir().join(format!("tapir-bench-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    run(one_case("mlp_grad", DeviceArg::Cuda(0), &dir)).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("b.json")).unwrap()).unwrap();
    assert_eq!(doc["device"], "cuda:0");
    let ms = doc["cases"][0]["tapir_ms"].as_f64().unwrap();
    assert!(ms.is_finite() && ms > 0.0, "{ms}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_gpu_scale_cases_are_refused_on_the_cpu_by_name() {
    let dir = std::env::temp_dir().join(format!("tapir-bench-cpu-{}", std::process::id()));
    let a = |only: &str| one_case(only, DeviceArg::Cpu, &dir);
    let e = run(a("linear_ce_8192x128256x4096_bf16")).unwrap_err().to_string();
    assert!(e.contains("runs on CUDA only (pass --device cuda)"), "{e}");
    let e = run(a("no_such_case")).unwrap_err().to_string();
    assert!(e.contains("on CUDA also: ce_32768x32000, ce_8192x128256"), "{e}");
}

/// The figures say which machine made them: the host CPU's name and the
/// vector set tapir's kernels ran, in the JSON beside the cases.
#[test]
fn bench_json_names_the_host_cpu_and_its_kernels() {
    let dir = std::env::temp_dir().join(format!("tapir-bench-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    run(one_case("scalar_chain", DeviceArg::Cpu, &dir)).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("b.json")).unwrap()).unwrap();
    let cpu = doc["host_cpu"].as_str().unwrap();
    assert!(!cpu.is_empty() && cpu == tapir_cli::device::cpu_model(), "{cpu}");
    let kernels = doc["cpu_kernels"].as_str().unwrap();
    assert!(["avx512", "avx2", "portable"].iter().any(|k| kernels.starts_with(k)), "{kernels}");
    assert!(doc["threads"].as_u64().unwrap() >= 1);
    std::fs::remove_dir_all(&dir).ok();
}

/// The `tapir` command allocates large buffers on cache lines (its
/// `#[global_allocator]` is `tapir::AlignedAlloc`), and its JSON says so;
/// a library user's process without it reports what its allocator gives.
#[test]
fn the_tapir_command_aligns_its_buffers_and_says_so() {
    let dir = std::env::temp_dir().join(format!("tapir-bench-align-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tapir"))
        .args(["bench", "--only", "scalar_chain", "--no-torch", "--reps", "1", "--json"])
        .arg(dir.join("b.json"))
        .arg("--plot")
        .arg(dir.join("b.png"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("b.json")).unwrap()).unwrap();
    let align = doc["buffer_align"].as_u64().unwrap();
    assert_eq!(align, 64, "the tapir command's buffers aligned to {align} bytes");
    assert!(stdout.contains(&format!("buffers aligned to {align} B")), "{stdout}");
    // This test's own process has no such allocator: still a power of two.
    assert!(tapir::buffer_alignment().is_power_of_two());
    std::fs::remove_dir_all(&dir).ok();
}
