//! Freed CPU buffers kept for reuse, the CPU side of the caching allocator.
//!
//! A graph frees all its values when its scope ends, and the next step
//! allocates the same sizes again. Handed back to the system, every one of
//! those buffers is faulted in and zeroed afresh by the kernel page by page:
//! several times the cost of the elementwise pass that fills it
//! (docs/performance.md).
//! So buffers of 64 KiB and more are kept here when freed, keyed by their
//! exact size and alignment, and handed out again by the kernels that fill
//! fresh outputs. Smaller ones go back to malloc, whose bins already reuse
//! them without faults.
//!
//! The accounting follows `torch.cuda`: a cached buffer is not allocated
//! but still reserved, so `reserved = allocated + cached` at all times;
//! [`empty_cache`] returns the cached bytes to the system. At most
//! [`MAX_CACHED_BYTES`] are kept.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::memory::{track_release, track_reuse};
use crate::Device;

/// Buffers smaller than this are not cached.
pub const MIN_CACHED_BYTES: usize = 64 << 10;
/// The cache holds at most this many bytes; buffers freed beyond it go back
/// to the system.
pub const MAX_CACHED_BYTES: usize = 1 << 30;

/// A cached buffer's pointer. Kept as a pointer, not an address, so the
/// buffer handed out again carries the provenance of its allocation (Miri
/// checks accesses through it; a pointer made from an integer it cannot).
struct FreeBuf(*mut u8);

// SAFETY: a cached buffer is owned by the cache alone (behind its mutex)
// until `take` hands it to exactly one vector.
unsafe impl Send for FreeBuf {}

struct Cache {
    /// Free buffers by (bytes, alignment).
    free: BTreeMap<(usize, usize), Vec<FreeBuf>>,
    bytes: usize,
    /// Buffers `take` handed out from the cache that no storage has adopted
    /// yet: their provenance, so the storage that adopts one counts a
    /// reuse, not a system allocation, however many are in flight at once
    /// and on whichever thread they become tensors.
    lent: Vec<usize>,
}

static CACHE: Mutex<Cache> = Mutex::new(Cache { free: BTreeMap::new(), bytes: 0, lent: Vec::new() });

/// How many buffers are lent: while none is (a loop of small tensors), a
/// storage's adoption check is one atomic load, without the lock.
static LENT: AtomicUsize = AtomicUsize::new(0);

fn lock() -> std::sync::MutexGuard<'static, Cache> {
    CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

/// An empty vector with room for exactly `n` elements: a cached buffer of
/// that size when there is one, else a fresh allocation (after emptying the
/// cache, if the first try finds no memory). Public for kernels outside
/// this crate that write every element themselves (through
/// `spare_capacity_mut`, then `set_len`), where [`filled`] would write
/// each element twice.
pub fn take<T>(n: usize) -> crate::Result<Vec<T>> {
    let (size, align) = (std::mem::size_of::<T>(), std::mem::align_of::<T>());
    // A size that overflows is never cached; `try_vec` reports it.
    let bytes = n.saturating_mul(size);
    if size > 0 && bytes >= MIN_CACHED_BYTES {
        let hit = {
            let mut c = lock();
            let p = c.free.get_mut(&(bytes, align)).and_then(|v| v.pop());
            if let Some(p) = &p {
                c.bytes -= bytes;
                c.lent.push(p.0 as usize);
                LENT.fetch_add(1, Ordering::Relaxed);
            }
            p
        };
        if let Some(p) = hit {
            track_reuse(Device::Cpu, bytes);
            // SAFETY: `p` came from a `Vec` whose allocation had exactly this
            // layout (`bytes` = capacity * size, `align`), given up by `give`
            // and owned by nobody since; a capacity of `n` elements of `T`
            // describes that same layout.
            return Ok(unsafe { Vec::from_raw_parts(p.0.cast::<T>(), 0, n) });
        }
    }
    // Out of memory with buffers cached: give them back and try once more.
    try_vec(n).or_else(|_| {
        empty_cache();
        try_vec(n)
    })
}

/// An empty vector with room for exactly `n` elements, fresh from the
/// system, or [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the
/// system refuses (never an abort). Every host buffer of a size chosen by
/// a user is allocated through here (or [`take`], which reuses a cached
/// one first) or [`crate::CpuBuffer::zeros`].
pub(crate) fn try_vec<T>(n: usize) -> crate::Result<Vec<T>> {
    let mut v = Vec::new();
    let bytes = n.saturating_mul(std::mem::size_of::<T>());
    v.try_reserve_exact(n).map_err(|_| crate::memory::out_of_memory(Device::Cpu, bytes))?;
    fresh(v.as_ptr() as usize, bytes);
    Ok(v)
}

/// A vector of `n` copies of `value`, in a cached buffer when one of that
/// size is free: the way for kernels outside this crate to get an output
/// buffer that becomes a tensor. Every element is written here, so pages
/// of a fresh buffer are faulted in once, for writing (a zeroed `vec!`
/// maps the shared zero page on the first read and copies it on the first
/// write, and on a multi-threaded process each such copy flushes the other
/// cores' TLBs).
pub fn filled<T: Copy>(n: usize, value: T) -> crate::Result<Vec<T>> {
    let mut v = take(n)?;
    v.resize(n, value);
    Ok(v)
}

/// True when `ptr` (of a buffer of `bytes`) is a buffer `take` lent from
/// the cache, which it then forgets: the storage adopting it is not a
/// system allocation.
pub(crate) fn adopt(ptr: usize, bytes: usize) -> bool {
    if ptr == 0 || bytes < MIN_CACHED_BYTES || LENT.load(Ordering::Relaxed) == 0 {
        return false;
    }
    forget_lent(&mut lock(), ptr)
}

/// Removes `ptr` from the lent buffers; true when it was one.
fn forget_lent(c: &mut Cache, ptr: usize) -> bool {
    let Some(i) = c.lent.iter().position(|&p| p == ptr) else { return false };
    c.lent.swap_remove(i);
    LENT.fetch_sub(1, Ordering::Relaxed);
    true
}

/// A fresh allocation at `ptr` of `bytes`: if a lent buffer at that
/// address was dropped without becoming a storage (an error between
/// `take` and the tensor), its entry is stale and goes, so the fresh
/// buffer is not mistaken for a reused one.
pub(crate) fn fresh(ptr: usize, bytes: usize) {
    if ptr != 0 && bytes >= MIN_CACHED_BYTES && LENT.load(Ordering::Relaxed) > 0 {
        forget_lent(&mut lock(), ptr);
    }
}

/// Keeps `v`'s buffer for reuse if it is large enough and the cache has
/// room; true when kept (the caller must then not count it freed to the
/// system).
pub(crate) fn give<T>(v: Vec<T>) -> bool {
    let (size, align) = (std::mem::size_of::<T>(), std::mem::align_of::<T>());
    let bytes = v.capacity() * size;
    // Only exact buffers (capacity = length, as every kernel's output is),
    // so the cache holds exactly the bytes the storage counted.
    if size == 0 || bytes < MIN_CACHED_BYTES || v.capacity() != v.len() {
        return false;
    }
    let mut c = lock();
    if c.bytes + bytes > MAX_CACHED_BYTES {
        return false;
    }
    // A lent buffer back before any storage adopted it is simply cached.
    forget_lent(&mut c, v.as_ptr() as usize);
    let mut v = std::mem::ManuallyDrop::new(v);
    c.free.entry((bytes, align)).or_default().push(FreeBuf(v.as_mut_ptr().cast::<u8>()));
    c.bytes += bytes;
    true
}

/// Bytes the CPU cache holds (reserved, not allocated).
pub fn cached_bytes() -> usize {
    lock().bytes
}

/// Returns every cached CPU buffer to the system
/// (`torch.cuda.empty_cache`); reserved bytes drop to the allocated ones.
pub fn empty_cache() {
    let free = {
        let mut c = lock();
        c.bytes = 0;
        std::mem::take(&mut c.free)
    };
    for ((bytes, align), ptrs) in free {
        let layout = Layout::from_size_align(bytes, align).expect("internal: a layout a Vec had");
        for p in ptrs {
            // SAFETY: each pointer is a live allocation of the global
            // allocator with this layout, owned by the cache alone.
            unsafe { std::alloc::dealloc(p.0, layout) };
            track_release(Device::Cpu, bytes);
        }
    }
}
