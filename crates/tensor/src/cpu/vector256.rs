//! [`Vector`] over AVX2's 256-bit and 128-bit types, for the matrix
//! kernels' copies that run without AVX-512: the same interface as
//! [`crate::cpu::vector512`], with each masked access made of AVX2's
//! `maskload` and `maskstore` (a lane mask built by comparing the lane
//! indices with the count; lanes past it are neither read nor written).
//! Newtypes, since the raw types already implement `Vector` through
//! AVX-512VL's masked instructions. Every method needs AVX2 and FMA,
//! which the callers' `#[target_feature]` functions enable.

use std::arch::x86_64::*;

use crate::cpu::vector512::Vector;

/// Eight f32 lanes.
#[derive(Clone, Copy)]
pub(crate) struct F32x8(__m256);
/// Four f32 lanes.
#[derive(Clone, Copy)]
pub(crate) struct F32x4(__m128);
/// Four f64 lanes.
#[derive(Clone, Copy)]
pub(crate) struct F64x4(__m256d);
/// Two f64 lanes.
#[derive(Clone, Copy)]
pub(crate) struct F64x2(__m128d);

/// `Vector` for one newtype: its element, the mask of the first `lanes`
/// lanes, and the intrinsics.
macro_rules! vector {
    ($t:ident, $e:ty, $mask:expr, $zero:ident, $splat:ident, $load:ident, $fma:ident, $add:ident, $mload:ident, $mstore:ident) => {
        impl Vector<$e> for $t {
            #[inline(always)]
            unsafe fn zero() -> Self {
                // SAFETY: the kernels run with AVX2 and FMA.
                unsafe { $t($zero()) }
            }
            #[inline(always)]
            unsafe fn splat(x: $e) -> Self {
                // SAFETY: as above.
                unsafe { $t($splat(x)) }
            }
            #[inline(always)]
            unsafe fn load(p: *const $e) -> Self {
                // SAFETY: the caller's pointer holds a vector's lanes.
                unsafe { $t($load(p)) }
            }
            #[inline(always)]
            unsafe fn load_masked(p: *const $e, lanes: usize) -> Self {
                // SAFETY: masked-off lanes are not read; the first `lanes`
                // elements at `p` are readable.
                unsafe { $t($mload(p, $mask(lanes))) }
            }
            #[inline(always)]
            unsafe fn fma(self, b: Self, c: Self) -> Self {
                // SAFETY: as above.
                unsafe { $t($fma(self.0, b.0, c.0)) }
            }
            #[inline(always)]
            unsafe fn add_masked(self, p: *const $e, lanes: usize) -> Self {
                // SAFETY: as `load_masked`.
                unsafe { $t($add(self.0, $mload(p, $mask(lanes)))) }
            }
            #[inline(always)]
            unsafe fn store_masked(self, p: *mut $e, lanes: usize) {
                // SAFETY: masked-off lanes are not written; the first
                // `lanes` elements at `p` are writable.
                unsafe { $mstore(p, $mask(lanes), self.0) }
            }
        }
    };
}

/// The first `lanes` of eight 32-bit lanes set.
#[inline(always)]
unsafe fn mask8(lanes: usize) -> __m256i {
    // SAFETY: AVX2, as every caller.
    unsafe { _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)) }
}
/// The first `lanes` of four 32-bit lanes set.
#[inline(always)]
unsafe fn mask4(lanes: usize) -> __m128i {
    // SAFETY: as above.
    unsafe { _mm_cmpgt_epi32(_mm_set1_epi32(lanes as i32), _mm_setr_epi32(0, 1, 2, 3)) }
}
/// The first `lanes` of four 64-bit lanes set.
#[inline(always)]
unsafe fn mask4d(lanes: usize) -> __m256i {
    // SAFETY: as above.
    unsafe { _mm256_cmpgt_epi64(_mm256_set1_epi64x(lanes as i64), _mm256_setr_epi64x(0, 1, 2, 3)) }
}
/// The first `lanes` of two 64-bit lanes set.
#[inline(always)]
unsafe fn mask2d(lanes: usize) -> __m128i {
    // SAFETY: as above (SSE4.2's compare, which AVX2 implies).
    unsafe { _mm_cmpgt_epi64(_mm_set1_epi64x(lanes as i64), _mm_set_epi64x(1, 0)) }
}

#[rustfmt::skip]
mod vectors {
    use super::*;
    vector!(F32x8, f32, mask8, _mm256_setzero_ps, _mm256_set1_ps, _mm256_loadu_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_maskload_ps, _mm256_maskstore_ps);
    vector!(F32x4, f32, mask4, _mm_setzero_ps, _mm_set1_ps, _mm_loadu_ps, _mm_fmadd_ps, _mm_add_ps, _mm_maskload_ps, _mm_maskstore_ps);
    vector!(F64x4, f64, mask4d, _mm256_setzero_pd, _mm256_set1_pd, _mm256_loadu_pd, _mm256_fmadd_pd, _mm256_add_pd, _mm256_maskload_pd, _mm256_maskstore_pd);
    vector!(F64x2, f64, mask2d, _mm_setzero_pd, _mm_set1_pd, _mm_loadu_pd, _mm_fmadd_pd, _mm_add_pd, _mm_maskload_pd, _mm_maskstore_pd);
}
