//! tapir-nn: parameters, layers, losses, optimizers and initialisers for
//! training loops written natively in Rust.
//!
//! ```
//! use tapir_nn::{Activation, Adam, Mlp, Optimizer, ParamStore};
//! use tapir_autograd::Graph;
//! use tapir_tensor::prelude::*;
//!
//! let mut rng = Rng::new(0);
//! let mut store = ParamStore::new();
//! let net = Mlp::new(&mut store, "net", &[2, 16, 1], Activation::Tanh, &mut rng, DType::F32)?;
//! let mut opt = Adam::new(1e-2);
//! let x = rng.randn([32, 2], DType::F32)?;
//! let y = x.sum(&[1], true)?;
//! for _ in 0..5 {
//!     // The step's graph lives exactly as long as this scope.
//!     let grads = Graph::scope(|g| {
//!         let p = store.bind(g);
//!         let loss = net.forward(&p, g.constant(x.clone()))?.sub(&g.constant(y.clone()))?.square()?.mean_all()?;
//!         p.grads(loss)
//!     })?;
//!     opt.step(&mut store, &grads)?;
//! }
//! # Ok::<(), Error>(())
//! ```
#![deny(missing_docs)]

pub mod init;
mod jet;
mod layers;
mod lbfgs;
mod optim;
mod params;

pub use layers::{Activation, Linear, Mlp};
pub use optim::{Adam, Optimizer, Schedule, Sgd};
pub use params::{Bound, Grads, ParamId, ParamStore};
pub use jet::Jet;
pub use lbfgs::{Lbfgs, LbfgsStep};
