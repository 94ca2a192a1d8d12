//! The CUDA kernels of the elementwise functions of one tensor
//! ([`crate::backend::unary`]): one launch of `kernels/elementwise.cu` per
//! call, the first-order derivative passes of the activations included
//! (`<op>_bwd`, as the CPU fuses them); the second-order tanh pass is the
//! CPU's alone, composed here from these kernels.

use super::buffer::{storage_of, CudaBuffer};
use super::launch::{device_of_src, dims_i64, float_suffix, info_array, launch, pair, Arg};
use super::CudaBackend;
use crate::backend::unary::{Unary, UnaryKernels};
use crate::backend::Src;
use crate::storage::Storage;
use crate::{Result, Shape};

impl UnaryKernels for CudaBackend {
    fn unary(&self, f: Unary, x: Src<'_>) -> Result<Storage> {
        unary(f, x)
    }

    fn tanh_backward(&self, y: Src<'_>, g: Src<'_>, shape: &Shape) -> Result<Storage> {
        tanh_backward(y, g, shape)
    }

    fn unary_grad(&self, f: Unary, x: Src<'_>, y: Src<'_>, g: Src<'_>) -> Result<Option<Storage>> {
        unary_grad(f, x, y, g)
    }

    fn tanh_second(&self, _: Src<'_>, _: Src<'_>, _: Src<'_>, _: Option<Src<'_>>) -> Result<Option<Storage>> {
        Ok(None)
    }
}

/// An elementwise function of one tensor (the op has checked the dtype:
/// a float, or an integer for neg and abs, which wrap as on the CPU).
fn unary(op: Unary, x: Src<'_>) -> Result<Storage> {
    let name = op.name();
    let suffix = x.dtype().cuda_suffix();
    let (dev, xp) = device_of_src(name, x)?;
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
            v.extend(x.layout.strides.iter().map(|&s| s as i64));
            Some(info_array(&dev, &v)?)
        };
        let args = [
            Arg::I64(n as i64),
            Arg::I32(x.shape().rank() as i32),
            Arg::Ptr(info.as_ref().map_or(0, CudaBuffer::ptr)),
            Arg::Ptr(xp),
            Arg::I64(x.layout.offset as i64),
            Arg::F64(p0),
            Arg::F64(p1),
            Arg::Ptr(out.ptr()),
        ];
        launch(&dev, "elementwise.cu", &format!("{name}_{suffix}"), n, &args)?;
    }
    Ok(storage_of(out))
}

/// `g * dy/dx` in one launch for the activations whose derivative line
/// would take several launches and as many temporaries of the
/// activation's size (a GELU over a transformer's MLP: about eight, which
/// set a training step's peak); f16 and bf16 computed in f32 and rounded
/// once, as on the CPU. `None` for the other functions and for integers.
fn unary_grad(f: Unary, x: Src<'_>, y: Src<'_>, g: Src<'_>) -> Result<Option<Storage>> {
    if !x.dtype().is_float() {
        return Ok(None);
    }
    // Each reads what its rule saves (`Derivative::saves`): gelu and
    // gelu_tanh their input x; relu, tanh and sigmoid their output y (x is
    // then a stand-in the backward left in place of the freed value).
    let (kernel, a) = match f {
        Unary::Relu => ("relu_bwd", y),
        Unary::GeluTanh => ("gelu_tanh_bwd", x),
        Unary::GeluErf => ("gelu_bwd", x),
        Unary::Tanh => ("tanh_bwd", y),
        Unary::Sigmoid => ("sigmoid_bwd", y),
        _ => return Ok(None),
    };
    let name = f.name();
    Ok(Some(pair(name, kernel, float_suffix(name, x.dtype())?, a, g, g.shape())?))
}

/// `g * (1 - y^2)`, broadcast to `shape`.
fn tanh_backward(y: Src<'_>, g: Src<'_>, shape: &Shape) -> Result<Storage> {
    pair("tanh_backward", "tanh_bwd", float_suffix("tanh_backward", y.dtype())?, y, g, shape)
}
