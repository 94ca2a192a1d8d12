//! `a @ b` for f32 products of a narrow output (9 to 32 columns) and a
//! short inner dimension (at most 64): the layers of a narrow network,
//! such as Raissi et al.'s nine layers of 20 for Burgers' equation, whose
//! forward-Laplacian pushes three such products through every layer and
//! their gradients back.
//!
//! The gemm crate packs both operands into panels of 6 columns and steps
//! its microkernel over them: 20 columns are four panels, the last a third
//! full, and the packing is a large part of a product this small (44
//! GFLOP/s on one Zen 4 core for 8,000 x 20 x 20, PyTorch 52). Here `b`
//! (at most 64 x 32) is copied once, zero-padded to rows of 32, and stays
//! in the L1 cache; each tile of [`ROWS`] output rows lives in registers,
//! a 16-lane vector per row plus a tail of 4, 8 or 16 lanes sized to the
//! columns past 16 (on the Zen 4 a 512-bit operation issues as two 256-bit
//! halves, so a 4-wide tail costs a quarter of a 16-wide one), while the
//! kernel walks the inner dimension, broadcasting one element of `a` a row
//! (`a` is read in place, any strides). Each output is the sum of its `k`
//! products in order, one fused multiply-add each, from zero; accumulating
//! adds that sum to the old value.

/// Output rows per tile.
const ROWS: usize = 6;
/// Widest output handled.
pub(crate) const MAX_N: usize = 32;
/// Longest inner dimension handled (`b` packed on the stack: 8 or 16 KiB).
pub(crate) const MAX_K: usize = 64;

/// Whether [`Narrow::run`] runs on this processor (AVX-512F and VL; the
/// detection is cached by the standard library).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::cpu::simd::isa() == crate::cpu::simd::Isa::Avx512 && std::arch::is_x86_feature_detected!("avx512vl");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether a product of this shape takes [`Narrow`]: 9 to [`MAX_N`]
/// columns (8 or fewer fill too little of an f32 vector to pay) and 1 to
/// [`MAX_K`] inner terms. Not the rows: a product split over threads by
/// rows runs every part here, so no output's bits depend on the thread
/// count.
pub(crate) fn fits(n: usize, k: usize) -> bool {
    (9..=MAX_N).contains(&n) && (1..=MAX_K).contains(&k) && available()
}

/// The element types the kernel has: f32 and f64.
pub(crate) trait Elem: Copy + Default + 'static {
    #[cfg(target_arch = "x86_64")]
    /// Dispatches [`Narrow::run`] for this type.
    unsafe fn product(o: &Narrow<Self>, packed: &[Self]);
}

/// `dst (m x n, row stride dst_rs) = a (m x k) @ b (k x n)` (`+=` when
/// `accumulate`), with `a[i, p]` at `a + i * a_rs + p * a_cs` and `b[p, j]`
/// at `b + p * b_rs + j * b_cs`.
#[derive(Clone, Copy)]
pub(crate) struct Narrow<E> {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: *const E,
    pub a_rs: isize,
    pub a_cs: isize,
    pub b: *const E,
    pub b_rs: isize,
    pub b_cs: isize,
    pub dst: *mut E,
    pub dst_rs: usize,
    pub accumulate: bool,
}

impl<E: Elem> Narrow<E> {
    /// Computes the product.
    ///
    /// # Safety
    /// [`fits`] holds for the shape; the addressed elements of `a` and `b`
    /// are readable; the `m x n` block of `dst` is writable, and
    /// initialised when `accumulate`.
    pub(crate) unsafe fn run(self) {
        debug_assert!(fits(self.n, self.k));
        let mut packed = [E::default(); MAX_K * MAX_N];
        for p in 0..self.k {
            for j in 0..self.n {
                // SAFETY: b[p, j] is readable (the caller's contract).
                packed[p * MAX_N + j] = unsafe { *self.b.offset(p as isize * self.b_rs + j as isize * self.b_cs) };
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded from the caller; `packed` holds k rows of 32.
        unsafe {
            E::product(&self, &packed)
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("internal: the narrow product without AVX-512");
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Elem, Narrow, MAX_N, ROWS};
    use crate::cpu::vector512::Vector;

    /// Picks `H` (full vectors) and the tail (quarter, half or full width,
    /// or none) for `o.n` columns, then runs every tile.
    macro_rules! dispatch {
        ($o:expr, $packed:expr, $lanes:literal, $full:ty, $quarter:ty, $half:ty, [$($h:literal),*]) => {{
            let (o, packed) = ($o, $packed);
            let (h, r) = (o.n / $lanes, o.n % $lanes);
            // SAFETY (every arm): forwarded from `product`'s caller.
            unsafe {
                match (h, r) {
                    $(
                        ($h, 0) => rows::<_, $full, $full, $h, false>(o, packed),
                        ($h, r) if r <= $lanes / 4 => rows::<_, $full, $quarter, $h, true>(o, packed),
                        ($h, r) if r <= $lanes / 2 => rows::<_, $full, $half, $h, true>(o, packed),
                        ($h, _) => rows::<_, $full, $full, $h, true>(o, packed),
                    )*
                    _ => unreachable!("internal: fits() bounds the columns"),
                }
            }
        }};
    }

    impl Elem for f32 {
        #[target_feature(enable = "avx512f,avx512vl,fma")]
        unsafe fn product(o: &Narrow<f32>, packed: &[f32]) {
            dispatch!(o, packed, 16, __m512, __m128, __m256, [0, 1, 2])
        }
    }

    impl Elem for f64 {
        #[target_feature(enable = "avx512f,avx512vl,fma")]
        unsafe fn product(o: &Narrow<f64>, packed: &[f64]) {
            dispatch!(o, packed, 8, __m512d, __m128d, __m256d, [1, 2, 3, 4])
        }
    }

    /// Every tile of rows: [`ROWS`] at a time, then the rest one by one.
    #[inline(always)]
    unsafe fn rows<E: Copy, F: Vector<E>, T: Vector<E>, const H: usize, const TAIL: bool>(o: &Narrow<E>, packed: &[E]) {
        let full = o.m / ROWS * ROWS;
        for i in (0..full).step_by(ROWS) {
            // SAFETY: rows i..i + ROWS are inside the block.
            unsafe { tile::<E, F, T, H, TAIL, ROWS>(o, packed, i) };
        }
        for i in full..o.m {
            // SAFETY: row i is inside the block.
            unsafe { tile::<E, F, T, H, TAIL, 1>(o, packed, i) };
        }
    }

    /// Output rows `i..i + R`: `H` full vectors a row, then the tail.
    #[inline(always)]
    unsafe fn tile<E: Copy, F: Vector<E>, T: Vector<E>, const H: usize, const TAIL: bool, const R: usize>(
        o: &Narrow<E>,
        packed: &[E],
        i: usize,
    ) {
        let lanes = 64 / std::mem::size_of::<E>();
        // SAFETY: every pointer below addresses an element the caller's
        // contract makes readable (`a`, `packed`) or writable (`dst`).
        unsafe {
            let mut head = [[F::zero(); H]; R];
            let mut tail = [T::zero(); R];
            let a = o.a.offset(i as isize * o.a_rs);
            for p in 0..o.k {
                let b = packed.as_ptr().add(p * MAX_N);
                let mut bh = [F::zero(); H];
                for (v, x) in bh.iter_mut().enumerate() {
                    *x = F::load(b.add(v * lanes));
                }
                let bt = T::load(b.add(H * lanes));
                let ap = a.offset(p as isize * o.a_cs);
                for (r, (hr, tr)) in head.iter_mut().zip(tail.iter_mut()).enumerate() {
                    let x = *ap.offset(r as isize * o.a_rs);
                    let xv = F::splat(x);
                    for (acc, &bv) in hr.iter_mut().zip(&bh) {
                        *acc = xv.fma(bv, *acc);
                    }
                    if TAIL {
                        *tr = T::splat(x).fma(bt, *tr);
                    }
                }
            }
            let rest = o.n - H * lanes;
            for (r, (hr, &tr)) in head.iter().zip(&tail).enumerate() {
                let d = o.dst.add((i + r) * o.dst_rs);
                for (v, &acc) in hr.iter().enumerate() {
                    let x = if o.accumulate { acc.add_masked(d.add(v * lanes), lanes) } else { acc };
                    x.store_masked(d.add(v * lanes), lanes);
                }
                if TAIL {
                    let t = d.add(H * lanes);
                    let x = if o.accumulate { tr.add_masked(t, rest) } else { tr };
                    x.store_masked(t, rest);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tail class in f32 (9-15, 16, 17-20, 21-24, 25-32 columns) and
    /// f64 (one to four full vectors, each tail), whole tiles and leftover
    /// rows, inner dimensions 1 to 64, `a` row-major and transposed, `b`
    /// both ways, padded row strides, and accumulation: each output the
    /// fused sum of its products in order, as a scalar loop computes it.
    macro_rules! check {
        ($e:ty) => {{
            let vals = |len: usize, seed: usize| -> Vec<$e> {
                (0..len).map(|i| ((i * 7919 + seed * 104729) % 1013) as $e / 1013.0 - 0.5).collect()
            };
            let shapes = [
                (6, 9, 1),
                (13, 16, 20),
                (20, 17, 7),
                (31, 20, 20),
                (8, 21, 64),
                (7, 24, 3),
                (19, 25, 33),
                (12, 32, 64),
                (6, 10, 2),
                (9, 12, 5),
            ];
            for (m, n, k) in shapes {
                for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
                    let (a, b) = (vals(m * k, 1), vals(k * n, 2));
                    // a[i, p] and b[p, j] as the strides address them.
                    let (a_rs, a_cs) = if a_t { (1, m as isize) } else { (k as isize, 1) };
                    let (b_rs, b_cs) = if b_t { (1, k as isize) } else { (n as isize, 1) };
                    let at = |i: usize, p: usize| a[(i as isize * a_rs + p as isize * a_cs) as usize];
                    let bt = |p: usize, j: usize| b[(p as isize * b_rs + j as isize * b_cs) as usize];
                    let dst_rs = n + 3;
                    for accumulate in [false, true] {
                        let start = vals(m * dst_rs, 3);
                        let mut dst = start.clone();
                        let (a, b, dst) = (a.as_ptr(), b.as_ptr(), dst.as_mut_ptr());
                        let o = Narrow { m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, dst, dst_rs, accumulate };
                        assert!(fits(n, k));
                        // SAFETY: fits() holds and the buffers are as the
                        // strides address them.
                        unsafe { o.run() };
                        // SAFETY: `dst` is the live buffer written above.
                        let dst = unsafe { std::slice::from_raw_parts(dst, m * dst_rs) };
                        for i in 0..m {
                            for j in 0..dst_rs {
                                let (got, old) = (dst[i * dst_rs + j], start[i * dst_rs + j]);
                                if j >= n {
                                    assert_eq!(got, old, "padding written at {i},{j}");
                                    continue;
                                }
                                let sum = (0..k).fold(0.0 as $e, |s, p| at(i, p).mul_add(bt(p, j), s));
                                let want = if accumulate { sum + old } else { sum };
                                let what = stringify!($e);
                                assert_eq!(got, want, "{what} {m}x{n}x{k} a_t {a_t} b_t {b_t} acc {accumulate} at {i},{j}");
                            }
                        }
                    }
                }
            }
        }};
    }

    #[test]
    fn narrow_product_matches_an_ordered_fused_sum() {
        if !available() {
            println!("SKIPPED: this processor has no AVX-512F and VL; the narrow product is not used here");
            return;
        }
        check!(f32);
        check!(f64);
        assert!(!fits(8, 20) && !fits(33, 20) && !fits(20, 65) && !fits(20, 0));
    }

    /// Rows computed in any grouping have the same bits: a product split
    /// over threads (parts of any row count) equals the whole.
    #[test]
    fn a_row_split_keeps_every_bit() {
        if !available() {
            println!("SKIPPED: this processor has no AVX-512F and VL; the narrow product is not used here");
            return;
        }
        let (m, n, k) = (29, 20, 20);
        let vals = |len: usize, seed: usize| -> Vec<f32> {
            (0..len).map(|i| ((i * 7919 + seed * 104729) % 1013) as f32 / 1013.0 - 0.5).collect()
        };
        let (a, b) = (vals(m * k, 1), vals(k * n, 2));
        let run = |rows: std::ops::Range<usize>, dst: &mut [f32]| {
            let o = Narrow {
                m: rows.len(),
                n,
                k,
                a: a[rows.start * k..].as_ptr(),
                a_rs: k as isize,
                a_cs: 1,
                b: b.as_ptr(),
                b_rs: n as isize,
                b_cs: 1,
                dst: dst[rows.start * n..].as_mut_ptr(),
                dst_rs: n,
                accumulate: false,
            };
            // SAFETY: the rows lie inside `a` and `dst`; fits() holds.
            unsafe { o.run() };
        };
        let mut whole = vec![0.0f32; m * n];
        run(0..m, &mut whole);
        for cuts in [vec![0, 5, 29], vec![0, 1, 2, 16, 29], vec![0, 13, 14, 29]] {
            let mut parts = vec![0.0f32; m * n];
            for w in cuts.windows(2) {
                run(w[0]..w[1], &mut parts);
            }
            assert_eq!(parts, whole, "cuts {cuts:?}");
        }
    }
}
