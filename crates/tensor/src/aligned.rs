//! [`AlignedAlloc`]: a global allocator that starts every buffer of 4 KiB
//! or more on a 64-byte cache line, for programs that stream large tensors
//! through AVX-512 kernels.
//!
//! glibc's `malloc` returns a large block 16 bytes past a page boundary
//! (its chunk header comes first), so every row of a large tensor starts
//! 16 bytes into a cache line and every 64-byte load of a row straddles
//! two lines. A kernel that only reads, such as a sum over the last axis,
//! then runs at two thirds of the memory's speed on an AMD Zen 5 core: 38-40
//! GB/s where aligned rows give 53-59 (docs/performance.md, "Cache-line
//! aligned buffers"). PyTorch aligns every CPU buffer to 64 bytes for this
//! reason. A tensor's buffer is a `Vec`, whose alignment is its element's,
//! so the alignment has to come from the allocator behind it:
//!
//! ```no_run
//! #[global_allocator]
//! static ALLOC: tapir::AlignedAlloc = tapir::AlignedAlloc;
//! # fn main() {}
//! ```
//!
//! in a binary (the `tapir` command and tapir's benchmarks do this).
//! Results do not change with it, bit for bit: every kernel's order of
//! operations is fixed by its element type, not by addresses. Smaller
//! allocations go to the system allocator unchanged (rounding them up would
//! cost `malloc`'s small bins more than a small buffer's loads gain).
//! [`buffer_alignment`] says what a process gets.

use std::alloc::{GlobalAlloc, Layout, System};

/// The alignment [`AlignedAlloc`] gives large blocks: one cache line.
pub const ALIGN: usize = 64;
/// Blocks of at least this many bytes are aligned to [`ALIGN`].
pub const MIN_ALIGNED_BYTES: usize = 4096;

/// The system allocator, with blocks of [`MIN_ALIGNED_BYTES`] or more
/// aligned to [`ALIGN`] bytes (see the module docs). Install it with
/// `#[global_allocator]`.
///
/// A large block is a system block [`ALIGN`] bytes longer, the returned
/// pointer the first cache line boundary at least 8 bytes into it, and the
/// 8 bytes before that pointer hold its offset from the system block's
/// start. So every request stays one `malloc`, `calloc` or `realloc` of
/// the system allocator, with their fast paths: `calloc`'s zero pages
/// fresh from the kernel are not written again, and `realloc` moves a
/// large block's pages without copying them. (Asking the system allocator
/// for 64-byte alignment instead made tapir's small-model steps up to 30%
/// slower: glibc's `posix_memalign` splits blocks, and Rust's `System`
/// serves an over-aligned `alloc_zeroed` by writing zeros and an
/// over-aligned `realloc` by copying.)
#[derive(Clone, Copy, Debug, Default)]
pub struct AlignedAlloc;

/// Where a large block's bytes start in its system block.
#[derive(Clone, Copy)]
struct Large;

impl Large {
    /// The system layout behind a large block of `size` bytes: 16-byte
    /// aligned, [`ALIGN`] bytes longer.
    fn layout(size: usize) -> Option<Layout> {
        Layout::from_size_align(size.checked_add(ALIGN)?, 16).ok()
    }

    /// The offset of the first cache line boundary at least 8 bytes past
    /// `raw`: 16, 32, 48 or 64, since `raw` is 16-byte aligned.
    fn offset(raw: *mut u8) -> usize {
        debug_assert_eq!(raw as usize % 16, 0);
        8 + (ALIGN - (raw as usize + 8) % ALIGN) % ALIGN
    }

    /// The aligned pointer into the system block `raw`, with the offset
    /// written before it.
    ///
    /// # Safety
    /// `raw` is a live system block from [`Large::layout`].
    unsafe fn place(raw: *mut u8, offset: usize) -> *mut u8 {
        // SAFETY: 8 <= offset <= ALIGN, so both the header and the
        // returned pointer lie inside the block of `size + ALIGN` bytes;
        // the header need not be aligned.
        unsafe {
            let p = raw.add(offset);
            p.sub(8).cast::<usize>().write_unaligned(offset);
            p
        }
    }

    /// The system block behind an aligned pointer `p` and `p`'s offset in it.
    ///
    /// # Safety
    /// `p` came from [`Large::place`].
    unsafe fn raw(p: *mut u8) -> (*mut u8, usize) {
        // SAFETY: `place` wrote the offset just before `p`.
        unsafe {
            let offset = p.sub(8).cast::<usize>().read_unaligned();
            (p.sub(offset), offset)
        }
    }
}

/// Whether a block of this layout is served aligned.
fn large(layout: Layout) -> bool {
    layout.size() >= MIN_ALIGNED_BYTES && layout.align() <= 16
}

/// A new block for `layout` (zeroed when `zeroed`): the system
/// allocator's own when small, else a system block with the pointer
/// placed on a cache line.
///
/// # Safety
/// `layout` has a non-zero size.
unsafe fn fresh(layout: Layout, zeroed: bool) -> *mut u8 {
    let get = |l: Layout| {
        // SAFETY: a non-zero size (the caller's contract; a large layout's
        // is larger still).
        unsafe {
            if zeroed {
                System.alloc_zeroed(l)
            } else {
                System.alloc(l)
            }
        }
    };
    if !large(layout) {
        return get(layout);
    }
    let Some(sys) = Large::layout(layout.size()) else { return std::ptr::null_mut() };
    // A zeroed system block stays zero after the header.
    let raw = get(sys);
    if raw.is_null() {
        return raw;
    }
    // SAFETY: `raw` is a live block of `sys`.
    unsafe { Large::place(raw, Large::offset(raw)) }
}

// SAFETY: a small block (or one whose own alignment exceeds 16) is the
// system allocator's, untouched. A large block is a system block of
// `Large::layout(size)` (alignment 16, `ALIGN` bytes longer), the pointer
// handed out is `ALIGN`-aligned and has `size` bytes after it inside that
// block (its offset is at most `ALIGN`), and `dealloc` and `realloc` find
// the system block again through the offset stored before the pointer.
// Whether a block is large depends only on its layout, which the
// `GlobalAlloc` contract makes the same at allocation and release.
unsafe impl GlobalAlloc for AlignedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, non-zero in size.
        unsafe { fresh(layout, false) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe { fresh(layout, true) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !large(layout) {
            // SAFETY: a small block is the system allocator's own.
            return unsafe { System.dealloc(ptr, layout) };
        }
        // SAFETY: `ptr` came from `alloc` or `realloc` as a large block of
        // `layout.size()` bytes, so its system block has that size's layout.
        unsafe {
            let (raw, _) = Large::raw(ptr);
            let sys = Large::layout(layout.size()).expect("internal: a layout that was allocated");
            System.dealloc(raw, sys)
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // The caller guarantees `new_size` with `layout.align()` is a valid
        // layout.
        let Ok(new) = Layout::from_size_align(new_size, layout.align()) else { return std::ptr::null_mut() };
        let kept = layout.size().min(new_size);
        match (large(layout), large(new)) {
            // SAFETY: a small block is the system allocator's own.
            (false, false) => unsafe { System.realloc(ptr, layout, new_size) },
            (false, true) => {
                let Some(sys) = Large::layout(new_size) else { return std::ptr::null_mut() };
                // SAFETY: the system block grows with the bytes at its start;
                // they then move up to the aligned offset (within the block:
                // offset + kept <= ALIGN + new_size), and the header goes in
                // front of them.
                unsafe {
                    let raw = System.realloc(ptr, layout, sys.size());
                    if raw.is_null() {
                        return raw;
                    }
                    let offset = Large::offset(raw);
                    std::ptr::copy(raw, raw.add(offset), kept);
                    Large::place(raw, offset)
                }
            }
            (true, false) => {
                // A new small block, the bytes copied, the old block freed
                // (only once the new one exists: a failed `realloc` leaves
                // the old block as it was).
                // SAFETY: `new` has a non-zero size; both blocks hold `kept`
                // bytes and are distinct; the old one goes with its layout.
                unsafe {
                    let fresh = System.alloc(new);
                    if !fresh.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, fresh, kept);
                        self.dealloc(ptr, layout);
                    }
                    fresh
                }
            }
            (true, true) => {
                let Some(sys) = Large::layout(new_size) else { return std::ptr::null_mut() };
                // SAFETY: the system block (of the old size's layout) is
                // resized with its bytes; if its new start puts the cache line
                // boundary elsewhere, the bytes move there within the block.
                unsafe {
                    let (raw, old_offset) = Large::raw(ptr);
                    let old_sys = Large::layout(layout.size()).expect("internal: a layout that was allocated");
                    let raw = System.realloc(raw, old_sys, sys.size());
                    if raw.is_null() {
                        return raw;
                    }
                    let offset = Large::offset(raw);
                    if offset != old_offset {
                        std::ptr::copy(raw.add(old_offset), raw.add(offset), kept);
                    }
                    Large::place(raw, offset)
                }
            }
        }
    }
}

/// The alignment, in bytes (at most [`ALIGN`]), that this process's global
/// allocator gives fresh blocks of 64 KiB and more: the smallest among
/// four such blocks held at once. 64 under [`AlignedAlloc`] (always);
/// under glibc's `malloc` alone 16, unless all four blocks happen to fall
/// on cache lines. `tapir bench` and `tapir pinn` report it beside their
/// figures.
pub fn buffer_alignment() -> usize {
    let blocks: Vec<Vec<f32>> = (0..4).map(|i| Vec::with_capacity((16 << 10) + i * 1024)).collect();
    let zeros = blocks.iter().map(|b| (b.as_ptr() as usize).trailing_zeros()).min().unwrap_or(0);
    (1usize << zeros.min(ALIGN.trailing_zeros())).max(std::mem::align_of::<f32>())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Allocates `size` bytes aligned to `align` through `AlignedAlloc`,
    /// fills them, and returns the block.
    fn block(size: usize, align: usize) -> (*mut u8, Layout) {
        let layout = Layout::from_size_align(size, align).unwrap();
        // SAFETY: a non-zero size.
        let p = unsafe { AlignedAlloc.alloc(layout) };
        assert!(!p.is_null());
        // SAFETY: the block holds `size` bytes.
        unsafe { std::ptr::write_bytes(p, 0xA5, size) };
        (p, layout)
    }

    #[test]
    fn large_blocks_start_on_a_cache_line_and_small_ones_keep_their_alignment() {
        for &(size, align) in &[(4096, 4), (4096, 8), (1 << 20, 4), (100_000, 2), (4095, 4), (8, 8), (5000, 128)] {
            let (p, layout) = block(size, align);
            let want = if size >= MIN_ALIGNED_BYTES { align.max(ALIGN) } else { align };
            assert_eq!(p as usize % want, 0, "{size} bytes aligned {align}");
            // SAFETY: allocated above with this layout.
            unsafe { AlignedAlloc.dealloc(p, layout) };
        }
    }

    #[test]
    fn zeroed_blocks_are_zero() {
        for size in [64, 4096, 1 << 18] {
            let layout = Layout::from_size_align(size, 4).unwrap();
            // SAFETY: a non-zero size.
            let p = unsafe { AlignedAlloc.alloc_zeroed(layout) };
            // SAFETY: the block holds `size` bytes.
            let bytes = unsafe { std::slice::from_raw_parts(p, size) };
            assert!(bytes.iter().all(|&b| b == 0), "{size}");
            assert!(size < MIN_ALIGNED_BYTES || (p as usize).is_multiple_of(ALIGN));
            // SAFETY: allocated above with this layout.
            unsafe { AlignedAlloc.dealloc(p, layout) };
        }
    }

    /// Growing and shrinking across the 4 KiB line keeps the contents and
    /// gives each size its class's alignment (a `Vec` pushed past 4 KiB
    /// takes this path).
    #[test]
    fn reallocation_across_the_threshold_keeps_contents_and_alignment() {
        let sizes = [16, 4000, 4096, 70_000, 4097, 100, 8192, 24];
        let (mut p, mut layout) = block(sizes[0], 4);
        for &next in &sizes[1..] {
            let kept = layout.size().min(next);
            // SAFETY: `p` is a live block of `layout`; `next` is non-zero.
            let q = unsafe { AlignedAlloc.realloc(p, layout, next) };
            assert!(!q.is_null());
            // SAFETY: `q` holds at least `kept` bytes copied from `p`.
            let bytes = unsafe { std::slice::from_raw_parts(q, kept) };
            assert!(bytes.iter().all(|&b| b == 0xA5), "{} -> {next}", layout.size());
            if next >= MIN_ALIGNED_BYTES {
                assert_eq!(q as usize % ALIGN, 0, "{} -> {next}", layout.size());
            }
            layout = Layout::from_size_align(next, 4).unwrap();
            // SAFETY: the block now holds `next` bytes.
            unsafe { std::ptr::write_bytes(q, 0xA5, next) };
            p = q;
        }
        // SAFETY: the live block and its layout.
        unsafe { AlignedAlloc.dealloc(p, layout) };
    }

    #[test]
    fn buffer_alignment_is_a_power_of_two_up_to_a_cache_line() {
        let a = buffer_alignment();
        assert!(a.is_power_of_two() && (4..=ALIGN).contains(&a), "{a}");
    }
}
