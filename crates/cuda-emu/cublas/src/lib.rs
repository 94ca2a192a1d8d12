//! The cuBLAS half of tapir's emulated CUDA device: a stand-in for
//! `libcublas` whose products are computed by the driver emulator
//! (`tapir-cuda-emu`, symbol `tapirEmuGemm`), which owns the device memory.
//!
//! The driver emulator is found by its soname (`libcuda.so`), which the
//! selection switch has already loaded; without it every call returns
//! `CUBLAS_STATUS_NOT_INITIALIZED`. Functions cudarc may call but the
//! emulator does not compute return `CUBLAS_STATUS_NOT_SUPPORTED`.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]
#![allow(clippy::too_many_arguments)]

use std::ffi::{c_int, c_longlong, c_void};
use std::sync::OnceLock;

type Status = c_int;
const SUCCESS: Status = 0;
const NOT_INITIALIZED: Status = 1;
const INVALID_VALUE: Status = 7;
const NOT_SUPPORTED: Status = 15;
const EXECUTION_FAILED: Status = 13;

/// cudaDataType values of the typed entry points.
const R_32F: c_int = 0;
const R_64F: c_int = 1;

/// The descriptor `tapirEmuGemm` takes; the same layout as the driver
/// emulator's `blas::GemmDesc`.
#[repr(C)]
struct GemmDesc {
    /// This struct's size, which the driver emulator checks against its own.
    size: u32,
    transa: c_int,
    transb: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    beta: *const c_void,
    a: u64,
    a_type: c_int,
    lda: c_int,
    stride_a: i64,
    b: u64,
    b_type: c_int,
    ldb: c_int,
    stride_b: i64,
    c: u64,
    c_type: c_int,
    ldc: c_int,
    stride_c: i64,
    batch: c_int,
    compute: c_int,
    /// Nonzero: f32 inputs are rounded to TF32 first (the handle's math
    /// mode is CUBLAS_TF32_TENSOR_OP_MATH, or the compute type is
    /// CUBLAS_COMPUTE_32F_FAST_TF32).
    tf32: c_int,
    /// Nonzero: `alpha` and `beta` are device addresses (the handle's
    /// pointer mode is CUBLAS_POINTER_MODE_DEVICE).
    device_scalars: c_int,
}

/// The descriptor `tapirEmuBlasVector` takes; the same layout as the
/// driver emulator's `blas::VecDesc`.
#[repr(C)]
struct VecDesc {
    size: u32,
    op: c_int,
    dtype: c_int,
    n: c_int,
    m: c_int,
    trans: c_int,
    x: u64,
    incx: c_int,
    y: u64,
    incy: c_int,
    a: u64,
    lda: c_int,
    alpha: u64,
    beta: u64,
    result: u64,
    device_scalars: c_int,
}

impl VecDesc {
    /// A descriptor of `op` on elements of `dtype`, every operand absent.
    fn new(op: c_int, dtype: c_int, n: c_int) -> Self {
        VecDesc {
            size: std::mem::size_of::<VecDesc>() as u32,
            op,
            dtype,
            n,
            m: 0,
            trans: 0,
            x: 0,
            incx: 1,
            y: 0,
            incy: 1,
            a: 0,
            lda: 1,
            alpha: 0,
            beta: 0,
            result: 0,
            device_scalars: 0,
        }
    }
}

/// `VecDesc::op` values, as the driver emulator numbers them.
const OP_ASUM: c_int = 0;
const OP_NRM2: c_int = 1;
const OP_DOT: c_int = 2;
const OP_AXPY: c_int = 3;
const OP_SCAL: c_int = 4;
const OP_GEMV: c_int = 5;

type GemmFn = unsafe extern "C" fn(*const GemmDesc) -> c_int;
type VecFn = unsafe extern "C" fn(*const VecDesc) -> c_int;

/// The address of `name` in the loaded driver emulator, if it is loaded.
fn emulator_symbol(name: &std::ffi::CStr) -> Option<usize> {
    // SAFETY: RTLD_NOLOAD only returns an object already loaded.
    unsafe {
        let h = libc::dlopen(c"libcuda.so".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if h.is_null() {
            return None;
        }
        let s = libc::dlsym(h, name.as_ptr());
        (!s.is_null()).then_some(s as usize)
    }
}

/// `tapirEmuGemm` of the loaded driver emulator.
fn gemm_fn() -> Option<GemmFn> {
    static F: OnceLock<Option<usize>> = OnceLock::new();
    let f = F.get_or_init(|| emulator_symbol(c"tapirEmuGemm"));
    // SAFETY: the address of a function with this signature.
    f.map(|a| unsafe { std::mem::transmute::<usize, GemmFn>(a) })
}

/// `tapirEmuBlasVector` of the loaded driver emulator.
fn vec_fn() -> Option<VecFn> {
    static F: OnceLock<Option<usize>> = OnceLock::new();
    let f = F.get_or_init(|| emulator_symbol(c"tapirEmuBlasVector"));
    // SAFETY: the address of a function with this signature.
    f.map(|a| unsafe { std::mem::transmute::<usize, VecFn>(a) })
}

/// Waits for the work queued on the handle's stream: the emulator computes
/// a routine on the calling thread, so it runs after that work and is
/// done when the call returns (one legal schedule of the stream). A fault
/// of that work, or an earlier one of the context, is
/// `CUBLAS_STATUS_EXECUTION_FAILED`.
///
/// # Safety
/// `h` was created by `cublasCreate_v2`.
unsafe fn stream_sync(h: *mut c_void) -> Status {
    type SyncFn = unsafe extern "C" fn(*mut c_void) -> u32;
    static F: OnceLock<Option<usize>> = OnceLock::new();
    let Some(f) = *F.get_or_init(|| emulator_symbol(c"cuStreamSynchronize")) else { return NOT_INITIALIZED };
    // SAFETY: the address of cuStreamSynchronize; the handle's stream is one the caller gave.
    match unsafe { std::mem::transmute::<usize, SyncFn>(f)((*h.cast::<Handle>())._stream) } {
        0 => SUCCESS,
        _ => EXECUTION_FAILED,
    }
}

fn run(d: GemmDesc) -> Status {
    match gemm_fn() {
        // SAFETY: the descriptor is valid for the call.
        Some(f) => unsafe { f(&d) },
        None => NOT_INITIALIZED,
    }
}

/// Runs a vector routine with the handle `h`'s pointer mode.
///
/// # Safety
/// `h` is null or was created by `cublasCreate_v2`.
unsafe fn run_vec(h: *mut c_void, mut d: VecDesc) -> Status {
    if h.is_null() {
        return NOT_INITIALIZED;
    }
    // SAFETY: created by cublasCreate_v2.
    let rc = unsafe { stream_sync(h) };
    if rc != SUCCESS {
        return rc;
    }
    // SAFETY: created by cublasCreate_v2.
    d.device_scalars = unsafe { (*h.cast::<Handle>()).pointer_mode };
    match vec_fn() {
        // SAFETY: the descriptor is valid for the call.
        Some(f) => unsafe { f(&d) },
        None => NOT_INITIALIZED,
    }
}

/// A handle: the stream it was given (whose work a routine waits for), its
/// math mode and its pointer mode (0 host, 1 device).
struct Handle {
    _stream: *mut c_void,
    math_mode: c_int,
    pointer_mode: c_int,
}

/// cublasMath_t's TF32 mode (the low bits; the high ones are flags).
const TF32_TENSOR_OP_MATH: c_int = 3;
/// cublasComputeType_t's f32 compute with TF32 inputs.
const COMPUTE_32F_FAST_TF32: c_int = 77;

#[no_mangle]
pub unsafe extern "C" fn cublasCreate_v2(handle: *mut *mut c_void) -> Status {
    if handle.is_null() {
        return INVALID_VALUE;
    }
    if gemm_fn().is_none() {
        return NOT_INITIALIZED;
    }
    // SAFETY: the caller's out-pointer.
    unsafe {
        *handle =
            Box::into_raw(Box::new(Handle { _stream: std::ptr::null_mut(), math_mode: 0, pointer_mode: 0 })).cast()
    };
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasDestroy_v2(handle: *mut c_void) -> Status {
    if handle.is_null() {
        return NOT_INITIALIZED;
    }
    // SAFETY: created by cublasCreate_v2.
    drop(unsafe { Box::from_raw(handle.cast::<Handle>()) });
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasSetStream_v2(handle: *mut c_void, stream: *mut c_void) -> Status {
    if handle.is_null() {
        return NOT_INITIALIZED;
    }
    // SAFETY: created by cublasCreate_v2.
    unsafe { (*handle.cast::<Handle>())._stream = stream };
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetStream_v2(handle: *mut c_void, stream: *mut *mut c_void) -> Status {
    if handle.is_null() || stream.is_null() {
        return NOT_INITIALIZED;
    }
    // SAFETY: as above.
    unsafe { *stream = (*handle.cast::<Handle>())._stream };
    SUCCESS
}

/// Writes `v` through the caller's out-pointer `out`; a null one is
/// `CUBLAS_STATUS_INVALID_VALUE`.
unsafe fn put(out: *mut c_int, v: c_int) -> Status {
    if out.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: a non-null out-pointer the caller gave.
    unsafe { *out = v };
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetVersion_v2(_handle: *mut c_void, v: *mut c_int) -> Status {
    // SAFETY: the caller's out-pointer.
    unsafe { put(v, 120900) }
}

/// The handle's math mode: CUBLAS_TF32_TENSOR_OP_MATH rounds the inputs
/// of f32 products to TF32; every other mode computes them in f32.
#[no_mangle]
pub unsafe extern "C" fn cublasSetMathMode(handle: *mut c_void, mode: c_int) -> Status {
    if handle.is_null() {
        return NOT_INITIALIZED;
    }
    // SAFETY: created by cublasCreate_v2.
    unsafe { (*handle.cast::<Handle>()).math_mode = mode };
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetMathMode(handle: *mut c_void, mode: *mut c_int) -> Status {
    if handle.is_null() {
        return NOT_INITIALIZED;
    }
    // SAFETY: created by cublasCreate_v2; the caller's out-pointer.
    unsafe { put(mode, (*handle.cast::<Handle>()).math_mode) }
}

/// CUBLAS_POINTER_MODE_HOST (0, the default) or _DEVICE (1): where the
/// scalars and results of later calls on the handle live.
#[no_mangle]
pub unsafe extern "C" fn cublasSetPointerMode_v2(handle: *mut c_void, mode: c_int) -> Status {
    if handle.is_null() {
        return NOT_INITIALIZED;
    }
    if mode != 0 && mode != 1 {
        return INVALID_VALUE;
    }
    // SAFETY: created by cublasCreate_v2.
    unsafe { (*handle.cast::<Handle>()).pointer_mode = mode };
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetPointerMode_v2(handle: *mut c_void, mode: *mut c_int) -> Status {
    if handle.is_null() {
        return NOT_INITIALIZED;
    }
    // SAFETY: created by cublasCreate_v2; the caller's out-pointer.
    unsafe { put(mode, (*handle.cast::<Handle>()).pointer_mode) }
}

#[no_mangle]
pub extern "C" fn cublasSetWorkspace_v2(_handle: *mut c_void, _ws: *mut c_void, _bytes: usize) -> Status {
    SUCCESS
}

/// `cublasGemmAlgo_t`'s default; the emulator has one algorithm.
const DEFAULT_ALGO: c_int = -1;

/// Every product: the typed and the one-product entry points below are
/// this one with their types, or with a batch of one (strides 0).
#[no_mangle]
pub unsafe extern "C" fn cublasGemmStridedBatchedEx(
    h: *mut c_void,
    transa: c_int,
    transb: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    a: u64,
    a_type: c_int,
    lda: c_int,
    stride_a: c_longlong,
    b: u64,
    b_type: c_int,
    ldb: c_int,
    stride_b: c_longlong,
    beta: *const c_void,
    c: u64,
    c_type: c_int,
    ldc: c_int,
    stride_c: c_longlong,
    batch: c_int,
    compute: c_int,
    _algo: c_int,
) -> Status {
    if h.is_null() {
        return NOT_INITIALIZED;
    }
    // SAFETY: created by cublasCreate_v2.
    let rc = unsafe { stream_sync(h) };
    if rc != SUCCESS {
        return rc;
    }
    // SAFETY: created by cublasCreate_v2.
    let (mode, device_scalars) = unsafe { ((*h.cast::<Handle>()).math_mode, (*h.cast::<Handle>()).pointer_mode) };
    let tf32 = c_int::from((mode & 0xf) == TF32_TENSOR_OP_MATH || compute == COMPUTE_32F_FAST_TF32);
    run(GemmDesc {
        size: std::mem::size_of::<GemmDesc>() as u32,
        transa,
        transb,
        m,
        n,
        k,
        alpha,
        beta,
        a,
        a_type,
        lda,
        stride_a,
        b,
        b_type,
        ldb,
        stride_b,
        c,
        c_type,
        ldc,
        stride_c,
        batch,
        compute,
        tf32,
        device_scalars,
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasGemmEx(
    h: *mut c_void,
    transa: c_int,
    transb: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    a: u64,
    a_type: c_int,
    lda: c_int,
    b: u64,
    b_type: c_int,
    ldb: c_int,
    beta: *const c_void,
    c: u64,
    c_type: c_int,
    ldc: c_int,
    compute: c_int,
    algo: c_int,
) -> Status {
    // SAFETY: the caller's handle and scalars, passed on.
    unsafe {
        cublasGemmStridedBatchedEx(
            h, transa, transb, m, n, k, alpha, a, a_type, lda, 0, b, b_type, ldb, 0, beta, c, c_type, ldc, 0, 1,
            compute, algo,
        )
    }
}

/// The products of one element type `$t`, cudaDataType `$r` for the three
/// matrices and the arithmetic: `$strided` is cublasGemmStridedBatchedEx
/// with those types, `$plain` a batch of one of it.
macro_rules! typed_gemm {
    ($plain:ident, $strided:ident, $t:ty, $r:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $plain(
            h: *mut c_void,
            transa: c_int,
            transb: c_int,
            m: c_int,
            n: c_int,
            k: c_int,
            alpha: *const $t,
            a: u64,
            lda: c_int,
            b: u64,
            ldb: c_int,
            beta: *const $t,
            c: u64,
            ldc: c_int,
        ) -> Status {
            // SAFETY: the caller's handle and scalars, passed on.
            unsafe { $strided(h, transa, transb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1) }
        }

        #[no_mangle]
        pub unsafe extern "C" fn $strided(
            h: *mut c_void,
            transa: c_int,
            transb: c_int,
            m: c_int,
            n: c_int,
            k: c_int,
            alpha: *const $t,
            a: u64,
            lda: c_int,
            stride_a: c_longlong,
            b: u64,
            ldb: c_int,
            stride_b: c_longlong,
            beta: *const $t,
            c: u64,
            ldc: c_int,
            stride_c: c_longlong,
            batch: c_int,
        ) -> Status {
            let (alpha, beta) = (alpha.cast(), beta.cast());
            // SAFETY: the caller's handle and scalars, passed on.
            unsafe {
                cublasGemmStridedBatchedEx(
                    h,
                    transa,
                    transb,
                    m,
                    n,
                    k,
                    alpha,
                    a,
                    $r,
                    lda,
                    stride_a,
                    b,
                    $r,
                    ldb,
                    stride_b,
                    beta,
                    c,
                    $r,
                    ldc,
                    stride_c,
                    batch,
                    $r,
                    DEFAULT_ALGO,
                )
            }
        }
    };
}

typed_gemm!(cublasSgemm_v2, cublasSgemmStridedBatched, f32, R_32F);
typed_gemm!(cublasDgemm_v2, cublasDgemmStridedBatched, f64, R_64F);

/// The level-1 routines and gemv of one element type `$t` (cudaDataType
/// `$r`), each a vector descriptor for the driver emulator. Scalars and
/// results are host pointers or device addresses by the handle's pointer
/// mode, so they travel as addresses.
macro_rules! typed_vector {
    ($t:ty, $r:expr, $asum:ident, $nrm2:ident, $dot:ident, $axpy:ident, $scal:ident, $gemv:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $asum(h: *mut c_void, n: c_int, x: u64, incx: c_int, result: *mut $t) -> Status {
            let d = VecDesc { x, incx, result: result as u64, ..VecDesc::new(OP_ASUM, $r, n) };
            // SAFETY: the caller's handle.
            unsafe { run_vec(h, d) }
        }

        #[no_mangle]
        pub unsafe extern "C" fn $nrm2(h: *mut c_void, n: c_int, x: u64, incx: c_int, result: *mut $t) -> Status {
            let d = VecDesc { x, incx, result: result as u64, ..VecDesc::new(OP_NRM2, $r, n) };
            // SAFETY: the caller's handle.
            unsafe { run_vec(h, d) }
        }

        #[no_mangle]
        pub unsafe extern "C" fn $dot(
            h: *mut c_void,
            n: c_int,
            x: u64,
            incx: c_int,
            y: u64,
            incy: c_int,
            result: *mut $t,
        ) -> Status {
            let d = VecDesc { x, incx, y, incy, result: result as u64, ..VecDesc::new(OP_DOT, $r, n) };
            // SAFETY: the caller's handle.
            unsafe { run_vec(h, d) }
        }

        #[no_mangle]
        pub unsafe extern "C" fn $axpy(
            h: *mut c_void,
            n: c_int,
            alpha: *const $t,
            x: u64,
            incx: c_int,
            y: u64,
            incy: c_int,
        ) -> Status {
            let d = VecDesc { x, incx, y, incy, alpha: alpha as u64, ..VecDesc::new(OP_AXPY, $r, n) };
            // SAFETY: the caller's handle.
            unsafe { run_vec(h, d) }
        }

        #[no_mangle]
        pub unsafe extern "C" fn $scal(h: *mut c_void, n: c_int, alpha: *const $t, x: u64, incx: c_int) -> Status {
            let d = VecDesc { x, incx, alpha: alpha as u64, ..VecDesc::new(OP_SCAL, $r, n) };
            // SAFETY: the caller's handle.
            unsafe { run_vec(h, d) }
        }

        #[no_mangle]
        pub unsafe extern "C" fn $gemv(
            h: *mut c_void,
            trans: c_int,
            m: c_int,
            n: c_int,
            alpha: *const $t,
            a: u64,
            lda: c_int,
            x: u64,
            incx: c_int,
            beta: *const $t,
            y: u64,
            incy: c_int,
        ) -> Status {
            let d = VecDesc {
                m,
                trans,
                a,
                lda,
                x,
                incx,
                y,
                incy,
                alpha: alpha as u64,
                beta: beta as u64,
                ..VecDesc::new(OP_GEMV, $r, n)
            };
            // SAFETY: the caller's handle.
            unsafe { run_vec(h, d) }
        }
    };
}

typed_vector!(
    f32,
    R_32F,
    cublasSasum_v2,
    cublasSnrm2_v2,
    cublasSdot_v2,
    cublasSaxpy_v2,
    cublasSscal_v2,
    cublasSgemv_v2
);
typed_vector!(
    f64,
    R_64F,
    cublasDasum_v2,
    cublasDnrm2_v2,
    cublasDdot_v2,
    cublasDaxpy_v2,
    cublasDscal_v2,
    cublasDgemv_v2
);

/// Routines cudarc may call that the emulator does not compute.
macro_rules! not_supported {
    ($($name:ident),*) => {
        $(
            #[no_mangle]
            pub extern "C" fn $name() -> Status {
                NOT_SUPPORTED
            }
        )*
    };
}

not_supported!(cublasGemmGroupedBatchedEx, cublasHgemm, cublasHgemmStridedBatched);
