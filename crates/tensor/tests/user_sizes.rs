//! Sizes a user chooses are added and multiplied with checks: in a debug
//! build (this suite's default, overflow checks on) an overflow would be a
//! panic, in a release build a wrong answer. Each case is an error naming
//! the op and the value the user gave.

use tapir_tensor::prelude::*;
use tapir_tensor::Layout;

fn m23() -> Tensor {
    Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], [2, 3]).expect("test tensor")
}

#[test]
fn narrow_past_the_end_names_the_index_the_user_gave() {
    let x = m23();
    let e = x.narrow(0, i64::MAX as usize, 1).expect_err("start past the end");
    assert_eq!(e, Error::IndexOutOfRange { op: "narrow", index: i64::MAX, position: 0, size: 2 });
    let e = x.narrow(0, usize::MAX, 1).expect_err("start past the end");
    assert_eq!(e, Error::IndexOutOfRange { op: "narrow", index: i64::MAX, position: 0, size: 2 });
    let e = x.narrow(1, 2, usize::MAX).expect_err("length past the end");
    assert_eq!(e, Error::IndexOutOfRange { op: "narrow", index: i64::MAX, position: 1, size: 3 });
    let e = x.narrow(1, 2, 5).expect_err("end past the end");
    assert_eq!(e, Error::IndexOutOfRange { op: "narrow", index: 7, position: 1, size: 3 });
    let e = x.narrow(1, 5, 0).expect_err("empty, but starting past the end");
    assert_eq!(e, Error::IndexOutOfRange { op: "narrow", index: 5, position: 1, size: 3 });
    assert_eq!(x.narrow(1, 3, 0).expect("empty at the end").dims(), [2, 0]);
}

#[test]
fn reducing_an_empty_axis_into_too_many_elements_is_an_invalid_shape() {
    let x = Tensor::zeros([0, usize::MAX], DType::F32).expect("no elements");
    for r in [x.sum(&[0], false), x.mean(&[0], true), x.logsumexp(&[0], false)] {
        match r {
            Err(Error::InvalidShape { shape, .. }) => assert!(shape.dims().contains(&usize::MAX), "{shape}"),
            other => panic!("expected InvalidShape, got {other:?}"),
        }
    }
    // Reductions that leave nothing, or one element, are fine.
    assert_eq!(x.sum(&[1], false).expect("empty result").dims(), [0]);
    assert_eq!(x.sum_all().expect("0-d").item().expect("one element"), 0.0);
}

#[test]
fn strides_of_shapes_that_overflow_do_not_panic() {
    let huge = Shape::from([usize::MAX, 2, 3]);
    assert!(huge.check("test", DType::F32).is_err());
    let l = Layout::contiguous(huge.clone());
    assert_eq!(l.strides.as_slice(), [6, 3, 1]);
    let wide = Layout::contiguous(Shape::from([3, usize::MAX, 2]));
    assert_eq!(wide.strides[0], usize::MAX, "saturated, not wrapped");
    let _ = wide.is_contiguous();
    assert_eq!(l.view_strides(&Shape::from([usize::MAX, 6])), None, "6 * (2^64 - 1) elements do not fit");
}
