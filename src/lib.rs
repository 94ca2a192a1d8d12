//! tapir: a pure-Rust autograd engine whose graphs cannot leak.
//!
//! This crate is the facade: it re-exports [`tensor`] (tensors, ops, memory
//! accounting), [`autograd`] (arena-scoped graphs, derivatives to any order)
//! and [`nn`] (layers, losses, optimizers), and a [`prelude`].
//!
//! ```
//! use tapir::prelude::*;
//!
//! // The second derivative of tanh, returned out of its scope as a plain tensor.
//! let x0 = Tensor::from_vec(vec![0.0f64, 0.5, 1.0], [3])?;
//! let d2 = Graph::scope(|g| {
//!     let x = g.leaf(x0.clone());
//!     let dy = g.grad_graph(x.tanh()?.sum_all()?, &[x])?[0];
//!     Ok::<_, Error>(g.grad(dy.sum_all()?, &[x])?.remove(0))
//! })?;
//! let t = 0.5f64.tanh();
//! assert!((d2.to_vec::<f64>()?[1] - (-2.0 * t * (1.0 - t * t))).abs() < 1e-12);
//! # Ok::<(), Error>(())
//! ```
#![deny(missing_docs)]

pub use tapir_autograd as autograd;
pub use tapir_nn as nn;
pub use tapir_tensor as tensor;

/// Everything a training loop or a PDE residual needs in scope.
pub mod prelude {
    pub use tapir_autograd::{check_grads, CheckOptions, GradOptions, Graph, Var};
    pub use tapir_tensor::prelude::*;
}
