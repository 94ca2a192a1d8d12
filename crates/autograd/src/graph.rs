//! The arena: a graph's nodes live in one slotmap owned by the [`Graph`],
//! and every node is freed, whole, when the scope that made the graph ends.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::Arc;

use slotmap::{new_key_type, Key, KeyData, SlotMap};
use smallvec::SmallVec;
use tapir_tensor::{DType, Derivative, Device, Diff, DynOp, Error, Result, Shape, Tape, Tensor, Traced};

new_key_type! {
    /// A node of a graph.
    pub struct NodeId;
}

/// One recorded value: what it is, how it was made, from what.
pub(crate) struct Node {
    /// The value; `None` once a backward pass without `retain_graph` has
    /// released it.
    pub value: Option<Tensor>,
    pub shape: Shape,
    pub dtype: DType,
    pub device: Device,
    /// `None` for leaves and constants.
    pub op: Option<Arc<dyn DynOp>>,
    pub inputs: SmallVec<[NodeId; 3]>,
    /// True when a leaf, or made by a differentiable op from such a node.
    pub requires_grad: bool,
    /// True once a first-order backward without `retain_graph` has run this
    /// node's rule: it will read no value again.
    pub rule_spent: bool,
    /// True while the value is not computed yet (`value` is `None`): a
    /// product a recorded gradient made, computed from its inputs (which
    /// are computed and kept) when first read ([`Graph::force`]).
    pub deferred: bool,
}

/// The rules a recorded pass (`grad_graph`, `jvp_graph`) runs for a node
/// whose op's recorded rules cannot serve: a checkpointed block, which the
/// pass records again into the graph and differentiates there. The passes
/// ask [`Graph::block_of`] before an op's own rules; the block's node
/// (`checkpoint.rs`, above the passes) implements this, so the passes need
/// not know it.
pub(crate) trait Rerecorded: Send + Sync {
    /// The reverse rule: the block recorded on the node's inputs
    /// `input_ids`, differentiated with seed `g`.
    fn reverse_rerecorded<'g>(
        &self,
        graph: &'g Graph,
        input_ids: &[NodeId],
        g: Traced<'g>,
    ) -> Result<SmallVec<[Option<Traced<'g>>; 3]>>;

    /// The forward rule: the block recorded on the node's inputs, pushed
    /// forward along their tangents `ts` (`None` for zero).
    fn forward_rerecorded<'g>(
        &self,
        graph: &'g Graph,
        input_ids: &[NodeId],
        ts: &[Option<&Traced<'g>>],
    ) -> Result<Option<Traced<'g>>>;
}

/// A computation graph: an arena of nodes. The only way to get one is
/// [`Graph::scope`], which frees every node when the closure returns.
pub struct Graph {
    pub(crate) nodes: RefCell<SlotMap<NodeId, Node>>,
    /// The blocks of checkpoint nodes ([`Graph::checkpoint`]), which a
    /// recorded pass runs again in this graph.
    pub(crate) blocks: RefCell<HashMap<NodeId, Arc<dyn Rerecorded>>>,
    /// Above 0 while a recorded gradient is being recorded: ops that can
    /// tell their output's shape without running ([`DynOp::plan`]) are
    /// then computed only when something reads them.
    pub(crate) defer: Cell<u32>,
    /// How many nodes are deferred now: with none (every graph that never
    /// ran `grad_graph`), recording and backward skip looking for them.
    pending: Cell<usize>,
    /// Pointer identity used to reject handles from another graph at run
    /// time (the lifetime brand already rejects them at compile time).
    id: usize,
    _not_sync: PhantomData<Cell<()>>,
}

/// A handle on a node of a graph, valid only inside that graph's scope.
///
/// `Var<'g>` is `Copy` and carries an invariant lifetime brand: it cannot be
/// returned from the scope, stored in anything that outlives it, or combined
/// with a `Var` of another graph. Values leave a scope only as plain
/// [`Tensor`]s, through [`Var::value`].
///
/// ```compile_fail
/// use tapir::prelude::*;
/// // A Var cannot escape its scope.
/// let escaped = Graph::scope(|g| Ok::<_, Error>(g.leaf(Tensor::scalar(1.0)))).unwrap();
/// ```
#[derive(Clone, Copy)]
pub struct Var<'g> {
    pub(crate) graph: &'g Graph,
    pub(crate) id: NodeId,
    _brand: PhantomData<fn(&'g ()) -> &'g ()>,
}

impl std::fmt::Debug for Var<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes = self.graph.nodes.borrow();
        let n = &nodes[self.id];
        let op = n.op.as_ref().map_or("leaf", |o| o.name());
        write!(f, "Var({:?}, {}, {:?}, {})", self.id.data(), op, n.shape, n.dtype)
    }
}

static NEXT_GRAPH: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

impl Graph {
    fn new() -> Self {
        Graph {
            nodes: RefCell::new(SlotMap::with_key()),
            blocks: RefCell::new(HashMap::new()),
            defer: Cell::new(0),
            pending: Cell::new(0),
            id: NEXT_GRAPH.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            _not_sync: PhantomData,
        }
    }

    /// Runs `f` with a fresh graph and frees all of it when `f` returns (or
    /// fails): nothing recorded inside can outlive this call. Return plain
    /// tensors or numbers from `f`.
    ///
    /// ```
    /// use tapir::prelude::*;
    ///
    /// let x0 = Tensor::from_vec(vec![0.5f64, -1.0], [2])?;
    /// let d2 = Graph::scope(|g| {
    ///     let x = g.leaf(x0.clone());
    ///     let y = x.tanh()?.sum_all()?;
    ///     let dy = g.grad_graph(y, &[x])?[0];        // recorded: differentiable again
    ///     let d2 = g.grad(dy.sum_all()?, &[x])?;     // second derivative, as tensors
    ///     Ok::<_, Error>(d2[0].clone())
    /// })?;
    /// let want: Vec<f64> = [0.5f64, -1.0].iter().map(|x| -2.0 * x.tanh() * (1.0 - x.tanh().powi(2))).collect();
    /// for (a, b) in d2.to_vec::<f64>()?.iter().zip(&want) { assert!((a - b).abs() < 1e-12); }
    /// # Ok::<(), Error>(())
    /// ```
    ///
    /// # Reusing a function across scopes
    ///
    /// A closure that takes a `Var<'g>` is tied to the one scope whose
    /// brand `'g` it names. To use the same computation in several scopes
    /// (and eagerly, on plain tensors), write it once as a function generic
    /// over [`Diff`], the trait both [`Tensor`] and every `Var<'g>`
    /// implement; every op method is available on it:
    ///
    /// ```
    /// use tapir::prelude::*;
    ///
    /// // x * sin(x), summed: one definition for tensors and graph values.
    /// fn energy<T: Diff>(x: &T) -> Result<T> {
    ///     x.mul(&x.sin()?)?.sum_all()
    /// }
    ///
    /// let x0 = Tensor::from_vec(vec![0.3f64, 1.2], [2])?;
    /// let e = energy(&x0)?; // eager: no graph at all
    /// let de = Graph::scope(|g| {
    ///     let x = g.leaf(x0.clone());
    ///     Ok::<_, Error>(g.grad(energy(&x)?, &[x])?.remove(0))
    /// })?;
    /// let d2e = Graph::scope(|g| {
    ///     // The same function in another scope, differentiated twice.
    ///     let x = g.leaf(x0.clone());
    ///     let de = g.grad_graph(energy(&x)?, &[x])?[0];
    ///     Ok::<_, Error>(g.grad(de.sum_all()?, &[x])?.remove(0))
    /// })?;
    /// let x = 1.2f64;
    /// assert!((de.to_vec::<f64>()?[1] - (x.sin() + x * x.cos())).abs() < 1e-12);
    /// assert!((d2e.to_vec::<f64>()?[1] - (2.0 * x.cos() - x * x.sin())).abs() < 1e-12);
    /// assert!((e.item()? - (0.3f64 * 0.3f64.sin() + x * x.sin())).abs() < 1e-12);
    /// # Ok::<(), Error>(())
    /// ```
    pub fn scope<R, E>(f: impl for<'g> FnOnce(&'g Graph) -> Result<R, E>) -> Result<R, E> {
        let g = Graph::new();
        f(&g)
        // `g` drops here, and with it every node and every tensor it held.
    }

    fn push(&self, node: Node) -> NodeId {
        self.nodes.borrow_mut().insert(node)
    }

    pub(crate) fn var(&self, id: NodeId) -> Var<'_> {
        Var { graph: self, id, _brand: PhantomData }
    }

    fn insert_value(&self, value: Tensor, requires_grad: bool) -> NodeId {
        self.push(Node {
            shape: value.shape().clone(),
            dtype: value.dtype(),
            device: value.device(),
            value: Some(value),
            op: None,
            inputs: SmallVec::new(),
            requires_grad,
            rule_spent: false,
            deferred: false,
        })
    }

    /// A leaf to differentiate with respect to.
    pub fn leaf(&self, value: Tensor) -> Var<'_> {
        self.var(self.insert_value(value, true))
    }

    /// A constant: recorded, but never differentiated.
    pub fn constant(&self, value: Tensor) -> Var<'_> {
        self.var(self.insert_value(value, false))
    }

    /// Runs `op` on the values of `inputs` and records the result (while
    /// [`Graph::defer`] is set and the op can plan its output, records it
    /// to be computed when read).
    pub(crate) fn record_op(&self, op: Arc<dyn DynOp>, inputs: &[NodeId]) -> Result<NodeId> {
        // A deferred node's inputs are always computed: its own
        // computation never waits on another's.
        if self.pending.get() > 0 {
            for &i in inputs {
                if self.nodes.borrow().contains_key(i) {
                    self.force(i)?;
                }
            }
        }
        let (value, meta, requires_grad) = {
            let nodes = self.nodes.borrow();
            let mut vals: SmallVec<[&Tensor; 4]> = SmallVec::new();
            let mut requires_grad = false;
            for &i in inputs {
                let n = nodes
                    .get(i)
                    .ok_or_else(|| Error::Graph { reason: "a node id that is not in this graph".into() })?;
                vals.push(n.value.as_ref().ok_or_else(|| released(op.name()))?);
                requires_grad |= n.requires_grad;
            }
            let requires_grad = requires_grad && op.is_differentiable();
            match (self.defer.get() > 0).then(|| op.plan(&vals)).flatten() {
                Some(meta) => (None, meta?, requires_grad),
                None => {
                    let v = op.forward(&vals)?;
                    let meta = (v.shape().clone(), v.dtype(), v.device());
                    (Some(v), meta, requires_grad)
                }
            }
        };
        let (shape, dtype, device) = meta;
        if value.is_none() {
            self.pending.set(self.pending.get() + 1);
        }
        Ok(self.push(Node {
            shape,
            dtype,
            device,
            deferred: value.is_none(),
            value,
            op: Some(op),
            inputs: inputs.iter().copied().collect(),
            requires_grad,
            rule_spent: false,
        }))
    }

    /// Computes the value of `id` if it was deferred (its inputs' values
    /// are kept until then: see [`crate::backward`]'s `SavedValues`).
    pub(crate) fn force(&self, id: NodeId) -> Result<()> {
        let value = {
            let nodes = self.nodes.borrow();
            let n = &nodes[id];
            if !n.deferred {
                return Ok(());
            }
            let op = n.op.as_ref().expect("a deferred node has an op");
            let vals = n
                .inputs
                .iter()
                .map(|&i| nodes[i].value.as_ref().ok_or_else(|| released(op.name())))
                .collect::<Result<SmallVec<[&Tensor; 4]>>>()?;
            op.forward(&vals)?
        };
        let mut nodes = self.nodes.borrow_mut();
        nodes[id].value = Some(value);
        nodes[id].deferred = false;
        self.pending.set(self.pending.get() - 1);
        Ok(())
    }

    /// Computes every deferred value: before a pass that releases values,
    /// which may be a deferred node's inputs.
    pub(crate) fn force_all(&self) -> Result<()> {
        if self.pending.get() == 0 {
            return Ok(());
        }
        let ids: Vec<NodeId> = self.nodes.borrow().iter().filter(|(_, n)| n.deferred).map(|(id, _)| id).collect();
        ids.into_iter().try_for_each(|id| self.force(id))
    }

    pub(crate) fn value_of(&self, id: NodeId) -> Result<Tensor> {
        self.force(id)?;
        let nodes = self.nodes.borrow();
        nodes[id].value.clone().ok_or_else(|| released("value"))
    }

    /// An [`Error::Graph`] naming `op` unless every handle in `vars` belongs
    /// to this graph. Lifetimes reject most mixes at compile time, but a
    /// graph's `&self` can be reborrowed for a shorter, nested scope, and
    /// methods taking `Var<'_>` accept any scope's handles; a foreign node
    /// id would read an unrelated node of this graph, or none.
    pub(crate) fn check_own(&self, op: &str, vars: &[Var<'_>]) -> Result<()> {
        if vars.iter().any(|v| v.graph.id != self.id) {
            return Err(Error::Graph { reason: format!("{op}: a variable from another graph") });
        }
        Ok(())
    }

    /// The recorded rules of a checkpoint node, when `n` is one.
    pub(crate) fn block_of(&self, n: NodeId) -> Option<Arc<dyn Rerecorded>> {
        self.blocks.borrow().get(&n).cloned()
    }

    /// Number of nodes the graph holds.
    pub fn node_count(&self) -> usize {
        self.nodes.borrow().len()
    }

    /// Bytes of tensor storage the graph's nodes keep alive (each storage
    /// counted once, even when several nodes view it).
    pub fn saved_bytes(&self) -> usize {
        let nodes = self.nodes.borrow();
        let mut seen: HashSet<*const ()> = HashSet::new();
        let mut total = 0;
        for n in nodes.values() {
            if let Some(v) = &n.value {
                if seen.insert(v.storage_ptr()) {
                    total += v.storage_bytes();
                }
            }
        }
        total
    }

    /// Names of the ops recorded in this graph, one per distinct op.
    pub fn op_names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> =
            self.nodes.borrow().values().filter_map(|n| n.op.as_ref().map(|o| o.name())).collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Number of nodes whose values a backward pass has released.
    pub fn released_count(&self) -> usize {
        self.nodes.borrow().values().filter(|n| n.value.is_none() && !n.deferred).count()
    }
}

pub(crate) fn released(what: &str) -> Error {
    Error::Graph {
        reason: format!(
            "{what}: a value this needs was released by an earlier backward pass; \
             read values before calling grad, or pass GradOptions {{ retain_graph: true, .. }}"
        ),
    }
}

pub(crate) fn to_raw(id: NodeId) -> u64 {
    id.data().as_ffi()
}

pub(crate) fn from_raw(raw: u64) -> NodeId {
    NodeId::from(KeyData::from_ffi(raw))
}

impl Tape for Graph {
    fn record(&self, op: Arc<dyn DynOp>, inputs: &[u64]) -> Result<u64> {
        let ids: SmallVec<[NodeId; 4]> = inputs.iter().map(|&r| from_raw(r)).collect();
        self.record_op(op, &ids).map(to_raw)
    }
    fn constant(&self, value: Tensor) -> u64 {
        to_raw(self.insert_value(value, false))
    }
    fn node_shape(&self, id: u64) -> Shape {
        self.nodes.borrow()[from_raw(id)].shape.clone()
    }
    fn node_dtype(&self, id: u64) -> DType {
        self.nodes.borrow()[from_raw(id)].dtype
    }
    fn node_device(&self, id: u64) -> Device {
        self.nodes.borrow()[from_raw(id)].device
    }
    fn node_value(&self, id: u64) -> Result<Tensor> {
        self.value_of(from_raw(id))
    }
}

impl<'g> Var<'g> {
    /// The value, as a plain tensor with no graph attached: the way out of a
    /// scope. An error only if a backward pass released it.
    pub fn value(&self) -> Result<Tensor> {
        self.graph.value_of(self.id)
    }

    /// Alias of [`Var::value`].
    pub fn to_tensor(&self) -> Result<Tensor> {
        self.value()
    }

    /// The single element, as f64.
    pub fn item(&self) -> Result<f64> {
        self.value()?.item()
    }

    /// The graph this handle belongs to.
    pub fn graph(&self) -> &'g Graph {
        self.graph
    }

    /// The node id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// True when gradients flow to this value.
    pub fn requires_grad(&self) -> bool {
        self.graph.nodes.borrow()[self.id].requires_grad
    }

    /// The same value as a new constant node: gradients stop here.
    pub fn detach(&self) -> Result<Var<'g>> {
        Ok(self.graph.constant(self.value()?))
    }

    pub(crate) fn traced(&self) -> tapir_tensor::Traced<'g> {
        tapir_tensor::Traced { tape: self.graph, id: to_raw(self.id) }
    }
}

impl Diff for Var<'_> {
    fn apply<O: Derivative>(op: O, inputs: &[&Self]) -> Result<Self> {
        let first = inputs.first().ok_or_else(|| Error::Graph { reason: "an op with no inputs".into() })?;
        let g = first.graph;
        if inputs.iter().any(|v| v.graph.id != g.id) {
            return Err(Error::Graph { reason: format!("{}: operands come from different graphs", op.name()) });
        }
        let ids: SmallVec<[NodeId; 4]> = inputs.iter().map(|v| v.id).collect();
        Ok(g.var(g.record_op(Arc::new(op), &ids)?))
    }
    fn shape(&self) -> Shape {
        self.graph.nodes.borrow()[self.id].shape.clone()
    }
    fn dtype(&self) -> DType {
        self.graph.nodes.borrow()[self.id].dtype
    }
    fn device(&self) -> Device {
        self.graph.nodes.borrow()[self.id].device
    }
    fn lift(&self, value: Tensor) -> Self {
        self.graph.constant(value)
    }
    fn eval(&self) -> Result<Tensor> {
        self.value()
    }
    fn is_recording(&self) -> bool {
        true
    }
    fn requires_grad(&self) -> bool {
        Var::requires_grad(self)
    }
}
