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
/// Longest inner dimension handled (`b` packed on the stack: 8 KiB).
pub(crate) const MAX_K: usize = 64;

/// Whether [`Narrow::run`] runs on this processor (AVX-512F and VL; the
/// detection is cached by the standard library).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::cpu::simd::isa() == crate::cpu::simd::Isa::Avx512 && std::arch::is_x86_feature_detected!("avx512vl");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether a product of this shape takes [`Narrow`]: at least a tile of
/// rows, 9 to [`MAX_N`] columns (8 or fewer fill too little of a vector to
/// pay), and 1 to [`MAX_K`] inner terms.
pub(crate) fn fits(m: usize, n: usize, k: usize) -> bool {
    m >= ROWS && (9..=MAX_N).contains(&n) && (1..=MAX_K).contains(&k) && available()
}

/// `dst (m x n, row stride dst_rs) = a (m x k) @ b (k x n)` (`+=` when
/// `accumulate`), with `a[i, p]` at `a + i * a_rs + p * a_cs` and `b[p, j]`
/// at `b + p * b_rs + j * b_cs`.
#[derive(Clone, Copy)]
pub(crate) struct Narrow {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: *const f32,
    pub a_rs: isize,
    pub a_cs: isize,
    pub b: *const f32,
    pub b_rs: isize,
    pub b_cs: isize,
    pub dst: *mut f32,
    pub dst_rs: usize,
    pub accumulate: bool,
}

impl Narrow {
    /// Computes the product.
    ///
    /// # Safety
    /// [`fits`] holds for the shape; the addressed elements of `a` and `b`
    /// are readable; the `m x n` block of `dst` is writable, and
    /// initialised when `accumulate`.
    pub(crate) unsafe fn run(self) {
        debug_assert!(fits(self.m, self.n, self.k));
        let mut packed = [0.0f32; MAX_K * MAX_N];
        for p in 0..self.k {
            for j in 0..self.n {
                // SAFETY: b[p, j] is readable (the caller's contract).
                packed[p * MAX_N + j] = unsafe { *self.b.offset(p as isize * self.b_rs + j as isize * self.b_cs) };
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded from the caller; `packed` holds k rows of 32.
        unsafe {
            avx512::product(&self, &packed)
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("internal: the narrow product without AVX-512");
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Narrow, MAX_N, ROWS};

    /// The vector holding an output row's columns past the first 16.
    trait Tail: Copy {
        unsafe fn zero() -> Self;
        unsafe fn splat(x: f32) -> Self;
        unsafe fn load(p: *const f32) -> Self;
        unsafe fn fma(self, b: Self, c: Self) -> Self;
        unsafe fn add_masked(self, p: *const f32, lanes: usize) -> Self;
        unsafe fn store_masked(self, p: *mut f32, lanes: usize);
    }

    fn mask(lanes: usize) -> u16 {
        ((1u32 << lanes) - 1) as u16
    }

    macro_rules! tail {
        ($t:ty, $zero:ident, $splat:ident, $load:ident, $fma:ident, $loadz:ident, $add:ident, $store:ident, $m:ty) => {
            impl Tail for $t {
                #[inline(always)]
                unsafe fn zero() -> Self {
                    // SAFETY: the kernel runs with AVX-512F and VL.
                    unsafe { $zero() }
                }
                #[inline(always)]
                unsafe fn splat(x: f32) -> Self {
                    // SAFETY: as above.
                    unsafe { $splat(x) }
                }
                #[inline(always)]
                unsafe fn load(p: *const f32) -> Self {
                    // SAFETY: the caller's pointer holds LANES floats.
                    unsafe { $load(p) }
                }
                #[inline(always)]
                unsafe fn fma(self, b: Self, c: Self) -> Self {
                    // SAFETY: as above.
                    unsafe { $fma(self, b, c) }
                }
                #[inline(always)]
                unsafe fn add_masked(self, p: *const f32, lanes: usize) -> Self {
                    // SAFETY: the first `lanes` floats at `p` are readable.
                    unsafe { $add(self, $loadz(mask(lanes) as $m, p)) }
                }
                #[inline(always)]
                unsafe fn store_masked(self, p: *mut f32, lanes: usize) {
                    // SAFETY: the first `lanes` floats at `p` are writable.
                    unsafe { $store(p, mask(lanes) as $m, self) }
                }
            }
        };
    }
    tail!(
        __m128,
        _mm_setzero_ps,
        _mm_set1_ps,
        _mm_loadu_ps,
        _mm_fmadd_ps,
        _mm_maskz_loadu_ps,
        _mm_add_ps,
        _mm_mask_storeu_ps,
        __mmask8
    );
    tail!(
        __m256,
        _mm256_setzero_ps,
        _mm256_set1_ps,
        _mm256_loadu_ps,
        _mm256_fmadd_ps,
        _mm256_maskz_loadu_ps,
        _mm256_add_ps,
        _mm256_mask_storeu_ps,
        __mmask8
    );
    tail!(
        __m512,
        _mm512_setzero_ps,
        _mm512_set1_ps,
        _mm512_loadu_ps,
        _mm512_fmadd_ps,
        _mm512_maskz_loadu_ps,
        _mm512_add_ps,
        _mm512_mask_storeu_ps,
        __mmask16
    );

    /// See [`Narrow`]; `packed` holds `b` in rows of [`MAX_N`], zero-padded.
    #[target_feature(enable = "avx512f,avx512vl,fma")]
    pub(super) unsafe fn product(o: &Narrow, packed: &[f32]) {
        // SAFETY (all four): forwarded.
        unsafe {
            match o.n {
                ..=16 => rows::<__m128, false>(o, packed),
                17..=20 => rows::<__m128, true>(o, packed),
                21..=24 => rows::<__m256, true>(o, packed),
                _ => rows::<__m512, true>(o, packed),
            }
        }
    }

    /// Every tile of rows: [`ROWS`] at a time, then the rest one by one.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,fma")]
    unsafe fn rows<T: Tail, const TAIL: bool>(o: &Narrow, packed: &[f32]) {
        let full = o.m / ROWS * ROWS;
        for i in (0..full).step_by(ROWS) {
            // SAFETY: rows i..i + ROWS are inside the block.
            unsafe { tile::<T, TAIL, ROWS>(o, packed, i) };
        }
        for i in full..o.m {
            // SAFETY: row i is inside the block.
            unsafe { tile::<T, TAIL, 1>(o, packed, i) };
        }
    }

    /// Output rows `i..i + R`.
    #[inline(always)]
    unsafe fn tile<T: Tail, const TAIL: bool, const R: usize>(o: &Narrow, packed: &[f32], i: usize) {
        // SAFETY: every pointer below addresses an element the caller's
        // contract makes readable (`a`, `packed`) or writable (`dst`).
        unsafe {
            let mut head = [_mm512_setzero_ps(); R];
            let mut tail = [T::zero(); R];
            let a = o.a.offset(i as isize * o.a_rs);
            for p in 0..o.k {
                let b = packed.as_ptr().add(p * MAX_N);
                let (bh, bt) = (_mm512_loadu_ps(b), T::load(b.add(16)));
                let ap = a.offset(p as isize * o.a_cs);
                for r in 0..R {
                    let x = *ap.offset(r as isize * o.a_rs);
                    head[r] = _mm512_fmadd_ps(_mm512_set1_ps(x), bh, head[r]);
                    if TAIL {
                        tail[r] = T::splat(x).fma(bt, tail[r]);
                    }
                }
            }
            let (n_head, n_tail) = (o.n.min(16), o.n.saturating_sub(16));
            for r in 0..R {
                let d = o.dst.add((i + r) * o.dst_rs);
                let mh = mask(n_head);
                if o.accumulate {
                    head[r] = _mm512_add_ps(head[r], _mm512_maskz_loadu_ps(mh, d));
                }
                _mm512_mask_storeu_ps(d, mh, head[r]);
                if TAIL {
                    let t = if o.accumulate { tail[r].add_masked(d.add(16), n_tail) } else { tail[r] };
                    t.store_masked(d.add(16), n_tail);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tail class (9-16, 17-20, 21-24, 25-32 columns), whole tiles and
    /// leftover rows, inner dimensions 1 to 64, `a` row-major and
    /// transposed, `b` both ways, padded row strides, and accumulation: each
    /// output the f32 fused sum in order, as a scalar loop computes it.
    #[test]
    fn narrow_product_matches_an_ordered_fused_sum() {
        if !available() {
            println!("SKIPPED: this processor has no AVX-512F; the narrow product is not used here");
            return;
        }
        let vals = |len: usize, seed: usize| -> Vec<f32> {
            (0..len).map(|i| ((i * 7919 + seed * 104729) % 1013) as f32 / 1013.0 - 0.5).collect()
        };
        for (m, n, k) in
            [(6, 9, 1), (13, 16, 20), (20, 17, 7), (31, 20, 20), (8, 21, 64), (7, 24, 3), (19, 25, 33), (12, 32, 64)]
        {
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
                    let o = Narrow {
                        m,
                        n,
                        k,
                        a: a.as_ptr(),
                        a_rs,
                        a_cs,
                        b: b.as_ptr(),
                        b_rs,
                        b_cs,
                        dst: dst.as_mut_ptr(),
                        dst_rs,
                        accumulate,
                    };
                    // SAFETY: fits() holds for these shapes (checked below)
                    // and the buffers are as the strides address them.
                    assert!(fits(m, n, k));
                    unsafe { o.run() };
                    for i in 0..m {
                        for j in 0..dst_rs {
                            let (got, old) = (dst[i * dst_rs + j], start[i * dst_rs + j]);
                            if j >= n {
                                assert_eq!(got, old, "padding written at {i},{j}");
                                continue;
                            }
                            let sum = (0..k).fold(0.0f32, |s, p| at(i, p).mul_add(bt(p, j), s));
                            let want = if accumulate { sum + old } else { sum };
                            assert_eq!(got, want, "{m}x{n}x{k} a_t {a_t} b_t {b_t} acc {accumulate} at {i},{j}");
                        }
                    }
                }
            }
        }
        assert!(!fits(5, 20, 20) && !fits(64, 8, 20) && !fits(64, 33, 20) && !fits(64, 20, 65) && !fits(64, 20, 0));
    }
}
