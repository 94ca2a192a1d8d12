//! CPU-vs-CUDA parity of the elementwise ops, casts and copies to and from
//! the device, and the list of every op family of the crate, each of which
//! must have a CUDA kernel.
//!
//! Every test needs a CUDA device (a GPU, or the emulated one with
//! `TAPIR_CUDA=emulated`); without one it says so and passes, unless
//! `TAPIR_REQUIRE_CUDA=1` makes the skip a failure.

use tapir_tensor::ops::binary::{Binary, Cmp, Compare};
use tapir_tensor::ops::unary::Unary;
use tapir_tensor::ops::{forward, Op};
use tapir_tensor::prelude::*;

#[path = "support/cuda.rs"]
mod support;
use support::cuda;

/// Deterministic values in `[lo, hi)`, irregular enough to catch a wrong index.
fn values(n: usize, lo: f64, hi: f64, seed: u64) -> Vec<f64> {
    (0..n).map(|i| lo + (hi - lo) * (((i as u64 * 7919 + seed * 104_729) % 1000) as f64 / 1000.0)).collect()
}

fn tensor(v: Vec<f64>, shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_vec(v, shape.to_vec()).unwrap().cast(dtype).unwrap()
}

/// Asserts two results agree: shape, dtype, the device, and the values
/// within the dtype's rounding (tapir-testing's comparison).
fn assert_close(what: &str, cpu: &Tensor, gpu: &Tensor) {
    assert_eq!(cpu.shape(), gpu.shape(), "{what}: shape");
    assert_eq!(cpu.dtype(), gpu.dtype(), "{what}: dtype");
    assert!(matches!(gpu.device(), Device::Cuda(_)), "{what}: the result stays on the device");
    let tol = match cpu.dtype() {
        DType::F64 => 1e-12,
        DType::F32 => 2e-6,
        _ => 1e-2,
    };
    tapir_testing::assert_close(what, &gpu.to_device(Device::Cpu).unwrap().to_vec_f64(), &cpu.to_vec_f64(), tol);
}

/// The views every elementwise test runs on: contiguous, transposed, and
/// a narrowed transpose (an offset and gaps).
fn views(base: &Tensor) -> Vec<(&'static str, Tensor)> {
    vec![
        ("contiguous [4, 6]", base.clone()),
        ("transposed [6, 4]", base.t().unwrap()),
        ("narrowed [3, 4]", base.t().unwrap().narrow(0, 2, 3).unwrap()),
        ("column [4, 1]", base.narrow(1, 5, 1).unwrap()),
    ]
}

#[tapir_testing::cuda_test]
fn cuda_to_device_round_trips_every_dtype_and_views() {
    let Some(dev) = cuda("cuda_to_device_round_trips_every_dtype_and_views") else { return };
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64] {
        let t = tensor(values(24, -50.0, 50.0, 1), &[4, 6], dtype);
        let d = t.to_device(dev).unwrap();
        assert_eq!((d.device(), d.dtype(), d.dims()), (dev, dtype, &[4usize, 6][..]));
        assert_eq!(d.to_device(Device::Cpu).unwrap().to_vec_f64(), t.to_vec_f64(), "{dtype:?}");
        // A strided view goes over as its values, contiguous.
        let v = t.t().unwrap().narrow(0, 1, 3).unwrap();
        let dv = v.to_device(dev).unwrap();
        assert_eq!(dv.to_vec_f64(), v.to_vec_f64(), "{dtype:?} view");
        assert!(dv.to_device(dev).unwrap().same_storage(&dv), "already there: the same handle");
    }
    let empty = Tensor::from_vec(Vec::<f32>::new(), [0, 3]).unwrap().to_device(dev).unwrap();
    assert_eq!((empty.dims(), empty.to_vec_f64().len()), (&[0usize, 3][..], 0));
}

#[tapir_testing::cuda_test]
fn cuda_device_is_usable_and_best_picks_it() {
    let Some(dev) = cuda("cuda_device_is_usable_and_best_picks_it") else { return };
    assert_eq!(dev, Device::Cuda(0));
    assert_eq!(Device::best(), dev);
    // Opened once: asking again is the same device.
    assert_eq!(Device::cuda(0).unwrap(), dev);
    // An ordinal past the driver's count is an error naming it.
    let err = Device::cuda(15).unwrap_err();
    assert!(matches!(err, Error::DeviceUnavailable { device: Device::Cuda(15), .. }), "{err}");
}

#[tapir_testing::cuda_test]
fn cuda_unary_matches_the_cpu_on_views_in_f32_and_f64() {
    let Some(dev) = cuda("cuda_unary_matches_the_cpu_on_views_in_f32_and_f64") else { return };
    for dtype in [DType::F32, DType::F64] {
        // Positive inputs for every function; signed ones for those defined
        // on them (log, sqrt, rsqrt, powf and log1p are not: the CPU's
        // values there are not finite).
        for (lo, hi) in [(0.05, 3.0), (-3.0, 3.0)] {
            let base = tensor(values(24, lo, hi, 2), &[4, 6], dtype);
            let on_dev = base.to_device(dev).unwrap();
            for &op in Unary::ALL {
                let defined = forward(&op, &[&base]).unwrap().to_vec_f64().iter().all(|v| v.is_finite());
                if lo < 0.0 && !defined {
                    continue;
                }
                for ((what, x), (_, dx)) in views(&base).into_iter().zip(views(&on_dev)) {
                    let cpu = forward(&op, &[&x]).unwrap();
                    let gpu = forward(&op, &[&dx]).unwrap();
                    assert_close(&format!("{} {dtype:?} {what}", op.name()), &cpu, &gpu);
                }
            }
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_unary_on_half_types_rounds_once_as_the_cpu() {
    let Some(dev) = cuda("cuda_unary_on_half_types_rounds_once_as_the_cpu") else { return };
    for dtype in [DType::F16, DType::BF16] {
        let x = tensor(values(24, -2.0, 2.0, 3), &[4, 6], dtype);
        for op in [Unary::Neg, Unary::Square, Unary::MulScalar(-2.0), Unary::Relu, Unary::Exp, Unary::Tanh] {
            let (cpu, gpu) = (forward(&op, &[&x]).unwrap(), forward(&op, &[&x.to_device(dev).unwrap()]).unwrap());
            assert_close(&format!("{} {dtype:?}", op.name()), &cpu, &gpu);
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_binary_matches_the_cpu_with_broadcasting_and_views() {
    let Some(dev) = cuda("cuda_binary_matches_the_cpu_with_broadcasting_and_views") else { return };
    let ops = [Binary::Add, Binary::Sub, Binary::Mul, Binary::Div, Binary::Pow, Binary::Maximum, Binary::Minimum];
    for dtype in [DType::F32, DType::F64] {
        let pairs: Vec<(Tensor, Tensor)> = vec![
            (tensor(values(12, 0.1, 2.0, 4), &[3, 4], dtype), tensor(values(12, 0.1, 2.0, 5), &[3, 4], dtype)),
            (tensor(values(12, 0.1, 2.0, 6), &[4, 1, 3], dtype), tensor(values(5, -1.0, 1.0, 7), &[5, 1], dtype)),
            (tensor(values(6, 0.1, 2.0, 8), &[2, 3], dtype), tensor(vec![1.5], &[], dtype)),
            (
                tensor(values(12, 0.1, 2.0, 9), &[4, 3], dtype).t().unwrap(),
                tensor(values(24, 0.1, 2.0, 10), &[4, 6], dtype).narrow(1, 1, 4).unwrap().narrow(0, 1, 3).unwrap(),
            ),
        ];
        for (a, b) in &pairs {
            let (da, db) = (a.to_device(dev).unwrap(), b.to_device(dev).unwrap());
            for op in ops {
                let cpu = forward(&op, &[a, b]).unwrap();
                let gpu = forward(&op, &[&da, &db]).unwrap();
                assert_close(&format!("{} {dtype:?} {} {}", op.name(), a.shape(), b.shape()), &cpu, &gpu);
            }
            let (cpu, gpu) = (a.tanh_backward(b).unwrap(), da.tanh_backward(&db).unwrap());
            assert_close(&format!("tanh_backward {dtype:?}"), &cpu, &gpu);
        }
    }
}

/// The integer results of `op` on both devices, bit for bit, or the same
/// error from both.
fn int_parity(op: Binary, a: &Tensor, b: &Tensor, dev: Device) {
    let what = format!("{} {:?} {} {}", op.name(), a.dtype(), a.shape(), b.shape());
    let cpu = forward(&op, &[a, b]);
    let gpu = forward(&op, &[&a.to_device(dev).unwrap(), &b.to_device(dev).unwrap()]);
    let (cpu, gpu) = match (cpu, gpu) {
        (Ok(c), Ok(g)) => (c, g),
        (Err(c), Err(g)) => return assert_eq!(c, g, "{what}: the CPU's error"),
        (c, g) => panic!("{what}: cpu {c:?} vs cuda {g:?}"),
    };
    assert_eq!(gpu.device(), dev, "{what}");
    let gpu = gpu.to_device(Device::Cpu).unwrap();
    assert_eq!((cpu.dtype(), cpu.dims()), (gpu.dtype(), gpu.dims()), "{what}");
    if a.dtype() == DType::I32 {
        assert_eq!(cpu.to_vec::<i32>().unwrap(), gpu.to_vec::<i32>().unwrap(), "{what}");
    } else {
        assert_eq!(cpu.to_vec::<i64>().unwrap(), gpu.to_vec::<i64>().unwrap(), "{what}");
    }
}

#[tapir_testing::cuda_test]
fn cuda_integer_arithmetic_wraps_and_matches_the_cpu() {
    let Some(dev) = cuda("cuda_integer_arithmetic_wraps_and_matches_the_cpu") else { return };
    let a32 = Tensor::from_vec(vec![i32::MAX, -3, 7, i32::MIN, 0, 12], [2, 3]).unwrap();
    let b32 = Tensor::from_vec(vec![1i32, 2, -2], [3]).unwrap();
    let a64 = Tensor::from_vec(vec![i64::MAX, -3, 1 << 40, i64::MIN, 0, 12], [3, 2]).unwrap().t().unwrap();
    let b64 = Tensor::from_vec(vec![3i64, -1], [2, 1]).unwrap();
    for (a, b) in [(&a32, &b32), (&a64, &b64)] {
        // pow meets a negative exponent here: the CPU's error, checked below.
        for &op in Binary::INT_KERNELS {
            int_parity(op, a, b, dev);
        }
        // Division of integers is true division, in float32, on both devices.
        let (da, db) = (a.to_device(dev).unwrap(), b.to_device(dev).unwrap());
        let q = forward(&Binary::Div, &[&da, &db]).unwrap();
        assert_close("div of integers", &forward(&Binary::Div, &[a, b]).unwrap(), &q);
    }
    assert_eq!(a32.add(&b32).unwrap().to_vec::<i32>().unwrap()[0], i32::MIN, "the CPU wraps too");
}

#[tapir_testing::cuda_test]
fn cuda_integer_pow_wraps_and_rejects_negative_exponents_as_the_cpu() {
    let Some(dev) = cuda("cuda_integer_pow_wraps_and_rejects_negative_exponents_as_the_cpu") else { return };
    // Bases that overflow at once, signs, 0 and 1; exponents 0, small, and
    // large enough to wrap many times over (2^40 loops 41 times).
    let bases32 = vec![i32::MAX, i32::MIN, -3, -1, 0, 1, 2, 7, 46_341, -65_536];
    let exps32 = vec![0i32, 1, 2, 3, 17, 31, 32, 63, i32::MAX];
    let bases64 = vec![i64::MAX, i64::MIN, -3, -1, 0, 1, 2, 7, 3_037_000_500, -(1 << 32)];
    let exps64 = vec![0i64, 1, 2, 3, 17, 63, 64, 1 << 40, i64::MAX];
    let a32 = Tensor::from_vec(bases32, [10, 1]).unwrap();
    let e32 = Tensor::from_vec(exps32, [9]).unwrap();
    let a64 = Tensor::from_vec(bases64, [10, 1]).unwrap();
    let e64 = Tensor::from_vec(exps64, [9]).unwrap();
    for (a, e) in [(&a32, &e32), (&a64, &e64)] {
        // Every base to every exponent (broadcast), and on strided views.
        int_parity(Binary::Pow, a, e, dev);
        let grid = forward(&Binary::Pow, &[a, e]).unwrap();
        int_parity(Binary::Pow, &grid.t().unwrap(), &e.narrow(0, 0, 1).unwrap(), dev);
        int_parity(Binary::Pow, &grid.narrow(1, 2, 4).unwrap(), &e.narrow(0, 1, 4).unwrap(), dev);
        // A 0-d exponent, and an empty operand.
        int_parity(Binary::Pow, a, &e.narrow(0, 3, 1).unwrap().reshape(()).unwrap(), dev);
        int_parity(Binary::Pow, &a.narrow(0, 0, 0).unwrap(), e, dev);
    }
    // Spot values: 3^3 wraps nowhere, 2^31 wraps i32 to its minimum, and
    // 7^2^40 is odd (7 to any power is).
    let p = forward(&Binary::Pow, &[&a32.to_device(dev).unwrap(), &e32.to_device(dev).unwrap()]).unwrap();
    let p = p.to_device(Device::Cpu).unwrap().to_vec::<i32>().unwrap();
    assert_eq!((p[2 * 9 + 3], p[6 * 9 + 5], p[6 * 9 + 6]), (-27, i32::MIN, 0));
    assert_eq!(p[7 * 9 + 8] & 1, 1);
    // Negative exponents: the CPU's error, naming the first one in the
    // output's order, also when it comes from a broadcast or strided operand.
    let neg = Tensor::from_vec(vec![2i32, 0, -4, 1, -1, -9], [2, 3]).unwrap();
    let base = Tensor::from_vec(vec![5i32, 6], [2, 1]).unwrap();
    int_parity(Binary::Pow, &base, &neg, dev);
    int_parity(Binary::Pow, &base, &neg.t().unwrap().narrow(0, 1, 2).unwrap(), dev);
    let err = base.to_device(dev).unwrap().pow(&neg.to_device(dev).unwrap()).unwrap_err();
    assert!(err.to_string().contains("negative integer powers") && err.to_string().contains("-4"), "{err}");
    let neg64 = Tensor::from_vec(vec![3i64, i64::MIN], [2]).unwrap();
    int_parity(Binary::Pow, &Tensor::from_vec(vec![-2i64], [1]).unwrap(), &neg64, dev);
}

#[tapir_testing::cuda_test]
fn cuda_reshape_and_contiguous_of_strided_views_copy_on_the_device() {
    let Some(dev) = cuda("cuda_reshape_and_contiguous_of_strided_views_copy_on_the_device") else { return };
    let base = tensor(values(24, -3.0, 3.0, 11), &[4, 6], DType::F32);
    let d = base.to_device(dev).unwrap();
    let (cpu, gpu) = (base.t().unwrap().reshape([3, 8]).unwrap(), d.t().unwrap().reshape([3, 8]).unwrap());
    assert_close("reshape of a transpose", &cpu, &gpu);
    let (cpu, gpu) =
        (base.narrow(1, 1, 4).unwrap().contiguous().unwrap(), d.narrow(1, 1, 4).unwrap().contiguous().unwrap());
    assert!(gpu.is_contiguous());
    assert_close("contiguous of a narrowed view", &cpu, &gpu);
}

#[tapir_testing::cuda_test]
fn cuda_comparisons_match_the_cpu_with_tensors_and_scalars() {
    let Some(dev) = cuda("cuda_comparisons_match_the_cpu_with_tensors_and_scalars") else { return };
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        // Few distinct values, so ties are common.
        let a = tensor(values(24, 0.0, 4.0, 11).into_iter().map(f64::floor).collect(), &[2, 3, 4], dtype);
        let b = tensor(values(4, 0.0, 4.0, 12).into_iter().map(f64::floor).collect(), &[4], dtype);
        let (da, db) = (a.to_device(dev).unwrap(), b.to_device(dev).unwrap());
        for cmp in [Cmp::Eq, Cmp::Ne, Cmp::Lt, Cmp::Le, Cmp::Gt, Cmp::Ge] {
            let with_tensor = Compare { cmp, scalar: None };
            let cpu = forward(&with_tensor, &[&a, &b]).unwrap();
            assert_close(&format!("{cmp:?} {dtype:?}"), &cpu, &forward(&with_tensor, &[&da, &db]).unwrap());
            let with_scalar = Compare { cmp, scalar: Some(2.0) };
            let (x, dx) = (a.t().unwrap(), da.t().unwrap());
            let cpu = forward(&with_scalar, &[&x]).unwrap();
            assert_close(&format!("{cmp:?} 2.0 {dtype:?}"), &cpu, &forward(&with_scalar, &[&dx]).unwrap());
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_contiguous_copies_strided_views_of_every_dtype() {
    let Some(dev) = cuda("cuda_contiguous_copies_strided_views_of_every_dtype") else { return };
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64] {
        let base = tensor(values(60, -9.0, 9.0, 13).into_iter().map(f64::round).collect(), &[3, 4, 5], dtype);
        let d = base.to_device(dev).unwrap();
        let cases = [
            (base.permute(&[2, 0, 1]).unwrap(), d.permute(&[2, 0, 1]).unwrap()),
            (
                base.narrow(2, 1, 3).unwrap().narrow(0, 1, 2).unwrap(),
                d.narrow(2, 1, 3).unwrap().narrow(0, 1, 2).unwrap(),
            ),
            (
                base.narrow(1, 2, 1).unwrap().broadcast_to([3, 6, 5]).unwrap(),
                d.narrow(1, 2, 1).unwrap().broadcast_to([3, 6, 5]).unwrap(),
            ),
        ];
        for (x, dx) in cases {
            let c = dx.contiguous_().unwrap();
            assert!(c.is_contiguous() && !c.same_storage(&dx));
            assert_eq!(c.to_vec_f64(), x.to_vec_f64(), "{dtype:?} {}", x.shape());
        }
        // Already contiguous: the same handle, as on the CPU.
        assert!(d.contiguous_().unwrap().same_storage(&d));
    }
}

#[tapir_testing::cuda_test]
fn cuda_casts_between_all_six_dtypes_match_the_cpu() {
    let Some(dev) = cuda("cuda_casts_between_all_six_dtypes_match_the_cpu") else { return };
    let all = [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64];
    // Fractions, negatives, values past f16's range and past i32's, NaN and
    // infinities: rounding, truncation and saturation all show.
    let special =
        vec![0.5, -1.75, 2.5, 1e5, -7e4, 3e9, -3e9, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1.0 / 3.0, 65519.0];
    for from in all {
        let x = Tensor::from_vec(special.clone(), [3, 4]).unwrap().cast(from).unwrap();
        let dx = x.to_device(dev).unwrap();
        for to in all {
            let cpu = x.cast(to).unwrap();
            let gpu = dx.cast(to).unwrap();
            assert_eq!(gpu.dtype(), to);
            let (a, b) = (cpu.to_vec_f64(), gpu.to_vec_f64());
            let same = a.iter().zip(&b).all(|(p, q)| p == q || (p.is_nan() && q.is_nan()));
            assert!(same, "{from:?} -> {to:?}: cpu {a:?} vs cuda {b:?}");
            // A transposed view casts to the same values.
            let (ct, gt) = (x.t().unwrap().cast(to).unwrap(), dx.t().unwrap().cast(to).unwrap());
            let (a, b) = (ct.to_vec_f64(), gt.to_vec_f64());
            assert!(a.iter().zip(&b).all(|(p, q)| p == q || (p.is_nan() && q.is_nan())), "{from:?} -> {to:?} view");
        }
    }
}

#[tapir_testing::cuda_test]
fn cuda_mixing_devices_is_a_device_mismatch_naming_both() {
    let Some(dev) = cuda("cuda_mixing_devices_is_a_device_mismatch_naming_both") else { return };
    let c = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    let d = c.to_device(dev).unwrap();
    assert_eq!(c.add(&d).unwrap_err(), Error::DeviceMismatch { op: "add", lhs: Device::Cpu, rhs: dev });
    assert_eq!(d.mul(&c).unwrap_err(), Error::DeviceMismatch { op: "mul", lhs: dev, rhs: Device::Cpu });
    // A shape mismatch is the CPU's error.
    let e = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap().to_device(dev).unwrap();
    assert!(matches!(d.add(&e).unwrap_err(), Error::ShapeMismatch { op: "add", .. }));
    // An int tensor has no float kernel: a dtype error naming the op.
    let i = Tensor::from_vec(vec![1i64, 2], [2]).unwrap().to_device(dev).unwrap();
    assert!(matches!(i.exp().unwrap_err(), Error::UnsupportedDType { op: "exp", dtype: DType::I64, .. }));
}

/// One call of an op on a CUDA tensor `x` ([2, 3] f32), making any other
/// operand it needs on `x`'s device.
type Case = (String, Box<dyn Fn(&Tensor) -> Result<Tensor>>);

fn case(name: &str, call: impl Fn(&Tensor) -> Result<Tensor> + 'static) -> Case {
    (name.to_string(), Box::new(call))
}

/// `v` as a tensor of `shape` on `x`'s device.
fn on<T: tapir_tensor::CpuElement>(x: &Tensor, v: Vec<T>, shape: &[usize]) -> Result<Tensor> {
    Tensor::from_vec(v, shape.to_vec())?.to_device(x.device())
}

/// Every op family of the tensor crate, each called once on a CUDA tensor:
/// every op of `ops::registry()` by its name (the test checks none is
/// missing), every unary and binary function and comparison, the integer
/// kernels, and the ops outside the registry (embedding, the constructors,
/// the random draws).
fn every_op() -> Vec<Case> {
    use tapir_tensor::ops::index::IndexAdd;
    use tapir_tensor::ops::shape::Pad;
    let mut cases: Vec<Case> = Unary::ALL
        .iter()
        .map(|&u| case(u.name(), move |x: &Tensor| forward(&u, &[&x.abs()?.add_scalar(0.5)?])))
        .collect();
    cases.extend(Binary::ALL.iter().map(|&b| case(b.name(), move |x: &Tensor| forward(&b, &[&x.exp()?, x]))));
    for cmp in Cmp::ALL.iter().copied() {
        let name = Compare { cmp, scalar: None }.name();
        cases.push(case(name, move |x| forward(&Compare { cmp, scalar: None }, &[x, &x.t()?.contiguous_()?.t()?])));
        cases.push(case(&format!("{name} scalar"), move |x| forward(&Compare { cmp, scalar: Some(0.0) }, &[x])));
    }
    for dt in [DType::I32, DType::I64] {
        for &b in Binary::INT_KERNELS {
            cases.push(case(&format!("{} {dt}", b.name()), move |x| {
                let i = on(x, vec![3i64, -2, 0, 7, 1, -1], &[2, 3])?.cast(dt)?;
                forward(&b, &[&i, &i.abs()?])
            }));
        }
        cases.push(case(&format!("div {dt}"), move |x| {
            let i = on(x, vec![3i64, -2, 5, 7, 1, -1], &[2, 3])?.cast(dt)?;
            i.div(&i)
        }));
        for cmp in Cmp::ALL.iter().copied() {
            cases.push(case(&format!("{} {dt}", Compare { cmp, scalar: None }.name()), move |x| {
                let i = on(x, vec![3i64, -2, 0, 7, 1, -1], &[2, 3])?.cast(dt)?;
                let j = on(x, vec![3i64, 2, -1], &[3])?.cast(dt)?;
                forward(&Compare { cmp, scalar: None }, &[&i, &j])?
                    .add(&forward(&Compare { cmp, scalar: Some(0.5) }, &[&i])?)
            }));
        }
        cases.push(case(&format!("neg {dt}"), move |x| on(x, vec![3i64, -2], &[2])?.cast(dt)?.neg()));
        cases.push(case(&format!("abs {dt}"), move |x| on(x, vec![3i64, -2], &[2])?.cast(dt)?.abs()));
        cases.push(case(&format!("sum {dt}"), move |x| {
            on(x, vec![3i64, -2, 4, 1], &[2, 2])?.cast(dt)?.sum(&[1], false)
        }));
        cases.push(case(&format!("argmax {dt}"), move |x| {
            on(x, vec![3i64, -2, 4, 1], &[2, 2])?.cast(dt)?.argmax(1, false)
        }));
    }
    cases.extend([
        case("tanh_backward", |x| x.tanh_backward(x)),
        case("where", |x| x.where_(&on(x, vec![1.0f32, 0.0, 1.0, 0.0, 1.0, 1.0], &[2, 3])?, &x.neg()?)),
        case("sum", |x| x.sum(&[1], false)),
        case("mean", |x| x.mean(&[0], true)),
        case("max", |x| x.max(&[1], false)),
        case("min", |x| x.min(&[1], false)),
        case("logsumexp", |x| x.logsumexp(&[1], false)),
        case("argmax", |x| x.argmax(1, false)),
        case("argmin", |x| x.argmin(0, true)),
        case("sum_to", |x| x.sum_to([1, 3])),
        case("softmax", |x| x.softmax(-1)),
        case("log_softmax", |x| x.log_softmax(0)),
        case("matmul", |x| x.matmul(&x.t()?)),
        case("matmul batched", |x| x.unsqueeze(0)?.broadcast_to([2, 2, 3])?.matmul(&x.t()?)),
        case("reshape", |x| x.t()?.reshape([6])),
        case("permute", |x| x.permute(&[1, 0])?.contiguous_()),
        case("narrow", |x| x.narrow(1, 1, 2)?.contiguous_()),
        case("broadcast_to", |x| x.unsqueeze(0)?.broadcast_to([2, 2, 3])?.contiguous_()),
        case("contiguous", |x| x.t()?.contiguous_()),
        case("cast", |x| x.cast(DType::F64)),
        case("cast f16", |x| x.cast(DType::F16)?.cast(DType::BF16)?.cast(DType::I64)),
        case("concat", |x| ShapeOps::concat(&[x, x], 0)),
        case("stack", |x| ShapeOps::stack(&[x, x], 0)),
        case("pad", |x| forward(&Pad { axis: 1, start: 1, size: 5 }, &[x])),
        case("index_select", |x| x.index_select(0, &on(x, vec![1i64, 0], &[2])?)),
        case("index_add", |x| forward(&IndexAdd { axis: 0, idx: on(x, vec![2i32, 2], &[2])?, size: 3 }, &[x])),
        case("gather", |x| x.gather(1, &on(x, vec![0i64, 2], &[2, 1])?)),
        case("scatter_add", |x| x.scatter_add(1, &on(x, vec![0i64, 0, 2, 1], &[2, 2])?, &x.narrow(1, 0, 2)?)),
        case("embedding", |x| x.embedding(&on(x, vec![1i64, 0, 1], &[3])?)),
        case("sparse_cross_entropy", |x| x.sparse_cross_entropy(&on(x, vec![2i64, 0], &[2])?)),
        case("linear_cross_entropy", |x| {
            let w = on(x, vec![0.5f32, -1.0, 0.25, 1.0, 0.0, -0.5, 2.0, 0.5, 1.5, -2.0, 1.0, 0.0], &[4, 3])?;
            x.linear_cross_entropy(&w, None, &on(x, vec![3i64, 1], &[2])?, Default::default(), None)
        }),
        case("zeros_on", |x| Tensor::zeros_on([2, 3], DType::BF16, x.device())),
        case("ones_on", |x| Tensor::ones_on([2, 3], DType::I32, x.device())),
        case("full_on", |x| Tensor::full_on([2, 3], -0.0, DType::F64, x.device())),
        case("to_device", |x| Tensor::scalar(1.0).to_device(x.device())),
        case("rand_on", |x| Rng::new(1).rand_on([5], DType::F32, x.device())),
        case("uniform_on", |x| Rng::new(2).uniform_on([5], -2.0, 2.0, DType::F64, x.device())),
        case("randn_on", |x| Rng::new(3).randn_on([5], DType::BF16, x.device())),
        case("normal_tensor_on", |x| Rng::new(4).normal_tensor_on([5], 1.0, 2.0, DType::F16, x.device())),
        case("randint_on", |x| Rng::new(5).randint_on([5], 7, DType::I64, x.device())),
    ]);
    cases
}

#[tapir_testing::cuda_test]
fn cuda_every_op_has_a_kernel_and_every_op_is_listed() {
    let Some(dev) = cuda("cuda_every_op_has_a_kernel_and_every_op_is_listed") else { return };
    let x = tensor(values(6, -1.0, 1.0, 14), &[2, 3], DType::F32).to_device(dev).unwrap();
    let cases = every_op();
    // Every op the crate registers has a case here (by its name, or its
    // name and a qualifier), so a new op cannot be left out of this list.
    for op in tapir_tensor::ops::registry() {
        let name = op.name();
        let listed = cases.iter().any(|(n, _)| n == name || n.starts_with(&format!("{name} ")));
        assert!(listed, "{name} is an op of the crate with no case in every_op()");
    }
    let (mut missing, mut done) = (Vec::new(), Vec::new());
    for (name, call) in &cases {
        match call(&x) {
            Ok(y) => {
                assert_eq!(y.device(), dev, "{name}");
                done.push(name.as_str());
            }
            Err(Error::Unsupported { device, .. }) => {
                assert_eq!(device, dev);
                missing.push(name.as_str());
            }
            Err(e) => panic!("{name}: neither a result nor Unsupported: {e}"),
        }
    }
    println!("ops with a CUDA kernel ({}): {}", done.len(), done.join(", "));
    println!("ops with no CUDA kernel ({}): {}", missing.len(), missing.join(", "));
    // The goal, reached: none. (That an op without a kernel is
    // `Error::Unsupported`, not a panic, is tested on a stand-in device by
    // the crate's own unit tests.)
    assert!(missing.is_empty(), "ops with no CUDA kernel: {}", missing.join(", "));
}
