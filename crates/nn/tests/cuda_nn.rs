//! The nn crate on CUDA against the CPU: every layer's forward and
//! backward, the optimizers' kernels (bit for bit on the same gradients),
//! a few training steps, live bytes at step boundaries, and checkpoints
//! moving between the devices.
//!
//! Each test needs CUDA device 0; without one it prints that it skipped,
//! and `TAPIR_REQUIRE_CUDA=1` makes that a failure (CI runs these on the
//! emulated device, so the sizes are small).

use std::collections::BTreeMap;

use tapir_autograd::{Graph, Var};
use tapir_nn::{
    checkpoint, mse, Activation, Adam, Bound, DataLoader, Dropout, Gpt, GptConfig, Grads, Lbfgs, Linear, Mlp,
    Optimizer, ParamStore, RmsNorm, Sgd,
};
use tapir_tensor::prelude::*;
use tapir_testing::{assert_close, cuda_or_skip};

/// Held by every test of this file while it runs: the live-bytes check
/// reads the device's counters, which the other tests' allocations would
/// move if they ran at the same time.
static DEVICE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn cuda(test: &str) -> Option<(Device, std::sync::MutexGuard<'static, ()>)> {
    let guard = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    cuda_or_skip(test, Device::cuda(0)).map(|d| (d, guard))
}

/// The loss's value and the gradients of every parameter of `store`, for
/// a loss written once for both devices.
fn loss_and_grads(
    store: &ParamStore,
    f: &dyn for<'g> Fn(&Bound<'g>) -> Result<Var<'g>>,
) -> Result<(Vec<f64>, Vec<f64>, Grads)> {
    Graph::scope(|g| {
        let b = store.bind(g);
        let out = f(&b)?;
        let loss = out.square()?.mean_all()?;
        let value = out.value()?.cast(DType::F64)?.to_vec::<f64>()?;
        let l = loss.value()?.cast(DType::F64)?.to_vec::<f64>()?;
        Ok((value, l, b.grads(loss)?))
    })
}

fn host_values(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F64).and_then(|t| t.to_vec::<f64>()).expect("values")
}

/// Runs `out` (a model's output from the bound parameters and the inputs
/// on that device) on a CPU store and on its copy on `dev`, comparing the
/// outputs and every parameter's gradient within `tol`.
fn compare(
    what: &str,
    store: &ParamStore,
    dev: Device,
    tol: f64,
    out: &dyn for<'g> Fn(&Bound<'g>, Device) -> Result<Var<'g>>,
) -> Result<()> {
    let mut on_dev = store.clone();
    on_dev.to_device(dev)?;
    assert_eq!(on_dev.device()?, dev);
    let (y_cpu, l_cpu, g_cpu) = loss_and_grads(store, &|b| out(b, Device::Cpu))?;
    let (y_dev, l_dev, g_dev) = loss_and_grads(&on_dev, &|b| out(b, dev))?;
    assert_close(&format!("{what}: output"), &y_dev, &y_cpu, tol);
    assert_close(&format!("{what}: loss"), &l_dev, &l_cpu, tol);
    for (id, name, _) in store.iter() {
        assert_eq!(g_dev.get(id).device(), dev, "{what}: the gradient of {name} stays on the device");
        let (gd, gc) = (host_values(g_dev.get(id)), host_values(g_cpu.get(id)));
        assert_close(&format!("{what}: gradient of {name}"), &gd, &gc, tol);
        assert!(gc.iter().any(|&x| x != 0.0), "{what}: the gradient of {name} is not all zero");
    }
    Ok(())
}

fn input(rng: &mut Rng, shape: &[usize], dtype: DType) -> Tensor {
    rng.normal_tensor(shape.to_vec(), 0.0, 1.0, dtype).expect("input")
}

#[tapir_testing::cuda_test]
fn cuda_gpt_layers_match_the_cpu() -> Result<()> {
    let Some((dev, _serial)) = cuda("cuda_gpt_layers_match_the_cpu") else { return Ok(()) };
    // Embeddings, layer norms, causal self-attention with its residual,
    // the MLP and the tied head: the layers of the GPT the CLI trains.
    let cfg = GptConfig {
        vocab: 11,
        block_size: 6,
        d_model: 8,
        n_layer: 1,
        n_head: 2,
        mlp_ratio: 2,
        dropout: 0.0,
        tie_weights: true,
    };
    let mut store = ParamStore::new();
    let gpt = Gpt::new(&mut store, cfg, &mut Rng::new(3), DType::F32)?;
    let ids = Tensor::from_vec(vec![1i64, 4, 7, 10, 0, 3, 2, 2, 9, 5, 6, 8], [2, 6])?;
    compare("gpt logits", &store, dev, 1e-4, &|b, d| gpt.logits(b, &ids.to_device(d)?, None))
}

/// The same model at a shape where every fused CUDA path does real work:
/// heads of 64 (the tensor-core attention kernels in bf16, a block of
/// queries wider than one warp's rows in f32), a context of 100 tokens
/// (more than one 64-row tile, and not a multiple of it), a vocabulary row
/// of 65 logits per token and two layers, so gradients flow through a
/// residual stream into the embeddings. Cheap since the interpreter runs
/// about a billion thread-instructions a second (crates/cuda-emu, "Speed").
#[tapir_testing::cuda_test]
fn cuda_gpt_at_a_training_shape_matches_the_cpu() -> Result<()> {
    let Some((dev, _serial)) = cuda("cuda_gpt_at_a_training_shape_matches_the_cpu") else { return Ok(()) };
    let cfg = GptConfig {
        vocab: 65,
        block_size: 100,
        d_model: 128,
        n_layer: 2,
        n_head: 2,
        mlp_ratio: 4,
        dropout: 0.0,
        tie_weights: true,
    };
    let mut rng = Rng::new(11);
    let ids = rng.randint([2, 100], 65, DType::I64)?;
    // f32 differs only by summation order (the two devices agree to 1e-6
    // here); bf16 by where each device rounds (the CPU's attention rounds
    // its f32 result once, the tensor-core kernels round P and the
    // products' inputs to bf16, as on hardware), a few of bf16's 2^-8
    // steps through two layers: 5e-3 fails, 1e-2 passes at this seed.
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 2e-2)] {
        let mut store = ParamStore::new();
        let gpt = Gpt::new(&mut store, cfg.clone(), &mut Rng::new(3), dtype)?;
        compare(&format!("gpt {dtype:?} [2, 100] d_model 128"), &store, dev, tol, &|b, d| {
            gpt.logits(b, &ids.to_device(d)?, None)
        })?;
    }
    Ok(())
}

#[tapir_testing::cuda_test]
fn cuda_mlp_linear_and_rms_norm_match_the_cpu() -> Result<()> {
    let Some((dev, _serial)) = cuda("cuda_mlp_linear_and_rms_norm_match_the_cpu") else { return Ok(()) };
    let mut rng = Rng::new(7);
    for (act, dtype, tol) in [
        (Activation::Tanh, DType::F32, 1e-5),
        (Activation::Gelu, DType::F64, 1e-12),
        (Activation::Tanh, DType::BF16, 2e-2),
    ] {
        let mut store = ParamStore::new();
        let net = Mlp::new(&mut store, "mlp", &[5, 7, 3], act, &mut rng, dtype)?;
        let x = input(&mut rng, &[4, 5], dtype);
        compare(&format!("mlp {act:?} {dtype}"), &store, dev, tol, &|b, d| {
            net.forward(b, b.graph().constant(x.to_device(d)?))
        })?;
    }
    // A linear layer without bias whose input needs a gradient, with the
    // residual fused, then an RMS norm.
    let mut store = ParamStore::new();
    let lin = Linear::new(&mut store, "lin", 6, 6, false, &mut rng, DType::F32)?;
    let norm = RmsNorm::new(&mut store, "norm", 6, DType::F32)?;
    let x = input(&mut rng, &[2, 3, 6], DType::F32);
    compare("linear + residual + rms norm", &store, dev, 1e-5, &|b, d| {
        let x = b.graph().leaf(x.to_device(d)?);
        let h = lin.forward_residual(b, x, x)?;
        norm.forward(b, h)
    })
}

/// Every optimizer the tests compare, fresh.
fn optimizers() -> Vec<(&'static str, Box<dyn Optimizer>)> {
    let mut sgd = Sgd::with_momentum(0.05, 0.9, true);
    sgd.weight_decay = 0.01;
    let mut adam = Adam::new(0.01);
    adam.weight_decay = 0.02;
    vec![
        ("sgd", Box::new(Sgd::new(0.1))),
        ("sgd momentum nesterov", Box::new(sgd)),
        ("adam", Box::new(adam)),
        ("adamw", Box::new(Adam::adamw(0.01, 0.1))),
    ]
}

#[tapir_testing::cuda_test]
fn cuda_optimizer_kernels_match_the_cpu_bit_for_bit() -> Result<()> {
    let Some((dev, _serial)) = cuda("cuda_optimizer_kernels_match_the_cpu_bit_for_bit") else { return Ok(()) };
    // The same parameters and the same gradients on both devices: the
    // updates are the same operations in the same order, so every bit of
    // the parameters and of the state agrees.
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for (name, mut cpu_opt) in optimizers() {
            let (_, mut dev_opt) = optimizers().into_iter().find(|(n, _)| *n == name).expect("same list");
            let mut rng = Rng::new(11);
            let mut cpu = ParamStore::new();
            // 335 elements: two blocks of the update kernels, the second ragged.
            cpu.add("w", input(&mut rng, &[67, 5], dtype))?;
            cpu.add_to_group("b", "no_decay", input(&mut rng, &[5], dtype))?;
            let mut on_dev = cpu.clone();
            on_dev.to_device(dev)?;
            for step in 0..3 {
                let gs: Vec<Tensor> = cpu.iter().map(|(_, _, p)| input(&mut rng, p.dims(), dtype)).collect();
                let gd = gs.iter().map(|g| g.to_device(dev)).collect::<Result<Vec<_>>>()?;
                cpu_opt.step(&mut cpu, &Grads::from_tensors(gs))?;
                dev_opt.step(&mut on_dev, &Grads::from_tensors(gd))?;
                for (id, pname, p) in cpu.iter() {
                    let q = on_dev.get(id);
                    assert_eq!(q.device(), dev);
                    assert_eq!(
                        host_values(q),
                        host_values(p),
                        "{name} {dtype}, step {step}: parameter {pname} differs"
                    );
                }
                let (sc, sd) = (cpu_opt.state_dict(), dev_opt.state_dict());
                for (a, b) in sc.slots.iter().flatten().zip(sd.slots.iter().flatten()) {
                    assert_eq!(b.device(), dev, "{name}: state lives on the parameter's device");
                    assert_eq!(b.dtype(), a.dtype());
                    assert_eq!(host_values(b), host_values(a), "{name} {dtype}, step {step}: state differs");
                }
            }
        }
    }
    Ok(())
}

/// The update kernels take 16 bytes a thread (4 f32, 2 f64, 8 f16 or
/// bf16) when every operand is 16-byte aligned, the n % pack elements
/// left and misaligned operands one at a time: each path, and the two
/// together, agree with the CPU bit for bit. 4,099 elements are packs over
/// several blocks and a ragged tail for every pack size; a gradient that
/// is a view at an odd offset (one element into a longer tensor) is
/// misaligned; a column of a [N, 2] tensor is not contiguous at all.
#[tapir_testing::cuda_test]
fn cuda_optimizer_kernels_match_the_cpu_bit_for_bit_on_every_alignment() -> Result<()> {
    let Some((dev, _serial)) = cuda("cuda_optimizer_kernels_match_the_cpu_bit_for_bit_on_every_alignment") else {
        return Ok(());
    };
    const N: usize = 4099;
    // A gradient view: the shape of the tensor it is taken from, and how
    // (the same on each device, so the device's copy is the view too).
    type View = (&'static str, [usize; 2], fn(&Tensor) -> Tensor);
    let views: [View; 3] = [
        ("contiguous", [1, N], |t| t.reshape([N]).expect("view")),
        ("odd offset", [1, N + 1], |t| t.reshape([N + 1]).and_then(|t| t.narrow(0, 1, N)).expect("view")),
        ("strided", [N, 2], |t| t.narrow(1, 1, 1).and_then(|t| t.squeeze(-1)).expect("view")),
    ];
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for (name, _) in optimizers() {
            for (view, shape, take) in views {
                let fresh = || optimizers().into_iter().find(|(n, _)| *n == name).expect("same list").1;
                let (mut cpu_opt, mut dev_opt) = (fresh(), fresh());
                let mut rng = Rng::new(5);
                let mut cpu = ParamStore::new();
                cpu.add("w", input(&mut rng, &[N], dtype))?;
                let mut on_dev = cpu.clone();
                on_dev.to_device(dev)?;
                for step in 0..2 {
                    let base = input(&mut rng, &shape, dtype);
                    let (g, gd) = (take(&base), take(&base.to_device(dev)?));
                    assert_eq!(gd.is_contiguous(), view != "strided", "{view}");
                    cpu_opt.step(&mut cpu, &Grads::from_tensors(vec![g]))?;
                    dev_opt.step(&mut on_dev, &Grads::from_tensors(vec![gd]))?;
                    let what = format!("{name} {dtype}, {view} gradient, step {step}");
                    for (id, _, p) in cpu.iter() {
                        assert_eq!(host_values(on_dev.get(id)), host_values(p), "{what}: parameter differs");
                    }
                    let (sc, sd) = (cpu_opt.state_dict(), dev_opt.state_dict());
                    for (a, b) in sc.slots.iter().flatten().zip(sd.slots.iter().flatten()) {
                        assert_eq!(host_values(b), host_values(a), "{what}: state differs");
                    }
                }
            }
        }
    }
    Ok(())
}

/// Mean squared error of an Mlp on fixed data, on `dev`.
fn mlp_loss<'g>(net: &Mlp, b: &Bound<'g>, x: &Tensor, y: &Tensor) -> Result<Var<'g>> {
    let g = b.graph();
    mse(&net.forward(b, g.constant(x.clone()))?, &g.constant(y.clone()))
}

#[tapir_testing::cuda_test]
fn cuda_training_steps_match_the_cpu_and_hold_live_bytes() -> Result<()> {
    let Some((dev, _serial)) = cuda("cuda_training_steps_match_the_cpu_and_hold_live_bytes") else { return Ok(()) };
    let mut rng = Rng::new(5);
    let x = input(&mut rng, &[16, 3], DType::F32);
    let y = input(&mut rng, &[16, 2], DType::F32);
    let (xd, yd) = (x.to_device(dev)?, y.to_device(dev)?);
    for (name, mut cpu_opt) in optimizers() {
        let (_, mut dev_opt) = optimizers().into_iter().find(|(n, _)| *n == name).expect("same list");
        let mut cpu = ParamStore::new();
        let net = Mlp::new(&mut cpu, "mlp", &[3, 8, 2], Activation::Tanh, &mut Rng::new(1), DType::F32)?;
        let mut on_dev = cpu.clone();
        on_dev.to_device(dev)?;
        let step = |store: &mut ParamStore, opt: &mut dyn Optimizer, x: &Tensor, y: &Tensor| -> Result<f64> {
            let (loss, grads) = Graph::scope(|g| {
                let b = store.bind(g);
                let loss = mlp_loss(&net, &b, x, y)?;
                Ok::<_, Error>((loss.value()?.to_vec::<f32>()?[0] as f64, b.grads(loss)?))
            })?;
            opt.step(store, &grads)?;
            Ok(loss)
        };
        let mut live = Vec::new();
        let (mut first, mut last) = (0.0, 0.0);
        for k in 0..5 {
            let lc = step(&mut cpu, cpu_opt.as_mut(), &x, &y)?;
            let ld = step(&mut on_dev, dev_opt.as_mut(), &xd, &yd)?;
            assert_close(&format!("{name}: loss at step {k}"), &[ld], &[lc], 1e-5);
            live.push(memory_stats(dev).allocated);
            if k == 0 {
                first = ld;
            }
            last = ld;
        }
        assert!(last < first, "{name}: the loss falls on CUDA ({first} -> {last})");
        // The state exists after the first step; from then on a step frees
        // all it allocates.
        assert!(live[1..].iter().all(|&b| b == live[1]), "{name}: live bytes at step boundaries {live:?}");
        for (id, pname, p) in cpu.iter() {
            let what = format!("{name}: {pname} after 5 steps");
            assert_close(&what, &host_values(on_dev.get(id)), &host_values(p), 1e-4);
        }
    }
    Ok(())
}

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("tapir-cuda-nn-{}-{name}.safetensors", std::process::id()))
}

#[tapir_testing::cuda_test]
fn cuda_checkpoints_move_between_devices() -> Result<(), Box<dyn std::error::Error>> {
    let Some((dev, _serial)) = cuda("cuda_checkpoints_move_between_devices") else { return Ok(()) };
    let mut rng = Rng::new(9);
    let x = input(&mut rng, &[8, 3], DType::F32);
    let y = input(&mut rng, &[8, 2], DType::F32);
    let (xd, yd) = (x.to_device(dev)?, y.to_device(dev)?);
    let mut store = ParamStore::new();
    let net = Mlp::new(&mut store, "mlp", &[3, 4, 2], Activation::Tanh, &mut rng, DType::F32)?;
    store.to_device(dev)?;
    let mut opt = Adam::new(0.01);
    let grads = Graph::scope(|g| {
        let b = store.bind(g);
        b.grads(mlp_loss(&net, &b, &xd, &yd)?)
    })?;
    opt.step(&mut store, &grads)?;

    // CUDA to the CPU: a store made on the host loads identical values,
    // and the optimizer's moments with them.
    let path = temp("from-cuda");
    checkpoint::save(&path, &store, Some(&opt), &BTreeMap::new())?;
    let mut host = ParamStore::new();
    Mlp::new(&mut host, "mlp", &[3, 4, 2], Activation::Tanh, &mut Rng::new(0), DType::F32)?;
    let mut host_opt = Adam::new(0.01);
    checkpoint::load(&path, &mut host, Some(&mut host_opt))?;
    for (id, name, p) in store.iter() {
        assert_eq!(host.get(id).device(), Device::Cpu);
        assert_eq!(host_values(host.get(id)), host_values(p), "{name} loaded on the CPU");
    }
    for (a, b) in opt.state().iter().flatten().zip(host_opt.state().iter().flatten()) {
        assert_eq!((a.device(), b.device()), (dev, Device::Cpu));
        assert_eq!(host_values(b), host_values(a), "moments loaded on the CPU");
    }
    let read = tapir_nn::Checkpoint::read_to(&path, dev)?;
    assert!(read.tensors.values().all(|t| t.device() == dev), "read_to places every tensor on the device");
    std::fs::remove_file(&path)?;

    // The CPU to CUDA: a store on the device keeps its device and takes the
    // file's values, moments included; the next step runs there.
    let path = temp("from-cpu");
    let ones = Grads::from_tensors(host.iter().map(|(_, _, p)| p.ones_like()).collect::<Result<_>>()?);
    host_opt.step(&mut host, &ones)?;
    checkpoint::save(&path, &host, Some(&host_opt), &BTreeMap::new())?;
    let mut fresh_opt = Adam::new(0.01);
    checkpoint::load(&path, &mut store, Some(&mut fresh_opt))?;
    for (id, name, p) in host.iter() {
        assert_eq!(store.get(id).device(), dev, "{name} stays on the device");
        assert_eq!(host_values(store.get(id)), host_values(p), "{name} loaded on CUDA");
    }
    assert_eq!(fresh_opt.steps(), 2);
    assert!(fresh_opt.state().iter().flatten().all(|t| t.device() == dev), "moments follow the parameters");
    std::fs::remove_file(&path)?;
    Ok(())
}

#[tapir_testing::cuda_test]
fn cuda_gradient_clipping_matches_the_cpu() -> Result<()> {
    let Some((dev, _serial)) = cuda("cuda_gradient_clipping_matches_the_cpu") else { return Ok(()) };
    let mut rng = Rng::new(13);
    let gs: Vec<Tensor> = [[3usize, 4], [5, 1]].iter().map(|s| input(&mut rng, s, DType::F32)).collect();
    let mut cpu = Grads::from_tensors(gs.clone());
    let mut on_dev = Grads::from_tensors(gs.iter().map(|g| g.to_device(dev)).collect::<Result<_>>()?);
    let (nc, nd) = (cpu.clip_global_norm(0.5)?, on_dev.clip_global_norm(0.5)?);
    assert_eq!(nd, nc, "the norm before clipping");
    assert!(nc > 0.5, "the gradients are clipped ({nc})");
    for ((_, c), (_, d)) in cpu.iter().zip(on_dev.iter()) {
        assert_eq!(d.device(), dev);
        assert_eq!(host_values(d), host_values(c), "clipped gradients agree bit for bit");
    }
    Ok(())
}

#[tapir_testing::cuda_test]
fn cuda_forward_jet_matches_the_cpu() -> Result<()> {
    let Some((dev, _serial)) = cuda("cuda_forward_jet_matches_the_cpu") else { return Ok(()) };
    // The physics-informed networks' derivatives: the Laplacian over all
    // dims (one fused sum of squares) and over a subset (a mask constant).
    let mut rng = Rng::new(17);
    let mut store = ParamStore::new();
    let net = Mlp::new(&mut store, "u", &[2, 6, 6, 1], Activation::Tanh, &mut rng, DType::F64)?;
    let x = input(&mut rng, &[5, 2], DType::F64);
    for dims in [&[0usize, 1][..], &[0][..]] {
        compare(&format!("forward_jet over {dims:?}"), &store, dev, 1e-10, &|b, d| {
            let jet = net.forward_jet(b, b.graph().constant(x.to_device(d)?), dims)?;
            jet.laplacian.add(&jet.value)?.add(&jet.jacobian.sum(&[1], false)?)
        })?;
    }
    Ok(())
}

/// Case `case` of the jet ops' tests on the leaves `[a, s, row, l, j,
/// j_row]`: the op's output and the inputs it reads.
fn jet_case<'g>(case: usize, v: Vec<Var<'g>>) -> Result<(Var<'g>, Vec<Var<'g>>)> {
    let [a, s, row, l, j, j_row] = v[..] else { panic!("six leaves") };
    Ok(match case {
        0 => (tapir_nn::tanh_jet(&a, &s, Some(&l))?, vec![a, s, l]),
        1 => (tapir_nn::tanh_jet(&a, &row, None)?, vec![a, row]),
        2 => (tapir_nn::tanh_jac(&j, &a)?, vec![j, a]),
        _ => (tapir_nn::tanh_jac(&j_row, &a)?, vec![j_row, a]),
    })
}

/// The tanh layer's fused jet ops on CUDA (kernels/jet.cu) against
/// the CPU's kernels: f32 and f64, with and without the incoming
/// Laplacian, the per-point and the one-row forms, values and gradients,
/// on the element loops and the 16-byte packs; bf16 and f16 against f64.
#[tapir_testing::cuda_test]
fn cuda_tanh_jet_ops_match_the_cpu() -> Result<()> {
    let Some((dev, _serial)) = cuda("cuda_tanh_jet_ops_match_the_cpu") else { return Ok(()) };
    // w = 7: the kernels' element loops (and tanh_jet's per-point packs
    // with an element tail); w = 16: every kernel's 16-byte packs.
    for ((n, d, w), dtype) in [(5, 2, 7), (6, 3, 16)].into_iter().flat_map(|s| [(s, DType::F32), (s, DType::F64)]) {
        let mut rng = Rng::new(23);
        let a = rng.uniform([n, w], -0.9, 0.9, dtype)?;
        let s = rng.uniform([n, w], 0.0, 2.0, dtype)?;
        let row = rng.uniform([w], 0.0, 2.0, dtype)?;
        let l = rng.uniform([n, w], -1.0, 1.0, dtype)?;
        let j = rng.uniform([n, d, w], -1.0, 1.0, dtype)?;
        let j_row = rng.uniform([1, d, w], -1.0, 1.0, dtype)?;
        let tol = if dtype == DType::F32 { 1e-5 } else { 1e-12 };
        // Every case's output and its inputs' gradients under a fixed
        // weighting, on `device`.
        let run = |device: Device, case: usize| -> Result<Vec<Vec<f64>>> {
            Graph::scope(|g| {
                let on = |t: &Tensor| -> Result<Var<'_>> { Ok(g.leaf(t.to_device(device)?)) };
                let (y, inputs) =
                    jet_case(case, [&a, &s, &row, &l, &j, &j_row].map(on).into_iter().collect::<Result<Vec<_>>>()?)?;
                let numel = y.shape().numel() as f64;
                let weight = Tensor::arange(0.0, numel, 1.0, dtype)?.mul_scalar(1.0 / numel)?.reshape(y.shape())?;
                let weight = g.constant(weight.to_device(device)?);
                let loss = y.mul(&y)?.add(&y.mul(&weight)?)?.sum_all()?;
                let mut out = vec![host_values(&y.value()?)];
                for grad in g.grad(loss, &inputs)? {
                    out.push(host_values(&grad));
                }
                Ok(out)
            })
        };
        for case in 0..4 {
            let (cpu, gpu) = (run(Device::Cpu, case)?, run(dev, case)?);
            assert_eq!(cpu.len(), gpu.len());
            for (k, (c, u)) in cpu.iter().zip(&gpu).enumerate() {
                assert_close(&format!("{dtype} w {w} case {case} output {k}"), u, c, tol);
            }
        }
    }
    // The 16-bit kernels (f32 arithmetic, one rounding an output) against
    // f64 on the CPU from the same rounded inputs: values and gradients
    // for an output gradient `weight`, within a 16-bit rounding.
    for ((n, d, w), dtype) in [(5, 2, 7), (6, 3, 16)].into_iter().flat_map(|s| [(s, DType::BF16), (s, DType::F16)]) {
        let mut rng = Rng::new(29);
        let draw = |rng: &mut Rng, dims: &[usize], lo: f64, hi: f64| -> Result<Tensor> {
            rng.uniform(dims, lo, hi, DType::F32)?.cast(dtype)
        };
        let a = draw(&mut rng, &[n, w], -0.9, 0.9)?;
        let (s, row, l) =
            (draw(&mut rng, &[n, w], 0.0, 2.0)?, draw(&mut rng, &[w], 0.0, 2.0)?, draw(&mut rng, &[n, w], -1.0, 1.0)?);
        let (j, j_row) = (draw(&mut rng, &[n, d, w], -1.0, 1.0)?, draw(&mut rng, &[1, d, w], -1.0, 1.0)?);
        let run = |device: Device, as_dtype: DType, case: usize| -> Result<Vec<Vec<f64>>> {
            Graph::scope(|g| {
                let on = |t: &Tensor| -> Result<Var<'_>> { Ok(g.leaf(t.cast(as_dtype)?.to_device(device)?)) };
                let (y, inputs) =
                    jet_case(case, [&a, &s, &row, &l, &j, &j_row].map(on).into_iter().collect::<Result<Vec<_>>>()?)?;
                let numel = y.shape().numel() as f64;
                let weight = Tensor::arange(0.0, numel, 1.0, DType::F32)?.mul_scalar(1.0 / numel)?.cast(dtype)?;
                let weight = g.constant(weight.cast(as_dtype)?.reshape(y.shape())?.to_device(device)?);
                let loss = y.mul(&weight)?.sum_all()?;
                let mut out = vec![host_values(&y.value()?)];
                for grad in g.grad(loss, &inputs)? {
                    out.push(host_values(&grad));
                }
                Ok(out)
            })
        };
        for case in 0..4 {
            let (want, got) = (run(Device::Cpu, DType::F64, case)?, run(dev, dtype, case)?);
            for (k, (c, u)) in want.iter().zip(&got).enumerate() {
                assert_close(&format!("{dtype} w {w} case {case} output {k}"), u, c, 1e-2);
            }
        }
    }
    Ok(())
}

#[tapir_testing::cuda_test]
fn cuda_dropout_data_loader_and_lbfgs_match_the_cpu() -> Result<()> {
    let Some((dev, _serial)) = cuda("cuda_dropout_data_loader_and_lbfgs_match_the_cpu") else { return Ok(()) };
    let mut rng = Rng::new(19);
    // Dropout: the same seed drops the same elements on both devices.
    let x = input(&mut rng, &[4, 6], DType::F32);
    let drop = Dropout::new(0.5)?;
    let on = |d: Device| -> Result<Vec<f64>> {
        Graph::scope(|g| Ok(host_values(&drop.forward(g.constant(x.to_device(d)?), Some(&mut Rng::new(2)))?.value()?)))
    };
    let (yc, yd) = (on(Device::Cpu)?, on(dev)?);
    assert_eq!(yd, yc, "dropout masks agree");
    assert!(yc.contains(&0.0), "some elements are dropped");

    // A shuffled loader over tensors on the device gives the CPU's batches.
    let labels = Tensor::from_vec((0..4i64).collect(), [4])?;
    let (xd, ld) = (x.to_device(dev)?, labels.to_device(dev)?);
    let host = DataLoader::new(&[&x, &labels], 3)?.shuffle(4);
    let device = DataLoader::new(&[&xd, &ld], 3)?.shuffle(4);
    for (bc, bd) in host.epoch(1).zip(device.epoch(1)) {
        for (c, d) in bc?.iter().zip(bd?.iter()) {
            assert_eq!(d.device(), dev, "batches stay on the device");
            assert_eq!(host_values(d), host_values(c), "the same rows in the same order");
        }
    }

    // L-BFGS: the history lives on the host in f64, the parameters on the device.
    let y = input(&mut rng, &[4, 1], DType::F64);
    let x64 = x.cast(DType::F64)?;
    let mut cpu = ParamStore::new();
    let net = Mlp::new(&mut cpu, "u", &[6, 5, 1], Activation::Tanh, &mut rng, DType::F64)?;
    let mut on_dev = cpu.clone();
    on_dev.to_device(dev)?;
    let run = |store: &mut ParamStore, x: &Tensor, y: &Tensor| -> Result<Vec<f64>> {
        let mut opt = Lbfgs::new(5);
        let mut losses = Vec::new();
        for _ in 0..3 {
            let s = opt.step(store, |st| {
                Graph::scope(|g| {
                    let b = st.bind(g);
                    let loss = mlp_loss(&net, &b, x, y)?;
                    Ok((loss.value()?.to_vec::<f64>()?[0], b.grads(loss)?))
                })
            })?;
            losses.push(s.loss);
        }
        Ok(losses)
    };
    let lc = run(&mut cpu, &x64, &y)?;
    let ld = run(&mut on_dev, &x64.to_device(dev)?, &y.to_device(dev)?)?;
    assert_close("L-BFGS losses", &ld, &lc, 1e-9);
    for (id, name, p) in cpu.iter() {
        assert_eq!(on_dev.get(id).device(), dev);
        assert_close(&format!("L-BFGS {name}"), &host_values(on_dev.get(id)), &host_values(p), 1e-8);
    }
    Ok(())
}
