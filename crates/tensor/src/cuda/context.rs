//! One CUDA device as the backend holds it: a context and its default
//! stream, the caching allocator, the kernels loaded into the context, and
//! a cuBLAS handle bound to the stream, each created once per process and
//! shared by every tensor on the device.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaModule, CudaStream, DriverError};

use super::alloc::{AllocFailure, CachingAllocator, DriverFailure, SegmentDriver};
use crate::memory::{track_alloc_retry, track_oom, track_segment_alloc, track_segment_free};
use crate::{Device, Error, Result};

/// The most CUDA devices the backend addresses (as the memory counters do).
const MAX_DEVICES: usize = 16;

type Slot = OnceLock<std::result::Result<Arc<CudaDevice>, String>>;
/// Each device, opened (or found missing) once per process.
static DEVICES: [Slot; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];

/// Segments straight from the driver, counted on the device's counters.
#[derive(Debug)]
pub(crate) struct DriverSegments {
    ctx: Arc<CudaContext>,
    device: Device,
}

impl SegmentDriver for DriverSegments {
    fn alloc(&mut self, bytes: usize) -> std::result::Result<u64, DriverFailure> {
        self.ctx.bind_to_thread().map_err(|e| DriverFailure::Other(e.to_string()))?;
        // SAFETY: a plain cuMemAlloc in the bound context; the pointer is
        // freed once, by `free` below.
        match unsafe { result::malloc_sync(bytes) } {
            Ok(p) => {
                track_segment_alloc(self.device, bytes);
                Ok(p)
            }
            Err(DriverError(sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY)) => Err(DriverFailure::OutOfMemory),
            Err(e) => Err(DriverFailure::Other(e.to_string())),
        }
    }
    fn free(&mut self, ptr: u64, bytes: usize) {
        // Work queued on the stream may still read the segment.
        let _ = self.ctx.synchronize();
        // SAFETY: `ptr` came from malloc_sync in this context and no block
        // of it is in use (the allocator only frees whole idle segments).
        let _ = unsafe { result::free_sync(ptr) };
        track_segment_free(self.device, bytes);
    }
}

/// A CUDA device in use.
#[derive(Debug)]
pub struct CudaDevice {
    pub(crate) device: Device,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    /// `compute_XY` for NVRTC.
    pub(crate) arch: String,
    alloc: Mutex<CachingAllocator<DriverSegments>>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    functions: Mutex<HashMap<(&'static str, String), CudaFunction>>,
    /// The cuBLAS handle, created on the first product (or found missing).
    blas: OnceLock<std::result::Result<Arc<CudaBlas>, String>>,
    /// Whether f32 products may use TF32 tensor cores (off unless asked).
    tf32: AtomicBool,
}

/// `CUBLAS_TF32_TENSOR_OP_MATH` when `tf32`, else `CUBLAS_DEFAULT_MATH`.
fn set_math_mode(blas: &CudaBlas, tf32: bool) -> std::result::Result<(), cudarc::cublas::result::CublasError> {
    use cudarc::cublas::sys::cublasMath_t::{CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH};
    let mode = if tf32 { CUBLAS_TF32_TENSOR_OP_MATH } else { CUBLAS_DEFAULT_MATH };
    // SAFETY: a live handle; the mode is one of cuBLAS's enum values.
    unsafe { cudarc::cublas::sys::cublasSetMathMode(*blas.handle(), mode) }.result()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn driver_error(what: &str, e: DriverError) -> Error {
    Error::Cuda(format!("{what}: {e}"))
}

impl CudaDevice {
    fn open(ordinal: usize) -> std::result::Result<CudaDevice, String> {
        let device = Device::Cuda(ordinal);
        // cudarc panics on a symbol the driver lacks; that is an error here.
        let opened = std::panic::catch_unwind(AssertUnwindSafe(|| -> std::result::Result<_, DriverError> {
            let ctx = CudaContext::new(ordinal)?;
            let (major, minor) = ctx.compute_capability()?;
            Ok((ctx, major, minor))
        }));
        let (ctx, major, minor) = match opened {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return Err(format!("creating a context failed: {e}")),
            Err(_) => return Err("the CUDA driver lacks an entry point cudarc needs".into()),
        };
        let stream = ctx.default_stream();
        // NVRTC 12 knows no architecture past the ones it ships; PTX for
        // compute_90 runs on anything newer by the driver's JIT.
        let cc = (major * 10 + minor).min(90);
        Ok(CudaDevice {
            device,
            alloc: Mutex::new(CachingAllocator::new(DriverSegments { ctx: ctx.clone(), device })),
            ctx,
            stream,
            arch: format!("compute_{cc}"),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            blas: OnceLock::new(),
            tf32: AtomicBool::new(false),
        })
    }

    /// The device `ordinal`, opened on first use; an error naming what is
    /// missing otherwise.
    pub(crate) fn get(ordinal: usize) -> Result<Arc<CudaDevice>> {
        let unavailable = |reason: String| Error::DeviceUnavailable { device: Device::Cuda(ordinal), reason };
        match super::driver::probe() {
            super::driver::DriverProbe::Devices(n) if ordinal < *n && ordinal < MAX_DEVICES => {}
            _ => return Err(unavailable(super::driver::unavailable_reason(ordinal))),
        }
        DEVICES[ordinal].get_or_init(|| CudaDevice::open(ordinal).map(Arc::new)).clone().map_err(unavailable)
    }

    /// The device `ordinal` if it has been opened already (asking opens nothing).
    pub(crate) fn opened(ordinal: usize) -> Option<Arc<CudaDevice>> {
        DEVICES.get(ordinal)?.get()?.as_ref().ok().cloned()
    }

    /// A block of at least `bytes` from the cache (or the driver): its
    /// address and whether the driver had to be asked. Zero bytes is the
    /// null address and no block.
    pub(crate) fn alloc(&self, bytes: usize) -> Result<(u64, bool)> {
        if bytes == 0 {
            return Ok((0, false));
        }
        let mut a = lock(&self.alloc);
        let before = a.stats();
        let out = a.alloc(bytes);
        let after = a.stats();
        for _ in before.alloc_retries..after.alloc_retries {
            track_alloc_retry(self.device);
        }
        for _ in before.ooms..after.ooms {
            track_oom(self.device);
        }
        drop(a);
        match out {
            Ok((p, _, fresh)) => Ok((p, fresh)),
            Err(AllocFailure::OutOfMemory { requested }) => Err(crate::memory::out_of_memory(self.device, requested)),
            Err(AllocFailure::Driver(why)) => Err(Error::Cuda(format!("allocating {bytes} bytes: {why}"))),
        }
    }

    /// Returns a block to the cache.
    pub(crate) fn free(&self, ptr: u64) {
        if ptr != 0 {
            lock(&self.alloc).free(ptr);
        }
    }

    /// Returns every idle cached segment to the driver.
    pub(crate) fn empty_cache(&self) {
        lock(&self.alloc).empty_cache();
    }

    /// The allocator's own counters.
    pub(crate) fn alloc_stats(&self) -> (super::alloc::AllocStats, [(usize, usize); 2]) {
        let a = lock(&self.alloc);
        (a.stats(), a.cached())
    }

    /// Resets the allocator's peaks.
    pub(crate) fn reset_peaks(&self) {
        lock(&self.alloc).reset_peaks();
    }

    /// The kernel `name` of the kernel file `file`, compiled by NVRTC for
    /// this device and loaded on first use.
    pub(crate) fn function(&self, file: &'static str, name: &str) -> Result<CudaFunction> {
        let key = (file, name.to_string());
        if let Some(f) = lock(&self.functions).get(&key) {
            return Ok(f.clone());
        }
        let module = {
            let mut modules = lock(&self.modules);
            match modules.get(file) {
                Some(m) => m.clone(),
                None => {
                    let ptx = super::cached_ptx(file, &self.arch)?;
                    let m = self
                        .ctx
                        .load_module(cudarc::nvrtc::Ptx::from_src(ptx.to_string()))
                        .map_err(|e| driver_error(&format!("loading {file}"), e))?;
                    modules.insert(file, m.clone());
                    m
                }
            }
        };
        let f = module.load_function(name).map_err(|e| driver_error(&format!("{file}: kernel {name}"), e))?;
        lock(&self.functions).insert(key, f.clone());
        Ok(f)
    }

    /// The device's cuBLAS handle, created on first use and bound to the
    /// device's stream, so products queue behind the kernels before them.
    ///
    /// The math mode is `CUBLAS_DEFAULT_MATH`: f32 products run in f32
    /// (TF32 is used only under `CUBLAS_TF32_TENSOR_OP_MATH` or a
    /// `_FAST_TF32` compute type), while f16/bf16 products with f32 compute
    /// may still use tensor cores. (`CUBLAS_PEDANTIC_MATH` would also keep
    /// those off the tensor cores.) [`CudaDevice::set_tf32`] switches f32
    /// products to `CUBLAS_TF32_TENSOR_OP_MATH` and back.
    /// A missing cuBLAS, or one lacking an entry point cudarc looks up, is
    /// an error here rather than cudarc's panic.
    pub(crate) fn blas(&self) -> Result<Arc<CudaBlas>> {
        let made = self.blas.get_or_init(|| {
            let lib = super::driver::cublas_library()?;
            self.ctx.bind_to_thread().map_err(|e| format!("binding the context: {e}"))?;
            let stream = self.stream.clone();
            let created = std::panic::catch_unwind(AssertUnwindSafe(move || {
                let blas = CudaBlas::new(stream)?;
                set_math_mode(&blas, self.tf32.load(Ordering::Relaxed))?;
                Ok::<_, cudarc::cublas::result::CublasError>(blas)
            }));
            match created {
                Ok(Ok(blas)) => Ok(Arc::new(blas)),
                Ok(Err(e)) => Err(format!("creating a cuBLAS handle ({lib}) failed: {e}")),
                Err(_) => Err(format!("{lib} lacks an entry point cudarc needs")),
            }
        });
        made.clone().map_err(|why| Error::Cuda(format!("cuBLAS: {why}")))
    }

    /// Lets f32 products use TF32 tensor cores (`allow`) or keeps them in
    /// f32; the handle's math mode changes at once, for every later product.
    pub(crate) fn set_tf32(&self, allow: bool) -> Result<()> {
        self.tf32.store(allow, Ordering::Relaxed);
        let blas = self.blas()?;
        self.bind()?;
        set_math_mode(&blas, allow).map_err(|e| Error::Cuda(format!("cuBLAS: setting the math mode: {e}")))
    }

    /// Whether f32 products may use TF32.
    pub(crate) fn tf32(&self) -> bool {
        self.tf32.load(Ordering::Relaxed)
    }

    /// Binds the context to the calling thread (every raw driver call needs it).
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| driver_error("binding the context", e))
    }
}
