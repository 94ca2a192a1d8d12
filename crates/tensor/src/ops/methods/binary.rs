//! The elementwise functions of two tensors, comparisons and `where`
//! (`ops/binary.rs`) as methods of every [`Diff`] value.

use crate::ops::binary::{Binary, Cmp, Compare, Where};
use crate::ops::methods::unary::UnaryOps;
use crate::ops::op::Diff;
use crate::{Result, Tensor};

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

/// Adds two optional tangents/gradients, treating `None` as zero.
pub fn add_opt<T: Diff>(a: Option<T>, b: Option<T>) -> Result<Option<T>> {
    Ok(match (a, b) {
        (Some(a), Some(b)) => Some(a.add(&b)?),
        (a, None) => a,
        (None, b) => b,
    })
}
