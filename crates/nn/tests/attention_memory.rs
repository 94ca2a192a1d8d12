//! Exact device memory of causal attention's forward and backward: the
//! fused CUDA kernels hold nothing quadratic in T. The counters are
//! process-wide, so this file is its own test binary and its tests hold one
//! lock. On the emulated device (CI) the bytes are counted exactly.

use std::sync::{Mutex, MutexGuard};

use smallvec::smallvec;
use tapir_autograd::Graph;
use tapir_nn::{causal_attention, CausalAttention};
use tapir_tensor::max_memory_allocated;
use tapir_tensor::ops::Derivative;
use tapir_tensor::prelude::*;
use tapir_testing::cuda_or_skip;

static LOCK: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn inputs(b: usize, t: usize, c: usize, device: Device) -> [Tensor; 4] {
    [1, 2, 3, 4].map(|s| {
        Rng::new(s).normal_tensor([b, t, c], 0.0, 1.0, DType::F32).and_then(|x| x.to_device(device)).expect("input")
    })
}

/// The peak bytes above the live bytes at the start of `f`, on `device`.
fn peak_of(device: Device, f: impl FnOnce()) -> usize {
    synchronize(device);
    let base = memory_allocated(device);
    reset_peak_memory_stats(device);
    f();
    let peak = max_memory_allocated(device) - base;
    assert_eq!(memory_allocated(device), base, "everything is freed afterwards");
    peak
}

fn synchronize(device: Device) {
    tapir_tensor::cuda::synchronize(device).expect("synchronize");
}

/// Forward and backward of the fused op on tensors, as a first-order
/// backward runs it: the output, then the three gradients.
fn fused_step(op: CausalAttention, [q, k, v, g]: &[Tensor; 4]) {
    let y = causal_attention(q, k, v, op.heads).expect("forward");
    let d = op.vjp_eager(smallvec![q.clone(), k.clone(), v.clone()], y, g.clone()).expect("backward");
    assert!(d.iter().all(|x| x.is_some()));
}

/// The fused path's peak above q, k, v and g, in bytes, for elements of
/// `size` bytes (f32, f16, bf16; all three accumulate in f32): the output
/// y [B, T, C] (alive through the backward, which reads it), dq, dk, dv
/// [B, T, C], and two f32 rows of statistics per (batch, head) (the
/// log-sum-exp the backward recomputes, and g . y per query).
fn fused_peak_formula(b: usize, t: usize, c: usize, heads: usize, size: usize) -> usize {
    size * 4 * b * t * c + 4 * 2 * b * heads * t
}

#[test]
fn cuda_fused_attention_peak_is_linear_in_t() {
    let _s = serial();
    let Some(dev) = cuda_or_skip("cuda_fused_attention_peak_is_linear_in_t", Device::cuda(0)) else { return };
    let (b, c, heads) = (1, 64, 4);
    let op = CausalAttention { heads, scale: 1.0 / ((c / heads) as f64).sqrt() };
    // bf16 and f16 run the tensor-core kernels (compute capability 8.0
    // and newer, the emulated device's), which keep nothing beyond the
    // scalar kernels' in device memory: their tiles are in shared memory.
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for t in [40, 97, 130] {
            let xs = inputs(b, t, c, dev).map(|x| x.cast(dtype).expect("cast"));
            let peak = peak_of(dev, || fused_step(op, &xs));
            println!("fused causal attention {dtype}, B={b} T={t} C={c} H={heads}: peak {peak} bytes above the inputs");
            assert_eq!(peak, fused_peak_formula(b, t, c, heads, dtype.size_in_bytes()), "{dtype} T = {t}");
        }
    }
}

/// The same step through a graph (leaves, a loss, `grad`), so the
/// figure is what a training step sees; and the composed path's beside
/// it, which holds [B, H, T, T] scores and probabilities.
#[test]
fn cuda_attention_graph_peak_fused_and_composed() {
    let _s = serial();
    let Some(dev) = cuda_or_skip("cuda_attention_graph_peak_fused_and_composed", Device::cuda(0)) else { return };
    let (b, t, c, heads) = (1, 128, 64, 4);
    let op = CausalAttention { heads, scale: 1.0 / ((c / heads) as f64).sqrt() };
    let xs = inputs(b, t, c, dev);
    let run = |fused: bool| {
        peak_of(dev, || {
            Graph::scope(|g| {
                let [q, k, v] = [0, 1, 2].map(|i| g.leaf(xs[i].clone()));
                let y = if fused { causal_attention(&q, &k, &v, heads)? } else { op.composed(&q, &k, &v)? };
                let loss = y.mul(&g.constant(xs[3].clone()))?.sum_all()?;
                g.grad(loss, &[q, k, v])?;
                Ok::<_, Error>(())
            })
            .expect("step");
        })
    };
    let (fused, composed) = (run(true), run(false));
    println!("B={b} T={t} C={c} H={heads}: graph step peak, fused {fused} bytes, composed {composed} bytes");
    let tt = 4 * b * heads * t * t;
    assert!(fused < tt, "the fused step holds less than one [B, H, T, T] f32 tensor ({fused} bytes)");
    assert!(composed >= 3 * tt, "the composed step holds several [B, H, T, T] tensors ({composed} bytes)");
}

/// The case, B = 1, T = 512, C = 64, 4 heads: the fused step's
/// peak by the formula (540,672 bytes), and the composed step's, which
/// holds [B, H, T, T] scores and probabilities (25.2 MB and more).
#[test]
#[ignore = "about two minutes on the emulated device: cargo test --test attention_memory -- --ignored"]
fn cuda_attention_peak_at_t_512() {
    let _s = serial();
    let Some(dev) = cuda_or_skip("cuda_attention_peak_at_t_512", Device::cuda(0)) else { return };
    let (b, t, c, heads) = (1, 512, 64, 4);
    let op = CausalAttention { heads, scale: 1.0 / ((c / heads) as f64).sqrt() };
    let xs = inputs(b, t, c, dev);
    let fused = peak_of(dev, || fused_step(op, &xs));
    let composed = peak_of(dev, || {
        let [q, k, v, g] = &xs;
        let y = op.composed(q, k, v).expect("forward");
        let d = op.vjp(&[q, k, v], &y, g).expect("backward");
        assert!(d.iter().all(|x| x.is_some()));
    });
    println!("B={b} T={t} C={c} H={heads}: peak above the inputs, fused {fused} bytes, composed {composed} bytes");
    assert_eq!(fused, fused_peak_formula(b, t, c, heads, 4));
    assert!(composed >= 6 * 4 * b * heads * t * t, "the composed step holds six [B, H, T, T] tensors");
}

/// On the CPU a bf16 or f16 step keeps nothing of f32 at tensor scale: its
/// peak above q, k, v and g is the 16-bit output and the three 16-bit
/// gradients, exactly (each (batch, head) is widened into f32 scratch of
/// its own thread, eight [T, d] rows of it, outside the tensor allocator;
/// before, five [B, T, C] f32 copies of the operands and three f32
/// gradients stood beside them).
#[test]
fn cpu_half_attention_peak_is_its_outputs() {
    let _s = serial();
    let (b, t, c, heads) = (2, 33, 64, 4);
    let op = CausalAttention { heads, scale: 0.25 };
    for dtype in [DType::BF16, DType::F16] {
        let xs = inputs(b, t, c, Device::Cpu).map(|x| x.cast(dtype).expect("cast"));
        let peak = peak_of(Device::Cpu, || fused_step(op, &xs));
        assert_eq!(peak, 4 * b * t * c * 2, "{dtype}: y, dq, dk, dv in 16 bits");
    }
}
