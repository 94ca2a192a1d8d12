//! Forward mode over the tape: tangents are pushed from inputs to outputs
//! through the recorded nodes with each op's JVP rule. Run over a graph that
//! itself holds a recorded gradient, this is forward-over-reverse: a
//! Hessian-vector product at the cost of a small constant times a gradient.

use std::collections::HashMap;

use smallvec::SmallVec;
use tapir_tensor::{Diff, Error, Result, Tensor, Traced};

use crate::graph::{from_raw, to_raw, Graph, NodeId, Var};

/// Nodes on which `outputs` depend and which depend on `inputs`, inputs
/// first. Unlike a backward path this ignores `requires_grad`: forward mode
/// may start from any node.
fn forward_path(g: &Graph, outputs: &[NodeId], inputs: &[NodeId]) -> Vec<NodeId> {
    let nodes = g.nodes.borrow();
    let mut order = Vec::new();
    let mut seen: HashMap<NodeId, ()> = HashMap::new();
    let mut stack: Vec<(NodeId, usize)> = Vec::new();
    for &o in outputs {
        if seen.insert(o, ()).is_some() {
            continue;
        }
        stack.push((o, 0));
        while let Some(&mut (n, ref mut next)) = stack.last_mut() {
            // Do not walk past an input: its tangent is given.
            let ins: &[NodeId] = if inputs.contains(&n) { &[] } else { &nodes[n].inputs };
            if *next < ins.len() {
                let c = ins[*next];
                *next += 1;
                if seen.insert(c, ()).is_none() {
                    stack.push((c, 0));
                }
            } else {
                order.push(n);
                stack.pop();
            }
        }
    }
    let mut depends: HashMap<NodeId, bool> = HashMap::new();
    for &n in &order {
        let d = inputs.contains(&n) || nodes[n].inputs.iter().any(|c| depends.get(c).copied().unwrap_or(false));
        depends.insert(n, d);
    }
    order.into_iter().filter(|n| depends[n]).collect()
}

fn check_tangents(inputs: &[Var<'_>], shapes: impl Iterator<Item = tapir_tensor::Shape>) -> Result<()> {
    for (x, s) in inputs.iter().zip(shapes) {
        if x.shape() != s {
            return Err(Error::ShapeMismatch { op: "jvp", lhs: x.shape(), rhs: s });
        }
    }
    Ok(())
}

impl Graph {
    /// Directional derivatives of `outputs` along `tangents` of `inputs`, as
    /// plain tensors (nothing recorded). Outputs that do not depend on the
    /// inputs get zeros.
    ///
    /// ```
    /// use tapir::prelude::*;
    ///
    /// // The derivative of sum(x^2) along v is 2 x . v.
    /// let jv = Graph::scope(|g| {
    ///     let x = g.leaf(Tensor::from_vec(vec![1.0f64, 2.0, 3.0], [3])?);
    ///     let y = x.square()?.sum_all()?;
    ///     let v = Tensor::from_vec(vec![1.0f64, 0.0, -1.0], [3])?;
    ///     Ok::<_, Error>(g.jvp(&[y], &[x], &[v])?.remove(0))
    /// })?;
    /// assert_eq!(jv.item()?, 2.0 * (1.0 - 3.0));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn jvp(&self, outputs: &[Var<'_>], inputs: &[Var<'_>], tangents: &[Tensor]) -> Result<Vec<Tensor>> {
        self.check_own("jvp", outputs)?;
        self.check_own("jvp", inputs)?;
        if inputs.len() != tangents.len() {
            return Err(Error::invalid_arg("jvp", format!("{} tangents for {} inputs", tangents.len(), inputs.len())));
        }
        check_tangents(inputs, tangents.iter().map(|t| t.shape().clone()))?;
        let out_ids: Vec<NodeId> = outputs.iter().map(|v| v.id).collect();
        let in_ids: Vec<NodeId> = inputs.iter().map(|v| v.id).collect();
        let mut tans: HashMap<NodeId, Tensor> = in_ids.iter().copied().zip(tangents.iter().cloned()).collect();
        for n in forward_path(self, &out_ids, &in_ids) {
            if tans.contains_key(&n) {
                continue;
            }
            let (op, ins, xs, y) = {
                let nodes = self.nodes.borrow();
                let node = &nodes[n];
                let Some(op) = node.op.clone() else { continue };
                if !op.is_differentiable() {
                    continue;
                }
                let xs = node
                    .inputs
                    .iter()
                    .map(|&i| nodes[i].value.clone().ok_or_else(|| crate::graph::released(op.name())))
                    .collect::<Result<SmallVec<[Tensor; 3]>>>()?;
                let y = node.value.clone().ok_or_else(|| crate::graph::released(op.name()))?;
                (op, node.inputs.clone(), xs, y)
            };
            let owned: SmallVec<[Option<Tensor>; 3]> = ins.iter().map(|i| tans.get(i).cloned()).collect();
            if owned.iter().all(|t| t.is_none()) {
                continue;
            }
            let ts: SmallVec<[Option<&Tensor>; 3]> = owned.iter().map(|t| t.as_ref()).collect();
            let refs: SmallVec<[&Tensor; 3]> = xs.iter().collect();
            if let Some(t) = op.jvp_eager(&refs, &y, &ts)? {
                tans.insert(n, t);
            }
        }
        outputs
            .iter()
            .map(|o| tans.get(&o.id).cloned().map_or_else(|| Tensor::zeros(o.shape(), o.dtype()), Ok))
            .collect()
    }

    /// Like [`Graph::jvp`], but recorded, with recorded tangents: the result
    /// can be differentiated again (the Laplacian inside a PINN loss).
    pub fn jvp_graph<'g>(
        &'g self,
        outputs: &[Var<'g>],
        inputs: &[Var<'g>],
        tangents: &[Var<'g>],
    ) -> Result<Vec<Var<'g>>> {
        for vars in [outputs, inputs, tangents] {
            self.check_own("jvp_graph", vars)?;
        }
        if inputs.len() != tangents.len() {
            return Err(Error::invalid_arg(
                "jvp_graph",
                format!("{} tangents for {} inputs", tangents.len(), inputs.len()),
            ));
        }
        check_tangents(inputs, tangents.iter().map(|t| t.shape()))?;
        let out_ids: Vec<NodeId> = outputs.iter().map(|v| v.id).collect();
        let in_ids: Vec<NodeId> = inputs.iter().map(|v| v.id).collect();
        let mut tans: HashMap<NodeId, Traced<'g>> =
            in_ids.iter().copied().zip(tangents.iter().map(|t| t.traced())).collect();
        for n in forward_path(self, &out_ids, &in_ids) {
            if tans.contains_key(&n) {
                continue;
            }
            let (op, ins) = {
                let nodes = self.nodes.borrow();
                let Some(op) = nodes[n].op.clone() else { continue };
                if !op.is_differentiable() {
                    continue;
                }
                (op, nodes[n].inputs.clone())
            };
            let owned: SmallVec<[Option<Traced<'g>>; 3]> = ins.iter().map(|i| tans.get(i).copied()).collect();
            if owned.iter().all(|t| t.is_none()) {
                continue;
            }
            let ts: SmallVec<[Option<&Traced<'g>>; 3]> = owned.iter().map(|t| t.as_ref()).collect();
            let xs: SmallVec<[Traced<'g>; 3]> = ins.iter().map(|&i| Traced { tape: self, id: to_raw(i) }).collect();
            let refs: SmallVec<[&Traced<'g>; 3]> = xs.iter().collect();
            let y = Traced { tape: self as &dyn tapir_tensor::Tape, id: to_raw(n) };
            if let Some(t) = op.jvp_traced(&refs, &y, &ts)? {
                tans.insert(n, t);
            }
        }
        outputs
            .iter()
            .map(|o| match tans.get(&o.id) {
                Some(t) => Ok(self.var(from_raw(t.id))),
                None => Ok(self.constant(Tensor::zeros(o.shape(), o.dtype())?)),
            })
            .collect()
    }
}
