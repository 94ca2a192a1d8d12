//! The CUDA side of tapir-tensor, as far as it goes without a GPU: the
//! kernel sources and their compilation by NVRTC.
//!
//! Every `kernels/*.cu` file is embedded here with `include_str!` and listed
//! in [`KERNELS`]; [`compile_kernel`] turns one into PTX for a given
//! architecture and [`cached_ptx`] does so once per process. NVRTC is found
//! at run time, never linked: when the library is absent
//! the functions return [`NvrtcError::NotFound`] rather than panic, so the
//! crate builds and runs on a machine with no CUDA at all. The device backend (allocator, launches, cuBLAS) is not built yet;
//! a probe of the driver lets `Device::cuda` say why no device is available.
//!
//! `TAPIR_CUDA=emulated` selects the emulated device of `crates/cuda-emu`
//! instead of the system's driver ([`driver_library`] says which is in use).

pub(crate) mod driver;
mod nvrtc;

pub use driver::{driver_library, emulated_selected};

pub use nvrtc::{cached_ptx, compile_kernel, compile_source, nvrtc_library, NvrtcError, DEFAULT_ARCH};

/// The prelude prepended to every kernel file before compilation: types,
/// f16/bf16 conversions, strided indexing, warp and block reductions.
pub const PRELUDE: &str = include_str!("../../../../kernels/common.cuh");

/// Every kernel file of `kernels/`, as `(file name, source)`; one file per op
/// family. A test checks that this list matches the folder.
pub const KERNELS: &[(&str, &str)] = &[
    ("elementwise.cu", include_str!("../../../../kernels/elementwise.cu")),
    ("reduce.cu", include_str!("../../../../kernels/reduce.cu")),
    ("softmax.cu", include_str!("../../../../kernels/softmax.cu")),
    ("cross_entropy.cu", include_str!("../../../../kernels/cross_entropy.cu")),
    ("index.cu", include_str!("../../../../kernels/index.cu")),
    ("cast.cu", include_str!("../../../../kernels/cast.cu")),
];
