//! The driver API, with the C ABI of CUDA 12.9: what cudarc 0.19 calls.
//!
//! All work is synchronous: a copy, memset or launch is complete when its
//! call returns, which is one legal schedule of CUDA's stream semantics;
//! streams and events are therefore only handles. Handles of modules,
//! functions, streams and events are small integers looked up in tables,
//! so a stale or made-up handle is an error, not a crash.

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

/// The emulated device's name.
pub const DEVICE_NAME: &str = "tapir emulated CUDA device (PTX interpreter, sm_90)";
/// Default capacity: 4 GiB, or a quarter of the host's memory if that is less.
const DEFAULT_CAPACITY: u64 = 4 << 30;
/// Static shared memory a block may use without opting in.
const SHARED_DEFAULT: u32 = 48 * 1024;
/// The most a block may opt in to (sm_90).
const SHARED_OPTIN: u32 = 227 * 1024;

struct LoadedModule {
    module: Module,
    /// Device allocations of the module's `.global`/`.const` variables.
    globals: Vec<(String, u64, u64)>,
}

struct FuncObj {
    module: Arc<LoadedModule>,
    index: usize,
    max_dyn_shared: u32,
}

/// The device: memory, and the tables behind every handle.
pub struct Emu {
    pub memory: Memory,
    modules: Mutex<HashMap<usize, Arc<LoadedModule>>>,
    funcs: Mutex<HashMap<usize, FuncObj>>,
    streams: Mutex<HashMap<usize, ()>>,
    events: Mutex<HashMap<usize, ()>>,
    next: AtomicUsize,
    primary_refs: AtomicUsize,
    racecheck: bool,
    /// Host threads a launch runs its blocks on.
    workers: usize,
    instructions: std::sync::atomic::AtomicU64,
}

/// The context handle: one primary context on one device.
const CTX: usize = 0xC0_7E47;

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
        Emu {
            memory: Memory::new(capacity),
            modules: Mutex::default(),
            funcs: Mutex::default(),
            streams: Mutex::default(),
            events: Mutex::default(),
            next: AtomicUsize::new(1),
            primary_refs: AtomicUsize::new(0),
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

/// Loads PTX text into a module, allocating its global variables.
pub fn load_module(src: &str) -> Result<usize, (CUresult, String)> {
    let e = emu();
    let mut allocs: Vec<(String, u64, u64)> = Vec::new();
    let failed = std::cell::Cell::new(false);
    let module = ptx::load(src, &|globals| {
        let mut out = Vec::new();
        for g in globals {
            let len = (g.init.len() as u64).max(1);
            match e.memory.alloc(len) {
                Ok(a) => {
                    if let Some(p) = e.memory.host_ptr(a, g.init.len() as u64) {
                        // SAFETY: the allocation has room for the initialiser.
                        unsafe { std::ptr::copy_nonoverlapping(g.init.as_ptr(), p, g.init.len()) };
                    }
                    out.push(a);
                }
                Err(_) => {
                    failed.set(true);
                    out.push(0);
                }
            }
        }
        out
    })
    .map_err(|m| (INVALID_PTX, format!("PTX rejected: {m}")))?;
    for (g, a) in module.globals.iter().zip(module.global_addrs.iter().copied()) {
        allocs.push((g.name.clone(), a, g.init.len() as u64));
    }
    if failed.get() {
        free_globals(&allocs);
        return Err((OUT_OF_MEMORY, "no device memory for the module's global variables".into()));
    }
    if !module.unsupported.is_empty() {
        free_globals(&allocs);
        return Err((
            NOT_SUPPORTED,
            format!("the PTX uses instructions the emulator does not implement: {}", module.unsupported.join(", ")),
        ));
    }
    let id = e.next.fetch_add(1, Ordering::Relaxed);
    lock(&e.modules).insert(id, Arc::new(LoadedModule { module, globals: allocs }));
    Ok(id)
}

fn free_globals(allocs: &[(String, u64, u64)]) {
    for (_, a, _) in allocs {
        if *a != 0 {
            emu().memory.free(*a);
        }
    }
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

// ---- initialisation, device, context ----

#[no_mangle]
pub extern "C" fn cuInit(_flags: c_uint) -> CUresult {
    emu();
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    write(v, 12090)
}

#[no_mangle]
pub extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    write(count, 1)
}

#[no_mangle]
pub extern "C" fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) -> CUresult {
    if ordinal != 0 {
        return INVALID_DEVICE;
    }
    write(dev, 0)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    if dev != 0 {
        return INVALID_DEVICE;
    }
    if name.is_null() || len <= 0 {
        return INVALID_VALUE;
    }
    let bytes = DEVICE_NAME.as_bytes();
    let n = bytes.len().min(len as usize - 1);
    // SAFETY: the caller's buffer holds `len` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), name.cast::<u8>(), n);
        *name.add(n) = 0;
    }
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    if dev != 0 {
        return INVALID_DEVICE;
    }
    write(bytes, emu().memory.capacity() as usize)
}

#[no_mangle]
pub extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    if dev != 0 {
        return INVALID_DEVICE;
    }
    write(uuid, *b"tapir-cuda-emu\0\0")
}

#[no_mangle]
pub extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    cuDeviceGetUuid(uuid, dev)
}

/// The device's attributes, those of an H100-class part at sm_90.
pub fn device_attribute(attr: c_int) -> Option<c_int> {
    Some(match attr {
        1 => 1024,                    // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,                // MAX_BLOCK_DIM_X/Y
        4 => 64,                      // MAX_BLOCK_DIM_Z
        5 => i32::MAX,                // MAX_GRID_DIM_X
        6 | 7 => 65535,               // MAX_GRID_DIM_Y/Z
        8 => SHARED_DEFAULT as c_int, // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 65536,                   // TOTAL_CONSTANT_MEMORY
        10 => 32,                     // WARP_SIZE
        11 => i32::MAX,               // MAX_PITCH
        12 => 65536,                  // MAX_REGISTERS_PER_BLOCK
        13 => 1_755_000,              // CLOCK_RATE (kHz)
        14 => 512,                    // TEXTURE_ALIGNMENT
        15 => 1,                      // GPU_OVERLAP
        16 => 132,                    // MULTIPROCESSOR_COUNT
        17 => 0,                      // KERNEL_EXEC_TIMEOUT
        18 => 0,                      // INTEGRATED
        19 => 1,                      // CAN_MAP_HOST_MEMORY
        20 => 0,                      // COMPUTE_MODE
        31 => 1,                      // CONCURRENT_KERNELS
        32 => 0,                      // ECC_ENABLED
        33..=35 => 0,                 // PCI ids
        36 => 2_619_000,              // MEMORY_CLOCK_RATE
        37 => 5120,                   // GLOBAL_MEMORY_BUS_WIDTH
        38 => 50 * 1024 * 1024,       // L2_CACHE_SIZE
        39 => 2048,                   // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 2,                      // ASYNC_ENGINE_COUNT
        41 => 1,                      // UNIFIED_ADDRESSING
        75 => 9,                      // COMPUTE_CAPABILITY_MAJOR
        76 => 0,                      // COMPUTE_CAPABILITY_MINOR
        81 => 228 * 1024,             // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        82 => 65536,                  // MAX_REGISTERS_PER_MULTIPROCESSOR
        83 => 0,                      // MANAGED_MEMORY
        84 => 0,                      // MULTI_GPU_BOARD
        86 => 1,                      // SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO
        89 => 0,                      // CONCURRENT_MANAGED_ACCESS
        95 => 1,                      // COOPERATIVE_LAUNCH
        97 => SHARED_OPTIN as c_int,  // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        106 => 32,                    // MAX_BLOCKS_PER_MULTIPROCESSOR
        115 => 1,                     // MEMORY_POOLS_SUPPORTED
        _ => 0,
    })
}

#[no_mangle]
pub extern "C" fn cuDeviceGetAttribute(pi: *mut c_int, attr: c_int, dev: CUdevice) -> CUresult {
    if dev != 0 {
        return INVALID_DEVICE;
    }
    match device_attribute(attr) {
        Some(v) => write(pi, v),
        None => INVALID_VALUE,
    }
}

#[no_mangle]
pub extern "C" fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: CUdevice) -> CUresult {
    if dev != 0 {
        return INVALID_DEVICE;
    }
    let rc = write(major, 9);
    if rc != SUCCESS {
        return rc;
    }
    write(minor, 0)
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: CUdevice) -> CUresult {
    if dev != 0 {
        return INVALID_DEVICE;
    }
    emu().primary_refs.fetch_add(1, Ordering::Relaxed);
    write(pctx, CTX as Handle)
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    if dev != 0 {
        return INVALID_DEVICE;
    }
    let _ = emu().primary_refs.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    if dev != 0 {
        return INVALID_DEVICE;
    }
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuCtxCreate_v2(pctx: *mut Handle, _flags: c_uint, dev: CUdevice) -> CUresult {
    cuDevicePrimaryCtxRetain(pctx, dev)
}

#[no_mangle]
pub extern "C" fn cuCtxCreate_v3(
    pctx: *mut Handle,
    _p: *mut c_void,
    _n: c_int,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    cuDevicePrimaryCtxRetain(pctx, dev)
}

#[no_mangle]
pub extern "C" fn cuCtxCreate_v4(pctx: *mut Handle, _p: *mut c_void, _flags: c_uint, dev: CUdevice) -> CUresult {
    cuDevicePrimaryCtxRetain(pctx, dev)
}

#[no_mangle]
pub extern "C" fn cuProfilerStart() -> CUresult {
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuProfilerStop() -> CUresult {
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuOccupancyMaxActiveClusters(_n: *mut c_int, _f: Handle, _cfg: *const c_void) -> CUresult {
    NOT_SUPPORTED
}

#[no_mangle]
pub extern "C" fn cuOccupancyMaxPotentialClusterSize(_n: *mut c_int, _f: Handle, _cfg: *const c_void) -> CUresult {
    NOT_SUPPORTED
}

#[no_mangle]
pub extern "C" fn cuCtxDestroy_v2(_ctx: Handle) -> CUresult {
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuCtxGetCurrent(pctx: *mut Handle) -> CUresult {
    write(pctx, CURRENT.with(|c| c.get()) as Handle)
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CUresult {
    let id = ctx as usize;
    if id != 0 && id != CTX {
        return INVALID_CONTEXT;
    }
    CURRENT.with(|c| c.set(id));
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: Handle) -> CUresult {
    cuCtxSetCurrent(ctx)
}

#[no_mangle]
pub extern "C" fn cuCtxPopCurrent_v2(pctx: *mut Handle) -> CUresult {
    if !pctx.is_null() {
        cuCtxGetCurrent(pctx);
    }
    CURRENT.with(|c| c.set(0));
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    write(dev, 0)
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuCtxSetFlags(_flags: c_uint) -> CUresult {
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuCtxGetLimit(v: *mut usize, limit: c_int) -> CUresult {
    write(
        v,
        match limit {
            0 => 1024,    // STACK_SIZE
            1 => 1 << 20, // PRINTF_FIFO_SIZE
            2 => 8 << 20, // MALLOC_HEAP_SIZE
            _ => 0,
        },
    )
}

#[no_mangle]
pub extern "C" fn cuCtxSetLimit(_limit: c_int, _v: usize) -> CUresult {
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuCtxGetCacheConfig(c: *mut c_int) -> CUresult {
    write(c, 0)
}

#[no_mangle]
pub extern "C" fn cuCtxSetCacheConfig(_c: c_int) -> CUresult {
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) -> CUresult {
    if !least.is_null() {
        write(least, 0);
    }
    if !greatest.is_null() {
        write(greatest, -5);
    }
    SUCCESS
}

// ---- memory ----

fn alloc(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    if dptr.is_null() || bytes == 0 {
        return INVALID_VALUE;
    }
    match emu().memory.alloc(bytes as u64) {
        Ok(a) => write(dptr, a),
        Err(_) => fail(
            OUT_OF_MEMORY,
            format!(
                "out of memory: {bytes} bytes requested, {} of {} bytes in use",
                emu().memory.used(),
                emu().memory.capacity()
            ),
        ),
    }
}

fn free(dptr: CUdeviceptr) -> CUresult {
    if dptr == 0 {
        return SUCCESS;
    }
    if emu().memory.free(dptr) {
        SUCCESS
    } else {
        fail(INVALID_VALUE, format!("cuMemFree of {dptr:#x}, which is not the start of a live allocation"))
    }
}

/// An entry point and its `Async` twin, which takes a stream as well and
/// does the same: every call runs to completion before it returns (see the
/// module docs), so the stream changes nothing. `unsafe` before the names
/// makes both `unsafe fn`s, for entry points that read or write through a
/// caller's host pointer, whose contract the body forwards.
macro_rules! with_async {
    ($sync:ident, $async_:ident, ($($arg:ident: $ty:ty),*) => $body:expr) => {
        #[no_mangle]
        pub extern "C" fn $sync($($arg: $ty),*) -> CUresult {
            $body
        }

        #[no_mangle]
        pub extern "C" fn $async_($($arg: $ty,)* _s: Handle) -> CUresult {
            $body
        }
    };
    (unsafe $sync:ident, $async_:ident, ($($arg:ident: $ty:ty),*) => $body:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $sync($($arg: $ty),*) -> CUresult {
            // SAFETY: forwarded contract.
            unsafe { $body }
        }

        #[no_mangle]
        pub unsafe extern "C" fn $async_($($arg: $ty,)* _s: Handle) -> CUresult {
            // SAFETY: forwarded contract.
            unsafe { $body }
        }
    };
}

with_async!(cuMemAlloc_v2, cuMemAllocAsync, (dptr: *mut CUdeviceptr, bytes: usize) => alloc(dptr, bytes));

#[no_mangle]
pub extern "C" fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytes: usize, _p: Handle, _s: Handle) -> CUresult {
    alloc(dptr, bytes)
}

with_async!(cuMemFree_v2, cuMemFreeAsync, (dptr: CUdeviceptr) => free(dptr));

#[no_mangle]
pub extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let m = &emu().memory;
    let rc = write(free, (m.capacity() - m.used()) as usize);
    if rc != SUCCESS {
        return rc;
    }
    write(total, m.capacity() as usize)
}

fn dev_ptr(addr: CUdeviceptr, len: usize, what: &str) -> Result<*mut u8, CUresult> {
    emu().memory.host_ptr(addr, len as u64).ok_or_else(|| {
        fail(INVALID_VALUE, format!("{what}: {len} bytes at {addr:#x} are not inside one live device allocation"))
    })
}

/// Runs `copy` on the host address of the `n` device bytes at `addr`,
/// after the checks every copy between host and device makes: nothing to
/// do for no bytes, `CUDA_ERROR_INVALID_VALUE` for a null host pointer
/// (`host_null`) or a range outside one live allocation (named `what`).
fn host_copy(addr: CUdeviceptr, n: usize, host_null: bool, what: &str, copy: impl FnOnce(*mut u8)) -> CUresult {
    if n == 0 {
        return SUCCESS;
    }
    if host_null {
        return INVALID_VALUE;
    }
    match dev_ptr(addr, n, what) {
        Ok(p) => {
            copy(p);
            SUCCESS
        }
        Err(rc) => rc,
    }
}

unsafe fn htod(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult {
    // SAFETY: the host buffer holds `n` bytes (the caller's contract); the device range was checked.
    host_copy(dst, n, src.is_null(), "cuMemcpyHtoD", |p| unsafe { std::ptr::copy(src.cast::<u8>(), p, n) })
}

unsafe fn dtoh(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    // SAFETY: as above.
    host_copy(src, n, dst.is_null(), "cuMemcpyDtoH", |p| unsafe { std::ptr::copy(p, dst.cast::<u8>(), n) })
}

fn dtod(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    if n == 0 {
        return SUCCESS;
    }
    let s = match dev_ptr(src, n, "cuMemcpyDtoD source") {
        Ok(p) => p,
        Err(rc) => return rc,
    };
    let d = match dev_ptr(dst, n, "cuMemcpyDtoD destination") {
        Ok(p) => p,
        Err(rc) => return rc,
    };
    // SAFETY: both ranges were checked; they may overlap.
    unsafe { std::ptr::copy(s, d, n) };
    SUCCESS
}

with_async!(unsafe cuMemcpyHtoD_v2, cuMemcpyHtoDAsync_v2,
    (dst: CUdeviceptr, src: *const c_void, n: usize) => htod(dst, src, n));
with_async!(unsafe cuMemcpyDtoH_v2, cuMemcpyDtoHAsync_v2,
    (dst: *mut c_void, src: CUdeviceptr, n: usize) => dtoh(dst, src, n));
with_async!(cuMemcpyDtoD_v2, cuMemcpyDtoDAsync_v2, (dst: CUdeviceptr, src: CUdeviceptr, n: usize) => dtod(dst, src, n));

#[no_mangle]
pub extern "C" fn cuMemcpyPeerAsync(
    dst: CUdeviceptr,
    _dc: Handle,
    src: CUdeviceptr,
    _sc: Handle,
    n: usize,
    _s: Handle,
) -> CUresult {
    dtod(dst, src, n)
}

fn memset(dst: CUdeviceptr, value: u32, elem: usize, n: usize) -> CUresult {
    if n == 0 {
        return SUCCESS;
    }
    let Some(bytes) = n.checked_mul(elem) else { return INVALID_VALUE };
    if !dst.is_multiple_of(elem as u64) {
        return INVALID_VALUE;
    }
    let p = match dev_ptr(dst, bytes, "cuMemset") {
        Ok(p) => p,
        Err(rc) => return rc,
    };
    let v = value.to_le_bytes();
    for k in 0..n {
        // SAFETY: within the checked range.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p.add(k * elem), elem) };
    }
    SUCCESS
}

with_async!(cuMemsetD8_v2, cuMemsetD8Async, (dst: CUdeviceptr, v: u8, n: usize) => memset(dst, u32::from(v), 1, n));
with_async!(cuMemsetD16_v2, cuMemsetD16Async, (dst: CUdeviceptr, v: u16, n: usize) => memset(dst, u32::from(v), 2, n));
with_async!(cuMemsetD32_v2, cuMemsetD32Async, (dst: CUdeviceptr, v: u32, n: usize) => memset(dst, v, 4, n));

#[no_mangle]
pub extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, _flags: c_uint) -> CUresult {
    let Ok(layout) = std::alloc::Layout::from_size_align(bytes.max(1) + 64, 64) else { return INVALID_VALUE };
    // SAFETY: non-zero size. The size is stored in front so cuMemFreeHost can rebuild the layout.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return OUT_OF_MEMORY;
    }
    // SAFETY: the block has 64 bytes in front of the user's part.
    unsafe {
        p.cast::<usize>().write(bytes.max(1) + 64);
        write(pp, p.add(64).cast())
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    if p.is_null() {
        return SUCCESS;
    }
    // SAFETY: `p` came from cuMemHostAlloc, which put the size 64 bytes before it.
    unsafe {
        let base = p.cast::<u8>().sub(64);
        let size = base.cast::<usize>().read();
        std::alloc::dealloc(base, std::alloc::Layout::from_size_align_unchecked(size, 64));
    }
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemAllocManaged(_d: *mut CUdeviceptr, _b: usize, _f: c_uint) -> CUresult {
    NOT_SUPPORTED
}

#[no_mangle]
pub extern "C" fn cuMemPrefetchAsync_v2(
    _d: CUdeviceptr,
    _n: usize,
    _l: MemLocation,
    _f: c_uint,
    _s: Handle,
) -> CUresult {
    NOT_SUPPORTED
}

#[no_mangle]
pub extern "C" fn cuMemAdvise_v2(_d: CUdeviceptr, _n: usize, _a: c_int, _l: MemLocation) -> CUresult {
    NOT_SUPPORTED
}

#[no_mangle]
pub extern "C" fn cuStreamAttachMemAsync(_s: Handle, _d: CUdeviceptr, _n: usize, _f: c_uint) -> CUresult {
    NOT_SUPPORTED
}

#[no_mangle]
pub extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut Handle, dev: CUdevice) -> CUresult {
    if dev != 0 {
        return INVALID_DEVICE;
    }
    write(pool, 0x9001 as Handle)
}

#[no_mangle]
pub extern "C" fn cuDeviceGetMemPool(pool: *mut Handle, dev: CUdevice) -> CUresult {
    cuDeviceGetDefaultMemPool(pool, dev)
}

#[no_mangle]
pub extern "C" fn cuDeviceSetMemPool(_dev: CUdevice, _pool: Handle) -> CUresult {
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemPoolCreate(_pool: *mut Handle, _props: *const c_void) -> CUresult {
    NOT_SUPPORTED
}

#[no_mangle]
pub extern "C" fn cuMemPoolDestroy(_pool: Handle) -> CUresult {
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemPoolTrimTo(_pool: Handle, _keep: usize) -> CUresult {
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemPoolSetAttribute(_pool: Handle, _attr: c_int, _v: *mut c_void) -> CUresult {
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemPoolGetAttribute(_pool: Handle, _attr: c_int, v: *mut u64) -> CUresult {
    write(v, 0)
}

/// `CUmemLocation`, passed by value.
#[repr(C)]
pub struct MemLocation {
    kind: c_int,
    id: c_int,
}

// ---- streams and events: handles only, as all work is synchronous ----

fn new_handle(table: &Mutex<HashMap<usize, ()>>, out: *mut Handle) -> CUresult {
    if out.is_null() {
        return INVALID_VALUE;
    }
    let id = emu().next.fetch_add(1, Ordering::Relaxed);
    lock(table).insert(id, ());
    write(out, id as Handle)
}

/// Destroys the stream or event `h` of `table`; one not there is
/// `CUDA_ERROR_INVALID_HANDLE`.
fn drop_handle(table: &Mutex<HashMap<usize, ()>>, h: Handle) -> CUresult {
    if lock(table).remove(&handle_id(h)).is_some() {
        SUCCESS
    } else {
        INVALID_HANDLE
    }
}

fn check_stream(s: Handle) -> CUresult {
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
    if check_stream(s) != SUCCESS {
        return INVALID_HANDLE;
    }
    check_event(e)
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

// ---- modules and functions ----

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(out: *mut Handle, image: *const c_void) -> CUresult {
    if out.is_null() || image.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: a PTX image is a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(image.cast()) }.to_bytes();
    if bytes.starts_with(b"\x7fELF") || bytes.len() < 4 {
        return fail(INVALID_IMAGE, "the emulator loads PTX text only, not cubin or fatbin images".into());
    }
    let Ok(src) = std::str::from_utf8(bytes) else {
        return fail(INVALID_PTX, "the PTX is not UTF-8".into());
    };
    match load_module(src) {
        Ok(id) => write(out, id as Handle),
        Err((rc, msg)) => fail(rc, msg),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    out: *mut Handle,
    image: *const c_void,
    _n: c_uint,
    _opts: *mut c_int,
    _vals: *mut *mut c_void,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuModuleLoadData(out, image) }
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(out: *mut Handle, fname: *const c_char) -> CUresult {
    if fname.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(fname) }.to_string_lossy().into_owned();
    let Ok(mut text) = std::fs::read(&path) else { return NOT_FOUND };
    text.push(0);
    // SAFETY: NUL-terminated above.
    unsafe { cuModuleLoadData(out, text.as_ptr().cast()) }
}

#[no_mangle]
pub extern "C" fn cuModuleUnload(m: Handle) -> CUresult {
    let e = emu();
    let Some(lm) = lock(&e.modules).remove(&handle_id(m)) else { return INVALID_HANDLE };
    free_globals(&lm.globals);
    lock(&e.funcs).retain(|_, f| !Arc::ptr_eq(&f.module, &lm));
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(out: *mut Handle, m: Handle, name: *const c_char) -> CUresult {
    if out.is_null() || name.is_null() {
        return INVALID_VALUE;
    }
    let e = emu();
    let Some(lm) = lock(&e.modules).get(&handle_id(m)).cloned() else { return INVALID_HANDLE };
    // SAFETY: a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    let Some(index) = lm.module.funcs.iter().position(|f| f.entry && f.name == name) else { return NOT_FOUND };
    let static_shared = lm.module.funcs[index].shared_size;
    let id = e.next.fetch_add(1, Ordering::Relaxed);
    lock(&e.funcs)
        .insert(id, FuncObj { module: lm, index, max_dyn_shared: SHARED_DEFAULT.saturating_sub(static_shared) });
    write(out, id as Handle)
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    m: Handle,
    name: *const c_char,
) -> CUresult {
    if name.is_null() {
        return INVALID_VALUE;
    }
    let Some(lm) = lock(&emu().modules).get(&handle_id(m)).cloned() else { return INVALID_HANDLE };
    // SAFETY: a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    let Some((_, a, n)) = lm.globals.iter().find(|(g, _, _)| *g == name) else { return NOT_FOUND };
    if !dptr.is_null() {
        write(dptr, *a);
    }
    if !bytes.is_null() {
        write(bytes, *n as usize);
    }
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuFuncGetAttribute(pi: *mut c_int, attr: c_int, f: Handle) -> CUresult {
    let funcs = lock(&emu().funcs);
    let Some(fo) = funcs.get(&handle_id(f)) else { return INVALID_HANDLE };
    let func = &fo.module.module.funcs[fo.index];
    let v = match attr {
        0 => func.maxntid.unwrap_or(1024) as c_int,
        1 => func.shared_size as c_int,
        2 => 0,
        3 => func.local_size as c_int,
        4 => (func.nregs as c_int).min(255),
        5 => 90,
        6 => 90,
        7 => 0,
        8 => fo.max_dyn_shared as c_int,
        9 => -1,
        _ => return INVALID_VALUE,
    };
    write(pi, v)
}

#[no_mangle]
pub extern "C" fn cuFuncSetAttribute(f: Handle, attr: c_int, value: c_int) -> CUresult {
    let mut funcs = lock(&emu().funcs);
    let Some(fo) = funcs.get_mut(&handle_id(f)) else { return INVALID_HANDLE };
    match attr {
        8 => {
            let static_shared = fo.module.module.funcs[fo.index].shared_size;
            if value < 0 || value as u32 + static_shared > SHARED_OPTIN {
                return INVALID_VALUE;
            }
            fo.max_dyn_shared = value as u32;
            SUCCESS
        }
        9 => SUCCESS,
        _ => INVALID_VALUE,
    }
}

#[no_mangle]
pub extern "C" fn cuFuncSetCacheConfig(f: Handle, _c: c_int) -> CUresult {
    if lock(&emu().funcs).contains_key(&handle_id(f)) {
        SUCCESS
    } else {
        INVALID_HANDLE
    }
}

#[no_mangle]
pub extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    n: *mut c_int,
    _f: Handle,
    block: c_int,
    _shared: usize,
) -> CUresult {
    write(n, (2048 / block.max(1)).clamp(1, 32))
}

#[no_mangle]
pub extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    n: *mut c_int,
    f: Handle,
    block: c_int,
    shared: usize,
    _flags: c_uint,
) -> CUresult {
    cuOccupancyMaxActiveBlocksPerMultiprocessor(n, f, block, shared)
}

#[no_mangle]
pub extern "C" fn cuOccupancyMaxPotentialBlockSize(
    min_grid: *mut c_int,
    block: *mut c_int,
    _f: Handle,
    _b2s: *mut c_void,
    _shared: usize,
    limit: c_int,
) -> CUresult {
    let b = if limit > 0 { limit.min(1024) } else { 1024 };
    if !min_grid.is_null() {
        write(min_grid, 132 * (2048 / b));
    }
    write(block, b)
}

#[no_mangle]
pub extern "C" fn cuOccupancyMaxPotentialBlockSizeWithFlags(
    min_grid: *mut c_int,
    block: *mut c_int,
    f: Handle,
    b2s: *mut c_void,
    shared: usize,
    limit: c_int,
    _flags: c_uint,
) -> CUresult {
    cuOccupancyMaxPotentialBlockSize(min_grid, block, f, b2s, shared, limit)
}

#[no_mangle]
pub extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    out: *mut usize,
    _f: Handle,
    _n: c_int,
    _b: c_int,
) -> CUresult {
    write(out, SHARED_DEFAULT as usize)
}

/// `CU_LAUNCH_PARAM_BUFFER_POINTER`, `_SIZE` and `_END` of `extra`.
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;
const PARAM_END: usize = 0;

#[allow(clippy::too_many_arguments)]
unsafe fn launch(
    f: Handle,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let e = emu();
    let (lm, index, max_dyn) = {
        let funcs = lock(&e.funcs);
        let Some(fo) = funcs.get(&handle_id(f)) else { return INVALID_HANDLE };
        (fo.module.clone(), fo.index, fo.max_dyn_shared)
    };
    if check_stream(stream) != SUCCESS {
        return INVALID_HANDLE;
    }
    let func = &lm.module.funcs[index];
    let threads = u64::from(block[0]) * u64::from(block[1]) * u64::from(block[2]);
    let limit = func.maxntid.unwrap_or(1024).min(1024);
    if block.contains(&0) || grid.contains(&0) {
        return fail(INVALID_VALUE, format!("launch of {} with a zero grid or block dimension", func.name));
    }
    if threads > u64::from(limit) || block[0] > 1024 || block[1] > 1024 || block[2] > 64 {
        return fail(
            INVALID_VALUE,
            format!(
                "launch of {} with block ({}, {}, {}): {threads} threads, more than the {limit} a block may have \
                 (or a dimension past 1024 x 1024 x 64)",
                func.name, block[0], block[1], block[2]
            ),
        );
    }
    if grid[0] > i32::MAX as u32 || grid[1] > 65535 || grid[2] > 65535 {
        return fail(
            INVALID_VALUE,
            format!(
                "launch of {} with grid ({}, {}, {}), past 2^31-1 x 65535 x 65535",
                func.name, grid[0], grid[1], grid[2]
            ),
        );
    }
    if shared > max_dyn {
        return fail(
            INVALID_VALUE,
            format!(
                "launch of {} with {shared} bytes of dynamic shared memory; with {} static bytes the limit is {max_dyn} \
                 (cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) raises it)",
                func.name, func.shared_size
            ),
        );
    }
    let mut buf = vec![0u8; func.param_size as usize];
    if !extra.is_null() {
        // SAFETY: `extra` is a PARAM_END-terminated list of (key, value) pairs.
        let (mut ptr, mut size) = (std::ptr::null::<u8>(), None);
        let mut k = 0;
        loop {
            let key = unsafe { *extra.add(k) } as usize;
            if key == PARAM_END {
                break;
            }
            let val = unsafe { *extra.add(k + 1) };
            match key {
                PARAM_BUFFER_POINTER => ptr = val.cast(),
                // SAFETY: the value points at a size_t.
                PARAM_BUFFER_SIZE => size = Some(unsafe { *(val as *const usize) }),
                _ => return INVALID_VALUE,
            }
            k += 2;
        }
        let want = func.params.last().map_or(0, |p| (p.offset + p.size) as usize);
        match size {
            Some(n) if n >= want && !ptr.is_null() => {
                // SAFETY: the caller's buffer holds `n` bytes.
                unsafe { std::ptr::copy_nonoverlapping(ptr, buf.as_mut_ptr(), want) };
            }
            _ => {
                return fail(
                    INVALID_VALUE,
                    format!(
                        "launch of {}: the parameter buffer is smaller than the {want} bytes of its signature",
                        func.name
                    ),
                )
            }
        }
    } else if !func.params.is_empty() {
        if params.is_null() {
            return fail(
                INVALID_VALUE,
                format!(
                    "launch of {} without arguments; its signature has {} parameters",
                    func.name,
                    func.params.len()
                ),
            );
        }
        for (k, p) in func.params.iter().enumerate() {
            // SAFETY: `params` holds one pointer per parameter of the signature (the driver's contract).
            let arg = unsafe { *params.add(k) };
            if arg.is_null() {
                return fail(INVALID_VALUE, format!("launch of {}: argument {k} is a null pointer", func.name));
            }
            // SAFETY: each argument points at a value of its parameter's size.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    arg.cast::<u8>(),
                    buf.as_mut_ptr().add(p.offset as usize),
                    p.size as usize,
                )
            };
        }
    }
    let snapshot = e.memory.snapshot();
    let l = Launch {
        module: &lm.module,
        func: index,
        grid,
        block,
        dyn_shared: shared,
        params: &buf,
        mem: &snapshot,
        racecheck: e.racecheck,
        workers: e.workers,
    };
    match exec::run(&l) {
        Ok(stats) => {
            e.instructions.fetch_add(stats.instructions, Ordering::Relaxed);
            SUCCESS
        }
        Err(fault) => fail(fault.code, fault.message),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { launch(f, [gx, gy, gz], [bx, by, bz], shared, stream, params, extra) }
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { launch(f, [gx, gy, gz], [bx, by, bz], shared, stream, params, std::ptr::null_mut()) }
}

// ---- graphs, external memory: not emulated ----

#[no_mangle]
pub extern "C" fn cuGraphInstantiateWithFlags(_e: *mut Handle, _g: Handle, _f: u64) -> CUresult {
    NOT_SUPPORTED
}
#[no_mangle]
pub extern "C" fn cuGraphLaunch(_e: Handle, _s: Handle) -> CUresult {
    NOT_SUPPORTED
}
#[no_mangle]
pub extern "C" fn cuGraphUpload(_e: Handle, _s: Handle) -> CUresult {
    NOT_SUPPORTED
}
#[no_mangle]
pub extern "C" fn cuGraphDestroy(_g: Handle) -> CUresult {
    NOT_SUPPORTED
}
#[no_mangle]
pub extern "C" fn cuGraphExecDestroy(_e: Handle) -> CUresult {
    NOT_SUPPORTED
}
#[no_mangle]
pub extern "C" fn cuImportExternalMemory(_m: *mut Handle, _d: *const c_void) -> CUresult {
    NOT_SUPPORTED
}
#[no_mangle]
pub extern "C" fn cuExternalMemoryGetMappedBuffer(_d: *mut CUdeviceptr, _m: Handle, _b: *const c_void) -> CUresult {
    NOT_SUPPORTED
}
#[no_mangle]
pub extern "C" fn cuDestroyExternalMemory(_m: Handle) -> CUresult {
    NOT_SUPPORTED
}

// ---- errors ----

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
    (218, "CUDA_ERROR_INVALID_PTX\0", "a PTX JIT compilation failed\0"),
    (400, "CUDA_ERROR_INVALID_HANDLE\0", "invalid resource handle\0"),
    (500, "CUDA_ERROR_NOT_FOUND\0", "named symbol not found\0"),
    (600, "CUDA_ERROR_NOT_READY\0", "device not ready\0"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS\0", "an illegal memory access was encountered\0"),
    (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES\0", "too many resources requested for launch\0"),
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

// ---- the emulator's own entry points ----

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
    emu().memory.host_ptr(addr, len as u64).map_or(std::ptr::null_mut(), |p| p.cast())
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
