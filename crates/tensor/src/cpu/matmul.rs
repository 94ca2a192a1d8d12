//! The CPU kernels of matrix products ([`crate::backend::matmul`]): a sum of
//! strided products into one block (`Gemm`, on the gemm crate's
//! microkernels and the pool), batched products, the one-job linear layer
//! with its epilogue, and `gemm_into` for kernels that own their buffers.

use smallvec::SmallVec;

use super::{float_src, host, CpuBackend};
use crate::backend::matmul::{Epilogue as Then, MatmulPlan};
use crate::backend::{MatmulKernels, Src};
use crate::storage::{CpuElement, Storage};
use crate::{with_float, DType, Float, Layout, Result, Shape};

impl MatmulKernels for CpuBackend {
    /// f16 and bf16 through f32 copies of both operands.
    fn matmul(&self, plan: &MatmulPlan, a: Src<'_>, b: Src<'_>) -> Result<Storage> {
        let (wide, layout);
        let b = if b.dtype() == b.dtype().compute() {
            b
        } else {
            wide = Storage::cpu(super::shape::cast(b, b.dtype().compute())?);
            layout = Layout::contiguous(b.shape().clone());
            Src { storage: &wide, layout: &layout }
        };
        float_src(
            "matmul",
            a,
            |a| with_float!(a.dtype(), T => Ok(Storage::cpu(T::wrap(kernel::<T>(a, b, plan)?))), _ => unreachable!()),
        )
    }

    /// f32 and f64 only, with `h` contiguous.
    fn linear_sum(
        &self,
        terms: &[(Src<'_>, Src<'_>)],
        bias: Option<Src<'_>>,
        then: Then<'_>,
        dims: (usize, usize),
    ) -> Result<Option<Storage>> {
        eager_linear_sum(terms, bias, then, dims)
    }
}

/// From this many multiply-adds on, one product is split over the spinning
/// helpers of [`crate::cpu::pool`] (about 20 us of work on one core). Splitting
/// through rayon measured slower than one thread up to 16 Mi multiply-adds:
/// its workers fall asleep between a step's products and each wake-up costs
/// more than half a 1024 x 64 x 64 product on these virtual machines.
const SPLIT_MIN: usize = 1 << 20;

/// One strided product's operands: `a` is `m x k`, `b` is `k x n`.
#[derive(Clone, Copy)]
struct Term<T> {
    k: usize,
    a: *const T,
    a_rs: isize,
    a_cs: isize,
    b: *const T,
    b_rs: isize,
    b_cs: isize,
}

/// A sum of strided products into one row-major block,
/// `dst = bias + a_1 @ b_1 + a_2 @ b_2 + ...` (`dst +=` when `accumulate`),
/// the bias a row of `n` broadcast over the `m` rows, then an [`Epilogue`].
/// A product rule's tangent (`ta @ b + a @ tb`), a linear layer
/// (`x @ w^T + b`) and a tanh layer are each one `Gemm`: split over the
/// pool as one job, each part computing every term, the bias and the
/// epilogue for its own rows, so no row crosses between cores.
#[derive(Clone)]
struct Gemm<T> {
    m: usize,
    n: usize,
    dst: *mut T,
    dst_rs: usize,
    terms: SmallVec<[Term<T>; 2]>,
    bias: Option<*const T>,
    accumulate: bool,
    then: Epilogue<T>,
}

/// What a [`Gemm`] does to its block once every term is in, on the thread
/// that computed it, while the block is still in that core's cache.
#[derive(Clone, Copy)]
enum Epilogue<T> {
    Nothing,
    /// `tanh` of every element: a tanh layer's forward.
    Tanh,
    /// Times `1 - h^2`, `h` a block of the same shape (row stride `h_rs`):
    /// a tanh layer's tangent.
    TanhBackward {
        h: *const T,
        h_rs: usize,
    },
}

// SAFETY: a `Gemm` is a description of disjoint output blocks and shared
// read-only operands; `run` hands each part's block to one thread only.
unsafe impl<T> Send for Gemm<T> {}
unsafe impl<T> Sync for Gemm<T> {}
// SAFETY: a `Term`'s operands are only read.
unsafe impl<T> Send for Term<T> {}
unsafe impl<T> Sync for Term<T> {}

/// Inner dimensions up to this get a strided `b` packed row-major first.
const SMALL_K: usize = 16;
/// Outputs up to this many elements with an inner dimension of two
/// [`K_CHUNK`]s or more take [`Gemm::split_k`].
const SMALL_OUT: usize = 1 << 14;
/// The inner-dimension chunk of [`Gemm::split_k`].
const K_CHUNK: usize = 512;
/// A wide product (`n > m`) whose `b` holds at least this many bytes (two
/// cores' L2 caches several times over, a quarter of the Zen 4's L3) is
/// split by columns.
const WIDE_B_BYTES: usize = 8 << 20;

/// `Some(f::<T, f32>(args))` when `T` is f32, `Some(f::<T, f64>(args))`
/// when it is f64, else `None`: the call to an unsafe kernel entry
/// generic over `T` and an element type `E` that must be `T` itself (the
/// check folds away at compile time).
macro_rules! as_f32_or_f64 {
    ($t:ty, $f:ident($($arg:expr),*)) => {{
        use std::any::TypeId;
        if TypeId::of::<$t>() == TypeId::of::<f32>() {
            // SAFETY: `E` is `T` here (the caller's contract for `$f`).
            Some(unsafe { $f::<$t, f32>($($arg),*) })
        } else if TypeId::of::<$t>() == TypeId::of::<f64>() {
            // SAFETY: as above.
            Some(unsafe { $f::<$t, f64>($($arg),*) })
        } else {
            None
        }
    }};
}

impl<T: Float> Gemm<T> {
    /// One product, `dst = a @ b` (or `+=`).
    fn single(m: usize, n: usize, dst: *mut T, dst_rs: usize, term: Term<T>, accumulate: bool) -> Self {
        Gemm { m, n, dst, dst_rs, terms: smallvec::smallvec![term], bias: None, accumulate, then: Epilogue::Nothing }
    }

    /// Runs the sum, split by output rows (or columns, for wide or short
    /// outputs, or by the inner dimension, for small outputs of long ones)
    /// over the pool when it is large enough.
    ///
    /// # Safety
    /// Every element the description addresses lies inside a live buffer
    /// (the bias: `n` elements; an epilogue's `h`: an `m x n` block); the
    /// `m x n` block at `dst` is not read or written by anyone else
    /// meanwhile, and is only read when `accumulate`.
    unsafe fn run(mut self) {
        if self.m == 0 || self.n == 0 {
            return;
        }
        // The gemm crate reads a thin `b` in place, and strided (a
        // transposed weight: a network's first layer on 2-D points) that
        // took 31 us for 1024 x 64 x 2 against 8 us row-major. A copy of
        // k x n elements costs nothing beside it.
        let mut packed: SmallVec<[Vec<T>; 2]> = SmallVec::new();
        for t in self.terms.iter_mut() {
            if t.k <= SMALL_K && t.b_cs != 1 && self.m >= 64 {
                let mut p = Vec::with_capacity(t.k * self.n);
                for r in 0..t.k {
                    // SAFETY: row r of `b` lies inside it (the caller's contract).
                    p.extend((0..self.n).map(|j| unsafe { *t.b.offset(r as isize * t.b_rs + j as isize * t.b_cs) }));
                }
                // `p`'s heap block stays put when `packed` grows.
                *t = Term { b: p.as_ptr(), b_rs: self.n as isize, b_cs: 1, ..*t };
                packed.push(p);
            }
        }
        let (m, n) = (self.m, self.n);
        let k_max = self.terms.iter().map(|t| t.k).max().unwrap_or(0);
        let macs: usize = self.terms.iter().map(|t| m * n * t.k).sum();
        // A small output of a long inner dimension (a weight gradient
        // `g^T x` over a batch) splits that dimension: also a thin one
        // (`1 x 64 x 1024`, a last layer's), too cheap to split for itself,
        // whose operands are as large as a split elementwise op's, so each
        // thread reads the rows of `x` and `g` the ops around it gave it.
        if m * n <= SMALL_OUT
            && k_max >= 2 * K_CHUNK
            && (macs >= SPLIT_MIN || k_max * m.max(n) >= crate::cpu::iter::SPLIT_MIN)
        {
            // SAFETY: forwarded from the caller.
            return unsafe { self.split_k(k_max) };
        }
        // One part per thread: the caller takes rows 0.., the helper the
        // rows after, the split [`crate::cpu::iter::fill_vec`] makes of an
        // elementwise output of that size, so the next op finds each half in
        // the cache of the core that wrote it.
        let by_work = crate::cpu::pool::parts_for(macs, SPLIT_MIN);
        // A tall product too cheap to be worth splitting for itself (a
        // network's first or last layer: 1024 x 64 x 2, 1024 x 1 x 64) is
        // still split by rows when its output or its left operand is as
        // large as a split elementwise op's: each thread then reads and
        // writes the rows the ops around it give that thread, where one
        // thread doing all rows would move half of them between the cores.
        let tall = m >= 64 && m * n.max(k_max) >= crate::cpu::iter::SPLIT_MIN;
        let parts = if by_work == 1 && tall {
            crate::cpu::pool::parts_for(m * n.max(k_max), crate::cpu::iter::SPLIT_MIN)
        } else {
            by_work
        };
        // The microkernels cover 16 rows or 4 columns at a time.
        let rows = m.div_ceil(parts).next_multiple_of(16);
        let cols = n.div_ceil(parts).next_multiple_of(4);
        // A wide product whose `b` outgrows the caches (a chunk of logits,
        // `h W^T` with `n` the vocabulary: a 94 MiB weight) splits by
        // columns: by rows, every thread would pack all of `b` from memory
        // for its share of the rows; by columns each packs its share of `b`
        // and all of the small `a`. At 1,048 x 32,000 x 768 on the 2-core
        // Zen 4, four interleaved pairs under load: 89-100 GFLOP/s by
        // columns against 88-97 by rows (docs/performance.md). A `b` that
        // fits (the mini-GPT's 64 x 256 x 576, 576 KiB) keeps the row split:
        // by columns its steps took 1-2% longer in three pairs of four.
        let b_bytes = k_max * n * std::mem::size_of::<T>();
        let wide = n > m && k_max > SMALL_K && by_work > 1 && b_bytes >= WIDE_B_BYTES;
        let wide_cols = n.div_ceil(by_work).next_multiple_of(16);
        if wide && wide_cols < n && crate::cpu::pool::width() > 1 {
            // SAFETY: the parts' column ranges are disjoint blocks of `dst`.
            crate::cpu::pool::split(n.div_ceil(wide_cols), &|i| unsafe { self.cols(i * wide_cols, wide_cols).call() });
        } else if parts > 1 && rows < m && crate::cpu::pool::width() > 1 {
            // SAFETY: the parts' row ranges are disjoint blocks of `dst`.
            crate::cpu::pool::split(m.div_ceil(rows), &|i| unsafe { self.rows(i * rows, rows).call() });
        } else if parts > 1 && !tall && cols < n && crate::cpu::pool::width() > 1 {
            // SAFETY: the parts' column ranges are disjoint blocks of `dst`.
            crate::cpu::pool::split(n.div_ceil(cols), &|i| unsafe { self.cols(i * cols, cols).call() });
        } else {
            // SAFETY: forwarded from the caller.
            unsafe { self.call() }
        }
        drop(packed);
    }

    /// The inner dimension in fixed chunks of [`K_CHUNK`], one partial sum
    /// per chunk into its own buffer, spread over the pool, then added in
    /// chunk order. Each thread packs only its chunk's operands, where a row
    /// split would pack all of `b` on every thread; the chunks depend only
    /// on the shapes, so no bit depends on the number of threads.
    unsafe fn split_k(self, k_max: usize) {
        let (m, n) = (self.m, self.n);
        let chunks = k_max.div_ceil(K_CHUNK);
        // Written before read: every chunk has a term reaching into it, and
        // that term's gemm writes the whole block (`accumulate` false).
        let Ok(mut partial) = crate::cache::take::<T>(chunks * m * n) else {
            // No memory for the partial sums: one thread, no extra buffer.
            // SAFETY: forwarded from the caller.
            return unsafe { self.call() };
        };
        let out = crate::cpu::pool::Disjoint::new(&mut partial.spare_capacity_mut()[..chunks * m * n]);
        crate::cpu::pool::split(chunks, &|c| {
            let k0 = c * K_CHUNK;
            let terms = self
                .terms
                .iter()
                .filter(|t| t.k > k0)
                .map(|t| Term {
                    k: K_CHUNK.min(t.k - k0),
                    a: t.a.wrapping_offset(k0 as isize * t.a_cs),
                    b: t.b.wrapping_offset(k0 as isize * t.b_rs),
                    ..*t
                })
                .collect();
            // SAFETY: block c of `partial` is this part's alone; the chunk's
            // columns of `a` and rows of `b` lie inside them.
            let dst = unsafe { out.slice(c * m * n, m * n) }.as_mut_ptr() as *mut T;
            unsafe {
                Gemm { m, n, dst, dst_rs: n, terms, bias: None, accumulate: false, then: Epilogue::Nothing }.call()
            }
        });
        // SAFETY: every block was written by its chunk's gemm above.
        unsafe { partial.set_len(chunks * m * n) };
        // SAFETY: the bias holds `n` elements (the caller's contract).
        let bias = self.bias.map(|b| unsafe { std::slice::from_raw_parts(b, n) });
        crate::cpu::simd::run(
            #[inline(always)]
            || {
                for i in 0..m {
                    // SAFETY: row i of `dst` (the caller's contract).
                    let row = unsafe { std::slice::from_raw_parts_mut(self.dst.add(i * self.dst_rs), n) };
                    // Each element gets its start, the bias, then the
                    // chunks in order: the loops run along the row, so
                    // they are vector loops.
                    if !self.accumulate {
                        row.fill(T::ZERO);
                    }
                    if let Some(b) = bias {
                        row.iter_mut().zip(b).for_each(|(o, &b)| *o += b);
                    }
                    for c in 0..chunks {
                        let part = &partial[c * m * n + i * n..][..n];
                        row.iter_mut().zip(part).for_each(|(o, &p)| *o += p);
                    }
                }
            },
        );
        // SAFETY: the block (the caller's contract).
        unsafe { self.finish() };
    }

    /// Applies [`Gemm::then`] to the block.
    ///
    /// # Safety
    /// The block is written; for `TanhBackward`, `h`'s block is readable.
    unsafe fn finish(&self) {
        // SAFETY: forwarded.
        unsafe { self.finish_with(None) }
    }

    /// [`Gemm::finish`], adding `bias` (`n` elements) to each row first
    /// when given.
    ///
    /// # Safety
    /// As [`Gemm::finish`]; `bias` holds `n` elements.
    unsafe fn finish_with(&self, bias: Option<*const T>) {
        let (n, then) = (self.n, self.then);
        if matches!(then, Epilogue::Nothing) {
            return;
        }
        // SAFETY: the bias holds `n` elements (the caller's contract).
        let bias = bias.map(|b| unsafe { std::slice::from_raw_parts(b, n) });
        crate::cpu::simd::run(
            #[inline(always)]
            move || {
                for i in 0..self.m {
                    // SAFETY: row i of the block (the caller's contract).
                    let row = unsafe { std::slice::from_raw_parts_mut(self.dst.add(i * self.dst_rs), n) };
                    // Separate loops with and without the bias, each a
                    // plain vector loop over the row.
                    match (then, bias) {
                        (Epilogue::Nothing, _) => {}
                        (Epilogue::Tanh, None) => row.iter_mut().for_each(|o| *o = o.tanh()),
                        (Epilogue::Tanh, Some(b)) => {
                            for (o, &b) in row.iter_mut().zip(b) {
                                *o = (*o + b).tanh();
                            }
                        }
                        (Epilogue::TanhBackward { h, h_rs }, b) => {
                            // SAFETY: row i of `h`'s block.
                            let h = unsafe { std::slice::from_raw_parts(h.add(i * h_rs), n) };
                            match b {
                                None => {
                                    for (o, &h) in row.iter_mut().zip(h) {
                                        *o *= T::ONE - h * h;
                                    }
                                }
                                Some(b) => {
                                    for ((o, &h), &b) in row.iter_mut().zip(h).zip(b) {
                                        *o = (*o + b) * (T::ONE - h * h);
                                    }
                                }
                            }
                        }
                    }
                }
            },
        )
    }

    /// Rows `r0..r0 + len` (clipped to `m`) of the sum.
    fn rows(&self, r0: usize, len: usize) -> Self {
        Gemm {
            m: len.min(self.m - r0),
            dst: self.dst.wrapping_add(r0 * self.dst_rs),
            terms: self.terms.iter().map(|t| Term { a: t.a.wrapping_offset(r0 as isize * t.a_rs), ..*t }).collect(),
            then: match self.then {
                Epilogue::TanhBackward { h, h_rs } => Epilogue::TanhBackward { h: h.wrapping_add(r0 * h_rs), h_rs },
                then => then,
            },
            ..self.clone()
        }
    }

    /// Columns `c0..c0 + len` (clipped to `n`) of the sum.
    fn cols(&self, c0: usize, len: usize) -> Self {
        Gemm {
            n: len.min(self.n - c0),
            dst: self.dst.wrapping_add(c0),
            terms: self.terms.iter().map(|t| Term { b: t.b.wrapping_offset(c0 as isize * t.b_cs), ..*t }).collect(),
            bias: self.bias.map(|b| b.wrapping_add(c0)),
            then: match self.then {
                Epilogue::TanhBackward { h, h_rs } => Epilogue::TanhBackward { h: h.wrapping_add(c0), h_rs },
                then => then,
            },
            ..self.clone()
        }
    }

    /// Runs `t` through [`crate::cpu::matmul_tn::Outer`] when it applies:
    /// f32 or f64 on AVX2 or AVX-512 (the same bits from each), both operands storing the inner dimension as
    /// rows (a weight gradient `g^T x`), and an output of at most 128 (f32)
    /// or 64 (f64) rows, so a block of `a` stays in the L1 cache. Returns
    /// whether it ran.
    fn outer_sum(&self, t: &Term<T>, accumulate: bool) -> bool {
        use crate::cpu::matmul_tn::{fits, Elem, Outer};
        /// The product with `T` read as `E` (the same type), if it fits.
        ///
        /// # Safety
        /// `E` is `T`; as [`Gemm::run`]'s contract.
        unsafe fn outer<T, E: Elem>(g: &Gemm<T>, t: &Term<T>, accumulate: bool) -> bool {
            let fits = t.a_rs == 1 && t.b_cs == 1 && t.a_cs >= 0 && t.b_rs >= 0 && fits::<E>(g.m);
            if fits {
                // SAFETY: the operands and block are as `run`'s contract
                // describes them, with `a[p, i]` at `a + p * a_cs + i` and
                // `b[p, j]` at `b + p * b_rs + j`.
                unsafe {
                    Outer {
                        m: g.m,
                        n: g.n,
                        k: t.k,
                        a: t.a as *const E,
                        lda: t.a_cs as usize,
                        b: t.b as *const E,
                        ldb: t.b_rs as usize,
                        dst: g.dst as *mut E,
                        dst_rs: g.dst_rs,
                        accumulate,
                    }
                    .run()
                };
            }
            fits
        }
        // SAFETY: `as_f32_or_f64!` passes `T` itself as `E`.
        as_f32_or_f64!(T, outer(self, t, accumulate)).unwrap_or(false)
    }

    /// Runs `t` through [`crate::cpu::matmul_narrow::Narrow`] when it
    /// applies: f32 or f64 on AVX2 or AVX-512, an output of 9 to 32 columns and an
    /// inner dimension of at most 64 (a narrow network's layer). Returns
    /// whether it ran.
    fn narrow_product(&self, t: &Term<T>, accumulate: bool) -> bool {
        use crate::cpu::matmul_narrow::{fits, Elem, Narrow};
        /// The product with `T` read as `E` (the same type).
        ///
        /// # Safety
        /// `E` is `T`; as [`Gemm::run`]'s contract.
        unsafe fn narrow<T, E: Elem>(g: &Gemm<T>, t: &Term<T>, accumulate: bool) {
            let (a, b, dst) = (t.a as *const E, t.b as *const E, g.dst as *mut E);
            let (m, n, k, dst_rs) = (g.m, g.n, t.k, g.dst_rs);
            let (a_rs, a_cs, b_rs, b_cs) = (t.a_rs, t.a_cs, t.b_rs, t.b_cs);
            // SAFETY: forwarded.
            unsafe { Narrow { m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, dst, dst_rs, accumulate }.run() }
        }
        if !fits(self.n, t.k) {
            return false;
        }
        // SAFETY: `as_f32_or_f64!` passes `T` itself as `E`; the operands
        // and block are as `run`'s contract describes them.
        as_f32_or_f64!(T, narrow(self, t, accumulate)).is_some()
    }

    /// The whole sum on this thread: the bias rows first, then one gemm
    /// call per term, each after the first adding into the block.
    unsafe fn call(&self) {
        let mut written = self.accumulate;
        // A tanh layer's bias (or its tangent's) is added in the
        // epilogue's pass, where the block is read anyway: the product
        // then writes the block without reading it, and no pass fills it
        // first. One product only, so each element is `product + bias`
        // rounded once, the same bits as the fill's `bias + product`
        // wherever the gemm crate sums the inner dimension in one block
        // (a network's 2 to a few hundred); past that its blocks' sums
        // now come first and the bias last, a rounding apart.
        let bias_then = self.bias.filter(|_| self.bias_in_epilogue());
        if let Some(b) = self.bias.filter(|_| bias_then.is_none()) {
            // SAFETY: the bias holds `n` elements, row i of `dst` is this
            // block's (the caller's contract).
            let b = unsafe { std::slice::from_raw_parts(b, self.n) };
            // Vector stores in the loop: `copy_from_slice` called memcpy
            // once a row, 2% of a Hessian-vector product. `acc` is a copy
            // taken by value: borrowed, `written` was read again for every
            // element (a store to the row might have changed it), so each
            // row began with alias checks and the plain fill read the row
            // and blended its sum away.
            let acc = written;
            crate::cpu::simd::run(
                #[inline(always)]
                move || {
                    for i in 0..self.m {
                        let row = unsafe { std::slice::from_raw_parts_mut(self.dst.add(i * self.dst_rs), self.n) };
                        for (o, &b) in row.iter_mut().zip(b) {
                            *o = if acc { *o + b } else { b };
                        }
                    }
                },
            );
            written = true;
        }
        for t in self.terms.iter().filter(|t| t.k > 0) {
            if self.outer_sum(t, written) || self.narrow_product(t, written) {
                written = true;
                continue;
            }
            // SAFETY: forwarded from `run`'s contract.
            unsafe {
                gemm::gemm(
                    self.m,
                    self.n,
                    t.k,
                    self.dst,
                    1,
                    self.dst_rs as isize,
                    written,
                    t.a,
                    t.a_cs,
                    t.a_rs,
                    t.b,
                    t.b_cs,
                    t.b_rs,
                    T::ONE,
                    T::ONE,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                )
            }
            written = true;
        }
        if !written {
            // Every inner dimension is 0: the empty sum.
            for i in 0..self.m {
                // SAFETY: row i of `dst` is this block's.
                unsafe { std::slice::from_raw_parts_mut(self.dst.add(i * self.dst_rs), self.n) }.fill(T::ZERO);
            }
        }
        // SAFETY: the block is written (above); `h` as the caller promised.
        unsafe { self.finish_with(bias_then) };
    }

    /// Whether [`Gemm::call`] adds the bias in the epilogue: a tanh or
    /// tanh-backward epilogue, a fresh block, and exactly one product.
    fn bias_in_epilogue(&self) -> bool {
        !self.accumulate
            && !matches!(self.then, Epilogue::Nothing)
            && self.terms.iter().filter(|t| t.k > 0).count() == 1
    }
}

/// Element offsets of each batch entry of `t` broadcast over `batch`.
fn batch_offsets(t: Src<'_>, batch: &Shape) -> Vec<usize> {
    let r = t.shape().rank();
    let own = Shape::from(&t.shape().dims()[..r - 2]);
    let lay = Layout { shape: own, strides: SmallVec::from_slice(&t.layout.strides[..r - 2]), offset: t.layout.offset };
    let strides = lay.broadcast_strides(batch);
    let mut out = Vec::with_capacity(batch.numel());
    let nd = crate::cpu::iter::Nd::new(batch.dims(), [&strides], [t.layout.offset]);
    nd.runs(0, batch.numel(), |_, [o], len, [s]| out.extend((0..len).map(|i| o + i * s)));
    out
}

/// The row and column strides of the matrix `t` (its last two axes).
fn mat_strides(t: Src<'_>) -> (isize, isize) {
    let s = &t.layout.strides[t.shape().rank() - 2..];
    (s[0] as isize, s[1] as isize)
}

fn kernel<T: Float + CpuElement>(a: Src<'_>, b: Src<'_>, p: &MatmulPlan) -> Result<Vec<T>> {
    let (m, k, n) = (p.m, p.k, p.n);
    let ((a_rs, a_cs), (b_rs, b_cs)) = (mat_strides(a), mat_strides(b));
    let (ao, bo) = (batch_offsets(a, &p.batch), batch_offsets(b, &p.batch));
    let (ad, bd) = (host::<T>(a), host::<T>(b));
    let total = p.batch.numel() * m * n;
    if total == 0 || k == 0 {
        return crate::storage::try_filled(total, T::ZERO);
    }
    // The output is not zeroed first: gemm is told not to read it
    // (`read_dst = false`) and writes every element of each block.
    let mut out: Vec<T> = crate::cache::take(total)?;
    let dst = crate::cpu::pool::Disjoint::new(&mut out.spare_capacity_mut()[..total]);
    let entry = |i: usize| {
        Gemm::single(
            m,
            n,
            // SAFETY: block i is written by whoever runs entry i, alone.
            unsafe { dst.slice(i * m * n, m * n) }.as_mut_ptr() as *mut T,
            n,
            Term {
                k,
                // SAFETY: the offsets come from valid layouts of `a` and `b`.
                a: unsafe { ad.as_ptr().add(ao[i]) },
                a_rs,
                a_cs,
                b: unsafe { bd.as_ptr().add(bo[i]) },
                b_rs,
                b_cs,
            },
            false,
        )
    };
    let batch = p.batch.numel();
    let parts = crate::cpu::pool::parts_for(batch * m * n * k, SPLIT_MIN).min(batch);
    if batch > 1 && m * n * k < SPLIT_MIN && batch * m * n * k >= SPLIT_MIN && parts > 1 {
        // Many small products: whole products per part.
        let per = batch.div_ceil(parts);
        crate::cpu::pool::split(batch.div_ceil(per), &|part| {
            for i in part * per..((part + 1) * per).min(batch) {
                // SAFETY: every addressed element of `a` and `b` lies in
                // their storage (valid layouts); block i is written by this
                // part only, and never read.
                unsafe { entry(i).call() };
            }
        });
    } else {
        for i in 0..batch {
            // SAFETY: as above; each product is split internally over
            // disjoint parts of its own block.
            unsafe { entry(i).run() };
        }
    }
    // SAFETY: k > 0, so each of the batch's m x n blocks, which tile
    // 0..total, was written by its gemm above.
    unsafe { out.set_len(total) };
    Ok(out)
}

/// One fused job for the linear sum the op checked fits, in f32 or f64
/// with `h` contiguous; `None` otherwise.
fn eager_linear_sum(
    terms: &[(Src<'_>, Src<'_>)],
    bias: Option<Src<'_>>,
    then: Then<'_>,
    (m, n): (usize, usize),
) -> Result<Option<Storage>> {
    let dtype = terms[0].0.dtype();
    if !matches!(dtype, DType::F32 | DType::F64) || matches!(then, Then::TanhBackward(h) if !h.is_contiguous()) {
        return Ok(None);
    }
    let dense;
    let bias = match bias {
        Some(b) if !b.is_contiguous() => {
            dense = (Storage::cpu(super::shape::copy(b)?), Layout::contiguous(b.shape().clone()));
            Some(Src { storage: &dense.0, layout: &dense.1 })
        }
        b => b,
    };
    with_float!(dtype, F => {
        let mut out: Vec<F> = crate::cache::take(m * n)?;
        let dst = out.spare_capacity_mut().as_mut_ptr() as *mut F;
        let terms = terms
            .iter()
            .map(|&(a, b)| {
                let (ad, bd) = (host::<F>(a), host::<F>(b));
                let ((a_rs, a_cs), (b_rs, b_cs)) = (mat_strides(a), mat_strides(b));
                Term {
                    k: a.shape().dims()[1],
                    // SAFETY: the offsets come from valid 2-D layouts.
                    a: unsafe { ad.as_ptr().add(a.layout.offset) },
                    a_rs,
                    a_cs,
                    b: unsafe { bd.as_ptr().add(b.layout.offset) },
                    b_rs,
                    b_cs,
                }
            })
            .collect();
        let bias_ptr = bias.map(|b| host::<F>(b)[b.layout.offset..].as_ptr());
        let then = match then {
            Then::Nothing => Epilogue::Nothing,
            Then::Tanh => Epilogue::Tanh,
            Then::TanhBackward(h) => Epilogue::TanhBackward { h: host::<F>(h)[h.layout.offset..].as_ptr(), h_rs: n },
        };
        // SAFETY: strides come from valid 2-D layouts of the operands, the
        // bias is n contiguous elements, `h` m x n contiguous ones, `dst`
        // has room for m x n elements and `Gemm::call` writes all of them
        // before reading any.
        unsafe { Gemm { m, n, dst, dst_rs: n, terms, bias: bias_ptr, accumulate: false, then }.run() };
        // SAFETY: written above (an empty sum writes zeros).
        unsafe { out.set_len(m * n) };
        Ok(Some(Storage::cpu(F::wrap(out))))
    }, _ => Ok(None))
}

/// A strided matrix operand: data, row stride, column stride.
pub(crate) struct MatRef<'a, T> {
    pub data: &'a [T],
    pub rs: usize,
    pub cs: usize,
}

/// `dst (m x n, row-major) = a (m x k) @ b (k x n)`, or `+=` when
/// `accumulate`: a gemm into a buffer the caller owns, for kernels that must
/// not allocate per call (the chunked linear cross-entropy).
pub(crate) fn gemm_into<T: Float>(
    dst: &mut [T],
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    accumulate: bool,
) {
    assert!(dst.len() >= m * n, "internal: gemm_into destination too small");
    if m * n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst[..m * n].iter_mut().for_each(|d| *d = T::ZERO);
        }
        return;
    }
    assert!(
        (m - 1) * a.rs + (k - 1) * a.cs < a.data.len() && (k - 1) * b.rs + (n - 1) * b.cs < b.data.len(),
        "internal: gemm_into operand too small"
    );
    let gemm = Gemm::single(
        m,
        n,
        dst.as_mut_ptr(),
        n,
        Term {
            k,
            a: a.data.as_ptr(),
            a_rs: a.rs as isize,
            a_cs: a.cs as isize,
            b: b.data.as_ptr(),
            b_rs: b.rs as isize,
            b_cs: b.cs as isize,
        },
        accumulate,
    );
    // SAFETY: the asserts above keep every addressed element in bounds,
    // and `dst` is borrowed mutably for the call.
    unsafe { gemm.run() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `gemm_into` against a plain triple loop in f64, at shapes that are
    /// not multiples of the microkernels' tiles: wide outputs (split by
    /// columns over the pool when it has helpers), tall ones (by rows), and
    /// operands read in place with either stride unit (`h W^T` reads the
    /// weight transposed), writing and accumulating, in f32 and f64.
    fn check<T: Float + CpuElement>(tol: f64) {
        // (m, n, k): wide (split by columns), tall (by rows), a small one
        // that is not split, and a short inner dimension.
        for (m, n, k) in [(37, 1001, 33), (5, 4099, 61), (1003, 29, 47), (7, 9, 5), (41, 2000, 17)] {
            for (a_t, b_t) in [(false, false), (false, true), (true, false), (true, true)] {
                let val =
                    |i: usize, seed: usize| T::from_f64(((i * 7919 + seed * 104_729) % 1013) as f64 / 1013.0 - 0.5);
                let a: Vec<T> = (0..m * k).map(|i| val(i, 1)).collect();
                let b: Vec<T> = (0..k * n).map(|i| val(i, 2)).collect();
                // Element (i, p) of `a` and (p, j) of `b` with either layout.
                let (a_rs, a_cs) = if a_t { (1, m) } else { (k, 1) };
                let (b_rs, b_cs) = if b_t { (1, k) } else { (n, 1) };
                for accumulate in [false, true] {
                    let start: Vec<T> = (0..m * n).map(|i| val(i, 3)).collect();
                    let mut dst = start.clone();
                    gemm_into(
                        &mut dst,
                        m,
                        n,
                        k,
                        MatRef { data: &a, rs: a_rs, cs: a_cs },
                        MatRef { data: &b, rs: b_rs, cs: b_cs },
                        accumulate,
                    );
                    for i in 0..m {
                        for j in 0..n {
                            let mut want = if accumulate { start[i * n + j].to_f64() } else { 0.0 };
                            for p in 0..k {
                                want += a[i * a_rs + p * a_cs].to_f64() * b[p * b_rs + j * b_cs].to_f64();
                            }
                            let got = dst[i * n + j].to_f64();
                            assert!(
                                (got - want).abs() <= tol * (1.0 + want.abs()),
                                "{m}x{n}x{k} a_t {a_t} b_t {b_t} acc {accumulate} at {i},{j}: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn gemm_into_matches_a_plain_product() {
        check::<f32>(1e-4);
        check::<f64>(1e-12);
    }

    /// A wide product whose `b` passes [`WIDE_B_BYTES`] (the fused head's
    /// logits, `h W^T`: `b` read transposed), split by columns over the
    /// pool when it has helpers, against a plain loop.
    #[test]
    fn gemm_into_matches_a_plain_product_with_a_large_b() {
        let (m, n, k) = (9, 2100, 1024);
        assert!(k * n * 4 >= WIDE_B_BYTES);
        let val = |i: usize, seed: usize| ((i * 7919 + seed * 104_729) % 1013) as f32 / 1013.0 - 0.5;
        let a: Vec<f32> = (0..m * k).map(|i| val(i, 1)).collect();
        let b: Vec<f32> = (0..k * n).map(|i| val(i, 2)).collect();
        let mut dst = vec![0.0f32; m * n];
        gemm_into(&mut dst, m, n, k, MatRef { data: &a, rs: k, cs: 1 }, MatRef { data: &b, rs: 1, cs: k }, false);
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k).map(|p| a[i * k + p] as f64 * b[j * k + p] as f64).sum();
                let got = dst[i * n + j] as f64;
                assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "at {i},{j}: {got} vs {want}");
            }
        }
    }
}
