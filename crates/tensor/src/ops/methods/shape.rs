//! The layout ops (`ops/shape.rs`) as methods of every [`Diff`] value.

use crate::ops::op::Diff;
use crate::ops::shape::{BroadcastTo, Cast, Concat, Contiguous, Narrow, Permute, Reshape};
use crate::{resolve_axis, DType, Error, Result, Shape};

/// Layout ops, on tensors and graph handles alike.
pub trait ShapeOps: Diff {
    /// Same elements, new shape (a view when the layout allows, else a copy).
    fn reshape(&self, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        if shape == self.shape() {
            return Ok(self.clone());
        }
        if shape.numel() != self.numel() {
            return Err(Error::ShapeMismatch { op: "reshape", lhs: Box::new(self.shape()), rhs: Box::new(shape) });
        }
        Self::apply(Reshape(shape), &[self])
    }
    /// Collapses to one dimension.
    fn flatten(&self) -> Result<Self> {
        self.reshape([self.numel()])
    }
    /// Reorders axes.
    fn permute(&self, perm: &[usize]) -> Result<Self> {
        Self::apply(Permute(perm.iter().copied().collect()), &[self])
    }
    /// Swaps two axes.
    fn transpose(&self, a: isize, b: isize) -> Result<Self> {
        let r = self.rank();
        let (a, b) = (resolve_axis("transpose", a, r)?, resolve_axis("transpose", b, r)?);
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }
    /// Swaps the last two axes (matrix transpose).
    fn t(&self) -> Result<Self> {
        if self.rank() < 2 {
            return Err(Error::InvalidShape {
                op: "t",
                shape: Box::new(self.shape()),
                reason: "needs rank >= 2".into(),
            });
        }
        self.transpose(-2, -1)
    }
    /// `len` elements of `axis` starting at `start` (a view).
    fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Self> {
        let axis = resolve_axis("narrow", axis, self.rank())?;
        let size = self.shape().dims()[axis];
        if start.checked_add(len).is_none_or(|e| e > size) {
            return Err(crate::tensor::narrow_out_of_range(axis, start, len, size));
        }
        Self::apply(Narrow { axis, start, len }, &[self])
    }
    /// Broadcasts to `shape` (a view; numpy rules).
    fn broadcast_to(&self, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        if shape == self.shape() {
            return Ok(self.clone());
        }
        Self::apply(BroadcastTo(shape), &[self])
    }
    /// Alias of `broadcast_to`, as torch's `expand`.
    fn expand(&self, shape: impl Into<Shape>) -> Result<Self> {
        self.broadcast_to(shape)
    }
    /// Inserts a size-1 axis at `axis` (`-1` appends).
    fn unsqueeze(&self, axis: isize) -> Result<Self> {
        let axis = resolve_axis("unsqueeze", axis, self.rank() + 1)?;
        let mut d: Vec<usize> = self.shape().dims().to_vec();
        d.insert(axis, 1);
        self.reshape(d)
    }
    /// Removes axis `axis`, which must have size 1.
    fn squeeze(&self, axis: isize) -> Result<Self> {
        let axis = resolve_axis("squeeze", axis, self.rank())?;
        let mut d: Vec<usize> = self.shape().dims().to_vec();
        if d[axis] != 1 {
            return Err(Error::InvalidShape {
                op: "squeeze",
                shape: Box::new(self.shape()),
                reason: format!("axis {axis} is not of size 1"),
            });
        }
        d.remove(axis);
        self.reshape(d)
    }
    /// A contiguous copy if not already contiguous.
    fn contiguous_(&self) -> Result<Self> {
        Self::apply(Contiguous, &[self])
    }
    /// Converts to `dtype`.
    fn cast(&self, dtype: DType) -> Result<Self> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        Self::apply(Cast(dtype), &[self])
    }
    /// Joins `xs` along `axis`.
    fn concat(xs: &[&Self], axis: isize) -> Result<Self> {
        let first = xs.first().ok_or_else(|| Error::invalid_arg("concat", "no tensors given"))?;
        let axis = resolve_axis("concat", axis, first.rank())?;
        Self::apply(Concat { axis }, xs)
    }
    /// Stacks equal-shaped `xs` along a new `axis`.
    fn stack(xs: &[&Self], axis: isize) -> Result<Self> {
        let first = xs.first().ok_or_else(|| Error::invalid_arg("stack", "no tensors given"))?;
        let axis = resolve_axis("stack", axis, first.rank() + 1)?;
        let shape = first.shape();
        let parts = xs
            .iter()
            .map(|x| {
                if x.shape() != shape {
                    return Err(Error::ShapeMismatch {
                        op: "stack",
                        lhs: Box::new(shape.clone()),
                        rhs: Box::new(x.shape()),
                    });
                }
                x.unsqueeze(axis as isize)
            })
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Self> = parts.iter().collect();
        Self::concat(&refs, axis as isize)
    }
}

impl<T: Diff> ShapeOps for T {}
