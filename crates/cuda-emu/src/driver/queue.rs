//! Asynchronous streams: each stream is a queue of operations that a
//! worker thread of its own runs in order.
//!
//! A launch, asynchronous copy, memset, event record or host function is
//! submitted and the call returns; the worker runs it once the operations
//! it waits for have completed (those of `cuStreamWaitEvent`, and the
//! legacy stream's implicit ones). A kernel fault becomes the device's
//! sticky error, reported by the next synchronizing call on the context
//! (a synchronize, a query, a synchronous copy) and by every call after
//! that; calls that only queue work succeed until then (`posted`). With `TAPIR_CUDA_EMU_SYNC=1` every operation runs on the
//! calling thread before its call returns, and a fault comes back from
//! the call that submitted it (sticky all the same): for debugging.

use std::collections::VecDeque;
use std::sync::Condvar;
use std::time::Instant;

use super::hazard::{Access, Clock, Epoch};
use super::*;

/// `CU_STREAM_NON_BLOCKING`: no implicit ordering with the legacy stream.
pub const NON_BLOCKING: c_uint = 1;
/// `CU_EVENT_DISABLE_TIMING`.
pub const DISABLE_TIMING: c_uint = 2;
/// `CUDA_ERROR_NOT_READY`.
pub const NOT_READY: CUresult = 600;
/// What a stream-order hazard returns: `CUDA_ERROR_ILLEGAL_STATE`.
pub const HAZARD: CUresult = 401;

/// What an operation does on the worker.
pub type Work = Box<dyn FnOnce() -> Result<(), exec::Fault> + Send>;

struct Op {
    seq: u64,
    deps: Vec<(Arc<Stream>, u64)>,
    work: Work,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Op>,
    submitted: u64,
    completed: u64,
    worker: bool,
    closed: bool,
    /// The clock of the last operation submitted.
    clock: Clock,
}

/// A stream: its device, kind and queue.
pub struct Stream {
    pub id: usize,
    pub device: usize,
    /// The legacy (NULL) stream of its device.
    pub legacy: bool,
    /// Created with `CU_STREAM_NON_BLOCKING`.
    pub non_blocking: bool,
    state: Mutex<State>,
    cv: Condvar,
}

impl Stream {
    pub fn new(device: usize, legacy: bool, non_blocking: bool) -> Arc<Stream> {
        Arc::new(Stream {
            id: emu().next.fetch_add(1, Ordering::Relaxed),
            device,
            legacy,
            non_blocking,
            state: Mutex::default(),
            cv: Condvar::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// The sequence number of the last operation submitted, and its clock.
    pub fn last(&self) -> (u64, Clock) {
        let s = self.lock();
        (s.submitted, s.clock.clone())
    }

    /// Whether operation `seq` has completed.
    pub fn done(&self, seq: u64) -> bool {
        self.lock().completed >= seq
    }

    /// Waits until operation `seq` has completed.
    pub fn wait(&self, seq: u64) {
        let mut s = self.lock();
        while s.completed < seq {
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Lets the worker exit once the queue is empty (the stream was destroyed).
    pub fn close(&self) {
        self.lock().closed = true;
        self.cv.notify_all();
    }

    fn run(self: Arc<Stream>) {
        loop {
            let op = {
                let mut s = self.lock();
                loop {
                    if let Some(op) = s.queue.pop_front() {
                        break op;
                    }
                    if s.closed {
                        s.worker = false;
                        return;
                    }
                    s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
                }
            };
            self.execute(op);
        }
    }

    fn execute(&self, op: Op) {
        for (s, q) in &op.deps {
            s.wait(*q);
        }
        // After a fault the context runs nothing more, as on hardware.
        if lock(&emu().devices[self.device].sticky).is_none() {
            if let Err(f) = (op.work)() {
                set_sticky(self.device, f);
            }
        }
        let mut s = self.lock();
        s.completed = op.seq;
        drop(s);
        self.cv.notify_all();
    }
}

/// Records a fault as the device's sticky error (the first one stays) and
/// prints it, as compute-sanitizer does when it sees it.
fn set_sticky(device: usize, f: exec::Fault) {
    eprintln!("========= tapir-cuda-emu: {}", f.message);
    let mut s = lock(&emu().devices[device].sticky);
    if s.is_none() {
        *s = Some((f.code, f.message));
    }
}

/// The device's sticky error, if a fault has happened on it, as a
/// synchronizing call sees it: recorded as the calling thread's last
/// error, and from now on returned by every call ([`posted`] included).
pub fn sticky(device: usize) -> CUresult {
    match &*lock(&emu().devices[device].sticky) {
        Some((code, msg)) => {
            emu().devices[device].observed.store(true, std::sync::atomic::Ordering::SeqCst);
            LAST_ERROR.with(|e| *e.borrow_mut() = msg.clone());
            *code
        }
        None => SUCCESS,
    }
}

/// The sticky error as a call that only queues work sees it: once a
/// synchronizing call has returned the fault, else success (the work is
/// queued and discarded, the worker runs nothing after a fault). So a
/// fault surfaces at the next synchronize, stream or event query or
/// synchronous copy, however fast the worker reached it, as on hardware;
/// with `TAPIR_CUDA_EMU_SYNC=1` the submitting call returns it at once.
pub fn posted(device: usize) -> CUresult {
    if emu().devices[device].observed.load(std::sync::atomic::Ordering::SeqCst) {
        sticky(device)
    } else {
        SUCCESS
    }
}

/// The sticky error of the current context's device.
pub fn ctx_error() -> CUresult {
    sticky(current_device())
}

/// Whether operations run on the caller's thread (`TAPIR_CUDA_EMU_SYNC=1`).
pub fn synchronous() -> bool {
    static SYNC: OnceLock<bool> = OnceLock::new();
    *SYNC.get_or_init(|| std::env::var("TAPIR_CUDA_EMU_SYNC").is_ok_and(|v| v == "1"))
}

/// The legacy stream of device `d`.
pub fn legacy(d: usize) -> Arc<Stream> {
    emu().devices[d].legacy.get_or_init(|| Stream::new(d, true, false)).clone()
}

/// The stream of handle `s`: the null and legacy handles (and the
/// per-thread one, which the emulator treats as the legacy stream) are
/// the current device's legacy stream.
pub fn resolve(s: Handle) -> Option<Arc<Stream>> {
    let id = handle_id(s);
    if id <= 2 {
        return Some(legacy(current_device()));
    }
    lock(&emu().streams).get(&id).cloned()
}

/// The blocking streams of device `d`, and its legacy stream.
fn blocking_streams(d: usize) -> Vec<Arc<Stream>> {
    let mut v: Vec<_> = lock(&emu().streams).values().filter(|s| s.device == d && !s.non_blocking).cloned().collect();
    v.push(legacy(d));
    v
}

/// What to submit: a name for reports, the allocations it touches, the
/// operations it must wait for besides its stream's, and the work.
pub struct Submit {
    pub what: String,
    pub access: Vec<Access>,
    pub deps: Vec<(Arc<Stream>, u64, Clock)>,
    pub work: Work,
}

/// Submits an operation to stream `st`; returns its sequence number, or a
/// hazard's error (nothing submitted). In synchronous mode it has run,
/// and a fault is returned.
pub fn submit(st: &Arc<Stream>, mut op: Submit) -> Result<u64, CUresult> {
    // The legacy stream waits for every blocking stream's work, and is
    // waited for by each.
    let implicit: Vec<Arc<Stream>> = if st.legacy {
        blocking_streams(st.device).into_iter().filter(|s| !Arc::ptr_eq(s, st)).collect()
    } else if st.non_blocking {
        Vec::new()
    } else {
        vec![legacy(st.device)]
    };
    for s in implicit {
        let (q, c) = s.last();
        if q > 0 {
            op.deps.push((s, q, c));
        }
    }
    // What the worker must wait for: other streams' work not yet complete
    // (a stream's own earlier work is before it anyway). Checked before
    // this stream's lock is taken, as `done` takes the other's.
    let waits: Vec<(Arc<Stream>, u64)> = op
        .deps
        .iter()
        .filter(|(s, q, _)| !Arc::ptr_eq(s, st) && !s.done(*q))
        .map(|(s, q, _)| (s.clone(), *q))
        .collect();
    let e = emu();
    let mut state = st.lock();
    let seq = state.submitted + 1;
    let mut clock = state.clock.clone();
    {
        let mut t = lock(&e.tracker);
        clock.join(&t.host);
        for (_, _, c) in &op.deps {
            clock.join(c);
        }
        clock.raise(st.id, seq);
        if e.streamcheck && !op.access.is_empty() {
            let epoch = Epoch { stream: st.id, seq, what: op.what.into() };
            if let Err(msg) = t.access(&epoch, &clock, &op.access) {
                drop(t);
                drop(state);
                return Err(fail(HAZARD, msg));
            }
        }
    }
    state.submitted = seq;
    state.clock = clock;
    let item = Op { seq, deps: waits, work: op.work };
    if synchronous() {
        drop(state);
        st.execute(item);
        return match sticky(st.device) {
            SUCCESS => Ok(seq),
            code => Err(code),
        };
    }
    state.queue.push_back(item);
    if !state.worker {
        state.worker = true;
        let s = st.clone();
        let spawned = std::thread::Builder::new().name(format!("tapir-emu-stream-{:x}", st.id)).spawn(move || s.run());
        if spawned.is_err() {
            // No thread: run it here, as the synchronous mode does.
            state.worker = false;
            let item = state.queue.pop_back().expect("internal: just pushed");
            drop(state);
            st.execute(item);
            return Ok(seq);
        }
    }
    drop(state);
    st.cv.notify_all();
    Ok(seq)
}

/// Waits for stream `st`'s work submitted so far, then joins its clock
/// into the host's; returns the device's sticky error, if any.
pub fn synchronize(st: &Stream) -> CUresult {
    let (q, c) = st.last();
    st.wait(q);
    lock(&emu().tracker).host.join(&c);
    sticky(st.device)
}

/// Waits for all work of device `d`.
pub fn synchronize_device(d: usize) -> CUresult {
    let streams: Vec<_> = lock(&emu().streams).values().filter(|s| s.device == d).cloned().collect();
    for s in streams.iter().chain(std::iter::once(&legacy(d))) {
        synchronize(s);
    }
    sticky(d)
}

/// An event: where it was last recorded, and when its worker reached it.
pub struct Event {
    pub device: usize,
    pub timing: bool,
    state: Mutex<EventState>,
}

#[derive(Default)]
struct EventState {
    /// The stream and operation of the last record.
    rec: Option<(Arc<Stream>, u64)>,
    clock: Clock,
    time: Option<Instant>,
    generation: u64,
}

impl Event {
    pub fn new(device: usize, flags: c_uint) -> Arc<Event> {
        Arc::new(Event { device, timing: flags & DISABLE_TIMING == 0, state: Mutex::default() })
    }

    /// Records the event on `st`: it completes when the work submitted to
    /// `st` so far has, and takes the worker's time then.
    pub fn record(self: &Arc<Event>, st: &Arc<Stream>) -> CUresult {
        let generation = {
            let mut s = lock(&self.state);
            s.generation += 1;
            s.time = None;
            s.generation
        };
        let ev = self.clone();
        let work: Work = Box::new(move || {
            let mut s = lock(&ev.state);
            if s.generation == generation {
                s.time = Some(Instant::now());
            }
            Ok(())
        });
        let what = "cuEventRecord".to_string();
        match submit(st, Submit { what, access: Vec::new(), deps: Vec::new(), work }) {
            Ok(seq) => {
                let (_, clock) = st.last();
                let mut s = lock(&self.state);
                if s.generation == generation {
                    s.rec = Some((st.clone(), seq));
                    s.clock = clock;
                }
                SUCCESS
            }
            Err(rc) => rc,
        }
    }

    /// The stream and operation the event waits for, with its clock.
    pub fn target(&self) -> Option<(Arc<Stream>, u64, Clock)> {
        let s = lock(&self.state);
        s.rec.as_ref().map(|(st, q)| (st.clone(), *q, s.clock.clone()))
    }

    /// Whether the event has completed (an event never recorded has);
    /// when it has, the host has seen what happened before it.
    pub fn query(&self) -> bool {
        match self.target() {
            None => true,
            Some((st, q, c)) => {
                let done = st.done(q);
                if done {
                    lock(&emu().tracker).host.join(&c);
                }
                done
            }
        }
    }

    /// Waits for the event to complete.
    pub fn synchronize(&self) {
        if let Some((st, q, c)) = self.target() {
            st.wait(q);
            lock(&emu().tracker).host.join(&c);
        }
    }

    /// The worker's time at the event: None while pending or never recorded.
    pub fn time(&self) -> Option<Instant> {
        lock(&self.state).time
    }
}
