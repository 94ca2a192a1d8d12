//! Mixed precision: the f16 loss scaler skips an overflowing step without
//! touching the parameters and backs off its scale, then steps again;
//! bf16 products keep the parameters and their gradients in f32 and stay
//! within bf16's rounding of the f32 model; a low-precision `Linear` (one
//! `LowPrecisionAffine` node) gives the numbers of the casts, matmul and
//! adds it replaced, bit for bit, on every device.

use tapir_autograd::{Graph, Var};
use tapir_nn::{Bound, Gpt, GptConfig, GradScaler, Grads, LayerNorm, Linear, ParamStore, Precision, Sgd};
use tapir_tensor::prelude::*;
use tapir_testing::test_device;

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

/// The composition a low-precision `Linear` ran before it was one node
/// (each cast, the product, the bias add, tanh and the residual add each a
/// node of their own), for the equality test below.
fn composed_linear<'g>(
    p: &Bound<'g>,
    lin: &Linear,
    dtype: DType,
    x: Var<'g>,
    r: Option<Var<'g>>,
    tanh: bool,
) -> Result<Var<'g>> {
    let cast = |v: Var<'g>| if v.dtype() == dtype { Ok(v) } else { v.cast(dtype) };
    let w = p.var(lin.weight)?;
    let mut y = cast(x)?.matmul(&cast(w)?.t()?)?;
    if let Some(b) = lin.bias {
        y = y.add(&cast(p.var(b)?)?)?;
    }
    if tanh {
        y = y.tanh()?;
    }
    match r {
        Some(r) => r.add(&y),
        None => Ok(y),
    }
}

test_device! {
    /// A small network of low-precision layers, through `Linear` (the fused
    /// node) and through the composition it replaced: the loss, the input's
    /// gradient and every parameter's gradient are equal bit for bit. It
    /// has what a transformer block has: an f32 input read by three layers
    /// (their gradients summed in the same order), a layer reading a
    /// low-precision input (no cast), a residual layer back into f32, a
    /// tanh layer, with and without bias, on a rank-3 input.
    fn low_precision_linear_equals_its_composition(device: Device) -> Result<()> {
        let mut store = ParamStore::new();
        let mut rng = Rng::new(11);
        let mut layer = |name: &str, i: usize, o: usize, bias: bool| Linear::new(&mut store, name, i, o, bias, &mut rng, DType::F32);
        let (q, k, v) = (layer("q", 24, 16, true)?, layer("k", 24, 16, false)?, layer("v", 24, 16, true)?);
        let (proj, head) = (layer("proj", 16, 24, true)?, layer("head", 24, 8, true)?);
        store.to_device(device)?;
        let x0 = Rng::new(12).normal_tensor([2, 5, 24], 0.0, 1.0, DType::F32)?.to_device(device)?;
        for (precision, dtype) in [(Precision::Bf16, DType::BF16), (Precision::F16, DType::F16)] {
            let run = |fused: bool| {
                Graph::scope(|g| {
                    let p = store.bind(g).with_precision(precision);
                    let x = g.leaf(x0.clone());
                    let f = |l: &Linear, h, r, tanh| {
                        if fused {
                            match (r, tanh) {
                                (Some(r), _) => l.forward_residual(&p, h, r),
                                (None, true) => l.forward_tanh(&p, h),
                                (None, false) => l.forward(&p, h),
                            }
                        } else {
                            composed_linear(&p, l, dtype, h, r, tanh)
                        }
                    };
                    let m = f(&q, x, None, false)?.mul(&f(&k, x, None, false)?)?.add(&f(&v, x, None, false)?)?;
                    let z = f(&proj, m, Some(x), false)?;
                    let out = f(&head, z, None, true)?;
                    let loss = out.cast(DType::F32)?.square()?.sum_all()?;
                    let mut wrt = vec![x];
                    wrt.extend_from_slice(p.vars());
                    let grads = g.grad(loss, &wrt)?;
                    let bits = |t: &Tensor| t.to_vec::<f32>().map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
                    let mut all = vec![bits(&loss.value()?)?];
                    for t in &grads {
                        assert_eq!(t.dtype(), DType::F32);
                        all.push(bits(t)?);
                    }
                    Ok::<_, Error>(all)
                })
            };
            let (fused, composed) = (run(true)?, run(false)?);
            assert_eq!(fused.len(), composed.len());
            for (i, (a, b)) in fused.iter().zip(&composed).enumerate() {
                assert!(a == b, "{precision:?}: value {i} (0 the loss, 1 the input's gradient, then the parameters') differs");
            }
        }
        Ok(())
    }

    /// A LayerNorm feeding a Linear stores its output in the Linear's low
    /// dtype (`forward_into_linear`, as the gpt's MLP norm does): the output
    /// is bf16 or f16, and the loss and every gradient (the input's, the
    /// norm's scale and shift, the layer's) are those of the norm's f32
    /// output rounded by the Linear, bit for bit. In full precision it is
    /// `forward` itself.
    fn norm_into_a_linear_keeps_the_numbers(device: Device) -> Result<()> {
        let mut store = ParamStore::new();
        let ln = LayerNorm::new(&mut store, "ln", 24, true, DType::F32)?;
        let fc = Linear::new(&mut store, "fc", 24, 16, true, &mut Rng::new(13), DType::F32)?;
        store.to_device(device)?;
        let x0 = Rng::new(14).normal_tensor([2, 5, 24], 1.0, 2.0, DType::F32)?.to_device(device)?;
        for (precision, dtype) in [(Precision::Bf16, DType::BF16), (Precision::F16, DType::F16), (Precision::Full, DType::F32)] {
            let run = |low: bool| {
                Graph::scope(|g| {
                    let p = store.bind(g).with_precision(precision);
                    let x = g.leaf(x0.clone());
                    let h = if low { ln.forward_into_linear(&p, x)? } else { ln.forward(&p, x)? };
                    assert_eq!(h.dtype(), if low { dtype } else { DType::F32 });
                    let loss = fc.forward(&p, h)?.cast(DType::F32)?.square()?.sum_all()?;
                    let mut wrt = vec![x];
                    wrt.extend_from_slice(p.vars());
                    let bits = |t: &Tensor| t.to_vec::<f32>().map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
                    let mut all = vec![bits(&loss.value()?)?];
                    for t in g.grad(loss, &wrt)? {
                        all.push(bits(&t)?);
                    }
                    Ok::<_, Error>(all)
                })
            };
            assert!(run(true)? == run(false)?, "{precision:?}: a value differs");
        }
        Ok(())
    }
}
