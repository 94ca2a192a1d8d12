//! The `tapir` command's subcommands, as a library so tests can run them
//! at tiny sizes.

pub mod allreduce;
pub mod bench;
pub mod chart;
pub mod device;
pub mod gpt;
pub mod memcheck;
mod memcheck_args;
pub mod memcheck_scale;
pub mod pinn;
pub mod profile;
