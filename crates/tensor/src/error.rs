//! The one error type of tapir-tensor.
//!
//! Every variant names the op that failed and the offending values, so a
//! message read in a log is enough to find the bad call.

use crate::{DType, Device, MemoryStats, Shape};

/// Result alias used across tapir.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a tensor or graph operation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Two operands whose shapes do not fit the op (including broadcasting).
    #[error("{op}: shape mismatch between {lhs} and {rhs}")]
    ShapeMismatch {
        /// The op that failed.
        op: &'static str,
        /// Left (or first) operand's shape.
        lhs: Box<Shape>,
        /// Right (or second) operand's shape.
        rhs: Box<Shape>,
    },
    /// A shape that is invalid for the op on its own.
    #[error("{op}: invalid shape {shape}: {reason}")]
    InvalidShape {
        /// The op that failed.
        op: &'static str,
        /// The shape in question.
        shape: Box<Shape>,
        /// Why it is invalid.
        reason: String,
    },
    /// Operands of different dtypes.
    #[error("{op}: dtype mismatch between {lhs} and {rhs}")]
    DTypeMismatch {
        /// The op that failed.
        op: &'static str,
        /// First dtype.
        lhs: DType,
        /// Second dtype.
        rhs: DType,
    },
    /// The op is not defined for this dtype.
    #[error("{op}: dtype {dtype} is not supported ({expected})")]
    UnsupportedDType {
        /// The op that failed.
        op: &'static str,
        /// The dtype given.
        dtype: DType,
        /// What the op accepts.
        expected: &'static str,
    },
    /// Operands on different devices.
    #[error("{op}: device mismatch between {lhs} and {rhs}; move one with to_device")]
    DeviceMismatch {
        /// The op that failed.
        op: &'static str,
        /// First device.
        lhs: Device,
        /// Second device.
        rhs: Device,
    },
    /// A device that cannot be used here (no driver, no GPU, op not built for it).
    #[error("device {device} is unavailable: {reason}")]
    DeviceUnavailable {
        /// The device asked for.
        device: Device,
        /// Why it cannot be used.
        reason: String,
    },
    /// The op has no kernel on this device (yet): the tensors are fine, the
    /// backend lacks it. Move the operands to a device that has one.
    #[error("{op}: no kernel for {device} in this build; move the operands with to_device(Device::Cpu)")]
    Unsupported {
        /// The op.
        op: &'static str,
        /// The device whose backend lacks it.
        device: Device,
    },
    /// An axis outside `-rank..rank`.
    #[error("{op}: axis {axis} is out of range for a tensor of rank {rank}")]
    AxisOutOfRange {
        /// The op that failed.
        op: &'static str,
        /// The axis given.
        axis: isize,
        /// The tensor's rank.
        rank: usize,
    },
    /// An index (in an index tensor or an argument) outside `0..size`.
    #[error("{op}: index {index} at position {position} is out of range for size {size}")]
    IndexOutOfRange {
        /// The op that failed.
        op: &'static str,
        /// The bad index.
        index: i64,
        /// Where it was found (flat position in the index tensor, or 0).
        position: usize,
        /// The size of the indexed dimension.
        size: usize,
    },
    /// A class label outside `0..classes` that is not the ignore index.
    #[error("{op}: label {label} in row {row} is out of range for {classes} classes")]
    LabelOutOfRange {
        /// The op that failed.
        op: &'static str,
        /// The bad label.
        label: i64,
        /// Its row (flat, over all leading dims).
        row: usize,
        /// Number of classes.
        classes: usize,
    },
    /// Data whose length does not match the shape it is given.
    #[error("{op}: {got} elements do not fit shape {shape} ({expected} elements)")]
    ElementCount {
        /// The op that failed.
        op: &'static str,
        /// The shape asked for.
        shape: Box<Shape>,
        /// Its element count.
        expected: usize,
        /// Elements supplied.
        got: usize,
    },
    /// Any other bad argument.
    #[error("{op}: {reason}")]
    InvalidArgument {
        /// The op that failed.
        op: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// A non-finite value where only finite values make sense.
    #[error("{op}: non-finite value {value} at position {position}")]
    NonFinite {
        /// The op that failed.
        op: &'static str,
        /// The value found.
        value: f64,
        /// Its flat position.
        position: usize,
    },
    /// Misuse of a graph: a freed node, a value from another graph, a second
    /// backward through released values.
    #[error("graph: {reason}")]
    Graph {
        /// What went wrong.
        reason: String,
    },
    /// The allocator could not satisfy a request, even after freeing its cache.
    #[error("out of memory on {device}: requested {} ({requested} bytes); {stats}", crate::format_bytes(*.requested as f64))]
    OutOfMemory {
        /// The device.
        device: Device,
        /// Bytes requested.
        requested: usize,
        /// The allocator's counters when it gave up.
        stats: Box<MemoryStats>,
    },
    /// An error from the CUDA driver, NVRTC or cuBLAS.
    #[error("cuda: {0}")]
    Cuda(String),
    /// A collective through NCCL failed, or no NCCL library was found:
    /// NCCL's own name for the result and its last message, or what was
    /// tried.
    #[error("{op}: {reason}")]
    Nccl {
        /// The NCCL call (or tapir function) that failed.
        op: &'static str,
        /// What NCCL said, or why no NCCL could be used.
        reason: String,
    },
    /// A checkpoint could not be saved or loaded: `tapir_nn`'s
    /// `CheckpointError` converted by `?` in a function returning this
    /// crate's [`Result`] (a tensor error inside it converts to itself).
    /// `message` is that error's own, naming the file and what was wrong.
    #[error("{message}")]
    Checkpoint {
        /// The checkpoint error's message.
        message: String,
    },
    /// A derivative disagreed with finite differences: `tapir_autograd`'s
    /// `CheckError::Mismatch` converted by `?` (its evaluation failures
    /// convert to the tensor error they carry).
    #[error("gradient check: {message}")]
    GradCheck {
        /// The check error's message.
        message: String,
    },
}

impl Error {
    /// An [`Error::InvalidArgument`] for `op`.
    pub fn invalid_arg(op: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument { op, reason: reason.into() }
    }
}
