//! Exact memory invariants of graphs (nothing outlives its scope, no
//! gradient lives on a parameter, every byte is counted),
//! named after the leak patterns they reproduce. The allocator's counters
//! are process-wide, so the tests in this file run one at a time.

use std::sync::{Mutex, MutexGuard};

use tapir_autograd::{GradOptions, Graph};
use tapir_tensor::max_memory_allocated;
use tapir_tensor::prelude::*;

static LOCK: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn live() -> usize {
    memory_allocated(Device::Cpu)
}

/// Seed 003: y = tanh(x), a first derivative with create_graph, a second
/// derivative, returned out of a function as a tensor, repeated. In PyTorch
/// the create_graph backward leaks through a parameter <-> grad cycle; here
/// live bytes grow by exactly the tensors the test chooses to keep.
#[test]
fn create_graph_cycle() {
    let _s = serial();
    const N: usize = 10_000;
    const ITERS: usize = 1_000;
    let x0 = Rng::new(3).randn([N], DType::F32).unwrap();
    let second_derivative = |x0: &Tensor| -> Result<Tensor> {
        Graph::scope(|g| {
            let x = g.leaf(x0.clone());
            let y = x.tanh()?;
            let dy = g.grad_graph(y.sum_all()?, &[x])?[0];
            Ok(g.grad(dy.sum_all()?, &[x])?.remove(0))
        })
    };
    let base = live();
    let mut kept = Vec::new();
    for i in 0..ITERS {
        let d2 = second_derivative(&x0).unwrap();
        if i % 100 == 0 {
            kept.push(d2);
        } else {
            drop(d2);
        }
        assert_eq!(live(), base + kept.len() * N * 4, "iteration {i}");
    }
    // The kept values are right: d2/dx2 tanh = -2 tanh (1 - tanh^2).
    let x = x0.to_vec::<f32>().unwrap();
    let d2 = kept[3].to_vec::<f32>().unwrap();
    for (x, d) in x.iter().zip(&d2).take(100) {
        let t = x.tanh();
        assert!((d - (-2.0 * t * (1.0 - t * t))).abs() < 1e-5);
    }
    drop(kept);
    assert_eq!(live(), base);
}

/// A two-layer MLP training step on new data each step, in its own scope.
fn mlp_step(params: &mut [Tensor], x: &Tensor, y: &Tensor, lr: f64) -> Result<f32> {
    let (loss, grads) = Graph::scope(|g| {
        let p: Vec<_> = params.iter().map(|t| g.leaf(t.clone())).collect();
        let h = g.constant(x.clone()).linear(&p[0], Some(&p[1]))?.tanh()?;
        let out = h.linear(&p[2], Some(&p[3]))?;
        let loss = out.sub(&g.constant(y.clone()))?.square()?.mean_all()?;
        Ok::<_, Error>((loss.item()? as f32, g.grad(loss, &p)?))
    })?;
    for (p, g) in params.iter_mut().zip(&grads) {
        let g = g.to_vec::<f32>()?;
        for (w, d) in p.make_mut::<f32>()?.iter_mut().zip(g) {
            *w -= lr as f32 * d;
        }
    }
    Ok(loss)
}

/// Seed 001: a model called eagerly in a loop on new inputs kept every
/// step's graph in TF2. Here each step's graph dies with its scope, so live
/// bytes at every step boundary are identical, and the loss falls.
#[test]
fn eager_graph_growth() {
    let _s = serial();
    let mut rng = Rng::new(1);
    let mut params = vec![
        rng.normal_tensor([16, 4], 0.0, 0.5, DType::F32).unwrap(),
        Tensor::zeros([16], DType::F32).expect("alloc"),
        rng.normal_tensor([1, 16], 0.0, 0.5, DType::F32).unwrap(),
        Tensor::zeros([1], DType::F32).expect("alloc"),
    ];
    let batch = |rng: &mut Rng| {
        let x = rng.uniform([32, 4], -1.0, 1.0, DType::F32).unwrap();
        let y = x.sum(&[1], true).unwrap().sin().unwrap();
        (x, y)
    };
    let (x, y) = batch(&mut rng);
    let first = mlp_step(&mut params, &x, &y, 0.1).unwrap();
    drop((x, y));
    let boundary = live();
    let mut last = first;
    for step in 0..1_000 {
        let (x, y) = batch(&mut rng);
        last = mlp_step(&mut params, &x, &y, 0.1).unwrap();
        drop((x, y));
        assert_eq!(live(), boundary, "step {step}");
    }
    assert!(last < first * 0.5, "loss {first} -> {last}");
}

/// PyTorch's `total_loss += loss` keeps every step's graph alive. In tapir
/// only a number or a tensor can leave a scope, so accumulating is flat.
#[test]
fn accumulated_loss() {
    let _s = serial();
    let w0 = Rng::new(5).randn([64, 64], DType::F32).unwrap();
    let x = Rng::new(6).randn([8, 64], DType::F32).unwrap();
    let base = live();
    let mut total = 0.0f64;
    let mut total_t = Tensor::zeros([], DType::F32).expect("alloc");
    for _ in 0..200 {
        // The loss keeps its value through the backward pass (outputs
        // always do), and may be read before or after it.
        let loss = Graph::scope(|g| {
            let w = g.leaf(w0.clone());
            let loss = g.constant(x.clone()).matmul(&w)?.tanh()?.square()?.mean_all()?;
            let _ = g.grad(loss, &[w])?;
            loss.value()
        })
        .unwrap();
        total_t = total_t.add(&loss).unwrap();
        drop(loss);
        let loss = Graph::scope(|g| {
            let w = g.leaf(w0.clone());
            let loss = g.constant(x.clone()).matmul(&w)?.tanh()?.square()?.mean_all()?;
            let value = loss.value()?;
            let _ = g.grad(loss, &[w])?;
            Ok::<_, Error>(value)
        })
        .unwrap();
        total += 2.0 * loss.item().unwrap();
        total_t = total_t.add(&loss).unwrap();
        assert_eq!(live(), base + 4 + 4, "only the running total and this step's loss value stay");
    }
    assert!((total - total_t.item().unwrap()).abs() < 1e-3 * total);
}

/// An error halfway through a forward frees everything the scope made.
#[test]
fn error_inside_scope_frees_everything() {
    let _s = serial();
    let a0 = Tensor::ones([256, 128], DType::F32).expect("alloc");
    let base = live();
    let r = Graph::scope(|g| {
        let a = g.leaf(a0.clone());
        let h = a.tanh()?.exp()?; // 256 KiB of intermediates
        let bad = g.constant(Tensor::ones([3, 5], DType::F32).expect("alloc"));
        h.matmul(&bad).map(|_| ()) // shape mismatch
    });
    let err = r.unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { op: "matmul", .. }), "{err}");
    assert_eq!(live(), base);
}

/// A first-order backward releases intermediate values as it goes (torch's
/// retain_graph=False); a second pass through them is a clear error, unless
/// the first asked to retain.
#[test]
fn backward_releases_saved_values() {
    let _s = serial();
    let x0 = Tensor::ones([1024], DType::F32).expect("alloc");
    Graph::scope(|g| {
        let x = g.leaf(x0.clone());
        let y = x.exp()?.tanh()?.sin()?.sum_all()?;
        let before = g.saved_bytes();
        assert_eq!(before, 3 * 4096 + 4096 + 4, "x + three intermediates + the scalar");
        g.grad(y, &[x])?;
        assert_eq!(g.saved_bytes(), 4096 + 4, "only the leaf and the output remain");
        assert_eq!(g.released_count(), 3);
        let again = g.grad(y, &[x]);
        assert!(matches!(again, Err(Error::Graph { .. })));
        let msg = again.unwrap_err().to_string();
        assert!(msg.contains("retain_graph"), "{msg}");
        Ok::<_, Error>(())
    })
    .unwrap();
    Graph::scope(|g| {
        let x = g.leaf(x0.clone());
        let y = x.exp()?.tanh()?.sum_all()?;
        let a = g.grad_with(&[y], &[x], GradOptions { retain_graph: true, ..Default::default() })?;
        let b = g.grad(y, &[x])?;
        assert_eq!(a[0].to_vec::<f32>()?, b[0].to_vec::<f32>()?);
        Ok::<_, Error>(())
    })
    .unwrap();
}

/// The graph's own diagnostics count what a scope holds, and the scope's
/// end returns all of it.
#[test]
fn scope_end_frees_all_nodes() {
    let _s = serial();
    let base = live();
    let (nodes, held) = Graph::scope(|g| {
        let x = g.leaf(Tensor::ones([100], DType::F32).expect("alloc"));
        let mut y = x;
        for _ in 0..10 {
            y = y.tanh()?;
        }
        let _d = g.grad_graph(y.sum_all()?, &[x])?;
        Ok::<_, Error>((g.node_count(), live() - base))
    })
    .unwrap();
    assert!(nodes > 20, "{nodes}");
    assert!(held >= 11 * 400, "{held}");
    assert_eq!(live(), base);
}

/// A first-order backward frees each value as soon as no rule still to run
/// reads it: `h = 3x` is read by no rule (mul_scalar needs nothing, exp
/// reads its own output), so it goes when backward starts, and exp's output
/// goes once exp's rule has read it. The backward's peak is then the
/// forward's live bytes, not those plus the gradients.
#[test]
fn backward_frees_values_no_rule_reads() {
    let _s = serial();
    const B: usize = 4096 * 4;
    let x0 = Rng::new(9).randn([4096], DType::F32).unwrap();
    let base = live();
    Graph::scope(|g| {
        let x = g.leaf(x0.clone());
        let h = x.mul_scalar(3.0)?;
        let e = h.mul_scalar(0.01)?.exp()?;
        let s = e.sum_all()?;
        let forward = live();
        assert_eq!(forward - base, 3 * B + 4, "h, h * 0.01, e and the scalar");
        reset_peak_memory_stats(Device::Cpu);
        let gx = g.grad(s, &[x])?;
        let peak = max_memory_allocated(Device::Cpu) - base;
        // Backward holds at most e and one gradient beside it, or two
        // gradients (plus the seed and the few-byte stand-ins of unread
        // values), below what the forward left live; keeping h and h * 0.01
        // to the end of the pass would have peaked at 4 * B.
        assert!(peak <= forward - base + 64, "backward peak {peak} above the forward's {}", forward - base);
        assert_eq!(live() - base, B + 4, "the gradient and the output");
        let want: Vec<f32> = x0.to_vec::<f32>()?.iter().map(|v| 0.03 * (0.03 * v).exp()).collect();
        for (a, b) in gx[0].to_vec::<f32>()?.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} vs {b}");
        }
        Ok::<_, Error>(())
    })
    .unwrap();
    assert_eq!(live(), base);
}

/// Two losses on one trunk, each with its own backward: the first pass
/// frees only what no rule of the graph will read again, so the second
/// head's rules still find the trunk's values they need.
#[test]
fn two_backward_passes_over_a_shared_trunk() {
    let _s = serial();
    let x0 = Rng::new(10).randn([16, 8], DType::F64).unwrap();
    let w0 = Rng::new(11).randn([8, 8], DType::F64).unwrap();
    Graph::scope(|g| {
        let (x, w) = (g.leaf(x0.clone()), g.leaf(w0.clone()));
        let trunk = x.matmul(&w)?.tanh()?;
        let head1 = trunk.exp()?.sum_all()?;
        let head2 = trunk.matmul(&w)?.square()?.sum_all()?;
        let g1 = g.grad(head1, &[w])?;
        let g2 = g.grad(head2, &[w])?;
        // The same gradients from passes that keep everything.
        let k1 = g.grad_with(&[head1], &[w], GradOptions { grad_outputs: None, retain_graph: true });
        assert!(k1.is_err(), "the first head's own values are gone after its pass");
        Ok::<_, Error>((g1, g2))
    })
    .map(|(g1, g2)| {
        let (k1, k2) = Graph::scope(|g| {
            let (x, w) = (g.leaf(x0.clone()), g.leaf(w0.clone()));
            let trunk = x.matmul(&w)?.tanh()?;
            let head1 = trunk.exp()?.sum_all()?;
            let head2 = trunk.matmul(&w)?.square()?.sum_all()?;
            let keep = GradOptions { grad_outputs: None, retain_graph: true };
            Ok::<_, Error>((g.grad_with(&[head1], &[w], keep.clone())?, g.grad_with(&[head2], &[w], keep)?))
        })
        .unwrap();
        assert_eq!(g1[0].to_vec::<f64>().unwrap(), k1[0].to_vec::<f64>().unwrap());
        assert_eq!(g2[0].to_vec::<f64>().unwrap(), k2[0].to_vec::<f64>().unwrap());
    })
    .unwrap();
}
