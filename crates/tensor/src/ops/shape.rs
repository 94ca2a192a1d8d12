//! Layout ops: reshape, permute, narrow, broadcast, concat, cast. Views
//! share storage (no copy) whenever the layout allows; the ops that copy
//! check once, for every device, and hand the device's [`ShapeKernels`](crate::backend::ShapeKernels)
//! their operands.

use smallvec::SmallVec;

use crate::backend::{Backend, Src};
use crate::layout::check_axis;
use crate::ops::reduce::ReduceOps;
use crate::ops::{one, Arity, Diff, InputGrads, Op, Saved};
use crate::storage::{CpuBuffer, CpuElement};
use crate::{resolve_axis, with_dtype, DType, Element, Error, Result, Shape, Tensor};

/// A new shape with the same elements.
#[derive(Debug, Clone)]
pub struct Reshape(pub Shape);

impl Op for Reshape {
    fn name(&self) -> &'static str {
        "reshape"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }

    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    /// A view: the layout changes, the storage is shared, on any device.
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        xs[0].reshape_raw(self.0.clone())
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        Ok(one(g.reshape(xs[0].shape())?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| t.reshape(self.0.clone())).transpose()
    }
}

/// Reorders axes (a view).
#[derive(Debug, Clone)]
pub struct Permute(pub SmallVec<[usize; 6]>);

impl Op for Permute {
    fn name(&self) -> &'static str {
        "permute"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }

    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    /// A view: the layout changes, the storage is shared, on any device.
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        xs[0].permute_raw(&self.0)
    }
    fn vjp<T: Diff>(&self, _: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let mut inv = vec![0; self.0.len()];
        for (i, &p) in self.0.iter().enumerate() {
            inv[p] = i;
        }
        Ok(one(g.permute(&inv)?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| t.permute(&self.0)).transpose()
    }
}

/// `len` elements of `axis` from `start` (a view).
#[derive(Debug, Clone)]
pub struct Narrow {
    /// The axis.
    pub axis: usize,
    /// First index kept.
    pub start: usize,
    /// Number kept.
    pub len: usize,
}

impl Op for Narrow {
    fn name(&self) -> &'static str {
        "narrow"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }

    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    /// A view: the layout changes, the storage is shared, on any device.
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        xs[0].narrow_raw(self.axis, self.start, self.len)
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let size = xs[0].shape().dims()[self.axis];
        Ok(one(T::apply(Pad { axis: self.axis, start: self.start, size }, &[g])?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| T::apply(self.clone(), &[t])).transpose()
    }
}

/// Zero-pads `axis` to `size`, placing the input at `start`: the transpose
/// of [`Narrow`].
#[derive(Debug, Clone)]
pub struct Pad {
    /// The axis.
    pub axis: usize,
    /// Where the input starts.
    pub start: usize,
    /// The padded size.
    pub size: usize,
}

impl Op for Pad {
    fn name(&self) -> &'static str {
        "pad"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }

    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0];
        let mut shape = x.shape().clone();
        let fits = self.axis < x.rank() && self.start.checked_add(x.dims()[self.axis]).is_some_and(|e| e <= self.size);
        if !fits {
            return Err(Error::invalid_arg(
                "pad",
                format!("cannot place {} at {} in {}", x.shape(), self.start, self.size),
            ));
        }
        shape.0[self.axis] = self.size;
        shape.check("pad", x.dtype())?;
        let offset = self.start * shape.contiguous_strides()[self.axis];
        Ok(Tensor::from_storage(backend.place("pad", &[(x.src(), offset)], &shape, true)?, shape))
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let len = xs[0].shape().dims()[self.axis];
        Ok(one(T::apply(Narrow { axis: self.axis, start: self.start, len }, &[g])?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| T::apply(self.clone(), &[t])).transpose()
    }
}

/// Broadcasts to a larger shape (a view with zero strides).
#[derive(Debug, Clone)]
pub struct BroadcastTo(pub Shape);

impl Op for BroadcastTo {
    fn name(&self) -> &'static str {
        "broadcast_to"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }

    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    /// A view: the layout changes, the storage is shared, on any device.
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        xs[0].broadcast_raw(&self.0)
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        Ok(one(g.sum_to(xs[0].shape())?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| t.broadcast_to(self.0.clone())).transpose()
    }
}

/// A contiguous copy (identity for derivatives).
#[derive(Debug, Clone)]
pub struct Contiguous;

impl Op for Contiguous {
    fn name(&self) -> &'static str {
        "contiguous"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }

    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    /// The same handle when the input is contiguous already.
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0];
        if x.is_contiguous() {
            return Ok(x.clone());
        }
        Ok(Tensor::from_storage(backend.copy("contiguous", x.src())?, x.shape().clone()))
    }
    fn vjp<T: Diff>(&self, _: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        Ok(one(g.clone()))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        Ok(ts[0].cloned())
    }
}

/// Joins tensors along an existing axis.
#[derive(Debug, Clone)]
pub struct Concat {
    /// The axis.
    pub axis: usize,
}

impl Concat {
    /// The output's shape, with every check in one order for every device:
    /// the axis, each part's rank and other dims, one dtype, no overflow.
    fn out_shape(&self, xs: &[&Tensor]) -> Result<Shape> {
        let first = xs[0];
        check_axis("concat", self.axis, first.rank())?;
        let mut shape = first.shape().clone();
        let mut total = 0usize;
        for x in xs {
            let compatible = x.rank() == first.rank()
                && x.dims().iter().zip(first.dims()).enumerate().all(|(i, (a, b))| i == self.axis || a == b);
            if !compatible {
                return Err(Error::ShapeMismatch {
                    op: "concat",
                    lhs: Box::new(first.shape().clone()),
                    rhs: Box::new(x.shape().clone()),
                });
            }
            if x.dtype() != first.dtype() {
                return Err(Error::DTypeMismatch { op: "concat", lhs: first.dtype(), rhs: x.dtype() });
            }
            total = match total.checked_add(x.dims()[self.axis]) {
                Some(t) => t,
                None => {
                    return Err(Error::InvalidShape {
                        op: "concat",
                        shape: Box::new(x.shape().clone()),
                        reason: format!("the sizes along axis {} overflow usize", self.axis),
                    })
                }
            };
        }
        shape.0[self.axis] = total;
        shape.check("concat", first.dtype())?;
        Ok(shape)
    }
}

impl Op for Concat {
    fn name(&self) -> &'static str {
        "concat"
    }
    fn arity(&self) -> Arity {
        Arity::at_least(1)
    }

    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let shape = self.out_shape(xs)?;
        let stride = shape.contiguous_strides()[self.axis];
        let mut at = 0;
        let parts: Vec<(Src<'_>, usize)> = xs
            .iter()
            .map(|&x| {
                let part = (x.src(), at * stride);
                at += x.dims()[self.axis];
                part
            })
            .collect();
        Ok(Tensor::from_storage(backend.place("concat", &parts, &shape, false)?, shape))
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let mut at = 0;
        xs.iter()
            .map(|x| {
                let len = x.shape().dims()[self.axis];
                let r = g.narrow(self.axis as isize, at, len).map(Some);
                at += len;
                r
            })
            .collect()
    }
    fn jvp<T: Diff>(&self, xs: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        if ts.iter().all(|t| t.is_none()) {
            return Ok(None);
        }
        let full: Vec<T> =
            xs.iter().zip(ts).map(|(x, t)| t.cloned().map_or_else(|| x.zeros_like(), Ok)).collect::<Result<_>>()?;
        let refs: Vec<&T> = full.iter().collect();
        T::apply(self.clone(), &refs).map(Some)
    }
}

/// Converts to another dtype. Float-to-float casts pass gradients through
/// (cast back); casts to integers have no derivative.
#[derive(Debug, Clone)]
pub struct Cast(pub DType);

impl Op for Cast {
    fn name(&self) -> &'static str {
        "cast"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }

    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    /// The same handle when the input has the dtype already.
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0];
        if x.dtype() == self.0 {
            return Ok(x.clone());
        }
        Ok(Tensor::from_storage(backend.cast(x.src(), self.0)?, x.shape().clone()))
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let from = xs[0].dtype();
        Ok(smallvec::smallvec![if from.is_float() && self.0.is_float() { Some(g.cast(from)?) } else { None }])
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        if !self.0.is_float() {
            return Ok(None);
        }
        ts[0].map(|t| t.cast(self.0)).transpose()
    }
    fn is_differentiable(&self) -> bool {
        self.0.is_float()
    }
}

/// This family's ops, each once (see [`crate::ops::registry`]).
pub(crate) fn family() -> Vec<Box<dyn super::DynOp>> {
    vec![
        Box::new(Reshape(Shape::from(()))),
        Box::new(Permute(SmallVec::new())),
        Box::new(Narrow { axis: 0, start: 0, len: 0 }),
        Box::new(Pad { axis: 0, start: 0, size: 0 }),
        Box::new(BroadcastTo(Shape::from(()))),
        Box::new(Contiguous),
        Box::new(Concat { axis: 0 }),
        Box::new(Cast(DType::F32)),
    ]
}

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

/// Builds a host buffer of `dtype` from f64 values (used by tests and tools).
pub fn buffer_from_f64(dtype: DType, v: &[f64]) -> CpuBuffer {
    with_dtype!(dtype, T => T::wrap(v.iter().map(|&x| T::from_f64(x)).collect()))
}
