//! Cross-entropy edge cases where torch is the reference: +inf logits, the
//! rounding of an f32 mean, the sign of a sum over no rows. The values
//! torch gives were read off `torch.nn.functional.cross_entropy` (2.x):
//!
//! ```python
//! x = torch.tensor([[inf, 0., 1.], [0., inf, inf], [1., 2., 3.]], requires_grad=True)
//! F.cross_entropy(x, torch.tensor([1, 0, 2]), reduction="none")  # nan, nan, 0.4076
//! # x.grad rows 0 and 1: all nan; row 2 finite
//! F.cross_entropy(torch.zeros(0, 5), torch.zeros(0, dtype=torch.long), reduction="sum")  # +0.0
//! ```

use tapir::prelude::*;
use tapir::tensor::ops::cross_entropy::{CrossEntropyOptions, Reduction};

const NONE: CrossEntropyOptions =
    CrossEntropyOptions { ignore_index: -100, label_smoothing: 0.0, reduction: Reduction::None };

/// Loss and logits gradient for a unit upstream gradient, eagerly (the
/// fused kernel) or with `create_graph` (the differentiable formulation).
fn run(x: &Tensor, labels: &Tensor, opts: CrossEntropyOptions, recorded: bool) -> (Tensor, Tensor) {
    Graph::scope(|g| {
        let xv = g.leaf(x.clone());
        let loss = xv.sparse_cross_entropy_with(labels, opts)?;
        let value = loss.value()?;
        let total = loss.sum_all()?;
        let grad = if recorded { g.grad_graph(total, &[xv])?[0].value()? } else { g.grad(total, &[xv])?.remove(0) };
        Ok::<_, Error>((value, grad))
    })
    .expect("cross-entropy")
}

#[test]
fn positive_infinity_logits_give_nan_loss_and_an_all_nan_gradient_row() {
    let inf = f64::INFINITY;
    let labels = Tensor::from_vec(vec![1i64, 0, 2], [3]).expect("labels");
    for dtype in [DType::F32, DType::F64] {
        for recorded in [false, true] {
            let x = Tensor::from_vec(vec![inf, 0., 1., 0., inf, inf, 1., 2., 3.], [3, 3])
                .and_then(|t| t.cast(dtype))
                .expect("logits");
            let (loss, grad) = run(&x, &labels, NONE, recorded);
            let l = loss.to_vec_f64();
            assert!(l[0].is_nan() && l[1].is_nan(), "{dtype:?} recorded={recorded}: {l:?}");
            let want = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln() - 3.0;
            assert!((l[2] - want).abs() < 1e-6, "{l:?}");
            let g = grad.to_vec_f64();
            assert!(g[..6].iter().all(|v| v.is_nan()), "{dtype:?} recorded={recorded}: {g:?}");
            assert!(g[6..].iter().all(|v| v.is_finite()), "{g:?}");
            let (mean, _) = run(&x, &labels, CrossEntropyOptions::default(), recorded);
            assert!(mean.item().expect("scalar").is_nan());
        }
    }
    // A +inf past the kernel's first 512-element block of a long row.
    let mut v = vec![0.5f32; 1100];
    v[900] = f32::INFINITY;
    let x = Tensor::from_vec(v, [1, 1100]).expect("logits");
    let (loss, grad) = run(&x, &Tensor::from_vec(vec![3i64], [1]).expect("label"), NONE, false);
    assert!(loss.to_vec_f64()[0].is_nan());
    assert!(grad.to_vec_f64().iter().all(|v| v.is_nan()));
}

/// Distance in units in the last place between two f32 values.
fn ulps(a: f32, b: f32) -> u32 {
    let key = |x: f32| {
        let b = x.to_bits() as i32;
        if b < 0 {
            i32::MIN - b
        } else {
            b
        }
    };
    key(a).abs_diff(key(b))
}

#[test]
fn f32_mean_and_sum_are_within_one_ulp_of_the_f64_value() {
    let mut rng = Rng::new(19);
    for (rows, v, scale) in [(4096, 64, 3.0), (1000, 37, 1.0), (257, 1000, 5.0), (20_000, 8, 0.5)] {
        let x = rng.normal_tensor([rows, v], 0.0, scale, DType::F32).expect("logits");
        let labels = rng.randint([rows], v as u64, DType::I64).expect("labels");
        let x64 = x.cast(DType::F64).expect("f64 copy");
        for reduction in [Reduction::Mean, Reduction::Sum] {
            let opts = CrossEntropyOptions { reduction, ..Default::default() };
            let got = x.sparse_cross_entropy_with(&labels, opts).and_then(|l| l.item()).expect("f32 loss") as f32;
            let exact = x64.sparse_cross_entropy_with(&labels, opts).and_then(|l| l.item()).expect("f64 loss");
            let d = ulps(got, exact as f32);
            assert!(d <= 1, "{rows}x{v} {reduction:?}: f32 {got} vs f64 {exact}: {d} ulp");
        }
    }
}

#[test]
fn a_sum_over_no_rows_is_positive_zero() {
    let sum = CrossEntropyOptions { reduction: Reduction::Sum, ..Default::default() };
    for dtype in [DType::F32, DType::F64] {
        let empty = Tensor::zeros([0, 5], dtype).expect("no rows");
        let loss = empty.sparse_cross_entropy_with(&Tensor::zeros([0], DType::I64).expect("labels"), sum);
        let l = loss.and_then(|l| l.item()).expect("sum");
        assert!(l == 0.0 && l.is_sign_positive(), "{dtype:?}: {l}");
        // Every row ignored: also +0.0.
        let x = Tensor::ones([3, 4], dtype).expect("logits");
        let ignored = Tensor::from_vec(vec![-100i64; 3], [3]).expect("labels");
        let l = x.sparse_cross_entropy_with(&ignored, sum).and_then(|l| l.item()).expect("sum");
        assert!(l == 0.0 && l.is_sign_positive(), "{dtype:?}: {l}");
    }
}
