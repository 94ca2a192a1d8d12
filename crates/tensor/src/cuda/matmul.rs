//! Matrix products on CUDA through cuBLAS.
//!
//! tapir's matrices are row-major and cuBLAS's column-major, so the row-major
//! `C = A B` is issued as the column-major `C^T = B^T A^T`: a row-major
//! `[r, c]` operand whose rows are contiguous is, as it lies, the
//! column-major `c x r` matrix (`op N`, the row stride its leading
//! dimension); one whose columns are contiguous (a transposed view) is the
//! column-major `r x c` matrix that `op T` turns round, so a transpose is
//! never copied. Any other view is made contiguous first.
//!
//! Batch dims run as strided-batched calls: every output batch dim that
//! each operand steps through with one stride (a broadcast operand's stride
//! is 0) is folded into one call, and the leading dims that cannot be are
//! looped over, one call each. f32 and f64 use `Sgemm`/`Dgemm`; f16 and
//! bf16 use `GemmEx` with `CUBLAS_COMPUTE_32F` (f32 accumulation, the
//! result rounded once to the dtype, as the CPU does). TF32 stays off (see
//! `CudaDevice::blas`).

use std::ffi::c_void;
use std::panic::AssertUnwindSafe;

use cudarc::cublas::result::{self, CublasError};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t};
use smallvec::SmallVec;

use super::buffer::{buffer_of_storage, storage_of, CudaBuffer};
use super::context::driver_error;
use super::launch::device_of_src;
use super::shape::{copy, first_element_src};
use super::CudaBackend;
use crate::backend::matmul::{Epilogue, MatmulPlan};
use crate::backend::{MatmulKernels, Src};
use crate::storage::Storage;
use crate::{DType, Error, Layout, Result, Shape};

impl MatmulKernels for CudaBackend {
    fn matmul(&self, plan: &MatmulPlan, a: Src<'_>, b: Src<'_>) -> Result<Storage> {
        forward(plan, a, b)
    }

    /// None: the composed sum runs as cuBLAS products and elementwise kernels.
    fn linear_sum(
        &self,
        _: &[(Src<'_>, Src<'_>)],
        _: Option<Src<'_>>,
        _: Epilogue<'_>,
        _: (usize, usize),
    ) -> Result<Option<Storage>> {
        Ok(None)
    }
}

/// One operand as cuBLAS reads it: its first element, whether it is
/// transposed, its leading dimension, and its strides over the output's
/// batch dims (0 where it broadcasts).
struct Operand {
    /// Kept alive while the calls read it: a contiguous copy of a view
    /// cuBLAS cannot read as it lies.
    _dense: Option<Storage>,
    ptr: u64,
    trans: bool,
    ld: usize,
    batch_strides: SmallVec<[usize; 6]>,
}

/// The column-major form of the row-major `[r, c]` matrix with strides
/// `(sr, sc)`, as cuBLAS must read its transpose (`c x r`): `op N` with the
/// row stride as leading dimension, `op T` with the column stride, or
/// `None` when neither describes the view.
fn column_major(r: usize, c: usize, sr: usize, sc: usize) -> Option<(bool, usize)> {
    // A dimension of size 1 is never stepped along, so its stride is free.
    if sc == 1 || c <= 1 {
        let ld = if r <= 1 { c.max(1) } else { sr };
        if ld >= c.max(1) {
            return Some((false, ld));
        }
    }
    if sr == 1 || r <= 1 {
        let ld = if c <= 1 { r.max(1) } else { sc };
        if ld >= r.max(1) {
            return Some((true, ld));
        }
    }
    None
}

fn operand(t: Src<'_>, batch: &Shape) -> Result<Operand> {
    let (dims, strides) = (t.shape().dims(), &t.layout.strides);
    let r = dims.len();
    let (rows, cols) = (dims[r - 2], dims[r - 1]);
    let fits = |v: usize| i32::try_from(v).is_ok();
    let form = column_major(rows, cols, strides[r - 2], strides[r - 1]).filter(|&(_, ld)| fits(ld));
    let (dense, layout, (trans, ld)) = match form {
        Some(f) => (None, t.layout.clone(), f),
        None => {
            let c = copy("contiguous", t)?;
            let f = column_major(rows, cols, cols, 1).expect("internal: a contiguous matrix has a cuBLAS form");
            (Some(c), Layout::contiguous(t.shape().clone()), f)
        }
    };
    let own = Layout {
        shape: Shape::from(&dims[..r - 2]),
        strides: SmallVec::from_slice(&layout.strides[..r - 2]),
        offset: 0,
    };
    let ptr = first_element_src("matmul", Src { storage: dense.as_ref().unwrap_or(t.storage), layout: &layout })?;
    Ok(Operand { ptr, trans, ld, batch_strides: own.broadcast_strides(batch), _dense: dense })
}

/// The first batch dim from which on every operand steps through the
/// (size-1-free) batch with one stride each: dims before it are looped
/// over, dims from it on are one strided-batched call.
fn fold_point(dims: &[usize], strides: &[&[usize]]) -> usize {
    let mut p = dims.len();
    // Walk left while each operand's stride at p-1 is its inner stride
    // times the size of the dims already folded.
    let mut inner: SmallVec<[Option<usize>; 3]> = SmallVec::from_elem(None, strides.len());
    let mut span = 1usize;
    while p > 0 {
        let i = p - 1;
        let ok = strides.iter().zip(&inner).all(|(s, base)| match base {
            None => true,
            Some(b) => Some(s[i]) == b.checked_mul(span),
        });
        if !ok {
            break;
        }
        for (s, base) in strides.iter().zip(inner.iter_mut()) {
            if base.is_none() {
                *base = Some(s[i]);
            }
        }
        span = span.saturating_mul(dims[i]);
        p = i;
    }
    p
}

/// `a @ b` on CUDA, as the op planned it.
fn forward(p: &MatmulPlan, a: Src<'_>, b: Src<'_>) -> Result<Storage> {
    let dtype = a.dtype();
    let (dev, _) = device_of_src("matmul", a)?;
    let total = p.shape.numel();
    let (out, _) = CudaBuffer::alloc(&dev, dtype, total)?;
    if total == 0 {
        return Ok(storage_of(out));
    }
    dev.bind()?;
    if p.k == 0 {
        // An empty sum: zeros, without asking cuBLAS about k = 0.
        // SAFETY: the block holds `total` elements of the dtype.
        unsafe {
            cudarc::driver::result::memset_d8_async(out.ptr(), 0, total * dtype.size_in_bytes(), dev.stream.cu_stream())
        }
        .map_err(|e| driver_error("matmul: zeroing an empty product", e))?;
        return Ok(storage_of(out));
    }
    let too_big = |what: &str, v: usize| Error::InvalidArgument {
        op: "matmul",
        reason: format!("{what} {v} exceeds what one cuBLAS call takes (2^31 - 1)"),
    };
    for (what, v) in [("m", p.m), ("k", p.k), ("n", p.n)] {
        if i32::try_from(v).is_err() {
            return Err(too_big(what, v));
        }
    }
    let blas = dev.blas()?;
    let (xa, xb) = (operand(a, &p.batch)?, operand(b, &p.batch)?);
    // The output is contiguous: each product is m x n, one after another.
    let out_strides = p.batch.contiguous_strides().iter().map(|s| s * p.m * p.n).collect::<SmallVec<[usize; 6]>>();
    // Size-1 batch dims are never stepped along; leave them out.
    let keep: Vec<usize> = (0..p.batch.rank()).filter(|&i| p.batch.dims()[i] != 1).collect();
    let dims: Vec<usize> = keep.iter().map(|&i| p.batch.dims()[i]).collect();
    let pick = |s: &[usize]| keep.iter().map(|&i| s[i]).collect::<Vec<usize>>();
    let (sa, sb, sc) = (pick(&xa.batch_strides), pick(&xb.batch_strides), pick(&out_strides));
    let fold = fold_point(&dims, &[&sa, &sb, &sc]);
    let inner: usize = dims[fold..].iter().product();
    let stride_of = |s: &[usize]| if fold < s.len() { s[fold..].last().copied().unwrap_or(0) } else { 0 };
    // The stride of the innermost folded dim is the one of the whole fold.
    let (ia, ib, ic) = (stride_of(&sa), stride_of(&sb), stride_of(&sc));
    if i32::try_from(inner).is_err() {
        return Err(too_big("batch", inner));
    }
    let outer: usize = dims[..fold].iter().product();
    let size = dtype.size_in_bytes() as u64;
    let mut idx = vec![0usize; fold];
    for _ in 0..outer {
        let off = |s: &[usize]| idx.iter().zip(s).map(|(i, s)| i * s).sum::<usize>() as u64 * size;
        // Column-major C^T (n x m) = op(B) (n x k) op(A) (k x m).
        let call = Gemm {
            dtype,
            m: p.n,
            n: p.m,
            k: p.k,
            a: (xb.ptr + off(&sb), xb.trans, xb.ld, ib),
            b: (xa.ptr + off(&sa), xa.trans, xa.ld, ia),
            c: (out.ptr() + off(&sc), p.n, ic),
            batch: inner,
            beta: 0.0,
        };
        // cudarc panics when cuBLAS lacks an entry point it looks up.
        let h = *blas.handle();
        let status = std::panic::catch_unwind(AssertUnwindSafe(|| call.run(h)))
            .map_err(|_| Error::Cuda("cuBLAS: the library lacks a gemm entry point cudarc needs".into()))?;
        status.map_err(|e| Error::Cuda(format!("cuBLAS gemm ({dtype}, {} x {} x {}): {e}", p.m, p.k, p.n)))?;
        // The next outer index, row-major.
        for d in (0..fold).rev() {
            idx[d] += 1;
            if idx[d] < dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(storage_of(out))
}

/// `out = a @ b + beta * out` for the matrices `a` (`[m, k]`) and `b`
/// (`[k, n]`) into `out`, a contiguous `[m, n]` view of a buffer the
/// caller holds the only handle on, in one cuBLAS call. With `beta = 1`
/// the product is accumulated where it will stay, so a caller summing
/// products (the fused cross-entropy head's gradients, chunk by chunk)
/// needs no buffer of the product's size; with `beta = 0` `out` is not
/// read, as cuBLAS does not read `C` then.
pub(crate) fn gemm_into(a: Src<'_>, b: Src<'_>, out: Src<'_>, beta: f64) -> Result<()> {
    let op = "matmul";
    let dtype = out.dtype();
    let (m, n) = match out.shape().dims() {
        &[m, n] => (m, n),
        _ => return Err(Error::invalid_arg(op, "gemm_into writes a matrix")),
    };
    let (ad, bd) = (a.shape().dims(), b.shape().dims());
    if ad.len() != 2 || bd.len() != 2 || ad[0] != m || bd[1] != n || ad[1] != bd[0] {
        return Err(Error::ShapeMismatch { op, lhs: Box::new(a.shape().clone()), rhs: Box::new(b.shape().clone()) });
    }
    for t in [a, b] {
        if t.dtype() != dtype {
            return Err(Error::DTypeMismatch { op, lhs: t.dtype(), rhs: dtype });
        }
    }
    if !dtype.is_float() {
        return Err(Error::UnsupportedDType { op, dtype, expected: "a float dtype" });
    }
    if !out.is_contiguous() {
        return Err(Error::invalid_arg(op, "gemm_into writes a contiguous output"));
    }
    let k = ad[1];
    for (what, v) in [("m", m), ("k", k), ("n", n)] {
        if i32::try_from(v).is_err() {
            return Err(Error::invalid_arg(op, format!("{what} {v} exceeds what one cuBLAS call takes (2^31 - 1)")));
        }
    }
    let buf = buffer_of_storage(out.storage).ok_or(Error::Unsupported { op, device: out.device() })?;
    let dev = buf.dev.clone();
    let ptr = buf.ptr() + (out.layout.offset * dtype.size_in_bytes()) as u64;
    if m == 0 || n == 0 {
        return Ok(());
    }
    dev.bind()?;
    if k == 0 {
        // An empty sum adds nothing; with beta = 0 the output is zeros.
        if beta == 0.0 {
            // SAFETY: the view holds `m * n` contiguous elements of the dtype.
            unsafe {
                cudarc::driver::result::memset_d8_async(ptr, 0, m * n * dtype.size_in_bytes(), dev.stream.cu_stream())
            }
            .map_err(|e| driver_error("matmul: zeroing an empty product", e))?;
        } else if beta != 1.0 {
            return Err(Error::invalid_arg(op, "gemm_into scales an empty product's output only by 0 or 1"));
        }
        return Ok(());
    }
    let none = Shape::from(Vec::new());
    let (xa, xb) = (operand(a, &none)?, operand(b, &none)?);
    let blas = dev.blas()?;
    // Column-major C^T (n x m) = op(B) (n x k) op(A) (k x m), as in `forward`.
    let call = Gemm {
        dtype,
        m: n,
        n: m,
        k,
        a: (xb.ptr, xb.trans, xb.ld, 0),
        b: (xa.ptr, xa.trans, xa.ld, 0),
        c: (ptr, n, 0),
        batch: 1,
        beta,
    };
    let h = *blas.handle();
    let status = std::panic::catch_unwind(AssertUnwindSafe(|| call.run(h)))
        .map_err(|_| Error::Cuda("cuBLAS: the library lacks a gemm entry point cudarc needs".into()))?;
    status.map_err(|e| Error::Cuda(format!("cuBLAS gemm ({dtype}, {m} x {k} x {n}, beta {beta}): {e}")))
}

/// One strided-batched call, column-major: `(pointer, transposed, ld,
/// batch stride)` for `a` and `b`, `(pointer, ld, batch stride)` for `c`,
/// and the weight of `c`'s old value (0: not read).
struct Gemm {
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    a: (u64, bool, usize, usize),
    b: (u64, bool, usize, usize),
    c: (u64, usize, usize),
    batch: usize,
    beta: f64,
}

impl Gemm {
    fn run(&self, h: cudarc::cublas::sys::cublasHandle_t) -> std::result::Result<(), CublasError> {
        let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
        let (m, n, k, batch) = (self.m as i32, self.n as i32, self.k as i32, self.batch as i32);
        let (pa, ta, lda, sa) = self.a;
        let (pb, tb, ldb, sb) = self.b;
        let (pc, ldc, sc) = self.c;
        let (lda, ldb, ldc) = (lda as i32, ldb as i32, ldc as i32);
        let (sa, sb, sc) = (sa as i64, sb as i64, sc as i64);
        // SAFETY: the pointers are live device blocks of this context
        // (the operands' buffers, held by the caller, and the output, a
        // fresh block or the caller's), each spanning the matrices these
        // sizes, leading dimensions and strides describe; the scalars are
        // host values of the compute type, which is the default pointer
        // mode.
        unsafe {
            match self.dtype {
                DType::F32 => {
                    let (one, beta) = (1f32, self.beta as f32);
                    result::sgemm_strided_batched(
                        h,
                        op(ta),
                        op(tb),
                        m,
                        n,
                        k,
                        &one,
                        pa as *const f32,
                        lda,
                        sa,
                        pb as *const f32,
                        ldb,
                        sb,
                        &beta,
                        pc as *mut f32,
                        ldc,
                        sc,
                        batch,
                    )
                }
                DType::F64 => {
                    let (one, beta) = (1f64, self.beta);
                    result::dgemm_strided_batched(
                        h,
                        op(ta),
                        op(tb),
                        m,
                        n,
                        k,
                        &one,
                        pa as *const f64,
                        lda,
                        sa,
                        pb as *const f64,
                        ldb,
                        sb,
                        &beta,
                        pc as *mut f64,
                        ldc,
                        sc,
                        batch,
                    )
                }
                _ => {
                    let t =
                        if self.dtype == DType::F16 { cudaDataType_t::CUDA_R_16F } else { cudaDataType_t::CUDA_R_16BF };
                    // With CUBLAS_COMPUTE_32F the scalars are f32.
                    let (one, beta) = (1f32, self.beta as f32);
                    result::gemm_strided_batched_ex(
                        h,
                        op(ta),
                        op(tb),
                        m,
                        n,
                        k,
                        (&one as *const f32).cast::<c_void>(),
                        pa as *const c_void,
                        t,
                        lda,
                        sa,
                        pb as *const c_void,
                        t,
                        ldb,
                        sb,
                        (&beta as *const f32).cast::<c_void>(),
                        pc as *mut c_void,
                        t,
                        ldc,
                        sc,
                        batch,
                        cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_map_to_cublas_forms_or_a_copy() {
        // Row-major contiguous [3, 4]: op N, ld 4.
        assert_eq!(column_major(3, 4, 4, 1), Some((false, 4)));
        // A narrowed row-major view keeps its row stride.
        assert_eq!(column_major(3, 2, 4, 1), Some((false, 4)));
        // The transpose of a contiguous [4, 3] is [3, 4] with strides (1, 3): op T, ld 3.
        assert_eq!(column_major(3, 4, 1, 3), Some((true, 3)));
        // Strides that step neither way, or an expanded column, need a copy.
        assert_eq!(column_major(3, 4, 8, 2), None);
        assert_eq!(column_major(3, 1, 0, 0), None);
        // A single row or column takes any stride of the unit dim.
        assert_eq!(column_major(1, 5, 0, 1), Some((false, 5)));
        assert_eq!(column_major(5, 1, 7, 9), Some((false, 7)));
    }

    #[test]
    fn batch_dims_fold_where_one_stride_steps_them() {
        // Contiguous [2, 3] batches: one call.
        assert_eq!(fold_point(&[2, 3], &[&[3, 1], &[3, 1]]), 0);
        // [b, 1] x [c]: a steps b only, b steps c only; loop over b.
        assert_eq!(fold_point(&[2, 3], &[&[12, 0], &[0, 20], &[3, 1]]), 1);
        // A broadcast operand (stride 0 throughout) folds with anything.
        assert_eq!(fold_point(&[4, 5], &[&[0, 0], &[5, 1]]), 0);
        assert_eq!(fold_point(&[], &[&[], &[]]), 0);
    }
}
