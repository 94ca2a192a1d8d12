//! `tapir pinn` (being written).

/// Arguments of `tapir pinn`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {}

/// Runs the command.
pub fn run(_a: Args) -> anyhow::Result<()> {
    Ok(())
}
