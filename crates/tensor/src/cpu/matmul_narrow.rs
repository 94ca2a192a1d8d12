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
//! columns past 16 (a Zen 4 issues a 512-bit operation as two 256-bit
//! halves, so a 4-wide tail costs it a quarter of a 16-wide one; a Zen 5
//! runs either in one), while the
//! kernel walks the inner dimension, broadcasting one element of `a` a row
//! (`a` is read in place, any strides). Each output is the sum of its `k`
//! products in order, one fused multiply-add each, from zero; accumulating
//! adds that sum to the old value.
//!
//! Without AVX-512, an AVX2 copy runs the same tiles in 256-bit vectors
//! (8 f32 or 4 f64 lanes, a tail of half or a whole vector) with as many
//! rows a tile as AVX2's 16 registers hold ([`avx2_rows`]: 4 for a 20-wide
//! f32 layer, 2 in f64). The order of every output's products is the
//! same, so both copies give the same bits.

/// Output rows per tile.
const ROWS: usize = 6;
/// Widest output handled.
pub(crate) const MAX_N: usize = 32;
/// Longest inner dimension handled (`b` packed on the stack: 8 or 16 KiB).
pub(crate) const MAX_K: usize = 64;

/// Whether [`Narrow::run`] runs on this processor: AVX2 with FMA (as
/// [`crate::cpu::simd::isa`] says, so `TAPIR_CPU_ISA=portable` turns it
/// off), in the AVX-512 copy where [`avx512`] holds.
pub(crate) fn available() -> bool {
    crate::cpu::simd::isa() >= crate::cpu::simd::Isa::Avx2
}

/// Whether the AVX-512 copies of the matrix kernels run here: the chosen
/// instruction set is AVX-512 and the processor has VL besides (the
/// detection is cached by the standard library).
pub(crate) fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::cpu::simd::isa() == crate::cpu::simd::Isa::Avx512 && std::arch::is_x86_feature_detected!("avx512vl");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Rows a tile of the AVX2 copy for `w` vectors a row (full ones and the
/// tail): the most whose accumulators, the row of `b`'s `w` vectors and a
/// broadcast fit AVX2's 16 registers, from 1 to [`ROWS`].
pub(crate) const fn avx2_rows(w: usize) -> usize {
    let r = 15usize.saturating_sub(w) / w;
    if r < 1 {
        1
    } else if r > ROWS {
        ROWS
    } else {
        r
    }
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
    /// Dispatches [`Narrow::run`] for this type to the copy for `isa`
    /// (AVX-512, or AVX2 for anything narrower).
    unsafe fn product(o: &Narrow<Self>, packed: &[Self], isa: crate::cpu::simd::Isa);
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
        // SAFETY: forwarded from the caller.
        unsafe { self.run_on(crate::cpu::simd::isa()) }
    }

    /// [`Narrow::run`] in the copy for `isa` (tests compare the copies):
    /// the same bits from each.
    ///
    /// # Safety
    /// As [`Narrow::run`], and the processor supports `isa` (at least AVX2).
    pub(crate) unsafe fn run_on(self, isa: crate::cpu::simd::Isa) {
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
            E::product(&self, &packed, isa)
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("internal: the narrow product without AVX2 {isa:?}");
    }
}

#[cfg(target_arch = "x86_64")]
mod kernels {
    use std::arch::x86_64::*;

    use super::{avx2_rows, Elem, Narrow, MAX_N, ROWS};
    use crate::cpu::simd::Isa;
    use crate::cpu::vector256::{F32x4, F32x8, F64x2, F64x4};
    use crate::cpu::vector512::Vector;

    /// Picks `H` (full vectors of `$lanes`) and the tail (quarter, half or
    /// full width, or none) for `o.n` columns, and the rows a tile
    /// (`$rows(vectors a row)`), then runs every tile.
    macro_rules! dispatch {
        ($o:expr, $packed:expr, $lanes:literal, $full:ty, $quarter:ty, $half:ty, $rows:path, [$($h:literal),*]) => {{
            let (o, packed) = ($o, $packed);
            let (h, r) = (o.n / $lanes, o.n % $lanes);
            // SAFETY (every arm): forwarded from `product`'s caller.
            unsafe {
                match (h, r) {
                    $(
                        ($h, 0) => rows::<_, $full, $full, $h, false, $lanes, { $rows($h) }>(o, packed),
                        ($h, r) if r <= $lanes / 4 => rows::<_, $full, $quarter, $h, true, $lanes, { $rows($h + 1) }>(o, packed),
                        ($h, r) if r <= $lanes / 2 => rows::<_, $full, $half, $h, true, $lanes, { $rows($h + 1) }>(o, packed),
                        ($h, _) => rows::<_, $full, $full, $h, true, $lanes, { $rows($h + 1) }>(o, packed),
                    )*
                    _ => unreachable!("internal: fits() bounds the columns"),
                }
            }
        }};
    }

    /// [`ROWS`] rows a tile whatever the width: AVX-512's 32 registers
    /// hold them.
    const fn avx512_rows(_w: usize) -> usize {
        ROWS
    }

    /// `Elem` for one type: its AVX-512 copy (lanes, full, quarter and
    /// half types, full-vector counts) and its AVX2 copy (the same), the
    /// one picked at run time. AVX2 has no quarter-width f32 type: the
    /// f32 copy passes its half as the quarter.
    macro_rules! elem {
        ($e:ty, ($l:literal, $f:ty, $q:ty, $h:ty, $hs:tt), ($l2:literal, $f2:ty, $q2:ty, $h2:ty, $hs2:tt)) => {
            impl Elem for $e {
                unsafe fn product(o: &Narrow<$e>, packed: &[$e], isa: Isa) {
                    #[target_feature(enable = "avx512f,avx512vl,fma")]
                    unsafe fn avx512(o: &Narrow<$e>, packed: &[$e]) {
                        dispatch!(o, packed, $l, $f, $q, $h, avx512_rows, $hs)
                    }
                    #[target_feature(enable = "avx2,fma")]
                    unsafe fn avx2(o: &Narrow<$e>, packed: &[$e]) {
                        dispatch!(o, packed, $l2, $f2, $q2, $h2, avx2_rows, $hs2)
                    }
                    // SAFETY: the caller's `isa` is supported; `avx512`
                    // checks VL.
                    unsafe {
                        if isa == Isa::Avx512 && super::avx512() {
                            avx512(o, packed)
                        } else {
                            avx2(o, packed)
                        }
                    }
                }
            }
        };
    }
    elem!(f32, (16, __m512, __m128, __m256, [0, 1, 2]), (8, F32x8, F32x4, F32x4, [1, 2, 3, 4]));
    elem!(f64, (8, __m512d, __m128d, __m256d, [1, 2, 3, 4]), (4, F64x4, F64x2, F64x2, [2, 3, 4, 5, 6, 7, 8]));

    /// Every tile of rows: `R` at a time, then the rest one by one.
    #[inline(always)]
    unsafe fn rows<
        E: Copy,
        F: Vector<E>,
        T: Vector<E>,
        const H: usize,
        const TAIL: bool,
        const L: usize,
        const R: usize,
    >(
        o: &Narrow<E>,
        packed: &[E],
    ) {
        let full = o.m / R * R;
        for i in (0..full).step_by(R) {
            // SAFETY: rows i..i + R are inside the block.
            unsafe { tile::<E, F, T, H, TAIL, L, R>(o, packed, i) };
        }
        for i in full..o.m {
            // SAFETY: row i is inside the block.
            unsafe { tile::<E, F, T, H, TAIL, L, 1>(o, packed, i) };
        }
    }

    /// Output rows `i..i + R`: `H` full vectors of `L` lanes a row, then
    /// the tail.
    #[inline(always)]
    unsafe fn tile<
        E: Copy,
        F: Vector<E>,
        T: Vector<E>,
        const H: usize,
        const TAIL: bool,
        const L: usize,
        const R: usize,
    >(
        o: &Narrow<E>,
        packed: &[E],
        i: usize,
    ) {
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
                    *x = F::load(b.add(v * L));
                }
                // Only with a tail: at 32 columns there is none, and a
                // load past the row would leave `packed` on its last row.
                let bt = if TAIL { T::load(b.add(H * L)) } else { T::zero() };
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
            let rest = o.n - H * L;
            for (r, (hr, &tr)) in head.iter().zip(&tail).enumerate() {
                let d = o.dst.add((i + r) * o.dst_rs);
                for (v, &acc) in hr.iter().enumerate() {
                    let x = if o.accumulate { acc.add_masked(d.add(v * L), L) } else { acc };
                    x.store_masked(d.add(v * L), L);
                }
                if TAIL {
                    let t = d.add(H * L);
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
    /// f64 (one to four full vectors, each tail), and in the AVX2 copy's
    /// narrower vectors (8 f32 lanes with each tail, 2 to 8 f64 vectors
    /// with each), whole tiles and leftover
    /// rows, inner dimensions 1 to 64, `a` row-major and transposed, `b`
    /// both ways, padded row strides, and accumulation: each output the
    /// fused sum of its products in order, as a scalar loop computes it.
    macro_rules! check {
        ($e:ty, $copy:expr) => {{
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
                (5, 15, 9),
                (11, 27, 17),
                (7, 31, 64),
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
                        // SAFETY: fits() holds, the buffers are as the
                        // strides address them, and the caller checked the
                        // copy is supported.
                        unsafe { o.run_on($copy) };
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
                                let copy = $copy;
                                assert_eq!(got, want, "{what} {copy:?} {m}x{n}x{k} a_t {a_t} b_t {b_t} acc {accumulate} at {i},{j}");
                            }
                        }
                    }
                }
            }
        }};
    }

    /// Each copy the processor has (AVX2, and AVX-512 where present), so
    /// both give the ordered fused sum's bits: the same on every machine.
    #[test]
    fn narrow_product_matches_an_ordered_fused_sum() {
        use crate::cpu::simd::Isa;
        if !available() {
            println!("SKIPPED: this processor has no AVX2 and FMA; the narrow product is not used here");
            return;
        }
        for copy in [Isa::Avx2, Isa::Avx512] {
            if copy == Isa::Avx512 && !avx512() {
                println!("SKIPPED: the AVX-512 copy (this processor has no AVX-512F and VL)");
                continue;
            }
            check!(f32, copy);
            check!(f64, copy);
        }
        assert!(!fits(8, 20) && !fits(33, 20) && !fits(20, 65) && !fits(20, 0));
    }

    /// The AVX2 tiles' rows fit its 16 registers: 6 for one or two
    /// vectors a row, 4 for a 20-wide f32 layer (two vectors and a tail),
    /// 2 for f64's five vectors, and never fewer than 1.
    #[test]
    fn avx2_tiles_fit_the_register_file() {
        assert_eq!(
            [avx2_rows(1), avx2_rows(2), avx2_rows(3), avx2_rows(5), avx2_rows(8), avx2_rows(9)],
            [6, 6, 4, 2, 1, 1]
        );
        for w in 1..=7 {
            assert!(avx2_rows(w) * w + w < 16, "{w} vectors a row");
        }
    }

    /// Rows computed in any grouping have the same bits: a product split
    /// over threads (parts of any row count) equals the whole.
    #[test]
    fn a_row_split_keeps_every_bit() {
        if !available() {
            println!("SKIPPED: this processor has no AVX2 and FMA; the narrow product is not used here");
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
