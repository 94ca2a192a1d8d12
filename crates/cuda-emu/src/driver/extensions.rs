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

/// One device range a host-side operation ([`tapirEmuSubmit`]) reads or
/// writes; the layout the NCCL stand-in fills.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TapirEmuRange {
    /// The first byte's device address.
    pub addr: CUdeviceptr,
    /// Bytes.
    pub len: u64,
    /// Nonzero when the operation writes the range.
    pub write: c_int,
}

/// The work of [`tapirEmuSubmit`]: called on the stream's worker with the
/// host address of each range (in the order given); returns 0, or
/// nonzero after writing a message of at most `msg_len` bytes (NUL
/// included) to `msg`, which faults the device as a failed launch would.
pub type TapirEmuHostWork =
    unsafe extern "C" fn(data: *mut c_void, ptrs: *const *mut u8, msg: *mut c_char, msg_len: usize) -> c_int;

/// A pointer that crosses to the stream's worker with the work.
struct WorkData(*mut c_void);
// SAFETY: the submitter hands `data` to the worker for the work's call,
// the contract of a host function.
unsafe impl Send for WorkData {}

/// Submits host-side work on device memory to stream `s` of device
/// `device` (the null handle is that device's legacy stream, whatever the
/// calling thread's current context): what the NCCL stand-in's
/// collectives are. Each range must lie inside one live allocation of
/// `device`; the ranges take part in the stream-order hazard check as the
/// operation `what` (reads and writes as flagged), the allocations stay
/// alive until the work has run, and written ranges count as initialised.
/// A nonzero return of the work becomes the device's sticky error
/// (`CUDA_ERROR_LAUNCH_FAILED`) with its message.
#[no_mangle]
pub unsafe extern "C" fn tapirEmuSubmit(
    device: c_int,
    s: Handle,
    what: *const c_char,
    ranges: *const TapirEmuRange,
    n: usize,
    work: Option<TapirEmuHostWork>,
    data: *mut c_void,
) -> CUresult {
    let Some(work) = work else { return INVALID_VALUE };
    let e = emu();
    let Some(d) = usize::try_from(device).ok().filter(|&d| d < e.devices.len()) else { return INVALID_DEVICE };
    let st = if handle_id(s) <= 2 {
        queue::legacy(d)
    } else {
        match lock(&e.streams).get(&handle_id(s)).cloned() {
            Some(st) => st,
            None => return INVALID_HANDLE,
        }
    };
    if st.device != d {
        return fail(INVALID_HANDLE, format!("a stream of device {} given for work on device {d}", st.device));
    }
    let rc = queue::posted(d);
    if rc != SUCCESS {
        return rc;
    }
    let what = if what.is_null() {
        "tapirEmuSubmit".to_string()
    } else {
        // SAFETY: a NUL-terminated name.
        unsafe { CStr::from_ptr(what) }.to_string_lossy().into_owned()
    };
    let ranges: &[TapirEmuRange] = if n == 0 || ranges.is_null() {
        &[]
    } else {
        // SAFETY: the caller's array of `n` ranges.
        unsafe { std::slice::from_raw_parts(ranges, n) }
    };
    let mut spans = Vec::with_capacity(ranges.len());
    let mut access: Vec<hazard::Access> = Vec::new();
    for r in ranges {
        if e.device_of(r.addr) != Some(d) {
            return fail(
                INVALID_VALUE,
                format!("{what}: {} bytes at {:#x} are not in device {d}'s memory", r.len, r.addr),
            );
        }
        let Some((base, alen, buf)) = e.devices[d].memory.region(r.addr, r.len.max(1)) else {
            return fail(
                INVALID_VALUE,
                format!("{what}: {} bytes at {:#x} are not inside one live device allocation", r.len, r.addr),
            );
        };
        let write = r.write != 0;
        match access.iter_mut().find(|a| a.base == base) {
            Some(a) => a.write |= write,
            None => access.push(hazard::Access { base, len: alen, write }),
        }
        spans.push((buf, (r.addr - base) as usize));
    }
    let data = WorkData(data);
    let name = what.clone();
    let run: queue::Work = Box::new(move || {
        let data = data;
        // SAFETY: each offset was checked inside its buffer, which `spans` keeps alive.
        let ptrs: Vec<*mut u8> = spans.iter().map(|(buf, off)| unsafe { buf.ptr().add(*off) }).collect();
        let mut msg = vec![0u8; 1024];
        // SAFETY: the submitter's work, with its data and the ranges' host addresses.
        let rc = unsafe { work(data.0, ptrs.as_ptr(), msg.as_mut_ptr().cast(), msg.len()) };
        if rc == 0 {
            return Ok(());
        }
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = String::from_utf8_lossy(&msg[..end]).into_owned();
        Err(exec::Fault { code: 719, message: format!("{name}: {text}") })
    });
    match queue::submit(&st, queue::Submit { what, access, deps: Vec::new(), work: run }) {
        Ok(_) => SUCCESS,
        Err(rc) => rc,
    }
}
