//! tapir-nn: layers, losses, optimizers and checkpoints (in progress).
#![deny(missing_docs)]

pub use tapir_autograd;
