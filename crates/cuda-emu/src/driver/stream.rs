//! Streams and events: the entry points over `queue`.

use super::queue::{self, Event, Stream, Submit, Work};
use super::*;

fn new_stream(out: *mut Handle, flags: c_uint) -> CUresult {
    if out.is_null() {
        return INVALID_VALUE;
    }
    let rc = queue::ctx_error();
    if rc != SUCCESS {
        return rc;
    }
    let s = Stream::new(current_device(), false, flags & queue::NON_BLOCKING != 0);
    let id = s.id;
    lock(&emu().streams).insert(id, s);
    write(out, id as Handle)
}

#[no_mangle]
pub extern "C" fn cuStreamCreate(out: *mut Handle, flags: c_uint) -> CUresult {
    new_stream(out, flags)
}

#[no_mangle]
pub extern "C" fn cuStreamCreateWithPriority(out: *mut Handle, flags: c_uint, _prio: c_int) -> CUresult {
    new_stream(out, flags)
}

/// Destroys a stream; work already submitted to it still runs, as in CUDA.
#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(s: Handle) -> CUresult {
    match lock(&emu().streams).remove(&handle_id(s)) {
        Some(st) => {
            st.close();
            SUCCESS
        }
        None => INVALID_HANDLE,
    }
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(s: Handle) -> CUresult {
    let Some(st) = queue::resolve(s) else { return INVALID_HANDLE };
    queue::synchronize(&st)
}

/// `CUDA_ERROR_NOT_READY` while work submitted to the stream is pending.
#[no_mangle]
pub extern "C" fn cuStreamQuery(s: Handle) -> CUresult {
    let Some(st) = queue::resolve(s) else { return INVALID_HANDLE };
    let rc = queue::sticky(st.device);
    if rc != SUCCESS {
        return rc;
    }
    let (q, c) = st.last();
    if !st.done(q) {
        return NOT_READY;
    }
    lock(&emu().tracker).host.join(&c);
    queue::sticky(st.device)
}

/// Later work on `s` waits until the event's last record has completed.
#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(s: Handle, e: Handle, _flags: c_uint) -> CUresult {
    let Some(st) = queue::resolve(s) else { return INVALID_HANDLE };
    let Some(ev) = lock(&emu().events).get(&handle_id(e)).cloned() else { return INVALID_HANDLE };
    let rc = queue::posted(st.device);
    if rc != SUCCESS {
        return rc;
    }
    let Some(dep) = ev.target() else { return SUCCESS };
    let work: Work = Box::new(|| Ok(()));
    match queue::submit(&st, Submit { what: "cuStreamWaitEvent".into(), access: Vec::new(), deps: vec![dep], work }) {
        Ok(_) => SUCCESS,
        Err(rc) => rc,
    }
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

/// A host pointer that may cross to the worker thread.
struct SendPtr(*mut c_void);
// SAFETY: the caller of cuLaunchHostFunc hands the pointer to its callback,
// which CUDA runs on a thread of its own as well.
unsafe impl Send for SendPtr {}

/// Runs `f(data)` on the stream's worker, after the work submitted before it.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchHostFunc(
    s: Handle,
    f: Option<unsafe extern "C" fn(*mut c_void)>,
    data: *mut c_void,
) -> CUresult {
    let Some(st) = queue::resolve(s) else { return INVALID_HANDLE };
    let Some(f) = f else { return INVALID_VALUE };
    let rc = queue::posted(st.device);
    if rc != SUCCESS {
        return rc;
    }
    let data = SendPtr(data);
    let work: Work = Box::new(move || {
        let data = data;
        // SAFETY: the caller's callback with the caller's argument.
        unsafe { f(data.0) };
        Ok(())
    });
    match queue::submit(&st, Submit { what: "cuLaunchHostFunc".into(), access: Vec::new(), deps: Vec::new(), work }) {
        Ok(_) => SUCCESS,
        Err(rc) => rc,
    }
}

#[no_mangle]
pub extern "C" fn cuEventCreate(out: *mut Handle, flags: c_uint) -> CUresult {
    if out.is_null() {
        return INVALID_VALUE;
    }
    let id = emu().next.fetch_add(1, Ordering::Relaxed);
    lock(&emu().events).insert(id, Event::new(current_device(), flags));
    write(out, id as Handle)
}

fn event(e: Handle) -> Option<Arc<Event>> {
    lock(&emu().events).get(&handle_id(e)).cloned()
}

#[no_mangle]
pub extern "C" fn cuEventRecord(e: Handle, s: Handle) -> CUresult {
    let Some(st) = queue::resolve(s) else { return INVALID_HANDLE };
    let Some(ev) = event(e) else { return INVALID_HANDLE };
    if st.device != ev.device {
        // An event records only on a stream of its own context.
        return fail(
            INVALID_HANDLE,
            format!("cuEventRecord of an event of device {} on a stream of device {}", ev.device, st.device),
        );
    }
    let rc = queue::posted(st.device);
    if rc != SUCCESS {
        return rc;
    }
    ev.record(&st)
}

#[no_mangle]
pub extern "C" fn cuEventRecordWithFlags(e: Handle, s: Handle, _flags: c_uint) -> CUresult {
    cuEventRecord(e, s)
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(e: Handle) -> CUresult {
    let Some(ev) = event(e) else { return INVALID_HANDLE };
    ev.synchronize();
    queue::sticky(ev.device)
}

/// `CUDA_ERROR_NOT_READY` while the work before the event's last record is pending.
#[no_mangle]
pub extern "C" fn cuEventQuery(e: Handle) -> CUresult {
    let Some(ev) = event(e) else { return INVALID_HANDLE };
    let rc = queue::sticky(ev.device);
    if rc != SUCCESS {
        return rc;
    }
    if ev.query() {
        queue::sticky(ev.device)
    } else {
        NOT_READY
    }
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(e: Handle) -> CUresult {
    if lock(&emu().events).remove(&handle_id(e)).is_some() {
        SUCCESS
    } else {
        INVALID_HANDLE
    }
}

/// Milliseconds between the times the stream workers reached the two
/// events: `CUDA_ERROR_NOT_READY` while either is pending,
/// `CUDA_ERROR_INVALID_HANDLE` for an event never recorded or created
/// with `CU_EVENT_DISABLE_TIMING`.
#[no_mangle]
pub extern "C" fn cuEventElapsedTime(ms: *mut f32, a: Handle, b: Handle) -> CUresult {
    let (Some(ea), Some(eb)) = (event(a), event(b)) else { return INVALID_HANDLE };
    if !ea.timing || !eb.timing || ea.target().is_none() || eb.target().is_none() {
        return INVALID_HANDLE;
    }
    let rc = queue::sticky(ea.device);
    if rc != SUCCESS {
        return rc;
    }
    if !ea.query() || !eb.query() {
        return NOT_READY;
    }
    match (ea.time(), eb.time()) {
        (Some(ta), Some(tb)) => {
            let d = if tb >= ta { (tb - ta).as_secs_f64() } else { -(ta - tb).as_secs_f64() };
            write(ms, (d * 1e3) as f32)
        }
        // Recorded after a fault: the worker skipped it.
        _ => queue::sticky(ea.device),
    }
}

#[no_mangle]
pub extern "C" fn cuEventElapsedTime_v2(ms: *mut f32, a: Handle, b: Handle) -> CUresult {
    cuEventElapsedTime(ms, a, b)
}
