//! Every op: its forward kernel and its derivative rules, side by side.
//!
//! An op is a small struct implementing [`Op`]: `forward` runs on plain
//! tensors, and `vjp` / `jvp` are written once, generically over [`Diff`],
//! in terms of other differentiable ops. The same rule therefore runs on
//! [`Tensor`] (eager, first-order backward, nothing recorded) and on a
//! recording handle (under `create_graph`, so the rule itself is
//! differentiated for higher orders). The autograd crate holds no per-op code.

use std::fmt::Debug;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::backend::Backend;
use crate::{DType, Device, Error, Result, Shape, Tensor};

pub mod binary;
pub mod cross_entropy;
pub mod index;
pub mod matmul;
pub mod optim;
pub mod reduce;
pub mod shape;
pub mod softmax;
pub mod unary;

/// Every op of this crate, each once, family by family: each op file lists
/// its own members (`family()`, and `ALL` for the enums), and names come
/// from the ops themselves, so this cannot drift from them. The
/// gradient-check table is checked against it in both directions, and a
/// unit test that every enum variant is listed.
pub fn registry() -> Vec<Box<dyn DynOp>> {
    [
        unary::family,
        binary::family,
        reduce::family,
        shape::family,
        matmul::family,
        softmax::family,
        index::family,
        cross_entropy::family,
    ]
    .into_iter()
    .flat_map(|family| family())
    .collect()
}

/// The names of the differentiable ops of [`registry`].
pub fn differentiable_ops() -> Vec<&'static str> {
    registry().iter().filter(|op| op.is_differentiable()).map(|op| op.name()).collect()
}

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

/// A differentiable operation.
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
    /// The eager reverse rule: [`Op::vjp`] on plain tensors the caller
    /// hands over, run by a first-order backward, where nothing is
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
    /// The eager forward rule: [`Op::jvp`] on plain tensors, where nothing
    /// is recorded (a Hessian-vector product's tangent pass). Overridden,
    /// like [`Op::vjp_eager`], only by ops with a fused kernel for it.
    fn jvp_eager(&self, xs: &[&Tensor], y: &Tensor, ts: &[Option<&Tensor>]) -> Result<Option<Tensor>> {
        self.jvp(xs, y, ts)
    }
    /// Frees what the op saved for its reverse rule beyond its inputs and
    /// output (a cross-entropy's per-row log-sum-exp, precomputed
    /// gradients), once a backward without `retain_graph` has run the rule
    /// and will not run it again. The default saves nothing.
    fn release(&self) {}
    /// False for ops with no derivative (comparisons, argmax, casts to ints):
    /// the graph then never calls their rules.
    fn is_differentiable(&self) -> bool {
        true
    }
}

/// Checks that two operands share a device and returns their broadcast
/// shape. Their dtypes may differ: binary ops promote them
/// ([`promote_pair`]).
pub(crate) fn check_pair(op: &'static str, a: &Tensor, b: &Tensor) -> Result<Shape> {
    if a.device() != b.device() {
        return Err(Error::DeviceMismatch { op, lhs: a.device(), rhs: b.device() });
    }
    Shape::broadcast(op, a.shape(), b.shape())
}

/// Both operands in their promoted dtype ([`DType::promote`]); handles
/// on the operands themselves when their dtypes already agree.
pub(crate) fn promote_pair(a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    let dtype = result_dtype(a, b);
    // Through the cast op, so the cast runs on the operands' device.
    let to = |x: &Tensor| if x.dtype() == dtype { Ok(x.clone()) } else { forward(&shape::Cast(dtype), &[x]) };
    Ok((to(a)?, to(b)?))
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

/// The backend of `device`'s kind: the one place a device is mapped to
/// its kernels (a CUDA kernel finds its ordinal in its operands' buffers).
pub(crate) fn backend_for(device: Device) -> &'static dyn Backend {
    match device {
        Device::Cpu => &crate::cpu::CpuBackend,
        Device::Cuda(_) => &crate::cuda::CudaBackend,
    }
}

/// Runs `op` forward on `inputs`: every input and every operand the op
/// holds must be on one device ([`Error::DeviceMismatch`] names the op and
/// the first two devices that differ), and [`Op::run`] computes the output
/// with that device's backend. This is the only way an op's forward is
/// run, eagerly or on a graph.
pub fn forward<O: Op + ?Sized>(op: &O, inputs: &[&Tensor]) -> Result<Tensor> {
    op.arity().check(op.name(), inputs.len())?;
    let mut devices = inputs.iter().copied().chain(op.operands()).map(Tensor::device);
    let device = devices.next().unwrap_or(Device::Cpu);
    if let Some(other) = devices.find(|&d| d != device) {
        return Err(Error::DeviceMismatch { op: op.name(), lhs: device, rhs: other });
    }
    op.run(backend_for(device), inputs)
}

/// The object-safe face of [`Op`], so a graph can store any op. Each rule is
/// compiled twice: once for eager tensors and once for the recording handle.
pub trait DynOp: Debug + Send + Sync + 'static {
    /// See [`Op::name`].
    fn name(&self) -> &'static str;
    /// [`forward`]: the input count, the device check, then that device's
    /// kernel.
    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor>;
    /// See [`Op::vjp_eager`].
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, y: Tensor, g: Tensor) -> Result<InputGrads<Tensor>>;
    /// [`Op::vjp`] recorded on a tape.
    fn vjp_traced<'t>(&self, xs: &[&Traced<'t>], y: &Traced<'t>, g: &Traced<'t>) -> Result<InputGrads<Traced<'t>>>;
    /// See [`Op::jvp_eager`].
    fn jvp_eager(&self, xs: &[&Tensor], y: &Tensor, ts: &[Option<&Tensor>]) -> Result<Option<Tensor>>;
    /// [`Op::jvp`] recorded on a tape.
    fn jvp_traced<'t>(
        &self,
        xs: &[&Traced<'t>],
        y: &Traced<'t>,
        ts: &[Option<&Traced<'t>>],
    ) -> Result<Option<Traced<'t>>>;
    /// See [`Op::is_differentiable`].
    fn is_differentiable(&self) -> bool;
    /// See [`Op::saves`].
    fn saves(&self) -> Saved;
    /// See [`Op::release`].
    fn release(&self);
}

impl<O: Op> DynOp for O {
    fn name(&self) -> &'static str {
        Op::name(self)
    }
    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        forward(self, inputs)
    }
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, y: Tensor, g: Tensor) -> Result<InputGrads<Tensor>> {
        Op::vjp_eager(self, xs, y, g)
    }
    fn vjp_traced<'t>(&self, xs: &[&Traced<'t>], y: &Traced<'t>, g: &Traced<'t>) -> Result<InputGrads<Traced<'t>>> {
        self.vjp(xs, y, g)
    }
    fn jvp_eager(&self, xs: &[&Tensor], y: &Tensor, ts: &[Option<&Tensor>]) -> Result<Option<Tensor>> {
        Op::jvp_eager(self, xs, y, ts)
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
        Op::is_differentiable(self)
    }
    fn saves(&self) -> Saved {
        Op::saves(self)
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
    fn apply<O: Op>(op: O, inputs: &[&Self]) -> Result<Self> {
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
    fn apply<O: Op>(op: O, inputs: &[&Self]) -> Result<Self> {
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
    fn apply<O: Op>(op: O, inputs: &[&Self]) -> Result<Self>;
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

pub use binary::BinaryOps;
pub use cross_entropy::{CrossEntropyOps, CrossEntropyOptions, Reduction};
pub use index::IndexOps;
pub use matmul::MatmulOps;
pub use reduce::ReduceOps;
pub use shape::ShapeOps;
pub use softmax::SoftmaxOps;
pub use unary::UnaryOps;

/// Adds two optional tangents/gradients, treating `None` as zero.
pub fn add_opt<T: Diff>(a: Option<T>, b: Option<T>) -> Result<Option<T>> {
    Ok(match (a, b) {
        (Some(a), Some(b)) => Some(a.add(&b)?),
        (a, None) => a,
        (None, b) => b,
    })
}

/// One gradient in an [`InputGrads`].
pub fn one<T>(g: T) -> InputGrads<T> {
    smallvec::smallvec![Some(g)]
}

#[cfg(test)]
mod seam_tests {
    //! The backend seam without a GPU: a stand-in device buffer that claims
    //! to live on `cuda:3` (or `cuda:5` for the one test that reads its
    //! counters, which nothing else touches) and
    //! keeps its elements in a host vector, so every path that must not
    //! read a device buffer as host memory is exercised.

    use std::sync::Arc;

    use crate::storage::{CpuBuffer, DeviceBuffer, Storage};
    use crate::{memory_stats, BinaryOps, Device, Error, Layout, ShapeOps, Tensor, UnaryOps};

    const FAKE: Device = Device::Cuda(3);
    const COUNTED: Device = Device::Cuda(5);

    #[derive(Debug)]
    struct FakeBuffer(CpuBuffer, Device);

    impl DeviceBuffer for FakeBuffer {
        fn device(&self) -> Device {
            self.1
        }
        fn dtype(&self) -> crate::DType {
            self.0.dtype()
        }
        fn len(&self) -> usize {
            self.0.len()
        }
        fn to_host(&self) -> crate::Result<CpuBuffer> {
            Ok(self.0.clone())
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    fn on_fake(v: Vec<f32>, shape: &[usize]) -> Tensor {
        on(FAKE, v, shape)
    }

    fn on(device: Device, v: Vec<f32>, shape: &[usize]) -> Tensor {
        let storage = Storage::on_device(Box::new(FakeBuffer(CpuBuffer::F32(v), device)), true);
        Tensor { storage: Arc::new(storage), layout: Layout::contiguous(shape.into()) }
    }

    #[test]
    fn device_storage_is_counted_on_its_device_exactly() {
        let t = on(COUNTED, vec![1.0; 6], &[2, 3]);
        assert_eq!(t.device(), COUNTED);
        let s = memory_stats(COUNTED);
        assert_eq!((s.allocated, s.peak, s.reserved, s.allocations, s.system_allocations), (24, 24, 24, 1, 1));
        let view = t.t().unwrap();
        drop(t);
        assert_eq!(memory_stats(COUNTED).allocated, 24, "a view keeps the storage");
        drop(view);
        // Unallocated; still reserved, as a caching allocator keeps the block.
        let s = memory_stats(COUNTED);
        assert_eq!((s.allocated, s.peak, s.reserved), (0, 24, 24));
    }

    #[test]
    fn mixing_devices_is_a_device_mismatch_naming_the_op_and_both_devices() {
        let (d, c) = (on_fake(vec![1.0, 2.0], &[2]), Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap());
        assert_eq!(c.add(&d).unwrap_err(), Error::DeviceMismatch { op: "add", lhs: Device::Cpu, rhs: FAKE });
        assert_eq!(d.mul(&c).unwrap_err(), Error::DeviceMismatch { op: "mul", lhs: FAKE, rhs: Device::Cpu });
        // An operand the op holds counts too: the mask of `where`.
        let mask = Tensor::from_vec(vec![1.0f32, 0.0], [2]).unwrap();
        assert_eq!(
            d.where_(&mask, &d).unwrap_err(),
            Error::DeviceMismatch { op: "where", lhs: FAKE, rhs: Device::Cpu }
        );
    }

    #[test]
    fn an_op_without_a_kernel_on_the_device_is_unsupported_not_a_panic() {
        let d = on_fake(vec![1.0, 2.0, 3.0, 4.0], &[2, 2]);
        assert_eq!(d.exp().unwrap_err(), Error::Unsupported { op: "exp", device: FAKE });
        assert_eq!(d.add(&d).unwrap_err(), Error::Unsupported { op: "add", device: FAKE });
        // Views need no kernel: they work on any device, and a copy of a
        // strided view is the device's business.
        let v = d.t().unwrap().narrow(0, 1, 1).unwrap();
        assert_eq!(v.device(), FAKE);
        assert_eq!(v.contiguous().unwrap_err(), Error::Unsupported { op: "contiguous", device: FAKE });
        let mut m = d.clone();
        assert!(matches!(m.make_mut::<f32>(), Err(Error::Unsupported { op: "make_mut", .. })));
        assert_eq!(d.as_slice::<f32>(), None);
        assert!(format!("{d:?}").contains("cuda:3"));
    }

    #[test]
    fn values_leave_a_device_through_a_host_copy() {
        let d = on_fake(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        assert_eq!(d.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let col = d.t().unwrap().narrow(0, 2, 1).unwrap();
        assert_eq!(col.to_vec_f64(), vec![3.0, 6.0]);
        let host = col.to_device(Device::Cpu).unwrap();
        assert_eq!(host.device(), Device::Cpu);
        assert_eq!(host.exp().unwrap().to_vec_f32(), vec![3.0f32.exp(), 6.0f32.exp()]);
        assert_eq!(d.narrow(1, 1, 1).unwrap().narrow(0, 1, 1).unwrap().item().unwrap(), 5.0);
        // A CUDA device: a copy where one is present, else an error naming it.
        match host.to_device(Device::Cuda(0)) {
            Ok(t) => assert_eq!((t.device(), t.to_vec_f64()), (Device::Cuda(0), host.to_vec_f64())),
            Err(err) => assert!(matches!(err, Error::DeviceUnavailable { device: Device::Cuda(0), .. }), "{err}"),
        }
    }
}
