//! tapir: a pure-Rust autograd engine whose graphs cannot leak.
//!
//! Every graph lives in an arena that [`Graph::scope`] frees, whole, when
//! its closure returns, including the graphs built for higher-order
//! derivatives; only plain [`Tensor`]s leave it. Gradients come back as
//! values, never stored on parameters.
//!
//! This crate is the facade. It re-exports the three crates that do the
//! work, each as a module:
//!
//! - [`tensor`]: [`Tensor`], [`DType`], [`Device`], every op (as methods of
//!   the traits in [`prelude`]), and exact memory accounting
//!   ([`memory_stats`]);
//! - [`autograd`]: [`Graph`] and [`Var`], reverse and forward mode to any
//!   order ([`Graph::grad`], [`Graph::grad_graph`], [`Graph::jvp`],
//!   [`Graph::hvp`], [`Graph::laplacian`]...), and the gradient checker;
//! - [`nn`]: [`ParamStore`](nn::ParamStore), layers ([`Linear`](nn::Linear),
//!   [`Mlp`](nn::Mlp), attention, norms), losses, optimizers
//!   ([`Adam`](nn::Adam), [`Sgd`](nn::Sgd), [`Lbfgs`](nn::Lbfgs)), a
//!   [`DataLoader`](nn::DataLoader), and safetensors
//!   [`checkpoint`](nn::checkpoint)s.
//!
//! `use tapir::prelude::*;` brings in everything a training loop or a PDE
//! residual needs.
//!
//! # A second derivative, returned as a tensor
//!
//! ```
//! use tapir::prelude::*;
//!
//! let x0 = Tensor::from_vec(vec![0.0f64, 0.5, 1.0], [3])?;
//! let d2 = Graph::scope(|g| {
//!     let x = g.leaf(x0.clone());
//!     let dy = g.grad_graph(x.tanh()?.sum_all()?, &[x])?[0]; // recorded: differentiable again
//!     Ok::<_, Error>(g.grad(dy.sum_all()?, &[x])?.remove(0)) // a plain tensor leaves the scope
//! })?; // every node of both graphs is freed here
//! let t = 0.5f64.tanh();
//! assert!((d2.to_vec::<f64>()?[1] - (-2.0 * t * (1.0 - t * t))).abs() < 1e-12);
//! # Ok::<(), Error>(())
//! ```
//!
//! # A training step
//!
//! ```
//! use tapir::prelude::*;
//!
//! let mut rng = Rng::new(0);
//! let mut store = ParamStore::new();
//! let net = Mlp::new(&mut store, "net", &[2, 16, 3], Activation::Relu, &mut rng, DType::F32)?;
//! let mut opt = Adam::new(1e-2);
//! let x = rng.randn([64, 2], DType::F32)?;
//! let y = rng.randint([64], 3, DType::I64)?;
//! let loader = DataLoader::new(&[&x, &y], 16)?.shuffle(1);
//! for epoch in 0..3 {
//!     for batch in loader.epoch(epoch) {
//!         let batch = batch?;
//!         // The step's graph lives exactly as long as this scope.
//!         let (loss, grads) = Graph::scope(|g| {
//!             let p = store.bind(g);
//!             let loss = net.forward(&p, g.constant(batch[0].clone()))?.sparse_cross_entropy(&batch[1])?;
//!             Ok::<_, Error>((loss.item()?, p.grads(loss)?))
//!         })?;
//!         opt.step(&mut store, &grads)?;
//!         assert!(loss.is_finite());
//!     }
//! }
//! # Ok::<(), Error>(())
//! ```
//!
//! # Parameters and checkpoints
//!
//! A [`ParamStore`](nn::ParamStore) holds named plain tensors; a layer
//! holds ids into it, so a model is plain data that outlives every scope.
//! [`ParamStore::bind`](nn::ParamStore::bind) brings the parameters into a
//! scope as leaves, and [`Bound::grads`](nn::Bound::grads) returns their
//! gradients as values keyed by id. A checkpoint is a safetensors file of
//! the parameters under their names, the optimizer's state, and your
//! metadata, written atomically; loading checks every name, shape and
//! dtype before it changes anything.
//!
//! ```
//! use std::collections::BTreeMap;
//! use tapir::prelude::*;
//!
//! let mut rng = Rng::new(0);
//! let mut store = ParamStore::new();
//! let layer = Linear::new(&mut store, "fc", 3, 2, true, &mut rng, DType::F32)?;
//! assert_eq!((store.len(), store.numel()), (2, 3 * 2 + 2));
//! assert_eq!(store.name(layer.weight), "fc.weight");
//!
//! let x = rng.randn([4, 3], DType::F32)?;
//! let mut opt = Sgd::with_momentum(0.1, 0.9, false);
//! let grads = Graph::scope(|g| {
//!     let p = store.bind(g);
//!     let loss = layer.forward(&p, g.constant(x.clone()))?.square()?.mean_all()?;
//!     p.grads(loss)
//! })?;
//! assert_eq!(grads.get(layer.weight).dims(), &[2, 3]);
//! opt.step(&mut store, &grads)?;
//!
//! let path = std::env::temp_dir().join(format!("tapir-doc-{}.safetensors", std::process::id()));
//! let meta = BTreeMap::from([("epoch".to_string(), "1".to_string())]);
//! checkpoint::save(&path, &store, Some(&opt), &meta)?;
//!
//! // A fresh model of the same shape, and a fresh optimizer, resume from it.
//! let mut restored = ParamStore::new();
//! Linear::new(&mut restored, "fc", 3, 2, true, &mut Rng::new(99), DType::F32)?;
//! let mut opt2 = Sgd::with_momentum(0.1, 0.9, false);
//! let meta2 = checkpoint::load(&path, &mut restored, Some(&mut opt2))?;
//! assert_eq!(meta2["epoch"], "1");
//! assert_eq!(restored.get(layer.weight).to_vec::<f32>()?, store.get(layer.weight).to_vec::<f32>()?);
//!
//! // A model of another shape is refused, naming what differs.
//! let mut other = ParamStore::new();
//! Linear::new(&mut other, "fc", 4, 2, true, &mut rng, DType::F32)?;
//! let err = checkpoint::load(&path, &mut other, None).unwrap_err();
//! assert!(err.to_string().contains("fc.weight"));
//! std::fs::remove_file(&path).ok();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Memory statistics
//!
//! Every tensor storage is counted, per device, with the semantics of
//! `torch.cuda.memory_allocated`, `max_memory_allocated` and
//! `reset_peak_memory_stats`. A scope gives back exactly what it took:
//!
//! ```
//! use tapir::prelude::*;
//!
//! let x0 = Tensor::ones([1024], DType::F32)?; // 4 KiB
//! let before = memory_stats(Device::Cpu);
//! reset_peak_memory_stats(Device::Cpu);
//! let d2 = Graph::scope(|g| {
//!     let x = g.leaf(x0.clone());
//!     let dy = g.grad_graph(x.tanh()?.sum_all()?, &[x])?[0];
//!     Ok::<_, Error>(g.grad(dy.sum_all()?, &[x])?.remove(0))
//! })?;
//! let after = memory_stats(Device::Cpu);
//! // Only the returned 4 KiB second derivative is still live; the graphs
//! // (of both orders) took more at their peak and gave it all back.
//! assert_eq!(after.allocated, before.allocated + d2.storage_bytes());
//! assert!(after.peak > after.allocated);
//! # Ok::<(), Error>(())
//! ```
//!
//! # Where things run
//!
//! Every op runs on the CPU and on CUDA: [`Device::cuda`] gives a device
//! with a caching allocator (the same [`memory_stats`] counters),
//! `to_device` copies both ways, and autograd, the nn layers, losses,
//! optimizers and checkpoints run unchanged on CUDA tensors; kernels are
//! compiled from CUDA C by NVRTC at first use. The CUDA path is tested on an
//! emulated device (`TAPIR_CUDA=emulated`; the README's "CUDA without a
//! GPU" section gives the commands), which checks correctness, not speed;
//! it has not yet been run on a real GPU. Without a driver (and without the
//! emulator selected), [`Device::cuda`] is
//! [`Error::DeviceUnavailable`] (never a panic), saying what is missing,
//! and [`Device::best`] picks the CPU.
//!
//! ```
//! use tapir::prelude::*;
//!
//! let device = Device::best(); // CUDA 0 when it can be used, else the CPU
//! let x = Tensor::ones([2, 3], DType::F32)?.to_device(device)?;
//! assert_eq!(x.sum_all()?.item()?, 6.0);
//! match Device::cuda(7) {
//!     Ok(d) => println!("{d}"),
//!     Err(e) => assert!(matches!(e, Error::DeviceUnavailable { .. }), "{e}"),
//! }
//! # Ok::<(), Error>(())
//! ```
//!
//! # Errors
//!
//! One error type, [`Error`], names the op and the values that failed.
//! The other errors of the API convert into it, so `?` works in a function
//! returning [`Result`]: a checkpoint's
//! [`CheckpointError`](nn::checkpoint::CheckpointError) and the gradient
//! checker's [`CheckError`](autograd::CheckError).
//!
//! ```
//! use tapir::prelude::*;
//!
//! fn save_model(store: &ParamStore, path: &std::path::Path) -> Result<()> {
//!     checkpoint::save(path, store, None, &Default::default())?; // CheckpointError -> Error
//!     Ok(())
//! }
//! let missing = std::path::Path::new("/nonexistent-dir/model.safetensors");
//! assert!(matches!(save_model(&ParamStore::new(), missing), Err(Error::Checkpoint { .. })));
//! # Ok::<(), Error>(())
//! ```
#![deny(missing_docs)]

#[doc(inline)]
pub use tapir_autograd as autograd;
#[doc(inline)]
pub use tapir_nn as nn;
#[doc(inline)]
pub use tapir_tensor as tensor;

pub use tapir_autograd::{GradOptions, Graph, Var};
pub use tapir_tensor::{
    buffer_alignment, max_memory_allocated, memory_allocated, memory_stats, reset_peak_memory_stats, AlignedAlloc,
    DType, Device, Error, MemoryStats, Result, Shape, Tensor,
};

/// Everything a training loop or a PDE residual needs in scope: the tensor
/// types and op traits, graphs, and the nn items of a training loop
/// (parameters, layers, losses, optimizers, batches, checkpoints).
pub mod prelude {
    pub use tapir_autograd::{check_grads, CheckOptions, GradOptions, Graph, Var};
    pub use tapir_nn::loss::{cross_entropy, CrossEntropyOptions, Reduction};
    pub use tapir_nn::{
        checkpoint, mse, Activation, Adam, Bound, DataLoader, Dropout, Embedding, Grads, LayerNorm, Lbfgs, Linear, Mlp,
        Optimizer, ParamId, ParamStore, RmsNorm, Schedule, Sgd,
    };
    pub use tapir_tensor::prelude::*;
    pub use tapir_tensor::{max_memory_allocated, MemoryStats};
}

/// The README's examples, compiled and run as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExamples;
