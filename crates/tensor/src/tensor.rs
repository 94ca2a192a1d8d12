//! The tensor handle.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::backend::{Backend, Src};
use crate::cpu::iter::{map1, Nd};
use crate::storage::{try_filled, try_vec, CpuBuffer, CpuElement, Storage};
use crate::{DType, Device, Element, Error, Layout, Result, Shape};

/// An n-dimensional array: a cheap-to-clone handle on shared storage plus a
/// strided layout. Cloning shares the storage; views (reshape, permute,
/// narrow, broadcast) share it too. A tensor carries no graph: that is what
/// lets it leave a `Graph::scope`.
///
/// Ops are methods of the traits in the prelude ([`BinaryOps`],
/// [`UnaryOps`], [`ReduceOps`], [`ShapeOps`], [`MatmulOps`]...), shared with
/// graph values, and follow torch's names and semantics. `{}` prints a
/// tensor as torch does.
///
/// ```
/// use tapir::prelude::*;
///
/// // Creation: from data (checked against the shape), or filled.
/// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3])?;
/// let ones = Tensor::ones([3], DType::F32)?;
/// let r = Tensor::arange(0.0, 4.0, 1.0, DType::I64)?;
/// assert_eq!(r.to_vec::<i64>()?, vec![0, 1, 2, 3]);
/// assert!(Tensor::from_vec(vec![1.0f32; 5], [2, 3]).is_err()); // 5 values cannot be [2, 3]
///
/// // Views share storage: no copy.
/// let t = a.t()?; // [3, 2]
/// assert!(t.same_storage(&a) && !t.is_contiguous());
/// assert_eq!(a.narrow(1, 1, 2)?.to_vec::<f32>()?, vec![2.0, 3.0, 5.0, 6.0]);
/// assert_eq!(a.reshape([3, 2])?.dims(), &[3, 2]);
///
/// // Broadcasting as in torch: [2, 3] + [3].
/// assert_eq!(a.add(&ones)?.to_vec::<f32>()?, vec![2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
///
/// // Matrix products (batched over leading dims too).
/// let p = a.matmul(&t)?; // [2, 3] @ [3, 2]
/// assert_eq!(p.to_vec::<f32>()?, vec![14.0, 32.0, 32.0, 77.0]);
///
/// // dtype and device: casts are explicit; the CPU is the default device.
/// let h = a.cast(DType::BF16)?;
/// assert_eq!((h.dtype(), h.device()), (DType::BF16, Device::Cpu));
/// assert_eq!(h.to_vec_f64(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
/// // To a GPU: a copy when one is present, else an error saying why (never a panic).
/// match a.to_device(Device::Cuda(0)) {
///     Ok(g) => assert_eq!(g.to_vec::<f32>()?, a.to_vec::<f32>()?),
///     Err(e) => assert!(matches!(e, Error::DeviceUnavailable { .. })),
/// }
///
/// // Printing.
/// assert_eq!(r.to_string(), "tensor([0, 1, 2, 3], shape=[4], dtype=int64)");
///
/// // Every storage is counted: the live bytes include a's 24.
/// assert!(memory_allocated(Device::Cpu) >= 24);
/// # Ok::<(), Error>(())
/// ```
///
/// [`BinaryOps`]: crate::BinaryOps
/// [`UnaryOps`]: crate::UnaryOps
/// [`ReduceOps`]: crate::ReduceOps
/// [`ShapeOps`]: crate::ShapeOps
/// [`MatmulOps`]: crate::MatmulOps
#[derive(Clone)]
pub struct Tensor {
    pub(crate) storage: Arc<Storage>,
    pub(crate) layout: Layout,
}

/// Runs `$body` with `$T` bound to the Rust type of a float compute dtype
/// (f32 or f64); other dtypes take the `$else` branch.
#[macro_export]
#[doc(hidden)]
macro_rules! with_float {
    ($dtype:expr, $T:ident => $body:expr, _ => $else:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            _ => $else,
        }
    };
}

/// Runs `$body` with `$T` bound to the Rust type of any dtype.
#[macro_export]
#[doc(hidden)]
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
        }
    };
}

/// The backend of `device`'s kind: the one place a device is mapped to
/// its kernels (a CUDA kernel finds its ordinal in its operands' buffers).
/// Beside the handle, which knows the devices its storage may live on, so
/// both the handle and every op above it reach a device's kernels here.
pub(crate) fn backend_for(device: Device) -> &'static dyn Backend {
    match device {
        Device::Cpu => &crate::cpu::CpuBackend,
        Device::Cuda(_) => &crate::cuda::CudaBackend,
    }
}

/// The error of a narrow past its axis: it names `start` when that is
/// already out of range, else the end `start + len`, saturated rather than
/// wrapped when a user's sizes overflow.
pub(crate) fn narrow_out_of_range(axis: usize, start: usize, len: usize, size: usize) -> Error {
    let index = if start > size { start } else { start.saturating_add(len) };
    Error::IndexOutOfRange { op: "narrow", index: i64::try_from(index).unwrap_or(i64::MAX), position: axis, size }
}

impl Tensor {
    // ----- construction -------------------------------------------------

    /// Wraps a host buffer as a contiguous tensor of `shape`.
    pub fn from_buffer(buf: CpuBuffer, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        shape.check("from_vec", buf.dtype())?;
        if buf.len() != shape.numel() {
            return Err(Error::ElementCount {
                op: "from_vec",
                expected: shape.numel(),
                got: buf.len(),
                shape: Box::new(shape),
            });
        }
        Ok(Tensor { storage: Arc::new(Storage::cpu(buf)), layout: Layout::contiguous(shape) })
    }

    /// A tensor owning `data`, checked against `shape`.
    pub fn from_vec<T: CpuElement>(data: Vec<T>, shape: impl Into<Shape>) -> Result<Self> {
        Self::from_buffer(T::wrap(data), shape)
    }

    /// A tensor copying `data`, checked against `shape`.
    pub fn from_slice<T: CpuElement>(data: &[T], shape: impl Into<Shape>) -> Result<Self> {
        Self::from_vec(data.to_vec(), shape)
    }

    /// A 0-d f32 tensor.
    pub fn scalar(v: f32) -> Self {
        Self::from_vec(vec![v], ()).expect("internal: scalar shape")
    }

    /// A 0-d tensor of `dtype` holding `v`.
    pub fn scalar_of(v: f64, dtype: DType) -> Self {
        let buf = with_dtype!(dtype, T => T::wrap(vec![T::from_f64(v)]));
        Self::from_buffer(buf, ()).expect("internal: scalar shape")
    }

    /// Zeros of `shape` and `dtype`. Fails with [`Error::InvalidShape`] when
    /// the shape's size overflows and [`Error::OutOfMemory`] when the system
    /// cannot provide the bytes; nothing is counted then.
    pub fn zeros(shape: impl Into<Shape>, dtype: DType) -> Result<Self> {
        let shape = shape.into();
        let n = shape.check("zeros", dtype)?;
        Self::from_buffer(CpuBuffer::zeros(dtype, n)?, shape)
    }

    /// Ones of `shape` and `dtype` (errors as [`Tensor::zeros`]).
    pub fn ones(shape: impl Into<Shape>, dtype: DType) -> Result<Self> {
        Self::full_named("ones", shape.into(), 1.0, dtype)
    }

    /// `shape` filled with `value` (converted to `dtype`; errors as
    /// [`Tensor::zeros`]).
    pub fn full(shape: impl Into<Shape>, value: f64, dtype: DType) -> Result<Self> {
        Self::full_named("full", shape.into(), value, dtype)
    }

    /// Zeros of `shape` and `dtype` made on `device`: on a CUDA device the
    /// memory is set there, never filled on the host and copied. Errors as
    /// [`Tensor::zeros`], and [`Error::DeviceUnavailable`] for a device
    /// this machine lacks.
    ///
    /// ```
    /// use tapir::prelude::*;
    ///
    /// let z = Tensor::zeros_on([2, 3], DType::F64, Device::Cpu)?;
    /// assert_eq!((z.device(), z.to_vec::<f64>()?), (Device::Cpu, vec![0.0; 6]));
    /// // On a GPU when one is present, else an error saying why.
    /// match Tensor::ones_on([4], DType::F32, Device::Cuda(0)) {
    ///     Ok(o) => assert_eq!((o.device(), o.to_vec::<f32>()?), (Device::Cuda(0), vec![1.0; 4])),
    ///     Err(e) => assert!(matches!(e, Error::DeviceUnavailable { .. })),
    /// }
    /// # Ok::<(), Error>(())
    /// ```
    pub fn zeros_on(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Self> {
        match device {
            Device::Cpu => Self::zeros(shape, dtype),
            Device::Cuda(i) => Self::full_on_cuda("zeros", i, shape.into(), 0.0, dtype),
        }
    }

    /// Ones of `shape` and `dtype` made on `device` (see [`Tensor::zeros_on`]).
    pub fn ones_on(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Self> {
        match device {
            Device::Cpu => Self::ones(shape, dtype),
            Device::Cuda(i) => Self::full_on_cuda("ones", i, shape.into(), 1.0, dtype),
        }
    }

    /// `shape` filled with `value` (converted to `dtype` as on the CPU,
    /// bit for bit) made on `device` (see [`Tensor::zeros_on`]).
    pub fn full_on(shape: impl Into<Shape>, value: f64, dtype: DType, device: Device) -> Result<Self> {
        match device {
            Device::Cpu => Self::full(shape, value, dtype),
            Device::Cuda(i) => Self::full_on_cuda("full", i, shape.into(), value, dtype),
        }
    }

    /// The CUDA side of the `*_on` constructors: the shape is checked as on
    /// the CPU (the same error for the same shape), then the device fills.
    fn full_on_cuda(op: &'static str, ordinal: usize, shape: Shape, value: f64, dtype: DType) -> Result<Self> {
        shape.check(op, dtype)?;
        crate::cuda::fill::full(ordinal, shape, value, dtype)
    }

    fn full_named(op: &'static str, shape: Shape, value: f64, dtype: DType) -> Result<Self> {
        let n = shape.check(op, dtype)?;
        // +0.0 only: zero bytes are +0.0, and full(.., -0.0) must keep its sign.
        if value.to_bits() == 0 {
            return Self::from_buffer(CpuBuffer::zeros(dtype, n)?, shape);
        }
        let buf = with_dtype!(dtype, T => T::wrap(try_filled(n, T::from_f64(value))?));
        Self::from_buffer(buf, shape)
    }

    /// Zeros shaped like `self`, same dtype and device (fails only when the
    /// memory cannot be allocated).
    pub fn zeros_like(&self) -> Result<Self> {
        Self::zeros_on(self.shape().clone(), self.dtype(), self.device())
    }

    /// Ones shaped like `self`, same dtype and device (fails only when the
    /// memory cannot be allocated).
    pub fn ones_like(&self) -> Result<Self> {
        Self::ones_on(self.shape().clone(), self.dtype(), self.device())
    }

    /// `value` in the shape, dtype and device of `self` (fails only when the
    /// memory cannot be allocated).
    pub fn full_like(&self, value: f64) -> Result<Self> {
        Self::full_on(self.shape().clone(), value, self.dtype(), self.device())
    }

    /// `start, start + step, ...` below `end` (torch.arange), as `dtype`.
    /// Non-finite or zero arguments are an [`Error::InvalidArgument`]; a
    /// length that overflows is an [`Error::InvalidShape`].
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType) -> Result<Self> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(Error::invalid_arg("arange", format!("start {start}, end {end}, step {step}")));
        }
        let len = ((end - start) / step).ceil().max(0.0);
        // `as` saturates; a length at or past 2^64 must not become usize::MAX
        // silently, so it is reported as the overflow it is.
        if len >= usize::MAX as f64 {
            return Err(Error::InvalidShape {
                op: "arange",
                shape: Box::new(Shape::from([usize::MAX])),
                reason: format!("start {start}, end {end}, step {step} give {len:e} elements"),
            });
        }
        let n = len as usize;
        Shape::from([n]).check("arange", dtype)?;
        let buf = with_dtype!(dtype, T => {
            let mut v = try_vec(n)?;
            v.extend((0..n).map(|i| T::from_f64(start + i as f64 * step)));
            T::wrap(v)
        });
        Self::from_buffer(buf, [n])
    }

    /// The `n x n` identity (errors as [`Tensor::zeros`]).
    pub fn eye(n: usize, dtype: DType) -> Result<Self> {
        let shape = Shape::from([n, n]);
        shape.check("eye", dtype)?;
        let mut t = Self::zeros(shape, dtype)?;
        with_dtype!(dtype, T => {
            let d = t.make_mut::<T>()?;
            for i in 0..n {
                d[i * (n + 1)] = T::from_f64(1.0);
            }
        });
        Ok(t)
    }

    // ----- inspection ---------------------------------------------------

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.layout.shape
    }
    /// The dims as a slice.
    pub fn dims(&self) -> &[usize] {
        self.layout.shape.dims()
    }
    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.layout.shape.rank()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.storage.dtype()
    }
    /// The device its storage lives on.
    pub fn device(&self) -> Device {
        self.storage.device()
    }
    /// The strided layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// Element strides.
    pub fn strides(&self) -> &[usize] {
        &self.layout.strides
    }
    /// True when row-major with no gaps.
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }
    /// Bytes of the storage this tensor views (shared with other views).
    pub fn storage_bytes(&self) -> usize {
        self.storage.bytes()
    }
    /// An identity for the storage this tensor views (for de-duplicating
    /// byte counts over several views).
    pub fn storage_ptr(&self) -> *const () {
        Arc::as_ptr(&self.storage) as *const ()
    }
    /// True when both handles view the same storage.
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }
    /// Size of `axis` (negative counts from the end).
    pub fn dim(&self, axis: isize) -> Result<usize> {
        Ok(self.dims()[self.shape().axis("dim", axis)?])
    }

    /// The whole storage as a typed slice (ignores the layout). Only CPU
    /// kernels call this, and an op's forward hands them CPU
    /// tensors only.
    pub(crate) fn storage_slice<T: CpuElement>(&self) -> &[T] {
        let host = self.storage.host().expect("internal: a CPU kernel was given a device tensor");
        T::slice(host).expect("internal: dtype matches storage")
    }

    /// This tensor if it is on the host, else a host copy (same layout).
    fn on_host(&self) -> Result<std::borrow::Cow<'_, Tensor>> {
        if self.storage.host().is_some() {
            return Ok(std::borrow::Cow::Borrowed(self));
        }
        let host = self.storage.to_host()?.into_owned();
        Ok(std::borrow::Cow::Owned(Tensor { storage: Arc::new(Storage::cpu(host)), layout: self.layout.clone() }))
    }

    /// The error for a host-only operation on a device tensor.
    fn host_only(&self, op: &'static str) -> Result<()> {
        match self.device() {
            Device::Cpu => Ok(()),
            device => Err(Error::Unsupported { op, device }),
        }
    }

    /// The elements as a contiguous slice, if this tensor is contiguous and
    /// of type `T`.
    pub fn as_slice<T: CpuElement>(&self) -> Option<&[T]> {
        if !self.is_contiguous() {
            return None;
        }
        let s = T::slice(self.storage.host()?)?;
        Some(&s[self.layout.offset..self.layout.offset + self.numel()])
    }

    /// This tensor as a kernel operand: its storage and layout.
    pub(crate) fn src(&self) -> Src<'_> {
        Src { storage: &self.storage, layout: &self.layout }
    }

    /// The whole storage, when this handle is contiguous over all of it and
    /// the only one on it (a kernel may then write over it, as
    /// [`Tensor::make_mut`] would without copying); else the handle back.
    // The `Err` is the handle given back, not an error: boxing it would
    // allocate on the common shared-logits path for nothing.
    #[allow(clippy::result_large_err)]
    pub(crate) fn into_sole_storage(self) -> std::result::Result<Storage, Tensor> {
        let whole = self.is_contiguous() && self.layout.offset == 0 && self.numel() == self.storage.len();
        if !whole {
            return Err(self);
        }
        let Tensor { storage, layout } = self;
        Arc::try_unwrap(storage).map_err(|storage| Tensor { storage, layout })
    }

    /// A contiguous tensor of `shape` over a kernel's output `storage`.
    pub(crate) fn from_storage(storage: Storage, shape: Shape) -> Tensor {
        Tensor { storage: Arc::new(storage), layout: Layout::contiguous(shape) }
    }

    /// The iteration space of this tensor alone.
    pub(crate) fn nd(&self) -> Nd<1> {
        Nd::new(self.dims(), [&self.layout.strides], [self.layout.offset])
    }

    // ----- leaving the tensor ---------------------------------------------

    /// The elements in row-major order; `T` must match the dtype.
    pub fn to_vec<T: CpuElement>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DTypeMismatch { op: "to_vec", lhs: self.dtype(), rhs: T::DTYPE });
        }
        let t = self.on_host()?;
        if let Some(s) = t.as_slice::<T>() {
            return Ok(s.to_vec());
        }
        map1(t.storage_slice::<T>(), &t.nd(), |x| x)
    }

    /// The elements converted to f64, in row-major order.
    ///
    /// # Panics
    ///
    /// When the system cannot allocate the vector (use
    /// [`Tensor::cast`](crate::ShapeOps::cast) and [`Tensor::to_vec`] for an
    /// error instead).
    pub fn to_vec_f64(&self) -> Vec<f64> {
        self.on_host()
            .and_then(|t| with_dtype!(t.dtype(), T => map1(t.storage_slice::<T>(), &t.nd(), |x: T| x.to_f64())))
            .unwrap_or_else(|e| panic!("to_vec_f64: {e}"))
    }

    /// The elements converted to f32, in row-major order.
    ///
    /// # Panics
    ///
    /// When the system cannot allocate the vector, as
    /// [`Tensor::to_vec_f64`].
    pub fn to_vec_f32(&self) -> Vec<f32> {
        self.on_host()
            .and_then(|t| with_dtype!(t.dtype(), T => map1(t.storage_slice::<T>(), &t.nd(), |x: T| x.to_f64() as f32)))
            .unwrap_or_else(|e| panic!("to_vec_f32: {e}"))
    }

    /// The single element of a one-element tensor, as f64.
    pub fn item(&self) -> Result<f64> {
        if self.numel() != 1 {
            return Err(Error::InvalidShape {
                op: "item",
                shape: Box::new(self.shape().clone()),
                reason: "item needs exactly one element".into(),
            });
        }
        let t = self.on_host()?;
        let v = with_dtype!(t.dtype(), T => map1(t.storage_slice::<T>(), &t.nd(), |x: T| x.to_f64()))?;
        Ok(v[0])
    }

    /// The single element of a one-element tensor, as f32.
    pub fn item_f32(&self) -> Result<f32> {
        self.item().map(|v| v as f32)
    }

    // ----- layout changes (no recording; Diff wraps these) --------------

    /// A contiguous copy, or `self` when already contiguous. Fails with
    /// [`Error::OutOfMemory`] when the copy cannot be allocated (a broadcast
    /// view can be far larger than its storage).
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        // The device's copy kernel, as the Contiguous op runs it.
        let copy = backend_for(self.device()).copy("contiguous", self.src())?;
        Ok(Tensor::from_storage(copy, self.shape().clone()))
    }

    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor { storage: self.storage.clone(), layout }
    }

    /// Reshape without copying when the layout allows, else copy.
    pub(crate) fn reshape_raw(&self, shape: Shape) -> Result<Tensor> {
        if shape.numel() != self.numel() {
            return Err(Error::ShapeMismatch {
                op: "reshape",
                lhs: Box::new(self.shape().clone()),
                rhs: Box::new(shape),
            });
        }
        shape.check("reshape", self.dtype())?;
        if let Some(strides) = self.layout.view_strides(&shape) {
            return Ok(self.with_layout(Layout { strides, shape, offset: self.layout.offset }));
        }
        let base = self.contiguous()?;
        Ok(Tensor {
            storage: base.storage,
            layout: Layout { strides: shape.contiguous_strides(), shape, offset: base.layout.offset },
        })
    }

    pub(crate) fn permute_raw(&self, perm: &[usize]) -> Result<Tensor> {
        let r = self.rank();
        let mut seen: SmallVec<[bool; 6]> = SmallVec::from_elem(false, r);
        if perm.len() != r || perm.iter().any(|&p| p >= r || std::mem::replace(&mut seen[p], true)) {
            return Err(Error::invalid_arg("permute", format!("{perm:?} is not a permutation of 0..{r}")));
        }
        let shape = Shape(perm.iter().map(|&p| self.dims()[p]).collect());
        let strides = perm.iter().map(|&p| self.layout.strides[p]).collect();
        Ok(self.with_layout(Layout { shape, strides, offset: self.layout.offset }))
    }

    pub(crate) fn narrow_raw(&self, axis: usize, start: usize, len: usize) -> Result<Tensor> {
        let size = self.dims()[crate::layout::check_axis("narrow", axis, self.rank())?];
        if start.checked_add(len).is_none_or(|e| e > size) {
            return Err(narrow_out_of_range(axis, start, len, size));
        }
        let mut l = self.layout.clone();
        l.shape.0[axis] = len;
        if len > 0 {
            l.offset += start * l.strides[axis];
        }
        Ok(self.with_layout(l))
    }

    pub(crate) fn broadcast_raw(&self, shape: &Shape) -> Result<Tensor> {
        shape.check("broadcast_to", self.dtype())?;
        let b = Shape::broadcast("broadcast_to", self.shape(), shape)?;
        if &b != shape {
            return Err(Error::ShapeMismatch {
                op: "broadcast_to",
                lhs: Box::new(self.shape().clone()),
                rhs: Box::new(shape.clone()),
            });
        }
        let strides = self.layout.broadcast_strides(shape);
        Ok(self.with_layout(Layout { shape: shape.clone(), strides, offset: self.layout.offset }))
    }

    /// A copy converted to `dtype` (no copy when it already is).
    pub(crate) fn cast_raw(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        self.host_only("cast")?;
        Tensor::from_buffer(crate::cpu::shape::cast(self.src(), dtype)?, self.shape().clone())
    }

    /// A copy on `device` (the same handle when already there). To the CPU
    /// from a device: the storage is copied to the host and the layout kept.
    /// To a CUDA device: a contiguous copy in its memory, or
    /// [`Error::DeviceUnavailable`] saying what this machine lacks.
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        match device {
            Device::Cpu => Ok(self.on_host()?.into_owned()),
            Device::Cuda(i) => crate::cuda::to_cuda(self, i),
        }
    }

    // ----- in place ---------------------------------------------------------

    /// Mutable access to this tensor's elements as a contiguous slice. When
    /// the storage is shared with another handle or the tensor is a strided
    /// view, it first gets a private contiguous copy (copy-on-write), so no
    /// other tensor ever sees the change.
    pub fn make_mut<T: CpuElement>(&mut self) -> Result<&mut [T]> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DTypeMismatch { op: "make_mut", lhs: self.dtype(), rhs: T::DTYPE });
        }
        self.host_only("make_mut")?;
        let whole = self.is_contiguous() && self.layout.offset == 0 && self.numel() == self.storage.len();
        if !whole || Arc::strong_count(&self.storage) != 1 {
            *self = Tensor::from_vec(self.to_vec::<T>()?, self.shape().clone())?;
        }
        let st = Arc::get_mut(&mut self.storage).expect("internal: unique after copy");
        let host = st.host_mut().expect("internal: a host tensor after the device check");
        Ok(T::slice_mut(host).expect("internal: dtype checked"))
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SHOW: usize = 8;
        write!(f, "Tensor[{}, {}, {}]", self.shape(), self.dtype(), self.device())?;
        // Debug never fails: a device tensor that cannot be copied out is
        // shown without its values.
        let Ok(host) = self.on_host() else { return write!(f, " <values on {}>", self.device()) };
        write!(f, " {:?}", host.narrow_flat_preview(SHOW.min(self.numel())))?;
        if self.numel() > SHOW {
            write!(f, " ...")?;
        }
        Ok(())
    }
}

impl Tensor {
    fn narrow_flat_preview(&self, n: usize) -> Vec<f64> {
        let mut out = Vec::with_capacity(n);
        with_dtype!(self.dtype(), T => self.nd().runs(0, n, |_, [o], len, [s]| {
            let src = self.storage_slice::<T>();
            for i in 0..len {
                out.push(src[o + i * s].to_f64());
            }
        }));
        out
    }
}
