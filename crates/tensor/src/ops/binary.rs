//! Elementwise functions of two tensors with numpy/torch broadcasting,
//! comparisons (masks) and `where`.
//!
//! Operands of different dtypes are promoted as torch promotes them
//! ([`DType::promote`]). Each op checks and promotes its operands once, for
//! every device, and hands the device's
//! [`BinaryKernels`](crate::backend::BinaryKernels) the plan and the operands.
//! Their derivatives are in `ops/rules/binary.rs`, their methods (`a.mul(&b)`)
//! in `ops/methods/binary.rs`.

use crate::backend::binary::Rhs;
pub use crate::backend::binary::{Binary, Cmp};
use crate::backend::Backend;
use crate::ops::op::{check_pair, forward, result_dtype, Arity, Op};
use crate::ops::shape::Cast;
use crate::{DType, Result, Shape, Tensor};

impl Op for Binary {
    fn name(&self) -> &'static str {
        Binary::name(*self)
    }
    fn arity(&self) -> Arity {
        Arity::exactly(2)
    }
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let (a, b, shape) = self.operands_of(xs)?;
        Ok(Tensor::from_storage(backend.binary(*self, a.src(), b.src(), &shape)?, shape))
    }
}

/// Comparison of two tensors (broadcasting) or of a tensor with a scalar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Compare {
    /// The test.
    pub cmp: Cmp,
    /// Compare against this scalar instead of a second tensor.
    pub scalar: Option<f64>,
}

impl Op for Compare {
    fn name(&self) -> &'static str {
        self.cmp.name()
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1 + self.scalar.is_none() as usize)
    }
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let a = xs[0];
        let (a, b, shape) = match self.scalar {
            Some(s) if a.dtype().is_int() => {
                // torch promotes an int tensor compared with a float scalar
                // (tensor([0]) < 0.5 is true); rounding the scalar to the int
                // dtype would not. f64 holds every i32 (and i64 below 2^53);
                // the mask goes back to the integer dtype.
                let wide = forward(&Cast(DType::F64), &[a])?;
                let mask = backend.compare(self.cmp, wide.src(), Rhs::Scalar(s), a.shape())?;
                let mask = Tensor::from_storage(mask, a.shape().clone());
                return forward(&Cast(a.dtype()), &[&mask]);
            }
            Some(s) => {
                return Ok(Tensor::from_storage(
                    backend.compare(self.cmp, a.src(), Rhs::Scalar(s), a.shape())?,
                    a.shape().clone(),
                ))
            }
            None => {
                let shape = check_pair(self.name(), a, xs[1])?;
                let (a, b) = promote_pair(a, xs[1])?;
                (a, b, shape)
            }
        };
        Ok(Tensor::from_storage(backend.compare(self.cmp, a.src(), Rhs::Operand(b.src()), &shape)?, shape))
    }
}

/// `where(mask, a, b)`: `a` where the mask is non-zero, else `b`, all three
/// broadcast together. The mask is a constant of the op.
#[derive(Debug, Clone)]
pub struct Where {
    /// Non-zero selects the first operand.
    pub mask: Tensor,
}

impl Op for Where {
    fn name(&self) -> &'static str {
        "where"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(2)
    }
    fn operands(&self) -> smallvec::SmallVec<[&Tensor; 2]> {
        smallvec::smallvec![&self.mask]
    }
    fn run(&self, backend: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        let ab = check_pair("where", xs[0], xs[1])?;
        let shape = Shape::broadcast("where", &ab, self.mask.shape())?;
        let (a, b) = promote_pair(xs[0], xs[1])?;
        Ok(Tensor::from_storage(backend.select(self.mask.src(), a.src(), b.src(), &shape)?, shape))
    }
}

impl Binary {
    /// The operands in their common dtype, and the broadcast shape.
    /// Integers divide as torch's `/` does, in float32 (true division).
    fn operands_of(self, xs: &[&Tensor]) -> Result<(Tensor, Tensor, Shape)> {
        let shape = check_pair(self.name(), xs[0], xs[1])?;
        let (a, b) = promote_pair(xs[0], xs[1])?;
        if self == Binary::Div && a.dtype().is_int() {
            let f = |x: &Tensor| forward(&Cast(DType::F32), &[x]);
            return Ok((f(&a)?, f(&b)?, shape));
        }
        Ok((a, b, shape))
    }
}

/// Both operands in their promoted dtype ([`DType::promote`]); handles
/// on the operands themselves when their dtypes already agree.
pub(crate) fn promote_pair(a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    let dtype = result_dtype(a, b);
    // Through the cast op, so the cast runs on the operands' device.
    let to = |x: &Tensor| if x.dtype() == dtype { Ok(x.clone()) } else { forward(&Cast(dtype), &[x]) };
    Ok((to(a)?, to(b)?))
}

/// This family's ops, each once (see [`crate::ops::registry`]).
pub(crate) fn family() -> Vec<Box<dyn crate::ops::op::DynOp>> {
    let mut ops: Vec<Box<dyn crate::ops::op::DynOp>> =
        Binary::ALL.iter().map(|&b| Box::new(b) as Box<dyn crate::ops::op::DynOp>).collect();
    ops.extend(Cmp::ALL.iter().map(|&cmp| Box::new(Compare { cmp, scalar: None }) as Box<dyn crate::ops::op::DynOp>));
    ops.push(Box::new(Where { mask: Tensor::scalar(1.0) }));
    ops
}

#[cfg(test)]
mod tests {
    use super::{Binary, Cmp};

    /// As `unary`'s test: no wildcard, so a new variant needs a place.
    fn place(b: Binary) -> usize {
        match b {
            Binary::Add => 0,
            Binary::Sub => 1,
            Binary::Mul => 2,
            Binary::Div => 3,
            Binary::Pow => 4,
            Binary::Maximum => 5,
            Binary::Minimum => 6,
        }
    }

    fn cmp_place(c: Cmp) -> usize {
        match c {
            Cmp::Eq => 0,
            Cmp::Ne => 1,
            Cmp::Lt => 2,
            Cmp::Le => 3,
            Cmp::Gt => 4,
            Cmp::Ge => 5,
        }
    }

    #[test]
    fn all_lists_every_variant_once_in_order() {
        assert_eq!(Binary::ALL.iter().map(|&b| place(b)).collect::<Vec<_>>(), (0..7).collect::<Vec<_>>());
        assert_eq!(Cmp::ALL.iter().map(|&c| cmp_place(c)).collect::<Vec<_>>(), (0..6).collect::<Vec<_>>());
    }
}
