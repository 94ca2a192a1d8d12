//! The derivatives of the layout ops (`ops/shape.rs`): each is another
//! layout op (a narrow's is a pad, a broadcast's a `sum_to`), so views stay
//! views in every order.

use crate::ops::methods::reduce::ReduceOps;
use crate::ops::methods::shape::ShapeOps;
use crate::ops::op::{one, Derivative, Diff, InputGrads, Saved};
use crate::ops::shape::{BroadcastTo, Cast, Concat, Contiguous, Narrow, Pad, Permute, Reshape};
use crate::Result;

impl Derivative for Reshape {
    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        Ok(one(g.reshape(xs[0].shape())?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| t.reshape(self.0.clone())).transpose()
    }
}

impl Derivative for Permute {
    fn saves(&self) -> Saved {
        Saved::NOTHING
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

impl Derivative for Narrow {
    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let size = xs[0].shape().dims()[self.axis];
        Ok(one(T::apply(Pad { axis: self.axis, start: self.start, size }, &[g])?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| T::apply(self.clone(), &[t])).transpose()
    }
}

impl Derivative for Pad {
    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let len = xs[0].shape().dims()[self.axis];
        Ok(one(T::apply(Narrow { axis: self.axis, start: self.start, len }, &[g])?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| T::apply(self.clone(), &[t])).transpose()
    }
}

impl Derivative for BroadcastTo {
    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        Ok(one(g.sum_to(xs[0].shape())?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| t.broadcast_to(self.0.clone())).transpose()
    }
}

impl Derivative for Contiguous {
    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn vjp<T: Diff>(&self, _: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        Ok(one(g.clone()))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        Ok(ts[0].cloned())
    }
}

impl Derivative for Concat {
    fn saves(&self) -> Saved {
        Saved::NOTHING
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

impl Derivative for Cast {
    fn saves(&self) -> Saved {
        Saved::NOTHING
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
