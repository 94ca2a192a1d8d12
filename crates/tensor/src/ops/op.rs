//! What an op is, below every op family: the [`Op`] and [`Derivative`]
//! traits, the [`Diff`] values rules are written over ([`Tensor`] and a
//! recording [`Traced`] handle), the object-safe [`DynOp`] a graph
//! records, and [`forward`], the one place an op's device is chosen.

use std::fmt::Debug;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::backend::Backend;
use crate::{DType, Device, Error, Result, Shape, Tensor};

/// Gradients of an op's inputs: `None` for an input that gets no gradient
/// (a constant operand, or an input the op is not differentiable in).
pub type InputGrads<T> = SmallVec<[Option<T>; 3]>;

/// Which values an op's reverse rule reads: some of its inputs, its output,
/// both or neither. A first-order backward frees every value no rule still
/// to run reads (torch's saved tensors), so a step's peak holds only what
/// backward needs. A rule still learns the shape and dtype of a value it
/// does not read, from a zero-sized stand-in: declaring too little is a
/// wrong gradient, which the gradient-check table test catches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Saved {
    inputs: u64,
    output: bool,
}

impl Saved {
    /// Every input and the output (the safe default).
    pub const ALL: Saved = Saved { inputs: u64::MAX, output: true };
    /// No value at all: the rule needs only shapes (add, reshape, sum...).
    pub const NOTHING: Saved = Saved { inputs: 0, output: false };
    /// The output only (exp, tanh, softmax...).
    pub const OUTPUT: Saved = Saved { inputs: 0, output: true };
    /// Every input, not the output (matmul...).
    pub const INPUTS: Saved = Saved { inputs: u64::MAX, output: false };

    /// Input `i` only.
    pub const fn input(i: usize) -> Saved {
        Saved { inputs: 1 << i, output: false }
    }
    /// This set and input `i`.
    pub const fn and_input(self, i: usize) -> Saved {
        Saved { inputs: self.inputs | 1 << i, output: self.output }
    }
    /// This set and the output.
    pub const fn and_output(self) -> Saved {
        Saved { inputs: self.inputs, output: true }
    }
    /// Whether the rule reads input `i` (inputs past the 64th always count
    /// as read).
    pub fn reads_input(self, i: usize) -> bool {
        i >= 64 || self.inputs >> i & 1 == 1
    }
    /// Whether the rule reads the output.
    pub fn reads_output(self) -> bool {
        self.output
    }
}

/// How many inputs an op takes. It is checked once, where an op is
/// applied (on tensors and on a graph), so no op's forward or rules need
/// to check it again before indexing their inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arity {
    /// The fewest inputs.
    pub min: usize,
    /// The most inputs (`usize::MAX` for no limit).
    pub max: usize,
}

impl Arity {
    /// Exactly `n` inputs.
    pub const fn exactly(n: usize) -> Arity {
        Arity { min: n, max: n }
    }
    /// `min` inputs or more.
    pub const fn at_least(min: usize) -> Arity {
        Arity { min, max: usize::MAX }
    }
    /// Between `min` and `max` inputs, both included.
    pub const fn between(min: usize, max: usize) -> Arity {
        Arity { min, max }
    }
    /// An [`Error::InvalidArgument`] naming `op` unless `n` inputs fit.
    pub fn check(self, op: &'static str, n: usize) -> Result<()> {
        if (self.min..=self.max).contains(&n) {
            return Ok(());
        }
        let want = match (self.min, self.max) {
            (a, b) if a == b => format!("{a}"),
            (a, usize::MAX) => format!("at least {a}"),
            (a, b) => format!("{a} to {b}"),
        };
        Err(Error::invalid_arg(op, format!("takes {want} inputs, got {n}")))
    }
}

/// An operation: what it computes, on every device. How it is
/// differentiated is its [`Derivative`], written in differentiable ops
/// (`ops/rules/`, above every op family), so an op's forward never needs
/// another family's methods.
pub trait Op: Debug + Send + Sync + 'static {
    /// The op's name, as used in errors and graph diagnostics.
    fn name(&self) -> &'static str;
    /// How many inputs the op takes (which may depend on its fields, as a
    /// layer norm's optional weight and bias); [`forward`] checks it first.
    fn arity(&self) -> Arity;
    /// Tensors the op holds as fields (a mask, class labels, an index),
    /// which must live on the inputs' device: [`forward`] checks them with
    /// the inputs before any kernel runs. The default holds none.
    fn operands(&self) -> SmallVec<[&Tensor; 2]> {
        SmallVec::new()
    }
    /// The output from the input values, on the device whose `backend`
    /// [`forward`] picked once it has checked that every input and operand
    /// lives there: the op checks its inputs (shapes, dtypes, the kernel's
    /// parameters) once, for every device, and calls the backend's kernel
    /// of its family, so a device without that family's kernels does not
    /// compile. (An op of another crate with kernel families of its own,
    /// as tapir-nn's fused ops, maps the inputs' device to its own backend
    /// the same way, in one place.)
    fn run(&self, backend: &dyn Backend, inputs: &[&Tensor]) -> Result<Tensor>;
    /// Frees what the op saved for its reverse rule beyond its inputs and
    /// output (a cross-entropy's per-row log-sum-exp, precomputed
    /// gradients), once a backward without `retain_graph` has run the rule
    /// and will not run it again. The default saves nothing.
    fn release(&self) {}
}

/// A differentiable operation: an [`Op`] and its derivative rules, each
/// written once, generically over [`Diff`], in differentiable ops, so the
/// same rule runs eagerly on [`Tensor`]s and recorded on a graph (and is
/// then differentiated again for higher orders).
pub trait Derivative: Op {
    /// Reverse mode: given the inputs `xs`, the output `y` and the gradient
    /// `g` of some scalar with respect to `y`, the gradients with respect
    /// to each input, broadcast back to that input's shape.
    fn vjp<T: Diff>(&self, xs: &[&T], y: &T, g: &T) -> Result<InputGrads<T>>;
    /// Forward mode: given the inputs, the output and each input's tangent
    /// (`None` for zero), the output's tangent (`None` for zero).
    fn jvp<T: Diff>(&self, xs: &[&T], y: &T, ts: &[Option<&T>]) -> Result<Option<T>>;
    /// The values `vjp` reads; see [`Saved`]. The default, everything, is
    /// always correct; an op that declares less lets backward free more.
    fn saves(&self) -> Saved {
        Saved::ALL
    }
    /// The eager reverse rule: [`Derivative::vjp`] on plain tensors the
    /// caller hands over, run by a first-order backward, where nothing is
    /// recorded. An op whose gradient has a fused kernel overrides this to
    /// run it, and falls back to `vjp` where the kernel does not apply; the
    /// recording path never calls it, so `vjp` itself stays in
    /// differentiable ops and any order of derivative works. A value whose
    /// last reader this rule is arrives as the only handle on its buffer,
    /// so an op may write its gradient over it instead of allocating (the
    /// sparse cross-entropy does, over the logits). The default borrows and
    /// calls `vjp`.
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, y: Tensor, g: Tensor) -> Result<InputGrads<Tensor>> {
        let refs: SmallVec<[&Tensor; 3]> = xs.iter().collect();
        self.vjp(&refs, &y, &g)
    }
    /// [`Derivative::vjp_eager`] told which inputs need a gradient
    /// (`wanted[i]`, false for a constant or data): a first-order backward
    /// drops the others, so an op whose rule spends a pass per input may
    /// skip theirs and return `None` in their place. The default computes
    /// every input's gradient. (A constant operand's gradient can cost
    /// more than the wanted one: `tanh_backward(y, ones)` summed a whole
    /// `[N, w]` pass down to the scalar `ones`, every layer of a jet.)
    fn vjp_eager_wanted(
        &self,
        xs: SmallVec<[Tensor; 3]>,
        y: Tensor,
        g: Tensor,
        wanted: &[bool],
    ) -> Result<InputGrads<Tensor>> {
        let _ = wanted;
        self.vjp_eager(xs, y, g)
    }
    /// The eager forward rule: [`Derivative::jvp`] on plain tensors, where
    /// nothing is recorded (a Hessian-vector product's tangent pass).
    /// Overridden, like [`Derivative::vjp_eager`], only by ops with a fused
    /// kernel for it.
    fn jvp_eager(&self, xs: &[&Tensor], y: &Tensor, ts: &[Option<&Tensor>]) -> Result<Option<Tensor>> {
        self.jvp(xs, y, ts)
    }
    /// False for ops with no derivative (comparisons, argmax, casts to ints):
    /// the graph then never calls their rules.
    fn is_differentiable(&self) -> bool {
        true
    }
    /// The output's shape and dtype from the input values without running
    /// the op, after the checks [`Op::run`] makes first (its errors, in its
    /// order), for an op whose output a recorded pass may compute only when
    /// something reads it (`None`: the op runs when recorded, the
    /// default). A recorded gradient's last products are such values: a
    /// Hessian-vector product pushes tangents through them and never reads
    /// them. What the kernel itself may fail on (memory) then fails when
    /// the value is read.
    fn planned(&self, xs: &[&Tensor]) -> Option<Result<(Shape, DType)>> {
        let _ = xs;
        None
    }
    /// Whether [`Derivative::jvp`] reads the output `y` (the default, true,
    /// is always correct): a forward pass gives a rule that does not a
    /// stand-in for an output not yet computed ([`Derivative::planned`]).
    fn jvp_reads_output(&self) -> bool {
        true
    }
}

/// Checks that two operands share a device and returns their broadcast
/// shape. Their dtypes may differ: binary ops promote them
/// (`promote_pair` in `binary.rs`).
pub(crate) fn check_pair(op: &'static str, a: &Tensor, b: &Tensor) -> Result<Shape> {
    if a.device() != b.device() {
        return Err(Error::DeviceMismatch { op, lhs: a.device(), rhs: b.device() });
    }
    Shape::broadcast(op, a.shape(), b.shape())
}

/// The dtype two operands compute in, as torch's `result_type`: a 0-d
/// tensor beside a tensor with dimensions counts only when its kind is
/// higher (a float scalar with an integer tensor), so `x * scalar(2.0)`
/// keeps `x`'s float16 and an int tensor plus a float64 scalar is float64.
/// Otherwise [`DType::promote`].
pub(crate) fn result_dtype(a: &Tensor, b: &Tensor) -> DType {
    let kind = |d: DType| u8::from(!d.is_int());
    match (a.rank() == 0, b.rank() == 0) {
        (true, false) if kind(a.dtype()) <= kind(b.dtype()) => b.dtype(),
        (false, true) if kind(b.dtype()) <= kind(a.dtype()) => a.dtype(),
        _ => DType::promote(a.dtype(), b.dtype()),
    }
}

/// Runs `op` forward on `inputs`: every input and every operand the op
/// holds must be on one device ([`Error::DeviceMismatch`] names the op and
/// the first two devices that differ), and [`Op::run`] computes the output
/// with that device's backend. This is the only way an op's forward is
/// run, eagerly or on a graph.
pub fn forward<O: Op + ?Sized>(op: &O, inputs: &[&Tensor]) -> Result<Tensor> {
    let device = checked_device(op, inputs)?;
    op.run(crate::tensor::backend_for(device), inputs)
}

/// What [`forward`] checks before the op's own checks: the input count,
/// then one device for every input and operand, which it returns.
fn checked_device<O: Op + ?Sized>(op: &O, inputs: &[&Tensor]) -> Result<Device> {
    op.arity().check(op.name(), inputs.len())?;
    let mut devices = inputs.iter().copied().chain(op.operands()).map(Tensor::device);
    let device = devices.next().unwrap_or(Device::Cpu);
    if let Some(other) = devices.find(|&d| d != device) {
        return Err(Error::DeviceMismatch { op: op.name(), lhs: device, rhs: other });
    }
    Ok(device)
}

/// The object-safe face of [`Op`], so a graph can store any op. Each rule is
/// compiled twice: once for eager tensors and once for the recording handle.
pub trait DynOp: Debug + Send + Sync + 'static {
    /// See [`Op::name`].
    fn name(&self) -> &'static str;
    /// [`forward`]: the input count, the device check, then that device's
    /// kernel.
    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor>;
    /// See [`Derivative::vjp_eager`].
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, y: Tensor, g: Tensor) -> Result<InputGrads<Tensor>>;
    /// See [`Derivative::vjp_eager_wanted`].
    fn vjp_eager_wanted(
        &self,
        xs: SmallVec<[Tensor; 3]>,
        y: Tensor,
        g: Tensor,
        wanted: &[bool],
    ) -> Result<InputGrads<Tensor>>;
    /// [`Derivative::vjp`] recorded on a tape.
    fn vjp_traced<'t>(&self, xs: &[&Traced<'t>], y: &Traced<'t>, g: &Traced<'t>) -> Result<InputGrads<Traced<'t>>>;
    /// See [`Derivative::jvp_eager`].
    fn jvp_eager(&self, xs: &[&Tensor], y: &Tensor, ts: &[Option<&Tensor>]) -> Result<Option<Tensor>>;
    /// [`Derivative::jvp`] recorded on a tape.
    fn jvp_traced<'t>(
        &self,
        xs: &[&Traced<'t>],
        y: &Traced<'t>,
        ts: &[Option<&Traced<'t>>],
    ) -> Result<Option<Traced<'t>>>;
    /// See [`Derivative::is_differentiable`].
    fn is_differentiable(&self) -> bool;
    /// [`Derivative::planned`] after the checks [`forward`] makes first
    /// (the input count, one device): the output's shape, dtype and device
    /// when the op may be computed later, `None` when it must run now.
    fn plan(&self, inputs: &[&Tensor]) -> Option<Result<(Shape, DType, Device)>>;
    /// See [`Derivative::jvp_reads_output`].
    fn jvp_reads_output(&self) -> bool;
    /// See [`Derivative::saves`].
    fn saves(&self) -> Saved;
    /// See [`Op::release`].
    fn release(&self);
}

impl<O: Derivative> DynOp for O {
    fn name(&self) -> &'static str {
        Op::name(self)
    }
    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        forward(self, inputs)
    }
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, y: Tensor, g: Tensor) -> Result<InputGrads<Tensor>> {
        Derivative::vjp_eager(self, xs, y, g)
    }
    fn vjp_eager_wanted(
        &self,
        xs: SmallVec<[Tensor; 3]>,
        y: Tensor,
        g: Tensor,
        wanted: &[bool],
    ) -> Result<InputGrads<Tensor>> {
        Derivative::vjp_eager_wanted(self, xs, y, g, wanted)
    }
    fn vjp_traced<'t>(&self, xs: &[&Traced<'t>], y: &Traced<'t>, g: &Traced<'t>) -> Result<InputGrads<Traced<'t>>> {
        self.vjp(xs, y, g)
    }
    fn jvp_eager(&self, xs: &[&Tensor], y: &Tensor, ts: &[Option<&Tensor>]) -> Result<Option<Tensor>> {
        Derivative::jvp_eager(self, xs, y, ts)
    }
    fn jvp_traced<'t>(
        &self,
        xs: &[&Traced<'t>],
        y: &Traced<'t>,
        ts: &[Option<&Traced<'t>>],
    ) -> Result<Option<Traced<'t>>> {
        self.jvp(xs, y, ts)
    }
    fn is_differentiable(&self) -> bool {
        Derivative::is_differentiable(self)
    }
    fn plan(&self, inputs: &[&Tensor]) -> Option<Result<(Shape, DType, Device)>> {
        match checked_device(self, inputs) {
            Ok(device) => self.planned(inputs).map(|r| r.map(|(shape, dtype)| (shape, dtype, device))),
            // `forward` would fail the same way: so fails the recording.
            Err(e) => Some(Err(e)),
        }
    }
    fn jvp_reads_output(&self) -> bool {
        Derivative::jvp_reads_output(self)
    }
    fn saves(&self) -> Saved {
        Derivative::saves(self)
    }
    fn release(&self) {
        Op::release(self)
    }
}

/// What a graph offers to rules that run in recording mode. Implemented by
/// tapir-autograd's `Graph`; node ids are opaque numbers.
pub trait Tape {
    /// Runs `op` on the values of `inputs` and records the result.
    fn record(&self, op: Arc<dyn DynOp>, inputs: &[u64]) -> Result<u64>;
    /// Records a constant.
    fn constant(&self, value: Tensor) -> u64;
    /// Shape of a node.
    fn node_shape(&self, id: u64) -> Shape;
    /// Dtype of a node.
    fn node_dtype(&self, id: u64) -> DType;
    /// Device of a node.
    fn node_device(&self, id: u64) -> Device;
    /// Value of a node (an error when it was released).
    fn node_value(&self, id: u64) -> Result<Tensor>;
}

/// A recording handle as rules see it: a node of some tape. Users meet the
/// branded `Var<'g>` of tapir-autograd instead.
#[derive(Clone, Copy)]
pub struct Traced<'t> {
    /// The tape the node lives on.
    pub tape: &'t dyn Tape,
    /// The node.
    pub id: u64,
}

impl Debug for Traced<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Traced({})", self.id)
    }
}

impl Diff for Traced<'_> {
    fn apply<O: Derivative>(op: O, inputs: &[&Self]) -> Result<Self> {
        let first = inputs.first().ok_or_else(|| Error::invalid_arg(op.name(), "takes at least 1 input, got 0"))?;
        let ids: SmallVec<[u64; 4]> = inputs.iter().map(|t| t.id).collect();
        Ok(Traced { tape: first.tape, id: first.tape.record(Arc::new(op), &ids)? })
    }
    fn shape(&self) -> Shape {
        self.tape.node_shape(self.id)
    }
    fn dtype(&self) -> DType {
        self.tape.node_dtype(self.id)
    }
    fn device(&self) -> Device {
        self.tape.node_device(self.id)
    }
    fn lift(&self, value: Tensor) -> Self {
        Traced { tape: self.tape, id: self.tape.constant(value) }
    }
    fn eval(&self) -> Result<Tensor> {
        self.tape.node_value(self.id)
    }
    fn is_recording(&self) -> bool {
        true
    }
}

impl Diff for Tensor {
    fn apply<O: Derivative>(op: O, inputs: &[&Self]) -> Result<Self> {
        forward(&op, inputs)
    }
    fn shape(&self) -> Shape {
        self.layout.shape.clone()
    }
    fn dtype(&self) -> DType {
        Tensor::dtype(self)
    }
    fn device(&self) -> Device {
        Tensor::device(self)
    }
    fn lift(&self, value: Tensor) -> Self {
        value
    }
    fn eval(&self) -> Result<Tensor> {
        Ok(self.clone())
    }
}

/// Something differentiable ops can be applied to: a [`Tensor`] (computes
/// now, records nothing) or a graph handle (computes now and records).
/// Every op method lives here, so `x.tanh()?` reads the same on both.
pub trait Diff: Clone + Sized {
    /// Applies `op` to `inputs` (the first input decides the context).
    fn apply<O: Derivative>(op: O, inputs: &[&Self]) -> Result<Self>;
    /// The shape.
    fn shape(&self) -> Shape;
    /// The dtype.
    fn dtype(&self) -> DType;
    /// The device.
    fn device(&self) -> Device;
    /// Brings a plain tensor into this value's context as a constant.
    fn lift(&self, value: Tensor) -> Self;
    /// The current value as a plain tensor.
    fn eval(&self) -> Result<Tensor>;
    /// True for graph handles, whose ops are recorded (under create_graph).
    /// Fused rules use it to pick their kernel (eager) or a differentiable
    /// formulation (recording).
    fn is_recording(&self) -> bool {
        false
    }
    /// True when gradients can flow to this value (a recorded value made
    /// from some leaf); false for constants and plain tensors. Fused ops
    /// use it to skip work only a backward pass would need.
    fn requires_grad(&self) -> bool {
        self.is_recording()
    }

    /// Number of dims.
    fn rank(&self) -> usize {
        self.shape().rank()
    }
    /// Number of elements.
    fn numel(&self) -> usize {
        self.shape().numel()
    }
    /// A constant of this value's dtype and device, shaped `shape`, filled
    /// with `v` (errors as [`Tensor::full`]).
    fn full_like_shape(&self, shape: impl Into<Shape>, v: f64) -> Result<Self> {
        Ok(self.lift(Tensor::full_on(shape, v, self.dtype(), self.device())?))
    }
    /// A zero constant shaped like `self` (fails only when out of memory).
    fn zeros_like(&self) -> Result<Self> {
        self.full_like_shape(self.shape(), 0.0)
    }
    /// A constant shaped like `self` filled with ones (fails only when out
    /// of memory).
    fn ones_like(&self) -> Result<Self> {
        self.full_like_shape(self.shape(), 1.0)
    }
}

/// The first two entries of a [`Derivative::vjp_eager_wanted`] mask, an
/// entry missing counting as wanted: what a two-input rule asks.
pub fn wanted_pair(wanted: &[bool]) -> [bool; 2] {
    let want = |i: usize| wanted.get(i).copied().unwrap_or(true);
    [want(0), want(1)]
}

/// One gradient in an [`InputGrads`].
pub fn one<T>(g: T) -> InputGrads<T> {
    smallvec::smallvec![Some(g)]
}
