//! tapir-autograd: graphs that live in an arena and are freed, whole, when
//! their scope ends — including the graphs built for higher derivatives.
//!
//! ```
//! use tapir::prelude::*;
//!
//! // d²/dx² of x³ at x = 2 is 12; only a plain tensor leaves the scope.
//! let h = Graph::scope(|g| {
//!     let x = g.leaf(Tensor::from_vec(vec![2.0f64], [1])?);
//!     let y = x.powf(3.0)?.sum_all()?;
//!     let dy = g.grad_graph(y, &[x])?[0];
//!     Ok::<_, Error>(g.grad(dy.sum_all()?, &[x])?.remove(0))
//! })?;
//! assert_eq!(h.to_vec::<f64>()?, vec![12.0]);
//! # Ok::<(), Error>(())
//! ```
//!
//! The rules themselves live beside each op in tapir-tensor; this crate holds
//! no per-op code.
#![deny(missing_docs)]

mod backward;
mod checkpoint;
mod forward;
mod gradcheck;
mod graph;
mod operators;

pub use backward::GradOptions;
pub use gradcheck::{check_grads, CheckError, CheckFn, CheckOptions};
pub use graph::{Graph, NodeId, Var};
