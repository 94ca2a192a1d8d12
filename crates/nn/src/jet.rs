//! Forward-Laplacian propagation through an MLP: the value, the Jacobian
//! with respect to the input points and the (partial) Laplacian are pushed
//! through the network together, layer by layer, in one forward pass. All of
//! it is recorded, so a loss on the Laplacian trains the network.
//!
//! For `d` input dims this costs about `d + 2` forward passes of matrix
//! work, and nothing of it is a backward pass, against `d` Hessian-vector
//! products (each a forward and two backward passes) for nested autodiff.

use smallvec::SmallVec;
use tapir_autograd::Var;
use tapir_tensor::backend::Backend;
use tapir_tensor::ops::shape::Pad;
use tapir_tensor::ops::{one, Arity, Derivative, InputGrads, Op, Saved};
use tapir_tensor::{BinaryOps, Diff, Error, MatmulOps, ReduceOps, Result, ShapeOps, Tensor, UnaryOps};

use crate::backend::{SumSquaresPlan, TanhJacPlan, TanhJetPlan};
use crate::dispatch::backend_for;
use crate::layers::{Activation, Mlp};
use crate::params::Bound;

/// The value of a network at points `[N, d]`, its Jacobian with respect to
/// the points and its second derivatives summed over chosen input dims.
pub struct Jet<'g> {
    /// The outputs `u`, `[N, out]`.
    pub value: Var<'g>,
    /// `du/dx`, `[N, d, out]`.
    pub jacobian: Var<'g>,
    /// `sum_{i in dims} d^2 u / dx_i^2`, `[N, out]`.
    pub laplacian: Var<'g>,
}

impl Activation {
    /// First and second derivatives as functions of the pre-activation `z`
    /// and the activation `a = f(z)`.
    fn derivatives<'g>(self, z: &Var<'g>, a: &Var<'g>) -> Result<(Var<'g>, Var<'g>)> {
        match self {
            Activation::Tanh => {
                // 1 - a^2 and -2 a (1 - a^2), one fused op each.
                let d1 = a.tanh_backward(&a.full_like_shape((), 1.0)?)?;
                let d2 = a.tanh_backward(&a.mul_scalar(-2.0)?)?;
                Ok((d1, d2))
            }
            Activation::Sin => Ok((z.cos()?, a.neg()?)),
            other => Err(Error::invalid_arg(
                "forward_jet",
                format!("{other:?} has no continuous second derivative; use Tanh or Sin"),
            )),
        }
    }
}

impl Mlp {
    /// Value, Jacobian and the Laplacian over input dims `dims` (all dims for
    /// the full Laplacian; `[0]` for `u_xx` of `u(x, t)`), for points `x`
    /// `[N, d]`, recorded in `x`'s graph.
    pub fn forward_jet<'g>(&self, p: &Bound<'g>, x: Var<'g>, dims: &[usize]) -> Result<Jet<'g>> {
        let xs = x.shape();
        if xs.rank() != 2 {
            return Err(Error::InvalidShape {
                op: "forward_jet",
                shape: Box::new(xs),
                reason: "points must be [N, d]".into(),
            });
        }
        let (n, d) = (xs.dims()[0], xs.dims()[1]);
        if let Some(&bad) = dims.iter().find(|&&i| i >= d) {
            return Err(Error::IndexOutOfRange { op: "forward_jet", index: bad as i64, position: 0, size: d });
        }
        // A [d] mask selecting the Laplacian's dims, as [1, d, 1]; none when
        // every dim is selected.
        let mut sel = vec![0.0; d];
        for &i in dims {
            sel[i] = 1.0;
        }
        let all = sel.iter().all(|&s| s == 1.0);
        // The selected dims as one run `lo..hi`, when they are one.
        let lo = sel.iter().position(|&s| s == 1.0).unwrap_or(0);
        let hi = sel.iter().rposition(|&s| s == 1.0).map_or(0, |i| i + 1);
        let run = hi > lo && sel[lo..hi].iter().all(|&s| s == 1.0);
        let sel = p.graph().constant(Tensor::from_vec(sel, [1, d, 1])?.cast(x.dtype())?.to_device(x.device())?);
        // sum over the selected dims of J^2: [N, d, w] -> [N, w].
        let sum_sq = |j: &Var<'g>| -> Result<Var<'g>> {
            if all {
                sum_squares_mid(j)
            } else if run {
                sum_squares_rows(j, lo, hi - lo)
            } else {
                j.square()?.mul(&sel)?.sum(&[1], false)
            }
        };

        let mut h = x;
        let mut jac: Option<Var<'g>> = None; // [N, d, w]; None = the identity
        let mut lap: Option<Var<'g>> = None; // [N, w];   None = zero
        for (k, layer) in self.layers.iter().enumerate() {
            let w = p.var(layer.weight)?; // [out, in]
            let out = w.shape().dims()[0];
            let hidden = k + 1 < self.layers.len();
            // A tanh layer's derivatives need only its output: one op, and
            // `h` is already the activation.
            let fused = hidden && self.activation == Activation::Tanh;
            h = if fused { layer.forward_tanh(p, h)? } else { layer.forward(p, h)? };
            jac = Some(match jac {
                // d(x W^T)/dx = W^T for every point. Copied out of the
                // weight's layout first (d x out elements): broadcast from
                // the transposed view, every elementwise op on the Jacobian
                // and on its gradient walked it with a stride of d, one
                // element at a time (a tenth of a Poisson step at d = 2).
                // A fused tanh layer's `tanh_jac` takes it as [1, d, out].
                None if fused => w.t()?.contiguous_()?.unsqueeze(0)?,
                None => w.t()?.contiguous_()?.unsqueeze(0)?.broadcast_to([n, d, out])?,
                Some(j) => {
                    let width = j.shape().dims()[2];
                    j.reshape([n * d, width])?.matmul(&w.t()?)?.reshape([n, d, out])?
                }
            });
            lap = match lap {
                None => None,
                Some(l) => Some(l.matmul(&w.t()?)?),
            };
            if hidden {
                let a = if fused { h } else { self.activation.apply(&h)? };
                let j = jac.take().expect("internal: set above");
                let jsq = if k == 0 {
                    // The first layer's Jacobian is W^T for every point: sum
                    // its squares once, as [w], instead of over [N, d, w].
                    let wsq = p.var(layer.weight)?.square()?;
                    if all {
                        wsq.sum(&[1], false)?
                    } else {
                        wsq.mul(&sel.reshape([1, d])?)?.sum(&[1], false)?
                    }
                } else {
                    sum_sq(&j)?
                };
                if fused {
                    // tanh: d2 = -2 a d1, so `l d1 + d2 jsq` is
                    // `(1 - a^2)(l - 2 a jsq)`: one `tanh_jet` op, one pass
                    // each way, where the composed ops took four forward
                    // and more again backward; and the Jacobian's
                    // `j (1 - a^2)` one `tanh_jac` op, where `1 - a^2` and
                    // the broadcast product were two, and their rules
                    // five passes backward.
                    lap = Some(tanh_jet(&a, &jsq, lap.as_ref())?);
                    jac = Some(tanh_jac(&j, &a)?);
                } else {
                    let (d1, d2) = self.activation.derivatives(&h, &a)?;
                    let curv = d2.mul(&jsq)?;
                    lap = Some(match lap {
                        None => curv,
                        Some(l) => l.mul(&d1)?.add(&curv)?,
                    });
                    jac = Some(j.mul(&d1.unsqueeze(1)?)?);
                }
                h = a;
            }
        }
        let jacobian = jac.ok_or_else(|| Error::invalid_arg("forward_jet", "the network has no layers"))?;
        let out = h.shape().dims()[1];
        let laplacian = match lap {
            Some(l) => l,
            None => p.graph().constant(Tensor::zeros_on([n, out], x.dtype(), x.device())?),
        };
        Ok(Jet { value: h, jacobian, laplacian })
    }
}

/// `sum_i x[n, i, j]^2` for `x` `[N, d, w]`: the Jacobian's squares summed
/// over the input dims, `[N, w]`, the one quantity the Laplacian needs of
/// them. As one op it is one pass over the `[N, d, w]` Jacobian, the
/// largest tensor of the propagation, where `square` then `sum` is two and
/// keeps a second tensor of that size alive in the graph.
///
/// `rows` sums only the input dims `lo..lo + len` (`None`: all of them): a
/// Laplacian over some dims (`u_xx` of `u(x, t)`) reads only their rows, and
/// its gradient is zero in the others, where masking the squares took three
/// passes forward and four back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SumSquaresMid {
    /// The rows of the middle axis summed, as `(lo, len)`; `None`: all.
    pub rows: Option<(usize, usize)>,
}

/// [`SumSquaresMid`] of `x` over every input dim.
pub fn sum_squares_mid<T: Diff>(x: &T) -> Result<T> {
    T::apply(SumSquaresMid { rows: None }, &[x])
}

/// [`SumSquaresMid`] of `x` over the input dims `lo..lo + len`.
pub fn sum_squares_rows<T: Diff>(x: &T, lo: usize, len: usize) -> Result<T> {
    T::apply(SumSquaresMid { rows: Some((lo, len)) }, &[x])
}

impl SumSquaresMid {
    /// The plan of `x`, an error unless it is `[N, d, w]` with the rows
    /// inside `d`.
    fn plan(&self, x: &Tensor) -> Result<SumSquaresPlan> {
        const OP: &str = "sum_squares_mid";
        let [n, d, w] = *x.dims() else {
            return Err(Error::InvalidShape {
                op: OP,
                shape: Box::new(x.shape().clone()),
                reason: "needs [N, d, w]".into(),
            });
        };
        let (lo, len) = self.rows.unwrap_or((0, d));
        if lo.checked_add(len).is_none_or(|end| end > d) {
            return Err(Error::invalid_arg(OP, format!("rows {lo}..{lo}+{len} outside the {d} input dims")));
        }
        Ok(SumSquaresPlan { n, d, w, lo, len })
    }
}

impl Op for SumSquaresMid {
    fn name(&self) -> &'static str {
        "sum_squares_mid"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }
    /// The device's one-pass kernel where it has one, else square then sum.
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let plan = self.plan(xs[0])?;
        match backend_for(xs[0].device()).sum_squares_mid(&plan, xs[0])? {
            Some(y) => Ok(y),
            None => xs[0].narrow(1, plan.lo, plan.len)?.square()?.sum(&[1], false),
        }
    }
}

impl Derivative for SumSquaresMid {
    fn saves(&self) -> Saved {
        Saved::input(0)
    }
    /// The device's one-pass kernel where it has one, else the rule.
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, y: Tensor, g: Tensor) -> Result<InputGrads<Tensor>> {
        let plan = self.plan(&xs[0])?;
        if let Some(dx) = backend_for(xs[0].device()).sum_squares_mid_grad(&plan, &xs[0], &g)? {
            return Ok(one(dx));
        }
        self.vjp(&[&xs[0]], &y, &g)
    }
    /// `2 x g` in the summed rows, zero in the others (rounded as `(x g) 2`).
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let x = xs[0];
        let Some((lo, len)) = self.rows else {
            return Ok(one(x.mul(&g.unsqueeze(1)?)?.mul_scalar(2.0)?));
        };
        let size = x.shape().dims()[1];
        let part = x.narrow(1, lo, len)?.mul(&g.unsqueeze(1)?)?.mul_scalar(2.0)?;
        Ok(one(T::apply(Pad { axis: 1, start: lo, size }, &[&part])?))
    }
    fn jvp<T: Diff>(&self, xs: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        let Some(t) = ts[0] else { return Ok(None) };
        let (x, t) = match self.rows {
            None => (xs[0].clone(), t.clone()),
            Some((lo, len)) => (xs[0].narrow(1, lo, len)?, t.narrow(1, lo, len)?),
        };
        Ok(Some(x.mul(&t)?.sum(&[1], false)?.mul_scalar(2.0)?))
    }
}

/// A tanh layer's Laplacian update, `(1 - a^2)(l - 2 a s)`, for its output
/// `a = tanh z` `[N, w]`, the Jacobian's squares summed over the input dims
/// `s` (`[N, w]`, or `[w]` for every point alike) and the incoming
/// Laplacian `l` `[N, w]` (none: zero, the first layer's). That is
/// `l tanh'(z) + s tanh''(z)` written in `a`.
///
/// As one op it is one pass forward and one backward, for its three
/// gradients; composed (`mul`, `mul_scalar`, `add`, `tanh_backward`) it was
/// four passes forward and their rules' passes backward; on CUDA one
/// kernel each way (`kernels/jet.cu`). Its rules are written in
/// differentiable ops, so any order works.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TanhJet;

/// [`TanhJet`] of `a`, `s` and `l` (`None`: zero).
pub fn tanh_jet<T: Diff>(a: &T, s: &T, l: Option<&T>) -> Result<T> {
    match l {
        Some(l) => T::apply(TanhJet, &[a, s, l]),
        None => T::apply(TanhJet, &[a, s]),
    }
}

/// The plan of `a`, `s` and `l`: an error unless `a` is a float `[N, w]`,
/// `s` `[N, w]` or `[w]` and `l` `[N, w]`, all of `a`'s dtype and device.
fn check_tanh_jet(xs: &[&Tensor]) -> Result<TanhJetPlan> {
    const OP: &str = "tanh_jet";
    let (a, s) = (xs[0], xs[1]);
    let dtype = a.dtype();
    if !dtype.is_float() {
        return Err(Error::UnsupportedDType { op: OP, dtype, expected: "a float dtype" });
    }
    let [n, w] = *a.dims() else {
        return Err(Error::InvalidShape {
            op: OP,
            shape: Box::new(a.shape().clone()),
            reason: "a must be [N, w]".into(),
        });
    };
    for x in &xs[1..] {
        if x.dtype() != dtype {
            return Err(Error::DTypeMismatch { op: OP, lhs: dtype, rhs: x.dtype() });
        }
        if x.device() != a.device() {
            return Err(Error::DeviceMismatch { op: OP, lhs: a.device(), rhs: x.device() });
        }
    }
    let s_row = s.dims() == [w];
    if !s_row && s.dims() != a.dims() {
        return Err(Error::ShapeMismatch {
            op: OP,
            lhs: Box::new(a.shape().clone()),
            rhs: Box::new(s.shape().clone()),
        });
    }
    if let Some(l) = xs.get(2).filter(|l| l.dims() != a.dims()) {
        return Err(Error::ShapeMismatch {
            op: OP,
            lhs: Box::new(a.shape().clone()),
            rhs: Box::new(l.shape().clone()),
        });
    }
    Ok(TanhJetPlan { n, w, s_row })
}

impl Op for TanhJet {
    fn name(&self) -> &'static str {
        "tanh_jet"
    }
    fn arity(&self) -> Arity {
        Arity::between(2, 3)
    }
    /// The device's one-pass kernel where it has one, else the composition.
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let plan = check_tanh_jet(xs)?;
        let (a, s, l) = (xs[0], xs[1], xs.get(2).copied());
        match backend_for(a.device()).tanh_jet(&plan, a, s, l)? {
            Some(y) => Ok(y),
            None => {
                let inner = a.mul(s)?.mul_scalar(-2.0)?;
                let inner = match l {
                    Some(l) => l.add(&inner)?,
                    None => inner,
                };
                a.tanh_backward(&inner)
            }
        }
    }
}

impl Derivative for TanhJet {
    fn saves(&self) -> Saved {
        Saved::INPUTS
    }
    /// The device's one-pass kernel for all three gradients where it has
    /// one, else the composed rule.
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, y: Tensor, g: Tensor) -> Result<InputGrads<Tensor>> {
        let refs: SmallVec<[&Tensor; 3]> = xs.iter().collect();
        let plan = check_tanh_jet(&refs)?;
        let l = xs.get(2);
        if let Some([da, ds, dl]) = backend_for(xs[0].device()).tanh_jet_grad(&plan, &xs[0], &xs[1], l, &g)? {
            let ds = if plan.s_row { ds.sum(&[0], false)? } else { ds };
            let mut out: InputGrads<Tensor> = smallvec::smallvec![Some(da), Some(ds)];
            if l.is_some() {
                out.push(Some(dl));
            }
            return Ok(out);
        }
        self.vjp(&refs, &y, &g)
    }
    /// With `u = l - 2 a s` and `d = 1 - a^2` (the output is `d u`):
    /// `dl = g d`, `ds = -2 a g d`, `da = -2 g (a u + s d)`.
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let (a, s, l) = (xs[0], xs[1], xs.get(2).copied());
        let u = inner(a, s, l)?;
        let dl = a.tanh_backward(g)?;
        let ds = a.mul(&dl)?.mul_scalar(-2.0)?.sum_to(s.shape())?;
        let da = a.mul(&u)?.add(&a.tanh_backward(s)?)?.mul(g)?.mul_scalar(-2.0)?;
        let mut out: InputGrads<T> = smallvec::smallvec![Some(da), Some(ds)];
        if l.is_some() {
            out.push(Some(dl));
        }
        Ok(out)
    }
    /// `tanh_jet(a, ts, tl) - 2 ta (a u + s d)`.
    fn jvp<T: Diff>(&self, xs: &[&T], out: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        let (a, s, l) = (xs[0], xs[1], xs.get(2).copied());
        let (ta, tsq, tl) = (ts[0], ts[1], ts.get(2).copied().flatten());
        let from_s_l = match (tsq, tl) {
            (None, None) => None,
            (Some(t), tl) => Some(tanh_jet(a, t, tl)?),
            (None, Some(tl)) => Some(a.tanh_backward(tl)?),
        };
        let from_a = match ta {
            None => None,
            Some(ta) => {
                let u = inner(a, s, l)?;
                Some(a.mul(&u)?.add(&a.tanh_backward(s)?)?.mul(ta)?.mul_scalar(-2.0)?)
            }
        };
        let t = match (from_s_l, from_a) {
            (None, None) => return Ok(None),
            (Some(t), None) | (None, Some(t)) => t,
            (Some(p), Some(q)) => p.add(&q)?,
        };
        Ok(Some(if t.shape() == out.shape() { t } else { t.broadcast_to(out.shape())? }))
    }
}

/// A tanh layer's Jacobian update, `j (1 - a^2)`, for the incoming
/// Jacobian `j` `[N, d, w]` (or `[1, d, w]`, the same for every point: the
/// first layer's `W^T`) and the layer's output `a = tanh z` `[N, w]`,
/// broadcast over each point's `d` rows; `[N, d, w]`.
///
/// One pass forward, where `1 - a^2` and the broadcast product were two,
/// and two backward (`d j = g (1 - a^2)`, `d a = -2 a sum_i g_i j_i`), where
/// the product's rule and `1 - a^2`'s took five. Its rules are written in
/// differentiable ops, so any order works.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TanhJac;

/// [`TanhJac`] of `j` and `a`.
pub fn tanh_jac<T: Diff>(j: &T, a: &T) -> Result<T> {
    T::apply(TanhJac, &[j, a])
}

/// The plan of `j` and `a`: an error unless `a` is a float `[N, w]` and `j`
/// `[N, d, w]` or `[1, d, w]` of `a`'s dtype and device.
fn check_tanh_jac(j: &Tensor, a: &Tensor) -> Result<TanhJacPlan> {
    const OP: &str = "tanh_jac";
    let dtype = a.dtype();
    if !dtype.is_float() {
        return Err(Error::UnsupportedDType { op: OP, dtype, expected: "a float dtype" });
    }
    if j.dtype() != dtype {
        return Err(Error::DTypeMismatch { op: OP, lhs: j.dtype(), rhs: dtype });
    }
    if j.device() != a.device() {
        return Err(Error::DeviceMismatch { op: OP, lhs: j.device(), rhs: a.device() });
    }
    let [n, w] = *a.dims() else {
        return Err(Error::InvalidShape {
            op: OP,
            shape: Box::new(a.shape().clone()),
            reason: "a must be [N, w]".into(),
        });
    };
    match *j.dims() {
        [m, d, v] if v == w && (m == n || m == 1) => Ok(TanhJacPlan { n, d, w, j_row: m == 1 && n != 1 }),
        _ => Err(Error::ShapeMismatch { op: OP, lhs: Box::new(j.shape().clone()), rhs: Box::new(a.shape().clone()) }),
    }
}

impl Op for TanhJac {
    fn name(&self) -> &'static str {
        "tanh_jac"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(2)
    }
    /// The device's one-pass kernel where it has one, else the composition.
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let (j, a) = (xs[0], xs[1]);
        let plan = check_tanh_jac(j, a)?;
        match backend_for(a.device()).tanh_jac(&plan, j, a)? {
            Some(y) => Ok(y),
            None => a.unsqueeze(1)?.tanh_backward(j)?.broadcast_to([plan.n, plan.d, plan.w])?.contiguous(),
        }
    }
}

impl Derivative for TanhJac {
    fn saves(&self) -> Saved {
        Saved::INPUTS
    }
    /// The device's kernels where it has them, else the composed rule.
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, y: Tensor, g: Tensor) -> Result<InputGrads<Tensor>> {
        let plan = check_tanh_jac(&xs[0], &xs[1])?;
        if let Some([dj, da]) = backend_for(xs[1].device()).tanh_jac_grad(&plan, &xs[0], &xs[1], &g)? {
            let dj = if plan.j_row { dj.sum(&[0], true)? } else { dj };
            return Ok(smallvec::smallvec![Some(dj), Some(da)]);
        }
        self.vjp(&[&xs[0], &xs[1]], &y, &g)
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let (j, a) = (xs[0], xs[1]);
        let dj = a.unsqueeze(1)?.tanh_backward(g)?.sum_to(j.shape())?;
        let da = a.mul(&g.mul(j)?.sum(&[1], false)?)?.mul_scalar(-2.0)?;
        Ok(smallvec::smallvec![Some(dj), Some(da)])
    }
    /// `tanh_jac(tj, a) + j (-2 a ta)`.
    fn jvp<T: Diff>(&self, xs: &[&T], out: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        let (j, a) = (xs[0], xs[1]);
        let from_j = ts[0].map(|tj| a.unsqueeze(1)?.tanh_backward(tj)).transpose()?;
        let from_a = ts[1].map(|ta| j.mul(&a.mul(ta)?.mul_scalar(-2.0)?.unsqueeze(1)?)).transpose()?;
        let t = match (from_j, from_a) {
            (None, None) => return Ok(None),
            (Some(t), None) | (None, Some(t)) => t,
            (Some(p), Some(q)) => p.add(&q)?,
        };
        Ok(Some(if t.shape() == out.shape() { t } else { t.broadcast_to(out.shape())? }))
    }
}

/// `l - 2 a s`, rounded as `l + (a s)(-2)`.
fn inner<T: Diff>(a: &T, s: &T, l: Option<&T>) -> Result<T> {
    let inner = a.mul(s)?.mul_scalar(-2.0)?;
    match l {
        Some(l) => l.add(&inner),
        None => Ok(inner),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tapir_autograd::{check_grads, CheckOptions};
    use tapir_tensor::{DType, Rng};

    #[test]
    fn sum_squares_mid_matches_square_sum_and_its_gradients_check() {
        let x = Rng::new(3).uniform([3, 4, 5], -1.0, 1.0, DType::F64).unwrap();
        let a = sum_squares_mid(&x).unwrap().to_vec::<f64>().unwrap();
        let b = x.square().unwrap().sum(&[1], false).unwrap().to_vec::<f64>().unwrap();
        assert!(a.iter().zip(&b).all(|(p, q)| (p - q).abs() < 1e-12));
        // A strided (permuted) input takes the same path through a copy.
        let xt = x.permute(&[1, 0, 2]).unwrap();
        let c = sum_squares_mid(&xt).unwrap().to_vec::<f64>().unwrap();
        let e = xt.square().unwrap().sum(&[1], false).unwrap().to_vec::<f64>().unwrap();
        assert!(c.iter().zip(&e).all(|(p, q)| (p - q).abs() < 1e-12));
        check_grads(&|_g, v| sum_squares_mid(&v[0])?.tanh(), &[x], &CheckOptions::default()).unwrap();
    }

    /// Large enough to split over threads, with rows of 300 so a part
    /// boundary falls inside a point's row.
    #[test]
    fn sum_squares_mid_split_inside_rows_matches_square_sum() {
        for dtype in [DType::F32, DType::F64] {
            let x = Rng::new(4).uniform([37, 3, 300], -1.0, 1.0, dtype).unwrap();
            let a = sum_squares_mid(&x).unwrap().to_vec_f64();
            let b = x.square().unwrap().sum(&[1], false).unwrap().to_vec_f64();
            assert!(a.iter().zip(&b).all(|(p, q)| (p - q).abs() < 1e-6), "{dtype}");
        }
    }

    /// Some input dims: the squares of rows `lo..lo + len` only, with the
    /// bits of narrowing, squaring and summing, and gradients that check
    /// (first and second order, through the composed rule's pad).
    #[test]
    fn sum_squares_rows_matches_narrow_square_sum_and_its_gradients_check() {
        let x = Rng::new(3).uniform([3, 4, 5], -1.0, 1.0, DType::F64).unwrap();
        for (lo, len) in [(0, 1), (1, 2), (3, 1), (0, 4)] {
            let a = sum_squares_rows(&x, lo, len).unwrap().to_vec::<f64>().unwrap();
            let b = x.narrow(1, lo, len).unwrap().square().unwrap().sum(&[1], false).unwrap();
            assert_eq!(a, b.to_vec::<f64>().unwrap(), "rows {lo}+{len}");
            let opts = CheckOptions::default();
            check_grads(&|_g, v| sum_squares_rows(&v[0], lo, len)?.tanh(), std::slice::from_ref(&x), &opts).unwrap();
        }
        assert!(matches!(sum_squares_rows(&x, 3, 2), Err(Error::InvalidArgument { .. })));
        assert!(matches!(sum_squares_rows(&x, usize::MAX, 2), Err(Error::InvalidArgument { .. })));
        let flat = x.reshape([12, 5]).unwrap();
        assert!(matches!(sum_squares_rows(&flat, 0, 1), Err(Error::InvalidShape { .. })));
    }

    /// The one-pass gradient kernel has the composed rule's bits (`(x g) 2`
    /// in the summed rows, zero elsewhere): f32 and f64, all rows and some,
    /// a size that splits over threads with part boundaries inside a row.
    #[test]
    fn sum_squares_gradient_kernel_has_the_composed_rules_bits() {
        for dtype in [DType::F32, DType::F64] {
            let mut rng = Rng::new(5);
            let x = rng.uniform([37, 3, 300], -1.0, 1.0, dtype).unwrap();
            let g = rng.uniform([37, 300], -2.0, 2.0, dtype).unwrap();
            for rows in [None, Some((0, 1)), Some((1, 2)), Some((2, 1))] {
                let op = SumSquaresMid { rows };
                let y = Tensor::apply(op, &[&x]).unwrap();
                let fused = op.vjp_eager(smallvec::smallvec![x.clone()], y.clone(), g.clone()).unwrap();
                let composed = op.vjp(&[&x], &y, &g).unwrap();
                let bits = |t: &Option<Tensor>| t.as_ref().unwrap().to_vec_f64();
                assert_eq!(bits(&fused[0]), bits(&composed[0]), "{dtype} {rows:?}");
            }
        }
    }

    /// `(1 - a^2)(l - 2 a s)` as the forward pass composed it before
    /// `TanhJet`: `tanh_backward(a, l + (a s)(-2))`.
    fn composed(a: &Tensor, s: &Tensor, l: Option<&Tensor>) -> Tensor {
        let inner = a.mul(s).unwrap().mul_scalar(-2.0).unwrap();
        let inner = match l {
            Some(l) => l.add(&inner).unwrap(),
            None => inner,
        };
        a.tanh_backward(&inner).unwrap()
    }

    /// The fused kernel has the composed ops' bits, forward and backward:
    /// f32 and f64, with and without `l`, `s` per point and one row, sizes
    /// that split over threads with part boundaries inside a row (rows of
    /// 131), a small size on one thread and a strided operand.
    #[test]
    fn tanh_jet_has_the_composed_ops_bits() {
        for dtype in [DType::F32, DType::F64] {
            for (n, w) in [(513, 131), (3, 5)] {
                let mut rng = Rng::new(7);
                let a = rng.uniform([n, w], -1.0, 1.0, dtype).unwrap().tanh().unwrap();
                let l = rng.uniform([n, w], -2.0, 2.0, dtype).unwrap();
                let g = rng.uniform([n, w], -1.0, 1.0, dtype).unwrap();
                let s_full = rng.uniform([n, w], 0.0, 3.0, dtype).unwrap();
                let s_row = rng.uniform([w], 0.0, 3.0, dtype).unwrap();
                let l_strided = rng.uniform([w, n], -2.0, 2.0, dtype).unwrap().t().unwrap();
                for s in [&s_full, &s_row] {
                    for l in [None, Some(&l), Some(&l_strided)] {
                        let what = format!("{dtype} [{n}, {w}] s {:?} l {}", s.dims(), l.is_some());
                        let y = tanh_jet(&a, s, l).unwrap();
                        assert_eq!(y.dims(), [n, w]);
                        assert_eq!(y.to_vec_f64(), composed(&a, s, l).to_vec_f64(), "forward, {what}");
                        let mut xs: SmallVec<[Tensor; 3]> = smallvec::smallvec![a.clone(), s.clone()];
                        xs.extend(l.cloned());
                        let refs: Vec<&Tensor> = xs.iter().collect();
                        let fused = TanhJet.vjp_eager(xs.clone(), y.clone(), g.clone()).unwrap();
                        let rule = TanhJet.vjp(&refs, &y, &g).unwrap();
                        assert_eq!(fused.len(), refs.len(), "{what}");
                        for (i, (p, q)) in fused.iter().zip(&rule).enumerate() {
                            let (p, q) = (p.as_ref().unwrap(), q.as_ref().unwrap());
                            assert_eq!(p.dims(), refs[i].dims(), "gradient {i}, {what}");
                            let (p, q) = (p.to_vec_f64(), q.to_vec_f64());
                            if i == 1 && s.dims() == [w] {
                                // Summed over points: the reduction's order may differ.
                                let tol = if dtype == DType::F32 { 1e-4 } else { 1e-12 };
                                assert!(
                                    p.iter().zip(&q).all(|(p, q)| (p - q).abs() <= tol * (1.0 + q.abs())),
                                    "{what}"
                                );
                            } else {
                                assert_eq!(p, q, "gradient {i}, {what}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// First and second order, reverse and forward, with and without `l`,
    /// `s` per point and one row.
    #[test]
    fn tanh_jet_gradients_check() {
        let mut rng = Rng::new(11);
        let a = rng.uniform([3, 4], -0.9, 0.9, DType::F64).unwrap();
        let l = rng.uniform([3, 4], -1.0, 1.0, DType::F64).unwrap();
        let s = rng.uniform([3, 4], 0.0, 2.0, DType::F64).unwrap();
        let row = rng.uniform([4], 0.0, 2.0, DType::F64).unwrap();
        let opts = CheckOptions::default();
        for s in [&s, &row] {
            check_grads(&|_g, v| tanh_jet(&v[0], &v[1], Some(&v[2])), &[a.clone(), s.clone(), l.clone()], &opts)
                .unwrap();
            check_grads(&|_g, v| tanh_jet(&v[0], &v[1], None), &[a.clone(), s.clone()], &opts).unwrap();
        }
    }

    #[test]
    fn tanh_jet_rejects_bad_input() {
        let f = |shape: &[usize], dtype| Tensor::ones(shape.to_vec(), dtype).unwrap();
        let a = f(&[3, 4], DType::F32);
        let int = f(&[3, 4], DType::I32);
        assert!(matches!(tanh_jet(&int, &int, None), Err(Error::UnsupportedDType { .. })));
        assert!(matches!(tanh_jet(&a, &f(&[3, 4], DType::F64), None), Err(Error::DTypeMismatch { .. })));
        assert!(matches!(tanh_jet(&a, &f(&[3, 5], DType::F32), None), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(tanh_jet(&a, &f(&[4, 1], DType::F32), None), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(tanh_jet(&a, &a, Some(&f(&[4], DType::F32))), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(tanh_jet(&a, &a, Some(&int)), Err(Error::DTypeMismatch { .. })));
        let a3 = f(&[2, 3, 4], DType::F32);
        assert!(matches!(tanh_jet(&a3, &a3, None), Err(Error::InvalidShape { .. })));
    }

    /// The fused Jacobian update against the composed ops (`j` times
    /// `tanh_backward(a, 1)` broadcast), forward bit for bit, backward
    /// against the composed rule: f32 and f64, `j` per point and one
    /// `[1, d, w]`, sizes that split over threads inside a row.
    #[test]
    fn tanh_jac_matches_the_composed_ops() {
        for dtype in [DType::F32, DType::F64] {
            for (n, d, w) in [(257, 3, 67), (2, 3, 5)] {
                let mut rng = Rng::new(5);
                let a = rng.uniform([n, w], -1.0, 1.0, dtype).unwrap().tanh().unwrap();
                let g = rng.uniform([n, d, w], -1.0, 1.0, dtype).unwrap();
                let j_full = rng.uniform([n, d, w], -1.0, 1.0, dtype).unwrap();
                let j_row = rng.uniform([1, d, w], -1.0, 1.0, dtype).unwrap();
                let ones = Tensor::ones([n, w], dtype).unwrap();
                let d1 = a.tanh_backward(&ones).unwrap().unsqueeze(1).unwrap();
                for j in [&j_full, &j_row] {
                    let what = format!("{dtype} [{n}, {d}, {w}] j {:?}", j.dims());
                    let y = tanh_jac(j, &a).unwrap();
                    assert_eq!(y.dims(), [n, d, w]);
                    assert_eq!(y.to_vec_f64(), j.mul(&d1).unwrap().to_vec_f64(), "forward, {what}");
                    let xs: SmallVec<[Tensor; 3]> = smallvec::smallvec![j.clone(), a.clone()];
                    let fused = TanhJac.vjp_eager(xs, y.clone(), g.clone()).unwrap();
                    let rule = TanhJac.vjp(&[j, &a], &y, &g).unwrap();
                    let tol = if dtype == DType::F32 { 1e-4 } else { 1e-12 };
                    for (i, (p, q)) in fused.iter().zip(&rule).enumerate() {
                        let (p, q) = (p.as_ref().unwrap(), q.as_ref().unwrap());
                        assert_eq!(p.dims(), q.dims(), "gradient {i}, {what}");
                        let (p, q) = (p.to_vec_f64(), q.to_vec_f64());
                        assert!(p.iter().zip(&q).all(|(p, q)| (p - q).abs() <= tol * (1.0 + q.abs())), "{i} {what}");
                    }
                }
            }
        }
    }

    #[test]
    fn tanh_jac_gradients_check() {
        let mut rng = Rng::new(13);
        let a = rng.uniform([3, 4], -0.9, 0.9, DType::F64).unwrap();
        let j = rng.uniform([3, 2, 4], -1.0, 1.0, DType::F64).unwrap();
        let row = rng.uniform([1, 2, 4], -1.0, 1.0, DType::F64).unwrap();
        for j in [&j, &row] {
            check_grads(&|_g, v| tanh_jac(&v[0], &v[1]), &[j.clone(), a.clone()], &CheckOptions::default()).unwrap();
        }
    }

    #[test]
    fn tanh_jac_rejects_bad_input() {
        let f = |shape: &[usize], dtype| Tensor::ones(shape.to_vec(), dtype).unwrap();
        let a = f(&[3, 4], DType::F32);
        assert!(matches!(
            tanh_jac(&f(&[3, 2, 4], DType::I64), &f(&[3, 4], DType::I64)),
            Err(Error::UnsupportedDType { .. })
        ));
        assert!(matches!(tanh_jac(&f(&[3, 2, 4], DType::F64), &a), Err(Error::DTypeMismatch { .. })));
        assert!(matches!(tanh_jac(&f(&[3, 2, 5], DType::F32), &a), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(tanh_jac(&f(&[2, 2, 4], DType::F32), &a), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(tanh_jac(&f(&[3, 4], DType::F32), &a), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(
            tanh_jac(&f(&[3, 2, 4], DType::F32), &f(&[3, 1, 4], DType::F32)),
            Err(Error::InvalidShape { .. })
        ));
    }
}
