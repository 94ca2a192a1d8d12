//! The CUDA launches of the binary family ([`crate::backend::binary`]):
//! the elementwise functions of two tensors, the comparisons and `where`,
//! each one kernel of `kernels/elementwise.cu`.

use half::{bf16, f16};

use super::buffer::{storage_of, CudaBuffer};
use super::context::driver_error;
use super::launch::{
    broadcast_strides_of, device_of_src, dims_i64, float_suffix, info_array, launch, pair, pair_flagged, pair_info, Arg,
};
use super::shape::width_suffix;
use super::CudaBackend;
use crate::backend::binary::{Binary, BinaryKernels, Cmp, Rhs};
use crate::backend::Src;
use crate::storage::Storage;
use crate::{DType, Result, Shape};

impl BinaryKernels for CudaBackend {
    fn binary(&self, f: Binary, a: Src<'_>, b: Src<'_>, shape: &Shape) -> Result<Storage> {
        binary(f, a, b, shape)
    }

    fn compare(&self, cmp: Cmp, a: Src<'_>, rhs: Rhs<'_>, shape: &Shape) -> Result<Storage> {
        compare(cmp, a, rhs, shape)
    }

    fn select(&self, mask: Src<'_>, a: Src<'_>, b: Src<'_>, shape: &Shape) -> Result<Storage> {
        where_(mask, a, b, shape)
    }
}

/// An elementwise function of two tensors, broadcast to `shape`.
/// Integers: add, sub, mul and pow (wrapping), maximum and minimum have
/// kernels; division never gets here with integers (it runs in float32).
fn binary(op: Binary, a: Src<'_>, b: Src<'_>, shape: &Shape) -> Result<Storage> {
    let name = op.name();
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
fn int_pow(a: Src<'_>, b: Src<'_>, shape: &Shape) -> Result<Storage> {
    let (dev, bp) = device_of_src("pow", b)?;
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
    let (mut rest, strides) = (bad[0] as usize, broadcast_strides_of(b.layout, shape));
    let mut at = b.layout.offset as i64;
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
fn compare(cmp: Cmp, a: Src<'_>, rhs: Rhs<'_>, shape: &Shape) -> Result<Storage> {
    let op = cmp.name();
    let (b, scalar) = match rhs {
        Rhs::Operand(b) => (Some(b), 0.0),
        Rhs::Scalar(s) => (None, s),
    };
    let suffix = match a.dtype() {
        d if d.is_int() => d.cuda_suffix(),
        d => float_suffix(op, d)?,
    };
    let (dev, ap) = device_of_src(op, a)?;
    let bp = b.map(|b| device_of_src(op, b)).transpose()?.map_or(0, |(_, p)| p);
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
            Arg::I64(a.layout.offset as i64),
            Arg::Ptr(bp),
            Arg::I64(b.map_or(0, |b| b.layout.offset as i64)),
            Arg::F64(scalar),
            Arg::Ptr(out.ptr()),
        ];
        launch(&dev, "elementwise.cu", &format!("compare_{suffix}"), n, &args)?;
    }
    Ok(storage_of(out))
}

/// The where kernel for a mask of `mask` and values of `values`.
fn where_kernel(mask: DType, values: DType) -> String {
    format!("where_{}_{}", mask.cuda_suffix(), width_suffix(values))
}

/// Every `where` kernel, as `(file, entry)`: one per mask dtype and
/// value width.
pub(crate) fn kernels() -> Vec<(&'static str, String)> {
    let all = [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64];
    let mut out = Vec::new();
    for mask in all {
        for values in [DType::F16, DType::F32, DType::F64] {
            out.push(("elementwise.cu", where_kernel(mask, values)));
        }
    }
    out
}

/// `where(mask, a, b)` broadcast to `shape`; `a` and `b` share a dtype.
fn where_(mask: Src<'_>, a: Src<'_>, b: Src<'_>, shape: &Shape) -> Result<Storage> {
    let op = "where";
    let (dev, ap) = device_of_src(op, a)?;
    let (_, bp) = device_of_src(op, b)?;
    let (_, mp) = device_of_src(op, mask)?;
    let n = shape.numel();
    let (out, _) = CudaBuffer::alloc(&dev, a.dtype(), n)?;
    if n > 0 {
        let mut v = dims_i64(shape);
        for t in [mask, a, b] {
            v.extend(broadcast_strides_of(t.layout, shape));
        }
        // A scalar output has no dims to describe: the kernel reads no info.
        let info = if shape.rank() > 0 { Some(info_array(&dev, &v)?) } else { None };
        let offset = |t: Src<'_>| Arg::I64(t.layout.offset as i64);
        let args = [
            Arg::I64(n as i64),
            Arg::I32(shape.rank() as i32),
            Arg::Ptr(info.as_ref().map_or(0, CudaBuffer::ptr)),
            Arg::Ptr(mp),
            offset(mask),
            Arg::Ptr(ap),
            offset(a),
            Arg::Ptr(bp),
            offset(b),
            Arg::Ptr(out.ptr()),
        ];
        launch(&dev, "elementwise.cu", &where_kernel(mask.dtype(), a.dtype()), n, &args)?;
    }
    Ok(storage_of(out))
}
