//! Indexing: index_select (and embedding), gather, scatter_add, and their
//! transposes. Index tensors are constants of the op (i32 or i64), checked
//! once: a bad index is an error naming it, never an out-of-bounds read.
//! Each op's derivative is another of them (`ops/rules/index.rs`); their
//! methods are in `ops/methods/index.rs`.

pub use crate::backend::index::{AxisPlan, SplitPlan};
use crate::backend::Backend;
use crate::layout::check_axis;
use crate::ops::op::{Arity, Op};
use crate::{DType, Error, Result, Shape, Tensor};

/// The indices' dtype checked: i32 or i64.
fn index_dtype(op: &'static str, idx: &Tensor) -> Result<()> {
    match idx.dtype() {
        DType::I32 | DType::I64 => Ok(()),
        dtype => Err(Error::UnsupportedDType { op, dtype, expected: "int32 or int64 indices" }),
    }
}

/// Splits `shape` around `axis` into (outer, size, inner) element counts,
/// checking the axis and that `idx` is 1-D.
pub(crate) fn split(op: &'static str, shape: &Shape, axis: usize, idx: &Tensor) -> Result<(usize, usize, usize)> {
    let d = shape.dims();
    check_axis(op, axis, d.len())?;
    if idx.rank() != 1 {
        return Err(Error::InvalidShape {
            op,
            shape: Box::new(idx.shape().clone()),
            reason: "indices must be 1-D".into(),
        });
    }
    Ok((d[..axis].iter().product(), d[axis], d[axis + 1..].iter().product()))
}

/// The plan's output size checked last, as it would be once the indices
/// were read: a bad index (checked by `backend` where the indices live)
/// is the error before an output too large to allocate.
fn check_size_after_indices(backend: &dyn Backend, x: &Tensor, idx: &Tensor, plan: &SplitPlan) -> Result<()> {
    plan.shape
        .check(plan.op, x.dtype())
        .map(drop)
        .or_else(|e| backend.check_indices(plan.op, idx.src(), plan.size).and(Err(e)))
}

/// For gather and scatter_add: `idx` has `target`'s rank and is no larger
/// on any axis but `axis`, and holds i32 or i64.
fn check_fits(op: &'static str, target: &Shape, axis: usize, idx: &Tensor) -> Result<()> {
    check_axis(op, axis, target.rank())?;
    let fits = idx.rank() == target.rank()
        && idx.dims().iter().zip(target.dims()).enumerate().all(|(a, (&i, &t))| a == axis || i <= t);
    if !fits {
        return Err(Error::ShapeMismatch { op, lhs: Box::new(target.clone()), rhs: Box::new(idx.shape().clone()) });
    }
    index_dtype(op, idx)
}

/// Picks entries `idx` (1-D) along `axis`: out has `idx.len()` there.
#[derive(Debug, Clone)]
pub struct IndexSelect {
    /// The axis.
    pub axis: usize,
    /// 1-D indices.
    pub idx: Tensor,
}

impl Op for IndexSelect {
    fn name(&self) -> &'static str {
        "index_select"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }
    fn operands(&self) -> smallvec::SmallVec<[&Tensor; 2]> {
        smallvec::smallvec![&self.idx]
    }
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let op = "index_select";
        let x = xs[0].contiguous()?;
        let (outer, size, inner) = split(op, x.shape(), self.axis, &self.idx)?;
        index_dtype(op, &self.idx)?;
        let idx = self.idx.contiguous()?;
        let n = idx.numel();
        let mut shape = x.shape().clone();
        shape.0[self.axis] = n;
        let plan = SplitPlan { op, axis: self.axis, outer, size, inner, n, shape };
        check_size_after_indices(backend, &x, &idx, &plan)?;
        let out = backend.index_select(&plan, x.src(), idx.src())?;
        Ok(Tensor::from_storage(out, plan.shape))
    }
}

/// The transpose of [`IndexSelect`]: zeros with `size` entries along `axis`,
/// to which slice `j` of the input is added at entry `idx[j]`.
#[derive(Debug, Clone)]
pub struct IndexAdd {
    /// The axis.
    pub axis: usize,
    /// 1-D indices.
    pub idx: Tensor,
    /// Size of the output along `axis`.
    pub size: usize,
}

impl Op for IndexAdd {
    fn name(&self) -> &'static str {
        "index_add"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }
    fn operands(&self) -> smallvec::SmallVec<[&Tensor; 2]> {
        smallvec::smallvec![&self.idx]
    }
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let op = "index_add";
        let g = xs[0].contiguous()?;
        let (outer, n, inner) = split(op, g.shape(), self.axis, &self.idx)?;
        index_dtype(op, &self.idx)?;
        let idx = self.idx.contiguous()?;
        if n != idx.numel() {
            backend.check_indices(op, idx.src(), self.size)?;
            return Err(Error::ShapeMismatch {
                op,
                lhs: Box::new(g.shape().clone()),
                rhs: Box::new(idx.shape().clone()),
            });
        }
        let mut shape = g.shape().clone();
        shape.0[self.axis] = self.size;
        let plan = SplitPlan { op, axis: self.axis, outer, size: self.size, inner, n, shape };
        check_size_after_indices(backend, &g, &idx, &plan)?;
        let out = backend.index_add(&plan, g.src(), idx.src())?;
        Ok(Tensor::from_storage(out, plan.shape))
    }
}

/// torch.gather: `out[i][j][k] = x[i][idx[i][j][k]][k]` for axis 1; `idx`
/// has the input's rank and its shape is the output's.
#[derive(Debug, Clone)]
pub struct Gather {
    /// The axis.
    pub axis: usize,
    /// Indices, same rank as the input.
    pub idx: Tensor,
}

impl Op for Gather {
    fn name(&self) -> &'static str {
        "gather"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }
    fn operands(&self) -> smallvec::SmallVec<[&Tensor; 2]> {
        smallvec::smallvec![&self.idx]
    }
    /// `x` is read through its strides, so a view needs no copy.
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let plan = AxisPlan { op: "gather", axis: self.axis };
        check_fits(plan.op, xs[0].shape(), self.axis, &self.idx)?;
        let idx = self.idx.contiguous()?;
        let out = backend.gather(&plan, xs[0].src(), idx.src())?;
        Ok(Tensor::from_storage(out, idx.shape().clone()))
    }
}

/// torch.scatter_add: a copy of `base` with `src[i][j][k]` added at
/// `[i][idx[i][j][k]][k]` (axis 1). Inputs: base, src.
#[derive(Debug, Clone)]
pub struct ScatterAdd {
    /// The axis.
    pub axis: usize,
    /// Indices, shaped like `src`.
    pub idx: Tensor,
}

impl Op for ScatterAdd {
    fn name(&self) -> &'static str {
        "scatter_add"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(2)
    }
    fn operands(&self) -> smallvec::SmallVec<[&Tensor; 2]> {
        smallvec::smallvec![&self.idx]
    }
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let plan = AxisPlan { op: "scatter_add", axis: self.axis };
        let (base, src) = (xs[0], xs[1]);
        if base.dtype() != src.dtype() {
            return Err(Error::DTypeMismatch { op: plan.op, lhs: base.dtype(), rhs: src.dtype() });
        }
        if src.shape() != self.idx.shape() {
            return Err(Error::ShapeMismatch {
                op: plan.op,
                lhs: Box::new(src.shape().clone()),
                rhs: Box::new(self.idx.shape().clone()),
            });
        }
        check_fits(plan.op, base.shape(), self.axis, &self.idx)?;
        let (src, idx) = (src.contiguous()?, self.idx.contiguous()?);
        let out = backend.scatter_add(&plan, base.src(), src.src(), idx.src())?;
        Ok(Tensor::from_storage(out, base.shape().clone()))
    }
}

/// This family's ops, each once (see [`crate::ops::registry`]).
pub(crate) fn family() -> Vec<Box<dyn crate::ops::op::DynOp>> {
    let idx = || Tensor::scalar_of(0.0, DType::I64);
    vec![
        Box::new(IndexSelect { axis: 0, idx: idx() }),
        Box::new(IndexAdd { axis: 0, idx: idx(), size: 1 }),
        Box::new(Gather { axis: 0, idx: idx() }),
        Box::new(ScatterAdd { axis: 0, idx: idx() }),
    ]
}
