//! The CPU kernel of [`crate::Affine`]: the product through the tensor
//! crate's fused linear sum, which applies the bias (and tanh) to each
//! thread's rows while they are in its core's cache, and a residual added
//! into the product's own buffer.

use tapir_tensor::cpu::pool::{self, Disjoint};
use tapir_tensor::cpu::simd;
use tapir_tensor::ops::rules::matmul::{fused_linear_sum_then, Then};
use tapir_tensor::{BinaryOps, DType, Device, Error, Result, ShapeOps, Tensor, UnaryOps};

use super::CpuBackend;
use crate::backend::{AffineKernels, AffinePlan, LowAffinePlan};

impl AffineKernels for CpuBackend {
    fn affine(
        &self,
        plan: &AffinePlan,
        x: &Tensor,
        w: &Tensor,
        bias: Option<&Tensor>,
        residual: Option<&Tensor>,
    ) -> Result<Option<Tensor>> {
        // Without a residual, tanh is applied in the product's own job; with
        // one, only after the residual is added.
        let then = if plan.tanh && residual.is_none() { Then::Tanh } else { Then::Nothing };
        let mut y = fused_linear_sum_then(&[(x, &w.t()?)], bias, then)?
            .ok_or_else(|| Error::invalid_arg("affine", "no product"))?;
        if let Some(r) = residual {
            if !add_in_place(&mut y, r)? {
                y = y.add(r)?;
            }
            if plan.tanh {
                y = y.tanh()?;
            }
        }
        Ok(Some(y))
    }

    fn low_affine(
        &self,
        _: &LowAffinePlan,
        _: &Tensor,
        _: &Tensor,
        _: Option<&Tensor>,
        _: Option<&Tensor>,
    ) -> Result<Option<Tensor>> {
        // No fused kernel: the composition's two roundings (after the
        // product, after the bias) are what the op promises, and the
        // tensor crate's fused linear sum rounds once. The composition's
        // casts are temporaries of the op's `run` either way, so the
        // memory is the same.
        Ok(None)
    }
}

fn in_place<F: tapir_tensor::CpuElement>(y: &mut Tensor, r: &Tensor, f: impl Fn(F, F) -> F + Sync) -> Result<bool> {
    let r = r.contiguous()?;
    let Some(rv) = r.as_slice::<F>() else { return Ok(false) };
    let n = rv.len();
    if n == 0 || !y.numel().is_multiple_of(n) {
        return Ok(false);
    }
    let ys = y.make_mut::<F>()?;
    let rows = ys.len() / n;
    let shared = Disjoint::new(ys);
    // Rows split over the pool's threads, as the product that made `y` split them.
    pool::ranges(rows, tapir_tensor::cpu::iter::SPLIT_MIN.div_ceil(n), &|part| {
        // SAFETY: the parts' row ranges are disjoint.
        let ys = unsafe { shared.slice(part.start * n, part.len() * n) };
        simd::run(
            #[inline(always)]
            || {
                for row in ys.chunks_mut(n) {
                    for (o, &c) in row.iter_mut().zip(rv) {
                        *o = f(*o, c);
                    }
                }
            },
        )
    });
    Ok(true)
}

/// `y += r` row by row (`r` is one row or all of them), in `y`'s buffer;
/// false where the kernel does not apply (off the host, other dtypes, a
/// shape that is not whole rows), and `y` is then unchanged.
fn add_in_place(y: &mut Tensor, r: &Tensor) -> Result<bool> {
    if y.device() != Device::Cpu || r.device() != Device::Cpu {
        return Ok(false);
    }
    match (y.dtype(), r.dtype()) {
        (DType::F32, DType::F32) => in_place::<f32>(y, r, |a, b| a + b),
        (DType::F64, DType::F64) => in_place::<f64>(y, r, |a, b| a + b),
        _ => Ok(false),
    }
}
