//! Losses, generic over tensors and graph values. The cross-entropies are
//! the fused ops of tapir-tensor (no one-hot, and for the linear form no
//! full logits); they are re-exported here so a training loop finds every
//! loss in one place.

use tapir_tensor::{BinaryOps, Diff, Error, ReduceOps, Result, Tensor, UnaryOps};

pub use tapir_tensor::ops::{CrossEntropyOps, CrossEntropyOptions, Reduction};

/// Mean squared error `mean((pred - target)^2)` (torch's mse_loss). The
/// shapes must be equal: a silent broadcast of `[N]` against `[N, 1]` is
/// a classic bug, so it is an error here.
pub fn mse<T: Diff>(pred: &T, target: &T) -> Result<T> {
    if pred.shape() != target.shape() {
        return Err(Error::ShapeMismatch { op: "mse", lhs: Box::new(pred.shape()), rhs: Box::new(target.shape()) });
    }
    pred.sub(target)?.square()?.mean_all()
}

/// Cross-entropy of logits `[..., V]` against integer labels `[...]`, with
/// torch's defaults (mean over rows, ignore_index -100).
pub fn cross_entropy<T: Diff>(logits: &T, labels: &Tensor) -> Result<T> {
    logits.sparse_cross_entropy(labels)
}
