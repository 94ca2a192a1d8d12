//! f16 and bf16 as storage types that compute in f32, and the integer dtypes
//! as labels and indices, on every device: each test on tensors runs on the
//! CPU (`<name>::cpu`) and on CUDA device 0 (`<name>::cuda`, skipped with a
//! printed line when there is none), its inputs made on that device.

use half::{bf16, f16};
use tapir_tensor::prelude::*;
use tapir_testing::test_device;

#[path = "support/on.rs"]
mod on;
use on::On;

type R = anyhow::Result<()>;

// No tensor, no device: the dtypes' own properties.
#[test]
fn dtype_properties() {
    let cases = [
        (DType::F32, 4, true, DType::F32, "float32"),
        (DType::F64, 8, true, DType::F64, "float64"),
        (DType::F16, 2, true, DType::F32, "float16"),
        (DType::BF16, 2, true, DType::F32, "bfloat16"),
        (DType::I32, 4, false, DType::I32, "int32"),
        (DType::I64, 8, false, DType::I64, "int64"),
    ];
    for (d, size, float, compute, name) in cases {
        assert_eq!(d.size_in_bytes(), size);
        assert_eq!(d.is_float(), float);
        assert_eq!(d.is_int(), !float);
        assert_eq!(d.compute(), compute);
        assert_eq!(d.name(), name);
        assert_eq!(d.to_string(), name);
    }
    assert_eq!(DType::default(), DType::F32);
}

test_device! {
    fn f16_round_trips_exactly_representable_values(device: Device) -> R {
        let on = On(device);
        let vals = [0.0f32, -0.0, 1.0, -2.5, 0.099975586, 1024.0, 65504.0, -65504.0, 6.1035156e-5];
        let h: Vec<f16> = vals.iter().map(|&v| f16::from_f32(v)).collect();
        let t = on.vec(h.clone(), [3, 3])?;
        assert_eq!(t.dtype(), DType::F16);
        assert_eq!(t.storage_bytes(), 18);
        assert_eq!(t.to_vec::<f16>()?, h);
        let f = t.cast(DType::F32)?;
        assert_eq!(f.to_vec::<f32>()?, vals.to_vec());
        let back = f.cast(DType::F16)?;
        assert_eq!(back.to_vec::<f16>()?, h);
        // Through f64 and bf16-free paths as well.
        assert_eq!(t.cast(DType::F64)?.cast(DType::F16)?.to_vec::<f16>()?, h);
        // Infinity and NaN survive.
        let s = on.vec(vec![f16::INFINITY, f16::NEG_INFINITY, f16::NAN], [3])?;
        let v = s.cast(DType::F32)?.to_vec::<f32>()?;
        assert_eq!(v[0], f32::INFINITY);
        assert_eq!(v[1], f32::NEG_INFINITY);
        assert!(v[2].is_nan());
        Ok(())
    }

    fn f16_and_bf16_round_to_nearest_on_cast(device: Device) -> R {
        let on = On(device);
        // 1 + 2^-11 is halfway between two f16 values: ties to even gives 1.
        // 1 + 3 * 2^-11 rounds up to 1 + 2^-9.
        let x = on.vec(vec![1.0f32 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-11), 70000.0], [3])?;
        let h = x.cast(DType::F16)?.to_vec::<f16>()?;
        assert_eq!(h[0], f16::from_f32(1.0));
        assert_eq!(h[1], f16::from_f32(1.0 + 2f32.powi(-9)));
        assert_eq!(h[2], f16::INFINITY, "beyond f16's range overflows to inf");
        // bf16 keeps f32's range with 8 bits of precision.
        let b = on.vec(vec![1.0f32 + 2f32.powi(-9), 3.0e38, 1.0 + 3.0 * 2f32.powi(-9)], [3])?
            .cast(DType::BF16)?
            .to_vec::<bf16>()?;
        assert_eq!(b[0], bf16::from_f32(1.0));
        assert!((b[1].to_f32() - 3.0e38).abs() / 3.0e38 < 1e-2);
        assert_eq!(b[2], bf16::from_f32(1.0 + 2f32.powi(-7)));
        Ok(())
    }

    fn bf16_round_trips(device: Device) -> R {
        let on = On(device);
        let vals = [0.0f32, 1.0, -1.5, 256.0, 3.0e38, 1.0e-30, -7.0];
        let b: Vec<bf16> = vals.iter().map(|&v| bf16::from_f32(v)).collect();
        let t = on.slice(&b, [7])?;
        assert_eq!(t.dtype(), DType::BF16);
        assert_eq!(t.storage_bytes(), 14);
        assert_eq!(t.to_vec::<bf16>()?, b);
        let f = t.cast(DType::F32)?.to_vec::<f32>()?;
        let want: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
        assert_eq!(f, want);
        assert_eq!(t.cast(DType::F32)?.cast(DType::BF16)?.to_vec::<bf16>()?, b);
        // bf16 <-> f16 through the cast.
        let small = on.vec(vec![bf16::from_f32(1.0), bf16::from_f32(-0.5)], [2])?;
        assert_eq!(small.cast(DType::F16)?.to_vec::<f16>()?, vec![f16::from_f32(1.0), f16::from_f32(-0.5)]);
        Ok(())
    }
}

/// An op on a half tensor and its f32 reference.
type HalfCase = (fn(&Tensor) -> Result<Tensor>, fn(f32) -> f32);

fn h(v: &[f32]) -> Vec<f16> {
    v.iter().map(|&x| f16::from_f32(x)).collect()
}

fn bh(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

test_device! {
    fn half_ops_compute_in_f32_and_keep_their_dtype(device: Device) -> R {
        let on = On(device);
        let xs = [-2.0f32, -0.5, 0.0, 0.5, 1.0, 3.0];
        for dtype in [DType::F16, DType::BF16] {
            let x = on.vec(xs.to_vec(), [2, 3])?.cast(dtype)?;
            let ops: [HalfCase; 6] = [
                (|t| t.exp(), f32::exp),
                (|t| t.tanh(), f32::tanh),
                (|t| t.sigmoid(), |v| 1.0 / (1.0 + (-v).exp())),
                (|t| t.relu(), |v| v.max(0.0)),
                (|t| t.mul_scalar(0.1), |v| v * 0.1),
                (|t| t.square(), |v| v * v),
            ];
            // Half precision keeps 11 (f16) or 8 (bf16) significant bits.
            let ulp = if dtype == DType::F16 { 2f64.powi(-10) } else { 2f64.powi(-7) };
            for (op, f) in ops {
                let y = op(&x)?;
                assert_eq!(y.dtype(), dtype);
                // The result is f(x) computed in f32, then rounded once: within
                // one half-precision ulp of the f32 value.
                for (&got, &v) in y.to_vec_f64().iter().zip(&xs) {
                    let want = f(v) as f64;
                    assert!((got - want).abs() <= ulp * want.abs().max(2f64.powi(-14)), "{dtype}: {got} vs {want}");
                }
            }
            let y = x.add(&x.t()?.t()?)?;
            assert_eq!(y.dtype(), dtype);
            assert_eq!(y.to_vec_f32(), xs.iter().map(|v| v * 2.0).collect::<Vec<_>>());
            // Broadcasting to a larger result, either operand the smaller:
            // the result, computed in f32, is cast back at its own size.
            let row = on.vec(vec![2.0f32, 0.5, -1.0], [3])?.cast(dtype)?;
            let col = on.vec(vec![3.0f32, 1.0], [2, 1])?.cast(dtype)?;
            let scalar = on.vec(vec![4.0f32], [1])?.cast(dtype)?.reshape([])?;
            assert_eq!(row.mul(&col)?.to_vec_f32(), vec![6.0, 1.5, -3.0, 2.0, 0.5, -1.0]);
            assert_eq!(scalar.mul(&row)?.to_vec_f32(), vec![8.0, 2.0, -4.0]);
            assert_eq!(scalar.sub(&x)?.dims(), &[2, 3]);
            // Comparisons give masks in the same dtype.
            let m = x.gt_scalar(0.0)?;
            assert_eq!(m.dtype(), dtype);
            assert_eq!(m.to_vec_f32(), vec![0., 0., 0., 1., 1., 1.]);
            // A half dtype with f32 promotes to f32, as in torch.
            assert_eq!(x.add(&on.zeros([2, 3], DType::F32)?)?.dtype(), DType::F32);
        }
        Ok(())
    }

    fn half_sums_accumulate_in_f32(device: Device) -> R {
        let on = On(device);
        // A running f16 sum of ones stalls at 2048; f32 accumulation reaches 4096,
        // which f16 represents exactly.
        let x = on.vec(h(&[1.0; 4096]), [4096])?;
        let s = x.sum_all()?;
        assert_eq!(s.dtype(), DType::F16);
        assert_eq!(s.item()?, 4096.0);
        // Same for bf16 (a bf16 running sum stalls at 256).
        let b = on.vec(bh(&[1.0; 1000]), [2, 500])?;
        assert_eq!(b.sum_all()?.item()?, 1000.0);
        assert_eq!(b.sum(&[1], false)?.to_vec_f32(), vec![500.0, 500.0]);
        // mean, max, logsumexp keep the dtype.
        let m = b.mean(&[1], true)?;
        assert_eq!(m.dtype(), DType::BF16);
        assert_eq!(m.dims(), &[2, 1]);
        assert_eq!(m.to_vec_f32(), vec![1.0, 1.0]);
        assert_eq!(b.max(&[], false)?.item()?, 1.0);
        let l = on.vec(h(&[0.0, 0.0]), [2])?.logsumexp(&[0], false)?;
        assert_eq!(l.dtype(), DType::F16);
        assert_eq!(l.item()?, f16::from_f32(2f32.ln()).to_f64());
        Ok(())
    }

    fn half_matmul_and_softmax(device: Device) -> R {
        let on = On(device);
        // [[1, 2], [3, 4]] @ [[0.5, -1], [2, 0.25]] in f16 and bf16: exact values.
        for dtype in [DType::F16, DType::BF16] {
            let a = on.vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2])?.cast(dtype)?;
            let b = on.vec(vec![0.5f32, -1.0, 2.0, 0.25], [2, 2])?.cast(dtype)?;
            let y = a.matmul(&b)?;
            assert_eq!(y.dtype(), dtype);
            assert_eq!(y.to_vec_f32(), vec![4.5, -0.5, 9.5, -2.0]);
            assert_eq!(a.matmul(&b.t()?)?.to_vec_f32(), vec![-1.5, 2.5, -2.5, 7.0]);
            // A long dot product of ones: exact with f32 accumulation.
            let ones = on.ones([1, 2048], dtype).expect("alloc");
            assert_eq!(ones.matmul(&ones.t()?)?.item()?, 2048.0);
            let s = on.vec(vec![0.0f32, 0.0, 1e4, 1e4], [2, 2])?.cast(dtype)?.softmax(1)?;
            assert_eq!(s.dtype(), dtype);
            assert_eq!(s.to_vec_f32(), vec![0.5, 0.5, 0.5, 0.5]);
        }
        Ok(())
    }

    fn half_views_and_index_ops(device: Device) -> R {
        let on = On(device);
        let x = on.vec(h(&[0., 1., 2., 3., 4., 5.]), [2, 3])?;
        let t = x.t()?;
        assert!(t.same_storage(&x));
        assert_eq!(t.to_vec_f32(), vec![0., 3., 1., 4., 2., 5.]);
        assert_eq!(t.contiguous()?.to_vec::<f16>()?, h(&[0., 3., 1., 4., 2., 5.]));
        let idx = on.vec(vec![2i64, 0], [2])?;
        let sel = x.index_select(1, &idx)?;
        assert_eq!(sel.dtype(), DType::F16);
        assert_eq!(sel.to_vec_f32(), vec![2., 0., 5., 3.]);
        let g = x.gather(1, &on.vec(vec![1i32, 1, 0, 2], [2, 2])?)?;
        assert_eq!(g.to_vec_f32(), vec![1., 1., 3., 5.]);
        let c = Tensor::concat(&[&x, &x], 0)?;
        assert_eq!(c.dtype(), DType::F16);
        assert_eq!(c.dims(), &[4, 3]);
        let sa = on.zeros([2, 3], DType::BF16).expect("alloc").scatter_add(
            1,
            &on.vec(vec![0i64, 0, 2, 2], [2, 2])?,
            &on.vec(bh(&[1.0, 2.0, 3.0, 4.0]), [2, 2])?,
        )?;
        assert_eq!(sa.to_vec_f32(), vec![3., 0., 0., 0., 0., 7.]);
        assert_eq!(x.argmax(1, false)?.to_vec::<i64>()?, vec![2, 2]);
        Ok(())
    }

    fn int_dtypes_for_indices_and_labels(device: Device) -> R {
        let on = On(device);
        let table = on.vec((0..12).map(|v| v as f32).collect::<Vec<_>>(), [4, 3])?;
        for ids in [on.vec(vec![3i32, 1, 3], [3])?, on.vec(vec![3i64, 1, 3], [3])?] {
            assert!(ids.dtype().is_int());
            let rows = table.index_select(0, &ids)?;
            assert_eq!(rows.to_vec::<f32>()?, vec![9., 10., 11., 3., 4., 5., 9., 10., 11.]);
            assert_eq!(table.embedding(&ids)?.dims(), &[3, 3]);
            let g = table.gather(0, &ids.reshape([1, 3])?)?;
            assert_eq!(g.to_vec::<f32>()?, vec![9., 4., 11.]);
        }
        // Integer tensors can themselves be indexed, gathered, selected,
        // concatenated, compared and viewed.
        let labels = on.vec(vec![5i64, 7, 9, 11], [2, 2])?;
        assert_eq!(labels.index_select(1, &on.vec(vec![1i32], [1])?)?.to_vec::<i64>()?, vec![7, 11]);
        assert_eq!(labels.gather(1, &on.vec(vec![1i64, 0], [2, 1])?)?.to_vec::<i64>()?, vec![7, 9]);
        assert_eq!(labels.t()?.to_vec::<i64>()?, vec![5, 9, 7, 11]);
        assert_eq!(labels.eq_scalar(9.0)?.to_vec::<i64>()?, vec![0, 0, 1, 0]);
        assert_eq!(labels.argmax(0, false)?.to_vec::<i64>()?, vec![1, 1]);
        let sa = on.zeros([3], DType::I32).expect("alloc").scatter_add(
            0,
            &on.vec(vec![2i64, 2, 0], [3])?,
            &on.vec(vec![1i32, 10, 100], [3])?,
        )?;
        assert_eq!(sa.to_vec::<i32>()?, vec![100, 0, 11]);
        // Random labels, and casts to and from floats.
        let r = Rng::new(3).randint_on([100], 7, DType::I32, device)?;
        assert_eq!(r.device(), device);
        assert_eq!(r.dtype(), DType::I32);
        assert!(r.to_vec::<i32>()?.iter().all(|&v| (0..7).contains(&v)));
        let f = on.vec(vec![-1.9f32, 2.9], [2])?;
        assert_eq!(f.cast(DType::I32)?.to_vec::<i32>()?, vec![-1, 2]);
        assert_eq!(
            on.vec(vec![i64::MAX, i64::MIN], [2])?.cast(DType::I32)?.to_vec::<i32>()?,
            vec![i32::MAX, i32::MIN]
        );
        Ok(())
    }
}

// The integer tests below assert torch 2.x's results (CPU), printed by:
//
//   import torch
//   a = torch.tensor([[1, -2, 3], [2147483647, 5, -6]], dtype=torch.int32)
//   print(a.sum().dtype, a.sum().item(), a.sum(0).tolist(), a.sum(1, keepdim=True).tolist())
//   b = torch.tensor([9007199254740993, 1, -3], dtype=torch.int64)
//   print(b.sum().dtype, b.sum().item())
//   m = torch.tensor([-2147483648, -7, 0, 7], dtype=torch.int32)
//   print(torch.neg(m).tolist(), torch.abs(m).tolist(), torch.neg(m).dtype)
//   x = torch.tensor([9007199254740993, 2, 3]); y = torch.tensor([9007199254740992, 2, 4])
//   print((x > y).tolist(), (x == y).tolist(), (x <= y).tolist())
//   a.mean()
//
// torch.int64 2147483648 [2147483648, 3, -3] [[2], [2147483646]]
// torch.int64 9007199254740991
// [-2147483648, 7, 0, -7] [-2147483648, 7, 0, 7] torch.int32
// [True, False, False] [False, True, False] [False, True, True]
// RuntimeError: mean(): could not infer output dtype. Input dtype must be
// either a floating point or complex dtype. Got: Int

test_device! {
    fn integer_sums_are_exact_int64_sums(device: Device) -> R {
        let on = On(device);
        let a = on.vec(vec![1i32, -2, 3, i32::MAX, 5, -6], [2, 3])?;
        let all = a.sum_all()?;
        assert_eq!((all.dtype(), all.to_vec::<i64>()?), (DType::I64, vec![2147483648]));
        assert_eq!(a.sum(&[0], false)?.to_vec::<i64>()?, vec![2147483648, 3, -3]);
        let rows = a.sum(&[1], true)?;
        assert_eq!((rows.dims().to_vec(), rows.to_vec::<i64>()?), (vec![2, 1], vec![2, 2147483646]));
        // A strided view sums the same as its copy.
        assert_eq!(a.t()?.sum(&[0], false)?.to_vec::<i64>()?, vec![2, 2147483646]);
        // Past 2^53, where a sum through f64 would round.
        let b = on.vec(vec![9007199254740993i64, 1, -3], [3])?;
        let s = b.sum_all()?;
        assert_eq!((s.dtype(), s.to_vec::<i64>()?), (DType::I64, vec![9007199254740991]));
        // An empty sum is zero, as for floats.
        assert_eq!(on.vec(Vec::<i32>::new(), [0])?.sum_all()?.to_vec::<i64>()?, vec![0]);
        Ok(())
    }

    fn integer_neg_and_abs_keep_their_dtype_and_wrap_like_torch(device: Device) -> R {
        let on = On(device);
        let m = on.vec(vec![i32::MIN, -7, 0, 7], [4])?;
        let (n, a) = (m.neg()?, m.abs()?);
        assert_eq!((n.dtype(), a.dtype()), (DType::I32, DType::I32));
        assert_eq!(n.to_vec::<i32>()?, vec![i32::MIN, 7, 0, -7]);
        assert_eq!(a.to_vec::<i32>()?, vec![i32::MIN, 7, 0, 7]);
        let l = on.vec(vec![-9007199254740993i64, 4], [2])?;
        assert_eq!(l.abs()?.to_vec::<i64>()?, vec![9007199254740993, 4]);
        assert_eq!(l.neg()?.to_vec::<i64>()?, vec![9007199254740993, -4]);
        Ok(())
    }

    fn integer_comparisons_are_exact_masks_in_the_operands_dtype(device: Device) -> R {
        let on = On(device);
        let x = on.vec(vec![9007199254740993i64, 2, 3], [3])?;
        let y = on.vec(vec![9007199254740992i64, 2, 4], [3])?;
        let gt = x.gt(&y)?;
        assert_eq!((gt.dtype(), gt.to_vec::<i64>()?), (DType::I64, vec![1, 0, 0]));
        assert_eq!(x.eq(&y)?.to_vec::<i64>()?, vec![0, 1, 0]);
        assert_eq!(x.le(&y)?.to_vec::<i64>()?, vec![0, 1, 1]);
        // Counting labels equal to a class needs no cast.
        let labels = on.vec(vec![0i32, 2, 2, 1, 2], [5])?;
        let class = on.vec(vec![2i32], [1])?;
        assert_eq!(labels.eq(&class)?.sum_all()?.to_vec::<i64>()?, vec![3]);
        Ok(())
    }

    fn the_mean_of_integers_is_an_error_that_says_to_cast(device: Device) -> R {
        let on = On(device);
        let a = on.vec(vec![1i32, 2, 3, 4], [2, 2])?;
        for r in [a.mean_all(), a.mean(&[0], false)] {
            let e = r.expect_err("mean of int32");
            assert!(matches!(e, Error::UnsupportedDType { op: "mean", dtype: DType::I32, .. }), "{e}");
            assert!(e.to_string().contains("cast"), "{e}");
        }
        assert_eq!(a.cast(DType::F32)?.mean_all()?.to_vec::<f32>()?, vec![2.5]);
        Ok(())
    }
}

// Promotion as torch's, whose table (rows and columns in the order of
// `ALL` below) and results were printed by:
//
//   import torch
//   ds = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]
//   for a in ds: print([str(torch.promote_types(a, b)) for b in ds])
//   f32 = torch.tensor([1.5, -2.0, 3.0]); i = torch.tensor([1, 2, 3], dtype=torch.int32)
//   print(f32 + i, i > torch.tensor([1.5, 2.0, 2.5], dtype=torch.float64))
//   print(torch.tensor([1, 2], dtype=torch.int32) < torch.tensor([2, 2]))
//   h = torch.tensor([1.5, 2.25], dtype=torch.float16); g = torch.tensor([0.5, 4.0], dtype=torch.bfloat16)
//   print(h * g)
//   print((torch.tensor([1.0, 2.0], dtype=torch.float16) * 2.5).dtype, (i * 2).dtype)
//   print(torch.where(torch.tensor([True, False]), torch.tensor([1.0, 2.0]),
//                     torch.tensor([3.0, 4.0], dtype=torch.float64)))
//
// ['float32', 'float64', 'float32', 'float32', 'float32', 'float32']
// ['float64', 'float64', 'float64', 'float64', 'float64', 'float64']
// ['float32', 'float64', 'float16', 'float32', 'float16', 'float16']
// ['float32', 'float64', 'float32', 'bfloat16', 'bfloat16', 'bfloat16']
// ['float32', 'float64', 'float16', 'bfloat16', 'int32', 'int64']
// ['float32', 'float64', 'float16', 'bfloat16', 'int64', 'int64']
// tensor([2.5000, 0.0000, 6.0000]) tensor([False, False,  True])
// tensor([ True, False])
// tensor([0.7500, 9.0000])  (float32)
// torch.float16 torch.int32
// tensor([1., 4.], dtype=torch.float64)

// No tensor, no device: the table itself (the ops' promotion runs on every
// device below).
#[test]
fn promotion_follows_torchs_table() {
    use DType::*;
    const ALL: [DType; 6] = [F32, F64, F16, BF16, I32, I64];
    let torch = [
        [F32, F64, F32, F32, F32, F32],
        [F64, F64, F64, F64, F64, F64],
        [F32, F64, F16, F32, F16, F16],
        [F32, F64, F32, BF16, BF16, BF16],
        [F32, F64, F16, BF16, I32, I64],
        [F32, F64, F16, BF16, I64, I64],
    ];
    for (i, &a) in ALL.iter().enumerate() {
        for (j, &b) in ALL.iter().enumerate() {
            assert_eq!(DType::promote(a, b), torch[i][j], "promote({a}, {b})");
        }
    }
}

test_device! {
    fn binary_ops_promote_mixed_dtypes(device: Device) -> R {
        let on = On(device);
        let x = on.vec(vec![1.5f32, -2.0, 3.0], [3])?;
        let i = on.vec(vec![1i32, 2, 3], [3])?;
        let y = x.add(&i)?;
        assert_eq!((y.dtype(), y.to_vec::<f32>()?), (DType::F32, vec![2.5, 0.0, 6.0]));
        // The order of the operands does not matter, nor does broadcasting.
        let d = on.vec(vec![2.0f64, 0.5], [2, 1])?;
        let z = d.mul(&x)?;
        assert_eq!((z.dtype(), z.dims().to_vec()), (DType::F64, vec![2, 3]));
        assert_eq!(z.to_vec::<f64>()?, vec![3.0, -4.0, 6.0, 0.75, -1.0, 1.5]);
        assert_eq!(x.mul(&d)?.to_vec::<f64>()?, z.to_vec::<f64>()?);
        // Neither half type holds the other: float32.
        let h = on.vec(h(&[1.5, 2.25]), [2])?;
        let b = on.vec(bh(&[0.5, 4.0]), [2])?;
        let p = h.mul(&b)?;
        assert_eq!((p.dtype(), p.to_vec::<f32>()?), (DType::F32, vec![0.75, 9.0]));
        // A Rust scalar keeps the tensor's dtype.
        assert_eq!(h.mul_scalar(2.5)?.dtype(), DType::F16);
        assert_eq!(x.add_scalar(1.0)?.dtype(), DType::F32);
        Ok(())
    }

    fn comparisons_and_where_promote_too(device: Device) -> R {
        let on = On(device);
        let i = on.vec(vec![1i32, 2, 3], [3])?;
        let f = on.vec(vec![1.5f64, 2.0, 2.5], [3])?;
        let m = i.gt(&f)?;
        assert_eq!((m.dtype(), m.to_vec::<f64>()?), (DType::F64, vec![0.0, 0.0, 1.0]));
        let l = on.vec(vec![2i64, 2], [2])?;
        let lt = on.vec(vec![1i32, 2], [2])?.lt(&l)?;
        assert_eq!((lt.dtype(), lt.to_vec::<i64>()?), (DType::I64, vec![1, 0]));
        let mask = on.vec(vec![1.0f32, 0.0], [2])?;
        let a = on.vec(vec![1.0f32, 2.0], [2])?;
        let b = on.vec(vec![3.0f64, 4.0], [2])?;
        let w = a.where_(&mask, &b)?;
        assert_eq!((w.dtype(), w.to_vec::<f64>()?), (DType::F64, vec![1.0, 4.0]));
        Ok(())
    }
}

// Checked against torch 2.x:
//   a = torch.tensor([2**31 - 1, -3, 7], dtype=torch.int32); b = torch.tensor([1, 2, -2], dtype=torch.int32)
//   a + b -> [-2147483648, -1, 5]; a - b -> [2147483646, -5, 9]; a * b -> [2147483647, -6, -14]
//   torch.maximum(a, b) -> [2147483647, 2, 7]; a / b -> float32 [2.1475e+09, -1.5, -3.5]
//   a ** torch.tensor([2, 3, 0], dtype=torch.int32) -> [1, -27, 1] (wrapped); a ** b with b < 0 -> RuntimeError
test_device! {
    fn integer_arithmetic_wraps_and_divides_in_float_like_torch(device: Device) -> R {
        let on = On(device);
        let a = on.vec(vec![i32::MAX, -3, 7], [3])?;
        let b = on.vec(vec![1i32, 2, -2], [3])?;
        assert_eq!(a.add(&b)?.to_vec::<i32>()?, vec![i32::MIN, -1, 5]);
        assert_eq!(a.sub(&b)?.to_vec::<i32>()?, vec![i32::MAX - 1, -5, 9]);
        assert_eq!(a.mul(&b)?.to_vec::<i32>()?, vec![i32::MAX, -6, -14]);
        assert_eq!(a.maximum(&b)?.to_vec::<i32>()?, vec![i32::MAX, 2, 7]);
        assert_eq!(a.minimum(&b)?.to_vec::<i32>()?, vec![1, -3, -2]);
        let q = a.div(&b)?;
        assert_eq!((q.dtype(), q.to_vec::<f32>()?), (DType::F32, vec![i32::MAX as f32, -1.5, -3.5]));
        let e = on.vec(vec![2i32, 3, 0], [3])?;
        assert_eq!(a.pow(&e)?.to_vec::<i32>()?, vec![1, -27, 1]);
        let err = a.pow(&b).unwrap_err();
        assert!(err.to_string().contains("negative integer powers"), "{err}");
        // int64 keeps its width; broadcasting works as for floats.
        let big = on.vec(vec![1i64 << 40, -5], [2, 1])?;
        let one = on.vec(vec![3i64, 1], [2])?;
        assert_eq!(big.mul(&one)?.to_vec::<i64>()?, vec![3 << 40, 1 << 40, -15, -5]);
        Ok(())
    }
}

// torch.result_type: a 0-d tensor beside a dimensioned one counts only when
// its kind (integer < float) is higher:
//   torch.ones(2, dtype=torch.float16) * torch.tensor(2.0, dtype=torch.float64) -> float16
//   torch.ones(2, dtype=torch.int32) + torch.tensor(2, dtype=torch.int64) -> int32
//   torch.ones(2, dtype=torch.int32) + torch.tensor(1.5, dtype=torch.float64) -> float64
//   torch.tensor(1.0, dtype=torch.float16) + torch.tensor(1.0, dtype=torch.float64) -> float64 (both 0-d)
test_device! {
    fn zero_dim_tensors_promote_with_lower_priority_like_torch(device: Device) -> R {
        let on = On(device);
        let h = on.vec(vec![1.0f32, 2.0], [2])?.cast(DType::F16)?;
        let y = h.mul(&on.scalar_of(2.0, DType::F64))?;
        assert_eq!((y.dtype(), y.cast(DType::F32)?.to_vec::<f32>()?), (DType::F16, vec![2.0, 4.0]));
        let i = on.vec(vec![1i32, 2], [2])?;
        assert_eq!(i.add(&on.scalar_of(2.0, DType::I64))?.dtype(), DType::I32);
        let f = i.add(&on.scalar_of(1.5, DType::F64))?;
        assert_eq!((f.dtype(), f.to_vec::<f64>()?), (DType::F64, vec![2.5, 3.5]));
        let both = on.scalar_of(1.0, DType::F16).add(&on.scalar_of(1.0, DType::F64))?;
        assert_eq!(both.dtype(), DType::F64);
        // Comparisons follow the same rule.
        assert_eq!(h.lt(&on.scalar_of(1.5, DType::F64))?.dtype(), DType::F16);
        Ok(())
    }
}
