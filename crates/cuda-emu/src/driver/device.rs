//! Initialisation, devices and contexts.

use super::*;

#[no_mangle]
pub extern "C" fn cuInit(_flags: c_uint) -> CUresult {
    emu();
    SUCCESS
}

/// The driver's private tables, which NVRTC and the CUDA runtime ask a
/// driver found as `libcuda.so.1` for. The emulator has none: it answers
/// `CUDA_ERROR_NOT_FOUND` with a null table, which NVRTC takes as "no such
/// table" and compiles on (without this symbol it calls through a null
/// pointer and crashes).
#[no_mangle]
pub extern "C" fn cuGetExportTable(table: *mut *const c_void, _id: *const [u8; 16]) -> CUresult {
    if !table.is_null() {
        write(table, std::ptr::null());
    }
    NOT_FOUND
}

/// The driver version the emulator reports: CUDA 12.9 (12090), or
/// `TAPIR_CUDA_EMU_DRIVER_VERSION` (scripts/gpu-rehearse.sh reports 13000,
/// the lent machine's CUDA 13, so tapir chooses its libraries as there).
#[no_mangle]
pub extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    let version = std::env::var("TAPIR_CUDA_EMU_DRIVER_VERSION").ok().and_then(|s| s.trim().parse().ok());
    write(v, version.unwrap_or(12090))
}

#[no_mangle]
pub extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    write(count, emu().devices.len() as c_int)
}

#[no_mangle]
pub extern "C" fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) -> CUresult {
    if let Err(rc) = emu().device(ordinal) {
        return rc;
    }
    write(dev, ordinal)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    if let Err(rc) = emu().device(dev) {
        return rc;
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
    if let Err(rc) = emu().device(dev) {
        return rc;
    }
    match emu().device(dev) {
        Ok(d) => write(bytes, d.memory.capacity() as usize),
        Err(rc) => rc,
    }
}

#[no_mangle]
pub extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    if let Err(rc) = emu().device(dev) {
        return rc;
    }
    let mut id = *b"tapir-cuda-emu\0\0";
    id[15] = dev as u8;
    write(uuid, id)
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
    if let Err(rc) = emu().device(dev) {
        return rc;
    }
    match device_attribute(attr) {
        Some(v) => write(pi, v),
        None => INVALID_VALUE,
    }
}

#[no_mangle]
pub extern "C" fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: CUdevice) -> CUresult {
    if let Err(rc) = emu().device(dev) {
        return rc;
    }
    let rc = write(major, 9);
    if rc != SUCCESS {
        return rc;
    }
    write(minor, 0)
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: CUdevice) -> CUresult {
    if let Err(rc) = emu().device(dev) {
        return rc;
    }
    match emu().device(dev) {
        Ok(d) => d.primary_refs.fetch_add(1, Ordering::Relaxed),
        Err(rc) => return rc,
    };
    write(pctx, (CTX + dev as usize) as Handle)
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    if let Err(rc) = emu().device(dev) {
        return rc;
    }
    let Ok(d) = emu().device(dev) else { return INVALID_DEVICE };
    let before = d.primary_refs.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    if before == Ok(1) {
        reset(dev as usize);
    }
    SUCCESS
}

/// Destroys the state of device `d`'s context that outlives no context:
/// waits for its streams' work, then clears its sticky error (memory,
/// modules and handles stay, which a real reset would free).
fn reset(d: usize) {
    queue::synchronize_device(d);
    *lock(&emu().devices[d].sticky) = None;
    emu().devices[d].observed.store(false, std::sync::atomic::Ordering::SeqCst);
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    if let Err(rc) = emu().device(dev) {
        return rc;
    }
    reset(dev as usize);
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

/// Releases what `cuCtxCreate` retained (contexts are the primary ones).
#[no_mangle]
pub extern "C" fn cuCtxDestroy_v2(ctx: Handle) -> CUresult {
    match ctx_device(ctx as usize) {
        Some(d) => cuDevicePrimaryCtxRelease_v2(d as CUdevice),
        None => INVALID_CONTEXT,
    }
}

#[no_mangle]
pub extern "C" fn cuCtxGetCurrent(pctx: *mut Handle) -> CUresult {
    write(pctx, CURRENT.with(|c| c.get()) as Handle)
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CUresult {
    let id = ctx as usize;
    if id != 0 && ctx_device(id).is_none() {
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
    write(dev, current_device() as CUdevice)
}

/// Waits for the work of every stream of the current context.
#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    queue::synchronize_device(current_device())
}

#[no_mangle]
pub extern "C" fn cuCtxSetFlags(_flags: c_uint) -> CUresult {
    SUCCESS
}

/// The index of `CUlimit` `limit`, or `CUDA_ERROR_UNSUPPORTED_LIMIT`.
fn limit_index(limit: c_int) -> Result<usize, CUresult> {
    usize::try_from(limit).ok().filter(|&i| i < LIMITS).ok_or(UNSUPPORTED_LIMIT)
}

/// A limit reads back what `cuCtxSetLimit` last set (the emulator enforces
/// none of them: its stack, printf buffer and heap are the host's).
#[no_mangle]
pub extern "C" fn cuCtxGetLimit(v: *mut usize, limit: c_int) -> CUresult {
    match limit_index(limit) {
        Ok(i) => write(v, lock(&emu().devices[current_device()].limits)[i]),
        Err(rc) => rc,
    }
}

#[no_mangle]
pub extern "C" fn cuCtxSetLimit(limit: c_int, v: usize) -> CUresult {
    match limit_index(limit) {
        Ok(i) => {
            lock(&emu().devices[current_device()].limits)[i] = v;
            SUCCESS
        }
        Err(rc) => rc,
    }
}

#[no_mangle]
pub extern "C" fn cuCtxGetCacheConfig(c: *mut c_int) -> CUresult {
    write(c, emu().devices[current_device()].cache_config.load(Ordering::Relaxed))
}

/// Keeps a `CUfunc_cache` (PREFER_NONE, SHARED, L1 or EQUAL) to read back;
/// the emulator has no L1 to split.
#[no_mangle]
pub extern "C" fn cuCtxSetCacheConfig(c: c_int) -> CUresult {
    if !(0..=3).contains(&c) {
        return INVALID_VALUE;
    }
    emu().devices[current_device()].cache_config.store(c, Ordering::Relaxed);
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

// ---- peer access ----

/// Every pair of distinct emulated devices can reach each other's memory.
#[no_mangle]
pub extern "C" fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice) -> CUresult {
    if let Err(rc) = emu().device(dev).and(emu().device(peer)) {
        return rc;
    }
    write(can, c_int::from(dev != peer))
}

/// `CUdevice_P2PAttribute`: performance rank, access supported, native
/// atomics, CUDA array access.
#[no_mangle]
pub extern "C" fn cuDeviceGetP2PAttribute(v: *mut c_int, attr: c_int, src: CUdevice, dst: CUdevice) -> CUresult {
    if let Err(rc) = emu().device(src).and(emu().device(dst)) {
        return rc;
    }
    if src == dst {
        return INVALID_DEVICE;
    }
    match attr {
        1..=4 => write(v, c_int::from(attr != 1)),
        _ => INVALID_VALUE,
    }
}

/// Lets the current context's kernels access the memory of `peer`'s device.
#[no_mangle]
pub extern "C" fn cuCtxEnablePeerAccess(peer: Handle, flags: c_uint) -> CUresult {
    let Some(p) = ctx_device(peer as usize) else { return INVALID_CONTEXT };
    if flags != 0 {
        return INVALID_VALUE;
    }
    let me = current_device();
    if p == me {
        return fail(INVALID_DEVICE, format!("cuCtxEnablePeerAccess: device {me} cannot be its own peer"));
    }
    let mut peers = lock(&emu().devices[me].peers);
    if peers.contains(&p) {
        return PEER_ACCESS_ALREADY_ENABLED;
    }
    peers.push(p);
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuCtxDisablePeerAccess(peer: Handle) -> CUresult {
    let Some(p) = ctx_device(peer as usize) else { return INVALID_CONTEXT };
    let mut peers = lock(&emu().devices[current_device()].peers);
    let before = peers.len();
    peers.retain(|&d| d != p);
    if peers.len() == before {
        PEER_ACCESS_NOT_ENABLED
    } else {
        SUCCESS
    }
}
