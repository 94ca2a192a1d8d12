//! CPU-vs-CUDA parity of the reductions (sum, mean, max, min, logsumexp,
//! argmax, argmin, sum_to) and of softmax and log_softmax: every kind over
//! many axis sets and views, ragged row lengths, every float dtype, NaN and
//! infinities, integer sums, the CPU's errors, and exact live bytes.
//!
//! Every test needs a CUDA device (a GPU, or the emulated one with
//! `TAPIR_CUDA=emulated`); without one it says so and passes, unless
//! `TAPIR_REQUIRE_CUDA=1` makes the skip a failure. The memory counters are
//! process-wide, so the tests take one lock and run one at a time.

use std::sync::{Mutex, MutexGuard};

use tapir_tensor::ops::reduce::ReduceKind;
use tapir_tensor::prelude::*;

#[path = "support/cuda.rs"]
mod support;
use support::cuda;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// `n` pseudo-random values in `[-scale, scale)` (a fixed LCG, so failures
/// reproduce), rounded to steps of `scale / 8` when `ties` is set so that
/// equal values are common.
fn noise(n: usize, scale: f64, seed: u64, ties: bool) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let u = (s >> 11) as f64 / (1u64 << 53) as f64;
            let v = scale * (2.0 * u - 1.0);
            if ties {
                (v * 8.0 / scale).round() * scale / 8.0
            } else {
                v
            }
        })
        .collect()
}

fn tensor(v: Vec<f64>, shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_vec(v, shape.to_vec()).unwrap().cast(dtype).unwrap()
}

/// Relative tolerance of a result that the CPU and the device compute in
/// a different order (sums, exponentials): f32 and f64 by their epsilon,
/// f16 and bf16 one rounding of the result apart.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        _ => 0.0,
    }
}

/// Asserts a device result equals the CPU's, to `tol` relative (0 for the
/// same values exactly), NaN where the CPU has NaN and infinities alike.
fn assert_matches(what: &str, cpu: &Tensor, gpu: &Tensor, tol: f64) {
    assert_eq!(gpu.device(), Device::Cuda(0), "{what}: the result stays on the device");
    assert_eq!((cpu.shape(), cpu.dtype()), (gpu.shape(), gpu.dtype()), "{what}: shape and dtype");
    let (a, b) = (cpu.to_vec_f64(), gpu.to_vec_f64());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        let ok = (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= tol * (1.0 + x.abs());
        assert!(ok, "{what}: element {i}: cpu {x} vs cuda {y}");
    }
}

/// One reduction through the public API.
fn run(kind: &str, x: &Tensor, axes: &[isize], keepdim: bool) -> Result<Tensor> {
    match kind {
        "sum" => x.sum(axes, keepdim),
        "mean" => x.mean(axes, keepdim),
        "max" => x.max(axes, keepdim),
        "min" => x.min(axes, keepdim),
        "logsumexp" => x.logsumexp(axes, keepdim),
        _ => unreachable!("{kind}"),
    }
}

/// Every reduction kind of the op family, by name, plus mean (a sum and a
/// scale, composed).
fn kinds() -> Vec<&'static str> {
    let mut out: Vec<&str> = ReduceKind::ALL
        .iter()
        .map(|k| match k {
            ReduceKind::Sum => "sum",
            ReduceKind::Max => "max",
            ReduceKind::Min => "min",
            ReduceKind::LogSumExp => "logsumexp",
        })
        .collect();
    out.push("mean");
    out
}

/// The tolerance of `kind`: none for max and min, which pick an element.
fn tol_of(kind: &str, dtype: DType) -> f64 {
    if matches!(kind, "max" | "min") {
        0.0
    } else {
        tolerance(dtype)
    }
}

/// The CPU and the device on the same view of the same values.
fn pair(x: &Tensor, dev: Device, view: fn(&Tensor) -> Tensor) -> (Tensor, Tensor) {
    (view(x), view(&x.to_device(dev).unwrap()))
}

type View = (&'static str, fn(&Tensor) -> Tensor);

/// Views of a [4, 3, 5] base: itself, a contiguous one at an offset, a
/// permutation (not contiguous), and a narrowed one (an offset and gaps),
/// all rank 3.
fn views() -> [View; 4] {
    [
        ("contiguous [4, 3, 5]", |t| t.clone()),
        ("offset [3, 3, 5]", |t| t.narrow(0, 1, 3).unwrap()),
        ("permuted [5, 4, 3]", |t| t.permute(&[2, 0, 1]).unwrap()),
        ("narrowed [3, 2, 4]", |t| t.narrow(0, 1, 3).unwrap().narrow(1, 1, 2).unwrap().narrow(2, 0, 4).unwrap()),
    ]
}

#[tapir_testing::cuda_test]
fn cuda_every_reduction_matches_the_cpu_over_axis_sets_and_views() {
    let _g = serial();
    let Some(dev) = cuda("cuda_every_reduction_matches_the_cpu_over_axis_sets_and_views") else { return };
    let axis_sets: [&[isize]; 8] = [&[], &[0], &[1], &[2], &[0, 1], &[0, 2], &[-2, -1], &[0, 1, 2]];
    let base = tensor(noise(60, 3.0, 1, false), &[4, 3, 5], DType::F64);
    for dtype in FLOATS {
        let base = base.cast(dtype).unwrap();
        for (what, view) in views() {
            let (x, dx) = pair(&base, dev, view);
            for axes in axis_sets {
                for keepdim in [false, true] {
                    // Every kind on f32; the other dtypes keep one keepdim each.
                    if dtype != DType::F32 && keepdim == (axes.len() % 2 == 0) {
                        continue;
                    }
                    for kind in kinds() {
                        let (cpu, gpu) =
                            (run(kind, &x, axes, keepdim).unwrap(), run(kind, &dx, axes, keepdim).unwrap());
                        let msg = format!("{kind} {dtype:?} {what} axes {axes:?} keepdim {keepdim}");
                        assert_matches(&msg, &cpu, &gpu, tol_of(kind, dtype));
                    }
                }
            }
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_reductions_handle_ragged_rows_and_rows_longer_than_a_block() {
    let _g = serial();
    let Some(dev) = cuda("cuda_reductions_handle_ragged_rows_and_rows_longer_than_a_block") else { return };
    for n in [1usize, 31, 33, 65, 257, 1000, 2100] {
        for dtype in [DType::F32, DType::F64] {
            let x = tensor(noise(3 * n, 2.0, n as u64, false), &[3, n], dtype);
            let dx = x.to_device(dev).unwrap();
            for kind in kinds() {
                // The last axis (a row kernel), the first (the column sum), and all.
                for axes in [&[1isize][..], &[0], &[]] {
                    let msg = format!("{kind} {dtype:?} [3, {n}] axes {axes:?}");
                    assert_matches(
                        &msg,
                        &run(kind, &x, axes, false).unwrap(),
                        &run(kind, &dx, axes, false).unwrap(),
                        tol_of(kind, dtype),
                    );
                }
            }
            for axis in [0isize, 1] {
                assert_matches(
                    &format!("argmax {dtype:?} [3, {n}] axis {axis}"),
                    &x.argmax(axis, false).unwrap(),
                    &dx.argmax(axis, false).unwrap(),
                    0.0,
                );
                assert_matches(
                    &format!("argmin {dtype:?} [3, {n}] axis {axis}"),
                    &x.argmin(axis, false).unwrap(),
                    &dx.argmin(axis, false).unwrap(),
                    0.0,
                );
                let tol = tolerance(dtype);
                assert_matches(
                    &format!("softmax {dtype:?} [3, {n}] axis {axis}"),
                    &x.softmax(axis).unwrap(),
                    &dx.softmax(axis).unwrap(),
                    tol,
                );
                assert_matches(
                    &format!("log_softmax {dtype:?} [3, {n}] axis {axis}"),
                    &x.log_softmax(axis).unwrap(),
                    &dx.log_softmax(axis).unwrap(),
                    tol,
                );
            }
        }
    }
    // A leading-axes sum wider than one tile of 32 columns, and of many rows.
    let x = tensor(noise(40 * 70, 1.0, 9, false), &[40, 70], DType::F32);
    let dx = x.to_device(dev).unwrap();
    assert_matches("sum [40, 70] axis 0", &x.sum(&[0], false).unwrap(), &dx.sum(&[0], false).unwrap(), 1e-5);
    // Leading-axis sums over many rows and few columns split the rows too.
    // 3,000 terms in [-1, 1] that cancel: in f32 either order's rounding is
    // within about 3,000 * 2^-24 of the exact sum, more than f32's
    // tolerance relative to a result near 0.
    for dtype in FLOATS {
        let x = tensor(noise(3000 * 40, 1.0, 14, false), &[3000, 40], dtype);
        let dx = x.to_device(dev).unwrap();
        let tol = if dtype == DType::F32 { 2e-4 } else { tolerance(dtype) };
        for kind in ["sum", "mean"] {
            let (cpu, gpu) = (run(kind, &x, &[0], true).unwrap(), run(kind, &dx, &[0], true).unwrap());
            assert_matches(&format!("{kind} {dtype:?} [3000, 40] axis 0"), &cpu, &gpu, tol);
        }
        let (cpu, gpu) = (x.sum_to([40]).unwrap(), dx.sum_to([40]).unwrap());
        assert_matches(&format!("sum_to {dtype:?} [3000, 40] to [40]"), &cpu, &gpu, tol);
    }
    // Many short rows, a warp each, eight to a block: every row gets its own result.
    let y = tensor(noise(600 * 2, 1.0, 10, false), &[600, 2], DType::F32);
    let dy = y.to_device(dev).unwrap();
    assert_matches("max [600, 2] axis 1", &y.max(&[1], false).unwrap(), &dy.max(&[1], false).unwrap(), 0.0);
    // More rows of a block each than the grid has blocks (4,096): the
    // blocks stride on to later rows.
    let z = tensor(noise(4100 * 65, 1.0, 11, true), &[4100, 65], DType::F32);
    let dz = z.to_device(dev).unwrap();
    assert_matches("argmax [4100, 65] axis 1", &z.argmax(1, false).unwrap(), &dz.argmax(1, false).unwrap(), 0.0);
}

#[tapir_testing::cuda_test]
fn cuda_a_few_long_rows_reduce_in_chunks_as_on_the_cpu() {
    let _g = serial();
    let Some(dev) = cuda("cuda_a_few_long_rows_reduce_in_chunks_as_on_the_cpu") else { return };
    // Rows of 20,001 elements: several chunks, the last one ragged; all
    // axes make one row of 40,002.
    let n = 20_001;
    let base = tensor(noise(2 * n, 2.0, 12, false), &[2, n], DType::F64);
    for dtype in FLOATS {
        let x = base.cast(dtype).unwrap();
        let dx = x.to_device(dev).unwrap();
        for kind in kinds() {
            for axes in [&[1isize][..], &[]] {
                let (cpu, gpu) = (run(kind, &x, axes, true).unwrap(), run(kind, &dx, axes, true).unwrap());
                assert_matches(&format!("{kind} {dtype:?} [2, {n}] axes {axes:?}"), &cpu, &gpu, tol_of(kind, dtype));
            }
        }
    }
    // A NaN in a later chunk wins; an all -inf row stays -inf; +inf is +inf.
    let mut v = noise(3 * n, 2.0, 13, false);
    v[2 * 4096 + 5] = f64::NAN;
    v[n..2 * n].iter_mut().for_each(|e| *e = f64::NEG_INFINITY);
    v[2 * n + 3 * 4096] = f64::INFINITY;
    let x = Tensor::from_vec(v, [3, n]).unwrap();
    let dx = x.to_device(dev).unwrap();
    for kind in kinds() {
        let (cpu, gpu) = (run(kind, &x, &[1], false).unwrap(), run(kind, &dx, &[1], false).unwrap());
        assert_matches(&format!("{kind} specials in long rows"), &cpu, &gpu, tol_of(kind, DType::F64));
    }
    let lse = dx.logsumexp(&[1], false).unwrap().to_vec_f64();
    assert!(lse[0].is_nan() && lse[1] == f64::NEG_INFINITY && lse[2] == f64::INFINITY, "{lse:?}");
}

/// Rows of special values: a NaN first, in the middle and last, +inf,
/// -inf entries, an all -inf row, rows with both infinities, and ties.
fn specials() -> Tensor {
    let (nan, inf) = (f64::NAN, f64::INFINITY);
    #[rustfmt::skip]
    let v = vec![
        nan, 1.0, 2.0, 3.0, 0.5,
        1.0, 2.0, nan, 3.0, nan,
        1.0, 2.0, 3.0, 0.5, nan,
        1.0, inf, 3.0, inf, 2.0,
        -inf, 1.0, -inf, 2.0, -inf,
        -inf, -inf, -inf, -inf, -inf,
        inf, -inf, 0.0, 1.0, -1.0,
        4.0, 4.0, -4.0, -4.0, 4.0,
        -inf, inf, -inf, -inf, -inf,
    ];
    Tensor::from_vec(v, [9, 5]).unwrap()
}

#[tapir_testing::cuda_test]
fn cuda_nan_and_infinities_are_handled_as_on_the_cpu() {
    let _g = serial();
    let Some(dev) = cuda("cuda_nan_and_infinities_are_handled_as_on_the_cpu") else { return };
    for dtype in FLOATS {
        let x = specials().cast(dtype).unwrap();
        for (what, x) in [("rows", x.clone()), ("columns", x.t().unwrap().contiguous().unwrap())] {
            let axis = if what == "rows" { 1 } else { 0 };
            let dx = x.to_device(dev).unwrap();
            for kind in kinds() {
                let msg = format!("{kind} {dtype:?} specials in {what}");
                assert_matches(
                    &msg,
                    &run(kind, &x, &[axis], false).unwrap(),
                    &run(kind, &dx, &[axis], false).unwrap(),
                    tol_of(kind, dtype),
                );
            }
            let tol = tolerance(dtype);
            for (name, cpu, gpu) in [
                ("argmax", x.argmax(axis, false), dx.argmax(axis, false)),
                ("argmin", x.argmin(axis, false), dx.argmin(axis, false)),
                ("softmax", x.softmax(axis), dx.softmax(axis)),
                ("log_softmax", x.log_softmax(axis), dx.log_softmax(axis)),
            ] {
                let t = if name.starts_with("arg") { 0.0 } else { tol };
                assert_matches(&format!("{name} {dtype:?} specials in {what}"), &cpu.unwrap(), &gpu.unwrap(), t);
            }
        }
    }
    // The values the CPU gives, spelled out: NaN wins argmax and argmin at
    // its first place, and an all -inf row has a NaN softmax.
    let dx = specials().to_device(dev).unwrap();
    assert_eq!(dx.argmax(1, false).unwrap().to_vec_f64(), vec![0.0, 2.0, 4.0, 1.0, 3.0, 0.0, 0.0, 0.0, 1.0]);
    assert_eq!(dx.argmin(1, false).unwrap().to_vec_f64(), vec![0.0, 2.0, 4.0, 0.0, 0.0, 0.0, 1.0, 2.0, 0.0]);
    let lse = dx.logsumexp(&[1], false).unwrap().to_vec_f64();
    assert!(lse[0].is_nan() && lse[3] == f64::INFINITY && lse[5] == f64::NEG_INFINITY, "{lse:?}");
    let sm = dx.softmax(1).unwrap().to_vec_f64();
    assert!(sm[25..30].iter().all(|v| v.is_nan()), "all -inf row: {:?}", &sm[25..30]);
    // A +inf makes the whole row NaN, the -inf entries included (torch too).
    assert!(sm[15..20].iter().chain(&sm[40..45]).all(|v| v.is_nan()), "rows with +inf: {sm:?}");
    let want = [0.0, 1.0 / (1.0 + 1f64.exp()), 0.0, 1f64.exp() / (1.0 + 1f64.exp()), 0.0];
    assert!(sm[20..25].iter().zip(want).all(|(p, q)| (p - q).abs() < 1e-12), "{:?}", &sm[20..25]);
}

#[tapir_testing::cuda_test]
fn cuda_softmax_is_stable_at_1e4_and_with_minus_inf_on_every_axis() {
    let _g = serial();
    let Some(dev) = cuda("cuda_softmax_is_stable_at_1e4_and_with_minus_inf_on_every_axis") else { return };
    let mut v: Vec<f64> = noise(60, 3.0, 4, false).into_iter().map(|x| x + 1e4).collect();
    for i in (0..60).step_by(7) {
        v[i] = f64::NEG_INFINITY;
    }
    for dtype in FLOATS {
        let base = tensor(v.clone(), &[3, 4, 5], dtype);
        for (what, view) in [
            ("contiguous", (|t: &Tensor| t.clone()) as fn(&Tensor) -> Tensor),
            ("transposed", |t| t.permute(&[2, 1, 0]).unwrap()),
        ] {
            let (x, dx) = pair(&base, dev, view);
            for axis in 0..3 {
                let (cpu, gpu) = (x.softmax(axis).unwrap(), dx.softmax(axis).unwrap());
                let msg = format!("softmax {dtype:?} {what} axis {axis}");
                assert_matches(&msg, &cpu, &gpu, tolerance(dtype));
                assert!(gpu.to_vec_f64().iter().all(|p| p.is_finite()), "{msg}: finite");
                // Each row sums to 1 (up to the dtype's rounding).
                let sums = gpu.cast(DType::F64).unwrap().sum(&[axis], false).unwrap().to_vec_f64();
                assert!(sums.iter().all(|s| (s - 1.0).abs() < 20.0 * tolerance(dtype).max(1e-6)), "{msg}: {sums:?}");
                let (cpu, gpu) = (x.log_softmax(axis).unwrap(), dx.log_softmax(axis).unwrap());
                assert_matches(&format!("log_softmax {dtype:?} {what} axis {axis}"), &cpu, &gpu, tolerance(dtype));
                // At 1e4 the log-probabilities keep their small differences:
                // no -inf but the inputs' own, and the largest near 0.
                let lp = gpu.to_vec_f64();
                assert_eq!(lp.iter().filter(|p| **p == f64::NEG_INFINITY).count(), 9, "{dtype:?} {what} axis {axis}");
            }
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_argmax_and_argmin_take_the_first_of_ties() {
    let _g = serial();
    let Some(dev) = cuda("cuda_argmax_and_argmin_take_the_first_of_ties") else { return };
    // Few distinct values: every row has ties for its extremes.
    let base = tensor(noise(4 * 300, 1.0, 5, true), &[4, 300], DType::F64);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64] {
        let x =
            if dtype.is_int() { base.mul_scalar(8.0).unwrap().cast(dtype).unwrap() } else { base.cast(dtype).unwrap() };
        let dx = x.to_device(dev).unwrap();
        for (axis, keepdim) in [(1isize, false), (0, true), (-1, true)] {
            for min in [false, true] {
                let (cpu, gpu) = if min {
                    (x.argmin(axis, keepdim).unwrap(), dx.argmin(axis, keepdim).unwrap())
                } else {
                    (x.argmax(axis, keepdim).unwrap(), dx.argmax(axis, keepdim).unwrap())
                };
                assert_eq!(gpu.dtype(), DType::I64);
                assert_matches(
                    &format!("arg{} {dtype:?} axis {axis}", if min { "min" } else { "max" }),
                    &cpu,
                    &gpu,
                    0.0,
                );
            }
        }
    }
    // A row of one value: index 0; the winner sits past the first block's
    // share of the row.
    let mut v = vec![2.0f32; 700];
    let d = Tensor::from_vec(v.clone(), [700]).unwrap().to_device(dev).unwrap();
    assert_eq!(d.argmax(0, false).unwrap().to_vec_f64(), vec![0.0]);
    v[600] = 3.0;
    v[650] = 3.0;
    let d = Tensor::from_vec(v, [700]).unwrap().to_device(dev).unwrap();
    assert_eq!(d.argmax(0, false).unwrap().to_vec_f64(), vec![600.0]);
}

#[tapir_testing::cuda_test]
fn cuda_integer_sums_are_int64_and_wrap_as_on_the_cpu() {
    let _g = serial();
    let Some(dev) = cuda("cuda_integer_sums_are_int64_and_wrap_as_on_the_cpu") else { return };
    let v: Vec<i32> =
        (0..3 * 40).map(|i| if i % 3 == 0 { -2_000_000_000 + i } else { 1_900_000_000 - 7 * i }).collect();
    let x = Tensor::from_vec(v, [3, 40]).unwrap();
    let big = Tensor::from_vec(vec![i64::MAX, 5, -3, i64::MIN, i64::MIN, -1], [2, 3]).unwrap();
    for x in [x.clone(), x.cast(DType::I64).unwrap(), big] {
        let dx = x.to_device(dev).unwrap();
        for axes in [&[][..], &[0isize], &[1]] {
            for keepdim in [false, true] {
                let (cpu, gpu) = (x.sum(axes, keepdim).unwrap(), dx.sum(axes, keepdim).unwrap());
                assert_eq!(gpu.dtype(), DType::I64);
                assert_eq!(cpu.shape(), gpu.shape());
                assert_eq!(cpu.to_vec::<i64>().unwrap(), gpu.to_vec::<i64>().unwrap(), "{:?} axes {axes:?}", x.dtype());
            }
        }
        // Only the sum is defined on integers, as on the CPU.
        for kind in ["max", "min", "logsumexp", "mean"] {
            let (c, g) = (run(kind, &x, &[1], false).unwrap_err(), run(kind, &dx, &[1], false).unwrap_err());
            let same = matches!((&c, &g), (Error::UnsupportedDType { op: a, dtype: p, .. }, Error::UnsupportedDType { op: b, dtype: q, .. }) if a == b && p == q);
            assert!(same, "{kind}: cpu {c} vs cuda {g}");
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_sum_to_matches_the_cpu() {
    let _g = serial();
    let Some(dev) = cuda("cuda_sum_to_matches_the_cpu") else { return };
    let x = tensor(noise(2 * 4 * 3, 2.0, 6, false), &[2, 4, 3], DType::F32);
    let dx = x.to_device(dev).unwrap();
    for target in [&[3usize][..], &[4, 1], &[1, 3], &[1, 4, 1], &[2, 1, 3], &[], &[2, 4, 3]] {
        let (cpu, gpu) = (x.sum_to(target.to_vec()).unwrap(), dx.sum_to(target.to_vec()).unwrap());
        assert_matches(&format!("sum_to {target:?}"), &cpu, &gpu, 1e-5);
    }
    // A transposed input, and a shape it does not broadcast from.
    let (xt, dxt) = (x.permute(&[2, 1, 0]).unwrap(), dx.permute(&[2, 1, 0]).unwrap());
    assert_matches("sum_to of a view", &xt.sum_to([4, 1]).unwrap(), &dxt.sum_to([4, 1]).unwrap(), 1e-5);
    assert_eq!(x.sum_to([5]).unwrap_err(), dx.sum_to([5]).unwrap_err());
}

/// One op on a tensor, for tables of cases.
type Call = fn(&Tensor) -> Result<Tensor>;

#[tapir_testing::cuda_test]
fn cuda_bad_reductions_are_the_cpus_errors() {
    let _g = serial();
    let Some(dev) = cuda("cuda_bad_reductions_are_the_cpus_errors") else { return };
    let x = Tensor::from_vec(vec![0.0f32; 0], [3, 0]).unwrap();
    let dx = x.to_device(dev).unwrap();
    let cases: Vec<(&str, Call)> = vec![
        ("max over an empty axis", |t| t.max(&[1], false)),
        ("min over an empty axis", |t| t.min(&[1], true)),
        ("argmax over an empty axis", |t| t.argmax(1, false)),
        ("argmin over an empty axis", |t| t.argmin(-1, false)),
        ("sum over an axis out of range", |t| t.sum(&[2], false)),
        ("repeated axis", |t| t.logsumexp(&[1, -1], false)),
        ("softmax axis out of range", |t| t.softmax(3)),
    ];
    for (what, f) in cases {
        assert_eq!(f(&x).unwrap_err(), f(&dx).unwrap_err(), "{what}");
    }
    // Empty reductions that are defined: zeros, -inf, and empty softmax.
    for (what, f) in [
        ("sum", (|t: &Tensor| t.sum(&[1], false)) as Call),
        ("logsumexp", |t| t.logsumexp(&[1], true)),
        ("sum over the empty axis 0", |t| t.t()?.sum(&[0], false)),
        ("max over a kept empty axis", |t| t.max(&[0], false)),
        ("softmax", |t| t.softmax(1)),
        ("log_softmax", |t| t.log_softmax(0)),
    ] {
        assert_matches(what, &f(&x).unwrap(), &f(&dx).unwrap(), 0.0);
    }
    // An integer softmax is a dtype error naming the op on both.
    let i = Tensor::from_vec(vec![1i64, 2], [2]).unwrap();
    let (c, g) = (i.softmax(0).unwrap_err(), i.to_device(dev).unwrap().softmax(0).unwrap_err());
    assert!(
        matches!(
            (&c, &g),
            (Error::UnsupportedDType { op: "softmax", .. }, Error::UnsupportedDType { op: "softmax", .. })
        ),
        "{c} / {g}"
    );
}

#[tapir_testing::cuda_test]
fn cuda_reductions_free_every_temporary_exactly() {
    let _g = serial();
    let Some(dev) = cuda("cuda_reductions_free_every_temporary_exactly") else { return };
    let x = tensor(noise(4 * 6 * 5, 2.0, 7, false), &[4, 6, 5], DType::F32).to_device(dev).unwrap();
    let xt = x.permute(&[2, 0, 1]).unwrap();
    let before = memory_stats(dev).allocated;
    {
        // Each result holds its own bytes only: the transposed copies, the
        // int64 index output and the softmax's two copies are gone.
        let s = xt.sum(&[1], false).unwrap();
        assert_eq!(memory_stats(dev).allocated, before + 5 * 6 * 4, "sum [5, 6] f32");
        let a = xt.argmax(0, true).unwrap();
        assert_eq!(memory_stats(dev).allocated, before + 5 * 6 * 4 + 4 * 6 * 8, "argmax [1, 4, 6] i64");
        let p = x.softmax(1).unwrap();
        assert_eq!(memory_stats(dev).allocated, before + 5 * 6 * 4 + 4 * 6 * 8 + 120 * 4, "softmax [4, 6, 5]");
        let l = x.logsumexp(&[0, 2], false).unwrap();
        let c = x.sum(&[0], false).unwrap();
        let t = x.sum_to([6, 1]).unwrap();
        let m = x.mean(&[], false).unwrap();
        let live = memory_stats(dev).allocated;
        assert_eq!(live, before + 5 * 6 * 4 + 4 * 6 * 8 + 120 * 4 + (6 + 30 + 6 + 1) * 4);
        // A long row's partials, and a split column sum's, are freed once merged.
        let tall = tensor(noise(600 * 3, 1.0, 9, false), &[600, 3], DType::F32).to_device(dev).unwrap();
        let ts = tall.sum(&[0], false).unwrap();
        assert_eq!(memory_stats(dev).allocated, live + 600 * 3 * 4 + 3 * 4, "the tall matrix and its column sums");
        drop((tall, ts));
        let long = tensor(noise(9000, 1.0, 8, false), &[9000], DType::F32).to_device(dev).unwrap();
        let mx = long.max(&[0], false).unwrap();
        assert_eq!(memory_stats(dev).allocated, live + 9000 * 4 + 4, "the long row and its max");
        drop((s, a, p, l, c, t, m, long, mx));
    }
    assert_eq!(memory_stats(dev).allocated, before, "every result dropped");
    // Errors free what they allocated too.
    assert!(x.max(&[7], false).is_err());
    assert!(x.cast(DType::I32).unwrap().logsumexp(&[0], false).is_err());
    assert_eq!(memory_stats(dev).allocated, before, "after errors");
}

/// Rows past the threshold of the warp-per-row kernels (1,024 rows of at
/// most 8 KiB, whole 16-byte units): 1,029 of them, not a multiple of the
/// eight rows a block. `cols` spans one unit a row, a lane's last unit
/// partial (units not a multiple of 32), each power of two of units a lane
/// (1, 2, 4, 8, 16) and 8 KiB exactly; the lengths that are not whole units
/// (1, 7, 9, 31, 255, 1023) and the ones past 8 KiB keep the block kernels
/// and are checked beside them. The softmaxes take a warp a row up to 4
/// KiB only (8 units a lane), the rows past it a block a row held in
/// registers (`softmax_block<U>_*`) as fewer rows do.
fn warp_row_lengths(dtype: DType) -> Vec<usize> {
    match dtype {
        DType::F64 => vec![1, 2, 7, 66, 1022, 1024, 1026],
        DType::F32 => vec![1, 4, 7, 9, 31, 132, 255, 1023, 1028, 2048, 2052],
        _ => vec![1, 7, 8, 9, 31, 255, 264, 1023, 1024, 2056, 4096, 4104],
    }
}

/// Softmax and log-softmax of `dims` rows of noise (scale 4, `seed`) of
/// `dtype` on `dev` match the CPU's; returns the CPU and device inputs.
fn softmaxes_match(dev: Device, dtype: DType, (rows, cols): (usize, usize), seed: u64) -> (Tensor, Tensor) {
    let x = tensor(noise(rows * cols, 4.0, seed, false), &[rows, cols], dtype);
    let dx = x.to_device(dev).unwrap();
    let tol = tolerance(dtype);
    let what = format!("{dtype:?} [{rows}, {cols}]");
    assert_matches(&format!("softmax {what}"), &x.softmax(1).unwrap(), &dx.softmax(1).unwrap(), tol);
    assert_matches(&format!("log_softmax {what}"), &x.log_softmax(1).unwrap(), &dx.log_softmax(1).unwrap(), tol);
    (x, dx)
}

#[tapir_testing::cuda_test]
fn cuda_many_rows_of_at_most_8_kib_take_a_warp_each_and_match_the_cpu() {
    let _g = serial();
    let Some(dev) = cuda("cuda_many_rows_of_at_most_8_kib_take_a_warp_each_and_match_the_cpu") else { return };
    let rows = 1029;
    for dtype in FLOATS {
        for cols in warp_row_lengths(dtype) {
            let (x, dx) = softmaxes_match(dev, dtype, (rows, cols), cols as u64);
            let (tol, what) = (tolerance(dtype), format!("{dtype:?} [{rows}, {cols}]"));
            // Sums of up to 4,096 terms of either sign: the absolute error
            // of either order grows with the terms, so relative to the
            // row's scale (4), not to a result near 0.
            let (cpu, gpu) = (x.sum(&[1], false).unwrap(), dx.sum(&[1], false).unwrap());
            let (a, b) = (cpu.to_vec_f64(), gpu.to_vec_f64());
            let bound = tol * 4.0 * (cols as f64).sqrt().max(1.0);
            for (i, (p, q)) in a.iter().zip(&b).enumerate() {
                assert!((p - q).abs() <= bound * (1.0 + p.abs()), "sum {what}: row {i}: cpu {p} vs cuda {q}");
            }
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_register_rows_handle_views_specials_and_large_values_as_on_the_cpu() {
    let _g = serial();
    let Some(dev) = cuda("cuda_register_rows_handle_views_specials_and_large_values_as_on_the_cpu") else { return };
    // 1,035 rows of 16 columns (a warp a row), then 10 rows of 200 (a
    // block of 32 threads a row, `softmax_block_*`).
    for (rows, cols, mid, step) in [(1035, 16, 8.0, 0.25), (10, 200, 100.0, 0.05)] {
        let v = special_rows(rows, cols, |c| (c as f64 - mid) * step);
        for dtype in FLOATS {
            let base = tensor(v.clone(), &[rows, cols], dtype);
            // Rows 3.. at an offset (still 16-byte aligned), and the
            // transpose of a transpose (a copy first).
            for (what, view) in [
                ("contiguous", (|t: &Tensor| t.clone()) as fn(&Tensor) -> Tensor),
                ("offset", |t| t.narrow(0, 3, t.dims()[0] - 5).unwrap()),
                ("transposed back", |t| t.t().unwrap().contiguous().unwrap().t().unwrap()),
            ] {
                let (x, dx) = pair(&base, dev, view);
                let tol = tolerance(dtype);
                let msg = format!("{dtype:?} [{rows}, {cols}] specials, {what}");
                assert_matches(&format!("softmax {msg}"), &x.softmax(1).unwrap(), &dx.softmax(1).unwrap(), tol);
                assert_matches(
                    &format!("log_softmax {msg}"),
                    &x.log_softmax(1).unwrap(),
                    &dx.log_softmax(1).unwrap(),
                    tol,
                );
                assert_matches(&format!("sum {msg}"), &x.sum(&[1], false).unwrap(), &dx.sum(&[1], false).unwrap(), tol);
            }
        }
        let nan_rows: Vec<usize> = (0..rows).filter(|r| [0, 3, 5, 8].contains(&(r % 10))).collect();
        check_special_rows(dev, v, rows, cols, &nan_rows);
    }
}

/// `rows` rows of `cols` columns: the nine rows of `specials` padded with
/// `pad(c)` (the all -inf row with -inf), a tenth row of values near 1e4,
/// repeated.
fn special_rows(rows: usize, cols: usize, pad: impl Fn(usize) -> f64) -> Vec<f64> {
    let sp = specials().to_vec_f64();
    let mut v = Vec::new();
    for r in 0..rows {
        let k = r % 10;
        for c in 0..cols {
            v.push(if k == 9 {
                1e4 + (c as f64) * 0.37
            } else if c < 5 {
                sp[k * 5 + c]
            } else if k == 5 {
                f64::NEG_INFINITY
            } else {
                pad(c)
            });
        }
    }
    v
}

/// The f32 softmax of `special_rows` on `dev`: the NaN row, the all -inf
/// row and the +inf rows (`nan_rows`) are NaN throughout; the 1e4 row is
/// finite and sums to 1.
fn check_special_rows(dev: Device, v: Vec<f64>, rows: usize, cols: usize, nan_rows: &[usize]) {
    let dx = tensor(v, &[rows, cols], DType::F32).to_device(dev).unwrap();
    let sm = dx.softmax(1).unwrap().to_vec_f64();
    let row = |r: usize| &sm[r * cols..(r + 1) * cols];
    for &r in nan_rows {
        assert!(row(r).iter().all(|p| p.is_nan()), "row {r}: {:?}", row(r));
    }
    assert!((row(9).iter().sum::<f64>() - 1.0).abs() < 1e-5, "{:?}", row(9));
}

/// Fewer rows than the warp-per-row kernels take, of whole 16-byte units
/// past a short row, at most 128 KiB: a block a row, the row in registers
/// (`softmax_block<U>_*`), the block 32 to 1,024 threads (about 4 units
/// each) and U = 1, 2, 4 or 8 units a thread. The lengths span one unit a
/// thread, a thread's last unit partial, 1,024 threads of 4 and of 8 units
/// (128 KiB exactly); the ones not whole units or past 128 KiB keep the
/// block kernel that reads the row twice and are checked beside them.
fn block_row_lengths(dtype: DType) -> Vec<usize> {
    match dtype {
        DType::F64 => vec![66, 250, 1026, 4002, 16384, 16386],
        DType::F32 => vec![68, 500, 2052, 8001, 16000, 32768, 32772],
        _ => vec![72, 1000, 1001, 4104, 32000, 65536, 65544],
    }
}

#[tapir_testing::cuda_test]
fn cuda_few_long_rows_take_a_block_each_and_match_the_cpu() {
    let _g = serial();
    let Some(dev) = cuda("cuda_few_long_rows_take_a_block_each_and_match_the_cpu") else { return };
    for dtype in FLOATS {
        for cols in block_row_lengths(dtype) {
            let row_counts: &[usize] = if cols * dtype.size_in_bytes() > 65536 { &[1, 2] } else { &[1, 37] };
            for &rows in row_counts {
                softmaxes_match(dev, dtype, (rows, cols), (cols + rows) as u64);
            }
        }
    }
}
