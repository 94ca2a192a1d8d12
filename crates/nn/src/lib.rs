//! tapir-nn: parameters, layers, losses, optimizers and initialisers for
//! training loops written natively in Rust.
//!
//! - [`ParamStore`]: named parameters, plain tensors; [`ParamStore::bind`]
//!   brings them into a graph scope as leaves and [`Bound::grads`] returns
//!   the gradients as values keyed by parameter.
//! - Layers hold parameter ids and run on a [`Bound`]: [`Linear`], [`Mlp`],
//!   [`Embedding`], [`LayerNorm`], [`RmsNorm`], [`Dropout`] (seeded),
//!   [`CausalSelfAttention`], [`Block`] and [`Gpt`].
//! - Three ops of their own, each a fused form of a composition with its
//!   derivative rules beside it: [`Affine`] (linear + bias + residual;
//!   [`LowPrecisionAffine`] for mixed precision, its casts temporaries),
//!   [`NormOp`] and [`CausalSoftmax`] (the causal mask without a mask tensor).
//! - Losses in [`loss`]; [`Sgd`] and [`Adam`] (AdamW) with [`Schedule`]s;
//!   seeded [`init`]; safetensors [`checkpoint`]s, written atomically;
//!   seeded shuffling and batching in [`DataLoader`].
//! - Devices: layers initialise on the host from the caller's `Rng` and
//!   [`ParamStore::to_device`] moves a model, so it holds the same values
//!   on every device. The layers and fused ops run on CUDA tensors, the
//!   optimizers update a CUDA parameter with one kernel launch (the CPU's
//!   arithmetic, bit for bit) and keep its state beside it, and
//!   checkpoints load onto the device of the store they fill.
//! - Past one device, [`dist`]: a `Communicator` over MPI (CPU ranks, the
//!   `mpi` feature) or NCCL (CUDA devices, the `nccl` feature: one thread
//!   per GPU with `Communicator::nccl_devices`, the gradients reduced in
//!   place on each device), `DataParallel` after PyTorch's DDP and
//!   `ShardedAdam` (ZeRO stage 1). Without a GPU the NCCL path runs on the
//!   emulated devices (`TAPIR_CUDA=emulated TAPIR_CUDA_EMU_DEVICES=2`) and
//!   the emulator's NCCL stand-in: `cargo test -p tapir-nn --test nccl`.
//!
//! ```
//! use tapir::prelude::*;
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

mod affine;
pub mod amp;
mod attention;
mod backend;
pub mod checkpoint;
mod cpu;
mod cuda;
mod data;
mod dispatch;
pub mod dist;
mod gpt;
pub mod init;
mod jet;
mod layers;
mod lbfgs;
pub mod loss;
mod norm;
mod optim;
mod params;
mod precision;

pub use affine::{affine, affine_with, low_precision_affine, Affine, LowPrecisionAffine};
pub use amp::{GradScaler, Precision};
pub use attention::{causal_attention, causal_softmax, CausalAttention, CausalSelfAttention, CausalSoftmax};
pub use checkpoint::{Checkpoint, CheckpointError, Mismatch};
pub use data::{DataLoader, Epoch};
pub use gpt::{Block, Gpt, GptConfig};
pub use jet::{tanh_jac, tanh_jet, Jet, TanhJac, TanhJet};
pub use layers::{Activation, Dropout, Embedding, Linear, Mlp};
pub use lbfgs::{Lbfgs, LbfgsStep, LineSearch};
pub use loss::mse;
pub use norm::{norm, LayerNorm, NormOp, RmsNorm};
pub use optim::{Adam, Optimizer, OptimizerState, Schedule, Sgd};
pub use params::{Bound, Grads, ParamId, ParamStore};
