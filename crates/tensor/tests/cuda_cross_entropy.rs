//! CPU-vs-CUDA parity of the cross-entropy losses (the sparse loss and the
//! fused linear head): values and gradients, eager and recorded, at
//! `[N, V]` and `[B, S, V]`, ragged shapes, every float dtype, label
//! smoothing, ignore_index, every reduction; bad labels (the CPU's error,
//! nothing leaked); and exact peak-memory bounds on the device.
//!
//! Every test needs a CUDA device (a GPU, or the emulated one with
//! `TAPIR_CUDA=emulated`); without one it says so and passes, unless
//! `TAPIR_REQUIRE_CUDA=1` makes the skip a failure. The memory counters are
//! process-wide, so the tests take one lock and run one at a time.

use std::sync::{Mutex, MutexGuard};

use tapir::prelude::*;
use tapir::tensor::ops::cross_entropy::{CrossEntropyOptions, Reduction};

#[path = "support/cuda.rs"]
mod support;
use support::cuda;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// `n` pseudo-random values in `[-scale, scale)` (a fixed LCG).
fn noise(n: usize, scale: f64, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            scale * (2.0 * ((s >> 11) as f64 / (1u64 << 53) as f64) - 1.0)
        })
        .collect()
}

fn tensor(v: Vec<f64>, shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_vec(v, shape.to_vec()).unwrap().cast(dtype).unwrap()
}

/// Labels in `0..v`, with every `ignore_every`-th row set to `ignore`.
fn labels(rows: usize, v: usize, ignore_every: usize, ignore: i64, seed: u64) -> Vec<i64> {
    noise(rows, 1.0, seed)
        .iter()
        .enumerate()
        .map(|(i, u)| {
            if ignore_every > 0 && i % ignore_every == 0 {
                ignore
            } else {
                ((u + 1.0) / 2.0 * v as f64) as i64 % v as i64
            }
        })
        .collect()
}

/// Tolerance relative to the largest magnitude of the reference: both
/// sides compute in f32 (f64 for f64) in a different order, and f16 and
/// bf16 results are one rounding of the same f32 value apart.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-11,
        DType::F32 => 2e-5,
        DType::F16 => 2e-3,
        _ => 1.6e-2,
    }
}

fn assert_close(what: &str, got: &Tensor, want: &Tensor, dtype: DType) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (g, w) = (got.to_vec_f64(), want.to_vec_f64());
    let scale = w.iter().fold(0.0f64, |a, b| a.max(b.abs())).max(1e-3);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        if b.is_nan() {
            assert!(a.is_nan(), "{what}[{i}]: {a} vs NaN");
            continue;
        }
        assert!((a - b).abs() <= tolerance(dtype) * scale, "{what}[{i}]: cuda {a} vs cpu {b} ({dtype:?})");
    }
}

/// The sparse loss and its gradient, eager (`g.grad`) and recorded
/// (`g.grad_graph`), on `device`.
fn sparse_run(x: &Tensor, l: &Tensor, o: CrossEntropyOptions, device: Device) -> (Tensor, Tensor, Tensor, Tensor) {
    let (x, l) = (x.to_device(device).unwrap(), l.to_device(device).unwrap());
    let plain = x.sparse_cross_entropy_with(&l, o).unwrap();
    let (loss, eager, recorded) = Graph::scope(|g| {
        let xv = g.leaf(x.clone());
        let loss = xv.sparse_cross_entropy_with(&l, o)?;
        // A scalar seed for every reduction: the sum of the per-row losses
        // weighted by fixed values, so the per-row gradient is tested too.
        let out = match o.reduction {
            Reduction::None => {
                let w = tensor(noise(loss.shape().numel(), 1.0, 9), loss.shape().dims(), loss.dtype());
                loss.mul(&g.constant(w.to_device(device)?))?.sum_all()?
            }
            _ => loss,
        };
        let value = loss.value()?;
        let eager = g.grad_with(&[out], &[xv], GradOptions { grad_outputs: None, retain_graph: true })?;
        let recorded = g.grad_graph(out, &[xv])?[0].value()?;
        Ok::<_, Error>((value, eager[0].clone(), recorded))
    })
    .unwrap();
    assert_eq!(plain.to_vec_f64().len(), loss.to_vec_f64().len());
    (plain, loss, eager, recorded)
}

fn sparse_case(dev: Device, lead: &[usize], v: usize, dtype: DType, o: CrossEntropyOptions, ignore_every: usize) {
    let rows: usize = lead.iter().product();
    let mut shape = lead.to_vec();
    shape.push(v);
    let x = tensor(noise(rows * v, 6.0, rows as u64 + v as u64), &shape, dtype);
    let l = Tensor::from_vec(labels(rows, v, ignore_every, o.ignore_index, 3), lead.to_vec()).unwrap();
    let cpu = sparse_run(&x, &l, o, Device::Cpu);
    let gpu = sparse_run(&x, &l, o, dev);
    let what = format!("{lead:?} x {v} {dtype:?} {o:?}");
    assert_close(&format!("{what} eager loss"), &gpu.0, &cpu.0, dtype);
    assert_close(&format!("{what} loss"), &gpu.1, &cpu.1, dtype);
    assert_close(&format!("{what} grad"), &gpu.2, &cpu.2, dtype);
    assert_close(&format!("{what} recorded grad"), &gpu.3, &cpu.3, dtype);
    assert_eq!(gpu.2.device(), dev);
}

fn opts(reduction: Reduction, label_smoothing: f64, ignore_index: i64) -> CrossEntropyOptions {
    CrossEntropyOptions { ignore_index, label_smoothing, reduction }
}

/// Both shapes, every dtype, every reduction, smoothing and ignore_index.
#[tapir_testing::cuda_test]
fn cuda_sparse_cross_entropy_matches_the_cpu() {
    let _s = serial();
    let Some(dev) = cuda("cuda_sparse_cross_entropy_matches_the_cpu") else { return };
    for dtype in FLOATS {
        for red in [Reduction::Mean, Reduction::Sum, Reduction::None] {
            sparse_case(dev, &[6], 1000, dtype, opts(red, 0.0, -100), 4);
            sparse_case(dev, &[2, 3], 1000, dtype, opts(red, 0.1, 5), 3);
        }
    }
}

/// Rows as long as real vocabularies: 32,000 (rows a multiple of 16 bytes:
/// the 16-byte packs, each thread through many of them) and GPT-2's 50,257
/// (odd: no row after the first is 16-byte aligned, so the scalar path),
/// with label smoothing and ignored rows; f32 and bf16.
#[tapir_testing::cuda_test]
fn cuda_sparse_cross_entropy_at_vocabulary_scale() {
    let _s = serial();
    let Some(dev) = cuda("cuda_sparse_cross_entropy_at_vocabulary_scale") else { return };
    for dtype in [DType::F32, DType::BF16] {
        sparse_case(dev, &[16], 32_000, dtype, opts(Reduction::Mean, 0.1, -100), 5);
        sparse_case(dev, &[3], 50_257, dtype, opts(Reduction::None, 0.0, -100), 0);
    }
}

/// Ragged shapes: V not a multiple of the block, a single row, tiny rows,
/// and every row ignored (a mean of no rows is NaN with a zero gradient).
#[tapir_testing::cuda_test]
fn cuda_sparse_cross_entropy_ragged_shapes() {
    let _s = serial();
    let Some(dev) = cuda("cuda_sparse_cross_entropy_ragged_shapes") else { return };
    for dtype in [DType::F32, DType::BF16] {
        sparse_case(dev, &[1], 2999, dtype, opts(Reduction::Mean, 0.0, -100), 0);
        sparse_case(dev, &[5], 3, dtype, opts(Reduction::Sum, 0.2, -100), 2);
        sparse_case(dev, &[3], 257, dtype, opts(Reduction::Mean, 0.0, -1), 1);
        sparse_case(dev, &[3], 257, dtype, opts(Reduction::Sum, 0.0, -1), 1);
    }
    // i32 labels take the other kernels.
    let x = tensor(noise(4 * 300, 3.0, 1), &[4, 300], DType::F32);
    let l = Tensor::from_vec(vec![0i32, 299, -100, 7], [4]).unwrap();
    let cpu = x.sparse_cross_entropy(&l).unwrap();
    let gpu = x.to_device(dev).unwrap().sparse_cross_entropy(&l.to_device(dev).unwrap()).unwrap();
    assert_close("i32 labels", &gpu, &cpu, DType::F32);
    // torch's special rows, as on the CPU: +inf or NaN in a row makes its
    // loss and gradient NaN; a row of -inf has a NaN loss.
    let mut v = noise(4 * 70, 3.0, 8);
    v[3] = f64::INFINITY;
    v[70 + 9] = f64::NAN;
    v[140..210].iter_mut().for_each(|e| *e = f64::NEG_INFINITY);
    let x = tensor(v, &[4, 70], DType::F32);
    let l = Tensor::from_vec(vec![1i64, 2, 3, 4], [4]).unwrap();
    let o = opts(Reduction::None, 0.0, -100);
    let cpu = sparse_run(&x, &l, o, Device::Cpu);
    let gpu = sparse_run(&x, &l, o, dev);
    assert!(cpu.1.to_vec_f64()[..3].iter().all(|e| e.is_nan()), "{:?}", cpu.1.to_vec_f64());
    assert_close("special rows loss", &gpu.1, &cpu.1, DType::F32);
    assert_close("special rows grad", &gpu.2, &cpu.2, DType::F32);
}

/// A second derivative through the loss (the recorded rule) on the device.
#[tapir_testing::cuda_test]
fn cuda_sparse_cross_entropy_hessian_vector_product() {
    let _s = serial();
    let Some(dev) = cuda("cuda_sparse_cross_entropy_hessian_vector_product") else { return };
    let x = tensor(noise(4 * 50, 2.0, 5), &[4, 50], DType::F64);
    let v = tensor(noise(4 * 50, 1.0, 6), &[4, 50], DType::F64);
    let l = Tensor::from_vec(vec![3i64, -100, 49, 0], [4]).unwrap();
    let o = opts(Reduction::Mean, 0.1, -100);
    let hvp = |d: Device| {
        let (x, v, l) = (x.to_device(d).unwrap(), v.to_device(d).unwrap(), l.to_device(d).unwrap());
        Graph::scope(|g| {
            let xv = g.leaf(x.clone());
            g.hvp(xv.sparse_cross_entropy_with(&l, o)?, xv, &v)
        })
        .unwrap()
    };
    assert_close("hvp", &hvp(dev), &hvp(Device::Cpu), DType::F64);
}

/// A label out of range is the CPU's error, naming the same (lowest) row
/// and value, and the call frees what it allocated.
#[tapir_testing::cuda_test]
fn cuda_sparse_cross_entropy_bad_labels() {
    let _s = serial();
    let Some(dev) = cuda("cuda_sparse_cross_entropy_bad_labels") else { return };
    let x = tensor(noise(8 * 100, 3.0, 2), &[8, 100], DType::F32);
    let xd = x.to_device(dev).unwrap();
    for (bad, dtype) in [(vec![(5usize, 100i64), (6, -3)], DType::I64), (vec![(2, -7), (7, 1000)], DType::I32)] {
        let mut l = vec![1i64; 8];
        for &(r, v) in &bad {
            l[r] = v;
        }
        let l = Tensor::from_vec(l, [8]).unwrap().cast(dtype).unwrap();
        let want = x.sparse_cross_entropy(&l).unwrap_err();
        let ld = l.to_device(dev).unwrap();
        let base = memory_allocated(dev);
        let got = xd.sparse_cross_entropy(&ld).unwrap_err();
        assert_eq!(format!("{got:?}"), format!("{want:?}"));
        assert!(matches!(got, Error::LabelOutOfRange { row, .. } if row == bad[0].0));
        assert_eq!(memory_allocated(dev), base, "the failed call leaked");
        let w = tensor(noise(100 * 16, 0.1, 3), &[100, 16], DType::F32).to_device(dev).unwrap();
        let h = tensor(noise(8 * 16, 1.0, 4), &[8, 16], DType::F32).to_device(dev).unwrap();
        let got = h.linear_cross_entropy(&w, None, &ld, CrossEntropyOptions::default(), Some(3)).unwrap_err();
        assert!(matches!(got, Error::LabelOutOfRange { row, .. } if row == bad[0].0), "{got:?}");
        assert_eq!(memory_allocated(dev), base + (100 * 16 + 8 * 16) * 4, "the failed head leaked");
    }
}

/// The fused head's loss and gradients on `device`: eager recompute (no
/// graph), precomputed in the forward (graph, first order) and recorded.
#[allow(clippy::type_complexity)]
fn head_run(
    xs: &[Tensor],
    l: &Tensor,
    o: CrossEntropyOptions,
    chunk: usize,
    d: Device,
) -> (Tensor, Vec<Tensor>, Vec<Tensor>) {
    let xs: Vec<Tensor> = xs.iter().map(|t| t.to_device(d).unwrap()).collect();
    let l = l.to_device(d).unwrap();
    Graph::scope(|g| {
        let vs: Vec<_> = xs.iter().map(|t| g.leaf(t.clone())).collect();
        let loss = vs[0].linear_cross_entropy(&vs[1], vs.get(2), &l, o, Some(chunk))?;
        let out = match o.reduction {
            Reduction::None => loss.mul_scalar(0.5)?.sum_all()?,
            _ => loss,
        };
        let value = loss.value()?;
        // Eager first, from the gradients the forward made; then recorded.
        let eager = g.grad_with(&[out], &vs, GradOptions { grad_outputs: None, retain_graph: true })?;
        let recorded = g.grad_graph(out, &vs)?.iter().map(|v| v.value()).collect::<Result<Vec<_>>>()?;
        Ok::<_, Error>((value, eager, recorded))
    })
    .unwrap()
}

fn head_case(dev: Device, lead: &[usize], dd: usize, v: usize, dtype: DType, o: CrossEntropyOptions, bias: bool) {
    let rows: usize = lead.iter().product();
    let mut hs = lead.to_vec();
    hs.push(dd);
    let mut xs = vec![tensor(noise(rows * dd, 1.0, 11), &hs, dtype), tensor(noise(v * dd, 0.3, 12), &[v, dd], dtype)];
    if bias {
        xs.push(tensor(noise(v, 0.5, 13), &[v], dtype));
    }
    let l = Tensor::from_vec(labels(rows, v, 3, o.ignore_index, 14), lead.to_vec()).unwrap();
    for chunk in [2, 64] {
        let cpu = head_run(&xs, &l, o, chunk, Device::Cpu);
        let gpu = head_run(&xs, &l, o, chunk, dev);
        let what = format!("head {lead:?} x {dd} x {v} {dtype:?} chunk {chunk} {o:?}");
        assert_close(&format!("{what} loss"), &gpu.0, &cpu.0, dtype);
        for (i, (a, b)) in gpu.1.iter().zip(&cpu.1).enumerate() {
            assert_close(&format!("{what} grad {i}"), a, b, dtype);
        }
        for (i, (a, b)) in gpu.2.iter().zip(&cpu.2).enumerate() {
            assert_close(&format!("{what} recorded grad {i}"), a, b, dtype);
        }
    }
    // Eager, on plain tensors: the backward recomputes each chunk.
    let xd: Vec<Tensor> = xs.iter().map(|t| t.to_device(dev).unwrap()).collect();
    let gpu = xd[0].linear_cross_entropy(&xd[1], xd.get(2), &l.to_device(dev).unwrap(), o, Some(5)).unwrap();
    let cpu = xs[0].linear_cross_entropy(&xs[1], xs.get(2), &l, o, Some(5)).unwrap();
    assert_close("plain head", &gpu, &cpu, dtype);
}

#[tapir_testing::cuda_test]
fn cuda_linear_cross_entropy_matches_the_cpu() {
    let _s = serial();
    let Some(dev) = cuda("cuda_linear_cross_entropy_matches_the_cpu") else { return };
    for dtype in FLOATS {
        head_case(dev, &[7], 16, 1000, dtype, opts(Reduction::Mean, 0.0, -100), true);
    }
    head_case(dev, &[2, 3], 8, 1001, DType::F32, opts(Reduction::Sum, 0.1, 4), false);
    head_case(dev, &[5], 8, 300, DType::F32, opts(Reduction::None, 0.0, -100), true);
    head_case(dev, &[1], 8, 257, DType::BF16, opts(Reduction::Mean, 0.2, -100), false);
    head_case(dev, &[3], 8, 131, DType::F64, opts(Reduction::Sum, 0.1, -100), false);
    head_case(dev, &[3], 8, 131, DType::F16, opts(Reduction::None, 0.0, 1), false);
    // Every row ignored.
    head_case(dev, &[4], 8, 100, DType::F32, opts(Reduction::Mean, 0.0, 0), true);
}

/// The head's backward without precomputed gradients (a second backward
/// of a retained graph, and reduction none) recomputes the chunks.
#[tapir_testing::cuda_test]
fn cuda_linear_cross_entropy_recomputing_backward() {
    let _s = serial();
    let Some(dev) = cuda("cuda_linear_cross_entropy_recomputing_backward") else { return };
    let xs =
        [tensor(noise(9 * 8, 1.0, 21), &[9, 8], DType::F32), tensor(noise(500 * 8, 0.3, 22), &[500, 8], DType::F32)];
    let l = Tensor::from_vec(labels(9, 500, 4, -100, 23), [9]).unwrap();
    let run = |d: Device| {
        let (h, w, l) = (xs[0].to_device(d).unwrap(), xs[1].to_device(d).unwrap(), l.to_device(d).unwrap());
        Graph::scope(|g| {
            let (hv, wv) = (g.leaf(h.clone()), g.leaf(w.clone()));
            let loss = hv.linear_cross_entropy(&wv, None, &l, CrossEntropyOptions::default(), Some(4))?;
            let opts = || GradOptions { grad_outputs: None, retain_graph: true };
            let first = g.grad_with(&[loss], &[hv, wv], opts())?;
            let second = g.grad_with(&[loss], &[hv, wv], opts())?;
            Ok::<_, Error>((first, second))
        })
        .unwrap()
    };
    let (cpu, gpu) = (run(Device::Cpu), run(dev));
    for (a, b) in gpu.0.iter().chain(&gpu.1).zip(cpu.0.iter().chain(&cpu.1)) {
        assert_close("head grads", a, b, DType::F32);
    }
}

const N: usize = 64;
const V: usize = 2000;
const SLACK: usize = 4096;

/// The sparse loss on the device: forward adds O(N) and allocates nothing
/// of N x V; forward plus backward adds at most the gradient and O(N); and
/// when the loss is the logits' last reader the gradient is written over
/// them (no N x V buffer above the forward).
#[tapir_testing::cuda_test]
fn cuda_sparse_cross_entropy_memory_bounds() {
    let _s = serial();
    let Some(dev) = cuda("cuda_sparse_cross_entropy_memory_bounds") else { return };
    let x = tensor(noise(N * V, 4.0, 31), &[N, V], DType::F32).to_device(dev).unwrap();
    let l = Tensor::from_vec(labels(N, V, 5, -100, 32), [N]).unwrap().to_device(dev).unwrap();
    Graph::scope(|g| {
        let xv = g.leaf(x.clone());
        reset_peak_memory_stats(dev);
        let base = memory_allocated(dev);
        let loss = xv.sparse_cross_entropy(&l)?;
        let s = memory_stats(dev);
        assert!(s.peak - base <= 16 * N + SLACK, "forward added {} bytes", s.peak - base);
        assert!(s.largest_allocation < N * V, "forward allocated {} bytes at once", s.largest_allocation);
        g.grad(loss, &[xv])?;
        let s = memory_stats(dev);
        assert!(s.peak - base <= N * V * 4 + 16 * N + SLACK, "forward+backward added {}", s.peak - base);
        Ok::<_, Error>(())
    })
    .unwrap();
    const D: usize = 8;
    let h0 = tensor(noise(N * D, 1.0, 33), &[N, D], DType::F32).to_device(dev).unwrap();
    let w0 = tensor(noise(V * D, 1.0, 34), &[V, D], DType::F32).to_device(dev).unwrap();
    let run = |retain: bool| {
        Graph::scope(|g| {
            let (h, w) = (g.leaf(h0.clone()), g.leaf(w0.clone()));
            let loss = h.matmul(&w.t()?)?.sparse_cross_entropy(&l)?;
            let forward = memory_allocated(dev);
            reset_peak_memory_stats(dev);
            let grads = g.grad_with(&[loss], &[h, w], GradOptions { grad_outputs: None, retain_graph: retain })?;
            Ok::<_, Error>((grads, memory_stats(dev).peak - forward))
        })
        .unwrap()
    };
    let (reused, extra) = run(false);
    let bound = (N * D + V * D) * 4 + 16 * N + SLACK;
    assert!(extra <= bound, "backward added {extra} bytes above the forward, bound {bound}");
    let (kept, extra_kept) = run(true);
    assert!(extra_kept >= N * V * 4, "with the logits kept, the gradient needs its own buffer ({extra_kept})");
    for (a, b) in reused.iter().zip(&kept) {
        assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    }
}

/// The fused head on the device holds what the CPU's head holds, by the
/// CPU's formula: above its inputs, one chunk of logits (`chunk x V`),
/// the gradients of its inputs (`N x D + V x D + V`) and O(N), with no
/// second chunk for the bias and no per-chunk `V x D` or `N x D` product.
/// The shapes make one chunk of logits larger than `weight`, so the
/// largest allocation is exactly that chunk. The forward's peak is exact:
/// the chunk, the gradients when it makes them, and its O(N) (the lse and
/// per-row losses, 8 bytes a row, one flag word per chunk and one for the
/// count of kept rows, and the unit row weight). Both paths: gradients
/// made in the forward (recorded, mean), and the backward recomputing each
/// chunk (reduction none, `weight` and `bias` constants), whose peak holds
/// the chunk and the gradients together.
#[tapir_testing::cuda_test]
fn cuda_linear_cross_entropy_memory_bounds() {
    let _s = serial();
    let Some(dev) = cuda("cuda_linear_cross_entropy_memory_bounds") else { return };
    const D: usize = 8;
    const CHUNK: usize = 16;
    let h = tensor(noise(N * D, 1.0, 41), &[N, D], DType::F32).to_device(dev).unwrap();
    let w = tensor(noise(V * D, 0.1, 42), &[V, D], DType::F32).to_device(dev).unwrap();
    let b = tensor(noise(V, 0.1, 43), &[V], DType::F32).to_device(dev).unwrap();
    let l = Tensor::from_vec(labels(N, V, 5, -100, 44), [N]).unwrap().to_device(dev).unwrap();
    let chunk_bytes = CHUNK * V * 4;
    let grads = (N * D + V * D + V) * 4;
    assert!(chunk_bytes > V * D * 4, "the shapes must make a chunk the largest buffer");
    let bound = chunk_bytes + grads + 16 * N + SLACK;
    let small = 8 * N + 8 * (N.div_ceil(CHUNK) + 1) + 4;
    for recorded in [true, false] {
        Graph::scope(|g| {
            let vs = [g.leaf(h.clone()), g.leaf(w.clone()), g.leaf(b.clone())];
            reset_peak_memory_stats(dev);
            let base = memory_allocated(dev);
            let loss = if recorded {
                vs[0].linear_cross_entropy(&vs[1], Some(&vs[2]), &l, CrossEntropyOptions::default(), Some(CHUNK))?
            } else {
                // On constants nothing is precomputed: the backward recomputes.
                let (hc, wc, bc) = (g.constant(h.clone()), g.constant(w.clone()), g.constant(b.clone()));
                let o = CrossEntropyOptions { reduction: Reduction::None, ..Default::default() };
                vs[0]
                    .linear_cross_entropy(&wc, Some(&bc), &l, o, Some(CHUNK))?
                    .sum_all()?
                    .add(&hc.sum_all()?.mul_scalar(0.0)?)?
            };
            let forward = memory_stats(dev);
            g.grad(loss, &vs[..1])?;
            let s = memory_stats(dev);
            let (fwd, peak) = (forward.peak - base, s.peak - base);
            println!(
                "head N={N} D={D} V={V} chunk={CHUNK} f32 bias, recorded {recorded}: forward peak +{fwd} B, \
                 forward+backward peak +{peak} B, largest allocation {} B; bound {bound} B \
                 (chunk {chunk_bytes} + gradients {grads} + 16 N {} + slack {SLACK})",
                s.largest_allocation,
                16 * N
            );
            assert_eq!(s.largest_allocation, chunk_bytes, "recorded {recorded}: largest allocation");
            let made = if recorded { grads } else { 0 };
            assert_eq!(fwd, chunk_bytes + made + small, "recorded {recorded}: the forward's peak");
            assert!(peak <= bound, "recorded {recorded}: forward+backward added {peak}, bound {bound}");
            assert!(peak >= chunk_bytes + grads, "recorded {recorded}: peak {peak} below a chunk and the gradients");
            if recorded {
                // The forward made the gradients; the backward only scales them.
                assert_eq!(peak, fwd, "the backward added to the recorded forward's peak");
            }
            Ok::<_, Error>(())
        })
        .unwrap();
    }
}
