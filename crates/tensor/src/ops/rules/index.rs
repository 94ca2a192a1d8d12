//! The derivatives of the indexing ops (`ops/index.rs`): index_select and
//! index_add are each other's transposes, as are gather and scatter_add.

use crate::ops::index::{Gather, IndexAdd, IndexSelect, ScatterAdd};
use crate::ops::op::{one, Derivative, Diff, InputGrads, Saved};
use crate::Result;

impl Derivative for IndexSelect {
    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let size = xs[0].shape().dims()[self.axis];
        Ok(one(T::apply(IndexAdd { axis: self.axis, idx: self.idx.clone(), size }, &[g])?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| T::apply(self.clone(), &[t])).transpose()
    }
}

impl Derivative for IndexAdd {
    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn vjp<T: Diff>(&self, _: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        Ok(one(T::apply(IndexSelect { axis: self.axis, idx: self.idx.clone() }, &[g])?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| T::apply(self.clone(), &[t])).transpose()
    }
}

impl Derivative for Gather {
    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        // On the gradient's device (a host zeros would be a device mismatch on CUDA).
        let zeros = g.full_like_shape(xs[0].shape(), 0.0)?;
        Ok(one(T::apply(ScatterAdd { axis: self.axis, idx: self.idx.clone() }, &[&zeros, g])?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| T::apply(self.clone(), &[t])).transpose()
    }
}

impl Derivative for ScatterAdd {
    fn saves(&self) -> Saved {
        Saved::NOTHING
    }
    fn vjp<T: Diff>(&self, _: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let gsrc = T::apply(Gather { axis: self.axis, idx: self.idx.clone() }, &[g])?;
        Ok(smallvec::smallvec![Some(g.clone()), Some(gsrc)])
    }
    fn jvp<T: Diff>(&self, xs: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        if ts.iter().all(|t| t.is_none()) {
            return Ok(None);
        }
        let tb = ts[0].cloned().map_or_else(|| xs[0].zeros_like(), Ok)?;
        let tsrc = ts[1].cloned().map_or_else(|| xs[1].zeros_like(), Ok)?;
        T::apply(self.clone(), &[&tb, &tsrc]).map(Some)
    }
}
