//! The derivatives of softmax and log_softmax (`ops/softmax.rs`).

use crate::ops::methods::binary::BinaryOps;
use crate::ops::methods::reduce::ReduceOps;
use crate::ops::methods::unary::UnaryOps;
use crate::ops::op::{one, Derivative, Diff, InputGrads, Saved};
use crate::ops::softmax::Softmax;
use crate::Result;

impl Derivative for Softmax {
    fn saves(&self) -> Saved {
        Saved::OUTPUT
    }
    fn vjp<T: Diff>(&self, _: &[&T], y: &T, g: &T) -> Result<InputGrads<T>> {
        Ok(one(self.pushforward(y, g)?))
    }
    fn jvp<T: Diff>(&self, _: &[&T], y: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        ts[0].map(|t| self.pushforward_jvp(y, t)).transpose()
    }
}

impl Softmax {
    /// softmax's Jacobian is symmetric, so one formula serves both modes:
    /// y * (v - sum(v * y)). log_softmax's VJP is g - softmax * sum(g).
    fn pushforward<T: Diff>(&self, y: &T, v: &T) -> Result<T> {
        let ax = [self.axis as isize];
        if self.log {
            v.sub(&y.exp()?.mul(&v.sum(&ax, true)?)?)
        } else {
            y.mul(&v.sub(&v.mul(y)?.sum(&ax, true)?)?)
        }
    }
    /// log_softmax's JVP is t - sum(softmax * t).
    fn pushforward_jvp<T: Diff>(&self, y: &T, t: &T) -> Result<T> {
        let ax = [self.axis as isize];
        if self.log {
            t.sub(&y.exp()?.mul(t)?.sum(&ax, true)?)
        } else {
            self.pushforward(y, t)
        }
    }
}
