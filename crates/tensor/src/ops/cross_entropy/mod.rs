//! Sparse cross-entropy that never builds a one-hot, and a fused linear +
//! cross-entropy head that never holds the full logits.
//!
//! Seed 000: Keras on PyTorch computed `one_hot(y) * log(softmax(x))` and
//! ran a 40 GiB GPU out of memory. Here the forward takes each row's
//! max-shifted log-sum-exp and saves only that (N floats); the backward
//! writes `softmax - target` straight from the logits and that saved
//! value. Under `create_graph` the rules switch to a differentiable
//! formulation, so second derivatives through the loss (Hessian-vector
//! products of a classifier) work.
//!
//! This folder holds what the losses compute: the label checks and saved
//! values they share (`checks`), the sparse loss (`sparse`) and the fused
//! head (`linear`), each with its checks (once, for every device, into the
//! plans of [`crate::backend::cross_entropy`]). Their derivative rules are
//! in `ops/rules/cross_entropy.rs`, their methods in
//! `ops/methods/cross_entropy.rs`. The
//! kernels are each device's `CrossEntropyKernels`: the CPU's row loops and
//! chunk loop in `cpu/cross_entropy.rs`, the CUDA launches in
//! `cuda/cross_entropy.rs`. This folder imports neither device.

use std::sync::Mutex;

use crate::{DType, Tensor};

pub(crate) mod checks;
pub(crate) mod linear;
pub(crate) mod sparse;

pub use crate::backend::cross_entropy::{CrossEntropyOptions, Reduction};
pub use linear::{auto_chunk, LinearCrossEntropy};
pub use sparse::SparseCrossEntropy;

/// This family's ops, each once (see [`crate::ops::registry`]).
pub(crate) fn family() -> Vec<Box<dyn crate::ops::op::DynOp>> {
    let labels = || Tensor::scalar_of(0.0, DType::I64);
    let options = CrossEntropyOptions::default();
    vec![
        Box::new(SparseCrossEntropy { labels: labels(), options, lse: Mutex::new(None), valid: Mutex::new(None) }),
        Box::new(LinearCrossEntropy {
            labels: labels(),
            options,
            chunk: None,
            precompute: false,
            lse: Mutex::new(None),
            valid: Mutex::new(None),
            grads: Mutex::new(None),
        }),
    ]
}
