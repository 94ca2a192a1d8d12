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

/// cudaDataType values of the typed entry points.
const R_32F: c_int = 0;
const R_64F: c_int = 1;

/// The descriptor `tapirEmuGemm` takes; the same layout as the driver
/// emulator's `blas::GemmDesc`.
#[repr(C)]
struct GemmDesc {
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
}

type GemmFn = unsafe extern "C" fn(*const GemmDesc) -> c_int;

/// `tapirEmuGemm` of the loaded driver emulator.
fn gemm_fn() -> Option<GemmFn> {
    static F: OnceLock<Option<usize>> = OnceLock::new();
    let f = F.get_or_init(|| {
        // SAFETY: RTLD_NOLOAD only returns an object already loaded; the
        // symbol has the signature above.
        unsafe {
            let h = libc::dlopen(c"libcuda.so".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
            if h.is_null() {
                return None;
            }
            let s = libc::dlsym(h, c"tapirEmuGemm".as_ptr());
            (!s.is_null()).then_some(s as usize)
        }
    });
    // SAFETY: the address of a function with this signature.
    f.map(|a| unsafe { std::mem::transmute::<usize, GemmFn>(a) })
}

fn run(d: GemmDesc) -> Status {
    match gemm_fn() {
        // SAFETY: the descriptor is valid for the call.
        Some(f) => unsafe { f(&d) },
        None => NOT_INITIALIZED,
    }
}

/// A handle: the stream it was given (unused: work is synchronous).
struct Handle {
    _stream: *mut c_void,
}

#[no_mangle]
pub unsafe extern "C" fn cublasCreate_v2(handle: *mut *mut c_void) -> Status {
    if handle.is_null() {
        return INVALID_VALUE;
    }
    if gemm_fn().is_none() {
        return NOT_INITIALIZED;
    }
    // SAFETY: the caller's out-pointer.
    unsafe { *handle = Box::into_raw(Box::new(Handle { _stream: std::ptr::null_mut() })).cast() };
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

#[no_mangle]
pub unsafe extern "C" fn cublasGetVersion_v2(_handle: *mut c_void, v: *mut c_int) -> Status {
    if v.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: the caller's out-pointer.
    unsafe { *v = 120900 };
    SUCCESS
}

/// Math modes change nothing: products are computed in f32 or f64.
#[no_mangle]
pub extern "C" fn cublasSetMathMode(_handle: *mut c_void, _mode: c_int) -> Status {
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetMathMode(_handle: *mut c_void, mode: *mut c_int) -> Status {
    if mode.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: the caller's out-pointer.
    unsafe { *mode = 0 };
    SUCCESS
}

/// Only host scalars (the default) are supported.
#[no_mangle]
pub extern "C" fn cublasSetPointerMode_v2(_handle: *mut c_void, mode: c_int) -> Status {
    if mode == 0 {
        SUCCESS
    } else {
        NOT_SUPPORTED
    }
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetPointerMode_v2(_handle: *mut c_void, mode: *mut c_int) -> Status {
    if mode.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: the caller's out-pointer.
    unsafe { *mode = 0 };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cublasSetWorkspace_v2(_handle: *mut c_void, _ws: *mut c_void, _bytes: usize) -> Status {
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cublasSgemm_v2(
    _h: *mut c_void,
    transa: c_int,
    transb: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f32,
    a: u64,
    lda: c_int,
    b: u64,
    ldb: c_int,
    beta: *const f32,
    c: u64,
    ldc: c_int,
) -> Status {
    run(GemmDesc {
        transa,
        transb,
        m,
        n,
        k,
        alpha: alpha.cast(),
        beta: beta.cast(),
        a,
        a_type: R_32F,
        lda,
        stride_a: 0,
        b,
        b_type: R_32F,
        ldb,
        stride_b: 0,
        c,
        c_type: R_32F,
        ldc,
        stride_c: 0,
        batch: 1,
        compute: R_32F,
    })
}

#[no_mangle]
pub extern "C" fn cublasDgemm_v2(
    _h: *mut c_void,
    transa: c_int,
    transb: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f64,
    a: u64,
    lda: c_int,
    b: u64,
    ldb: c_int,
    beta: *const f64,
    c: u64,
    ldc: c_int,
) -> Status {
    run(GemmDesc {
        transa,
        transb,
        m,
        n,
        k,
        alpha: alpha.cast(),
        beta: beta.cast(),
        a,
        a_type: R_64F,
        lda,
        stride_a: 0,
        b,
        b_type: R_64F,
        ldb,
        stride_b: 0,
        c,
        c_type: R_64F,
        ldc,
        stride_c: 0,
        batch: 1,
        compute: R_64F,
    })
}

#[no_mangle]
pub extern "C" fn cublasSgemmStridedBatched(
    _h: *mut c_void,
    transa: c_int,
    transb: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f32,
    a: u64,
    lda: c_int,
    stride_a: c_longlong,
    b: u64,
    ldb: c_int,
    stride_b: c_longlong,
    beta: *const f32,
    c: u64,
    ldc: c_int,
    stride_c: c_longlong,
    batch: c_int,
) -> Status {
    run(GemmDesc {
        transa,
        transb,
        m,
        n,
        k,
        alpha: alpha.cast(),
        beta: beta.cast(),
        a,
        a_type: R_32F,
        lda,
        stride_a,
        b,
        b_type: R_32F,
        ldb,
        stride_b,
        c,
        c_type: R_32F,
        ldc,
        stride_c,
        batch,
        compute: R_32F,
    })
}

#[no_mangle]
pub extern "C" fn cublasDgemmStridedBatched(
    _h: *mut c_void,
    transa: c_int,
    transb: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f64,
    a: u64,
    lda: c_int,
    stride_a: c_longlong,
    b: u64,
    ldb: c_int,
    stride_b: c_longlong,
    beta: *const f64,
    c: u64,
    ldc: c_int,
    stride_c: c_longlong,
    batch: c_int,
) -> Status {
    run(GemmDesc {
        transa,
        transb,
        m,
        n,
        k,
        alpha: alpha.cast(),
        beta: beta.cast(),
        a,
        a_type: R_64F,
        lda,
        stride_a,
        b,
        b_type: R_64F,
        ldb,
        stride_b,
        c,
        c_type: R_64F,
        ldc,
        stride_c,
        batch,
        compute: R_64F,
    })
}

#[no_mangle]
pub extern "C" fn cublasGemmEx(
    _h: *mut c_void,
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
    _algo: c_int,
) -> Status {
    run(GemmDesc {
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
        stride_a: 0,
        b,
        b_type,
        ldb,
        stride_b: 0,
        c,
        c_type,
        ldc,
        stride_c: 0,
        batch: 1,
        compute,
    })
}

#[no_mangle]
pub extern "C" fn cublasGemmStridedBatchedEx(
    _h: *mut c_void,
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
    run(GemmDesc {
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
    })
}

/// Level-1 and level-2 routines cudarc exposes but tapir does not use.
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

not_supported!(
    cublasGemmGroupedBatchedEx,
    cublasSasum_v2,
    cublasDasum_v2,
    cublasSgemv_v2,
    cublasDgemv_v2,
    cublasHgemm,
    cublasHgemmStridedBatched
);
