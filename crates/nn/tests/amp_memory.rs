//! Exact memory of mixed precision. A bf16 `Linear` is one node that keeps
//! only its low-precision output for the backward (its casts of the input,
//! weight and bias are temporaries of the forward), so a bf16 training
//! step of the gpt model peaks below the f32 one, as autocast's does in
//! PyTorch. Before, the casts and the product before the bias stayed on
//! the tape beside the f32 values, and the bf16 step peaked above f32's
//! (issue 27: 78.33 MiB against 69.28 in `tapir memcheck --scenario amp`).
//! The counters are process-wide, so this file is its own test binary and
//! its tests hold one lock.
//!
//! The CPU's f16/bf16 attention backward and activation gradients run
//! through f32 in one pass (`cpu/attention.rs`, tapir-tensor's
//! `cpu/unary.rs`); their composed rules' temporaries were the rest of the
//! excess.

use std::sync::{Mutex, MutexGuard};

use tapir_autograd::Graph;
use tapir_nn::{Gpt, GptConfig, LayerNorm, Linear, ParamStore, Precision};
use tapir_tensor::max_memory_allocated;
use tapir_tensor::prelude::*;
use tapir_testing::test_device;

static LOCK: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn synchronize(device: Device) {
    if !device.is_cpu() {
        tapir_tensor::cuda::synchronize(device).expect("synchronize");
    }
}

/// One forward and backward (no optimizer) of a small gpt model in
/// `precision`: the peak bytes above those live before it.
fn gpt_step_peak(device: Device, precision: Precision) -> usize {
    let cfg = GptConfig {
        vocab: 11,
        block_size: 64,
        d_model: 64,
        n_layer: 2,
        n_head: 2,
        mlp_ratio: 4,
        dropout: 0.0,
        tie_weights: true,
    };
    let mut rng = Rng::new(3);
    let mut store = ParamStore::new();
    let model = Gpt::new(&mut store, cfg, &mut rng, DType::F32).expect("model");
    store.to_device(device).expect("to device");
    let x = rng.randint([4, 64], 11, DType::I64).and_then(|t| t.to_device(device)).expect("ids");
    let y = rng.randint([4, 64], 11, DType::I64).and_then(|t| t.to_device(device)).expect("targets");
    synchronize(device);
    let base = memory_allocated(device);
    reset_peak_memory_stats(device);
    let grads = Graph::scope(|g| {
        let p = store.bind(g).with_precision(precision);
        let loss = model.loss(&p, &x, &y, None)?;
        p.grads(loss)
    })
    .expect("step");
    drop(grads);
    synchronize(device);
    assert_eq!(memory_allocated(device), base, "{precision:?}: the step leaves nothing behind");
    max_memory_allocated(device) - base
}

/// For each precision with its bytes an element (f32 4, bf16 and f16 2),
/// the bytes a layer keeps between its forward and its backward: `layer`
/// runs on a leaf holding `x` with the parameters of `store` bound, and
/// its output must hold exactly `elements` times that many bytes.
fn kept_bytes_per_precision(
    device: Device,
    store: &ParamStore,
    x: &Tensor,
    elements: usize,
    layer: &dyn for<'g> Fn(&tapir_nn::Bound<'g>, tapir_autograd::Var<'g>) -> Result<tapir_autograd::Var<'g>>,
) {
    for (precision, bytes) in [(Precision::Full, 4), (Precision::Bf16, 2), (Precision::F16, 2)] {
        Graph::scope(|g| {
            let p = store.bind(g).with_precision(precision);
            let xv = g.leaf(x.clone());
            synchronize(device);
            let before = memory_allocated(device);
            let y = layer(&p, xv)?;
            synchronize(device);
            assert_eq!(memory_allocated(device) - before, elements * bytes, "{precision:?}: kept bytes");
            p.grads(y.cast(DType::F32)?.sum_all()?).map(drop)
        })
        .expect("step");
    }
}

test_device! {
    /// Between its forward and its backward a Linear keeps its output and
    /// nothing else: 2 bytes an element in bf16 and f16, 4 in f32. (The
    /// input and the weight are kept by their own nodes whatever the
    /// precision.) The sizes are whole 512-byte granules, so the CUDA
    /// allocator's figure is the same.
    fn low_precision_linear_keeps_only_its_output(device: Device) {
        let _s = serial();
        let (rows, input, out) = (16, 64, 32);
        let mut store = ParamStore::new();
        let lin = Linear::new(&mut store, "lin", input, out, true, &mut Rng::new(1), DType::F32).expect("layer");
        store.to_device(device).expect("to device");
        let x = Rng::new(2).normal_tensor([2, rows / 2, input], 0.0, 1.0, DType::F32).and_then(|t| t.to_device(device));
        let x = x.expect("input");
        kept_bytes_per_precision(device, &store, &x, rows * out, &|p, xv| {
            let y = lin.forward(p, xv)?;
            assert_eq!(y.shape().dims(), [2, rows / 2, out]);
            Ok(y)
        });
    }

    /// The gpt model's forward and backward peaks lower in bf16 than in
    /// f32. It peaked higher while each Linear's casts stayed on the tape,
    /// and, on the CPU, while attention's and GELU's gradients ran their
    /// composed rules in bf16 (low-precision temporaries of the
    /// activations' size, `[B, H, T, T]` for attention).
    fn bf16_gpt_step_peaks_below_f32(device: Device) {
        let _s = serial();
        let full = gpt_step_peak(device, Precision::Full);
        let bf16 = gpt_step_peak(device, Precision::Bf16);
        println!("{device}: gpt forward + backward peak: f32 {full} bytes, bf16 {bf16} bytes");
        assert!(bf16 < full, "bf16 peak {bf16} bytes is not below f32's {full}");
    }

    /// A LayerNorm feeding a Linear keeps its output in the low dtype:
    /// 2 bytes an element under bf16 and f16, 4 in f32 (its input and
    /// parameters are kept by their own nodes).
    fn norm_into_a_linear_keeps_a_low_output(device: Device) {
        let _s = serial();
        let (rows, dim) = (16, 64);
        let mut store = ParamStore::new();
        let ln = LayerNorm::new(&mut store, "ln", dim, true, DType::F32).expect("norm");
        store.to_device(device).expect("to device");
        let x = Rng::new(2).normal_tensor([rows, dim], 0.0, 1.0, DType::F32).and_then(|t| t.to_device(device));
        let x = x.expect("input");
        kept_bytes_per_precision(device, &store, &x, rows * dim, &|p, xv| ln.forward_into_linear(p, xv));
    }
}
