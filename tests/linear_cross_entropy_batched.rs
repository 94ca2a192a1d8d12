//! The fused linear + cross-entropy head on hidden states `[B, S, D]` with
//! labels `[B, S]`: the same values and gradients as the `[B * S, D]` rows
//! it flattens to, and as `sparse_cross_entropy` of the full logits.

use tapir::prelude::*;
use tapir::tensor::ops::cross_entropy::{CrossEntropyOptions, Reduction};

const B: usize = 3;
const S: usize = 5;
const D: usize = 8;
const V: usize = 11;

/// Hidden states, a weight, a bias and labels (two of them ignored).
fn inputs(dtype: DType) -> (Tensor, Tensor, Tensor, Tensor) {
    let mut rng = Rng::new(7);
    let h = rng.randn([B, S, D], dtype).unwrap();
    let w = rng.normal_tensor([V, D], 0.0, 0.5, dtype).unwrap();
    let b = rng.normal_tensor([V], 0.0, 0.5, dtype).unwrap();
    let mut l = rng.randint([B * S], V as u64, DType::I64).unwrap().to_vec::<i64>().unwrap();
    l[3] = -100;
    l[11] = -100;
    (h, w, b, Tensor::from_vec(l, [B, S]).unwrap())
}

fn options() -> Vec<CrossEntropyOptions> {
    let mut out = Vec::new();
    for reduction in [Reduction::None, Reduction::Sum, Reduction::Mean] {
        for label_smoothing in [0.0, 0.1] {
            out.push(CrossEntropyOptions { reduction, label_smoothing, ..Default::default() });
        }
    }
    out
}

/// A scalar from the loss: weighted per-row losses for `Reduction::None`
/// (so each row's gradient differs), else the loss itself.
fn scalar<'g>(g: &'g Graph, loss: Var<'g>) -> Result<Var<'g>> {
    if loss.rank() == 0 {
        return Ok(loss);
    }
    let n: usize = loss.shape().dims().iter().product();
    let wts: Vec<f64> = (0..n).map(|i| 0.5 + i as f64 / n as f64).collect();
    let wts = Tensor::from_vec(wts, loss.shape())?.cast(loss.dtype())?;
    loss.mul(&g.constant(wts))?.sum_all()
}

/// (loss, [d_hidden, d_weight, d_bias]) of the fused head.
fn fused(h: &Tensor, w: &Tensor, b: &Tensor, labels: &Tensor, o: CrossEntropyOptions) -> (Tensor, Vec<Tensor>) {
    Graph::scope(|g| {
        let (hv, wv, bv) = (g.leaf(h.clone()), g.leaf(w.clone()), g.leaf(b.clone()));
        let loss = hv.linear_cross_entropy(&wv, Some(&bv), labels, o, Some(4))?;
        let value = loss.value()?;
        let grads = g.grad(scalar(g, loss)?, &[hv, wv, bv])?;
        Ok::<_, Error>((value, grads))
    })
    .unwrap()
}

/// The same through the full logits and the sparse loss.
fn unfused(h: &Tensor, w: &Tensor, b: &Tensor, labels: &Tensor, o: CrossEntropyOptions) -> (Tensor, Vec<Tensor>) {
    Graph::scope(|g| {
        let (hv, wv, bv) = (g.leaf(h.clone()), g.leaf(w.clone()), g.leaf(b.clone()));
        let logits = hv.matmul(&wv.t()?)?.add(&bv)?;
        let loss = logits.sparse_cross_entropy_with(labels, o)?;
        let value = loss.value()?;
        let grads = g.grad(scalar(g, loss)?, &[hv, wv, bv])?;
        Ok::<_, Error>((value, grads))
    })
    .unwrap()
}

fn close(a: &Tensor, b: &Tensor, tol: f64, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}: shapes");
    for (i, (x, y)) in a.to_vec_f64().iter().zip(b.to_vec_f64()).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{what}[{i}]: {x} vs {y}");
    }
}

#[test]
fn batched_hidden_states_equal_their_flattened_rows_exactly() {
    let (h, w, b, labels) = inputs(DType::F32);
    let (hf, lf) = (h.reshape([B * S, D]).unwrap(), labels.reshape([B * S]).unwrap());
    for o in options() {
        let (loss3, g3) = fused(&h, &w, &b, &labels, o);
        let (loss2, g2) = fused(&hf, &w, &b, &lf, o);
        let want_shape: &[usize] = if o.reduction == Reduction::None { &[B, S] } else { &[] };
        assert_eq!(loss3.shape().dims(), want_shape, "{o:?}");
        assert_eq!(g3[0].shape().dims(), &[B, S, D], "{o:?}: the hidden gradient is shaped like the hidden states");
        assert_eq!(loss3.to_vec::<f32>().unwrap(), loss2.to_vec::<f32>().unwrap(), "{o:?}: loss");
        assert_eq!(g3[0].reshape([B * S, D]).unwrap().to_vec::<f32>().unwrap(), g2[0].to_vec::<f32>().unwrap());
        assert_eq!(g3[1].to_vec::<f32>().unwrap(), g2[1].to_vec::<f32>().unwrap(), "{o:?}: d_weight");
        assert_eq!(g3[2].to_vec::<f32>().unwrap(), g2[2].to_vec::<f32>().unwrap(), "{o:?}: d_bias");
    }
}

#[test]
fn batched_head_matches_sparse_cross_entropy_of_the_logits() {
    let (h, w, b, labels) = inputs(DType::F64);
    for o in options() {
        let (loss, grads) = fused(&h, &w, &b, &labels, o);
        let (want, want_grads) = unfused(&h, &w, &b, &labels, o);
        close(&loss, &want, 1e-12, &format!("{o:?} loss"));
        for (k, (got, want)) in grads.iter().zip(&want_grads).enumerate() {
            close(got, want, 1e-12, &format!("{o:?} grad {k}"));
        }
    }
}

#[test]
fn batched_head_on_plain_tensors_and_in_forward_mode() {
    let (h, w, b, labels) = inputs(DType::F64);
    let o = CrossEntropyOptions { reduction: Reduction::None, ..Default::default() };
    let eager = h.linear_cross_entropy(&w, Some(&b), &labels, o, None).unwrap();
    let (want, _) = unfused(&h, &w, &b, &labels, o);
    close(&eager, &want, 1e-12, "eager per-row losses");
    // A tangent of the hidden states through the flattening reshape.
    let t = Rng::new(3).randn([B, S, D], DType::F64).unwrap();
    let mean = CrossEntropyOptions::default();
    let (tan, tan_want) = Graph::scope(|g| {
        let hv = g.leaf(h.clone());
        let (wv, bv) = (g.constant(w.clone()), g.constant(b.clone()));
        let fused = hv.linear_cross_entropy(&wv, Some(&bv), &labels, mean, None)?;
        let composed = hv.matmul(&wv.t()?)?.add(&bv)?.sparse_cross_entropy_with(&labels, mean)?;
        let mut tangents = g.jvp(&[fused, composed], &[hv], std::slice::from_ref(&t))?;
        let composed = tangents.pop().expect("two tangents");
        let fused = tangents.pop().expect("two tangents");
        Ok::<_, Error>((fused, composed))
    })
    .unwrap();
    close(&tan, &tan_want, 1e-12, "tangent");
}

#[test]
fn batched_labels_must_match_the_leading_axes() {
    let (h, w, b, labels) = inputs(DType::F32);
    let flat = labels.reshape([B * S]).unwrap();
    let err = h.linear_cross_entropy(&w, Some(&b), &flat, CrossEntropyOptions::default(), None).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { op: "linear_cross_entropy", .. }), "{err:?}");
    let wide = Rng::new(1).randn([B, S, D + 1], DType::F32).unwrap();
    let err = wide.linear_cross_entropy(&w, Some(&b), &labels, CrossEntropyOptions::default(), None).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { op: "linear_cross_entropy", .. }), "{err:?}");
}
