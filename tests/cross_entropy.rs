//! Sparse and linear cross-entropy against a straightforward reference
//! (log_softmax + gather in f64), through the gradient checker, and on the
//! edge cases: ignored rows, all rows ignored, label smoothing, +-1e4, -inf,
//! V = 1, V not a multiple of any vector width, every float dtype.

use tapir::prelude::*;
use tapir::tensor::ops::cross_entropy::{CrossEntropyOptions, Reduction};

const IGNORE: i64 = -100;

/// Reference per-row losses and logits gradient (for reduction `red`,
/// incoming gradient 1), computed in f64 with plain loops.
fn reference(x: &[f64], v: usize, labels: &[i64], eps: f64, red: Reduction) -> (Vec<f64>, f64, Vec<f64>) {
    let rows = labels.len();
    let valid = labels.iter().filter(|&&l| l != IGNORE).count() as f64;
    let mut losses = vec![0.0; rows];
    let mut grad = vec![0.0; rows * v];
    for r in 0..rows {
        let xr = &x[r * v..(r + 1) * v];
        if labels[r] == IGNORE {
            continue;
        }
        let m = xr.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + xr.iter().map(|&a| (a - m).exp()).sum::<f64>().ln();
        let y = labels[r] as usize;
        let logp: Vec<f64> = xr.iter().map(|&a| a - lse).collect();
        let mean_logp = logp.iter().sum::<f64>() / v as f64;
        losses[r] = -(1.0 - eps) * logp[y] - eps * mean_logp;
        let w = match red {
            Reduction::Mean => 1.0 / valid,
            _ => 1.0,
        };
        for j in 0..v {
            let target = (1.0 - eps) * if j == y { 1.0 } else { 0.0 } + eps / v as f64;
            grad[r * v + j] = w * (logp[j].exp() - target);
        }
    }
    let total: f64 = losses.iter().sum();
    let reduced = match red {
        Reduction::Mean => total / valid,
        _ => total,
    };
    (losses, reduced, grad)
}

fn run(x: &Tensor, labels: &Tensor, opts: CrossEntropyOptions) -> (Tensor, Tensor) {
    Graph::scope(|g| {
        let xv = g.leaf(x.clone());
        let loss = xv.sparse_cross_entropy_with(labels, opts)?;
        let value = loss.value()?;
        let seed = Tensor::ones(value.shape().clone(), value.dtype()).expect("alloc");
        let grad = g.grad_with(&[loss], &[xv], GradOptions { grad_outputs: Some(vec![seed]), retain_graph: false })?;
        Ok::<_, Error>((value, grad[0].clone()))
    })
    .unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let ok = (x - y).abs() <= tol * (1.0 + y.abs()) || (x.is_nan() && y.is_nan()) || x == y;
        assert!(ok, "{what} at {i}: {x} vs {y}");
    }
}

#[allow(clippy::too_many_arguments)]
fn case(rows: usize, v: usize, labels: Vec<i64>, scale: f64, eps: f64, red: Reduction, dtype: DType, tol: f64) {
    let x64 = Rng::new((rows * 31 + v) as u64).uniform([rows, v], -scale, scale, DType::F64).unwrap();
    let xd = x64.cast(dtype).unwrap();
    // The reference sees exactly the values the op sees (after rounding).
    let xs = xd.to_vec_f64();
    let lt = Tensor::from_vec(labels.clone(), [rows]).unwrap();
    let opts = CrossEntropyOptions { ignore_index: IGNORE, label_smoothing: eps, reduction: red };
    let (loss, grad) = run(&xd, &lt, opts);
    let (per_row, reduced, want_grad) = reference(&xs, v, &labels, eps, red);
    let what = format!("rows {rows} v {v} eps {eps} {red:?} {dtype:?}");
    match red {
        Reduction::None => close(&loss.to_vec_f64(), &per_row, tol, &what),
        _ => close(&loss.to_vec_f64(), &[reduced], tol, &what),
    }
    close(&grad.to_vec_f64(), &want_grad, tol, &format!("grad {what}"));
    assert_eq!(loss.dtype(), dtype);
    assert_eq!(grad.dtype(), dtype);
}

#[test]
fn matches_reference_over_reductions_smoothing_and_ignored_rows() {
    for red in [Reduction::None, Reduction::Sum, Reduction::Mean] {
        for eps in [0.0, 0.1] {
            case(6, 37, vec![0, 36, IGNORE, 5, 5, 17], 3.0, eps, red, DType::F64, 1e-12);
            case(6, 37, vec![0, 36, IGNORE, 5, 5, 17], 3.0, eps, red, DType::F32, 1e-5);
        }
    }
}

#[test]
fn every_float_dtype() {
    case(4, 19, vec![1, 2, 3, IGNORE], 2.0, 0.0, Reduction::Mean, DType::F16, 2e-3);
    case(4, 19, vec![1, 2, 3, IGNORE], 2.0, 0.0, Reduction::Mean, DType::BF16, 1e-2);
    case(4, 19, vec![1, 2, 3, IGNORE], 2.0, 0.0, Reduction::None, DType::F64, 1e-12);
}

#[test]
fn large_logits_and_single_class() {
    case(3, 8, vec![1, 0, 7], 1e4, 0.0, Reduction::None, DType::F32, 1e-5);
    case(3, 8, vec![1, 0, 7], 1e4, 0.05, Reduction::Mean, DType::F64, 1e-9);
    case(4, 1, vec![0, 0, IGNORE, 0], 5.0, 0.0, Reduction::None, DType::F32, 1e-6);
    case(2, 1000, vec![999, 3], 10.0, 0.0, Reduction::Sum, DType::F32, 1e-5);
}

#[test]
fn negative_infinity_logits() {
    // -inf on a non-target class contributes nothing; on the target the
    // loss is +inf, as in torch.
    let ninf = f32::NEG_INFINITY;
    let x = Tensor::from_vec(vec![0.0f32, ninf, 1.0, ninf, 2.0, 0.5], [2, 3]).unwrap();
    let labels = Tensor::from_vec(vec![0i64, 0], [2]).unwrap();
    let none = CrossEntropyOptions { reduction: Reduction::None, ..Default::default() };
    let (loss, grad) = run(&x, &labels, none);
    let l = loss.to_vec::<f32>().unwrap();
    let want0 = -(0.0f64 - (1.0f64.exp() + 1.0).ln());
    assert!((l[0] as f64 - want0).abs() < 1e-6, "{l:?}");
    assert_eq!(l[1], f32::INFINITY);
    let g = grad.to_vec::<f32>().unwrap();
    assert_eq!(g[1], 0.0, "softmax of -inf is exactly zero");
}

#[test]
fn nan_rows_and_a_leading_block_of_negative_infinity() {
    // Rows longer than the kernel's 512-element blocks: a NaN anywhere in a
    // row makes its loss NaN and leaves the other rows alone; with label
    // smoothing, -inf logits make the loss +inf (the smoothed target puts
    // mass on them) even when only a leading block is -inf.
    let v = 1100;
    let mut x = vec![0.25f32; 3 * v];
    x[700] = f32::NAN;
    x[v..v + 512].iter_mut().for_each(|e| *e = f32::NEG_INFINITY);
    let x = Tensor::from_vec(x, [3, v]).unwrap();
    let labels = Tensor::from_vec(vec![3i64, (v - 1) as i64, 5], [3]).unwrap();
    let none = CrossEntropyOptions { reduction: Reduction::None, ..Default::default() };
    let l = run(&x, &labels, none).0.to_vec::<f32>().unwrap();
    assert!(l[0].is_nan(), "{l:?}");
    assert!((l[1] as f64 - ((v - 512) as f64).ln()).abs() < 1e-5, "{l:?}");
    assert!((l[2] as f64 - (v as f64).ln()).abs() < 1e-5, "{l:?}");
    let smoothed = CrossEntropyOptions { label_smoothing: 0.1, ..none };
    let l = run(&x, &labels, smoothed).0.to_vec::<f32>().unwrap();
    assert_eq!(l[1], f32::INFINITY, "{l:?}");
    assert!((l[2] as f64 - (v as f64).ln()).abs() < 1e-5, "{l:?}");
}

#[test]
fn all_rows_ignored() {
    let x = Tensor::ones([3, 4], DType::F32).expect("alloc");
    let labels = Tensor::from_vec(vec![IGNORE; 3], [3]).unwrap();
    let (mean, grad) = run(&x, &labels, CrossEntropyOptions::default());
    assert!(mean.item().unwrap().is_nan(), "a mean over zero rows is NaN, as in torch");
    assert!(grad.to_vec::<f32>().unwrap().iter().all(|&g| g == 0.0), "and its gradient is zero");
    let sum = CrossEntropyOptions { reduction: Reduction::Sum, ..Default::default() };
    assert_eq!(run(&x, &labels, sum).0.item().unwrap(), 0.0);
}

#[test]
fn leading_dims_and_i32_labels() {
    let x = Rng::new(2).randn([2, 3, 5], DType::F64).unwrap();
    let labels = Tensor::from_vec(vec![0i32, 4, 2, 1, 3, 3], [2, 3]).unwrap();
    let (flat_loss, flat_grad) =
        run(&x.reshape([6, 5]).unwrap(), &labels.reshape([6]).unwrap(), CrossEntropyOptions::default());
    let (loss, grad) = run(&x, &labels, CrossEntropyOptions::default());
    close(&loss.to_vec_f64(), &flat_loss.to_vec_f64(), 1e-12, "leading dims");
    close(&grad.to_vec_f64(), &flat_grad.to_vec_f64(), 1e-12, "leading dims grad");
}

#[test]
fn bad_labels_are_reported_with_their_row_and_leak_nothing() {
    let x = Tensor::zeros([4, 10], DType::F32).expect("alloc");
    for (bad, row) in [(10i64, 2usize), (-1, 1)] {
        let mut l = vec![0i64, 1, 2, 3];
        l[row] = bad;
        let labels = Tensor::from_vec(l, [4]).unwrap();
        let r = Graph::scope(|g| g.leaf(x.clone()).sparse_cross_entropy(&labels).map(|_| ()));
        match r {
            Err(Error::LabelOutOfRange { label, row: r, classes, .. }) => {
                assert_eq!((label, r, classes), (bad, row, 10));
            }
            other => panic!("expected LabelOutOfRange, got {other:?}"),
        }
    }
    let bad_shape = Tensor::from_vec(vec![0i64; 3], [3]).unwrap();
    assert!(matches!(x.sparse_cross_entropy(&bad_shape), Err(Error::ShapeMismatch { .. })));
    let float_labels = Tensor::zeros([4], DType::F32).expect("alloc");
    assert!(matches!(x.sparse_cross_entropy(&float_labels), Err(Error::UnsupportedDType { .. })));
    let smoothing = CrossEntropyOptions { label_smoothing: 1.5, ..Default::default() };
    assert!(matches!(
        x.sparse_cross_entropy_with(&Tensor::zeros([4], DType::I64).expect("alloc"), smoothing),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn gradient_checker_first_and_second_order() {
    // Order 1 in reverse mode runs the fused kernel; order 2 differentiates
    // the differentiable formulation used under create_graph.
    let labels = Tensor::from_vec(vec![2i64, IGNORE, 0, 4], [4]).unwrap();
    let x = Rng::new(9).randn([4, 5], DType::F64).unwrap();
    for red in [Reduction::None, Reduction::Sum, Reduction::Mean] {
        let opts = CrossEntropyOptions { label_smoothing: 0.1, reduction: red, ..Default::default() };
        check_grads(
            &|_g, v| v[0].sparse_cross_entropy_with(&labels, opts),
            std::slice::from_ref(&x),
            &CheckOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{red:?}: {e}"));
    }
}

#[test]
fn linear_cross_entropy_matches_linear_then_cross_entropy() {
    let mut rng = Rng::new(4);
    let (n, d, v) = (10, 6, 13);
    let h = rng.randn([n, d], DType::F64).unwrap();
    let w = rng.randn([v, d], DType::F64).unwrap();
    let b = rng.randn([v], DType::F64).unwrap();
    let labels = Tensor::from_vec(vec![0i64, 12, 5, IGNORE, 7, 7, 1, 2, 3, 11], [n]).unwrap();
    let opts = CrossEntropyOptions { label_smoothing: 0.05, ..Default::default() };
    for chunk in [Some(1), Some(3), Some(10), None] {
        let (fused, unfused) = Graph::scope(|g| {
            let (hv, wv, bv) = (g.leaf(h.clone()), g.leaf(w.clone()), g.leaf(b.clone()));
            let a = hv.linear_cross_entropy(&wv, Some(&bv), &labels, opts, chunk)?;
            let b2 = hv.linear(&wv, Some(&bv))?.sparse_cross_entropy_with(&labels, opts)?;
            let (av, bv2) = (a.value()?, b2.value()?);
            let ga = g.grad_with(&[a], &[hv, wv, bv], GradOptions { retain_graph: true, ..Default::default() })?;
            let gb = g.grad(b2, &[hv, wv, bv])?;
            Ok::<_, Error>(((av, ga), (bv2, gb)))
        })
        .unwrap();
        close(&fused.0.to_vec_f64(), &unfused.0.to_vec_f64(), 1e-12, "loss");
        for (a, b) in fused.1.iter().zip(&unfused.1) {
            close(&a.to_vec_f64(), &b.to_vec_f64(), 1e-10, &format!("grad, chunk {chunk:?}"));
        }
    }
    let l = labels.clone();
    check_grads(
        &|_g, x| x[0].linear_cross_entropy(&x[1], Some(&x[2]), &l, opts, Some(4)),
        &[h, w, b],
        &CheckOptions::default(),
    )
    .unwrap();
}

/// Gradients of `hidden`, `weight` and `bias` through `linear` followed by
/// `sparse_cross_entropy`, times `k`: the unfused reference.
fn unfused_linear_grads(
    h: &Tensor,
    w: &Tensor,
    b: &Tensor,
    labels: &Tensor,
    opts: CrossEntropyOptions,
    k: f64,
) -> Vec<Tensor> {
    Graph::scope(|g| {
        let (hv, wv, bv) = (g.leaf(h.clone()), g.leaf(w.clone()), g.leaf(b.clone()));
        let loss = hv.linear(&wv, Some(&bv))?.sparse_cross_entropy_with(labels, opts)?;
        let loss = if opts.reduction == Reduction::None { loss.sum_all()? } else { loss };
        g.grad(loss.mul_scalar(k)?, &[hv, wv, bv])
    })
    .unwrap()
}

/// On a graph with a sum or mean, the forward precomputes the gradients and
/// the first backward only scales them by the upstream scalar (3 here); a
/// second backward (retain_graph) finds them taken and recomputes the
/// logits chunk by chunk. Both agree with linear + cross-entropy, including
/// a mean over ignored rows, smoothing, reduction none (always recomputed)
/// and a batch whose rows are all ignored.
#[test]
fn linear_cross_entropy_precomputed_gradients_match_recompute() {
    let mut rng = Rng::new(11);
    let (n, d, v) = (12, 7, 19);
    let h = rng.randn([n, d], DType::F64).unwrap();
    let w = rng.randn([v, d], DType::F64).unwrap();
    let b = rng.randn([v], DType::F64).unwrap();
    let some_ignored = Tensor::from_vec(vec![3i64, IGNORE, 0, 18, 5, 5, IGNORE, 1, 9, 2, 17, 4], [n]).unwrap();
    let all_ignored = Tensor::from_vec(vec![IGNORE; n], [n]).unwrap();
    for labels in [&some_ignored, &all_ignored] {
        for reduction in [Reduction::Sum, Reduction::Mean, Reduction::None] {
            for (label_smoothing, chunk) in [(0.0, Some(5)), (0.1, None), (0.1, Some(1))] {
                let opts = CrossEntropyOptions { label_smoothing, reduction, ..Default::default() };
                let what = format!("{reduction:?}, smoothing {label_smoothing}, chunk {chunk:?}");
                let (first, second) = Graph::scope(|g| {
                    let (hv, wv, bv) = (g.leaf(h.clone()), g.leaf(w.clone()), g.leaf(b.clone()));
                    let loss = hv.linear_cross_entropy(&wv, Some(&bv), labels, opts, chunk)?;
                    let loss = if reduction == Reduction::None { loss.sum_all()? } else { loss };
                    let scaled = loss.mul_scalar(3.0)?;
                    let keep = GradOptions { retain_graph: true, ..Default::default() };
                    let first = g.grad_with(&[scaled], &[hv, wv, bv], keep)?;
                    let second = g.grad(scaled, &[hv, wv, bv])?;
                    Ok::<_, Error>((first, second))
                })
                .unwrap();
                let want = unfused_linear_grads(&h, &w, &b, labels, opts, 3.0);
                for ((a, s), r) in first.iter().zip(&second).zip(&want) {
                    close(&a.to_vec_f64(), &r.to_vec_f64(), 1e-10, &format!("first backward, {what}"));
                    close(&s.to_vec_f64(), &r.to_vec_f64(), 1e-10, &format!("second backward, {what}"));
                    close(&a.to_vec_f64(), &s.to_vec_f64(), 1e-12, &format!("precomputed vs recomputed, {what}"));
                }
                if labels.to_vec::<i64>().unwrap().iter().all(|&l| l == IGNORE) && reduction != Reduction::None {
                    assert!(first.iter().all(|t| t.to_vec_f64().iter().all(|&e| e == 0.0)), "{what}");
                }
            }
        }
    }
}

/// The precomputed path in f32 (the benchmark's dtype, AVX2 row kernels)
/// against the unfused head, without a bias, and the eager call's value.
#[test]
fn linear_cross_entropy_precomputed_f32() {
    let mut rng = Rng::new(12);
    let (n, d, v) = (40, 16, 1003);
    let h = rng.randn([n, d], DType::F32).unwrap();
    let w = rng.normal_tensor([v, d], 0.0, 0.3, DType::F32).unwrap();
    let mut l = rng.randint([n], v as u64, DType::I64).unwrap().to_vec::<i64>().unwrap();
    l[3] = IGNORE;
    let labels = Tensor::from_vec(l, [n]).unwrap();
    let opts = CrossEntropyOptions { label_smoothing: 0.05, ..Default::default() };
    let (value, fused, unfused) = Graph::scope(|g| {
        let (hv, wv) = (g.leaf(h.clone()), g.leaf(w.clone()));
        let a = hv.linear_cross_entropy(&wv, None, &labels, opts, Some(16))?;
        let value = a.value()?;
        let fused = g.grad(a, &[hv, wv])?;
        let b = hv.linear(&wv, None)?.sparse_cross_entropy_with(&labels, opts)?;
        Ok::<_, Error>((value, fused, g.grad(b, &[hv, wv])?))
    })
    .unwrap();
    let eager = h.linear_cross_entropy(&w, None, &labels, opts, Some(16)).unwrap();
    close(&value.to_vec_f64(), &eager.to_vec_f64(), 1e-6, "graph vs eager value");
    for (a, b) in fused.iter().zip(&unfused) {
        close(&a.to_vec_f64(), &b.to_vec_f64(), 1e-4, "f32 gradient");
    }
}
