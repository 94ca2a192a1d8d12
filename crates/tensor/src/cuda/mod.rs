//! The CUDA side of tapir-tensor: the kernel sources and their compilation
//! by NVRTC, the device contexts, the caching allocator, the launch
//! toolkit (`launch.rs`), and the launches of the op families, one file
//! per family as in `cpu/` and `kernels/`; [`CudaBackend`] is the device's
//! face to the ops.
//!
//! Every `kernels/*.cu` file is embedded here with `include_str!` and listed
//! in [`KERNELS`]; [`compile_kernel`] turns one into PTX for a given
//! architecture and [`cached_ptx`] does so once per process, keeping the PTX
//! on disk for the next ([`kernel_cache_dir`]). NVRTC is found
//! at run time, never linked: when the library is absent
//! the functions return [`NvrtcError::NotFound`] rather than panic, so the
//! crate builds and runs on a machine with no CUDA at all. A probe of the
//! driver lets `Device::cuda` say why no device is available.
//!
//! `TAPIR_CUDA=emulated` selects the emulated device of `crates/cuda-emu`
//! instead of the system's driver ([`driver_library`] says which is in use).

pub mod alloc;
pub mod attention;
pub(crate) mod binary;
mod buffer;
mod context;
pub(crate) mod cross_entropy;
pub(crate) mod driver;
pub(crate) mod fill;
pub(crate) mod index;
pub mod jet;
pub(crate) mod launch;
mod libs;
pub(crate) mod matmul;
#[cfg(feature = "nccl")]
pub mod nccl;
mod nvrtc;
pub mod optim;
pub(crate) mod random;
pub(crate) mod reduce;
pub(crate) mod shape;
pub(crate) mod softmax;
pub mod timing;
mod unary;

use crate::backend::{Binary, Cmp, Unary};
use crate::DType;
pub(crate) use buffer::to_cuda;
pub use buffer::CudaBuffer;
pub use context::CudaDevice;

use crate::Tensor;

pub use driver::{cublas_library, device_count, driver_library, driver_version, emulated_selected};

pub use nvrtc::{
    cached_ptx, compile_kernel, compile_source, kernel_cache_dir, nvrtc_library, NvrtcError, DEFAULT_ARCH,
};

/// The CUDA backend: every family's kernels as launches on the device
/// whose buffers the operands live in.
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaBackend;

impl crate::backend::Backend for CudaBackend {
    fn is_host(&self) -> bool {
        false
    }
}

/// The prelude prepended to every kernel file before compilation: types,
/// f16/bf16 conversions, strided indexing, warp and block reductions.
pub const PRELUDE: &str = include_str!("../../kernels/common.cuh");

/// Every kernel file of `kernels/`, as `(file name, source)`; one file per op
/// family. A test checks that this list matches the folder.
pub const KERNELS: &[(&str, &str)] = &[
    ("elementwise.cu", include_str!("../../kernels/elementwise.cu")),
    ("reduce.cu", include_str!("../../kernels/reduce.cu")),
    ("softmax.cu", include_str!("../../kernels/softmax.cu")),
    ("cross_entropy.cu", include_str!("../../kernels/cross_entropy.cu")),
    ("index.cu", include_str!("../../kernels/index.cu")),
    ("cast.cu", include_str!("../../kernels/cast.cu")),
    ("random.cu", include_str!("../../kernels/random.cu")),
    ("optim.cu", include_str!("../../kernels/optim.cu")),
    ("attention.cu", include_str!("../../kernels/attention.cu")),
    ("jet.cu", include_str!("../../kernels/jet.cu")),
];

/// Every CUDA kernel the op families name, as `(file of kernels/, entry)`
/// (the unary and binary functions from their families' lists, the other
/// launches from the names they launch by): the NVRTC test
/// checks each is an entry of its file's PTX, so a function added to a
/// family without its `.cu` line fails there.
pub fn kernel_entries() -> Vec<(&'static str, String)> {
    let floats = [DType::F32, DType::F64, DType::F16, DType::BF16];
    let mut out = Vec::new();
    for dt in floats {
        out.extend(Unary::ALL.iter().map(|u| ("elementwise.cu", u.cuda_kernel(dt))));
        out.extend(Binary::ALL.iter().map(|b| ("elementwise.cu", b.cuda_kernel(dt))));
        out.push(("elementwise.cu", Cmp::cuda_kernel(dt)));
    }
    for dt in [DType::I32, DType::I64] {
        out.extend(Binary::INT_KERNELS.iter().map(|b| ("elementwise.cu", b.cuda_kernel(dt))));
        out.push(("elementwise.cu", Cmp::cuda_kernel(dt)));
        out.extend(Unary::INT_KERNELS.iter().map(|u| ("elementwise.cu", u.cuda_kernel(dt))));
    }
    out.extend(binary::kernels());
    out.extend(index::kernels());
    out.extend(shape::kernels());
    out.extend(reduce::kernels());
    out.extend(softmax::kernels());
    out.extend(cross_entropy::kernels());
    // The constructors' fills (zeros and ones on a device), one per width.
    out.extend(fill::KERNELS.iter().map(|k| ("elementwise.cu", k.to_string())));
    out.extend(random::kernel_names().into_iter().map(|k| ("random.cu", k)));
    // The optimizers' in-place updates, one launch per parameter.
    out.extend(optim::kernels());
    // tapir-nn's causal softmax and fused attention.
    out.extend(attention::kernels());
    // tapir-nn's tanh-layer jet updates.
    out.extend(jet::kernels());
    out
}

/// Waits until every launch and copy queued on `device`'s stream has
/// finished (`torch.cuda.synchronize`): a benchmark's clock must not stop
/// while kernels are still queued. Nothing to wait for on the CPU.
pub fn synchronize(device: crate::Device) -> crate::Result<()> {
    if let crate::Device::Cuda(i) = device {
        let dev = CudaDevice::get(i)?;
        dev.stream.synchronize().map_err(|e| context::driver_error("stream synchronize", e))?;
    }
    Ok(())
}

/// Copies `src` (any layout) into the flat CUDA tensor `dst` from element
/// `offset` on, in place, queued on the device's stream: how data
/// parallelism packs each gradient into its bucket without allocating.
/// `dst` keeps its buffer when no other tensor shares it (otherwise it
/// gets a copy of its own first, so nobody else sees the write).
pub fn copy_into(dst: &mut Tensor, offset: usize, src: &Tensor) -> crate::Result<()> {
    const OP: &str = "copy_into";
    if dst.device() != src.device() {
        return Err(crate::Error::DeviceMismatch { op: OP, lhs: dst.device(), rhs: src.device() });
    }
    if dst.dtype() != src.dtype() {
        return Err(crate::Error::DTypeMismatch { op: OP, lhs: dst.dtype(), rhs: src.dtype() });
    }
    if dst.rank() != 1 || offset + src.numel() > dst.numel() {
        return Err(crate::Error::InvalidShape {
            op: OP,
            shape: Box::new(dst.shape().clone()),
            reason: format!("{} elements at offset {offset} do not fit a flat tensor", src.numel()),
        });
    }
    if src.numel() == 0 {
        return Ok(());
    }
    let (dev, _) = launch::device_of(OP, dst)?;
    let base = optim::owned(OP, dst)?;
    let at = base + (offset * dst.dtype().size_in_bytes()) as u64;
    shape::place(OP, &dev, src, at, &src.shape().contiguous_strides())
}

/// Lets f32 matrix products on `device` use TF32 tensor cores (10-bit
/// mantissa inputs, f32 accumulation; faster on Ampere and later, about
/// 1e-3 relative error instead of f32's 1e-7), as
/// `torch.backends.cuda.matmul.allow_tf32 = True` does; `false` restores
/// f32 products, the default. f64, f16 and bf16 products are unaffected.
/// On the CPU, which computes f32 products in f32 always, this is an
/// `Error::InvalidArgument`.
pub fn set_allow_tf32(device: crate::Device, allow: bool) -> crate::Result<()> {
    match device {
        crate::Device::Cuda(i) => CudaDevice::get(i)?.set_tf32(allow),
        crate::Device::Cpu => Err(crate::Error::invalid_arg(
            "set_allow_tf32",
            "TF32 is a CUDA math mode; the CPU computes f32 products in f32",
        )),
    }
}

/// Whether f32 matrix products on `device` may use TF32 (see
/// [`set_allow_tf32`]); false on the CPU and on a device never opened.
pub fn allow_tf32(device: crate::Device) -> bool {
    match device {
        crate::Device::Cuda(i) => CudaDevice::opened(i).is_some_and(|d| d.tf32()),
        crate::Device::Cpu => false,
    }
}

/// Resets the peak to the current live bytes, and the largest single
/// allocation to zero (`torch.cuda.reset_peak_memory_stats`), on any
/// device; on a CUDA device the caching allocator's peaks too. It lives
/// here, above the counters (`memory.rs`), because the allocator's context
/// counts on them.
pub fn reset_peak_memory_stats(device: crate::Device) {
    crate::memory::reset_peaks(device);
    if let crate::Device::Cuda(i) = device {
        if let Some(dev) = CudaDevice::opened(i) {
            dev.reset_peaks();
        }
    }
}

/// Returns every cached block of `device` that no tensor uses to the
/// driver (`torch.cuda.empty_cache`); reserved memory drops to what live
/// blocks' segments hold. Nothing to do on the CPU's CUDA-less devices.
pub fn empty_cache(device: crate::Device) {
    if let crate::Device::Cuda(i) = device {
        if let Ok(dev) = CudaDevice::get(i) {
            dev.empty_cache();
        }
    }
}

/// A table of `device`'s allocator statistics, in the manner of
/// `torch.cuda.memory_summary()`: live and reserved bytes with their peaks,
/// the cached blocks of each pool, and the driver calls.
pub fn memory_summary(device: crate::Device) -> String {
    use std::fmt::Write;
    let s = crate::memory_stats(device);
    let mut out = String::new();
    let line = "=".repeat(64);
    let _ = writeln!(out, "{line}\n tapir memory summary, device {device}\n{line}");
    let row = |out: &mut String, name: &str, cur: usize, peak: usize| {
        let _ = writeln!(out, " {name:<28} {cur:>15} B {peak:>15} B");
    };
    let _ = writeln!(out, " {:<28} {:>17} {:>17}", "metric", "current", "peak");
    row(&mut out, "allocated (tensors)", s.allocated, s.peak);
    row(&mut out, "reserved (segments)", s.reserved, s.peak_reserved);
    if let crate::Device::Cuda(i) = device {
        if let Ok(dev) = CudaDevice::get(i) {
            let (a, cached) = dev.alloc_stats();
            row(&mut out, "allocated (rounded blocks)", a.allocated, a.peak_allocated);
            let _ = writeln!(out, " {:<28} {:>17}", "active blocks", a.active_blocks);
            let _ = writeln!(out, " {:<28} {:>17}", "segments", a.segments);
            for (name, (bytes, n)) in ["cached, small pool", "cached, large pool"].iter().zip(cached) {
                let _ = writeln!(out, " {name:<28} {bytes:>15} B in {n} blocks");
            }
        }
    }
    let _ = writeln!(out, " {:<28} {:>17}", "tensor allocations", s.allocations);
    let _ = writeln!(out, " {:<28} {:>17}", "driver allocations", s.system_allocations);
    let _ = writeln!(out, " {:<28} {:>17}", "driver frees", s.system_frees);
    let _ = writeln!(out, " {:<28} {:>17}", "alloc retries", s.alloc_retries);
    let _ = writeln!(out, " {:<28} {:>17}", "out of memory", s.ooms);
    let _ = write!(out, "{line}");
    out
}
