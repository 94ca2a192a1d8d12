//! `x @ w^T + b` as one op, for [`crate::Linear`].
//!
//! Composed from `matmul`, `t` and `add`, a linear layer records three
//! nodes and its backward does three avoidable things: it keeps the
//! product *and* the biased sum alive until the backward pass; it returns
//! the weight's gradient as a transposed view (the transpose of `x^T g`),
//! which the optimizer must then copy to read in order; and it computes the
//! gradient of the input even when the input is data. This op adds the bias
//! into the product's own buffer, writes `dW = g^T x` in the weight's
//! layout, and is told when recording whether the input needs a gradient.
//! It can also add a residual branch in the same buffer, and return the
//! tanh of the result (a tanh layer as one node that keeps only its
//! output: tanh's derivative is `1 - y^2`).
//! Its rules are written in differentiable ops, so higher orders work.

use tapir_tensor::backend::Backend;
use tapir_tensor::ops::matmul::{fused_linear_sum_then, linear_sum_then, Then};
use tapir_tensor::ops::{add_opt, Arity, InputGrads, Op, Saved};
use tapir_tensor::{BinaryOps, Diff, Error, MatmulOps, ReduceOps, Result, ShapeOps, Tensor, UnaryOps};

use crate::backend::AffinePlan;
use crate::dispatch::backend_for;

/// `y = x @ w^T + b`, plus `r` when `residual`, for `x` `[N, in]`, `w`
/// `[out, in]`, `b` `[out]`, `r` `[N, out]`. Inputs: x, w, then b if
/// `bias`, then r if `residual`. With the residual fused, the branch's
/// output is never kept apart from the sum for the backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Affine {
    /// Whether the gradient of `x` is wanted (false for data).
    pub input_grad: bool,
    /// A bias input follows the weight.
    pub bias: bool,
    /// Add a residual input to the result.
    pub residual: bool,
    /// Return `tanh` of the result: a tanh layer as one op. Its rules need
    /// only the output (`1 - y^2`), so the pre-activation is never stored,
    /// and each thread applies tanh (or, for the tangent, `1 - y^2`) to its
    /// rows of the product while they are in its core's cache.
    pub tanh: bool,
}

impl Op for Affine {
    fn name(&self) -> &'static str {
        "affine"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(2 + self.bias as usize + self.residual as usize)
    }

    fn saves(&self) -> Saved {
        // x and the weight; never the bias or the residual, and the output
        // only for tanh.
        let saved = Saved::input(0).and_input(1);
        if self.tanh {
            saved.and_output()
        } else {
            saved
        }
    }
    /// The device's fused kernel where it has one, else the composition.
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let plan = self.check(xs)?;
        let (x, w, b, r) = self.operands_of(xs);
        match backend_for(x.device()).affine(&plan, x, w, b, r)? {
            Some(y) => Ok(y),
            None => self.composed(x, w, b, r),
        }
    }
    fn vjp<T: Diff>(&self, xs: &[&T], y: &T, g: &T) -> Result<InputGrads<T>> {
        let (x, w) = (xs[0], xs[1]);
        let gz;
        let g = if self.tanh {
            gz = y.tanh_backward(g)?;
            &gz
        } else {
            g
        };
        let mut out = InputGrads::new();
        out.push(if self.input_grad { Some(g.matmul(w)?) } else { None });
        // (g^T x) is [out, in], the weight's own layout.
        out.push(Some(g.t()?.matmul(x)?));
        if self.bias {
            out.push(Some(g.sum(&[0], false)?));
        }
        if self.residual {
            out.push(Some(g.clone()));
        }
        Ok(out)
    }
    fn jvp<T: Diff>(&self, xs: &[&T], y: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        self.tangent(xs, y, ts, &|terms, b, then| linear_sum_then(terms, b, then))
    }
    /// The tangent as one product sum writing one buffer, `1 - y^2` applied
    /// in the same job.
    fn jvp_eager(&self, xs: &[&Tensor], y: &Tensor, ts: &[Option<&Tensor>]) -> Result<Option<Tensor>> {
        self.tangent(xs, y, ts, &|terms, b, then| fused_linear_sum_then(terms, b, then))
    }
}

/// How a rule computes `then(sum of products + bias)`: composed, or one
/// fused job when eager.
type ProductSum<'a, T> = &'a dyn Fn(&[(&T, &T)], Option<&T>, Then<'_, T>) -> Result<Option<T>>;

impl Affine {
    /// The shape rule every device shares: `x` `[N, in]`, `w` `[out, in]`,
    /// `b` `[out]`, `r` `[N, out]`.
    fn check(&self, xs: &[&Tensor]) -> Result<AffinePlan> {
        let (x, w) = (xs[0], xs[1]);
        if x.rank() != 2 || w.rank() != 2 || x.dims()[1] != w.dims()[1] {
            return Err(Error::ShapeMismatch {
                op: "affine",
                lhs: Box::new(x.shape().clone()),
                rhs: Box::new(w.shape().clone()),
            });
        }
        if self.bias && xs[2].dims() != [w.dims()[0]] {
            return Err(Error::ShapeMismatch {
                op: "affine",
                lhs: Box::new(w.shape().clone()),
                rhs: Box::new(xs[2].shape().clone()),
            });
        }
        if self.residual {
            let r = xs[xs.len() - 1];
            if r.dims() != [x.dims()[0], w.dims()[0]] {
                return Err(Error::ShapeMismatch {
                    op: "affine",
                    lhs: Box::new(x.shape().clone()),
                    rhs: Box::new(r.shape().clone()),
                });
            }
        }
        Ok(AffinePlan { tanh: self.tanh })
    }

    /// `x`, `w`, and the bias and residual where the op has them.
    fn operands_of<'a, T>(&self, xs: &[&'a T]) -> (&'a T, &'a T, Option<&'a T>, Option<&'a T>) {
        let b = self.bias.then(|| xs[2]);
        let r = self.residual.then(|| xs[xs.len() - 1]);
        (xs[0], xs[1], b, r)
    }

    /// The op from tensor ops, for a device without a fused kernel: the
    /// product, then the bias, the residual and tanh, each a kernel.
    fn composed(&self, x: &Tensor, w: &Tensor, b: Option<&Tensor>, r: Option<&Tensor>) -> Result<Tensor> {
        let mut y = x.matmul(&w.t()?)?;
        if let Some(b) = b {
            y = y.add(b)?;
        }
        if let Some(r) = r {
            y = y.add(r)?;
        }
        if self.tanh {
            y = y.tanh()?;
        }
        Ok(y)
    }

    fn tangent<T: Diff>(&self, xs: &[&T], y: &T, ts: &[Option<&T>], sum: ProductSum<'_, T>) -> Result<Option<T>> {
        let (x, w) = (xs[0], xs[1]);
        // tx @ w^T + x @ tw^T, as one product sum (one buffer when eager).
        let wt = ts[0].map(|_| w.t()).transpose()?;
        let twt = ts[1].map(|t| t.t()).transpose()?;
        let mut terms: Vec<(&T, &T)> = Vec::with_capacity(2);
        if let (Some(t), Some(wt)) = (ts[0], wt.as_ref()) {
            terms.push((t, wt));
        }
        if let Some(twt) = twt.as_ref() {
            terms.push((x, twt));
        }
        let tb = if self.bias { ts[2] } else { None };
        // Without a residual, a tanh layer's `1 - y^2` is applied in the
        // product's own job.
        let in_job = self.tanh && !self.residual && !terms.is_empty();
        let tz = match (terms.is_empty(), tb) {
            (true, Some(tb)) => Some(tb.broadcast_to(y.shape())?),
            _ => sum(&terms, tb, if in_job { Then::TanhBackward(y) } else { Then::Nothing })?,
        };
        let tz = if self.residual { add_opt(tz, ts[ts.len() - 1].cloned())? } else { tz };
        match tz {
            Some(t) if self.tanh && !in_job => Ok(Some(y.tanh_backward(&t)?)),
            tz => Ok(tz),
        }
    }
}

/// `x @ w^T + b` for 2-D `x`, one [`Affine`] op.
pub fn affine<T: Diff>(x: &T, w: &T, b: Option<&T>, input_grad: bool) -> Result<T> {
    affine_with(Affine { input_grad, ..Affine::default() }, x, w, b, None)
}

/// [`Affine`] with a `residual` to add (`op.bias` and `op.residual` are
/// set from the arguments).
pub fn affine_with<T: Diff>(mut op: Affine, x: &T, w: &T, b: Option<&T>, residual: Option<&T>) -> Result<T> {
    op.bias = b.is_some();
    op.residual = residual.is_some();
    let mut inputs = vec![x, w];
    inputs.extend(b);
    inputs.extend(residual);
    T::apply(op, &inputs)
}
