//! `a^T @ b` for f32 operands that both store the inner dimension as rows:
//! a weight gradient, `g^T x` summed over a batch, is this product.
//!
//! The gemm crate packs `a` into panels before its microkernel runs; read
//! transposed, that packing cost more than the products here
//! (docs/performance.md). Stored this way the
//! operands need no packing at all: row `p` of `a` holds the `p`-th term's
//! left factors for all output rows and row `p` of `b` its right factors
//! for all columns, so the product is a sum of outer products. Each output
//! tile of 6 rows by up to 64 columns lives in 24 AVX-512 registers while
//! the kernel walks `p`.
//!
//! Rows of `p` are taken in blocks of [`P_BLOCK`], so a block of `b`
//! (64 columns x 64 rows, 16 KiB) stays in the L1 cache for every tile.

/// Rows of the inner dimension per block.
const P_BLOCK: usize = 64;
/// Output rows per tile.
const ROWS: usize = 6;

/// Whether [`Outer::run`] runs on this processor (AVX-512F).
pub(crate) fn available() -> bool {
    crate::cpu::simd::isa() == crate::cpu::simd::Isa::Avx512
}

/// `dst (m x n, row stride dst_rs) = sum over p < k of a[p, ..m]^T b[p, ..n]`
/// (`+=` when `accumulate`), with `a[p, i]` at `a + p * lda + i` and
/// `b[p, j]` at `b + p * ldb + j`.
#[derive(Clone, Copy)]
pub(crate) struct Outer {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: *const f32,
    pub lda: usize,
    pub b: *const f32,
    pub ldb: usize,
    pub dst: *mut f32,
    pub dst_rs: usize,
    pub accumulate: bool,
}

impl Outer {
    /// Computes the product.
    ///
    /// # Safety
    /// [`available`] is true; the addressed elements of `a` and `b` are
    /// readable; the `m x n` block of `dst` is writable, and initialised
    /// when `accumulate`.
    pub(crate) unsafe fn run(self) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded from the caller.
        unsafe {
            let Outer { m, n, dst, dst_rs, accumulate, .. } = self;
            if n < 16 && m > n {
                // A narrow output (a first layer's `[64, 2]` gradient) would
                // fill one register per tile row, and each register's chain
                // of adds would wait on the last: 18 us for 64 x 2 x 1024.
                // Its transpose has rows of `m` columns: computed there, then
                // copied.
                let mut t = vec![0.0f32; n * m];
                let swapped = Outer { m: n, n: m, a: self.b, lda: self.ldb, b: self.a, ldb: self.lda, ..self };
                avx512::outer_sum(Outer { dst: t.as_mut_ptr(), dst_rs: m, accumulate: false, ..swapped });
                for i in 0..m {
                    let row = std::slice::from_raw_parts_mut(dst.add(i * dst_rs), n);
                    for (j, o) in row.iter_mut().enumerate() {
                        *o = if accumulate { *o + t[j * m + i] } else { t[j * m + i] };
                    }
                }
                return;
            }
            avx512::outer_sum(self)
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("internal: outer_sum without AVX-512");
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Outer, P_BLOCK, ROWS};

    /// See [`Outer`].
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn outer_sum(o: Outer) {
        let Outer { m, n, k, a, lda, b, ldb, dst, dst_rs, accumulate } = o;
        if k == 0 {
            if !accumulate {
                for i in 0..m {
                    // SAFETY: row i of the block is writable.
                    unsafe { std::ptr::write_bytes(dst.add(i * dst_rs), 0, n) };
                }
            }
            return;
        }
        for j0 in (0..n).step_by(64) {
            let width = 64.min(n - j0);
            for p0 in (0..k).step_by(P_BLOCK) {
                let block = P_BLOCK.min(k - p0);
                // The first block starts from zero unless accumulating.
                let load = accumulate || p0 > 0;
                for i0 in (0..m).step_by(ROWS) {
                    let t = Tile {
                        rows: ROWS.min(m - i0),
                        width,
                        k: block,
                        // SAFETY: offsets inside the operands and the block.
                        a: unsafe { a.add(p0 * lda + i0) },
                        lda,
                        b: unsafe { b.add(p0 * ldb + j0) },
                        ldb,
                        dst: unsafe { dst.add(i0 * dst_rs + j0) },
                        dst_rs,
                        load,
                    };
                    // SAFETY: forwarded; the tile lies inside the block.
                    unsafe { t.run() };
                }
            }
        }
    }

    /// Up to [`ROWS`] rows by up to 64 columns of the output, over `k`
    /// rows of the operands.
    struct Tile {
        rows: usize,
        width: usize,
        k: usize,
        a: *const f32,
        lda: usize,
        b: *const f32,
        ldb: usize,
        dst: *mut f32,
        dst_rs: usize,
        load: bool,
    }

    impl Tile {
        /// Dispatches to the copy compiled for this tile's row and vector
        /// counts, so the accumulators stay in registers.
        #[target_feature(enable = "avx512f")]
        unsafe fn run(&self) {
            let vectors = self.width.div_ceil(16);
            macro_rules! by_vectors {
                ($r:literal) => {
                    // SAFETY: forwarded from `run`'s caller.
                    unsafe {
                        match vectors {
                            1 => self.kernel::<$r, 1>(),
                            2 => self.kernel::<$r, 2>(),
                            3 => self.kernel::<$r, 3>(),
                            _ => self.kernel::<$r, 4>(),
                        }
                    }
                };
            }
            match self.rows {
                1 => by_vectors!(1),
                2 => by_vectors!(2),
                3 => by_vectors!(3),
                4 => by_vectors!(4),
                5 => by_vectors!(5),
                _ => by_vectors!(6),
            }
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn kernel<const R: usize, const V: usize>(&self) {
            // Lanes of the last vector inside the width (all 16 otherwise).
            let tail = self.width - 16 * (V - 1);
            let last: __mmask16 = if tail >= 16 { 0xffff } else { (1u16 << tail) - 1 };
            let mask = |v: usize| if v + 1 == V { last } else { 0xffff };
            let mut acc = [[_mm512_setzero_ps(); V]; R];
            if self.load {
                for (r, row) in acc.iter_mut().enumerate() {
                    for (v, x) in row.iter_mut().enumerate() {
                        // SAFETY: inside the block (masked past the width).
                        *x = unsafe { _mm512_maskz_loadu_ps(mask(v), self.dst.add(r * self.dst_rs + 16 * v)) };
                    }
                }
            }
            for p in 0..self.k {
                // SAFETY: row p of `b`, masked past the width.
                let bp = unsafe { self.b.add(p * self.ldb) };
                let mut bv = [_mm512_setzero_ps(); V];
                for (v, x) in bv.iter_mut().enumerate() {
                    *x = unsafe { _mm512_maskz_loadu_ps(mask(v), bp.add(16 * v)) };
                }
                // SAFETY: row p of `a` holds this tile's R factors.
                let ap = unsafe { self.a.add(p * self.lda) };
                for (r, row) in acc.iter_mut().enumerate() {
                    let x = _mm512_set1_ps(unsafe { *ap.add(r) });
                    for (v, y) in row.iter_mut().enumerate() {
                        *y = _mm512_fmadd_ps(x, bv[v], *y);
                    }
                }
            }
            for (r, row) in acc.iter().enumerate() {
                for (v, x) in row.iter().enumerate() {
                    // SAFETY: inside the block (masked past the width).
                    unsafe { _mm512_mask_storeu_ps(self.dst.add(r * self.dst_rs + 16 * v), mask(v), *x) };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: &[f32], lda: usize, b: &[f32], ldb: usize) -> Vec<f64> {
        let mut out = vec![0.0f64; m * n];
        for p in 0..k {
            for i in 0..m {
                for j in 0..n {
                    out[i * n + j] += a[p * lda + i] as f64 * b[p * ldb + j] as f64;
                }
            }
        }
        out
    }

    /// Every tile shape (rows 1-6, 1-4 vectors, masked widths), several
    /// column panels and inner blocks, padded strides, and accumulation.
    #[test]
    fn outer_sum_matches_a_naive_sum() {
        if !available() {
            println!("SKIPPED: this processor has no AVX-512F; outer_sum is not used here");
            return;
        }
        let vals = |len: usize, seed: usize| -> Vec<f32> {
            (0..len).map(|i| ((i * 7919 + seed * 104729) % 1013) as f32 / 1013.0 - 0.5).collect()
        };
        for (m, n, k) in
            [(64, 64, 512), (1, 64, 1024), (7, 20, 3), (13, 130, 200), (6, 16, 64), (5, 1, 65), (64, 2, 70)]
        {
            let (lda, ldb, dst_rs) = (m + 3, n + 5, n + 2);
            let (a, b) = (vals(k * lda, 1), vals(k * ldb, 2));
            let want = naive(m, n, k, &a, lda, &b, ldb);
            for accumulate in [false, true] {
                let start = vals(m * dst_rs, 3);
                let mut dst = start.clone();
                // SAFETY: available() checked; sizes as allocated above.
                unsafe {
                    Outer { m, n, k, a: a.as_ptr(), lda, b: b.as_ptr(), ldb, dst: dst.as_mut_ptr(), dst_rs, accumulate }
                        .run()
                };
                for i in 0..m {
                    for j in 0..dst_rs {
                        let got = dst[i * dst_rs + j] as f64;
                        if j >= n {
                            assert_eq!(dst[i * dst_rs + j], start[i * dst_rs + j], "padding written at {i},{j}");
                            continue;
                        }
                        let w = want[i * n + j] + if accumulate { start[i * dst_rs + j] as f64 } else { 0.0 };
                        assert!((got - w).abs() <= 1e-4 * (1.0 + w.abs()), "{m}x{n}x{k} at {i},{j}: {got} vs {w}");
                    }
                }
            }
        }
    }
}
