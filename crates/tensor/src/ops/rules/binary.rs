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
use crate::ops::op::{wanted_pair, Derivative, Diff, InputGrads, Saved};
use crate::{Result, Tensor};
use smallvec::SmallVec;

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
        self.grads(xs, y, g, [true, true])
    }
    /// A constant operand's gradient is a pass of its own, and a reduction
    /// too when it was broadcast (a jet's `[1, d, 1]` mask summed a whole
    /// `[N, d, w]` product down to three numbers every layer): skipped.
    fn vjp_eager_wanted(
        &self,
        xs: SmallVec<[Tensor; 3]>,
        y: Tensor,
        g: Tensor,
        wanted: &[bool],
    ) -> Result<InputGrads<Tensor>> {
        self.grads(&[&xs[0], &xs[1]], &y, &g, wanted_pair(wanted))
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
        self.grads(xs, g, [true, true])
    }
    /// A constant branch (a fill value) gets no gradient pass.
    fn vjp_eager_wanted(
        &self,
        xs: SmallVec<[Tensor; 3]>,
        _: Tensor,
        g: Tensor,
        wanted: &[bool],
    ) -> Result<InputGrads<Tensor>> {
        self.grads(&[&xs[0], &xs[1]], &g, wanted_pair(wanted))
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
    /// The gradients of the inputs `want` asks for (`None` for the others
    /// and for integer inputs), each at its input's shape and dtype.
    fn grads<T: Diff>(self, xs: &[&T], y: &T, g: &T, want: [bool; 2]) -> Result<InputGrads<T>> {
        // The inputs a rule reads, in the output's (promoted) dtype; a no-op
        // unless the dtypes differ. Only read inputs are cast: the others
        // may be stand-ins holding no values.
        let up = |x: &T| x.cast(y.dtype());
        let (a, b) = (xs[0], xs[1]);
        // Input i's gradient at the broadcast shape, when wanted.
        let ga = |f: &dyn Fn() -> Result<T>| if want[0] { f().map(Some) } else { Ok(None) };
        let gb = |f: &dyn Fn() -> Result<T>| if want[1] { f().map(Some) } else { Ok(None) };
        let (ga, gb) = match self {
            Binary::Add => (ga(&|| Ok(g.clone()))?, gb(&|| Ok(g.clone()))?),
            Binary::Sub => (ga(&|| Ok(g.clone()))?, gb(&|| g.neg())?),
            Binary::Mul => (ga(&|| g.mul(&up(b)?))?, gb(&|| g.mul(&up(a)?))?),
            Binary::Div => (ga(&|| g.div(&up(b)?))?, gb(&|| g.mul(y)?.div(&up(b)?)?.neg())?),
            Binary::Pow => {
                // d/da a^b = b a^(b-1); d/db a^b = a^b ln a
                let da = || {
                    let (a_, b_) = (up(a)?, up(b)?);
                    g.mul(&b_.mul(&a_.pow(&b_.sub_scalar(1.0)?)?)?)
                };
                // An integer exponent gets no gradient: skip its ln a.
                let db = || if b.dtype().is_int() { Ok(g.clone()) } else { g.mul(&y.mul(&up(a)?.log()?)?) };
                (ga(&da)?, gb(&db)?)
            }
            Binary::Maximum | Binary::Minimum => {
                let m = self.select_mask(&up(a)?, &up(b)?)?;
                (ga(&|| g.mul(&m))?, gb(&|| g.mul(&m.neg()?.add_scalar(1.0)?))?)
            }
        };
        let back = |g: Option<T>, x: &T| g.map(|g| grad_back(g, x)).transpose().map(Option::flatten);
        Ok(smallvec::smallvec![back(ga, a)?, back(gb, b)?])
    }

    /// For maximum/minimum: 1 where `a` wins, 0 where `b` wins, 1/2 on ties
    /// (torch splits the gradient evenly on ties).
    fn select_mask<T: Diff>(self, a: &T, b: &T) -> Result<T> {
        let wins = if self == Binary::Maximum { a.gt(b)? } else { a.lt(b)? };
        wins.add(&a.eq(b)?.mul_scalar(0.5)?)
    }
}

impl Where {
    /// The wanted branches' gradients: `g` where the mask picks the branch,
    /// zero elsewhere.
    fn grads<T: Diff>(&self, xs: &[&T], g: &T, want: [bool; 2]) -> Result<InputGrads<T>> {
        let m = g.lift(self.mask.ne_scalar(0.0)?.cast(g.dtype())?);
        let ga = if want[0] { grad_back(g.mul(&m)?, xs[0])? } else { None };
        let gb = if want[1] { grad_back(g.mul(&m.neg()?.add_scalar(1.0)?)?, xs[1])? } else { None };
        Ok(smallvec::smallvec![ga, gb])
    }
}
