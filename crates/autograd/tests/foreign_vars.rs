//! Every entry point that takes `Var`s checks that they belong to the graph
//! it is called on. Lifetimes catch most mixes at compile time, but not a
//! nested scope: the inner graph's methods taking `Var<'_>` accept the outer
//! graph's handles, and the outer graph's `&self` reborrows for the inner
//! scope's lifetime. Unchecked, a foreign node id reads an unrelated node
//! (silently wrong numbers) or none (a panic).

use tapir_autograd::{Graph, Var};
use tapir_tensor::prelude::*;
use tapir_testing::test_device;

fn points() -> Tensor {
    Tensor::from_vec(vec![0.5f64, -1.0, 2.0, 0.25], [2, 2]).expect("points")
}

fn is_graph_error<T: std::fmt::Debug>(r: Result<T>, op: &str) {
    match r {
        Err(Error::Graph { reason }) => assert!(reason.contains(op), "{op}: {reason}"),
        other => panic!("{op}: expected Error::Graph, got {other:?}"),
    }
}

test_device! {
    /// On every device: the checks run before any op does (the gradient of
    /// a non-scalar output needs no reduction).
    fn the_inner_graph_rejects_outer_handles(device: Device) {
        let pts = || points().to_device(device).expect("points");
        Graph::scope(|outer| {
            let x = outer.leaf(pts());
            let y = x.square()?;
            let ones = Tensor::ones_on([2, 2], DType::F64, device)?;
            // Empty inner graph: this used to panic on an invalid slotmap key.
            Graph::scope(|inner| {
                is_graph_error(inner.jvp(&[y], &[x], std::slice::from_ref(&ones)), "jvp");
                Ok::<_, Error>(())
            })?;
            // A busy inner graph: this used to return e^5 from unrelated nodes.
            Graph::scope(|inner| {
                let z = inner.leaf(Tensor::full_on([2, 2], 5.0, DType::F64, device)?);
                let _ = z.exp()?.square()?;
                is_graph_error(inner.jvp(&[y], &[x], std::slice::from_ref(&ones)), "jvp");
                is_graph_error(inner.jvp(&[z], &[x], std::slice::from_ref(&ones)), "jvp");
                is_graph_error(inner.grad(y, &[x]), "grad");
                is_graph_error(inner.hvp(y, x, &ones), "hvp");
                is_graph_error(inner.hessian(y, x), "hessian");
                is_graph_error(inner.jacobian(y, x), "jacobian");
                Ok::<_, Error>(())
            })?;
            // The right graph still gives 2x.
            let t = outer.jvp(&[y], &[x], std::slice::from_ref(&ones))?.remove(0);
            assert_eq!(t.device(), device);
            assert_eq!(t.to_vec::<f64>()?, [1.0, -2.0, 4.0, 0.5]);
            Ok::<_, Error>(())
        })
        .expect("scopes");
    }
}

#[test]
fn the_outer_graph_rejects_inner_handles_in_recorded_operators() {
    Graph::scope(|outer| {
        let _ = outer.leaf(points()).square()?;
        Graph::scope(|inner| {
            let x: Var<'_> = inner.leaf(points());
            let u = x.square()?.sum(&[1], false)?;
            let t = inner.constant(Tensor::ones([2, 2], DType::F64)?);
            let f = u.sum_all()?;
            is_graph_error(outer.jvp_graph(&[u], &[x], &[t]), "jvp_graph");
            is_graph_error(outer.grad_graph(f, &[x]), "grad");
            is_graph_error(outer.hvp_graph(f, x, t), "hvp_graph");
            is_graph_error(outer.second_partials(u, x, &[0]), "second_partials");
            is_graph_error(outer.hessian_diag(u, x), "hessian_diag");
            is_graph_error(outer.laplacian(u, x), "hessian_diag");
            is_graph_error(outer.mixed_partial(u, x, 0, 1), "mixed_partial");
            is_graph_error(outer.point_gradient(u, x), "point_gradient");
            let mut rng = Rng::new(1);
            is_graph_error(outer.laplacian_hutchinson(u, x, 2, &mut rng), "laplacian_hutchinson");
            // A tangent or seed from the other graph, with the rest right.
            let xo = outer.leaf(points());
            let uo = xo.square()?.sum(&[1], false)?;
            is_graph_error(outer.jvp_graph(&[uo], &[xo], &[t]), "jvp_graph");
            let fo = uo.sum_all()?;
            is_graph_error(outer.hvp_graph(fo, xo, t), "hvp_graph");
            is_graph_error(outer.grad_graph_with(&[uo], &[xo], Some(&[u])), "grad");
            // And the inner graph on its own handles still works.
            let lap = inner.laplacian(u, x)?;
            assert_eq!(lap.value()?.to_vec::<f64>()?, [4.0, 4.0]);
            Ok::<_, Error>(())
        })
    })
    .expect("scopes");
}

#[test]
fn operators_over_zero_coordinates_give_zeros() {
    // torch: the Laplacian over no coordinates is an empty trace, zero.
    Graph::scope(|g| {
        let x = g.leaf(Tensor::zeros([3, 0], DType::F64)?);
        let u = x.sum(&[1], false)?.add_scalar(1.0)?;
        let lap = g.laplacian(u, x)?;
        assert_eq!(lap.value()?.dims(), [3]);
        assert_eq!(lap.value()?.to_vec::<f64>()?, [0.0; 3]);
        assert_eq!(g.hessian_diag(u, x)?.value()?.dims(), [3, 0]);
        // No listed coordinates of a non-empty point set.
        let y = g.leaf(points());
        let v = y.square()?.sum(&[1], false)?;
        assert_eq!(g.second_partials(v, y, &[])?.value()?.dims(), [2, 0]);
        Ok::<_, Error>(())
    })
    .expect("zero coordinates");
}
