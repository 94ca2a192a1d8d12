//! The CUDA launches of the tensor ops: operands described as the kernels
//! of `kernels/` expect them (dims and strides in a small device array, a
//! base offset), an output allocated from the caching allocator, one launch.

use std::sync::Arc;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use half::{bf16, f16};

use super::buffer::{buffer_of, tensor_of, CudaBuffer};
use super::context::{driver_error, CudaDevice};
use crate::ops::binary::{Binary, Cmp};
use crate::ops::unary::Unary;
use crate::{DType, Error, Result, Shape, Tensor};

/// Threads a block for the elementwise kernels.
pub(crate) const BLOCK: u32 = 256;
/// Blocks at most: the kernels loop over the rest with a grid stride.
const MAX_BLOCKS: usize = 4096;

/// A kernel argument by value.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg {
    I64(i64),
    I32(i32),
    Ptr(u64),
    F64(f64),
}

/// The device a CUDA op runs on, from its first input.
pub(crate) fn device_of(op: &'static str, t: &Tensor) -> Result<(Arc<CudaDevice>, u64)> {
    // A device buffer of another backend (a test's stand-in) has no kernels here.
    let buf = buffer_of(t).ok_or(Error::Unsupported { op, device: t.device() })?;
    Ok((buf.dev.clone(), buf.ptr()))
}

/// Launches `name` of `file` over `n` elements with `args`.
pub(crate) fn launch(dev: &CudaDevice, file: &'static str, name: &str, n: usize, args: &[Arg]) -> Result<()> {
    let f = dev.function(file, name)?;
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, MAX_BLOCKS) as u32;
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let mut b = dev.stream.launch_builder(&f);
    for a in args {
        match a {
            Arg::I64(v) => b.arg(v),
            Arg::I32(v) => b.arg(v),
            Arg::Ptr(v) => b.arg(v),
            Arg::F64(v) => b.arg(v),
        };
    }
    // SAFETY: each kernel's argument list is the one its file's header
    // documents, and every pointer is a live block at least as large as
    // the kernel reads or writes (the sizes are computed from the layouts).
    unsafe { b.launch(cfg) }.map_err(|e| driver_error(&format!("launching {name}"), e))?;
    Ok(())
}

/// The kernel-name suffix of a float dtype.
pub(crate) fn float_suffix(op: &'static str, dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::F64 => Ok("f64"),
        DType::F16 => Ok("f16"),
        DType::BF16 => Ok("bf16"),
        // The CPU's words, so an error reads the same from either device.
        _ => Err(Error::UnsupportedDType { op, dtype, expected: "a float dtype" }),
    }
}

/// `t`'s strides as seen from `out` (numpy broadcasting: leading dims
/// missing and size-1 dims that broadcast get stride 0).
pub(crate) fn broadcast_strides(t: &Tensor, out: &Shape) -> Vec<i64> {
    let (r, rt) = (out.rank(), t.rank());
    (0..r)
        .map(|i| {
            if i < r - rt {
                return 0;
            }
            let j = i - (r - rt);
            if t.dims()[j] == 1 && out.dims()[i] != 1 {
                0
            } else {
                t.strides()[j] as i64
            }
        })
        .collect()
}

/// A device array of i64 (the kernels' `info`), freed when dropped.
pub(crate) fn info_array(dev: &Arc<CudaDevice>, values: &[i64]) -> Result<CudaBuffer> {
    let (buf, _) = CudaBuffer::alloc(dev, DType::I64, values.len())?;
    dev.bind()?;
    // SAFETY: the block holds `values.len()` i64s.
    unsafe { cudarc::driver::result::memcpy_htod_sync(buf.ptr(), values) }
        .map_err(|e| driver_error("copy of kernel dims", e))?;
    Ok(buf)
}

pub(crate) fn dims_i64(shape: &Shape) -> Vec<i64> {
    shape.dims().iter().map(|&d| d as i64).collect()
}

/// An elementwise function of one tensor.
/// Integers: neg and abs (wrapping) have kernels, as on the CPU.
pub(crate) fn unary(op: Unary, x: &Tensor) -> Result<Tensor> {
    let name = op.name();
    let suffix = match x.dtype() {
        d if d.is_int() && Unary::INT_KERNELS.contains(&op) => d.cuda_suffix(),
        d => float_suffix(name, d)?,
    };
    let (dev, xp) = device_of(name, x)?;
    let n = x.numel();
    let (out, _) = CudaBuffer::alloc(&dev, x.dtype(), n)?;
    if n > 0 {
        let (p0, p1) = match op {
            Unary::Powf(p) | Unary::AddScalar(p) | Unary::MulScalar(p) => (p, 0.0),
            Unary::Clamp(lo, hi) => (lo, hi),
            _ => (0.0, 0.0),
        };
        let info = if x.is_contiguous() {
            None
        } else {
            let mut v = dims_i64(x.shape());
            v.extend(x.strides().iter().map(|&s| s as i64));
            Some(info_array(&dev, &v)?)
        };
        let args = [
            Arg::I64(n as i64),
            Arg::I32(x.rank() as i32),
            Arg::Ptr(info.as_ref().map_or(0, CudaBuffer::ptr)),
            Arg::Ptr(xp),
            Arg::I64(x.layout().offset as i64),
            Arg::F64(p0),
            Arg::F64(p1),
            Arg::Ptr(out.ptr()),
        ];
        launch(&dev, "elementwise.cu", &format!("{name}_{suffix}"), n, &args)?;
    }
    Ok(tensor_of(out, x.shape().clone()))
}

/// The `info` of a two-operand kernel (dims, a's strides, b's strides), or
/// none when both operands are contiguous in the output's shape.
fn pair_info(dev: &Arc<CudaDevice>, a: &Tensor, b: Option<&Tensor>, shape: &Shape) -> Result<Option<CudaBuffer>> {
    let plain = |t: &Tensor| t.is_contiguous() && t.shape() == shape;
    if plain(a) && b.is_none_or(plain) {
        return Ok(None);
    }
    let mut v = dims_i64(shape);
    v.extend(broadcast_strides(a, shape));
    match b {
        Some(b) => v.extend(broadcast_strides(b, shape)),
        None => v.extend(std::iter::repeat_n(0, shape.rank())),
    }
    Ok(Some(info_array(dev, &v)?))
}

/// A two-operand kernel of elementwise.cu named `kernel`, broadcasting to `shape`.
fn pair(op: &'static str, kernel: &str, suffix: &str, a: &Tensor, b: &Tensor, shape: &Shape) -> Result<Tensor> {
    pair_flagged(op, kernel, suffix, a, b, shape, None)
}

/// [`pair`], with the address of a flag the kernel takes after the output.
fn pair_flagged(
    op: &'static str,
    kernel: &str,
    suffix: &str,
    a: &Tensor,
    b: &Tensor,
    shape: &Shape,
    flag: Option<u64>,
) -> Result<Tensor> {
    let (dev, ap) = device_of(op, a)?;
    let (_, bp) = device_of(op, b)?;
    let n = shape.numel();
    let (out, _) = CudaBuffer::alloc(&dev, a.dtype(), n)?;
    if n > 0 {
        let info = pair_info(&dev, a, Some(b), shape)?;
        let mut args = vec![
            Arg::I64(n as i64),
            Arg::I32(shape.rank() as i32),
            Arg::Ptr(info.as_ref().map_or(0, CudaBuffer::ptr)),
            Arg::Ptr(ap),
            Arg::I64(a.layout().offset as i64),
            Arg::Ptr(bp),
            Arg::I64(b.layout().offset as i64),
            Arg::Ptr(out.ptr()),
        ];
        args.extend(flag.map(Arg::Ptr));
        launch(&dev, "elementwise.cu", &format!("{kernel}_{suffix}"), n, &args)?;
    }
    Ok(tensor_of(out, shape.clone()))
}

/// An elementwise function of two tensors, broadcast to `shape`.
/// Integers: add, sub, mul and pow (wrapping), maximum and minimum have
/// kernels; division never gets here with integers (it runs in float32).
pub(crate) fn binary(op: Binary, a: &Tensor, b: &Tensor, shape: &Shape) -> Result<Tensor> {
    let name = crate::ops::Op::name(&op);
    if op == Binary::Pow && a.dtype().is_int() {
        return int_pow(a, b, shape);
    }
    let suffix = match a.dtype() {
        d if d.is_int() && Binary::INT_KERNELS.contains(&op) => d.cuda_suffix(),
        d => float_suffix(name, d)?,
    };
    pair(name, name, suffix, a, b, shape)
}

/// Integer `a ^ b`, wrapping, broadcast to `shape`. A negative exponent is
/// the CPU's error, naming the first one in the output's order: the kernel
/// records the lowest such position in a one-word flag, read once; the
/// exponent there is read back from `b`.
fn int_pow(a: &Tensor, b: &Tensor, shape: &Shape) -> Result<Tensor> {
    let (dev, bp) = device_of("pow", b)?;
    if shape.numel() == 0 {
        return pair("pow", "pow", a.dtype().cuda_suffix(), a, b, shape);
    }
    let (flag, _) = CudaBuffer::alloc(&dev, DType::I64, 1)?;
    // All ones: no negative exponent yet (the kernel takes the minimum).
    super::shape::fill_bytes(&dev, flag.ptr(), 0xff, 8)?;
    let out = pair_flagged("pow", "pow", a.dtype().cuda_suffix(), a, b, shape, Some(flag.ptr()))?;
    dev.bind()?;
    let mut bad = [0u64];
    // SAFETY: the flag is one u64; the synchronous copy waits for the
    // kernel queued before it on the device's stream.
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut bad, flag.ptr()) }
        .map_err(|e| driver_error("reading the pow flag", e))?;
    if bad[0] == u64::MAX {
        return Ok(out);
    }
    // The exponent's element at that output position, through b's
    // broadcast strides.
    let (mut rest, strides) = (bad[0] as usize, broadcast_strides(b, shape));
    let mut at = b.layout().offset as i64;
    for (&d, &s) in shape.dims().iter().zip(&strides).rev() {
        at += (rest % d) as i64 * s;
        rest /= d;
    }
    let addr = bp + (at as u64) * b.dtype().size_in_bytes() as u64;
    // SAFETY: `at` is an element of b's view (a position of the output
    // mapped through b's strides), so it lies in b's buffer.
    let q = unsafe {
        if b.dtype() == DType::I32 {
            let mut v = [0i32];
            cudarc::driver::result::memcpy_dtoh_sync(&mut v, addr).map(|_| i64::from(v[0]))
        } else {
            let mut v = [0i64];
            cudarc::driver::result::memcpy_dtoh_sync(&mut v, addr).map(|_| v[0])
        }
    }
    .map_err(|e| driver_error("reading an exponent", e))?;
    Err(Binary::negative_int_power(q))
}

/// `g * (1 - y^2)`, broadcast to `shape`.
pub(crate) fn tanh_backward(y: &Tensor, g: &Tensor, shape: &Shape) -> Result<Tensor> {
    pair("tanh_backward", "tanh_bwd", float_suffix("tanh_backward", y.dtype())?, y, g, shape)
}

/// A comparison with a second tensor (broadcast to `shape`) or a scalar,
/// as 1 and 0 in the operands' dtype.
pub(crate) fn compare(
    op: &'static str,
    cmp: Cmp,
    a: &Tensor,
    b: Option<&Tensor>,
    scalar: f64,
    shape: &Shape,
) -> Result<Tensor> {
    if a.dtype().is_int() && b.is_none() {
        // As on the CPU: an integer tensor meets a float scalar in f64
        // (which holds every i32, and i64 below 2^53), and the mask goes
        // back to the integer dtype.
        let mask = compare(op, cmp, &cast(a, DType::F64)?, None, scalar, shape)?;
        return cast(&mask, a.dtype());
    }
    let suffix = match a.dtype() {
        d if d.is_int() => d.cuda_suffix(),
        d => float_suffix(op, d)?,
    };
    let (dev, ap) = device_of(op, a)?;
    let bp = b.map(|b| device_of(op, b)).transpose()?.map_or(0, |(_, p)| p);
    // The scalar rounded to the dtype, as the CPU compares it.
    let scalar = match a.dtype() {
        DType::F32 => scalar as f32 as f64,
        DType::F16 => f16::from_f64(scalar).to_f64(),
        DType::BF16 => bf16::from_f64(scalar).to_f64(),
        _ => scalar,
    };
    let code = match cmp {
        Cmp::Eq => 0,
        Cmp::Ne => 1,
        Cmp::Lt => 2,
        Cmp::Le => 3,
        Cmp::Gt => 4,
        Cmp::Ge => 5,
    };
    let n = shape.numel();
    let (out, _) = CudaBuffer::alloc(&dev, a.dtype(), n)?;
    if n > 0 {
        let info = pair_info(&dev, a, b, shape)?;
        let args = [
            Arg::I64(n as i64),
            Arg::I32(shape.rank() as i32),
            Arg::Ptr(info.as_ref().map_or(0, CudaBuffer::ptr)),
            Arg::I32(code),
            Arg::Ptr(ap),
            Arg::I64(a.layout().offset as i64),
            Arg::Ptr(bp),
            Arg::I64(b.map_or(0, |b| b.layout().offset as i64)),
            Arg::F64(scalar),
            Arg::Ptr(out.ptr()),
        ];
        launch(&dev, "elementwise.cu", &format!("compare_{suffix}"), n, &args)?;
    }
    Ok(tensor_of(out, shape.clone()))
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
