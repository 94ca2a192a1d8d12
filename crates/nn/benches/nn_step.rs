//! One training step, end to end (forward, loss, backward, optimizer), for
//! two models; `benches/torch/mlp_step.py` and `benches/torch/gpt_step.py`
//! run the same steps in PyTorch and `scripts/bench-nn.sh` prints the
//! ratios of time and peak memory.
//!
//! - `nn_step/mlp`: MLP 784-1024-1024-10 (ReLU), batch 256, cross-entropy,
//!   plain SGD (lr 0.01).
//! - `nn_step/gpt`: the `tapir gpt` default model (vocab 13, context 16,
//!   d_model 64, 2 layers, 4 heads, MLP 4x, tied head) on a batch of 64
//!   sequences of 9 tokens, AdamW with global-norm clipping.
//!
//! Before timing, each step's peak memory is measured exactly (the
//! allocator's counters, reset at the step's start, with the parameters,
//! optimizer state and batch live) and printed as one JSON line:
//! `{"id": "nn_step/mlp", "peak_bytes": ..., "live_bytes": ...}`.
//!
//! `TAPIR_BENCH_DEVICE=cuda` (or `cuda:N`) runs both steps on a CUDA device,
//! with that device's counters; the mirrors take `--device cuda`. Each step
//! reads its loss to the host, which waits for everything queued before, so
//! over many steps the clock reads work done on either device.

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use tapir_autograd::Graph;
use tapir_nn::{Activation, Adam, Gpt, GptConfig, Mlp, Optimizer, ParamStore, Sgd};
use tapir_tensor::max_memory_allocated;
use tapir_tensor::prelude::*;

/// A model, its optimizer and one fixed batch: `step` runs one training step.
trait Step {
    fn step(&mut self) -> f32;
}

struct MlpStep {
    store: ParamStore,
    net: Mlp,
    opt: Sgd,
    x: Tensor,
    y: Tensor,
}

/// The device `TAPIR_BENCH_DEVICE` names (the CPU when unset).
fn device() -> Device {
    let name = std::env::var("TAPIR_BENCH_DEVICE").unwrap_or_default();
    let cuda = |n: usize| Device::cuda(n).unwrap_or_else(|e| panic!("TAPIR_BENCH_DEVICE={name}: {e}"));
    match name.as_str() {
        "" | "cpu" => Device::Cpu,
        "cuda" => cuda(0),
        other => match other.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
            Some(n) => cuda(n),
            None => panic!("TAPIR_BENCH_DEVICE={other}: expected cpu, cuda or cuda:N"),
        },
    }
}

impl MlpStep {
    fn new(device: Device) -> Self {
        let mut rng = Rng::new(0);
        let mut store = ParamStore::new();
        let net =
            Mlp::new(&mut store, "net", &[784, 1024, 1024, 10], Activation::Relu, &mut rng, DType::F32).expect("mlp");
        store.to_device(device).expect("parameters on the device");
        let x = rng.randn([256, 784], DType::F32).and_then(|t| t.to_device(device)).expect("x");
        let y = rng.randint([256], 10, DType::I64).and_then(|t| t.to_device(device)).expect("y");
        MlpStep { store, net, opt: Sgd::new(0.01), x, y }
    }
}

impl Step for MlpStep {
    fn step(&mut self) -> f32 {
        let (net, x, y) = (&self.net, &self.x, &self.y);
        let (loss, grads) = Graph::scope(|g| {
            let p = self.store.bind(g);
            let loss = net.forward(&p, g.constant(x.clone()))?.sparse_cross_entropy(y)?;
            Ok::<_, Error>((loss.item()? as f32, p.grads(loss)?))
        })
        .expect("mlp step");
        self.opt.step(&mut self.store, &grads).expect("sgd");
        loss
    }
}

struct GptStep {
    store: ParamStore,
    gpt: Gpt,
    opt: Adam,
    x: Tensor,
    y: Tensor,
}

/// The `tapir gpt` default configuration.
pub fn gpt_config() -> GptConfig {
    GptConfig {
        vocab: 13,
        block_size: 16,
        d_model: 64,
        n_layer: 2,
        n_head: 4,
        mlp_ratio: 4,
        dropout: 0.0,
        tie_weights: true,
    }
}

impl GptStep {
    fn new(device: Device) -> Self {
        let mut rng = Rng::new(0);
        let mut store = ParamStore::new();
        let gpt = Gpt::new(&mut store, gpt_config(), &mut rng, DType::F32).expect("gpt");
        store.to_device(device).expect("parameters on the device");
        let x = rng.randint([64, 9], 13, DType::I64).and_then(|t| t.to_device(device)).expect("x");
        let y = rng.randint([64, 9], 13, DType::I64).and_then(|t| t.to_device(device)).expect("y");
        let mut opt = Adam::adamw(3e-3, 0.1);
        opt.beta2 = 0.99;
        GptStep { store, gpt, opt, x, y }
    }
}

impl Step for GptStep {
    fn step(&mut self) -> f32 {
        let (gpt, x, y) = (&self.gpt, &self.x, &self.y);
        let (loss, mut grads) = Graph::scope(|g| {
            let p = self.store.bind(g);
            let loss = gpt.loss(&p, x, y, None)?;
            Ok::<_, Error>((loss.item()? as f32, p.grads(loss)?))
        })
        .expect("gpt step");
        grads.clip_global_norm(1.0).expect("clip");
        self.opt.step(&mut self.store, &grads).expect("adamw");
        loss
    }
}

/// Peak and live bytes of one step of the model `make` builds, after two
/// warm-up steps (so the optimizer's state exists, as in a steady loop),
/// counted from the bytes live before the model was made.
fn memory<S: Step>(id: &str, device: Device, make: impl FnOnce(Device) -> S) -> S {
    let base = memory_allocated(device);
    let mut s = make(device);
    s.step();
    s.step();
    let live = memory_allocated(device);
    reset_peak_memory_stats(device);
    s.step();
    let peak = max_memory_allocated(device);
    assert_eq!(memory_allocated(device), live, "{id}: live bytes changed across a step");
    println!(
        "{{\"id\": \"{id}\", \"device\": \"{device}\", \"peak_bytes\": {}, \"live_bytes\": {}}}",
        peak - base,
        live - base
    );
    s
}

fn bench(c: &mut Criterion, id: &str, s: &mut dyn Step) {
    let mut g = c.benchmark_group("nn_step");
    g.sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    g.bench_function(BenchmarkId::from_parameter(id), |b| {
        // Each step reads its loss, which waits for the work queued before
        // it: over many steps the clock reads work done on either device.
        b.iter_custom(|iters| {
            let t0 = Instant::now();
            for _ in 0..iters {
                std::hint::black_box(s.step());
            }
            t0.elapsed()
        })
    });
    g.finish();
}

fn main() {
    let device = device();
    let mut mlp = memory("nn_step/mlp", device, MlpStep::new);
    let mut gpt = memory("nn_step/gpt", device, GptStep::new);
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c, "mlp", &mut mlp);
    bench(&mut c, "gpt", &mut gpt);
    c.final_summary();
}
