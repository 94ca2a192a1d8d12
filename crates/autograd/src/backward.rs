//! Reverse mode. Gradients are returned as values and never stored on a
//! parameter, so the parameter <-> grad reference cycle of PyTorch has
//! nowhere to form.

use std::collections::{HashMap, HashSet};

use smallvec::SmallVec;
use tapir_tensor::{BinaryOps, Diff, DynOp, Error, Result, Saved, ShapeOps, Tape, Tensor, Traced};

use slotmap::SlotMap;

use crate::graph::{from_raw, released, to_raw, Graph, Node, NodeId, Var};

/// Options of a backward pass.
#[derive(Debug, Clone, Default)]
pub struct GradOptions {
    /// Seeds for each output (default: ones, so a scalar output gets its
    /// plain gradient and a tensor output the gradient of its sum).
    pub grad_outputs: Option<Vec<Tensor>>,
    /// Keep intermediate values after a first-order pass, so a second
    /// backward through the same nodes works (torch's retain_graph). Passes
    /// that record (`grad_graph`) always keep them.
    pub retain_graph: bool,
}

/// What hears of each input's gradient once it is final: the input's
/// position in `inputs` and the gradient.
type ReadyHook<'a, V> = dyn FnMut(usize, &V) -> Result<()> + 'a;

/// Which way a pass walks the tape, which decides the nodes it visits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Backward: only nodes requiring grad carry a gradient, and the walk
    /// goes on past a requested input, which may itself depend on another.
    Reverse,
    /// Forward: any node may carry a tangent, and the walk stops at a
    /// requested input, whose tangent is given.
    Forward,
}

/// The nodes on which `outputs` depend and which depend on `inputs`, in
/// topological order (inputs first): what a pass in direction `dir` must
/// visit.
pub(crate) fn path(g: &Graph, outputs: &[NodeId], inputs: &[NodeId], dir: Direction) -> Vec<NodeId> {
    let nodes = g.nodes.borrow();
    let visits = |n: NodeId| dir == Direction::Forward || nodes[n].requires_grad;
    // Iterative DFS post-order from the outputs.
    let mut order = Vec::new();
    let mut seen: HashSet<NodeId> = HashSet::new();
    let mut stack: Vec<(NodeId, usize)> = Vec::new();
    for &o in outputs {
        if seen.contains(&o) || !visits(o) {
            continue;
        }
        seen.insert(o);
        stack.push((o, 0));
        while let Some(&mut (n, ref mut next)) = stack.last_mut() {
            let stop = dir == Direction::Forward && inputs.contains(&n);
            let ins: &[NodeId] = if stop { &[] } else { &nodes[n].inputs };
            if *next < ins.len() {
                let c = ins[*next];
                *next += 1;
                if visits(c) && seen.insert(c) {
                    stack.push((c, 0));
                }
            } else {
                order.push(n);
                stack.pop();
            }
        }
    }
    // Keep only nodes from which a requested input is reachable.
    let mut leads: HashMap<NodeId, bool> = HashMap::with_capacity(order.len());
    for &n in &order {
        let l = inputs.contains(&n) || nodes[n].inputs.iter().any(|c| leads.get(c).copied().unwrap_or(false));
        leads.insert(n, l);
    }
    order.into_iter().filter(|n| leads[n]).collect()
}

fn check_inputs(g: &Graph, vars: &[Var<'_>]) -> Result<()> {
    g.check_own("grad", vars)
}

fn seeds(outputs: &[Var<'_>], grad_outputs: Option<Vec<Tensor>>) -> Result<Vec<Tensor>> {
    match grad_outputs {
        // Made on each output's device: a seed on the host would make the
        // first rule a device mismatch.
        None => outputs.iter().map(|o| Tensor::ones_on(o.shape(), o.dtype(), o.device())).collect(),
        Some(s) => {
            if s.len() != outputs.len() {
                return Err(Error::invalid_arg(
                    "grad",
                    format!("{} grad_outputs for {} outputs", s.len(), outputs.len()),
                ));
            }
            for (o, s) in outputs.iter().zip(&s) {
                if o.shape() != *s.shape() {
                    return Err(Error::ShapeMismatch {
                        op: "grad",
                        lhs: Box::new(o.shape()),
                        rhs: Box::new(s.shape().clone()),
                    });
                }
                if o.device() != s.device() {
                    return Err(Error::DeviceMismatch { op: "grad", lhs: o.device(), rhs: s.device() });
                }
            }
            Ok(s)
        }
    }
}

impl Graph {
    /// Gradients of the scalar `output` with respect to `inputs`, as plain
    /// tensors. Nothing is recorded. An input the output does not depend on
    /// gets zeros.
    ///
    /// # A first-order `grad` frees the intermediate values
    ///
    /// Each intermediate value is freed as soon as no rule that may still
    /// run reads it (see [`Saved`]), as PyTorch frees a graph's saved
    /// tensors in `backward()`: that is what keeps the peak of a training
    /// step at one forward's worth of activations. The output and the
    /// inputs keep their values, so `output.item()` still works afterwards,
    /// but reading an intermediate [`Var::value`] after `grad` is an
    /// [`Error::Graph`] that says so. Read what you need before calling
    /// `grad`, or ask to keep everything with
    /// [`GradOptions::retain_graph`] through [`Graph::grad_with`].
    /// [`Graph::grad_graph`] (recorded, for higher orders) frees nothing.
    ///
    /// ```
    /// use tapir::prelude::*;
    ///
    /// Graph::scope(|g| {
    ///     let x = g.leaf(Tensor::from_vec(vec![0.5f64, -1.0], [2])?);
    ///     let h = x.tanh()?;
    ///     let loss = h.square()?.sum_all()?;
    ///     let hidden = h.value()?; // read before grad: a plain tensor, kept
    ///     let dx = g.grad(loss, &[x])?;
    ///     assert!(h.value().is_err()); // released by the pass
    ///     assert!(loss.item()? > 0.0); // the output keeps its value
    ///     let want: Vec<f64> = hidden.to_vec::<f64>()?.iter().map(|t| 2.0 * t * (1.0 - t * t)).collect();
    ///     assert!(dx[0].to_vec::<f64>()?.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-12));
    ///
    ///     // With retain_graph every value stays, and a second pass can run.
    ///     let h = x.tanh()?;
    ///     let loss = h.square()?.sum_all()?;
    ///     let keep = GradOptions { retain_graph: true, ..Default::default() };
    ///     let first = g.grad_with(&[loss], &[x], keep)?;
    ///     assert!(h.value().is_ok());
    ///     assert_eq!(g.grad(loss, &[x])?[0].to_vec::<f64>()?, first[0].to_vec::<f64>()?);
    ///     Ok::<_, Error>(())
    /// })?;
    /// # Ok::<(), Error>(())
    /// ```
    pub fn grad(&self, output: Var<'_>, inputs: &[Var<'_>]) -> Result<Vec<Tensor>> {
        self.grad_with(&[output], inputs, GradOptions::default())
    }

    /// Gradients as recorded values of this graph (torch's
    /// `create_graph=True`): they can be differentiated again, to any order.
    /// Nothing is freed until the scope ends. The products and sums the pass
    /// records are computed when first read (by an op, a rule or
    /// [`Var::value`]): a Hessian-vector product, which pushes tangents
    /// through each weight's gradient `g^T x` and its bias's `g.sum(0)`,
    /// never computes them. Their shapes are checked when recorded; only
    /// what their kernel itself may fail on (memory) fails at the read.
    ///
    /// ```
    /// use tapir::prelude::*;
    ///
    /// // d/dx of x^3 is 3x^2, and d/dx of that is 6x, at x = 2.
    /// let (d1, d2) = Graph::scope(|g| {
    ///     let x = g.leaf(Tensor::from_vec(vec![2.0f64], [1])?);
    ///     let dy = g.grad_graph(x.powf(3.0)?.sum_all()?, &[x])?[0];
    ///     let d1 = dy.value()?; // read first: the first-order grad below frees dy
    ///     let d2 = g.grad(dy.sum_all()?, &[x])?.remove(0);
    ///     Ok::<_, Error>((d1, d2))
    /// })?;
    /// assert_eq!((d1.item()?, d2.item()?), (12.0, 12.0));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn grad_graph<'g>(&'g self, output: Var<'g>, inputs: &[Var<'g>]) -> Result<Vec<Var<'g>>> {
        self.grad_graph_with(&[output], inputs, None)
    }

    /// First-order backward from several outputs, with options.
    pub fn grad_with(&self, outputs: &[Var<'_>], inputs: &[Var<'_>], opts: GradOptions) -> Result<Vec<Tensor>> {
        check_inputs(self, outputs)?;
        check_inputs(self, inputs)?;
        let seeds = seeds(outputs, opts.grad_outputs)?;
        let out_ids: Vec<NodeId> = outputs.iter().map(|v| v.id).collect();
        let in_ids: Vec<NodeId> = inputs.iter().map(|v| v.id).collect();
        let order = path(self, &out_ids, &in_ids, Direction::Reverse);
        let saved = if opts.retain_graph {
            None
        } else {
            // The values this pass releases may be a deferred value's inputs.
            self.force_all()?;
            Some(SavedValues::new(self, &order, &out_ids, &in_ids))
        };
        self.backward(&order, &out_ids, inputs, seeds, saved, None)
    }

    /// [`grad`](Self::grad), calling `on_ready(k, gradient)` for each of
    /// `inputs` the moment its gradient is final, while the pass goes on
    /// (inputs no gradient reaches are not reported). The walk is in reverse
    /// topological order, so an input is final as soon as every node that
    /// reads it has run: the gradients of the last layer come first, the
    /// first layer's last. It is what lets data parallelism start reducing a
    /// bucket of gradients before the backward has produced the rest (torch's
    /// gradient hooks in DistributedDataParallel). An error from `on_ready`
    /// ends the pass and is returned.
    ///
    /// ```
    /// use tapir::prelude::*;
    ///
    /// let order = Graph::scope(|g| {
    ///     let (a, b) = (g.leaf(Tensor::scalar(2.0f32)), g.leaf(Tensor::scalar(3.0f32)));
    ///     let loss = a.mul(&b)?.tanh()?.mul(&b)?;
    ///     let mut order = Vec::new();
    ///     let grads = g.grad_hooked(loss, &[a, b], &mut |k, _grad| {
    ///         order.push(k);
    ///         Ok(())
    ///     })?;
    ///     assert_eq!(grads.len(), 2);
    ///     Ok::<_, Error>(order)
    /// })?;
    /// assert_eq!(order.len(), 2); // each input once, when it was final
    /// # Ok::<(), Error>(())
    /// ```
    pub fn grad_hooked(
        &self,
        output: Var<'_>,
        inputs: &[Var<'_>],
        on_ready: &mut dyn FnMut(usize, &Tensor) -> Result<()>,
    ) -> Result<Vec<Tensor>> {
        let outputs = [output];
        check_inputs(self, &outputs)?;
        check_inputs(self, inputs)?;
        let seeds = seeds(&outputs, None)?;
        let out_ids = [output.id];
        let in_ids: Vec<NodeId> = inputs.iter().map(|v| v.id).collect();
        let order = path(self, &out_ids, &in_ids, Direction::Reverse);
        self.force_all()?;
        let saved = Some(SavedValues::new(self, &order, &out_ids, &in_ids));
        self.backward(&order, &out_ids, inputs, seeds, saved, Some(on_ready))
    }

    /// Recorded backward from several outputs, seeded by `grad_outputs`
    /// (recorded values; default ones).
    pub fn grad_graph_with<'g>(
        &'g self,
        outputs: &[Var<'g>],
        inputs: &[Var<'g>],
        grad_outputs: Option<&[Var<'g>]>,
    ) -> Result<Vec<Var<'g>>> {
        check_inputs(self, outputs)?;
        check_inputs(self, inputs)?;
        check_inputs(self, grad_outputs.unwrap_or_default())?;
        let out_ids: Vec<NodeId> = outputs.iter().map(|v| v.id).collect();
        let in_ids: Vec<NodeId> = inputs.iter().map(|v| v.id).collect();
        let order = path(self, &out_ids, &in_ids, Direction::Reverse);
        let mut seeds = Vec::with_capacity(outputs.len());
        for (k, o) in outputs.iter().enumerate() {
            seeds.push(match grad_outputs {
                Some(s) => {
                    let s =
                        s.get(k).ok_or_else(|| Error::invalid_arg("grad_graph", "fewer grad_outputs than outputs"))?;
                    if s.shape() != o.shape() {
                        return Err(Error::ShapeMismatch {
                            op: "grad_graph",
                            lhs: Box::new(o.shape()),
                            rhs: Box::new(s.shape()),
                        });
                    }
                    if s.device() != o.device() {
                        return Err(Error::DeviceMismatch { op: "grad_graph", lhs: o.device(), rhs: s.device() });
                    }
                    s.traced()
                }
                None => o.traced().lift(Tensor::ones_on(o.shape(), o.dtype(), o.device())?),
            });
        }
        // The products the rules record are computed when first read: the
        // last ones (a weight's gradient `g^T x`) may never be, where only
        // their tangents are wanted (a Hessian-vector product).
        self.defer.set(self.defer.get() + 1);
        let grads = self.backward(&order, &out_ids, inputs, seeds, None, None);
        self.defer.set(self.defer.get() - 1);
        Ok(grads?.into_iter().map(|t| self.var(from_raw(t.id))).collect())
    }

    /// The reverse walk both passes share: seeds the outputs, runs each
    /// reached node's rule in reverse topological `order`, adds up what
    /// flows into each node, and returns the gradient of each of `inputs`
    /// (zeros where none arrived). `saved` is what releases values as
    /// their last reader runs; without it every value stays. `on_ready`
    /// hears of each input's gradient as soon as it is final.
    fn backward<'g, V: Value<'g>>(
        &'g self,
        order: &[NodeId],
        out_ids: &[NodeId],
        inputs: &[Var<'_>],
        seeds: Vec<V>,
        mut saved: Option<SavedValues>,
        mut on_ready: Option<&mut ReadyHook<'_, V>>,
    ) -> Result<Vec<V>> {
        let mut grads: HashMap<NodeId, V> = HashMap::new();
        for (&o, s) in out_ids.iter().zip(seeds) {
            accumulate(&mut grads, o, s)?;
        }
        let mut results: HashMap<NodeId, V> = HashMap::new();
        for &n in order.iter().rev() {
            // A node no gradient reached keeps its values: another pass may
            // still run its rule.
            let Some(gn) = grads.remove(&n) else { continue };
            if let Some(k) = inputs.iter().position(|v| v.id == n) {
                // Every reader of an input has run before it (reverse
                // topological order): its gradient is final here.
                if let Some(hook) = on_ready.as_mut() {
                    hook(k, &gn)?;
                }
                results.insert(n, gn.clone());
            }
            let (op, input_ids) = {
                let nodes = self.nodes.borrow();
                let Some(op) = nodes[n].op.clone() else { continue };
                (op, nodes[n].inputs.clone())
            };
            let gin = V::reverse(self, &*op, n, &input_ids, gn, saved.as_mut())?;
            if saved.is_some() {
                // The rule is spent: what the op saved beyond values goes too.
                op.release();
            }
            for (i, gi) in input_ids.iter().zip(gin) {
                if let Some(gi) = gi {
                    if self.nodes.borrow()[*i].requires_grad {
                        accumulate(&mut grads, *i, gi)?;
                    }
                }
            }
        }
        let mut out: Vec<V> = Vec::with_capacity(inputs.len());
        for (i, v) in inputs.iter().enumerate() {
            // The same input listed twice gets its gradient twice.
            let g = match inputs[..i].iter().position(|b| b.id == v.id) {
                Some(j) => out[j].clone(),
                None => match results.remove(&v.id) {
                    Some(g) => g,
                    None => V::zeros(self, v)?,
                },
            };
            out.push(g);
        }
        Ok(out)
    }
}

/// A value a pass carries along the tape: a plain [`Tensor`] (nothing
/// recorded, the ops' eager rules with their fused kernels) or a
/// [`Traced`] handle (every step recorded on the graph, so the result can
/// be differentiated again). The walks are written once over this trait;
/// what differs is how a rule gets its operands and which of its compiled
/// forms runs.
pub(crate) trait Value<'g>: Diff {
    /// Runs the reverse rule of node `n` (op `op`, inputs `input_ids`) on
    /// the gradient `g` of its output. `saved`, when given, decides which
    /// values the rule gets and which it takes over.
    fn reverse(
        graph: &'g Graph,
        op: &dyn DynOp,
        n: NodeId,
        input_ids: &[NodeId],
        g: Self,
        saved: Option<&mut SavedValues>,
    ) -> Result<SmallVec<[Option<Self>; 3]>>;

    /// Runs the forward rule of node `n` on its inputs' tangents `ts`
    /// (`None` for zero).
    fn forward(
        graph: &'g Graph,
        op: &dyn DynOp,
        n: NodeId,
        input_ids: &[NodeId],
        ts: &[Option<&Self>],
    ) -> Result<Option<Self>>;

    /// Zeros shaped like `like`: what a pass returns where nothing flowed.
    fn zeros(graph: &'g Graph, like: &Var<'_>) -> Result<Self>;
}

impl<'g> Value<'g> for Tensor {
    fn reverse(
        graph: &'g Graph,
        op: &dyn DynOp,
        n: NodeId,
        input_ids: &[NodeId],
        g: Tensor,
        saved: Option<&mut SavedValues>,
    ) -> Result<SmallVec<[Option<Tensor>; 3]>> {
        let (xs, y) = match saved {
            Some(s) => s.take_for(graph, n, input_ids, op.saves())?,
            None => {
                if op.saves().reads_output() {
                    graph.force(n)?;
                }
                let nodes = graph.nodes.borrow();
                let value = |i: NodeId| nodes[i].value.clone().ok_or_else(|| released(op.name()));
                let y = if nodes[n].deferred { stand_in(&mut Vec::new(), &nodes[n])? } else { value(n)? };
                (input_ids.iter().map(|&i| value(i)).collect::<Result<_>>()?, y)
            }
        };
        // The walk accumulates only the gradients of inputs that require
        // one and drops the rest, so the rule need not compute those. Most
        // nodes have every input wanted: they take the plain rule, without
        // building the mask (a chain of scalar ops is this walk's overhead
        // alone, where building it cost a few percent).
        let nodes = graph.nodes.borrow();
        if input_ids.iter().all(|&i| nodes[i].requires_grad) {
            drop(nodes);
            return op.vjp_eager(xs, y, g);
        }
        let wanted: SmallVec<[bool; 3]> = input_ids.iter().map(|&i| nodes[i].requires_grad).collect();
        drop(nodes);
        op.vjp_eager_wanted(xs, y, g, &wanted)
    }

    fn forward(
        graph: &'g Graph,
        op: &dyn DynOp,
        n: NodeId,
        input_ids: &[NodeId],
        ts: &[Option<&Tensor>],
    ) -> Result<Option<Tensor>> {
        // A deferred output is computed only for a rule that reads it;
        // one that does not gets a stand-in.
        if op.jvp_reads_output() {
            graph.force(n)?;
        }
        // An eager rule records nothing, so the values can stay borrowed
        // from the graph while it runs.
        let nodes = graph.nodes.borrow();
        let value = |i: NodeId| nodes[i].value.as_ref().ok_or_else(|| released(op.name()));
        let xs = input_ids.iter().map(|&i| value(i)).collect::<Result<SmallVec<[&Tensor; 3]>>>()?;
        let stand;
        let y = if nodes[n].deferred {
            stand = stand_in(&mut Vec::new(), &nodes[n])?;
            &stand
        } else {
            value(n)?
        };
        op.jvp_eager(&xs, y, ts)
    }

    fn zeros(_: &'g Graph, like: &Var<'_>) -> Result<Tensor> {
        Tensor::zeros_on(like.shape(), like.dtype(), like.device())
    }
}

impl<'g> Value<'g> for Traced<'g> {
    fn reverse(
        graph: &'g Graph,
        op: &dyn DynOp,
        n: NodeId,
        input_ids: &[NodeId],
        g: Traced<'g>,
        _: Option<&mut SavedValues>,
    ) -> Result<SmallVec<[Option<Traced<'g>>; 3]>> {
        if let Some(block) = graph.block_of(n) {
            return block.reverse_rerecorded(graph, input_ids, g);
        }
        let (xs, y) = handles(graph, n, input_ids);
        let refs: SmallVec<[&Traced<'g>; 3]> = xs.iter().collect();
        op.vjp_traced(&refs, &y, &g)
    }

    fn forward(
        graph: &'g Graph,
        op: &dyn DynOp,
        n: NodeId,
        input_ids: &[NodeId],
        ts: &[Option<&Traced<'g>>],
    ) -> Result<Option<Traced<'g>>> {
        if let Some(block) = graph.block_of(n) {
            return block.forward_rerecorded(graph, input_ids, ts);
        }
        let (xs, y) = handles(graph, n, input_ids);
        let refs: SmallVec<[&Traced<'g>; 3]> = xs.iter().collect();
        op.jvp_traced(&refs, &y, ts)
    }

    fn zeros(graph: &'g Graph, like: &Var<'_>) -> Result<Traced<'g>> {
        Ok(graph.constant(Tensor::zeros_on(like.shape(), like.dtype(), like.device())?).traced())
    }
}

/// Recording handles on node `n`'s inputs and on `n` itself.
fn handles<'g>(graph: &'g Graph, n: NodeId, input_ids: &[NodeId]) -> (SmallVec<[Traced<'g>; 3]>, Traced<'g>) {
    let handle = |i: NodeId| Traced { tape: graph as &dyn Tape, id: to_raw(i) };
    (input_ids.iter().map(|&i| handle(i)).collect(), handle(n))
}

/// The bookkeeping that lets a first-order backward free each value as soon
/// as no rule that may still run reads it (what each rule reads is its op's
/// [`Saved`]), the way torch frees saved tensors as their nodes run. Rules
/// outside this pass count too (another loss's backward may still run
/// them), so only values no rule will ever read again go. The outputs, the
/// requested inputs, leaves and constants keep their values.
pub(crate) struct SavedValues {
    /// Reads still to come, per node, by the rules not yet spent.
    readers: HashMap<NodeId, usize>,
    /// Nodes whose values stay.
    kept: HashSet<NodeId>,
    /// One zero scalar per dtype and device, which every stand-in views.
    zeros: Vec<Tensor>,
}

impl SavedValues {
    /// Counts the reads of every rule of the graph that may still run (this
    /// pass's, and those no pass has spent), and frees at once the values on
    /// this pass's path that none of them needs.
    fn new(g: &Graph, order: &[NodeId], outputs: &[NodeId], inputs: &[NodeId]) -> SavedValues {
        let mut nodes = g.nodes.borrow_mut();
        let mut readers: HashMap<NodeId, usize> = HashMap::with_capacity(order.len());
        let on_path: HashSet<NodeId> = order.iter().copied().collect();
        for (n, node) in nodes.iter() {
            let Some(op) = &node.op else { continue };
            // A rule spent by an earlier pass runs again if it is on this
            // pass's path (and finds its values if they were kept).
            if !node.requires_grad || (node.rule_spent && !on_path.contains(&n)) {
                continue;
            }
            let saves = op.saves();
            if saves.reads_output() {
                *readers.entry(n).or_default() += 1;
            }
            for (k, &i) in node.inputs.iter().enumerate() {
                if saves.reads_input(k) {
                    *readers.entry(i).or_default() += 1;
                }
            }
        }
        let kept: HashSet<NodeId> = outputs.iter().chain(inputs).copied().collect();
        let saved = SavedValues { readers, kept, zeros: Vec::new() };
        for &n in order {
            saved.release_if_unread(&mut nodes, n);
        }
        saved
    }

    fn release_if_unread(&self, nodes: &mut SlotMap<NodeId, Node>, n: NodeId) {
        let node = &mut nodes[n];
        if node.op.is_some() && !self.kept.contains(&n) && self.readers.get(&n).copied().unwrap_or(0) == 0 {
            node.value = None;
        }
    }

    /// The values the rule of node `n` reads, its inputs' and its own;
    /// what it does not read comes as a stand-in with the right shape and
    /// dtype. A value read here for the last time is taken out of its node
    /// (handed over, so the rule may reuse its buffer).
    fn take_for(
        &mut self,
        g: &Graph,
        n: NodeId,
        input_ids: &[NodeId],
        saves: Saved,
    ) -> Result<(SmallVec<[Tensor; 3]>, Tensor)> {
        let mut nodes = g.nodes.borrow_mut();
        let name = nodes[n].op.as_ref().map_or("backward", |o| o.name());
        let mut take = |nodes: &mut SlotMap<NodeId, Node>, i: NodeId| -> Result<Tensor> {
            let left = self.readers.get_mut(&i).map(|r| {
                *r = r.saturating_sub(1);
                *r
            });
            let node = &mut nodes[i];
            let last = left == Some(0) && node.op.is_some() && !self.kept.contains(&i);
            let value = if last { node.value.take() } else { node.value.clone() };
            value.ok_or_else(|| released(name))
        };
        let mut xs = SmallVec::new();
        for (k, &i) in input_ids.iter().enumerate() {
            xs.push(if saves.reads_input(k) { take(&mut nodes, i)? } else { stand_in(&mut self.zeros, &nodes[i])? });
        }
        let y = if saves.reads_output() { take(&mut nodes, n)? } else { stand_in(&mut self.zeros, &nodes[n])? };
        nodes[n].rule_spent = true;
        self.release_if_unread(&mut nodes, n);
        Ok((xs, y))
    }
}

/// A tensor with `node`'s shape, dtype and device that holds no data of
/// its own (a broadcast view of one shared zero): what a rule gets for
/// a value it declared it does not read. `zeros` holds one zero scalar per
/// dtype and device, made on first need.
fn stand_in(zeros: &mut Vec<Tensor>, node: &Node) -> Result<Tensor> {
    let zero = match zeros.iter().find(|z| z.dtype() == node.dtype && z.device() == node.device) {
        Some(z) => z.clone(),
        None => {
            let z = Tensor::zeros_on([], node.dtype, node.device)?;
            zeros.push(z.clone());
            z
        }
    };
    zero.broadcast_to(node.shape.clone())
}

fn accumulate<V: Diff>(grads: &mut HashMap<NodeId, V>, id: NodeId, g: V) -> Result<()> {
    match grads.remove(&id) {
        Some(prev) => grads.insert(id, prev.add(&g)?),
        None => grads.insert(id, g),
    };
    Ok(())
}
