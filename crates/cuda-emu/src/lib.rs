//! An emulated CUDA device, so the CUDA code path runs and is tested on
//! machines without a GPU.
//!
//! The crate builds a shared library that stands in for the CUDA driver
//! (`libcuda`): the driver API that cudarc calls, over a PTX interpreter
//! that runs what NVRTC emits, with a sanitizer that checks every access.
//! Its sibling package `tapir-cuda-emu-cublas` stands in for `libcublas`
//! and forwards to [`blas`] here. It is a test instrument, used only when
//! selected (see the README for the switch, `TAPIR_CUDA=emulated`).
//!
//! The interpreter can also be driven directly, without the C ABI:
//!
//! ```
//! use tapir_cuda_emu::{memory::Memory, ptx, exec};
//!
//! let src = r#"
//! .version 8.8
//! .target sm_90
//! .address_size 64
//! .visible .entry twice(.param .u64 p)
//! {
//!     .reg .b32 %r<3>;
//!     .reg .b64 %rd<4>;
//!     ld.param.u64 %rd1, [p];
//!     cvta.to.global.u64 %rd2, %rd1;
//!     mov.u32 %r1, %tid.x;
//!     mul.wide.u32 %rd3, %r1, 4;
//!     add.s64 %rd2, %rd2, %rd3;
//!     shl.b32 %r2, %r1, 1;
//!     st.global.u32 [%rd2], %r2;
//!     ret;
//! }
//! "#;
//! let mem = Memory::new(1 << 20);
//! let buf = mem.alloc(64 * 4).unwrap();
//! let module = ptx::load(src, &|_| Vec::new()).unwrap();
//! let launch = exec::Launch {
//!     module: &module, func: 0, grid: [1, 1, 1], block: [64, 1, 1], dyn_shared: 0,
//!     params: &buf.to_le_bytes(), mem: &mem.snapshot(), racecheck: true, workers: 1,
//! };
//! exec::run(&launch).unwrap();
//! let p = mem.host_ptr(buf + 4 * 21, 4).unwrap();
//! assert_eq!(unsafe { p.cast::<u32>().read() }, 42);
//! ```

pub mod blas;
pub mod driver;
pub mod exec;
pub mod memory;
pub mod profile;
pub mod ptx;
