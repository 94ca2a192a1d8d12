//! `--device`: `tapir pinn poisson --device cuda` trains on a CUDA device
//! (the emulated one in CI) with flat memory, a CUDA request without a
//! device is a clear error, and `auto` falls back to the CPU saying so.

use std::process::Command;

use tapir::prelude::*;
use tapir_cli::device::DeviceArg;
use tapir_cli::pinn::{train, Args, Problem};

/// The CUDA device, or None after saying why this test skips (a failure
/// under TAPIR_REQUIRE_CUDA=1).
fn cuda_or_skip(test: &str) -> Option<Device> {
    tapir_testing::cuda_or_skip(test, Device::cuda(0))
}

/// The memory counters are process-wide: the tests that train hold this.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn tiny(device: DeviceArg) -> Args {
    Args {
        problem: Problem::Poisson,
        steps: Some(25),
        lbfgs: Some(0),
        lr: 1e-2,
        lr_final: 1e-2,
        hidden: Some(vec![8, 8]),
        interior: Some(48),
        boundary: 24,
        ic_points: 0,
        ic_weight: None,
        adaptive: 0,
        adaptive_rounds: 1,
        adaptive_every: 1000,
        adaptive_candidates: 20_000,
        f64: false,
        lbfgs_precision: None,
        lbfgs_f64_cost: 2.7,
        line_search: None,
        seed: 3,
        eval_every: 1000,
        plot: "".into(),
        curves: "".into(),
        quiet: true,
        plain: false,
        device,
        dist: Default::default(),
        devices: vec![],
        json: None,
    }
}

#[tapir_testing::cuda_test]
fn pinn_poisson_on_cuda_learns_with_flat_device_memory() {
    let _s = serial();
    let Some(dev) = cuda_or_skip("pinn_poisson_on_cuda_learns_with_flat_device_memory") else { return };
    let before = memory_allocated(dev);
    let o = train(&tiny(DeviceArg::Cuda(0))).unwrap();
    assert_eq!(o.losses.len(), 25);
    let (first, last) = (o.losses[0], *o.losses.last().unwrap());
    assert!(last.is_finite() && last < 0.5 * first, "loss {first} -> {last}");
    assert!(o.rel_l2.is_finite());
    // After the first step (which creates Adam's moments) every boundary
    // holds exactly the parameters, moments and points, on the device.
    assert!(o.live.windows(2).skip(1).all(|w| w[0] == w[1]), "device live bytes moved: {:?}", o.live);
    assert!(o.live[1] > before, "nothing was live on {dev}: the run did not use it");
    // Everything the run made is freed once it returns.
    assert_eq!(memory_allocated(dev), before);
}

#[tapir_testing::cuda_test]
fn pinn_on_cuda_and_cpu_agree_at_the_start() {
    // The same seed draws the same points and weights on every device, so
    // the first loss (before any update) agrees to f32 rounding.
    let _s = serial();
    let Some(_) = cuda_or_skip("pinn_on_cuda_and_cpu_agree_at_the_start") else { return };
    let one = |d| train(&Args { steps: Some(1), ..tiny(d) }).unwrap().losses[0];
    let (c, g) = (one(DeviceArg::Cpu), one(DeviceArg::Cuda(0)));
    assert!((c - g).abs() <= 1e-4 * c.abs(), "cpu {c} vs cuda {g}");
}

#[tapir_testing::cuda_test]
fn pinn_adam_then_lbfgs_on_cuda_follows_the_cpu_with_flat_memory() {
    // Adam then L-BFGS, the full PINN recipe, on the device: the iterates
    // follow the CPU's (the same arithmetic up to f32 rounding, so the
    // losses agree closely after a few L-BFGS iterations), L-BFGS lowers
    // the loss Adam left, and nothing stays on the device afterwards.
    let _s = serial();
    let Some(dev) = cuda_or_skip("pinn_adam_then_lbfgs_on_cuda_follows_the_cpu_with_flat_memory") else { return };
    let before = memory_allocated(dev);
    let args = |d| Args { steps: Some(5), lbfgs: Some(6), ..tiny(d) };
    let gpu = train(&args(DeviceArg::Cuda(0))).unwrap();
    let cpu = train(&args(DeviceArg::Cpu)).unwrap();
    assert_eq!(gpu.losses.len(), 11);
    assert!(gpu.losses[10] < gpu.losses[5], "L-BFGS did not lower the loss: {:?}", gpu.losses);
    for (step, (c, g)) in cpu.losses.iter().zip(&gpu.losses).enumerate() {
        assert!((c - g).abs() <= 1e-3 * c.abs(), "step {step}: cpu {c} vs cuda {g}");
    }
    assert!((cpu.rel_l2 - gpu.rel_l2).abs() <= 1e-3 * cpu.rel_l2, "rel L2 cpu {} vs cuda {}", cpu.rel_l2, gpu.rel_l2);
    assert_eq!(memory_allocated(dev), before, "the run left bytes on {dev}");
}

/// The `tapir` binary with the emulated device selected but its library
/// missing: no CUDA device, on any machine.
fn tapir_without_cuda() -> Command {
    // The one cargo built, else the one beside this test binary (the GPU
    // check's prepared folder holds both, moved to another machine).
    let built = std::path::PathBuf::from(env!("CARGO_BIN_EXE_tapir"));
    let beside = std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join("tapir")));
    let bin = if built.exists() { Some(built) } else { beside.filter(|p| p.exists()) };
    let mut c = Command::new(bin.unwrap_or_else(|| env!("CARGO_BIN_EXE_tapir").into()));
    c.env("TAPIR_CUDA", "emulated").env("TAPIR_CUDA_EMU_LIB", "/nonexistent-tapir-cuda-emu");
    c.args(["pinn", "poisson", "--steps", "3", "--hidden", "4", "--interior", "16", "--boundary", "8"]);
    // The plots go to cargo's target/tmp (they outlived every run in the
    // system's temporary folder).
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let plot = dir.join(format!("tapir-pinn-cuda-{}.png", std::process::id()));
    let curves = dir.join(format!("tapir-pinn-cuda-{}-curves.png", std::process::id()));
    c.args(["--lbfgs", "0", "--quiet", "--plot"]).arg(plot).arg("--curves").arg(curves);
    c
}

#[test]
fn cuda_without_a_device_is_a_clear_error() {
    let o = tapir_without_cuda().args(["--device", "cuda"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "exit status {:?}", o.status);
    assert_eq!(o.status.code(), Some(1), "an error exit, not a panic: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("--device cuda:0 cannot be used"), "{err}");
    assert!(err.contains("emulator library was not found"), "the reason is named: {err}");
    // A malformed device is rejected by the argument parser.
    let o = tapir_without_cuda().args(["--device", "gpu"]).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("expected cpu, cuda, cuda:N or auto"));
}

#[test]
fn auto_without_a_device_falls_back_to_the_cpu_and_says_so() {
    let o = tapir_without_cuda().args(["--device", "auto"]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("device: auto picked cpu (no CUDA:"), "{out}");
    assert!(out.contains("live memory at every step boundary after the first: identical"), "{out}");
}
