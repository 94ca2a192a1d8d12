//! The CUDA launches of the layout ops that copy: a strided view's
//! contiguous copy and its cast to another dtype, and the joining ops
//! (concat, and so stack, and pad): the output is allocated once and each
//! input is copied into its region, strided in and strided out, by one
//! `place` kernel of `elementwise.cu`; a region that is one dense run on
//! both sides is a plain device copy.

use std::sync::Arc;

use cudarc::driver::result;

use super::buffer::{tensor_of, CudaBuffer};
use super::context::{driver_error, CudaDevice};
use super::launch::{device_of, dims_i64, info_array, launch, Arg};
use crate::{DType, Error, Layout, Result, Shape, Tensor};

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
    let (_, p) = device_of(op, t)?;
    Ok(p + (t.layout().offset * t.dtype().size_in_bytes()) as u64)
}

/// Copies `x` into the output at device address `at`, its elements placed
/// at the output's `strides`.
pub(crate) fn place(op: &'static str, dev: &Arc<CudaDevice>, x: &Tensor, at: u64, strides: &[usize]) -> Result<()> {
    let n = x.numel();
    if n == 0 {
        return Ok(());
    }
    let from = first_element(op, x)?;
    let region = Layout { shape: x.shape().clone(), strides: strides.iter().copied().collect(), offset: 0 };
    if x.is_contiguous() && region.is_contiguous() {
        // SAFETY: both ranges hold `n` elements (the output's region was
        // sized by the caller's shape rule) and the stream is the device's.
        unsafe { result::memcpy_dtod_async(at, from, n * x.dtype().size_in_bytes(), dev.stream.cu_stream()) }
            .map_err(|e| driver_error("device copy", e))?;
        return Ok(());
    }
    let mut v = dims_i64(x.shape());
    v.extend(x.strides().iter().map(|&s| s as i64));
    v.extend(strides.iter().map(|&s| s as i64));
    let info = info_array(dev, &v)?;
    let args = [Arg::I64(n as i64), Arg::I32(x.rank() as i32), Arg::Ptr(info.ptr()), Arg::Ptr(from), Arg::Ptr(at)];
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

/// `xs` joined along `axis` into `shape`, which the op computed and checked.
pub(crate) fn concat(axis: usize, xs: &[&Tensor], shape: Shape) -> Result<Tensor> {
    let first = xs[0];
    let n = shape.numel();
    let (dev, _) = device_of("concat", first)?;
    let (out, _) = CudaBuffer::alloc(&dev, first.dtype(), n)?;
    // The parts tile the output, so nothing needs zeroing first.
    let strides = shape.contiguous_strides();
    let size = first.dtype().size_in_bytes();
    let mut at = 0;
    for x in xs {
        place("concat", &dev, x, out.ptr() + (at * strides[axis] * size) as u64, &strides)?;
        at += x.dims()[axis];
    }
    Ok(tensor_of(out, shape))
}

/// `x` placed at `start` of a zero tensor of `size` entries along `axis`.
pub(crate) fn pad(axis: usize, start: usize, size: usize, x: &Tensor) -> Result<Tensor> {
    let fits = axis < x.rank() && start.checked_add(x.dims()[axis]).is_some_and(|e| e <= size);
    if !fits {
        return Err(Error::invalid_arg("pad", format!("cannot place {} at {} in {}", x.shape(), start, size)));
    }
    let mut shape: Shape = x.shape().clone();
    shape.0[axis] = size;
    let n = shape.check("pad", x.dtype())?;
    let (dev, _) = device_of("pad", x)?;
    let bytes = x.dtype().size_in_bytes();
    let (out, _) = CudaBuffer::alloc(&dev, x.dtype(), n)?;
    fill_bytes(&dev, out.ptr(), 0, n * bytes)?;
    let strides = shape.contiguous_strides();
    place("pad", &dev, x, out.ptr() + (start * strides[axis] * bytes) as u64, &strides)?;
    Ok(tensor_of(out, shape))
}

/// A contiguous copy of a (strided) tensor; the same handle when it is
/// contiguous already, as on the CPU.
pub(crate) fn contiguous(x: &Tensor) -> Result<Tensor> {
    if x.is_contiguous() {
        return Ok(x.clone());
    }
    let suffix = match x.dtype() {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 | DType::BF16 => "u16",
        DType::I32 => "i32",
        DType::I64 => "i64",
    };
    let (dev, xp) = device_of("contiguous", x)?;
    let n = x.numel();
    let (out, _) = CudaBuffer::alloc(&dev, x.dtype(), n)?;
    if n > 0 {
        let mut v = dims_i64(x.shape());
        v.extend(x.strides().iter().map(|&s| s as i64));
        let info = info_array(&dev, &v)?;
        let args = [
            Arg::I64(n as i64),
            Arg::I32(x.rank() as i32),
            Arg::Ptr(info.ptr()),
            Arg::Ptr(xp),
            Arg::I64(x.layout().offset as i64),
            Arg::Ptr(out.ptr()),
        ];
        launch(&dev, "elementwise.cu", &format!("copy_strided_{suffix}"), n, &args)?;
    }
    Ok(tensor_of(out, x.shape().clone()))
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

/// `x` converted to `dtype` (strided views are made contiguous first, as
/// the cast kernels read dense input).
pub(crate) fn cast(x: &Tensor, dtype: DType) -> Result<Tensor> {
    if dtype == x.dtype() {
        return Ok(x.clone());
    }
    let x = contiguous(x)?;
    let (dev, xp) = device_of("cast", &x)?;
    let n = x.numel();
    let (out, _) = CudaBuffer::alloc(&dev, dtype, n)?;
    if n > 0 {
        let at = xp + (x.layout().offset * x.dtype().size_in_bytes()) as u64;
        let name = format!("cast_{}_{}", any_suffix(x.dtype()), any_suffix(dtype));
        launch(&dev, "cast.cu", &name, n, &[Arg::I64(n as i64), Arg::Ptr(at), Arg::Ptr(out.ptr())])?;
    }
    Ok(tensor_of(out, x.shape().clone()))
}
