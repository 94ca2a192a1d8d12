//! Reductions over any set of axes: sum, mean, max, min, argmax, argmin,
//! logsumexp, and `sum_to`, the reduction broadcasting's backward needs.
//!
//! This file holds what the reductions compute: their checks and plans
//! (once, for every device). Each device runs a plan through its
//! [`ReduceKernels`](crate::backend::ReduceKernels). Their derivatives are in
//! `ops/rules/reduce.rs`, their methods (`x.sum(..)`) in
//! `ops/methods/reduce.rs`.

use smallvec::SmallVec;

pub use crate::backend::reduce::{ArgReducePlan, Axes, ReduceKind, ReducePlan, Rows};
use crate::backend::Backend;
use crate::ops::op::{Arity, Op};
use crate::{resolve_axis, DType, Error, Result, Shape, Tensor};

/// Resolves user axes (negative from the end; empty means all) for `rank`.
pub fn normalize_axes(op: &'static str, axes: &[isize], rank: usize) -> Result<Axes> {
    let mut out: Axes = if axes.is_empty() {
        (0..rank).collect()
    } else {
        axes.iter().map(|&a| resolve_axis(op, a, rank)).collect::<Result<_>>()?
    };
    out.sort_unstable();
    let before = out.len();
    out.dedup();
    if out.len() != before {
        return Err(Error::invalid_arg(op, format!("repeated axis in {axes:?}")));
    }
    Ok(out)
}

/// Checks axes that an op struct built by hand carries: each in range,
/// sorted and unique, as [`normalize_axes`] makes them.
pub(crate) fn check_axes(op: &'static str, axes: &[usize], rank: usize) -> Result<()> {
    for (i, &a) in axes.iter().enumerate() {
        crate::layout::check_axis(op, a, rank)?;
        if i > 0 && axes[i - 1] >= a {
            return Err(Error::invalid_arg(op, format!("axes {axes:?} are not sorted and unique")));
        }
    }
    Ok(())
}

/// The shape after reducing `axes`.
pub fn reduced_shape(shape: &Shape, axes: &[usize], keepdim: bool) -> Shape {
    let mut out = SmallVec::new();
    for (i, &d) in shape.dims().iter().enumerate() {
        if axes.contains(&i) {
            if keepdim {
                out.push(1);
            }
        } else {
            out.push(d);
        }
    }
    Shape(out)
}

/// A reduction over `axes`.
#[derive(Debug, Clone, PartialEq)]
pub struct Reduce {
    /// Which reduction.
    pub kind: ReduceKind,
    /// Sorted, unique axes.
    pub axes: Axes,
    /// Keep reduced axes as size 1.
    pub keepdim: bool,
}

impl Reduce {
    /// The checks of a reduction of `x`, in one order for every device
    /// (the axes, an empty axis for max and min, the output's size, a
    /// float dtype unless an integer sum), and what it makes.
    pub fn plan(&self, x: &Tensor) -> Result<ReducePlan> {
        let name = self.name();
        check_axes(name, &self.axes, x.rank())?;
        if matches!(self.kind, ReduceKind::Max | ReduceKind::Min) {
            if let Some(&a) = self.axes.iter().find(|&&a| x.dims()[a] == 0) {
                return Err(Error::InvalidShape {
                    op: name,
                    shape: Box::new(x.shape().clone()),
                    reason: format!("cannot take {name} over empty axis {a}"),
                });
            }
        }
        let shape = reduced_shape(x.shape(), &self.axes, self.keepdim);
        // As torch: an integer sum is an int64 sum, so counting int32
        // labels cannot overflow at 2^31, and it wraps past 2^63.
        let int_sum = self.kind == ReduceKind::Sum && x.dtype().is_int();
        let dtype = if int_sum { DType::I64 } else { x.dtype() };
        // Reducing an empty axis can leave more elements than the input
        // had: zeros([0, usize::MAX]).sum(0) would be usize::MAX zeros.
        shape.check(name, dtype)?;
        if !int_sum && !x.dtype().is_float() {
            return Err(Error::UnsupportedDType { op: name, dtype: x.dtype(), expected: "a float dtype" });
        }
        let k = self.axes.len();
        let leading = k > 0 && k < x.rank() && self.axes.iter().enumerate().all(|(i, &a)| i == a);
        let rows = Rows::of(x.shape(), &self.axes);
        Ok(ReducePlan { kind: self.kind.clone(), axes: self.axes.clone(), shape, dtype, int_sum, rows, leading })
    }
}

impl Op for Reduce {
    fn name(&self) -> &'static str {
        self.kind.name()
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let plan = self.plan(xs[0])?;
        let out = backend.reduce(&plan, xs[0].src())?;
        Ok(Tensor::from_storage(out, plan.shape))
    }
}

/// Index of the largest (or smallest) element along one axis, as i64.
#[derive(Debug, Clone, PartialEq)]
pub struct ArgReduce {
    /// The axis.
    pub axis: usize,
    /// Keep the axis as size 1.
    pub keepdim: bool,
    /// argmin instead of argmax.
    pub min: bool,
}

impl ArgReduce {
    /// The checks of an arg-reduction of `x`, in one order for every
    /// device (the axis, not empty, the output's size), and what it makes.
    pub fn plan(&self, x: &Tensor) -> Result<ArgReducePlan> {
        let name = self.name();
        if x.dims()[crate::layout::check_axis(name, self.axis, x.rank())?] == 0 {
            return Err(Error::InvalidShape {
                op: name,
                shape: Box::new(x.shape().clone()),
                reason: "empty axis".into(),
            });
        }
        let shape = reduced_shape(x.shape(), &[self.axis], self.keepdim);
        shape.check(name, DType::I64)?;
        Ok(ArgReducePlan { min: self.min, shape, rows: Rows::of(x.shape(), &[self.axis]) })
    }
}

impl Op for ArgReduce {
    fn name(&self) -> &'static str {
        if self.min {
            "argmin"
        } else {
            "argmax"
        }
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let plan = self.plan(xs[0])?;
        let out = backend.arg_reduce(&plan, xs[0].src())?;
        Ok(Tensor::from_storage(out, plan.shape))
    }
}

/// Sums a broadcast value back to `shape` (the reverse of `broadcast_to`).
#[derive(Debug, Clone, PartialEq)]
pub struct SumTo {
    /// The target shape; the input must broadcast to... from it.
    pub shape: Shape,
}

impl Op for SumTo {
    fn name(&self) -> &'static str {
        "sum_to"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }
    /// The shape rule, then the sum on the input's device (none when no
    /// axis is summed) and a reshape, a view.
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0];
        let (r, tr) = (x.rank(), self.shape.rank());
        let fits = tr <= r && self.shape.dims().iter().enumerate().all(|(i, &d)| d == 1 || d == x.dims()[r - tr + i]);
        if !fits {
            return Err(Error::ShapeMismatch {
                op: "sum_to",
                lhs: Box::new(x.shape().clone()),
                rhs: Box::new(self.shape.clone()),
            });
        }
        let axes: Axes =
            (0..r).filter(|&i| i < r - tr || (self.shape.dims()[i - (r - tr)] == 1 && x.dims()[i] != 1)).collect();
        if axes.is_empty() {
            return x.reshape_raw(self.shape.clone());
        }
        let s = Reduce { kind: ReduceKind::Sum, axes, keepdim: true }.run(backend, &[x])?;
        s.reshape_raw(self.shape.clone())
    }
}

/// This family's ops, each once (see [`crate::ops::registry`]).
pub(crate) fn family() -> Vec<Box<dyn crate::ops::op::DynOp>> {
    let mut ops: Vec<Box<dyn crate::ops::op::DynOp>> = ReduceKind::ALL
        .iter()
        .map(|kind| {
            Box::new(Reduce { kind: kind.clone(), axes: Axes::new(), keepdim: false }) as Box<dyn crate::ops::op::DynOp>
        })
        .collect();
    for min in [false, true] {
        ops.push(Box::new(ArgReduce { axis: 0, keepdim: false, min }));
    }
    ops.push(Box::new(SumTo { shape: Shape::from(()) }));
    ops
}
