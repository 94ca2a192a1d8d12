//! Mixed precision: the f16 loss scaler skips an overflowing step without
//! touching the parameters and backs off its scale, then steps again;
//! bf16 products keep the parameters and their gradients in f32 and stay
//! within bf16's rounding of the f32 model.

use tapir_autograd::Graph;
use tapir_nn::{Gpt, GptConfig, GradScaler, Grads, ParamStore, Precision, Sgd};
use tapir_tensor::prelude::*;

#[test]
fn f16_loss_scaler_recovers_from_an_overflow_step() {
    let mut store = ParamStore::new();
    let id = store.add("w", Tensor::from_vec(vec![1.0f32, -2.0, 3.0], [3]).unwrap()).unwrap();
    let mut opt = Sgd::new(0.1);
    let mut scaler = GradScaler::new(1024.0).unwrap();
    scaler.growth_interval = 2;
    let before = store.get(id).to_vec::<f32>().unwrap();
    // An overflowed gradient (as f16 products of a scaled loss give): the
    // step is skipped and the scale halves.
    let bad = Grads::from_tensors(vec![Tensor::from_vec(vec![1.0f32, f32::INFINITY, 0.0], [3]).unwrap()]);
    assert!(!scaler.step(&mut opt, &mut store, &bad).unwrap());
    assert_eq!(store.get(id).to_vec::<f32>().unwrap(), before, "a skipped step leaves the parameters");
    assert_eq!(scaler.scale, 512.0);
    let nan = Grads::from_tensors(vec![Tensor::from_vec(vec![f32::NAN, 0.0, 0.0], [3]).unwrap()]);
    assert!(!scaler.step(&mut opt, &mut store, &nan).unwrap());
    assert_eq!(scaler.scale, 256.0);
    // A finite (scaled) gradient: unscaled by 256, then the SGD step.
    let good = Grads::from_tensors(vec![Tensor::from_vec(vec![256.0f32, 512.0, -256.0], [3]).unwrap()]);
    assert!(scaler.step(&mut opt, &mut store, &good).unwrap());
    let after = store.get(id).to_vec::<f32>().unwrap();
    for (a, b) in after.iter().zip([0.9f32, -2.2, 3.1]) {
        assert!((a - b).abs() < 1e-6, "{after:?}");
    }
    // Two good steps in a row double the scale.
    assert!(scaler.step(&mut opt, &mut store, &good).unwrap());
    assert_eq!(scaler.scale, 512.0);
    assert!(GradScaler::new(0.0).is_err());
    assert!(Precision::parse("f8").is_err());
}

fn gpt() -> (ParamStore, Gpt) {
    let cfg = GptConfig {
        vocab: 11,
        block_size: 8,
        d_model: 64,
        n_layer: 1,
        n_head: 2,
        mlp_ratio: 2,
        dropout: 0.0,
        tie_weights: true,
    };
    let mut store = ParamStore::new();
    let gpt = Gpt::new(&mut store, cfg, &mut Rng::new(3), DType::F32).unwrap();
    (store, gpt)
}

#[test]
fn bf16_products_keep_f32_parameters_and_gradients() {
    let (store, model) = gpt();
    let x = Rng::new(4).randint([4, 8], 11, DType::I64).unwrap();
    let y = Rng::new(5).randint([4, 8], 11, DType::I64).unwrap();
    let run = |precision: Precision| {
        Graph::scope(|g| {
            let p = store.bind(g).with_precision(precision);
            let loss = model.loss(&p, &x, &y, None)?;
            Ok::<_, Error>((loss.item()?, p.grads(loss)?))
        })
        .unwrap()
    };
    let (l32, g32) = run(Precision::Full);
    // Gradients that are zero in exact arithmetic (the key bias: softmax
    // ignores a constant shift) are rounding noise: compare each against
    // its own norm plus a sliver of the whole gradient's.
    let global = g32.global_norm();
    for precision in [Precision::Bf16, Precision::F16] {
        let (llo, glo) = run(precision);
        let tol = if precision == Precision::Bf16 { 2e-2 } else { 4e-3 };
        assert!((llo - l32).abs() <= tol * l32.abs(), "{precision:?}: loss {llo} against {l32}");
        for ((id, a), (_, b)) in glo.iter().zip(g32.iter()) {
            assert_eq!(a.dtype(), DType::F32, "{precision:?}: the gradient of {} is f32", store.name(id));
            let (a, b) = (a.to_vec_f64(), b.to_vec_f64());
            let norm = b.iter().map(|v| v * v).sum::<f64>().sqrt();
            let diff = a.iter().zip(&b).map(|(p, q)| (p - q) * (p - q)).sum::<f64>().sqrt();
            assert!(
                diff <= 10.0 * tol * norm + 1e-3 * global,
                "{precision:?}: {}: |d| {diff} against |g| {norm}",
                store.name(id)
            );
        }
    }
}
