//! Device and pinned host memory, copies and memsets, memory pools.

use super::*;

fn alloc(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    if dptr.is_null() || bytes == 0 {
        return INVALID_VALUE;
    }
    let d = current_device();
    let m = &emu().devices[d].memory;
    match m.alloc(bytes as u64) {
        Ok(a) => write(dptr, a),
        Err(_) => fail(
            OUT_OF_MEMORY,
            format!(
                "out of memory on device {d}: {bytes} bytes requested, {} of {} bytes in use",
                m.used(),
                m.capacity()
            ),
        ),
    }
}

fn free(dptr: CUdeviceptr) -> CUresult {
    if dptr == 0 {
        return SUCCESS;
    }
    let e = emu();
    if e.device_of(dptr).is_some_and(|d| e.devices[d].memory.free(dptr)) {
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
    let m = &emu().devices[current_device()].memory;
    let rc = write(free, (m.capacity() - m.used()) as usize);
    if rc != SUCCESS {
        return rc;
    }
    write(total, m.capacity() as usize)
}

fn dev_ptr(addr: CUdeviceptr, len: usize, what: &str) -> Result<*mut u8, CUresult> {
    emu().host_ptr(addr, len as u64).ok_or_else(|| {
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

/// A copy between the memories of two contexts' devices: each address
/// must belong to its context's device (every emulated device reaches
/// every other's memory for copies, as peer copies do on hardware).
fn peer(dst: CUdeviceptr, dst_ctx: Handle, src: CUdeviceptr, src_ctx: Handle, n: usize) -> CUresult {
    let (Some(dd), Some(sd)) = (ctx_device(dst_ctx as usize), ctx_device(src_ctx as usize)) else {
        return INVALID_CONTEXT;
    };
    if n == 0 {
        return SUCCESS;
    }
    let e = emu();
    for (what, addr, dev) in [("destination", dst, dd), ("source", src, sd)] {
        if e.device_of(addr) != Some(dev) {
            return fail(
                INVALID_VALUE,
                format!("cuMemcpyPeer {what} {addr:#x} is not memory of device {dev}, its context's device"),
            );
        }
    }
    dtod(dst, src, n)
}

with_async!(cuMemcpyPeer, cuMemcpyPeerAsync,
    (dst: CUdeviceptr, dst_ctx: Handle, src: CUdeviceptr, src_ctx: Handle, n: usize) =>
    peer(dst, dst_ctx, src, src_ctx, n));

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
    if let Err(rc) = emu().device(dev) {
        return rc;
    }
    write(pool, (0x9001 + dev as usize) as Handle)
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
