//! The CUDA launches of the cross-entropy losses (this device's
//! `CrossEntropyKernels`, [`crate::backend::cross_entropy`]) over the
//! kernels of `kernels/cross_entropy.cu`.
//!
//! The sparse loss is one forward launch, a block per row, that keeps each
//! row's log-sum-exp (N floats) and finds bad labels on the device: the
//! lowest bad row and the count of kept rows share one two-word flag,
//! zeroed by one memset, that the host reads once per call, the only wait
//! the loss makes; a sum or mean is then one single-block launch over the
//! per-row losses. A set flag
//! becomes the CPU's `Error::LabelOutOfRange` with the same row and value
//! (read back as the index kernels' bad values are), and what the call
//! allocated is freed. The op has checked shapes, dtypes and options, once
//! for every device. The backward is one launch that
//! writes `w * (softmax - target)` over the logits' own buffer when the
//! caller holds the only handle on it, else over a private copy.
//!
//! The fused linear head runs the same kernels over one chunk of rows of
//! logits at a time, each made by cuBLAS and consumed while it is in
//! memory, so the `[N, V]` logits never exist. A call allocates one
//! chunk-sized buffer that every chunk's product is written into; the
//! kernels add the bias as they read a row, so the sum with the bias has
//! no buffer of its own. The gradients are allocated once per call and
//! each chunk's products land in them directly: `d_hidden`'s rows are
//! written by cuBLAS, `d_weight` is accumulated by cuBLAS with `beta = 1`,
//! and `d_bias` by a kernel adding the chunk's column sums. Above its
//! inputs a call therefore holds one chunk, the gradients and O(N), the
//! CPU's bound. Everything runs in the compute dtype (f32 for f16 and
//! bf16, as on the CPU).

use std::sync::Arc;

use cudarc::driver::result;

use super::buffer::{storage_of, CudaBuffer};
use super::context::{driver_error, CudaDevice};
use super::fill::fill_buffer;
use super::index::int_at;
use super::launch::{device_of_src, launch, Arg, BLOCK};
use super::matmul::gemm_into;
use super::shape::{cast_src, copy, fill_bytes, first_element_src};
use super::CudaBackend;
use crate::backend::cross_entropy::{
    CeForward, CrossEntropyKernels, CrossEntropyOptions, HeadPlan, Logits, Reduction, SparsePlan,
};
use crate::backend::Src;
use crate::storage::Storage;
use crate::{DType, Error, Layout, Result, Shape};

const FILE: &str = "cross_entropy.cu";

/// The float dtypes the kernels have a copy for.
const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

fn fwd_kernel(dtype: DType, labels: DType) -> String {
    format!("ce_fwd_{}_{}", dtype.cuda_suffix(), labels.cuda_suffix())
}

fn bwd_kernel(dtype: DType, labels: DType) -> String {
    format!("ce_bwd_{}_{}", dtype.cuda_suffix(), labels.cuda_suffix())
}

fn inplace_kernel(name: &str, dtype: DType) -> String {
    format!("ce_{name}_{}", dtype.cuda_suffix())
}

/// Every kernel this module launches, as `(file, entry)`.
pub(crate) fn kernels() -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for dt in FLOATS {
        for ld in [DType::I32, DType::I64] {
            out.push((FILE, fwd_kernel(dt, ld)));
            out.push((FILE, bwd_kernel(dt, ld)));
        }
        out.push((FILE, inplace_kernel("scale", dt)));
        out.push((FILE, inplace_kernel("finish", dt)));
        out.push((FILE, inplace_kernel("bias_grad", dt)));
        out.push((FILE, inplace_kernel("bias_grad16", dt)));
    }
    out
}

/// A contiguous buffer this module made (counted by the memory statistics
/// from its allocation on) and its layout.
struct Owned {
    storage: Storage,
    layout: Layout,
}

impl Owned {
    fn src(&self) -> Src<'_> {
        Src { storage: &self.storage, layout: &self.layout }
    }
}

/// An operand read densely: its own elements when it is contiguous in the
/// dtype wanted, else a contiguous copy made here.
enum Dense<'a> {
    Borrowed(Src<'a>),
    Owned(Owned),
}

impl<'a> Dense<'a> {
    /// `x` in `dtype` and contiguous: itself when it is already.
    fn of(x: Src<'a>, dtype: DType) -> Result<Self> {
        let layout = Layout::contiguous(x.shape().clone());
        if x.dtype() != dtype {
            return Ok(Dense::Owned(Owned { storage: cast_src(x, dtype)?, layout }));
        }
        if !x.is_contiguous() {
            return Ok(Dense::Owned(Owned { storage: copy("contiguous", x)?, layout }));
        }
        Ok(Dense::Borrowed(x))
    }

    fn src(&self) -> Src<'_> {
        match self {
            Dense::Borrowed(x) => *x,
            Dense::Owned(o) => o.src(),
        }
    }
}

/// A fresh, uninitialised contiguous buffer of `shape` on `dev`.
fn scratch(dev: &Arc<CudaDevice>, dtype: DType, shape: Shape) -> Result<Owned> {
    let (buf, _) = CudaBuffer::alloc(dev, dtype, shape.numel())?;
    Ok(Owned { storage: storage_of(buf), layout: Layout::contiguous(shape) })
}

/// A contiguous buffer of `shape` on `dev`, every element `value`.
fn filled(dev: &Arc<CudaDevice>, dtype: DType, shape: Shape, value: f64) -> Result<Owned> {
    let n = shape.numel();
    let (buf, _) = CudaBuffer::alloc(dev, dtype, n)?;
    fill_buffer(dev, &buf, n, value, dtype)?;
    Ok(Owned { storage: storage_of(buf), layout: Layout::contiguous(shape) })
}

/// The device address of `x`'s first element.
fn ptr(x: Src<'_>) -> Result<u64> {
    first_element_src("cross_entropy", x)
}

/// Rows `r0..r0 + c` of the contiguous matrix `x`, as a layout.
fn rows_of(x: Src<'_>, r0: usize, c: usize) -> Layout {
    let d = x.shape().dims()[1];
    Layout { shape: Shape::from([c, d]), strides: [d, 1].into_iter().collect(), offset: x.layout.offset + r0 * d }
}

/// The transpose of the matrix `x`, as a layout.
fn transposed(x: Src<'_>) -> Layout {
    let (d, s) = (x.shape().dims(), &x.layout.strides);
    Layout { shape: Shape::from([d[1], d[0]]), strides: [s[1], s[0]].into_iter().collect(), offset: x.layout.offset }
}

/// The flag words of one call, zeroed by one memset: `parts` bad-row
/// words (the complement of the lowest bad row, 0 for none: the kernels
/// take the maximum) and the count of kept rows last.
fn flags(dev: &Arc<CudaDevice>, parts: usize) -> Result<Owned> {
    let t = scratch(dev, DType::I64, Shape::from([parts + 1]))?;
    fill_bytes(dev, ptr(t.src())?, 0, (parts + 1) * 8)?;
    Ok(t)
}

/// Reads the flag words once (waiting for the kernels queued before).
fn read_flags(dev: &Arc<CudaDevice>, flag: &Owned, parts: usize) -> Result<Vec<u64>> {
    dev.bind()?;
    let mut v = vec![0u64; parts + 1];
    // SAFETY: the block holds `parts + 1` u64s; the synchronous copy waits
    // for the kernels queued before it on the device's stream.
    unsafe { result::memcpy_dtoh_sync(&mut v[..], ptr(flag.src())?) }
        .map_err(|e| driver_error("reading the label flag", e))?;
    Ok(v)
}

/// The forward kernel over `rows` contiguous rows of `v` logits at `x`
/// (plus the `v` values at `bias`, unless it is 0): their lse and per-row
/// loss into `lse` and `loss` (accumulation type).
#[allow(clippy::too_many_arguments)]
fn launch_fwd(
    dev: &CudaDevice,
    kernel: &str,
    (rows, v): (usize, usize),
    (x, bias): (u64, u64),
    labels: u64,
    o: &CrossEntropyOptions,
    (lse, loss): (u64, u64),
    (bad, valid): (u64, u64),
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let args = [
        Arg::I64(rows as i64),
        Arg::I64(v as i64),
        Arg::Ptr(x),
        Arg::Ptr(bias),
        Arg::Ptr(labels),
        Arg::I64(o.ignore_index),
        Arg::F64(o.label_smoothing),
        Arg::Ptr(lse),
        Arg::Ptr(loss),
        Arg::Ptr(bad),
        Arg::Ptr(valid),
    ];
    launch(dev, FILE, kernel, rows.saturating_mul(BLOCK as usize), &args)
}

/// The backward kernel over `rows` contiguous rows at `x` (plus `bias`,
/// unless it is 0), in place, with row weights `g[r * g_stride] * scale`.
#[allow(clippy::too_many_arguments)]
fn launch_bwd(
    dev: &CudaDevice,
    kernel: &str,
    (rows, v): (usize, usize),
    (x, bias): (u64, u64),
    lse: u64,
    labels: u64,
    o: &CrossEntropyOptions,
    (g, g_stride, scale): (u64, usize, f64),
) -> Result<()> {
    if rows == 0 || v == 0 {
        return Ok(());
    }
    let args = [
        Arg::I64(rows as i64),
        Arg::I64(v as i64),
        Arg::Ptr(x),
        Arg::Ptr(bias),
        Arg::Ptr(lse),
        Arg::Ptr(labels),
        Arg::I64(o.ignore_index),
        Arg::F64(o.label_smoothing),
        Arg::Ptr(g),
        Arg::I64(g_stride as i64),
        Arg::F64(scale),
    ];
    launch(dev, FILE, kernel, rows.saturating_mul(BLOCK as usize), &args)
}

/// `x *= s` in place over each whole contiguous buffer of `xs` (one
/// dtype), which nothing else reads: three buffers a launch.
fn scale_in_place(xs: &[Src<'_>], s: f64) -> Result<()> {
    let xs: Vec<&Src<'_>> = xs.iter().filter(|x| x.numel() > 0).collect();
    let Some(first) = xs.first() else { return Ok(()) };
    if s == 1.0 {
        return Ok(());
    }
    let (dev, _) = device_of_src("scale", **first)?;
    for group in xs.chunks(3) {
        let mut args = Vec::with_capacity(7);
        let mut n = 0;
        for k in 0..3 {
            match group.get(k) {
                Some(x) => {
                    debug_assert_eq!(x.dtype(), first.dtype(), "internal: one dtype a scaling");
                    args.extend([Arg::I64(x.numel() as i64), Arg::Ptr(ptr(**x)?)]);
                    n += x.numel();
                }
                None => args.extend([Arg::I64(0), Arg::Ptr(0)]),
            }
        }
        args.push(Arg::F64(s));
        launch(&dev, FILE, &inplace_kernel("scale", first.dtype()), n, &args)?;
    }
    Ok(())
}

/// `db += column sums of g` in place (`g` a contiguous `[rows, v]` view,
/// `db` the unique `[v]` bias gradient, same dtype).
fn add_column_sums(db: Src<'_>, g: Src<'_>) -> Result<()> {
    let (rows, v) = (g.shape().dims()[0], g.shape().dims()[1]);
    if rows == 0 || v == 0 {
        return Ok(());
    }
    let (dev, _) = device_of_src("bias_grad", db)?;
    let (gp, dbp) = (ptr(g)?, ptr(db)?);
    let args = [Arg::I64(rows as i64), Arg::I64(v as i64), Arg::Ptr(gp), Arg::Ptr(dbp)];
    // Rows of whole 16-byte units on aligned bases take the vector kernel,
    // a block for each 32 units of columns (its 8 warps, `BIAS_WARPS` in
    // kernels/cross_entropy.cu, are the launch's block of 256 threads).
    let unit = 16 / db.dtype().size_in_bytes();
    if v % unit == 0 && gp % 16 == 0 && dbp % 16 == 0 {
        let blocks = (v / unit).div_ceil(32);
        return launch(&dev, FILE, &inplace_kernel("bias_grad16", db.dtype()), blocks * BLOCK as usize, &args);
    }
    launch(&dev, FILE, &inplace_kernel("bias_grad", db.dtype()), v, &args)
}

/// Logits a kernel may write over: the caller's own buffer when it gave
/// it up, else a fresh contiguous copy.
fn private(logits: Logits<'_>, shape: Shape) -> Result<Owned> {
    let x = match logits {
        Logits::Own(storage) => return Ok(Owned { storage, layout: Layout::contiguous(shape) }),
        Logits::Shared(x) => x,
    };
    let layout = Layout::contiguous(shape);
    if !x.is_contiguous() {
        return Ok(Owned { storage: copy("contiguous", x)?, layout });
    }
    let (dev, _) = device_of_src("copy", x)?;
    let (out, _) = CudaBuffer::alloc(&dev, x.dtype(), x.numel())?;
    let bytes = x.numel() * x.dtype().size_in_bytes();
    if bytes > 0 {
        let from = first_element_src("copy", x)?;
        // SAFETY: both blocks hold `bytes` bytes; the stream is the device's.
        unsafe { result::memcpy_dtod_async(out.ptr(), from, bytes, dev.stream.cu_stream()) }
            .map_err(|e| driver_error("device copy", e))?;
    }
    Ok(Owned { storage: storage_of(out), layout })
}

/// The loss of the per-row losses `loss` (accumulation type) combined as
/// the CPU combines them, in `dtype`: a sum accumulated in f64 from +0.0,
/// a mean over the `valid` kept rows (NaN when none is), one launch either
/// way.
fn combine(loss: Owned, valid: usize, red: Reduction, dtype: DType) -> Result<Storage> {
    if red == Reduction::None {
        if loss.storage.dtype() == dtype {
            return Ok(loss.storage);
        }
        return cast_src(loss.src(), dtype);
    }
    let (dev, lp) = device_of_src("cross_entropy", loss.src())?;
    let out = scratch(&dev, dtype, Shape::from(()))?;
    let kept = if red == Reduction::Mean { valid as i64 } else { -1 };
    let args = [Arg::I64(loss.layout.numel() as i64), Arg::Ptr(lp), Arg::I64(kept), Arg::Ptr(ptr(out.src())?)];
    launch(&dev, FILE, &inplace_kernel("finish", dtype), BLOCK as usize, &args)?;
    Ok(out.storage)
}

/// The per-row weights of an upstream gradient `g` as the backward kernel
/// takes them: `g` in `dtype`, contiguous, its stride over rows (0 for a
/// scalar) and the scale of a mean.
fn weights(g: Src<'_>, dtype: DType, red: Reduction, valid: usize) -> Result<(Dense<'_>, usize, f64)> {
    let g = Dense::of(g, dtype)?;
    Ok(match red {
        Reduction::None => (g, 1, 1.0),
        Reduction::Sum => (g, 0, 1.0),
        Reduction::Mean => (g, 0, if valid == 0 { 0.0 } else { 1.0 / valid as f64 }),
    })
}

/// The first bad row of a call whose chunk `k` starts at `k * chunk`, from
/// the flag words, as the CPU's error (the kernels apply the label rule of
/// [`crate::backend::cross_entropy::label_row`]; the value is read back as
/// the index kernels' bad values are).
fn bad_label(op: &'static str, labels: Src<'_>, words: &[u64], chunk: usize, classes: usize) -> Result<()> {
    let bad = words.iter().enumerate().filter(|(_, &w)| w != 0).map(|(k, &w)| k * chunk + !w as usize).min();
    match bad {
        None => Ok(()),
        Some(row) => Err(Error::LabelOutOfRange { op, label: int_at("reading a label", labels, row)?, row, classes }),
    }
}

impl CrossEntropyKernels for CudaBackend {
    fn sparse_ce(&self, plan: &SparsePlan, x: Src<'_>, labels: Src<'_>) -> Result<CeForward> {
        let (lse, loss, valid) = sparse_rows(plan, x, labels)?;
        let loss = combine(loss, valid, plan.options.reduction, plan.dtype)?;
        Ok(CeForward { loss, lse: lse.storage, valid, grads: None })
    }

    /// Written over the logits' buffer when the caller gave it up, else
    /// over a private copy.
    fn sparse_ce_grad(
        &self,
        plan: &SparsePlan,
        logits: Logits<'_>,
        (lse, valid): (Src<'_>, usize),
        labels: Src<'_>,
        g: Src<'_>,
    ) -> Result<Storage> {
        let name = plan.op;
        let labels = Dense::of(labels, labels.dtype())?;
        let ld = labels.src().dtype();
        let mut shape = plan.lead.clone();
        shape.0.push(plan.v);
        let grad = private(logits, shape)?;
        let dtype = grad.storage.dtype();
        let (g, stride, scale) = weights(g, dtype, plan.options.reduction, valid)?;
        let (dev, _) = device_of_src(name, grad.src())?;
        launch_bwd(
            &dev,
            &bwd_kernel(dtype, ld),
            (plan.lead.numel(), plan.v),
            (ptr(grad.src())?, 0),
            first_element_src(name, lse)?,
            first_element_src(name, labels.src())?,
            &plan.options,
            (first_element_src(name, g.src())?, stride, scale),
        )?;
        Ok(grad.storage)
    }

    fn linear_ce(&self, plan: &HeadPlan, ins: &[Src<'_>], labels: Src<'_>, precompute: bool) -> Result<CeForward> {
        let run = HeadRun::new(plan, ins, labels)?;
        let (loss, lse, valid, grads) = head_forward(&run, precompute)?;
        let loss = combine(loss, valid, plan.options.reduction, plan.dtype)?;
        Ok(CeForward {
            loss,
            lse: lse.storage,
            valid,
            grads: grads.map(|g| g.into_iter().map(|o| o.storage).collect()),
        })
    }

    /// Each chunk's logits recomputed and turned into the gradient in
    /// place, in the inputs' dtype.
    fn linear_ce_grad(
        &self,
        plan: &HeadPlan,
        ins: &[Src<'_>],
        (lse, valid): (Src<'_>, usize),
        labels: Src<'_>,
        g: Src<'_>,
    ) -> Result<Vec<Storage>> {
        let name = plan.op;
        let cd = plan.compute;
        let run = HeadRun::new(plan, ins, labels)?;
        let (g, stride, scale) = weights(g, cd, plan.options.reduction, valid)?;
        let (dev, _) = device_of_src(name, run.ins[0].src())?;
        let grads = zero_grads(&dev, &run)?;
        let buf = run.chunk_buffer(&dev)?;
        let (asz, lsz) = (cd.size_in_bytes() as u64, run.ld.size_in_bytes() as u64);
        let (lp, lsep, gp) = (
            first_element_src(name, run.labels.src())?,
            first_element_src(name, lse)?,
            first_element_src(name, g.src())?,
        );
        let bp = run.bias()?;
        for (_, r0, c) in run.chunks() {
            let (ll, hl) = chunk_logits(&run, &buf, r0, c)?;
            let logits = Src { storage: &buf.storage, layout: &ll };
            let hc = Src { storage: run.ins[0].src().storage, layout: &hl };
            let at = r0 as u64;
            let w = (gp + (stride * r0) as u64 * asz, stride, scale);
            let xp = ptr(logits)?;
            let o = &plan.options;
            launch_bwd(&dev, &bwd_kernel(cd, run.ld), (c, plan.v), (xp, bp), lsep + at * asz, lp + at * lsz, o, w)?;
            backprop_chunk(logits, hc, &run, r0, &grads)?;
        }
        drop(buf);
        if plan.dtype == cd {
            return Ok(grads.into_iter().map(|t| t.storage).collect());
        }
        let out = grads.iter().map(|t| cast_src(t.src(), plan.dtype)).collect::<Result<Vec<_>>>()?;
        drop(grads);
        Ok(out)
    }

    fn scale_ce_grads(&self, grads: Vec<Storage>, s: f64, dtype: DType) -> Result<Vec<Storage>> {
        let owned: Vec<Owned> = grads
            .into_iter()
            .map(|storage| {
                let layout = Layout::contiguous(Shape::from([storage.len()]));
                Owned { storage, layout }
            })
            .collect();
        // One launch for the buffers of each dtype (they share the compute dtype).
        let mut dtypes: Vec<DType> = Vec::new();
        for t in &owned {
            if !dtypes.contains(&t.storage.dtype()) {
                dtypes.push(t.storage.dtype());
            }
        }
        for dt in dtypes {
            let srcs: Vec<Src<'_>> = owned.iter().filter(|t| t.storage.dtype() == dt).map(|t| t.src()).collect();
            scale_in_place(&srcs, s)?;
        }
        owned
            .into_iter()
            .map(|t| if t.storage.dtype() == dtype { Ok(t.storage) } else { cast_src(t.src(), dtype) })
            .collect()
    }
}

/// The forward kernel over all rows of `x`: the lse and per-row losses
/// (shaped like the labels, in the compute dtype) and the count of kept
/// rows, or the CPU's error for a bad label.
fn sparse_rows(plan: &SparsePlan, x: Src<'_>, labels: Src<'_>) -> Result<(Owned, Owned, usize)> {
    let name = plan.op;
    let x = Dense::of(x, x.dtype())?;
    let labels = Dense::of(labels, labels.dtype())?;
    let (x, labels) = (x.src(), labels.src());
    let (dev, _) = device_of_src(name, x)?;
    let rows = plan.lead.numel();
    let lse = scratch(&dev, plan.compute, plan.lead.clone())?;
    let loss = scratch(&dev, plan.compute, plan.lead.clone())?;
    let flag = flags(&dev, 1)?;
    if rows > 0 {
        let fp = ptr(flag.src())?;
        launch_fwd(
            &dev,
            &fwd_kernel(x.dtype(), labels.dtype()),
            (rows, plan.v),
            (first_element_src(name, x)?, 0),
            first_element_src(name, labels)?,
            &plan.options,
            (ptr(lse.src())?, ptr(loss.src())?),
            (fp, fp + 8),
        )?;
    }
    let words = read_flags(&dev, &flag, 1)?;
    bad_label(name, labels, &words[..1], 0, plan.v)?;
    Ok((lse, loss, words[1] as usize))
}

/// What the head's chunk loop needs of the plan and its operands: the
/// inputs and labels contiguous, the inputs in the compute dtype.
struct HeadRun<'a> {
    plan: &'a HeadPlan,
    ins: Vec<Dense<'a>>,
    labels: Dense<'a>,
    ld: DType,
}

impl<'a> HeadRun<'a> {
    fn new(plan: &'a HeadPlan, ins: &[Src<'a>], labels: Src<'a>) -> Result<Self> {
        let ins = ins.iter().map(|&x| Dense::of(x, plan.compute)).collect::<Result<Vec<_>>>()?;
        let labels = Dense::of(labels, labels.dtype())?;
        let ld = labels.src().dtype();
        Ok(HeadRun { plan, ins, labels, ld })
    }

    fn parts(&self) -> usize {
        self.plan.n.div_ceil(self.plan.chunk)
    }

    fn chunks(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let (n, chunk) = (self.plan.n, self.plan.chunk);
        (0..self.parts()).map(move |k| (k, k * chunk, chunk.min(n - k * chunk)))
    }

    /// The one chunk of logits a call writes every chunk's product into.
    fn chunk_buffer(&self, dev: &Arc<CudaDevice>) -> Result<Owned> {
        scratch(dev, self.plan.compute, Shape::from([self.plan.chunk.min(self.plan.n), self.plan.v]))
    }

    /// The address of the bias, or 0 (none) for the kernels.
    fn bias(&self) -> Result<u64> {
        self.ins.get(2).map_or(Ok(0), |b| ptr(b.src()))
    }
}

/// Rows `r0..r0 + c` of `h @ w^T`, by cuBLAS, written over the first `c`
/// rows of the call's chunk buffer `buf` (`[chunk, v]`); the bias is left
/// to the kernels. Returns the layouts of those rows of logits (in `buf`)
/// and of `h`.
fn chunk_logits(run: &HeadRun<'_>, buf: &Owned, r0: usize, c: usize) -> Result<(Layout, Layout)> {
    let (h, w) = (run.ins[0].src(), run.ins[1].src());
    let hl = rows_of(h, r0, c);
    let ll = rows_of(buf.src(), 0, c);
    let wt = transposed(w);
    gemm_into(
        Src { storage: h.storage, layout: &hl },
        Src { storage: w.storage, layout: &wt },
        Src { storage: &buf.storage, layout: &ll },
        0.0,
    )?;
    Ok((ll, hl))
}

/// `[d_hidden, d_weight, d_bias?]`, zeros on the inputs' device.
fn zero_grads(dev: &Arc<CudaDevice>, run: &HeadRun<'_>) -> Result<Vec<Owned>> {
    run.ins.iter().map(|t| filled(dev, run.plan.compute, t.src().shape().clone(), 0.0)).collect()
}

/// Pushes the logits' gradient `g` (`c x v`) of rows `r0..` (hidden rows
/// `hc`) into the gradients, with no buffer of its own: `g @ w` is written
/// into those rows of `d_hidden` (no other chunk writes them), `g^T @ hc`
/// is accumulated into `d_weight` (cuBLAS's `beta = 1`) and the column
/// sums of `g` into `d_bias`.
fn backprop_chunk(g: Src<'_>, hc: Src<'_>, run: &HeadRun<'_>, r0: usize, grads: &[Owned]) -> Result<()> {
    let c = g.shape().dims()[0];
    let dh = rows_of(grads[0].src(), r0, c);
    gemm_into(g, run.ins[1].src(), Src { storage: &grads[0].storage, layout: &dh }, 0.0)?;
    let gt = transposed(g);
    gemm_into(Src { storage: g.storage, layout: &gt }, hc, grads[1].src(), 1.0)?;
    if let Some(db) = grads.get(2) {
        add_column_sums(db.src(), g)?;
    }
    Ok(())
}

/// The fused head's forward: the per-row losses, the lse, the count of
/// kept rows and, with `precompute`, the gradients for a unit upstream
/// gradient (a mean's scaled by one over the kept rows).
#[allow(clippy::type_complexity)]
fn head_forward(run: &HeadRun<'_>, precompute: bool) -> Result<(Owned, Owned, usize, Option<Vec<Owned>>)> {
    let (name, cd, v) = (run.plan.op, run.plan.compute, run.plan.v);
    let (dev, _) = device_of_src(name, run.ins[0].src())?;
    let shape = Shape::from([run.plan.n]);
    let lse = scratch(&dev, cd, shape.clone())?;
    let loss = scratch(&dev, cd, shape)?;
    let parts = run.parts();
    let flag = flags(&dev, parts)?;
    let grads = if precompute { Some(zero_grads(&dev, run)?) } else { None };
    let one = filled(&dev, cd, Shape::from(()), 1.0)?;
    let buf = run.chunk_buffer(&dev)?;
    let (asz, lsz) = (cd.size_in_bytes() as u64, run.ld.size_in_bytes() as u64);
    let (lp, bp, fp) = (first_element_src(name, run.labels.src())?, run.bias()?, ptr(flag.src())?);
    let (lsep, lossp) = (ptr(lse.src())?, ptr(loss.src())?);
    for (k, r0, c) in run.chunks() {
        let (ll, hl) = chunk_logits(run, &buf, r0, c)?;
        let logits = Src { storage: &buf.storage, layout: &ll };
        let hc = Src { storage: run.ins[0].src().storage, layout: &hl };
        let xp = ptr(logits)?;
        let at = r0 as u64;
        launch_fwd(
            &dev,
            &fwd_kernel(cd, run.ld),
            (c, v),
            (xp, bp),
            lp + at * lsz,
            &run.plan.options,
            (lsep + at * asz, lossp + at * asz),
            (fp + 8 * k as u64, fp + 8 * parts as u64),
        )?;
        if let Some(gr) = grads.as_ref() {
            let g = (ptr(one.src())?, 0, 1.0);
            let o = &run.plan.options;
            launch_bwd(&dev, &bwd_kernel(cd, run.ld), (c, v), (xp, bp), lsep + at * asz, lp + at * lsz, o, g)?;
            backprop_chunk(logits, hc, run, r0, gr)?;
        }
    }
    drop(buf);
    let words = read_flags(&dev, &flag, parts)?;
    bad_label(name, run.labels.src(), &words[..parts], run.plan.chunk, v)?;
    let valid = words[parts] as usize;
    if let Some(gr) = grads.as_ref() {
        // Made for a unit weight per row; a mean's is one over the kept rows.
        if run.plan.options.reduction == Reduction::Mean {
            let s = if valid == 0 { 0.0 } else { 1.0 / valid as f64 };
            scale_in_place(&gr.iter().map(|t| t.src()).collect::<Vec<_>>(), s)?;
        }
    }
    Ok((loss, lse, valid, grads))
}
