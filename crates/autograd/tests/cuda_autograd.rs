//! Autograd runs unchanged on CUDA tensors: each test is one body run on
//! the CPU and on CUDA device 0 (`test_device!`), and on a device its
//! derivatives must equal the CPU's (and the closed forms) while every
//! value, seed, zero and tangent stays on that device.
//!
//! These use elementwise ops only, whose CUDA kernels exist: an output that
//! is not a scalar is seeded with ones, which differentiates its sum
//! without running a reduction.

use tapir_autograd::{GradOptions, Graph, Var};
use tapir_tensor::ops::binary::Binary;
use tapir_tensor::ops::unary::Unary;
use tapir_tensor::prelude::*;
use tapir_tensor::Derivative;
use tapir_testing::{assert_close, test_device};

/// Points away from every kink (relu, abs, clamp) and tie (maximum).
const X: [f64; 6] = [-1.3, -0.45, 0.3, 0.85, 1.6, 2.2];
const W: [f64; 6] = [0.7, -1.1, 0.4, 1.9, -0.35, 0.05];

fn on(device: Device, v: &[f64]) -> Result<Tensor> {
    Tensor::from_vec(v.to_vec(), [2, 3])?.to_device(device)
}

/// The values of a tensor, after checking where it lives.
fn vals(t: &Tensor, device: Device, what: &str) -> Vec<f64> {
    assert_eq!(t.device(), device, "{what} left the device");
    t.to_vec_f64()
}

/// `tanh(x w) sin(x) + exp(w) / (1 + x^2)`: elementwise, with every input
/// used more than once, so gradients accumulate.
fn f<T: Diff>(x: &T, w: &T) -> Result<T> {
    let a = x.mul(w)?.tanh()?.mul(&x.sin()?)?;
    a.add(&w.exp()?.div(&x.square()?.add_scalar(1.0)?)?)
}

/// The differentiable functions of the unary and binary families' lists
/// (those the op registry is made from), so a function added there is
/// checked here with no edit.
fn elementwise_ops() -> (Vec<Unary>, &'static [Binary]) {
    (Unary::ALL.iter().copied().filter(Derivative::is_differentiable).collect(), Binary::ALL)
}

fn elementwise_count() -> usize {
    let (unary, binary) = elementwise_ops();
    unary.len() + binary.len()
}

/// One case an elementwise function: `f(x)` (`f(x, d)` with `d = w^2 +
/// 1/2`, away from zero, for a binary one) times `x`, so that a linear
/// function has a second derivative too. A function not finite everywhere
/// on `x` (log, sqrt, powf...) runs on the positive `x^2 + 0.2` instead.
fn elementwise_cases<'g>(x: Var<'g>, w: Var<'g>) -> Result<Vec<(&'static str, Var<'g>)>> {
    let pos = x.square()?.add_scalar(0.2)?;
    let d = w.square()?.add_scalar(0.5)?;
    let finite = |y: &Var<'g>| -> Result<bool> { Ok(y.value()?.to_vec_f64().iter().all(|v| v.is_finite())) };
    let (unary, binary) = elementwise_ops();
    let mut cases = Vec::new();
    for u in unary {
        let on_x = Var::apply(u, &[&x])?;
        let y = if finite(&on_x)? { on_x } else { Var::apply(u, &[&pos])? };
        cases.push((u.name(), y.mul(&x)?));
    }
    for &b in binary {
        let on_x = Var::apply(b, &[&x, &d])?;
        let y = if finite(&on_x)? { on_x } else { Var::apply(b, &[&pos, &d])? };
        cases.push((b.name(), y.mul(&x)?));
    }
    Ok(cases)
}

test_device! {
    /// First-order gradients equal the closed form and, on a device, the
    /// CPU's; they are made on the inputs' device.
    fn grad_matches_the_closed_form_and_the_cpu(device: Device) -> Result<()> {
        let run = |device: Device| -> Result<Vec<Vec<f64>>> {
            Graph::scope(|g| {
                let (x, w) = (g.leaf(on(device, &X)?), g.leaf(on(device, &W)?));
                let gs = g.grad(f(&x, &w)?, &[x, w])?;
                Ok(gs.iter().map(|t| vals(t, device, "grad")).collect())
            })
        };
        let got = run(device)?;
        let (mut dx, mut dw) = (vec![], vec![]);
        for (&x, &w) in X.iter().zip(&W) {
            let t = (x * w).tanh();
            let q = 1.0 + x * x;
            dx.push((1.0 - t * t) * w * x.sin() + t * x.cos() - w.exp() * 2.0 * x / (q * q));
            dw.push((1.0 - t * t) * x * x.sin() + w.exp() / q);
        }
        assert_close("df/dx", &got[0], &dx, 1e-12);
        assert_close("df/dw", &got[1], &dw, 1e-12);
        let cpu = run(Device::Cpu)?;
        assert_close("df/dx vs the cpu", &got[0], &cpu[0], 1e-13);
        assert_close("df/dw vs the cpu", &got[1], &cpu[1], 1e-13);
        Ok(())
    }

    /// create_graph to the third order: tanh (through its fused backward
    /// op, whose own rules are differentiated) and e^x sin x.
    fn create_graph_second_and_third_order(device: Device) -> Result<()> {
        let run = |device: Device| -> Result<Vec<Vec<f64>>> {
            Graph::scope(|g| {
                let x = g.leaf(on(device, &X)?);
                let mut out = Vec::new();
                for y in [x.tanh()?, x.exp()?.mul(&x.sin()?)?] {
                    let d1 = g.grad_graph(y, &[x])?[0];
                    let d2 = g.grad_graph(d1, &[x])?[0];
                    let d3 = g.grad(d2, &[x])?.remove(0);
                    // d1 and d2 are recorded values, still readable after d3.
                    out.push(vals(&d1.value()?, device, "d1"));
                    out.push(vals(&d2.value()?, device, "d2"));
                    out.push(vals(&d3, device, "d3"));
                }
                Ok(out)
            })
        };
        let got = run(device)?;
        let t: Vec<f64> = X.iter().map(|x| x.tanh()).collect();
        let want_tanh = [
            t.iter().map(|t| 1.0 - t * t).collect::<Vec<_>>(),
            t.iter().map(|t| -2.0 * t * (1.0 - t * t)).collect(),
            t.iter().map(|t| -2.0 * (1.0 - t * t) * (1.0 - 3.0 * t * t)).collect(),
        ];
        let want_es = [
            X.iter().map(|x| x.exp() * (x.sin() + x.cos())).collect::<Vec<_>>(),
            X.iter().map(|x| 2.0 * x.exp() * x.cos()).collect(),
            X.iter().map(|x| 2.0 * x.exp() * (x.cos() - x.sin())).collect(),
        ];
        for (k, want) in want_tanh.iter().chain(&want_es).enumerate() {
            assert_close(&format!("derivative {k}"), &got[k], want, 1e-12);
        }
        let cpu = run(Device::Cpu)?;
        for (k, (a, b)) in got.iter().zip(&cpu).enumerate() {
            assert_close(&format!("derivative {k} vs the cpu"), a, b, 1e-13);
        }
        Ok(())
    }

    /// Forward mode, a Hessian-vector product (forward over reverse), and
    /// its recorded form differentiated once more.
    fn jvp_hvp_and_a_recorded_hvp(device: Device) -> Result<()> {
        const V: [f64; 6] = [1.0, -2.0, 0.5, 0.25, -1.5, 3.0];
        let run = |device: Device| -> Result<Vec<Vec<f64>>> {
            Graph::scope(|g| {
                let x = g.leaf(on(device, &X)?);
                let v = on(device, &V)?;
                // u = x^2 sin x: u' = 2x sin + x^2 cos, u'' = 2 sin + 4x cos - x^2 sin.
                let u = x.square()?.mul(&x.sin()?)?;
                let jv = g.jvp(&[u], &[x], std::slice::from_ref(&v))?.remove(0);
                let hv = g.hvp(u, x, &v)?;
                let hv_graph = g.hvp_graph(u, x, g.constant(v.clone()))?;
                let third = g.grad(hv_graph, &[x])?.remove(0);
                Ok(vec![vals(&jv, device, "jvp"), vals(&hv, device, "hvp"), vals(&third, device, "d(hvp)/dx")])
            })
        };
        let got = run(device)?;
        let (mut jv, mut hv, mut third) = (vec![], vec![], vec![]);
        for (&x, &v) in X.iter().zip(&V) {
            let (s, c) = (x.sin(), x.cos());
            jv.push((2.0 * x * s + x * x * c) * v);
            hv.push((2.0 * s + 4.0 * x * c - x * x * s) * v);
            third.push((6.0 * c - 6.0 * x * s - x * x * c) * v);
        }
        assert_close("jvp", &got[0], &jv, 1e-12);
        assert_close("hvp", &got[1], &hv, 1e-12);
        assert_close("d(hvp)/dx", &got[2], &third, 1e-12);
        let cpu = run(Device::Cpu)?;
        for (k, (a, b)) in got.iter().zip(&cpu).enumerate() {
            assert_close(&format!("result {k} vs the cpu"), a, b, 1e-13);
        }
        Ok(())
    }

    /// Every differentiable unary function and every binary one, first and
    /// second order, in reverse and forward mode: the rules run on the
    /// device and give the CPU's numbers.
    fn every_elementwise_rule_matches_the_cpu_to_second_order(device: Device) -> Result<()> {
        let run = |device: Device| -> Result<Vec<(String, Vec<f64>)>> {
            Graph::scope(|g| {
                let (x, w) = (g.leaf(on(device, &X)?), g.leaf(on(device, &W)?));
                let cases = elementwise_cases(x, w)?;
                let tangent = g.constant(on(device, &W)?.mul_scalar(0.5)?);
                let mut out = Vec::new();
                for (name, y) in cases {
                    let gs = g.grad_graph(y, &[x, w])?;
                    let d2 = g.grad_with(&[gs[0]], &[x, w], GradOptions { retain_graph: true, ..Default::default() })?;
                    let jv = g.jvp_graph(&[y], &[x], &[tangent])?.remove(0);
                    let jj = g.jvp(&[jv], &[x], &[on(device, &X)?])?.remove(0);
                    out.push((format!("{name}: dy/dx"), vals(&gs[0].value()?, device, name)));
                    out.push((format!("{name}: dy/dw"), vals(&gs[1].value()?, device, name)));
                    out.push((format!("{name}: d2y/dx2"), vals(&d2[0], device, name)));
                    out.push((format!("{name}: d2y/dxdw"), vals(&d2[1], device, name)));
                    out.push((format!("{name}: jvp"), vals(&jv.value()?, device, name)));
                    out.push((format!("{name}: jvp of jvp"), vals(&jj, device, name)));
                }
                Ok(out)
            })
        };
        let got = run(device)?;
        let cpu = run(Device::Cpu)?;
        assert_eq!(got.len(), elementwise_count() * 6);
        for ((what, a), (_, b)) in got.iter().zip(&cpu) {
            assert!(a.iter().all(|v| v.is_finite()), "{what}: {a:?}");
            assert_close(what, a, b, 1e-12);
        }
        Ok(())
    }

    /// Where nothing flows, a pass gives zeros, made on the device of the
    /// value they stand for (reverse, recorded reverse and forward mode).
    fn zeros_for_unreached_values_are_on_the_device(device: Device) -> Result<()> {
        Graph::scope(|g| {
            let (x, unused) = (g.leaf(on(device, &X)?), g.leaf(on(device, &W)?));
            let y = x.sin()?;
            let gs = g.grad_with(&[y], &[x, unused], GradOptions { retain_graph: true, ..Default::default() })?;
            assert_eq!(vals(&gs[1], device, "grad of an unused input"), vec![0.0; 6]);
            let recorded = g.grad_graph(y, &[unused])?[0];
            assert_eq!(vals(&recorded.value()?, device, "recorded zeros"), vec![0.0; 6]);
            let z = unused.exp()?;
            let t = g.jvp(&[z], &[x], &[on(device, &X)?])?.remove(0);
            assert_eq!(vals(&t, device, "tangent of an output x does not reach"), vec![0.0; 6]);
            Ok(())
        })
    }

    /// An explicit output gradient on the device seeds the pass; one on
    /// another device, or a tangent elsewhere, is a DeviceMismatch naming
    /// the entry point, before any rule runs.
    fn seeds_and_tangents_must_be_on_the_outputs_device(device: Device) -> Result<()> {
        Graph::scope(|g| {
            let x = g.leaf(on(device, &X)?);
            let y = x.tanh()?;
            let seed = on(device, &W)?;
            let keep = |s: Tensor| GradOptions { grad_outputs: Some(vec![s]), retain_graph: true };
            let d = g.grad_with(&[y], &[x], keep(seed.clone()))?.remove(0);
            let want: Vec<f64> = X.iter().zip(&W).map(|(x, w)| w * (1.0 - x.tanh().powi(2))).collect();
            assert_close("seeded grad", &vals(&d, device, "seeded grad"), &want, 1e-12);
            let seed_var = g.constant(seed.clone());
            let d = g.grad_graph_with(&[y], &[x], Some(&[seed_var]))?.remove(0);
            assert_close("seeded recorded grad", &vals(&d.value()?, device, "seeded"), &want, 1e-12);
            if device != Device::Cpu {
                let host = seed.to_device(Device::Cpu)?;
                let e = g.grad_with(&[y], &[x], keep(host.clone())).unwrap_err();
                assert_eq!(e, Error::DeviceMismatch { op: "grad", lhs: device, rhs: Device::Cpu });
                let e = g.grad_graph_with(&[y], &[x], Some(&[g.constant(host.clone())])).unwrap_err();
                assert_eq!(e, Error::DeviceMismatch { op: "grad_graph", lhs: device, rhs: Device::Cpu });
                let e = g.jvp(&[y], &[x], std::slice::from_ref(&host)).unwrap_err();
                assert_eq!(e, Error::DeviceMismatch { op: "jvp", lhs: device, rhs: Device::Cpu });
                let e = g.jvp_graph(&[y], &[x], &[g.constant(host)]).unwrap_err();
                assert_eq!(e, Error::DeviceMismatch { op: "jvp", lhs: device, rhs: Device::Cpu });
            }
            Ok(())
        })
    }
}
