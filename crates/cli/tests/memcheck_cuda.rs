//! `tapir memcheck --device cuda`: the scenarios on a CUDA device (the
//! emulated one in CI) grow by exactly zero bytes of device memory.

use tapir::prelude::*;
use tapir_cli::memcheck::scenarios;

/// The CUDA device, or None after saying why this test skips (a failure
/// under TAPIR_REQUIRE_CUDA=1).
fn cuda_or_skip(test: &str) -> Option<Device> {
    tapir_testing::cuda_or_skip(test, Device::cuda(0))
}

/// One test at a time: the device's counters are shared by the process.
static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The scenarios on `dev`, each growing by exactly zero bytes.
fn flat_on(dev: Device, names: &[&str]) {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let before = memory_allocated(dev);
    for s in scenarios().iter().filter(|s| names.contains(&s.name)) {
        let m = (s.run)(0.01, 6, dev).unwrap_or_else(|e| panic!("{}: {e}", s.name));
        assert_eq!(m.live.len(), 6);
        assert_eq!(m.growth(), 0, "{}: device live bytes {:?}, kept {:?}", s.name, m.live, m.kept);
        assert!(m.peak.iter().all(|&p| p > before), "{}: nothing ran on {dev}", s.name);
    }
    assert_eq!(memory_allocated(dev), before, "the scenarios freed what they made on {dev}");
}

#[tapir_testing::cuda_test]
fn memcheck_scenarios_on_cuda_are_flat() {
    let Some(dev) = cuda_or_skip("memcheck_scenarios_on_cuda_are_flat") else { return };
    flat_on(
        dev,
        &[
            "create_graph_cycle",
            "pinn_create_graph",
            "returned_second_derivative",
            "accumulated_loss",
            "eager_graph_growth",
            "hessian_optimizer_loop",
        ],
    );
}

#[tapir_testing::cuda_test]
fn memcheck_onehot_scenario_on_cuda_is_flat() {
    let Some(dev) = cuda_or_skip("memcheck_onehot_scenario_on_cuda_is_flat") else { return };
    flat_on(dev, &["onehot_cross_entropy"]);
}

#[tapir_testing::cuda_test]
fn memcheck_attention_scenario_on_cuda_matches_the_formula() {
    // The attention scenario's step (leaves, the fused op, a backward with
    // the output's gradient given) peaks at exactly 16 B T C + 8 B H T
    // bytes above its inputs on the device, T a multiple of no tile.
    let Some(dev) = cuda_or_skip("memcheck_attention_scenario_on_cuda_matches_the_formula") else { return };
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    use tapir_cli::memcheck_scale::{attention_figure, fused_attention_formula};
    for (t, h, d) in [(40, 2, 32), (97, 4, 16)] {
        let f = attention_figure(dev, DType::F32, 1, t, h, d, 1, false).unwrap();
        assert_eq!(f.peak, fused_attention_formula(1, t, h * d, h, 4), "T={t} H={h} D={d}");
        assert_eq!(f.live, 0);
    }
}

#[tapir_testing::cuda_test]
fn memcheck_attention_scenario_in_bf16_and_f16_on_cuda_matches_the_formula() {
    // `--dtype bf16|f16`: the tensor-core kernels (compute capability 8.0
    // and newer, the emulated device's) peak at exactly 8 B T C + 8 B H T
    // bytes above the inputs, half of f32's activations, the statistics
    // still f32; the composed path holds its [B, H, T, T] scores and
    // probabilities beyond that floor.
    let Some(dev) = cuda_or_skip("memcheck_attention_scenario_in_bf16_and_f16_on_cuda_matches_the_formula") else {
        return;
    };
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    use tapir_cli::memcheck_scale::{attention_figure, composed_attention_floor, fused_attention_formula};
    for dtype in [DType::BF16, DType::F16] {
        for (t, h, d) in [(40, 2, 32), (97, 4, 16)] {
            let f = attention_figure(dev, dtype, 1, t, h, d, 0, false).unwrap();
            assert_eq!(f.peak, fused_attention_formula(1, t, h * d, h, 2), "{dtype} T={t} H={h} D={d}");
            assert_eq!(f.live, 0);
        }
    }
    let (t, h, d) = (64, 2, 32);
    let composed = attention_figure(dev, DType::BF16, 1, t, h, d, 0, true).unwrap();
    assert!(composed.peak >= composed_attention_floor(1, t, h, 2), "composed peak {}", composed.peak);
    assert_eq!(composed.live, 0);
}
