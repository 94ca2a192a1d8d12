//! The CPU kernel of [`crate::Affine`]: a residual added into the
//! product's own buffer, by the threads that made its rows.

use tapir_tensor::cpu::pool::{self, Disjoint};
use tapir_tensor::cpu::simd;
use tapir_tensor::{DType, Device, Result, Tensor};

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
pub(crate) fn add_in_place(y: &mut Tensor, r: &Tensor) -> Result<bool> {
    if y.device() != Device::Cpu || r.device() != Device::Cpu {
        return Ok(false);
    }
    match (y.dtype(), r.dtype()) {
        (DType::F32, DType::F32) => in_place::<f32>(y, r, |a, b| a + b),
        (DType::F64, DType::F64) => in_place::<f64>(y, r, |a, b| a + b),
        _ => Ok(false),
    }
}
