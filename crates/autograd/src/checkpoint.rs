//! Activation checkpointing (PyTorch's `torch.utils.checkpoint`): a block
//! of layers recorded as one node that keeps only its inputs and output,
//! and recomputes its activations when a pass needs them.
//!
//! The forward runs the block in a nested scope on constants and keeps
//! only the output; the nested graph, and with it every activation, is
//! freed before the outer forward goes on. A first-order backward runs the
//! block again in a nested scope of its own, takes the gradient there with
//! the outer gradient as the seed, and frees that scope before moving on,
//! so the recomputed activations live and die inside the backward. A
//! recorded pass (`grad_graph`, `jvp_graph`) records the block into the
//! graph itself and differentiates that recording, so every order works
//! (the recording then stays until the scope ends, as any recording does).

use std::collections::HashSet;
use std::sync::Arc;

use smallvec::SmallVec;
use tapir_tensor::backend::Backend;
use tapir_tensor::ops::{Arity, Derivative, InputGrads, Op, Saved};
use tapir_tensor::{Diff, Error, Result, Tensor, Traced};

use crate::backward::{path, Direction, GradOptions};
use crate::graph::{from_raw, Graph, NodeId, Rerecorded, Var};

/// A block as [`Graph::checkpoint`] keeps it: a function of values of
/// whichever graph it is run in.
type BlockFn = dyn for<'h> Fn(&'h Graph, &[Var<'h>]) -> Result<Var<'h>> + Send + Sync;

/// The node a checkpointed block records.
pub(crate) struct Checkpoint {
    block: Arc<BlockFn>,
    arity: usize,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Checkpoint({} inputs)", self.arity)
    }
}

fn recorded_only() -> Error {
    Error::Graph { reason: "checkpoint: its recorded rules run through the graph that recorded it".into() }
}

impl Checkpoint {
    /// The block's output on plain values: run in a scope of its own on
    /// constants, which ends (freeing every activation) before this returns.
    fn run_block(&self, xs: &[&Tensor]) -> Result<Tensor> {
        Graph::scope(|h| {
            let vs: Vec<Var<'_>> = xs.iter().map(|x| h.constant((*x).clone())).collect();
            (self.block)(h, &vs)?.value()
        })
    }
}

/// Which of `leaves` a gradient from `out` reaches.
fn reached(h: &Graph, out: Var<'_>, leaves: &[Var<'_>]) -> Vec<bool> {
    let ids: Vec<NodeId> = leaves.iter().map(|v| v.id).collect();
    let on: HashSet<NodeId> = path(h, &[out.id], &ids, Direction::Reverse).into_iter().collect();
    ids.iter().map(|i| on.contains(i)).collect()
}

impl Op for Checkpoint {
    fn name(&self) -> &'static str {
        "checkpoint"
    }
    fn arity(&self) -> Arity {
        Arity::exactly(self.arity)
    }
    /// The block's own ops choose their devices' kernels, so the backend
    /// is not needed here.
    fn run(&self, _: &dyn Backend, xs: &[&Tensor]) -> Result<Tensor> {
        self.run_block(xs)
    }
}

impl Derivative for Checkpoint {
    /// The inputs, to run the block again; never the output.
    fn saves(&self) -> Saved {
        Saved::INPUTS
    }
    /// Never called: the eager pass runs [`Derivative::vjp_eager`], and a recorded
    /// pass records the block into its graph (`backward.rs` asks the graph
    /// for the block of a checkpoint node first).
    fn vjp<T: Diff>(&self, _: &[&T], _: &T, _: &T) -> Result<InputGrads<T>> {
        Err(recorded_only())
    }
    fn jvp<T: Diff>(&self, _: &[&T], _: &T, _: &[Option<&T>]) -> Result<Option<T>> {
        Err(recorded_only())
    }
    /// The block again, in a scope of its own, differentiated there with
    /// `g` as its output's seed; an input no gradient reaches gets `None`
    /// (no zeros are made for it). The scope, the recomputed activations
    /// with it, ends before this returns.
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, _: Tensor, g: Tensor) -> Result<InputGrads<Tensor>> {
        Graph::scope(|h| {
            let leaves: Vec<Var<'_>> = xs.into_iter().map(|x| h.leaf(x)).collect();
            let out = (self.block)(h, &leaves)?;
            let hit = reached(h, out, &leaves);
            let wanted: Vec<Var<'_>> = leaves.iter().zip(&hit).filter(|(_, &r)| r).map(|(v, _)| *v).collect();
            let opts = GradOptions { grad_outputs: Some(vec![g]), retain_graph: false };
            let mut grads = h.grad_with(&[out], &wanted, opts)?.into_iter();
            Ok(hit.iter().map(|&r| if r { grads.next() } else { None }).collect())
        })
    }
    /// Forward mode, eagerly: the block again in a scope of its own, with
    /// zero tangents where none is given.
    fn jvp_eager(&self, xs: &[&Tensor], _: &Tensor, ts: &[Option<&Tensor>]) -> Result<Option<Tensor>> {
        Graph::scope(|h| {
            let leaves: Vec<Var<'_>> = xs.iter().map(|x| h.leaf((*x).clone())).collect();
            let out = (self.block)(h, &leaves)?;
            let tangents = xs
                .iter()
                .zip(ts)
                .map(|(x, t)| match t {
                    Some(t) => Ok((*t).clone()),
                    None => Tensor::zeros_on(x.shape().clone(), x.dtype(), x.device()),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Some(h.jvp(&[out], &leaves, &tangents)?.remove(0)))
        })
    }
}

impl Rerecorded for Checkpoint {
    /// The block recorded into `graph` on the node's inputs, differentiated
    /// there with seed `g`.
    fn reverse_rerecorded<'g>(
        &self,
        graph: &'g Graph,
        input_ids: &[NodeId],
        g: Traced<'g>,
    ) -> Result<SmallVec<[Option<Traced<'g>>; 3]>> {
        let xs: Vec<Var<'g>> = input_ids.iter().map(|&i| graph.var(i)).collect();
        let out = (self.block)(graph, &xs)?;
        let seed = graph.var(from_raw(g.id));
        let grads = graph.grad_graph_with(&[out], &xs, Some(&[seed]))?;
        Ok(grads.into_iter().map(|v| Some(v.traced())).collect())
    }

    /// The block recorded into `graph`, pushed forward along `ts`.
    fn forward_rerecorded<'g>(
        &self,
        graph: &'g Graph,
        input_ids: &[NodeId],
        ts: &[Option<&Traced<'g>>],
    ) -> Result<Option<Traced<'g>>> {
        let xs: Vec<Var<'g>> = input_ids.iter().map(|&i| graph.var(i)).collect();
        let out = (self.block)(graph, &xs)?;
        let mut tangents = Vec::with_capacity(xs.len());
        for (x, t) in xs.iter().zip(ts) {
            tangents.push(match t {
                Some(t) => graph.var(from_raw(t.id)),
                None => graph.constant(Tensor::zeros_on(x.shape(), x.dtype(), x.device())?),
            });
        }
        Ok(Some(graph.jvp_graph(&[out], &xs, &tangents)?.remove(0).traced()))
    }
}

impl Graph {
    /// Runs `block` on `inputs` as one checkpointed node (PyTorch's
    /// `torch.utils.checkpoint`): only the inputs and the output are kept,
    /// and the block's activations are recomputed when a backward needs
    /// them, inside the backward's own nested scope, which frees them
    /// before the backward goes on. Every value the block differentiates
    /// must come in through `inputs` (pass the parameters too; a layer's
    /// `Bound` can be rebuilt from them with `Bound::from_vars`), and the
    /// block must compute the same function each time it runs (give it a
    /// fixed seed for dropout). Gradients are those of the plain block (bit
    /// for bit on the CPU when the inputs are used only inside it), and
    /// recorded passes (`grad_graph`, `jvp_graph`, `jvp`) work through it
    /// to any order.
    ///
    /// ```
    /// use tapir::prelude::*;
    ///
    /// let x0 = Tensor::from_vec(vec![0.5f64, -1.0, 2.0], [3])?;
    /// let (plain, ckpt) = Graph::scope(|g| {
    ///     let x = g.leaf(x0.clone());
    ///     let y = x.tanh()?.mul(&x)?.sum_all()?;
    ///     // The same block, checkpointed: only x and c are kept.
    ///     let c = g.checkpoint(&[x], |_h, v| v[0].tanh()?.mul(&v[0])?.sum_all())?;
    ///     Ok::<_, Error>((g.grad(y, &[x])?.remove(0), g.grad(c, &[x])?.remove(0)))
    /// })?;
    /// assert_eq!(plain.to_vec::<f64>()?, ckpt.to_vec::<f64>()?);
    /// # Ok::<(), Error>(())
    /// ```
    pub fn checkpoint<'g, F>(&'g self, inputs: &[Var<'g>], block: F) -> Result<Var<'g>>
    where
        F: for<'h> Fn(&'h Graph, &[Var<'h>]) -> Result<Var<'h>> + Send + Sync + 'static,
    {
        self.check_own("checkpoint", inputs)?;
        if inputs.is_empty() {
            return Err(Error::invalid_arg("checkpoint", "a block needs at least one input"));
        }
        let op = Arc::new(Checkpoint { block: Arc::new(block), arity: inputs.len() });
        let ids: SmallVec<[NodeId; 4]> = inputs.iter().map(|v| v.id).collect();
        let id = self.record_op(op.clone(), &ids)?;
        self.blocks.borrow_mut().insert(id, op);
        Ok(self.var(id))
    }
}
