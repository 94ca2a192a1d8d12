//! The derivatives of the matrix product (`ops/matmul.rs`), and the
//! product sums (`a_1 @ b_1 + a_2 @ b_2 + ... + bias`, then maybe a tanh)
//! that every product rule's tangent and linear layer's rules are written
//! with, composed or as one fused job on plain tensors.

use smallvec::SmallVec;

use crate::backend::Src;
use crate::ops::matmul::{checked, Epilogue, Matmul};
use crate::ops::methods::binary::add_opt;
use crate::ops::methods::matmul::MatmulOps;
use crate::ops::methods::reduce::ReduceOps;
use crate::ops::methods::shape::ShapeOps;
use crate::ops::methods::unary::UnaryOps;
use crate::ops::op::{Derivative, Diff, InputGrads, Saved};
use crate::tensor::backend_for;
use crate::{DType, Result, Shape, Tensor};

impl Derivative for Matmul {
    fn saves(&self) -> Saved {
        Saved::INPUTS
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let (a, b) = (xs[0], xs[1]);
        let ga = g.matmul(&b.t()?)?.sum_to(a.shape())?;
        let gb = a.t()?.matmul(g)?.sum_to(b.shape())?;
        Ok(smallvec::smallvec![Some(ga), Some(gb)])
    }
    fn jvp<T: Diff>(&self, xs: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        product_rule(xs, ts, &|terms| matmul_sum(terms))
    }
    /// The tangent `ta @ b + a @ tb` as one product sum writing one buffer.
    fn jvp_eager(&self, xs: &[&Tensor], _: &Tensor, ts: &[Option<&Tensor>]) -> Result<Option<Tensor>> {
        product_rule(xs, ts, &|terms| fused_linear_sum_then(terms, None, Then::Nothing))
    }
    /// The product's shape, after its checks, for f32 and f64 operands
    /// (whose product has their dtype): a recorded gradient's weight
    /// products (`g^T x`), which a Hessian-vector product only pushes
    /// tangents through, are then computed only if read.
    fn planned(&self, xs: &[&Tensor]) -> Option<Result<(Shape, DType)>> {
        let (a, b) = (xs[0], xs[1]);
        if !matches!(a.dtype(), DType::F32 | DType::F64) {
            return None;
        }
        Some(checked(a, b).map(|plan| (plan.shape, a.dtype())))
    }
    /// `ta @ b + a @ tb` reads no output.
    fn jvp_reads_output(&self) -> bool {
        false
    }
}

/// How a rule adds up its products (composed, or one fused job when eager).
type ProductSum<'a, T> = &'a dyn Fn(&[(&T, &T)]) -> Result<Option<T>>;

/// `ta @ b + a @ tb` over the tangents present.
fn product_rule<T: Diff>(xs: &[&T], ts: &[Option<&T>], sum: ProductSum<'_, T>) -> Result<Option<T>> {
    let (a, b) = (xs[0], xs[1]);
    let mut terms: SmallVec<[(&T, &T); 2]> = SmallVec::new();
    if let Some(t) = ts[0] {
        terms.push((t, b));
    }
    if let Some(t) = ts[1] {
        terms.push((a, t));
    }
    sum(&terms)
}

/// `a_1 @ b_1 + a_2 @ b_2 + ...` (`None` for no terms): the form of every
/// product rule's tangent. See [`linear_sum`].
pub fn matmul_sum<T: Diff>(terms: &[(&T, &T)]) -> Result<Option<T>> {
    linear_sum(terms, None)
}

/// `a_1 @ b_1 + a_2 @ b_2 + ... + bias`, the bias (a row of the output's
/// width) added to every row: a linear layer and its tangent. `None` for no
/// terms (a bias alone has no row count). See [`linear_sum_then`].
pub fn linear_sum<T: Diff>(terms: &[(&T, &T)], bias: Option<&T>) -> Result<Option<T>> {
    linear_sum_then(terms, bias, Then::<T>::Nothing)
}

/// What [`linear_sum_then`] applies to the sum.
pub enum Then<'a, T> {
    /// The sum itself.
    Nothing,
    /// `tanh(sum)`: a tanh layer.
    Tanh,
    /// `h.tanh_backward(sum)`, that is `sum * (1 - h^2)`: the tangent of a
    /// tanh layer whose output is `h`.
    TanhBackward(&'a T),
}

impl<T> Clone for Then<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Then<'_, T> {}

/// `then(a_1 @ b_1 + a_2 @ b_2 + ... + bias)`, the bias broadcast over the
/// rows as `add` would, composed of differentiable ops (`matmul`, `add`,
/// `tanh` or `tanh_backward`): the form recorded rules use. `None` for no
/// terms.
///
/// On plain tensors, [`fused_linear_sum_then`] computes the same as one
/// split job when every operand is a 2-D CPU f32/f64 matrix (`h` of the
/// sum's shape, contiguous, the bias `[n]`): each thread computes every
/// term, the bias and `then` for its own rows (gemm adds each product into
/// the block, `then` runs while the rows are in that core's cache), so
/// there is no temporary product, no separate pass, and no row moves
/// between cores.
pub fn linear_sum_then<T: Diff>(terms: &[(&T, &T)], bias: Option<&T>, then: Then<'_, T>) -> Result<Option<T>> {
    let mut acc: Option<T> = None;
    for (a, b) in terms {
        acc = add_opt(acc, Some(a.matmul(b)?))?;
    }
    let Some(sum) = add_opt(acc, bias.cloned())? else { return Ok(None) };
    Ok(Some(match then {
        Then::Nothing => sum,
        Then::Tanh => sum.tanh()?,
        Then::TanhBackward(h) => h.tanh_backward(&sum)?,
    }))
}

/// [`linear_sum_then`] on plain tensors, as one split job writing one
/// buffer where it applies (see there), composed otherwise: the form eager
/// rules and forward kernels use.
pub fn fused_linear_sum_then(
    terms: &[(&Tensor, &Tensor)],
    bias: Option<&Tensor>,
    then: Then<'_, Tensor>,
) -> Result<Option<Tensor>> {
    if terms.is_empty() {
        return Ok(None);
    }
    if terms.len() > 1 || bias.is_some() || !matches!(then, Then::Nothing) {
        if let Some((m, n)) = linear_fits(terms, bias, then) {
            let srcs: SmallVec<[(Src<'_>, Src<'_>); 2]> = terms.iter().map(|(a, b)| (a.src(), b.src())).collect();
            let epilogue = match then {
                Then::Nothing => Epilogue::Nothing,
                Then::Tanh => Epilogue::Tanh,
                Then::TanhBackward(h) => Epilogue::TanhBackward(h.src()),
            };
            let backend = backend_for(terms[0].0.device());
            if let Some(out) = backend.linear_sum(&srcs, bias.map(Tensor::src), epilogue, (m, n))? {
                return Ok(Some(Tensor::from_storage(out, Shape::from([m, n]))));
            }
        }
    }
    linear_sum_then(terms, bias, then)
}

/// The output's `(m, n)` when every operand of a fused linear sum is a
/// matrix of one dtype and device that fits (`[m, k_i] @ [k_i, n]`, the
/// bias `[n]`, `h` `[m, n]`), else `None` (the sum is then composed, and
/// its ops report what does not fit).
fn linear_fits(terms: &[(&Tensor, &Tensor)], bias: Option<&Tensor>, then: Then<'_, Tensor>) -> Option<(usize, usize)> {
    let (a0, b0) = terms[0];
    let (dtype, device) = (a0.dtype(), a0.device());
    let (m, n) = (a0.dims().first().copied()?, b0.dims().get(1).copied()?);
    let alike = |t: &Tensor| t.dtype() == dtype && t.device() == device;
    let fits = terms.iter().all(|(a, b)| {
        [a, b].iter().all(|t| t.rank() == 2 && alike(t))
            && a.dims()[0] == m
            && b.dims()[1] == n
            && a.dims()[1] == b.dims()[0]
    }) && bias.is_none_or(|b| alike(b) && b.dims() == [n])
        && match then {
            Then::TanhBackward(h) => alike(h) && h.dims() == [m, n],
            _ => true,
        };
    fits.then_some((m, n))
}
