//! Exact memory invariants of graphs (DESIGN.md invariants 1, 2 and 5),
//! named after the leak patterns they reproduce. The allocator's counters
//! are process-wide, so the tests in this file run one at a time.

use std::sync::{Mutex, MutexGuard};

use tapir_autograd::{GradOptions, Graph};
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
        let loss = Graph::scope(|g| {
            let w = g.leaf(w0.clone());
            let loss = g.constant(x.clone()).matmul(&w)?.tanh()?.square()?.mean_all()?;
            let _ = g.grad(loss, &[w])?;
            loss.value()
        });
        // The loss's value was released by the backward pass: reading it
        // after grad is an error that says so, not a silent leak.
        assert!(matches!(loss, Err(Error::Graph { .. })));
        let loss = Graph::scope(|g| {
            let w = g.leaf(w0.clone());
            let loss = g.constant(x.clone()).matmul(&w)?.tanh()?.square()?.mean_all()?;
            let value = loss.value()?;
            let _ = g.grad(loss, &[w])?;
            Ok::<_, Error>(value)
        })
        .unwrap();
        total += loss.item().unwrap();
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
        assert_eq!(g.saved_bytes(), 4096, "only the leaf remains");
        assert_eq!(g.released_count(), 4);
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
