//! Strided iteration: the one loop nest every CPU kernel runs on.
//!
//! A kernel over `K` operands walks the output in row-major order; for each
//! innermost run it is handed the operands' element offsets and their inner
//! strides, so the hot loop is a plain strided (usually unit-stride) loop.
//! Dims are coalesced first, so a contiguous tensor is a single run.
//! Large outputs are split across rayon's pool; small ones (a PDE solver's
//! few thousand elements) stay on the calling thread.

use std::mem::MaybeUninit;

use rayon::prelude::*;
use smallvec::SmallVec;

/// Below this many elements a kernel runs on the calling thread: a memory-
/// bound pass over 256 Ki floats takes tens of microseconds, about what
/// waking the pool costs on two busy cores.
pub const PAR_MIN: usize = 1 << 18;

/// A coalesced iteration space: dims and, per operand, strides.
#[derive(Debug, Clone)]
pub struct Nd<const K: usize> {
    dims: SmallVec<[usize; 6]>,
    strides: [SmallVec<[usize; 6]>; K],
    offsets: [usize; K],
}

impl<const K: usize> Nd<K> {
    /// Builds the space for `dims` with each operand's `strides` and offset,
    /// merging dims that are adjacent in every operand and dropping size-1 dims.
    pub fn new(dims: &[usize], strides: [&[usize]; K], offsets: [usize; K]) -> Self {
        let mut d: SmallVec<[usize; 6]> = SmallVec::new();
        let mut s: [SmallVec<[usize; 6]>; K] = std::array::from_fn(|_| SmallVec::new());
        for i in 0..dims.len() {
            if dims[i] == 1 {
                continue;
            }
            let merge = !d.is_empty() && (0..K).all(|k| s[k][s[k].len() - 1] == strides[k][i] * dims[i]);
            if merge {
                let last = d.len() - 1;
                d[last] *= dims[i];
                for k in 0..K {
                    let l = s[k].len() - 1;
                    s[k][l] = strides[k][i];
                }
            } else {
                d.push(dims[i]);
                for k in 0..K {
                    s[k].push(strides[k][i]);
                }
            }
        }
        Nd { dims: d, strides: s, offsets }
    }

    /// Total number of elements.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    /// Calls `f(out_start, offsets, len, inner_strides)` for each innermost run
    /// covering the linear output range `start..end`.
    pub fn runs(&self, start: usize, end: usize, mut f: impl FnMut(usize, [usize; K], usize, [usize; K])) {
        if start >= end {
            return;
        }
        let r = self.dims.len();
        if r == 0 {
            f(start, self.offsets, 1, [0; K]);
            return;
        }
        let inner = self.dims[r - 1];
        let inner_strides: [usize; K] = std::array::from_fn(|k| self.strides[k][r - 1]);
        // Multi-index of `start`.
        let mut idx: SmallVec<[usize; 6]> = SmallVec::from_elem(0, r);
        let mut rem = start;
        for i in (0..r).rev() {
            idx[i] = rem % self.dims[i];
            rem /= self.dims[i];
        }
        let mut pos = start;
        while pos < end {
            let mut offs = self.offsets;
            for i in 0..r {
                for (k, o) in offs.iter_mut().enumerate() {
                    *o += idx[i] * self.strides[k][i];
                }
            }
            let len = (inner - idx[r - 1]).min(end - pos);
            f(pos, offs, len, inner_strides);
            pos += len;
            // Advance the multi-index by `len`.
            idx[r - 1] += len;
            let mut i = r - 1;
            while idx[i] == self.dims[i] && i > 0 {
                idx[i] = 0;
                idx[i - 1] += 1;
                i -= 1;
            }
        }
    }
}

/// Fills a new vector of `n` elements by calling `fill(start, chunk)` over
/// disjoint chunks, in parallel when `n` is large.
pub fn fill_vec<D: Send>(n: usize, fill: impl Fn(usize, &mut [MaybeUninit<D>]) + Sync) -> Vec<D> {
    let mut v: Vec<D> = Vec::with_capacity(n);
    {
        let spare = &mut v.spare_capacity_mut()[..n];
        if n >= PAR_MIN && rayon::current_num_threads() > 1 {
            let chunk = (n / (rayon::current_num_threads() * 4)).max(PAR_MIN / 4);
            spare.par_chunks_mut(chunk).enumerate().for_each(|(i, c)| fill(i * chunk, c));
        } else {
            fill(0, spare);
        }
    }
    // SAFETY: `fill` is required to write every element of each chunk it is
    // given, and the chunks cover 0..n exactly.
    unsafe { v.set_len(n) };
    v
}

/// Maps one strided operand through `f` into a new contiguous vector.
pub fn map1<S: Copy + Sync, D: Send>(src: &[S], nd: &Nd<1>, f: impl Fn(S) -> D + Sync) -> Vec<D> {
    fill_vec(nd.numel(), |start, out| {
        nd.runs(start, start + out.len(), |pos, [o], len, [s]| {
            let out = &mut out[pos - start..pos - start + len];
            if s == 1 {
                for (d, &x) in out.iter_mut().zip(&src[o..o + len]) {
                    d.write(f(x));
                }
            } else {
                for (i, d) in out.iter_mut().enumerate() {
                    d.write(f(src[o + i * s]));
                }
            }
        })
    })
}

/// Maps two strided operands (already broadcast to one shape) through `f`.
pub fn map2<A: Copy + Sync, B: Copy + Sync, D: Send>(
    a: &[A],
    b: &[B],
    nd: &Nd<2>,
    f: impl Fn(A, B) -> D + Sync,
) -> Vec<D> {
    fill_vec(nd.numel(), |start, out| {
        nd.runs(start, start + out.len(), |pos, [oa, ob], len, [sa, sb]| {
            let out = &mut out[pos - start..pos - start + len];
            match (sa, sb) {
                (1, 1) => {
                    for ((d, &x), &y) in out.iter_mut().zip(&a[oa..oa + len]).zip(&b[ob..ob + len]) {
                        d.write(f(x, y));
                    }
                }
                (1, 0) => {
                    let y = b[ob];
                    for (d, &x) in out.iter_mut().zip(&a[oa..oa + len]) {
                        d.write(f(x, y));
                    }
                }
                (0, 1) => {
                    let x = a[oa];
                    for (d, &y) in out.iter_mut().zip(&b[ob..ob + len]) {
                        d.write(f(x, y));
                    }
                }
                _ => {
                    for (i, d) in out.iter_mut().enumerate() {
                        d.write(f(a[oa + i * sa], b[ob + i * sb]));
                    }
                }
            }
        })
    })
}

/// Maps three strided operands (already broadcast to one shape) through `f`.
pub fn map3<A: Copy + Sync, B: Copy + Sync, C: Copy + Sync, D: Send>(
    a: &[A],
    b: &[B],
    c: &[C],
    nd: &Nd<3>,
    f: impl Fn(A, B, C) -> D + Sync,
) -> Vec<D> {
    fill_vec(nd.numel(), |start, out| {
        nd.runs(start, start + out.len(), |pos, [oa, ob, oc], len, [sa, sb, sc]| {
            let out = &mut out[pos - start..pos - start + len];
            for (i, d) in out.iter_mut().enumerate() {
                d.write(f(a[oa + i * sa], b[ob + i * sb], c[oc + i * sc]));
            }
        })
    })
}
