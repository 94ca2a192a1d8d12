//! tapir-tensor: n-dimensional arrays on the CPU (CUDA in its own module),
//! with exact memory accounting, and every op's forward and derivative rules.
//!
//! A [`Tensor`] is a cheap handle (shared storage plus a strided layout).
//! Every op is a method of a trait implemented for all [`Diff`] values, so
//! the same call records on a graph handle in tapir-autograd:
//!
//! ```
//! use tapir::prelude::*;
//!
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2])?;
//! let y = x.matmul(&x.t()?)?.tanh()?.sum(&[1], false)?;
//! assert_eq!(y.shape().dims(), &[2]);
//! // Memory is counted exactly: y's 8 bytes are live.
//! assert!(memory_allocated(Device::Cpu) >= 8);
//! # Ok::<(), Error>(())
//! ```
#![deny(missing_docs)]

pub mod aligned;
pub mod backend;
pub mod cache;
pub mod cpu;
pub mod cuda;
mod device;
mod display;
mod dtype;
mod error;
mod layout;
mod memory;
pub mod ops;
mod rng;
mod storage;
mod tensor;

pub use aligned::{buffer_alignment, AlignedAlloc};
pub use cuda::reset_peak_memory_stats;
pub use device::Device;
pub use dtype::{DType, Element, Float};
pub use error::{Error, Result};
pub use layout::{resolve_axis, Layout, Shape};
pub use memory::{format_bytes, max_memory_allocated, memory_allocated, memory_stats, MemoryStats};
pub use ops::{
    Arity, BinaryOps, CrossEntropyOps, Derivative, Diff, DynOp, IndexOps, MatmulOps, Op, ReduceOps, Saved, ShapeOps,
    SoftmaxOps, Tape, Traced, UnaryOps,
};
pub use rng::Rng;
pub use storage::{CpuBuffer, CpuElement, Storage};
pub use tensor::Tensor;

/// Everything a user of tensors needs in scope: the types and every op trait.
pub mod prelude {
    pub use crate::{
        memory_allocated, memory_stats, reset_peak_memory_stats, BinaryOps, CrossEntropyOps, DType, Device, Diff,
        Error, IndexOps, MatmulOps, ReduceOps, Result, Rng, Shape, ShapeOps, SoftmaxOps, Tensor, UnaryOps,
    };
}
