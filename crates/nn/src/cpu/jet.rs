//! The CPU kernel of the forward-Laplacian's sum of squares: the Jacobian
//! `[N, d, w]` read once, each point's `d` rows of squares summed in order
//! into its row of the `[N, w]` output.

use tapir_tensor::{with_float, DType, Result, Tensor};

use super::CpuBackend;
use crate::backend::{JetKernels, SumSquaresPlan};

impl JetKernels for CpuBackend {
    /// f32 and f64; other dtypes square and sum.
    fn sum_squares_mid(&self, plan: &SumSquaresPlan, x: &Tensor) -> Result<Option<Tensor>> {
        if !matches!(x.dtype(), DType::F32 | DType::F64) {
            return Ok(None);
        }
        let x = x.contiguous()?;
        let SumSquaresPlan { n, d, w } = *plan;
        with_float!(x.dtype(), F => {
            let v = x.as_slice::<F>().expect("internal: contiguous");
            Tensor::from_vec(sum_squares::<F>(v, n, d, w)?, [n, w]).map(Some)
        }, _ => unreachable!())
    }
}

fn sum_squares<F: tapir_tensor::Float + tapir_tensor::CpuElement>(
    x: &[F],
    n: usize,
    d: usize,
    w: usize,
) -> Result<Vec<F>> {
    if w == 0 {
        return Ok(Vec::new());
    }
    // Points split over the pool (the Jacobian of a 100-dim Laplacian is
    // 256 x 100 x 128); each output row sums its point's d rows in order.
    let parts = tapir_tensor::cpu::pool::parts_for(n * d * w, tapir_tensor::cpu::iter::SPLIT_MIN);
    tapir_tensor::cpu::iter::fill_vec_parts(n * w, parts, |start, out| {
        tapir_tensor::cpu::simd::run(
            #[inline(always)]
            || {
                // A part may start or end inside a point's row of `w`.
                for (at, piece) in split_rows(out, start, w) {
                    let (p, c0) = (at / w, at % w);
                    let len = piece.len();
                    piece.iter_mut().for_each(|o| {
                        o.write(F::ZERO);
                    });
                    // SAFETY: every element of `piece` was written just above.
                    let piece = unsafe { &mut *(piece as *mut [std::mem::MaybeUninit<F>] as *mut [F]) };
                    for v in x[p * d * w..(p + 1) * d * w].chunks(w) {
                        for (o, &x) in piece.iter_mut().zip(&v[c0..c0 + len]) {
                            *o += x * x;
                        }
                    }
                }
            },
        )
    })
}

/// `out`, the elements `start..` of a matrix with rows of `w`, cut at the
/// row ends, each piece with the index of its first element.
fn split_rows<T>(mut out: &mut [T], start: usize, w: usize) -> impl Iterator<Item = (usize, &mut [T])> {
    let mut at = start;
    std::iter::from_fn(move || {
        if out.is_empty() {
            return None;
        }
        let len = (w - at % w).min(out.len());
        let (piece, rest) = std::mem::take(&mut out).split_at_mut(len);
        out = rest;
        at += len;
        Some((at - len, piece))
    })
}

#[cfg(test)]
mod tests {
    use super::split_rows;

    #[test]
    fn split_rows_cuts_a_part_at_the_row_ends() {
        let pieces: Vec<(usize, usize)> = split_rows(&mut [0u8; 700], 250, 300).map(|(at, p)| (at, p.len())).collect();
        assert_eq!(pieces, [(250, 50), (300, 300), (600, 300), (900, 50)]);
    }
}
