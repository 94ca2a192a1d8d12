//! `tapir gpt --device cuda`: a short run on a CUDA device (the emulated
//! one in CI) learns and keeps the device's live bytes identical at every
//! step boundary, and a checkpoint saved there resumes on the CPU.

use tapir::prelude::*;
use tapir_cli::device::DeviceArg;
use tapir_cli::gpt::{train, Args};

/// The memory counters are process-wide: the tests that train hold this.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A tiny model for `steps` steps on `device`.
fn tiny(steps: usize, device: DeviceArg) -> Args {
    Args {
        digits: 1,
        steps,
        batch: 16,
        d_model: 16,
        layers: 1,
        heads: 2,
        block: 8,
        warmup: 2,
        eval_every: 0,
        no_chart: true,
        quiet: true,
        device,
        ..Args::default()
    }
}

#[test]
fn gpt_on_cuda_learns_with_flat_device_memory() {
    let _s = serial();
    let Some(dev) = tapir_testing::cuda_or_skip("gpt_on_cuda_learns_with_flat_device_memory", Device::cuda(0)) else {
        return;
    };
    let before = memory_allocated(dev);
    let a = tiny(20, DeviceArg::Cuda(0));
    let s = train(&a).unwrap();
    assert_eq!(s.steps_run, 20);
    let (first, last) = (s.losses[0], *s.losses.last().unwrap());
    assert!(last < 0.9 * first, "loss {first} -> {last}");
    // The same run on the CPU starts from the same loss (same seed, same
    // initial parameters): the device computes what the host does.
    let cpu = train(&Args { device: DeviceArg::Cpu, ..a.clone() }).unwrap();
    assert!((cpu.losses[0] - first).abs() <= 1e-4 * first.abs(), "first loss: cpu {} vs cuda {first}", cpu.losses[0]);
    assert!(s.memory_flat, "device live bytes moved: {:?}", s.live);
    assert!(s.live[0] > before, "nothing was live on {dev}: the run did not use it");
    assert_eq!(memory_allocated(dev), before, "the run freed what it made on {dev}");
}

#[test]
fn a_run_saved_on_cuda_resumes_on_the_cpu() {
    // Half a run on the device, saved; the other half resumed from that
    // checkpoint on the host. The parameters and AdamW's moments cross in
    // the file, so the resumed half follows the uninterrupted device run up
    // to the rounding by which the devices' kernels differ.
    let _s = serial();
    let Some(dev) = tapir_testing::cuda_or_skip("a_run_saved_on_cuda_resumes_on_the_cpu", Device::cuda(0)) else {
        return;
    };
    let ck = std::env::temp_dir().join(format!("tapir-gpt-cuda-{}.safetensors", std::process::id()));
    let whole = train(&tiny(10, DeviceArg::Cuda(0))).unwrap();
    let first = train(&Args { save: Some(ck.clone()), stop_after: Some(5), ..tiny(10, DeviceArg::Cuda(0)) }).unwrap();
    assert_eq!(first.losses, whole.losses[..5].to_vec(), "a device run is deterministic");
    let before = memory_allocated(dev);
    let rest = train(&Args { resume: Some(ck.clone()), ..tiny(10, DeviceArg::Cpu) }).unwrap();
    assert_eq!(memory_allocated(dev), before, "the resumed run did not touch {dev}");
    assert_eq!(rest.steps_run, 5);
    for (k, (cpu, cuda)) in rest.losses.iter().zip(&whole.losses[5..]).enumerate() {
        assert!((cpu - cuda).abs() <= 1e-4 * cuda.abs(), "step {}: resumed on the cpu {cpu}, cuda {cuda}", k + 5);
    }
    let _ = std::fs::remove_file(&ck);
}
