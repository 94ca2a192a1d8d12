//! The public op structs run through `Diff::apply` directly, with input
//! counts and fields no method would make: each is an error naming the op,
//! never an out-of-bounds index. The cases are the ones a pass of bad input
//! through the public API found panicking.

use smallvec::smallvec;
use tapir_tensor::ops::binary::{Binary, Cmp, Compare, Where};
use tapir_tensor::ops::index::{Gather, IndexAdd, IndexSelect, ScatterAdd};
use tapir_tensor::ops::matmul::Matmul;
use tapir_tensor::ops::reduce::{ArgReduce, Reduce, ReduceKind};
use tapir_tensor::ops::shape::{Concat, Narrow};
use tapir_tensor::ops::softmax::Softmax;
use tapir_tensor::ops::unary::{TanhBackward, Unary};
use tapir_tensor::prelude::*;
use tapir_tensor::Arity;

fn m23() -> Tensor {
    Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], [2, 3]).expect("test tensor")
}

fn idx(v: &[i64], dims: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), dims.to_vec()).expect("index tensor")
}

/// Asserts an `InvalidArgument` from `op` saying how many inputs it takes.
fn assert_arity(r: Result<Tensor>, want_op: &str, want: &str) {
    match r {
        Err(Error::InvalidArgument { op, reason }) => {
            assert_eq!(op, want_op);
            assert!(reason.contains(want), "{op}: {reason}");
        }
        other => panic!("{want_op}: expected an arity error, got {other:?}"),
    }
}

fn assert_axis(r: Result<Tensor>, want_op: &str, want_axis: isize, want_rank: usize) {
    match r {
        Err(Error::AxisOutOfRange { op, axis, rank }) => {
            assert_eq!((op, axis, rank), (want_op, want_axis, want_rank));
        }
        other => panic!("{want_op}: expected AxisOutOfRange, got {other:?}"),
    }
}

#[test]
fn too_few_or_too_many_inputs_are_arity_errors() {
    let x = m23();
    assert_arity(Tensor::apply(Unary::Exp, &[]), "exp", "takes 1 inputs, got 0");
    assert_arity(Tensor::apply(Unary::Exp, &[&x, &x]), "exp", "takes 1 inputs, got 2");
    assert_arity(Tensor::apply(Matmul, &[&x]), "matmul", "takes 2 inputs, got 1");
    assert_arity(Tensor::apply(Binary::Add, &[&x]), "add", "takes 2 inputs, got 1");
    assert_arity(Tensor::apply(TanhBackward, &[&x]), "tanh_backward", "got 1");
    assert_arity(Tensor::apply(Concat { axis: 0 }, &[]), "concat", "at least 1 inputs, got 0");
    assert_arity(Tensor::apply(Compare { cmp: Cmp::Lt, scalar: None }, &[&x]), "lt", "takes 2 inputs");
    assert_arity(Tensor::apply(Where { mask: x.clone() }, &[&x]), "where", "takes 2 inputs");
    assert_arity(Tensor::apply(ScatterAdd { axis: 0, idx: idx(&[0], &[1, 1]) }, &[&x]), "scatter_add", "got 1");
    // With a scalar, a comparison takes one input and rejects a second.
    let lt = Compare { cmp: Cmp::Lt, scalar: Some(2.0) };
    assert_eq!(Tensor::apply(lt, &[&x]).expect("x < 2").to_vec::<f32>().expect("f32"), [1., 0., 0., 0., 0., 0.]);
    assert_arity(Tensor::apply(lt, &[&x, &x]), "lt", "takes 1 inputs, got 2");
}

#[test]
fn arity_describes_ranges() {
    assert_eq!(Arity::exactly(2).check("op", 2), Ok(()));
    assert!(Arity::between(2, 3).check("op", 3).is_ok());
    let e = Arity::between(2, 3).check("op", 4).expect_err("4 > 3");
    assert_eq!(e, Error::invalid_arg("op", "takes 2 to 3 inputs, got 4"));
    assert!(Arity::at_least(1).check("op", 1000).is_ok());
}

#[test]
fn axes_past_the_rank_are_axis_errors() {
    let x = m23();
    assert_axis(Tensor::apply(Narrow { axis: 2, start: 0, len: 1 }, &[&x]), "narrow", 2, 2);
    assert_axis(Tensor::apply(Concat { axis: 5 }, &[&x, &x]), "concat", 5, 2);
    assert_axis(Tensor::apply(IndexSelect { axis: 2, idx: idx(&[0], &[1]) }, &[&x]), "index_select", 2, 2);
    assert_axis(Tensor::apply(IndexAdd { axis: 3, idx: idx(&[0], &[1]), size: 2 }, &[&x]), "index_add", 3, 2);
    assert_axis(Tensor::apply(Gather { axis: 2, idx: idx(&[0; 6], &[2, 3]) }, &[&x]), "gather", 2, 2);
    let add = ScatterAdd { axis: 2, idx: idx(&[0; 6], &[2, 3]) };
    assert_axis(Tensor::apply(add, &[&x, &x]), "scatter_add", 2, 2);
    assert_axis(Tensor::apply(Softmax { axis: 2, log: false }, &[&x]), "softmax", 2, 2);
    assert_axis(Tensor::apply(Softmax { axis: 0, log: true }, &[&Tensor::scalar(1.0)]), "log_softmax", 0, 0);
    let sum = Reduce { kind: ReduceKind::Sum, axes: smallvec![0, 2], keepdim: false };
    assert_axis(Tensor::apply(sum, &[&x]), "sum", 2, 2);
    assert_axis(Tensor::apply(ArgReduce { axis: 2, keepdim: false, min: false }, &[&x]), "argmax", 2, 2);
    // An axis too large for isize is reported saturated, not wrapped.
    assert_axis(Tensor::apply(Narrow { axis: usize::MAX, start: 0, len: 1 }, &[&x]), "narrow", isize::MAX, 2);
}

#[test]
fn hand_built_fields_that_methods_never_make_are_errors() {
    let x = m23();
    // Unsorted or repeated reduction axes.
    let unsorted = Reduce { kind: ReduceKind::Max, axes: smallvec![1, 0], keepdim: false };
    assert!(matches!(Tensor::apply(unsorted, &[&x]), Err(Error::InvalidArgument { op: "max", .. })));
    let repeated = Reduce { kind: ReduceKind::Sum, axes: smallvec![1, 1], keepdim: true };
    assert!(matches!(Tensor::apply(repeated, &[&x]), Err(Error::InvalidArgument { op: "sum", .. })));
    // Indices of index_select and index_add must be 1-D.
    let two_d = IndexSelect { axis: 0, idx: idx(&[0, 1], &[1, 2]) };
    assert!(matches!(Tensor::apply(two_d, &[&x]), Err(Error::InvalidShape { op: "index_select", .. })));
    let two_d = IndexAdd { axis: 0, idx: idx(&[0, 1], &[2, 1]), size: 2 };
    assert!(matches!(Tensor::apply(two_d, &[&x]), Err(Error::InvalidShape { op: "index_add", .. })));
}

#[test]
fn index_add_past_the_first_outer_row_reads_its_own_slice() {
    // index_select's transpose along an inner axis, as its backward runs
    // it: each outer row of the gradient lands in its own output row.
    let g = Tensor::from_vec(vec![1f32, 2., 3., 4.], [2, 2]).expect("gradient");
    let op = IndexAdd { axis: 1, idx: idx(&[0, 2], &[2]), size: 3 };
    let out = Tensor::apply(op, &[&g]).expect("index_add along axis 1");
    assert_eq!(out.dims(), [2, 3]);
    assert_eq!(out.to_vec::<f32>().expect("f32"), [1., 0., 2., 3., 0., 4.]);
    // Repeated indices add up, row by row.
    let op = IndexAdd { axis: 1, idx: idx(&[1, 1], &[2]), size: 2 };
    assert_eq!(Tensor::apply(op, &[&g]).expect("repeated").to_vec::<f32>().expect("f32"), [0., 3., 0., 7.]);
}
