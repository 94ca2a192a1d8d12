//! The emulator's own entry points, outside CUDA's API (for tests and the cuBLAS stand-in).

use super::*;

/// Copies the calling thread's last failure message (NUL-terminated,
/// truncated to `len`) into `buf`; returns the message's full length.
#[no_mangle]
pub unsafe extern "C" fn tapirEmuLastError(buf: *mut c_char, len: usize) -> usize {
    let msg = last_error();
    if !buf.is_null() && len > 0 {
        let n = msg.len().min(len - 1);
        // SAFETY: the caller's buffer holds `len` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(msg.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    msg.len()
}

/// Thread-instructions executed by all launches so far.
#[no_mangle]
pub extern "C" fn tapirEmuInstructions() -> u64 {
    emu().instructions.load(Ordering::Relaxed)
}

/// A host pointer to `len` bytes of device memory at `addr`, or null when
/// they are not inside one live allocation (for the cuBLAS stand-in).
#[no_mangle]
pub extern "C" fn tapirEmuHostPtr(addr: CUdeviceptr, len: usize) -> *mut c_void {
    emu().host_ptr(addr, len as u64).map_or(std::ptr::null_mut(), |p| p.cast())
}

/// Records a failure message from the cuBLAS stand-in.
#[no_mangle]
pub unsafe extern "C" fn tapirEmuSetError(msg: *const c_char) {
    if msg.is_null() {
        return;
    }
    // SAFETY: a NUL-terminated message.
    let m = unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned();
    record_failure(m);
}
