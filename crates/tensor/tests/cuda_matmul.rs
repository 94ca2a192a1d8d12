//! Matrix products on CUDA (cuBLAS) against the CPU: ragged 2-D sizes,
//! transposed and strided views, batches with broadcast batch dims, the
//! vector forms, every float dtype, the same errors as the CPU, and live
//! bytes back where they were.
//!
//! Every test needs a CUDA device (a GPU, or the emulated one with
//! `TAPIR_CUDA=emulated`); without one it says so and passes, unless
//! `TAPIR_REQUIRE_CUDA=1` makes the skip a failure. The tests hold one lock
//! because the memory counters are process-wide.

use std::sync::{Mutex, MutexGuard};

use tapir_tensor::prelude::*;

#[path = "support/cuda.rs"]
mod support;

static LOCK: Mutex<()> = Mutex::new(());

/// The device and the lock, or `None` after saying why the test skips.
fn cuda(test: &str) -> Option<(Device, MutexGuard<'static, ()>)> {
    let guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    support::cuda(test).map(|d| (d, guard))
}

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Deterministic values in `[-1, 1)`, irregular enough to catch a wrong index.
fn tensor(shape: &[usize], seed: u64, dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> =
        (0..n).map(|i| -1.0 + 2.0 * (((i as u64 * 7919 + seed * 104_729) % 1009) as f64 / 1009.0)).collect();
    Tensor::from_vec(v, shape.to_vec()).unwrap().cast(dtype).unwrap()
}

/// Both devices' products agree within the dtype's rounding: f32 and f64
/// sum in another order than the CPU's gemm; f16 and bf16 accumulate in
/// f32 on both and round once, so they differ by at most an ulp or so.
fn assert_close(what: &str, cpu: &Tensor, gpu: &Tensor) {
    assert_eq!(cpu.shape(), gpu.shape(), "{what}: shape");
    assert_eq!(cpu.dtype(), gpu.dtype(), "{what}: dtype");
    assert!(matches!(gpu.device(), Device::Cuda(_)), "{what}: the result stays on the device");
    let tol = match cpu.dtype() {
        DType::F64 => 1e-13,
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        _ => 1.6e-2,
    };
    tapir_testing::assert_close(what, &gpu.to_device(Device::Cpu).unwrap().to_vec_f64(), &cpu.to_vec_f64(), tol);
}

/// `a @ b` on both devices, compared.
fn check(what: &str, dev: Device, a: &Tensor, b: &Tensor) {
    let cpu = a.matmul(b).unwrap_or_else(|e| panic!("{what}: cpu: {e}"));
    let (da, db) = (a.to_device(dev).unwrap(), b.to_device(dev).unwrap());
    let gpu = da.matmul(&db).unwrap_or_else(|e| panic!("{what}: cuda: {e}"));
    assert_close(what, &cpu, &gpu);
}

/// `f(a) @ g(b)` with the views taken on each device, so the CUDA product
/// sees the strided layout itself.
fn check_view(
    what: &str,
    dev: Device,
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(&Tensor) -> Tensor,
    g: impl Fn(&Tensor) -> Tensor,
) {
    let cpu = f(a).matmul(&g(b)).unwrap_or_else(|e| panic!("{what}: cpu: {e}"));
    let (da, db) = (f(&a.to_device(dev).unwrap()), g(&b.to_device(dev).unwrap()));
    let gpu = da.matmul(&db).unwrap_or_else(|e| panic!("{what}: cuda: {e}"));
    assert_close(what, &cpu, &gpu);
}

/// Ragged sizes around the tiles a GPU kernel uses.
const SIZES: [(usize, usize, usize); 8] =
    [(1, 1, 1), (1, 7, 33), (7, 33, 1), (33, 7, 65), (65, 33, 7), (7, 65, 33), (65, 1, 65), (33, 65, 33)];

#[tapir_testing::cuda_test]
fn cuda_matmul_matches_the_cpu_on_ragged_2d_sizes_in_every_float_dtype() {
    let Some((dev, _g)) = cuda("cuda_matmul_matches_the_cpu_on_ragged_2d_sizes_in_every_float_dtype") else {
        return;
    };
    for dtype in FLOATS {
        for (i, &(m, k, n)) in SIZES.iter().enumerate() {
            let (a, b) = (tensor(&[m, k], i as u64, dtype), tensor(&[k, n], 50 + i as u64, dtype));
            check(&format!("{dtype:?} [{m}, {k}] x [{k}, {n}]"), dev, &a, &b);
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_matmul_reads_transposed_and_strided_views_in_place() {
    let Some((dev, _g)) = cuda("cuda_matmul_reads_transposed_and_strided_views_in_place") else { return };
    let id = |t: &Tensor| t.clone();
    let t = |t: &Tensor| t.t().unwrap();
    for dtype in FLOATS {
        for &(m, k, n) in &SIZES[2..6] {
            let what = |v: &str| format!("{dtype:?} {m}x{k}x{n} {v}");
            // a^T and b^T stored: [k, m] and [n, k], transposed views (op T, no copy).
            let (at, bt) = (tensor(&[k, m], 1, dtype), tensor(&[n, k], 2, dtype));
            let (a, b) = (tensor(&[m, k], 3, dtype), tensor(&[k, n], 4, dtype));
            check_view(&what("a^T view"), dev, &at, &b, t, id);
            check_view(&what("b^T view"), dev, &a, &bt, id, t);
            check_view(&what("both views"), dev, &at, &bt, t, t);
            // Narrowed columns: rows keep a longer stride (a leading dimension > k).
            let wide = tensor(&[m, k + 5], 5, dtype);
            check_view(&what("narrowed a"), dev, &wide, &b, |x| x.narrow(1, 2, k).unwrap(), id);
            // A stride of 2 along both dims: neither op N nor op T, so a copy.
            let spaced = tensor(&[m, k, 2], 6, dtype);
            let every_other = |x: &Tensor| x.narrow(2, 1, 1).unwrap().squeeze(2).unwrap();
            check_view(&what("stride-2 a"), dev, &spaced, &b, every_other, id);
            // An expanded row (stride 0): a copy too.
            let row = tensor(&[1, k], 7, dtype);
            check_view(&what("expanded a"), dev, &row, &b, |x| x.expand([m, k]).unwrap(), id);
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_matmul_batches_and_broadcasts_batch_dims() {
    let Some((dev, _g)) = cuda("cuda_matmul_batches_and_broadcasts_batch_dims") else { return };
    let id = |t: &Tensor| t.clone();
    for dtype in FLOATS {
        let (m, k, n) = (7, 33, 5);
        let case = |s: &str| format!("{dtype:?} {s}");
        // [b, m, k] x [k, n]: b broadcast with stride 0.
        check(&case("[3,m,k] x [k,n]"), dev, &tensor(&[3, m, k], 1, dtype), &tensor(&[k, n], 2, dtype));
        // [m, k] x [b, k, n].
        check(&case("[m,k] x [3,k,n]"), dev, &tensor(&[m, k], 3, dtype), &tensor(&[3, k, n], 4, dtype));
        // [b, m, k] x [b, k, n].
        check(&case("[4,m,k] x [4,k,n]"), dev, &tensor(&[4, m, k], 5, dtype), &tensor(&[4, k, n], 6, dtype));
        // [b, 1, m, k] x [c, k, n]: the output batch is [b, c]; a steps b
        // only and b steps c only, so one call per b.
        check(&case("[2,1,m,k] x [3,k,n]"), dev, &tensor(&[2, 1, m, k], 7, dtype), &tensor(&[3, k, n], 8, dtype));
        // [b, 1, m, k] x [1, c, k, n] and the reverse broadcast.
        check(&case("[2,1,m,k] x [1,3,k,n]"), dev, &tensor(&[2, 1, m, k], 9, dtype), &tensor(&[1, 3, k, n], 10, dtype));
        check(
            &case("[1,3,m,k] x [2,1,k,n]"),
            dev,
            &tensor(&[1, 3, m, k], 11, dtype),
            &tensor(&[2, 1, k, n], 12, dtype),
        );
        // Batched transposed views, and a batch dim that is not outermost in memory.
        let bt = tensor(&[3, n, k], 13, dtype);
        check_view(&case("[3,m,k] x [3,n,k]^T"), dev, &tensor(&[3, m, k], 14, dtype), &bt, id, |x| x.t().unwrap());
        let inner = tensor(&[m, 3, k], 15, dtype);
        let permuted = |x: &Tensor| x.permute(&[1, 0, 2]).unwrap();
        check_view(&case("permuted batch"), dev, &inner, &tensor(&[3, k, n], 16, dtype), permuted, id);
    }
}

#[tapir_testing::cuda_test]
fn cuda_matmul_takes_the_vector_forms_the_cpu_takes() {
    let Some((dev, _g)) = cuda("cuda_matmul_takes_the_vector_forms_the_cpu_takes") else { return };
    for dtype in FLOATS {
        let (m, k, n) = (7, 33, 5);
        let case = |s: &str| format!("{dtype:?} {s}");
        check(&case("[k] x [k,n]"), dev, &tensor(&[k], 1, dtype), &tensor(&[k, n], 2, dtype));
        check(&case("[m,k] x [k]"), dev, &tensor(&[m, k], 3, dtype), &tensor(&[k], 4, dtype));
        check(&case("[k] x [k]"), dev, &tensor(&[k], 5, dtype), &tensor(&[k], 6, dtype));
        check(&case("[2,m,k] x [k]"), dev, &tensor(&[2, m, k], 7, dtype), &tensor(&[k], 8, dtype));
        check(&case("[k] x [2,k,n]"), dev, &tensor(&[k], 9, dtype), &tensor(&[2, k, n], 10, dtype));
    }
}

#[tapir_testing::cuda_test]
fn cuda_matmul_of_empty_operands_is_empty_or_zero() {
    let Some((dev, _g)) = cuda("cuda_matmul_of_empty_operands_is_empty_or_zero") else { return };
    for dtype in FLOATS {
        // k = 0: an empty sum, every element 0 (the block is not left unwritten).
        let (a, b) = (tensor(&[3, 0], 1, dtype), tensor(&[0, 4], 2, dtype));
        let y = a.to_device(dev).unwrap().matmul(&b.to_device(dev).unwrap()).unwrap();
        assert_eq!(y.dims(), &[3, 4]);
        assert_eq!(y.to_vec_f64(), vec![0.0; 12], "{dtype:?}");
        // m = 0 and a zero batch: empty results.
        check(&format!("{dtype:?} m = 0"), dev, &tensor(&[0, 3], 3, dtype), &tensor(&[3, 4], 4, dtype));
        check(&format!("{dtype:?} batch 0"), dev, &tensor(&[0, 2, 3], 5, dtype), &tensor(&[3, 4], 6, dtype));
    }
}

#[tapir_testing::cuda_test]
fn cuda_matmul_errors_are_the_cpus() {
    let Some((dev, _g)) = cuda("cuda_matmul_errors_are_the_cpus") else { return };
    let f = DType::F32;
    let cases: Vec<(Tensor, Tensor)> = vec![
        (tensor(&[2, 3], 1, f), tensor(&[4, 5], 2, f)),
        (tensor(&[3], 1, f), tensor(&[4], 2, f)),
        (tensor(&[2, 3, 4], 1, f), tensor(&[3, 4, 5], 2, f)),
        (tensor(&[], 1, f), tensor(&[3, 4], 2, f)),
        (tensor(&[2, 3], 1, f), tensor(&[3, 4], 2, DType::F64)),
        (tensor(&[2, 3], 1, DType::I64), tensor(&[3, 4], 2, DType::I64)),
        (tensor(&[2, 3], 1, DType::I32), tensor(&[3, 4], 2, DType::I32)),
    ];
    let before = memory_stats(dev).allocated;
    for (a, b) in &cases {
        let cpu = a.matmul(b).expect_err("a bad product");
        let (da, db) = (a.to_device(dev).unwrap(), b.to_device(dev).unwrap());
        let gpu = da.matmul(&db).expect_err("a bad product");
        assert_eq!(gpu, cpu, "{} x {} ({:?})", a.shape(), b.shape(), a.dtype());
    }
    // A product mixing devices names both.
    let err = tensor(&[2, 3], 1, f).to_device(dev).unwrap().matmul(&tensor(&[3, 2], 2, f)).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "matmul", .. }), "{err}");
    assert_eq!(memory_stats(dev).allocated, before, "a failed product leaves nothing behind");
}

#[tapir_testing::cuda_test]
fn cuda_matmul_live_bytes_return_to_their_value() {
    let Some((dev, _g)) = cuda("cuda_matmul_live_bytes_return_to_their_value") else { return };
    let (a, b) = (tensor(&[2, 1, 7, 33], 1, DType::F32), tensor(&[3, 33, 5], 2, DType::F32));
    let (da, db) = (a.to_device(dev).unwrap(), b.to_device(dev).unwrap());
    let before = memory_stats(dev).allocated;
    {
        let y = da.matmul(&db).unwrap();
        // The output is exactly its 2 * 3 * 7 * 5 f32s (granule-rounded in
        // the allocator's own counters, not in the tensors' ones).
        assert_eq!(memory_stats(dev).allocated - before, 2 * 3 * 7 * 5 * 4);
        // A view that needs a copy frees the copy when the product returns.
        let spaced = tensor(&[7, 33, 2], 3, DType::F32).to_device(dev).unwrap();
        let view = spaced.narrow(2, 0, 1).unwrap().squeeze(2).unwrap();
        let live = memory_stats(dev).allocated;
        let z = view.matmul(&db.narrow(0, 0, 1).unwrap().squeeze(0).unwrap()).unwrap();
        assert_eq!(memory_stats(dev).allocated - live, 7 * 5 * 4, "only the output stays");
        drop((y, z, spaced));
    }
    assert_eq!(memory_stats(dev).allocated, before);
}

#[tapir_testing::cuda_test]
fn cuda_matmul_makes_no_copy_of_transposed_views_or_broadcast_batches() {
    let Some((dev, _g)) = cuda("cuda_matmul_makes_no_copy_of_transposed_views_or_broadcast_batches") else {
        return;
    };
    let on = |shape: &[usize], seed| tensor(shape, seed, DType::F32).to_device(dev).unwrap();
    let cases: Vec<(&str, Tensor, Tensor)> = vec![
        ("a^T", on(&[33, 7], 1).t().unwrap(), on(&[33, 5], 2)),
        ("b^T", on(&[7, 33], 3), on(&[5, 33], 4).t().unwrap()),
        ("batched b^T", on(&[3, 7, 33], 5), on(&[3, 5, 33], 6).t().unwrap()),
        ("[2,1,m,k] x [3,k,n]", on(&[2, 1, 7, 33], 7), on(&[3, 33, 5], 8)),
        ("narrowed", on(&[7, 40], 9).narrow(1, 3, 33).unwrap(), on(&[33, 5], 10)),
    ];
    for (what, a, b) in cases {
        let n = memory_stats(dev).allocations;
        let y = a.matmul(&b).unwrap();
        assert_eq!(memory_stats(dev).allocations - n, 1, "{what}: the output is the only allocation");
        let cpu = a.to_device(Device::Cpu).unwrap().matmul(&b.to_device(Device::Cpu).unwrap()).unwrap();
        assert_close(what, &cpu, &y);
    }
}

/// The fused linear sums (a product rule's tangent, a tanh layer) have a
/// fused kernel on the CPU only; on CUDA they run composed, through the
/// cuBLAS product and the elementwise kernels, to the same values.
#[tapir_testing::cuda_test]
fn cuda_fused_linear_sums_run_composed_to_the_cpus_values() {
    use tapir_tensor::ops::rules::matmul::{fused_linear_sum_then, Then};
    let Some((dev, _g)) = cuda("cuda_fused_linear_sums_run_composed_to_the_cpus_values") else { return };
    let f = DType::F32;
    let (x, w, t, tw) =
        (tensor(&[7, 33], 1, f), tensor(&[33, 5], 2, f), tensor(&[7, 33], 3, f), tensor(&[33, 5], 4, f));
    let (bias, h) = (tensor(&[5], 5, f), tensor(&[7, 5], 6, f));
    let on = |t: &Tensor| t.to_device(dev).unwrap();
    let (dx, dw, dt, dtw, db, dh) = (on(&x), on(&w), on(&t), on(&tw), on(&bias), on(&h));
    let cpu_terms = [(&t, &w), (&x, &tw)];
    let gpu_terms = [(&dt, &dw), (&dx, &dtw)];
    for (what, cpu_then, gpu_then) in [
        ("sum", Then::Nothing, Then::Nothing),
        ("tanh", Then::Tanh, Then::Tanh),
        ("tanh_backward", Then::TanhBackward(&h), Then::TanhBackward(&dh)),
    ] {
        let cpu = fused_linear_sum_then(&cpu_terms, Some(&bias), cpu_then).unwrap().unwrap();
        let gpu = fused_linear_sum_then(&gpu_terms, Some(&db), gpu_then).unwrap().unwrap();
        assert_close(what, &cpu, &gpu);
    }
}

/// The largest error of `c = a b` (f32, `[m, k] x [k, n]`) against the
/// product in f64, relative to `sum_l |a_il b_lj|` (the scale rounding
/// errors of a dot product are measured in).
fn relative_product_error(a: &Tensor, b: &Tensor, c: &Tensor) -> f64 {
    let (m, k, n) = (a.dims()[0], a.dims()[1], b.dims()[1]);
    let (av, bv, cv) = (a.to_vec_f64(), b.to_vec_f64(), c.to_vec_f64());
    let mut worst = 0f64;
    for i in 0..m {
        for j in 0..n {
            let (mut exact, mut scale) = (0f64, 0f64);
            for l in 0..k {
                exact += av[i * k + l] * bv[l * n + j];
                scale += (av[i * k + l] * bv[l * n + j]).abs();
            }
            worst = worst.max((cv[i * n + j] - exact).abs() / scale);
        }
    }
    worst
}

#[tapir_testing::cuda_test]
fn cuda_tf32_is_off_unless_asked_for_and_changes_f32_products_only() {
    assert!(matches!(
        tapir_tensor::cuda::set_allow_tf32(Device::Cpu, true),
        Err(Error::InvalidArgument { op: "set_allow_tf32", .. })
    ));
    assert!(!tapir_tensor::cuda::allow_tf32(Device::Cpu));
    let Some((dev, _lock)) = cuda("cuda_tf32_is_off_unless_asked_for_and_changes_f32_products_only") else { return };
    // Values with all 23 mantissa bits in use, so rounding them to TF32's
    // 10 shows.
    let mut rng = Rng::new(31);
    let (a, b) = (rng.randn([24, 96], DType::F32).unwrap(), rng.randn([96, 16], DType::F32).unwrap());
    let (ad, bd) = (a.to_device(dev).unwrap(), b.to_device(dev).unwrap());
    assert!(!tapir_tensor::cuda::allow_tf32(dev), "TF32 is off by default");
    let f32_product = ad.matmul(&bd).unwrap();
    // f32 accumulation: a few units of 2^-24 per term at most.
    let k = 96.0;
    let exact_bound = k * 2f64.powi(-23);
    let off = relative_product_error(&a, &b, &f32_product);
    assert!(off <= exact_bound, "f32 product error {off:e} above {exact_bound:e}");
    let (a64, b64) = (ad.cast(DType::F64).unwrap(), bd.cast(DType::F64).unwrap());
    let f64_product = a64.matmul(&b64).unwrap().to_vec_f64();
    let bf16_product = ad.cast(DType::BF16).unwrap().matmul(&bd.cast(DType::BF16).unwrap()).unwrap().to_vec_f64();

    tapir_tensor::cuda::set_allow_tf32(dev, true).unwrap();
    assert!(tapir_tensor::cuda::allow_tf32(dev));
    let tf32_product = ad.matmul(&bd).unwrap();
    let (f64_then, bf16_then) = (
        a64.matmul(&b64).unwrap().to_vec_f64(),
        ad.cast(DType::BF16).unwrap().matmul(&bd.cast(DType::BF16).unwrap()).unwrap().to_vec_f64(),
    );
    tapir_tensor::cuda::set_allow_tf32(dev, false).unwrap();
    let on = relative_product_error(&a, &b, &tf32_product);
    // Each input loses at most 2^-11 (rounded) or 2^-10 (truncated) of
    // itself, so a product term at most about 2^-9 of its size.
    let tf32_bound = 2f64.powi(-9) + exact_bound;
    assert!(on > exact_bound, "TF32 on: error {on:e} is f32's ({exact_bound:e}): the inputs were not rounded");
    assert!(on <= tf32_bound, "TF32 on: error {on:e} above TF32's bound {tf32_bound:e}");
    assert_eq!(f64_then, f64_product, "f64 products ignore TF32");
    assert_eq!(bf16_then, bf16_product, "bf16 products ignore TF32");
    // Off again: f32 products as before, bit for bit.
    assert!(!tapir_tensor::cuda::allow_tf32(dev));
    assert_eq!(ad.matmul(&bd).unwrap().to_vec_f64(), f32_product.to_vec_f64());
}
