//! Asynchronous streams: pending work seen by queries, a fault reported at
//! the next synchronize and sticky after it, host functions on the
//! stream's worker, ordering by events and by the legacy stream, and the
//! sanitizer's stream-order hazards (cross-stream accesses and frees with
//! nothing ordering them).
//!
//! A stream is held back deterministically by a host function that waits
//! for the test to open a gate (with a time limit, so an emulator that
//! runs host functions inline, as a synchronous one does, fails the test
//! instead of hanging).

mod common;

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::CudaContext;

/// Hand-written kernels, so these tests need no NVRTC.
const PTX: &str = r#"
.version 8.8
.target sm_90
.address_size 64

// p[tid] = v
.visible .entry fill(.param .u64 p, .param .u32 v)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [p];
    ld.param.u32 %r1, [v];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r2, %tid.x;
    mul.wide.u32 %rd2, %r2, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r1;
    ret;
}

// dst[tid] = src[tid]
.visible .entry copy(.param .u64 dst, .param .u64 src)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [dst];
    ld.param.u64 %rd2, [src];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.u32 %r2, [%rd4];
    add.s64 %rd5, %rd1, %rd3;
    st.global.u32 [%rd5], %r2;
    ret;
}

// p[tid] counts up to n, one add at a time: a kernel that takes a while.
.visible .entry spin(.param .u64 p, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<5>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [p];
    ld.param.u32 %r1, [n];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r2, %tid.x;
    mul.wide.u32 %rd2, %r2, 4;
    add.s64 %rd3, %rd1, %rd2;
    mov.u32 %r3, 0;
$L_loop:
    add.u32 %r3, %r3, 1;
    setp.lt.u32 %p1, %r3, %r1;
    @%p1 bra $L_loop;
    st.global.u32 [%rd3], %r3;
    ret;
}
"#;

const N: usize = 32;

struct Dev {
    _ctx: Arc<CudaContext>,
    module: sys::CUmodule,
}

impl Dev {
    fn func(&self, name: &str) -> sys::CUfunction {
        let mut f = null_mut();
        let name = std::ffi::CString::new(name).unwrap();
        // SAFETY: a loaded module and a NUL-terminated name.
        check(unsafe { sys::cuModuleGetFunction(&mut f, self.module, name.as_ptr()) });
        f
    }
}

fn setup(test: &str) -> Option<Dev> {
    if !common::emulator_or_skip(test) {
        return None;
    }
    let ctx = CudaContext::new(0).unwrap();
    ctx.bind_to_thread().unwrap();
    let mut module = null_mut();
    let src = std::ffi::CString::new(PTX).unwrap();
    // SAFETY: NUL-terminated PTX text.
    check(unsafe { sys::cuModuleLoadData(&mut module, src.as_ptr().cast()) });
    Some(Dev { _ctx: ctx, module })
}

/// False (after saying why) in the synchronous mode (`TAPIR_CUDA_EMU_SYNC=1`),
/// where no work is ever pending: a test of pending work cannot run there.
fn asynchronous(test: &str) -> bool {
    let sync = std::env::var("TAPIR_CUDA_EMU_SYNC").as_deref() == Ok("1");
    if sync {
        println!("{test}: skipped, TAPIR_CUDA_EMU_SYNC=1 runs every operation before its call returns");
    }
    !sync
}

#[track_caller]
fn check(rc: CUresult) {
    assert_eq!(rc, CUresult::CUDA_SUCCESS, "{}", common::last_error());
}

fn stream(flags: u32) -> sys::CUstream {
    let mut s = null_mut();
    // SAFETY: an out-pointer.
    check(unsafe { sys::cuStreamCreate(&mut s, flags) });
    s
}

const NON_BLOCKING: u32 = 1;

fn alloc(bytes: usize) -> u64 {
    let mut p = 0;
    // SAFETY: an out-pointer.
    check(unsafe { sys::cuMemAlloc_v2(&mut p, bytes) });
    // SAFETY: a fresh allocation of `bytes` bytes.
    check(unsafe { sys::cuMemsetD8_v2(p, 0, bytes) });
    // SAFETY: plain synchronize.
    check(unsafe { sys::cuCtxSynchronize() });
    p
}

/// Launches `f` with one block of N threads and these arguments.
fn launch(f: sys::CUfunction, s: sys::CUstream, args: &mut [*mut c_void]) -> CUresult {
    // SAFETY: the arguments match the kernel's parameters (the callers').
    unsafe { sys::cuLaunchKernel(f, 1, 1, 1, N as u32, 1, 1, 0, s, args.as_mut_ptr(), null_mut()) }
}

fn read(p: u64) -> Vec<u32> {
    let mut v = vec![0u32; N];
    // SAFETY: N words at p.
    check(unsafe { sys::cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), p, N * 4) });
    v
}

/// A gate a stream's worker waits at, in a host function, until the test
/// opens it (or two seconds pass).
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
    log: Mutex<Vec<String>>,
}

impl Gate {
    fn new() -> Arc<Gate> {
        Arc::new(Gate { open: Mutex::new(false), cv: Condvar::new(), log: Mutex::default() })
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }

    fn log(&self, s: &str) {
        self.log.lock().unwrap().push(s.to_string());
    }
}

unsafe extern "C" fn wait_at_gate(data: *mut c_void) {
    // SAFETY: an Arc<Gate> the test keeps alive until the stream completes.
    let g = unsafe { &*data.cast::<Gate>() };
    g.log(&format!("gate on {:?}", std::thread::current().id()));
    let open = g.open.lock().unwrap();
    let (open, _) = g.cv.wait_timeout_while(open, Duration::from_secs(2), |o| !*o).unwrap();
    drop(open);
}

unsafe extern "C" fn log_callback(data: *mut c_void) {
    // SAFETY: as above.
    let g = unsafe { &*data.cast::<Gate>() };
    g.log("callback");
}

fn hold(s: sys::CUstream, g: &Arc<Gate>) {
    // SAFETY: the gate outlives the stream's work (each test synchronizes before dropping it).
    check(unsafe { sys::cuLaunchHostFunc(s, Some(wait_at_gate), Arc::as_ptr(g) as *mut c_void) });
}

fn query_event(e: sys::CUevent) -> CUresult {
    // SAFETY: a live event.
    unsafe { sys::cuEventQuery(e) }
}

fn query_stream(s: sys::CUstream) -> CUresult {
    // SAFETY: a live stream (or the legacy one).
    unsafe { sys::cuStreamQuery(s) }
}

#[test]
fn an_event_behind_a_long_kernel_is_pending_until_it_finishes() {
    let _d = common::shared_device();
    if !asynchronous("an_event_behind_a_long_kernel_is_pending_until_it_finishes") {
        return;
    }
    let Some(dev) = setup("an_event_behind_a_long_kernel_is_pending_until_it_finishes") else { return };
    let s = stream(NON_BLOCKING);
    let g = Gate::new();
    let mut p = alloc(N * 4);
    let mut n = 20_000u32;
    hold(s, &g);
    check(launch(dev.func("spin"), s, &mut [(&raw mut p).cast(), (&raw mut n).cast()]));
    let mut e = null_mut();
    // SAFETY: out-pointer; a live stream.
    unsafe {
        check(sys::cuEventCreate(&mut e, 0));
        check(sys::cuEventRecord(e, s));
    }
    assert_eq!(query_event(e), CUresult::CUDA_ERROR_NOT_READY, "the kernel behind the gate has not run");
    assert_eq!(query_stream(s), CUresult::CUDA_ERROR_NOT_READY);
    g.open();
    // SAFETY: a live event.
    check(unsafe { sys::cuEventSynchronize(e) });
    assert_eq!(query_event(e), CUresult::CUDA_SUCCESS);
    assert_eq!(query_stream(s), CUresult::CUDA_SUCCESS);
    assert_eq!(read(p), vec![n; N]);
    // SAFETY: live handles, no pending work.
    unsafe {
        check(sys::cuEventDestroy_v2(e));
        check(sys::cuStreamDestroy_v2(s));
        check(sys::cuMemFree_v2(p));
    }
}

#[test]
fn event_times_come_from_the_worker() {
    let _d = common::shared_device();
    let Some(_dev) = setup("event_times_come_from_the_worker") else { return };
    let s = stream(NON_BLOCKING);
    let (mut a, mut b) = (null_mut(), null_mut());
    unsafe extern "C" fn nap(_: *mut c_void) {
        std::thread::sleep(Duration::from_millis(30));
    }
    // SAFETY: live handles; the callback takes no data.
    unsafe {
        check(sys::cuEventCreate(&mut a, 0));
        check(sys::cuEventCreate(&mut b, 0));
        check(sys::cuEventRecord(a, s));
        check(sys::cuLaunchHostFunc(s, Some(nap), null_mut()));
        check(sys::cuEventRecord(b, s));
        check(sys::cuEventSynchronize(b));
        let mut ms = 0f32;
        check(sys::cuEventElapsedTime_v2(&mut ms, a, b));
        // A lower bound the sleep guarantees, not a speed.
        assert!(ms >= 29.0, "the worker slept 30 ms between the events, measured {ms} ms");
        check(sys::cuEventDestroy_v2(a));
        check(sys::cuEventDestroy_v2(b));
        check(sys::cuStreamDestroy_v2(s));
    }
}

#[test]
fn host_functions_run_on_the_worker_in_stream_order() {
    let _d = common::shared_device();
    if !asynchronous("host_functions_run_on_the_worker_in_stream_order") {
        return;
    }
    let Some(dev) = setup("host_functions_run_on_the_worker_in_stream_order") else { return };
    let s = stream(NON_BLOCKING);
    let g = Gate::new();
    let mut p = alloc(N * 4);
    let mut v = 7u32;
    hold(s, &g);
    check(launch(dev.func("fill"), s, &mut [(&raw mut p).cast(), (&raw mut v).cast()]));
    // SAFETY: the gate outlives the stream's work.
    check(unsafe { sys::cuLaunchHostFunc(s, Some(log_callback), Arc::as_ptr(&g) as *mut c_void) });
    g.log("returned");
    g.open();
    // SAFETY: a live stream.
    check(unsafe { sys::cuStreamSynchronize(s) });
    let log = g.log.lock().unwrap().clone();
    assert_eq!(log.len(), 3, "{log:?}");
    let order: Vec<&str> = log.iter().map(String::as_str).filter(|l| !l.starts_with("gate")).collect();
    assert_eq!(order, ["returned", "callback"], "the callback ran after the call returned: {log:?}");
    let me = format!("gate on {:?}", std::thread::current().id());
    assert!(log.iter().any(|l| l.starts_with("gate on")) && !log.contains(&me), "on the worker: {log:?}");
    assert_eq!(read(p), vec![7; N]);
    // SAFETY: live handles, no pending work.
    unsafe {
        check(sys::cuStreamDestroy_v2(s));
        check(sys::cuMemFree_v2(p));
    }
}

#[test]
fn a_stream_waiting_for_an_event_runs_after_it() {
    let _d = common::shared_device();
    if !asynchronous("a_stream_waiting_for_an_event_runs_after_it") {
        return;
    }
    let Some(dev) = setup("a_stream_waiting_for_an_event_runs_after_it") else { return };
    let (s1, s2) = (stream(NON_BLOCKING), stream(NON_BLOCKING));
    let g = Gate::new();
    let (mut src, mut dst) = (alloc(N * 4), alloc(N * 4));
    let mut v = 5u32;
    let mut e = null_mut();
    hold(s1, &g);
    check(launch(dev.func("fill"), s1, &mut [(&raw mut src).cast(), (&raw mut v).cast()]));
    // SAFETY: live handles.
    unsafe {
        check(sys::cuEventCreate(&mut e, 2));
        check(sys::cuEventRecord(e, s1));
        check(sys::cuStreamWaitEvent(s2, e, 0));
    }
    // Ordered by the event: no hazard, and the copy sees the fill.
    check(launch(dev.func("copy"), s2, &mut [(&raw mut dst).cast(), (&raw mut src).cast()]));
    assert_eq!(query_stream(s2), CUresult::CUDA_ERROR_NOT_READY, "s2 waits for s1, held at the gate");
    g.open();
    // SAFETY: a live stream.
    check(unsafe { sys::cuStreamSynchronize(s2) });
    assert_eq!(read(dst), vec![5; N]);
    // SAFETY: live handles, no pending work.
    unsafe {
        check(sys::cuEventDestroy_v2(e));
        check(sys::cuStreamDestroy_v2(s1));
        check(sys::cuStreamDestroy_v2(s2));
        check(sys::cuMemFree_v2(src));
        check(sys::cuMemFree_v2(dst));
    }
}

#[test]
fn the_legacy_stream_waits_for_blocking_streams_only() {
    let _d = common::shared_device();
    if !asynchronous("the_legacy_stream_waits_for_blocking_streams_only") {
        return;
    }
    let Some(dev) = setup("the_legacy_stream_waits_for_blocking_streams_only") else { return };
    let (blocking, non_blocking) = (stream(0), stream(NON_BLOCKING));
    let (g1, g2) = (Gate::new(), Gate::new());
    let mut p = alloc(N * 4);
    let mut v = 3u32;
    hold(non_blocking, &g1);
    // Nothing on the legacy stream waits for the non-blocking stream.
    check(launch(dev.func("fill"), null_mut(), &mut [(&raw mut p).cast(), (&raw mut v).cast()]));
    // SAFETY: the legacy stream.
    check(unsafe { sys::cuStreamSynchronize(null_mut()) });
    assert_eq!(query_stream(non_blocking), CUresult::CUDA_ERROR_NOT_READY);
    hold(blocking, &g2);
    // This launch waits for the blocking stream's gate.
    check(launch(dev.func("fill"), null_mut(), &mut [(&raw mut p).cast(), (&raw mut v).cast()]));
    assert_eq!(query_stream(null_mut()), CUresult::CUDA_ERROR_NOT_READY, "the legacy stream waits for `blocking`");
    g2.open();
    g1.open();
    // SAFETY: the context's streams.
    check(unsafe { sys::cuCtxSynchronize() });
    assert_eq!(query_stream(null_mut()), CUresult::CUDA_SUCCESS);
    // SAFETY: live handles, no pending work.
    unsafe {
        check(sys::cuStreamDestroy_v2(blocking));
        check(sys::cuStreamDestroy_v2(non_blocking));
        check(sys::cuMemFree_v2(p));
    }
}

#[test]
fn a_kernel_fault_is_reported_at_synchronize_and_is_sticky() {
    let _f = common::faulting();
    let Some(dev) = setup("a_kernel_fault_is_reported_at_synchronize_and_is_sticky") else { return };
    let s = stream(NON_BLOCKING);
    let mut v = 1u32;
    let mut bad = alloc(16); // 4 words for 32 threads: the fill writes past the end
    let rc = launch(dev.func("fill"), s, &mut [(&raw mut bad).cast(), (&raw mut v).cast()]);
    if std::env::var("TAPIR_CUDA_EMU_SYNC").as_deref() == Ok("1") {
        assert_eq!(rc, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, "the synchronous mode reports at the launch");
    } else {
        assert_eq!(rc, CUresult::CUDA_SUCCESS, "the launch returns before the kernel runs");
        // SAFETY: a live stream.
        let rc = unsafe { sys::cuStreamSynchronize(s) };
        assert_eq!(rc, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, "the fault is reported at the synchronize");
    }
    let msg = common::last_error();
    assert!(msg.contains("invalid __global__ write of size 4"), "{msg}");
    // Sticky: every later call on the context fails with it.
    let mut p = 0;
    // SAFETY: plain calls.
    unsafe {
        assert_eq!(sys::cuMemAlloc_v2(&mut p, 64), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
        assert_eq!(sys::cuCtxSynchronize(), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
        assert_eq!(sys::cuStreamSynchronize(null_mut()), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
        assert_eq!(sys::cuMemsetD8_v2(bad, 0, 16), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    }
    let mut good = 0u64;
    assert_eq!(
        launch(dev.func("fill"), s, &mut [(&raw mut good).cast(), (&raw mut v).cast()]),
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
    );
    // Until the context is reset.
    // SAFETY: plain calls on device 0.
    unsafe {
        check(sys::cuDevicePrimaryCtxReset_v2(0));
        check(sys::cuMemAlloc_v2(&mut p, 64));
        check(sys::cuMemFree_v2(p));
        check(sys::cuMemFree_v2(bad));
        check(sys::cuStreamDestroy_v2(s));
    }
}

#[test]
fn a_cross_stream_access_without_an_event_is_a_hazard() {
    let _d = common::alone();
    let Some(dev) = setup("a_cross_stream_access_without_an_event_is_a_hazard") else { return };
    let (s1, s2) = (stream(NON_BLOCKING), stream(NON_BLOCKING));
    let (mut a, mut b) = (alloc(N * 4), alloc(N * 4));
    let mut v = 9u32;
    check(launch(dev.func("fill"), s1, &mut [(&raw mut a).cast(), (&raw mut v).cast()]));
    // s2 reads what s1 writes, with no event between: reported, not run.
    let rc = launch(dev.func("copy"), s2, &mut [(&raw mut b).cast(), (&raw mut a).cast()]);
    assert_eq!(rc, CUresult::CUDA_ERROR_ILLEGAL_STATE);
    let msg = common::last_error();
    assert!(msg.contains("stream-order hazard"), "{msg}");
    assert!(msg.contains("the launch of copy") && msg.contains("the launch of fill"), "names both: {msg}");
    assert!(msg.contains(&format!("{a:#x}")), "names the allocation: {msg}");
    // Two streams reading the same buffer is no hazard.
    // SAFETY: a live stream.
    check(unsafe { sys::cuStreamSynchronize(s1) });
    let mut c = alloc(N * 4);
    check(launch(dev.func("copy"), s1, &mut [(&raw mut b).cast(), (&raw mut a).cast()]));
    check(launch(dev.func("copy"), s2, &mut [(&raw mut c).cast(), (&raw mut a).cast()]));
    // But writing what the other stream reads is, and a copy counts as well as a launch.
    let host = [0u32; N];
    // SAFETY: N words from a host buffer.
    let rc = unsafe { sys::cuMemcpyHtoDAsync_v2(a, host.as_ptr().cast(), N * 4, s2) };
    assert_eq!(rc, CUresult::CUDA_ERROR_ILLEGAL_STATE);
    let msg = common::last_error();
    assert!(msg.contains("cuMemcpyHtoDAsync") && msg.contains("reads"), "{msg}");
    // SAFETY: live handles.
    unsafe {
        check(sys::cuCtxSynchronize());
        check(sys::cuStreamDestroy_v2(s1));
        check(sys::cuStreamDestroy_v2(s2));
        for p in [a, b, c] {
            check(sys::cuMemFree_v2(p));
        }
    }
}

#[test]
fn freeing_memory_that_pending_work_uses_is_a_hazard() {
    let _d = common::alone();
    let Some(dev) = setup("freeing_memory_that_pending_work_uses_is_a_hazard") else { return };
    let (s1, s2) = (stream(NON_BLOCKING), stream(NON_BLOCKING));
    let g = Gate::new();
    let (mut a, mut b) = (alloc(N * 4), alloc(N * 4));
    let mut v = 4u32;
    hold(s1, &g);
    check(launch(dev.func("fill"), s1, &mut [(&raw mut a).cast(), (&raw mut v).cast()]));
    check(launch(dev.func("fill"), s1, &mut [(&raw mut b).cast(), (&raw mut v).cast()]));
    // SAFETY: the frees are what is tested; the emulator keeps the memory for the pending launches.
    unsafe {
        assert_eq!(sys::cuMemFree_v2(a), CUresult::CUDA_ERROR_ILLEGAL_STATE);
        let msg = common::last_error();
        assert!(msg.contains("cuMemFree") && msg.contains("the launch of fill"), "{msg}");
        assert_eq!(sys::cuMemFreeAsync(b, s2), CUresult::CUDA_ERROR_ILLEGAL_STATE);
        let msg = common::last_error();
        assert!(msg.contains("cuMemFreeAsync") && msg.contains("the launch of fill"), "{msg}");
    }
    g.open();
    // A free on the stream that used the memory is ordered after it.
    let mut c = alloc(N * 4);
    check(launch(dev.func("fill"), s1, &mut [(&raw mut c).cast(), (&raw mut v).cast()]));
    // SAFETY: live handles.
    unsafe {
        check(sys::cuMemFreeAsync(c, s1));
        check(sys::cuCtxSynchronize());
        check(sys::cuStreamDestroy_v2(s1));
        check(sys::cuStreamDestroy_v2(s2));
    }
}
