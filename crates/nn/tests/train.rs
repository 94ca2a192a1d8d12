//! Short training runs whose loss must fall: a tiny GPT on a periodic
//! sequence (AdamW, warm-up and cosine, clipping) and an MLP regression
//! (SGD with momentum). A few dozen steps each, so the suite stays fast.

use tapir_autograd::Graph;
use tapir_nn::{mse, Activation, Adam, Gpt, GptConfig, Mlp, Optimizer, ParamStore, Schedule, Sgd};
use tapir_tensor::prelude::*;

#[test]
fn tiny_gpt_learns_a_periodic_sequence() {
    let cfg = GptConfig {
        vocab: 5,
        block_size: 8,
        d_model: 16,
        n_layer: 1,
        n_head: 2,
        mlp_ratio: 2,
        dropout: 0.0,
        tie_weights: true,
    };
    let mut store = ParamStore::new();
    let mut rng = Rng::new(0);
    let gpt = Gpt::new(&mut store, cfg, &mut rng, DType::F32).unwrap();
    let mut opt = Adam::adamw(1e-2, 0.01);
    let schedule = Schedule::WarmupCosine { warmup: 5, total: 40, min_factor: 0.1 };
    // Sequences of 0 1 2 3 4 0 1 ... from random starting points: every
    // next token is determined by the current one.
    let batch = |rng: &mut Rng| {
        let starts: Vec<i64> = (0..16).map(|_| rng.below(5) as i64).collect();
        let seq =
            |off: i64| -> Vec<i64> { starts.iter().flat_map(|&s| (0..8).map(move |i| (s + i + off) % 5)).collect() };
        (Tensor::from_vec(seq(0), [16, 8]).unwrap(), Tensor::from_vec(seq(1), [16, 8]).unwrap())
    };
    let mut losses = vec![];
    for step in 0..40 {
        opt.set_lr(schedule.lr(1e-2, step));
        let (x, y) = batch(&mut rng);
        let (loss, mut grads) = Graph::scope(|g| {
            let p = store.bind(g);
            let loss = gpt.loss(&p, &x, &y, None)?;
            Ok::<_, Error>((loss.item()?, p.grads(loss)?))
        })
        .unwrap();
        grads.clip_global_norm(1.0).unwrap();
        opt.step(&mut store, &grads).unwrap();
        losses.push(loss);
    }
    let (first, last) = (losses[0], losses[losses.len() - 1]);
    assert!((first - 5f64.ln()).abs() < 0.1, "starts near ln(vocab): {first}");
    assert!(last < 0.2 * first, "loss {first} -> {last}");
}

#[test]
fn mlp_regression_with_sgd_momentum() {
    let mut store = ParamStore::new();
    let mut rng = Rng::new(1);
    let net = Mlp::new(&mut store, "net", &[2, 32, 1], Activation::Tanh, &mut rng, DType::F32).unwrap();
    let mut opt = Sgd::with_momentum(0.05, 0.9, false);
    let x = rng.uniform([64, 2], -1.0, 1.0, DType::F32).unwrap();
    let y = x.sum(&[1], true).unwrap().sin().unwrap();
    let mut losses = vec![];
    for _ in 0..60 {
        let (loss, grads) = Graph::scope(|g| {
            let p = store.bind(g);
            let loss = mse(&net.forward(&p, g.constant(x.clone()))?, &g.constant(y.clone()))?;
            Ok::<_, Error>((loss.item()?, p.grads(loss)?))
        })
        .unwrap();
        opt.step(&mut store, &grads).unwrap();
        losses.push(loss);
    }
    assert!(losses[59] < 0.1 * losses[0], "loss {} -> {}", losses[0], losses[59]);
}
