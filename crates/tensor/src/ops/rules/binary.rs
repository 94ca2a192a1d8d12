//! The derivatives of the elementwise functions of two tensors
//! (`ops/binary.rs`).
//!
//! Rules compute each input's gradient at the broadcast shape and reduce it
//! back with `sum_to`, so broadcasting needs no special case anywhere else;
//! each gradient is cast back to its input's dtype, so an optimizer never
//! meets a parameter and a gradient that disagree.

use crate::ops::binary::{Binary, Compare, Where};
use crate::ops::methods::binary::{add_opt, BinaryOps};
use crate::ops::methods::reduce::ReduceOps;
use crate::ops::methods::shape::ShapeOps;
use crate::ops::methods::unary::UnaryOps;
use crate::ops::op::{Derivative, Diff, InputGrads, Saved};
use crate::Result;

impl Derivative for Binary {
    fn saves(&self) -> Saved {
        match self {
            Binary::Add | Binary::Sub => Saved::NOTHING,
            Binary::Mul | Binary::Maximum | Binary::Minimum => Saved::INPUTS,
            Binary::Div => Saved::input(1).and_output(),
            Binary::Pow => Saved::ALL,
        }
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

impl Derivative for Compare {
    fn saves(&self) -> Saved {
        Saved::NOTHING
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

impl Derivative for Where {
    fn saves(&self) -> Saved {
        Saved::NOTHING
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
