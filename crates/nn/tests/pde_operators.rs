//! The forward-Laplacian jet against nested autodiff, and L-BFGS on the
//! Rosenbrock function.

use tapir_autograd::Graph;
use tapir_nn::{Activation, Grads, Lbfgs, LineSearch, Mlp, ParamStore};
use tapir_tensor::prelude::*;

fn close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{what} at {i}: {x} vs {y}");
    }
}

#[test]
fn forward_jet_matches_nested_autodiff_and_trains_the_same() {
    for act in [Activation::Tanh, Activation::Sin] {
        let mut rng = Rng::new(3);
        let mut store = ParamStore::new();
        let net = Mlp::xavier(&mut store, "u", &[3, 16, 16, 1], act, &mut rng, DType::F64).unwrap();
        let pts = rng.uniform([7, 3], -1.0, 1.0, DType::F64).unwrap();
        for dims in [vec![0, 1, 2], vec![1], vec![1, 2], vec![0, 2]] {
            Graph::scope(|g| {
                let p = store.bind(g);
                let x = g.leaf(pts.clone());
                let jet = net.forward_jet(&p, x, &dims)?;
                let u = net.forward(&p, x)?;
                close(&jet.value.value()?.to_vec::<f64>()?, &u.value()?.to_vec::<f64>()?, 1e-12, "value");
                let nested = g.second_partials(u, x, &dims)?.sum(&[1], false)?;
                let lap = jet.laplacian.reshape([7])?;
                close(&lap.value()?.to_vec::<f64>()?, &nested.value()?.to_vec::<f64>()?, 1e-10, "laplacian");
                let grad = g.point_gradient(u, x)?;
                close(
                    &jet.jacobian.reshape([7, 3])?.value()?.to_vec::<f64>()?,
                    &grad.value()?.to_vec::<f64>()?,
                    1e-12,
                    "jacobian",
                );
                // Parameter gradients of a loss on the Laplacian agree.
                let a = p.grads(lap.square()?.sum_all()?)?;
                let b = p.grads(nested.square()?.sum_all()?)?;
                for ((_, x), (_, y)) in a.iter().zip(b.iter()) {
                    close(&x.to_vec::<f64>()?, &y.to_vec::<f64>()?, 1e-9, "parameter gradient");
                }
                Ok::<_, Error>(())
            })
            .unwrap();
        }
    }
}

#[test]
fn forward_jet_rejects_bad_input() {
    let mut rng = Rng::new(1);
    let mut store = ParamStore::new();
    let relu = Mlp::new(&mut store, "r", &[2, 4, 1], Activation::Relu, &mut rng, DType::F64).unwrap();
    Graph::scope(|g| {
        let p = store.bind(g);
        let x = g.leaf(Tensor::ones([3, 2], DType::F64).expect("alloc"));
        assert!(matches!(relu.forward_jet(&p, x, &[0]), Err(Error::InvalidArgument { .. })));
        let x1 = g.leaf(Tensor::ones([3], DType::F64).expect("alloc"));
        assert!(matches!(relu.forward_jet(&p, x1, &[0]), Err(Error::InvalidShape { .. })));
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn lbfgs_solves_rosenbrock() {
    for search in [LineSearch::Backtracking, LineSearch::StrongWolfe] {
        rosenbrock_with(search);
    }
}

fn rosenbrock_with(search: LineSearch) {
    let mut store = ParamStore::new();
    let id = store.add("xy", Tensor::from_vec(vec![-1.2f64, 1.0], [2]).unwrap()).unwrap();
    let mut opt = Lbfgs::new(10).with_line_search(search);
    let calls = std::cell::Cell::new(0usize);
    let rosenbrock = |s: &ParamStore| -> Result<(f64, Grads)> {
        calls.set(calls.get() + 1);
        Graph::scope(|g| {
            let p = s.bind(g);
            let v = p.var(id)?;
            let (x, y) = (v.narrow(0, 0, 1)?, v.narrow(0, 1, 1)?);
            let f = x.rsub_scalar(1.0)?.square()?.add(&y.sub(&x.square()?)?.square()?.mul_scalar(100.0)?)?.sum_all()?;
            Ok((f.item()?, p.grads(f)?))
        })
    };
    let mut iters = 0;
    let mut last = f64::INFINITY;
    let mut reported = 0;
    for _ in 0..200 {
        iters += 1;
        let st = opt.step(&mut store, rosenbrock).unwrap();
        reported += st.evals;
        assert_eq!(reported, calls.get(), "evals counts every call of f");
        if iters > 1 {
            assert!(st.evals >= 1, "each step evaluates at least its trial point");
        }
        assert!(st.loss <= st.loss_before, "a step never increases the loss");
        last = st.loss;
        if st.converged || st.loss < 1e-20 {
            break;
        }
    }
    let xy = store.get(id).to_vec::<f64>().unwrap();
    assert!(
        (xy[0] - 1.0).abs() < 1e-6 && (xy[1] - 1.0).abs() < 1e-6,
        "{search:?}: {xy:?} after {iters} iterations, loss {last}"
    );
    assert!(iters < 100, "{search:?}: {iters} iterations");
    // Each step starts where the last one ended and reuses that evaluation.
    assert!(calls.get() < 2 * iters, "{search:?}: {} evaluations for {iters} iterations", calls.get());
}
