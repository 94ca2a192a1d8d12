//! The derivatives of the reductions (`ops/reduce.rs`): a reduction's
//! gradient is its output's broadcast back over the reduced axes (weighted
//! by the ties of max and min, by the softmax of logsumexp).

use crate::ops::methods::binary::BinaryOps;
use crate::ops::methods::reduce::ReduceOps;
use crate::ops::methods::shape::ShapeOps;
use crate::ops::methods::unary::UnaryOps;
use crate::ops::op::{one, Derivative, Diff, InputGrads, Saved};
use crate::ops::reduce::{reduced_shape, ArgReduce, Reduce, ReduceKind, SumTo};
use crate::{DType, Result, Shape, Tensor};

impl Derivative for Reduce {
    fn saves(&self) -> Saved {
        match self.kind {
            ReduceKind::Sum => Saved::NOTHING,
            ReduceKind::Max | ReduceKind::Min | ReduceKind::LogSumExp => Saved::ALL,
        }
    }
    fn vjp<T: Diff>(&self, xs: &[&T], y: &T, g: &T) -> Result<InputGrads<T>> {
        let x = xs[0];
        if x.dtype().is_int() {
            return Ok(smallvec::smallvec![None]);
        }
        let xs_shape = x.shape();
        let gk = self.keep(g, &xs_shape)?;
        Ok(one(match self.kind {
            ReduceKind::Sum => gk.broadcast_to(xs_shape)?,
            ReduceKind::Max | ReduceKind::Min => self.tie_weights(x, y)?.mul(&gk)?,
            ReduceKind::LogSumExp => x.sub(&self.keep(y, &xs_shape)?)?.exp()?.mul(&gk)?,
        }))
    }
    fn jvp<T: Diff>(&self, xs: &[&T], y: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        let Some(t) = ts[0] else { return Ok(None) };
        let x = xs[0];
        if x.dtype().is_int() {
            return Ok(None);
        }
        let axes: Vec<isize> = self.axes.iter().map(|&a| a as isize).collect();
        let weighted = match self.kind {
            ReduceKind::Sum => t.clone(),
            ReduceKind::Max | ReduceKind::Min => t.mul(&self.tie_weights(x, y)?)?,
            ReduceKind::LogSumExp => t.mul(&x.sub(&self.keep(y, &x.shape())?)?.exp()?)?,
        };
        Ok(Some(weighted.sum(&axes, self.keepdim)?))
    }
    /// A sum's shape and dtype, after its checks: a recorded gradient's
    /// bias sums (`g.sum(0)`), which a Hessian-vector product only pushes
    /// tangents through, are then computed only if read.
    fn planned(&self, xs: &[&Tensor]) -> Option<Result<(Shape, DType)>> {
        (self.kind == ReduceKind::Sum).then(|| self.plan(xs[0]).map(|p| (p.shape, p.dtype)))
    }
    /// A sum's tangent is the tangent summed.
    fn jvp_reads_output(&self) -> bool {
        self.kind != ReduceKind::Sum
    }
}

impl Derivative for ArgReduce {
    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn vjp<T: Diff>(&self, _: &[&T], _: &T, _: &T) -> Result<InputGrads<T>> {
        Ok(smallvec::smallvec![None])
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, _: &[Option<&T>]) -> Result<Option<T>> {
        Ok(None)
    }
    fn is_differentiable(&self) -> bool {
        false
    }
}

impl Derivative for SumTo {
    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        Ok(one(g.broadcast_to(xs[0].shape())?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| t.sum_to(self.shape.clone())).transpose()
    }
}

impl Reduce {
    /// `y` (or a gradient of y's shape) with the reduced axes put back as 1s.
    fn keep<T: Diff>(&self, y: &T, x_shape: &Shape) -> Result<T> {
        if self.keepdim {
            Ok(y.clone())
        } else {
            y.reshape(reduced_shape(x_shape, &self.axes, true))
        }
    }

    /// For max/min: where the input attains the result, divided by the
    /// number of ties, so the gradient is split evenly.
    fn tie_weights<T: Diff>(&self, x: &T, y: &T) -> Result<T> {
        let yk = self.keep(y, &x.shape())?;
        let mask = x.eq(&yk)?;
        let count = mask.sum(&self.axes.iter().map(|&a| a as isize).collect::<Vec<_>>(), true)?;
        mask.div(&count)
    }
}
