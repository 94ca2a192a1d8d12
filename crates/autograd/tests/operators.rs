//! Derivative operators against closed forms.

use tapir_autograd::{GradOptions, Graph, Var};
use tapir_tensor::prelude::*;
use tapir_testing::test_device;

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "at {i}: {x} vs {y}");
    }
}

/// Points [N, 2] and u = x^3 y + sin(x) e^y, whose derivatives are known.
fn points() -> Tensor {
    Tensor::from_vec(vec![0.1f64, 0.2, -0.7, 0.4, 1.3, -0.5, 0.0, 0.9], [4, 2]).unwrap()
}

fn u_of<'g>(x: tapir_autograd::Var<'g>) -> Result<tapir_autograd::Var<'g>> {
    let a = x.narrow(1, 0, 1)?;
    let b = x.narrow(1, 1, 1)?;
    a.powf(3.0)?.mul(&b)?.add(&a.sin()?.mul(&b.exp()?)?)
}

#[test]
fn laplacian_hessian_diag_and_mixed_partials_match_closed_forms() {
    let p = points().to_vec::<f64>().unwrap();
    let (mut uxx, mut uyy, mut uxy, mut ux) = (vec![], vec![], vec![], vec![]);
    for r in p.chunks(2) {
        let (x, y) = (r[0], r[1]);
        uxx.push(6.0 * x * y - x.sin() * y.exp());
        uyy.push(x.sin() * y.exp());
        uxy.push(3.0 * x * x + x.cos() * y.exp());
        ux.push(3.0 * x * x * y + x.cos() * y.exp());
    }
    Graph::scope(|g| {
        let x = g.leaf(points());
        let u = u_of(x)?;
        let lap = g.laplacian(u, x)?.value()?.to_vec::<f64>()?;
        let want: Vec<f64> = uxx.iter().zip(&uyy).map(|(a, b)| a + b).collect();
        close(&lap, &want, 1e-12);
        let diag = g.hessian_diag(u, x)?.value()?.to_vec::<f64>()?;
        let want: Vec<f64> = uxx.iter().zip(&uyy).flat_map(|(a, b)| [*a, *b]).collect();
        close(&diag, &want, 1e-12);
        close(&g.second_partials(u, x, &[1])?.value()?.to_vec::<f64>()?, &uyy, 1e-12);
        close(&g.mixed_partial(u, x, 0, 1)?.value()?.to_vec::<f64>()?, &uxy, 1e-12);
        close(&g.mixed_partial(u, x, 1, 0)?.value()?.to_vec::<f64>()?, &uxy, 1e-12);
        let grad = g.point_gradient(u, x)?.value()?.to_vec::<f64>()?;
        close(&grad.iter().step_by(2).copied().collect::<Vec<_>>(), &ux, 1e-12);
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn laplacian_is_differentiable_for_training() {
    // d/dc of sum(lap(c * u)) = sum(lap(u)).
    Graph::scope(|g| {
        let c = g.leaf(Tensor::from_vec(vec![2.0f64], [1])?);
        let x = g.leaf(points());
        let u = u_of(x)?.mul(&c)?;
        let lap = g.laplacian(u, x)?;
        let dc = g.grad(lap.sum_all()?, &[c])?.remove(0).item()?;
        let lap_u = Graph::scope(|h| {
            let x = h.leaf(points());
            h.laplacian(u_of(x)?, x)?.sum_all()?.item()
        })?;
        assert!((dc - lap_u).abs() < 1e-10, "{dc} vs {lap_u}");
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn hutchinson_estimate_is_unbiased_on_average() {
    let mut rng = Rng::new(7);
    Graph::scope(|g| {
        let x = g.leaf(points());
        let u = u_of(x)?;
        let exact = g.laplacian(u, x)?.value()?.to_vec::<f64>()?;
        let probes = 4000;
        let est = g.laplacian_hutchinson(u, x, probes, &mut rng)?.value()?.to_vec::<f64>()?;
        let mixed = g.mixed_partial(u, x, 0, 1)?.value()?.to_vec::<f64>()?;
        for ((e, a), m) in est.iter().zip(&exact).zip(&mixed) {
            // With Rademacher probes in 2-D, v'Hv = trace + 2 v0 v1 H01: its
            // standard deviation is 2 |H01|; allow five standard errors.
            let tol = 5.0 * 2.0 * m.abs() / (probes as f64).sqrt() + 1e-12;
            assert!((e - a).abs() <= tol, "{e} vs {a} (tolerance {tol})");
        }
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn hvp_hessian_and_jacobian() {
    // f(x) = sum(x^2 * x_shifted) style: f = x0^2 x1 + x1^3 + sin(x2)
    let x0 = Tensor::from_vec(vec![0.5f64, -1.0, 0.3], [3]).unwrap();
    Graph::scope(|g| {
        let x = g.leaf(x0.clone());
        let (a, b, c) = (x.narrow(0, 0, 1)?, x.narrow(0, 1, 1)?, x.narrow(0, 2, 1)?);
        let f = a.square()?.mul(&b)?.add(&b.powf(3.0)?)?.add(&c.sin()?)?.sum_all()?;
        let h = g.hessian(f, x)?.to_vec::<f64>()?;
        let (xa, xb, xc) = (0.5, -1.0, 0.3f64);
        let want = [2.0 * xb, 2.0 * xa, 0.0, 2.0 * xa, 6.0 * xb, 0.0, 0.0, 0.0, -xc.sin()];
        close(&h, &want, 1e-12);
        let v = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], [3])?;
        let hv = g.hvp(f, x, &v)?.to_vec::<f64>()?;
        let want_hv: Vec<f64> = (0..3).map(|i| (0..3).map(|j| want[i * 3 + j] * [1.0, 2.0, 3.0][j]).sum()).collect();
        close(&hv, &want_hv, 1e-12);
        // Jacobian of y = [x0*x1, x2^2] both ways agree with the closed form.
        let y = Var::concat(&[&a.mul(&b)?, &c.square()?], 0)?;
        let j = g.jacobian(y, x)?.to_vec::<f64>()?;
        close(&j, &[xb, xa, 0.0, 0.0, 0.0, 2.0 * xc], 1e-12);
        Ok::<_, Error>(())
    })
    .unwrap();
}

/// A recorded gradient's last product (the weight's `x^T g`) is computed
/// only when read: a Hessian-vector product pushes its tangent through it
/// and never reads it. Read later, it is right, also after a first-order
/// backward has released the values around it.
#[test]
fn a_recorded_weight_gradient_is_computed_when_read() {
    let x0 = Tensor::from_vec((0..8).map(|i| 0.1 * i as f64 - 0.3).collect(), [4, 2]).unwrap();
    let w0 = Tensor::from_vec(vec![0.5f64, -1.0, 0.25, 2.0, 0.75, -0.5], [2, 3]).unwrap();
    let v0 = Tensor::from_vec(vec![1.0f64, 0.0, -1.0, 0.5, 2.0, 1.0], [2, 3]).unwrap();
    let xv = x0.to_vec::<f64>().unwrap();
    let xtx = |i: usize, j: usize| (0..4).map(|r| xv[r * 2 + i] * xv[r * 2 + j]).sum::<f64>();
    // loss = sum((x w)^2): grad 2 x^T x w, Hessian-vector product 2 x^T x v.
    let times_2xtx = |m: &Tensor| {
        let m = m.to_vec::<f64>().unwrap();
        (0..2)
            .flat_map(|i| (0..3).map(move |j| (i, j)))
            .map(|(i, j)| 2.0 * (0..2).map(|p| xtx(i, p) * m[p * 3 + j]).sum::<f64>())
            .collect::<Vec<_>>()
    };
    Graph::scope(|g| {
        let (x, w) = (g.constant(x0.clone()), g.leaf(w0.clone()));
        let loss = x.matmul(&w)?.square()?.sum_all()?;
        let before = g.saved_bytes();
        let gw = g.grad_graph(loss, &[w])?[0];
        let recorded = g.saved_bytes() - before;
        let hv = g.jvp(&[gw], &[w], std::slice::from_ref(&v0))?.remove(0);
        close(&hv.to_vec::<f64>()?, &times_2xtx(&v0), 1e-12);
        assert_eq!(g.saved_bytes() - before, recorded, "the tangent pass computed no gradient");
        assert_eq!(g.released_count(), 0, "a value not computed yet is not released");
        // A first-order backward releases the values the product reads.
        g.grad(loss, &[w])?;
        close(&gw.value()?.to_vec::<f64>()?, &times_2xtx(&w0), 1e-12);
        Ok::<_, Error>(())
    })
    .unwrap();
    // Read at once, the same gradient.
    Graph::scope(|g| {
        let (x, w) = (g.constant(x0.clone()), g.leaf(w0.clone()));
        let loss = x.matmul(&w)?.square()?.sum_all()?;
        let gw = g.grad_graph(loss, &[w])?[0];
        let before = g.saved_bytes();
        close(&gw.value()?.to_vec::<f64>()?, &times_2xtx(&w0), 1e-12);
        assert_eq!(g.saved_bytes() - before, 6 * 8, "read, the gradient is kept");
        Ok::<_, Error>(())
    })
    .unwrap();
}

test_device! {
    /// The same body on every device (the ops are elementwise; a
    /// one-element output seeds its own gradient, no sum needed).
    fn third_order_derivative(device: Device) {
        // d^3/dx^3 tanh(x) = -2 sech^2 (1 - 3 tanh^2)... checked against finite
        // differences of the second derivative instead.
        let at = |x: f64| Tensor::from_vec(vec![x], [1]).and_then(|t| t.to_device(device));
        let second = |x: f64| -> f64 {
            Graph::scope(|g| {
                let v = g.leaf(at(x)?);
                let d1 = g.grad_graph(v.tanh()?, &[v])?[0];
                g.grad(d1, &[v])?.remove(0).item()
            })
            .unwrap()
        };
        let third = Graph::scope(|g| {
            let v = g.leaf(at(0.4)?);
            let d1 = g.grad_graph(v.tanh()?, &[v])?[0];
            let d2 = g.grad_graph(d1, &[v])?[0];
            let d3 = g.grad(d2, &[v])?.remove(0);
            assert_eq!(d3.device(), device);
            d3.item()
        })
        .unwrap();
        let fd = (second(0.4 + 1e-5) - second(0.4 - 1e-5)) / 2e-5;
        assert!((third - fd).abs() < 1e-6, "{third} vs {fd}");
    }

    fn grad_errors_are_structured(device: Device) {
        let ones = |dims: &[usize]| Tensor::ones_on(dims, DType::F64, device).expect("alloc");
        Graph::scope(|g| {
            let x = g.leaf(ones(&[3]));
            let y = x.square()?;
            let bad = g.grad_with(
                &[y],
                &[x],
                GradOptions {
                    grad_outputs: Some(vec![ones(&[2])]),
                    retain_graph: false,
                },
            );
            assert!(matches!(bad, Err(Error::ShapeMismatch { op: "grad", .. })));
            let unused = g.leaf(ones(&[2]));
            let gs = g.grad(y, &[x, unused])?;
            assert_eq!(gs[1].to_vec::<f64>()?, vec![0.0, 0.0], "an unused input gets zeros");
            assert_eq!(gs[1].device(), device, "made on its input's device");
            let pts = g.leaf(ones(&[3]));
            assert!(matches!(g.laplacian(y, pts), Err(Error::InvalidShape { .. })));
            Ok::<_, Error>(())
        })
        .unwrap();
    }
}

/// A first-order backward tells each rule which inputs need a gradient
/// (`Derivative::vjp_eager_wanted`): `tanh_backward(y, ones)` with a
/// constant `ones` skips the constant's gradient (a pass and a sum down to
/// its scalar). What it still computes, `y`'s gradient, must have the same
/// bits as when both gradients are asked for, in f32 and f64, and the
/// constant must get nothing.
#[test]
fn tanh_backward_skips_a_constant_operands_gradient_and_keeps_the_others_bits() {
    for dtype in [DType::F32, DType::F64] {
        let y0 = Tensor::from_vec(vec![0.3f64, -0.8, 0.55, 0.0, 0.9, -0.1], [2, 3]).unwrap().cast(dtype).unwrap();
        let gbar = Tensor::from_vec(vec![1.5f64, -0.25, 2.0, 0.75, -3.0, 0.5], [2, 3]).unwrap().cast(dtype).unwrap();
        let (only_y, both) = Graph::scope(|g| {
            let y = g.leaf(y0.clone());
            let ones = g.constant(Tensor::full_on((), 1.0, dtype, Device::Cpu)?);
            let loss = y.tanh_backward(&ones)?.mul(&g.constant(gbar.clone()))?.sum_all()?;
            let only_y = g.grad(loss, &[y])?.remove(0);
            // The same expression with `ones` a leaf: both gradients wanted.
            let y2 = g.leaf(y0.clone());
            let ones2 = g.leaf(Tensor::full_on((), 1.0, dtype, Device::Cpu)?);
            let loss2 = y2.tanh_backward(&ones2)?.mul(&g.constant(gbar.clone()))?.sum_all()?;
            let both = g.grad(loss2, &[y2, ones2])?;
            Ok::<_, Error>((only_y, both))
        })
        .unwrap();
        assert_eq!(
            only_y.cast(DType::F64).unwrap().to_vec::<f64>().unwrap(),
            both[0].cast(DType::F64).unwrap().to_vec::<f64>().unwrap(),
            "{dtype:?}"
        );
        // d/dy of ones * (1 - y^2) * gbar is -2 y gbar, and the constant's
        // gradient (sum of (1 - y^2) gbar) arrived where it was wanted.
        let want: Vec<f64> = y0
            .cast(DType::F64)
            .unwrap()
            .to_vec::<f64>()
            .unwrap()
            .iter()
            .zip(gbar.cast(DType::F64).unwrap().to_vec::<f64>().unwrap())
            .map(|(y, g)| -2.0 * y * g)
            .collect();
        close(&only_y.cast(DType::F64).unwrap().to_vec::<f64>().unwrap(), &want, 1e-6);
        let s: f64 = y0
            .cast(DType::F64)
            .unwrap()
            .to_vec::<f64>()
            .unwrap()
            .iter()
            .zip(gbar.cast(DType::F64).unwrap().to_vec::<f64>().unwrap())
            .map(|(y, g)| (1.0 - y * y) * g)
            .sum();
        close(&both[1].cast(DType::F64).unwrap().to_vec::<f64>().unwrap(), &[s], 1e-6);
    }
}

/// The binary ops skip a constant operand's gradient too (a broadcast
/// mask's cost a pass and a sum down to its shape, every layer of a jet).
/// For every op, the constant on either side and broadcast or not, the
/// leaf's gradient has the same bits as when both operands are leaves, in
/// f32 and f64, and `where_` likewise for a constant branch.
#[test]
fn binary_ops_skip_a_constant_operands_gradient_and_keep_the_others_bits() {
    type F = for<'g> fn(&Var<'g>, &Var<'g>) -> Result<Var<'g>>;
    fn run<'g>(op: F, constant_first: bool, x: Var<'g>, c: Var<'g>) -> Result<Var<'g>> {
        if constant_first {
            op(&c, &x)
        } else {
            op(&x, &c)
        }
    }
    let ops: [(&str, F); 8] = [
        ("add", |a, b| a.add(b)),
        ("sub", |a, b| a.sub(b)),
        ("mul", |a, b| a.mul(b)),
        ("div", |a, b| a.div(b)),
        ("pow", |a, b| a.abs()?.add_scalar(0.5)?.pow(b)),
        ("maximum", |a, b| a.maximum(b)),
        ("minimum", |a, b| a.minimum(b)),
        ("where", |a, b| {
            let mask = Tensor::from_vec(vec![1.0f64, 0.0, 1.0], [1, 3])?.cast(a.dtype())?;
            a.where_(&mask.broadcast_to(a.shape())?.contiguous()?, &b.broadcast_to(a.shape())?)
        }),
    ];
    let big = Tensor::from_vec(vec![0.3f64, -0.8, 0.55, 1.25, 0.9, -0.1], [2, 3]).unwrap();
    let row = Tensor::from_vec(vec![1.5f64, -0.25, 0.75], [1, 3]).unwrap();
    for dtype in [DType::F32, DType::F64] {
        let (big, row) = (big.cast(dtype).unwrap(), row.cast(dtype).unwrap());
        let weights = Tensor::from_vec(vec![1.0f64, -2.0, 0.5, 3.0, -1.5, 2.5], [2, 3]).unwrap().cast(dtype).unwrap();
        for (name, op) in ops {
            for (leaf, constant) in [(&big, &row), (&row, &big)] {
                // (leaf, constant), then the same values with the constant
                // first (where the op allows it: `where_` keeps `a` big).
                for constant_first in [false, true] {
                    if name == "where" && (constant_first || leaf.dims() != big.dims()) {
                        continue;
                    }
                    let (only, both) = Graph::scope(|g| {
                        let w = g.constant(weights.clone());
                        let x = g.leaf(leaf.clone());
                        let loss = run(op, constant_first, x, g.constant(constant.clone()))?.mul(&w)?.sum_all()?;
                        let only = g.grad(loss, &[x])?.remove(0);
                        let (x2, c2) = (g.leaf(leaf.clone()), g.leaf(constant.clone()));
                        let loss2 = run(op, constant_first, x2, c2)?.mul(&w)?.sum_all()?;
                        let both = g.grad(loss2, &[x2, c2])?;
                        Ok::<_, Error>((only, both))
                    })
                    .unwrap();
                    let bits = |t: &Tensor| t.cast(DType::F64).unwrap().to_vec::<f64>().unwrap();
                    assert_eq!(only.dims(), leaf.dims(), "{name} {dtype:?}");
                    assert_eq!(bits(&only), bits(&both[0]), "{name} {dtype:?} constant first: {constant_first}");
                    assert_eq!(both[1].dims(), constant.dims(), "{name} {dtype:?}");
                }
            }
        }
    }
}
