//! Elementwise functions of one tensor.
//!
//! Each function is a variant of [`Unary`] (listed once more in
//! [`Unary::ALL`]) and a name. The op checks its operand once, for every
//! device, and hands the device's [`UnaryKernels`](crate::backend::UnaryKernels)
//! the function and the operand: its CPU kernel is one closure in
//! `cpu/unary.rs`, its CUDA kernel one line of `kernels/elementwise.cu` (named
//! by [`Unary::cuda_kernel`]). Its derivative, one line `dy/dx` in
//! differentiable ops, is in `ops/rules/unary.rs`; its methods (`x.tanh()`) in
//! `ops/methods/unary.rs`.

pub use crate::backend::unary::Unary;
use crate::backend::Backend;
use crate::ops::op::{check_pair, Arity, Op};
use crate::{Error, Result, Tensor};

impl Op for Unary {
    fn name(&self) -> &'static str {
        Unary::name(*self)
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1)
    }
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0];
        let dtype = x.dtype();
        if dtype.is_int() && !Unary::INT_KERNELS.contains(self) {
            return Err(Error::UnsupportedDType { op: self.name(), dtype, expected: "a float dtype" });
        }
        Ok(Tensor::from_storage(backend.unary(*self, x.src())?, x.shape().clone()))
    }
}

/// `g * (1 - y^2)`: tanh's derivative, given its output `y = tanh x`,
/// applied to a gradient or tangent `g` (inputs `y`, `g`, broadcasting).
///
/// As one op this is one pass and one recorded node where the composed line
/// (`square`, `neg`, `add_scalar`, `mul`) is four of each: tanh's VJP and
/// JVP use it, so a gradient recorded under `create_graph` (a Hessian-vector
/// product, a PDE residual's second derivative) holds one node per tanh.
/// Its own rules are written in differentiable ops (itself among them), so
/// any order works:
///
/// - `d/dg`: `gbar * (1 - y^2)`, this op again;
/// - `d/dy`: `-2 y g gbar`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TanhBackward;

impl Op for TanhBackward {
    fn name(&self) -> &'static str {
        "tanh_backward"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(2)
    }
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let shape = check_pair("tanh_backward", xs[0], xs[1])?;
        let dtype = xs[0].dtype();
        if dtype.is_int() {
            return Err(Error::UnsupportedDType { op: "tanh_backward", dtype, expected: "a float dtype" });
        }
        Ok(Tensor::from_storage(backend.tanh_backward(xs[0].src(), xs[1].src(), &shape)?, shape))
    }
}

/// This family's ops, each once (see [`crate::ops::registry`]).
pub(crate) fn family() -> Vec<Box<dyn crate::ops::op::DynOp>> {
    let mut ops: Vec<Box<dyn crate::ops::op::DynOp>> =
        Unary::ALL.iter().map(|&u| Box::new(u) as Box<dyn crate::ops::op::DynOp>).collect();
    ops.push(Box::new(TanhBackward));
    ops
}

#[cfg(test)]
mod tests {
    use super::Unary;

    /// `ALL` is made from the same declaration as the enum, so it lists
    /// every variant; what is left to check is that no two share a name
    /// (the name is the CUDA kernel's and the gradient-check case's).
    #[test]
    fn every_function_has_its_own_name() {
        let mut names: Vec<&str> = Unary::ALL.iter().map(|u| u.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Unary::ALL.len(), "every function has its own name");
    }
}
