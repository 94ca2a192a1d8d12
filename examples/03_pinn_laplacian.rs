//! A physics-informed network: the Poisson equation
//! `-Laplacian(u) = 2 pi^2 sin(pi x) sin(pi y)` on the unit square with
//! `u = 0` on its boundary, whose solution is `sin(pi x) sin(pi y)`.
//!
//! The loss holds the PDE residual, built from `g.laplacian(u, x)`: second
//! derivatives of the network with respect to its inputs, recorded so the
//! loss can be differentiated once more with respect to the parameters.
//! Each step is one scope; live memory at every step boundary is the same.
//!
//! Run: `cargo run --release --example 03_pinn_laplacian`
//! (`tapir pinn poisson` is the full-size version, with L-BFGS and plots;
//! add `-- --device cuda` for CUDA).

use std::f64::consts::PI;

use tapir::prelude::*;

mod common;

/// `n` points `[n, 2]` uniformly in the unit square, and `m` on its edges.
fn points(n: usize, m: usize, rng: &mut Rng) -> Result<(Tensor, Tensor)> {
    let inner = rng.rand([n, 2], DType::F32)?;
    let mut edge = Vec::with_capacity(2 * m);
    for i in 0..m {
        let s = rng.next_f64() as f32;
        edge.extend(match i % 4 {
            0 => [s, 0.0],
            1 => [s, 1.0],
            2 => [0.0, s],
            _ => [1.0, s],
        });
    }
    Ok((inner, Tensor::from_vec(edge, [m, 2])?))
}

/// The residual's source term `2 pi^2 sin(pi x) sin(pi y)`, `[n]`.
fn source(pts: &Tensor) -> Result<Tensor> {
    let v = pts.to_vec::<f32>()?;
    let f: Vec<f32> =
        v.chunks(2).map(|p| (2.0 * PI * PI * (PI * p[0] as f64).sin() * (PI * p[1] as f64).sin()) as f32).collect();
    Tensor::from_vec(f, [v.len() / 2])
}

/// Relative L2 error of the network against the exact solution on a grid.
fn error(store: &ParamStore, net: &Mlp, device: Device) -> Result<f64> {
    let n = 41;
    let grid: Vec<f32> =
        (0..n * n).flat_map(|k| [(k % n) as f32 / (n - 1) as f32, (k / n) as f32 / (n - 1) as f32]).collect();
    let exact: Vec<f64> = grid.chunks(2).map(|p| (PI * p[0] as f64).sin() * (PI * p[1] as f64).sin()).collect();
    let grid = Tensor::from_vec(grid, [n * n, 2])?.to_device(device)?;
    let u = Graph::scope(|g| net.forward(&store.bind(g), g.constant(grid.clone()))?.value())?.to_vec_f64();
    let num: f64 = u.iter().zip(&exact).map(|(a, b)| (a - b).powi(2)).sum();
    let den: f64 = exact.iter().map(|b| b * b).sum();
    Ok((num / den).sqrt())
}

fn main() -> anyhow::Result<()> {
    let device = common::device()?;
    let mut rng = Rng::new(0);
    let (inner, edge) = points(256, 128, &mut rng)?;
    let f = source(&inner)?.to_device(device)?;
    let (inner, edge) = (inner.to_device(device)?, edge.to_device(device)?);
    let mut store = ParamStore::new();
    let net = Mlp::xavier(&mut store, "u", &[2, 32, 32, 1], Activation::Tanh, &mut rng, DType::F32)?;
    store.to_device(device)?;
    let mut opt = Adam::new(5e-3);
    println!(
        "PINN for -Laplacian(u) = 2 pi^2 sin(pi x) sin(pi y): MLP 2-32-32-1 (tanh), 256 interior + 128 edge points"
    );
    println!("step     0  relative L2 error {:.3}", error(&store, &net, device)?);

    let steps = 600;
    let mut live = Vec::with_capacity(steps);
    for step in 1..=steps {
        let (loss, grads) = Graph::scope(|g| {
            let p = store.bind(g);
            let x = g.leaf(inner.clone());
            let u = net.forward(&p, x)?; // [N, 1]
            let lap = g.laplacian(u, x)?; // [N], recorded: differentiable again
            let residual = lap.add(&g.constant(f.clone()))?; // Laplacian(u) + f = 0
            let boundary = net.forward(&p, g.constant(edge.clone()))?; // u = 0 there
            let loss = residual.square()?.mean_all()?.add(&boundary.square()?.mean_all()?)?;
            Ok::<_, Error>((loss.item()?, p.grads(loss)?))
        })?;
        opt.step(&mut store, &grads)?;
        drop(grads);
        live.push(memory_allocated(device));
        if step % 150 == 0 {
            println!("step {step:>5}  loss {loss:.4}  relative L2 error {:.3}", error(&store, &net, device)?);
        }
    }
    let flat = live.iter().all(|&b| b == live[0]);
    println!(
        "live bytes at the {steps} step boundaries: {} ({})",
        live[0],
        if flat { "identical at every one" } else { "CHANGED" }
    );
    anyhow::ensure!(flat, "live memory changed between steps");
    let err = error(&store, &net, device)?;
    anyhow::ensure!(err < 0.2, "the network did not approach the solution (error {err})");
    Ok(())
}
