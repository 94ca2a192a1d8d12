//! The CPU kernels of the forward-Laplacian: the sum of squares, the
//! Jacobian `[N, d, w]` read once, each point's `d` rows of squares (or
//! the plan's run of them) summed in order into its row of the `[N, w]`
//! output, and its one-pass gradient; a tanh layer's
//! Laplacian update `(1 - a^2)(l - 2 a s)` and its three gradients, each one
//! pass, rounded as the composed ops round them (the same bits); and its
//! Jacobian update `j (1 - a^2)`, one pass, with its two gradients.

use std::mem::MaybeUninit;

use tapir_tensor::cpu::{iter, pool, simd};
use tapir_tensor::{with_float, CpuElement, DType, Float, Result, Tensor};

use super::CpuBackend;
use crate::backend::{JetKernels, SumSquaresPlan, TanhJacPlan, TanhJetPlan};

impl JetKernels for CpuBackend {
    /// f32 and f64; other dtypes square and sum.
    fn sum_squares_mid(&self, plan: &SumSquaresPlan, x: &Tensor) -> Result<Option<Tensor>> {
        if !matches!(x.dtype(), DType::F32 | DType::F64) {
            return Ok(None);
        }
        let x = x.contiguous()?;
        with_float!(x.dtype(), F => {
            let v = x.as_slice::<F>().expect("internal: contiguous");
            Tensor::from_vec(sum_squares::<F>(v, plan)?, [plan.n, plan.w]).map(Some)
        }, _ => unreachable!())
    }

    /// f32 and f64 with `g` of `x`'s dtype; others compose the gradient.
    fn sum_squares_mid_grad(&self, plan: &SumSquaresPlan, x: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let SumSquaresPlan { n, d, w, lo, len } = *plan;
        if !matches!(x.dtype(), DType::F32 | DType::F64) || g.dtype() != x.dtype() || g.dims() != [n, w] {
            return Ok(None);
        }
        let (x, g) = (x.contiguous()?, g.contiguous()?);
        with_float!(x.dtype(), F => {
            let (xv, gv) = (x.as_slice::<F>().expect("internal: contiguous"), g.as_slice::<F>().expect("internal: contiguous"));
            let two = <F as tapir_tensor::Element>::from_f64(2.0);
            let total = n * d * w;
            let out = if w == 0 || total == 0 {
                Vec::new()
            } else {
                iter::fill_vec(total, |start, out| {
                    simd::run(
                        #[inline(always)]
                        || {
                            for (at, piece) in split_rows(out, start, w) {
                                let (r, c0, l) = (at / w, at % w, piece.len());
                                let (p, i) = (r / d, r % d);
                                if (lo..lo + len).contains(&i) {
                                    let gr = &gv[p * w + c0..][..l];
                                    for ((o, &x), &g) in piece.iter_mut().zip(&xv[at..at + l]).zip(gr) {
                                        o.write(x * g * two);
                                    }
                                } else {
                                    piece.iter_mut().for_each(|o| {
                                        o.write(F::ZERO);
                                    });
                                }
                            }
                        },
                    )
                })?
            };
            Tensor::from_vec(out, [n, d, w]).map(Some)
        }, _ => unreachable!())
    }

    /// f32 and f64; other dtypes compose the update.
    fn tanh_jet(&self, plan: &TanhJetPlan, a: &Tensor, s: &Tensor, l: Option<&Tensor>) -> Result<Option<Tensor>> {
        if !matches!(a.dtype(), DType::F32 | DType::F64) {
            return Ok(None);
        }
        let (a, s, l) = (a.contiguous()?, s.contiguous()?, l.map(Tensor::contiguous).transpose()?);
        with_float!(a.dtype(), F => {
            let ops = Operands::<F>::of(plan, &a, &s, l.as_ref());
            let out = iter::fill_vec(ops.a.len(), |start, out| {
                simd::run(
                    #[inline(always)]
                    || {
                        ops.each_piece(
                            start,
                            out,
                            #[inline(always)]
                            |o, [a, s, l], _| jet_forward(o, a, s, l),
                        )
                    },
                )
            })?;
            Tensor::from_vec(out, [plan.n, plan.w]).map(Some)
        }, _ => unreachable!())
    }

    /// f32 and f64; other dtypes compose the gradients.
    fn tanh_jet_grad(
        &self,
        plan: &TanhJetPlan,
        a: &Tensor,
        s: &Tensor,
        l: Option<&Tensor>,
        g: &Tensor,
    ) -> Result<Option<[Tensor; 3]>> {
        if !matches!(a.dtype(), DType::F32 | DType::F64) || g.dtype() != a.dtype() || g.dims() != a.dims() {
            return Ok(None);
        }
        let (a, s, l, g) = (a.contiguous()?, s.contiguous()?, l.map(Tensor::contiguous).transpose()?, g.contiguous()?);
        with_float!(a.dtype(), F => {
            let ops = Operands::<F>::of(plan, &a, &s, l.as_ref());
            let gv = g.as_slice::<F>().expect("internal: contiguous");
            let n = gv.len();
            // `d s` and `d l` written by the parts that write `d a`, each
            // part its own range of all three.
            let (mut ds, mut dl) = (tapir_tensor::cache::take::<F>(n)?, tapir_tensor::cache::take::<F>(n)?);
            let ds_parts = pool::Disjoint::new(&mut ds.spare_capacity_mut()[..n]);
            let dl_parts = pool::Disjoint::new(&mut dl.spare_capacity_mut()[..n]);
            let da = iter::fill_vec(n, |start, out| {
                let len = out.len();
                // SAFETY: `fill_vec`'s parts are disjoint ranges of 0..n,
                // so no two parts take the same elements of `ds` or `dl`.
                let (ds, dl) = unsafe { (ds_parts.slice(start, len), dl_parts.slice(start, len)) };
                let gv = &gv[start..start + len];
                simd::run(
                    #[inline(always)]
                    || {
                        ops.each_piece(
                            start,
                            out,
                            #[inline(always)]
                            |o, [a, s, l], at| {
                            let r = at - start..at - start + o.len();
                            jet_backward(o, &mut ds[r.clone()], &mut dl[r.clone()], a, s, l, &gv[r])
                        })
                    },
                )
            })?;
            // SAFETY: the parts of `fill_vec` cover 0..n, and each wrote
            // every element of its range of `ds` and `dl`.
            unsafe {
                ds.set_len(n);
                dl.set_len(n);
            }
            let shape = [plan.n, plan.w];
            Ok(Some([Tensor::from_vec(da, shape)?, Tensor::from_vec(ds, shape)?, Tensor::from_vec(dl, shape)?]))
        }, _ => unreachable!())
    }

    /// f32 and f64; other dtypes compose the product.
    fn tanh_jac(&self, plan: &TanhJacPlan, j: &Tensor, a: &Tensor) -> Result<Option<Tensor>> {
        if !matches!(a.dtype(), DType::F32 | DType::F64) {
            return Ok(None);
        }
        let (j, a) = (j.contiguous()?, a.contiguous()?);
        with_float!(a.dtype(), F => {
            let (jv, av) = (j.as_slice::<F>().expect("internal: contiguous"), a.as_slice::<F>().expect("internal: contiguous"));
            let out = scale_rows::<F>(plan, jv, av)?;
            Tensor::from_vec(out, [plan.n, plan.d, plan.w]).map(Some)
        }, _ => unreachable!())
    }

    /// f32 and f64; other dtypes compose the gradients.
    fn tanh_jac_grad(&self, plan: &TanhJacPlan, j: &Tensor, a: &Tensor, g: &Tensor) -> Result<Option<[Tensor; 2]>> {
        let TanhJacPlan { n, d, w, .. } = *plan;
        if !matches!(a.dtype(), DType::F32 | DType::F64) || g.dtype() != a.dtype() || g.dims() != [n, d, w] {
            return Ok(None);
        }
        let (j, a, g) = (j.contiguous()?, a.contiguous()?, g.contiguous()?);
        with_float!(a.dtype(), F => {
            let jv = j.as_slice::<F>().expect("internal: contiguous");
            let av = a.as_slice::<F>().expect("internal: contiguous");
            let gv = g.as_slice::<F>().expect("internal: contiguous");
            // d j = g (1 - a^2), the forward's pass on `g` (one per point).
            let dj = scale_rows::<F>(&TanhJacPlan { j_row: false, ..*plan }, gv, av)?;
            // d a = -2 a sum_i g_i j_i, each point's d rows summed in order.
            let m2 = <F as tapir_tensor::Element>::from_f64(-2.0);
            let parts = pool::parts_for(n * d * w, iter::SPLIT_MIN);
            let da = iter::fill_vec_parts(n * w, parts, |start, out| {
                simd::run(
                    #[inline(always)]
                    || {
                        for (at, piece) in split_rows(out, start, w) {
                            let (p, c0, len) = (at / w, at % w, piece.len());
                            piece.iter_mut().for_each(|o| {
                                o.write(F::ZERO);
                            });
                            // SAFETY: every element of `piece` was written just above.
                            let piece = unsafe { &mut *(piece as *mut [MaybeUninit<F>] as *mut [F]) };
                            let jp = if plan.j_row { 0 } else { p };
                            for i in 0..d {
                                let gr = &gv[(p * d + i) * w + c0..][..len];
                                let jr = &jv[(jp * d + i) * w + c0..][..len];
                                for ((o, &g), &j) in piece.iter_mut().zip(gr).zip(jr) {
                                    *o += g * j;
                                }
                            }
                            let ar = &av[at..at + len];
                            for (o, &a) in piece.iter_mut().zip(ar) {
                                *o = a * *o * m2;
                            }
                        }
                    },
                )
            })?;
            Ok(Some([Tensor::from_vec(dj, [n, d, w])?, Tensor::from_vec(da, [n, w])?]))
        }, _ => unreachable!())
    }
}

/// `x (1 - a^2)` for `x` `[n, d, w]` (or `[1, d, w]` with `plan.j_row`) and
/// `a` `[n, w]` broadcast over each point's `d` rows, `[n, d, w]`.
fn scale_rows<F: Float + CpuElement>(plan: &TanhJacPlan, x: &[F], a: &[F]) -> Result<Vec<F>> {
    let TanhJacPlan { d, w, j_row, .. } = *plan;
    let total = plan.n * d * w;
    if w == 0 || total == 0 {
        return Ok(Vec::new());
    }
    iter::fill_vec(total, |start, out| {
        simd::run(
            #[inline(always)]
            || {
                for (at, piece) in split_rows(out, start, w) {
                    let (r, c0, len) = (at / w, at % w, piece.len());
                    let (p, i) = (r / d, r % d);
                    let xr = if j_row { &x[i * w + c0..][..len] } else { &x[at..at + len] };
                    let ar = &a[p * w + c0..][..len];
                    for ((o, &x), &a) in piece.iter_mut().zip(xr).zip(ar) {
                        o.write(x * (F::ONE - a * a));
                    }
                }
            },
        )
    })
}

/// The operands of a tanh layer's Laplacian update as slices: `a` and `l`
/// (when given) `[n, w]`, `s` `[n, w]` or one row `[w]`.
struct Operands<'t, F> {
    a: &'t [F],
    s: &'t [F],
    l: Option<&'t [F]>,
    s_row: bool,
    w: usize,
}

impl<'t, F: CpuElement> Operands<'t, F> {
    /// The slices of contiguous `a`, `s`, `l`, checked by the op.
    fn of(plan: &TanhJetPlan, a: &'t Tensor, s: &'t Tensor, l: Option<&'t Tensor>) -> Self {
        let sl = |t: &'t Tensor| t.as_slice::<F>().expect("internal: contiguous");
        Operands { a: sl(a), s: sl(s), l: l.map(sl), s_row: plan.s_row, w: plan.w }
    }

    /// Calls `f(out_piece, [a, s, l], at)` over the elements `start..` of
    /// `out`, in pieces along which every operand is one contiguous run
    /// (cut at the row ends when `s` is one row; `l` empty when absent),
    /// `at` the index of the piece's first element.
    #[inline(always)]
    fn each_piece<O>(&self, start: usize, out: &mut [O], mut f: impl FnMut(&mut [O], [&[F]; 3], usize)) {
        if self.s_row {
            for (at, piece) in split_rows(out, start, self.w) {
                let (c0, len) = (at % self.w, piece.len());
                f(piece, self.run(at, len, &self.s[c0..c0 + len]), at);
            }
        } else {
            let len = out.len();
            f(out, self.run(start, len, &self.s[start..start + len]), start);
        }
    }

    /// `a` and `l` (empty when absent) at `at..at + len`, with `s`'s run.
    #[inline(always)]
    fn run(&self, at: usize, len: usize, s: &'t [F]) -> [&'t [F]; 3] {
        let r = at..at + len;
        [&self.a[r.clone()], s, self.l.map_or(&[][..], |l| &l[r])]
    }
}

/// `out = (l - 2 a s)(1 - a^2)` (`l` empty: zero), as the composed ops
/// round it: `(l + (a s)(-2)) (1 - a a)`.
#[inline(always)]
fn jet_forward<F: Float>(out: &mut [MaybeUninit<F>], a: &[F], s: &[F], l: &[F]) {
    let m2 = F::from_f64(-2.0);
    let (a, s) = (&a[..out.len()], &s[..out.len()]);
    if l.is_empty() {
        for (i, o) in out.iter_mut().enumerate() {
            o.write(a[i] * s[i] * m2 * (F::ONE - a[i] * a[i]));
        }
    } else {
        let l = &l[..out.len()];
        for (i, o) in out.iter_mut().enumerate() {
            o.write((l[i] + a[i] * s[i] * m2) * (F::ONE - a[i] * a[i]));
        }
    }
}

/// The gradients of [`jet_forward`] for the output's gradient `g`, with
/// `u = l - 2 a s` and `d = 1 - a^2`: `dl = g d`, `ds = (a dl)(-2)` and
/// `da = ((a u + s d) g)(-2)`, rounded as the op's composed rule rounds
/// them.
#[inline(always)]
fn jet_backward<F: Float>(
    da: &mut [MaybeUninit<F>],
    ds: &mut [MaybeUninit<F>],
    dl: &mut [MaybeUninit<F>],
    a: &[F],
    s: &[F],
    l: &[F],
    g: &[F],
) {
    let m2 = F::from_f64(-2.0);
    let n = da.len();
    let (a, s, g, ds, dl) = (&a[..n], &s[..n], &g[..n], &mut ds[..n], &mut dl[..n]);
    let with_l = !l.is_empty();
    let l = if with_l { &l[..n] } else { l };
    for i in 0..n {
        let d = F::ONE - a[i] * a[i];
        let inner = a[i] * s[i] * m2;
        let u = if with_l { l[i] + inner } else { inner };
        let gl = g[i] * d;
        dl[i].write(gl);
        ds[i].write(a[i] * gl * m2);
        da[i].write((a[i] * u + s[i] * d) * g[i] * m2);
    }
}

/// The plan's sum of squares of contiguous `x`, `[n, w]`.
fn sum_squares<F: tapir_tensor::Float + tapir_tensor::CpuElement>(x: &[F], plan: &SumSquaresPlan) -> Result<Vec<F>> {
    let SumSquaresPlan { n, d, w, lo, len: rows } = *plan;
    if w == 0 {
        return Ok(Vec::new());
    }
    // Points split over the pool (the Jacobian of a 100-dim Laplacian is
    // 256 x 100 x 128); each output row sums its point's rows in order.
    let parts = tapir_tensor::cpu::pool::parts_for(n * rows * w, tapir_tensor::cpu::iter::SPLIT_MIN);
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
                    for v in x[(p * d + lo) * w..(p * d + lo + rows) * w].chunks(w) {
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
