//! The leak-freedom invariants of graphs on every device, with exact byte
//! counts from that device's counters (on CUDA, the caching allocator's
//! live bytes): nothing a scope made outlives it, after a higher-order
//! pass, after an error, after a backward that frees as it goes. The
//! counters are process-wide, so every test of this binary takes one lock.
//!
//! Elementwise ops only: a non-scalar output is seeded with ones.

use std::sync::{Mutex, MutexGuard};

use tapir_autograd::{GradOptions, Graph};
use tapir_tensor::prelude::*;
use tapir_testing::{assert_close, test_device};

static LOCK: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn live(device: Device) -> usize {
    memory_stats(device).allocated
}

/// `n` values in (-2, 2) on `device`.
fn points(n: usize, device: Device) -> Result<Tensor> {
    Tensor::from_vec((0..n).map(|i| 4.0 * (i as f32 + 0.5) / n as f32 - 2.0).collect(), [n])?.to_device(device)
}

test_device! {
    /// Seed 003: tanh, a first derivative with create_graph, a second
    /// derivative returned out of the scope as a tensor, repeated. Live
    /// bytes grow by exactly the tensors the loop keeps.
    fn create_graph_cycle(device: Device) -> Result<()> {
        let _s = serial();
        const N: usize = 2048;
        const ITERS: usize = 60;
        let x0 = points(N, device)?;
        let second_derivative = |x0: &Tensor| -> Result<Tensor> {
            Graph::scope(|g| {
                let x = g.leaf(x0.clone());
                let dy = g.grad_graph(x.tanh()?, &[x])?[0];
                Ok(g.grad(dy, &[x])?.remove(0))
            })
        };
        let base = live(device);
        let mut kept = Vec::new();
        for i in 0..ITERS {
            let d2 = second_derivative(&x0)?;
            assert_eq!(d2.device(), device);
            if i % 20 == 0 {
                kept.push(d2);
            } else {
                drop(d2);
            }
            assert_eq!(live(device), base + kept.len() * N * 4, "iteration {i}");
        }
        let want: Vec<f64> = x0.to_vec_f64().iter().map(|x| {
            let t = x.tanh();
            -2.0 * t * (1.0 - t * t)
        }).collect();
        assert_close("d2 tanh", &kept[2].to_vec_f64(), &want, 1e-5);
        drop(kept);
        assert_eq!(live(device), base);
        Ok(())
    }

    /// Second and third derivatives, recorded and eager, with a Hessian-
    /// vector product on top: the scope's end returns every byte.
    fn higher_order_passes_leave_nothing_behind(device: Device) -> Result<()> {
        let _s = serial();
        let x0 = points(1000, device)?;
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

    /// An error halfway through a forward frees everything the scope made:
    /// a shape mismatch, and on a device an operand left on the host.
    fn error_inside_scope_frees_everything(device: Device) -> Result<()> {
        let _s = serial();
        let a0 = Tensor::ones_on([256, 128], DType::F32, device)?;
        let base = live(device);
        let host = live(Device::Cpu);
        let r = Graph::scope(|g| {
            let a = g.leaf(a0.clone());
            let h = a.tanh()?.exp()?; // 256 KiB of intermediates
            let bad = g.constant(Tensor::ones_on([3, 5], DType::F32, device)?);
            h.add(&bad).map(|_| ())
        });
        let err = r.unwrap_err();
        assert!(matches!(err, Error::ShapeMismatch { op: "add", .. }), "{err}");
        assert_eq!(live(device), base);
        if device != Device::Cpu {
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

    /// PyTorch's `total += loss` keeps every step's graph; here only
    /// tensors leave a scope, so a running total stays flat.
    fn accumulated_loss(device: Device) -> Result<()> {
        let _s = serial();
        const N: usize = 512;
        let w0 = points(N, device)?;
        let base = live(device);
        let mut total = Tensor::zeros_on([N], DType::F32, device)?;
        for step in 0..40 {
            let loss = Graph::scope(|g| {
                let w = g.leaf(w0.clone());
                let loss = w.mul_scalar(0.5)?.tanh()?.square()?;
                let _ = g.grad(loss, &[w])?;
                loss.value()
            })?;
            total = total.add(&loss)?;
            assert_eq!(live(device), base + 2 * N * 4, "step {step}: the running total and this step's loss");
        }
        let want: Vec<f64> = w0.to_vec_f64().iter().map(|w| 40.0 * (0.5 * w).tanh().powi(2)).collect();
        assert_close("total", &total.to_vec_f64(), &want, 1e-5);
        Ok(())
    }

    /// A first-order backward releases intermediate values as it goes, on
    /// the device as on the host: the graph holds exactly the leaf and the
    /// output afterwards, and the device's live bytes say the same.
    fn backward_releases_saved_values(device: Device) -> Result<()> {
        let _s = serial();
        let x0 = Tensor::ones_on([1024], DType::F32, device)?;
        let base = live(device);
        Graph::scope(|g| {
            let x = g.leaf(x0.clone());
            let y = x.exp()?.tanh()?.sin()?;
            assert_eq!(g.saved_bytes(), 4 * 4096, "x, two intermediates and the output");
            assert_eq!(live(device), base + 3 * 4096);
            let gx = g.grad(y, &[x])?.remove(0);
            assert_eq!(g.saved_bytes(), 2 * 4096, "only the leaf and the output remain");
            assert_eq!(g.released_count(), 2);
            assert_eq!(live(device), base + 2 * 4096, "the output and the gradient");
            let e = 1f64.exp();
            let want = e.tanh().cos() * (1.0 - e.tanh().powi(2)) * e;
            assert_close("grad", &gx.to_vec_f64(), &[want; 1024], 1e-6);
            Ok::<_, Error>(())
        })?;
        assert_eq!(live(device), base);
        Ok(())
    }
}
