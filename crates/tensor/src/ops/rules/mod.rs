//! Each op family's [`Derivative`](crate::ops::Derivative): its VJP and
//! JVP rules, written once, generically over
//! [`Diff`](crate::ops::Diff), in the differentiable ops of
//! `ops/methods/`, so the same rule runs eagerly and recorded, to any
//! order. Above every family and every method trait; a family's forward
//! never needs them.

pub mod binary;
pub mod cross_entropy;
pub mod index;
pub mod matmul;
pub mod reduce;
pub mod shape;
pub mod softmax;
pub mod unary;
