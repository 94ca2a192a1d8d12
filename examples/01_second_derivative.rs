//! A second derivative, returned out of its scope as a plain tensor.
//!
//! `d2` differentiates tanh twice: the first gradient is recorded
//! (`grad_graph`, PyTorch's `create_graph=True`) so it can be differentiated
//! again, and only the plain result leaves the scope. Calling it in a loop
//! leaves live memory exactly where it was: the pattern that leaks in
//! PyTorch when the result is returned from a function.
//!
//! Run: `cargo run --release --example 01_second_derivative` (add
//! `-- --device cuda` for CUDA; every example takes `--device`).

use tapir::prelude::*;

mod common;

/// d^2/dx^2 tanh(x) at every point of `x0`, computed by reverse mode twice.
fn d2(x0: &Tensor) -> Result<Tensor> {
    Graph::scope(|g| {
        let x = g.leaf(x0.clone());
        let dy = g.grad_graph(x.tanh()?.sum_all()?, &[x])?[0]; // recorded: differentiable again
        Ok(g.grad(dy.sum_all()?, &[x])?.remove(0)) // a plain tensor leaves the scope
    }) // every node of both graphs is freed here
}

fn main() -> anyhow::Result<()> {
    let device = common::device()?;
    let x = Tensor::from_vec(vec![-2.0f64, -1.0, 0.0, 0.5, 1.0, 2.0], [6])?.to_device(device)?;
    let got = d2(&x)?;
    println!("x           = {x}");
    println!("tanh''(x)   = {got}");
    // tanh'' = -2 tanh (1 - tanh^2).
    let exact: Vec<f64> = x.to_vec::<f64>()?.iter().map(|v| -2.0 * v.tanh() * (1.0 - v.tanh().powi(2))).collect();
    let err = got.to_vec::<f64>()?.iter().zip(&exact).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    println!("max |error| against -2 tanh (1 - tanh^2): {err:.2e}");
    anyhow::ensure!(err < 1e-12, "second derivative is off by {err}");

    // The same call 1,000 times on a larger input: live bytes at every
    // iteration boundary are identical, and the results we keep are all
    // that stays. (100 calls on CUDA: on the emulated device every kernel
    // is interpreted, and 100 show the same flat line.)
    let calls = if device.is_cpu() { 1000 } else { 100 };
    let big = Rng::new(0).randn_on([10_000], DType::F32, device)?;
    let start = memory_allocated(device);
    let mut boundaries = Vec::new();
    for _ in 0..calls {
        let r = d2(&big)?;
        drop(r);
        boundaries.push(memory_allocated(device));
    }
    let flat = boundaries.iter().all(|&b| b == start);
    println!(
        "live bytes on {device} before the loop: {start}; after each of {calls} calls: {} ({})",
        boundaries[calls - 1],
        if flat { "identical every time" } else { "CHANGED" }
    );
    anyhow::ensure!(flat, "live memory changed across calls");
    Ok(())
}
