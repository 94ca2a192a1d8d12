//! The CUDA launches of causal attention for tapir-nn: the causal softmax
//! of `kernels/softmax.cu` (the mask is computed in the kernel, never a
//! tensor) and the fused attention of `kernels/attention.cu` (queries in
//! tiles, keys and values streamed through shared memory, an online
//! softmax, and a backward that recomputes the probabilities tile by tile
//! from the per-row log-sum-exp; for f16 and bf16 on compute capability
//! 8.0 and newer every product of both directions runs on the tensor
//! cores; no `[T, T]` tensor exists).
//!
//! tapir-nn's `CausalSoftmax` and `CausalAttention` hold the meaning, the
//! shape checks and the derivative rules; this module sees only tensors
//! already checked there, and re-checks what a kernel's memory safety
//! depends on (shapes, dtypes, one device) so a wrong call is an error.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::buffer::{tensor_of, CudaBuffer};
use super::context::{driver_error, CudaDevice};
use super::launch::{device_of, float_suffix};
use super::shape::contiguous;
use super::shape::first_element;
use crate::{DType, Error, Result, Shape, Tensor};

const SOFTMAX: &str = "softmax.cu";
const ATTENTION: &str = "attention.cu";

/// Threads a block of the attention kernels (`ATT_THREADS`).
const THREADS: u32 = 128;
/// Query rows a forward block takes (`FQ` of `kernels/attention.cu`).
const FQ: usize = 16;
/// Query rows a block of the tensor-core forward takes (`TQ`).
const TQ: usize = 64;
/// Query rows a block of the query-gradient kernel takes (`BQ`).
const BQ: usize = 8;
/// Keys a tile, and a block of the key/value-gradient kernel (`KT`).
const KT: usize = 32;
/// Keys a block of the tensor-core key/value-gradient kernel (`TK`); its
/// query-gradient kernel takes [`TQ`] rows a block, as the forward does.
const TK: usize = 64;
/// The widest head the fused kernels take (`32 * DR` with DR at most 4).
pub const MAX_HEAD_DIM: usize = 128;
/// Threads a block of the causal softmax: a row a block, or a row a warp
/// for rows of at most [`SHORT_ROW`] keys (`row_split` of
/// `kernels/common.cuh`); the kernel grid-strides over the rest.
const SOFTMAX_THREADS: u32 = 256;
const SHORT_ROW: usize = 64;
/// The most blocks a grid's second dimension (one a batch and head) takes.
const MAX_GRID_Y: usize = 65_535;

/// `DR` of the kernels for a head of width `d` (channels a lane holds).
fn lanes_per_row(d: usize) -> usize {
    match d {
        0..=32 => 1,
        33..=64 => 2,
        _ => 4,
    }
}

/// Every kernel this module launches, as `(file, entry)`.
pub(crate) fn kernels() -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let s = dt.cuda_suffix();
        out.push((SOFTMAX, format!("causal_softmax_{s}")));
        out.push((ATTENTION, format!("flash_prep_{s}")));
        let widths: &[usize] = if dt == DType::F64 { &[1, 2] } else { &[1, 2, 4] };
        for dr in widths {
            for k in ["fwd", "dq", "dkv"] {
                out.push((ATTENTION, format!("flash_{k}_{s}_{dr}")));
            }
            if matches!(dt, DType::F16 | DType::BF16) {
                for k in ["fwd", "dq", "dkv"] {
                    out.push((ATTENTION, format!("flash_{k}_tc_{s}_{dr}")));
                }
            }
        }
    }
    out
}

/// A kernel argument by value.
#[derive(Debug, Clone, Copy)]
enum Arg {
    I64(i64),
    F64(f64),
    Ptr(u64),
}

/// Launches `name` of `file` on a `grid` of blocks of `threads`.
fn launch(
    dev: &CudaDevice,
    file: &'static str,
    name: &str,
    grid: (u32, u32),
    threads: u32,
    args: &[Arg],
) -> Result<()> {
    let f = dev.function(file, name)?;
    let cfg = LaunchConfig { grid_dim: (grid.0, grid.1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
    let mut b = dev.stream.launch_builder(&f);
    for a in args {
        match a {
            Arg::I64(v) => b.arg(v),
            Arg::F64(v) => b.arg(v),
            Arg::Ptr(v) => b.arg(v),
        };
    }
    // SAFETY: each argument list is the one `kernels/attention.cu` or
    // `kernels/softmax.cu` documents for the entry, and every pointer is a
    // live block holding what the kernel reads or writes: the callers
    // below check the shapes the sizes are computed from.
    unsafe { b.launch(cfg) }.map_err(|e| driver_error(&format!("launching {name}"), e))?;
    Ok(())
}

/// Whether `dev` runs the tensor-core forward and backward for `dtype`: f16 and bf16 on
/// compute capability 8.0 and newer, which have `mma.sync` m16n8k16 (the
/// kernels are compiled for the device's own architecture).
fn tensor_cores(dev: &CudaDevice, dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
        && dev.arch.strip_prefix("compute_").and_then(|cc| cc.parse::<u32>().ok()).is_some_and(|cc| cc >= 80)
}

/// A grid dimension, or an error naming the op when it does not fit.
fn grid_dim(op: &'static str, n: usize) -> Result<u32> {
    u32::try_from(n.max(1)).map_err(|_| Error::invalid_arg(op, format!("{n} blocks exceed a CUDA grid")))
}

/// `softmax(scale * x)` along the last axis of CUDA scores `x`
/// `[..., tq, tk]` (`tq <= tk`), query `i` seeing keys `j <= i + tk - tq`
/// only and the others written as exact zeros: tapir-nn's
/// `CausalSoftmax`, with the mask computed in the kernel.
pub fn causal_softmax(x: &Tensor, scale: f64) -> Result<Tensor> {
    const OP: &str = "causal_softmax";
    let suffix = float_suffix(OP, x.dtype())?;
    let dims = x.dims();
    if dims.len() < 2 || dims[dims.len() - 2] > dims[dims.len() - 1] {
        return Err(Error::InvalidShape {
            op: OP,
            shape: Box::new(x.shape().clone()),
            reason: "needs [..., queries, keys] with queries <= keys".into(),
        });
    }
    let (tq, tk) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    let x = contiguous(x)?;
    let (dev, _) = device_of(OP, &x)?;
    let (out, _) = CudaBuffer::alloc(&dev, x.dtype(), x.numel())?;
    let rows = x.numel().checked_div(tk).unwrap_or(0);
    if rows > 0 {
        let per_block = if tk <= SHORT_ROW { SOFTMAX_THREADS as usize / 32 } else { 1 };
        let blocks = grid_dim(OP, rows.div_ceil(per_block).min(65_535))?;
        let threads = SOFTMAX_THREADS;
        let args = [
            Arg::I64(rows as i64),
            Arg::I64(tk as i64),
            Arg::I64(tq as i64),
            Arg::F64(scale),
            Arg::Ptr(first_element(OP, &x)?),
            Arg::Ptr(out.ptr()),
        ];
        launch(&dev, SOFTMAX, &format!("causal_softmax_{suffix}"), (blocks, 1), threads, &args)?;
    }
    Ok(tensor_of(out, x.shape().clone()))
}

/// Whether the fused kernels take heads of width `head_dim` in `dtype`:
/// f32, f16 and bf16 up to [`MAX_HEAD_DIM`], f64 up to 64 (its tiles in
/// shared memory are twice as large).
pub fn flash_supported(dtype: DType, head_dim: usize) -> bool {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => (1..=MAX_HEAD_DIM).contains(&head_dim),
        DType::F64 => (1..=64).contains(&head_dim),
        _ => false,
    }
}

/// Whether [`flash_forward`] and [`flash_backward`] take `q` `[B, T, C]`
/// split into `heads` heads: a supported dtype and head width
/// ([`flash_supported`]) and at most 65,535 (batch, head) pairs. Where
/// they do not, tapir-nn composes the attention from other ops.
pub fn flash_applies(q: &Tensor, heads: usize) -> bool {
    q.rank() == 3
        && heads > 0
        && q.dims()[2].is_multiple_of(heads)
        && flash_supported(q.dtype(), q.dims()[2] / heads)
        && q.dims()[0].saturating_mul(heads) <= MAX_GRID_Y
}

/// The checked geometry of one fused call: `(B, T, C, D)`.
struct Geometry {
    b: usize,
    t: usize,
    c: usize,
    d: usize,
    heads: usize,
}

impl Geometry {
    fn of(op: &'static str, q: &Tensor, others: &[&Tensor], heads: usize) -> Result<Geometry> {
        if q.rank() != 3 || others.iter().any(|x| x.shape() != q.shape()) {
            let other = others.iter().find(|x| x.shape() != q.shape()).map_or(q.shape(), |x| x.shape());
            return Err(Error::ShapeMismatch { op, lhs: Box::new(q.shape().clone()), rhs: Box::new(other.clone()) });
        }
        if let Some(x) = others.iter().find(|x| x.dtype() != q.dtype()) {
            return Err(Error::DTypeMismatch { op, lhs: q.dtype(), rhs: x.dtype() });
        }
        if let Some(x) = others.iter().find(|x| x.device() != q.device()) {
            return Err(Error::DeviceMismatch { op, lhs: q.device(), rhs: x.device() });
        }
        let (b, t, c) = (q.dims()[0], q.dims()[1], q.dims()[2]);
        if !flash_applies(q, heads) {
            return Err(Error::invalid_arg(
                op,
                format!("{c} channels in {heads} heads of {} in {}: no fused kernel", c / heads.max(1), q.dtype()),
            ));
        }
        Ok(Geometry { b, t, c, d: c / heads, heads })
    }

    fn dims(&self) -> [Arg; 4] {
        [Arg::I64(self.t as i64), Arg::I64(self.heads as i64), Arg::I64(self.c as i64), Arg::I64(self.d as i64)]
    }

    /// The per-row statistics' shape, `[B, H, T]`.
    fn rows(&self) -> Shape {
        Shape::from([self.b, self.heads, self.t])
    }

    fn kernel(&self, kind: &str, dtype: DType) -> String {
        format!("flash_{kind}_{}_{}", dtype.cuda_suffix(), lanes_per_row(self.d))
    }
}

/// Fused causal attention of CUDA `q`, `k`, `v` `[B, T, C]` with `heads`
/// heads (tapir-nn's `CausalAttention`): the output `[B, T, C]` and the
/// log-sum-exp of each row's scaled scores, `[B, H, T]` in the
/// accumulation dtype (f32, or f64 for f64 inputs). Beyond the inputs it
/// allocates exactly these two tensors (plus a contiguous copy of an input
/// that is a strided view).
pub fn flash_forward(q: &Tensor, k: &Tensor, v: &Tensor, heads: usize, scale: f64) -> Result<(Tensor, Tensor)> {
    const OP: &str = "causal_attention";
    let geo = Geometry::of(OP, q, &[k, v], heads)?;
    let (q, k, v) = (contiguous(q)?, contiguous(k)?, contiguous(v)?);
    let (dev, _) = device_of(OP, &q)?;
    let (y, _) = CudaBuffer::alloc(&dev, q.dtype(), q.numel())?;
    let lse = lse_of(&geo, &q, &k, &v, Some(y.ptr()), scale)?;
    Ok((tensor_of(y, q.shape().clone()), lse))
}

/// Runs the forward kernel into `y` (or only the log-sum-exp when `y` is
/// `None`) and returns the log-sum-exp; the inputs are contiguous.
fn lse_of(geo: &Geometry, q: &Tensor, k: &Tensor, v: &Tensor, y: Option<u64>, scale: f64) -> Result<Tensor> {
    const OP: &str = "causal_attention";
    let (dev, _) = device_of(OP, q)?;
    let acc = q.dtype().compute();
    let rows = geo.rows();
    let (lse, _) = CudaBuffer::alloc(&dev, acc, rows.numel())?;
    if rows.numel() > 0 {
        let mut args = Vec::from(geo.dims());
        args.extend([
            Arg::F64(scale),
            Arg::Ptr(first_element(OP, q)?),
            Arg::Ptr(first_element(OP, k)?),
            Arg::Ptr(first_element(OP, v)?),
            Arg::Ptr(y.unwrap_or(0)),
            Arg::Ptr(lse.ptr()),
        ]);
        let (kind, rows_block) = if tensor_cores(&dev, q.dtype()) { ("fwd_tc", TQ) } else { ("fwd", FQ) };
        let grid = (grid_dim(OP, geo.t.div_ceil(rows_block))?, grid_dim(OP, geo.b * geo.heads)?);
        launch(&dev, ATTENTION, &geo.kernel(kind, q.dtype()), grid, THREADS, &args)?;
    }
    Ok(tensor_of(lse, rows))
}

/// The gradients of `q`, `k` and `v` of [`flash_forward`] from its output
/// `y`, the upstream gradient `g` (all `[B, T, C]`, one dtype, one CUDA
/// device) and, when the caller kept it, the forward's log-sum-exp (else
/// it is recomputed by the forward kernel without writing an output). The
/// probabilities are recomputed tile by tile; beyond the three gradients
/// the scratch is two `[B, H, T]` rows of statistics.
#[allow(clippy::too_many_arguments)]
pub fn flash_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    y: &Tensor,
    g: &Tensor,
    lse: Option<&Tensor>,
    heads: usize,
    scale: f64,
) -> Result<[Tensor; 3]> {
    const OP: &str = "causal_attention";
    let geo = Geometry::of(OP, q, &[k, v, y, g], heads)?;
    let acc = q.dtype().compute();
    if let Some(l) = lse {
        if l.shape() != &geo.rows() || l.dtype() != acc || l.device() != q.device() {
            return Err(Error::invalid_arg(
                OP,
                format!(
                    "a saved log-sum-exp must be {} {acc} on {}; got {} {}",
                    geo.rows(),
                    q.device(),
                    l.shape(),
                    l.dtype()
                ),
            ));
        }
    }
    let [q, k, v, y, g] = [q, k, v, y, g].map(contiguous);
    let (q, k, v, y, g) = (q?, k?, v?, y?, g?);
    let (dev, _) = device_of(OP, &q)?;
    let lse = match lse {
        Some(l) => contiguous(l)?,
        None => lse_of(&geo, &q, &k, &v, None, scale)?,
    };
    let rows = geo.rows();
    let (dsum, _) = CudaBuffer::alloc(&dev, acc, rows.numel())?;
    let dsum = tensor_of(dsum, rows.clone());
    let alloc = || CudaBuffer::alloc(&dev, q.dtype(), q.numel()).map(|(b, _)| b);
    let (dq, dk, dv) = (alloc()?, alloc()?, alloc()?);
    if rows.numel() > 0 {
        let warps = (THREADS / 32) as usize;
        let prep_blocks = grid_dim(OP, rows.numel().div_ceil(warps).min(65_535))?;
        let mut args = vec![Arg::I64(rows.numel() as i64)];
        args.extend(geo.dims());
        args.extend([
            Arg::Ptr(first_element(OP, &g)?),
            Arg::Ptr(first_element(OP, &y)?),
            Arg::Ptr(first_element(OP, &dsum)?),
        ]);
        launch(&dev, ATTENTION, &format!("flash_prep_{}", q.dtype().cuda_suffix()), (prep_blocks, 1), THREADS, &args)?;

        let mut common = Vec::from(geo.dims());
        common.extend([
            Arg::F64(scale),
            Arg::Ptr(first_element(OP, &q)?),
            Arg::Ptr(first_element(OP, &k)?),
            Arg::Ptr(first_element(OP, &v)?),
            Arg::Ptr(first_element(OP, &g)?),
            Arg::Ptr(first_element(OP, &lse)?),
            Arg::Ptr(first_element(OP, &dsum)?),
        ]);
        let bh = grid_dim(OP, geo.b * geo.heads)?;
        // The tensor-core kernels take the same arguments in larger blocks.
        let ((dq_kind, dq_rows), (dkv_kind, dkv_keys)) =
            if tensor_cores(&dev, q.dtype()) { (("dq_tc", TQ), ("dkv_tc", TK)) } else { (("dq", BQ), ("dkv", KT)) };
        let (mut dq_args, mut dkv_args) = (common.clone(), common);
        dq_args.push(Arg::Ptr(dq.ptr()));
        launch(
            &dev,
            ATTENTION,
            &geo.kernel(dq_kind, q.dtype()),
            (grid_dim(OP, geo.t.div_ceil(dq_rows))?, bh),
            THREADS,
            &dq_args,
        )?;
        dkv_args.extend([Arg::Ptr(dk.ptr()), Arg::Ptr(dv.ptr())]);
        launch(
            &dev,
            ATTENTION,
            &geo.kernel(dkv_kind, q.dtype()),
            (grid_dim(OP, geo.t.div_ceil(dkv_keys))?, bh),
            THREADS,
            &dkv_args,
        )?;
    }
    let shape = q.shape().clone();
    Ok([tensor_of(dq, shape.clone()), tensor_of(dk, shape.clone()), tensor_of(dv, shape)])
}
