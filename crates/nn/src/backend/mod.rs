//! The seam between what this crate's fused ops mean and how a device runs
//! them, as the tensor crate's `backend` is for its op families.
//!
//! An op file (`affine.rs`, `attention.rs`, `jet.rs`, `norm.rs`) checks its
//! inputs once, for every device, into a plan (the kernel's parameters and
//! the dims it needs), and hands the plan and the checked tensors to the
//! kernel trait of its family, implemented by every device: a device
//! missing a family's kernel does not compile. The device is chosen in one
//! place, [`crate::dispatch::backend_for`].
//!
//! A kernel that returns `Ok(None)` says that this device has no fused
//! kernel for the plan (the CUDA norm, say, or an f16 gradient on the
//! CPU); the op then runs its composition of tensor ops, which every
//! device runs. This module imports neither device, and neither device
//! imports an op file.

pub(crate) mod affine;
pub(crate) mod attention;
pub(crate) mod jet;
pub(crate) mod norm;

pub(crate) use affine::{AffineKernels, AffinePlan, LowAffinePlan};
pub(crate) use attention::{AttentionKernels, AttentionPlan, CausalSoftmaxPlan};
pub(crate) use jet::{JetKernels, SumSquaresPlan, TanhJacPlan, TanhJetPlan};
pub(crate) use norm::{NormKernels, NormPlan};

/// A device as this crate's fused ops see it: one kernel trait per family.
/// Implemented by the CPU and the CUDA backends; a family added here is a
/// compile error until both have its kernels.
pub(crate) trait NnBackend: AffineKernels + AttentionKernels + JetKernels + NormKernels + Sync {}
