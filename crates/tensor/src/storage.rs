//! Storage: the bytes behind one or more tensors, counted by the allocator.

use half::{bf16, f16};

use crate::memory::{out_of_memory, track_alloc, track_free};
use crate::{DType, Device, Element, Result};

pub(crate) use crate::cache::try_vec;

/// `n` copies of `value`, or an out-of-memory error.
pub(crate) fn try_filled<T: Copy>(n: usize, value: T) -> Result<Vec<T>> {
    crate::cache::filled(n, value)
}

/// From this size on, zeros come from the allocator's zeroed memory: fresh
/// pages from the system are zero already, so a large buffer is not written
/// at all (as with `vec![0.0; n]`), and a buffer that is only partly
/// touched (a sparse gradient) never costs its untouched pages.
const LAZY_ZEROS_MIN_BYTES: usize = 32 << 20;

/// `n` elements of all-zero bytes: written into a (possibly cached) buffer
/// below [`LAZY_ZEROS_MIN_BYTES`], lazily zeroed pages from the allocator
/// from there on.
///
/// # Safety
///
/// All-zero bytes must be a valid `T`.
unsafe fn try_zeroed<T>(n: usize) -> Result<Vec<T>> {
    if n == 0 || std::mem::size_of::<T>() == 0 {
        return Ok(Vec::new());
    }
    let bytes = n.saturating_mul(std::mem::size_of::<T>());
    if bytes < LAZY_ZEROS_MIN_BYTES {
        // Written now, in a cached buffer when there is one: see `cache::filled`.
        let mut v = crate::cache::take::<T>(n)?;
        // SAFETY: the vector has capacity for `n` elements, all of which are
        // set to zero bytes, a valid `T` by the caller's promise.
        unsafe {
            std::ptr::write_bytes(v.as_mut_ptr(), 0, n);
            v.set_len(n);
        }
        return Ok(v);
    }
    let oom = || out_of_memory(Device::Cpu, bytes);
    let layout = std::alloc::Layout::array::<T>(n).map_err(|_| oom())?;
    // SAFETY: the layout has a non-zero size (n > 0 and T is not zero-sized).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return Err(oom());
    }
    crate::cache::fresh(ptr as usize, bytes);
    // SAFETY: `ptr` comes from the global allocator with T's array layout for
    // `n` elements (what Vec frees with), and its n zeroed elements are valid
    // values by the caller's promise.
    Ok(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// A host buffer of one dtype.
#[derive(Debug, Clone)]
pub enum CpuBuffer {
    /// f32 elements.
    F32(Vec<f32>),
    /// f64 elements.
    F64(Vec<f64>),
    /// f16 elements.
    F16(Vec<f16>),
    /// bf16 elements.
    BF16(Vec<bf16>),
    /// i32 elements.
    I32(Vec<i32>),
    /// i64 elements.
    I64(Vec<i64>),
}

impl CpuBuffer {
    /// The buffer's dtype.
    pub fn dtype(&self) -> DType {
        match self {
            CpuBuffer::F32(_) => DType::F32,
            CpuBuffer::F64(_) => DType::F64,
            CpuBuffer::F16(_) => DType::F16,
            CpuBuffer::BF16(_) => DType::BF16,
            CpuBuffer::I32(_) => DType::I32,
            CpuBuffer::I64(_) => DType::I64,
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            CpuBuffer::F32(v) => v.len(),
            CpuBuffer::F64(v) => v.len(),
            CpuBuffer::F16(v) => v.len(),
            CpuBuffer::BF16(v) => v.len(),
            CpuBuffer::I32(v) => v.len(),
            CpuBuffer::I64(v) => v.len(),
        }
    }
    /// Address of the first element (0 when empty), an identity for the
    /// allocation.
    pub(crate) fn addr(&self) -> usize {
        if self.is_empty() {
            return 0;
        }
        match self {
            CpuBuffer::F32(v) => v.as_ptr() as usize,
            CpuBuffer::F64(v) => v.as_ptr() as usize,
            CpuBuffer::F16(v) => v.as_ptr() as usize,
            CpuBuffer::BF16(v) => v.as_ptr() as usize,
            CpuBuffer::I32(v) => v.as_ptr() as usize,
            CpuBuffer::I64(v) => v.as_ptr() as usize,
        }
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// A zero-filled buffer of `n` elements, or
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the system
    /// cannot provide it.
    pub fn zeros(dtype: DType, n: usize) -> Result<Self> {
        // SAFETY: zero bytes are 0 (or +0.0) in every one of these types.
        unsafe {
            Ok(match dtype {
                DType::F32 => CpuBuffer::F32(try_zeroed(n)?),
                DType::F64 => CpuBuffer::F64(try_zeroed(n)?),
                DType::F16 => CpuBuffer::F16(try_zeroed::<f16>(n)?),
                DType::BF16 => CpuBuffer::BF16(try_zeroed::<bf16>(n)?),
                DType::I32 => CpuBuffer::I32(try_zeroed(n)?),
                DType::I64 => CpuBuffer::I64(try_zeroed(n)?),
            })
        }
    }
}

/// Typed access to a [`CpuBuffer`].
pub trait CpuElement: Element {
    /// The slice, if the buffer holds this type.
    fn slice(b: &CpuBuffer) -> Option<&[Self]>;
    /// The mutable slice, if the buffer holds this type.
    fn slice_mut(b: &mut CpuBuffer) -> Option<&mut [Self]>;
    /// Wraps a vector.
    fn wrap(v: Vec<Self>) -> CpuBuffer;
}

macro_rules! cpu_element {
    ($t:ty, $v:ident) => {
        impl CpuElement for $t {
            fn slice(b: &CpuBuffer) -> Option<&[Self]> {
                match b {
                    CpuBuffer::$v(v) => Some(v),
                    _ => None,
                }
            }
            fn slice_mut(b: &mut CpuBuffer) -> Option<&mut [Self]> {
                match b {
                    CpuBuffer::$v(v) => Some(v),
                    _ => None,
                }
            }
            fn wrap(v: Vec<Self>) -> CpuBuffer {
                CpuBuffer::$v(v)
            }
        }
    };
}
cpu_element!(f32, F32);
cpu_element!(f64, F64);
cpu_element!(f16, F16);
cpu_element!(bf16, BF16);
cpu_element!(i32, I32);
cpu_element!(i64, I64);

/// Memory on a device other than the host, as that device's backend holds
/// it. The CPU never reads it directly: kernels of its own backend do, and
/// [`DeviceBuffer::to_host`] copies it out.
pub trait DeviceBuffer: std::fmt::Debug + Send + Sync + 'static {
    /// The device it lives on.
    fn device(&self) -> Device;
    /// Its element type.
    fn dtype(&self) -> DType;
    /// Number of elements.
    fn len(&self) -> usize;
    /// True when it holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// A host copy of every element.
    fn to_host(&self) -> Result<CpuBuffer>;
    /// The backend's own type, for its kernels to downcast to.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// The bytes of a storage: a host buffer, or a buffer a device backend owns.
#[derive(Debug)]
enum Buffer {
    Host(CpuBuffer),
    Device(Box<dyn DeviceBuffer>),
}

/// The memory behind tensors. Its bytes are counted live from creation to
/// drop, on its device's counters.
#[derive(Debug)]
pub struct Storage {
    buf: Buffer,
    device: Device,
    bytes: usize,
}

impl Storage {
    /// Takes ownership of a host buffer and counts it.
    pub fn cpu(buf: CpuBuffer) -> Self {
        let bytes = buf.len() * buf.dtype().size_in_bytes();
        // A buffer from the cache is reserved again, but is no system
        // allocation.
        let reused = crate::cache::adopt(buf.addr(), bytes);
        track_alloc(Device::Cpu, bytes, true);
        if reused {
            crate::memory::track_adopted(Device::Cpu);
        }
        Storage { buf: Buffer::Host(buf), device: Device::Cpu, bytes }
    }
    /// Takes ownership of a device buffer and counts its bytes as allocated
    /// on its device. `from_system` says whether the backend's allocator
    /// had to ask its driver for them (a cache miss) or reused cached
    /// memory; the allocator itself counts the memory it returns to the
    /// driver, so dropping the storage only makes the bytes unallocated.
    pub fn on_device(buf: Box<dyn DeviceBuffer>, from_system: bool) -> Self {
        let (device, bytes) = (buf.device(), buf.len() * buf.dtype().size_in_bytes());
        track_alloc(device, bytes, from_system);
        Storage { buf: Buffer::Device(buf), device, bytes }
    }
    /// The host buffer; `None` for device memory.
    pub fn host(&self) -> Option<&CpuBuffer> {
        match &self.buf {
            Buffer::Host(b) => Some(b),
            Buffer::Device(_) => None,
        }
    }
    /// The host buffer, mutably; `None` for device memory.
    pub fn host_mut(&mut self) -> Option<&mut CpuBuffer> {
        match &mut self.buf {
            Buffer::Host(b) => Some(b),
            Buffer::Device(_) => None,
        }
    }
    /// The device buffer; `None` for host memory.
    pub fn device_buffer(&self) -> Option<&dyn DeviceBuffer> {
        match &self.buf {
            Buffer::Host(_) => None,
            Buffer::Device(b) => Some(b.as_ref()),
        }
    }
    /// The elements on the host: the buffer itself, or a copy of the
    /// device's.
    pub fn to_host(&self) -> Result<std::borrow::Cow<'_, CpuBuffer>> {
        match &self.buf {
            Buffer::Host(b) => Ok(std::borrow::Cow::Borrowed(b)),
            Buffer::Device(b) => b.to_host().map(std::borrow::Cow::Owned),
        }
    }
    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }
    /// The dtype.
    pub fn dtype(&self) -> DType {
        match &self.buf {
            Buffer::Host(b) => b.dtype(),
            Buffer::Device(b) => b.dtype(),
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.buf {
            Buffer::Host(b) => b.len(),
            Buffer::Device(b) => b.len(),
        }
    }
    /// True when it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes counted for this storage.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        let buf = match std::mem::replace(&mut self.buf, Buffer::Host(CpuBuffer::F32(Vec::new()))) {
            Buffer::Host(b) => b,
            Buffer::Device(b) => {
                // The backend's buffer returns its block to its allocator
                // as it drops; the block stays reserved there.
                drop(b);
                track_free(self.device, self.bytes, false);
                return;
            }
        };
        // (`host_mut` could have resized it: then it is simply freed.)
        let exact = buf.len() * buf.dtype().size_in_bytes() == self.bytes;
        let cached = exact
            && match buf {
                CpuBuffer::F32(v) => crate::cache::give(v),
                CpuBuffer::F64(v) => crate::cache::give(v),
                CpuBuffer::F16(v) => crate::cache::give(v),
                CpuBuffer::BF16(v) => crate::cache::give(v),
                CpuBuffer::I32(v) => crate::cache::give(v),
                CpuBuffer::I64(v) => crate::cache::give(v),
            };
        // A cached buffer stays reserved.
        track_free(self.device, self.bytes, !cached);
    }
}
