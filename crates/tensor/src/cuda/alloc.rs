//! The caching allocator of CUDA device memory, after PyTorch's
//! CUDACachingAllocator.
//!
//! Requests are rounded up to 512-byte granules. Blocks of up to 1 MiB come
//! from the small pool, carved out of 2 MiB segments; larger ones from the
//! large pool, whose segments are 20 MiB for requests under 10 MiB and the
//! request rounded up to 2 MiB otherwise. A free block that fits is split
//! when the rest is worth keeping, and a freed block is merged with its
//! free neighbours of the same segment, so a steady loop finds every block
//! it needs in the cache and asks the driver for nothing after its first
//! step. When the driver is out of memory, every cached segment goes back
//! to it and the request is tried once more.
//!
//! The core is generic over [`SegmentDriver`], so its bookkeeping is tested
//! against a fake driver without a GPU.

use std::collections::{BTreeMap, BTreeSet};

/// Every block size is a multiple of this.
pub const GRANULE: usize = 512;
/// The largest block the small pool serves.
pub const SMALL_BLOCK_MAX: usize = 1 << 20;
/// The segment size of the small pool.
pub const SMALL_SEGMENT: usize = 2 << 20;
/// Requests under this get a [`LARGE_SEGMENT`] from the large pool.
pub const MIN_LARGE_ALLOC: usize = 10 << 20;
/// The segment size for large-pool requests under [`MIN_LARGE_ALLOC`].
pub const LARGE_SEGMENT: usize = 20 << 20;
/// Larger segments are rounded up to a multiple of this.
pub const ROUND_LARGE: usize = 2 << 20;

/// Why the driver refused a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverFailure {
    /// CUDA_ERROR_OUT_OF_MEMORY: worth retrying after freeing the cache.
    OutOfMemory,
    /// Any other failure, in words.
    Other(String),
}

/// Where segments come from: the CUDA driver, or a fake in tests.
pub trait SegmentDriver {
    /// A fresh segment of `bytes`, or why not.
    fn alloc(&mut self, bytes: usize) -> Result<u64, DriverFailure>;
    /// Returns a segment the driver gave.
    fn free(&mut self, ptr: u64, bytes: usize);
}

/// Why an allocation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocFailure {
    /// Out of memory even after the cache was emptied and the request retried.
    OutOfMemory {
        /// The bytes asked for (before rounding).
        requested: usize,
    },
    /// The driver failed otherwise.
    Driver(String),
}

/// The allocator's own counters, with torch.cuda's names in mind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllocStats {
    /// Bytes of blocks in use, rounded sizes.
    pub allocated: usize,
    /// Highest `allocated` since the last reset.
    pub peak_allocated: usize,
    /// Bytes of every segment held from the driver.
    pub reserved: usize,
    /// Highest `reserved` since the last reset.
    pub peak_reserved: usize,
    /// Blocks in use.
    pub active_blocks: usize,
    /// Segments held from the driver.
    pub segments: usize,
    /// Segments asked of the driver.
    pub driver_allocs: u64,
    /// Segments returned to the driver.
    pub driver_frees: u64,
    /// Requests retried after the cache was emptied for lack of memory.
    pub alloc_retries: u64,
    /// Requests that failed for lack of memory after the retry.
    pub ooms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Pool {
    Small,
    Large,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    size: usize,
    /// The start of the segment the block was carved from.
    segment: u64,
    pool: Pool,
    in_use: bool,
}

/// The caching allocator over a driver.
#[derive(Debug)]
pub struct CachingAllocator<D> {
    driver: D,
    /// Every block, in use or free, by address.
    blocks: BTreeMap<u64, Block>,
    /// Free blocks by (pool, size, address): the first at or after a
    /// request's key is the best fit.
    free: BTreeSet<(Pool, usize, u64)>,
    /// Segment sizes by start address.
    segments: BTreeMap<u64, (usize, Pool)>,
    stats: AllocStats,
}

/// `bytes` rounded up to the granule (at least one granule).
pub fn round_size(bytes: usize) -> usize {
    bytes.max(1).div_ceil(GRANULE).saturating_mul(GRANULE)
}

fn segment_size(rounded: usize) -> usize {
    if rounded <= SMALL_BLOCK_MAX {
        SMALL_SEGMENT
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_SEGMENT
    } else {
        rounded.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

impl<D: SegmentDriver> CachingAllocator<D> {
    /// An empty cache over `driver`.
    pub fn new(driver: D) -> Self {
        CachingAllocator {
            driver,
            blocks: BTreeMap::new(),
            free: BTreeSet::new(),
            segments: BTreeMap::new(),
            stats: AllocStats::default(),
        }
    }

    /// The counters now.
    pub fn stats(&self) -> AllocStats {
        self.stats
    }

    /// The driver (tests read a fake's log through it).
    pub fn driver(&self) -> &D {
        &self.driver
    }

    /// Resets the peaks to the current values.
    pub fn reset_peaks(&mut self) {
        self.stats.peak_allocated = self.stats.allocated;
        self.stats.peak_reserved = self.stats.reserved;
    }

    /// A block of at least `bytes`: its address, its size (rounded, or
    /// more when the rest was too small to split off) and
    /// whether a new segment had to be asked of the driver for it.
    pub fn alloc(&mut self, bytes: usize) -> Result<(u64, usize, bool), AllocFailure> {
        let size = round_size(bytes);
        let pool = if size <= SMALL_BLOCK_MAX { Pool::Small } else { Pool::Large };
        let (ptr, fresh) = match self.free.range((pool, size, 0)..).next().copied() {
            Some(key @ (p, _, ptr)) if p == pool => {
                self.free.remove(&key);
                (ptr, false)
            }
            _ => (self.new_segment(bytes, size, pool)?, true),
        };
        self.split(ptr, size);
        let b = self.blocks.get_mut(&ptr).expect("a free block is in the map");
        b.in_use = true;
        // A block left unsplit is larger than asked: it is counted whole.
        let size = b.size;
        let s = &mut self.stats;
        s.allocated += size;
        s.peak_allocated = s.peak_allocated.max(s.allocated);
        s.active_blocks += 1;
        Ok((ptr, size, fresh))
    }

    /// Asks the driver for a segment holding `size`, emptying the cache and
    /// retrying once when it is out of memory; the segment is one free block.
    fn new_segment(&mut self, requested: usize, size: usize, pool: Pool) -> Result<u64, AllocFailure> {
        let seg = segment_size(size);
        let ptr = match self.driver.alloc(seg) {
            Ok(p) => p,
            Err(DriverFailure::OutOfMemory) => {
                self.stats.alloc_retries += 1;
                self.empty_cache();
                match self.driver.alloc(seg) {
                    Ok(p) => p,
                    Err(DriverFailure::OutOfMemory) => {
                        self.stats.ooms += 1;
                        return Err(AllocFailure::OutOfMemory { requested });
                    }
                    Err(DriverFailure::Other(why)) => return Err(AllocFailure::Driver(why)),
                }
            }
            Err(DriverFailure::Other(why)) => return Err(AllocFailure::Driver(why)),
        };
        self.segments.insert(ptr, (seg, pool));
        self.blocks.insert(ptr, Block { size: seg, segment: ptr, pool, in_use: false });
        let s = &mut self.stats;
        s.reserved += seg;
        s.peak_reserved = s.peak_reserved.max(s.reserved);
        s.segments += 1;
        s.driver_allocs += 1;
        Ok(ptr)
    }

    /// Splits the free block at `ptr` (out of the free set) to `size` when
    /// the rest is worth keeping: any granule in the small pool, more than
    /// a small block in the large one (smaller rests would fragment it).
    fn split(&mut self, ptr: u64, size: usize) {
        let b = self.blocks[&ptr];
        let rest = b.size - size;
        let worth = match b.pool {
            Pool::Small => rest >= GRANULE,
            Pool::Large => rest > SMALL_BLOCK_MAX,
        };
        if !worth {
            return;
        }
        let tail = ptr + size as u64;
        self.blocks.insert(tail, Block { size: rest, ..b });
        self.free.insert((b.pool, rest, tail));
        self.blocks.get_mut(&ptr).expect("just read").size = size;
    }

    /// Returns the block at `ptr` to the cache, merged with its free
    /// neighbours; the driver is not called. An address that is not a
    /// block in use is ignored (and reported as false).
    pub fn free(&mut self, ptr: u64) -> bool {
        let Some(b) = self.blocks.get_mut(&ptr).filter(|b| b.in_use) else { return false };
        b.in_use = false;
        let mut b = *b;
        self.stats.allocated -= b.size;
        self.stats.active_blocks -= 1;
        let mut start = ptr;
        // The next block, when free and of the same segment.
        let next = ptr + b.size as u64;
        if let Some(n) = self.blocks.get(&next).copied().filter(|n| !n.in_use && n.segment == b.segment) {
            self.free.remove(&(n.pool, n.size, next));
            self.blocks.remove(&next);
            b.size += n.size;
        }
        // The previous one, likewise.
        if let Some((&p, &pb)) = self.blocks.range(..ptr).next_back() {
            if !pb.in_use && pb.segment == b.segment && p + pb.size as u64 == ptr {
                self.free.remove(&(pb.pool, pb.size, p));
                self.blocks.remove(&ptr);
                b.size += pb.size;
                start = p;
            }
        }
        self.blocks.insert(start, b);
        self.free.insert((b.pool, b.size, start));
        true
    }

    /// Returns every segment with no block in use to the driver.
    pub fn empty_cache(&mut self) {
        let whole: Vec<(u64, usize)> = self
            .segments
            .iter()
            .filter(|(p, (size, _))| self.blocks.get(p).is_some_and(|b| !b.in_use && b.size == *size))
            .map(|(&p, &(size, _))| (p, size))
            .collect();
        for (p, size) in whole {
            let b = self.blocks.remove(&p).expect("checked above");
            self.free.remove(&(b.pool, b.size, p));
            self.segments.remove(&p);
            self.driver.free(p, size);
            let s = &mut self.stats;
            s.reserved -= size;
            s.segments -= 1;
            s.driver_frees += 1;
        }
    }

    /// The free blocks of each pool, as (bytes, count), for summaries.
    pub fn cached(&self) -> [(usize, usize); 2] {
        let mut out = [(0, 0); 2];
        for &(pool, size, _) in &self.free {
            let i = pool as usize;
            out[i].0 += size;
            out[i].1 += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    //! The allocator against a fake driver that hands out addresses from a
    //! counter, keeps a log and runs out of memory at a set capacity.

    use super::*;

    #[derive(Debug, Default)]
    struct Fake {
        next: u64,
        live: BTreeMap<u64, usize>,
        capacity: usize,
        allocs: Vec<usize>,
        frees: Vec<usize>,
    }

    impl SegmentDriver for Fake {
        fn alloc(&mut self, bytes: usize) -> Result<u64, DriverFailure> {
            if self.live.values().sum::<usize>() + bytes > self.capacity {
                return Err(DriverFailure::OutOfMemory);
            }
            // A gap after each segment, so neighbouring segments never touch.
            let p = self.next + (1 << 40);
            self.next = p + bytes as u64;
            self.live.insert(p, bytes);
            self.allocs.push(bytes);
            Ok(p)
        }
        fn free(&mut self, ptr: u64, bytes: usize) {
            assert_eq!(self.live.remove(&ptr), Some(bytes), "freed what it was given");
            self.frees.push(bytes);
        }
    }

    fn alloc(capacity: usize) -> CachingAllocator<Fake> {
        CachingAllocator::new(Fake { capacity, ..Fake::default() })
    }

    #[test]
    fn cuda_alloc_sizes_round_to_granules_and_pick_the_pool_segment() {
        assert_eq!((round_size(0), round_size(1), round_size(512), round_size(513)), (512, 512, 512, 1024));
        assert_eq!(segment_size(512), SMALL_SEGMENT);
        assert_eq!(segment_size(SMALL_BLOCK_MAX), SMALL_SEGMENT);
        assert_eq!(segment_size(SMALL_BLOCK_MAX + 512), LARGE_SEGMENT);
        assert_eq!(segment_size(MIN_LARGE_ALLOC), MIN_LARGE_ALLOC.div_ceil(ROUND_LARGE) * ROUND_LARGE);
        assert_eq!(segment_size(11 << 20), 12 << 20);
    }

    #[test]
    fn cuda_alloc_freed_blocks_are_reused_without_the_driver() {
        let mut a = alloc(1 << 30);
        let (p, size, fresh) = a.alloc(1000).unwrap();
        assert_eq!((size, fresh), (1024, true));
        assert!(a.free(p));
        // The same request again, and a step of them: no new segment.
        let (q, _, fresh) = a.alloc(1000).unwrap();
        assert_eq!((q, fresh), (p, false));
        a.free(q);
        for _ in 0..3 {
            let xs: Vec<u64> = (0..10).map(|i| a.alloc(100 + 4000 * i).unwrap().0).collect();
            xs.into_iter().for_each(|x| assert!(a.free(x)));
        }
        assert_eq!(a.driver().allocs, vec![SMALL_SEGMENT]);
        let s = a.stats();
        assert_eq!((s.allocated, s.active_blocks, s.reserved, s.driver_allocs), (0, 0, SMALL_SEGMENT, 1));
        assert!(!a.free(p), "a double free is refused");
    }

    #[test]
    fn cuda_alloc_blocks_split_and_coalesce_back_into_one_segment() {
        let mut a = alloc(1 << 30);
        let (x, _, _) = a.alloc(512).unwrap();
        let (y, _, _) = a.alloc(1024).unwrap();
        let (z, _, _) = a.alloc(512).unwrap();
        // Carved one after another from one segment.
        assert_eq!((y - x, z - y), (512, 1024));
        assert_eq!(a.cached()[0], (SMALL_SEGMENT - 2048, 1));
        // Freeing the middle leaves a hole that is not merged with live blocks.
        a.free(y);
        assert_eq!(a.cached()[0], (SMALL_SEGMENT - 2048 + 1024, 2));
        // A request that fits the hole takes it (best fit).
        let (w, _, _) = a.alloc(700).unwrap();
        assert_eq!(w, y);
        a.free(w);
        a.free(x);
        assert_eq!(a.cached()[0], (SMALL_SEGMENT - 512, 2), "x merged with the hole");
        a.free(z);
        assert_eq!(a.cached()[0], (SMALL_SEGMENT, 1), "everything merged back into the segment");
        assert_eq!(a.blocks.len(), 1);
        // Large pool: a 3 MiB block from a 20 MiB segment, the rest split off.
        let (l, size, _) = a.alloc(3 << 20).unwrap();
        assert_eq!(size, 3 << 20);
        assert_eq!(a.cached()[1], (LARGE_SEGMENT - (3 << 20), 1));
        // A rest of 1 MiB or less is not split off in the large pool.
        let (m, msize, fresh) = a.alloc(LARGE_SEGMENT - (3 << 20) - (1 << 20)).unwrap();
        assert!(!fresh);
        assert_eq!(m, l + (3 << 20));
        assert_eq!(a.cached()[1], (0, 0), "the 1 MiB rest stayed in the block");
        assert_eq!(msize, LARGE_SEGMENT - (3 << 20), "and is counted with it");
        assert_eq!(a.stats().allocated, LARGE_SEGMENT);
        a.free(l);
        a.free(m);
        assert_eq!(a.cached()[1], (LARGE_SEGMENT, 1));
    }

    #[test]
    fn cuda_alloc_peaks_track_the_highest_values_and_reset() {
        let mut a = alloc(1 << 30);
        let x = a.alloc(4096).unwrap().0;
        let y = a.alloc(2 << 20).unwrap().0;
        a.free(y);
        let s = a.stats();
        assert_eq!((s.allocated, s.peak_allocated), (4096, 4096 + (2 << 20)));
        assert_eq!((s.reserved, s.peak_reserved), (SMALL_SEGMENT + LARGE_SEGMENT, SMALL_SEGMENT + LARGE_SEGMENT));
        a.empty_cache();
        let s = a.stats();
        assert_eq!((s.reserved, s.peak_reserved, s.driver_frees), (SMALL_SEGMENT, SMALL_SEGMENT + LARGE_SEGMENT, 1));
        a.reset_peaks();
        let s = a.stats();
        assert_eq!((s.peak_allocated, s.peak_reserved), (4096, SMALL_SEGMENT));
        a.free(x);
    }

    #[test]
    fn cuda_alloc_empty_cache_returns_only_segments_with_nothing_in_use() {
        let mut a = alloc(1 << 30);
        let x = a.alloc(512).unwrap().0;
        let y = a.alloc(5 << 20).unwrap().0;
        // 16 MiB does not fit the 15 MiB left beside y: a segment of its own.
        let z = a.alloc(16 << 20).unwrap().0;
        a.free(y);
        a.free(z);
        a.empty_cache();
        assert_eq!(a.driver().frees, vec![LARGE_SEGMENT, 16 << 20]);
        assert_eq!(a.stats().reserved, SMALL_SEGMENT, "the small segment holds x");
        a.free(x);
        a.empty_cache();
        let s = a.stats();
        assert_eq!((s.reserved, s.segments, s.driver_allocs, s.driver_frees), (0, 0, 3, 3));
        assert!(a.driver().live.is_empty());
    }

    #[test]
    fn cuda_alloc_out_of_memory_empties_the_cache_retries_once_then_fails() {
        // Room for two 20 MiB segments and 4 MiB more.
        let mut a = alloc(2 * LARGE_SEGMENT + (4 << 20));
        let x = a.alloc(5 << 20).unwrap().0;
        // 18 MiB does not fit x's 15 MiB rest: a segment of its own, cached once freed.
        let y = a.alloc(18 << 20).unwrap().0;
        a.free(y);
        // 22 MiB fits no cached block and not beside the cached 18 MiB:
        // out of memory until that segment goes back, then it fits.
        let (z, _, fresh) = a.alloc(22 << 20).expect("the retry after emptying the cache succeeds");
        assert!(fresh);
        let s = a.stats();
        assert_eq!((s.alloc_retries, s.ooms, s.driver_frees), (1, 0, 1));
        assert_eq!(s.reserved, LARGE_SEGMENT + (22 << 20));
        // Nothing left to free: the retry fails too, and nothing was lost.
        let before = a.stats();
        let err = a.alloc(30 << 20).unwrap_err();
        assert_eq!(err, AllocFailure::OutOfMemory { requested: 30 << 20 });
        let s = a.stats();
        assert_eq!((s.alloc_retries, s.ooms, s.driver_frees), (2, 1, 1));
        assert_eq!((s.allocated, s.reserved, s.active_blocks), (before.allocated, before.reserved, 2));
        // The next allocation that fits succeeds, from x's segment.
        let (w, _, fresh) = a.alloc(4 << 20).unwrap();
        assert!(!fresh);
        for p in [w, x, z] {
            assert!(a.free(p));
        }
    }

    #[test]
    fn cuda_alloc_a_driver_failure_other_than_memory_is_passed_on() {
        struct Broken;
        impl SegmentDriver for Broken {
            fn alloc(&mut self, _: usize) -> Result<u64, DriverFailure> {
                Err(DriverFailure::Other("CUDA_ERROR_INVALID_CONTEXT".into()))
            }
            fn free(&mut self, _: u64, _: usize) {}
        }
        let mut a = CachingAllocator::new(Broken);
        assert_eq!(a.alloc(8).unwrap_err(), AllocFailure::Driver("CUDA_ERROR_INVALID_CONTEXT".into()));
        assert_eq!(a.stats(), AllocStats::default());
    }
}
