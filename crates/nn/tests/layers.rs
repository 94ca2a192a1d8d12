//! Every layer's forward against reference values computed with explicit
//! loops, and through the gradient checker (f64; orders 1 and 2 where the
//! second order is cheap, reverse and forward mode).

use tapir_autograd::{check_grads, CheckOptions, Graph, Var};
use tapir_nn::{
    affine, affine_with, causal_attention, causal_softmax, mse, Activation, Affine, Bound, CausalAttention,
    CausalSelfAttention, Dropout, Embedding, Gpt, GptConfig, LayerNorm, Linear, Mlp, ParamStore, RmsNorm,
};
use tapir_tensor::prelude::*;

type R<'g> = Result<Var<'g>>;

fn rnd(shape: &[usize], seed: u64) -> Tensor {
    Rng::new(seed).uniform(shape.to_vec(), -1.0, 1.0, DType::F64).unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "element {i}: {x} vs {y}");
    }
}

/// Runs `f` on the store's parameters (as the checker's leaves) and `x`.
fn check_layer(
    store: &ParamStore,
    x: Option<Tensor>,
    orders: &[usize],
    f: &dyn for<'g> Fn(&Bound<'g>, Option<Var<'g>>) -> R<'g>,
) {
    let n = store.len();
    let mut inputs: Vec<Tensor> = store.iter().map(|(_, _, t)| t.clone()).collect();
    if let Some(x) = &x {
        inputs.push(x.clone());
    }
    let has_x = x.is_some();
    for &order in orders {
        let opts = CheckOptions { order, ..CheckOptions::default() };
        check_grads(
            &|g, v| {
                let p = Bound::from_vars(g, v[..n].to_vec());
                f(&p, has_x.then(|| v[n]))
            },
            &inputs,
            &opts,
        )
        .unwrap_or_else(|e| panic!("order {order}: {e}"));
    }
}

/// Forward of `f` on the store's parameters and `x`, as f64 values.
fn eval(store: &ParamStore, x: &Tensor, f: &dyn for<'g> Fn(&Bound<'g>, Var<'g>) -> R<'g>) -> Vec<f64> {
    Graph::scope(|g| {
        let p = store.bind(g);
        Ok::<_, Error>(f(&p, g.constant(x.clone()))?.value()?.to_vec_f64())
    })
    .unwrap()
}

#[test]
fn linear_forward_matches_loops_and_folds_leading_dims() {
    let mut store = ParamStore::new();
    let l = Linear::new(&mut store, "l", 3, 2, true, &mut Rng::new(1), DType::F64).unwrap();
    let x = rnd(&[2, 2, 3], 2);
    let y = eval(&store, &x, &|p, x| l.forward(p, x));
    let (w, b, xv) = (store.get(l.weight).to_vec_f64(), store.get(l.bias.unwrap()).to_vec_f64(), x.to_vec_f64());
    let mut want = vec![];
    for r in 0..4 {
        for o in 0..2 {
            want.push(b[o] + (0..3).map(|i| xv[r * 3 + i] * w[o * 3 + i]).sum::<f64>());
        }
    }
    close(&y, &want, 1e-12);
    let shape = Graph::scope(|g| Ok::<_, Error>(l.forward(&store.bind(g), g.constant(x.clone()))?.shape())).unwrap();
    assert_eq!(shape.dims(), &[2, 2, 2]);
    check_layer(&store, Some(x), &[1, 2], &|p, x| l.forward(p, x.unwrap()));
}

#[test]
fn affine_op_gradients_and_layouts() {
    let (x, w, b) = (rnd(&[4, 3], 20), rnd(&[2, 3], 21), rnd(&[2], 22));
    let want = x.matmul(&w.t().unwrap()).unwrap().add(&b).unwrap().to_vec_f64();
    close(&affine(&x, &w, Some(&b), true).unwrap().to_vec_f64(), &want, 1e-15);
    check_grads(&|_g, v| affine(&v[0], &v[1], Some(&v[2]), true), &[x.clone(), w.clone(), b], &CheckOptions::default())
        .unwrap();
    check_grads(&|_g, v| affine(&v[0], &v[1], None, true)?.tanh(), &[x.clone(), w.clone()], &CheckOptions::default())
        .unwrap();
    // The weight's gradient comes back in the weight's own (contiguous)
    // layout, and data gets no gradient computed.
    let mut store = ParamStore::new();
    let l = Linear::new(&mut store, "l", 3, 2, true, &mut Rng::new(23), DType::F32).unwrap();
    let x32 = x.cast(DType::F32).unwrap();
    let grads = Graph::scope(|g| {
        let p = store.bind(g);
        let y = l.forward(&p, g.constant(x32.clone()))?;
        assert!(!y.requires_grad() || p.var(l.weight)?.requires_grad());
        p.grads(y.square()?.sum_all()?)
    })
    .unwrap();
    assert!(grads.get(l.weight).is_contiguous());
    assert!(matches!(affine(&x, &rnd(&[2, 4], 1), None, true), Err(Error::ShapeMismatch { op: "affine", .. })));

    // A fused residual: the same values as the sum, and checked derivatives.
    let plain = Affine { input_grad: true, ..Affine::default() };
    let (b, r) = (rnd(&[2], 22), rnd(&[4, 2], 24));
    let z = x.matmul(&w.t().unwrap()).unwrap().add(&b).unwrap();
    close(
        &affine_with(plain, &x, &w, Some(&b), Some(&r)).unwrap().to_vec_f64(),
        &z.add(&r).unwrap().to_vec_f64(),
        1e-15,
    );
    check_grads(
        &|_g, v| affine_with(plain, &v[0], &v[1], Some(&v[2]), Some(&v[3]))?.tanh(),
        &[x.clone(), w.clone(), b, r],
        &CheckOptions::default(),
    )
    .unwrap();
}

/// A tanh layer as one op: the values of the composition, checked
/// derivatives (orders 1 and 2, reverse and forward, with and without a
/// bias or a residual), and at a size split over threads, eager tangents
/// equal to the composed op's.
#[test]
fn affine_tanh_matches_its_composition() {
    let (x, w, b, r) = (rnd(&[4, 3], 30), rnd(&[2, 3], 31), rnd(&[2], 32), rnd(&[4, 2], 33));
    let fused = Affine { input_grad: true, tanh: true, ..Affine::default() };
    let z = x.matmul(&w.t().unwrap()).unwrap().add(&b).unwrap();
    let got = affine_with(fused, &x, &w, Some(&b), None).unwrap();
    close(&got.to_vec_f64(), &z.tanh().unwrap().to_vec_f64(), 1e-15);
    let got = affine_with(fused, &x, &w, Some(&b), Some(&r)).unwrap();
    close(&got.to_vec_f64(), &z.add(&r).unwrap().tanh().unwrap().to_vec_f64(), 1e-15);
    for order in [1, 2] {
        let opts = CheckOptions { order, ..CheckOptions::default() };
        check_grads(
            &|_g, v| affine_with(fused, &v[0], &v[1], Some(&v[2]), None),
            &[x.clone(), w.clone(), b.clone()],
            &opts,
        )
        .unwrap();
        check_grads(&|_g, v| affine_with(fused, &v[0], &v[1], None, None), &[x.clone(), w.clone()], &opts).unwrap();
        check_grads(
            &|_g, v| affine_with(fused, &v[0], &v[1], Some(&v[2]), Some(&v[3])),
            &[x.clone(), w.clone(), b.clone(), r.clone()],
            &opts,
        )
        .unwrap();
    }
    // [1024, 64] in f32: the product, tanh and 1 - y^2 run in the split job.
    let f = |s: &[usize], seed| Rng::new(seed).uniform(s.to_vec(), -1.0, 1.0, DType::F32).unwrap();
    let (x, w, b) = (f(&[1024, 64], 34), f(&[64, 64], 35), f(&[64], 36));
    let (tx, tw, tb) = (f(&[1024, 64], 37), f(&[64, 64], 38), f(&[64], 39));
    let run = |fuse: bool| {
        Graph::scope(|g| {
            let (xv, wv, bv) = (g.leaf(x.clone()), g.leaf(w.clone()), g.leaf(b.clone()));
            let y = if fuse {
                affine_with(fused, &xv, &wv, Some(&bv), None)?
            } else {
                affine(&xv, &wv, Some(&bv), true)?.tanh()?
            };
            let t = g.jvp(&[y], &[xv, wv, bv], &[tx.clone(), tw.clone(), tb.clone()])?;
            Ok::<_, Error>((y.value()?.to_vec_f64(), t[0].to_vec_f64()))
        })
        .unwrap()
    };
    let ((y1, t1), (y2, t2)) = (run(true), run(false));
    close(&y1, &y2, 1e-6);
    close(&t1, &t2, 1e-5);
}

#[test]
fn mlp_gradients() {
    for act in [Activation::GeluTanh, Activation::Relu, Activation::Tanh] {
        let mut store = ParamStore::new();
        let m = Mlp::new(&mut store, "m", &[3, 5, 2], act, &mut Rng::new(3), DType::F64).unwrap();
        check_layer(&store, Some(rnd(&[4, 3], 4)), &[1, 2], &|p, x| m.forward(p, x.unwrap()));
    }
}

#[test]
fn embedding_picks_rows_and_rejects_bad_ids() {
    let mut store = ParamStore::new();
    let e = Embedding::new(&mut store, "e", 5, 3, 1.0, &mut Rng::new(5), DType::F64).unwrap();
    let table = store.get(e.weight).to_vec_f64();
    let ids = Tensor::from_vec(vec![4i64, 0, 4, 2], [2, 2]).unwrap();
    let (y, shape) = Graph::scope(|g| {
        let v = e.forward(&store.bind(g), &ids)?;
        Ok::<_, Error>((v.value()?.to_vec_f64(), v.shape()))
    })
    .unwrap();
    assert_eq!(shape.dims(), &[2, 2, 3]);
    let want: Vec<f64> = [4, 0, 4, 2].iter().flat_map(|&r| table[r * 3..r * 3 + 3].to_vec()).collect();
    assert_eq!(y, want);
    // Gradients: a repeated id accumulates.
    check_layer(&store, None, &[1, 2], &|p, _| e.forward(p, &ids)?.square()?.sum_all());
    let bad = Tensor::from_vec(vec![1i64, 5], [2]).unwrap();
    let err = Graph::scope(|g| e.forward(&store.bind(g), &bad).map(|_| ())).unwrap_err();
    assert!(matches!(err, Error::IndexOutOfRange { index: 5, size: 5, .. }), "{err}");
}

/// (x - mean) / sqrt(var + eps) * w + b per row, with explicit loops.
fn layer_norm_ref(x: &[f64], d: usize, w: &[f64], b: Option<&[f64]>, eps: f64, rms: bool) -> Vec<f64> {
    x.chunks(d)
        .flat_map(|r| {
            let mean = if rms { 0.0 } else { r.iter().sum::<f64>() / d as f64 };
            let var = r.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d as f64;
            (0..d).map(move |i| (r[i] - mean) / (var + eps).sqrt() * w[i] + b.map_or(0.0, |b| b[i])).collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn layer_norm_forward_and_gradients() {
    let mut store = ParamStore::new();
    let ln = LayerNorm::new(&mut store, "ln", 4, true, DType::F64).unwrap();
    // Non-trivial affine parameters, so their gradients are checked too.
    store.set(ln.weight.unwrap(), rnd(&[4], 6)).unwrap();
    store.set(ln.bias.unwrap(), rnd(&[4], 7)).unwrap();
    let x = rnd(&[3, 4], 8).mul_scalar(3.0).unwrap();
    let y = eval(&store, &x, &|p, x| ln.forward(p, x));
    let (w, b) = (store.get(ln.weight.unwrap()).to_vec_f64(), store.get(ln.bias.unwrap()).to_vec_f64());
    close(&y, &layer_norm_ref(&x.to_vec_f64(), 4, &w, Some(&b), 1e-5, false), 1e-12);
    check_layer(&store, Some(x), &[1, 2], &|p, x| ln.forward(p, x.unwrap()));
}

#[test]
fn rms_norm_forward_and_gradients() {
    let mut store = ParamStore::new();
    let n = RmsNorm::new(&mut store, "rms", 5, DType::F64).unwrap();
    store.set(n.weight.unwrap(), rnd(&[5], 9)).unwrap();
    let x = rnd(&[2, 3, 5], 10);
    let y = eval(&store, &x, &|p, x| n.forward(p, x));
    let w = store.get(n.weight.unwrap()).to_vec_f64();
    close(&y, &layer_norm_ref(&x.to_vec_f64(), 5, &w, None, 1e-6, true), 1e-12);
    check_layer(&store, Some(x), &[1, 2], &|p, x| n.forward(p, x.unwrap()));
}

/// The fused op and its composition agree: values, first-order gradients
/// (the op's one-pass kernel) and second-order ones (its differentiable
/// formulation), in f64 and f32.
/// A norm layer's forward, as the comparisons below take it.
type NormFn<'a> = &'a dyn for<'g> Fn(&Bound<'g>, Var<'g>) -> R<'g>;

/// `run` (the values a norm's forward and its gradients produce) agrees
/// between the fused op and its composition, for both norms.
fn fused_matches_composed(ln: &LayerNorm, rms: &RmsNorm, run: &dyn Fn(NormFn<'_>) -> Vec<Vec<f64>>, tol: f64) {
    for (fused, composed) in [
        (run(&|p, x| ln.forward(p, x)), run(&|p, x| ln.forward_composed(p, x))),
        (run(&|p, x| rms.forward(p, x)), run(&|p, x| rms.forward_composed(p, x))),
    ] {
        for (a, b) in fused.iter().zip(&composed) {
            close(a, b, tol);
        }
    }
}

#[test]
fn norm_op_matches_its_composition() {
    for dtype in [DType::F64, DType::F32] {
        let tol = if dtype == DType::F64 { 1e-12 } else { 2e-5 };
        let mut store = ParamStore::new();
        let ln = LayerNorm::new(&mut store, "ln", 6, true, dtype).unwrap();
        let rms = RmsNorm::new(&mut store, "rms", 6, dtype).unwrap();
        for id in store.ids().collect::<Vec<_>>() {
            store.set(id, rnd(&[6], 30 + id.index() as u64).cast(dtype).unwrap()).unwrap();
        }
        let x0 = rnd(&[2, 3, 6], 31).mul_scalar(2.0).unwrap().cast(dtype).unwrap();
        let r = rnd(&[2, 3, 6], 32).cast(dtype).unwrap();
        let run = |f: NormFn<'_>| {
            Graph::scope(|g| {
                let p = store.bind(g);
                let x = g.leaf(x0.clone());
                let y = f(&p, x)?;
                let s = y.mul(&g.constant(r.clone()))?.sum_all()?;
                let mut wrt = p.vars().to_vec();
                wrt.push(x);
                // Second order: the gradient of the squared norm of the gradients.
                let g1 = g.grad_graph(s, &wrt)?;
                let mut n2 = g1[0].square()?.sum_all()?;
                for gi in &g1[1..] {
                    n2 = n2.add(&gi.square()?.sum_all()?)?;
                }
                let h = g.grad(n2, &wrt)?;
                let first = Graph::scope(|g2| {
                    let p2 = store.bind(g2);
                    let x2 = g2.leaf(x0.clone());
                    let s2 = f(&p2, x2)?.mul(&g2.constant(r.clone()))?.sum_all()?;
                    let mut wrt2 = p2.vars().to_vec();
                    wrt2.push(x2);
                    g2.grad(s2, &wrt2)
                })?;
                let mut out = vec![y.value()?.to_vec_f64()];
                out.extend(first.iter().map(|t| t.to_vec_f64()));
                out.extend(h.iter().map(|t| t.to_vec_f64()));
                Ok::<_, Error>(out)
            })
            .unwrap()
        };
        fused_matches_composed(&ln, &rms, &run, tol);
    }
}

#[test]
fn dropout_is_seeded_scaled_and_identity_in_eval() {
    let d = Dropout::new(0.25).unwrap();
    assert!(Dropout::new(1.0).is_err() && Dropout::new(-0.1).is_err());
    let x = Tensor::ones([4000], DType::F32).expect("alloc");
    let run = |seed: Option<u64>| {
        Graph::scope(|g| {
            let mut rng = seed.map(Rng::new);
            d.forward(g.constant(x.clone()), rng.as_mut())?.value()?.to_vec::<f32>()
        })
        .unwrap()
    };
    assert_eq!(run(None), vec![1.0; 4000], "identity in evaluation");
    let a = run(Some(1));
    assert_eq!(a, run(Some(1)), "same seed, same mask");
    assert_ne!(a, run(Some(2)));
    assert!(a.iter().all(|&v| v == 0.0 || v == 1.0 / 0.75));
    let dropped = a.iter().filter(|&&v| v == 0.0).count() as f64 / 4000.0;
    assert!((dropped - 0.25).abs() < 0.03, "dropped {dropped}");
    // The gradient is the mask: checked with the mask fixed by the seed.
    check_grads(
        &|_g, v| d.forward(v[0], Some(&mut Rng::new(3)))?.square()?.sum_all(),
        &[rnd(&[6, 5], 11)],
        &CheckOptions::default(),
    )
    .unwrap();
}

/// softmax(scale * s) over keys j <= i + (tk - tq), zero elsewhere.
fn causal_ref(s: &[f64], tq: usize, tk: usize, scale: f64) -> Vec<f64> {
    s.chunks(tk)
        .enumerate()
        .flat_map(|(r, row)| {
            let n = (r % tq) + 1 + tk - tq;
            let m = row[..n].iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b * scale));
            let z: f64 = row[..n].iter().map(|&v| (v * scale - m).exp()).sum();
            (0..tk).map(move |j| if j < n { (row[j] * scale - m).exp() / z } else { 0.0 }).collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn causal_softmax_forward_and_gradients() {
    for (tq, tk) in [(4, 4), (2, 5)] {
        let s = rnd(&[2, 3, tq, tk], 12).mul_scalar(4.0).unwrap();
        let y = causal_softmax(&s, 0.7).unwrap();
        close(&y.to_vec_f64(), &causal_ref(&s.to_vec_f64(), tq, tk, 0.7), 1e-12);
        // f32 takes the same path.
        let y32 = causal_softmax(&s.cast(DType::F32).unwrap(), 0.7).unwrap();
        close(&y32.to_vec_f64(), &y.to_vec_f64(), 1e-6);
        check_grads(&|_g, v| causal_softmax(&v[0], 0.7), &[s], &CheckOptions::default()).unwrap();
    }
    assert!(matches!(causal_softmax(&rnd(&[5, 3], 1), 1.0), Err(Error::InvalidShape { op: "causal_softmax", .. })));
}

/// Attention with explicit loops: per batch and head, q k^T / sqrt(hd)
/// over j <= i, softmax, times v, then the output projection.
fn attention_ref(store: &ParamStore, a: &CausalSelfAttention, x: &[f64], b: usize, t: usize, c: usize) -> Vec<f64> {
    let lin = |l: &Linear, inp: &[f64]| -> Vec<f64> {
        let (w, bias) = (store.get(l.weight).to_vec_f64(), store.get(l.bias.unwrap()).to_vec_f64());
        inp.chunks(c)
            .flat_map(|r| {
                (0..c).map(|o| bias[o] + (0..c).map(|i| r[i] * w[o * c + i]).sum::<f64>()).collect::<Vec<_>>()
            })
            .collect()
    };
    let (q, k, v) = (lin(&a.q, x), lin(&a.k, x), lin(&a.v, x));
    let (h, hd) = (a.heads, c / a.heads);
    let mut y = vec![0.0; b * t * c];
    for bi in 0..b {
        for hi in 0..h {
            let at = |m: &[f64], ti: usize, d: usize| m[(bi * t + ti) * c + hi * hd + d];
            for i in 0..t {
                let scores: Vec<f64> = (0..=i)
                    .map(|j| (0..hd).map(|d| at(&q, i, d) * at(&k, j, d)).sum::<f64>() / (hd as f64).sqrt())
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                for d in 0..hd {
                    y[(bi * t + i) * c + hi * hd + d] =
                        (0..=i).map(|j| (scores[j] - m).exp() / z * at(&v, j, d)).sum::<f64>();
                }
            }
        }
    }
    lin(&a.proj, &y)
}

#[test]
fn attention_forward_matches_loops_and_is_causal() {
    let (b, t, c) = (2, 4, 6);
    let mut store = ParamStore::new();
    let a = CausalSelfAttention::new(&mut store, "a", c, 3, 0.5, 0.5, &mut Rng::new(13), DType::F64).unwrap();
    // Non-zero biases, so they matter.
    for id in store.ids().collect::<Vec<_>>() {
        if store.name(id).ends_with("bias") {
            store.set(id, rnd(&[c], id.index() as u64)).unwrap();
        }
    }
    let x = rnd(&[b, t, c], 14);
    let y = eval(&store, &x, &|p, x| a.forward(p, x, None));
    close(&y, &attention_ref(&store, &a, &x.to_vec_f64(), b, t, c), 1e-12);
    // Changing the last position changes no earlier output.
    let mut x2 = x.to_vec_f64();
    for v in &mut x2[(t - 1) * c..t * c] {
        *v += 1.0;
    }
    let y2 = eval(&store, &Tensor::from_vec(x2, [b, t, c]).unwrap(), &|p, x| a.forward(p, x, None));
    assert_eq!(&y[..(t - 1) * c], &y2[..(t - 1) * c]);
    assert_ne!(&y[(t - 1) * c..t * c], &y2[(t - 1) * c..t * c]);
    check_layer(&store, Some(x), &[1], &|p, x| a.forward(p, x.unwrap(), None));
}

#[test]
fn attention_second_order_on_a_tiny_input() {
    let mut store = ParamStore::new();
    let a = CausalSelfAttention::new(&mut store, "a", 2, 1, 0.7, 0.7, &mut Rng::new(15), DType::F64).unwrap();
    check_layer(&store, Some(rnd(&[1, 3, 2], 16)), &[2], &|p, x| a.forward(p, x.unwrap(), None));
}

fn tiny_gpt(tie: bool) -> (ParamStore, Gpt) {
    let cfg = GptConfig {
        vocab: 5,
        block_size: 4,
        d_model: 4,
        n_layer: 1,
        n_head: 2,
        mlp_ratio: 2,
        dropout: 0.0,
        tie_weights: tie,
    };
    let mut store = ParamStore::new();
    let gpt = Gpt::new(&mut store, cfg, &mut Rng::new(17), DType::F64).unwrap();
    // Larger weights than GPT-2's 0.02, so every path carries signal.
    for id in store.ids().collect::<Vec<_>>() {
        let t = store.get(id).clone();
        store.set(id, t.add(&rnd(t.dims(), 100 + id.index() as u64).mul_scalar(0.5).unwrap()).unwrap()).unwrap();
    }
    (store, gpt)
}

#[test]
fn gpt_logits_are_causal_and_the_loss_is_their_cross_entropy() {
    for tie in [true, false] {
        let (store, gpt) = tiny_gpt(tie);
        assert_eq!(store.id("head.weight").is_some(), !tie);
        let ids = Tensor::from_vec(vec![1i64, 4, 0, 2, 3, 3, 1, 0], [2, 4]).unwrap();
        let targets = Tensor::from_vec(vec![4i64, 0, -100, 3, 3, 1, 0, 2], [2, 4]).unwrap();
        let (logits, loss, shape) = Graph::scope(|g| {
            let p = store.bind(g);
            let l = gpt.logits(&p, &ids, None)?;
            Ok::<_, Error>((l.value()?, gpt.loss(&p, &ids, &targets, None)?.item()?, l.shape()))
        })
        .unwrap();
        assert_eq!(shape.dims(), &[2, 4, 5]);
        let want = logits.sparse_cross_entropy(&targets).unwrap().item().unwrap();
        assert!((loss - want).abs() < 1e-12, "{loss} vs {want}");
        // A later token never changes an earlier position's logits.
        let ids2 = Tensor::from_vec(vec![1i64, 4, 0, 0, 3, 3, 1, 4], [2, 4]).unwrap();
        let l2 = Graph::scope(|g| gpt.logits(&store.bind(g), &ids2, None)?.value()).unwrap();
        let (a, b) = (logits.to_vec_f64(), l2.to_vec_f64());
        for row in 0..2 {
            let s = row * 20;
            assert_eq!(&a[s..s + 15], &b[s..s + 15]);
            assert_ne!(&a[s + 15..s + 20], &b[s + 15..s + 20]);
        }
    }
}

#[test]
fn gpt_gradients() {
    let (store, gpt) = tiny_gpt(true);
    let ids = Tensor::from_vec(vec![1i64, 4, 0, 2, 3, 3], [2, 3]).unwrap();
    let targets = Tensor::from_vec(vec![4i64, 0, 1, 3, -100, 2], [2, 3]).unwrap();
    check_layer(&store, None, &[1], &|p, _| gpt.loss(p, &ids, &targets, None));
    assert!(Graph::scope(|g| gpt
        .logits(&store.bind(g), &Tensor::zeros([1, 5], DType::I64).expect("alloc"), None)
        .map(|_| ()))
    .is_err());
}

#[test]
fn mse_value_gradient_and_shape_check() {
    let (a, b) = (rnd(&[3, 2], 18), rnd(&[3, 2], 19));
    let want = a.to_vec_f64().iter().zip(b.to_vec_f64()).map(|(x, y)| (x - y).powi(2)).sum::<f64>() / 6.0;
    assert!((mse(&a, &b).unwrap().item().unwrap() - want).abs() < 1e-15);
    check_grads(&|_g, v| mse(&v[0], &v[1]), &[a.clone(), b], &CheckOptions::default()).unwrap();
    assert!(matches!(mse(&a, &rnd(&[6], 1)), Err(Error::ShapeMismatch { op: "mse", .. })));
}

/// The activations' one-pass eager backward (tapir-tensor's unary ops)
/// agrees with their differentiable derivative line (used when recording).
#[test]
fn activation_backward_eager_matches_recorded() {
    for dtype in [DType::F64, DType::F32] {
        let x0 = rnd(&[5, 7], 40).mul_scalar(3.0).unwrap().cast(dtype).unwrap();
        let r = rnd(&[5, 7], 41).cast(dtype).unwrap();
        for act in [Activation::Relu, Activation::Gelu, Activation::GeluTanh, Activation::Tanh] {
            let (eager, recorded) = Graph::scope(|g| {
                let x = g.leaf(x0.clone());
                let s = act.apply(&x)?.mul(&g.constant(r.clone()))?.sum_all()?;
                let recorded = g.grad_graph(s, &[x])?[0].value()?;
                Ok::<_, Error>((g.grad(s, &[x])?.remove(0), recorded))
            })
            .unwrap();
            close(&eager.to_vec_f64(), &recorded.to_vec_f64(), if dtype == DType::F64 { 1e-12 } else { 1e-5 });
        }
    }
}

/// The fused attention op against its composition (matmuls and the causal
/// softmax): values, eager first-order gradients (its one-pass kernel) and
/// the recorded rule, plus the gradient checker at orders 1 and 2.
/// Inputs of 32 Ki elements and more take the kernels' split over the
/// pool's threads (rows in parts, per-part sums of dw and db).
#[test]
fn norm_op_split_over_threads_matches_its_composition() {
    let (rows, d) = (600, 64);
    let mut store = ParamStore::new();
    let ln = LayerNorm::new(&mut store, "ln", d, true, DType::F64).unwrap();
    let rms = RmsNorm::new(&mut store, "rms", d, DType::F64).unwrap();
    for id in store.ids().collect::<Vec<_>>() {
        store.set(id, rnd(&[d], 60 + id.index() as u64)).unwrap();
    }
    let (x0, r) = (rnd(&[rows, d], 61).mul_scalar(3.0).unwrap(), rnd(&[rows, d], 62));
    let run = |f: NormFn<'_>| {
        Graph::scope(|g| {
            let p = store.bind(g);
            let x = g.leaf(x0.clone());
            let y = f(&p, x)?;
            let mut wrt = p.vars().to_vec();
            wrt.push(x);
            let mut out = vec![y.value()?.to_vec_f64()];
            let grads = g.grad(y.mul(&g.constant(r.clone()))?.sum_all()?, &wrt)?;
            out.extend(grads.iter().map(|t| t.to_vec_f64()));
            Ok::<_, Error>(out)
        })
        .unwrap()
    };
    fused_matches_composed(&ln, &rms, &run, 1e-11);
}

#[test]
fn causal_attention_op_matches_its_composition() {
    let (q, k, v) = (rnd(&[2, 4, 6], 50), rnd(&[2, 4, 6], 51), rnd(&[2, 4, 6], 52));
    let op = CausalAttention { heads: 3, scale: 1.0 / 2f64.sqrt() };
    let fused = causal_attention(&q, &k, &v, 3).unwrap();
    close(&fused.to_vec_f64(), &op.composed(&q, &k, &v).unwrap().to_vec_f64(), 1e-14);
    let r = rnd(&[2, 4, 6], 53);
    let (eager, recorded, reference) = Graph::scope(|g| {
        let xs = [g.leaf(q.clone()), g.leaf(k.clone()), g.leaf(v.clone())];
        let s = causal_attention(&xs[0], &xs[1], &xs[2], 3)?.mul(&g.constant(r.clone()))?.sum_all()?;
        let recorded: Vec<Tensor> = g.grad_graph(s, &xs)?.iter().map(|t| t.value()).collect::<Result<_>>()?;
        let eager = g.grad(s, &xs)?;
        let s2 = op.composed(&xs[0], &xs[1], &xs[2])?.mul(&g.constant(r.clone()))?.sum_all()?;
        Ok::<_, Error>((eager, recorded, g.grad(s2, &xs)?))
    })
    .unwrap();
    for ((a, b), c) in eager.iter().zip(&recorded).zip(&reference) {
        close(&a.to_vec_f64(), &c.to_vec_f64(), 1e-13);
        close(&b.to_vec_f64(), &c.to_vec_f64(), 1e-13);
    }
    check_grads(&|_g, x| causal_attention(&x[0], &x[1], &x[2], 2), &[q, k, v], &CheckOptions::default()).unwrap();
    assert!(causal_attention(&rnd(&[2, 4, 6], 1), &rnd(&[2, 4, 6], 2), &rnd(&[2, 3, 6], 3), 3).is_err());
    assert!(causal_attention(&rnd(&[2, 4, 6], 1), &rnd(&[2, 4, 6], 2), &rnd(&[2, 4, 6], 3), 4).is_err());
}

/// A wrong input width is reported by the layer, naming it and the
/// dimension, before any op runs.
#[test]
fn shape_errors_name_the_layer_and_the_dimension() {
    let mut store = ParamStore::new();
    let mut rng = Rng::new(0);
    let mlp =
        tapir_nn::Mlp::new(&mut store, "m", &[2, 16, 8, 1], tapir_nn::Activation::Relu, &mut rng, DType::F32).unwrap();
    let lin = Linear::new(&mut store, "l", 3, 4, true, &mut rng, DType::F32).unwrap();
    let run = |f: &dyn for<'g> Fn(&Bound<'g>, Var<'g>) -> R<'g>, x: Tensor| {
        Graph::scope(|g| f(&store.bind(g), g.constant(x))?.value()).unwrap_err().to_string()
    };
    assert_eq!(
        run(&|p, x| mlp.forward(p, x), Tensor::zeros([16, 1], DType::F32).unwrap()),
        "Mlp: invalid shape [16, 1]: layer 0 of 3 (Linear 2 -> 16) expects 2 input features in the last dimension, got 1"
    );
    assert_eq!(
        run(&|p, x| lin.forward(p, x), Tensor::zeros([5, 2, 2], DType::F32).unwrap()),
        "Linear: invalid shape [5, 2, 2]: Linear 3 -> 4 expects 3 input features in the last dimension, got 2"
    );
    assert_eq!(
        run(&|p, x| lin.forward(p, x), Tensor::scalar(1.0)),
        "Linear: invalid shape []: Linear 3 -> 4 needs an input of rank 1 or more, [..., 3]"
    );
}
