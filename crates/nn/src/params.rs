//! Parameters: plain named tensors that never hold graph state.

use std::collections::HashMap;

use tapir_autograd::{Graph, Var};

use crate::precision::Precision;
use tapir_tensor::{Device, Error, Result, Tensor, UnaryOps};

/// Identifies a parameter in its [`ParamStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParamId(pub(crate) usize);

impl ParamId {
    /// Position in the store (insertion order).
    pub fn index(self) -> usize {
        self.0
    }
}

#[derive(Debug, Clone)]
struct Param {
    name: String,
    group: String,
    value: Tensor,
}

/// Named parameters, grouped (for per-group optimizer settings such as no
/// weight decay on norms and biases). Parameters are plain tensors: a graph
/// sees them only as leaves made by [`ParamStore::bind`] inside a scope, and
/// gradients come back as values in [`Grads`], never stored on a parameter.
#[derive(Debug, Clone, Default)]
pub struct ParamStore {
    params: Vec<Param>,
    by_name: HashMap<String, ParamId>,
}

impl ParamStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a parameter in the default group.
    pub fn add(&mut self, name: impl Into<String>, value: Tensor) -> Result<ParamId> {
        self.add_to_group(name, "default", value)
    }

    /// Adds a parameter in `group`. Names are unique.
    pub fn add_to_group(
        &mut self,
        name: impl Into<String>,
        group: impl Into<String>,
        value: Tensor,
    ) -> Result<ParamId> {
        let name = name.into();
        if !value.dtype().is_float() {
            return Err(Error::UnsupportedDType {
                op: "ParamStore::add",
                dtype: value.dtype(),
                expected: "a float dtype",
            });
        }
        if self.by_name.contains_key(&name) {
            return Err(Error::invalid_arg("ParamStore::add", format!("a parameter named {name:?} already exists")));
        }
        let id = ParamId(self.params.len());
        self.by_name.insert(name.clone(), id);
        self.params.push(Param { name, group: group.into(), value });
        Ok(id)
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.params.len()
    }
    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }
    /// Total number of scalar parameters.
    pub fn numel(&self) -> usize {
        self.params.iter().map(|p| p.value.numel()).sum()
    }
    /// Every id, in insertion order.
    pub fn ids(&self) -> impl Iterator<Item = ParamId> + '_ {
        (0..self.params.len()).map(ParamId)
    }
    /// The id of a parameter by name.
    pub fn id(&self, name: &str) -> Option<ParamId> {
        self.by_name.get(name).copied()
    }
    /// A parameter's value.
    pub fn get(&self, id: ParamId) -> &Tensor {
        &self.params[id.0].value
    }
    /// A parameter's value, mutably (updates happen in place when the
    /// storage is not shared; see [`Tensor::make_mut`]).
    pub fn get_mut(&mut self, id: ParamId) -> &mut Tensor {
        &mut self.params[id.0].value
    }
    /// Replaces a parameter's value; the shape and dtype must match.
    pub fn set(&mut self, id: ParamId, value: Tensor) -> Result<()> {
        let old = &self.params[id.0].value;
        if old.shape() != value.shape() {
            return Err(Error::ShapeMismatch {
                op: "ParamStore::set",
                lhs: Box::new(old.shape().clone()),
                rhs: Box::new(value.shape().clone()),
            });
        }
        if old.dtype() != value.dtype() {
            return Err(Error::DTypeMismatch { op: "ParamStore::set", lhs: old.dtype(), rhs: value.dtype() });
        }
        self.params[id.0].value = value;
        Ok(())
    }
    /// Moves every parameter to `device` (a copy through the host between
    /// devices; nothing is copied for a parameter already there). Layers
    /// initialise their parameters on the host from the caller's [`Rng`],
    /// so a model built and then moved holds the same values on every
    /// device. On an error the parameters moved so far stay moved.
    ///
    /// [`Rng`]: tapir_tensor::Rng
    pub fn to_device(&mut self, device: Device) -> Result<()> {
        for p in &mut self.params {
            if p.value.device() != device {
                p.value = p.value.to_device(device)?;
            }
        }
        Ok(())
    }
    /// The device of the parameters: that of the first one, the CPU for an
    /// empty store, or an error naming two devices when they differ.
    pub fn device(&self) -> Result<Device> {
        let first = self.params.first().map_or(Device::Cpu, |p| p.value.device());
        match self.params.iter().find(|p| p.value.device() != first) {
            Some(p) => Err(Error::DeviceMismatch { op: "ParamStore::device", lhs: first, rhs: p.value.device() }),
            None => Ok(first),
        }
    }
    /// A parameter's name.
    pub fn name(&self, id: ParamId) -> &str {
        &self.params[id.0].name
    }
    /// A parameter's group.
    pub fn group(&self, id: ParamId) -> &str {
        &self.params[id.0].group
    }
    /// Every (id, name, value), in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (ParamId, &str, &Tensor)> {
        self.params.iter().enumerate().map(|(i, p)| (ParamId(i), p.name.as_str(), &p.value))
    }
    /// Bytes of parameter storage.
    pub fn bytes(&self) -> usize {
        self.params.iter().map(|p| p.value.numel() * p.value.dtype().size_in_bytes()).sum()
    }

    /// Brings every parameter into graph `g` as a leaf. The leaves share the
    /// parameters' storage (no copy) and are dropped with the scope, so the
    /// store's tensors are unshared again after it.
    pub fn bind<'g>(&self, g: &'g Graph) -> Bound<'g> {
        Bound {
            graph: g,
            vars: self.params.iter().map(|p| g.leaf(p.value.clone())).collect(),
            precision: Precision::Full,
        }
    }
}

/// The parameters of a store as leaves of one graph.
pub struct Bound<'g> {
    graph: &'g Graph,
    vars: Vec<Var<'g>>,
    precision: Precision,
}

impl<'g> Bound<'g> {
    /// Parameters given as existing values of `graph`, one per parameter in
    /// store order: how a layer runs on leaves made elsewhere, e.g. by the
    /// gradient checker.
    pub fn from_vars(graph: &'g Graph, vars: Vec<Var<'g>>) -> Self {
        Bound { graph, vars, precision: Precision::Full }
    }
    /// The same parameters with mixed precision `precision` (see
    /// [`crate::amp`]): the layers run their products in its dtype and
    /// the rest in the parameters' own; set once, for the whole forward.
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }
    /// The mixed precision the layers run in.
    pub fn precision(&self) -> Precision {
        self.precision
    }
    /// Every bound value, in store order.
    pub fn vars(&self) -> &[Var<'g>] {
        &self.vars
    }
    /// The leaf of parameter `id`: an error when `id` is not a parameter
    /// of the store bound here (a layer made on another store).
    pub fn var(&self, id: ParamId) -> Result<Var<'g>> {
        self.vars.get(id.0).copied().ok_or_else(|| {
            Error::invalid_arg(
                "Bound::var",
                format!("parameter {} is not in the bound store, which has {}", id.0, self.vars.len()),
            )
        })
    }
    /// The graph.
    pub fn graph(&self) -> &'g Graph {
        self.graph
    }
    /// Gradients of the scalar `loss` with respect to every parameter, as
    /// plain tensors keyed by parameter (a first-order pass: nothing
    /// recorded, intermediates released as it goes).
    pub fn grads(&self, loss: Var<'g>) -> Result<Grads> {
        let g = self.graph.grad(loss, &self.vars)?;
        Ok(Grads { grads: g })
    }
}

/// Gradients keyed by parameter: values, not fields of the parameters.
#[derive(Debug, Clone)]
pub struct Grads {
    grads: Vec<Tensor>,
}

impl Grads {
    /// The gradient of parameter `id`.
    pub fn get(&self, id: ParamId) -> &Tensor {
        &self.grads[id.0]
    }
    /// Number of gradients.
    pub fn len(&self) -> usize {
        self.grads.len()
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.grads.is_empty()
    }
    /// Gradients from tensors, one per parameter in store order.
    pub fn from_tensors(grads: Vec<Tensor>) -> Self {
        Grads { grads }
    }
    /// An error naming `op` unless there is one gradient per parameter of
    /// `store`, each of its parameter's shape and dtype: gradients built
    /// by hand, or returned by a user's closure, may not be.
    pub fn check_fits(&self, store: &ParamStore, op: &'static str) -> Result<()> {
        if store.len() != self.len() {
            return Err(Error::invalid_arg(op, format!("{} gradients for {} parameters", self.len(), store.len())));
        }
        for (id, g) in self.iter() {
            let p = store.get(id);
            if p.shape() != g.shape() {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: Box::new(p.shape().clone()),
                    rhs: Box::new(g.shape().clone()),
                });
            }
            if p.dtype() != g.dtype() {
                return Err(Error::DTypeMismatch { op, lhs: p.dtype(), rhs: g.dtype() });
            }
        }
        Ok(())
    }
    /// Every gradient, in store order.
    pub fn iter(&self) -> impl Iterator<Item = (ParamId, &Tensor)> {
        self.grads.iter().enumerate().map(|(i, g)| (ParamId(i), g))
    }
    /// The global L2 norm over all gradients.
    pub fn global_norm(&self) -> f64 {
        self.grads.iter().flat_map(|g| g.to_vec_f64()).map(|x| x * x).sum::<f64>().sqrt()
    }
    /// Scales all gradients so their global norm is at most `max_norm`;
    /// returns the norm before clipping (torch's clip_grad_norm_).
    pub fn clip_global_norm(&mut self, max_norm: f64) -> Result<f64> {
        let norm = self.global_norm();
        if norm > max_norm && norm > 0.0 {
            let k = max_norm / (norm + 1e-6);
            for g in &mut self.grads {
                scale_in_place(g, k)?;
            }
        }
        Ok(norm)
    }
}

fn scale_in_place(t: &mut Tensor, k: f64) -> Result<()> {
    if t.device() != Device::Cpu {
        // Off the host, one scaling kernel writing a new gradient: the
        // product is rounded to the dtype as the loops below round it.
        *t = t.mul_scalar(k)?;
        return Ok(());
    }
    match t.dtype() {
        tapir_tensor::DType::F64 => t.make_mut::<f64>()?.iter_mut().for_each(|x| *x *= k),
        tapir_tensor::DType::F32 => t.make_mut::<f32>()?.iter_mut().for_each(|x| *x *= k as f32),
        dtype => return Err(Error::UnsupportedDType { op: "clip_global_norm", dtype, expected: "f32 or f64" }),
    }
    Ok(())
}
