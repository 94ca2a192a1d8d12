//! Exact memory bounds of the cross-entropy kernels (seed 000), through the
//! allocator's counters. These tests run one at a time: the counters are
//! process-wide.

use std::sync::{Mutex, MutexGuard};

use tapir::prelude::*;
use tapir::tensor::max_memory_allocated;
use tapir::tensor::ops::cross_entropy::CrossEntropyOptions;

static LOCK: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

const N: usize = 2048;
const V: usize = 8192;
const SLACK: usize = 4096; // scalars and seeds: a few small tensors

fn inputs() -> (Tensor, Tensor) {
    let mut rng = Rng::new(0);
    let x = rng.uniform([N, V], -4.0, 4.0, DType::F32).unwrap();
    let mut l = rng.randint([N], V as u64, DType::I64).unwrap().to_vec::<i64>().unwrap();
    l[7] = -100;
    (x, Tensor::from_vec(l, [N]).unwrap())
}

/// Forward adds at most 16 bytes per row; no allocation of N x V bytes or
/// more happens in forward (a one-hot of any dtype would be one); forward
/// plus backward adds at most the one N x V gradient plus O(N).
#[test]
fn sparse_cross_entropy_memory_bounds() {
    let _s = serial();
    let (x, labels) = inputs();
    let logits_bytes = N * V * 4;
    Graph::scope(|g| {
        let xv = g.leaf(x.clone());
        reset_peak_memory_stats(Device::Cpu);
        let base = memory_allocated(Device::Cpu);
        let loss = xv.sparse_cross_entropy(&labels)?;
        let s = memory_stats(Device::Cpu);
        assert!(s.peak - base <= 16 * N + SLACK, "forward added {} bytes", s.peak - base);
        assert!(s.largest_allocation < N * V, "forward allocated {} bytes at once", s.largest_allocation);
        let grad = g.grad(loss, &[xv])?;
        let s = memory_stats(Device::Cpu);
        assert!(
            s.peak - base <= logits_bytes + 16 * N + SLACK,
            "forward+backward added {} bytes, bound {}",
            s.peak - base,
            logits_bytes + 16 * N + SLACK
        );
        assert_eq!(grad[0].shape().dims(), &[N, V]);
        Ok::<_, Error>(())
    })
    .unwrap();
}

/// When the loss is the logits' last reader (logits made in the graph, not
/// a leaf the user holds), backward writes the gradient over the logits'
/// own buffer: forward plus backward then adds no N x V buffer besides the
/// logits themselves, only the gradients of the matmul's inputs and O(N).
/// The values equal those of a pass that keeps the logits (retain_graph).
#[test]
fn sparse_cross_entropy_gradient_reuses_the_logits() {
    let _s = serial();
    const D: usize = 8;
    let mut rng = Rng::new(3);
    let h0 = rng.randn([N, D], DType::F32).unwrap();
    let w0 = rng.randn([V, D], DType::F32).unwrap();
    let (_, labels) = inputs();
    let run = |retain: bool| {
        Graph::scope(|g| {
            let (h, w) = (g.leaf(h0.clone()), g.leaf(w0.clone()));
            let loss = h.matmul(&w.t()?)?.sparse_cross_entropy(&labels)?;
            let forward = memory_allocated(Device::Cpu);
            reset_peak_memory_stats(Device::Cpu);
            let grads = g.grad_with(&[loss], &[h, w], GradOptions { grad_outputs: None, retain_graph: retain })?;
            Ok::<_, Error>((grads, max_memory_allocated(Device::Cpu) - forward))
        })
        .unwrap()
    };
    let (reused, extra) = run(false);
    let bound = (N * D + V * D) * 4 + 16 * N + SLACK;
    assert!(
        extra <= bound,
        "backward added {extra} bytes above the forward, bound {bound} (the logits are {})",
        N * V * 4
    );
    let (kept, extra_kept) = run(true);
    assert!(extra_kept >= N * V * 4, "with the logits kept, the gradient needs its own buffer ({extra_kept})");
    for (a, b) in reused.iter().zip(&kept) {
        assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    }
}

/// Width and chunk of the fused-head tests.
const D: usize = 64;
const CHUNK: usize = 256;

/// Hidden states [N, D], a classifier weight [V, D] and labels for the
/// fused-head tests.
fn head_inputs(seed: u64) -> (Tensor, Tensor, Tensor) {
    let mut rng = Rng::new(seed);
    let h = rng.randn([N, D], DType::F32).unwrap();
    let w = rng.normal_tensor([V, D], 0.0, 0.1, DType::F32).unwrap();
    let labels = rng.randint([N], V as u64, DType::I64).unwrap();
    (h, w, labels)
}

/// The fused head never holds the N x V logits: its largest allocation in
/// forward is one chunk of logits (here larger than `weight`'s gradient),
/// and its peak follows chunk x V plus the gradients of its inputs plus
/// O(N). On a graph with a mean, the forward already makes those gradients
/// (they count as the gradients of its inputs), so the forward reaches the
/// bound and the backward adds nothing.
#[test]
fn linear_cross_entropy_memory_bounds() {
    let _s = serial();
    let (h, w, labels) = head_inputs(1);
    let chunk_bytes = CHUNK * V * 4;
    Graph::scope(|g| {
        let (hv, wv) = (g.leaf(h.clone()), g.leaf(w.clone()));
        reset_peak_memory_stats(Device::Cpu);
        let base = memory_allocated(Device::Cpu);
        let loss = hv.linear_cross_entropy(&wv, None, &labels, CrossEntropyOptions::default(), Some(CHUNK))?;
        let s = memory_stats(Device::Cpu);
        assert!(s.largest_allocation <= chunk_bytes, "largest forward allocation {}", s.largest_allocation);
        let grads = (N * D + V * D) * 4;
        assert!(s.peak - base <= chunk_bytes + grads + 16 * N + SLACK, "forward added {}", s.peak - base);
        g.grad(loss, &[hv, wv])?;
        let s = memory_stats(Device::Cpu);
        assert!(s.peak - base <= chunk_bytes + grads + 16 * N + SLACK, "forward+backward added {}", s.peak - base);
        assert!(s.peak - base < N * V * 4 / 4, "far below the full logits");
        Ok::<_, Error>(())
    })
    .unwrap();
}

/// Recorded on constants only (an evaluation inside a training scope), the
/// fused head makes no gradients in its forward: no backward can ask for
/// them, so the forward holds one chunk of logits and O(N), nothing more.
#[test]
fn linear_cross_entropy_on_constants_makes_no_gradients() {
    let _s = serial();
    let (h, w, labels) = head_inputs(4);
    let eager = h.linear_cross_entropy(&w, None, &labels, CrossEntropyOptions::default(), Some(CHUNK)).unwrap();
    Graph::scope(|g| {
        let (hv, wv) = (g.constant(h.clone()), g.constant(w.clone()));
        reset_peak_memory_stats(Device::Cpu);
        let base = memory_allocated(Device::Cpu);
        let loss = hv.linear_cross_entropy(&wv, None, &labels, CrossEntropyOptions::default(), Some(CHUNK))?;
        let added = max_memory_allocated(Device::Cpu) - base;
        assert!(added <= CHUNK * V * 4 + 16 * N + SLACK, "forward added {added}, gradients are {}", (N + V) * D * 4);
        assert_eq!(loss.item()?, eager.item()?);
        Ok::<_, Error>(())
    })
    .unwrap();
}

/// A backward without retain_graph takes the precomputed gradients out of
/// the op: once the returned gradients are dropped, only the saved
/// log-sum-exp (4 bytes a row) is left until the scope ends, and nothing
/// after it. An upstream gradient other than 1 scales them in place, so the
/// backward still adds nothing to the forward's peak.
#[test]
fn linear_cross_entropy_backward_releases_precomputed_gradients() {
    let _s = serial();
    let (h, w, labels) = head_inputs(2);
    let chunk_bytes = CHUNK * V * 4;
    let grads = (N * D + V * D) * 4;
    let outside = memory_allocated(Device::Cpu);
    Graph::scope(|g| {
        let (hv, wv) = (g.leaf(h.clone()), g.leaf(w.clone()));
        reset_peak_memory_stats(Device::Cpu);
        let base = memory_allocated(Device::Cpu);
        let loss = hv.linear_cross_entropy(&wv, None, &labels, CrossEntropyOptions::default(), Some(CHUNK))?;
        let loss = loss.mul_scalar(3.0)?;
        let after_forward = memory_allocated(Device::Cpu) - base;
        assert!(after_forward >= grads, "the forward holds the gradients ({after_forward} bytes live)");
        let got = g.grad(loss, &[hv, wv])?;
        let s = memory_stats(Device::Cpu);
        assert!(s.peak - base <= chunk_bytes + grads + 16 * N + SLACK, "forward+backward added {}", s.peak - base);
        assert_eq!(got[1].shape().dims(), &[V, D]);
        drop(got);
        let left = memory_allocated(Device::Cpu) - base;
        assert!(left <= 4 * N + SLACK, "{left} bytes left after the backward");
        Ok::<_, Error>(())
    })
    .unwrap();
    assert_eq!(memory_allocated(Device::Cpu), outside);
}

/// A bad label fails before anything large is allocated, and frees what it made.
#[test]
fn bad_label_leaks_nothing() {
    let _s = serial();
    let (x, _) = inputs();
    let mut l = vec![0i64; N];
    l[N - 1] = V as i64;
    let labels = Tensor::from_vec(l, [N]).unwrap();
    let base = memory_allocated(Device::Cpu);
    let r = Graph::scope(|g| g.leaf(x.clone()).sparse_cross_entropy(&labels).map(|_| ()));
    assert!(matches!(r, Err(Error::LabelOutOfRange { row, .. }) if row == N - 1));
    assert_eq!(memory_allocated(Device::Cpu), base);
}
