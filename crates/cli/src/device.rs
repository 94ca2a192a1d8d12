//! `--device`: which device a command runs on.

use std::str::FromStr;

use tapir::prelude::*;

/// What the user asked for with `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceArg {
    /// The host.
    #[default]
    Cpu,
    /// CUDA device N (`cuda` is `cuda:0`).
    Cuda(usize),
    /// CUDA 0 when one can be used, else the CPU.
    Auto,
}

impl FromStr for DeviceArg {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceArg::Cpu),
            "cuda" => Ok(DeviceArg::Cuda(0)),
            "auto" => Ok(DeviceArg::Auto),
            other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(DeviceArg::Cuda(n)),
                _ => Err(format!("unknown device `{s}`: expected cpu, cuda, cuda:N or auto")),
            },
        }
    }
}

impl std::fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceArg::Cpu => f.write_str("cpu"),
            DeviceArg::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceArg::Auto => f.write_str("auto"),
        }
    }
}

impl DeviceArg {
    /// The device to run on, with a line saying why when `auto` chose.
    /// A CUDA request on a machine without one is an error naming what is
    /// missing, never a fallback: a user who asked for the GPU should not
    /// get CPU figures without noticing.
    pub fn resolve(self) -> anyhow::Result<(Device, Option<String>)> {
        match self {
            DeviceArg::Cpu => Ok((Device::Cpu, None)),
            DeviceArg::Cuda(n) => match Device::cuda(n) {
                Ok(d) => Ok((d, None)),
                Err(e) => Err(anyhow::anyhow!("--device cuda:{n} cannot be used: {e}")),
            },
            DeviceArg::Auto => match Device::cuda(0) {
                Ok(d) => Ok((d, Some(format!("device: auto picked {d} (CUDA is present)")))),
                Err(e) => Ok((Device::Cpu, Some(format!("device: auto picked cpu (no CUDA: {e})")))),
            },
        }
    }

    /// [`DeviceArg::resolve`], printing the choice when `auto` made one.
    pub fn pick(self) -> anyhow::Result<Device> {
        let (d, note) = self.resolve()?;
        if let Some(n) = note {
            println!("{n}");
        }
        Ok(d)
    }
}

/// The host's CPU as `lscpu` names it (`model name` in /proc/cpuinfo), or
/// `unknown CPU` where that cannot be read: figures printed beside it say
/// which machine they came from.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The vector instruction set tapir's CPU kernels run (`avx512`, `avx2`
/// or `portable`), with ` (TAPIR_CPU_ISA)` where that variable lowered it.
pub fn cpu_kernels() -> String {
    use tapir::tensor::cpu::simd::{isa, Isa};
    let capped = std::env::var("TAPIR_CPU_ISA").ok().and_then(|v| Isa::parse(&v)).is_some();
    format!("{}{}", isa().name(), if capped { " (TAPIR_CPU_ISA)" } else { "" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_spelling_and_rejects_others() {
        assert_eq!("cpu".parse::<DeviceArg>(), Ok(DeviceArg::Cpu));
        assert_eq!("cuda".parse::<DeviceArg>(), Ok(DeviceArg::Cuda(0)));
        assert_eq!("CUDA:3".parse::<DeviceArg>(), Ok(DeviceArg::Cuda(3)));
        assert_eq!("auto".parse::<DeviceArg>(), Ok(DeviceArg::Auto));
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", ""] {
            let e = bad.parse::<DeviceArg>().unwrap_err();
            assert!(e.contains("cpu, cuda, cuda:N or auto"), "{bad}: {e}");
        }
    }
}
