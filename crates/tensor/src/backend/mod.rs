//! The seam between what an op means and how a device runs it.
//!
//! An op family's file under [`crate::ops`] checks its inputs once, for
//! every device, and hands a device its kernel's parameters (a plan) and
//! its operands as [`Src`]: a storage and the layout it is read through,
//! never a [`crate::Tensor`]. A device is one type implementing
//! [`Backend`], the supertrait of one kernel trait per op family (here,
//! beside each trait, the plan types its kernels take), so a device
//! missing a family's kernel does not compile. `ops::forward` picks the
//! device once, from the operands, and hands the op that device's backend.
//!
//! The CPU backend is [`crate::cpu::CpuBackend`], the CUDA backend
//! [`crate::cuda::CudaBackend`]; each implements a family's trait in its
//! file named after the family (`cpu/unary.rs`, `cuda/unary.rs`). This
//! module imports neither device, and neither device imports an op.

use crate::storage::Storage;
use crate::{DType, Device, Layout, Shape};

pub mod binary;
pub mod cross_entropy;
pub mod index;
pub mod matmul;
pub mod optim;
pub mod random;
pub mod reduce;
pub mod shape;
pub mod softmax;
pub mod unary;

pub use binary::{Binary, BinaryKernels, Cmp};
pub use cross_entropy::CrossEntropyKernels;
pub use index::IndexKernels;
pub use matmul::MatmulKernels;
pub use optim::OptimKernels;
pub use random::RandomKernels;
pub use reduce::ReduceKernels;
pub use shape::ShapeKernels;
pub use softmax::SoftmaxKernels;
pub use unary::{Unary, UnaryKernels};

/// An operand as a kernel reads it: a storage and the layout of the view
/// (shape, strides, offset) it is read through.
#[derive(Clone, Copy)]
pub struct Src<'a> {
    /// The elements.
    pub storage: &'a Storage,
    /// How the view maps onto them.
    pub layout: &'a Layout,
}

impl<'a> Src<'a> {
    /// The operand's dtype.
    pub fn dtype(&self) -> DType {
        self.storage.dtype()
    }
    /// The device its storage lives on.
    pub fn device(&self) -> Device {
        self.storage.device()
    }
    /// The view's shape.
    pub fn shape(&self) -> &'a Shape {
        &self.layout.shape
    }
    /// The view's element count.
    pub fn numel(&self) -> usize {
        self.layout.shape.numel()
    }
    /// Whether the view is row-major and dense.
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }
}

/// A device: one kernel trait per op family. Implemented by the CPU and the
/// CUDA backends; a family added here is a compile error until both have
/// its kernels.
pub trait Backend:
    UnaryKernels
    + BinaryKernels
    + ShapeKernels
    + SoftmaxKernels
    + ReduceKernels
    + IndexKernels
    + MatmulKernels
    + RandomKernels
    + CrossEntropyKernels
    + OptimKernels
    + Sync
{
    /// True for the CPU backend, whose kernels read host memory; false for
    /// a device's (which finds its ordinal in the operands' buffers).
    fn is_host(&self) -> bool;
}
