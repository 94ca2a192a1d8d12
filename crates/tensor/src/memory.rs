//! Exact memory accounting.
//!
//! Every tensor storage is allocated through [`track_alloc`] and released
//! through [`track_free`] when its last handle drops, so the counters below
//! are exact byte counts of live storage, with the semantics of
//! `torch.cuda.memory_allocated`, `max_memory_allocated`,
//! `reset_peak_memory_stats` and `memory_reserved`.
//!
//! The counters are process-wide per device, as in torch. Tests that assert
//! exact numbers therefore run in a test binary of their own, serialised.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::{Device, Error};

/// A snapshot of one device's allocator counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Bytes of live tensor storage (`torch.cuda.memory_allocated`).
    pub allocated: usize,
    /// Highest `allocated` since the last reset (`max_memory_allocated`).
    pub peak: usize,
    /// Bytes held from the system, live or cached (`memory_reserved`). On the
    /// CPU freed blocks go straight back to the system, so this equals
    /// `allocated`.
    pub reserved: usize,
    /// Largest single allocation since the last reset.
    pub largest_allocation: usize,
    /// Number of storage allocations since the process started.
    pub allocations: u64,
    /// Number of allocations that went to the system (the driver on CUDA);
    /// a caching allocator keeps this flat in a steady loop.
    pub system_allocations: u64,
    /// Highest `reserved` since the last reset (`max_memory_reserved`).
    /// Kept by the CUDA allocator; 0 on the CPU.
    pub peak_reserved: usize,
    /// Segments the CUDA allocator returned to its driver
    /// (`num_device_free`); 0 on the CPU.
    pub system_frees: u64,
    /// Requests retried after the CUDA cache was emptied for lack of
    /// memory (`num_alloc_retries`); 0 on the CPU.
    pub alloc_retries: u64,
    /// Requests that failed for lack of memory after the retry
    /// (`num_ooms`); 0 on the CPU.
    pub ooms: u64,
}

impl std::fmt::Display for MemoryStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = |n: usize| format_bytes(n as f64);
        write!(f, "allocated {}, peak {}, reserved {}", b(self.allocated), b(self.peak), b(self.reserved))
    }
}

/// A byte count in the unit that suits it, as every message and chart of
/// tapir writes one: B below 1 KiB, then KiB, MiB or GiB with two decimals
/// (binary units throughout). Negative counts (differences) keep their sign.
///
/// ```
/// use tapir_tensor::format_bytes;
/// assert_eq!(format_bytes(512.0), "512 B");
/// assert_eq!(format_bytes(3.0 * 1024.0 * 1024.0), "3.00 MiB");
/// ```
pub fn format_bytes(b: f64) -> String {
    const K: f64 = 1024.0;
    let a = b.abs();
    if a < K {
        format!("{b:.0} B")
    } else if a < K * K {
        format!("{:.2} KiB", b / K)
    } else if a < K * K * K {
        format!("{:.2} MiB", b / (K * K))
    } else {
        format!("{:.2} GiB", b / (K * K * K))
    }
}

struct Counters {
    allocated: AtomicUsize,
    peak: AtomicUsize,
    reserved: AtomicUsize,
    largest: AtomicUsize,
    allocations: AtomicU64,
    system_allocations: AtomicU64,
    peak_reserved: AtomicUsize,
    system_frees: AtomicU64,
    alloc_retries: AtomicU64,
    ooms: AtomicU64,
}

impl Counters {
    const fn new() -> Self {
        Counters {
            allocated: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            reserved: AtomicUsize::new(0),
            largest: AtomicUsize::new(0),
            allocations: AtomicU64::new(0),
            system_allocations: AtomicU64::new(0),
            peak_reserved: AtomicUsize::new(0),
            system_frees: AtomicU64::new(0),
            alloc_retries: AtomicU64::new(0),
            ooms: AtomicU64::new(0),
        }
    }
}

const MAX_CUDA_DEVICES: usize = 16;
static CPU: Counters = Counters::new();
static CUDA: [Counters; MAX_CUDA_DEVICES] = [const { Counters::new() }; MAX_CUDA_DEVICES];

fn counters(device: Device) -> &'static Counters {
    match device {
        Device::Cpu => &CPU,
        Device::Cuda(i) => &CUDA[i.min(MAX_CUDA_DEVICES - 1)],
    }
}

/// Records an allocation of `bytes` on `device`. `from_system` says whether
/// the bytes were newly reserved (always on the CPU; a cache miss on CUDA).
pub(crate) fn track_alloc(device: Device, bytes: usize, from_system: bool) {
    let c = counters(device);
    let now = c.allocated.fetch_add(bytes, Ordering::Relaxed) + bytes;
    c.peak.fetch_max(now, Ordering::Relaxed);
    c.largest.fetch_max(bytes, Ordering::Relaxed);
    c.allocations.fetch_add(1, Ordering::Relaxed);
    if from_system {
        c.reserved.fetch_add(bytes, Ordering::Relaxed);
        c.system_allocations.fetch_add(1, Ordering::Relaxed);
    }
}

/// Records that `bytes` on `device` are no longer live; `to_system` says
/// whether they were returned to the system (always on the CPU).
pub(crate) fn track_free(device: Device, bytes: usize, to_system: bool) {
    let c = counters(device);
    c.allocated.fetch_sub(bytes, Ordering::Relaxed);
    if to_system {
        c.reserved.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// The error for an allocation of `requested` bytes on `device` that the
/// system refused; nothing was counted for it.
pub(crate) fn out_of_memory(device: Device, requested: usize) -> Error {
    Error::OutOfMemory { device, requested, stats: Box::new(memory_stats(device)) }
}

/// The counters of `device` now.
pub fn memory_stats(device: Device) -> MemoryStats {
    let c = counters(device);
    MemoryStats {
        allocated: c.allocated.load(Ordering::Relaxed),
        peak: c.peak.load(Ordering::Relaxed),
        reserved: c.reserved.load(Ordering::Relaxed),
        largest_allocation: c.largest.load(Ordering::Relaxed),
        allocations: c.allocations.load(Ordering::Relaxed),
        system_allocations: c.system_allocations.load(Ordering::Relaxed),
        peak_reserved: c.peak_reserved.load(Ordering::Relaxed),
        system_frees: c.system_frees.load(Ordering::Relaxed),
        alloc_retries: c.alloc_retries.load(Ordering::Relaxed),
        ooms: c.ooms.load(Ordering::Relaxed),
    }
}

/// A caching device allocator took a segment of `bytes` from its driver:
/// reserved, and one system allocation, though no tensor holds it yet.
pub(crate) fn track_segment_alloc(device: Device, bytes: usize) {
    let c = counters(device);
    let now = c.reserved.fetch_add(bytes, Ordering::Relaxed) + bytes;
    c.peak_reserved.fetch_max(now, Ordering::Relaxed);
    c.system_allocations.fetch_add(1, Ordering::Relaxed);
}

/// A caching device allocator returned a segment of `bytes` to its driver.
pub(crate) fn track_segment_free(device: Device, bytes: usize) {
    let c = counters(device);
    c.reserved.fetch_sub(bytes, Ordering::Relaxed);
    c.system_frees.fetch_add(1, Ordering::Relaxed);
}

/// A device request was retried after its allocator emptied its cache.
pub(crate) fn track_alloc_retry(device: Device) {
    counters(device).alloc_retries.fetch_add(1, Ordering::Relaxed);
}

/// A device request failed for lack of memory after the retry.
pub(crate) fn track_oom(device: Device) {
    counters(device).ooms.fetch_add(1, Ordering::Relaxed);
}

/// A cached buffer leaves the cache to be filled: it is no longer reserved
/// by the cache (the storage that adopts it reserves it again).
pub(crate) fn track_reuse(device: Device, bytes: usize) {
    counters(device).reserved.fetch_sub(bytes, Ordering::Relaxed);
}

/// The allocation just counted by `track_alloc` reused a cached buffer:
/// it was no system allocation.
pub(crate) fn track_adopted(device: Device) {
    counters(device).system_allocations.fetch_sub(1, Ordering::Relaxed);
}

/// A cached buffer goes back to the system.
pub(crate) fn track_release(device: Device, bytes: usize) {
    counters(device).reserved.fetch_sub(bytes, Ordering::Relaxed);
}

/// Live bytes on `device` (`torch.cuda.memory_allocated`).
pub fn memory_allocated(device: Device) -> usize {
    counters(device).allocated.load(Ordering::Relaxed)
}

/// Peak live bytes on `device` since the last reset
/// (`torch.cuda.max_memory_allocated`).
pub fn max_memory_allocated(device: Device) -> usize {
    counters(device).peak.load(Ordering::Relaxed)
}

/// Resets `device`'s peaks to the current live and reserved bytes, and the
/// largest single allocation to zero: the counters' part of
/// [`crate::reset_peak_memory_stats`], which resets a CUDA allocator's own
/// peaks too.
pub(crate) fn reset_peaks(device: Device) {
    let c = counters(device);
    c.peak.store(c.allocated.load(Ordering::Relaxed), Ordering::Relaxed);
    c.peak_reserved.store(c.reserved.load(Ordering::Relaxed), Ordering::Relaxed);
    c.largest.store(0, Ordering::Relaxed);
}
