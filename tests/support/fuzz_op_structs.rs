//! The public op structs, built with arbitrary fields and run through
//! `Diff::apply` on any number of inputs, eagerly and recorded (then
//! differentiated), shared by the cargo-fuzz target
//! `fuzz/fuzz_targets/op_structs.rs` and `tests/fuzz_ops.rs`. Nothing may
//! panic, and every byte must be freed afterwards.

#![allow(dead_code)]

use arbitrary::{Arbitrary, Unstructured};
use tapir::nn::{Affine, CausalAttention, CausalSoftmax, NormOp};
use tapir::prelude::*;
use tapir::tensor::ops::binary::{Binary, Cmp, Compare, Where};
use tapir::tensor::ops::index::{Gather, IndexAdd, IndexSelect, ScatterAdd};
use tapir::tensor::ops::matmul::Matmul;
use tapir::tensor::ops::reduce::{ArgReduce, Reduce, ReduceKind, SumTo};
use tapir::tensor::ops::shape::{BroadcastTo, Cast, Concat, Contiguous, Narrow, Pad, Permute, Reshape};
use tapir::tensor::ops::softmax::Softmax;
use tapir::tensor::ops::unary::{TanhBackward, Unary};

use super::fuzz_program::{make_leaf, Leaf};

/// A size a user could give: small, or (rarely) enormous.
#[derive(Debug, Clone, Copy)]
pub struct Size(pub usize);

impl<'a> Arbitrary<'a> for Size {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let b: u8 = u.arbitrary()?;
        Ok(Size(match b {
            255 => usize::MAX,
            254 => usize::MAX / 2 + 1,
            253 => i64::MAX as usize,
            b => (b % 8) as usize,
        }))
    }
}

fn sizes(v: &[Size]) -> Vec<usize> {
    v.iter().take(6).map(|s| s.0).collect()
}

/// An op and its fields.
#[derive(Debug, Clone, Arbitrary)]
pub enum OpStruct {
    Unary(u8, f64, f64),
    TanhBackward,
    Binary(u8),
    Compare(u8, Option<f64>),
    Where(u64, Vec<Size>),
    Reduce(u8, Vec<Size>, bool),
    ArgReduce(Size, bool, bool),
    SumTo(Vec<Size>),
    Reshape(Vec<Size>),
    Permute(Vec<Size>),
    Narrow(Size, Size, Size),
    Pad(Size, Size, Size),
    BroadcastTo(Vec<Size>),
    Contiguous,
    Concat(Size),
    Cast(u8),
    Matmul,
    Softmax(Size, bool),
    IndexSelect(Size, Vec<i8>, Vec<Size>),
    IndexAdd(Size, Vec<i8>, Size),
    Gather(Size, Vec<i8>, Vec<Size>),
    ScatterAdd(Size, Vec<i8>, Vec<Size>),
    Affine(bool, bool, bool, bool),
    Norm(f64, bool, bool, bool),
    CausalAttention(Size, f64),
    CausalSoftmax(f64),
}

/// An index tensor from the case's values; its dims are capped (an index
/// tensor too large to make is not what this target is after).
fn idx(v: &[i8], dims: Vec<usize>) -> Result<Tensor> {
    let dims: Vec<usize> = dims.into_iter().map(|d| d.min(8)).collect();
    let n: usize = dims.iter().product();
    let vals: Vec<i64> = (0..n).map(|i| v.get(i).map_or(0, |&x| x as i64)).collect();
    Tensor::from_vec(vals, dims)
}

/// A case: the op, its inputs.
#[derive(Debug, Clone, Arbitrary)]
pub struct Case {
    pub op: OpStruct,
    pub inputs: Vec<Leaf>,
}

/// Applies the op to `xs` in `T`'s context.
pub fn apply<T: Diff>(op: &OpStruct, xs: &[&T]) -> Result<T> {
    match op {
        OpStruct::Unary(k, a, b) => {
            // Every function of the family's list, its parameters drawn.
            let u = match Unary::ALL[*k as usize % Unary::ALL.len()] {
                Unary::Powf(_) => Unary::Powf(*a),
                Unary::AddScalar(_) => Unary::AddScalar(*a),
                Unary::MulScalar(_) => Unary::MulScalar(*a),
                Unary::Clamp(..) => Unary::Clamp(*a, *b),
                u => u,
            };
            T::apply(u, xs)
        }
        OpStruct::TanhBackward => T::apply(TanhBackward, xs),
        OpStruct::Binary(k) => {
            let b = Binary::ALL[*k as usize % Binary::ALL.len()];
            T::apply(b, xs)
        }
        OpStruct::Compare(k, scalar) => {
            let cmp = Cmp::ALL[*k as usize % Cmp::ALL.len()];
            T::apply(Compare { cmp, scalar: *scalar }, xs)
        }
        OpStruct::Where(seed, dims) => {
            let mask =
                Rng::new(*seed).rand(sizes(dims).iter().map(|d| d.min(&4)).copied().collect::<Vec<_>>(), DType::F32)?;
            T::apply(Where { mask }, xs)
        }
        OpStruct::Reduce(k, axes, keepdim) => {
            let kind = ReduceKind::ALL[*k as usize % ReduceKind::ALL.len()].clone();
            T::apply(Reduce { kind, axes: sizes(axes).into_iter().collect(), keepdim: *keepdim }, xs)
        }
        OpStruct::ArgReduce(axis, keepdim, min) => {
            T::apply(ArgReduce { axis: axis.0, keepdim: *keepdim, min: *min }, xs)
        }
        OpStruct::SumTo(d) => T::apply(SumTo { shape: sizes(d).into() }, xs),
        OpStruct::Reshape(d) => T::apply(Reshape(sizes(d).into()), xs),
        OpStruct::Permute(d) => T::apply(Permute(sizes(d).into_iter().collect()), xs),
        OpStruct::Narrow(a, s, l) => T::apply(Narrow { axis: a.0, start: s.0, len: l.0 }, xs),
        OpStruct::Pad(a, s, n) => T::apply(Pad { axis: a.0, start: s.0, size: n.0 }, xs),
        OpStruct::BroadcastTo(d) => T::apply(BroadcastTo(sizes(d).into()), xs),
        OpStruct::Contiguous => T::apply(Contiguous, xs),
        OpStruct::Concat(a) => T::apply(Concat { axis: a.0 }, xs),
        OpStruct::Cast(d) => T::apply(
            Cast([DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64][*d as usize % 6]),
            xs,
        ),
        OpStruct::Matmul => T::apply(Matmul, xs),
        OpStruct::Softmax(a, log) => T::apply(Softmax { axis: a.0, log: *log }, xs),
        OpStruct::IndexSelect(a, v, d) => T::apply(IndexSelect { axis: a.0, idx: idx(v, sizes(d))? }, xs),
        OpStruct::IndexAdd(a, v, size) => {
            T::apply(IndexAdd { axis: a.0, idx: idx(v, vec![v.len()])?, size: size.0 }, xs)
        }
        OpStruct::Gather(a, v, d) => T::apply(Gather { axis: a.0, idx: idx(v, sizes(d))? }, xs),
        OpStruct::ScatterAdd(a, v, d) => T::apply(ScatterAdd { axis: a.0, idx: idx(v, sizes(d))? }, xs),
        OpStruct::Affine(input_grad, bias, residual, tanh) => {
            let op = Affine { input_grad: *input_grad, bias: *bias, residual: *residual, tanh: *tanh };
            T::apply(op, xs)
        }
        OpStruct::Norm(eps, rms, has_weight, has_bias) => {
            T::apply(NormOp { eps: *eps, rms: *rms, has_weight: *has_weight, has_bias: *has_bias, out: None }, xs)
        }
        OpStruct::CausalAttention(heads, scale) => T::apply(CausalAttention { heads: heads.0, scale: *scale }, xs),
        OpStruct::CausalSoftmax(scale) => T::apply(CausalSoftmax { scale: *scale }, xs),
    }
}

/// Runs a case every way; panics on a panic or a leak.
pub fn check(c: &Case) {
    let baseline = memory_allocated(Device::Cpu);
    check_inner(c);
    assert_eq!(memory_allocated(Device::Cpu), baseline, "memory not back at its baseline after {c:#?}");
}

fn check_inner(c: &Case) {
    let Ok(inputs) = c.inputs.iter().take(4).map(make_leaf).collect::<Result<Vec<Tensor>>>() else { return };
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let eager = apply(&c.op, &refs);
    let _ = Graph::scope(|g| {
        let vars: Vec<Var<'_>> = inputs
            .iter()
            .map(|t| if t.dtype().is_float() { g.leaf(t.clone()) } else { g.constant(t.clone()) })
            .collect();
        let vrefs: Vec<&Var<'_>> = vars.iter().collect();
        let recorded = apply(&c.op, &vrefs);
        assert_eq!(recorded.is_ok(), eager.is_ok(), "eager {eager:?} vs recorded {recorded:?}");
        if let Ok(y) = recorded {
            if y.dtype().is_float() && y.requires_grad() {
                let xs: Vec<Var<'_>> = vars.iter().copied().filter(|v| v.requires_grad()).collect();
                let f = y.sum_all()?;
                let _ = g.grad_with(&[f], &xs, GradOptions { grad_outputs: None, retain_graph: true })?;
                let _ = g.grad_graph(f, &xs)?;
            }
        }
        Ok::<_, Error>(())
    });
}
