//! The NCCL half of tapir's emulated CUDA device: a stand-in for `libnccl`
//! whose collectives run among emulated devices, those of one process or
//! of several processes on one machine, for tests only. It is no NCCL: no
//! rings, trees or kernels, no network, and nothing of its speed means
//! anything.
//!
//! A communicator is one rank of a clique, made by `ncclCommInitAll` (every
//! rank at once, on the devices listed) or by `ncclCommInitRank` with the
//! id of `ncclGetUniqueId` (each rank on its own thread or in its own
//! process, on the current context's device; the call returns once every
//! rank has joined). The ranks of an id meet in a shared folder named by
//! the id (see `shared.rs`): the way processes of one machine share
//! memory, and how a job started by `mpirun` whose rank 0 made the id and
//! sent it to the others over MPI forms its clique. A
//! collective is submitted to the rank's stream through the driver
//! emulator's `tapirEmuSubmit` (found by the emulator's soname,
//! `libcuda.so`, which the selection switch has loaded): it runs in stream
//! order, after the kernels before it, and the buffers take part in the
//! emulator's stream-order hazard check. When it runs, the rank's worker
//! waits until every rank of the clique has reached the same collective
//! (the n-th of each rank is one operation); the last to arrive computes
//! the result from every rank's buffers (reductions in f64 for floats,
//! wrapping integer arithmetic for integers, ranks in order) and writes
//! every rank's output. Ranks that disagree on the operation, count,
//! dtype, reduction or root fail it on every rank, naming both; a rank
//! that never comes fails the others after `TAPIR_CUDA_EMU_NCCL_TIMEOUT`
//! seconds (default 300), as does `ncclCommAbort` of a rank with work
//! still queued, and a rank whose process has exited fails the others of
//! its id within a tenth of a second. A failure is the device's sticky error, as a kernel
//! fault is.
//!
//! `ncclGroupStart`/`ncclGroupEnd` defer the calls of the calling thread
//! until the outermost end, then submit them in order. Since submission
//! never blocks, one thread may drive every rank (as NCCL requires a group
//! for) with or without a group; under the emulator's synchronous mode
//! (`TAPIR_CUDA_EMU_SYNC=1`) it cannot, as each collective then waits on
//! the submitting thread.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]
#![allow(clippy::too_many_arguments)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

mod shared;
use shared::Shared;

type NcclResult = c_int;
const SUCCESS: NcclResult = 0;
const UNHANDLED_CUDA_ERROR: NcclResult = 1;
const SYSTEM_ERROR: NcclResult = 2;
const INTERNAL_ERROR: NcclResult = 3;
const INVALID_ARGUMENT: NcclResult = 4;
const INVALID_USAGE: NcclResult = 5;
const REMOTE_ERROR: NcclResult = 6;

/// NCCL 2.30.0 (`NCCL_VERSION_CODE`): the version of cudarc's bindings.
const VERSION: c_int = 23000;

/// `ncclUniqueId`, passed by value as C passes the struct.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    internal: [u8; 128],
}

/// The layout of the driver emulator's `TapirEmuRange`.
#[repr(C)]
struct Range {
    addr: u64,
    len: u64,
    write: c_int,
}

type HostWork = unsafe extern "C" fn(*mut c_void, *const *mut u8, *mut c_char, usize) -> c_int;
type SubmitFn =
    unsafe extern "C" fn(c_int, *mut c_void, *const c_char, *const Range, usize, Option<HostWork>, *mut c_void) -> u32;
type CtxGetDeviceFn = unsafe extern "C" fn(*mut c_int) -> u32;

/// The address of `name` in the loaded driver emulator, if it is loaded.
fn emulator_symbol(name: &CStr) -> Option<usize> {
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

fn submit_fn() -> Option<SubmitFn> {
    static F: OnceLock<Option<usize>> = OnceLock::new();
    // SAFETY: the address of tapirEmuSubmit, whose signature this is.
    F.get_or_init(|| emulator_symbol(c"tapirEmuSubmit")).map(|a| unsafe { std::mem::transmute::<usize, SubmitFn>(a) })
}

/// The device of the calling thread's current context.
fn current_device() -> Option<c_int> {
    static F: OnceLock<Option<usize>> = OnceLock::new();
    let f = (*F.get_or_init(|| emulator_symbol(c"cuCtxGetDevice")))?;
    // SAFETY: the address of cuCtxGetDevice.
    let f = unsafe { std::mem::transmute::<usize, CtxGetDeviceFn>(f) };
    let mut d = 0;
    // SAFETY: a valid out-pointer.
    (unsafe { f(&mut d) } == 0).then_some(d)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
    /// Open groups of this thread, and the calls deferred until the last ends.
    static GROUP: RefCell<(usize, Vec<Pending>)> = const { RefCell::new((0, Vec::new())) };
}

/// Records `msg` as this thread's last error (`ncclGetLastError`) and
/// returns `code`.
fn fail(code: NcclResult, msg: impl Into<String>) -> NcclResult {
    let msg = msg.into();
    eprintln!("tapir-cuda-emu-nccl: {msg}");
    LAST_ERROR.with(|e| *e.borrow_mut() = msg);
    code
}

/// How long a rank waits for the others at a collective or at init.
fn timeout() -> Duration {
    static T: OnceLock<Duration> = OnceLock::new();
    *T.get_or_init(|| {
        let s = std::env::var("TAPIR_CUDA_EMU_NCCL_TIMEOUT").ok().and_then(|v| v.parse::<f64>().ok());
        Duration::from_secs_f64(s.filter(|s| *s > 0.0).unwrap_or(300.0))
    })
}

// ---------------------------------------------------------------- types

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DType {
    I8,
    U8,
    I32,
    U32,
    I64,
    U64,
    F16,
    F32,
    F64,
    BF16,
}

impl DType {
    fn from_raw(v: c_int) -> Option<DType> {
        Some(match v {
            0 => DType::I8,
            1 => DType::U8,
            2 => DType::I32,
            3 => DType::U32,
            4 => DType::I64,
            5 => DType::U64,
            6 => DType::F16,
            7 => DType::F32,
            8 => DType::F64,
            9 => DType::BF16,
            _ => return None,
        })
    }

    fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
        }
    }

    fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::F32 | DType::F64 | DType::BF16)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RedOp {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
}

impl RedOp {
    fn from_raw(v: c_int) -> Option<RedOp> {
        Some(match v {
            0 => RedOp::Sum,
            1 => RedOp::Prod,
            2 => RedOp::Max,
            3 => RedOp::Min,
            4 => RedOp::Avg,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "ncclAllReduce",
            Kind::Broadcast => "ncclBroadcast",
            Kind::Reduce => "ncclReduce",
            Kind::AllGather => "ncclAllGather",
            Kind::ReduceScatter => "ncclReduceScatter",
        }
    }
}

/// What every rank must agree on for one collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Desc {
    kind: Kind,
    /// Elements: per rank's send for all-gather, per rank's receive for
    /// reduce-scatter, the buffer's otherwise.
    count: usize,
    dtype: DType,
    op: Option<RedOp>,
    root: Option<usize>,
}

impl std::fmt::Display for Desc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of {} {:?}", self.kind.name(), self.count, self.dtype)?;
        if let Some(op) = self.op {
            write!(f, " ({op:?})")?;
        }
        if let Some(r) = self.root {
            write!(f, " from root {r}")?;
        }
        Ok(())
    }
}

// --------------------------------------------------------- the cliques

/// One rank's buffers at a collective, as host addresses.
#[derive(Clone, Copy)]
struct Part {
    send: *const u8,
    recv: *mut u8,
}

/// One collective while its ranks arrive.
struct Slot {
    desc: Desc,
    parts: Vec<Option<Part>>,
    arrived: usize,
    left: usize,
    done: bool,
    error: Option<String>,
}

#[derive(Default)]
struct CliqueState {
    slots: HashMap<u64, Slot>,
    /// Why the clique can run nothing more (a timeout, an abort).
    broken: Option<String>,
}

/// The ranks of one communicator.
struct Clique {
    nranks: usize,
    state: Mutex<CliqueState>,
    cv: Condvar,
}

// SAFETY: the raw pointers in the slots are host addresses of device
// memory that the submitting ranks' work keeps alive while they wait at
// the slot; they are only read and written under the clique's lock.
unsafe impl Send for Clique {}
// SAFETY: as above.
unsafe impl Sync for Clique {}

/// How a rank reaches the others of its clique.
#[derive(Clone)]
enum Link {
    /// Ranks of this process (`ncclCommInitAll`), meeting in memory.
    Local(Arc<Clique>),
    /// Ranks of an id (`ncclCommInitRank`), in this process or others,
    /// meeting in a shared folder.
    Shared(Arc<Shared>),
}

impl Link {
    fn nranks(&self) -> usize {
        match self {
            Link::Local(c) => c.nranks,
            Link::Shared(s) => s.nranks,
        }
    }

    /// Why the clique can run nothing more, if it cannot.
    fn broken(&self) -> Option<String> {
        match self {
            Link::Local(c) => lock(&c.state).broken.clone(),
            Link::Shared(s) => s.broken(),
        }
    }
}

/// A communicator: one rank of a clique (`ncclComm_t` points to one).
struct Comm {
    link: Link,
    rank: usize,
    device: c_int,
    /// Collectives issued by the host, and run by the worker.
    issued: AtomicU64,
    finished: Arc<AtomicU64>,
    destroyed: AtomicBool,
}

fn new_clique(nranks: usize) -> Arc<Clique> {
    Arc::new(Clique { nranks, state: Mutex::new(CliqueState::default()), cv: Condvar::new() })
}

fn new_comm(link: Link, rank: usize, device: c_int) -> *mut c_void {
    let comm = Comm {
        link,
        rank,
        device,
        issued: AtomicU64::new(0),
        finished: Arc::new(AtomicU64::new(0)),
        destroyed: AtomicBool::new(false),
    };
    Box::into_raw(Box::new(comm)).cast()
}

/// The communicator behind a handle.
///
/// # Safety
/// `comm` is null or a handle this library made and not yet destroyed.
unsafe fn comm_ref<'a>(comm: *mut c_void) -> Option<&'a Comm> {
    // SAFETY: the caller's contract.
    unsafe { comm.cast::<Comm>().as_ref() }
}

// ------------------------------------------------------ the entry points

#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> NcclResult {
    if version.is_null() {
        return fail(INVALID_ARGUMENT, "ncclGetVersion: null version pointer");
    }
    // SAFETY: checked non-null; the caller's out-pointer.
    unsafe { *version = VERSION };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: NcclResult) -> *const c_char {
    let s: &'static CStr = match result {
        SUCCESS => c"no error",
        UNHANDLED_CUDA_ERROR => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        SYSTEM_ERROR => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        INTERNAL_ERROR => c"internal error - please report this issue to the NCCL developers",
        INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        REMOTE_ERROR => c"remote process exited or there was a network error",
        7 => c"NCCL operation in progress",
        _ => c"unknown result code",
    };
    s.as_ptr()
}

#[no_mangle]
pub extern "C" fn ncclGetLastError(_comm: *mut c_void) -> *const c_char {
    thread_local! {
        static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    let msg = LAST_ERROR.with(|e| e.borrow().clone());
    BUF.with(|b| {
        let mut b = b.borrow_mut();
        *b = msg.into_bytes();
        b.retain(|&c| c != 0);
        b.push(0);
        b.as_ptr().cast()
    })
}

/// An id: a tag, this process, a counter and the clock, so ids never
/// repeat within a process, nor across the processes of a machine.
#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(id: *mut UniqueId) -> NcclResult {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    if id.is_null() {
        return fail(INVALID_ARGUMENT, "ncclGetUniqueId: null id pointer");
    }
    let mut bytes = [0u8; 128];
    bytes[..8].copy_from_slice(b"tapiremu");
    bytes[8..16].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
    bytes[16..24].copy_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    bytes[24..32].copy_from_slice(&now.to_le_bytes());
    // SAFETY: checked non-null; 128 bytes, ncclUniqueId's size.
    unsafe { *id = UniqueId { internal: bytes } };
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(comms: *mut *mut c_void, ndev: c_int, devlist: *const c_int) -> NcclResult {
    if comms.is_null() || ndev <= 0 {
        return fail(INVALID_ARGUMENT, format!("ncclCommInitAll: {ndev} devices, or a null output array"));
    }
    if submit_fn().is_none() {
        return fail(SYSTEM_ERROR, "the driver emulator (libcuda.so with tapirEmuSubmit) is not loaded");
    }
    let n = ndev as usize;
    let devices: Vec<c_int> = if devlist.is_null() {
        (0..ndev).collect()
    } else {
        // SAFETY: the caller's list of `ndev` devices.
        unsafe { std::slice::from_raw_parts(devlist, n) }.to_vec()
    };
    let clique = new_clique(n);
    for (rank, &d) in devices.iter().enumerate() {
        // SAFETY: the caller's array of `ndev` handles.
        unsafe { *comms.add(rank) = new_comm(Link::Local(clique.clone()), rank, d) };
    }
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut *mut c_void,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
) -> NcclResult {
    if comm.is_null() || nranks <= 0 || rank < 0 || rank >= nranks {
        return fail(INVALID_ARGUMENT, format!("ncclCommInitRank: rank {rank} of {nranks}, or a null output"));
    }
    if submit_fn().is_none() {
        return fail(SYSTEM_ERROR, "the driver emulator (libcuda.so with tapirEmuSubmit) is not loaded");
    }
    let Some(device) = current_device() else {
        return fail(UNHANDLED_CUDA_ERROR, "ncclCommInitRank: no current CUDA context on this thread");
    };
    let (n, r) = (nranks as usize, rank as usize);
    let link = match Shared::join(&id.internal, n, r, timeout()) {
        Ok(shared) => Link::Shared(Arc::new(shared)),
        Err(m) => return fail(if m.contains("never joined") { REMOTE_ERROR } else { INVALID_ARGUMENT }, m),
    };
    // SAFETY: checked non-null; the caller's out-pointer.
    unsafe { *comm = new_comm(link, r, device) };
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut *mut c_void,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    _config: *mut c_void,
) -> NcclResult {
    // SAFETY: forwarded contract (the configuration only tunes real NCCL).
    unsafe { ncclCommInitRank(comm, nranks, id, rank) }
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommFinalize(comm: *mut c_void) -> NcclResult {
    // SAFETY: the caller's handle.
    match unsafe { comm_ref(comm) } {
        Some(_) => SUCCESS,
        None => fail(INVALID_ARGUMENT, "ncclCommFinalize: null communicator"),
    }
}

/// Frees a communicator; work already submitted keeps what it needs.
unsafe fn release(comm: *mut c_void) {
    // SAFETY: made by `new_comm`, released once (the caller's contract).
    let c = unsafe { Box::from_raw(comm.cast::<Comm>()) };
    c.destroyed.store(true, Ordering::Relaxed);
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommDestroy(comm: *mut c_void) -> NcclResult {
    if comm.is_null() {
        return fail(INVALID_ARGUMENT, "ncclCommDestroy: null communicator");
    }
    // SAFETY: the caller's handle, destroyed once.
    unsafe { release(comm) };
    SUCCESS
}

/// Frees the communicator; when it still has collectives queued, the
/// clique is broken, so every rank waiting at one fails now instead of
/// waiting for a rank that will never come.
#[no_mangle]
pub unsafe extern "C" fn ncclCommAbort(comm: *mut c_void) -> NcclResult {
    // SAFETY: the caller's handle.
    let Some(c) = (unsafe { comm_ref(comm) }) else {
        return fail(INVALID_ARGUMENT, "ncclCommAbort: null communicator");
    };
    if c.issued.load(Ordering::Acquire) > c.finished.load(Ordering::Acquire) {
        let why = format!("rank {} aborted the communicator", c.rank);
        match &c.link {
            Link::Local(clique) => {
                lock(&clique.state).broken.get_or_insert(why);
                clique.cv.notify_all();
            }
            Link::Shared(shared) => shared.break_with(&why),
        }
    }
    // SAFETY: the caller's handle, aborted once.
    unsafe { release(comm) };
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(comm: *mut c_void, err: *mut NcclResult) -> NcclResult {
    // SAFETY: the caller's handle.
    let Some(c) = (unsafe { comm_ref(comm) }) else {
        return fail(INVALID_ARGUMENT, "ncclCommGetAsyncError: null communicator");
    };
    if err.is_null() {
        return fail(INVALID_ARGUMENT, "ncclCommGetAsyncError: null output");
    }
    let broken = c.link.broken().is_some();
    // SAFETY: checked non-null.
    unsafe { *err = if broken { REMOTE_ERROR } else { SUCCESS } };
    SUCCESS
}

/// Writes one of the communicator's numbers through `out`.
unsafe fn comm_query(comm: *mut c_void, out: *mut c_int, what: &str, f: impl Fn(&Comm) -> c_int) -> NcclResult {
    // SAFETY: the caller's handle.
    let Some(c) = (unsafe { comm_ref(comm) }) else {
        return fail(INVALID_ARGUMENT, format!("{what}: null communicator"));
    };
    if out.is_null() {
        return fail(INVALID_ARGUMENT, format!("{what}: null output"));
    }
    // SAFETY: checked non-null.
    unsafe { *out = f(c) };
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(comm: *mut c_void, count: *mut c_int) -> NcclResult {
    // SAFETY: forwarded contract.
    unsafe { comm_query(comm, count, "ncclCommCount", |c| c.link.nranks() as c_int) }
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(comm: *mut c_void, device: *mut c_int) -> NcclResult {
    // SAFETY: forwarded contract.
    unsafe { comm_query(comm, device, "ncclCommCuDevice", |c| c.device) }
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(comm: *mut c_void, rank: *mut c_int) -> NcclResult {
    // SAFETY: forwarded contract.
    unsafe { comm_query(comm, rank, "ncclCommUserRank", |c| c.rank as c_int) }
}

#[no_mangle]
pub extern "C" fn ncclGroupStart() -> NcclResult {
    GROUP.with(|g| g.borrow_mut().0 += 1);
    SUCCESS
}

#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> NcclResult {
    let deferred = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 == 0 {
            return None;
        }
        g.0 -= 1;
        Some(if g.0 == 0 { std::mem::take(&mut g.1) } else { Vec::new() })
    });
    let Some(deferred) = deferred else { return fail(INVALID_USAGE, "ncclGroupEnd without ncclGroupStart") };
    let mut rc = SUCCESS;
    for p in deferred {
        let r = p.submit();
        if rc == SUCCESS {
            rc = r;
        }
    }
    rc
}

/// What the emulator does not provide: an error naming the call.
fn unsupported(what: &str) -> NcclResult {
    fail(INVALID_USAGE, format!("{what} is not emulated (tapir's NCCL stand-in has the collectives only)"))
}

#[no_mangle]
pub extern "C" fn ncclSend(
    _: *const c_void,
    _: usize,
    _: c_int,
    _: c_int,
    _: *mut c_void,
    _: *mut c_void,
) -> NcclResult {
    unsupported("ncclSend")
}

#[no_mangle]
pub extern "C" fn ncclRecv(_: *mut c_void, _: usize, _: c_int, _: c_int, _: *mut c_void, _: *mut c_void) -> NcclResult {
    unsupported("ncclRecv")
}

#[no_mangle]
pub extern "C" fn ncclRedOpCreatePreMulSum(
    _: *mut c_int,
    _: *mut c_void,
    _: c_int,
    _: c_int,
    _: *mut c_void,
) -> NcclResult {
    unsupported("ncclRedOpCreatePreMulSum")
}

#[no_mangle]
pub extern "C" fn ncclRedOpDestroy(_: c_int, _: *mut c_void) -> NcclResult {
    unsupported("ncclRedOpDestroy")
}

#[no_mangle]
pub extern "C" fn ncclCommSplit(_: *mut c_void, _: c_int, _: c_int, _: *mut *mut c_void, _: *mut c_void) -> NcclResult {
    unsupported("ncclCommSplit")
}

#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    comm: *mut c_void,
    stream: *mut c_void,
) -> NcclResult {
    // SAFETY: forwarded contract.
    unsafe { collective(Kind::AllReduce, send, recv, count, dtype, Some(op), None, comm, stream) }
}

#[no_mangle]
pub unsafe extern "C" fn ncclBroadcast(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
    comm: *mut c_void,
    stream: *mut c_void,
) -> NcclResult {
    // SAFETY: forwarded contract.
    unsafe { collective(Kind::Broadcast, send, recv, count, dtype, None, Some(root), comm, stream) }
}

#[no_mangle]
pub unsafe extern "C" fn ncclBcast(
    buf: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
    comm: *mut c_void,
    stream: *mut c_void,
) -> NcclResult {
    // SAFETY: forwarded contract.
    unsafe { collective(Kind::Broadcast, buf, buf, count, dtype, None, Some(root), comm, stream) }
}

#[no_mangle]
pub unsafe extern "C" fn ncclReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    root: c_int,
    comm: *mut c_void,
    stream: *mut c_void,
) -> NcclResult {
    // SAFETY: forwarded contract.
    unsafe { collective(Kind::Reduce, send, recv, count, dtype, Some(op), Some(root), comm, stream) }
}

#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(
    send: *const c_void,
    recv: *mut c_void,
    sendcount: usize,
    dtype: c_int,
    comm: *mut c_void,
    stream: *mut c_void,
) -> NcclResult {
    // SAFETY: forwarded contract.
    unsafe { collective(Kind::AllGather, send, recv, sendcount, dtype, None, None, comm, stream) }
}

#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatter(
    send: *const c_void,
    recv: *mut c_void,
    recvcount: usize,
    dtype: c_int,
    op: c_int,
    comm: *mut c_void,
    stream: *mut c_void,
) -> NcclResult {
    // SAFETY: forwarded contract.
    unsafe { collective(Kind::ReduceScatter, send, recv, recvcount, dtype, Some(op), None, comm, stream) }
}

// ------------------------------------------------------ the collectives

/// One rank's collective, checked, waiting to be submitted.
struct Pending {
    link: Link,
    finished: Arc<AtomicU64>,
    rank: usize,
    device: c_int,
    stream: usize,
    seq: u64,
    desc: Desc,
    /// Device addresses and byte lengths (0: absent on this rank).
    send: (u64, u64),
    recv: (u64, u64),
}

/// Checks a call and submits it (or defers it to the group's end).
unsafe fn collective(
    kind: Kind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: Option<c_int>,
    root: Option<c_int>,
    comm: *mut c_void,
    stream: *mut c_void,
) -> NcclResult {
    let name = kind.name();
    // SAFETY: the caller's handle.
    let Some(c) = (unsafe { comm_ref(comm) }) else {
        return fail(INVALID_ARGUMENT, format!("{name}: null communicator"));
    };
    let Some(dt) = DType::from_raw(dtype) else {
        return fail(INVALID_ARGUMENT, format!("{name}: data type {dtype} is not emulated (the fp8 types are not)"));
    };
    let op = match op.map(|o| (o, RedOp::from_raw(o))) {
        None => None,
        Some((_, Some(o))) => Some(o),
        Some((o, None)) => {
            return fail(INVALID_ARGUMENT, format!("{name}: reduction {o} (only sum, prod, max, min, avg)"))
        }
    };
    let n = c.link.nranks();
    let root = match root {
        None => None,
        Some(r) if r >= 0 && (r as usize) < n => Some(r as usize),
        Some(r) => return fail(INVALID_ARGUMENT, format!("{name}: root {r} in a communicator of {n} ranks")),
    };
    let es = dt.size() as u64;
    let c64 = count as u64;
    let (send_len, recv_len) = match kind {
        Kind::AllReduce => (c64 * es, c64 * es),
        Kind::Broadcast => (if root == Some(c.rank) { c64 * es } else { 0 }, c64 * es),
        Kind::Reduce => (c64 * es, if root == Some(c.rank) { c64 * es } else { 0 }),
        Kind::AllGather => (c64 * es, c64 * es * n as u64),
        Kind::ReduceScatter => (c64 * es * n as u64, c64 * es),
    };
    if (send_len > 0 && send.is_null()) || (recv_len > 0 && recv.is_null()) {
        return fail(INVALID_ARGUMENT, format!("{name}: a null buffer on rank {}", c.rank));
    }
    let seq = c.issued.fetch_add(1, Ordering::AcqRel);
    let p = Pending {
        link: c.link.clone(),
        finished: c.finished.clone(),
        rank: c.rank,
        device: c.device,
        stream: stream as usize,
        seq,
        desc: Desc { kind, count, dtype: dt, op, root },
        send: (send as u64, send_len),
        recv: (recv as u64, recv_len),
    };
    let deferred = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 > 0 {
            g.1.push(p);
            None
        } else {
            Some(p)
        }
    });
    match deferred {
        Some(p) => p.submit(),
        None => SUCCESS,
    }
}

impl Pending {
    /// Submits the collective to the rank's stream.
    fn submit(self) -> NcclResult {
        let Some(submit) = submit_fn() else {
            return fail(SYSTEM_ERROR, "the driver emulator (libcuda.so with tapirEmuSubmit) is not loaded");
        };
        let mut ranges = Vec::new();
        if self.send.1 > 0 {
            ranges.push(Range { addr: self.send.0, len: self.send.1, write: 0 });
        }
        if self.recv.1 > 0 {
            ranges.push(Range { addr: self.recv.0, len: self.recv.1, write: 1 });
        }
        let what = std::ffi::CString::new(format!("{} (rank {})", self.desc.kind.name(), self.rank))
            .expect("internal: no NUL in a name");
        let (device, stream, name) = (self.device, self.stream, self.desc.kind.name());
        let data = Box::into_raw(Box::new(self));
        // SAFETY: the emulator's entry point; `data` is handed to `run` once.
        let rc = unsafe {
            submit(device, stream as *mut c_void, what.as_ptr(), ranges.as_ptr(), ranges.len(), Some(run), data.cast())
        };
        if rc != 0 {
            // SAFETY: not submitted, so still ours.
            drop(unsafe { Box::from_raw(data) });
            return fail(UNHANDLED_CUDA_ERROR, format!("{name}: the emulated driver refused the work (CUresult {rc})"));
        }
        SUCCESS
    }
}

/// Writes `msg` into the emulator's message buffer.
unsafe fn write_msg(buf: *mut c_char, len: usize, msg: &str) {
    if buf.is_null() || len == 0 {
        return;
    }
    let n = msg.len().min(len - 1);
    // SAFETY: the emulator's buffer of `len` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
}

/// The collective on the rank's stream worker.
unsafe extern "C" fn run(data: *mut c_void, ptrs: *const *mut u8, msg: *mut c_char, msg_len: usize) -> c_int {
    // SAFETY: made by `Pending::submit` for this call.
    let p = unsafe { Box::from_raw(data.cast::<Pending>()) };
    let mut k = 0;
    let mut next = |present: bool| {
        if !present {
            return std::ptr::null_mut();
        }
        // SAFETY: one host address for each range submitted, in order.
        let q = unsafe { *ptrs.add(k) };
        k += 1;
        q
    };
    let part = Part { send: next(p.send.1 > 0), recv: next(p.recv.1 > 0) };
    let out = rendezvous(&p, part);
    p.finished.fetch_add(1, Ordering::AcqRel);
    match out {
        Ok(()) => 0,
        Err(m) => {
            // SAFETY: the emulator's buffer.
            unsafe { write_msg(msg, msg_len, &m) };
            1
        }
    }
}

/// Runs the collective with the other ranks of the clique.
fn rendezvous(p: &Pending, part: Part) -> Result<(), String> {
    match &p.link {
        Link::Local(c) => rendezvous_local(c, p, part),
        Link::Shared(s) => rendezvous_shared(s, p, part),
    }
}

/// Publishes this rank's input in the clique's folder, reads every rank's,
/// and computes this rank's output (every rank the same arithmetic in the
/// same order, so every rank gets the same result).
fn rendezvous_shared(s: &Shared, p: &Pending, part: Part) -> Result<(), String> {
    let input: &[u8] = if part.send.is_null() {
        &[]
    } else {
        // SAFETY: the host address of the checked send range, live while
        // this work runs.
        unsafe { std::slice::from_raw_parts(part.send, p.send.1 as usize) }
    };
    let what = p.desc.to_string();
    let all = s.exchange(p.seq, &what, input, timeout())?;
    if let Some((r, (other, _))) = all.iter().enumerate().find(|(_, (d, _))| *d != all[0].0) {
        return Err(format!(
            "collective {} of the communicator differs between ranks: rank {r} called {other}, rank 0 {}",
            p.seq + 1,
            all[0].0
        ));
    }
    for (r, (_, bytes)) in all.iter().enumerate() {
        let want = input_len(&p.desc, r, s.nranks);
        if bytes.len() != want {
            return Err(format!("rank {r} gave {} bytes to {what}, which needs {want}", bytes.len()));
        }
    }
    let parts: Vec<Part> = all
        .iter()
        .enumerate()
        .map(|(r, (_, bytes))| Part {
            send: if bytes.is_empty() { std::ptr::null() } else { bytes.as_ptr() },
            recv: if r == s.rank { part.recv } else { std::ptr::null_mut() },
        })
        .collect();
    // SAFETY: every input is as long as the collective reads (checked
    // above); this rank's output is its checked receive range, the others
    // are null and skipped.
    unsafe { compute(&p.desc, &parts) };
    Ok(())
}

/// The bytes rank `rank` sends to a collective of `nranks`.
fn input_len(desc: &Desc, rank: usize, nranks: usize) -> usize {
    let bytes = desc.count * desc.dtype.size();
    match desc.kind {
        Kind::AllReduce | Kind::Reduce | Kind::AllGather => bytes,
        Kind::Broadcast => {
            if desc.root == Some(rank) {
                bytes
            } else {
                0
            }
        }
        Kind::ReduceScatter => bytes * nranks,
    }
}

/// Waits at the collective's slot until every rank has arrived; the last
/// one computes it.
fn rendezvous_local(c: &Clique, p: &Pending, part: Part) -> Result<(), String> {
    let n = c.nranks;
    let mut s = lock(&c.state);
    if let Some(why) = &s.broken {
        return Err(format!("the communicator is broken: {why}"));
    }
    let slot = s.slots.entry(p.seq).or_insert_with(|| Slot {
        desc: p.desc,
        parts: vec![None; n],
        arrived: 0,
        left: 0,
        done: false,
        error: None,
    });
    if slot.desc != p.desc && slot.error.is_none() {
        slot.error = Some(format!(
            "collective {} of the communicator differs between ranks: rank {} called {}, another rank {}",
            p.seq + 1,
            p.rank,
            p.desc,
            slot.desc
        ));
    }
    slot.parts[p.rank] = Some(part);
    slot.arrived += 1;
    if slot.arrived == n {
        if slot.error.is_none() {
            let parts: Vec<Part> = slot.parts.iter().map(|q| q.expect("internal: every rank arrived")).collect();
            // SAFETY: every rank's buffers are live (their work waits here)
            // and as long as the checked ranges.
            unsafe { compute(&slot.desc, &parts) };
        }
        slot.done = true;
        c.cv.notify_all();
    } else {
        let start = Instant::now();
        loop {
            let slot = s.slots.get(&p.seq).expect("internal: the slot lives until every rank left");
            if slot.done {
                break;
            }
            if let Some(why) = s.broken.clone() {
                let slot = s.slots.get_mut(&p.seq).expect("internal: the slot");
                slot.error.get_or_insert(format!("the communicator is broken: {why}"));
                slot.done = true;
                c.cv.notify_all();
                break;
            }
            let left = timeout().saturating_sub(start.elapsed());
            if left.is_zero() {
                let missing: Vec<usize> =
                    slot.parts.iter().enumerate().filter(|(_, q)| q.is_none()).map(|(r, _)| r).collect();
                let why = format!(
                    "rank {} waited {:?} at {} for ranks {missing:?}, which never came",
                    p.rank,
                    timeout(),
                    p.desc
                );
                s.broken = Some(why.clone());
                let slot = s.slots.get_mut(&p.seq).expect("internal: the slot");
                slot.error = Some(why);
                slot.done = true;
                c.cv.notify_all();
                break;
            }
            s = c.cv.wait_timeout(s, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
    let slot = s.slots.get_mut(&p.seq).expect("internal: the slot");
    // A rank's buffers must not be touched once it has left.
    slot.parts[p.rank] = None;
    slot.left += 1;
    let error = slot.error.clone();
    if slot.left == slot.arrived && slot.done && slot.arrived == n {
        s.slots.remove(&p.seq);
    }
    match error {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

// ---------------------------------------------------------- arithmetic

/// Element `i` of `p` as f64 (floats).
///
/// # Safety
/// `p` holds at least `i + 1` elements of `dt`.
unsafe fn load_f(dt: DType, p: *const u8, i: usize) -> f64 {
    // SAFETY: the caller's contract; unaligned reads of plain numbers.
    unsafe {
        match dt {
            DType::F16 => half::f16::from_bits(p.cast::<u16>().add(i).read_unaligned()).to_f64(),
            DType::BF16 => half::bf16::from_bits(p.cast::<u16>().add(i).read_unaligned()).to_f64(),
            DType::F32 => f64::from(p.cast::<f32>().add(i).read_unaligned()),
            _ => p.cast::<f64>().add(i).read_unaligned(),
        }
    }
}

/// Stores `v` rounded to `dt` as element `i` of `p` (floats).
///
/// # Safety
/// `p` holds at least `i + 1` elements of `dt`.
unsafe fn store_f(dt: DType, p: *mut u8, i: usize, v: f64) {
    // SAFETY: the caller's contract.
    unsafe {
        match dt {
            DType::F16 => p.cast::<u16>().add(i).write_unaligned(half::f16::from_f64(v).to_bits()),
            DType::BF16 => p.cast::<u16>().add(i).write_unaligned(half::bf16::from_f64(v).to_bits()),
            DType::F32 => p.cast::<f32>().add(i).write_unaligned(v as f32),
            _ => p.cast::<f64>().add(i).write_unaligned(v),
        }
    }
}

/// Element `i` of `p` as i128 (integers).
///
/// # Safety
/// As [`load_f`].
unsafe fn load_i(dt: DType, p: *const u8, i: usize) -> i128 {
    // SAFETY: the caller's contract.
    unsafe {
        match dt {
            DType::I8 => i128::from(p.cast::<i8>().add(i).read_unaligned()),
            DType::U8 => i128::from(p.add(i).read_unaligned()),
            DType::I32 => i128::from(p.cast::<i32>().add(i).read_unaligned()),
            DType::U32 => i128::from(p.cast::<u32>().add(i).read_unaligned()),
            DType::I64 => i128::from(p.cast::<i64>().add(i).read_unaligned()),
            _ => i128::from(p.cast::<u64>().add(i).read_unaligned()),
        }
    }
}

/// Stores `v` wrapped to `dt` as element `i` of `p` (integers).
///
/// # Safety
/// As [`store_f`].
unsafe fn store_i(dt: DType, p: *mut u8, i: usize, v: i128) {
    // SAFETY: the caller's contract; `as` wraps, as integer arithmetic on the device does.
    unsafe {
        match dt {
            DType::I8 | DType::U8 => p.add(i).write_unaligned(v as u8),
            DType::I32 | DType::U32 => p.cast::<u32>().add(i).write_unaligned(v as u32),
            _ => p.cast::<u64>().add(i).write_unaligned(v as u64),
        }
    }
}

/// The reduction of element `i` over `inputs`, in rank order, stored as
/// element `j` of `out`.
///
/// # Safety
/// Every input holds element `i`, `out` element `j`.
unsafe fn reduce_element(dt: DType, op: RedOp, inputs: &[*const u8], i: usize, out: *mut u8, j: usize) {
    let n = inputs.len();
    // SAFETY: the caller's contract, throughout.
    unsafe {
        if dt.is_float() {
            let mut acc = load_f(dt, inputs[0], i);
            for &q in &inputs[1..] {
                let v = load_f(dt, q, i);
                acc = match op {
                    RedOp::Sum | RedOp::Avg => acc + v,
                    RedOp::Prod => acc * v,
                    RedOp::Max => acc.max(v),
                    RedOp::Min => acc.min(v),
                };
            }
            if op == RedOp::Avg {
                acc /= n as f64;
            }
            store_f(dt, out, j, acc);
        } else {
            let mut acc = load_i(dt, inputs[0], i);
            for &q in &inputs[1..] {
                let v = load_i(dt, q, i);
                acc = match op {
                    RedOp::Sum | RedOp::Avg => acc.wrapping_add(v),
                    RedOp::Prod => acc.wrapping_mul(v),
                    RedOp::Max => acc.max(v),
                    RedOp::Min => acc.min(v),
                };
            }
            if op == RedOp::Avg {
                acc /= n as i128;
            }
            store_i(dt, out, j, acc);
        }
    }
}

/// Computes the collective from every rank's buffers into every rank's
/// output (a null output is a rank whose result another process computes
/// for itself). Inputs are read whole before any output is written, so a
/// buffer may be both (in place).
///
/// # Safety
/// Each part's buffers are live and as long as `desc` says for its rank.
unsafe fn compute(desc: &Desc, parts: &[Part]) {
    let n = parts.len();
    let es = desc.dtype.size();
    let count = desc.count;
    let op = desc.op.unwrap_or(RedOp::Sum);
    // SAFETY: the caller's contract, throughout.
    unsafe {
        match desc.kind {
            Kind::AllReduce | Kind::Reduce => {
                let inputs: Vec<*const u8> = parts.iter().map(|q| q.send).collect();
                let mut result = vec![0u8; count * es];
                for i in 0..count {
                    reduce_element(desc.dtype, op, &inputs, i, result.as_mut_ptr(), i);
                }
                for (r, q) in parts.iter().enumerate() {
                    if !q.recv.is_null() && (desc.kind == Kind::AllReduce || desc.root == Some(r)) {
                        std::ptr::copy_nonoverlapping(result.as_ptr(), q.recv, result.len());
                    }
                }
            }
            Kind::Broadcast => {
                let root = desc.root.expect("internal: a broadcast has a root");
                let data = std::slice::from_raw_parts(parts[root].send, count * es).to_vec();
                for q in parts.iter().filter(|q| !q.recv.is_null()) {
                    std::ptr::copy_nonoverlapping(data.as_ptr(), q.recv, data.len());
                }
            }
            Kind::AllGather => {
                let mut all = Vec::with_capacity(n * count * es);
                for q in parts {
                    all.extend_from_slice(std::slice::from_raw_parts(q.send, count * es));
                }
                for q in parts.iter().filter(|q| !q.recv.is_null()) {
                    std::ptr::copy_nonoverlapping(all.as_ptr(), q.recv, all.len());
                }
            }
            Kind::ReduceScatter => {
                let inputs: Vec<*const u8> = parts.iter().map(|q| q.send).collect();
                let mut result = vec![0u8; n * count * es];
                for i in 0..n * count {
                    reduce_element(desc.dtype, op, &inputs, i, result.as_mut_ptr(), i);
                }
                for (r, q) in parts.iter().enumerate().filter(|(_, q)| !q.recv.is_null()) {
                    std::ptr::copy_nonoverlapping(result.as_ptr().add(r * count * es), q.recv, count * es);
                }
            }
        }
    }
}
