//! Indexing: index_select (and embedding), gather, scatter_add, and their
//! transposes. Index tensors are constants of the op (i32 or i64), checked
//! once: a bad index is an error naming it, never an out-of-bounds read.

use crate::layout::check_axis;
use crate::ops::{one, Arity, Diff, InputGrads, Op, Saved};
use crate::{cpu, resolve_axis, DType, Error, Result, Shape, Tensor};

/// The indices of `idx` as usize, each checked against `size`.
pub(crate) fn checked_indices(op: &'static str, idx: &Tensor, size: usize) -> Result<Vec<usize>> {
    let raw: Vec<i64> = match idx.dtype() {
        DType::I64 => idx.to_vec::<i64>()?,
        DType::I32 => idx.to_vec::<i32>()?.into_iter().map(i64::from).collect(),
        dtype => return Err(Error::UnsupportedDType { op, dtype, expected: "int32 or int64 indices" }),
    };
    raw.iter()
        .enumerate()
        .map(|(position, &i)| {
            if i >= 0 && (i as usize) < size {
                Ok(i as usize)
            } else {
                Err(Error::IndexOutOfRange { op, index: i, position, size })
            }
        })
        .collect()
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

    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0].contiguous()?;
        let (outer, size, inner) = split("index_select", x.shape(), self.axis, &self.idx)?;
        let ids = checked_indices("index_select", &self.idx, size)?;
        let mut shape = x.shape().clone();
        shape.0[self.axis] = ids.len();
        shape.check("index_select", x.dtype())?;
        cpu::index::select(&x, &ids, [outer, size, inner], shape)
    }
    fn forward_cuda(&self, xs: &[&Tensor]) -> Result<Tensor> {
        crate::cuda::index::index_select(self.axis, xs[0], &self.idx)
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let size = xs[0].shape().dims()[self.axis];
        Ok(one(T::apply(IndexAdd { axis: self.axis, idx: self.idx.clone(), size }, &[g])?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| T::apply(self.clone(), &[t])).transpose()
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

    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let g = xs[0].contiguous()?;
        let (outer, n, inner) = split("index_add", g.shape(), self.axis, &self.idx)?;
        let ids = checked_indices("index_add", &self.idx, self.size)?;
        if n != ids.len() {
            return Err(Error::ShapeMismatch {
                op: "index_add",
                lhs: Box::new(g.shape().clone()),
                rhs: Box::new(self.idx.shape().clone()),
            });
        }
        let mut shape = g.shape().clone();
        shape.0[self.axis] = self.size;
        shape.check("index_add", g.dtype())?;
        cpu::index::add(&g, &ids, [outer, n, inner], shape)
    }
    fn forward_cuda(&self, xs: &[&Tensor]) -> Result<Tensor> {
        crate::cuda::index::index_add(self.axis, self.size, xs[0], &self.idx)
    }
    fn vjp<T: Diff>(&self, _: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        Ok(one(T::apply(IndexSelect { axis: self.axis, idx: self.idx.clone() }, &[g])?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| T::apply(self.clone(), &[t])).transpose()
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

/// For gather/scatter: checks ranks and shapes and returns, for each
/// element of `idx` in row-major order, its flat offset in a contiguous
/// tensor of `target` shape.
fn scatter_offsets(op: &'static str, target: &Shape, axis: usize, idx: &Tensor) -> Result<Vec<usize>> {
    check_axis(op, axis, target.rank())?;
    let fits = idx.rank() == target.rank()
        && idx.dims().iter().zip(target.dims()).enumerate().all(|(a, (&i, &t))| a == axis || i <= t);
    if !fits {
        return Err(Error::ShapeMismatch { op, lhs: Box::new(target.clone()), rhs: Box::new(idx.shape().clone()) });
    }
    let ids = checked_indices(op, idx, target.dims()[axis])?;
    let ts = target.contiguous_strides();
    let id = idx.dims();
    let mut out = Vec::with_capacity(ids.len());
    let mut pos: Vec<usize> = vec![0; id.len()];
    for &i in &ids {
        let mut off = 0;
        for a in 0..id.len() {
            off += if a == axis { i } else { pos[a] } * ts[a];
        }
        out.push(off);
        for a in (0..id.len()).rev() {
            pos[a] += 1;
            if pos[a] < id[a] {
                break;
            }
            pos[a] = 0;
        }
    }
    Ok(out)
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

    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0].contiguous()?;
        let offs = scatter_offsets("gather", x.shape(), self.axis, &self.idx)?;
        cpu::index::gather(&x, &offs, self.idx.shape().clone())
    }
    fn forward_cuda(&self, xs: &[&Tensor]) -> Result<Tensor> {
        crate::cuda::index::gather(self.axis, xs[0], &self.idx)
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        // On the gradient's device (a host zeros would be a device mismatch on CUDA).
        let zeros = g.full_like_shape(xs[0].shape(), 0.0)?;
        Ok(one(T::apply(ScatterAdd { axis: self.axis, idx: self.idx.clone() }, &[&zeros, g])?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| T::apply(self.clone(), &[t])).transpose()
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

    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let (base, src) = (xs[0], xs[1].contiguous()?);
        if base.dtype() != src.dtype() {
            return Err(Error::DTypeMismatch { op: "scatter_add", lhs: base.dtype(), rhs: src.dtype() });
        }
        if src.shape() != self.idx.shape() {
            return Err(Error::ShapeMismatch {
                op: "scatter_add",
                lhs: Box::new(src.shape().clone()),
                rhs: Box::new(self.idx.shape().clone()),
            });
        }
        let offs = scatter_offsets("scatter_add", base.shape(), self.axis, &self.idx)?;
        cpu::index::scatter_add(base, &src, &offs)
    }
    fn forward_cuda(&self, xs: &[&Tensor]) -> Result<Tensor> {
        crate::cuda::index::scatter_add(self.axis, xs[0], xs[1], &self.idx)
    }
    fn vjp<T: Diff>(&self, _: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let gsrc = T::apply(Gather { axis: self.axis, idx: self.idx.clone() }, &[g])?;
        Ok(smallvec::smallvec![Some(g.clone()), Some(gsrc)])
    }
    fn jvp<T: Diff>(&self, xs: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        if ts.iter().all(|t| t.is_none()) {
            return Ok(None);
        }
        let tb = ts[0].cloned().map_or_else(|| xs[0].zeros_like(), Ok)?;
        let tsrc = ts[1].cloned().map_or_else(|| xs[1].zeros_like(), Ok)?;
        T::apply(self.clone(), &[&tb, &tsrc]).map(Some)
    }
}

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
        crate::ops::shape::ShapeOps::reshape(&rows, shape)
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

/// This family's ops, each once (see [`crate::ops::registry`]).
pub(crate) fn family() -> Vec<Box<dyn super::DynOp>> {
    let idx = || Tensor::scalar_of(0.0, DType::I64);
    vec![
        Box::new(IndexSelect { axis: 0, idx: idx() }),
        Box::new(IndexAdd { axis: 0, idx: idx(), size: 1 }),
        Box::new(Gather { axis: 0, idx: idx() }),
        Box::new(ScatterAdd { axis: 0, idx: idx() }),
    ]
}
