//! The method traits users call, one file per op family, each
//! implemented for every [`Diff`](crate::ops::Diff) value: `x.tanh()?`
//! reads the same on a [`Tensor`](crate::Tensor) and on a graph handle.
//! Above every family (a method may compose several), below the rules.

pub mod binary;
pub mod cross_entropy;
pub mod index;
pub mod matmul;
pub mod reduce;
pub mod shape;
pub mod softmax;
pub mod unary;

pub use binary::BinaryOps;
pub use cross_entropy::CrossEntropyOps;
pub use index::IndexOps;
pub use matmul::MatmulOps;
pub use reduce::ReduceOps;
pub use shape::ShapeOps;
pub use softmax::SoftmaxOps;
pub use unary::UnaryOps;
