//! One interface over the AVX-512 (and VL) vector types of f32 and f64,
//! so a matrix kernel is written once for both element types and for a
//! row's full vectors and its narrower tail: 512-bit vectors of 16 or 8
//! lanes, 256-bit and 128-bit ones of a half and a quarter as many (a
//! Zen 4 issues a 512-bit operation as two 256-bit halves, so a tail of 4
//! f32 columns costs it a quarter of a full vector; a Zen 5 or an Intel
//! core runs it whole, where the narrow tail saves only its lanes' loads
//! and stores). Used by
//! [`crate::cpu::matmul_narrow`] and [`crate::cpu::matmul_tn`]; every
//! method needs AVX-512F and VL, which their callers check.

use std::arch::x86_64::*;

/// A vector of `E` lanes: 2 to 16 of them.
pub(crate) trait Vector<E>: Copy {
    /// All lanes zero.
    unsafe fn zero() -> Self;
    /// Every lane `x`.
    unsafe fn splat(x: E) -> Self;
    /// A whole vector's lanes from `p`.
    unsafe fn load(p: *const E) -> Self;
    /// The first `lanes` elements at `p`, the rest zero (nothing past them
    /// is read).
    unsafe fn load_masked(p: *const E, lanes: usize) -> Self;
    /// `self * b + c`, rounded once.
    unsafe fn fma(self, b: Self, c: Self) -> Self;
    /// `self` plus the first `lanes` elements at `p`.
    unsafe fn add_masked(self, p: *const E, lanes: usize) -> Self;
    /// Writes the first `lanes` lanes to `p` (nothing past them).
    unsafe fn store_masked(self, p: *mut E, lanes: usize);
}

/// The mask of the first `lanes` lanes.
fn mask(lanes: usize) -> u16 {
    ((1u32 << lanes) - 1) as u16
}

/// `Vector` for one intrinsic type: its element, mask type and
/// intrinsics.
macro_rules! vector {
    ($t:ty, $e:ty, $m:ty, $zero:ident, $splat:ident, $load:ident, $fma:ident, $loadz:ident, $add:ident, $store:ident) => {
        impl Vector<$e> for $t {
            #[inline(always)]
            unsafe fn zero() -> Self {
                // SAFETY: the kernels run with AVX-512F and VL.
                unsafe { $zero() }
            }
            #[inline(always)]
            unsafe fn splat(x: $e) -> Self {
                // SAFETY: as above.
                unsafe { $splat(x) }
            }
            #[inline(always)]
            unsafe fn load(p: *const $e) -> Self {
                // SAFETY: the caller's pointer holds a vector's lanes.
                unsafe { $load(p) }
            }
            #[inline(always)]
            unsafe fn load_masked(p: *const $e, lanes: usize) -> Self {
                // SAFETY: the first `lanes` elements at `p` are readable.
                unsafe { $loadz(mask(lanes) as $m, p) }
            }
            #[inline(always)]
            unsafe fn fma(self, b: Self, c: Self) -> Self {
                // SAFETY: as above.
                unsafe { $fma(self, b, c) }
            }
            #[inline(always)]
            unsafe fn add_masked(self, p: *const $e, lanes: usize) -> Self {
                // SAFETY: the first `lanes` elements at `p` are readable.
                unsafe { $add(self, $loadz(mask(lanes) as $m, p)) }
            }
            #[inline(always)]
            unsafe fn store_masked(self, p: *mut $e, lanes: usize) {
                // SAFETY: the first `lanes` elements at `p` are writable.
                unsafe { $store(p, mask(lanes) as $m, self) }
            }
        }
    };
}

#[rustfmt::skip]
mod vectors {
    use super::*;
    vector!(__m128, f32, __mmask8, _mm_setzero_ps, _mm_set1_ps, _mm_loadu_ps, _mm_fmadd_ps, _mm_maskz_loadu_ps, _mm_add_ps, _mm_mask_storeu_ps);
    vector!(__m256, f32, __mmask8, _mm256_setzero_ps, _mm256_set1_ps, _mm256_loadu_ps, _mm256_fmadd_ps, _mm256_maskz_loadu_ps, _mm256_add_ps, _mm256_mask_storeu_ps);
    vector!(__m512, f32, __mmask16, _mm512_setzero_ps, _mm512_set1_ps, _mm512_loadu_ps, _mm512_fmadd_ps, _mm512_maskz_loadu_ps, _mm512_add_ps, _mm512_mask_storeu_ps);
    vector!(__m128d, f64, __mmask8, _mm_setzero_pd, _mm_set1_pd, _mm_loadu_pd, _mm_fmadd_pd, _mm_maskz_loadu_pd, _mm_add_pd, _mm_mask_storeu_pd);
    vector!(__m256d, f64, __mmask8, _mm256_setzero_pd, _mm256_set1_pd, _mm256_loadu_pd, _mm256_fmadd_pd, _mm256_maskz_loadu_pd, _mm256_add_pd, _mm256_mask_storeu_pd);
    vector!(__m512d, f64, __mmask8, _mm512_setzero_pd, _mm512_set1_pd, _mm512_loadu_pd, _mm512_fmadd_pd, _mm512_maskz_loadu_pd, _mm512_add_pd, _mm512_mask_storeu_pd);
}
