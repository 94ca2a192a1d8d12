//! The driver API, with the C ABI of CUDA 12.9: what cudarc 0.19 calls.
//!
//! Work is asynchronous: each stream is a queue that a worker thread runs
//! in order (`queue`), with the legacy stream's implicit ordering, events,
//! sticky errors and a stream-order hazard check (`hazard`). Handles of
//! modules, functions, streams and events are small integers looked up in
//! tables, so a stale or made-up handle is an error, not a crash.
//!
//! This file holds the device's state and what every chapter shares; the
//! entry points live in one file per chapter of the driver API's
//! reference: `device` (initialisation, devices, contexts), `memory`,
//! `stream` (streams and events), `module` (modules, functions,
//! occupancy), `launch`, `unsupported` (graphs, external memory),
//! `errors`, and `extensions` (the emulator's own entry points).

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::exec::{self, Launch};
use crate::memory::Memory;
use crate::ptx::{self, Module};

mod device;
mod errors;
mod extensions;
pub mod hazard;
mod launch;
mod memory;
mod module;
pub mod queue;
mod stream;
mod unsupported;

pub use device::*;
pub use errors::*;
pub use extensions::*;
pub use launch::*;
pub use memory::*;
pub use module::*;
pub use stream::*;
pub use unsupported::*;

pub type CUresult = c_uint;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type Handle = *mut c_void;

pub const SUCCESS: CUresult = 0;
pub const INVALID_VALUE: CUresult = 1;
pub const OUT_OF_MEMORY: CUresult = 2;
pub const NOT_INITIALIZED: CUresult = 3;
pub const INVALID_DEVICE: CUresult = 101;
pub const INVALID_IMAGE: CUresult = 200;
pub const INVALID_CONTEXT: CUresult = 201;
pub const INVALID_PTX: CUresult = 218;
pub const NOT_FOUND: CUresult = 500;
pub const INVALID_HANDLE: CUresult = 400;
pub const NOT_SUPPORTED: CUresult = 801;
pub const PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
pub const PEER_ACCESS_NOT_ENABLED: CUresult = 705;
pub const UNSUPPORTED_LIMIT: CUresult = 215;
pub use queue::{HAZARD, NOT_READY};

/// The emulated device's name.
pub const DEVICE_NAME: &str = "tapir emulated CUDA device (PTX interpreter, sm_90)";
/// Default capacity: 4 GiB, or a quarter of the host's memory if that is less.
const DEFAULT_CAPACITY: u64 = 4 << 30;
/// Static shared memory a block may use without opting in.
const SHARED_DEFAULT: u32 = 48 * 1024;
/// The most a block may opt in to (sm_90).
const SHARED_OPTIN: u32 = 227 * 1024;

struct LoadedModule {
    /// The device whose memory holds the globals and runs the kernels.
    device: usize,
    module: Module,
    /// Device allocations of the module's `.global`/`.const` variables.
    globals: Vec<(String, u64, u64)>,
}

struct FuncObj {
    module: Arc<LoadedModule>,
    index: usize,
    max_dyn_shared: u32,
    /// The parameters it reads and writes global memory through.
    uses: hazard::ParamUse,
}

/// One emulated device: its memory (addresses `ordinal * DEVICE_SPAN`
/// above the base) and its primary context's settings.
pub struct Device {
    pub memory: Memory,
    primary_refs: AtomicUsize,
    /// `cuCtxSetLimit`'s values, by `CUlimit`.
    limits: Mutex<[usize; LIMITS]>,
    /// `cuCtxSetCacheConfig`'s value (a `CUfunc_cache`).
    cache_config: std::sync::atomic::AtomicI32,
    /// Devices whose memory this device's kernels may access
    /// (`cuCtxEnablePeerAccess` from this device's context).
    peers: Mutex<Vec<usize>>,
    /// The first kernel fault, returned by every call on the context from
    /// the next synchronizing one on, until the context is reset.
    sticky: Mutex<Option<(CUresult, String)>>,
    /// Whether a synchronizing call has returned the fault yet: until one
    /// has, calls that only queue work (a launch, an event record, an
    /// asynchronous copy) succeed, as on hardware, where the host learns of
    /// a fault when it next waits on the device.
    observed: std::sync::atomic::AtomicBool,
    /// The legacy (NULL) stream.
    legacy: OnceLock<Arc<queue::Stream>>,
}

/// The emulated devices, and the tables behind every handle.
pub struct Emu {
    pub devices: Vec<Device>,
    modules: Mutex<HashMap<usize, Arc<LoadedModule>>>,
    funcs: Mutex<HashMap<usize, FuncObj>>,
    /// Streams and events (each knows the device of its context).
    streams: Mutex<HashMap<usize, Arc<queue::Stream>>>,
    events: Mutex<HashMap<usize, Arc<queue::Event>>>,
    /// Accesses and clocks for the stream-order hazard check.
    tracker: Mutex<hazard::Tracker>,
    /// Whether stream-order hazards are checked (`TAPIR_CUDA_EMU_STREAMCHECK=0` turns it off).
    streamcheck: bool,
    /// Page-locked host buffers (`cuMemHostAlloc`): start and length.
    pinned: Mutex<std::collections::BTreeMap<usize, usize>>,
    next: AtomicUsize,
    racecheck: bool,
    /// Host threads a launch runs its blocks on.
    workers: usize,
    instructions: std::sync::atomic::AtomicU64,
}

/// The address range of each device's memory.
const DEVICE_SPAN: u64 = 1 << 40;
/// The most devices `TAPIR_CUDA_EMU_DEVICES` may ask for.
const MAX_DEVICES: usize = 16;

impl Emu {
    /// The device whose address range holds `addr`.
    pub fn device_of(&self, addr: CUdeviceptr) -> Option<usize> {
        let d = usize::try_from(addr.checked_sub(crate::memory::GLOBAL_BASE)? / DEVICE_SPAN).ok()?;
        (d < self.devices.len()).then_some(d)
    }

    /// A host pointer to `[addr, addr + len)` when it lies in one live
    /// allocation of any device.
    pub fn host_ptr(&self, addr: CUdeviceptr, len: u64) -> Option<*mut u8> {
        self.devices[self.device_of(addr)?].memory.host_ptr(addr, len)
    }

    /// The device `ordinal`, or `CUDA_ERROR_INVALID_DEVICE`.
    fn device(&self, ordinal: CUdevice) -> Result<&Device, CUresult> {
        usize::try_from(ordinal).ok().and_then(|d| self.devices.get(d)).ok_or(INVALID_DEVICE)
    }
}

/// `CUlimit` values the driver knows (stack size to the CIG shared-memory
/// fallback).
const LIMITS: usize = 10;
/// Each limit's value before a context sets it, as an H100's driver reports.
const LIMIT_DEFAULTS: [usize; LIMITS] = [
    1024,    // STACK_SIZE
    1 << 20, // PRINTF_FIFO_SIZE
    8 << 20, // MALLOC_HEAP_SIZE
    2,       // DEV_RUNTIME_SYNC_DEPTH
    2048,    // DEV_RUNTIME_PENDING_LAUNCH_COUNT
    64,      // MAX_L2_FETCH_GRANULARITY
    0,       // PERSISTING_L2_CACHE_SIZE
    0,       // SHMEM_SIZE
    0,       // CIG_ENABLED
    0,       // CIG_SHMEM_FALLBACK_ENABLED
];

/// The context handles: device `d`'s primary context is `CTX + d` (the
/// emulator has one context a device).
const CTX: usize = 0xC0_7E47;

/// The device of context handle `ctx`, if it is one.
fn ctx_device(ctx: usize) -> Option<usize> {
    ctx.checked_sub(CTX).filter(|&d| d < emu().devices.len())
}

/// The device of the calling thread's current context; device 0 when none
/// is current (cudarc makes one current before every call that needs it).
fn current_device() -> usize {
    ctx_device(CURRENT.with(|c| c.get())).unwrap_or(0)
}

fn host_memory() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Parses a byte count with an optional K/M/G suffix.
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1u64 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mul)
}

/// The process's emulated device, created on first use.
pub fn emu() -> &'static Emu {
    static EMU: OnceLock<Emu> = OnceLock::new();
    EMU.get_or_init(|| {
        let host = host_memory().unwrap_or(DEFAULT_CAPACITY * 4);
        let capacity = std::env::var("TAPIR_CUDA_EMU_MEMORY")
            .ok()
            .and_then(|s| parse_bytes(&s))
            .unwrap_or(DEFAULT_CAPACITY.min(host / 4))
            .min(host);
        let racecheck = std::env::var("TAPIR_CUDA_EMU_RACECHECK").map_or(true, |v| v != "0");
        let workers = std::env::var("TAPIR_CUDA_EMU_THREADS")
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(8)))
            .max(1);
        let count = std::env::var("TAPIR_CUDA_EMU_DEVICES")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(1)
            .clamp(1, MAX_DEVICES);
        let devices = (0..count)
            .map(|d| Device {
                memory: Memory::with_base(capacity, crate::memory::GLOBAL_BASE + d as u64 * DEVICE_SPAN),
                primary_refs: AtomicUsize::new(0),
                limits: Mutex::new(LIMIT_DEFAULTS),
                cache_config: std::sync::atomic::AtomicI32::new(0),
                peers: Mutex::default(),
                sticky: Mutex::default(),
                observed: std::sync::atomic::AtomicBool::new(false),
                legacy: OnceLock::new(),
            })
            .collect();
        Emu {
            devices,
            modules: Mutex::default(),
            funcs: Mutex::default(),
            streams: Mutex::default(),
            events: Mutex::default(),
            tracker: Mutex::default(),
            streamcheck: std::env::var("TAPIR_CUDA_EMU_STREAMCHECK").map_or(true, |v| v != "0"),
            pinned: Mutex::default(),
            // Handles start past the null, legacy (1) and per-thread (2) stream handles.
            next: AtomicUsize::new(16),
            racecheck,
            workers,
            instructions: std::sync::atomic::AtomicU64::new(0),
        }
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
    static CURRENT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Records a failure's message for `tapirEmuLastError` and prints it, as
/// compute-sanitizer does.
fn fail(code: CUresult, msg: String) -> CUresult {
    eprintln!("========= tapir-cuda-emu: {msg}");
    LAST_ERROR.with(|e| *e.borrow_mut() = msg);
    code
}

/// Records a failure message without a driver result code.
pub fn record_failure(msg: String) {
    fail(SUCCESS, msg);
}

/// The calling thread's last failure message, in words.
pub fn last_error() -> String {
    LAST_ERROR.with(|e| e.borrow().clone())
}

fn handle_id(h: Handle) -> usize {
    h as usize
}

fn write<T>(p: *mut T, v: T) -> CUresult {
    if p.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: the caller passed a pointer to write the result to.
    unsafe { p.write(v) };
    SUCCESS
}
