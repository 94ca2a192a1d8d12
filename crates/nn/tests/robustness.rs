//! Misuse of the nn crate's public API is an error, never a panic: op
//! structs applied with too few inputs, layers bound from another store,
//! optimizers handed gradients that do not fit.

use tapir_autograd::Graph;
use tapir_nn::{Adam, CausalAttention, Embedding, Grads, LayerNorm, Lbfgs, Linear, NormOp, Optimizer, ParamStore};
use tapir_tensor::prelude::*;

/// The memory counters are process-wide: a test asserting on them holds
/// this lock, and so does every other test of this binary.
static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn x23() -> Tensor {
    Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], [2, 3]).expect("test tensor")
}

#[test]
fn nn_op_structs_check_their_input_count() {
    let _g = lock();
    let x = x23();
    let norm = NormOp { eps: 1e-5, rms: false, has_weight: true, has_bias: false, out: None };
    match Tensor::apply(norm, &[&x]) {
        Err(Error::InvalidArgument { op: "layer_norm", reason }) => assert!(reason.contains("takes 2 inputs, got 1")),
        other => panic!("expected an arity error, got {other:?}"),
    }
    let attn = CausalAttention { heads: 1, scale: 1.0 };
    match Tensor::apply(attn, &[&x]) {
        Err(Error::InvalidArgument { op, reason }) => {
            assert!(reason.contains("takes 3 inputs, got 1"), "{op}: {reason}")
        }
        other => panic!("expected an arity error, got {other:?}"),
    }
}

fn is_bound_error<T: std::fmt::Debug>(r: Result<T>) {
    match r {
        Err(Error::InvalidArgument { op: "Bound::var", reason }) => assert!(reason.contains("not in the bound store")),
        other => panic!("expected a Bound::var error, got {other:?}"),
    }
}

#[test]
fn a_layer_bound_from_another_store_is_an_error() {
    let _g = lock();
    let mut rng = Rng::new(2);
    let mut store = ParamStore::new();
    let _first = Linear::new(&mut store, "a", 3, 3, true, &mut rng, DType::F32).expect("layer");
    let lin = Linear::new(&mut store, "b", 3, 2, true, &mut rng, DType::F32).expect("layer");
    let emb = Embedding::new(&mut store, "e", 4, 3, 1.0, &mut rng, DType::F32).expect("table");
    let ln = LayerNorm::new(&mut store, "n", 3, true, DType::F32).expect("norm");
    let mut other = ParamStore::new();
    other.add("only", Tensor::ones([2, 3], DType::F32).expect("ones")).expect("param");
    let before = memory_allocated(Device::Cpu);
    Graph::scope(|g| {
        let p = other.bind(g);
        let x = g.constant(x23());
        is_bound_error(lin.forward(&p, x));
        is_bound_error(emb.forward(&p, &Tensor::from_vec(vec![0i64], [1])?));
        is_bound_error(ln.forward(&p, x));
        // The right store still works.
        let q = store.bind(g);
        assert_eq!(lin.forward(&q, x)?.shape().dims(), [2, 2]);
        Ok::<_, Error>(())
    })
    .expect("scope");
    assert_eq!(memory_allocated(Device::Cpu), before);
}

fn one_param() -> ParamStore {
    let mut s = ParamStore::new();
    s.add("w", Tensor::from_vec(vec![1.0f64, -2.0, 0.5], [3]).expect("w")).expect("param");
    s
}

#[test]
fn lbfgs_checks_the_gradients_its_closure_returns() {
    let _g = lock();
    let bad: [(&str, Vec<Tensor>); 4] = [
        ("none", vec![]),
        ("two", vec![Tensor::zeros([3], DType::F64).expect("g"), Tensor::zeros([3], DType::F64).expect("g")]),
        ("short", vec![Tensor::ones([2], DType::F64).expect("g")]),
        ("f32", vec![Tensor::ones([3], DType::F32).expect("g")]),
    ];
    for (what, g) in bad {
        let mut store = one_param();
        let mut opt = Lbfgs::new(5);
        let r = opt.step(&mut store, |_| Ok((1.0, Grads::from_tensors(g.clone()))));
        assert!(
            matches!(r, Err(Error::InvalidArgument { .. } | Error::ShapeMismatch { .. } | Error::DTypeMismatch { .. })),
            "{what}: {r:?}"
        );
        assert_eq!(store.get(store.id("w").expect("id")).to_vec::<f64>().expect("w"), [1.0, -2.0, 0.5]);
    }
    // Right at the first evaluation, wrong in the line search: the error
    // comes back and the parameters are where the step began.
    let mut store = one_param();
    let mut opt = Lbfgs::new(5);
    let mut calls = 0;
    let r = opt.step(&mut store, |s| {
        calls += 1;
        let w = s.get(s.id("w").expect("id")).clone();
        let loss = w.square()?.sum_all()?.item()?;
        let g = if calls == 1 { w.mul_scalar(2.0)? } else { Tensor::ones([1], DType::F64)? };
        Ok((loss, Grads::from_tensors(vec![g])))
    });
    assert!(matches!(r, Err(Error::ShapeMismatch { op: "Lbfgs::step", .. })), "{r:?}");
    assert_eq!(calls, 2);
    assert_eq!(store.get(store.id("w").expect("id")).to_vec::<f64>().expect("w"), [1.0, -2.0, 0.5]);
}

#[test]
fn lbfgs_forgets_curvature_of_another_parameter_space() {
    let _g = lock();
    let quad = |s: &ParamStore| -> Result<(f64, Grads)> {
        let gs = s.ids().map(|id| s.get(id).mul_scalar(2.0)).collect::<Result<Vec<_>>>()?;
        let loss = s.ids().map(|id| s.get(id).square()?.sum_all()?.item()).sum::<Result<f64>>()?;
        Ok((loss, Grads::from_tensors(gs)))
    };
    let mut store = one_param();
    let mut opt = Lbfgs::new(5);
    opt.step(&mut store, quad).expect("first step");
    opt.step(&mut store, quad).expect("second step");
    store.add("v", Tensor::ones([4], DType::F64).expect("v")).expect("param");
    let r = opt.step(&mut store, quad).expect("a step over the larger space");
    assert!(r.loss < r.loss_before, "{r:?}");
}

#[test]
fn adam_and_lbfgs_agree_on_what_fits() {
    let _g = lock();
    // The same gradients Lbfgs rejects, Adam rejects: one rule for both.
    let mut store = one_param();
    let short = Grads::from_tensors(vec![Tensor::ones([2], DType::F64).expect("g")]);
    assert!(Adam::new(0.1).step(&mut store, &short).is_err());
    assert!(short.check_fits(&store, "test").is_err());
    let ok = Grads::from_tensors(vec![Tensor::ones([3], DType::F64).expect("g")]);
    assert!(ok.check_fits(&store, "test").is_ok());
}

#[test]
fn causal_softmax_over_no_keys_is_empty_not_a_panic() {
    // Found by the op_structs fuzz target: a [.., 0, 0] score block asked
    // for rows of zero keys, which `chunks` cannot make.
    let _g = lock();
    let x = Tensor::zeros([2, 0, 0], DType::F32).expect("empty scores");
    let y = Tensor::apply(tapir_nn::CausalSoftmax { scale: 1.0 }, &[&x]).expect("empty result");
    assert_eq!(y.dims(), [2, 0, 0]);
    let y = tapir_nn::causal_softmax(&x.cast(DType::F64).expect("f64"), 0.5).expect("f64 too");
    assert_eq!(y.dims(), [2, 0, 0]);
}
