//! The CUDA launches of the layout ops that copy: a strided view's
//! contiguous copy and its cast to another dtype, and the joining ops
//! (concat, and so stack, and pad): the output is allocated once and each
//! input is copied into its region, strided in and strided out, by one
//! `place` kernel of `elementwise.cu`; a region that is one dense run on
//! both sides is a plain device copy.

use std::sync::Arc;

use cudarc::driver::result;

use super::buffer::{storage_of, CudaBuffer};
use super::context::{driver_error, CudaDevice};
use super::launch::{device_of_src, dims_i64, info_array, launch, Arg};
use super::CudaBackend;
use crate::backend::{ShapeKernels, Src};
use crate::storage::Storage;
use crate::{DType, Layout, Result, Shape, Tensor};

impl ShapeKernels for CudaBackend {
    fn copy(&self, op: &'static str, x: Src<'_>) -> Result<Storage> {
        copy(op, x)
    }

    fn cast(&self, x: Src<'_>, dtype: DType) -> Result<Storage> {
        cast_src(x, dtype)
    }

    fn place(&self, op: &'static str, parts: &[(Src<'_>, usize)], shape: &Shape, zeroed: bool) -> Result<Storage> {
        place_parts(op, parts, shape, zeroed)
    }
}

/// The kernel-name suffix of the kernels that only move elements: the
/// value's width, so one kernel serves every dtype of that size.
pub(crate) fn width_suffix(dtype: DType) -> &'static str {
    match dtype.size_in_bytes() {
        2 => "u16",
        4 => "u32",
        _ => "u64",
    }
}

/// The kernel placing elements of `dtype`.
fn place_kernel(dtype: DType) -> String {
    format!("place_{}", width_suffix(dtype))
}

/// Every kernel this module launches, as `(file, entry)`.
pub(crate) fn kernels() -> Vec<(&'static str, String)> {
    [DType::F16, DType::F32, DType::F64].into_iter().map(|d| ("elementwise.cu", place_kernel(d))).collect()
}

/// The device address of `t`'s first element.
pub(crate) fn first_element(op: &'static str, t: &Tensor) -> Result<u64> {
    first_element_src(op, t.src())
}

/// The device address of the view `x`'s first element.
pub(crate) fn first_element_src(op: &'static str, x: Src<'_>) -> Result<u64> {
    let (_, p) = device_of_src(op, x)?;
    Ok(p + (x.layout.offset * x.dtype().size_in_bytes()) as u64)
}

/// Copies `x` into the output at device address `at`, its elements placed
/// at the output's `strides`.
pub(crate) fn place(op: &'static str, dev: &Arc<CudaDevice>, x: &Tensor, at: u64, strides: &[usize]) -> Result<()> {
    place_src(op, dev, x.src(), at, strides)
}

/// [`place`] of a view.
pub(crate) fn place_src(op: &'static str, dev: &Arc<CudaDevice>, x: Src<'_>, at: u64, strides: &[usize]) -> Result<()> {
    let n = x.numel();
    if n == 0 {
        return Ok(());
    }
    let from = first_element_src(op, x)?;
    let region = Layout { shape: x.shape().clone(), strides: strides.iter().copied().collect(), offset: 0 };
    if x.is_contiguous() && region.is_contiguous() {
        // SAFETY: both ranges hold `n` elements (the output's region was
        // sized by the caller's shape rule) and the stream is the device's.
        unsafe { result::memcpy_dtod_async(at, from, n * x.dtype().size_in_bytes(), dev.stream.cu_stream()) }
            .map_err(|e| driver_error("device copy", e))?;
        return Ok(());
    }
    let mut v = dims_i64(x.shape());
    v.extend(x.layout.strides.iter().map(|&s| s as i64));
    v.extend(strides.iter().map(|&s| s as i64));
    let info = info_array(dev, &v)?;
    let args =
        [Arg::I64(n as i64), Arg::I32(x.shape().rank() as i32), Arg::Ptr(info.ptr()), Arg::Ptr(from), Arg::Ptr(at)];
    launch(dev, "elementwise.cu", &place_kernel(x.dtype()), n, &args)
}

/// Sets the `bytes` bytes at `ptr` to `byte`, in stream order.
pub(crate) fn fill_bytes(dev: &CudaDevice, ptr: u64, byte: u8, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the caller's block holds `bytes` bytes.
    unsafe { result::memset_d8_async(ptr, byte, bytes, dev.stream.cu_stream()) }.map_err(|e| driver_error("memset", e))
}

/// A buffer of the contiguous `shape` with each part copied in from its
/// element offset; zeroed first unless the parts tile it.
fn place_parts(op: &'static str, parts: &[(Src<'_>, usize)], shape: &Shape, zeroed: bool) -> Result<Storage> {
    let first = parts[0].0;
    let n = shape.numel();
    let (dev, _) = device_of_src(op, first)?;
    let size = first.dtype().size_in_bytes();
    let (out, _) = CudaBuffer::alloc(&dev, first.dtype(), n)?;
    if zeroed {
        fill_bytes(&dev, out.ptr(), 0, n * size)?;
    }
    let strides = shape.contiguous_strides();
    for &(x, offset) in parts {
        place_src(op, &dev, x, out.ptr() + (offset * size) as u64, &strides)?;
    }
    Ok(storage_of(out))
}

/// A contiguous copy of a (strided) tensor; the same handle when it is
/// contiguous already, as on the CPU.
pub(crate) fn contiguous(x: &Tensor) -> Result<Tensor> {
    if x.is_contiguous() {
        return Ok(x.clone());
    }
    Ok(Tensor::from_storage(copy("contiguous", x.src())?, x.shape().clone()))
}

/// The elements of the view `x` in row-major order, by one strided copy.
pub(crate) fn copy(op: &'static str, x: Src<'_>) -> Result<Storage> {
    let suffix = match x.dtype() {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 | DType::BF16 => "u16",
        DType::I32 => "i32",
        DType::I64 => "i64",
    };
    let (dev, xp) = device_of_src(op, x)?;
    let n = x.numel();
    let (out, _) = CudaBuffer::alloc(&dev, x.dtype(), n)?;
    if n > 0 {
        let mut v = dims_i64(x.shape());
        v.extend(x.layout.strides.iter().map(|&s| s as i64));
        let info = info_array(&dev, &v)?;
        let args = [
            Arg::I64(n as i64),
            Arg::I32(x.shape().rank() as i32),
            Arg::Ptr(info.ptr()),
            Arg::Ptr(xp),
            Arg::I64(x.layout.offset as i64),
            Arg::Ptr(out.ptr()),
        ];
        launch(&dev, "elementwise.cu", &format!("copy_strided_{suffix}"), n, &args)?;
    }
    Ok(storage_of(out))
}

/// The kernel-name suffix of any dtype.
fn any_suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I32 => "i32",
        DType::I64 => "i64",
    }
}

/// The view `x` converted to `dtype` (strided views are made contiguous
/// first, as the cast kernels read dense input).
pub(crate) fn cast_src(x: Src<'_>, dtype: DType) -> Result<Storage> {
    let dense;
    let layout;
    let x = if x.is_contiguous() {
        x
    } else {
        dense = copy("contiguous", x)?;
        layout = Layout::contiguous(x.shape().clone());
        Src { storage: &dense, layout: &layout }
    };
    let (dev, xp) = device_of_src("cast", x)?;
    let n = x.numel();
    let (out, _) = CudaBuffer::alloc(&dev, dtype, n)?;
    if n > 0 {
        let at = xp + (x.layout.offset * x.dtype().size_in_bytes()) as u64;
        let name = format!("cast_{}_{}", any_suffix(x.dtype()), any_suffix(dtype));
        launch(&dev, "cast.cu", &name, n, &[Arg::I64(n as i64), Arg::Ptr(at), Arg::Ptr(out.ptr())])?;
    }
    Ok(storage_of(out))
}
