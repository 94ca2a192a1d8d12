//! What every example shares: the device it runs on, from its command line.

use tapir::prelude::*;

/// The device named by `--device` (`cpu`, the default; `cuda`, the same as
/// `cuda:0`; `cuda:N`; or `auto`, CUDA 0 when it can be used), e.g.
/// `cargo run --example 01_second_derivative -- --device cuda`. With
/// `TAPIR_CUDA=emulated`, `cuda` is the emulated device (README, "CUDA
/// without a GPU"). Asking for CUDA where there is none is an error saying
/// why, never a silent fallback.
pub fn device() -> anyhow::Result<Device> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut name = None;
    for (i, a) in args.iter().enumerate() {
        if a == "--device" {
            name = Some(args.get(i + 1).cloned().ok_or_else(|| anyhow::anyhow!("--device needs a value"))?);
        } else if let Some(v) = a.strip_prefix("--device=") {
            name = Some(v.to_string());
        } else if args.get(i.wrapping_sub(1)).is_none_or(|p| p != "--device") {
            anyhow::bail!("unknown argument {a:?}; the examples take only --device cpu|cuda|cuda:N|auto");
        }
    }
    let device = match name.as_deref().unwrap_or("cpu") {
        "cpu" => Device::Cpu,
        "auto" => Device::best(),
        "cuda" => Device::cuda(0)?,
        other => match other.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
            Some(n) => Device::cuda(n)?,
            None => anyhow::bail!("--device {other:?}: expected cpu, cuda, cuda:N or auto"),
        },
    };
    println!("device: {device}");
    Ok(device)
}
