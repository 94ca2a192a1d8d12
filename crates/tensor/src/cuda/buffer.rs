//! Tensor storage in CUDA device memory: a block of the device's caching
//! allocator, returned to it when the buffer drops.

use std::sync::Arc;

use cudarc::driver::result;
use half::{bf16, f16};

use super::context::{driver_error, CudaDevice};
use crate::storage::{CpuBuffer, DeviceBuffer, Storage};
use crate::{DType, Device, Error, Layout, Result, Shape, Tensor};

/// `len` elements of one dtype on a CUDA device.
#[derive(Debug)]
pub struct CudaBuffer {
    pub(crate) dev: Arc<CudaDevice>,
    ptr: u64,
    dtype: DType,
    len: usize,
}

impl CudaBuffer {
    /// An uninitialised buffer and whether the driver was asked for memory.
    pub(crate) fn alloc(dev: &Arc<CudaDevice>, dtype: DType, len: usize) -> Result<(CudaBuffer, bool)> {
        let bytes = len
            .checked_mul(dtype.size_in_bytes())
            .ok_or_else(|| crate::memory::out_of_memory(dev.device, usize::MAX))?;
        let (ptr, fresh) = dev.alloc(bytes)?;
        Ok((CudaBuffer { dev: dev.clone(), ptr, dtype, len }, fresh))
    }

    /// The device address of the first element (0 when empty).
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        self.dev.free(self.ptr);
    }
}

/// Copies `n` elements from device address `src` into a host vector.
fn download<T: Copy>(src: u64, n: usize, zero: T) -> Result<Vec<T>> {
    let mut v = crate::storage::try_filled(n, zero)?;
    if n > 0 {
        // SAFETY: `src` holds at least `n` elements of `T` (the buffer's
        // length), and the context is bound by the caller.
        unsafe { result::memcpy_dtoh_sync(&mut v[..], src) }.map_err(|e| driver_error("copy to host", e))?;
    }
    Ok(v)
}

impl DeviceBuffer for CudaBuffer {
    fn device(&self) -> Device {
        self.dev.device
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn len(&self) -> usize {
        self.len
    }
    fn to_host(&self) -> Result<CpuBuffer> {
        self.dev.bind()?;
        self.dev.stream.synchronize().map_err(|e| driver_error("synchronize", e))?;
        let (p, n) = (self.ptr, self.len);
        Ok(match self.dtype {
            DType::F32 => CpuBuffer::F32(download(p, n, 0f32)?),
            DType::F64 => CpuBuffer::F64(download(p, n, 0f64)?),
            DType::F16 => CpuBuffer::F16(download(p, n, f16::ZERO)?),
            DType::BF16 => CpuBuffer::BF16(download(p, n, bf16::ZERO)?),
            DType::I32 => CpuBuffer::I32(download(p, n, 0i32)?),
            DType::I64 => CpuBuffer::I64(download(p, n, 0i64)?),
        })
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Wraps a buffer as a contiguous tensor of `shape`, counted on its device.
pub(crate) fn tensor_of(buf: CudaBuffer, shape: Shape) -> Tensor {
    // The allocator counts its own segments as reserved and as system
    // allocations, so the storage counts only live bytes.
    let storage = Storage::on_device(Box::new(buf), false);
    Tensor { storage: Arc::new(storage), layout: Layout::contiguous(shape) }
}

/// Wraps a buffer as a kernel's output storage, counted on its device.
pub(crate) fn storage_of(buf: CudaBuffer) -> Storage {
    // As in `tensor_of`: the allocator counts its segments itself.
    Storage::on_device(Box::new(buf), false)
}

/// The CUDA buffer behind a storage, when it has one.
pub(crate) fn buffer_of_storage(s: &Storage) -> Option<&CudaBuffer> {
    s.device_buffer()?.as_any().downcast_ref::<CudaBuffer>()
}

/// Copies the host slice `src` to a new buffer on `dev`.
fn upload_slice<T>(dev: &Arc<CudaDevice>, dtype: DType, src: &[T]) -> Result<CudaBuffer> {
    let (buf, _) = CudaBuffer::alloc(dev, dtype, src.len())?;
    if !src.is_empty() {
        dev.bind()?;
        // SAFETY: the block holds `src.len()` elements of `T`.
        unsafe { result::memcpy_htod_sync(buf.ptr, src) }.map_err(|e| driver_error("copy to device", e))?;
    }
    Ok(buf)
}

/// A copy of `t` (on any device) on CUDA device `ordinal`, contiguous.
pub(crate) fn to_cuda(t: &Tensor, ordinal: usize) -> Result<Tensor> {
    let dev = CudaDevice::get(ordinal)?;
    let host = t.to_device(Device::Cpu)?.contiguous()?;
    let storage = host.storage.host().ok_or_else(|| Error::Cuda("internal: a host copy is not on the host".into()))?;
    let range = host.layout.offset..host.layout.offset + host.numel();
    let buf = match storage {
        CpuBuffer::F32(v) => upload_slice(&dev, DType::F32, &v[range])?,
        CpuBuffer::F64(v) => upload_slice(&dev, DType::F64, &v[range])?,
        CpuBuffer::F16(v) => upload_slice(&dev, DType::F16, &v[range])?,
        CpuBuffer::BF16(v) => upload_slice(&dev, DType::BF16, &v[range])?,
        CpuBuffer::I32(v) => upload_slice(&dev, DType::I32, &v[range])?,
        CpuBuffer::I64(v) => upload_slice(&dev, DType::I64, &v[range])?,
    };
    Ok(tensor_of(buf, t.shape().clone()))
}
