//! Exact memory invariants of graphs on every device (nothing outlives its
//! scope, no gradient lives on a parameter, every byte is counted), named
//! after the leak patterns they reproduce. Each test runs on the CPU and on
//! CUDA device 0 (`<name>::cpu`, `<name>::cuda`), counted by that device's
//! own counters, which count tensor bytes exactly on CUDA as on the host
//! (the caching allocator's rounding shows in `reserved`, not here). The
//! counters are process-wide, so the tests in this file run one at a time.

use std::sync::{Mutex, MutexGuard};

use tapir_autograd::{GradOptions, Graph, Var};
use tapir_tensor::max_memory_allocated;
use tapir_tensor::prelude::*;
use tapir_testing::{assert_close, test_device};

static LOCK: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn live(device: Device) -> usize {
    memory_allocated(device)
}

/// A two-layer MLP training step on new data, in its own scope; the update
/// is made of tensor ops, so it runs on the parameters' device.
fn mlp_step(params: &mut [Tensor], x: &Tensor, y: &Tensor, lr: f64) -> Result<f64> {
    let (loss, grads) = Graph::scope(|g| {
        let p: Vec<_> = params.iter().map(|t| g.leaf(t.clone())).collect();
        let h = g.constant(x.clone()).linear(&p[0], Some(&p[1]))?.tanh()?;
        let out = h.linear(&p[2], Some(&p[3]))?;
        let loss = out.sub(&g.constant(y.clone()))?.square()?.mean_all()?;
        Ok::<_, Error>((loss.item()?, g.grad(loss, &p)?))
    })?;
    for (p, g) in params.iter_mut().zip(&grads) {
        *p = p.sub(&g.mul_scalar(lr)?)?;
    }
    Ok(loss)
}

test_device! {
    /// Seed 003: y = tanh(x), a first derivative with create_graph, a
    /// second derivative returned out of the scope as a tensor, repeated.
    /// In PyTorch the create_graph backward leaks through a parameter <->
    /// grad cycle; here live bytes grow by exactly the tensors the loop
    /// chooses to keep.
    fn create_graph_cycle(device: Device) -> Result<()> {
        let _s = serial();
        // Fewer, smaller iterations on CUDA, where CI runs the emulator.
        let (n, iters) = if device.is_cpu() { (10_000, 1_000) } else { (2_048, 60) };
        let x0 = Rng::new(3).randn([n], DType::F32)?.to_device(device)?;
        let second_derivative = |x0: &Tensor| -> Result<Tensor> {
            Graph::scope(|g| {
                let x = g.leaf(x0.clone());
                let y = x.tanh()?;
                let dy = g.grad_graph(y.sum_all()?, &[x])?[0];
                Ok(g.grad(dy.sum_all()?, &[x])?.remove(0))
            })
        };
        let base = live(device);
        let mut kept = Vec::new();
        for i in 0..iters {
            let d2 = second_derivative(&x0)?;
            assert_eq!(d2.device(), device);
            if i % (iters / 10) == 0 {
                kept.push(d2);
            } else {
                drop(d2);
            }
            assert_eq!(live(device), base + kept.len() * n * 4, "iteration {i}");
        }
        // The kept values are right: d2/dx2 tanh = -2 tanh (1 - tanh^2).
        let want: Vec<f64> = x0
            .to_vec_f64()
            .iter()
            .map(|x| {
                let t = x.tanh();
                -2.0 * t * (1.0 - t * t)
            })
            .collect();
        assert_close("d2 tanh", &kept[3].to_vec_f64(), &want, 1e-5);
        drop(kept);
        assert_eq!(live(device), base);
        Ok(())
    }

    /// Seed 001: a model called eagerly in a loop on new inputs kept every
    /// step's graph in TF2. Here each step's graph dies with its scope, so
    /// live bytes at every one of 1,000 step boundaries are identical, and
    /// the loss falls.
    fn eager_graph_growth(device: Device) -> Result<()> {
        let _s = serial();
        let mut rng = Rng::new(1);
        let mut params = vec![
            rng.normal_tensor([16, 4], 0.0, 0.5, DType::F32)?.to_device(device)?,
            Tensor::zeros_on([16], DType::F32, device)?,
            rng.normal_tensor([1, 16], 0.0, 0.5, DType::F32)?.to_device(device)?,
            Tensor::zeros_on([1], DType::F32, device)?,
        ];
        let batch = |rng: &mut Rng| -> Result<(Tensor, Tensor)> {
            let x = rng.uniform([32, 4], -1.0, 1.0, DType::F32)?.to_device(device)?;
            let y = x.sum(&[1], true)?.sin()?;
            Ok((x, y))
        };
        let (x, y) = batch(&mut rng)?;
        let first = mlp_step(&mut params, &x, &y, 0.1)?;
        drop((x, y));
        let boundary = live(device);
        let mut last = first;
        for step in 0..1_000 {
            let (x, y) = batch(&mut rng)?;
            last = mlp_step(&mut params, &x, &y, 0.1)?;
            drop((x, y));
            assert_eq!(live(device), boundary, "step {step}");
        }
        assert!(params.iter().all(|p| p.device() == device));
        assert!(last < first * 0.5, "loss {first} -> {last}");
        Ok(())
    }

    /// PyTorch's `total_loss += loss` keeps every step's graph alive. In
    /// tapir only a number or a tensor can leave a scope, so accumulating
    /// is flat.
    fn accumulated_loss(device: Device) -> Result<()> {
        let _s = serial();
        let w0 = Rng::new(5).randn([64, 64], DType::F32)?.to_device(device)?;
        let x = Rng::new(6).randn([8, 64], DType::F32)?.to_device(device)?;
        let base = live(device);
        let mut total = 0.0f64;
        let mut total_t = Tensor::zeros_on([], DType::F32, device)?;
        let steps = if device.is_cpu() { 200 } else { 40 };
        for step in 0..steps {
            // The loss keeps its value through the backward pass (outputs
            // always do), and may be read before or after it.
            let loss = Graph::scope(|g| {
                let w = g.leaf(w0.clone());
                let loss = g.constant(x.clone()).matmul(&w)?.tanh()?.square()?.mean_all()?;
                let _ = g.grad(loss, &[w])?;
                loss.value()
            })?;
            total_t = total_t.add(&loss)?;
            drop(loss);
            let loss = Graph::scope(|g| {
                let w = g.leaf(w0.clone());
                let loss = g.constant(x.clone()).matmul(&w)?.tanh()?.square()?.mean_all()?;
                let value = loss.value()?;
                let _ = g.grad(loss, &[w])?;
                Ok::<_, Error>(value)
            })?;
            assert_eq!(loss.device(), device);
            total += 2.0 * loss.item()?;
            total_t = total_t.add(&loss)?;
            assert_eq!(live(device), base + 4 + 4, "step {step}: only the running total and this step's loss");
        }
        assert!((total - total_t.item()?).abs() < 1e-3 * total);
        Ok(())
    }

    /// An error halfway through a forward frees everything the scope made:
    /// a shape mismatch, on a device an operand left on the host, and an
    /// error inside a backward pass.
    fn error_inside_scope_frees_everything(device: Device) -> Result<()> {
        let _s = serial();
        let a0 = Tensor::ones_on([256, 128], DType::F32, device)?;
        let base = live(device);
        let host = live(Device::Cpu);
        for op in ["matmul", "add"] {
            let r = Graph::scope(|g| {
                let a = g.leaf(a0.clone());
                let h = a.tanh()?.exp()?; // 256 KiB of intermediates
                let bad = g.constant(Tensor::ones_on([3, 5], DType::F32, device)?);
                if op == "matmul" { h.matmul(&bad) } else { h.add(&bad) }.map(|_| ())
            });
            let err = r.unwrap_err();
            assert!(matches!(&err, Error::ShapeMismatch { op: o, .. } if *o == op), "{op}: {err}");
            assert_eq!(live(device), base, "{op}");
        }
        if !device.is_cpu() {
            let r = Graph::scope(|g| {
                let a = g.leaf(a0.clone());
                let h = a.tanh()?.exp()?;
                let on_host = g.constant(Tensor::ones([256, 128], DType::F32)?);
                h.mul(&on_host).map(|_| ())
            });
            assert_eq!(r.unwrap_err(), Error::DeviceMismatch { op: "mul", lhs: device, rhs: Device::Cpu });
            assert_eq!((live(device), live(Device::Cpu)), (base, host));
        }
        // An error inside a backward pass too (a seed of the wrong shape).
        let r = Graph::scope(|g| {
            let a = g.leaf(a0.clone());
            let y = a.sin()?.square()?;
            let _ = g.grad_graph(y, &[a])?;
            let seed = Tensor::ones_on([3], DType::F32, device)?;
            g.grad_with(&[y], &[a], GradOptions { grad_outputs: Some(vec![seed]), retain_graph: false }).map(|_| ())
        });
        assert!(matches!(r, Err(Error::ShapeMismatch { op: "grad", .. })), "{r:?}");
        assert_eq!(live(device), base);
        Ok(())
    }

    /// A first-order backward releases intermediate values as it goes
    /// (torch's retain_graph=False); a second pass through them is a clear
    /// error, unless the first asked to retain. The device's live bytes say
    /// what the graph's own count says.
    fn backward_releases_saved_values(device: Device) -> Result<()> {
        let _s = serial();
        let x0 = Tensor::ones_on([1024], DType::F32, device)?;
        let base = live(device);
        // A scalar f32's bytes.
        let scalar = 4;
        Graph::scope(|g| {
            let x = g.leaf(x0.clone());
            let y = x.exp()?.tanh()?.sin()?.sum_all()?;
            assert_eq!(g.saved_bytes(), 3 * 4096 + 4096 + 4, "x + three intermediates + the scalar");
            assert_eq!(live(device), base + 3 * 4096 + scalar);
            let gx = g.grad(y, &[x])?.remove(0);
            assert_eq!(g.saved_bytes(), 4096 + 4, "only the leaf and the output remain");
            assert_eq!(g.released_count(), 3);
            assert_eq!(live(device), base + 4096 + scalar, "the gradient and the output");
            let e = 1f64.exp();
            let want = e.tanh().cos() * (1.0 - e.tanh().powi(2)) * e;
            assert_close("grad", &gx.to_vec_f64(), &[want; 1024], 1e-6);
            let again = g.grad(y, &[x]);
            assert!(matches!(again, Err(Error::Graph { .. })));
            let msg = again.unwrap_err().to_string();
            assert!(msg.contains("retain_graph"), "{msg}");
            Ok::<_, Error>(())
        })?;
        assert_eq!(live(device), base);
        Graph::scope(|g| {
            let x = g.leaf(x0.clone());
            let y = x.exp()?.tanh()?.sum_all()?;
            let a = g.grad_with(&[y], &[x], GradOptions { retain_graph: true, ..Default::default() })?;
            let b = g.grad(y, &[x])?;
            assert_eq!(a[0].to_vec::<f32>()?, b[0].to_vec::<f32>()?);
            Ok::<_, Error>(())
        })?;
        assert_eq!(live(device), base);
        Ok(())
    }

    /// The graph's own diagnostics count what a scope holds, and the
    /// scope's end returns all of it.
    fn scope_end_frees_all_nodes(device: Device) -> Result<()> {
        let _s = serial();
        let base = live(device);
        let (nodes, held) = Graph::scope(|g| {
            let x = g.leaf(Tensor::ones_on([100], DType::F32, device)?);
            let mut y = x;
            for _ in 0..10 {
                y = y.tanh()?;
            }
            let _d = g.grad_graph(y.sum_all()?, &[x])?;
            Ok::<_, Error>((g.node_count(), live(device) - base))
        })?;
        assert!(nodes > 20, "{nodes}");
        assert!(held >= 11 * 400, "{held}");
        assert_eq!(live(device), base);
        Ok(())
    }

    /// Second and third derivatives, recorded and eager, with a Hessian-
    /// vector product on top: the scope's end returns every byte.
    fn higher_order_passes_leave_nothing_behind(device: Device) -> Result<()> {
        let _s = serial();
        let x0 = Tensor::from_vec((0..1000).map(|i| 4.0 * (i as f32 + 0.5) / 1000.0 - 2.0).collect(), [1000])?
            .to_device(device)?;
        let v = x0.mul_scalar(0.5)?;
        let base = live(device);
        let (third, held) = Graph::scope(|g| {
            let x = g.leaf(x0.clone());
            let y = x.sin()?.mul(&x.exp()?)?;
            let d1 = g.grad_graph(y, &[x])?[0];
            let d2 = g.grad_graph(d1, &[x])?[0];
            let d3 = g.grad(d2, &[x])?.remove(0);
            let _hv = g.hvp(y, x, &v)?;
            let _hv2 = g.hvp_graph(d1, x, g.constant(v.clone()))?;
            Ok::<_, Error>((d3, live(device) - base))
        })?;
        assert!(held > 20 * 4000, "the graph held its values ({held} bytes)");
        assert_eq!(live(device), base + 4000, "only the third derivative left the scope");
        let want: Vec<f64> = x0.to_vec_f64().iter().map(|x| 2.0 * x.exp() * (x.cos() - x.sin())).collect();
        assert_close("d3", &third.to_vec_f64(), &want, 1e-5);
        drop(third);
        assert_eq!(live(device), base);
        Ok(())
    }

    /// A first-order backward frees each value as soon as no rule still to
    /// run reads it: `h = 3x` is read by no rule (mul_scalar needs nothing,
    /// exp reads its own output), so it goes when backward starts, and
    /// exp's output goes once exp's rule has read it. The backward's peak
    /// is then the forward's live bytes, not those plus the gradients.
    fn backward_frees_values_no_rule_reads(device: Device) -> Result<()> {
        let _s = serial();
        const B: usize = 4096 * 4;
        let x0 = Rng::new(9).randn([4096], DType::F32)?.to_device(device)?;
        let base = live(device);
        // A scalar f32's bytes.
        let scalar = 4;
        Graph::scope(|g| {
            let x = g.leaf(x0.clone());
            let h = x.mul_scalar(3.0)?;
            let e = h.mul_scalar(0.01)?.exp()?;
            let s = e.sum_all()?;
            let forward = live(device);
            assert_eq!(forward - base, 3 * B + scalar, "h, h * 0.01, e and the scalar");
            reset_peak_memory_stats(device);
            let gx = g.grad(s, &[x])?;
            let peak = max_memory_allocated(device) - base;
            // Backward holds at most e and one gradient beside it, or two
            // gradients (plus the seed and the few-byte stand-ins of unread
            // values), below what the forward left live; keeping h and
            // h * 0.01 to the end of the pass would have peaked at 4 * B.
            assert!(peak <= forward - base + 64, "backward peak {peak} above the forward's {}", forward - base);
            assert_eq!(live(device) - base, B + scalar, "the gradient and the output");
            let want: Vec<f64> = x0.to_vec_f64().iter().map(|v| 0.03 * (0.03 * v).exp()).collect();
            assert_close("grad", &gx[0].to_vec_f64(), &want, 1e-6);
            Ok::<_, Error>(())
        })?;
        assert_eq!(live(device), base);
        Ok(())
    }

    /// Two losses on one trunk, each with its own backward: the first pass
    /// frees only what no rule of the graph will read again, so the second
    /// head's rules still find the trunk's values they need.
    fn two_backward_passes_over_a_shared_trunk(device: Device) -> Result<()> {
        let _s = serial();
        let x0 = Rng::new(10).randn([16, 8], DType::F64)?.to_device(device)?;
        let w0 = Rng::new(11).randn([8, 8], DType::F64)?.to_device(device)?;
        let (g1, g2) = Graph::scope(|g| {
            let (x, w) = (g.leaf(x0.clone()), g.leaf(w0.clone()));
            let trunk = x.matmul(&w)?.tanh()?;
            let head1 = trunk.exp()?.sum_all()?;
            let head2 = trunk.matmul(&w)?.square()?.sum_all()?;
            let g1 = g.grad(head1, &[w])?;
            let g2 = g.grad(head2, &[w])?;
            let k1 = g.grad_with(&[head1], &[w], GradOptions { grad_outputs: None, retain_graph: true });
            assert!(k1.is_err(), "the first head's own values are gone after its pass");
            Ok::<_, Error>((g1, g2))
        })?;
        // The same gradients from passes that keep everything.
        let (k1, k2) = Graph::scope(|g| {
            let (x, w) = (g.leaf(x0.clone()), g.leaf(w0.clone()));
            let trunk = x.matmul(&w)?.tanh()?;
            let head1 = trunk.exp()?.sum_all()?;
            let head2 = trunk.matmul(&w)?.square()?.sum_all()?;
            let keep = GradOptions { grad_outputs: None, retain_graph: true };
            Ok::<_, Error>((g.grad_with(&[head1], &[w], keep.clone())?, g.grad_with(&[head2], &[w], keep)?))
        })?;
        assert_eq!(g1[0].to_vec::<f64>()?, k1[0].to_vec::<f64>()?);
        assert_eq!(g2[0].to_vec::<f64>()?, k2[0].to_vec::<f64>()?);
        Ok(())
    }

    /// An activation's first-order backward is one pass on every device:
    /// relu, tanh, sigmoid and both GELUs hold, beside what the forward
    /// left live, at most the seed gradient and the input's gradient
    /// (2 B), where their composed derivative lines keep three to eight
    /// temporaries of B at once (a GELU over a transformer's MLP set a
    /// CUDA training step's peak 9 MiB above the CPU's this way); f32 and
    /// bf16, the gradients against the CPU's.
    fn activation_backward_is_one_pass(device: Device) -> Result<()> {
        let _s = serial();
        type Act = for<'g> fn(&Var<'g>) -> Result<Var<'g>>;
        let acts: [(&str, Act); 5] = [
            ("relu", |x| x.relu()),
            ("tanh", |x| x.tanh()),
            ("sigmoid", |x| x.sigmoid()),
            ("gelu", |x| x.gelu()),
            ("gelu_tanh", |x| x.gelu_tanh()),
        ];
        const N: usize = 4096;
        for dtype in [DType::F32, DType::BF16] {
            let host = Rng::new(12).randn([N], DType::F32)?.mul_scalar(2.0)?.cast(dtype)?;
            let x0 = host.to_device(device)?;
            let b = N * dtype.size_in_bytes();
            for (name, act) in acts {
                let grad_on = |x0: &Tensor, measure: bool| -> Result<Tensor> {
                    let dev = x0.device();
                    let base = live(dev);
                    Graph::scope(|g| {
                        let x = g.leaf(x0.clone());
                        let s = act(&x)?.sum_all()?;
                        let forward = live(dev) - base;
                        reset_peak_memory_stats(dev);
                        let gx = g.grad(s, &[x])?.remove(0);
                        let peak = max_memory_allocated(dev) - base;
                        if measure {
                            assert!(
                                peak <= forward + 2 * b + 64,
                                "{name} {dtype:?}: backward peak {peak} above the forward's {forward} + 2 x {b}"
                            );
                        }
                        Ok(gx)
                    })
                };
                let got = grad_on(&x0, true)?.to_vec_f64();
                let want = grad_on(&host, false)?.to_vec_f64();
                let tol = if dtype == DType::BF16 { 1e-2 } else { 1e-5 };
                assert_close(&format!("{name} {dtype:?}"), &got, &want, tol);
            }
        }
        Ok(())
    }
}
