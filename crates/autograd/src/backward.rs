//! Reverse mode. Gradients are returned as values and never stored on a
//! parameter, so the parameter <-> grad reference cycle of PyTorch has
//! nowhere to form.

use std::collections::HashMap;

use smallvec::SmallVec;
use tapir_tensor::{BinaryOps, Diff, Error, Result, Tensor, Traced};

use crate::graph::{from_raw, released, to_raw, Graph, NodeId, Var};

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

/// The nodes between `outputs` and `inputs` that a backward pass must visit,
/// in topological order (inputs first).
pub(crate) fn path(g: &Graph, outputs: &[NodeId], inputs: &[NodeId]) -> Vec<NodeId> {
    let nodes = g.nodes.borrow();
    // Iterative DFS post-order from the outputs, over nodes requiring grad.
    let mut order = Vec::new();
    let mut state: HashMap<NodeId, bool> = HashMap::new(); // false = open, true = done
    let mut stack: Vec<(NodeId, usize)> = Vec::new();
    for &o in outputs {
        if state.contains_key(&o) || !nodes[o].requires_grad {
            continue;
        }
        state.insert(o, false);
        stack.push((o, 0));
        while let Some(&mut (n, ref mut next)) = stack.last_mut() {
            let ins = &nodes[n].inputs;
            if *next < ins.len() {
                let c = ins[*next];
                *next += 1;
                if nodes[c].requires_grad && !state.contains_key(&c) {
                    state.insert(c, false);
                    stack.push((c, 0));
                }
            } else {
                state.insert(n, true);
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
    if vars.iter().any(|v| !std::ptr::eq(v.graph, g)) {
        return Err(Error::Graph { reason: "grad: a variable from another graph".into() });
    }
    Ok(())
}

fn seeds(outputs: &[Var<'_>], grad_outputs: Option<&Vec<Tensor>>) -> Result<Vec<Tensor>> {
    match grad_outputs {
        None => outputs.iter().map(|o| Tensor::ones(o.shape(), o.dtype())).collect(),
        Some(s) => {
            if s.len() != outputs.len() {
                return Err(Error::invalid_arg(
                    "grad",
                    format!("{} grad_outputs for {} outputs", s.len(), outputs.len()),
                ));
            }
            for (o, s) in outputs.iter().zip(s) {
                if o.shape() != *s.shape() {
                    return Err(Error::ShapeMismatch { op: "grad", lhs: o.shape(), rhs: s.shape().clone() });
                }
            }
            Ok(s.clone())
        }
    }
}

impl Graph {
    /// Gradients of the scalar `output` with respect to `inputs`, as plain
    /// tensors. Nothing is recorded, and intermediate values are released
    /// as soon as the pass no longer needs them. An input the output does
    /// not depend on gets zeros.
    pub fn grad(&self, output: Var<'_>, inputs: &[Var<'_>]) -> Result<Vec<Tensor>> {
        self.grad_with(&[output], inputs, GradOptions::default())
    }

    /// Gradients as recorded values of this graph (torch's
    /// `create_graph=True`): they can be differentiated again, to any order.
    pub fn grad_graph<'g>(&'g self, output: Var<'g>, inputs: &[Var<'g>]) -> Result<Vec<Var<'g>>> {
        self.grad_graph_with(&[output], inputs, None)
    }

    /// First-order backward from several outputs, with options.
    pub fn grad_with(&self, outputs: &[Var<'_>], inputs: &[Var<'_>], opts: GradOptions) -> Result<Vec<Tensor>> {
        check_inputs(self, outputs)?;
        check_inputs(self, inputs)?;
        let seeds = seeds(outputs, opts.grad_outputs.as_ref())?;
        let out_ids: Vec<NodeId> = outputs.iter().map(|v| v.id).collect();
        let in_ids: Vec<NodeId> = inputs.iter().map(|v| v.id).collect();
        let order = path(self, &out_ids, &in_ids);
        let mut grads: HashMap<NodeId, Tensor> = HashMap::new();
        for (&o, s) in out_ids.iter().zip(seeds) {
            accumulate(&mut grads, o, s)?;
        }
        let mut results: HashMap<NodeId, Tensor> = HashMap::new();
        for &n in order.iter().rev() {
            let Some(gn) = grads.remove(&n) else { continue };
            if in_ids.contains(&n) {
                results.insert(n, gn.clone());
            }
            let (op, input_ids, xs, y) = {
                let nodes = self.nodes.borrow();
                let node = &nodes[n];
                let Some(op) = node.op.clone() else { continue };
                let xs = node
                    .inputs
                    .iter()
                    .map(|&i| nodes[i].value.clone().ok_or_else(|| released(op.name())))
                    .collect::<Result<SmallVec<[Tensor; 3]>>>()?;
                let y = node.value.clone().ok_or_else(|| released(op.name()))?;
                (op, node.inputs.clone(), xs, y)
            };
            let refs: SmallVec<[&Tensor; 3]> = xs.iter().collect();
            let gin = op.vjp_eager(&refs, &y, &gn)?;
            drop(refs);
            drop((xs, y, gn));
            for (i, gi) in input_ids.iter().zip(gin) {
                if let Some(gi) = gi {
                    if self.nodes.borrow()[*i].requires_grad {
                        accumulate(&mut grads, *i, gi)?;
                    }
                }
            }
            if !opts.retain_graph {
                // Release what only this pass needed: the node's own value.
                // Leaves and constants are the user's and stay.
                self.nodes.borrow_mut()[n].value = None;
            }
        }
        inputs
            .iter()
            .map(|v| match results.remove(&v.id) {
                Some(g) => Ok(g),
                None => Tensor::zeros(v.shape(), v.dtype()),
            })
            .collect::<Result<Vec<_>>>()
            .map(|mut v| {
                // The same input listed twice gets its gradient twice.
                for (i, a) in inputs.iter().enumerate() {
                    if let Some(j) = inputs[..i].iter().position(|b| b.id == a.id) {
                        v[i] = v[j].clone();
                    }
                }
                v
            })
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
        let out_ids: Vec<NodeId> = outputs.iter().map(|v| v.id).collect();
        let in_ids: Vec<NodeId> = inputs.iter().map(|v| v.id).collect();
        let order = path(self, &out_ids, &in_ids);
        let mut grads: HashMap<NodeId, Traced<'g>> = HashMap::new();
        for (k, o) in outputs.iter().enumerate() {
            let seed = match grad_outputs {
                Some(s) => {
                    let s =
                        s.get(k).ok_or_else(|| Error::invalid_arg("grad_graph", "fewer grad_outputs than outputs"))?;
                    if s.shape() != o.shape() {
                        return Err(Error::ShapeMismatch { op: "grad_graph", lhs: o.shape(), rhs: s.shape() });
                    }
                    s.traced()
                }
                None => o.traced().lift(Tensor::ones(o.shape(), o.dtype())?),
            };
            accumulate_traced(&mut grads, o.id, seed)?;
        }
        let mut results: HashMap<NodeId, Traced<'g>> = HashMap::new();
        for &n in order.iter().rev() {
            let Some(gn) = grads.remove(&n) else { continue };
            if in_ids.contains(&n) {
                results.insert(n, gn);
            }
            let (op, input_ids) = {
                let nodes = self.nodes.borrow();
                let Some(op) = nodes[n].op.clone() else { continue };
                (op, nodes[n].inputs.clone())
            };
            let xs: SmallVec<[Traced<'g>; 3]> =
                input_ids.iter().map(|&i| Traced { tape: self, id: to_raw(i) }).collect();
            let refs: SmallVec<[&Traced<'g>; 3]> = xs.iter().collect();
            let y = Traced { tape: self as &dyn tapir_tensor::Tape, id: to_raw(n) };
            let gin = op.vjp_traced(&refs, &y, &gn)?;
            for (i, gi) in input_ids.iter().zip(gin) {
                if let Some(gi) = gi {
                    if self.nodes.borrow()[*i].requires_grad {
                        accumulate_traced(&mut grads, *i, gi)?;
                    }
                }
            }
        }
        inputs
            .iter()
            .map(|v| match results.get(&v.id) {
                Some(t) => Ok(self.var(from_raw(t.id))),
                None => Ok(self.constant(Tensor::zeros(v.shape(), v.dtype())?)),
            })
            .collect()
    }
}

fn accumulate(grads: &mut HashMap<NodeId, Tensor>, id: NodeId, g: Tensor) -> Result<()> {
    match grads.remove(&id) {
        Some(prev) => grads.insert(id, prev.add(&g)?),
        None => grads.insert(id, g),
    };
    Ok(())
}

fn accumulate_traced<'g>(grads: &mut HashMap<NodeId, Traced<'g>>, id: NodeId, g: Traced<'g>) -> Result<()> {
    match grads.remove(&id) {
        Some(prev) => grads.insert(id, prev.add(&g)?),
        None => grads.insert(id, g),
    };
    Ok(())
}
