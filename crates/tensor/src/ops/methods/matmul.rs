//! The matrix product (`ops/matmul.rs`) and a linear layer as methods of
//! every [`Diff`] value.

use crate::ops::matmul::Matmul;
use crate::ops::methods::binary::BinaryOps;
use crate::ops::methods::shape::ShapeOps;
use crate::ops::op::Diff;
use crate::{Error, Result};

/// Matrix products, on tensors and graph handles alike.
pub trait MatmulOps: Diff {
    /// torch.matmul: 1-D operands are promoted to matrices and the added
    /// axis removed afterwards; batch dims broadcast.
    fn matmul(&self, o: &Self) -> Result<Self> {
        let (ra, rb) = (self.rank(), o.rank());
        let mismatch = || Error::ShapeMismatch { op: "matmul", lhs: Box::new(self.shape()), rhs: Box::new(o.shape()) };
        if ra == 0 || rb == 0 {
            return Err(mismatch());
        }
        // Check the inner dims here, so the error names the shapes the user
        // passed rather than the promoted ones.
        let (sa, sb) = (self.shape(), o.shape());
        if sa.dims()[ra - 1] != sb.dims()[rb.saturating_sub(2)] {
            return Err(mismatch());
        }
        let a = if ra == 1 { self.unsqueeze(0)? } else { self.clone() };
        let b = if rb == 1 { o.unsqueeze(-1)? } else { o.clone() };
        let mut y = Self::apply(Matmul, &[&a, &b])?;
        // y is [..., m, n]; drop the promoted row axis first, so that for
        // vector . vector the promoted column axis is then last.
        if ra == 1 {
            y = y.squeeze(-2)?;
        }
        if rb == 1 {
            y = y.squeeze(-1)?;
        }
        Ok(y)
    }
    /// `x @ w^T + b`, the affine map of a linear layer (`w` is `[out, in]`).
    fn linear(&self, w: &Self, b: Option<&Self>) -> Result<Self> {
        let y = self.matmul(&w.t()?)?;
        match b {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }
}

impl<T: Diff> MatmulOps for T {}
