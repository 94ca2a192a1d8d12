//! A random program of tensor ops, shared by the cargo-fuzz target
//! `fuzz/fuzz_targets/ops.rs` and the proptest suite `tests/fuzz_ops.rs`:
//! the same structure, built by `arbitrary` from bytes, whoever picks them.
//!
//! A program makes a few leaves (random shapes up to rank 4, every dtype,
//! some of them strided views), then applies a list of steps, each to
//! earlier values picked by index. [`check`] runs it eagerly on tensors and
//! recorded on a graph, asserting that the two agree step by step (the same
//! errors, the same bits), then takes a reverse-mode gradient, a recorded
//! one, a forward-mode derivative and a Hessian-vector product of the last
//! float value, checking shapes and that forward and reverse mode agree,
//! and finally that every byte allocated is freed when the scope ends.
//! Any panic is a bug: bad input must come back as an `Error`.

#![allow(dead_code)]

use arbitrary::{Arbitrary, Unstructured};
use tapir::prelude::*;
use tapir::tensor::ops::binary::{Binary, Cmp, Compare};
use tapir::tensor::ops::unary::Unary;

/// One dimension: small, with zero and one over-represented.
fn dim(u: &mut Unstructured<'_>) -> arbitrary::Result<usize> {
    Ok(match u.int_in_range(0u8..=9)? {
        0 => 0,
        1 | 2 => 1,
        n => n as usize - 1,
    })
}

/// A leaf: its shape, dtype, values and how it is viewed.
#[derive(Debug, Clone)]
pub struct Leaf {
    pub dims: Vec<usize>,
    pub dtype: DType,
    pub seed: u64,
    /// 0: contiguous; 1: transposed; 2: narrowed; 3: broadcast; 4: permuted copy.
    pub view: u8,
    /// Values drawn from a wide range, with infinities and NaN, instead of
    /// [-2, 2].
    pub wild: bool,
}

impl<'a> Arbitrary<'a> for Leaf {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let rank = u.int_in_range(0u8..=4)? as usize;
        let dims = (0..rank).map(|_| dim(u)).collect::<arbitrary::Result<Vec<_>>>()?;
        let dtype = match u.int_in_range(0u8..=9)? {
            0..=3 => DType::F32,
            4..=6 => DType::F64,
            7 => DType::F16,
            8 => DType::BF16,
            _ => {
                if u.arbitrary()? {
                    DType::I32
                } else {
                    DType::I64
                }
            }
        };
        Ok(Leaf { dims, dtype, seed: u.arbitrary()?, view: u.int_in_range(0u8..=4)?, wild: u.ratio(1u8, 8)? })
    }
}

/// One step of a program. Operands are indices into the values made so far
/// (taken modulo their count).
#[derive(Debug, Clone, Arbitrary)]
pub enum Step {
    Unary(u8, u8),
    Scalar(u8, u8, i8),
    Binary(u8, u8, u8),
    Compare(u8, u8, u8),
    Where(u8, u8, u8),
    Reduce(u8, u8, u8, bool),
    ArgReduce(u8, i8, bool, bool),
    Softmax(u8, i8, bool),
    Reshape(u8, u8),
    Transpose(u8, i8, i8),
    Narrow(u8, i8, u8, u8),
    Concat(u8, u8, i8),
    Stack(u8, u8, i8),
    Unsqueeze(u8, i8),
    Squeeze(u8, i8),
    Broadcast(u8, u8),
    Matmul(u8, u8),
    Cast(u8, u8),
    Contiguous(u8),
    IndexSelect(u8, i8, u64),
    Gather(u8, i8, u64),
    ScatterAdd(u8, i8, u8, u64),
    SumTo(u8, u8),
    CrossEntropy(u8, u64, u8),
}

/// A whole program.
#[derive(Debug, Clone)]
pub struct Program {
    pub leaves: Vec<Leaf>,
    pub steps: Vec<Step>,
    /// Seed of the forward-mode tangents and the HVP direction.
    pub seed: u64,
}

impl<'a> Arbitrary<'a> for Program {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let n = u.int_in_range(1u8..=3)?;
        let leaves = (0..n).map(|_| Leaf::arbitrary(u)).collect::<arbitrary::Result<Vec<_>>>()?;
        let k = u.int_in_range(0u8..=10)?;
        let steps = (0..k).map(|_| Step::arbitrary(u)).collect::<arbitrary::Result<Vec<_>>>()?;
        Ok(Program { leaves, steps, seed: u.arbitrary()? })
    }
}

/// The leaf's tensor (made outside any graph).
pub fn make_leaf(l: &Leaf) -> Result<Tensor> {
    let mut rng = Rng::new(l.seed);
    let n: usize = l.dims.iter().product();
    let mut vals: Vec<f64> = (0..n)
        .map(|_| {
            if l.wild {
                match rng.below(8) {
                    0 => f64::INFINITY,
                    1 => f64::NEG_INFINITY,
                    2 => f64::NAN,
                    3 => 0.0,
                    _ => (rng.next_f64() - 0.5) * 2e4,
                }
            } else {
                (rng.next_f64() * 4.0 - 2.0) * if l.dtype.is_float() { 1.0 } else { 3.0 }
            }
        })
        .collect();
    if !l.dtype.is_float() {
        vals.iter_mut().for_each(|v| *v = if v.is_finite() { v.round().clamp(-3.0, 3.0) } else { 0.0 });
    }
    let base = Tensor::from_vec(vals, l.dims.clone())?.cast(l.dtype)?;
    let r = base.rank();
    Ok(match l.view {
        1 if r >= 2 => base.transpose(0, -1)?.contiguous()?.transpose(0, -1)?,
        2 if r >= 1 => {
            // A narrowed view of a larger buffer with the same dims.
            let mut big = l.dims.clone();
            big[0] += 2;
            let m: usize = big.iter().product();
            let wide = Tensor::from_vec((0..m).map(|i| i as f64 * 0.01).collect::<Vec<_>>(), big)?.cast(l.dtype)?;
            wide.narrow(0, 1, l.dims[0])?
        }
        3 if r >= 1 && l.dims[0] == 1 => {
            let mut to = l.dims.clone();
            to[0] = 3;
            base.broadcast_to(to)?
        }
        4 if r >= 2 => {
            let mut perm: Vec<usize> = (0..r).collect();
            perm.rotate_left(1);
            base.permute(&perm)?
        }
        _ => base,
    })
}

fn pick<T>(vals: &[T], i: u8) -> &T {
    &vals[i as usize % vals.len()]
}

fn index_tensor(seed: u64, len: usize, size: usize, dims: Vec<usize>) -> Result<Tensor> {
    let mut rng = Rng::new(seed);
    // Mostly in range; now and then out of it (an error to report).
    let v: Vec<i64> = (0..len)
        .map(|_| {
            if rng.below(16) == 0 {
                size as i64 + rng.below(3) as i64 - 1
            } else {
                rng.below(size.max(1) as u64) as i64
            }
        })
        .collect();
    Tensor::from_vec(v, dims)
}

/// Runs one step on values of any `Diff` kind. A tensor-only argument (an
/// index or a mask) is made from the step's own seed, identically for both
/// kinds.
pub fn apply<T: Diff>(s: &Step, vals: &[T]) -> Result<T> {
    match *s {
        Step::Unary(k, a) => {
            let x = pick(vals, a);
            // Every function of the unary family's list (the one the op
            // registry is made from), then tanh's backward.
            match Unary::ALL.get(k as usize % (Unary::ALL.len() + 1)) {
                Some(&u) => T::apply(u, &[x]),
                None => x.tanh_backward(x),
            }
        }
        Step::Scalar(k, a, c) => {
            let (x, c) = (pick(vals, a), c as f64 / 8.0);
            match k % 7 {
                0 => x.add_scalar(c),
                1 => x.mul_scalar(c),
                2 => x.powf(c),
                3 => x.maximum_scalar(c),
                4 => x.rsub_scalar(c),
                5 => x.rdiv_scalar(c),
                _ => x.div_scalar(c),
            }
        }
        Step::Binary(k, a, b) => {
            let (x, y) = (pick(vals, a), pick(vals, b));
            T::apply(Binary::ALL[k as usize % Binary::ALL.len()], &[x, y])
        }
        Step::Compare(k, a, b) => {
            let (x, y) = (pick(vals, a), pick(vals, b));
            // Every comparison of the family's list, then two with scalars.
            match Cmp::ALL.get(k as usize % (Cmp::ALL.len() + 2)) {
                Some(&cmp) => T::apply(Compare { cmp, scalar: None }, &[x, y]),
                None if k % 2 == 0 => x.lt_scalar(0.25),
                None => x.ge_scalar(-0.5),
            }
        }
        Step::Where(m, a, b) => {
            let mask = pick(vals, m).eval()?.gt_scalar(0.0)?;
            pick(vals, a).where_(&mask, pick(vals, b))
        }
        Step::Reduce(k, a, axes, keepdim) => {
            let x = pick(vals, a);
            // Bits of `axes` pick axes; 0xF0 and up asks for a negative or
            // out-of-range axis.
            let mut ax: Vec<isize> = (0..x.rank()).filter(|i| axes >> i & 1 == 1).map(|i| i as isize).collect();
            if axes >= 0xF0 {
                ax.push(-((axes & 7) as isize) - 1);
            }
            match k % 5 {
                0 => x.sum(&ax, keepdim),
                1 => x.mean(&ax, keepdim),
                2 => x.max(&ax, keepdim),
                3 => x.min(&ax, keepdim),
                _ => x.logsumexp(&ax, keepdim),
            }
        }
        Step::ArgReduce(a, axis, keepdim, min) => {
            let x = pick(vals, a);
            let axis = axis as isize % 5;
            if min {
                x.argmin(axis, keepdim)
            } else {
                x.argmax(axis, keepdim)
            }
        }
        Step::Softmax(a, axis, log) => {
            let x = pick(vals, a);
            let axis = axis as isize % 5;
            if log {
                x.log_softmax(axis)
            } else {
                x.softmax(axis)
            }
        }
        Step::Reshape(a, k) => {
            let x = pick(vals, a);
            let n = x.numel();
            let shape: Vec<usize> = match k % 5 {
                0 => vec![n],
                1 => vec![1, n],
                2 if n % 2 == 0 => vec![2, n / 2],
                3 => vec![n + 1],
                _ => x.shape().dims().iter().rev().copied().collect(),
            };
            x.reshape(shape)
        }
        Step::Transpose(a, i, j) => pick(vals, a).transpose(i as isize % 5, j as isize % 5),
        Step::Narrow(a, axis, start, len) => {
            let x = pick(vals, a);
            let (start, len) =
                if start == 255 { (usize::MAX - 1, len as usize) } else { (start as usize % 6, len as usize % 6) };
            x.narrow(axis as isize % 5, start, len)
        }
        Step::Concat(a, b, axis) => T::concat(&[pick(vals, a), pick(vals, b)], axis as isize % 5),
        Step::Stack(a, b, axis) => T::stack(&[pick(vals, a), pick(vals, b)], axis as isize % 5),
        Step::Unsqueeze(a, axis) => pick(vals, a).unsqueeze(axis as isize % 6),
        Step::Squeeze(a, axis) => pick(vals, a).squeeze(axis as isize % 5),
        Step::Broadcast(a, k) => {
            let x = pick(vals, a);
            let mut to: Vec<usize> =
                x.shape().dims().iter().map(|&d| if d == 1 { 1 + (k as usize % 3) } else { d }).collect();
            if k & 0x80 != 0 {
                to.insert(0, 2);
            }
            x.broadcast_to(to)
        }
        Step::Matmul(a, b) => {
            let (x, y) = (pick(vals, a), pick(vals, b));
            // A transposed right operand when that makes the product fit.
            if y.rank() >= 2 && x.rank() >= 1 && x.shape().dims().last() == y.shape().dims().last() {
                x.matmul(&y.t()?)
            } else {
                x.matmul(y)
            }
        }
        Step::Cast(a, d) => {
            let dtype = [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64][d as usize % 6];
            pick(vals, a).cast(dtype)
        }
        Step::Contiguous(a) => pick(vals, a).contiguous_(),
        Step::IndexSelect(a, axis, seed) => {
            let x = pick(vals, a);
            let axis = axis as isize % 5;
            let size = x.shape().axis("index_select", axis).map(|ax| x.shape().dims()[ax]).unwrap_or(1);
            let len = (seed % 5) as usize;
            x.index_select(axis, &index_tensor(seed, len, size, vec![len])?)
        }
        Step::Gather(a, axis, seed) => {
            let x = pick(vals, a);
            let axis = axis as isize % 5;
            let size = x.shape().axis("gather", axis).map(|ax| x.shape().dims()[ax]).unwrap_or(1);
            let dims: Vec<usize> = x.shape().dims().iter().map(|&d| d.min(1 + (seed % 3) as usize)).collect();
            let len = dims.iter().product();
            x.gather(axis, &index_tensor(seed, len, size, dims)?)
        }
        Step::ScatterAdd(a, axis, b, seed) => {
            let (x, src) = (pick(vals, a), pick(vals, b));
            let axis = axis as isize % 5;
            let size = x.shape().axis("scatter_add", axis).map(|ax| x.shape().dims()[ax]).unwrap_or(1);
            let dims = src.shape().dims().to_vec();
            let len = dims.iter().product();
            x.scatter_add(axis, &index_tensor(seed, len, size, dims)?, src)
        }
        Step::SumTo(a, k) => {
            let x = pick(vals, a);
            let d = x.shape().dims().to_vec();
            let to: Vec<usize> = match k % 3 {
                0 => d.iter().skip(1).copied().collect(),
                1 => d.iter().map(|_| 1).collect(),
                _ => d.iter().map(|&v| v + 1).collect(),
            };
            x.sum_to(to)
        }
        Step::CrossEntropy(a, seed, opts) => {
            let x = pick(vals, a);
            let d = x.shape().dims().to_vec();
            let (lead, v) = match d.split_last() {
                Some((&v, lead)) => (lead.to_vec(), v),
                None => (vec![], 0),
            };
            let n = lead.iter().product();
            let mut labels = index_tensor(seed, n, v, lead)?;
            if opts & 1 == 1 && n > 0 {
                // One ignored row.
                let mut l = labels.to_vec::<i64>()?;
                l[0] = -100;
                labels = Tensor::from_vec(l, labels.shape().clone())?;
            }
            let reduction = [Reduction::Mean, Reduction::Sum, Reduction::None][(opts >> 1) as usize % 3];
            let label_smoothing = if opts & 8 != 0 { 0.1 } else { 0.0 };
            x.sparse_cross_entropy_with(
                &labels,
                CrossEntropyOptions { reduction, label_smoothing, ..Default::default() },
            )
        }
    }
}

use tapir::tensor::ops::cross_entropy::{CrossEntropyOptions, Reduction};

/// Bits of a value, NaN made canonical (a NaN's payload is not part of any
/// contract).
fn bits(t: &Tensor) -> Vec<u64> {
    t.to_vec_f64().into_iter().map(|v| if v.is_nan() { u64::MAX } else { v.to_bits() }).collect()
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| !x.is_finite() || !y.is_finite() || (x - y).abs() <= tol * (1.0 + x.abs().max(y.abs())))
}

/// Whether a value's derivatives are worth comparing at `tol`: f64 only,
/// and only where every number involved is moderate.
fn comparable(vals: &[f64]) -> bool {
    vals.iter().all(|v| v.is_finite() && v.abs() < 1e6)
}

/// Runs `p` every way and asserts everything the module doc promises.
pub fn check(p: &Program) {
    let baseline = memory_allocated(Device::Cpu);
    check_inner(p);
    let after = memory_allocated(Device::Cpu);
    assert_eq!(after, baseline, "memory not back at its baseline after {p:#?}");
}

fn check_inner(p: &Program) {
    let leaves: Vec<Tensor> = match p.leaves.iter().map(make_leaf).collect::<Result<_>>() {
        Ok(l) => l,
        Err(_) => return,
    };
    // Eagerly, on tensors.
    let mut eager: Vec<Tensor> = leaves.clone();
    let mut eager_results: Vec<Result<Tensor>> = Vec::new();
    for s in &p.steps {
        let r = apply(s, &eager);
        if let Ok(t) = &r {
            eager.push(t.clone());
        }
        eager_results.push(r);
    }
    // Recorded, on a graph: the same results, bit for bit, the same errors.
    let r = Graph::scope(|g| {
        let vars: Vec<Var<'_>> = leaves
            .iter()
            .map(|t| if t.dtype().is_float() { g.leaf(t.clone()) } else { g.constant(t.clone()) })
            .collect();
        let mut vals = vars.clone();
        for (i, s) in p.steps.iter().enumerate() {
            let r = apply(s, &vals);
            match (&r, &eager_results[i]) {
                (Ok(v), Ok(t)) => {
                    let v = v.value()?;
                    assert_eq!(v.shape(), t.shape(), "step {i} {s:?}");
                    assert_eq!(v.dtype(), t.dtype(), "step {i} {s:?}");
                    assert_eq!(bits(&v), bits(t), "step {i} {s:?}: recorded and eager values differ");
                }
                (Err(a), Err(b)) => assert_eq!(a, b, "step {i} {s:?}: different errors"),
                (a, b) => panic!("step {i} {s:?}: recorded {a:?} but eager {b:?}"),
            }
            if let Ok(v) = r {
                vals.push(v);
            }
        }
        derivatives(g, p, &vars, &vals)
    });
    if let Err(e) = r {
        panic!("derivatives failed: {e:?}\n{p:#?}");
    }
}

/// Reverse, recorded reverse, forward and second order on the last float
/// value made from a float leaf.
fn derivatives<'g>(g: &'g Graph, p: &Program, leaves: &[Var<'g>], vals: &[Var<'g>]) -> Result<()> {
    let Some(out) = vals.iter().rev().find(|v| v.dtype().is_float() && v.requires_grad()) else { return Ok(()) };
    let xs: Vec<Var<'g>> = leaves.iter().copied().filter(|v| v.dtype().is_float()).collect();
    let f = out.sum_all()?;
    let opts = GradOptions { grad_outputs: None, retain_graph: true };
    let grads = g.grad_with(&[f], &xs, opts)?;
    for (x, gx) in xs.iter().zip(&grads) {
        assert_eq!(gx.shape(), &x.shape(), "gradient shape");
        assert_eq!(gx.dtype(), x.dtype(), "gradient dtype");
    }
    // In f64 throughout only: a cast to a narrower float rounds the tangent
    // and the value differently, and a fused f32 kernel rounds otherwise
    // than its recorded formulation.
    let all_f64 = vals.iter().all(|v| !v.dtype().is_float() || v.dtype() == DType::F64);
    let recorded = g.grad_graph(f, &xs)?;
    for (gx, rx) in grads.iter().zip(&recorded) {
        let rv = rx.value()?;
        assert_eq!(rv.shape(), gx.shape(), "recorded gradient shape");
        if all_f64 {
            let (a, b) = (gx.to_vec_f64(), rv.to_vec_f64());
            assert!(close(&a, &b, 1e-9), "eager {a:?} vs recorded {b:?} gradient\n{p:#?}");
        }
    }
    // Forward mode along random tangents: sum(jvp) = <grad, t>.
    let mut rng = Rng::new(p.seed);
    let tangents: Vec<Tensor> =
        xs.iter().map(|x| rng.uniform(x.shape(), -1.0, 1.0, DType::F64)?.cast(x.dtype())).collect::<Result<_>>()?;
    let jv = g.jvp(&[f], &xs, &tangents)?.remove(0);
    assert_eq!(jv.shape(), &f.shape(), "jvp shape");
    if all_f64 {
        let dot: f64 = grads
            .iter()
            .zip(&tangents)
            .map(|(a, t)| a.to_vec_f64().iter().zip(t.to_vec_f64()).map(|(x, y)| x * y).sum::<f64>())
            .sum();
        let j = jv.item()?;
        let terms: Vec<f64> = grads.iter().flat_map(|a| a.to_vec_f64()).chain([j, dot, f.item()?]).collect();
        if comparable(&terms) {
            assert!(close(&[j], &[dot], 1e-7), "jvp {j} vs <grad, t> {dot}\n{p:#?}");
        }
    }
    // Second order: a Hessian-vector product with respect to the first leaf.
    let hv = g.hvp(f, xs[0], &tangents[0])?;
    assert_eq!(hv.shape(), &xs[0].shape(), "hvp shape");
    Ok(())
}

/// A program from raw bytes, as the fuzzer and the proptest both make it.
pub fn from_bytes(data: &[u8]) -> Option<Program> {
    Program::arbitrary(&mut Unstructured::new(data)).ok()
}
