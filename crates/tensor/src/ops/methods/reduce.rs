//! The reductions (`ops/reduce.rs`) as methods of every [`Diff`] value.

use crate::ops::methods::unary::UnaryOps;
use crate::ops::op::Diff;
use crate::ops::reduce::{normalize_axes, ArgReduce, Reduce, ReduceKind, SumTo};
use crate::{resolve_axis, Error, Result, Shape};

/// Reductions, on tensors and graph handles alike. An empty `axes` slice
/// means every axis.
pub trait ReduceOps: Diff {
    /// Sum over `axes` (an empty slice: every axis). PyTorch's
    /// argument-free `x.sum()` is [`sum_all`](ReduceOps::sum_all).
    fn sum(&self, axes: &[isize], keepdim: bool) -> Result<Self> {
        let axes = normalize_axes("sum", axes, self.rank())?;
        Self::apply(Reduce { kind: ReduceKind::Sum, axes, keepdim }, &[self])
    }
    /// Sum of every element, as a 0-d value: PyTorch's `x.sum()`.
    #[doc(alias = "sum")]
    fn sum_all(&self) -> Result<Self> {
        self.sum(&[], false)
    }
    /// Mean over `axes` (an empty slice: every axis). PyTorch's
    /// argument-free `x.mean()` is [`mean_all`](ReduceOps::mean_all).
    fn mean(&self, axes: &[isize], keepdim: bool) -> Result<Self> {
        if self.dtype().is_int() {
            // torch refuses too: the mean of integers has no integer dtype.
            return Err(Error::UnsupportedDType {
                op: "mean",
                dtype: self.dtype(),
                expected: "a float dtype; cast first, e.g. x.cast(DType::F32)?.mean(..)",
            });
        }
        let norm = normalize_axes("mean", axes, self.rank())?;
        let n: usize = norm.iter().map(|&a| self.shape().dims()[a]).product();
        self.sum(axes, keepdim)?.mul_scalar(1.0 / n as f64)
    }
    /// Mean of every element, as a 0-d value: PyTorch's `x.mean()`.
    #[doc(alias = "mean")]
    fn mean_all(&self) -> Result<Self> {
        self.mean(&[], false)
    }
    /// Maximum over `axes`.
    fn max(&self, axes: &[isize], keepdim: bool) -> Result<Self> {
        let axes = normalize_axes("max", axes, self.rank())?;
        Self::apply(Reduce { kind: ReduceKind::Max, axes, keepdim }, &[self])
    }
    /// Minimum over `axes`.
    fn min(&self, axes: &[isize], keepdim: bool) -> Result<Self> {
        let axes = normalize_axes("min", axes, self.rank())?;
        Self::apply(Reduce { kind: ReduceKind::Min, axes, keepdim }, &[self])
    }
    /// log(sum(exp(x))) over `axes`, computed stably.
    fn logsumexp(&self, axes: &[isize], keepdim: bool) -> Result<Self> {
        let axes = normalize_axes("logsumexp", axes, self.rank())?;
        Self::apply(Reduce { kind: ReduceKind::LogSumExp, axes, keepdim }, &[self])
    }
    /// Index of the maximum along `axis` (i64, first occurrence).
    fn argmax(&self, axis: isize, keepdim: bool) -> Result<Self> {
        let axis = resolve_axis("argmax", axis, self.rank())?;
        Self::apply(ArgReduce { axis, keepdim, min: false }, &[self])
    }
    /// Index of the minimum along `axis` (i64, first occurrence).
    fn argmin(&self, axis: isize, keepdim: bool) -> Result<Self> {
        let axis = resolve_axis("argmin", axis, self.rank())?;
        Self::apply(ArgReduce { axis, keepdim, min: true }, &[self])
    }
    /// Sums a broadcast value back down to `shape`.
    fn sum_to(&self, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        if shape == self.shape() {
            return Ok(self.clone());
        }
        Self::apply(SumTo { shape }, &[self])
    }
}

impl<T: Diff> ReduceOps for T {}
