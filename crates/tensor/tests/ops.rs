//! Reference values for every op of tapir-tensor, forward only, on every
//! device: each test runs on the CPU (`<name>::cpu`) and on CUDA device 0
//! (`<name>::cuda`, skipped with a printed line when there is none), its
//! inputs made on that device and its results read back to be checked.
//!
//! Expected values are either hand-computed, pasted from torch (the script is
//! in a comment beside them) or produced by a plain loop over `Vec<f64>` with
//! explicit index math in this file. Every op also runs on strided inputs
//! (transposed, narrowed, broadcast) and must agree with a contiguous copy.
//! The few plain `#[test]`s are about the host itself; each says why.

use tapir_tensor::prelude::*;
use tapir_testing::test_device;

#[path = "support/on.rs"]
mod on;
use on::On;

// ----- helpers -------------------------------------------------------------

type R = anyhow::Result<()>;

/// Asserts two results are the same tensor by value, on one device.
#[track_caller]
fn same(a: &Tensor, b: &Tensor) {
    assert_eq!(a.device(), b.device());
    assert_eq!(a.dims(), b.dims());
    assert_eq!(a.dtype(), b.dtype());
    assert_eq!(a.to_vec_f64(), b.to_vec_f64());
}

/// Row-major multi-index of flat position `i` in `dims`.
fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for a in (0..dims.len()).rev() {
        idx[a] = i % dims[a];
        i /= dims[a];
    }
    idx
}

fn ravel(idx: &[usize], dims: &[usize]) -> usize {
    idx.iter().zip(dims).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// numpy broadcasting of two shapes (test reference).
fn bshape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let da = if i + a.len() >= r { a[i + a.len() - r] } else { 1 };
            let db = if i + b.len() >= r { b[i + b.len() - r] } else { 1 };
            if da == 1 {
                db
            } else {
                da
            }
        })
        .collect()
}

/// Reads element `out_idx` of a broadcast operand of shape `dims`.
fn bread(data: &[f64], dims: &[usize], out_idx: &[usize]) -> f64 {
    let off = out_idx.len() - dims.len();
    let idx: Vec<usize> = dims.iter().enumerate().map(|(i, &d)| if d == 1 { 0 } else { out_idx[off + i] }).collect();
    data[ravel(&idx, dims)]
}

/// Naive broadcasting binary op.
fn naive_binary(
    a: &[f64],
    ad: &[usize],
    b: &[f64],
    bd: &[usize],
    f: impl Fn(f64, f64) -> f64,
) -> (Vec<usize>, Vec<f64>) {
    let od = bshape(ad, bd);
    let n: usize = od.iter().product();
    let out = (0..n)
        .map(|i| {
            let idx = unravel(i, &od);
            f(bread(a, ad, &idx), bread(b, bd, &idx))
        })
        .collect();
    (od, out)
}

/// Naive reduction over `axes` (sorted, unique) with `init` and `fold`.
fn naive_reduce(
    x: &[f64],
    dims: &[usize],
    axes: &[usize],
    keepdim: bool,
    init: f64,
    fold: impl Fn(f64, f64) -> f64,
) -> (Vec<usize>, Vec<f64>) {
    let kept: Vec<usize> = dims.iter().enumerate().map(|(i, &d)| if axes.contains(&i) { 1 } else { d }).collect();
    let mut out = vec![init; kept.iter().product()];
    for (i, &v) in x.iter().enumerate() {
        let mut idx = unravel(i, dims);
        for &a in axes {
            idx[a] = 0;
        }
        let o = ravel(&idx, &kept);
        out[o] = fold(out[o], v);
    }
    let shape = if keepdim {
        kept
    } else {
        dims.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect()
    };
    (shape, out)
}

fn naive_matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    out
}

// ----- creation --------------------------------------------------------------

test_device! {
    fn creation_zeros_ones_full(device: Device) -> R {
        let on = On(device);
        let z = on.zeros([2, 3], DType::F32).expect("alloc");
        on.check(&z, &[2, 3], &[0.0; 6], 0.0);
        assert_eq!(z.dtype(), DType::F32);
        let o = on.ones([4], DType::I64).expect("alloc");
        assert_eq!(o.to_vec::<i64>()?, vec![1, 1, 1, 1]);
        let f = on.full([2, 2], 2.5, DType::F64).expect("alloc");
        assert_eq!(f.to_vec::<f64>()?, vec![2.5; 4]);
        let s = on.full((), -3.0, DType::I32).expect("alloc");
        assert_eq!(s.dims(), &[] as &[usize]);
        assert_eq!(s.to_vec::<i32>()?, vec![-3]);
        let e = on.zeros([0, 3], DType::F32).expect("alloc");
        assert_eq!(e.numel(), 0);
        assert_eq!(e.to_vec::<f32>()?, Vec::<f32>::new());
        let zl = f.zeros_like()?;
        assert_eq!(zl.dims(), &[2, 2]);
        assert_eq!(zl.dtype(), DType::F64);
        assert_eq!(zl.to_vec::<f64>()?, vec![0.0; 4]);
        Ok(())
    }

    fn creation_arange(device: Device) -> R {
        let on = On(device);
        on.check(&on.arange(0.0, 5.0, 1.0, DType::F32)?, &[5], &[0.0, 1.0, 2.0, 3.0, 4.0], 0.0);
        on.check(&on.arange(1.0, 2.0, 0.25, DType::F64)?, &[4], &[1.0, 1.25, 1.5, 1.75], 0.0);
        // Negative step, and an end that is not hit exactly (torch: ceil).
        on.check(&on.arange(3.0, -3.0, -2.0, DType::F32)?, &[3], &[3.0, 1.0, -1.0], 0.0);
        assert_eq!(on.arange(0.0, 10.0, 3.0, DType::I64)?.to_vec::<i64>()?, vec![0, 3, 6, 9]);
        // Empty ranges, including a step pointing away from the end.
        assert_eq!(on.arange(2.0, 2.0, 1.0, DType::F32)?.dims(), &[0]);
        assert_eq!(on.arange(2.0, 0.0, 1.0, DType::F32)?.dims(), &[0]);
        Ok(())
    }

    fn creation_eye_and_scalars(device: Device) -> R {
        let on = On(device);
        on.check(&on.eye(3, DType::F32).expect("alloc"), &[3, 3], &[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0], 0.0);
        assert_eq!(on.eye(0, DType::F32).expect("alloc").dims(), &[0, 0]);
        assert_eq!(on.eye(2, DType::I32).expect("alloc").to_vec::<i32>()?, vec![1, 0, 0, 1]);
        let s = on.scalar(1.5);
        assert_eq!(s.rank(), 0);
        assert_eq!(s.item()?, 1.5);
        assert_eq!(s.item_f32()?, 1.5);
        let s64 = on.scalar_of(0.1, DType::F64);
        assert_eq!(s64.dtype(), DType::F64);
        assert_eq!(s64.item()?, 0.1);
        // item works on any one-element tensor.
        assert_eq!(on.f32s(&[7.0], &[1, 1, 1]).item()?, 7.0);
        Ok(())
    }
}

// Host only: from_vec and from_slice make host tensors, and as_slice views
// host memory.
#[test]
fn creation_from_vec_and_slice() -> R {
    let x = Tensor::from_slice(&[1i32, 2, 3, 4, 5, 6], [2, 3])?;
    assert_eq!(x.dtype(), DType::I32);
    assert_eq!(x.dims(), &[2, 3]);
    assert_eq!(x.strides(), &[3, 1]);
    assert!(x.is_contiguous());
    assert_eq!(x.to_vec::<i32>()?, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(x.as_slice::<i32>(), Some(&[1, 2, 3, 4, 5, 6][..]));
    assert_eq!(x.as_slice::<f32>(), None);
    assert_eq!(x.device(), Device::Cpu);
    assert_eq!(x.dim(-1)?, 3);
    assert_eq!(x.dim(0)?, 2);
    // Wrong element count: a structured error, not a panic.
    assert!(matches!(Tensor::from_vec(vec![1.0f32; 5], [2, 3]), Err(Error::ElementCount { expected: 6, got: 5, .. })));
    assert!(matches!(Tensor::from_slice(&[1.0f64; 7], [2, 3]), Err(Error::ElementCount { expected: 6, got: 7, .. })));
    // to_vec with the wrong type is an error too.
    assert!(matches!(x.to_vec::<f32>(), Err(Error::DTypeMismatch { .. })));
    // to_vec_f32/f64 convert any dtype.
    assert_eq!(x.to_vec_f32(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    Ok(())
}

test_device! {
    /// Every generator draws on the test's device, there.
    fn rng_reproducible_from_seed(device: Device) -> R {
        let on = |t: Tensor| -> Result<Tensor> {
            assert_eq!(t.device(), device, "generated on the device");
            Ok(t)
        };
        let a = on(Rng::new(42).randn_on([64], DType::F32, device)?)?.to_vec::<f32>()?;
        let b = on(Rng::new(42).randn_on([64], DType::F32, device)?)?.to_vec::<f32>()?;
        let c = on(Rng::new(43).randn_on([64], DType::F32, device)?)?.to_vec::<f32>()?;
        assert_eq!(a, b);
        assert_ne!(a, c);

        let mut r = Rng::new(7);
        let u = on(r.rand_on([10_000], DType::F64, device)?)?.to_vec::<f64>()?;
        assert!(u.iter().all(|&v| (0.0..1.0).contains(&v)));
        let mean = u.iter().sum::<f64>() / u.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "uniform mean {mean}");

        let w = on(r.uniform_on([10_000], -3.0, -1.0, DType::F32, device)?)?.to_vec::<f32>()?;
        assert!(w.iter().all(|&v| (-3.0..-1.0).contains(&v)));

        let n = on(r.randn_on([20_000], DType::F64, device)?)?.to_vec::<f64>()?;
        let m = n.iter().sum::<f64>() / n.len() as f64;
        let var = n.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / n.len() as f64;
        assert!(m.abs() < 0.03, "normal mean {m}");
        assert!((var - 1.0).abs() < 0.05, "normal variance {var}");

        let nt = on(r.normal_tensor_on([20_000], 5.0, 2.0, DType::F64, device)?)?.to_vec::<f64>()?;
        let m2 = nt.iter().sum::<f64>() / nt.len() as f64;
        assert!((m2 - 5.0).abs() < 0.06, "normal(5, 2) mean {m2}");

        let ints = on(r.randint_on([1000], 10, DType::I64, device)?)?.to_vec::<i64>()?;
        assert!(ints.iter().all(|&v| (0..10).contains(&v)));
        for k in 0..10 {
            assert!(ints.contains(&k), "randint never produced {k}");
        }
        // A cloned generator continues the same stream.
        let mut g1 = Rng::new(9);
        g1.next_u64();
        let mut g2 = g1.clone();
        assert_eq!(g1.next_u64(), g2.next_u64());
        assert_eq!(on(Rng::new(1).rand_on([3], DType::F16, device)?)?.dtype(), DType::F16);
        Ok(())
    }
}

// ----- unary -----------------------------------------------------------------

/// A unary op under test: the method and the f64 reference.
type UnaryCase = (&'static str, fn(&Tensor) -> Result<Tensor>, fn(f64) -> f64);

const XS: [f64; 6] = [-2.0, -0.5, 0.0, 0.3, 1.0, 2.5];
const POS: [f64; 6] = [0.01, 0.25, 0.5, 1.0, 2.0, 100.0];

fn unary_cases() -> Vec<(UnaryCase, &'static [f64])> {
    vec![
        (("neg", |x| x.neg(), |v| -v), &XS),
        (("abs", |x| x.abs(), |v| v.abs()), &XS),
        (("exp", |x| x.exp(), |v| v.exp()), &XS),
        (("log", |x| x.log(), |v| v.ln()), &POS),
        (("sqrt", |x| x.sqrt(), |v| v.sqrt()), &POS),
        (("rsqrt", |x| x.rsqrt(), |v| 1.0 / v.sqrt()), &POS),
        (("tanh", |x| x.tanh(), |v| v.tanh()), &XS),
        (("sigmoid", |x| x.sigmoid(), |v| 1.0 / (1.0 + (-v).exp())), &XS),
        (("relu", |x| x.relu(), |v| v.max(0.0)), &XS),
        (("sin", |x| x.sin(), |v| v.sin()), &XS),
        (("cos", |x| x.cos(), |v| v.cos()), &XS),
        (("square", |x| x.square(), |v| v * v), &XS),
        (("powf 3", |x| x.powf(3.0), |v| v.powi(3)), &XS),
        (("powf 0.5", |x| x.powf(0.5), |v| v.sqrt()), &POS),
        (("powf -1.5", |x| x.powf(-1.5), |v| v.powf(-1.5)), &POS),
        (("recip", |x| x.recip(), |v| 1.0 / v), &POS),
        (("add_scalar", |x| x.add_scalar(1.5), |v| v + 1.5), &XS),
        (("sub_scalar", |x| x.sub_scalar(1.5), |v| v - 1.5), &XS),
        (("mul_scalar", |x| x.mul_scalar(-3.0), |v| v * -3.0), &XS),
        (("div_scalar", |x| x.div_scalar(4.0), |v| v / 4.0), &XS),
        (("clamp", |x| x.clamp(-0.5, 1.0), |v| v.clamp(-0.5, 1.0)), &XS),
        (("rsub_scalar", |x| x.rsub_scalar(2.0), |v| 2.0 - v), &XS),
        (("rdiv_scalar", |x| x.rdiv_scalar(2.0), |v| 2.0 / v), &POS),
        (
            (
                "sign",
                |x| x.sign(),
                |v| {
                    if v > 0.0 {
                        1.0
                    } else if v < 0.0 {
                        -1.0
                    } else {
                        0.0
                    }
                },
            ),
            &XS,
        ),
        (("maximum_scalar", |x| x.maximum_scalar(0.2), |v| v.max(0.2)), &XS),
        (("minimum_scalar", |x| x.minimum_scalar(0.2), |v| v.min(0.2)), &XS),
    ]
}

test_device! {
    fn unary_reference_values_f32_f64(device: Device) -> R {
        let on = On(device);
        for ((name, op, reference), xs) in unary_cases() {
            let want: Vec<f64> = xs.iter().map(|&v| reference(v)).collect();
            let y64 = op(&on.f64s(xs, &[2, 3]))?;
            assert_eq!(y64.dtype(), DType::F64, "{name}");
            on.check(&y64, &[2, 3], &want, 1e-12);
            let y32 = op(&on.f32s(xs, &[2, 3]))?;
            assert_eq!(y32.dtype(), DType::F32, "{name}");
            // The reference is evaluated at the f32-rounded input.
            let want32: Vec<f64> = xs.iter().map(|&v| reference(v as f32 as f64)).collect();
            on.check(&y32, &[2, 3], &want32, 2e-6);
        }
        Ok(())
    }

    fn unary_on_strided_inputs_matches_contiguous(device: Device) -> R {
        let on = On(device);
        // A transposed view, a narrowed view and a broadcast view.
        let base = on.f64s(&(0..24).map(|i| (i as f64 - 11.5) / 7.0).collect::<Vec<_>>(), &[4, 6]);
        let pos = base.abs()?.add_scalar(0.1)?;
        for ((name, op, reference), xs) in unary_cases() {
            let src = if xs == POS { &pos } else { &base };
            let views = [
                src.t()?,
                src.narrow(1, 1, 3)?,
                src.narrow(0, 1, 1)?.broadcast_to([3, 6])?,
                src.t()?.narrow(0, 2, 3)?.narrow(1, 1, 2)?,
            ];
            for v in &views {
                assert!(!v.is_contiguous(), "{name}: view should be strided");
                let got = op(v)?;
                let want: Vec<f64> = v.to_vec_f64().iter().map(|&x| reference(x)).collect();
                on.check(&got, v.dims(), &want, 1e-12);
                same(&got, &op(&v.contiguous()?)?);
            }
        }
        Ok(())
    }

    fn gelu_erf_and_gelu_tanh_match_torch(device: Device) -> R {
        let on = On(device);
        // import math, torch
        // xs = [-2.0, -0.5, 0.0, 0.3, 1.0, 2.5]
        // [0.5*x*(1+math.erf(x/math.sqrt(2))) for x in xs]
        // torch.nn.functional.gelu(torch.tensor(xs, dtype=torch.float64), approximate='tanh')
        let gelu =
            [-0.04550026389635842, -0.15426876936299344, 0.0, 0.18537342665668577, 0.8413447460685429, 2.4844758366855597];
        let gelu_tanh =
            [-0.04540230591222494, -0.15428599017485606, 0.0, 0.18537092354275922, 0.8411919906082768, 2.484915733910001];
        on.check(&on.f64s(&XS, &[6]).gelu()?, &[6], &gelu, 1e-13);
        on.check(&on.f64s(&XS, &[6]).gelu_tanh()?, &[6], &gelu_tanh, 1e-13);
        on.check(&on.f32s(&XS, &[6]).gelu()?, &[6], &gelu, 1e-6);
        on.check(&on.f32s(&XS, &[6]).gelu_tanh()?, &[6], &gelu_tanh, 1e-6);
        // On strided views too (a transpose and a broadcast).
        let m = on.f64s(&XS, &[2, 3]);
        for v in [m.t()?, m.narrow(0, 1, 1)?.broadcast_to([4, 3])?] {
            same(&v.gelu()?, &v.contiguous()?.gelu()?);
            same(&v.gelu_tanh()?, &v.contiguous()?.gelu_tanh()?);
            same(&v.erf()?, &v.contiguous()?.erf()?);
        }
        Ok(())
    }

    fn erf_matches_python_math_erf(device: Device) -> R {
        let on = On(device);
        // [math.erf(x) for x in xs]
        let xs = [-2.0, -0.5, 0.0, 0.3, 1.0, 2.5, 3.5, 4.5, 5.5, 7.0];
        let want = [
            -0.9953222650189527,
            -0.5204998778130465,
            0.0,
            0.3286267594591274,
            0.8427007929497149,
            0.999593047982555,
            0.9999992569016276,
            0.9999999998033839,
            0.9999999999999927,
            1.0,
        ];
        on.check(&on.f64s(&xs, &[10]).erf()?, &[10], &want, 1e-13);
        on.check(&on.f32s(&xs, &[10]).erf()?, &[10], &want, 1e-6);
        Ok(())
    }

    fn unary_special_values(device: Device) -> R {
        let on = On(device);
        let x = on.f64s(&[f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 0.0, -0.0], &[5]);
        let inf = f64::INFINITY;
        let nan = f64::NAN;
        on.check(&x.exp()?, &[5], &[inf, 0.0, nan, 1.0, 1.0], 0.0);
        on.check(&x.tanh()?, &[5], &[1.0, -1.0, nan, 0.0, 0.0], 0.0);
        on.check(&x.sigmoid()?, &[5], &[1.0, 0.0, nan, 0.5, 0.5], 0.0);
        on.check(&x.relu()?, &[5], &[inf, 0.0, nan, 0.0, 0.0], 0.0);
        on.check(&x.erf()?, &[5], &[1.0, -1.0, nan, 0.0, 0.0], 0.0);
        on.check(&x.sign()?, &[5], &[1.0, -1.0, nan, 0.0, 0.0], 0.0);
        on.check(&x.clamp(-1.0, 1.0)?, &[5], &[1.0, -1.0, nan, 0.0, 0.0], 0.0);
        let logs = on.f64s(&[0.0, -1.0], &[2]).log()?.to_vec::<f64>()?;
        assert_eq!(logs[0], f64::NEG_INFINITY);
        assert!(logs[1].is_nan());
        on.check(&on.f64s(&[0.0], &[1]).recip()?, &[1], &[inf], 0.0);
        // Large arguments saturate instead of overflowing to NaN.
        on.check(&on.f32s(&[-100.0, 100.0], &[2]).sigmoid()?, &[2], &[0.0, 1.0], 1e-30);
        on.check(&on.f32s(&[-100.0, 100.0], &[2]).gelu()?, &[2], &[0.0, 100.0], 1e-7);
        on.check(&on.f32s(&[-100.0, 100.0], &[2]).gelu_tanh()?, &[2], &[0.0, 100.0], 1e-7);
        Ok(())
    }

    fn unary_on_scalar_and_empty_tensors(device: Device) -> R {
        let on = On(device);
        on.check(&on.scalar(2.0).square()?, &[], &[4.0], 0.0);
        let e = on.zeros([3, 0, 2], DType::F32).expect("alloc").exp()?;
        assert_eq!(e.dims(), &[3, 0, 2]);
        assert_eq!(e.numel(), 0);
        Ok(())
    }

    fn unary_large_tensor_parallel_path_matches_reference(device: Device) -> R {
        let on = On(device);
        // Above the parallel threshold (and the huge-page one: > 4 MiB), and
        // strided, so chunked runs of a transposed input are exercised.
        let (r, c) = (1100, 1013);
        let n = r * c;
        let x = on.f32s(&(0..n).map(|i| ((i * 37) % 1001) as f64 / 100.0 - 5.0).collect::<Vec<_>>(), &[r, c]);
        let xt = x.t()?;
        let got = xt.tanh()?.to_vec_f64();
        let src = xt.to_vec_f64();
        for (i, (&g, &v)) in got.iter().zip(&src).enumerate() {
            assert!((g - v.tanh()).abs() < 1e-6, "element {i}");
        }
        Ok(())
    }
}

// Host only: its sizes are the CPU's thread-split and huge-page boundaries
// (outputs of 16 MiB each), which the device's kernels do not have.
#[test]
fn large_outputs_are_filled_completely() -> R {
    // Outputs big enough to be split across threads on huge-page boundaries
    // (> 4 MiB), of odd lengths so the first and last chunks are partial,
    // for element sizes 2, 4 and 8: every element must be written once.
    for (dtype, n) in [(DType::F32, (1 << 22) + 12_345), (DType::F64, (1 << 21) + 7), (DType::F16, (1 << 23) + 3)] {
        let y = Tensor::zeros([n], dtype).expect("alloc").add_scalar(1.0)?;
        assert_eq!(y.dtype(), dtype);
        assert_eq!(y.numel(), n);
        let v = y.to_vec_f64();
        if let Some(i) = v.iter().position(|&e| e != 1.0) {
            panic!("{dtype}: element {i} of {n} is {}", v[i]);
        }
        if dtype == DType::F16 {
            continue; // f16 cannot hold the positions below
        }
        // Element i really is f(x[i]): a position-dependent binary op.
        let x = Tensor::arange(0.0, n as f64, 1.0, dtype)?;
        let z = x.add(&x)?.to_vec_f64();
        if let Some(i) = (0..n).find(|&i| z[i] != 2.0 * i as f64) {
            panic!("{dtype}: element {i} of {n} is {}", z[i]);
        }
    }
    Ok(())
}

// ----- binary ----------------------------------------------------------------

type BinaryCase = (&'static str, fn(&Tensor, &Tensor) -> Result<Tensor>, fn(f64, f64) -> f64);

fn binary_cases() -> Vec<BinaryCase> {
    vec![
        ("add", |a, b| a.add(b), |a, b| a + b),
        ("sub", |a, b| a.sub(b), |a, b| a - b),
        ("mul", |a, b| a.mul(b), |a, b| a * b),
        ("div", |a, b| a.div(b), |a, b| a / b),
        ("pow", |a, b| a.pow(b), |a, b| a.powf(b)),
        ("maximum", |a, b| a.maximum(b), f64::max),
        ("minimum", |a, b| a.minimum(b), f64::min),
    ]
}

/// Deterministic positive-ish values (pow needs a positive base).
fn vals(n: usize, seed: usize) -> Vec<f64> {
    (0..n).map(|i| 0.25 + ((i * 7 + seed * 13) % 17) as f64 / 4.0).collect()
}

test_device! {
    fn binary_broadcasting_reference(device: Device) -> R {
        let on = On(device);
        let shapes: &[(&[usize], &[usize])] = &[
            (&[2, 3], &[2, 3]),
            (&[2, 3], &[3]),
            (&[2, 3], &[2, 1]),
            (&[2, 1, 4], &[3, 1]),
            (&[4], &[3, 1]),
            (&[2, 3], &[]),
            (&[], &[2, 3]),
            (&[1, 3, 1], &[2, 1, 5]),
            (&[0, 3], &[3]),
        ];
        for (name, op, f) in binary_cases() {
            for &(ad, bd) in shapes {
                let (a, b) = (vals(ad.iter().product(), 1), vals(bd.iter().product(), 2));
                let (od, want) = naive_binary(&a, ad, &b, bd, f);
                let got = op(&on.f64s(&a, ad), &on.f64s(&b, bd))?;
                on.check(&got, &od, &want, 1e-14);
                let got32 = op(&on.f32s(&a, ad), &on.f32s(&b, bd))?;
                assert_eq!(got32.dtype(), DType::F32, "{name}");
                on.check(&got32, &od, &want, 1e-6);
            }
        }
        Ok(())
    }

    fn binary_on_strided_operands_matches_contiguous(device: Device) -> R {
        let on = On(device);
        let a = on.f64s(&vals(24, 3), &[4, 6]);
        let b = on.f64s(&vals(24, 4), &[6, 4]);
        let c = on.f64s(&vals(24, 6), &[4, 6]);
        let row = on.f64s(&vals(6, 5), &[6]);
        for (name, op, f) in binary_cases() {
            // Transposed + contiguous, transposed + transposed, narrowed + broadcast.
            let pairs = [
                (b.t()?, a.clone()),
                (a.t()?, b.clone()),
                (a.t()?, c.t()?),
                (a.narrow(1, 2, 3)?, row.narrow(0, 1, 3)?),
                (row.unsqueeze(1)?.broadcast_to([6, 4])?, b.clone()),
                (a.narrow(0, 1, 1)?, a.t()?.narrow(1, 0, 1)?),
            ];
            for (x, y) in &pairs {
                let got = op(x, y)?;
                let want = op(&x.contiguous()?, &y.contiguous()?)?;
                same(&got, &want);
                let (od, naive) = naive_binary(&x.to_vec_f64(), x.dims(), &y.to_vec_f64(), y.dims(), f);
                on.check(&got, &od, &naive, 1e-14);
                let _ = name;
            }
        }
        Ok(())
    }

    fn binary_large_broadcast_parallel_path(device: Device) -> R {
        let on = On(device);
        // [512, 300] + [300] and [512, 1] * [512, 300]^T-view: above PAR_MIN.
        let a = on.iota(&[512, 300]);
        let r = on.iota(&[300]);
        let c = on.iota(&[512, 1]);
        let s = a.add(&r)?.to_vec_f64();
        let p = c.mul(&a)?.to_vec_f64();
        for i in 0..512 {
            for j in 0..300 {
                let v = (i * 300 + j) as f64;
                assert_eq!(s[i * 300 + j], v + j as f64);
                // f32 products above 2^24 round: compare with the f32 product.
                assert_eq!(p[i * 300 + j], (v as f32 * i as f32) as f64);
            }
        }
        let at = on.iota(&[300, 512]).t()?;
        let d = a.sub(&at)?.to_vec_f64();
        for i in 0..512 {
            for j in 0..300 {
                assert_eq!(d[i * 300 + j], (i * 300 + j) as f64 - (j * 512 + i) as f64);
            }
        }
        Ok(())
    }

    fn maximum_minimum_propagate_nan(device: Device) -> R {
        let on = On(device);
        let a = on.f32s(&[1.0, f64::NAN, 3.0], &[3]);
        let b = on.f32s(&[f64::NAN, 2.0, 1.0], &[3]);
        on.check(&a.maximum(&b)?, &[3], &[f64::NAN, f64::NAN, 3.0], 0.0);
        on.check(&a.minimum(&b)?, &[3], &[f64::NAN, f64::NAN, 1.0], 0.0);
        Ok(())
    }

    fn division_by_zero_follows_ieee(device: Device) -> R {
        let on = On(device);
        let a = on.f32s(&[1.0, -1.0, 0.0], &[3]);
        let z = on.zeros([3], DType::F32).expect("alloc");
        on.check(&a.div(&z)?, &[3], &[f64::INFINITY, f64::NEG_INFINITY, f64::NAN], 0.0);
        Ok(())
    }

    fn comparisons_give_masks_in_operand_dtype(device: Device) -> R {
        let on = On(device);
        let a = on.f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        let b = on.f32s(&[2.0, 2.0, 4.0], &[3]);
        type Cmp = (fn(&Tensor, &Tensor) -> Result<Tensor>, fn(f64, f64) -> bool);
        let cases: [Cmp; 6] = [
            (|a, b| a.eq(b), |a, b| a == b),
            (|a, b| a.ne(b), |a, b| a != b),
            (|a, b| a.lt(b), |a, b| a < b),
            (|a, b| a.le(b), |a, b| a <= b),
            (|a, b| a.gt(b), |a, b| a > b),
            (|a, b| a.ge(b), |a, b| a >= b),
        ];
        for (op, f) in cases {
            let m = op(&a, &b)?;
            assert_eq!(m.dtype(), DType::F32);
            let (od, want) =
                naive_binary(&a.to_vec_f64(), a.dims(), &b.to_vec_f64(), b.dims(), |x, y| f64::from(u8::from(f(x, y))));
            on.check(&m, &od, &want, 0.0);
            // Strided operands give the same mask.
            let mt = op(&a.t()?, &b.unsqueeze(1)?)?;
            let (od, want) =
                naive_binary(&a.t()?.to_vec_f64(), &[3, 2], &b.to_vec_f64(), &[3, 1], |x, y| f64::from(u8::from(f(x, y))));
            on.check(&mt, &od, &want, 0.0);
        }
        // Scalar comparisons.
        on.check(&a.gt_scalar(3.0)?, &[2, 3], &[0., 0., 0., 1., 1., 1.], 0.0);
        on.check(&a.ge_scalar(3.0)?, &[2, 3], &[0., 0., 1., 1., 1., 1.], 0.0);
        on.check(&a.lt_scalar(3.0)?, &[2, 3], &[1., 1., 0., 0., 0., 0.], 0.0);
        on.check(&a.le_scalar(3.0)?, &[2, 3], &[1., 1., 1., 0., 0., 0.], 0.0);
        on.check(&a.eq_scalar(3.0)?, &[2, 3], &[0., 0., 1., 0., 0., 0.], 0.0);
        on.check(&a.ne_scalar(3.0)?, &[2, 3], &[1., 1., 0., 1., 1., 1.], 0.0);
        // NaN compares unequal to everything, itself included.
        let n = on.f64s(&[f64::NAN, 1.0], &[2]);
        on.check(&n.eq(&n)?, &[2], &[0.0, 1.0], 0.0);
        on.check(&n.ne(&n)?, &[2], &[1.0, 0.0], 0.0);
        Ok(())
    }

    fn comparisons_on_int_tensors_against_fractional_scalars(device: Device) -> R {
        let on = On(device);
        // torch promotes: tensor([0, 1, 2]) < 0.5 is [True, False, False].
        let x = on.vec(vec![0i64, 1, 2], [3])?;
        assert_eq!(x.lt_scalar(0.5)?.to_vec::<i64>()?, vec![1, 0, 0]);
        assert_eq!(x.gt_scalar(1.5)?.to_vec::<i64>()?, vec![0, 0, 1]);
        assert_eq!(x.eq_scalar(1.0)?.to_vec::<i64>()?, vec![0, 1, 0]);
        assert_eq!(x.eq_scalar(1.5)?.to_vec::<i64>()?, vec![0, 0, 0]);
        let y = on.vec(vec![-1i32, 0, 1], [3])?;
        assert_eq!(y.ge_scalar(-0.5)?.to_vec::<i32>()?, vec![0, 1, 1]);
        Ok(())
    }

    fn where_selects_with_broadcasting(device: Device) -> R {
        let on = On(device);
        let a = on.f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        let b = on.f32s(&[-1.0, -2.0, -3.0], &[3]);
        let mask = on.vec(vec![1.0f32, 0.0], [2, 1])?;
        on.check(&a.where_(&mask, &b)?, &[2, 3], &[1.0, 2.0, 3.0, -1.0, -2.0, -3.0], 0.0);
        // An integer mask of a larger shape, and a scalar `other`.
        let m2 = on.vec(vec![0i64, 1, 0, 1, 0, 1], [2, 3])?;
        on.check(&a.where_(&m2, &on.scalar(0.0))?, &[2, 3], &[0.0, 2.0, 0.0, 4.0, 0.0, 6.0], 0.0);
        // The mask broadcasts the operands up: [3] and [3] with a [2, 3] mask.
        let c = on.f32s(&[10.0, 20.0, 30.0], &[3]);
        on.check(&b.where_(&m2, &c)?, &[2, 3], &[10.0, -2.0, 30.0, -1.0, 20.0, -3.0], 0.0);
        // Transposed operands and a mask computed by a comparison.
        let at = a.t()?;
        let m3 = at.gt_scalar(2.5)?;
        on.check(&at.where_(&m3, &at.neg()?)?, &[3, 2], &[-1.0, 4.0, -2.0, 5.0, 3.0, 6.0], 0.0);
        // Ints work too.
        let i = on.vec(vec![1i32, 2, 3], [3])?;
        let j = on.vec(vec![7i32, 8, 9], [3])?;
        let m = on.vec(vec![1.0f32, 0.0, 1.0], [3])?;
        assert_eq!(i.where_(&m, &j)?.to_vec::<i32>()?, vec![1, 8, 3]);
        Ok(())
    }
}

// ----- reductions ------------------------------------------------------------

type ReduceCase = (&'static str, fn(&Tensor, &[isize], bool) -> Result<Tensor>, f64, fn(f64, f64) -> f64);

fn reduce_cases() -> Vec<ReduceCase> {
    vec![
        ("sum", |x, a, k| x.sum(a, k), 0.0, |a, b| a + b),
        ("max", |x, a, k| x.max(a, k), f64::NEG_INFINITY, f64::max),
        ("min", |x, a, k| x.min(a, k), f64::INFINITY, f64::min),
    ]
}

fn all_axis_sets(rank: usize) -> Vec<Vec<usize>> {
    (0..1usize << rank).map(|m| (0..rank).filter(|a| m >> a & 1 == 1).collect()).collect()
}

test_device! {
    fn reductions_over_every_axis_set_with_keepdim(device: Device) -> R {
        let on = On(device);
        let dims = [2, 3, 4];
        let data: Vec<f64> = (0..24).map(|i| ((i * 11) % 24) as f64 - 7.5).collect();
        let x = on.f64s(&data, &dims);
        for (name, op, init, fold) in reduce_cases() {
            for axes in all_axis_sets(3) {
                if axes.is_empty() {
                    continue; // empty means "all axes", checked below
                }
                let ax: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
                for keepdim in [false, true] {
                    let (od, want) = naive_reduce(&data, &dims, &axes, keepdim, init, fold);
                    let got = op(&x, &ax, keepdim)?;
                    on.check(&got, &od, &want, 1e-12);
                    // Negative axes name the same dims.
                    let neg: Vec<isize> = axes.iter().map(|&a| a as isize - 3).collect();
                    same(&got, &op(&x, &neg, keepdim)?);
                    // Unsorted axes too.
                    let rev: Vec<isize> = ax.iter().rev().copied().collect();
                    same(&got, &op(&x, &rev, keepdim)?);
                    // f32 agrees.
                    on.check(&op(&x.cast(DType::F32)?, &ax, keepdim)?, &od, &want, 1e-6);
                }
            }
            // Empty axes: every axis.
            let (_, all) = naive_reduce(&data, &dims, &[0, 1, 2], false, init, fold);
            on.check(&op(&x, &[], false)?, &[], &all, 1e-12);
            on.check(&op(&x, &[], true)?, &[1, 1, 1], &all, 1e-12);
            let _ = name;
        }
        on.check(&x.sum_all()?, &[], &[data.iter().sum()], 1e-12);
        on.check(&x.mean_all()?, &[], &[data.iter().sum::<f64>() / 24.0], 1e-12);
        Ok(())
    }

    fn reductions_on_strided_inputs(device: Device) -> R {
        let on = On(device);
        let base = on.f64s(&(0..60).map(|i| ((i * 7) % 13) as f64).collect::<Vec<_>>(), &[3, 4, 5]);
        let views = [
            base.permute(&[2, 0, 1])?,
            base.narrow(2, 1, 3)?,
            base.transpose(0, 1)?.narrow(0, 1, 2)?,
            base.narrow(0, 1, 1)?.broadcast_to([4, 4, 5])?,
        ];
        for v in &views {
            let data = v.to_vec_f64();
            let dims = v.dims().to_vec();
            for (_, op, init, fold) in reduce_cases() {
                for axes in all_axis_sets(3).into_iter().skip(1) {
                    let ax: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
                    let (od, want) = naive_reduce(&data, &dims, &axes, true, init, fold);
                    let got = op(v, &ax, true)?;
                    on.check(&got, &od, &want, 1e-12);
                    same(&got, &op(&v.contiguous()?, &ax, true)?);
                }
            }
        }
        Ok(())
    }

    fn mean_and_logsumexp_reference(device: Device) -> R {
        let on = On(device);
        let data = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let x = on.f64s(&data, &[2, 3]);
        on.check(&x.mean(&[1], false)?, &[2], &[2.0, 5.0], 1e-15);
        on.check(&x.mean(&[0], true)?, &[1, 3], &[2.5, 3.5, 4.5], 1e-15);
        on.check(&x.mean(&[], false)?, &[], &[3.5], 1e-15);
        let lse = |r: &[f64]| r.iter().map(|v| v.exp()).sum::<f64>().ln();
        on.check(&x.logsumexp(&[1], false)?, &[2], &[lse(&data[..3]), lse(&data[3..])], 1e-14);
        on.check(&x.logsumexp(&[0, 1], true)?, &[1, 1], &[lse(&data)], 1e-14);
        // Stable for large inputs and exact with -inf entries.
        let big = on.f32s(&[1e4, 1e4, -1e4], &[3]);
        on.check(&big.logsumexp(&[0], false)?, &[], &[1e4 + 2f64.ln()], 1e-6);
        let ninf = on.f64s(&[f64::NEG_INFINITY, 0.0, f64::NEG_INFINITY, f64::NEG_INFINITY], &[2, 2]);
        on.check(&ninf.logsumexp(&[1], false)?, &[2], &[0.0, f64::NEG_INFINITY], 0.0);
        // +inf dominates.
        on.check(&on.f64s(&[f64::INFINITY, 1.0], &[2]).logsumexp(&[0], false)?, &[], &[f64::INFINITY], 0.0);
        Ok(())
    }

    fn argmax_argmin_first_occurrence_i64(device: Device) -> R {
        let on = On(device);
        let x = on.f32s(&[1.0, 5.0, 5.0, -2.0, 0.0, -2.0, 3.0, 3.0], &[2, 4]);
        let am = x.argmax(1, false)?;
        assert_eq!(am.dtype(), DType::I64);
        assert_eq!(am.dims(), &[2]);
        assert_eq!(am.to_vec::<i64>()?, vec![1, 2]);
        assert_eq!(x.argmin(1, false)?.to_vec::<i64>()?, vec![3, 1]);
        assert_eq!(x.argmax(-1, true)?.dims(), &[2, 1]);
        assert_eq!(x.argmax(0, false)?.to_vec::<i64>()?, vec![0, 0, 0, 1]);
        assert_eq!(x.argmin(0, false)?.to_vec::<i64>()?, vec![1, 1, 1, 0]);
        // On a transposed view.
        assert_eq!(x.t()?.argmax(0, false)?.to_vec::<i64>()?, vec![1, 2]);
        // NaN counts as the maximum (torch).
        let n = on.f32s(&[1.0, f64::NAN, 3.0], &[3]);
        assert_eq!(n.argmax(0, false)?.to_vec::<i64>()?, vec![1]);
        // Integer inputs.
        let i = on.vec(vec![3i64, 9, -4, 9], [4])?;
        assert_eq!(i.argmax(0, false)?.to_vec::<i64>()?, vec![1]);
        assert_eq!(i.argmin(0, false)?.to_vec::<i64>()?, vec![2]);
        Ok(())
    }

    fn sum_to_reverses_broadcasting(device: Device) -> R {
        let on = On(device);
        let x = on.iota(&[2, 3, 4]);
        on.check(
            &x.sum_to([3, 1])?,
            &[3, 1],
            &[
                (0..4).chain(12..16).sum::<i32>() as f64,
                (4..8).chain(16..20).sum::<i32>() as f64,
                (8..12).chain(20..24).sum::<i32>() as f64,
            ],
            0.0,
        );
        on.check(&x.sum_to([4])?, &[4], &[60.0, 66.0, 72.0, 78.0], 0.0);
        on.check(&x.sum_to(())?, &[], &[276.0], 0.0);
        on.check(&x.sum_to([1, 1, 4])?, &[1, 1, 4], &[60.0, 66.0, 72.0, 78.0], 0.0);
        // Same shape: identity, sharing storage.
        let same_shape = x.sum_to([2, 3, 4])?;
        assert!(same_shape.same_storage(&x));
        // broadcast_to then sum_to multiplies by the number of copies.
        let v = on.f32s(&[1.0, 2.0, 3.0], &[3]);
        on.check(&v.broadcast_to([5, 3])?.sum_to([3])?, &[3], &[5.0, 10.0, 15.0], 0.0);
        on.check(&v.broadcast_to([5, 3])?.sum_to([1, 3])?, &[1, 3], &[5.0, 10.0, 15.0], 0.0);
        Ok(())
    }

    fn reductions_over_empty_axes(device: Device) -> R {
        let on = On(device);
        // torch.zeros(3, 0).sum(1) is zeros(3); .sum(0) is zeros(0).
        let x = on.zeros([3, 0], DType::F32).expect("alloc");
        on.check(&x.sum(&[1], false)?, &[3], &[0.0; 3], 0.0);
        on.check(&x.sum(&[1], true)?, &[3, 1], &[0.0; 3], 0.0);
        on.check(&x.sum(&[0], false)?, &[0], &[], 0.0);
        on.check(&x.sum(&[], false)?, &[], &[0.0], 0.0);
        let y = on.zeros([0, 4], DType::F64).expect("alloc");
        on.check(&y.sum(&[0], false)?, &[4], &[0.0; 4], 0.0);
        on.check(&y.sum_to([4])?, &[4], &[0.0; 4], 0.0);
        // logsumexp of nothing is -inf, mean of nothing is NaN (torch).
        on.check(&x.logsumexp(&[1], false)?, &[3], &[f64::NEG_INFINITY; 3], 0.0);
        on.check(&x.mean(&[1], false)?, &[3], &[f64::NAN; 3], 0.0);
        // Reductions over a non-empty axis of an empty tensor give empty results.
        on.check(&x.max(&[0], false)?, &[0], &[], 0.0);
        Ok(())
    }

    fn large_reductions_match_naive_sums(device: Device) -> R {
        let on = On(device);
        // Leading-axis fast path, last-axis rows, one big row: all above PAR_MIN.
        let (r, c) = (700, 517);
        let data: Vec<f64> = (0..r * c).map(|i| ((i * 31) % 97) as f64).collect();
        let x = on.f64s(&data, &[r, c]);
        let (d0, w0) = naive_reduce(&data, &[r, c], &[0], false, 0.0, |a, b| a + b);
        on.check(&x.sum(&[0], false)?, &d0, &w0, 0.0);
        let (d1, w1) = naive_reduce(&data, &[r, c], &[1], false, 0.0, |a, b| a + b);
        on.check(&x.sum(&[1], false)?, &d1, &w1, 0.0);
        on.check(&x.sum_all()?, &[], &[data.iter().sum()], 0.0);
        on.check(&x.t()?.sum(&[1], false)?, &d0, &w0, 0.0);
        let (dm, wm) = naive_reduce(&data, &[r, c], &[1], false, f64::NEG_INFINITY, f64::max);
        on.check(&x.max(&[1], false)?, &dm, &wm, 0.0);
        // Rows wider than the leading-axis sum's blocks: split by columns.
        let (r, c) = (5, 20_000);
        let data: Vec<f64> = (0..r * c).map(|i| ((i * 13) % 89) as f64).collect();
        let (d0, w0) = naive_reduce(&data, &[r, c], &[0], false, 0.0, |a, b| a + b);
        on.check(&on.f64s(&data, &[r, c]).sum(&[0], false)?, &d0, &w0, 0.0);
        // f32 bias-gradient shapes: register blocks of 64 columns, and a
        // remainder of 2 columns.
        for (r, c) in [(1024, 64), (300, 130)] {
            let data: Vec<f64> = (0..r * c).map(|i| ((i * 7) % 23) as f64).collect();
            let (d0, w0) = naive_reduce(&data, &[r, c], &[0], false, 0.0, |a, b| a + b);
            on.check(&on.f32s(&data, &[r, c]).sum(&[0], false)?, &d0, &w0, 0.0);
        }
        // f32 sums with many accumulators stay accurate.
        let ones = on.ones([1 << 20], DType::F32).expect("alloc");
        assert_eq!(ones.sum_all()?.item()?, (1u64 << 20) as f64);
        Ok(())
    }
}

// ----- matmul ----------------------------------------------------------------

test_device! {
    fn matmul_2d_reference(device: Device) -> R {
        let on = On(device);
        for &(m, k, n) in &[(1, 1, 1), (2, 3, 4), (5, 1, 3), (7, 9, 2), (33, 17, 65)] {
            let a = vals(m * k, 1);
            let b = vals(k * n, 2);
            let want = naive_matmul(&a, &b, m, k, n);
            on.check(&on.f64s(&a, &[m, k]).matmul(&on.f64s(&b, &[k, n]))?, &[m, n], &want, 1e-12);
            on.check(&on.f32s(&a, &[m, k]).matmul(&on.f32s(&b, &[k, n]))?, &[m, n], &want, 1e-5);
        }
        // The doc example: x @ x^T.
        let x = on.f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
        on.check(&x.matmul(&x.t()?)?, &[2, 2], &[5.0, 11.0, 11.0, 25.0], 0.0);
        // k = 0 gives zeros; m = 0 or n = 0 give empty products.
        on.check(
            &on.zeros([2, 0], DType::F32)
                .expect("alloc")
                .matmul(&on.zeros([0, 3], DType::F32).expect("alloc"))?,
            &[2, 3],
            &[0.0; 6],
            0.0,
        );
        assert_eq!(
            on.zeros([0, 4], DType::F32)
                .expect("alloc")
                .matmul(&on.zeros([4, 3], DType::F32).expect("alloc"))?
                .dims(),
            &[0, 3]
        );
        Ok(())
    }

    fn matmul_transposed_and_strided_views_read_in_place(device: Device) -> R {
        let on = On(device);
        let (m, k, n) = (37, 29, 23);
        let a = on.f32s(&vals(m * k, 3), &[m, k]);
        let b = on.f32s(&vals(k * n, 4), &[k, n]);
        let want = a.matmul(&b)?;
        // a^T^T and b^T^T: strided views of transposed storage.
        let at = on.f32s(&a.t()?.to_vec_f64(), &[k, m]).t()?;
        let bt = on.f32s(&b.t()?.to_vec_f64(), &[n, k]).t()?;
        assert!(!at.is_contiguous() && !bt.is_contiguous());
        on.check(&at.matmul(&b)?, &[m, n], &want.to_vec_f64(), 1e-6);
        on.check(&a.matmul(&bt)?, &[m, n], &want.to_vec_f64(), 1e-6);
        on.check(&at.matmul(&bt)?, &[m, n], &want.to_vec_f64(), 1e-6);
        // x @ x.t() gives the same as x @ contiguous(x.t()).
        let xt = a.t()?;
        assert!(xt.same_storage(&a), "t() is a view");
        same(&a.matmul(&xt)?, &a.matmul(&xt.contiguous()?)?);
        // Narrowed rows and columns (row stride > number of columns).
        let big = on.f32s(&vals(50 * 40, 5), &[50, 40]);
        let an = big.narrow(0, 3, 20)?.narrow(1, 5, 30)?;
        let bn = big.narrow(0, 10, 30)?.narrow(1, 1, 11)?;
        let got = an.matmul(&bn)?;
        let naive = naive_matmul(&an.to_vec_f64(), &bn.to_vec_f64(), 20, 30, 11);
        on.check(&got, &[20, 11], &naive, 1e-5);
        same(&got, &an.contiguous()?.matmul(&bn.contiguous()?)?);
        // A broadcast operand (zero row stride).
        let row = on.f32s(&vals(30, 6), &[1, 30]).broadcast_to([4, 30])?;
        let g2 = row.matmul(&bn)?;
        let naive2 = naive_matmul(&row.to_vec_f64(), &bn.to_vec_f64(), 4, 30, 11);
        on.check(&g2, &[4, 11], &naive2, 1e-5);
        Ok(())
    }

    /// Products of 1 Mi multiply-adds and more are split over the pool's
    /// threads: by rows, by columns when the output has few rows, and by
    /// chunks of the inner dimension when the output is small and it is long;
    /// tall thin products (1000 x 3 x 40, 2000 x 20 x 1) split by rows too.
    fn matmul_large_parallel_matches_naive(device: Device) -> R {
        let on = On(device);
        for (m, k, n) in [
            (150, 96, 80),
            (8, 512, 300),
            (1, 2048, 600),
            (32, 2048, 32),
            (64, 1500, 60),
            (1000, 3, 40),
            (2000, 20, 1),
            // Thin weight gradients, split along the inner dimension.
            (1, 1024, 64),
            (64, 1100, 2),
        ] {
            let a = vals(m * k, 7);
            let b = vals(k * n, 8);
            let want = naive_matmul(&a, &b, m, k, n);
            on.check(&on.f64s(&a, &[m, k]).matmul(&on.f64s(&b, &[k, n]))?, &[m, n], &want, 1e-12);
            let bt = on.f64s(&on.f64s(&b, &[k, n]).t()?.to_vec_f64(), &[n, k]).t()?;
            on.check(&on.f64s(&a, &[m, k]).matmul(&bt)?, &[m, n], &want, 1e-12);
            let at = on.f64s(&on.f64s(&a, &[m, k]).t()?.to_vec_f64(), &[k, m]).t()?;
            on.check(&at.matmul(&bt)?, &[m, n], &want, 1e-12);
        }
        Ok(())
    }

    /// The epilogues of a product sum (tanh, and times `1 - h^2`) on row-split,
    /// column-split (short outputs, and wide ones whose `b` passes 8 MiB:
    /// 24 x 1,100 x 1,000 in f64) and inner-dimension-split products, against the composed ops: with one
    /// product (the CPU adds the bias in the epilogue's pass) and with two
    /// (it fills the block with the bias first).
    fn linear_sum_then_applies_its_epilogue_on_every_split(device: Device) -> R {
        let on = On(device);
        use tapir_tensor::ops::rules::matmul::{fused_linear_sum_then, linear_sum, Then};
        for (m, k, n) in [(1000, 64, 64), (8, 512, 600), (24, 1100, 1000), (32, 2048, 32), (5, 3, 7)] {
            let (a, b, bias, h) = (vals(m * k, 41), vals(k * n, 42), vals(n, 43), vals(m * n, 44));
            let (ta, tb, tbias) = (on.f64s(&a, &[m, k]), on.f64s(&b, &[k, n]), on.f64s(&bias, &[n]));
            // Scaled so tanh is not saturated.
            let th = on.f64s(&h, &[m, n]).mul_scalar(0.01)?;
            let sum = linear_sum(&[(&ta, &tb)], Some(&tbias))?.expect("a term");
            let got = fused_linear_sum_then(&[(&ta, &tb)], Some(&tbias), Then::Tanh)?.expect("a term");
            on.check(&got, &[m, n], &sum.tanh()?.to_vec_f64(), 1e-12);
            let got = fused_linear_sum_then(&[(&ta, &tb)], Some(&tbias), Then::TanhBackward(&th))?.expect("a term");
            on.check(&got, &[m, n], &th.tanh_backward(&sum)?.to_vec_f64(), 1e-12);
            let (ta2, tb2) = (on.f64s(&vals(m * k, 45), &[m, k]), on.f64s(&vals(k * n, 46), &[k, n]));
            let terms = [(&ta, &tb), (&ta2, &tb2)];
            let sum = linear_sum(&terms, Some(&tbias))?.expect("two terms");
            let got = fused_linear_sum_then(&terms, Some(&tbias), Then::Tanh)?.expect("two terms");
            on.check(&got, &[m, n], &sum.tanh()?.to_vec_f64(), 1e-12);
            let got = fused_linear_sum_then(&terms, Some(&tbias), Then::TanhBackward(&th))?.expect("two terms");
            on.check(&got, &[m, n], &th.tanh_backward(&sum)?.to_vec_f64(), 1e-12);
        }
        Ok(())
    }

    /// f32 products whose left operand is a transposed view (`g^T x`, a
    /// weight gradient): on AVX-512 they run tapir's own outer-product kernel
    /// rather than the gemm crate, alone or as terms of a sum.
    fn matmul_f32_transposed_left_operand_matches_naive(device: Device) -> R {
        let on = On(device);
        use tapir_tensor::ops::rules::matmul::Then;
        for (m, k, n) in [(64, 1024, 64), (1, 1024, 64), (64, 1100, 2), (13, 70, 37), (100, 40, 130)] {
            let (a, b, a2) = (vals(m * k, 21), vals(k * n, 22), vals(m * k, 23));
            let want = naive_matmul(&a, &b, m, k, n);
            // a is stored [k, m], as an activation is, and read transposed.
            let at = on.f32s(&on.f64s(&a, &[m, k]).t()?.to_vec_f64(), &[k, m]).t()?;
            on.check(&at.matmul(&on.f32s(&b, &[k, n]))?, &[m, n], &want, 1e-4);
            let a2t = on.f32s(&on.f64s(&a2, &[m, k]).t()?.to_vec_f64(), &[k, m]).t()?;
            let want2: Vec<f64> = want.iter().zip(naive_matmul(&a2, &b, m, k, n)).map(|(x, y)| x + y).collect();
            let tb = on.f32s(&b, &[k, n]);
            let got = tapir_tensor::ops::rules::matmul::fused_linear_sum_then(&[(&at, &tb), (&a2t, &tb)], None, Then::Nothing)?
                .expect("two terms");
            on.check(&got, &[m, n], &want2, 1e-4);
        }
        Ok(())
    }

    fn matmul_batched_with_broadcast_batch_dims(device: Device) -> R {
        let on = On(device);
        let (m, k, n) = (3, 4, 5);
        let a = vals(2 * 3 * m * k, 1);
        let b = vals(3 * k * n, 2);
        // [2, 3, m, k] @ [3, k, n] -> [2, 3, m, n]
        let got = on.f64s(&a, &[2, 3, m, k]).matmul(&on.f64s(&b, &[3, k, n]))?;
        let mut want = Vec::new();
        for i in 0..2 {
            for j in 0..3 {
                let ab = &a[(i * 3 + j) * m * k..][..m * k];
                let bb = &b[j * k * n..][..k * n];
                want.extend(naive_matmul(ab, bb, m, k, n));
            }
        }
        on.check(&got, &[2, 3, m, n], &want, 1e-12);
        // [2, 1, m, k] @ [3, k, n] -> [2, 3, m, n]
        let a1 = &a[..2 * m * k];
        let got = on.f64s(a1, &[2, 1, m, k]).matmul(&on.f64s(&b, &[3, k, n]))?;
        let mut want = Vec::new();
        for i in 0..2 {
            for j in 0..3 {
                want.extend(naive_matmul(&a1[i * m * k..][..m * k], &b[j * k * n..][..k * n], m, k, n));
            }
        }
        on.check(&got, &[2, 3, m, n], &want, 1e-12);
        // A batched matrix against a plain matrix (the matrix broadcasts).
        let w = &b[..k * n];
        let got = on.f64s(&a, &[6, m, k]).matmul(&on.f64s(w, &[k, n]))?;
        let want: Vec<f64> = (0..6).flat_map(|i| naive_matmul(&a[i * m * k..][..m * k], w, m, k, n)).collect();
        on.check(&got, &[6, m, n], &want, 1e-12);
        // Batched with transposed (permuted) operands.
        let ap = on.f64s(&a, &[6, m, k]);
        let bp = on.f64s(&vals(6 * n * k, 9), &[6, n, k]);
        same(&ap.matmul(&bp.transpose(1, 2)?)?, &ap.matmul(&bp.transpose(1, 2)?.contiguous()?)?);
        let ap2 = on.f64s(&a, &[m, 6, k]).permute(&[1, 0, 2])?;
        same(&ap2.matmul(&bp.transpose(1, 2)?)?, &ap2.contiguous()?.matmul(&bp.transpose(1, 2)?.contiguous()?)?);
        // Many small matrices (the batch-parallel path).
        let many = on.f32s(&vals(512 * 16 * 16, 3), &[512, 16, 16]);
        let mm = many.matmul(&many)?;
        let mv = many.to_vec_f64();
        let mmv = mm.to_vec_f64();
        for bi in [0, 1, 255, 511] {
            let blk = &mv[bi * 256..][..256];
            let want = naive_matmul(blk, blk, 16, 16, 16);
            for (i, w) in want.iter().enumerate() {
                assert!((mmv[bi * 256 + i] - w).abs() <= 1e-5 * (1.0 + w.abs()));
            }
        }
        Ok(())
    }

    fn matmul_one_dimensional_cases(device: Device) -> R {
        let on = On(device);
        let v = on.f64s(&[1.0, 2.0, 3.0], &[3]);
        let w = on.f64s(&[4.0, 5.0, 6.0], &[3]);
        let m = on.f64s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
        // vector . vector -> scalar
        on.check(&v.matmul(&w)?, &[], &[32.0], 0.0);
        // vector @ matrix -> vector
        on.check(&v.matmul(&m)?, &[2], &[22.0, 28.0], 0.0);
        // matrix @ vector -> vector
        on.check(&m.t()?.matmul(&v)?, &[2], &[22.0, 28.0], 0.0);
        // batched matrix @ vector
        let bm = on.f64s(&(0..12).map(f64::from).collect::<Vec<_>>(), &[2, 2, 3]);
        on.check(&bm.matmul(&v)?, &[2, 2], &[8.0, 26.0, 44.0, 62.0], 0.0);
        // vector @ batched matrix
        on.check(&v.matmul(&bm.transpose(1, 2)?)?, &[2, 2], &[8.0, 26.0, 44.0, 62.0], 0.0);
        // A strided vector: a column of a matrix.
        let col = m.narrow(1, 1, 1)?.squeeze(1)?;
        on.check(&col.matmul(&v)?, &[], &[2.0 + 8.0 + 18.0], 0.0);
        Ok(())
    }

    fn linear_is_x_wt_plus_b(device: Device) -> R {
        let on = On(device);
        let x = on.f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
        let w = on.f32s(&[1.0, 0.0, 1.0, 1.0, 0.0, 2.0], &[3, 2]);
        let b = on.f32s(&[0.5, -0.5, 1.0], &[3]);
        on.check(&x.linear(&w, Some(&b))?, &[2, 3], &[1.5, 2.5, 5.0, 3.5, 6.5, 9.0], 0.0);
        on.check(&x.linear(&w, None)?, &[2, 3], &[1.0, 3.0, 4.0, 3.0, 7.0, 8.0], 0.0);
        Ok(())
    }
}

// ----- softmax ---------------------------------------------------------------

fn naive_softmax(x: &[f64], dims: &[usize], axis: usize, log: bool) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for i in 0..x.len() {
        let idx = unravel(i, dims);
        let row: Vec<f64> = (0..dims[axis])
            .map(|j| {
                let mut k = idx.clone();
                k[axis] = j;
                x[ravel(&k, dims)]
            })
            .collect();
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        out[i] = if log { x[i] - m - s.ln() } else { (x[i] - m).exp() / s };
    }
    out
}

test_device! {
    fn softmax_and_log_softmax_on_every_axis(device: Device) -> R {
        let on = On(device);
        let dims = [2, 3, 4];
        let data: Vec<f64> = (0..24).map(|i| ((i * 5) % 7) as f64 - 3.0).collect();
        let x = on.f64s(&data, &dims);
        for axis in 0..3 {
            for log in [false, true] {
                let want = naive_softmax(&data, &dims, axis, log);
                let ax = axis as isize;
                let got = if log { x.log_softmax(ax)? } else { x.softmax(ax)? };
                on.check(&got, &dims, &want, 1e-14);
                let neg = if log { x.log_softmax(ax - 3)? } else { x.softmax(ax - 3)? };
                same(&got, &neg);
                let g32 = if log { x.cast(DType::F32)?.log_softmax(ax)? } else { x.cast(DType::F32)?.softmax(ax)? };
                on.check(&g32, &dims, &want, 1e-6);
            }
        }
        // Rows sum to one.
        let s = x.softmax(1)?.sum(&[1], false)?;
        on.check(&s, &[2, 4], &[1.0; 8], 1e-14);
        Ok(())
    }

    fn softmax_handles_large_and_infinite_inputs(device: Device) -> R {
        let on = On(device);
        // torch.softmax(torch.tensor([1e4, 1e4 - 1, -1e4]), 0)
        let x = on.f32s(&[1e4, 1e4 - 1.0, -1e4], &[3]);
        let e = (-1f64).exp();
        on.check(&x.softmax(0)?, &[3], &[1.0 / (1.0 + e), e / (1.0 + e), 0.0], 1e-6);
        on.check(&x.log_softmax(0)?, &[3], &[-(1.0 + e).ln(), -1.0 - (1.0 + e).ln(), -2e4 - (1.0 + e).ln()], 1e-6);
        // -inf entries get probability 0 and log-probability -inf.
        let y = on.f64s(&[0.0, f64::NEG_INFINITY, 0.0, f64::NEG_INFINITY], &[4]);
        on.check(&y.softmax(0)?, &[4], &[0.5, 0.0, 0.5, 0.0], 1e-15);
        on.check(&y.log_softmax(0)?, &[4], &[-(2f64.ln()), f64::NEG_INFINITY, -(2f64.ln()), f64::NEG_INFINITY], 1e-15);
        // A row that is entirely -inf is NaN, as in torch.
        let z = on.f64s(&[f64::NEG_INFINITY; 2], &[1, 2]);
        on.check(&z.softmax(1)?, &[1, 2], &[f64::NAN; 2], 0.0);
        Ok(())
    }

    fn softmax_on_strided_and_large_inputs(device: Device) -> R {
        let on = On(device);
        let x = on.f64s(&(0..60).map(|i| ((i * 13) % 11) as f64 / 3.0).collect::<Vec<_>>(), &[3, 4, 5]);
        for v in [x.permute(&[2, 0, 1])?, x.narrow(2, 1, 3)?, x.t()?] {
            for axis in 0..3 {
                let want = naive_softmax(&v.to_vec_f64(), v.dims(), axis, false);
                on.check(&v.softmax(axis as isize)?, v.dims(), &want, 1e-14);
                let wl = naive_softmax(&v.to_vec_f64(), v.dims(), axis, true);
                on.check(&v.log_softmax(axis as isize)?, v.dims(), &wl, 1e-14);
            }
        }
        // Above the parallel threshold.
        let big = on.f32s(&(0..256 * 200).map(|i| ((i * 17) % 23) as f64 / 5.0).collect::<Vec<_>>(), &[256, 200]);
        let s = big.softmax(1)?.sum(&[1], false)?.to_vec_f64();
        assert!(s.iter().all(|v| (v - 1.0).abs() < 1e-5));
        let s0 = big.softmax(0)?.sum(&[0], false)?.to_vec_f64();
        assert!(s0.iter().all(|v| (v - 1.0).abs() < 1e-5));
        Ok(())
    }
}

// ----- indexing --------------------------------------------------------------

test_device! {
    fn index_select_reference(device: Device) -> R {
        let on = On(device);
        let x = on.iota(&[3, 4]);
        let rows = on.vec(vec![2i64, 0, 2], [3])?;
        on.check(&x.index_select(0, &rows)?, &[3, 4], &[8., 9., 10., 11., 0., 1., 2., 3., 8., 9., 10., 11.], 0.0);
        let cols = on.vec(vec![3i32, 1], [2])?;
        on.check(&x.index_select(1, &cols)?, &[3, 2], &[3., 1., 7., 5., 11., 9.], 0.0);
        on.check(&x.index_select(-1, &cols)?, &[3, 2], &[3., 1., 7., 5., 11., 9.], 0.0);
        // On a transposed view.
        on.check(&x.t()?.index_select(0, &cols)?, &[2, 3], &[3., 7., 11., 1., 5., 9.], 0.0);
        // No indices: an empty selection.
        let none = on.vec(Vec::<i64>::new(), [0])?;
        assert_eq!(x.index_select(0, &none)?.dims(), &[0, 4]);
        // Middle axis of a 3-D tensor.
        let y = on.iota(&[2, 3, 2]);
        let mid = on.vec(vec![1i64], [1])?;
        on.check(&y.index_select(1, &mid)?, &[2, 1, 2], &[2., 3., 8., 9.], 0.0);
        Ok(())
    }

    fn embedding_looks_up_rows_for_any_id_shape(device: Device) -> R {
        let on = On(device);
        let table = on.iota(&[5, 3]);
        let ids = on.vec(vec![4i64, 0, 1, 4], [2, 2])?;
        on.check(&table.embedding(&ids)?, &[2, 2, 3], &[12., 13., 14., 0., 1., 2., 3., 4., 5., 12., 13., 14.], 0.0);
        let one = on.vec(vec![2i32], ())?;
        on.check(&table.embedding(&one)?, &[3], &[6., 7., 8.], 0.0);
        Ok(())
    }

    fn gather_reference(device: Device) -> R {
        let on = On(device);
        // torch.gather(torch.arange(12.).reshape(3, 4), 1, torch.tensor([[0, 3], [2, 2], [1, 0]]))
        let x = on.iota(&[3, 4]);
        let idx = on.vec(vec![0i64, 3, 2, 2, 1, 0], [3, 2])?;
        on.check(&x.gather(1, &idx)?, &[3, 2], &[0., 3., 6., 6., 9., 8.], 0.0);
        // Axis 0: out[i][j] = x[idx[i][j]][j].
        let idx0 = on.vec(vec![2i32, 0, 1, 1, 0, 2], [2, 3])?;
        on.check(&x.gather(0, &idx0)?, &[2, 3], &[8., 1., 6., 4., 1., 10.], 0.0);
        // On a strided input.
        let xt = x.t()?; // [4, 3]
        let idx1 = on.vec(vec![2i64, 0, 1, 1], [4, 1])?;
        on.check(&xt.gather(1, &idx1)?, &[4, 1], &[8., 1., 6., 7.], 0.0);
        Ok(())
    }

    fn scatter_add_reference(device: Device) -> R {
        let on = On(device);
        let base = on.zeros([2, 4], DType::F32).expect("alloc");
        let idx = on.vec(vec![0i64, 3, 0, 1, 1, 1], [2, 3])?;
        let src = on.f32s(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
        // Repeated indices accumulate.
        on.check(&base.scatter_add(1, &idx, &src)?, &[2, 4], &[4., 0., 0., 2., 0., 15., 0., 0.], 0.0);
        // Into a non-zero base along axis 0.
        let base2 = on.ones([3, 2], DType::F64).expect("alloc");
        let idx2 = on.vec(vec![2i64, 0, 2, 2], [2, 2])?;
        let src2 = on.f64s(&[1., 2., 3., 4.], &[2, 2]);
        on.check(&base2.scatter_add(0, &idx2, &src2)?, &[3, 2], &[1., 3., 1., 1., 5., 5.], 0.0);
        // scatter_add is gather's transpose: <gather(x), y> == <x, scatter_add(0, y)>.
        let x = on.f64s(&vals(12, 1), &[3, 4]);
        let gi = on.vec(vec![1i64, 2, 0, 2, 2, 0], [3, 2])?;
        let y = on.f64s(&vals(6, 2), &[3, 2]);
        let lhs = x.gather(1, &gi)?.mul(&y)?.sum_all()?.item()?;
        let rhs = x.mul(&on.zeros([3, 4], DType::F64).expect("alloc").scatter_add(1, &gi, &y)?)?.sum_all()?.item()?;
        assert!((lhs - rhs).abs() < 1e-12);
        Ok(())
    }

    fn concat_and_stack_reference(device: Device) -> R {
        let on = On(device);
        let a = on.iota(&[2, 3]);
        let b = on.f32s(&[10., 11., 12.], &[1, 3]);
        on.check(&Tensor::concat(&[&a, &b], 0)?, &[3, 3], &[0., 1., 2., 3., 4., 5., 10., 11., 12.], 0.0);
        let c = on.f32s(&[20., 21.], &[2, 1]);
        on.check(&Tensor::concat(&[&a, &c, &c], -1)?, &[2, 5], &[0., 1., 2., 20., 20., 3., 4., 5., 21., 21.], 0.0);
        // Strided inputs (transposed) concatenate by value.
        let at = a.t()?; // [3, 2]
        on.check(&Tensor::concat(&[&at, &at], 1)?, &[3, 4], &[0., 3., 0., 3., 1., 4., 1., 4., 2., 5., 2., 5.], 0.0);
        // A single input is a copy of it.
        same(&Tensor::concat(&[&a], 0)?, &a);
        // stack adds an axis.
        let s0 = Tensor::stack(&[&a, &a.mul_scalar(2.0)?], 0)?;
        on.check(&s0, &[2, 2, 3], &[0., 1., 2., 3., 4., 5., 0., 2., 4., 6., 8., 10.], 0.0);
        let s2 = Tensor::stack(&[&a, &a.mul_scalar(2.0)?], 2)?;
        on.check(&s2, &[2, 3, 2], &[0., 0., 1., 2., 2., 4., 3., 6., 4., 8., 5., 10.], 0.0);
        let sl = Tensor::stack(&[&a, &a], -1)?;
        same(&sl, &Tensor::stack(&[&a, &a], 2)?);
        // Int tensors.
        let i = on.vec(vec![1i64, 2], [2])?;
        assert_eq!(Tensor::concat(&[&i, &i], 0)?.to_vec::<i64>()?, vec![1, 2, 1, 2]);
        Ok(())
    }
}

// ----- casts -----------------------------------------------------------------

test_device! {
    fn casts_between_all_dtypes(device: Device) -> R {
        let on = On(device);
        let all = [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64];
        // Small integers are exact in every dtype.
        let data = [-3.0, -1.0, 0.0, 1.0, 2.0, 100.0];
        for &from in &all {
            let x = on.f64s(&data, &[2, 3]).cast(from)?;
            assert_eq!(x.dtype(), from);
            for &to in &all {
                let y = x.cast(to)?;
                assert_eq!(y.dtype(), to, "{from} -> {to}");
                on.check(&y, &[2, 3], &data, 0.0);
                // Through a strided view as well.
                on.check(&x.t()?.cast(to)?, &[3, 2], &x.t()?.to_vec_f64(), 0.0);
            }
            // Casting to the same dtype shares storage.
            assert!(x.cast(from)?.same_storage(&x));
        }
        // Float to int truncates toward zero (torch) and saturates.
        let f = on.f64s(&[2.7, -2.7, 0.5, -0.5, 1e20, -1e20], &[6]);
        assert_eq!(f.cast(DType::I64)?.to_vec::<i64>()?[..4], [2, -2, 0, 0]);
        assert_eq!(f.cast(DType::I32)?.to_vec::<i32>()?, vec![2, -2, 0, 0, i32::MAX, i32::MIN]);
        // f64 -> f32 rounds to nearest.
        let r = on.f64s(&[0.1, 1.0 / 3.0], &[2]).cast(DType::F32)?;
        assert_eq!(r.to_vec::<f32>()?, vec![0.1f32, 1.0f32 / 3.0]);
        // i64 -> f64 is exact up to 2^53.
        let big = on.vec(vec![1i64 << 53, -(1i64 << 40)], [2])?;
        assert_eq!(big.cast(DType::F64)?.to_vec::<f64>()?, vec![(1u64 << 53) as f64, -((1u64 << 40) as f64)]);
        Ok(())
    }
}

// ----- views -----------------------------------------------------------------

test_device! {
    fn reshape_is_a_view_when_contiguous(device: Device) -> R {
        let on = On(device);
        let x = on.iota(&[2, 3, 4]);
        let r = x.reshape([6, 4])?;
        assert!(r.same_storage(&x));
        on.check(&r, &[6, 4], &x.to_vec_f64(), 0.0);
        let f = x.flatten()?;
        assert!(f.same_storage(&x));
        assert_eq!(f.dims(), &[24]);
        let back = f.reshape([2, 3, 4])?;
        same(&back, &x);
        // A scalar and back.
        let s = on.f32s(&[5.0], &[1]);
        assert_eq!(s.reshape(())?.dims(), &[] as &[usize]);
        // Reshaping a transposed tensor copies (the elements are not in order)
        // and gives the row-major order of the view.
        let t = x.reshape([6, 4])?.t()?;
        let rt = t.reshape([24])?;
        assert!(!rt.same_storage(&x));
        assert_eq!(rt.to_vec_f64(), t.to_vec_f64());
        // A narrowed tensor that is still contiguous reshapes as a view.
        let n = x.narrow(0, 1, 1)?;
        assert!(n.is_contiguous());
        let nr = n.reshape([3, 4])?;
        assert!(nr.same_storage(&x));
        on.check(&nr, &[3, 4], &(12..24).map(f64::from).collect::<Vec<_>>(), 0.0);
        Ok(())
    }

    fn reshape_of_strided_view_is_a_view_when_possible(device: Device) -> R {
        let on = On(device);
        // torch: a view whenever the strides allow it, e.g. splitting or merging
        // dims that are contiguous among themselves.
        let x = on.iota(&[4, 6]);
        let n = x.narrow(1, 0, 4)?; // [4, 4], row stride 6
        let split = n.reshape([2, 2, 4])?;
        assert!(split.same_storage(&x), "split of the leading dim is a view");
        assert_eq!(split.to_vec_f64(), n.to_vec_f64());
        let split2 = n.reshape([4, 2, 2])?;
        assert!(split2.same_storage(&x), "split of the inner dim is a view");
        assert_eq!(split2.to_vec_f64(), n.to_vec_f64());
        // Merging the rows of a narrowed tensor cannot be a view; it copies.
        let merged = n.reshape([16])?;
        assert!(!merged.same_storage(&x));
        assert_eq!(merged.to_vec_f64(), n.to_vec_f64());
        // A transposed 3-D tensor whose last two dims are merged.
        let y = on.iota(&[2, 3, 4]).permute(&[1, 0, 2])?; // [3, 2, 4], strides [4, 12, 1]
        let m = y.reshape([3, 8])?;
        assert!(!m.same_storage(&y));
        assert_eq!(m.to_vec_f64(), y.to_vec_f64());
        // [4, 2, 3] with strides [1, 12, 4]: the last two dims merge (12 = 3 * 4).
        let z = on.iota(&[2, 3, 4]).permute(&[2, 0, 1])?;
        let zm = z.reshape([4, 6])?;
        assert!(zm.same_storage(&z));
        assert_eq!(zm.strides(), &[1, 4]);
        assert_eq!(zm.to_vec_f64(), z.to_vec_f64());
        Ok(())
    }

    fn permute_transpose_t_are_views(device: Device) -> R {
        let on = On(device);
        let x = on.iota(&[2, 3, 4]);
        let p = x.permute(&[2, 0, 1])?;
        assert!(p.same_storage(&x));
        assert_eq!(p.dims(), &[4, 2, 3]);
        assert_eq!(p.strides(), &[1, 12, 4]);
        assert!(!p.is_contiguous());
        let pv = p.to_vec_f64();
        for i in 0..4 {
            for j in 0..2 {
                for k in 0..3 {
                    assert_eq!(pv[(i * 2 + j) * 3 + k], (j * 12 + k * 4 + i) as f64);
                }
            }
        }
        let tr = x.transpose(0, -1)?;
        assert!(tr.same_storage(&x));
        assert_eq!(tr.dims(), &[4, 3, 2]);
        let t = x.t()?;
        assert_eq!(t.dims(), &[2, 4, 3]);
        assert!(t.same_storage(&x));
        same(&t.t()?, &x);
        // Identity permutation keeps the layout.
        assert!(x.permute(&[0, 1, 2])?.is_contiguous());
        Ok(())
    }

    fn narrow_is_a_view(device: Device) -> R {
        let on = On(device);
        let x = on.iota(&[4, 5]);
        let n = x.narrow(1, 1, 3)?;
        assert!(n.same_storage(&x));
        assert_eq!(n.dims(), &[4, 3]);
        on.check(&n, &[4, 3], &[1., 2., 3., 6., 7., 8., 11., 12., 13., 16., 17., 18.], 0.0);
        let nn = n.narrow(0, 2, 2)?.narrow(-1, 1, 1)?;
        on.check(&nn, &[2, 1], &[12., 17.], 0.0);
        assert!(nn.same_storage(&x));
        // Zero-length narrows are fine, at the end too.
        assert_eq!(x.narrow(0, 4, 0)?.dims(), &[0, 5]);
        assert_eq!(x.narrow(0, 2, 0)?.numel(), 0);
        Ok(())
    }

    fn broadcast_to_is_a_view_with_zero_strides(device: Device) -> R {
        let on = On(device);
        let v = on.f32s(&[1., 2., 3.], &[3]);
        let b = v.broadcast_to([2, 3])?;
        assert!(b.same_storage(&v));
        assert_eq!(b.strides(), &[0, 1]);
        on.check(&b, &[2, 3], &[1., 2., 3., 1., 2., 3.], 0.0);
        let c = on.f32s(&[1., 2.], &[2, 1]).broadcast_to([2, 2, 3])?;
        on.check(&c, &[2, 2, 3], &[1., 1., 1., 2., 2., 2., 1., 1., 1., 2., 2., 2.], 0.0);
        let e = v.expand([1, 3])?;
        assert!(e.same_storage(&v));
        // Broadcasting to the same shape is the tensor itself.
        assert!(v.broadcast_to([3])?.same_storage(&v));
        // A scalar to anything.
        let s = on.scalar(4.0).broadcast_to([2, 2])?;
        on.check(&s, &[2, 2], &[4.0; 4], 0.0);
        // Broadcast of a transposed view.
        let m = on.iota(&[2, 3]).t()?.unsqueeze(0)?.broadcast_to([2, 3, 2])?;
        on.check(&m, &[2, 3, 2], &[0., 3., 1., 4., 2., 5., 0., 3., 1., 4., 2., 5.], 0.0);
        Ok(())
    }

    fn squeeze_unsqueeze_are_views(device: Device) -> R {
        let on = On(device);
        let x = on.iota(&[2, 3]);
        let u0 = x.unsqueeze(0)?;
        assert_eq!(u0.dims(), &[1, 2, 3]);
        assert!(u0.same_storage(&x));
        assert_eq!(x.unsqueeze(-1)?.dims(), &[2, 3, 1]);
        assert_eq!(x.unsqueeze(1)?.dims(), &[2, 1, 3]);
        same(&u0.squeeze(0)?, &x);
        // On a strided view they must not copy either.
        let t = x.t()?;
        let tu = t.unsqueeze(1)?;
        assert_eq!(tu.dims(), &[3, 1, 2]);
        assert!(tu.same_storage(&x), "unsqueeze of a transposed view copies");
        assert_eq!(tu.to_vec_f64(), t.to_vec_f64());
        let ts = tu.squeeze(1)?;
        assert!(ts.same_storage(&x), "squeeze of a transposed view copies");
        same(&ts, &t);
        let col = x.narrow(1, 2, 1)?.squeeze(-1)?;
        assert!(col.same_storage(&x));
        on.check(&col, &[2], &[2., 5.], 0.0);
        Ok(())
    }

    fn contiguous_copies_only_when_needed(device: Device) -> R {
        let on = On(device);
        let x = on.iota(&[3, 4]);
        assert!(x.contiguous()?.same_storage(&x));
        assert!(x.contiguous_()?.same_storage(&x));
        let t = x.t()?;
        let c = t.contiguous()?;
        assert!(!c.same_storage(&x));
        assert!(c.is_contiguous());
        assert_eq!(c.strides(), &[3, 1]);
        same(&c, &t);
        let c2 = t.contiguous_()?;
        same(&c2, &t);
        assert!(c2.is_contiguous());
        // A contiguous row range of a larger tensor needs no copy.
        let rows = x.narrow(0, 1, 2)?;
        assert!(rows.is_contiguous());
        assert!(rows.contiguous()?.same_storage(&x));
        // A column range is not contiguous.
        assert!(!x.narrow(1, 1, 2)?.is_contiguous());
        Ok(())
    }

    fn to_vec_and_item_on_views(device: Device) -> R {
        let on = On(device);
        let x = on.iota(&[3, 4]);
        assert_eq!(x.t()?.to_vec::<f32>()?, vec![0., 4., 8., 1., 5., 9., 2., 6., 10., 3., 7., 11.]);
        assert_eq!(x.narrow(0, 2, 1)?.narrow(1, 3, 1)?.item()?, 11.0);
        assert_eq!(x.sum_all()?.item_f32()?, 66.0);
        assert_eq!(x.narrow(1, 1, 1)?.broadcast_to([3, 2])?.to_vec::<f32>()?, vec![1., 1., 5., 5., 9., 9.]);
        // Debug printing never panics, small or large, strided or not.
        let _ = format!("{:?} {:?} {:?}", x, x.t()?, on.iota(&[100, 100]).t()?);
        Ok(())
    }
}

// Host only: the CPU's one-job linear layer (the bias, the product, then
// tanh or `1 - h^2` on each thread's rows) rounds as the composed ops do,
// `acc + b` once, so a fused tanh layer has their bits (other devices
// round as they like).
#[test]
fn f32_linear_tanh_epilogue_has_the_composed_ops_bits() -> R {
    use tapir_tensor::ops::rules::matmul::{fused_linear_sum_then, Then};
    let on = On(Device::Cpu);
    // Row-split (1000 x 64 x 64), a first layer's inner dimension of 2 and
    // a strided right operand (x @ w^T), one block of 512, a small one.
    for (m, k, n) in [(1000, 64, 64), (1024, 2, 64), (8, 512, 600), (5, 3, 7)] {
        let x = on.f32s(&vals(m * k, 51), &[m, k]);
        let w = on.f32s(&vals(n * k, 52), &[n, k]);
        let (b, h) = (on.f32s(&vals(n, 53), &[n]), on.f32s(&vals(m * n, 54), &[m, n]).mul_scalar(0.01)?);
        let wt = w.t()?;
        let z = x.matmul(&wt)?.add(&b)?;
        let bits =
            |t: &Tensor| -> anyhow::Result<Vec<u32>> { Ok(t.to_vec::<f32>()?.iter().map(|v| v.to_bits()).collect()) };
        let got = fused_linear_sum_then(&[(&x, &wt)], Some(&b), Then::Tanh)?.expect("a term");
        assert_eq!(bits(&got)?, bits(&z.tanh()?)?, "tanh, {m} x {k} x {n}");
        let got = fused_linear_sum_then(&[(&x, &wt)], Some(&b), Then::TanhBackward(&h))?.expect("a term");
        assert_eq!(bits(&got)?, bits(&h.tanh_backward(&z)?)?, "1 - h^2, {m} x {k} x {n}");
    }
    Ok(())
}

// Host only: as_slice views host memory.
#[test]
fn as_slice_views_contiguous_ranges_only() -> R {
    let x = On(Device::Cpu).iota(&[3, 4]);
    assert_eq!(x.narrow(0, 1, 2)?.as_slice::<f32>(), Some(&[4., 5., 6., 7., 8., 9., 10., 11.][..]));
    assert_eq!(x.narrow(1, 1, 2)?.as_slice::<f32>(), None);
    Ok(())
}

// Host only: make_mut hands out host memory.
#[test]
fn make_mut_copies_on_write() -> R {
    let on = On(Device::Cpu);
    let x = on.iota(&[2, 2]);
    let mut y = x.clone();
    y.make_mut::<f32>()?[0] = 100.0;
    assert_eq!(x.to_vec::<f32>()?, vec![0., 1., 2., 3.]);
    assert_eq!(y.to_vec::<f32>()?, vec![100., 1., 2., 3.]);
    // A unique, whole tensor is written in place.
    let mut z = on.iota(&[2, 2]);
    let before = z.clone();
    drop(before);
    z.make_mut::<f32>()?[3] = -1.0;
    assert_eq!(z.to_vec::<f32>()?, vec![0., 1., 2., -1.]);
    // A strided view gets a private contiguous copy in its own order.
    let mut t = x.t()?;
    t.make_mut::<f32>()?[1] = 42.0;
    assert_eq!(t.to_vec::<f32>()?, vec![0., 42., 1., 3.]);
    assert_eq!(x.to_vec::<f32>()?, vec![0., 1., 2., 3.]);
    assert!(matches!(t.make_mut::<f64>(), Err(Error::DTypeMismatch { .. })));
    Ok(())
}

// Host only: it is about the CPU device itself.
#[test]
fn devices_are_cpu_without_cuda() -> R {
    let on = On(Device::Cpu);
    let x = on.iota(&[2]);
    assert_eq!(x.device(), Device::Cpu);
    assert!(Device::Cpu.is_cpu());
    assert!(x.to_device(Device::Cpu)?.same_storage(&x));
    // Device::best() never panics.
    let _ = Device::best();
    Ok(())
}

test_device! {
    /// Row reductions over the last axis (the vectorised row kernels) against
    /// an f64 reference: a long row, a single row long enough to be split
    /// across threads, and lengths that are no multiple of any vector width or
    /// lane count (so every remainder path runs).
    fn last_axis_reductions_match_f64_reference(device: Device) -> R {
        let on = On(device);
        let cases: &[(usize, usize)] =
            &[(3, 1_000_003), (1, 600_001), (7, 1), (5, 3), (4, 17), (3, 127), (2, 129), (3, 255), (2, 8193), (65, 4099)];
        for &(rows, n) in cases {
            let mut rng = Rng::new(n as u64);
            let x = rng.uniform_on([rows, n], -1.0, 2.0, DType::F32, device)?;
            let data = x.to_vec::<f32>()?;
            let sum = x.sum(&[-1], false)?.to_vec::<f32>()?;
            let mean = x.mean(&[-1], false)?.to_vec::<f32>()?;
            let max = x.max(&[-1], false)?.to_vec::<f32>()?;
            let min = x.min(&[-1], false)?.to_vec::<f32>()?;
            let lse = x.logsumexp(&[-1], false)?.to_vec::<f32>()?;
            for r in 0..rows {
                let row = &data[r * n..(r + 1) * n];
                let want: f64 = row.iter().map(|&v| v as f64).sum();
                // One running f32 sum of a million elements is off by ~1e-3
                // relative; the lane kernels stay near 1e-6.
                let tol = 2e-6 * row.iter().map(|&v| v.abs() as f64).sum::<f64>() + 1e-6;
                assert!((sum[r] as f64 - want).abs() <= tol, "sum [{rows}, {n}] row {r}: {} vs {want}", sum[r]);
                assert!((mean[r] as f64 - want / n as f64).abs() <= tol / n as f64 + 1e-7, "mean [{rows}, {n}]");
                let mx = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mn = row.iter().copied().fold(f32::INFINITY, f32::min);
                assert_eq!(max[r], mx, "max [{rows}, {n}] row {r}");
                assert_eq!(min[r], mn, "min [{rows}, {n}] row {r}");
                let l = mx as f64 + row.iter().map(|&v| (v as f64 - mx as f64).exp()).sum::<f64>().ln();
                assert!((lse[r] as f64 - l).abs() <= 1e-5 * l.abs().max(1.0), "logsumexp [{rows}, {n}]: {} vs {l}", lse[r]);
            }
        }
        // f64 rows keep f64 accuracy.
        let x = Rng::new(3).uniform_on([2, 100_003], -1.0, 1.0, DType::F64, device)?;
        let data = x.to_vec::<f64>()?;
        let got = x.sum(&[1], false)?.to_vec::<f64>()?;
        for (r, g) in got.iter().enumerate() {
            let want: f64 = data[r * 100_003..(r + 1) * 100_003].iter().sum();
            assert!((g - want).abs() <= 1e-10, "{g} vs {want}");
        }
        // A NaN anywhere in a row makes its max and min NaN, as in torch.
        let mut v = vec![0.5f32; 3 * 301];
        v[301 + 299] = f32::NAN;
        let t = on.vec(v, [3, 301])?;
        let m = t.max(&[1], false)?.to_vec::<f32>()?;
        assert!(m[0] == 0.5 && m[1].is_nan() && m[2] == 0.5, "{m:?}");
        assert!(t.min(&[1], false)?.to_vec::<f32>()?[1].is_nan());
        Ok(())
    }

    fn full_keeps_the_sign_of_zero(device: Device) -> R {
        let on = On(device);
        let t = on.full([3], -0.0, DType::F32)?.to_vec::<f32>()?;
        assert!(t.iter().all(|v| *v == 0.0 && v.is_sign_negative()), "{t:?}");
        let z = on.full([3], 0.0, DType::F64)?.to_vec::<f64>()?;
        assert!(z.iter().all(|v| *v == 0.0 && v.is_sign_positive()), "{z:?}");
        Ok(())
    }

    /// A sum of products into one buffer (forward-mode rules use it), on shapes
    /// that take the row split and the inner-dimension split with accumulation.
    fn matmul_sum_accumulates_every_term(device: Device) -> R {
        let on = On(device);
        use tapir_tensor::ops::rules::matmul::{fused_linear_sum_then as fused, Then};
        // Row split, column split, inner-dimension split (also of a thin
        // output), and terms of different inner dimensions.
        for (m, k, n, k2) in
            [(40, 30, 20, 30), (150, 96, 80, 7), (32, 2048, 32, 2048), (1, 1024, 64, 600), (1000, 64, 64, 2)]
        {
            let (a1, b1, a2, b2) = (vals(m * k, 11), vals(k * n, 12), vals(m * k2, 13), vals(k2 * n, 14));
            let bias = vals(n, 15);
            let want: Vec<f64> =
                naive_matmul(&a1, &b1, m, k, n).iter().zip(naive_matmul(&a2, &b2, m, k2, n)).map(|(x, y)| x + y).collect();
            let (ta1, tb1, ta2, tb2) = (on.f64s(&a1, &[m, k]), on.f64s(&b1, &[k, n]), on.f64s(&a2, &[m, k2]), on.f64s(&b2, &[k2, n]));
            let got = fused(&[(&ta1, &tb1), (&ta2, &tb2)], None, Then::Nothing)?.expect("two terms");
            on.check(&got, &[m, n], &want, 1e-12);
            let composed = tapir_tensor::ops::rules::matmul::matmul_sum(&[(&ta1, &tb1), (&ta2, &tb2)])?.expect("two terms");
            on.check(&composed, &[m, n], &want, 1e-12);
            // The bias, added to every row by the same job.
            let with_bias: Vec<f64> = want.iter().enumerate().map(|(i, w)| w + bias[i % n]).collect();
            let tb = on.f64s(&bias, &[n]);
            let got = fused(&[(&ta1, &tb1), (&ta2, &tb2)], Some(&tb), Then::Nothing)?.expect("terms");
            on.check(&got, &[m, n], &with_bias, 1e-12);
            // One term and a bias; a transposed (strided) right operand.
            let one: Vec<f64> = naive_matmul(&a1, &b1, m, k, n).iter().enumerate().map(|(i, w)| w + bias[i % n]).collect();
            let b1t = on.f64s(&on.f64s(&b1, &[k, n]).t()?.to_vec_f64(), &[n, k]).t()?;
            let got = fused(&[(&ta1, &b1t)], Some(&tb), Then::Nothing)?.expect("a term");
            on.check(&got, &[m, n], &one, 1e-12);
        }
        assert!(tapir_tensor::ops::rules::matmul::linear_sum::<Tensor>(&[], None)?.is_none());
        Ok(())
    }
}
