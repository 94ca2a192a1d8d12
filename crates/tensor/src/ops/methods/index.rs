//! The indexing ops (`ops/index.rs`) as methods of every [`Diff`] value.

use crate::ops::index::{Gather, IndexSelect, ScatterAdd};
use crate::ops::methods::shape::ShapeOps;
use crate::ops::op::Diff;
use crate::{resolve_axis, Error, Result, Shape, Tensor};

/// Indexing ops, on tensors and graph handles alike.
pub trait IndexOps: Diff {
    /// Entries `idx` (1-D, i32/i64) along `axis`.
    fn index_select(&self, axis: isize, idx: &Tensor) -> Result<Self> {
        let axis = resolve_axis("index_select", axis, self.rank())?;
        if idx.rank() != 1 {
            return Err(Error::InvalidShape {
                op: "index_select",
                shape: Box::new(idx.shape().clone()),
                reason: "indices must be 1-D".into(),
            });
        }
        Self::apply(IndexSelect { axis, idx: idx.clone() }, &[self])
    }
    /// Rows of an embedding table `[vocab, dim]` for integer `ids` of any
    /// shape: the result is `[..ids.shape, dim]`.
    fn embedding(&self, ids: &Tensor) -> Result<Self> {
        if self.rank() != 2 {
            return Err(Error::InvalidShape {
                op: "embedding",
                shape: Box::new(self.shape()),
                reason: "table must be [vocab, dim]".into(),
            });
        }
        let flat = ids.reshape_raw(Shape::from([ids.numel()]))?;
        // The lookup is an index_select, but a bad id is reported as the
        // embedding's, at its flat position in `ids`.
        let rows = self.index_select(0, &flat).map_err(|e| match e {
            Error::IndexOutOfRange { index, position, size, .. } => {
                Error::IndexOutOfRange { op: "embedding", index, position, size }
            }
            Error::UnsupportedDType { dtype, expected, .. } => {
                Error::UnsupportedDType { op: "embedding", dtype, expected }
            }
            e => e,
        })?;
        let mut shape = ids.shape().clone();
        shape.0.push(self.shape().dims()[1]);
        ShapeOps::reshape(&rows, shape)
    }
    /// torch.gather along `axis`.
    fn gather(&self, axis: isize, idx: &Tensor) -> Result<Self> {
        let axis = resolve_axis("gather", axis, self.rank())?;
        Self::apply(Gather { axis, idx: idx.clone() }, &[self])
    }
    /// torch.scatter_add along `axis`: `self` with `src` added at `idx`.
    fn scatter_add(&self, axis: isize, idx: &Tensor, src: &Self) -> Result<Self> {
        let axis = resolve_axis("scatter_add", axis, self.rank())?;
        Self::apply(ScatterAdd { axis, idx: idx.clone() }, &[self, src])
    }
}

impl<T: Diff> IndexOps for T {}
