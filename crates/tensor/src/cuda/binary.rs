//! The CUDA launches of the elementwise functions of two tensors and of
//! the comparisons ([`crate::ops::binary`]).

use half::{bf16, f16};

use super::buffer::{tensor_of, CudaBuffer};
use super::context::driver_error;
use super::launch::{broadcast_strides, device_of, float_suffix, launch, pair, pair_flagged, pair_info, Arg};
use super::shape::cast;
use crate::ops::binary::{Binary, Cmp};
use crate::{DType, Result, Shape, Tensor};

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
    pair(name, name, suffix, a.src(), b.src(), shape).map(|s| Tensor::from_storage(s, shape.clone()))
}

/// Integer `a ^ b`, wrapping, broadcast to `shape`. A negative exponent is
/// the CPU's error, naming the first one in the output's order: the kernel
/// records the lowest such position in a one-word flag, read once; the
/// exponent there is read back from `b`.
fn int_pow(a: &Tensor, b: &Tensor, shape: &Shape) -> Result<Tensor> {
    let (dev, bp) = device_of("pow", b)?;
    if shape.numel() == 0 {
        return pair("pow", "pow", a.dtype().cuda_suffix(), a.src(), b.src(), shape)
            .map(|s| Tensor::from_storage(s, shape.clone()));
    }
    let (flag, _) = CudaBuffer::alloc(&dev, DType::I64, 1)?;
    // All ones: no negative exponent yet (the kernel takes the minimum).
    super::shape::fill_bytes(&dev, flag.ptr(), 0xff, 8)?;
    let out = pair_flagged("pow", "pow", a.dtype().cuda_suffix(), a.src(), b.src(), shape, Some(flag.ptr()))?;
    let out = Tensor::from_storage(out, shape.clone());
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
        let info = pair_info(&dev, a.src(), b.map(Tensor::src), shape)?;
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
