//! The CUDA launches of the cross-entropy losses
//! ([`crate::ops::cross_entropy`]) over the kernels of
//! `kernels/cross_entropy.cu`.
//!
//! The sparse loss is one forward launch, a block per row, that keeps each
//! row's log-sum-exp (N floats) and finds bad labels on the device: the
//! lowest bad row and the count of kept rows share one two-word flag,
//! zeroed by one memset, that the host reads once per call, the only wait
//! the loss makes; a sum or mean is then one single-block launch over the
//! per-row losses. A set flag
//! becomes the CPU's `Error::LabelOutOfRange` with the same row and value,
//! and what the call allocated is freed. The backward is one launch that
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

use super::buffer::{tensor_of, CudaBuffer};
use super::context::{driver_error, CudaDevice};
use super::launch::{device_of, launch, Arg, BLOCK};
use super::matmul::gemm_into;
use super::shape::{cast, contiguous};
use super::shape::{fill_bytes, first_element};
use crate::ops::cross_entropy::{
    check_options, compute_dtype, CrossEntropyOptions, LinearCrossEntropy, Reduction, SparseCrossEntropy,
};
use crate::ops::shape::ShapeOps;
use crate::ops::Op;
use crate::{DType, Error, Result, Shape, Tensor};

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
    }
    out
}

/// The label dtype, or the CPU's error for any other.
fn label_dtype(op: &'static str, labels: &Tensor) -> Result<DType> {
    match labels.dtype() {
        d @ (DType::I32 | DType::I64) => Ok(d),
        dtype => Err(Error::UnsupportedDType { op, dtype, expected: "int32 or int64 labels" }),
    }
}

/// The label at flat position `row` of the contiguous device tensor `labels`.
fn label_at(labels: &Tensor, row: usize) -> Result<i64> {
    let at = first_element("label", labels)? + (row * labels.dtype().size_in_bytes()) as u64;
    // SAFETY: `row` is a row a kernel read a label of, so the element lies
    // in the buffer; the context is bound by the caller.
    unsafe {
        if labels.dtype() == DType::I32 {
            let mut v = [0i32];
            result::memcpy_dtoh_sync(&mut v, at).map(|_| i64::from(v[0]))
        } else {
            let mut v = [0i64];
            result::memcpy_dtoh_sync(&mut v, at).map(|_| v[0])
        }
    }
    .map_err(|e| driver_error("reading a label", e))
}

/// A fresh, uninitialised contiguous tensor of `shape` on `dev`, counted
/// by the memory statistics from now on (a bare buffer is counted only
/// once a tensor holds it).
fn scratch(dev: &Arc<CudaDevice>, dtype: DType, shape: Shape) -> Result<Tensor> {
    let (buf, _) = CudaBuffer::alloc(dev, dtype, shape.numel())?;
    Ok(tensor_of(buf, shape))
}

/// The device address of `t`'s first element, for a tensor made here.
fn ptr(t: &Tensor) -> Result<u64> {
    first_element("cross_entropy", t)
}

/// The flag words of one call, zeroed by one memset: `parts` bad-row
/// words (the complement of the lowest bad row, 0 for none: the kernels
/// take the maximum) and the count of kept rows last.
fn flags(dev: &Arc<CudaDevice>, parts: usize) -> Result<Tensor> {
    let t = scratch(dev, DType::I64, Shape::from([parts + 1]))?;
    fill_bytes(dev, ptr(&t)?, 0, (parts + 1) * 8)?;
    Ok(t)
}

/// Reads the flag words once (waiting for the kernels queued before).
fn read_flags(dev: &Arc<CudaDevice>, flag: &Tensor, parts: usize) -> Result<Vec<u64>> {
    dev.bind()?;
    let mut v = vec![0u64; parts + 1];
    // SAFETY: the block holds `parts + 1` u64s; the synchronous copy waits
    // for the kernels queued before it on the device's stream.
    unsafe { result::memcpy_dtoh_sync(&mut v[..], ptr(flag)?) }
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

/// `x *= s` in place over the whole buffer of the unique tensor `x`.
fn scale_in_place(x: &Tensor, s: f64) -> Result<()> {
    let n = x.numel();
    if n == 0 || s == 1.0 {
        return Ok(());
    }
    let (dev, p) = device_of("scale", x)?;
    launch(&dev, FILE, &inplace_kernel("scale", x.dtype()), n, &[Arg::I64(n as i64), Arg::Ptr(p), Arg::F64(s)])
}

/// `db += column sums of g` in place (`g` a contiguous `[rows, v]` view,
/// `db` the unique `[v]` bias gradient, same dtype).
fn add_column_sums(db: &Tensor, g: &Tensor) -> Result<()> {
    let (rows, v) = (g.dims()[0], g.dims()[1]);
    if rows == 0 || v == 0 {
        return Ok(());
    }
    let (dev, _) = device_of("bias_grad", db)?;
    let args = [Arg::I64(rows as i64), Arg::I64(v as i64), Arg::Ptr(ptr(g)?), Arg::Ptr(ptr(db)?)];
    launch(&dev, FILE, &inplace_kernel("bias_grad", db.dtype()), v, &args)
}

/// `t` itself when the caller holds the only handle on its whole,
/// contiguous buffer (so a kernel may write over it), else a fresh
/// contiguous copy.
fn private(t: Tensor) -> Result<Tensor> {
    let whole = t.is_contiguous() && t.layout.offset == 0 && t.numel() == t.storage.len();
    if whole && Arc::strong_count(&t.storage) == 1 {
        return Ok(t);
    }
    if !t.is_contiguous() {
        return contiguous(&t);
    }
    let (dev, _) = device_of("copy", &t)?;
    let (out, _) = CudaBuffer::alloc(&dev, t.dtype(), t.numel())?;
    let bytes = t.numel() * t.dtype().size_in_bytes();
    if bytes > 0 {
        let from = first_element("copy", &t)?;
        // SAFETY: both blocks hold `bytes` bytes; the stream is the device's.
        unsafe { result::memcpy_dtod_async(out.ptr(), from, bytes, dev.stream.cu_stream()) }
            .map_err(|e| driver_error("device copy", e))?;
    }
    Ok(tensor_of(out, t.shape().clone()))
}

/// The loss of the per-row losses `loss` (accumulation type) combined as
/// the CPU combines them, in `dtype`: a sum accumulated in f64 from +0.0,
/// a mean over the `valid` kept rows (NaN when none is), one launch either
/// way.
fn combine(loss: Tensor, valid: usize, red: Reduction, dtype: DType) -> Result<Tensor> {
    if red == Reduction::None {
        return cast(&loss, dtype);
    }
    let (dev, lp) = device_of("cross_entropy", &loss)?;
    let out = scratch(&dev, dtype, Shape::from(()))?;
    let kept = if red == Reduction::Mean { valid as i64 } else { -1 };
    let args = [Arg::I64(loss.numel() as i64), Arg::Ptr(lp), Arg::I64(kept), Arg::Ptr(ptr(&out)?)];
    launch(&dev, FILE, &inplace_kernel("finish", dtype), BLOCK as usize, &args)?;
    Ok(out)
}

/// The per-row weights of an upstream gradient `g` as the backward kernel
/// takes them: `g` in `dtype`, contiguous, its stride over rows (0 for a
/// scalar) and the scale of a mean.
fn weights(g: &Tensor, dtype: DType, red: Reduction, valid: usize) -> Result<(Tensor, usize, f64)> {
    let g = contiguous(&cast(g, dtype)?)?;
    Ok(match red {
        Reduction::None => (g, 1, 1.0),
        Reduction::Sum => (g, 0, 1.0),
        Reduction::Mean => (g, 0, if valid == 0 { 0.0 } else { 1.0 / valid as f64 }),
    })
}

/// The first bad row of a call whose chunk `k` starts at `k * chunk`, from
/// the flag words, as the CPU's error.
fn bad_label(op: &'static str, labels: &Tensor, words: &[u64], chunk: usize, classes: usize) -> Result<()> {
    let bad = words.iter().enumerate().filter(|(_, &w)| w != 0).map(|(k, &w)| k * chunk + !w as usize).min();
    match bad {
        None => Ok(()),
        Some(row) => Err(Error::LabelOutOfRange { op, label: label_at(labels, row)?, row, classes }),
    }
}

/// The sparse loss's forward on CUDA, with the CPU's checks in the CPU's
/// order; saves the lse and the count of kept rows in the op.
pub(crate) fn sparse_forward(op: &SparseCrossEntropy, x: &Tensor) -> Result<Tensor> {
    let name = op.name();
    let (lead, v) = op.split(x.shape())?;
    check_options(name, &op.options)?;
    let ld = label_dtype(name, &op.labels)?;
    let cd = compute_dtype(name, x)?;
    let (lse, loss, valid) = sparse_rows(op, x, &lead, v, cd, ld)?;
    let out = combine(loss, valid, op.options.reduction, x.dtype())?;
    op.save_cuda(lse, valid);
    Ok(out)
}

/// The forward kernel over all rows of `x`: the lse and per-row losses
/// (shaped `lead`, in `cd`) and the count of kept rows, or the CPU's error
/// for a bad label.
fn sparse_rows(
    op: &SparseCrossEntropy,
    x: &Tensor,
    lead: &Shape,
    v: usize,
    cd: DType,
    ld: DType,
) -> Result<(Tensor, Tensor, usize)> {
    let x = contiguous(x)?;
    let labels = contiguous(&op.labels)?;
    let (dev, _) = device_of(op.name(), &x)?;
    let rows = lead.numel();
    let lse = scratch(&dev, cd, lead.clone())?;
    let loss = scratch(&dev, cd, lead.clone())?;
    let flag = flags(&dev, 1)?;
    if rows > 0 {
        let fp = ptr(&flag)?;
        launch_fwd(
            &dev,
            &fwd_kernel(x.dtype(), ld),
            (rows, v),
            (first_element(op.name(), &x)?, 0),
            first_element(op.name(), &labels)?,
            &op.options,
            (ptr(&lse)?, ptr(&loss)?),
            (fp, fp + 8),
        )?;
    }
    let words = read_flags(&dev, &flag, 1)?;
    bad_label(op.name(), &labels, &words[..1], 0, v)?;
    Ok((lse, loss, words[1] as usize))
}

/// The sparse loss's fused backward on CUDA: `g * (softmax - target)`
/// written over the logits' buffer when `logits` is the only handle on it.
pub(crate) fn sparse_grad(op: &SparseCrossEntropy, logits: Tensor, g: &Tensor) -> Result<Tensor> {
    let name = op.name();
    let (lead, v) = op.split(logits.shape())?;
    let ld = label_dtype(name, &op.labels)?;
    let cd = compute_dtype(name, &logits)?;
    let (lse, valid) = match op.saved_cuda() {
        Some(s) => s,
        None => {
            let (lse, _, valid) = sparse_rows(op, &logits, &lead, v, cd, ld)?;
            (lse, valid)
        }
    };
    let labels = contiguous(&op.labels)?;
    let grad = private(logits)?;
    let (g, stride, scale) = weights(g, grad.dtype(), op.options.reduction, valid)?;
    let (dev, xp) = device_of(name, &grad)?;
    launch_bwd(
        &dev,
        &bwd_kernel(grad.dtype(), ld),
        (lead.numel(), v),
        (xp, 0),
        first_element(name, &lse)?,
        first_element(name, &labels)?,
        &op.options,
        (first_element(name, &g)?, stride, scale),
    )?;
    Ok(grad)
}

/// The inputs of the fused head in the compute dtype, contiguous.
fn head_inputs(xs: &[&Tensor], cd: DType) -> Result<Vec<Tensor>> {
    xs.iter().map(|t| contiguous(&cast(t, cd)?)).collect()
}

/// Rows `r0..r0 + c` of `h @ w^T`, by cuBLAS, written over the first `c`
/// rows of the call's chunk buffer `buf` (`[chunk, v]`); the bias is left
/// to the kernels. Returns those rows of logits and of `h`.
fn chunk_logits(ins: &[Tensor], buf: &Tensor, r0: usize, c: usize) -> Result<(Tensor, Tensor)> {
    let hc = ins[0].narrow(0, r0, c)?;
    let logits = buf.narrow(0, 0, c)?;
    gemm_into(&hc, &ins[1].t()?, &logits, 0.0)?;
    Ok((logits, hc))
}

/// `[d_hidden, d_weight, d_bias?]`, zeros on the inputs' device.
fn zero_grads(ins: &[Tensor], cd: DType) -> Result<Vec<Tensor>> {
    let dev = ins[0].device();
    ins.iter().map(|t| Tensor::zeros_on(t.shape().clone(), cd, dev)).collect()
}

/// Pushes the logits' gradient `g` (`c x v`) of rows `r0..` (hidden rows
/// `hc`) into the gradients, with no buffer of its own: `g @ w` is written
/// into those rows of `d_hidden` (no other chunk writes them), `g^T @ hc`
/// is accumulated into `d_weight` (cuBLAS's `beta = 1`) and the column
/// sums of `g` into `d_bias`.
fn backprop_chunk(g: &Tensor, hc: &Tensor, ins: &[Tensor], r0: usize, grads: &[Tensor]) -> Result<()> {
    let c = g.dims()[0];
    gemm_into(g, &ins[1], &grads[0].narrow(0, r0, c)?, 0.0)?;
    gemm_into(&g.t()?, hc, &grads[1], 1.0)?;
    if let Some(db) = grads.get(2) {
        add_column_sums(db, g)?;
    }
    Ok(())
}

/// What the head's chunk loop needs of the op and its inputs.
struct HeadRun<'a> {
    op: &'a LinearCrossEntropy,
    ins: Vec<Tensor>,
    labels: Tensor,
    ld: DType,
    n: usize,
    v: usize,
    chunk: usize,
}

impl HeadRun<'_> {
    fn parts(&self) -> usize {
        self.n.div_ceil(self.chunk)
    }

    fn chunks(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        (0..self.parts()).map(|k| (k, k * self.chunk, self.chunk.min(self.n - k * self.chunk)))
    }

    /// The one chunk of logits a call writes every chunk's product into.
    fn chunk_buffer(&self, dev: &Arc<CudaDevice>, cd: DType) -> Result<Tensor> {
        scratch(dev, cd, Shape::from([self.chunk.min(self.n), self.v]))
    }

    /// The address of the bias, or 0 (none) for the kernels.
    fn bias(&self) -> Result<u64> {
        self.ins.get(2).map_or(Ok(0), ptr)
    }
}

/// The fused head's forward on CUDA: the loss (in the inputs' dtype) and,
/// saved in the op, the lse, the count of kept rows and, with
/// `precompute`, the gradients for a unit upstream gradient.
pub(crate) fn linear_forward(op: &LinearCrossEntropy, xs: &[&Tensor], precompute: bool) -> Result<Tensor> {
    let name = op.name();
    let (n, d, v) = op.check_shapes(xs)?;
    let ld = label_dtype(name, &op.labels)?;
    let cd = compute_dtype(name, xs[0])?;
    let run = HeadRun {
        op,
        ins: head_inputs(xs, cd)?,
        labels: contiguous(&op.labels)?,
        ld,
        n,
        v,
        chunk: op.chunk_rows(n, d, v),
    };
    let (loss, lse, valid, grads) = head_forward(&run, cd, precompute)?;
    let out = combine(loss, valid, op.options.reduction, xs[0].dtype())?;
    op.save_cuda(lse, valid, grads);
    Ok(out)
}

#[allow(clippy::type_complexity)]
fn head_forward(
    run: &HeadRun<'_>,
    cd: DType,
    precompute: bool,
) -> Result<(Tensor, Tensor, usize, Option<Vec<Tensor>>)> {
    let name = run.op.name();
    let (dev, _) = device_of(name, &run.ins[0])?;
    let shape = Shape::from([run.n]);
    let lse = scratch(&dev, cd, shape.clone())?;
    let loss = scratch(&dev, cd, shape)?;
    let parts = run.parts();
    let flag = flags(&dev, parts)?;
    let grads = if precompute { Some(zero_grads(&run.ins, cd)?) } else { None };
    let one = Tensor::full_on((), 1.0, cd, run.ins[0].device())?;
    let buf = run.chunk_buffer(&dev, cd)?;
    let (asz, lsz) = (cd.size_in_bytes() as u64, run.ld.size_in_bytes() as u64);
    let (lp, bp, fp) = (first_element(name, &run.labels)?, run.bias()?, ptr(&flag)?);
    let (lsep, lossp) = (ptr(&lse)?, ptr(&loss)?);
    for (k, r0, c) in run.chunks() {
        let (logits, hc) = chunk_logits(&run.ins, &buf, r0, c)?;
        let xp = ptr(&logits)?;
        let at = r0 as u64;
        launch_fwd(
            &dev,
            &fwd_kernel(cd, run.ld),
            (c, run.v),
            (xp, bp),
            lp + at * lsz,
            &run.op.options,
            (lsep + at * asz, lossp + at * asz),
            (fp + 8 * k as u64, fp + 8 * parts as u64),
        )?;
        if let Some(gr) = grads.as_ref() {
            let g = (ptr(&one)?, 0, 1.0);
            let x = (xp, bp);
            launch_bwd(
                &dev,
                &bwd_kernel(cd, run.ld),
                (c, run.v),
                x,
                lsep + at * asz,
                lp + at * lsz,
                &run.op.options,
                g,
            )?;
            backprop_chunk(&logits, &hc, &run.ins, r0, gr)?;
        }
    }
    drop(buf);
    let words = read_flags(&dev, &flag, parts)?;
    bad_label(name, &run.labels, &words[..parts], run.chunk, run.v)?;
    let valid = words[parts] as usize;
    if let Some(gr) = grads.as_ref() {
        // Made for a unit weight per row; a mean's is one over the kept rows.
        if run.op.options.reduction == Reduction::Mean {
            let s = if valid == 0 { 0.0 } else { 1.0 / valid as f64 };
            gr.iter().try_for_each(|t| scale_in_place(t, s))?;
        }
    }
    Ok((loss, lse, valid, grads))
}

/// The fused head's eager backward on CUDA: the forward's gradients scaled
/// by the upstream scalar, or each chunk's logits recomputed and turned
/// into the gradient in place, in the inputs' dtype.
pub(crate) fn linear_backward(op: &LinearCrossEntropy, xs: &[Tensor], g: &Tensor) -> Result<Vec<Tensor>> {
    let name = op.name();
    let dt = xs[0].dtype();
    if let Some(grads) = op.take_grads() {
        let s = g.item()?;
        return grads.into_iter().map(|t| scale_in_place(&t, s).and_then(|_| cast(&t, dt))).collect();
    }
    let refs: Vec<&Tensor> = xs.iter().collect();
    let (n, d, v) = op.check_shapes(&refs)?;
    let ld = label_dtype(name, &op.labels)?;
    let cd = compute_dtype(name, &xs[0])?;
    let run = HeadRun {
        op,
        ins: head_inputs(&refs, cd)?,
        labels: contiguous(&op.labels)?,
        ld,
        n,
        v,
        chunk: op.chunk_rows(n, d, v),
    };
    let (lse, valid) = match op.saved_lse() {
        Some(s) => s,
        None => {
            let (_, lse, valid, _) = head_forward(&run, cd, false)?;
            (lse, valid)
        }
    };
    let (g, stride, scale) = weights(g, cd, op.options.reduction, valid)?;
    let (dev, _) = device_of(name, &run.ins[0])?;
    let grads = zero_grads(&run.ins, cd)?;
    let buf = run.chunk_buffer(&dev, cd)?;
    let (asz, lsz) = (cd.size_in_bytes() as u64, ld.size_in_bytes() as u64);
    let (lp, lsep, gp) = (first_element(name, &run.labels)?, first_element(name, &lse)?, first_element(name, &g)?);
    let bp = run.bias()?;
    for (_, r0, c) in run.chunks() {
        let (logits, hc) = chunk_logits(&run.ins, &buf, r0, c)?;
        let at = r0 as u64;
        let w = (gp + (stride * r0) as u64 * asz, stride, scale);
        let xp = ptr(&logits)?;
        launch_bwd(&dev, &bwd_kernel(cd, ld), (c, v), (xp, bp), lsep + at * asz, lp + at * lsz, &op.options, w)?;
        backprop_chunk(&logits, &hc, &run.ins, r0, &grads)?;
    }
    drop(buf);
    grads.iter().map(|t| cast(t, dt)).collect()
}
