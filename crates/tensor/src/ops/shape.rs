//! Layout ops: reshape, permute, narrow, broadcast, concat, cast. Views
//! share storage (no copy) whenever the layout allows; the ops that copy
//! check once, for every device, and hand the device's
//! [`ShapeKernels`](crate::backend::ShapeKernels) their operands. Their
//! derivatives are in `ops/rules/shape.rs`, their methods (`x.reshape(..)`)
//! in `ops/methods/shape.rs`.

use smallvec::SmallVec;

use crate::backend::{Backend, Src};
use crate::layout::check_axis;
use crate::ops::op::{Arity, Op};
use crate::storage::{CpuBuffer, CpuElement};
use crate::{with_dtype, DType, Element, Error, Result, Shape, Tensor};

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
    /// A view: the layout changes, the storage is shared, on any device.
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        xs[0].reshape_raw(self.0.clone())
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
    /// A view: the layout changes, the storage is shared, on any device.
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        xs[0].permute_raw(&self.0)
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
    /// A view: the layout changes, the storage is shared, on any device.
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        xs[0].narrow_raw(self.axis, self.start, self.len)
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
    /// A view: the layout changes, the storage is shared, on any device.
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        xs[0].broadcast_raw(&self.0)
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
    /// The same handle when the input is contiguous already.
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0];
        if x.is_contiguous() {
            return Ok(x.clone());
        }
        Ok(Tensor::from_storage(backend.copy("contiguous", x.src())?, x.shape().clone()))
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
    /// The same handle when the input has the dtype already.
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0];
        if x.dtype() == self.0 {
            return Ok(x.clone());
        }
        Ok(Tensor::from_storage(backend.cast(x.src(), self.0)?, x.shape().clone()))
    }
}

/// This family's ops, each once (see [`crate::ops::registry`]).
pub(crate) fn family() -> Vec<Box<dyn crate::ops::op::DynOp>> {
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

/// Builds a host buffer of `dtype` from f64 values (used by tests and tools).
pub fn buffer_from_f64(dtype: DType, v: &[f64]) -> CpuBuffer {
    with_dtype!(dtype, T => T::wrap(v.iter().map(|&x| T::from_f64(x)).collect()))
}
