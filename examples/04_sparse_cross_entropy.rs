//! Sparse cross-entropy on `[B, S, V]` logits against `[B, S]` labels, and
//! the memory it saves over the one-hot formula.
//!
//! Keras 3 on PyTorch computed this loss as `sum(one_hot(labels) *
//! log(softmax(logits)))`, which on a language model's vocabulary ran a
//! 40 GiB GPU out of memory (docs/motivation.md). tapir's
//! `sparse_cross_entropy` takes the labels as integers: it keeps one
//! log-sum-exp per row, and its backward writes `softmax - onehot` straight
//! into the gradient. This example measures the peak of forward plus
//! backward for both, with tapir's exact allocator counters.
//!
//! Run: `cargo run --release --example 04_sparse_cross_entropy` (add
//! `-- --device cuda` for CUDA).

use tapir::prelude::*;

mod common;

const MIB: f64 = 1024.0 * 1024.0;

/// The one-hot formula, written with tapir's ops as Keras wrote it with
/// PyTorch's: a `[B, S, V]` one-hot, times log-softmax, summed.
fn one_hot_loss<'g>(g: &'g Graph, logits: Var<'g>, labels: &Tensor, v: usize) -> Result<Var<'g>> {
    let mut one_hot = Tensor::zeros(logits.shape(), DType::F32)?;
    let rows = one_hot.make_mut::<f32>()?;
    for (r, &l) in labels.to_vec::<i64>()?.iter().enumerate() {
        rows[r * v + l as usize] = 1.0;
    }
    logits.log_softmax(-1)?.mul(&g.constant(one_hot.to_device(logits.device())?))?.sum(&[-1], false)?.mean_all()?.neg()
}

/// Loss and peak bytes above the starting point, of forward plus backward.
fn measure(x0: &Tensor, loss: impl for<'g> Fn(&'g Graph, Var<'g>) -> Result<Var<'g>>) -> Result<(f64, usize, Tensor)> {
    let device = x0.device();
    let start = memory_allocated(device);
    reset_peak_memory_stats(device);
    let (l, grad) = Graph::scope(|g| {
        let x = g.leaf(x0.clone());
        let l = loss(g, x)?;
        Ok::<_, Error>((l.item()?, g.grad(l, &[x])?.remove(0)))
    })?;
    Ok((l, max_memory_allocated(device) - start, grad))
}

fn main() -> anyhow::Result<()> {
    let device = common::device()?;
    let (b, s, v) = (4, 64, 8_000);
    let mut rng = Rng::new(0);
    let logits = rng.uniform_on([b, s, v], -3.0, 3.0, DType::F32, device)?;
    let labels = rng.randint_on([b, s], v as u64, DType::I64, device)?;
    let logits_bytes = logits.storage_bytes();
    println!("logits {} ({:.1} MiB), labels {}", logits.shape(), logits_bytes as f64 / MIB, labels.shape());

    let (sparse, sparse_peak, g1) = measure(&logits, |_, x| x.sparse_cross_entropy(&labels))?;
    let (dense, dense_peak, g2) = measure(&logits, |g, x| one_hot_loss(g, x, &labels, v))?;

    let max_diff = g1.to_vec::<f32>()?.iter().zip(g2.to_vec::<f32>()?).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    println!("loss: sparse {sparse:.6}, one-hot {dense:.6}; gradients agree to {max_diff:.1e}");
    println!("peak memory of forward + backward, above the logits:");
    println!(
        "  sparse_cross_entropy  {:>7.1} MiB  ({:.2}x the logits: the gradient, plus one float per row)",
        sparse_peak as f64 / MIB,
        sparse_peak as f64 / logits_bytes as f64
    );
    println!(
        "  one-hot formula       {:>7.1} MiB  ({:.2}x the logits: one-hot, log-softmax, product, gradients)",
        dense_peak as f64 / MIB,
        dense_peak as f64 / logits_bytes as f64
    );
    println!(
        "  saved: {:.1} MiB, {:.1}x less",
        (dense_peak - sparse_peak) as f64 / MIB,
        dense_peak as f64 / sparse_peak as f64
    );
    anyhow::ensure!((sparse - dense).abs() < 1e-4 && max_diff < 1e-6, "the two losses disagree");
    // The sparse loss allocates nothing of [B, S, V] size beyond its gradient.
    anyhow::ensure!(sparse_peak < logits_bytes + logits_bytes / 8, "sparse peak {sparse_peak} B");
    anyhow::ensure!(dense_peak > 2 * sparse_peak, "the one-hot formula should cost far more");
    Ok(())
}
