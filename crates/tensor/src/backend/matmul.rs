//! The matrix products' seam: the plan of a product ([`MatmulPlan`]), what
//! a fused linear sum applies to its result ([`Epilogue`]), and the
//! kernels every device implements ([`MatmulKernels`]). The ops, their
//! shape rule and derivatives are [`crate::ops::matmul`]'s.

use super::Src;
use crate::storage::Storage;
use crate::{Result, Shape};

/// The shapes of a product `[..., m, k] @ [..., k, n]`: checked once, for
/// every device.
#[derive(Debug, Clone, PartialEq)]
pub struct MatmulPlan {
    /// The operands' batch dims, broadcast.
    pub batch: Shape,
    /// Rows of the left operand and of the output.
    pub m: usize,
    /// The inner dimension.
    pub k: usize,
    /// Columns of the right operand and of the output.
    pub n: usize,
    /// The output's shape: `batch` then `[m, n]`.
    pub shape: Shape,
}

/// What a fused linear sum applies to `a_1 @ b_1 + ... + bias`.
#[derive(Clone, Copy)]
pub enum Epilogue<'a> {
    /// The sum itself.
    Nothing,
    /// `tanh(sum)`.
    Tanh,
    /// `sum * (1 - h^2)` for `h` of the sum's shape.
    TanhBackward(Src<'a>),
}

/// The matrix products' kernels; every output is a new contiguous buffer.
pub trait MatmulKernels {
    /// `a @ b` at the plan's shape, batch dims broadcast; the operands
    /// share a float dtype (the op checked), f16 and bf16 accumulate in f32.
    fn matmul(&self, plan: &MatmulPlan, a: Src<'_>, b: Src<'_>) -> Result<Storage>;
    /// `then(a_1 @ b_1 + a_2 @ b_2 + ... + bias)` as one job writing one
    /// `[m, n]` buffer, for matrices the op checked fit (`[m, k_i] @ [k_i,
    /// n]` in one dtype, the bias `[n]`, `h` `[m, n]`), or `None` where
    /// this device has no such job for these operands (the op then
    /// composes the sum from its ops).
    fn linear_sum(
        &self,
        terms: &[(Src<'_>, Src<'_>)],
        bias: Option<Src<'_>>,
        then: Epilogue<'_>,
        dims: (usize, usize),
    ) -> Result<Option<Storage>>;
}
