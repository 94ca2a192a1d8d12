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
//!
//! [`LowPrecisionAffine`] is the same layer under mixed precision: f32
//! operands in, the product in bf16 or f16, as one node.

use tapir_tensor::backend::Backend;
use tapir_tensor::ops::rules::matmul::{fused_linear_sum_then, linear_sum_then, Then};
use tapir_tensor::ops::{add_opt, Arity, Derivative, InputGrads, Op, Saved};
use tapir_tensor::{BinaryOps, DType, Diff, Error, MatmulOps, ReduceOps, Result, ShapeOps, Tensor, UnaryOps};

use crate::backend::{AffinePlan, LowAffinePlan};
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
        arity(self.bias, self.residual)
    }
    /// The device's fused kernel where it has one, else the composition.
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let plan = self.check(xs)?;
        let (x, w, b, r) = operands(self.bias, self.residual, xs);
        match backend_for(x.device()).affine(&plan, x, w, b, r)? {
            Some(y) => Ok(y),
            None => self.composed(x, w, b, r),
        }
    }
}

impl Derivative for Affine {
    fn saves(&self) -> Saved {
        saves(self.tanh)
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
    T::apply(op, &inputs(x, w, b, residual))
}

/// `x @ w^T + b`, plus `r` when `residual`, with the product and the bias
/// in the low `dtype` (bf16 or f16, f32 accumulation in the kernels) for
/// operands in the parameters' dtype: mixed precision's linear layer
/// ([`crate::Precision`]), as one node. `x` is `[..., in]`, `w`
/// `[out, in]`, `b` `[out]`, `r` the product's shape. Inputs: x, w, then b
/// if `bias`, then r if `residual`. The output is in `dtype`, or, with a
/// residual, in the residual's and `dtype`'s promoted dtype (an f32
/// residual stream stays f32); with `tanh` it is `tanh` of all that.
///
/// Why one node: the tape keeps every node's value until the backward, so
/// composed of casts, `matmul` and `add`, the layer kept the low copies of
/// `x`, `w` and `b` and the product before the bias, beside the f32 `x`
/// every path keeps, and a bf16 step peaked above the f32 one. Here the
/// casts are temporaries of the forward, freed before it returns, and the
/// rule keeps only the f32 `x` and `w` (what [`Affine`] keeps) and casts
/// them again. The numbers are the composition's, bit for bit: the same
/// casts, the product rounded to `dtype` and then the bias added and
/// rounded again, and rules that are the composed ops' rules in their
/// order (`crates/nn/tests/amp.rs` compares a model's loss and gradients).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LowPrecisionAffine {
    /// The dtype the product and the bias run in.
    pub dtype: DType,
    /// Whether the gradient of `x` is wanted (false for data).
    pub input_grad: bool,
    /// A bias input follows the weight.
    pub bias: bool,
    /// Add a residual input to the result.
    pub residual: bool,
    /// Return `tanh` of the result (after the residual, as [`Affine`]).
    pub tanh: bool,
}

impl Op for LowPrecisionAffine {
    fn name(&self) -> &'static str {
        "low_precision_affine"
    }
    fn arity(&self) -> Arity {
        arity(self.bias, self.residual)
    }
    /// The device's fused kernel where it has one, else the composition,
    /// whose casts and product are dropped as `run` returns.
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let plan = self.check(xs)?;
        let (x, w, b, r) = operands(self.bias, self.residual, xs);
        match backend_for(x.device()).low_affine(&plan, x, w, b, r)? {
            Some(y) => Ok(y),
            None => self.composed(x, w, b, r),
        }
    }
}

impl Derivative for LowPrecisionAffine {
    /// The f32 x and weight, cast again by the rule; never their low
    /// copies.
    fn saves(&self) -> Saved {
        saves(self.tanh)
    }
    /// The composition's rules in reverse order: residual add (or tanh),
    /// bias add, matmul, transpose, casts; each input's gradient back in
    /// its own dtype.
    fn vjp<T: Diff>(&self, xs: &[&T], y: &T, g: &T) -> Result<InputGrads<T>> {
        let dt = self.dtype;
        let (x, w) = (xs[0], xs[1]);
        let gz;
        let mut g = if self.tanh {
            gz = y.tanh_backward(g)?;
            &gz
        } else {
            g
        };
        // The product's shape: x's with the last dim the weight's rows.
        let mut low_shape = x.shape().dims().to_vec();
        if let Some(last) = low_shape.last_mut() {
            *last = w.shape().dims()[0];
        }
        let (gr, g_low);
        if self.residual {
            let r = xs[xs.len() - 1];
            gr = Some(g.sum_to(r.shape())?.cast(r.dtype())?);
            g_low = g.sum_to(low_shape.clone())?.cast(dt)?;
            g = &g_low;
        } else {
            gr = None;
        }
        // The bias add: the product's gradient is g; the bias's is summed
        // to its row in the low dtype and cast back up.
        let gb = if self.bias {
            let b = xs[2];
            Some(g.sum_to(b.shape())?.cast(dt)?.cast(b.dtype())?)
        } else {
            None
        };
        // The matmul of x_low [..., in] by wt = w_low^T [in, out].
        let wt = w.cast(dt)?.t()?;
        let mut out = InputGrads::new();
        out.push(if self.input_grad { Some(g.matmul(&wt.t()?)?.sum_to(x.shape())?.cast(x.dtype())?) } else { None });
        let gwt = x.cast(dt)?.t()?.matmul(g)?.sum_to(wt.shape())?;
        out.push(Some(gwt.t()?.cast(w.dtype())?));
        if self.bias {
            out.push(gb);
        }
        if self.residual {
            out.push(gr);
        }
        Ok(out)
    }
    /// The composition's tangent: the casts' tangents, the product rule,
    /// the bias's tangent, then the residual's and tanh's.
    fn jvp<T: Diff>(&self, xs: &[&T], y: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        let dt = self.dtype;
        let (x, w) = (xs[0], xs[1]);
        let wt = w.cast(dt)?.t()?;
        let twt = ts[1].map(|t| t.cast(dt)?.t()).transpose()?;
        let tx = ts[0].map(|t| t.cast(dt)).transpose()?;
        let xl = twt.as_ref().map(|_| x.cast(dt)).transpose()?;
        let mut terms: Vec<(&T, &T)> = Vec::with_capacity(2);
        if let Some(t) = tx.as_ref() {
            terms.push((t, &wt));
        }
        if let (Some(xl), Some(t)) = (xl.as_ref(), twt.as_ref()) {
            terms.push((xl, t));
        }
        let tb = if self.bias { ts[2].map(|t| t.cast(dt)).transpose()? } else { None };
        let mut low_shape = x.shape().dims().to_vec();
        if let Some(last) = low_shape.last_mut() {
            *last = w.shape().dims()[0];
        }
        let tp = linear_sum_then(&terms, None, Then::Nothing)?;
        let mut t = match (tp, tb) {
            (Some(tp), Some(tb)) => Some(tp.add(&tb)?),
            (Some(tp), None) => Some(tp),
            (None, Some(tb)) => Some(tb.broadcast_to(low_shape)?),
            (None, None) => None,
        };
        if self.residual {
            t = add_opt(
                t.map(|t| t.cast(y.dtype())).transpose()?,
                ts[ts.len() - 1].map(|t| t.cast(y.dtype())).transpose()?,
            )?;
        }
        match t {
            Some(t) if self.tanh => Ok(Some(y.tanh_backward(&t)?)),
            t => Ok(t),
        }
    }
}

impl LowPrecisionAffine {
    /// The shape rule every device shares: `x` `[..., in]` (rank 2 or
    /// more, as `matmul` takes it), `w` `[out, in]`, `b` `[out]`, `r` the
    /// product's shape; float operands and a float `dtype`.
    fn check(&self, xs: &[&Tensor]) -> Result<LowAffinePlan> {
        let (x, w) = (xs[0], xs[1]);
        if !self.dtype.is_float() {
            return Err(Error::UnsupportedDType {
                op: "low_precision_affine",
                dtype: self.dtype,
                expected: "a float dtype",
            });
        }
        for t in xs {
            if !t.dtype().is_float() {
                return Err(Error::UnsupportedDType {
                    op: "low_precision_affine",
                    dtype: t.dtype(),
                    expected: "a float dtype",
                });
            }
        }
        let mismatch = |a: &Tensor, b: &Tensor| Error::ShapeMismatch {
            op: "low_precision_affine",
            lhs: Box::new(a.shape().clone()),
            rhs: Box::new(b.shape().clone()),
        };
        if x.rank() < 2 || w.rank() != 2 || x.dims()[x.rank() - 1] != w.dims()[1] {
            return Err(mismatch(x, w));
        }
        if self.bias && xs[2].dims() != [w.dims()[0]] {
            return Err(mismatch(w, xs[2]));
        }
        if self.residual {
            let r = xs[xs.len() - 1];
            let mut want = x.dims().to_vec();
            want[x.rank() - 1] = w.dims()[0];
            if r.dims() != want.as_slice() {
                return Err(mismatch(x, r));
            }
        }
        Ok(LowAffinePlan { dtype: self.dtype, tanh: self.tanh })
    }

    /// The op from tensor ops: the casts, the product and the bias sum are
    /// temporaries, each dropped as soon as the next step has read it.
    fn composed(&self, x: &Tensor, w: &Tensor, b: Option<&Tensor>, r: Option<&Tensor>) -> Result<Tensor> {
        let dt = self.dtype;
        let mut y = x.cast(dt)?.matmul(&w.cast(dt)?.t()?)?;
        if let Some(b) = b {
            y = y.add(&b.cast(dt)?)?;
        }
        if let Some(r) = r {
            y = r.add(&y)?;
        }
        if self.tanh {
            y = y.tanh()?;
        }
        Ok(y)
    }
}

/// [`LowPrecisionAffine`] `op` on `x`, `w` and the bias and residual given
/// (`op.bias` and `op.residual` are set from the arguments).
pub fn low_precision_affine<T: Diff>(
    mut op: LowPrecisionAffine,
    x: &T,
    w: &T,
    b: Option<&T>,
    residual: Option<&T>,
) -> Result<T> {
    op.bias = b.is_some();
    op.residual = residual.is_some();
    T::apply(op, &inputs(x, w, b, residual))
}

// What the two ops share: their inputs are x, w, then the bias and the
// residual where they have them, and they keep x and the weight (never the
// bias or the residual), and the output only for tanh, whose derivative
// `1 - y^2` needs it.

fn arity(bias: bool, residual: bool) -> Arity {
    Arity::exactly(2 + bias as usize + residual as usize)
}

fn saves(tanh: bool) -> Saved {
    let saved = Saved::input(0).and_input(1);
    if tanh {
        saved.and_output()
    } else {
        saved
    }
}

/// `x`, `w`, and the bias and residual where the op has them.
fn operands<'a, T>(bias: bool, residual: bool, xs: &[&'a T]) -> (&'a T, &'a T, Option<&'a T>, Option<&'a T>) {
    (xs[0], xs[1], bias.then(|| xs[2]), residual.then(|| xs[xs.len() - 1]))
}

/// The input list `operands` reads back.
fn inputs<'a, T>(x: &'a T, w: &'a T, b: Option<&'a T>, residual: Option<&'a T>) -> Vec<&'a T> {
    let mut inputs = vec![x, w];
    inputs.extend(b);
    inputs.extend(residual);
    inputs
}
