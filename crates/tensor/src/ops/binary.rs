//! Elementwise functions of two tensors with numpy/torch broadcasting,
//! comparisons (masks) and `where`.
//!
//! Rules compute each input's gradient at the broadcast shape and reduce it
//! back with `sum_to`, so broadcasting needs no special case anywhere else.

use crate::ops::reduce::ReduceOps;
use crate::ops::shape::ShapeOps;
use crate::ops::unary::UnaryOps;
use crate::ops::{add_opt, check_pair, Arity, Diff, InputGrads, Op, Saved};
use crate::{cpu, DType, Result, Shape, Tensor};

/// Which two-operand function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a * b
    Mul,
    /// a / b
    Div,
    /// a ^ b
    Pow,
    /// max(a, b), NaN-propagating
    Maximum,
    /// min(a, b), NaN-propagating
    Minimum,
}

impl Op for Binary {
    fn name(&self) -> &'static str {
        match self {
            Binary::Add => "add",
            Binary::Sub => "sub",
            Binary::Mul => "mul",
            Binary::Div => "div",
            Binary::Pow => "pow",
            Binary::Maximum => "maximum",
            Binary::Minimum => "minimum",
        }
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

    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let shape = check_pair(self.name(), xs[0], xs[1])?;
        cpu::binary::forward(*self, xs[0], xs[1], &shape)
    }

    fn forward_cuda(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let shape = check_pair(self.name(), xs[0], xs[1])?;
        crate::cuda::ops::binary(*self, xs[0], xs[1], &shape)
    }

    fn vjp<T: Diff>(&self, xs: &[&T], y: &T, g: &T) -> Result<InputGrads<T>> {
        let (a, b) = (xs[0], xs[1]);
        let (ga, gb) = match self {
            Binary::Add => (g.clone(), g.clone()),
            Binary::Sub => (g.clone(), g.neg()?),
            Binary::Mul => (g.mul(b)?, g.mul(a)?),
            Binary::Div => {
                let gb_ = g.mul(y)?.div(b)?.neg()?;
                (g.div(b)?, gb_)
            }
            Binary::Pow => {
                // d/da a^b = b a^(b-1); d/db a^b = a^b ln a
                let da = b.mul(&a.pow(&b.sub_scalar(1.0)?)?)?;
                (g.mul(&da)?, g.mul(&y.mul(&a.log()?)?)?)
            }
            Binary::Maximum | Binary::Minimum => {
                let m = self.select_mask(a, b)?;
                (g.mul(&m)?, g.mul(&m.neg()?.add_scalar(1.0)?)?)
            }
        };
        Ok(smallvec::smallvec![Some(ga.sum_to(a.shape())?), Some(gb.sum_to(b.shape())?)])
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
            Binary::Pow => add_opt(
                ta.map(|t| t.mul(&b.mul(&a.pow(&b.sub_scalar(1.0)?)?)?)).transpose()?,
                tb.map(|t| t.mul(&y.mul(&a.log()?)?)).transpose()?,
            )?,
            Binary::Maximum | Binary::Minimum => {
                let m = self.select_mask(a, b)?;
                add_opt(ta.map(|t| t.mul(&m)).transpose()?, tb.map(|t| t.mul(&m.neg()?.add_scalar(1.0)?)).transpose()?)?
            }
        };
        // A tangent of a broadcast input must itself be broadcast.
        out.map(|t| if t.shape() == shape { Ok(t) } else { t.broadcast_to(shape.clone()) }).transpose()
    }
}

impl Binary {
    /// For maximum/minimum: 1 where `a` wins, 0 where `b` wins, 1/2 on ties
    /// (torch splits the gradient evenly on ties).
    fn select_mask<T: Diff>(self, a: &T, b: &T) -> Result<T> {
        let wins = if self == Binary::Maximum { a.gt(b)? } else { a.lt(b)? };
        wins.add(&a.eq(b)?.mul_scalar(0.5)?)
    }
}

/// A comparison, giving a mask of 1 and 0 in the operand's dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// ==
    Eq,
    /// !=
    Ne,
    /// <
    Lt,
    /// <=
    Le,
    /// >
    Gt,
    /// >=
    Ge,
}

impl Cmp {
    /// Whether `a` and `b` pass the test.
    #[inline]
    pub fn test<T: PartialOrd>(self, a: T, b: T) -> bool {
        match self {
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
            Cmp::Lt => a < b,
            Cmp::Le => a <= b,
            Cmp::Gt => a > b,
            Cmp::Ge => a >= b,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Cmp::Eq => "eq",
            Cmp::Ne => "ne",
            Cmp::Lt => "lt",
            Cmp::Le => "le",
            Cmp::Gt => "gt",
            Cmp::Ge => "ge",
        }
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
    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let a = xs[0];
        let cmp = self.cmp;
        if let (Some(_), true) = (self.scalar, a.dtype().is_int()) {
            // torch promotes an int tensor compared with a float scalar
            // (tensor([0]) < 0.5 is true); rounding the scalar to the int
            // dtype would not. f64 holds every i32 (and i64 below 2^53).
            return self.forward_cpu(&[&a.cast_raw(DType::F64)?])?.cast_raw(a.dtype());
        }
        let (b, shape) = match self.scalar {
            Some(s) => (Tensor::scalar_of(s, a.dtype()), a.shape().clone()),
            None => (xs[1].clone(), check_pair(self.name(), a, xs[1])?),
        };
        cpu::binary::compare(cmp, a, &b, &shape)
    }
    fn forward_cuda(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let (b, shape) = match self.scalar {
            Some(_) => (None, xs[0].shape().clone()),
            None => (Some(xs[1]), check_pair(self.name(), xs[0], xs[1])?),
        };
        crate::cuda::ops::compare(self.name(), self.cmp, xs[0], b, self.scalar.unwrap_or(0.0), &shape)
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
    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let (a, b) = (xs[0], xs[1]);
        let ab = check_pair("where", a, b)?;
        let shape = Shape::broadcast("where", &ab, self.mask.shape())?;
        cpu::binary::select(&self.mask, a, b, &shape)
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let m = g.lift(self.mask.ne_scalar(0.0)?.cast(g.dtype())?);
        let ga = g.mul(&m)?.sum_to(xs[0].shape())?;
        let gb = g.mul(&m.neg()?.add_scalar(1.0)?)?.sum_to(xs[1].shape())?;
        Ok(smallvec::smallvec![Some(ga), Some(gb)])
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
