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

/// Frees the allocation at `dptr`: from the host (`stream` None, after a
/// check that no unfinished stream work still uses it) or ordered on a
/// stream (`cuMemFreeAsync`: after a check that the stream's work is
/// ordered after every use). The address is retired at once; work already
/// submitted keeps the memory it uses alive until it completes.
fn free(dptr: CUdeviceptr, stream: Option<Handle>) -> CUresult {
    let st = match stream.map(queue::resolve) {
        Some(None) => return INVALID_HANDLE,
        Some(Some(st)) => Some(st),
        None => None,
    };
    if dptr == 0 {
        return SUCCESS;
    }
    let e = emu();
    let live = |d: usize| e.devices[d].memory.snapshot().find(dptr, 1).is_some_and(|r| r.base == dptr);
    let Some(d) = e.device_of(dptr).filter(|&d| live(d)) else {
        return fail(INVALID_VALUE, format!("cuMemFree of {dptr:#x}, which is not the start of a live allocation"));
    };
    let mut hazard = Ok(());
    if e.streamcheck {
        match &st {
            None => {
                let mut t = lock(&e.tracker);
                let host = t.host.clone();
                hazard = t.free(dptr, usize::MAX, &host, "cuMemFree");
            }
            Some(st) => {
                // A free on a stream is an operation of the stream: its clock.
                let work: queue::Work = Box::new(|| Ok(()));
                let what = "cuMemFreeAsync".to_string();
                if let Err(rc) = queue::submit(st, queue::Submit { what, access: Vec::new(), deps: Vec::new(), work }) {
                    return rc;
                }
                let (_, c) = st.last();
                hazard = lock(&e.tracker).free(dptr, st.id, &c, "cuMemFreeAsync");
            }
        }
    }
    e.devices[d].memory.free(dptr);
    if let Err(msg) = hazard {
        return fail(HAZARD, msg);
    }
    // A context with a fault frees, but answers with the fault.
    queue::sticky(d)
}

#[no_mangle]
pub extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    match queue::ctx_error() {
        SUCCESS => alloc(dptr, bytes),
        rc => rc,
    }
}

/// Allocates at once: the memory is usable by the stream's later work (and by any other).
#[no_mangle]
pub extern "C" fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, s: Handle) -> CUresult {
    match queue::resolve(s) {
        None => INVALID_HANDLE,
        Some(st) => match queue::posted(st.device) {
            SUCCESS => alloc(dptr, bytes),
            rc => rc,
        },
    }
}

#[no_mangle]
pub extern "C" fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytes: usize, _p: Handle, s: Handle) -> CUresult {
    cuMemAllocAsync(dptr, bytes, s)
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    free(dptr, None)
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, s: Handle) -> CUresult {
    free(dptr, Some(s))
}

#[no_mangle]
pub extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let rc = queue::ctx_error();
    if rc != SUCCESS {
        return rc;
    }
    let m = &emu().devices[current_device()].memory;
    let rc = write(free, (m.capacity() - m.used()) as usize);
    if rc != SUCCESS {
        return rc;
    }
    write(total, m.capacity() as usize)
}

/// Device bytes an operation uses when it runs: the allocation is kept
/// alive by the buffer's `Arc`, whatever is freed meanwhile.
struct Span {
    buf: Arc<crate::memory::HostBuf>,
    off: usize,
    base: u64,
    len: u64,
}

impl Span {
    fn ptr(&self) -> *mut u8 {
        // SAFETY: `off` is inside the buffer (checked when the span was made).
        unsafe { self.buf.ptr().add(self.off) }
    }

    fn access(&self, write: bool) -> hazard::Access {
        hazard::Access { base: self.base, len: self.len, write }
    }
}

fn span(addr: CUdeviceptr, len: usize, what: &str) -> Result<Span, CUresult> {
    let e = emu();
    e.device_of(addr)
        .and_then(|d| e.devices[d].memory.region(addr, len as u64))
        .map(|(base, alen, buf)| Span { buf, off: (addr - base) as usize, base, len: alen })
        .ok_or_else(|| {
            fail(INVALID_VALUE, format!("{what}: {len} bytes at {addr:#x} are not inside one live device allocation"))
        })
}

/// A host pointer that crosses to a stream's worker.
struct HostPtr(*mut u8);
// SAFETY: the caller keeps the buffer valid until the copy completes (the
// contract of an asynchronous copy with page-locked memory).
unsafe impl Send for HostPtr {}

/// Whether `[p, p + n)` lies in page-locked memory from `cuMemHostAlloc`.
fn pinned(p: *const c_void, n: usize) -> bool {
    let pinned = lock(&emu().pinned);
    let a = p as usize;
    pinned.range(..=a).next_back().is_some_and(|(&b, &len)| a + n <= b + len)
}

/// Where a copy or memset goes: `Some(s)` for an `Async` entry point, None
/// for the synchronous one (the current context's legacy stream).
fn target(stream: Option<Handle>) -> Result<Arc<queue::Stream>, CUresult> {
    let st = match stream {
        Some(s) => queue::resolve(s).ok_or(INVALID_HANDLE)?,
        None => queue::legacy(current_device()),
    };
    match queue::posted(st.device) {
        SUCCESS => Ok(st),
        rc => Err(rc),
    }
}

/// Submits a copy or memset to `st`; with `wait`, returns once it has
/// completed, with the context's sticky error if one arose.
fn enqueue(
    st: &Arc<queue::Stream>,
    what: &str,
    access: Vec<hazard::Access>,
    wait: bool,
    work: queue::Work,
) -> CUresult {
    match queue::submit(st, queue::Submit { what: what.into(), access, deps: Vec::new(), work }) {
        Ok(_) if wait => queue::synchronize(st),
        Ok(_) => SUCCESS,
        Err(rc) => rc,
    }
}

/// Host to device. The synchronous call returns once the copy is done;
/// the asynchronous one from pageable memory takes the bytes at once
/// (CUDA stages them), from page-locked memory when the copy runs.
unsafe fn htod(dst: CUdeviceptr, src: *const c_void, n: usize, stream: Option<Handle>) -> CUresult {
    let st = match target(stream) {
        Ok(st) => st,
        Err(rc) => return rc,
    };
    if n == 0 {
        return SUCCESS;
    }
    if src.is_null() {
        return INVALID_VALUE;
    }
    let what = if stream.is_some() { "cuMemcpyHtoDAsync" } else { "cuMemcpyHtoD" };
    let d = match span(dst, n, what) {
        Ok(d) => d,
        Err(rc) => return rc,
    };
    let access = vec![d.access(true)];
    let work: queue::Work = if stream.is_some() && pinned(src, n) {
        let src = HostPtr(src as *mut u8);
        Box::new(move || {
            let src = src;
            // SAFETY: the page-locked buffer holds `n` bytes until the copy completes (the caller's contract).
            unsafe { std::ptr::copy(src.0, d.ptr(), n) };
            Ok(())
        })
    } else {
        // SAFETY: the host buffer holds `n` bytes (the caller's contract).
        let bytes = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), n) }.to_vec();
        Box::new(move || {
            // SAFETY: the span holds `n` bytes.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), d.ptr(), n) };
            Ok(())
        })
    };
    enqueue(&st, what, access, stream.is_none(), work)
}

/// Device to host: returns once the copy is done, except an asynchronous
/// copy to page-locked memory, which completes on the stream.
unsafe fn dtoh(dst: *mut c_void, src: CUdeviceptr, n: usize, stream: Option<Handle>) -> CUresult {
    let st = match target(stream) {
        Ok(st) => st,
        Err(rc) => return rc,
    };
    if n == 0 {
        return SUCCESS;
    }
    if dst.is_null() {
        return INVALID_VALUE;
    }
    let what = if stream.is_some() { "cuMemcpyDtoHAsync" } else { "cuMemcpyDtoH" };
    let s = match span(src, n, what) {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    let access = vec![s.access(false)];
    let wait = stream.is_none() || !pinned(dst, n);
    let dst = HostPtr(dst.cast());
    let work: queue::Work = Box::new(move || {
        let dst = dst;
        // SAFETY: the host buffer holds `n` bytes until the copy completes.
        unsafe { std::ptr::copy(s.ptr(), dst.0, n) };
        Ok(())
    });
    enqueue(&st, what, access, wait, work)
}

/// Device to device, in stream order (the synchronous call too returns at
/// once, as CUDA's does).
fn dtod(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: Option<Handle>, what: &str) -> CUresult {
    let st = match target(stream) {
        Ok(st) => st,
        Err(rc) => return rc,
    };
    if n == 0 {
        return SUCCESS;
    }
    let s = match span(src, n, &format!("{what} source")) {
        Ok(p) => p,
        Err(rc) => return rc,
    };
    let d = match span(dst, n, &format!("{what} destination")) {
        Ok(p) => p,
        Err(rc) => return rc,
    };
    let access = if s.base == d.base { vec![d.access(true)] } else { vec![s.access(false), d.access(true)] };
    let work: queue::Work = Box::new(move || {
        // SAFETY: both ranges were checked; they may overlap.
        unsafe { std::ptr::copy(s.ptr(), d.ptr(), n) };
        Ok(())
    });
    enqueue(&st, what, access, false, work)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { htod(dst, src, n, None) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, s: Handle) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { htod(dst, src, n, Some(s)) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { dtoh(dst, src, n, None) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, s: Handle) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { dtoh(dst, src, n, Some(s)) }
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    dtod(dst, src, n, None, "cuMemcpyDtoD")
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: Handle) -> CUresult {
    dtod(dst, src, n, Some(s), "cuMemcpyDtoDAsync")
}

/// A copy between the memories of two contexts' devices: each address
/// must belong to its context's device (every emulated device reaches
/// every other's memory for copies, as peer copies do on hardware).
fn peer(dst: CUdeviceptr, dst_ctx: Handle, src: CUdeviceptr, src_ctx: Handle, n: usize, s: Option<Handle>) -> CUresult {
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
    dtod(dst, src, n, s, if s.is_some() { "cuMemcpyPeerAsync" } else { "cuMemcpyPeer" })
}

#[no_mangle]
pub extern "C" fn cuMemcpyPeer(
    dst: CUdeviceptr,
    dst_ctx: Handle,
    src: CUdeviceptr,
    src_ctx: Handle,
    n: usize,
) -> CUresult {
    peer(dst, dst_ctx, src, src_ctx, n, None)
}

#[no_mangle]
pub extern "C" fn cuMemcpyPeerAsync(
    dst: CUdeviceptr,
    dst_ctx: Handle,
    src: CUdeviceptr,
    src_ctx: Handle,
    n: usize,
    s: Handle,
) -> CUresult {
    peer(dst, dst_ctx, src, src_ctx, n, Some(s))
}

/// Sets `n` elements of `elem` bytes, in stream order (the synchronous
/// call too returns at once, as CUDA's does for device memory).
fn memset(dst: CUdeviceptr, value: u32, elem: usize, n: usize, stream: Option<Handle>) -> CUresult {
    let st = match target(stream) {
        Ok(st) => st,
        Err(rc) => return rc,
    };
    if n == 0 {
        return SUCCESS;
    }
    let Some(bytes) = n.checked_mul(elem) else { return INVALID_VALUE };
    if !dst.is_multiple_of(elem as u64) {
        return INVALID_VALUE;
    }
    let d = match span(dst, bytes, "cuMemset") {
        Ok(d) => d,
        Err(rc) => return rc,
    };
    let access = vec![d.access(true)];
    let work: queue::Work = Box::new(move || {
        let v = value.to_le_bytes();
        let p = d.ptr();
        for k in 0..n {
            // SAFETY: within the checked range.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p.add(k * elem), elem) };
        }
        Ok(())
    });
    enqueue(&st, if stream.is_some() { "cuMemsetAsync" } else { "cuMemset" }, access, false, work)
}

/// A memset entry point and its `Async` twin.
macro_rules! memsets {
    ($sync:ident, $async_:ident, $t:ty, $elem:expr) => {
        #[no_mangle]
        pub extern "C" fn $sync(dst: CUdeviceptr, v: $t, n: usize) -> CUresult {
            memset(dst, u32::from(v), $elem, n, None)
        }

        #[no_mangle]
        pub extern "C" fn $async_(dst: CUdeviceptr, v: $t, n: usize, s: Handle) -> CUresult {
            memset(dst, u32::from(v), $elem, n, Some(s))
        }
    };
}

memsets!(cuMemsetD8_v2, cuMemsetD8Async, u8, 1);
memsets!(cuMemsetD16_v2, cuMemsetD16Async, u16, 2);
memsets!(cuMemsetD32_v2, cuMemsetD32Async, u32, 4);

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
        lock(&emu().pinned).insert(p.add(64) as usize, bytes);
        write(pp, p.add(64).cast())
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    if p.is_null() {
        return SUCCESS;
    }
    lock(&emu().pinned).remove(&(p as usize));
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
