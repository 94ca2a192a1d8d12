//! Matrix products: `matmul` (2-D and batched, broadcasting batch dims).
//! Each device runs them through its
//! [`MatmulKernels`](crate::backend::MatmulKernels). The product rule, and
//! the product sums the rules of linear layers are written with, are in
//! `ops/rules/matmul.rs`; the methods (`a.matmul(&b)`) in
//! `ops/methods/matmul.rs`.

pub use crate::backend::matmul::{Epilogue, MatmulPlan};
use crate::backend::Backend;
use crate::ops::op::{Arity, Op};
use crate::{Error, Result, Shape, Tensor};

/// `a @ b` for rank >= 2 operands: `[..., m, k] @ [..., k, n]`.
#[derive(Debug, Clone, Copy)]
pub struct Matmul;

/// The checks every device makes, in one order, so a bad product is the
/// same error everywhere (the dtypes, the shapes, the output's size, a
/// float dtype), and the product's plan.
pub(crate) fn checked(a: &Tensor, b: &Tensor) -> Result<MatmulPlan> {
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch { op: "matmul", lhs: a.dtype(), rhs: b.dtype() });
    }
    let mismatch =
        || Error::ShapeMismatch { op: "matmul", lhs: Box::new(a.shape().clone()), rhs: Box::new(b.shape().clone()) };
    if a.rank() < 2 || b.rank() < 2 {
        return Err(mismatch());
    }
    let (ra, rb) = (a.rank(), b.rank());
    let (m, k) = (a.dims()[ra - 2], a.dims()[ra - 1]);
    let (k2, n) = (b.dims()[rb - 2], b.dims()[rb - 1]);
    if k != k2 {
        return Err(mismatch());
    }
    let batch = Shape::broadcast("matmul", &Shape::from(&a.dims()[..ra - 2]), &Shape::from(&b.dims()[..rb - 2]))
        .map_err(|_| mismatch())?;
    let mut shape = batch.clone();
    shape.0.push(m);
    shape.0.push(n);
    shape.check("matmul", a.dtype())?;
    if !a.dtype().is_float() {
        return Err(Error::UnsupportedDType { op: "matmul", dtype: a.dtype(), expected: "a float dtype" });
    }
    Ok(MatmulPlan { batch, m, k, n, shape })
}

impl Op for Matmul {
    fn name(&self) -> &'static str {
        "matmul"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(2)
    }
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let plan = checked(xs[0], xs[1])?;
        let out = backend.matmul(&plan, xs[0].src(), xs[1].src())?;
        Ok(Tensor::from_storage(out, plan.shape))
    }
}

/// This family's ops, each once (see [`crate::ops::registry`]).
pub(crate) fn family() -> Vec<Box<dyn crate::ops::op::DynOp>> {
    vec![Box::new(Matmul)]
}
