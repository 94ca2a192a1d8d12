//! Row kernels: the sum, maximum, minimum and log-sum-exp of one contiguous
//! slice, the inner loop of every reduction whose reduced axes are last.
//!
//! Each kernel keeps `L` independent lane accumulators (an array the
//! compiler maps onto eight vector registers), so neither the adds' latency
//! nor a single dependency chain is what a core waits on. The bodies are
//! written once, generically and `#[inline(always)]`, and compiled again
//! inside `#[target_feature]` wrappers for AVX-512 and AVX2 + FMA, picked
//! at run time (the pattern of the cross-entropy kernels). Other processors
//! and architectures run the portable build, with the same lanes, so every
//! build gives bit-identical results on a given input: the order of the
//! adds depends on `L`, which depends only on the element type.
//!
//! A row is read with unaligned loads from wherever it starts. On a Zen 5
//! a row that starts inside a cache line reads at two thirds of the speed
//! of one that starts on a line with 512-bit loads, and loses little with
//! 256-bit ones (docs/performance.md, "Cache-line-aligned buffers"): so
//! the kernels that only load (sum, maximum, minimum) take their AVX2 copy
//! for a long row that starts inside a line, and large buffers should come
//! from [`crate::AlignedAlloc`] (the `tapir` command's allocator), where
//! every row of a 64-byte multiple starts on one. The lanes, and so the
//! bits, depend on neither.
//!
//! Accuracy: a sum adds, per lane, at most `BLOCK` elements before folding
//! the lane into a second-level lane total, and the lanes are combined
//! pairwise at the end; the rounding error grows with `BLOCK + n / (L *
//! BLOCK) + log2 L` rather than with `n` as one running sum's would.

use crate::cpu::math::exp_f32;
use crate::cpu::simd::{isa, Isa};
use crate::Float;

/// Chunks of `L` elements each lane accumulator takes before it is folded
/// into the lane totals.
const BLOCK: usize = 64;

/// Rows of at least this many elements that start
/// inside a cache line take the AVX2 copy of the load-only kernels: a
/// shorter row is read from the caches, where straddling loads cost little.
const STRADDLE_MIN: usize = 4096;

/// Lanes for `T`: eight 64-byte (AVX-512) vectors' worth. On AVX2 this is
/// sixteen 32-byte registers of accumulators, which still fit the register
/// file with the loads folded into the adds.
const fn lanes<T>() -> usize {
    8 * 64 / std::mem::size_of::<T>()
}

/// Sums `L` lanes pairwise (`L` a power of two).
#[inline(always)]
fn fold_lanes<T: Float, const L: usize>(mut t: [T; L]) -> T {
    let mut w = L / 2;
    while w > 0 {
        for i in 0..w {
            t[i] += t[i + w];
        }
        w /= 2;
    }
    t[0]
}

/// Sum of `f(x)` over `s`, in `L` lanes, blocked (see the module docs).
#[inline(always)]
fn sum_map_body<T: Float, const L: usize>(s: &[T], f: impl Fn(T) -> T) -> T {
    let mut total = [T::ZERO; L];
    for block in s.chunks(L * BLOCK) {
        let (chunks, rest) = block.as_chunks::<L>();
        let mut acc = [T::ZERO; L];
        for c in chunks {
            for i in 0..L {
                acc[i] += f(c[i]);
            }
        }
        for (a, &r) in acc.iter_mut().zip(rest) {
            *a += f(r);
        }
        for i in 0..L {
            total[i] += acc[i];
        }
    }
    fold_lanes(total)
}

/// Largest (`MAX`) or smallest element of a non-empty `s`, NaN if any
/// element is NaN (torch's semantics). The lanes keep a plain compare and
/// select, which vectorises; a second accumulator of `x - x` (zero for
/// finite `x`, NaN for NaN and infinities) tells whether the row needs the
/// exact, NaN-aware fold instead. Rows with infinities or NaNs are rare.
#[inline(always)]
#[allow(clippy::eq_op)] // `x - x` is the point: 0 for finite x, NaN otherwise
fn extreme_body<T: Float, const L: usize, const MAX: bool>(s: &[T]) -> T {
    let Some(&first) = s.first() else {
        return if MAX { T::NEG_INF } else { T::INF };
    };
    let better = |v: T, m: T| if MAX { v > m } else { v < m };
    let (chunks, rest) = s.as_chunks::<L>();
    let mut m = [first; L];
    let mut bad = [T::ZERO; L];
    for c in chunks {
        for i in 0..L {
            m[i] = if better(c[i], m[i]) { c[i] } else { m[i] };
            bad[i] += c[i] - c[i];
        }
    }
    for (i, &r) in rest.iter().enumerate() {
        m[i] = if better(r, m[i]) { r } else { m[i] };
        bad[i] += r - r;
    }
    if fold_lanes(bad) != T::ZERO {
        // An infinity or a NaN: the exact fold, NaN-propagating.
        return s.iter().fold(first, |a, &b| if MAX { a.max(b) } else { a.min(b) });
    }
    m.iter().fold(m[0], |a, &b| if better(b, a) { b } else { a })
}

/// Bytes of a row the one-pass log-sum-exp takes at a time: read from
/// memory by the block's maximum, then again from the core's L1 cache (32
/// KiB or more on current x86 cores) by its exponentials.
const LSE_BLOCK_BYTES: usize = 16 << 10;

/// Lanes of the exponentials' sum: each exponential is a dozen
/// instructions, so a few vectors already hide their latency, and more
/// would spill.
const EXP_LANES: usize = 16;

/// log(sum(exp(x))) of a row in one pass over memory: block by block
/// ([`LSE_BLOCK_BYTES`]), the block's maximum, then, the running sums
/// rescaled by `exp(old max - new max)` when the maximum grew, the block's
/// shifted exponentials added while the block is still in L1 (the online
/// softmax of Milakov and Gimelshein, 2018, by blocks rather than by
/// elements, so each element costs one exponential). -inf for an empty or
/// all -inf row, the row's maximum when it is +inf or NaN.
#[inline(always)]
fn lse_body<T: Float, const L: usize>(s: &[T], exp: impl Fn(T) -> T) -> T {
    let block = LSE_BLOCK_BYTES / std::mem::size_of::<T>();
    let mut m = T::NEG_INF;
    let mut total = [T::ZERO; EXP_LANES];
    for b in s.chunks(block) {
        let bm = extreme_body::<T, L, true>(b);
        if bm == T::INF || bm.is_nan() {
            // The row's maximum is +inf or NaN: that is the answer (NaN
            // wins over +inf wherever it is).
            return extreme_body::<T, L, true>(s);
        }
        if bm == T::NEG_INF {
            // Every element is -inf: it adds nothing.
            continue;
        }
        if bm > m {
            // exp(-inf) = 0 on the first block with a finite maximum.
            let scale = exp(m - bm);
            for t in total.iter_mut() {
                *t *= scale;
            }
            m = bm;
        }
        // Blocked as in `sum_map_body`: at most `BLOCK` terms per lane
        // before they join the lane totals.
        for sub in b.chunks(EXP_LANES * BLOCK) {
            let (chunks, rest) = sub.as_chunks::<EXP_LANES>();
            let mut acc = [T::ZERO; EXP_LANES];
            for c in chunks {
                for i in 0..EXP_LANES {
                    acc[i] += exp(c[i] - m);
                }
            }
            for (a, &r) in acc.iter_mut().zip(rest) {
                *a += exp(r - m);
            }
            for i in 0..EXP_LANES {
                total[i] += acc[i];
            }
        }
    }
    if m == T::NEG_INF {
        return m;
    }
    m + fold_lanes(total).ln()
}

/// The row kernels of a float type, each dispatched once per call to the
/// widest instruction set the processor has.
pub(crate) trait RowKernels: Float {
    /// Sum of a row.
    fn row_sum(s: &[Self]) -> Self;
    /// Maximum of a row (NaN-propagating; -inf when empty).
    fn row_max(s: &[Self]) -> Self;
    /// Minimum of a row (NaN-propagating; +inf when empty).
    fn row_min(s: &[Self]) -> Self;
    /// log-sum-exp of a row (max-shifted; -inf when empty).
    fn row_lse(s: &[Self]) -> Self;
}

/// Defines `$name`, which runs `$body` (an expression in `$s`) compiled for
/// the processor's widest instruction set.
macro_rules! dispatched {
    ($name:ident, $t:ty, |$s:ident| $body:expr) => {
        dispatched!($name, $t, false, |$s| $body);
    };
    ($name:ident, $t:ty, $reads_only:expr, |$s:ident| $body:expr) => {
        fn $name($s: &[$t]) -> $t {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                fn avx512($s: &[$t]) -> $t {
                    $body
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($s: &[$t]) -> $t {
                    $body
                }
                match isa() {
                    // A row that only streams loads and starts inside a
                    // cache line takes the AVX2 copy (the same lanes, so
                    // the same bits): 512-bit loads that straddle lines
                    // read at two thirds of the speed on a Zen 5, 256-bit
                    // ones lose little (module docs).
                    Isa::Avx512 if $reads_only && $s.len() >= STRADDLE_MIN && ($s.as_ptr() as usize) % 64 != 0 => {
                        // SAFETY: AVX-512 implies AVX2 and FMA.
                        return unsafe { avx2($s) };
                    }
                    // SAFETY: the features each copy was compiled for are
                    // present (isa() checked them).
                    Isa::Avx512 => return unsafe { avx512($s) },
                    Isa::Avx2 => return unsafe { avx2($s) },
                    Isa::Portable => {}
                }
            }
            $body
        }
    };
}

macro_rules! row_kernels {
    ($t:ty, $exp:expr) => {
        impl RowKernels for $t {
            dispatched!(row_sum, $t, true, |s| sum_map_body::<$t, { lanes::<$t>() }>(s, |v| v));
            dispatched!(row_max, $t, true, |s| extreme_body::<$t, { lanes::<$t>() }, true>(s));
            dispatched!(row_min, $t, true, |s| extreme_body::<$t, { lanes::<$t>() }, false>(s));
            dispatched!(row_lse, $t, |s| lse_body::<$t, { lanes::<$t>() }>(s, $exp));
        }
    };
}

row_kernels!(f32, exp_f32);
row_kernels!(f64, f64::exp);

#[cfg(test)]
mod tests {
    use super::*;

    /// Every compiled copy the processor can run agrees with an f64
    /// reference, on lengths around every lane and block boundary.
    #[test]
    fn kernels_match_reference_on_odd_lengths() {
        let lens = [0usize, 1, 2, 3, 7, 15, 16, 17, 31, 33, 127, 128, 129, 255, 257, 8191, 8192, 8193, 70_001];
        for n in lens {
            let x: Vec<f32> = (0..n).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 97.0).collect();
            let want: f64 = x.iter().map(|&v| v as f64).sum();
            let got = f32::row_sum(&x) as f64;
            assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "n {n}: {got} vs {want}");
            if n > 0 {
                let mx = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mn = x.iter().copied().fold(f32::INFINITY, f32::min);
                assert_eq!(f32::row_max(&x), mx, "n {n}");
                assert_eq!(f32::row_min(&x), mn, "n {n}");
                let lse = mx as f64 + x.iter().map(|&v| (v as f64 - mx as f64).exp()).sum::<f64>().ln();
                assert!((f32::row_lse(&x) as f64 - lse).abs() <= 1e-5 * (1.0 + lse.abs()), "n {n}");
            }
            let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            assert!((f64::row_sum(&x64) - want).abs() <= 1e-12 * (1.0 + want.abs()), "n {n}");
        }
    }

    /// The dispatched copies add in the same order as the portable one, so
    /// results do not depend on the processor.
    #[test]
    fn dispatched_kernels_equal_the_portable_body_bitwise() {
        let x: Vec<f32> = (0..10_007).map(|i| ((i * 31 % 977) as f32).sin() * 1e3).collect();
        assert_eq!(f32::row_sum(&x).to_bits(), sum_map_body::<f32, { lanes::<f32>() }>(&x, |v| v).to_bits());
        assert_eq!(f32::row_lse(&x).to_bits(), lse_body::<f32, { lanes::<f32>() }>(&x, exp_f32).to_bits());
        let y: Vec<f64> = x.iter().map(|&v| v as f64 / 3.0).collect();
        assert_eq!(f64::row_sum(&y).to_bits(), sum_map_body::<f64, { lanes::<f64>() }>(&y, |v| v).to_bits());
    }

    /// A long row read from every offset in a cache line (the load-only
    /// kernels take the AVX2 copy where the row starts inside a line and
    /// the AVX-512 copy where it starts on one) gives the portable body's
    /// bits at each.
    #[test]
    fn load_only_kernels_keep_their_bits_at_every_offset_in_a_cache_line() {
        let n = STRADDLE_MIN + 1001;
        let buf: Vec<f32> = (0..n + 64).map(|i| ((i * 31 % 977) as f32).sin() * 1e3).collect();
        let buf64: Vec<f64> = buf.iter().map(|&v| v as f64 / 3.0).collect();
        let (mut aligned, mut inside) = (0, 0);
        for start in 0..16 {
            let x = &buf[start..start + n];
            if (x.as_ptr() as usize).is_multiple_of(64) {
                aligned += 1;
            } else {
                inside += 1;
            }
            let sum = sum_map_body::<f32, { lanes::<f32>() }>(x, |v| v);
            assert_eq!(f32::row_sum(x).to_bits(), sum.to_bits(), "start {start}");
            assert_eq!(f32::row_max(x), x.iter().copied().fold(f32::NEG_INFINITY, f32::max), "start {start}");
            assert_eq!(f32::row_min(x), x.iter().copied().fold(f32::INFINITY, f32::min), "start {start}");
            let y = &buf64[start..start + n];
            assert_eq!(f64::row_sum(y).to_bits(), sum_map_body::<f64, { lanes::<f64>() }>(y, |v| v).to_bits());
        }
        // Sixteen f32 starts span a 64-byte line: one on it, the rest inside.
        assert_eq!((aligned, inside), (1, 15));
    }

    /// The one-pass log-sum-exp over rows whose maximum grows from block
    /// to block (each growth rescales the running sums), falls, or sits in
    /// the last, short block, against an f64 reference; and a row whose
    /// first blocks are all -inf.
    #[test]
    fn one_pass_lse_rescales_when_the_maximum_grows() {
        let block = LSE_BLOCK_BYTES / 4;
        for n in [block - 1, block, block + 1, 3 * block + 17, 40_000] {
            for shape in 0..3 {
                let x: Vec<f32> = (0..n)
                    .map(|i| {
                        let t = i as f32 / n as f32;
                        let wobble = ((i * 7919 % 1013) as f32) / 1013.0;
                        match shape {
                            0 => 30.0 * t + wobble,
                            1 => -30.0 * t + wobble,
                            _ => wobble + if i == n - 1 { 40.0 } else { 0.0 },
                        }
                    })
                    .collect();
                let m = x.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
                let want = m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
                let got = f32::row_lse(&x) as f64;
                assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "n {n} shape {shape}: {got} vs {want}");
            }
        }
        let mut x = vec![f32::NEG_INFINITY; 3 * block];
        x[2 * block + 5] = 1.5;
        x[2 * block + 9] = 0.5;
        let want = 1.5 + (1.0f64 + (-1.0f64).exp()).ln();
        assert!((f32::row_lse(&x) as f64 - want).abs() <= 1e-6, "{}", f32::row_lse(&x));
    }

    #[test]
    fn extremes_propagate_nan_and_handle_infinities() {
        for n in [1usize, 5, 200, 1000] {
            for at in [0, n / 2, n - 1] {
                let mut x = vec![1.0f32; n];
                x[at] = f32::NAN;
                assert!(f32::row_max(&x).is_nan() && f32::row_min(&x).is_nan(), "n {n} at {at}");
                assert!(f32::row_lse(&x).is_nan());
                x[at] = f32::INFINITY;
                assert_eq!(f32::row_max(&x), f32::INFINITY);
                assert_eq!(f32::row_min(&x), if n == 1 { f32::INFINITY } else { 1.0 });
                assert_eq!(f32::row_lse(&x), f32::INFINITY);
                x[at] = f32::NEG_INFINITY;
                assert_eq!(f32::row_min(&x), f32::NEG_INFINITY);
                assert_eq!(f32::row_max(&x), if n == 1 { f32::NEG_INFINITY } else { 1.0 });
            }
        }
        assert_eq!(f32::row_lse(&[f32::NEG_INFINITY; 40]), f32::NEG_INFINITY);
        assert_eq!(f64::row_lse(&[]), f64::NEG_INFINITY);
    }
}
