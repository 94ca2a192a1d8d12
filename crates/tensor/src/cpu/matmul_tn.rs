//! `a^T @ b` for f32 and f64 operands that both store the inner dimension
//! as rows: a weight gradient, `g^T x` summed over a batch, is this
//! product.
//!
//! The gemm crate packs `a` into panels before its microkernel runs; read
//! transposed, that packing cost more than the products here
//! (docs/performance.md). Stored this way the
//! operands need no packing at all: row `p` of `a` holds the `p`-th term's
//! left factors for all output rows and row `p` of `b` its right factors
//! for all columns, so the product is a sum of outer products. Each output
//! tile of 6 rows by up to four 512-bit vectors of columns (64 f32, 32
//! f64) lives in registers while the kernel walks `p`: the full vectors,
//! then a tail of a quarter, half or whole vector sized to the columns
//! left (a 20-wide layer's 20 f32 columns are 16 + 4, not 16 + a masked
//! 16: [`crate::cpu::vector512`]).
//!
//! Rows of `p` are taken in blocks of [`P_BLOCK`], so a block of `b`
//! (a panel's columns x 64 rows, 16 KiB) stays in the L1 cache for every
//! tile. Each output is its products' fused sum in order of `p`, from zero
//! (or from the old value when accumulating).

/// Rows of the inner dimension per block.
const P_BLOCK: usize = 64;
/// Output rows per tile.
const ROWS: usize = 6;

/// Whether [`Outer::run`] runs on this processor: AVX2 with FMA (as
/// [`crate::cpu::simd::isa`] says, so `TAPIR_CPU_ISA=portable` turns it
/// off), in the AVX-512 copy where the processor has AVX-512F and VL.
pub(crate) fn available() -> bool {
    crate::cpu::simd::isa() >= crate::cpu::simd::Isa::Avx2
}

/// The element types the kernel has: f32 and f64.
pub(crate) trait Elem: Copy + Default + std::ops::Add<Output = Self> + 'static {
    /// Lanes of a 512-bit vector (also where a narrow output is computed
    /// transposed, on every instruction set alike, so the bits agree).
    const LANES: usize;
    /// The most output rows taken (a block of `a`, [`P_BLOCK`] rows of
    /// them, stays within 32 KiB).
    const MAX_M: usize;
    #[cfg(target_arch = "x86_64")]
    /// Dispatches [`Outer::run`] for this type to the copy for `isa`
    /// (AVX-512, or AVX2 for anything narrower).
    unsafe fn outer_sum(o: Outer<Self>, isa: crate::cpu::simd::Isa);
}

/// Whether a product with `m` output rows takes [`Outer`] for `E`.
pub(crate) fn fits<E: Elem>(m: usize) -> bool {
    m <= E::MAX_M && available()
}

/// `dst (m x n, row stride dst_rs) = sum over p < k of a[p, ..m]^T b[p, ..n]`
/// (`+=` when `accumulate`), with `a[p, i]` at `a + p * lda + i` and
/// `b[p, j]` at `b + p * ldb + j`.
#[derive(Clone, Copy)]
pub(crate) struct Outer<E> {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: *const E,
    pub lda: usize,
    pub b: *const E,
    pub ldb: usize,
    pub dst: *mut E,
    pub dst_rs: usize,
    pub accumulate: bool,
}

impl<E: Elem> Outer<E> {
    /// Computes the product.
    ///
    /// # Safety
    /// [`available`] is true; the addressed elements of `a` and `b` are
    /// readable; the `m x n` block of `dst` is writable, and initialised
    /// when `accumulate`.
    pub(crate) unsafe fn run(self) {
        // SAFETY: forwarded from the caller.
        unsafe { self.run_on(crate::cpu::simd::isa()) }
    }

    /// [`Outer::run`] in the copy for `isa` (tests compare the copies): the
    /// same bits from each, every output its products' fused sum in order.
    ///
    /// # Safety
    /// As [`Outer::run`], and the processor supports `isa` (at least AVX2).
    pub(crate) unsafe fn run_on(self, isa: crate::cpu::simd::Isa) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded from the caller.
        unsafe {
            let Outer { m, n, dst, dst_rs, accumulate, .. } = self;
            if n < E::LANES && m > n {
                // A narrow output (a first layer's `[64, 2]` gradient) would
                // fill one register per tile row, and each register's chain
                // of adds would wait on the last: 18 us for 64 x 2 x 1024.
                // Its transpose has rows of `m` columns: computed there, then
                // copied.
                let mut t = vec![E::default(); n * m];
                let swapped = Outer { m: n, n: m, a: self.b, lda: self.ldb, b: self.a, ldb: self.lda, ..self };
                E::outer_sum(Outer { dst: t.as_mut_ptr(), dst_rs: m, accumulate: false, ..swapped }, isa);
                for i in 0..m {
                    let row = std::slice::from_raw_parts_mut(dst.add(i * dst_rs), n);
                    for (j, o) in row.iter_mut().enumerate() {
                        *o = if accumulate { *o + t[j * m + i] } else { t[j * m + i] };
                    }
                }
                return;
            }
            E::outer_sum(self, isa)
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("internal: outer_sum without AVX2 {isa:?}");
    }
}

#[cfg(target_arch = "x86_64")]
mod kernels {
    use std::arch::x86_64::*;

    use super::{Elem, Outer, P_BLOCK, ROWS};
    use crate::cpu::simd::Isa;
    use crate::cpu::vector256::{F32x4, F32x8, F64x2, F64x4};
    use crate::cpu::vector512::Vector;

    /// Whether the AVX-512 copy runs for `isa` on this processor.
    fn wide(isa: Isa) -> bool {
        isa == Isa::Avx512 && crate::cpu::matmul_narrow::avx512()
    }

    /// `Elem` for one type: its lanes, its row limit, and its two copies.
    /// A panel is four 512-bit vectors of columns, or two 256-bit ones
    /// where AVX2's 16 registers hold six rows of them and the operands'
    /// row besides; AVX2 has no quarter-width type, so its half serves.
    macro_rules! elem {
        ($e:ty, $lanes:literal, $max_m:literal, [$f:ty, $q:ty, $h:ty], [$f2:ty, $h2:ty]) => {
            impl Elem for $e {
                const LANES: usize = $lanes;
                const MAX_M: usize = $max_m;
                unsafe fn outer_sum(o: Outer<$e>, isa: Isa) {
                    #[target_feature(enable = "avx512f,avx512vl,fma")]
                    unsafe fn avx512(o: Outer<$e>) {
                        // SAFETY: forwarded from `Outer::run`'s caller.
                        unsafe { panels::<$e, $f, $q, $h, $lanes, 4>(o) }
                    }
                    #[target_feature(enable = "avx2,fma")]
                    unsafe fn avx2(o: Outer<$e>) {
                        // SAFETY: as above.
                        unsafe { panels::<$e, $f2, $h2, $h2, { $lanes / 2 }, 2>(o) }
                    }
                    // SAFETY: the caller's `isa` is supported; `wide` checks VL.
                    unsafe {
                        if wide(isa) {
                            avx512(o)
                        } else {
                            avx2(o)
                        }
                    }
                }
            }
        };
    }
    elem!(f32, 16, 128, [__m512, __m128, __m256], [F32x8, F32x4]);
    elem!(f64, 8, 64, [__m512d, __m128d, __m256d], [F64x4, F64x2]);

    /// Every panel of up to `V` full vectors of `L` lanes, every block of
    /// [`P_BLOCK`] inner rows, every tile of rows. `F` is the full vector,
    /// `Q` and `H` the quarter and half ones.
    #[inline(always)]
    unsafe fn panels<E: Elem, F: Vector<E>, Q: Vector<E>, H: Vector<E>, const L: usize, const V: usize>(o: Outer<E>) {
        let Outer { m, n, k, a, lda, b, ldb, dst, dst_rs, accumulate } = o;
        if k == 0 {
            if !accumulate {
                for i in 0..m {
                    // SAFETY: row i of the block is writable.
                    unsafe { std::slice::from_raw_parts_mut(dst.add(i * dst_rs), n) }.fill(E::default());
                }
            }
            return;
        }
        for j0 in (0..n).step_by(V * L) {
            let width = (V * L).min(n - j0);
            for p0 in (0..k).step_by(P_BLOCK) {
                // The first block starts from zero unless accumulating.
                let load = accumulate || p0 > 0;
                let mut i0 = 0;
                while i0 < m {
                    // Tiles of 6 rows, then of 4, 2 and 1 for the rest.
                    let rows = [ROWS, 4, 2, 1].into_iter().find(|&r| r <= m - i0).expect("1 <= m - i0");
                    let t = Tile {
                        width,
                        k: P_BLOCK.min(k - p0),
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
                    unsafe { t.run::<F, Q, H, L, V>(rows) };
                    i0 += rows;
                }
            }
        }
    }

    /// Some rows by up to a panel of columns of the output, over `k` rows
    /// of the operands.
    struct Tile<E> {
        width: usize,
        k: usize,
        a: *const E,
        lda: usize,
        b: *const E,
        ldb: usize,
        dst: *mut E,
        dst_rs: usize,
        load: bool,
    }

    impl<E: Elem> Tile<E> {
        /// Dispatches to the copy compiled for this tile's rows, full
        /// vectors and tail, so the accumulators stay in registers.
        #[inline(always)]
        unsafe fn run<F: Vector<E>, Q: Vector<E>, H: Vector<E>, const L: usize, const V: usize>(&self, rows: usize) {
            let lanes = L;
            let (full, rest) = (self.width / lanes, self.width % lanes);
            macro_rules! by_rows {
                ($t:ty, $h:expr, $tail:literal) => {
                    // SAFETY: forwarded from `run`'s caller.
                    unsafe {
                        match rows {
                            ROWS => self.kernel::<F, $t, $h, $tail, ROWS, L>(),
                            4 => self.kernel::<F, $t, $h, $tail, 4, L>(),
                            2 => self.kernel::<F, $t, $h, $tail, 2, L>(),
                            _ => self.kernel::<F, $t, $h, $tail, 1, L>(),
                        }
                    }
                };
            }
            macro_rules! by_tail {
                ($($h:literal),*) => {
                    match (full, rest) {
                        (f, _) if f == V => by_rows!(F, V, false),
                        $(
                            ($h, 0) => by_rows!(F, $h, false),
                            ($h, r) if r <= lanes / 4 => by_rows!(Q, $h, true),
                            ($h, r) if r <= lanes / 2 => by_rows!(H, $h, true),
                            ($h, _) => by_rows!(F, $h, true),
                        )*
                        _ => unreachable!("internal: a panel is at most V vectors wide"),
                    }
                };
            }
            by_tail!(0, 1, 2, 3)
        }

        /// `R` rows: `N` full vectors a row, then (with `TAIL`) the rest
        /// of the width in one `T`.
        #[inline(always)]
        unsafe fn kernel<
            F: Vector<E>,
            T: Vector<E>,
            const N: usize,
            const TAIL: bool,
            const R: usize,
            const L: usize,
        >(
            &self,
        ) {
            let lanes = L;
            let rest = self.width - N * lanes;
            // SAFETY: every pointer below addresses an element of the
            // operands' rows or of the block (the caller's contract); the
            // tail's loads and stores stop at the width.
            unsafe {
                let mut head = [[F::zero(); N]; R];
                let mut tail = [T::zero(); R];
                if self.load {
                    for (r, (hr, tr)) in head.iter_mut().zip(tail.iter_mut()).enumerate() {
                        let d = self.dst.add(r * self.dst_rs);
                        for (v, x) in hr.iter_mut().enumerate() {
                            *x = F::load(d.add(v * lanes));
                        }
                        if TAIL {
                            *tr = T::load_masked(d.add(N * lanes), rest);
                        }
                    }
                }
                for p in 0..self.k {
                    let bp = self.b.add(p * self.ldb);
                    let mut bh = [F::zero(); N];
                    for (v, x) in bh.iter_mut().enumerate() {
                        *x = F::load(bp.add(v * lanes));
                    }
                    let bt = if TAIL { T::load_masked(bp.add(N * lanes), rest) } else { T::zero() };
                    // Row p of `a` holds this tile's R factors.
                    let ap = self.a.add(p * self.lda);
                    for (r, (hr, tr)) in head.iter_mut().zip(tail.iter_mut()).enumerate() {
                        let x = *ap.add(r);
                        let xv = F::splat(x);
                        for (acc, &bv) in hr.iter_mut().zip(&bh) {
                            *acc = xv.fma(bv, *acc);
                        }
                        if TAIL {
                            *tr = T::splat(x).fma(bt, *tr);
                        }
                    }
                }
                for (r, (hr, &tr)) in head.iter().zip(&tail).enumerate() {
                    let d = self.dst.add(r * self.dst_rs);
                    for (v, &x) in hr.iter().enumerate() {
                        x.store_masked(d.add(v * lanes), lanes);
                    }
                    if TAIL {
                        tr.store_masked(d.add(N * lanes), rest);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every panel shape (0 to 4 full vectors, each tail class), row tiles
    /// of 6, 4, 2 and 1, several panels and inner blocks, padded strides,
    /// the transposed narrow case, and accumulation, in f32 and f64: each
    /// output its products' fused sum in order of `p`, as a scalar loop
    /// computes it.
    macro_rules! check {
        ($e:ty, $isa:expr) => {{
            let vals = |len: usize, seed: usize| -> Vec<$e> {
                (0..len).map(|i| ((i * 7919 + seed * 104729) % 1013) as $e / 1013.0 - 0.5).collect()
            };
            let lanes = <$e as Elem>::LANES;
            let mut shapes = vec![(64, 64, 512), (1, 64, 1024), (13, 130, 200), (6, 16, 64), (5, 1, 65), (64, 2, 70)];
            // Each tail class after 0 to 3 full vectors, and four full.
            for full in 0..4 {
                for rest in [1, lanes / 4, lanes / 4 + 1, lanes / 2, lanes / 2 + 1, lanes - 1, 0] {
                    if full * lanes + rest > 0 {
                        shapes.push((19, full * lanes + rest, 70));
                    }
                }
            }
            // Every width up to two 512-bit vectors: each tail class of
            // the AVX2 copy's half-width vectors too.
            shapes.extend((1..=2 * lanes).map(|n| (19, n, 70)));
            shapes.push((7, 4 * lanes, 3));
            shapes.push((20, 20, 0));
            for (m, n, k) in shapes {
                let m = m.min(<$e as Elem>::MAX_M);
                let (lda, ldb, dst_rs) = (m + 3, n + 5, n + 2);
                let (a, b) = (vals(k * lda, 1), vals(k * ldb, 2));
                for accumulate in [false, true] {
                    let start = vals(m * dst_rs, 3);
                    let mut dst = start.clone();
                    let o = Outer { m, n, k, a: a.as_ptr(), lda, b: b.as_ptr(), ldb, dst: dst.as_mut_ptr(), dst_rs, accumulate };
                    // SAFETY: the processor has `$isa` (checked by the
                    // caller); sizes as allocated above.
                    unsafe { o.run_on($isa) };
                    let swapped = n < lanes && m > n;
                    for i in 0..m {
                        for j in 0..dst_rs {
                            let (got, old) = (dst[i * dst_rs + j], start[i * dst_rs + j]);
                            if j >= n {
                                assert_eq!(got, old, "padding written at {i},{j}");
                                continue;
                            }
                            let (x, y) = (|p: usize| a[p * lda + i], |p: usize| b[p * ldb + j]);
                            let want = if swapped || !accumulate {
                                let sum = (0..k).fold(0.0 as $e, |s, p| x(p).mul_add(y(p), s));
                                if accumulate { old + sum } else { sum }
                            } else {
                                (0..k).fold(old, |s, p| x(p).mul_add(y(p), s))
                            };
                            let what = stringify!($e);
                            assert_eq!(got, want, "{what} {:?} {m}x{n}x{k} acc {accumulate} at {i},{j}", $isa);
                        }
                    }
                }
            }
        }};
    }

    /// Each copy the processor has (AVX2, and AVX-512 where present), so
    /// both give the ordered fused sum's bits: the same on every machine.
    #[test]
    fn outer_sum_matches_an_ordered_fused_sum() {
        use crate::cpu::simd::{isa, Isa};
        if !available() {
            println!("SKIPPED: this processor has no AVX2 and FMA; outer_sum is not used here");
            return;
        }
        for copy in [Isa::Avx2, Isa::Avx512] {
            if copy == Isa::Avx512 && !crate::cpu::matmul_narrow::avx512() {
                println!("SKIPPED: the AVX-512 copy (this processor has no AVX-512F and VL)");
                continue;
            }
            check!(f32, copy);
            check!(f64, copy);
        }
        assert!(fits::<f32>(128) && !fits::<f32>(129) && fits::<f64>(64) && !fits::<f64>(65));
        println!("processor runs {:?}", isa());
    }
}
