//! Strided iteration: the one loop nest every CPU kernel runs on.
//!
//! A kernel over `K` operands walks the output in row-major order; for each
//! innermost run it is handed the operands' element offsets and their inner
//! strides, so the hot loop is a plain strided (usually unit-stride) loop.
//! Dims are coalesced first, so a contiguous tensor is a single run.
//! Outputs of [`SPLIT_MIN`] elements and more are split over
//! [`crate::cpu::pool`]'s threads; small ones (a PDE solver's few thousand
//! elements) stay on the calling thread.

use std::mem::MaybeUninit;

use smallvec::SmallVec;

use crate::Result;

/// Below this many elements the row kernels that split by rows or chunks
/// of one long row (reductions, softmax) run on the calling thread: a
/// memory-bound pass over 256 Ki floats takes tens of microseconds, about
/// what waking parked helpers costs on two busy cores.
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
    /// covering the linear output range `start..end`. Inlined, so that a
    /// kernel calling it inside [`crate::cpu::simd::run`] gets the walk and
    /// `f` compiled in the vector copy.
    #[inline(always)]
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

/// The iteration space of two views (their layouts) broadcast to `shape`.
pub(crate) fn nd2(a: &crate::Layout, b: &crate::Layout, shape: &crate::Shape) -> Nd<2> {
    let sa = a.broadcast_strides(shape);
    let sb = b.broadcast_strides(shape);
    Nd::new(shape.dims(), [&sa, &sb], [a.offset, b.offset])
}

/// The iteration space of one view (its layout).
pub(crate) fn nd1(a: &crate::Layout) -> Nd<1> {
    Nd::new(a.shape.dims(), [&a.strides], [a.offset])
}

/// Transparent huge pages: the size of one, and the smallest buffer worth
/// asking for them (numpy's threshold).
const HUGE_PAGE: usize = 2 << 20;
const HUGE_MIN_BYTES: usize = 4 << 20;

/// Asks the OS to back the 2 MiB-aligned interior of a large fresh buffer
/// with transparent huge pages, before its first touch; returns whether it
/// asked. Faulting in a 64 MiB output 4 KiB at a time costs more than the
/// kernel that fills it (numpy does the same). Purely advisory: byte
/// accounting is unchanged and a refusal (other OS, THP off) costs nothing.
fn advise_huge_pages(addr: usize, bytes: usize) -> bool {
    if bytes < HUGE_MIN_BYTES {
        return false;
    }
    #[cfg(target_os = "linux")]
    {
        let start = addr.next_multiple_of(HUGE_PAGE);
        let end = (addr + bytes) / HUGE_PAGE * HUGE_PAGE;
        if end > start {
            // SAFETY: the range lies inside one live allocation we own;
            // MADV_HUGEPAGE changes no contents and no permissions.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
        true
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = addr;
        false
    }
}

/// From this many elements on, [`fill_vec`] splits its output over the
/// threads of [`crate::cpu::pool`] (torch's grain size for elementwise loops).
pub const SPLIT_MIN: usize = 1 << 15;

/// Fills a new vector of `n` elements by calling `fill(start, chunk)` over
/// disjoint chunks (some possibly empty), split over the pool's threads when
/// `n` is large. Fails with [`Error::OutOfMemory`](crate::Error::OutOfMemory),
/// before calling `fill`, when the vector cannot be allocated.
///
/// The split gives the calling thread the first part and the helpers the
/// following ones, in order, as a large matrix product splits its rows:
/// an elementwise op after a product finds each part in the cache of the
/// core that wrote it.
pub fn fill_vec<D: Send>(n: usize, fill: impl Fn(usize, &mut [MaybeUninit<D>]) + Sync) -> Result<Vec<D>> {
    fill_vec_parts(n, crate::cpu::pool::parts_for(n, SPLIT_MIN), fill)
}

/// [`fill_vec`] in `parts` parts (at most one per thread and element; for
/// kernels whose work per output element is large: a reduction's rows).
pub fn fill_vec_parts<D: Send>(
    n: usize,
    parts: usize,
    fill: impl Fn(usize, &mut [MaybeUninit<D>]) + Sync,
) -> Result<Vec<D>> {
    let mut v: Vec<D> = crate::cache::take(n)?;
    {
        let spare = &mut v.spare_capacity_mut()[..n];
        let size = std::mem::size_of::<D>().max(1);
        let huge = advise_huge_pages(spare.as_mut_ptr() as usize, n * size);
        let parts = parts.min(crate::cpu::pool::width()).min(n).max(1);
        if parts > 1 {
            // Part boundaries on cache lines, or on huge pages when the
            // buffer has them (two threads faulting in one 2 MiB page wait
            // for each other).
            let base = spare.as_ptr() as usize;
            let align = if huge { HUGE_PAGE } else { 64 };
            let bound = |i: usize| -> usize {
                if i == 0 {
                    return 0;
                }
                if i >= parts {
                    return n;
                }
                let at = (base + i * n.div_ceil(parts) * size).next_multiple_of(align);
                ((at - base) / size).min(n)
            };
            let out = crate::cpu::pool::Disjoint::new(spare);
            crate::cpu::pool::split(parts, &|i| {
                let (start, end) = (bound(i), bound(i + 1));
                // SAFETY: the bounds increase with `i`, so the parts are
                // disjoint ranges of `spare`, each handed to one thread.
                let chunk = unsafe { out.slice(start, end.max(start) - start) };
                fill(start, chunk);
            });
        } else {
            fill(0, spare);
        }
    }
    // SAFETY: `fill` is required to write every element of each chunk it is
    // given, and the chunks cover 0..n exactly.
    unsafe { v.set_len(n) };
    Ok(v)
}

/// Maps one strided operand through `f` into a new contiguous vector (or
/// fails, as [`fill_vec`] does, when it cannot be allocated).
pub fn map1<S: Copy + Sync, D: Send>(src: &[S], nd: &Nd<1>, f: impl Fn(S) -> D + Sync) -> Result<Vec<D>> {
    fill_vec(nd.numel(), |start, out| {
        nd.runs(start, start + out.len(), |pos, [o], len, [s]| {
            let out = &mut out[pos - start..pos - start + len];
            if s == 1 {
                let src = &src[o..o + len];
                crate::cpu::simd::run(
                    #[inline(always)]
                    || {
                        for (d, &x) in out.iter_mut().zip(src) {
                            d.write(f(x));
                        }
                    },
                );
            } else {
                for (i, d) in out.iter_mut().enumerate() {
                    d.write(f(src[o + i * s]));
                }
            }
        })
    })
}

/// Maps two strided operands (already broadcast to one shape) through `f`.
///
/// Each part's whole walk runs inside one [`crate::cpu::simd::run`], not
/// one per run: an operand broadcast along a middle axis (`[N, 1, w]`
/// against `[N, d, w]`, a Jacobian times an activation's derivative) cuts
/// the walk into runs of `w`, and at `w = 64` entering the vector copy for
/// each run cost as much as the run's arithmetic (a twentieth of a Poisson
/// PINN step).
pub fn map2<A: Copy + Sync, B: Copy + Sync, D: Send>(
    a: &[A],
    b: &[B],
    nd: &Nd<2>,
    f: impl Fn(A, B) -> D + Sync,
) -> Result<Vec<D>> {
    fill_vec(nd.numel(), |start, out| {
        crate::cpu::simd::run(
            #[inline(always)]
            || {
                nd.runs(
                    start,
                    start + out.len(),
                    #[inline(always)]
                    |pos, [oa, ob], len, [sa, sb]| {
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
                    },
                )
            },
        )
    })
}

/// Maps three strided operands (already broadcast to one shape) through `f`.
pub fn map3<A: Copy + Sync, B: Copy + Sync, C: Copy + Sync, D: Send>(
    a: &[A],
    b: &[B],
    c: &[C],
    nd: &Nd<3>,
    f: impl Fn(A, B, C) -> D + Sync,
) -> Result<Vec<D>> {
    fill_vec(nd.numel(), |start, out| {
        nd.runs(start, start + out.len(), |pos, [oa, ob, oc], len, [sa, sb, sc]| {
            let out = &mut out[pos - start..pos - start + len];
            if (sa, sb, sc) == (1, 1, 1) {
                let (a, b, c) = (&a[oa..oa + len], &b[ob..ob + len], &c[oc..oc + len]);
                crate::cpu::simd::run(
                    #[inline(always)]
                    || {
                        for (((d, &x), &y), &z) in out.iter_mut().zip(a).zip(b).zip(c) {
                            d.write(f(x, y, z));
                        }
                    },
                );
            } else {
                for (i, d) in out.iter_mut().enumerate() {
                    d.write(f(a[oa + i * sa], b[ob + i * sb], c[oc + i * sc]));
                }
            }
        })
    })
}
