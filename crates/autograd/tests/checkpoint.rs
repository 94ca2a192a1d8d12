//! Activation checkpointing (`Graph::checkpoint`): the same gradients as
//! the plain block, bit for bit on the CPU; fewer live bytes between the
//! forward and the backward, by exactly the block's activations; nothing
//! left after the scope; and second order and forward mode through the
//! recorded block. The byte counts are process-wide, so the tests of this
//! file run one at a time.

use std::sync::{Mutex, MutexGuard};

use tapir_autograd::{Graph, Var};
use tapir_tensor::prelude::*;

static LOCK: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

const N: usize = 64;
const D: usize = 32;
const H: usize = 128;

/// An MLP block with a residual: `x + tanh(x w1) w2`, [N, D] -> [N, D].
fn block<'h>(_: &'h Graph, v: &[Var<'h>]) -> Result<Var<'h>> {
    let (x, w1, w2) = (v[0], v[1], v[2]);
    x.add(&x.matmul(&w1)?.tanh()?.matmul(&w2)?)
}

fn inputs() -> [Tensor; 3] {
    let mut rng = Rng::new(11);
    [
        rng.normal_tensor([N, D], 0.0, 1.0, DType::F32).unwrap(),
        rng.normal_tensor([D, H], 0.0, 0.2, DType::F32).unwrap(),
        rng.normal_tensor([H, D], 0.0, 0.2, DType::F32).unwrap(),
    ]
}

/// The loss `sum(block(block(x)))` through two blocks, each plain or
/// checkpointed; returns the loss, the gradients of x, w1, w2, and the live
/// bytes between the forward and the backward above the inputs.
fn run(checkpointed: bool) -> (Vec<f32>, Vec<Vec<f32>>, usize) {
    let [x0, w10, w20] = inputs();
    let base = memory_allocated(Device::Cpu);
    let out = Graph::scope(|g| {
        let (x, w1, w2) = (g.leaf(x0.clone()), g.leaf(w10.clone()), g.leaf(w20.clone()));
        let mut h = x;
        for _ in 0..2 {
            h = if checkpointed { g.checkpoint(&[h, w1, w2], block)? } else { block(g, &[h, w1, w2])? };
        }
        let loss = h.square()?.sum_all()?;
        let between = memory_allocated(Device::Cpu) - base;
        let grads = g.grad(loss, &[x, w1, w2])?;
        let grads = grads.iter().map(|t| t.to_vec::<f32>()).collect::<Result<Vec<_>>>()?;
        Ok::<_, Error>((loss.value()?.to_vec::<f32>()?, grads, between))
    })
    .unwrap();
    assert_eq!(memory_allocated(Device::Cpu), base, "everything is freed after the scope");
    out
}

#[test]
fn checkpointed_blocks_give_the_plain_gradients_bit_for_bit() {
    let _s = serial();
    let (loss_p, grads_p, live_p) = run(false);
    let (loss_c, grads_c, live_c) = run(true);
    assert_eq!(loss_p, loss_c, "the loss");
    for (name, (a, b)) in ["x", "w1", "w2"].iter().zip(grads_p.iter().zip(&grads_c)) {
        assert_eq!(a, b, "the gradient of {name}, bit for bit");
        assert!(a.iter().any(|&v| v != 0.0));
    }
    // Per block the plain graph keeps x w1 and its tanh ([N, H] each) and
    // the product with w2 ([N, D]); the checkpointed one keeps none of
    // them. Both keep each block's output and the loss's square.
    let f = 4;
    let activations = 2 * (2 * N * H * f + N * D * f);
    println!("live between forward and backward: plain {live_p} B, checkpointed {live_c} B");
    assert_eq!(live_p - live_c, activations, "checkpointing drops exactly the blocks' activations");
}

#[test]
fn second_order_and_forward_mode_through_a_checkpoint() {
    let _s = serial();
    let [x0, w10, w20] = inputs().map(|t| t.cast(DType::F64).unwrap());
    let t0 = Rng::new(5).normal_tensor([N, D], 0.0, 1.0, DType::F64).unwrap();
    let run = |checkpointed: bool| {
        Graph::scope(|g| {
            let (x, w1, w2) = (g.leaf(x0.clone()), g.leaf(w10.clone()), g.leaf(w20.clone()));
            let y = if checkpointed { g.checkpoint(&[x, w1, w2], block)? } else { block(g, &[x, w1, w2])? };
            let loss = y.square()?.sum_all()?;
            // Forward mode, eager and recorded (before the first-order
            // backward below releases the values).
            let jv = g.jvp(&[y], &[x], std::slice::from_ref(&t0))?.remove(0);
            let jvr = g.jvp_graph(&[y], &[x], &[g.constant(t0.clone())])?[0].value()?;
            // Gradient of the squared norm of dloss/dx (grad of grad).
            let dx = g.grad_graph(loss, &[x])?[0];
            let n = dx.square()?.sum_all()?;
            let gg = g.grad(n, &[x, w1])?;
            let out: Vec<Vec<f64>> =
                [&gg[0], &gg[1], &jv, &jvr].iter().map(|t| t.to_vec::<f64>()).collect::<Result<_>>()?;
            Ok::<_, Error>(out)
        })
        .unwrap()
    };
    let (plain, ckpt) = (run(false), run(true));
    for (name, (a, b)) in ["d2/dx", "d2/dw1", "jvp", "recorded jvp"].iter().zip(plain.iter().zip(&ckpt)) {
        // The recorded block sums in another order than the plain graph:
        // equal to f64 rounding, relative to the largest entry.
        let err = a.iter().zip(b).map(|(p, q)| (p - q).abs()).fold(0.0, f64::max);
        let scale = a.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(err <= 1e-13 * (1.0 + scale), "{name}: max difference {err} (largest entry {scale})");
        assert!(a.iter().any(|&v| v != 0.0), "{name} is not all zero");
    }
}

#[test]
fn checkpoint_errors_are_structured() {
    let _s = serial();
    Graph::scope(|g| {
        assert!(matches!(g.checkpoint(&[], block), Err(Error::InvalidArgument { .. })));
        let x = g.leaf(Tensor::zeros([2, 3], DType::F32)?);
        // A block that fails (shapes that do not multiply) fails the call.
        let bad = g.checkpoint(&[x, x, x], block);
        assert!(bad.is_err());
        Ok::<_, Error>(())
    })
    .unwrap();
}
