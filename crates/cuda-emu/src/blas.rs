//! Matrix products for the cuBLAS stand-in, computed on the CPU with f32
//! (or f64) accumulation, column-major as cuBLAS is.
//!
//! The stand-in library (`tapir-cuda-emu-cublas`) validates nothing
//! itself: it fills a [`GemmDesc`] and calls [`tapirEmuGemm`], which checks
//! the arguments as cuBLAS does and every matrix against the live device
//! allocations.

#![allow(non_snake_case)]

use std::ffi::{c_int, c_void};

use half::{bf16, f16};

use crate::driver::emu;

/// cublasStatus_t values.
pub const STATUS_SUCCESS: c_int = 0;
pub const STATUS_INVALID_VALUE: c_int = 7;
pub const STATUS_EXECUTION_FAILED: c_int = 13;
pub const STATUS_NOT_SUPPORTED: c_int = 15;

/// cudaDataType values.
const R_32F: c_int = 0;
const R_64F: c_int = 1;
const R_16F: c_int = 2;
const R_16BF: c_int = 14;

/// One (strided-batched) product `C = alpha op(A) op(B) + beta C`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GemmDesc {
    /// `size_of::<GemmDesc>()` as the caller built it: the two libraries
    /// are separate builds, and a descriptor of another layout must be
    /// refused, not misread.
    pub size: u32,
    pub transa: c_int,
    pub transb: c_int,
    pub m: c_int,
    pub n: c_int,
    pub k: c_int,
    /// Host pointers to the scalars, of the compute type.
    pub alpha: *const c_void,
    pub beta: *const c_void,
    pub a: u64,
    pub a_type: c_int,
    pub lda: c_int,
    pub stride_a: i64,
    pub b: u64,
    pub b_type: c_int,
    pub ldb: c_int,
    pub stride_b: i64,
    pub c: u64,
    pub c_type: c_int,
    pub ldc: c_int,
    pub stride_c: i64,
    pub batch: c_int,
    /// cublasComputeType_t, or a cudaDataType for the legacy forms.
    pub compute: c_int,
    /// Nonzero: f32 inputs are rounded to TF32 (1 sign, 8 exponent and 10
    /// mantissa bits, to nearest with ties away from zero, as
    /// `cvt.rna.tf32.f32`) before the product, which accumulates in f32.
    pub tf32: c_int,
    /// Nonzero: `alpha` and `beta` are device addresses
    /// (CUBLAS_POINTER_MODE_DEVICE), not host pointers.
    pub device_scalars: c_int,
}

/// `x` rounded to TF32: the low 13 mantissa bits go, to nearest with ties
/// away from zero; infinities and NaN pass through.
fn to_tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    f32::from_bits((x.to_bits() + 0x1000) & !0x1fff)
}

fn elem_size(t: c_int) -> Option<usize> {
    match t {
        R_32F => Some(4),
        R_64F => Some(8),
        R_16F | R_16BF => Some(2),
        _ => None,
    }
}

/// Reads element `i` of a matrix of type `t` as f64.
///
/// # Safety
/// `p` must point at more than `i` elements of type `t`.
unsafe fn read(p: *const u8, t: c_int, i: usize) -> f64 {
    // SAFETY: the caller checked the range.
    unsafe {
        match t {
            R_32F => f64::from(p.cast::<f32>().add(i).read_unaligned()),
            R_64F => p.cast::<f64>().add(i).read_unaligned(),
            R_16F => f64::from(f16::from_bits(p.cast::<u16>().add(i).read_unaligned()).to_f32()),
            _ => f64::from(bf16::from_bits(p.cast::<u16>().add(i).read_unaligned()).to_f32()),
        }
    }
}

/// # Safety
/// As for [`read`].
unsafe fn store(p: *mut u8, t: c_int, i: usize, v: f64) {
    // SAFETY: the caller checked the range.
    unsafe {
        match t {
            R_32F => p.cast::<f32>().add(i).write_unaligned(v as f32),
            R_64F => p.cast::<f64>().add(i).write_unaligned(v),
            R_16F => p.cast::<u16>().add(i).write_unaligned(f16::from_f64(v).to_bits()),
            _ => p.cast::<u16>().add(i).write_unaligned(bf16::from_f64(v).to_bits()),
        }
    }
}

/// Records and prints the message, as a failed launch does.
fn fail(msg: String) -> c_int {
    crate::driver::record_failure(format!("cuBLAS: {msg}"));
    STATUS_EXECUTION_FAILED
}

/// Runs one product; returns a cublasStatus_t.
///
/// # Safety
/// `d` must point at a valid descriptor whose scalar pointers are valid.
#[no_mangle]
pub unsafe extern "C" fn tapirEmuGemm(d: *const GemmDesc) -> c_int {
    if d.is_null() {
        return STATUS_INVALID_VALUE;
    }
    // SAFETY: every layout the stand-in has had starts with a 4-byte field;
    // the rest is read only once the size says the layouts agree.
    let size = unsafe { d.cast::<u32>().read() };
    if size as usize != std::mem::size_of::<GemmDesc>() {
        return fail(format!(
            "the cuBLAS stand-in passed a {size}-byte product descriptor where this driver emulator takes {} \
             bytes: the two libraries come from different builds (rebuild both: cargo build -p tapir-cuda-emu \
             -p tapir-cuda-emu-cublas)",
            std::mem::size_of::<GemmDesc>()
        ));
    }
    // SAFETY: the caller's descriptor, of this layout.
    let d = unsafe { *d };
    let op = |t: c_int| match t {
        0 => Some(false),
        1 | 2 => Some(true),
        _ => None,
    };
    let (Some(ta), Some(tb)) = (op(d.transa), op(d.transb)) else { return STATUS_INVALID_VALUE };
    if d.m < 0 || d.n < 0 || d.k < 0 || d.batch < 0 {
        return STATUS_INVALID_VALUE;
    }
    let (m, n, k) = (d.m as usize, d.n as usize, d.k as usize);
    // Rows of A and B as stored: op(A) is m x k, op(B) is k x n.
    let (a_rows, a_cols) = if ta { (k, m) } else { (m, k) };
    let (b_rows, b_cols) = if tb { (n, k) } else { (k, n) };
    if (d.lda as i64) < a_rows.max(1) as i64
        || (d.ldb as i64) < b_rows.max(1) as i64
        || (d.ldc as i64) < m.max(1) as i64
    {
        return STATUS_INVALID_VALUE;
    }
    // The type combinations GemmEx supports here: f32 and f64 throughout,
    // and f16/bf16 inputs with f32 compute, written as f16, bf16 or f32.
    let f64_mode = match (d.a_type, d.b_type, d.c_type, d.compute) {
        (R_32F, R_32F, R_32F, 0 | 68 | 69 | 74 | 75 | 77) => false,
        (R_64F, R_64F, R_64F, 1 | 70 | 71) => true,
        (R_16F, R_16F, R_16F | R_32F, 0 | 68 | 69) => false,
        (R_16BF, R_16BF, R_16BF | R_32F, 0 | 68 | 69) => false,
        _ => return STATUS_NOT_SUPPORTED,
    };
    let scalar_type = if f64_mode { R_64F } else { R_32F };
    let scalars = (
        scalar(d.alpha as u64, scalar_type, d.device_scalars != 0, "gemm alpha"),
        scalar(d.beta as u64, scalar_type, d.device_scalars != 0, "gemm beta"),
    );
    let (alpha, beta) = match scalars {
        (Ok(a), Ok(b)) => (a, b),
        (Err(s), _) | (_, Err(s)) => return s,
    };
    if m == 0 || n == 0 || d.batch == 0 {
        return STATUS_SUCCESS;
    }
    let batch = d.batch as usize;
    let span = |rows: usize, cols: usize, ld: c_int, stride: i64| -> Option<u64> {
        if rows == 0 || cols == 0 {
            return Some(0);
        }
        let one = (cols as u64 - 1).checked_mul(ld as u64)?.checked_add(rows as u64)?;
        let stride = u64::try_from(stride).ok()?;
        (batch as u64 - 1).checked_mul(stride)?.checked_add(one)
    };
    let mem = emu();
    let mut ptrs = [std::ptr::null_mut::<u8>(); 3];
    for (slot, (name, addr, t, rows, cols, ld, stride)) in [
        ("A", d.a, d.a_type, a_rows, a_cols, d.lda, d.stride_a),
        ("B", d.b, d.b_type, b_rows, b_cols, d.ldb, d.stride_b),
        ("C", d.c, d.c_type, m, n, d.ldc, d.stride_c),
    ]
    .into_iter()
    .enumerate()
    {
        if slot < 2 && k == 0 {
            continue;
        }
        let Some(elems) = span(rows, cols, ld, if batch > 1 { stride } else { 0 }) else {
            return STATUS_INVALID_VALUE;
        };
        let bytes = elems * elem_size(t).expect("internal: type checked") as u64;
        match mem.host_ptr(addr, bytes) {
            Some(p) => ptrs[slot] = p,
            None => {
                return fail(format!(
                "gemm: matrix {name} ({rows} x {cols}, ld {ld}, {batch} batch(es)) needs {bytes} bytes at {addr:#x}, \
                     which are not inside one live device allocation"
            ))
            }
        }
    }
    // TF32 changes f32 products only; f16/bf16 inputs have fewer bits already.
    let tf32 = d.tf32 != 0 && d.a_type == R_32F && d.b_type == R_32F;
    if crate::exec::profiling() {
        profile_gemm(&d, tf32, beta != 0.0);
    }
    let input = |v: f64| if tf32 { f64::from(to_tf32(v as f32)) } else { v };
    let mut col = vec![0f64; k];
    let mut arow = vec![0f64; k * m];
    for bi in 0..batch {
        let (oa, ob, oc) = (bi * d.stride_a as usize, bi * d.stride_b as usize, bi * d.stride_c as usize);
        // op(A) row i, gathered once per batch: arow[i * k + l].
        for i in 0..m {
            for l in 0..k {
                let idx = if ta { l + i * d.lda as usize } else { i + l * d.lda as usize };
                // SAFETY: inside the span checked above.
                arow[i * k + l] = input(unsafe { read(ptrs[0], d.a_type, oa + idx) });
            }
        }
        for j in 0..n {
            for (l, c) in col.iter_mut().enumerate() {
                let idx = if tb { j + l * d.ldb as usize } else { l + j * d.ldb as usize };
                // SAFETY: as above.
                *c = input(unsafe { read(ptrs[1], d.b_type, ob + idx) });
            }
            for i in 0..m {
                let a = &arow[i * k..(i + 1) * k];
                let acc = if f64_mode {
                    a.iter().zip(&col).map(|(x, y)| x * y).sum::<f64>()
                } else {
                    let mut s = 0f32;
                    for (x, y) in a.iter().zip(&col) {
                        s = (*x as f32).mul_add(*y as f32, s);
                    }
                    f64::from(s)
                };
                let ci = oc + i + j * d.ldc as usize;
                // cuBLAS does not read C when beta is zero, so NaNs there do not propagate.
                let old = if beta == 0.0 {
                    0.0
                } else {
                    // SAFETY: as above.
                    unsafe { read(ptrs[2], d.c_type, ci) }
                };
                let v = if f64_mode {
                    alpha * acc + beta * old
                } else {
                    f64::from((alpha as f32).mul_add(acc as f32, beta as f32 * old as f32))
                };
                // SAFETY: as above.
                unsafe { store(ptrs[2], d.c_type, ci, v) };
            }
        }
    }
    STATUS_SUCCESS
}

/// Records a product in the profile: its FLOPs, the bytes of its
/// matrices (C twice when it is read), and the peak of its input type.
fn profile_gemm(d: &GemmDesc, tf32: bool, reads_c: bool) {
    use crate::profile::model::H200;
    let (m, n, k, batch) = (d.m as f64, d.n as f64, d.k as f64, d.batch as f64);
    let size = |t: c_int| elem_size(t).unwrap_or(4) as f64;
    let c_times = if reads_c { 2.0 } else { 1.0 };
    let bytes = batch * (m * k * size(d.a_type) + k * n * size(d.b_type) + c_times * m * n * size(d.c_type));
    let (ty, peak) = match d.a_type {
        R_16F => ("f16", H200.bf16_flops),
        R_16BF => ("bf16", H200.bf16_flops),
        R_64F => ("f64", H200.f64_flops),
        _ if tf32 => ("tf32", H200.tf32_flops),
        _ => ("f32", H200.f32_flops),
    };
    let name = format!(
        "cublas gemm {ty} {}x{}x{}{}",
        d.m,
        d.n,
        d.k,
        if d.batch > 1 { format!(" x{}", d.batch) } else { String::new() }
    );
    crate::profile::record_library(name, 2.0 * m * n * k * batch, bytes, peak);
}

/// Reads a scalar of type `t` (f32 or f64) at `addr`: a host pointer, or
/// with `device` a device address inside one live allocation
/// (CUBLAS_POINTER_MODE_DEVICE).
fn scalar(addr: u64, t: c_int, device: bool, what: &str) -> Result<f64, c_int> {
    let p = scalar_ptr(addr, t, device, what)?;
    // SAFETY: `scalar_ptr` checked the pointer (host: non-null, the caller's contract).
    Ok(unsafe { read(p, t, 0) })
}

/// The host address of a scalar of type `t` at `addr` (see [`scalar`]).
fn scalar_ptr(addr: u64, t: c_int, device: bool, what: &str) -> Result<*mut u8, c_int> {
    let size = elem_size(t).expect("internal: scalar types are f32 or f64") as u64;
    if addr == 0 {
        return Err(STATUS_INVALID_VALUE);
    }
    if !device {
        return Ok(addr as *mut u8);
    }
    emu().host_ptr(addr, size).ok_or_else(|| {
        fail(format!(
            "{what}: pointer mode is DEVICE but {addr:#x} is not {size} bytes inside one live device allocation"
        ))
    })
}

/// The level-1 routines and gemv, by [`VecDesc::op`].
pub const OP_ASUM: c_int = 0;
pub const OP_NRM2: c_int = 1;
pub const OP_DOT: c_int = 2;
pub const OP_AXPY: c_int = 3;
pub const OP_SCAL: c_int = 4;
pub const OP_GEMV: c_int = 5;

/// One level-1 routine or one gemv, of f32 or f64 (`dtype`).
///
/// Vectors follow BLAS's stride rule: element `i` of a vector of `len`
/// elements with increment `inc` is at `i * inc` when `inc > 0`, and at
/// `(len - 1 - i) * |inc|` when it is negative.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VecDesc {
    /// `size_of::<VecDesc>()` as the caller built it (see [`GemmDesc::size`]).
    pub size: u32,
    pub op: c_int,
    pub dtype: c_int,
    /// Elements of the vectors; for gemv, the columns of A as stored.
    pub n: c_int,
    /// gemv: the rows of A as stored.
    pub m: c_int,
    /// gemv: cublasOperation_t.
    pub trans: c_int,
    pub x: u64,
    pub incx: c_int,
    pub y: u64,
    pub incy: c_int,
    pub a: u64,
    pub lda: c_int,
    /// The scalars and the result: host pointers, or device addresses when
    /// `device_scalars` is nonzero.
    pub alpha: u64,
    pub beta: u64,
    pub result: u64,
    pub device_scalars: c_int,
}

/// A strided vector of device memory, checked against the live allocations.
struct Strided {
    p: *mut u8,
    t: c_int,
    len: usize,
    inc: isize,
}

impl Strided {
    fn new(addr: u64, t: c_int, len: usize, inc: c_int, what: &str) -> Result<Self, c_int> {
        let size = elem_size(t).expect("internal: type checked") as u64;
        let span = if len == 0 { 0 } else { (len as u64 - 1) * u64::from(inc.unsigned_abs()) + 1 };
        if span == 0 {
            return Ok(Strided { p: std::ptr::null_mut(), t, len: 0, inc: 1 });
        }
        match emu().host_ptr(addr, span * size) {
            Some(p) => Ok(Strided { p, t, len, inc: inc as isize }),
            None => Err(fail(format!(
                "{what}: {len} elements with increment {inc} need {} bytes at {addr:#x}, which are not inside \
                 one live device allocation",
                span * size
            ))),
        }
    }

    fn index(&self, i: usize) -> usize {
        if self.inc > 0 {
            i * self.inc as usize
        } else {
            (self.len - 1 - i) * self.inc.unsigned_abs()
        }
    }

    fn get(&self, i: usize) -> f64 {
        // SAFETY: `i < len`, inside the span checked in `new`.
        unsafe { read(self.p, self.t, self.index(i)) }
    }

    fn set(&self, i: usize, v: f64) {
        // SAFETY: as above.
        unsafe { store(self.p, self.t, self.index(i), v) }
    }
}

/// Runs one level-1 routine or gemv; returns a cublasStatus_t.
///
/// Sums accumulate in f64 and round once to the element type, so an f32
/// result is the correctly rounded exact sum for all but pathological
/// inputs (cuBLAS's own order of summation differs, within its bounds).
///
/// # Safety
/// `d` must point at a valid descriptor whose host scalar pointers (when
/// `device_scalars` is zero) are valid.
#[no_mangle]
pub unsafe extern "C" fn tapirEmuBlasVector(d: *const VecDesc) -> c_int {
    if d.is_null() {
        return STATUS_INVALID_VALUE;
    }
    // SAFETY: as in tapirEmuGemm, the size is read first.
    let size = unsafe { d.cast::<u32>().read() };
    if size as usize != std::mem::size_of::<VecDesc>() {
        return fail(format!(
            "the cuBLAS stand-in passed a {size}-byte vector descriptor where this driver emulator takes {} bytes: \
             the two libraries come from different builds (rebuild both)",
            std::mem::size_of::<VecDesc>()
        ));
    }
    // SAFETY: the caller's descriptor, of this layout.
    let d = unsafe { *d };
    match vector_op(&d) {
        Ok(()) => STATUS_SUCCESS,
        Err(s) => s,
    }
}

fn vector_op(d: &VecDesc) -> Result<(), c_int> {
    if d.dtype != R_32F && d.dtype != R_64F {
        return Err(STATUS_NOT_SUPPORTED);
    }
    let (t, dev) = (d.dtype, d.device_scalars != 0);
    let put = |v: f64, what: &str| -> Result<(), c_int> {
        let p = scalar_ptr(d.result, t, dev, what)?;
        // SAFETY: checked by `scalar_ptr`.
        unsafe { store(p, t, 0, v) };
        Ok(())
    };
    match d.op {
        OP_ASUM | OP_NRM2 => {
            let name = if d.op == OP_ASUM { "asum" } else { "nrm2" };
            // cuBLAS returns 0 for n <= 0 or incx <= 0.
            if d.n <= 0 || d.incx <= 0 {
                return put(0.0, name);
            }
            let x = Strided::new(d.x, t, d.n as usize, d.incx, name)?;
            let v = if d.op == OP_ASUM {
                (0..x.len).map(|i| x.get(i).abs()).sum::<f64>()
            } else {
                // Scaled by the largest magnitude so squares neither overflow nor underflow.
                let big = (0..x.len).map(|i| x.get(i).abs()).fold(0.0, f64::max);
                if big == 0.0 || !big.is_finite() {
                    big
                } else {
                    big * (0..x.len).map(|i| (x.get(i) / big).powi(2)).sum::<f64>().sqrt()
                }
            };
            put(v, name)
        }
        OP_DOT => {
            if d.n <= 0 {
                return put(0.0, "dot");
            }
            let n = d.n as usize;
            let x = Strided::new(d.x, t, n, d.incx, "dot x")?;
            let y = Strided::new(d.y, t, n, d.incy, "dot y")?;
            put((0..n).map(|i| x.get(i) * y.get(i)).sum(), "dot")
        }
        OP_AXPY => {
            let alpha = scalar(d.alpha, t, dev, "axpy alpha")?;
            if d.n <= 0 {
                return Ok(());
            }
            let n = d.n as usize;
            let x = Strided::new(d.x, t, n, d.incx, "axpy x")?;
            let y = Strided::new(d.y, t, n, d.incy, "axpy y")?;
            for i in 0..n {
                y.set(i, fma_in(t, alpha, x.get(i), y.get(i)));
            }
            Ok(())
        }
        OP_SCAL => {
            let alpha = scalar(d.alpha, t, dev, "scal alpha")?;
            if d.n <= 0 || d.incx <= 0 {
                return Ok(());
            }
            let x = Strided::new(d.x, t, d.n as usize, d.incx, "scal x")?;
            for i in 0..x.len {
                x.set(i, round_to(t, alpha * x.get(i)));
            }
            Ok(())
        }
        OP_GEMV => gemv(d),
        _ => Err(STATUS_INVALID_VALUE),
    }
}

/// `a * x + y` rounded once to the element type `t`.
fn fma_in(t: c_int, a: f64, x: f64, y: f64) -> f64 {
    if t == R_32F {
        f64::from((a as f32).mul_add(x as f32, y as f32))
    } else {
        a.mul_add(x, y)
    }
}

fn round_to(t: c_int, v: f64) -> f64 {
    if t == R_32F {
        f64::from(v as f32)
    } else {
        v
    }
}

/// `y = alpha op(A) x + beta y`, A `m x n` column-major with leading
/// dimension `lda`; cuBLAS's argument checks first.
fn gemv(d: &VecDesc) -> Result<(), c_int> {
    let trans = match d.trans {
        0 => false,
        1 | 2 => true,
        _ => return Err(STATUS_INVALID_VALUE),
    };
    if d.m < 0 || d.n < 0 || d.lda < d.m.max(1) || d.incx == 0 || d.incy == 0 {
        return Err(STATUS_INVALID_VALUE);
    }
    let (t, dev) = (d.dtype, d.device_scalars != 0);
    let alpha = scalar(d.alpha, t, dev, "gemv alpha")?;
    let beta = scalar(d.beta, t, dev, "gemv beta")?;
    let (m, n, lda) = (d.m as usize, d.n as usize, d.lda as usize);
    if m == 0 || n == 0 {
        return Ok(());
    }
    // op(A) is rows x cols.
    let (rows, cols) = if trans { (n, m) } else { (m, n) };
    let a = Strided::new(d.a, t, (n - 1) * lda + m, 1, "gemv A")?;
    let x = Strided::new(d.x, t, cols, d.incx, "gemv x")?;
    let y = Strided::new(d.y, t, rows, d.incy, "gemv y")?;
    let xs: Vec<f64> = (0..cols).map(|j| x.get(j)).collect();
    for i in 0..rows {
        let acc: f64 =
            xs.iter().enumerate().map(|(j, xj)| a.get(if trans { j + i * lda } else { i + j * lda }) * xj).sum();
        // cuBLAS does not read y when beta is zero, so NaNs there do not propagate.
        let old = if beta == 0.0 { 0.0 } else { y.get(i) };
        y.set(i, round_to(t, alpha * acc + beta * old));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_of_another_layout_is_refused_not_misread() {
        let one = 1f32;
        let mut d = GemmDesc {
            size: 0,
            transa: 0,
            transb: 0,
            m: 1,
            n: 1,
            k: 1,
            alpha: (&one as *const f32).cast(),
            beta: (&one as *const f32).cast(),
            a: 0,
            a_type: R_32F,
            lda: 1,
            stride_a: 0,
            b: 0,
            b_type: R_32F,
            ldb: 1,
            stride_b: 0,
            c: 0,
            c_type: R_32F,
            ldc: 1,
            stride_c: 0,
            batch: 1,
            compute: 68,
            tf32: 0,
            device_scalars: 0,
        };
        // An older stand-in's first field was transa (0 or 1).
        for size in [0, 1, std::mem::size_of::<GemmDesc>() as u32 - 8] {
            d.size = size;
            // SAFETY: a descriptor on the stack with valid scalar pointers.
            assert_eq!(unsafe { tapirEmuGemm(&d) }, STATUS_EXECUTION_FAILED, "size {size}");
        }
    }

    #[test]
    fn tf32_keeps_ten_mantissa_bits_rounding_ties_away_from_zero() {
        let ulp = 2f32.powi(-10);
        for sign in [1.0f32, -1.0] {
            // Exact TF32 values stay; below half an ulp goes down, half an
            // ulp (a tie) and above go up.
            assert_eq!(to_tf32(sign * (1.0 + ulp)), sign * (1.0 + ulp));
            assert_eq!(to_tf32(sign * (1.0 + ulp / 4.0)), sign);
            assert_eq!(to_tf32(sign * (1.0 + ulp / 2.0)), sign * (1.0 + ulp));
            assert_eq!(to_tf32(sign * (1.0 + 3.0 * ulp / 4.0)), sign * (1.0 + ulp));
        }
        assert_eq!(to_tf32(f32::INFINITY), f32::INFINITY);
        assert!(to_tf32(f32::NAN).is_nan());
        assert_eq!(to_tf32(0.0).to_bits(), 0);
        assert_eq!(to_tf32(-0.0).to_bits(), (-0.0f32).to_bits());
    }
}
