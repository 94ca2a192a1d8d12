//! Every error path of tapir-tensor returns the right structured variant,
//! naming the op and the offending values, on every device: each test on
//! tensors runs on the CPU (`<name>::cpu`) and on CUDA device 0
//! (`<name>::cuda`, skipped with a printed line when there is none), its
//! inputs made there, and must see the same variants with the same labels,
//! indices and shapes. Nothing here may panic: a panic fails the test as
//! surely as a wrong variant.

use std::sync::{Mutex, MutexGuard};

use tapir_tensor::format_bytes;
use tapir_tensor::ops::cross_entropy::CrossEntropyOptions;
use tapir_tensor::prelude::*;
use tapir_testing::test_device;

#[path = "support/on.rs"]
mod on;
use on::On;

/// The memory counters are process-wide, and some tests here assert that a
/// failed call left them unchanged; every test takes this lock so no other
/// test of this binary allocates meanwhile.
static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Asserts that `$e` is an `Err` matching `$p` (with an optional guard), and
/// returns the error for further checks.
macro_rules! assert_err {
    ($e:expr, $p:pat $(if $guard:expr)?) => {{
        match $e {
            Err(err) => {
                #[allow(unused_variables)]
                let ok = matches!(&err, $p $(if $guard)?);
                assert!(ok, "wrong error: {err:?}");
                err
            }
            Ok(v) => panic!("expected an error, got Ok({v:?})"),
        }
    }};
}

type UnaryFn = fn(&Tensor) -> Result<Tensor>;
type BinaryFn = fn(&Tensor, &Tensor) -> Result<Tensor>;

fn f32s(on: On, data: &[f32], dims: &[usize]) -> Tensor {
    on.vec(data.to_vec(), dims.to_vec()).expect("test tensor")
}

fn m23(on: On) -> Tensor {
    f32s(on, &[1., 2., 3., 4., 5., 6.], &[2, 3])
}

fn shape(d: &[usize]) -> Shape {
    Shape::from(d)
}

fn i64s(on: On, v: &[i64], dims: &[usize]) -> Tensor {
    on.vec(v.to_vec(), dims.to_vec()).expect("index tensor")
}

// ----- shape mismatches --------------------------------------------------------

test_device! {
    fn binary_shape_mismatch_names_op_and_shapes(device: Device) {
        let on = On(device);
        let _g = lock();
        let a = m23(on);
        let b = f32s(on, &[1., 2., 3., 4.], &[4]);
        let ops: [(&str, BinaryFn); 7] = [
            ("add", |a, b| a.add(b)),
            ("sub", |a, b| a.sub(b)),
            ("mul", |a, b| a.mul(b)),
            ("div", |a, b| a.div(b)),
            ("pow", |a, b| a.pow(b)),
            ("maximum", |a, b| a.maximum(b)),
            ("minimum", |a, b| a.minimum(b)),
        ];
        for (name, op) in ops {
            let e = assert_err!(
                op(&a, &b),
                Error::ShapeMismatch { op, lhs, rhs }
                    if *op == name && *lhs == Box::new(shape(&[2, 3])) && *rhs == Box::new(shape(&[4]))
            );
            let msg = e.to_string();
            assert!(msg.contains(name) && msg.contains("[2, 3]") && msg.contains("[4]"), "{msg}");
        }
        // Comparisons and where broadcast too.
        assert_err!(a.lt(&b), Error::ShapeMismatch { op: "lt", .. });
        assert_err!(a.eq(&b), Error::ShapeMismatch { op: "eq", .. });
        let mask = f32s(on, &[1., 0.], &[2]);
        assert_err!(a.where_(&mask, &a), Error::ShapeMismatch { op: "where", .. });
        assert_err!(
            a.where_(&on.ones([2, 3], DType::F32).expect("alloc"), &b),
            Error::ShapeMismatch { op: "where", .. }
        );
    }

    fn matmul_inner_mismatch_names_user_shapes(device: Device) {
        let on = On(device);
        let _g = lock();
        let a = m23(on);
        let b = on.zeros([4, 5], DType::F32).expect("alloc");
        let e = assert_err!(
            a.matmul(&b),
            Error::ShapeMismatch { op: "matmul", lhs, rhs }
                if *lhs == Box::new(shape(&[2, 3])) && *rhs == Box::new(shape(&[4, 5]))
        );
        assert!(e.to_string().contains("matmul"));
        // Batch dims that do not broadcast.
        assert_err!(
            on.zeros([2, 2, 3], DType::F32).expect("alloc").matmul(&on.zeros([3, 3, 4], DType::F32).expect("alloc")),
            Error::ShapeMismatch { op: "matmul", lhs, rhs }
                if *lhs == Box::new(shape(&[2, 2, 3])) && *rhs == Box::new(shape(&[3, 3, 4]))
        );
        // 1-D operands: the error names the shapes the user passed.
        let v3 = on.zeros([3], DType::F32).expect("alloc");
        let v4 = on.zeros([4], DType::F32).expect("alloc");
        assert_err!(
            v3.matmul(&v4),
            Error::ShapeMismatch { op: "matmul", lhs, rhs }
                if *lhs == Box::new(shape(&[3])) && *rhs == Box::new(shape(&[4]))
        );
        assert_err!(
            v4.matmul(&a),
            Error::ShapeMismatch { op: "matmul", lhs, rhs }
                if *lhs == Box::new(shape(&[4])) && *rhs == Box::new(shape(&[2, 3]))
        );
        assert_err!(
            a.matmul(&v4),
            Error::ShapeMismatch { op: "matmul", lhs, rhs }
                if *lhs == Box::new(shape(&[2, 3])) && *rhs == Box::new(shape(&[4]))
        );
        // 0-d operands cannot be multiplied as matrices.
        assert_err!(on.scalar(1.0).matmul(&a), Error::ShapeMismatch { op: "matmul", .. });
        assert_err!(a.matmul(&on.scalar(1.0)), Error::ShapeMismatch { op: "matmul", .. });
        // linear with a weight of the wrong width.
        assert_err!(
            a.linear(&on.zeros([5, 4], DType::F32).expect("alloc"), None),
            Error::ShapeMismatch { op: "matmul", .. }
        );
    }

    fn view_shape_errors(device: Device) {
        let on = On(device);
        let _g = lock();
        let a = m23(on);
        // reshape to the wrong number of elements.
        assert_err!(
            a.reshape([4]),
            Error::ShapeMismatch { op: "reshape", lhs, rhs }
                if *lhs == Box::new(shape(&[2, 3])) && *rhs == Box::new(shape(&[4]))
        );
        assert_err!(a.reshape([7, 1]), Error::ShapeMismatch { op: "reshape", .. });
        // broadcast_to a shape the tensor does not broadcast to.
        assert_err!(
            a.broadcast_to([2, 4]),
            Error::ShapeMismatch { op: "broadcast_to", lhs, rhs }
                if *lhs == Box::new(shape(&[2, 3])) && *rhs == Box::new(shape(&[2, 4]))
        );
        assert_err!(a.broadcast_to([3]), Error::ShapeMismatch { op: "broadcast_to", .. });
        assert_err!(a.broadcast_to([1, 3]), Error::ShapeMismatch { op: "broadcast_to", .. });
        assert_err!(a.expand([3, 3]), Error::ShapeMismatch { op: "broadcast_to", .. });
        // sum_to a shape the tensor is not a broadcast of.
        assert_err!(a.sum_to([4]), Error::ShapeMismatch { op: "sum_to", .. });
        assert_err!(a.sum_to([2, 2, 3]), Error::ShapeMismatch { op: "sum_to", .. });
        // concat and stack of incompatible shapes.
        let b = on.zeros([2, 2], DType::F32).expect("alloc");
        assert_err!(
            Tensor::concat(&[&a, &b], 0),
            Error::ShapeMismatch { op: "concat", lhs, rhs }
                if *lhs == Box::new(shape(&[2, 3])) && *rhs == Box::new(shape(&[2, 2]))
        );
        assert_err!(
            Tensor::concat(&[&a, &on.zeros([6], DType::F32).expect("alloc")], 0),
            Error::ShapeMismatch { op: "concat", .. }
        );
        assert_err!(Tensor::stack(&[&a, &b], 0), Error::ShapeMismatch { op: "stack", .. });
        // squeeze of a dim that is not 1, t() of a vector.
        assert_err!(
            a.squeeze(0),
            Error::InvalidShape { op: "squeeze", shape: s, .. } if *s == Box::new(shape(&[2, 3]))
        );
        assert_err!(on.zeros([3], DType::F32).expect("alloc").t(), Error::InvalidShape { op: "t", .. });
    }

    fn index_shape_errors(device: Device) {
        let on = On(device);
        let _g = lock();
        let x = m23(on);
        // index_select wants 1-D indices.
        assert_err!(x.index_select(0, &i64s(on, &[0, 1], &[1, 2])), Error::InvalidShape { op: "index_select", .. });
        // embedding wants a [vocab, dim] table.
        assert_err!(
            on.zeros([4], DType::F32).expect("alloc").embedding(&i64s(on, &[0], &[1])),
            Error::InvalidShape { op: "embedding", .. }
        );
        // gather indices of another rank, or larger than the input off-axis.
        assert_err!(x.gather(1, &i64s(on, &[0, 1], &[2])), Error::ShapeMismatch { op: "gather", .. });
        assert_err!(x.gather(1, &i64s(on, &[0; 9], &[3, 3])), Error::ShapeMismatch { op: "gather", .. });
        // scatter_add: src and idx must have one shape.
        let src = on.ones([2, 2], DType::F32).expect("alloc");
        assert_err!(x.scatter_add(1, &i64s(on, &[0, 1, 2], &[1, 3]), &src), Error::ShapeMismatch { op: "scatter_add", .. });
    }
}

// ----- dtypes and devices ------------------------------------------------------

test_device! {
    fn dtype_mismatch_names_both_dtypes(device: Device) {
        let on = On(device);
        let _g = lock();
        let a = m23(on);
        let b = on.ones([2, 3], DType::F64).expect("alloc");
        // Elementwise ops, comparisons and `where` promote instead (the dtypes
        // tests); matmul, as torch's, does not.
        let e = assert_err!(
            a.matmul(&on.ones([3, 2], DType::F16).expect("alloc")),
            Error::DTypeMismatch { op: "matmul", lhs: DType::F32, rhs: DType::F16 }
        );
        // Messages name dtypes as torch does, never by their Rust variant.
        assert_eq!(e.to_string(), "matmul: dtype mismatch between float32 and float16");
        assert_eq!(a.add(&b).expect("promotes").dtype(), DType::F64);
        assert_err!(Tensor::concat(&[&a, &b], 0), Error::DTypeMismatch { op: "concat", lhs: DType::F32, rhs: DType::F64 });
        assert_err!(a.scatter_add(1, &i64s(on, &[0; 6], &[2, 3]), &b), Error::DTypeMismatch { op: "scatter_add", .. });
        // Reading elements as the wrong Rust type.
        assert_err!(a.to_vec::<f64>(), Error::DTypeMismatch { op: "to_vec", lhs: DType::F32, rhs: DType::F64 });
        let mut m = a.clone();
        assert_err!(m.make_mut::<i32>().map(|s| s.len()), Error::DTypeMismatch { op: "make_mut", .. });
    }

    fn float_ops_reject_integer_tensors(device: Device) {
        let on = On(device);
        let _g = lock();
        let i = on.vec(vec![1i32, 2, 3, 4], [2, 2]).expect("ints");
        let unary: [(&str, UnaryFn); 6] = [
            ("exp", |x| x.exp()),
            ("log", |x| x.log()),
            ("tanh", |x| x.tanh()),
            ("relu", |x| x.relu()),
            ("mul_scalar", |x| x.mul_scalar(2.0)),
            ("clamp", |x| x.clamp(0.0, 1.0)),
        ];
        for (name, op) in unary {
            assert_err!(
                op(&i),
                Error::UnsupportedDType { op, dtype: DType::I32, .. } if *op == name
            );
        }
        assert_eq!(i.exp().unwrap_err().to_string(), "exp: dtype int32 is not supported (a float dtype)");
        // Integer arithmetic is supported (wrapping, as torch's); see tests/dtypes.rs.
        assert_eq!(i.add(&i).unwrap().dtype(), DType::I32);
        assert_err!(i.matmul(&i), Error::UnsupportedDType { op: "matmul", .. });
        assert_err!(i.softmax(0), Error::UnsupportedDType { op: "softmax", .. });
        assert_err!(i.log_softmax(0), Error::UnsupportedDType { op: "log_softmax", .. });
        assert_err!(i.max(&[0], false), Error::UnsupportedDType { op: "max", .. });
    }

    fn indices_must_be_integers(device: Device) {
        let on = On(device);
        let _g = lock();
        let x = m23(on);
        let fidx = f32s(on, &[0., 1.], &[2]);
        assert_err!(x.index_select(1, &fidx), Error::UnsupportedDType { op: "index_select", dtype: DType::F32, .. });
        assert_err!(x.embedding(&fidx), Error::UnsupportedDType { dtype: DType::F32, .. });
        assert_err!(x.gather(1, &f32s(on, &[0.; 6], &[2, 3])), Error::UnsupportedDType { op: "gather", .. });
    }
}

// Host only: it is about opening devices, from the host.
#[test]
fn missing_cuda_is_an_error_never_a_panic() {
    let _g = lock();
    let m23 = || m23(On(Device::Cpu));
    // No machine has 101 GPUs: always an error naming the device.
    assert_err!(Device::cuda(100), Error::DeviceUnavailable { device: Device::Cuda(100), .. });
    assert_err!(m23().to_device(Device::Cuda(100)), Error::DeviceUnavailable { .. });
    // Device 0 exists or is an error, depending on the machine; best()
    // agrees with it either way.
    match Device::cuda(0) {
        Ok(d) => {
            assert_eq!(d, Device::Cuda(0));
            assert_eq!(Device::best(), Device::Cuda(0));
        }
        Err(e) => {
            assert!(matches!(e, Error::DeviceUnavailable { device: Device::Cuda(0), .. }), "{e:?}");
            assert_err!(m23().to_device(Device::Cuda(0)), Error::DeviceUnavailable { .. });
            assert_eq!(Device::best(), Device::Cpu);
        }
    }
}

// ----- axes ----------------------------------------------------------------------

test_device! {
    fn axis_out_of_range_names_axis_and_rank(device: Device) {
        let on = On(device);
        let _g = lock();
        let x = m23(on);
        type AxisOp = (&'static str, isize, fn(&Tensor, isize) -> Result<Tensor>);
        let cases: [AxisOp; 16] = [
            ("sum", 2, |x, a| x.sum(&[a], false)),
            ("sum", -3, |x, a| x.sum(&[0, a], true)),
            ("mean", 5, |x, a| x.mean(&[a], false)),
            ("max", 2, |x, a| x.max(&[a], false)),
            ("min", -3, |x, a| x.min(&[a], false)),
            ("logsumexp", 2, |x, a| x.logsumexp(&[a], false)),
            ("argmax", 2, |x, a| x.argmax(a, false)),
            ("argmin", -3, |x, a| x.argmin(a, false)),
            ("softmax", 2, |x, a| x.softmax(a)),
            ("log_softmax", -3, |x, a| x.log_softmax(a)),
            ("narrow", 2, |x, a| x.narrow(a, 0, 1)),
            ("transpose", 2, |x, a| x.transpose(0, a)),
            ("squeeze", 2, |x, a| x.squeeze(a)),
            ("index_select", 2, |x, a| x.index_select(a, &Tensor::from_vec(vec![0i64], [1])?.to_device(x.device())?)),
            ("gather", 2, |x, a| x.gather(a, &Tensor::from_vec(vec![0i64], [1, 1])?.to_device(x.device())?)),
            ("concat", 2, |x, a| Tensor::concat(&[x, x], a)),
        ];
        for (name, axis, op) in cases {
            let e = assert_err!(
                op(&x, axis),
                Error::AxisOutOfRange { op, axis: a, rank: 2 } if *op == name && *a == axis
            );
            let msg = e.to_string();
            assert!(msg.contains(name) && msg.contains(&axis.to_string()), "{msg}");
        }
        // unsqueeze and stack insert an axis, so rank + 1 positions are valid.
        assert_err!(x.unsqueeze(3), Error::AxisOutOfRange { op: "unsqueeze", axis: 3, rank: 3 });
        assert_err!(x.unsqueeze(-4), Error::AxisOutOfRange { op: "unsqueeze", axis: -4, rank: 3 });
        assert_err!(Tensor::stack(&[&x, &x], 3), Error::AxisOutOfRange { op: "stack", axis: 3, rank: 3 });
        assert_err!(x.dim(2), Error::AxisOutOfRange { op: "dim", axis: 2, rank: 2 });
        assert_err!(
            x.scatter_add(3, &i64s(on, &[0], &[1, 1]), &on.ones([1, 1], DType::F32).expect("alloc")),
            Error::AxisOutOfRange { op: "scatter_add", axis: 3, rank: 2 }
        );
        // A scalar has no axes at all.
        assert_err!(on.scalar(1.0).softmax(0), Error::AxisOutOfRange { op: "softmax", axis: 0, rank: 0 });
    }

    fn repeated_axes_and_bad_permutations_are_invalid_arguments(device: Device) {
        let on = On(device);
        let _g = lock();
        let x = m23(on);
        assert_err!(x.sum(&[0, 0], false), Error::InvalidArgument { op: "sum", .. });
        assert_err!(x.sum(&[1, -1], false), Error::InvalidArgument { op: "sum", .. });
        assert_err!(x.mean(&[0, -2], false), Error::InvalidArgument { op: "mean", .. });
        assert_err!(x.permute(&[0, 0]), Error::InvalidArgument { op: "permute", .. });
        assert_err!(x.permute(&[0]), Error::InvalidArgument { op: "permute", .. });
        assert_err!(x.permute(&[0, 2]), Error::InvalidArgument { op: "permute", .. });
        assert_err!(x.permute(&[1, 0, 2]), Error::InvalidArgument { op: "permute", .. });
    }
}

// ----- indices -------------------------------------------------------------------

test_device! {
    fn index_out_of_range_names_value_and_position(device: Device) {
        let on = On(device);
        let _g = lock();
        let x = m23(on);
        let e = assert_err!(
            x.index_select(1, &i64s(on, &[0, 2, 3, 1], &[4])),
            Error::IndexOutOfRange { op: "index_select", index: 3, position: 2, size: 3 }
        );
        let msg = e.to_string();
        assert!(msg.contains("index_select") && msg.contains('3') && msg.contains('2'), "{msg}");
        // Negative indices are out of range (no wrap-around).
        assert_err!(
            x.index_select(0, &on.vec(vec![-1i32], [1]).expect("idx")),
            Error::IndexOutOfRange { index: -1, position: 0, size: 2, .. }
        );
        // embedding names itself (not the index_select it runs on), the id and
        // where it sits in the flattened ids.
        let table = on.zeros([5, 2], DType::F32).expect("alloc");
        let e = assert_err!(
            table.embedding(&i64s(on, &[0, 4, 1, 5], &[2, 2])),
            Error::IndexOutOfRange { op: "embedding", index: 5, position: 3, size: 5 }
        );
        assert!(e.to_string().starts_with("embedding"), "{e}");
        assert_err!(
            table.embedding(&i64s(on, &[-2, 0], &[2])),
            Error::IndexOutOfRange { op: "embedding", index: -2, position: 0, size: 5 }
        );
        assert_err!(
            table.embedding(&f32s(on, &[0.0], &[1])),
            Error::UnsupportedDType { op: "embedding", dtype: DType::F32, .. }
        );
        // gather and scatter_add.
        assert_err!(
            x.gather(1, &i64s(on, &[0, 1, 2, 0, 7, 1], &[2, 3])),
            Error::IndexOutOfRange { op: "gather", index: 7, position: 4, size: 3 }
        );
        assert_err!(
            x.gather(0, &i64s(on, &[0, 1, 2], &[1, 3])),
            Error::IndexOutOfRange { op: "gather", index: 2, position: 2, size: 2 }
        );
        assert_err!(
            on.zeros([2, 3], DType::F32).expect("alloc").scatter_add(
                1,
                &i64s(on, &[0, -5], &[1, 2]),
                &on.ones([1, 2], DType::F32).expect("alloc")
            ),
            Error::IndexOutOfRange { op: "scatter_add", index: -5, position: 1, size: 3 }
        );
        // narrow past the end.
        assert_err!(x.narrow(1, 2, 2), Error::IndexOutOfRange { op: "narrow", index: 4, size: 3, .. });
        assert_err!(x.narrow(0, 3, 0), Error::IndexOutOfRange { op: "narrow", size: 2, .. });
        assert_err!(x.narrow(0, usize::MAX, 2), Error::IndexOutOfRange { op: "narrow", .. });
    }
}

// ----- labels ----------------------------------------------------------------------

test_device! {
    /// Both cross-entropies check their labels and shapes alike on every
    /// device: the lowest bad row with its value, the labels' dtype, the
    /// shapes, the options.
    fn cross_entropy_labels_and_shapes_are_checked(device: Device) {
        let on = On(device);
        let _g = lock();
        let x = m23(on);
        let ce = |labels: &Tensor| x.sparse_cross_entropy(labels);
        assert_err!(
            ce(&i64s(on, &[0, 5], &[2])),
            Error::LabelOutOfRange { op: "sparse_cross_entropy", label: 5, row: 1, classes: 3 }
        );
        // Below zero (and not the ignored -100) is out of range too; the
        // lowest bad row is named, in int32 labels as in int64.
        let l32 = on.vec(vec![-2i32, 7], [2]).expect("labels");
        assert_err!(ce(&l32), Error::LabelOutOfRange { op: "sparse_cross_entropy", label: -2, row: 0, classes: 3 });
        assert!(ce(&i64s(on, &[-100, 2], &[2])).is_ok(), "the ignored label");
        assert_err!(
            ce(&f32s(on, &[0.0, 1.0], &[2])),
            Error::UnsupportedDType { op: "sparse_cross_entropy", dtype: DType::F32, .. }
        );
        assert_err!(ce(&i64s(on, &[0, 1, 2], &[3])), Error::ShapeMismatch { op: "sparse_cross_entropy", .. });
        assert_err!(
            on.scalar(1.0).sparse_cross_entropy(&i64s(on, &[0], &[])),
            Error::InvalidShape { op: "sparse_cross_entropy", .. }
        );
        let smooth = CrossEntropyOptions { label_smoothing: 1.5, ..Default::default() };
        assert_err!(
            x.sparse_cross_entropy_with(&i64s(on, &[0, 1], &[2]), smooth),
            Error::InvalidArgument { op: "sparse_cross_entropy", .. }
        );
        // The fused head: [2, 3] rows against a [4, 3] weight.
        let w = on.ones([4, 3], DType::F32).expect("alloc");
        let head = |w: &Tensor, labels: &Tensor, chunk| x.linear_cross_entropy(w, None, labels, Default::default(), chunk);
        let good = i64s(on, &[3, 0], &[2]);
        assert!(head(&w, &good, None).is_ok());
        assert_err!(
            head(&w, &i64s(on, &[1, 4], &[2]), None),
            Error::LabelOutOfRange { op: "linear_cross_entropy", label: 4, row: 1, classes: 4 }
        );
        assert_err!(
            head(&on.ones([4, 2], DType::F32).expect("alloc"), &good, None),
            Error::ShapeMismatch { op: "linear_cross_entropy", .. }
        );
        assert_err!(head(&w, &i64s(on, &[0], &[1]), None), Error::ShapeMismatch { op: "linear_cross_entropy", .. });
        assert_err!(
            head(&on.ones([4, 3], DType::F64).expect("alloc"), &good, None),
            Error::DTypeMismatch { op: "linear_cross_entropy", lhs: DType::F32, rhs: DType::F64 }
        );
        assert_err!(head(&w, &good, Some(0)), Error::InvalidArgument { op: "linear_cross_entropy", .. });
    }
}

// ----- element counts and arguments ------------------------------------------------

// Host only: from_vec and from_slice make host tensors.
#[test]
fn element_count_errors() {
    let _g = lock();
    let e = assert_err!(
        Tensor::from_vec(vec![0.0f32; 5], [2, 3]),
        Error::ElementCount { shape: s, expected: 6, got: 5, .. } if *s == Box::new(shape(&[2, 3]))
    );
    assert!(e.to_string().contains('5') && e.to_string().contains('6'));
    assert_err!(Tensor::from_slice(&[1i64, 2], ()), Error::ElementCount { expected: 1, got: 2, .. });
    assert_err!(Tensor::from_vec(Vec::<f64>::new(), [1]), Error::ElementCount { expected: 1, got: 0, .. });
}

test_device! {
    fn invalid_arguments(device: Device) {
        let on = On(device);
        let _g = lock();
        let x = m23(on);
        let e = assert_err!(x.clamp(1.0, 0.0), Error::InvalidArgument { op: "clamp", .. });
        assert!(e.to_string().contains("clamp"));
        assert_err!(x.clamp(f64::NAN, 1.0), Error::InvalidArgument { op: "clamp", .. });
        assert_err!(x.clamp(0.0, f64::NAN), Error::InvalidArgument { op: "clamp", .. });
        // lo == hi is fine.
        assert!(x.clamp(2.0, 2.0).is_ok());
        assert_err!(on.arange(0.0, 1.0, 0.0, DType::F32), Error::InvalidArgument { op: "arange", .. });
        assert_err!(on.arange(0.0, f64::INFINITY, 1.0, DType::F32), Error::InvalidArgument { op: "arange", .. });
        assert_err!(on.arange(f64::NAN, 1.0, 1.0, DType::F32), Error::InvalidArgument { op: "arange", .. });
        assert_err!(on.arange(0.0, 1.0, f64::NAN, DType::F32), Error::InvalidArgument { op: "arange", .. });
        assert_err!(Tensor::concat(&[], 0), Error::InvalidArgument { op: "concat", .. });
        assert_err!(Tensor::stack(&[], 0), Error::InvalidArgument { op: "stack", .. });
    }

    fn invalid_shapes(device: Device) {
        let on = On(device);
        let _g = lock();
        let x = m23(on);
        let e = assert_err!(
            x.item(),
            Error::InvalidShape { op: "item", shape: s, .. } if *s == Box::new(shape(&[2, 3]))
        );
        assert!(e.to_string().contains("item"));
        assert_err!(x.item_f32(), Error::InvalidShape { op: "item", .. });
        assert_err!(on.zeros([0], DType::F32).expect("alloc").item(), Error::InvalidShape { op: "item", .. });
        // max/min/argmax over an empty axis have no answer.
        let e0 = on.zeros([2, 0], DType::F32).expect("alloc");
        assert_err!(e0.max(&[1], false), Error::InvalidShape { op: "max", .. });
        assert_err!(e0.min(&[], false), Error::InvalidShape { op: "min", .. });
        assert_err!(e0.argmax(1, false), Error::InvalidShape { op: "argmax", .. });
        assert_err!(e0.argmin(1, false), Error::InvalidShape { op: "argmin", .. });
    }

    fn errors_display_the_op(device: Device) {
        let on = On(device);
        let _g = lock();
        // Every variant's message starts with (or names) the op, so a log line is
        // enough to find the call.
        let x = m23(on);
        let errs = [
            x.add(&on.zeros([4], DType::F32).expect("alloc")).unwrap_err(),
            x.matmul(&on.zeros([3, 2], DType::F64).expect("alloc")).unwrap_err(),
            x.sum(&[7], false).unwrap_err(),
            x.index_select(0, &i64s(on, &[9], &[1])).unwrap_err(),
            x.clamp(1.0, 0.0).unwrap_err(),
            x.item().unwrap_err(),
            on.vec(vec![1.0f32], [2]).unwrap_err(),
            on.vec(vec![1i32], [1]).and_then(|t| t.exp()).unwrap_err(),
        ];
        let ops = ["add", "matmul", "sum", "index_select", "clamp", "item", "from_vec", "exp"];
        for (e, op) in errs.iter().zip(ops) {
            assert!(e.to_string().starts_with(op), "{e}");
        }
    }

    fn degenerate_inputs_do_not_panic(device: Device) {
        let on = On(device);
        let _g = lock();
        // Empty tensors through every op family: results or errors, no panics.
        let e = on.zeros([0, 3], DType::F32).expect("alloc");
        let _ = e.exp().expect("exp of empty");
        let _ = e.add(&on.zeros([3], DType::F32).expect("alloc")).expect("add of empty");
        let _ = e.softmax(0).expect("softmax over an empty axis");
        let _ = e.softmax(1).expect("softmax of no rows");
        let _ = e.log_softmax(1).expect("log_softmax of no rows");
        let _ = e.t().and_then(|t| t.matmul(&e)).expect("[3, 0] @ [0, 3]");
        let _ = e.matmul(&on.zeros([3, 2], DType::F32).expect("alloc")).expect("[0, 3] @ [3, 2]");
        let _ = e.sum(&[0], false).expect("sum over an empty axis");
        let _ = e.argmax(1, false).expect("argmax of no rows");
        let _ = e.index_select(1, &i64s(on, &[2, 0], &[2])).expect("select from no rows");
        let _ = e.gather(0, &on.zeros([0, 3], DType::I64).expect("alloc")).expect("gather of nothing");
        let _ = Tensor::concat(&[&e, &e], 0).expect("concat of empties");
        let _ = e.reshape([3, 0]).expect("reshape of empty");
        let _ = e.narrow(1, 1, 2).expect("narrow of empty");
        let _ = e.cast(DType::F16).expect("cast of empty");
        assert!(e.clamp(1.0, 0.0).is_err());
        // Scalars.
        let s = on.scalar(2.0);
        let _ = s.sum(&[], false).expect("sum of a scalar");
        let _ = s.reshape([1, 1]).expect("scalar to [1, 1]");
        assert!(s.t().is_err());
        assert!(s.argmax(0, false).is_err());
        assert!(s.narrow(0, 0, 1).is_err());
        assert!(s.squeeze(0).is_err());
        let _ = s.unsqueeze(0).expect("unsqueeze a scalar");
    }
}

// ----- absurd sizes ----------------------------------------------------------------

/// Elements of f32 that no system can provide: 2^48 bytes, past the 47-bit
/// user address space of x86-64 and aarch64, so the allocation fails under
/// any overcommit policy. It fits usize and `isize::MAX` bytes, so it is an
/// out-of-memory error, not an overflow.
const HUGE: usize = 1 << 46;

/// Asserts that `$e` fails with `$p` and that it left every memory counter
/// (live, peak, reserved, allocation counts) as it found it.
macro_rules! assert_err_untouched {
    ($device:expr, $e:expr, $p:pat $(if $guard:expr)?) => {{
        let before = memory_stats($device);
        let err = assert_err!($e, $p $(if $guard)?);
        assert_eq!(memory_stats($device), before, "{err}");
        err
    }};
}

test_device! {
    fn overflowing_sizes_are_invalid_shapes(device: Device) {
        let on = On(device);
        let _g = lock();
        let over = [usize::MAX / 2, 3]; // the element count overflows usize
        let bytes_over = [1usize << 62]; // the elements fit, the bytes do not
        for dtype in [DType::F32, DType::F64, DType::F16, DType::I64] {
            assert_err_untouched!(device, on.zeros(over, dtype), Error::InvalidShape { op: "zeros", .. });
            assert_err_untouched!(device, on.ones(over, dtype), Error::InvalidShape { op: "ones", .. });
            assert_err_untouched!(device, on.full(over, 2.0, dtype), Error::InvalidShape { op: "full", .. });
            assert_err_untouched!(device, on.zeros(bytes_over, dtype), Error::InvalidShape { op: "zeros", .. });
            assert_err_untouched!(device, on.full(bytes_over, 2.0, dtype), Error::InvalidShape { op: "full", .. });
            assert_err_untouched!(device, on.eye(1 << 32, dtype), Error::InvalidShape { op: "eye", .. });
            assert_err_untouched!(device, on.eye(1 << 31, dtype), Error::InvalidShape { op: "eye", .. });
            let mut rng = Rng::new(0);
            assert_err_untouched!(device, rng.rand_on(over, dtype, device), Error::InvalidShape { op: "uniform", .. });
            assert_err_untouched!(device, rng.randn_on(bytes_over, dtype, device), Error::InvalidShape { op: "normal", .. });
            assert_err_untouched!(device, rng.randint_on(over, 10, dtype, device), Error::InvalidShape { op: "randint", .. });
            // An overflowing shape, even with an empty dim, has no strides.
            assert_err_untouched!(device, on.zeros([0, usize::MAX / 2, 4], dtype), Error::InvalidShape { op: "zeros", .. });
        }
        // No number was drawn for the failed calls: the stream is where it was.
        let mut a = Rng::new(7);
        let _ = a.randn_on(over, DType::F32, device);
        assert_eq!(a.next_u64(), Rng::new(7).next_u64());
        // arange: 1e19 elements fit usize but not the address space; 1e30 do
        // not fit usize (and must not saturate to usize::MAX silently).
        assert_err_untouched!(device, on.arange(0.0, 1e19, 1.0, DType::F32), Error::InvalidShape { op: "arange", .. });
        assert_err_untouched!(device, on.arange(0.0, 1e30, 1.0, DType::F64), Error::InvalidShape { op: "arange", .. });
        assert_err_untouched!(device, on.arange(1e30, 0.0, -1e-3, DType::I32), Error::InvalidShape { op: "arange", .. });
        // from_vec with an overflowing shape.
        assert_err_untouched!(device, on.vec(Vec::<f32>::new(), [0, usize::MAX, 2]), Error::InvalidShape { .. });
    }

    fn shape_ops_reject_overflowing_shapes(device: Device) {
        let on = On(device);
        let _g = lock();
        let x = m23(on);
        let empty = on.zeros([0], DType::F32).expect("alloc");
        let one = on.ones([1], DType::F32).expect("alloc");
        // reshape: a count that cannot match, and an empty tensor to a shape
        // whose strides overflow.
        assert_err_untouched!(device, x.reshape([usize::MAX, 2]), Error::ShapeMismatch { op: "reshape", .. });
        assert_err_untouched!(device, x.reshape([1 << 40, 1 << 40]), Error::ShapeMismatch { op: "reshape", .. });
        assert_err_untouched!(device, empty.reshape([0, 1 << 40, 1 << 40]), Error::InvalidShape { op: "reshape", .. });
        // broadcast_to / expand: views, but of a size no tensor can have.
        assert_err_untouched!(device, one.broadcast_to([1 << 40, 1 << 40]), Error::InvalidShape { op: "broadcast_to", .. });
        assert_err_untouched!(device, one.expand([1 << 62]), Error::InvalidShape { op: "broadcast_to", .. });
        assert_err_untouched!(device, x.expand([usize::MAX, 2, 3]), Error::InvalidShape { op: "broadcast_to", .. });
        // Broadcasting two views whose joint shape overflows.
        let col = one.expand([1 << 40, 1]).expect("a view");
        let row = one.expand([1, 1 << 40]).expect("a view");
        assert_err_untouched!(device, col.add(&row), Error::InvalidShape { op: "add", .. });
        assert_err_untouched!(device, col.mul(&row), Error::InvalidShape { op: "mul", .. });
        // matmul of two views whose product is too large.
        let tall = one.reshape([1, 1]).and_then(|t| t.expand([1 << 32, 1])).expect("a view");
        let wide = one.reshape([1, 1]).and_then(|t| t.expand([1, 1 << 32])).expect("a view");
        assert_err_untouched!(device, tall.matmul(&wide), Error::InvalidShape { op: "matmul", .. });
        // concat / stack whose joined size overflows.
        let h = on.ones([1], DType::F16).expect("alloc").expand([1usize << 61]).expect("a view");
        assert_err_untouched!(device, Tensor::concat(&[&h, &h], 0), Error::InvalidShape { op: "concat", .. });
        assert_err_untouched!(device, Tensor::stack(&[&h, &h], 0), Error::InvalidShape { op: "concat", .. });
        let e = on.zeros([0], DType::F32).expect("alloc").reshape([0, 1]).expect("reshape");
        let wide0 = e.expand([0, usize::MAX / 2]).expect("an empty view");
        assert_err_untouched!(device, Tensor::concat(&[&wide0, &wide0, &wide0], 1), Error::InvalidShape { op: "concat", .. });
        // pad (the transpose of narrow): a start or size past usize.
        use tapir_tensor::ops::shape::Pad;
        assert_err_untouched!(device,
            Tensor::apply(Pad { axis: 1, start: usize::MAX, size: 4 }, &[&x]),
            Error::InvalidArgument { op: "pad", .. }
        );
        assert_err_untouched!(device,
            Tensor::apply(Pad { axis: 1, start: 0, size: usize::MAX }, &[&x]),
            Error::InvalidShape { op: "pad", .. }
        );
    }
}

// Host only: the host allocator's failure counts nothing; the CUDA
// allocator's (the cache emptied and the call retried, then counted as
// torch counts it) is tested in cuda_memory.rs.
#[test]
fn unallocatable_sizes_are_out_of_memory_and_count_nothing() {
    let _g = lock();
    let oom = |e: &Error, bytes: usize| matches!(e, Error::OutOfMemory { device: Device::Cpu, requested, .. } if *requested == bytes);
    let e = assert_err_untouched!(Device::Cpu, Tensor::zeros([HUGE], DType::F32), Error::OutOfMemory { .. });
    assert!(oom(&e, HUGE * 4), "{e}");
    assert!(e.to_string().contains(&(HUGE * 4).to_string()), "{e}");
    // Sizes in the message read in binary units as well as exact bytes.
    let msg = e.to_string();
    assert!(msg.contains(&format!("requested {} ({} bytes)", format_bytes((HUGE * 4) as f64), HUGE * 4)), "{msg}");
    assert!(msg.contains("; allocated ") && msg.contains(" B") && !msg.contains(" B B"), "{msg}");
    let e = assert_err_untouched!(Device::Cpu, Tensor::ones([HUGE / 2, 2], DType::F64), Error::OutOfMemory { .. });
    assert!(oom(&e, HUGE * 8), "{e}");
    assert_err_untouched!(Device::Cpu, Tensor::full([HUGE], 3.0, DType::I32), Error::OutOfMemory { .. });
    assert_err_untouched!(Device::Cpu, Tensor::zeros([HUGE * 2], DType::BF16), Error::OutOfMemory { .. });
    assert_err_untouched!(Device::Cpu, Tensor::eye(1 << 23, DType::F32), Error::OutOfMemory { .. });
    assert_err_untouched!(Device::Cpu, Tensor::arange(0.0, HUGE as f64, 1.0, DType::F32), Error::OutOfMemory { .. });
    let mut rng = Rng::new(0);
    assert_err_untouched!(Device::Cpu, rng.rand([HUGE], DType::F32), Error::OutOfMemory { .. });
    assert_err_untouched!(Device::Cpu, rng.randn([HUGE], DType::F32), Error::OutOfMemory { .. });
    // A broadcast view of that size is fine (it is a view) until an op has
    // to materialise it.
    let one = Tensor::ones([1], DType::F32).expect("alloc");
    let v = one.expand([HUGE]).expect("a view");
    assert_err_untouched!(Device::Cpu, v.contiguous(), Error::OutOfMemory { .. });
    assert_err_untouched!(Device::Cpu, v.exp(), Error::OutOfMemory { .. });
    assert_err_untouched!(Device::Cpu, v.add(&one), Error::OutOfMemory { .. });
    assert_err_untouched!(Device::Cpu, v.cast(DType::F64), Error::OutOfMemory { .. });
    assert_err_untouched!(Device::Cpu, v.softmax(0), Error::OutOfMemory { .. });
    assert_err_untouched!(
        Device::Cpu,
        v.reshape([HUGE / 4, 4]).and_then(|r| r.max(&[1], false)),
        Error::OutOfMemory { .. }
    );
    assert_err_untouched!(Device::Cpu, v.zeros_like(), Error::OutOfMemory { .. });
}

// No tensor, no device: the error type's size.
#[test]
fn errors_are_small_enough_for_clippys_result_large_err() {
    // clippy's result_large_err fires at 128 bytes; the shape and
    // statistics payloads are boxed so users' own `Result<_, Error>`
    // functions stay well under it.
    let size = std::mem::size_of::<Error>();
    assert!(size <= 64, "Error is {size} bytes");
    let r = std::mem::size_of::<Result<()>>();
    assert!(r <= 64, "Result<()> is {r} bytes");
}
