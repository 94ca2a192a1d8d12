//! The CUDA launches of tapir-nn's forward-Laplacian updates of a tanh
//! layer (`kernels/jet.cu`): `(1 - a^2)(l - 2 a s)` and its three gradients
//! in one pass each, `j (1 - a^2)` over each point's rows of the Jacobian
//! and the sum its `a` gradient needs, f32 arithmetic for f16 and bf16.
//!
//! tapir-nn's `TanhJet` and `TanhJac` hold the meaning, the shape checks
//! and the derivative rules; this module sees only tensors already checked
//! there, and re-checks what a kernel's memory safety depends on (element
//! counts, dtypes, one device) so a wrong call is an error.

use super::buffer::{tensor_of, CudaBuffer};
use super::launch::{device_of, float_suffix, launch, Arg};
use super::shape::{contiguous, first_element};
use crate::{DType, Error, Result, Shape, Tensor};

const JET: &str = "jet.cu";

/// Every kernel this module launches, as `(file, entry)`.
pub(crate) fn kernels() -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let s = dt.cuda_suffix();
        for k in ["tanh_jet", "tanh_jet_grad", "tanh_jac", "tanh_jac_da"] {
            out.push((JET, format!("{k}_{s}")));
        }
    }
    out
}

/// Contiguous copies of `xs`, each checked to hold `counts[i]` elements of
/// the first's dtype on the first's device.
fn operands(op: &'static str, xs: &[&Tensor], counts: &[usize]) -> Result<Vec<Tensor>> {
    let (dtype, device) = (xs[0].dtype(), xs[0].device());
    xs.iter()
        .zip(counts)
        .map(|(x, &n)| {
            if x.dtype() != dtype {
                return Err(Error::DTypeMismatch { op, lhs: dtype, rhs: x.dtype() });
            }
            if x.device() != device {
                return Err(Error::DeviceMismatch { op, lhs: device, rhs: x.device() });
            }
            if x.numel() != n {
                return Err(Error::invalid_arg(
                    op,
                    format!("an operand of {} elements where {n} are needed", x.numel()),
                ));
            }
            contiguous(x)
        })
        .collect()
}

/// `(1 - a^2)(l - 2 a s)` for `a` `[n, w]`, `s` `[n, w]` or `[w]`
/// (`s_row`), `l` `[n, w]` or zero; `[n, w]`.
pub fn tanh_jet(a: &Tensor, s: &Tensor, l: Option<&Tensor>, s_row: bool) -> Result<Tensor> {
    const OP: &str = "tanh_jet";
    let suffix = float_suffix(OP, a.dtype())?;
    let [n, w] = *a.dims() else { return Err(Error::invalid_arg(OP, "a must be [n, w]")) };
    let total = n * w;
    let mut xs = vec![a, s];
    let mut counts = vec![total, if s_row { w } else { total }];
    xs.extend(l);
    counts.extend(l.map(|_| total));
    let ops = operands(OP, &xs, &counts)?;
    let (dev, _) = device_of(OP, &ops[0])?;
    let (out, _) = CudaBuffer::alloc(&dev, a.dtype(), total)?;
    if total > 0 {
        let lp = match ops.get(2) {
            Some(l) => first_element(OP, l)?,
            None => 0,
        };
        let args = [
            Arg::I64(total as i64),
            Arg::I64(w as i64),
            Arg::I64(s_row as i64),
            Arg::Ptr(first_element(OP, &ops[0])?),
            Arg::Ptr(first_element(OP, &ops[1])?),
            Arg::Ptr(lp),
            Arg::Ptr(out.ptr()),
        ];
        launch(&dev, JET, &format!("tanh_jet_{suffix}"), total, &args)?;
    }
    Ok(tensor_of(out, Shape::from([n, w])))
}

/// The gradients of [`tanh_jet`] for the output's gradient `g` `[n, w]`:
/// `[d a, d s, d l]`, each `[n, w]` (`d s` before a row `s`'s sum over
/// points).
pub fn tanh_jet_grad(a: &Tensor, s: &Tensor, l: Option<&Tensor>, g: &Tensor, s_row: bool) -> Result<[Tensor; 3]> {
    const OP: &str = "tanh_jet_grad";
    let suffix = float_suffix(OP, a.dtype())?;
    let [n, w] = *a.dims() else { return Err(Error::invalid_arg(OP, "a must be [n, w]")) };
    let total = n * w;
    let mut xs = vec![a, g, s];
    let mut counts = vec![total, total, if s_row { w } else { total }];
    xs.extend(l);
    counts.extend(l.map(|_| total));
    let ops = operands(OP, &xs, &counts)?;
    let (dev, _) = device_of(OP, &ops[0])?;
    let outs = [(); 3].map(|_| CudaBuffer::alloc(&dev, a.dtype(), total).map(|(b, _)| b));
    let [da, ds, dl] = outs;
    let (da, ds, dl) = (da?, ds?, dl?);
    if total > 0 {
        let lp = match ops.get(3) {
            Some(l) => first_element(OP, l)?,
            None => 0,
        };
        let args = [
            Arg::I64(total as i64),
            Arg::I64(w as i64),
            Arg::I64(s_row as i64),
            Arg::Ptr(first_element(OP, &ops[0])?),
            Arg::Ptr(first_element(OP, &ops[2])?),
            Arg::Ptr(lp),
            Arg::Ptr(first_element(OP, &ops[1])?),
            Arg::Ptr(da.ptr()),
            Arg::Ptr(ds.ptr()),
            Arg::Ptr(dl.ptr()),
        ];
        launch(&dev, JET, &format!("tanh_jet_grad_{suffix}"), total, &args)?;
    }
    let shape = Shape::from([n, w]);
    Ok([tensor_of(da, shape.clone()), tensor_of(ds, shape.clone()), tensor_of(dl, shape)])
}

/// `x (1 - a^2)` for `x` `[n, d, w]` (or `[1, d, w]` with `x_row`) and `a`
/// `[n, w]` broadcast over each point's `d` rows; `[n, d, w]`.
fn scale_rows(op: &'static str, x: &Tensor, a: &Tensor, d: usize, x_row: bool) -> Result<Tensor> {
    let suffix = float_suffix(op, a.dtype())?;
    let [n, w] = *a.dims() else { return Err(Error::invalid_arg(op, "a must be [n, w]")) };
    let total = n * d * w;
    let ops = operands(op, &[a, x], &[n * w, if x_row { d * w } else { total }])?;
    let (dev, _) = device_of(op, &ops[0])?;
    let (out, _) = CudaBuffer::alloc(&dev, a.dtype(), total)?;
    if total > 0 {
        let args = [
            Arg::I64(total as i64),
            Arg::I64(d as i64),
            Arg::I64(w as i64),
            Arg::I64(x_row as i64),
            Arg::Ptr(first_element(op, &ops[1])?),
            Arg::Ptr(first_element(op, &ops[0])?),
            Arg::Ptr(out.ptr()),
        ];
        launch(&dev, JET, &format!("tanh_jac_{suffix}"), total, &args)?;
    }
    Ok(tensor_of(out, Shape::from([n, d, w])))
}

/// `j (1 - a^2)` for `j` `[n, d, w]` (or `[1, d, w]` with `j_row`) and `a`
/// `[n, w]`; `[n, d, w]`.
pub fn tanh_jac(j: &Tensor, a: &Tensor, d: usize, j_row: bool) -> Result<Tensor> {
    scale_rows("tanh_jac", j, a, d, j_row)
}

/// The gradients of [`tanh_jac`] for the output's gradient `g`
/// `[n, d, w]`: `[d j, d a]`, `d j = g (1 - a^2)` `[n, d, w]` (before a
/// `[1, d, w]` `j`'s sum over points), `d a = -2 a sum_i g_i j_i` `[n, w]`.
pub fn tanh_jac_grad(j: &Tensor, a: &Tensor, g: &Tensor, d: usize, j_row: bool) -> Result<[Tensor; 2]> {
    const OP: &str = "tanh_jac_grad";
    let suffix = float_suffix(OP, a.dtype())?;
    let [n, w] = *a.dims() else { return Err(Error::invalid_arg(OP, "a must be [n, w]")) };
    let total = n * d * w;
    let dj = scale_rows(OP, g, a, d, false)?;
    let ops = operands(OP, &[a, j, g], &[n * w, if j_row { d * w } else { total }, total])?;
    let (dev, _) = device_of(OP, &ops[0])?;
    let (da, _) = CudaBuffer::alloc(&dev, a.dtype(), n * w)?;
    if n * w > 0 {
        let args = [
            Arg::I64((n * w) as i64),
            Arg::I64(d as i64),
            Arg::I64(w as i64),
            Arg::I64(j_row as i64),
            Arg::Ptr(first_element(OP, &ops[1])?),
            Arg::Ptr(first_element(OP, &ops[0])?),
            Arg::Ptr(first_element(OP, &ops[2])?),
            Arg::Ptr(da.ptr()),
        ];
        launch(&dev, JET, &format!("tanh_jac_da_{suffix}"), n * w, &args)?;
    }
    Ok([dj, tensor_of(da, Shape::from([n, w]))])
}
