//! Elementwise functions of two tensors with numpy/torch broadcasting,
//! comparisons (masks) and `where`.
//!
//! Rules compute each input's gradient at the broadcast shape and reduce it
//! back with `sum_to`, so broadcasting needs no special case anywhere else.
//! Operands of different dtypes are promoted as torch promotes them
//! ([`DType::promote`]); each gradient is cast back to its input's dtype,
//! so an optimizer never meets a parameter and a gradient that disagree.
//! Each op checks and promotes its operands once, for every device, and
//! hands the device's [`BinaryKernels`](crate::backend::BinaryKernels) the plan and the operands.

use crate::backend::binary::Rhs;
pub use crate::backend::binary::{Binary, Cmp};
use crate::backend::Backend;
use crate::ops::reduce::ReduceOps;
use crate::ops::shape::ShapeOps;
use crate::ops::unary::UnaryOps;
use crate::ops::{add_opt, check_pair, promote_pair, Arity, Diff, InputGrads, Op, Saved};
use crate::{DType, Result, Shape, Tensor};

impl Op for Binary {
    fn name(&self) -> &'static str {
        Binary::name(*self)
    }
    fn arity(&self) -> Arity {
        Arity::exactly(2)
    }

    fn saves(&self) -> Saved {
        match self {
            Binary::Add | Binary::Sub => Saved::NOTHING,
            Binary::Mul | Binary::Maximum | Binary::Minimum => Saved::INPUTS,
            Binary::Div => Saved::input(1).and_output(),
            Binary::Pow => Saved::ALL,
        }
    }

    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let (a, b, shape) = self.operands_of(xs)?;
        Ok(Tensor::from_storage(backend.binary(*self, a.src(), b.src(), &shape)?, shape))
    }

    fn vjp<T: Diff>(&self, xs: &[&T], y: &T, g: &T) -> Result<InputGrads<T>> {
        // The inputs a rule reads, in the output's (promoted) dtype; a no-op
        // unless the dtypes differ. Only read inputs are cast: the others
        // may be stand-ins holding no values.
        let up = |x: &T| x.cast(y.dtype());
        let (a, b) = (xs[0], xs[1]);
        let (ga, gb) = match self {
            Binary::Add => (g.clone(), g.clone()),
            Binary::Sub => (g.clone(), g.neg()?),
            Binary::Mul => (g.mul(&up(b)?)?, g.mul(&up(a)?)?),
            Binary::Div => {
                let b = up(b)?;
                let gb_ = g.mul(y)?.div(&b)?.neg()?;
                (g.div(&b)?, gb_)
            }
            Binary::Pow => {
                // d/da a^b = b a^(b-1); d/db a^b = a^b ln a
                let (a_, b_) = (up(a)?, up(b)?);
                let da = b_.mul(&a_.pow(&b_.sub_scalar(1.0)?)?)?;
                // An integer exponent gets no gradient: skip its ln a.
                let gb_ = if b.dtype().is_int() { g.clone() } else { g.mul(&y.mul(&a_.log()?)?)? };
                (g.mul(&da)?, gb_)
            }
            Binary::Maximum | Binary::Minimum => {
                let m = self.select_mask(&up(a)?, &up(b)?)?;
                (g.mul(&m)?, g.mul(&m.neg()?.add_scalar(1.0)?)?)
            }
        };
        Ok(smallvec::smallvec![grad_back(ga, a)?, grad_back(gb, b)?])
    }

    fn jvp<T: Diff>(&self, xs: &[&T], y: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        let (a, b) = (xs[0], xs[1]);
        let (ta, tb) = (ts[0], ts[1]);
        let shape = y.shape();
        let out = match self {
            Binary::Add => add_opt(ta.cloned(), tb.cloned())?,
            Binary::Sub => add_opt(ta.cloned(), tb.map(|t| t.neg()).transpose()?)?,
            Binary::Mul => add_opt(ta.map(|t| t.mul(b)).transpose()?, tb.map(|t| t.mul(a)).transpose()?)?,
            Binary::Div => {
                add_opt(ta.map(|t| t.div(b)).transpose()?, tb.map(|t| t.mul(y)?.div(b)?.neg()).transpose()?)?
            }
            Binary::Pow => {
                let (a, b) = (a.cast(y.dtype())?, b.cast(y.dtype())?);
                add_opt(
                    ta.map(|t| t.mul(&b.mul(&a.pow(&b.sub_scalar(1.0)?)?)?)).transpose()?,
                    tb.map(|t| t.mul(&y.mul(&a.log()?)?)).transpose()?,
                )?
            }
            Binary::Maximum | Binary::Minimum => {
                let m = self.select_mask(a, b)?;
                add_opt(ta.map(|t| t.mul(&m)).transpose()?, tb.map(|t| t.mul(&m.neg()?.add_scalar(1.0)?)).transpose()?)?
            }
        };
        // A tangent of a broadcast input must itself be broadcast, and one
        // input's tangent alone (of add, say) has that input's dtype.
        out.map(|t| {
            let t = t.cast(y.dtype())?;
            if t.shape() == shape {
                Ok(t)
            } else {
                t.broadcast_to(shape.clone())
            }
        })
        .transpose()
    }
}

/// An input's gradient from one at the broadcast shape and the promoted
/// dtype: summed back to the input's shape, then cast back to its dtype.
/// `None` for an integer input, which carries no gradient.
fn grad_back<T: Diff>(g: T, x: &T) -> Result<Option<T>> {
    if x.dtype().is_int() {
        return Ok(None);
    }
    Ok(Some(g.sum_to(x.shape())?.cast(x.dtype())?))
}

impl Binary {
    /// For maximum/minimum: 1 where `a` wins, 0 where `b` wins, 1/2 on ties
    /// (torch splits the gradient evenly on ties).
    fn select_mask<T: Diff>(self, a: &T, b: &T) -> Result<T> {
        let wins = if self == Binary::Maximum { a.gt(b)? } else { a.lt(b)? };
        wins.add(&a.eq(b)?.mul_scalar(0.5)?)
    }
}

/// Comparison of two tensors (broadcasting) or of a tensor with a scalar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Compare {
    /// The test.
    pub cmp: Cmp,
    /// Compare against this scalar instead of a second tensor.
    pub scalar: Option<f64>,
}

impl Op for Compare {
    fn name(&self) -> &'static str {
        self.cmp.name()
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1 + self.scalar.is_none() as usize)
    }

    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let a = xs[0];
        let (a, b, shape) = match self.scalar {
            Some(s) if a.dtype().is_int() => {
                // torch promotes an int tensor compared with a float scalar
                // (tensor([0]) < 0.5 is true); rounding the scalar to the int
                // dtype would not. f64 holds every i32 (and i64 below 2^53);
                // the mask goes back to the integer dtype.
                let wide = super::forward(&super::shape::Cast(DType::F64), &[a])?;
                let mask = backend.compare(self.cmp, wide.src(), Rhs::Scalar(s), a.shape())?;
                let mask = Tensor::from_storage(mask, a.shape().clone());
                return super::forward(&super::shape::Cast(a.dtype()), &[&mask]);
            }
            Some(s) => {
                return Ok(Tensor::from_storage(
                    backend.compare(self.cmp, a.src(), Rhs::Scalar(s), a.shape())?,
                    a.shape().clone(),
                ))
            }
            None => {
                let shape = check_pair(self.name(), a, xs[1])?;
                let (a, b) = promote_pair(a, xs[1])?;
                (a, b, shape)
            }
        };
        Ok(Tensor::from_storage(backend.compare(self.cmp, a.src(), Rhs::Operand(b.src()), &shape)?, shape))
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, _: &T) -> Result<InputGrads<T>> {
        Ok(xs.iter().map(|_| None).collect())
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, _: &[Option<&T>]) -> Result<Option<T>> {
        Ok(None)
    }
    fn is_differentiable(&self) -> bool {
        false
    }
}

/// `where(mask, a, b)`: `a` where the mask is non-zero, else `b`, all three
/// broadcast together. The mask is a constant of the op.
#[derive(Debug, Clone)]
pub struct Where {
    /// Non-zero selects the first operand.
    pub mask: Tensor,
}

impl Op for Where {
    fn name(&self) -> &'static str {
        "where"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(2)
    }

    fn operands(&self) -> smallvec::SmallVec<[&Tensor; 2]> {
        smallvec::smallvec![&self.mask]
    }

    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let ab = check_pair("where", xs[0], xs[1])?;
        let shape = Shape::broadcast("where", &ab, self.mask.shape())?;
        let (a, b) = promote_pair(xs[0], xs[1])?;
        Ok(Tensor::from_storage(backend.select(self.mask.src(), a.src(), b.src(), &shape)?, shape))
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let m = g.lift(self.mask.ne_scalar(0.0)?.cast(g.dtype())?);
        let ga = grad_back(g.mul(&m)?, xs[0])?;
        let gb = grad_back(g.mul(&m.neg()?.add_scalar(1.0)?)?, xs[1])?;
        Ok(smallvec::smallvec![ga, gb])
    }
    fn jvp<T: Diff>(&self, xs: &[&T], y: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        if ts.iter().all(|t| t.is_none()) {
            return Ok(None);
        }
        let ta = ts[0].cloned().map_or_else(|| xs[0].zeros_like(), Ok)?;
        let tb = ts[1].cloned().map_or_else(|| xs[1].zeros_like(), Ok)?;
        let t = T::apply(self.clone(), &[&ta, &tb])?;
        let shape = y.shape();
        Ok(Some(if t.shape() == shape { t } else { t.broadcast_to(shape)? }))
    }
}

impl Binary {
    /// The operands in their common dtype, and the broadcast shape.
    /// Integers divide as torch's `/` does, in float32 (true division).
    fn operands_of(self, xs: &[&Tensor]) -> Result<(Tensor, Tensor, Shape)> {
        let shape = check_pair(self.name(), xs[0], xs[1])?;
        let (a, b) = promote_pair(xs[0], xs[1])?;
        if self == Binary::Div && a.dtype().is_int() {
            let f = |x: &Tensor| crate::ops::forward(&super::shape::Cast(DType::F32), &[x]);
            return Ok((f(&a)?, f(&b)?, shape));
        }
        Ok((a, b, shape))
    }
}

/// This family's ops, each once (see [`crate::ops::registry`]).
pub(crate) fn family() -> Vec<Box<dyn super::DynOp>> {
    let mut ops: Vec<Box<dyn super::DynOp>> =
        Binary::ALL.iter().map(|&b| Box::new(b) as Box<dyn super::DynOp>).collect();
    ops.extend(Cmp::ALL.iter().map(|&cmp| Box::new(Compare { cmp, scalar: None }) as Box<dyn super::DynOp>));
    ops.push(Box::new(Where { mask: Tensor::scalar(1.0) }));
    ops
}

/// Two-operand elementwise ops, comparisons and `where`.
pub trait BinaryOps: Diff {
    /// a + b (broadcasting).
    fn add(&self, o: &Self) -> Result<Self> {
        Self::apply(Binary::Add, &[self, o])
    }
    /// a - b (broadcasting).
    fn sub(&self, o: &Self) -> Result<Self> {
        Self::apply(Binary::Sub, &[self, o])
    }
    /// a * b (broadcasting).
    fn mul(&self, o: &Self) -> Result<Self> {
        Self::apply(Binary::Mul, &[self, o])
    }
    /// a / b (broadcasting).
    fn div(&self, o: &Self) -> Result<Self> {
        Self::apply(Binary::Div, &[self, o])
    }
    /// a ^ b (broadcasting).
    fn pow(&self, o: &Self) -> Result<Self> {
        Self::apply(Binary::Pow, &[self, o])
    }
    /// Elementwise maximum (broadcasting).
    fn maximum(&self, o: &Self) -> Result<Self> {
        Self::apply(Binary::Maximum, &[self, o])
    }
    /// Elementwise minimum (broadcasting).
    fn minimum(&self, o: &Self) -> Result<Self> {
        Self::apply(Binary::Minimum, &[self, o])
    }
    /// Elementwise maximum with a scalar.
    fn maximum_scalar(&self, c: f64) -> Result<Self> {
        self.maximum(&self.full_like_shape((), c)?)
    }
    /// Elementwise minimum with a scalar.
    fn minimum_scalar(&self, c: f64) -> Result<Self> {
        self.minimum(&self.full_like_shape((), c)?)
    }
    /// c - x.
    fn rsub_scalar(&self, c: f64) -> Result<Self> {
        self.neg()?.add_scalar(c)
    }
    /// c / x.
    fn rdiv_scalar(&self, c: f64) -> Result<Self> {
        self.recip()?.mul_scalar(c)
    }
    /// Mask of a == b.
    fn eq(&self, o: &Self) -> Result<Self> {
        Self::apply(Compare { cmp: Cmp::Eq, scalar: None }, &[self, o])
    }
    /// Mask of a != b.
    fn ne(&self, o: &Self) -> Result<Self> {
        Self::apply(Compare { cmp: Cmp::Ne, scalar: None }, &[self, o])
    }
    /// Mask of a < b.
    fn lt(&self, o: &Self) -> Result<Self> {
        Self::apply(Compare { cmp: Cmp::Lt, scalar: None }, &[self, o])
    }
    /// Mask of a <= b.
    fn le(&self, o: &Self) -> Result<Self> {
        Self::apply(Compare { cmp: Cmp::Le, scalar: None }, &[self, o])
    }
    /// Mask of a > b.
    fn gt(&self, o: &Self) -> Result<Self> {
        Self::apply(Compare { cmp: Cmp::Gt, scalar: None }, &[self, o])
    }
    /// Mask of a >= b.
    fn ge(&self, o: &Self) -> Result<Self> {
        Self::apply(Compare { cmp: Cmp::Ge, scalar: None }, &[self, o])
    }
    /// Mask of x == c.
    fn eq_scalar(&self, c: f64) -> Result<Self> {
        Self::apply(Compare { cmp: Cmp::Eq, scalar: Some(c) }, &[self])
    }
    /// Mask of x != c.
    fn ne_scalar(&self, c: f64) -> Result<Self> {
        Self::apply(Compare { cmp: Cmp::Ne, scalar: Some(c) }, &[self])
    }
    /// Mask of x < c.
    fn lt_scalar(&self, c: f64) -> Result<Self> {
        Self::apply(Compare { cmp: Cmp::Lt, scalar: Some(c) }, &[self])
    }
    /// Mask of x <= c.
    fn le_scalar(&self, c: f64) -> Result<Self> {
        Self::apply(Compare { cmp: Cmp::Le, scalar: Some(c) }, &[self])
    }
    /// Mask of x > c.
    fn gt_scalar(&self, c: f64) -> Result<Self> {
        Self::apply(Compare { cmp: Cmp::Gt, scalar: Some(c) }, &[self])
    }
    /// Mask of x >= c.
    fn ge_scalar(&self, c: f64) -> Result<Self> {
        Self::apply(Compare { cmp: Cmp::Ge, scalar: Some(c) }, &[self])
    }
    /// `self` where `mask` is non-zero, else `other` (all broadcast).
    fn where_(&self, mask: &Tensor, other: &Self) -> Result<Self> {
        Self::apply(Where { mask: mask.clone() }, &[self, other])
    }
}

impl<T: Diff> BinaryOps for T {}

#[cfg(test)]
mod tests {
    use super::{Binary, Cmp};

    /// As `unary`'s test: no wildcard, so a new variant needs a place.
    fn place(b: Binary) -> usize {
        match b {
            Binary::Add => 0,
            Binary::Sub => 1,
            Binary::Mul => 2,
            Binary::Div => 3,
            Binary::Pow => 4,
            Binary::Maximum => 5,
            Binary::Minimum => 6,
        }
    }

    fn cmp_place(c: Cmp) -> usize {
        match c {
            Cmp::Eq => 0,
            Cmp::Ne => 1,
            Cmp::Lt => 2,
            Cmp::Le => 3,
            Cmp::Gt => 4,
            Cmp::Ge => 5,
        }
    }

    #[test]
    fn all_lists_every_variant_once_in_order() {
        assert_eq!(Binary::ALL.iter().map(|&b| place(b)).collect::<Vec<_>>(), (0..7).collect::<Vec<_>>());
        assert_eq!(Cmp::ALL.iter().map(|&c| cmp_place(c)).collect::<Vec<_>>(), (0..6).collect::<Vec<_>>());
    }
}
