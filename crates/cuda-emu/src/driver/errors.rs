//! Error names and descriptions.

use super::*;

const ERRORS: &[(CUresult, &str, &str)] = &[
    (0, "CUDA_SUCCESS\0", "no error\0"),
    (1, "CUDA_ERROR_INVALID_VALUE\0", "invalid argument\0"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY\0", "out of memory\0"),
    (3, "CUDA_ERROR_NOT_INITIALIZED\0", "initialization error\0"),
    (4, "CUDA_ERROR_DEINITIALIZED\0", "driver shutting down\0"),
    (100, "CUDA_ERROR_NO_DEVICE\0", "no CUDA-capable device is detected\0"),
    (101, "CUDA_ERROR_INVALID_DEVICE\0", "invalid device ordinal\0"),
    (200, "CUDA_ERROR_INVALID_IMAGE\0", "device kernel image is invalid\0"),
    (201, "CUDA_ERROR_INVALID_CONTEXT\0", "invalid device context\0"),
    (215, "CUDA_ERROR_UNSUPPORTED_LIMIT\0", "limit is not supported on this architecture\0"),
    (218, "CUDA_ERROR_INVALID_PTX\0", "a PTX JIT compilation failed\0"),
    (400, "CUDA_ERROR_INVALID_HANDLE\0", "invalid resource handle\0"),
    (401, "CUDA_ERROR_ILLEGAL_STATE\0", "the operation is not permitted in the current state\0"),
    (500, "CUDA_ERROR_NOT_FOUND\0", "named symbol not found\0"),
    (600, "CUDA_ERROR_NOT_READY\0", "device not ready\0"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS\0", "an illegal memory access was encountered\0"),
    (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES\0", "too many resources requested for launch\0"),
    (704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED\0", "peer access is already enabled\0"),
    (705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED\0", "peer access has not been enabled\0"),
    (710, "CUDA_ERROR_ASSERT\0", "device-side assert triggered\0"),
    (716, "CUDA_ERROR_MISALIGNED_ADDRESS\0", "misaligned address\0"),
    (719, "CUDA_ERROR_LAUNCH_FAILED\0", "unspecified launch failure\0"),
    (801, "CUDA_ERROR_NOT_SUPPORTED\0", "operation not supported\0"),
    (999, "CUDA_ERROR_UNKNOWN\0", "unknown error\0"),
];

#[no_mangle]
pub extern "C" fn cuGetErrorName(e: CUresult, out: *mut *const c_char) -> CUresult {
    match ERRORS.iter().find(|x| x.0 == e) {
        Some(x) => write(out, x.1.as_ptr().cast()),
        None => INVALID_VALUE,
    }
}

#[no_mangle]
pub extern "C" fn cuGetErrorString(e: CUresult, out: *mut *const c_char) -> CUresult {
    match ERRORS.iter().find(|x| x.0 == e) {
        Some(x) => write(out, x.2.as_ptr().cast()),
        None => INVALID_VALUE,
    }
}
