//! Forward-Laplacian propagation through an MLP: the value, the Jacobian
//! with respect to the input points and the (partial) Laplacian are pushed
//! through the network together, layer by layer, in one forward pass. All of
//! it is recorded, so a loss on the Laplacian trains the network.
//!
//! For `d` input dims this costs about `d + 2` forward passes of matrix
//! work, and nothing of it is a backward pass, against `d` Hessian-vector
//! products (each a forward and two backward passes) for nested autodiff.

use tapir_autograd::Var;
use tapir_tensor::{BinaryOps, Diff, Error, MatmulOps, ReduceOps, Result, ShapeOps, Tensor, UnaryOps};

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
                let d1 = a.square()?.rsub_scalar(1.0)?;
                let d2 = a.mul(&d1)?.mul_scalar(-2.0)?;
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
            return Err(Error::InvalidShape { op: "forward_jet", shape: xs, reason: "points must be [N, d]".into() });
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
        let sel = p.graph().constant(Tensor::from_vec(sel, [1, d, 1])?.cast(x.dtype())?);
        // sum over the selected dims of J^2: [N, d, w] -> [N, w].
        let sum_sq = |j: &Var<'g>| -> Result<Var<'g>> {
            let sq = j.square()?;
            if all {
                sq.sum(&[1], false)
            } else {
                sq.mul(&sel)?.sum(&[1], false)
            }
        };

        let mut h = x;
        let mut jac: Option<Var<'g>> = None; // [N, d, w]; None = the identity
        let mut lap: Option<Var<'g>> = None; // [N, w];   None = zero
        for (k, layer) in self.layers.iter().enumerate() {
            let w = p.var(layer.weight); // [out, in]
            let out = w.shape().dims()[0];
            h = layer.forward(p, h)?;
            jac = Some(match jac {
                // d(x W^T)/dx = W^T for every point.
                None => w.t()?.unsqueeze(0)?.broadcast_to([n, d, out])?,
                Some(j) => {
                    let width = j.shape().dims()[2];
                    j.reshape([n * d, width])?.matmul(&w.t()?)?.reshape([n, d, out])?
                }
            });
            lap = match lap {
                None => None,
                Some(l) => Some(l.matmul(&w.t()?)?),
            };
            if k + 1 < self.layers.len() {
                let a = self.activation.apply(&h)?;
                let (d1, d2) = self.activation.derivatives(&h, &a)?;
                let j = jac.take().expect("internal: set above");
                let jsq = if k == 0 {
                    // The first layer's Jacobian is W^T for every point: sum
                    // its squares once, as [w], instead of over [N, d, w].
                    let wsq = p.var(layer.weight).square()?;
                    if all {
                        wsq.sum(&[1], false)?
                    } else {
                        wsq.mul(&sel.reshape([1, d])?)?.sum(&[1], false)?
                    }
                } else {
                    sum_sq(&j)?
                };
                let curv = d2.mul(&jsq)?;
                lap = Some(match lap {
                    None => curv,
                    Some(l) => l.mul(&d1)?.add(&curv)?,
                });
                jac = Some(j.mul(&d1.unsqueeze(1)?)?);
                h = a;
            }
        }
        let jacobian = jac.ok_or_else(|| Error::invalid_arg("forward_jet", "the network has no layers"))?;
        let out = h.shape().dims()[1];
        let laplacian = match lap {
            Some(l) => l,
            None => p.graph().constant(Tensor::zeros([n, out], x.dtype())?),
        };
        Ok(Jet { value: h, jacobian, laplacian })
    }
}
