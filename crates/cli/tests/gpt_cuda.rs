//! `tapir gpt --device cuda`: a short run on a CUDA device (the emulated
//! one in CI) learns and keeps the device's live bytes identical at every
//! step boundary.

use tapir::prelude::*;
use tapir_cli::device::DeviceArg;
use tapir_cli::gpt::{train, Args};

#[test]
fn gpt_on_cuda_learns_with_flat_device_memory() {
    let dev = match Device::cuda(0) {
        Ok(d) => d,
        Err(e) => {
            assert!(std::env::var("TAPIR_REQUIRE_CUDA").as_deref() != Ok("1"), "TAPIR_REQUIRE_CUDA=1 but {e}");
            println!("SKIPPED gpt_on_cuda_learns_with_flat_device_memory: no CUDA device ({e})");
            return;
        }
    };
    let before = memory_allocated(dev);
    let a = Args {
        digits: 1,
        steps: 20,
        batch: 16,
        d_model: 16,
        layers: 1,
        heads: 2,
        block: 8,
        warmup: 2,
        eval_every: 0,
        no_chart: true,
        quiet: true,
        device: DeviceArg::Cuda(0),
        ..Args::default()
    };
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
