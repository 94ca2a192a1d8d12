//! Forward mode over the tape: tangents are pushed from inputs to outputs
//! through the recorded nodes with each op's JVP rule. Run over a graph that
//! itself holds a recorded gradient, this is forward-over-reverse: a
//! Hessian-vector product at the cost of a small constant times a gradient.

use std::collections::HashMap;

use smallvec::SmallVec;
use tapir_tensor::{Device, Diff, Error, Result, Shape, Tensor};

use crate::backward::{path, Direction, Value};
use crate::graph::{from_raw, Graph, NodeId, Var};

/// Each tangent has its input's shape and lives on its input's device (a
/// tangent elsewhere would fail later, in whichever rule met it first,
/// under that op's name).
fn check_tangents(inputs: &[Var<'_>], tangents: impl Iterator<Item = (Shape, Device)>) -> Result<()> {
    for (x, (s, d)) in inputs.iter().zip(tangents) {
        if x.shape() != s {
            return Err(Error::ShapeMismatch { op: "jvp", lhs: Box::new(x.shape()), rhs: Box::new(s) });
        }
        if x.device() != d {
            return Err(Error::DeviceMismatch { op: "jvp", lhs: x.device(), rhs: d });
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
        check_tangents(inputs, tangents.iter().map(|t| (t.shape().clone(), t.device())))?;
        self.push_tangents(outputs, inputs, tangents.iter().cloned())
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
        check_tangents(inputs, tangents.iter().map(|t| (t.shape(), t.device())))?;
        let tans = self.push_tangents(outputs, inputs, tangents.iter().map(|t| t.traced()))?;
        Ok(tans.into_iter().map(|t| self.var(from_raw(t.id))).collect())
    }

    /// The forward walk both modes share: pushes `tangents` of `inputs`
    /// through every node between them and `outputs`, in topological order,
    /// and returns each output's tangent (zeros where none arrived). A
    /// node whose inputs carry no tangent, or whose op has no derivative,
    /// gets none.
    fn push_tangents<'g, V: Value<'g>>(
        &'g self,
        outputs: &[Var<'_>],
        inputs: &[Var<'_>],
        tangents: impl Iterator<Item = V>,
    ) -> Result<Vec<V>> {
        let out_ids: Vec<NodeId> = outputs.iter().map(|v| v.id).collect();
        let in_ids: Vec<NodeId> = inputs.iter().map(|v| v.id).collect();
        let mut tans: HashMap<NodeId, V> = in_ids.iter().copied().zip(tangents).collect();
        for n in path(self, &out_ids, &in_ids, Direction::Forward) {
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
            let t = {
                let ts: SmallVec<[Option<&V>; 3]> = ins.iter().map(|i| tans.get(i)).collect();
                if ts.iter().all(|t| t.is_none()) {
                    continue;
                }
                V::forward(self, &*op, n, &ins, &ts)?
            };
            if let Some(t) = t {
                tans.insert(n, t);
            }
        }
        outputs
            .iter()
            .map(|o| match tans.get(&o.id) {
                Some(t) => Ok(t.clone()),
                None => V::zeros(self, o),
            })
            .collect()
    }
}
