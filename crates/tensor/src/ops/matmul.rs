//! Matrix products through the gemm crate, on strided views (a transposed
//! operand is read in place, never copied), with broadcast batch dims.

use smallvec::SmallVec;

use crate::ops::binary::BinaryOps;
use crate::ops::reduce::ReduceOps;
use crate::ops::shape::ShapeOps;
use crate::ops::unary::float_map;
use crate::ops::{add_opt, Diff, InputGrads, Op, Saved};
use crate::storage::CpuElement;
use crate::{with_float, Error, Float, Result, Shape, Tensor};

/// From this many multiply-adds on, one product is split over the spinning
/// helpers of [`crate::pool`] (about 20 us of work on one core). Splitting
/// through rayon measured slower than one thread up to 16 Mi multiply-adds:
/// its workers fall asleep between a step's products and each wake-up costs
/// more than half a 1024 x 64 x 64 product on these virtual machines.
const SPLIT_MIN: usize = 1 << 20;

/// One strided product `dst = a @ b` (`dst += a @ b` when `accumulate`),
/// `dst` row-major with row stride `dst_rs`.
#[derive(Clone, Copy)]
struct Gemm<T> {
    m: usize,
    n: usize,
    k: usize,
    dst: *mut T,
    dst_rs: usize,
    a: *const T,
    a_rs: isize,
    a_cs: isize,
    b: *const T,
    b_rs: isize,
    b_cs: isize,
    accumulate: bool,
}

// SAFETY: a `Gemm` is a description of disjoint output blocks and shared
// read-only operands; `run` hands each part's block to one thread only.
unsafe impl<T> Send for Gemm<T> {}
unsafe impl<T> Sync for Gemm<T> {}

/// Inner dimensions up to this get a strided `b` packed row-major first.
const SMALL_K: usize = 16;
/// Outputs up to this many elements with an inner dimension of two
/// [`K_CHUNK`]s or more take [`Gemm::split_k`].
const SMALL_OUT: usize = 1 << 14;
/// The inner-dimension chunk of [`Gemm::split_k`].
const K_CHUNK: usize = 512;

/// A `Gemm` shared by the parts of a split.
struct SendGemm<T>(Gemm<T>);
// SAFETY: as for `Gemm`.
unsafe impl<T> Send for SendGemm<T> {}
unsafe impl<T> Sync for SendGemm<T> {}

impl<T: Copy> SendGemm<T> {
    fn get(&self) -> Gemm<T> {
        self.0
    }
}

impl<T: Float> Gemm<T> {
    /// Runs the product, split by output rows (or columns, for short wide
    /// outputs) over the pool when it is large enough.
    ///
    /// # Safety
    /// Every element the description addresses lies inside a live buffer;
    /// the `m x n` block at `dst` is not read or written by anyone else
    /// meanwhile, and is only read when `accumulate`.
    unsafe fn run(self) {
        if self.m == 0 || self.n == 0 {
            return;
        }
        if self.k <= SMALL_K && self.b_cs != 1 && self.m >= 64 {
            // The gemm crate reads a thin `b` in place, and strided (a
            // transposed weight: a network's first layer on 2-D points) that
            // took 31 us for 1024 x 64 x 2 against 8 us row-major. A copy of
            // k x n elements costs nothing beside it.
            let mut packed = Vec::with_capacity(self.k * self.n);
            for p in 0..self.k {
                // SAFETY: row p of `b` lies inside it (the caller's contract).
                packed.extend(
                    (0..self.n).map(|j| unsafe { *self.b.offset(p as isize * self.b_rs + j as isize * self.b_cs) }),
                );
            }
            // SAFETY: `packed` is `b`'s k x n elements, row-major, alive for
            // the call.
            return unsafe { Gemm { b: packed.as_ptr(), b_rs: self.n as isize, b_cs: 1, ..self }.run() };
        }
        if self.m * self.n <= SMALL_OUT && self.k >= 2 * K_CHUNK && self.m * self.n * self.k >= SPLIT_MIN {
            // SAFETY: forwarded from the caller.
            return unsafe { self.split_k() };
        }
        // One part per thread: the caller takes rows 0.., the helper the
        // rows after, the split [`crate::iter::fill_vec`] makes of an
        // elementwise output of that size, so the next op finds each half in
        // the cache of the core that wrote it.
        let parts = crate::pool::parts_for(self.m * self.n * self.k, SPLIT_MIN);
        // A tall product too cheap to be worth splitting for itself (a
        // network's first or last layer: 1024 x 64 x 2, 1024 x 1 x 64) is
        // still split by rows when its output or its left operand is as
        // large as a split elementwise op's: each thread then reads and
        // writes the rows the ops around it give that thread, where one
        // thread doing all rows would move half of them between the cores.
        let tall = self.m >= 64 && self.m * self.n.max(self.k) >= crate::iter::SPLIT_MIN;
        let parts = if parts == 1 && tall {
            crate::pool::parts_for(self.m * self.n.max(self.k), crate::iter::SPLIT_MIN)
        } else {
            parts
        };
        // The microkernels cover 16 rows or 4 columns at a time.
        let rows = self.m.div_ceil(parts).next_multiple_of(16);
        let cols = self.n.div_ceil(parts).next_multiple_of(4);
        if parts > 1 && rows < self.m && crate::pool::width() > 1 {
            // SAFETY: the parts' row ranges are disjoint blocks of `dst`.
            crate::pool::split(self.m.div_ceil(rows), &|i| unsafe { self.rows(i * rows, rows).call() });
        } else if parts > 1 && !tall && cols < self.n && crate::pool::width() > 1 {
            // SAFETY: the parts' column ranges are disjoint blocks of `dst`.
            crate::pool::split(self.n.div_ceil(cols), &|i| unsafe { self.cols(i * cols, cols).call() });
        } else {
            self.call()
        }
    }

    /// A small output with a long inner dimension (a weight gradient,
    /// `dY^T X` over a batch): the inner dimension in fixed chunks of
    /// [`K_CHUNK`], one product per chunk into its own buffer, spread over
    /// the pool, then added in chunk order. Each thread packs only its
    /// chunk's operands, where a row split would pack all of `b` on every
    /// thread; the chunks depend only on `k`, so no bit depends on the
    /// number of threads.
    unsafe fn split_k(self) {
        let (m, n) = (self.m, self.n);
        let chunks = self.k.div_ceil(K_CHUNK);
        let mut partial = vec![T::ZERO; chunks * m * n];
        let out = crate::pool::Disjoint::new(&mut partial);
        let this = SendGemm(self);
        crate::pool::split(chunks, &|c| {
            let g = this.get();
            let k0 = c * K_CHUNK;
            // SAFETY: block c of `partial` is this part's alone; the chunk's
            // columns of `a` and rows of `b` lie inside them.
            unsafe {
                Gemm {
                    k: K_CHUNK.min(g.k - k0),
                    dst: out.slice(c * m * n, m * n).as_mut_ptr(),
                    dst_rs: n,
                    a: g.a.wrapping_offset(k0 as isize * g.a_cs),
                    b: g.b.wrapping_offset(k0 as isize * g.b_rs),
                    accumulate: false,
                    ..g
                }
                .call()
            }
        });
        for i in 0..m {
            // SAFETY: row i of `dst` (the caller's contract).
            let row = unsafe { std::slice::from_raw_parts_mut(self.dst.add(i * self.dst_rs), n) };
            for (j, o) in row.iter_mut().enumerate() {
                let mut acc = if self.accumulate { *o } else { T::ZERO };
                for c in 0..chunks {
                    acc += partial[c * m * n + i * n + j];
                }
                *o = acc;
            }
        }
    }

    /// Rows `r0..r0 + len` (clipped to `m`) of the product.
    fn rows(self, r0: usize, len: usize) -> Self {
        Gemm {
            m: len.min(self.m - r0),
            dst: self.dst.wrapping_add(r0 * self.dst_rs),
            a: self.a.wrapping_offset(r0 as isize * self.a_rs),
            ..self
        }
    }

    /// Columns `c0..c0 + len` (clipped to `n`) of the product.
    fn cols(self, c0: usize, len: usize) -> Self {
        Gemm {
            n: len.min(self.n - c0),
            dst: self.dst.wrapping_add(c0),
            b: self.b.wrapping_offset(c0 as isize * self.b_cs),
            ..self
        }
    }

    /// One gemm call on this thread.
    unsafe fn call(self) {
        // SAFETY: forwarded from `run`'s contract.
        unsafe {
            gemm::gemm(
                self.m,
                self.n,
                self.k,
                self.dst,
                1,
                self.dst_rs as isize,
                self.accumulate,
                self.a,
                self.a_cs,
                self.a_rs,
                self.b,
                self.b_cs,
                self.b_rs,
                T::ONE,
                T::ONE,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        }
    }
}

/// `a @ b` for rank >= 2 operands: `[..., m, k] @ [..., k, n]`.
#[derive(Debug, Clone, Copy)]
pub struct Matmul;

struct Plan {
    batch: Shape,
    m: usize,
    k: usize,
    n: usize,
}

fn plan(a: &Tensor, b: &Tensor) -> Result<Plan> {
    let mismatch = || Error::ShapeMismatch { op: "matmul", lhs: a.shape().clone(), rhs: b.shape().clone() };
    if a.rank() < 2 || b.rank() < 2 {
        return Err(mismatch());
    }
    let (ra, rb) = (a.rank(), b.rank());
    let (m, k) = (a.dims()[ra - 2], a.dims()[ra - 1]);
    let (k2, n) = (b.dims()[rb - 2], b.dims()[rb - 1]);
    if k != k2 {
        return Err(mismatch());
    }
    let batch = Shape::broadcast("matmul", &Shape::from(&a.dims()[..ra - 2]), &Shape::from(&b.dims()[..rb - 2]))
        .map_err(|_| mismatch())?;
    Ok(Plan { batch, m, k, n })
}

/// Element offsets of each batch entry of `t` broadcast over `batch`.
fn batch_offsets(t: &Tensor, batch: &Shape) -> Vec<usize> {
    let r = t.rank();
    let own = Shape::from(&t.dims()[..r - 2]);
    let lay =
        crate::Layout { shape: own, strides: SmallVec::from_slice(&t.strides()[..r - 2]), offset: t.layout.offset };
    let strides = lay.broadcast_strides(batch);
    let mut out = Vec::with_capacity(batch.numel());
    let nd = crate::iter::Nd::new(batch.dims(), [&strides], [t.layout.offset]);
    nd.runs(0, batch.numel(), |_, [o], len, [s]| out.extend((0..len).map(|i| o + i * s)));
    out
}

fn kernel<T: Float + CpuElement>(a: &Tensor, b: &Tensor, p: &Plan) -> Result<Vec<T>> {
    let (m, k, n) = (p.m, p.k, p.n);
    let (ra, rb) = (a.rank(), b.rank());
    let (a_rs, a_cs) = (a.strides()[ra - 2] as isize, a.strides()[ra - 1] as isize);
    let (b_rs, b_cs) = (b.strides()[rb - 2] as isize, b.strides()[rb - 1] as isize);
    let (ao, bo) = (batch_offsets(a, &p.batch), batch_offsets(b, &p.batch));
    let (ad, bd) = (a.storage_slice::<T>(), b.storage_slice::<T>());
    let total = p.batch.numel() * m * n;
    if total == 0 || k == 0 {
        return crate::storage::try_filled(total, T::ZERO);
    }
    // The output is not zeroed first: gemm is told not to read it
    // (`read_dst = false`) and writes every element of each block.
    let mut out: Vec<T> = crate::cache::take(total)?;
    let dst = crate::pool::Disjoint::new(&mut out.spare_capacity_mut()[..total]);
    let entry = |i: usize| Gemm {
        m,
        n,
        k,
        // SAFETY: block i is written by whoever runs entry i, alone.
        dst: unsafe { dst.slice(i * m * n, m * n) }.as_mut_ptr() as *mut T,
        dst_rs: n,
        // SAFETY: the offsets come from valid layouts of `a` and `b`.
        a: unsafe { ad.as_ptr().add(ao[i]) },
        a_rs,
        a_cs,
        b: unsafe { bd.as_ptr().add(bo[i]) },
        b_rs,
        b_cs,
        accumulate: false,
    };
    let batch = p.batch.numel();
    let parts = crate::pool::parts_for(batch * m * n * k, SPLIT_MIN).min(batch);
    if batch > 1 && m * n * k < SPLIT_MIN && batch * m * n * k >= SPLIT_MIN && parts > 1 {
        // Many small products: whole products per part.
        let per = batch.div_ceil(parts);
        crate::pool::split(batch.div_ceil(per), &|part| {
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

impl Op for Matmul {
    fn name(&self) -> &'static str {
        "matmul"
    }

    fn saves(&self) -> Saved {
        Saved::INPUTS
    }
    fn forward(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let (a, b) = (xs[0], xs[1]);
        if a.dtype() != b.dtype() {
            return Err(Error::DTypeMismatch { op: "matmul", lhs: a.dtype(), rhs: b.dtype() });
        }
        if a.device() != b.device() {
            return Err(Error::DeviceMismatch { op: "matmul", lhs: a.device(), rhs: b.device() });
        }
        let p = plan(a, b)?;
        let mut shape = p.batch.clone();
        shape.0.push(p.m);
        shape.0.push(p.n);
        shape.check("matmul", a.dtype())?;
        let b = b.cast_raw(a.dtype().compute())?;
        float_map(
            "matmul",
            a,
            |a| with_float!(a.dtype(), T => Tensor::from_vec(kernel::<T>(a, &b, &p)?, shape.clone()), _ => unreachable!()),
        )
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let (a, b) = (xs[0], xs[1]);
        let ga = g.matmul(&b.t()?)?.sum_to(a.shape())?;
        let gb = a.t()?.matmul(g)?.sum_to(b.shape())?;
        Ok(smallvec::smallvec![Some(ga), Some(gb)])
    }
    fn jvp<T: Diff>(&self, xs: &[&T], _: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        let (a, b) = (xs[0], xs[1]);
        let mut terms: SmallVec<[(&T, &T); 2]> = SmallVec::new();
        if let Some(t) = ts[0] {
            terms.push((t, b));
        }
        if let Some(t) = ts[1] {
            terms.push((a, t));
        }
        matmul_sum(&terms)
    }
}

/// `a_1 @ b_1 + a_2 @ b_2 + ...` (`None` for no terms): the form of every
/// product rule's tangent. When nothing is recorded and every operand is a
/// 2-D CPU f32/f64 matrix, the products go into one buffer, the first
/// written and the others accumulated by gemm, so there is no temporary
/// product and no addition pass. Otherwise (recording, batched or other
/// dtypes) it is `matmul` and `add`, differentiable as usual.
pub fn matmul_sum<T: Diff>(terms: &[(&T, &T)]) -> Result<Option<T>> {
    let Some(&(first, _)) = terms.first() else { return Ok(None) };
    if !first.is_recording() && terms.len() > 1 {
        let vals = terms.iter().map(|(a, b)| Ok((a.eval()?, b.eval()?))).collect::<Result<Vec<_>>>()?;
        if let Some(out) = eager_matmul_sum(&vals)? {
            return Ok(Some(first.lift(out)));
        }
    }
    let mut acc: Option<T> = None;
    for (a, b) in terms {
        acc = add_opt(acc, Some(a.matmul(b)?))?;
    }
    Ok(acc)
}

fn eager_matmul_sum(terms: &[(Tensor, Tensor)]) -> Result<Option<Tensor>> {
    let (a0, b0) = &terms[0];
    let dtype = a0.dtype();
    let (m, n) = (a0.dims().first().copied().unwrap_or(0), b0.dims().get(1).copied().unwrap_or(0));
    let fits = terms.iter().all(|(a, b)| {
        [a, b].iter().all(|t| t.rank() == 2 && t.dtype() == dtype && t.device() == crate::Device::Cpu)
            && a.dims()[0] == m
            && b.dims()[1] == n
            && a.dims()[1] == b.dims()[0]
    });
    if !fits || !matches!(dtype, crate::DType::F32 | crate::DType::F64) {
        return Ok(None);
    }
    with_float!(dtype, F => {
        let mut out: Vec<F> = crate::cache::take(m * n)?;
        let dst = out.spare_capacity_mut().as_mut_ptr() as *mut F;
        let mut written = false;
        for (a, b) in terms {
            let k = a.dims()[1];
            if m * n == 0 || k == 0 {
                continue;
            }
            let (ad, bd) = (a.storage_slice::<F>(), b.storage_slice::<F>());
            // SAFETY: offsets and strides come from valid 2-D layouts of `a`
            // and `b`; `dst` has room for m x n elements, and is read
            // (`accumulate`) only after an earlier term wrote all of them.
            unsafe {
                Gemm {
                    m,
                    n,
                    k,
                    dst,
                    dst_rs: n,
                    a: ad.as_ptr().add(a.layout.offset),
                    a_rs: a.strides()[0] as isize,
                    a_cs: a.strides()[1] as isize,
                    b: bd.as_ptr().add(b.layout.offset),
                    b_rs: b.strides()[0] as isize,
                    b_cs: b.strides()[1] as isize,
                    accumulate: written,
                }
                .run()
            };
            written = true;
        }
        if !written {
            return Ok(Some(Tensor::zeros([m, n], dtype)?));
        }
        // SAFETY: the first product with k > 0 wrote all m x n elements.
        unsafe { out.set_len(m * n) };
        Tensor::from_vec(out, [m, n]).map(Some)
    }, _ => Ok(None))
}

/// Matrix products, on tensors and graph handles alike.
pub trait MatmulOps: Diff {
    /// torch.matmul: 1-D operands are promoted to matrices and the added
    /// axis removed afterwards; batch dims broadcast.
    fn matmul(&self, o: &Self) -> Result<Self> {
        let (ra, rb) = (self.rank(), o.rank());
        let mismatch = || Error::ShapeMismatch { op: "matmul", lhs: self.shape(), rhs: o.shape() };
        if ra == 0 || rb == 0 {
            return Err(mismatch());
        }
        // Check the inner dims here, so the error names the shapes the user
        // passed rather than the promoted ones.
        let (sa, sb) = (self.shape(), o.shape());
        if sa.dims()[ra - 1] != sb.dims()[rb.saturating_sub(2)] {
            return Err(mismatch());
        }
        let a = if ra == 1 { self.unsqueeze(0)? } else { self.clone() };
        let b = if rb == 1 { o.unsqueeze(-1)? } else { o.clone() };
        let mut y = Self::apply(Matmul, &[&a, &b])?;
        // y is [..., m, n]; drop the promoted row axis first, so that for
        // vector . vector the promoted column axis is then last.
        if ra == 1 {
            y = y.squeeze(-2)?;
        }
        if rb == 1 {
            y = y.squeeze(-1)?;
        }
        Ok(y)
    }
    /// `x @ w^T + b`, the affine map of a linear layer (`w` is `[out, in]`).
    fn linear(&self, w: &Self, b: Option<&Self>) -> Result<Self> {
        let y = self.matmul(&w.t()?)?;
        match b {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }
}

impl<T: Diff> MatmulOps for T {}

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
    // SAFETY: the asserts above keep every addressed element in bounds,
    // and `dst` is borrowed mutably for the call.
    unsafe {
        Gemm {
            m,
            n,
            k,
            dst: dst.as_mut_ptr(),
            dst_rs: n,
            a: a.data.as_ptr(),
            a_rs: a.rs as isize,
            a_cs: a.cs as isize,
            b: b.data.as_ptr(),
            b_rs: b.rs as isize,
            b_cs: b.cs as isize,
            accumulate,
        }
        .run()
    }
}
