//! Forward-Laplacian propagation through an MLP: the value, the Jacobian
//! with respect to the input points and the (partial) Laplacian are pushed
//! through the network together, layer by layer, in one forward pass. All of
//! it is recorded, so a loss on the Laplacian trains the network.
//!
//! For `d` input dims this costs about `d + 2` forward passes of matrix
//! work, and nothing of it is a backward pass, against `d` Hessian-vector
//! products (each a forward and two backward passes) for nested autodiff.

use tapir_autograd::Var;
use tapir_tensor::backend::Backend;
use tapir_tensor::ops::{one, Arity, Derivative, InputGrads, Op, Saved};
use tapir_tensor::{BinaryOps, Diff, Error, MatmulOps, ReduceOps, Result, ShapeOps, Tensor, UnaryOps};

use crate::backend::SumSquaresPlan;
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
        let sel = p.graph().constant(Tensor::from_vec(sel, [1, d, 1])?.cast(x.dtype())?.to_device(x.device())?);
        // sum over the selected dims of J^2: [N, d, w] -> [N, w].
        let sum_sq = |j: &Var<'g>| -> Result<Var<'g>> {
            if all {
                sum_squares_mid(j)
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
                let d1 = if fused {
                    // tanh: d2 = -2 a d1, so `l d1 + d2 jsq` is
                    // `(l - 2 a jsq) d1`, one `tanh_backward` of the
                    // bracket: four elementwise ops where d2, its product
                    // and the sum of the two products took five, and
                    // fewer passes again in the backward.
                    let d1 = a.tanh_backward(&a.full_like_shape((), 1.0)?)?;
                    let s = a.mul(&jsq)?.mul_scalar(-2.0)?;
                    let inner = match lap {
                        None => s,
                        Some(l) => l.add(&s)?,
                    };
                    lap = Some(a.tanh_backward(&inner)?);
                    d1
                } else {
                    let (d1, d2) = self.activation.derivatives(&h, &a)?;
                    let curv = d2.mul(&jsq)?;
                    lap = Some(match lap {
                        None => curv,
                        Some(l) => l.mul(&d1)?.add(&curv)?,
                    });
                    d1
                };
                jac = Some(j.mul(&d1.unsqueeze(1)?)?);
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SumSquaresMid;

/// [`SumSquaresMid`] applied to `x`.
pub fn sum_squares_mid<T: Diff>(x: &T) -> Result<T> {
    T::apply(SumSquaresMid, &[x])
}

/// The plan of `x`, an error unless it is `[N, d, w]`.
fn check_mid(x: &Tensor) -> Result<SumSquaresPlan> {
    match *x.dims() {
        [n, d, w] => Ok(SumSquaresPlan { n, d, w }),
        _ => Err(Error::InvalidShape {
            op: "sum_squares_mid",
            shape: Box::new(x.shape().clone()),
            reason: "needs [N, d, w]".into(),
        }),
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
        let plan = check_mid(xs[0])?;
        match backend_for(xs[0].device()).sum_squares_mid(&plan, xs[0])? {
            Some(y) => Ok(y),
            None => xs[0].square()?.sum(&[1], false),
        }
    }
}

impl Derivative for SumSquaresMid {
    fn saves(&self) -> Saved {
        Saved::input(0)
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        Ok(one(xs[0].mul(&g.unsqueeze(1)?)?.mul_scalar(2.0)?))
    }
    fn jvp<T: Diff>(&self, xs: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        let Some(t) = ts[0] else { return Ok(None) };
        Ok(Some(xs[0].mul(t)?.sum(&[1], false)?.mul_scalar(2.0)?))
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
}
