//! Device memory: host buffers behind made-up device addresses.
//!
//! Addresses are handed out from a counter and never reused, with a gap
//! after every allocation, so an access one past the end, or to a freed
//! buffer, falls outside every live allocation and the sanitizer sees it.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Where device addresses start (high, like a real driver's, so a host
/// pointer or a small integer passed as a device pointer is caught).
pub const GLOBAL_BASE: u64 = 0x7f00_0000_0000;
/// Generic addresses of shared memory: `SHARED_WIN + offset`.
pub const SHARED_WIN: u64 = 0x1000_0000_0000;
/// Generic addresses of local memory: `LOCAL_WIN + offset`.
pub const LOCAL_WIN: u64 = 0x2000_0000_0000;
/// Size of each of those windows.
pub const WIN_SIZE: u64 = 1 << 32;
/// Alignment of every allocation, as cudaMalloc guarantees.
const ALIGN: u64 = 256;
/// Unmapped bytes after each allocation.
const GAP: u64 = 4096;

/// A zeroed host buffer with the alignment of a device allocation.
pub struct HostBuf {
    ptr: *mut u8,
    len: usize,
    /// The initcheck shadow when it is on: bit `k % 64` of word `k / 64`
    /// says whether byte `k` has been written since the allocation.
    written: Option<Box<[AtomicU64]>>,
}

// SAFETY: the buffer is plain memory; concurrent access is governed by the
// kernels that use it, as on a device.
unsafe impl Send for HostBuf {}
// SAFETY: as above.
unsafe impl Sync for HostBuf {}

impl HostBuf {
    /// Allocates `len` zeroed bytes, or None when the host has no memory;
    /// with a shadow of written bytes when `initcheck`.
    fn new(len: usize, initcheck: bool) -> Option<HostBuf> {
        let layout = Layout::from_size_align(len.max(1), ALIGN as usize).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let written = initcheck.then(|| (0..len.div_ceil(64)).map(|_| AtomicU64::new(0)).collect());
        (!ptr.is_null()).then_some(HostBuf { ptr, len, written })
    }

    /// The buffer's first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The initcheck shadow (see [`mark_written`], [`first_unwritten`]),
    /// or None when the buffer was allocated with initcheck off.
    pub fn written(&self) -> Option<&[AtomicU64]> {
        self.written.as_deref()
    }
}

/// The bits of word `w` covering bytes `[off, off + len)` of the buffer.
#[inline]
fn word_bits(w: usize, off: usize, len: usize) -> u64 {
    let lo = off.max(w * 64) - w * 64;
    let hi = (off + len).min(w * 64 + 64) - w * 64;
    if hi - lo == 64 {
        u64::MAX
    } else {
        ((1u64 << (hi - lo)) - 1) << lo
    }
}

/// Records bytes `[off, off + len)` of a shadow as written.
#[inline]
pub fn mark_written(shadow: &[AtomicU64], off: usize, len: usize) {
    if len == 0 {
        return;
    }
    let first = off / 64;
    for (w, word) in (first..).zip(&shadow[first..=(off + len - 1) / 64]) {
        let bits = word_bits(w, off, len);
        // Most stores land on bytes already written: skip the locked update.
        if word.load(Ordering::Relaxed) & bits != bits {
            word.fetch_or(bits, Ordering::Relaxed);
        }
    }
}

/// The first byte of `[off, off + len)` never written, if any.
#[inline]
pub fn first_unwritten(shadow: &[AtomicU64], off: usize, len: usize) -> Option<usize> {
    if len == 0 {
        return None;
    }
    let first = off / 64;
    for (w, word) in (first..).zip(&shadow[first..=(off + len - 1) / 64]) {
        let missing = !word.load(Ordering::Relaxed) & word_bits(w, off, len);
        if missing != 0 {
            return Some(w * 64 + missing.trailing_zeros() as usize);
        }
    }
    None
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len.max(1), ALIGN as usize).expect("internal: layout was valid");
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

/// One live allocation in a snapshot.
#[derive(Clone)]
pub struct Region {
    pub base: u64,
    pub len: u64,
    pub buf: Arc<HostBuf>,
}

/// The live allocations at one moment, sorted by address: what a launch
/// checks its accesses against. The buffers are kept alive by the
/// snapshot, so a free during a launch cannot pull memory from under it.
#[derive(Clone, Default)]
pub struct Snapshot {
    pub regions: Vec<Region>,
    /// Recently freed ranges, for messages: `(base, len)`.
    pub freed: Vec<(u64, u64)>,
}

impl Snapshot {
    /// The region holding `[addr, addr + len)`, if one does.
    #[inline]
    pub fn find(&self, addr: u64, len: u64) -> Option<&Region> {
        let k = self.regions.partition_point(|r| r.base <= addr);
        let r = self.regions.get(k.checked_sub(1)?)?;
        (addr.checked_add(len)? <= r.base + r.len).then_some(r)
    }

    /// Describes an address outside every allocation, as memcheck does.
    pub fn describe(&self, addr: u64, len: u64) -> String {
        for &(b, l) in self.freed.iter().rev() {
            if addr >= b && addr < b.saturating_add(l + GAP) {
                return format!("the address is inside or just past a {l}-byte allocation at {b:#x} that was freed");
            }
        }
        let k = self.regions.partition_point(|r| r.base <= addr);
        if let Some(r) = k.checked_sub(1).and_then(|k| self.regions.get(k)) {
            if addr < r.base + r.len + GAP {
                let past = addr.saturating_add(len).saturating_sub(r.base + r.len);
                return format!(
                    "the access ends {past} bytes past the end of a {}-byte allocation at {:#x}",
                    r.len, r.base
                );
            }
        }
        if let Some(r) = self.regions.get(k) {
            if r.base - addr < GAP {
                return format!(
                    "the address is {} bytes before a {}-byte allocation at {:#x}",
                    r.base - addr,
                    r.len,
                    r.base
                );
            }
        }
        "the address is not in any allocation".into()
    }
}

/// Why an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocError {
    /// Past the device's capacity, or the host had no memory.
    OutOfMemory,
}

struct State {
    live: BTreeMap<u64, Arc<HostBuf>>,
    lens: BTreeMap<u64, u64>,
    next: u64,
    used: u64,
    freed: Vec<(u64, u64)>,
    snapshot: Option<Arc<Snapshot>>,
}

/// The device's memory.
pub struct Memory {
    capacity: u64,
    state: Mutex<State>,
    /// Whether new allocations get an initcheck shadow.
    initcheck: AtomicBool,
}

impl Memory {
    /// An empty device memory of `capacity` bytes, with initcheck on when
    /// `TAPIR_CUDA_EMU_INITCHECK=1`.
    pub fn new(capacity: u64) -> Memory {
        Memory::with_base(capacity, GLOBAL_BASE)
    }

    /// An empty device memory of `capacity` bytes whose addresses start at
    /// `base`: each emulated device has a range of its own, so an address
    /// names its device (unified addressing, as on hardware).
    pub fn with_base(capacity: u64, base: u64) -> Memory {
        Memory {
            initcheck: AtomicBool::new(std::env::var("TAPIR_CUDA_EMU_INITCHECK").is_ok_and(|v| v == "1")),
            capacity,
            state: Mutex::new(State {
                live: BTreeMap::new(),
                lens: BTreeMap::new(),
                next: base,
                used: 0,
                freed: Vec::new(),
                snapshot: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Turns initcheck on or off for allocations made from now on: a
    /// kernel's global load of bytes of such an allocation that nothing has
    /// written since it was made fails the launch.
    pub fn set_initcheck(&self, on: bool) {
        self.initcheck.store(on, Ordering::Relaxed);
    }

    /// The capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes in live allocations.
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// Allocates `len` bytes; zero bytes is an error, as in the driver
    /// (the caller checks that).
    pub fn alloc(&self, len: u64) -> Result<u64, AllocError> {
        let mut s = self.lock();
        let rounded = len.div_ceil(ALIGN) * ALIGN;
        if s.used.checked_add(rounded).is_none_or(|u| u > self.capacity) {
            return Err(AllocError::OutOfMemory);
        }
        let initcheck = self.initcheck.load(Ordering::Relaxed);
        let buf = usize::try_from(len).ok().and_then(|n| HostBuf::new(n, initcheck)).ok_or(AllocError::OutOfMemory)?;
        let base = s.next;
        s.next = base + rounded + GAP;
        s.used += rounded;
        s.live.insert(base, Arc::new(buf));
        s.lens.insert(base, len);
        s.snapshot = None;
        Ok(base)
    }

    /// Frees the allocation at `base`; false when there is none.
    pub fn free(&self, base: u64) -> bool {
        let mut s = self.lock();
        if s.live.remove(&base).is_none() {
            return false;
        }
        let len = s.lens.remove(&base).unwrap_or(0);
        s.used -= len.div_ceil(ALIGN) * ALIGN;
        s.freed.push((base, len));
        if s.freed.len() > 4096 {
            s.freed.remove(0);
        }
        s.snapshot = None;
        true
    }

    /// The live allocations now.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        let mut s = self.lock();
        if let Some(snap) = &s.snapshot {
            return snap.clone();
        }
        let regions = s.live.iter().map(|(&base, buf)| Region { base, len: s.lens[&base], buf: buf.clone() }).collect();
        let snap = Arc::new(Snapshot { regions, freed: s.freed.clone() });
        s.snapshot = Some(snap.clone());
        snap
    }

    /// The allocation holding `[addr, addr + len)`: its start, length and
    /// buffer (kept alive by the `Arc` for work that runs later). The range
    /// counts as written for initcheck, as with [`Memory::host_ptr`].
    pub fn region(&self, addr: u64, len: u64) -> Option<(u64, u64, Arc<HostBuf>)> {
        let s = self.lock();
        let (&base, buf) = s.live.range(..=addr).next_back()?;
        let alloc_len = s.lens[&base];
        if addr.checked_add(len)? > base + alloc_len {
            return None;
        }
        if let Some(w) = buf.written() {
            mark_written(w, (addr - base) as usize, len as usize);
        }
        Some((base, alloc_len, buf.clone()))
    }

    /// A host pointer to `[addr, addr + len)` when it lies in one live
    /// allocation. The pointer stays valid while the allocation lives.
    /// For initcheck the range counts as written: the driver's copies and
    /// memsets come through here (so, conservatively, do reads to the host).
    pub fn host_ptr(&self, addr: u64, len: u64) -> Option<*mut u8> {
        let s = self.lock();
        let (&base, buf) = s.live.range(..=addr).next_back()?;
        let end = base + s.lens[&base];
        if addr.checked_add(len)? > end {
            return None;
        }
        if let Some(w) = buf.written() {
            mark_written(w, (addr - base) as usize, len as usize);
        }
        // SAFETY: addr - base is within the buffer.
        Some(unsafe { buf.ptr().add((addr - base) as usize) })
    }
}
