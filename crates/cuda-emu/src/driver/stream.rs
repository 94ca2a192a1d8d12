//! Streams and events: handles only, as all work is synchronous.

use super::*;

/// A new stream or event in `table`, of the current context's device.
fn new_handle(table: &Mutex<HashMap<usize, usize>>, out: *mut Handle) -> CUresult {
    if out.is_null() {
        return INVALID_VALUE;
    }
    let id = emu().next.fetch_add(1, Ordering::Relaxed);
    lock(table).insert(id, current_device());
    write(out, id as Handle)
}

/// Destroys the stream or event `h` of `table`; one not there is
/// `CUDA_ERROR_INVALID_HANDLE`.
fn drop_handle(table: &Mutex<HashMap<usize, usize>>, h: Handle) -> CUresult {
    if lock(table).remove(&handle_id(h)).is_some() {
        SUCCESS
    } else {
        INVALID_HANDLE
    }
}

/// The device of stream `s`: its context's, or the current context's for
/// the null and the legacy/per-thread streams; None for no stream.
pub(super) fn stream_device(s: Handle) -> Option<usize> {
    let id = handle_id(s);
    if id <= 2 {
        return Some(current_device());
    }
    lock(&emu().streams).get(&id).copied()
}

pub(super) fn check_stream(s: Handle) -> CUresult {
    let id = handle_id(s);
    // The null stream and the legacy/per-thread stream handles are always valid.
    if id <= 2 || lock(&emu().streams).contains_key(&id) {
        SUCCESS
    } else {
        INVALID_HANDLE
    }
}

#[no_mangle]
pub extern "C" fn cuStreamCreate(out: *mut Handle, _flags: c_uint) -> CUresult {
    new_handle(&emu().streams, out)
}

#[no_mangle]
pub extern "C" fn cuStreamCreateWithPriority(out: *mut Handle, _flags: c_uint, _prio: c_int) -> CUresult {
    new_handle(&emu().streams, out)
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(s: Handle) -> CUresult {
    drop_handle(&emu().streams, s)
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(s: Handle) -> CUresult {
    check_stream(s)
}

#[no_mangle]
pub extern "C" fn cuStreamQuery(s: Handle) -> CUresult {
    check_stream(s)
}

#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(s: Handle, e: Handle, _flags: c_uint) -> CUresult {
    if check_stream(s) != SUCCESS || !lock(&emu().events).contains_key(&handle_id(e)) {
        return INVALID_HANDLE;
    }
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuStreamIsCapturing(_s: Handle, status: *mut c_int) -> CUresult {
    write(status, 0)
}

#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2(_s: Handle, _mode: c_int) -> CUresult {
    NOT_SUPPORTED
}

#[no_mangle]
pub extern "C" fn cuStreamEndCapture(_s: Handle, _g: *mut Handle) -> CUresult {
    NOT_SUPPORTED
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchHostFunc(
    s: Handle,
    f: Option<unsafe extern "C" fn(*mut c_void)>,
    data: *mut c_void,
) -> CUresult {
    if check_stream(s) != SUCCESS {
        return INVALID_HANDLE;
    }
    let Some(f) = f else { return INVALID_VALUE };
    // SAFETY: the caller's callback, run now: the stream has no pending work.
    unsafe { f(data) };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuEventCreate(out: *mut Handle, _flags: c_uint) -> CUresult {
    new_handle(&emu().events, out)
}

fn check_event(e: Handle) -> CUresult {
    if lock(&emu().events).contains_key(&handle_id(e)) {
        SUCCESS
    } else {
        INVALID_HANDLE
    }
}

#[no_mangle]
pub extern "C" fn cuEventRecord(e: Handle, s: Handle) -> CUresult {
    let Some(sd) = stream_device(s) else { return INVALID_HANDLE };
    let Some(ed) = lock(&emu().events).get(&handle_id(e)).copied() else { return INVALID_HANDLE };
    if sd != ed {
        // An event records only on a stream of its own context.
        return fail(INVALID_HANDLE, format!("cuEventRecord of an event of device {ed} on a stream of device {sd}"));
    }
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuEventRecordWithFlags(e: Handle, s: Handle, _flags: c_uint) -> CUresult {
    cuEventRecord(e, s)
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(e: Handle) -> CUresult {
    check_event(e)
}

#[no_mangle]
pub extern "C" fn cuEventQuery(e: Handle) -> CUresult {
    check_event(e)
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(e: Handle) -> CUresult {
    drop_handle(&emu().events, e)
}

/// Elapsed time between events: always zero, since the emulator measures
/// correctness, not speed.
#[no_mangle]
pub extern "C" fn cuEventElapsedTime(ms: *mut f32, a: Handle, b: Handle) -> CUresult {
    if check_event(a) != SUCCESS || check_event(b) != SUCCESS {
        return INVALID_HANDLE;
    }
    write(ms, 0.0)
}

#[no_mangle]
pub extern "C" fn cuEventElapsedTime_v2(ms: *mut f32, a: Handle, b: Handle) -> CUresult {
    cuEventElapsedTime(ms, a, b)
}
