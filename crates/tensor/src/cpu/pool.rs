//! A small pool of spinning helper threads for splitting one kernel into a
//! few parts: the matrix products and elementwise passes of tens of
//! microseconds that dominate a PDE solver's or a small model's step.
//!
//! rayon puts idle workers to sleep within microseconds, and waking one
//! takes an inter-processor interrupt that costs tens of microseconds on a
//! virtual machine (docs/performance.md has the measurements). Here a helper that has just finished a
//! part keeps polling for the next job for 2 ms (`SPIN`) before it parks,
//! the way OpenMP runtimes keep their threads (torch's CPU kernels get
//! their speed-up on small products from exactly that). A step's kernels come a
//! few microseconds apart, so the helpers stay awake through a step and
//! sleep between steps.
//!
//! The caller always works too: it runs part 0 itself (the rows a kernel
//! before it gave this thread, so they are in this core's cache), then
//! claims parts from the same counter as the helpers, so a job finishes
//! even when no helper shows up (a helper descheduled by another process
//! costs at most the parts it took).
//!
//! A job costs a few cache-line transfers between cores, and a round trip
//! of a line between cores on different dies is several times one between
//! neighbours (docs/performance.md), while a Hessian-vector product makes
//! dozens of jobs. So the job is published in one line of the pool
//! (the closure, and a ticket that holds the job's number, its part count
//! and the next unclaimed part: a helper claims a part by one
//! compare-and-swap on it), the count of finished parts has a line of its
//! own, and what only callers touch is in a third. Nothing a helper
//! touches lives on the caller's stack except the closure it runs once a
//! claim succeeds, and a claim can only succeed while the caller waits.
//!
//! This pool is the crate's one thread runtime: every CPU kernel that
//! splits (elementwise passes, reductions, softmax and cross-entropy rows,
//! matrix products) splits through it, and rayon is never started.
//! The pool has one helper fewer than the thread count (the
//! `RAYON_NUM_THREADS` variable, else one per CPU), so `RAYON_NUM_THREADS=1`
//! runs every kernel on the calling thread.
//! One job runs at a time; a split requested while another is in flight
//! (from another thread, or from inside a part) runs on the calling thread.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a helper polls for a new job after its last one.
const SPIN: Duration = Duration::from_millis(2);

/// A job's number, part count and next unclaimed part share one `u64`
/// ticket (`job << 32 | parts << 16 | next`), so a claim is checked against
/// the part count of the job it claims from. (With the count read apart, a
/// helper could read the next job's larger count while the ticket still
/// showed the finished job, and claim a part past its end.)
const PART_BITS: u32 = 16;
const PART_MASK: u64 = (1 << PART_BITS) - 1;
/// Splits into more parts than this run on the calling thread.
const MAX_PARTS: usize = PART_MASK as usize;

/// The closure of a job, as the caller's stack holds it.
type Part<'a> = &'a (dyn Fn(usize) + Sync);

/// Aligned to 128 bytes: a cache line and the one the adjacent-line
/// prefetcher pairs with it.
#[repr(align(128))]
struct Line<T>(T);

/// The job in flight, as helpers read it.
struct Slot {
    /// See [`PART_BITS`].
    ticket: AtomicU64,
    /// Points at the caller's `Part` (valid while the job is open).
    f: AtomicPtr<Part<'static>>,
}

/// What only callers touch (besides `sleepers`, written by a helper as it
/// parks).
struct CallerSide {
    /// Held by the caller of the job in flight.
    busy: AtomicBool,
    /// The number of the last job published.
    job: AtomicU64,
    /// Helpers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
}

struct Pool {
    slot: Line<Slot>,
    /// Parts helpers have finished (or abandoned to a panic) in this job.
    done: Line<AtomicUsize>,
    caller: Line<CallerSide>,
    /// Helper threads running (set once, after they are spawned).
    helpers: AtomicUsize,
    /// A panic out of a part a helper ran, for the caller to resume.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    lock: Mutex<()>,
    wake: Condvar,
}

fn ticket(job: u64, parts: usize, next: usize) -> u64 {
    job << (2 * PART_BITS) | (parts as u64) << PART_BITS | next as u64
}

fn job_of(ticket: u64) -> u64 {
    ticket >> (2 * PART_BITS)
}

fn parts_of(ticket: u64) -> usize {
    ((ticket >> PART_BITS) & PART_MASK) as usize
}

fn next_of(ticket: u64) -> usize {
    (ticket & PART_MASK) as usize
}

impl Pool {
    /// Claims the next part of job `job`, if any is left.
    fn claim(&self, job: u64) -> Option<usize> {
        let mut t = self.slot.0.ticket.load(SeqCst);
        loop {
            if job_of(t) != job || next_of(t) >= parts_of(t) {
                return None;
            }
            match self.slot.0.ticket.compare_exchange_weak(t, t + 1, SeqCst, SeqCst) {
                Ok(_) => return Some(next_of(t)),
                Err(now) => t = now,
            }
        }
    }

    /// Closes the job in flight (the caller's) to further claims; returns
    /// how many parts were claimed in all.
    fn close(&self) -> usize {
        let mut t = self.slot.0.ticket.load(SeqCst);
        loop {
            let parts = parts_of(t);
            if next_of(t) >= parts {
                return parts;
            }
            match self.slot.0.ticket.compare_exchange_weak(t, ticket(job_of(t), parts, parts), SeqCst, SeqCst) {
                Ok(_) => return next_of(t),
                Err(now) => t = now,
            }
        }
    }
}

/// Counts a helper's part as done when dropped, so a part that panics
/// still counts and nobody waits for it forever.
struct Done<'a>(&'a AtomicUsize);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// Ends the caller's job when dropped (also while unwinding): closes it to
/// claims, waits until every part a helper claimed has finished, then
/// frees the pool for the next job.
struct Finish<'a> {
    pool: &'a Pool,
    /// Parts the caller claimed itself.
    own: Cell<usize>,
    /// Where the panic of a helper's part goes, for the caller to resume
    /// (dropped if the caller is unwinding from its own).
    panic: &'a Cell<Option<Box<dyn Any + Send>>>,
}

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        let claimed = self.pool.close();
        let by_helpers = claimed - self.own.get();
        wait_until(|| self.pool.done.0.load(SeqCst) >= by_helpers);
        let payload = self.pool.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if !std::thread::panicking() {
            self.panic.set(payload);
        }
        self.pool.caller.0.busy.store(false, SeqCst);
    }
}

/// Polls `ready`, yielding the core now and then (the thread it waits for
/// may need it).
fn wait_until(ready: impl Fn() -> bool) {
    let mut polls = 0u32;
    while !ready() {
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(64) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// The threads kernels run on, the caller included: `RAYON_NUM_THREADS`
/// when it holds a positive number, else one per CPU. The variable keeps
/// rayon's name and meaning (0 or anything unparsable means the default),
/// which scripts and users set from when this pool sized itself by rayon's.
fn threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<&'static Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let wanted = threads().saturating_sub(1);
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            slot: Line(Slot { ticket: AtomicU64::new(0), f: AtomicPtr::new(std::ptr::null_mut()) }),
            done: Line(AtomicUsize::new(0)),
            caller: Line(CallerSide {
                busy: AtomicBool::new(false),
                job: AtomicU64::new(0),
                sleepers: AtomicUsize::new(0),
            }),
            helpers: AtomicUsize::new(0),
            panic: Mutex::new(None),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        }));
        // Fewer helpers than wanted (a refused spawn) only means fewer
        // hands: the caller runs every part nobody else claims.
        let spawned = (0..wanted)
            .take_while(|i| {
                std::thread::Builder::new().name(format!("tapir-helper-{i}")).spawn(move || helper(pool)).is_ok()
            })
            .count();
        pool.helpers.store(spawned, SeqCst);
        pool
    })
}

fn helper(pool: &'static Pool) {
    let slot = &pool.slot.0;
    let mut seen = job_of(slot.ticket.load(SeqCst));
    let mut idle_since = Instant::now();
    let mut polls = 0u32;
    loop {
        let job = job_of(slot.ticket.load(SeqCst));
        if job != seen {
            seen = job;
            // Read before the claim: a claim of this job succeeds only while
            // its caller waits, so these are still the job's then.
            let f = slot.f.load(SeqCst);
            while let Some(i) = pool.claim(job) {
                let _done = Done(&pool.done.0);
                // SAFETY: the claim succeeded, so the caller is inside
                // `split` for this job, and stays there (keeping `*f` and the
                // closure alive) until `done` counts this part.
                let f = unsafe { *f };
                if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(i))) {
                    *pool.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(payload);
                }
            }
            idle_since = Instant::now();
            polls = 0;
            continue;
        }
        polls += 1;
        if !polls.is_multiple_of(64) || idle_since.elapsed() < SPIN {
            if polls.is_multiple_of(64) {
                // Let another runnable thread on this core go first.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        let sleepers = &pool.caller.0.sleepers;
        let mut guard = pool.lock.lock().unwrap_or_else(|e| e.into_inner());
        sleepers.fetch_add(1, SeqCst);
        while job_of(slot.ticket.load(SeqCst)) == seen {
            guard = pool.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        sleepers.fetch_sub(1, SeqCst);
        drop(guard);
        idle_since = Instant::now();
        polls = 0;
    }
}

/// Number of parts worth splitting a kernel into: the helpers plus the
/// calling thread (1 when the pool has no helpers).
pub fn width() -> usize {
    pool().helpers.load(Relaxed) + 1
}

/// Runs `f(i)` for every `i < parts`, spread over the calling thread and
/// the helpers; returns when every part has run. The calling thread runs
/// part 0.
pub fn split(parts: usize, f: &(dyn Fn(usize) + Sync)) {
    let pool = pool();
    let side = &pool.caller.0;
    if parts <= 1 || parts > MAX_PARTS || pool.helpers.load(Relaxed) == 0 || side.busy.swap(true, SeqCst) {
        (0..parts).for_each(f);
        return;
    }
    // SAFETY (of the lifetime erasure): helpers reach `part` only through
    // a successful claim, and `Finish` keeps this frame alive until every
    // claimed part is done.
    let part: Part<'static> = unsafe { std::mem::transmute::<Part<'_>, Part<'static>>(f) };
    // Job numbers wrap at 2^32 (the ticket's width for them).
    let job = (side.job.load(Relaxed) + 1) & 0xffff_ffff;
    side.job.store(job, Relaxed);
    let slot = &pool.slot.0;
    slot.f.store(&part as *const Part<'static> as *mut Part<'static>, SeqCst);
    pool.done.0.store(0, SeqCst);
    // Part 0 is the caller's: published as already claimed.
    slot.ticket.store(ticket(job, parts, 1), SeqCst);
    if side.sleepers.load(SeqCst) > 0 {
        let _guard = pool.lock.lock().unwrap_or_else(|e| e.into_inner());
        pool.wake.notify_all();
    }
    let panic = Cell::new(None);
    {
        let finish = Finish { pool, own: Cell::new(1), panic: &panic };
        f(0);
        while let Some(i) = pool.claim(job) {
            finish.own.set(finish.own.get() + 1);
            f(i);
        }
    }
    if let Some(payload) = panic.take() {
        resume_unwind(payload);
    }
}

/// How many parts a kernel of `work` units is split into: one below `min`
/// (where a split stops paying for itself), else one per thread, but no
/// part smaller than `min / 2` (so a many-core machine does not cut a
/// 40 us kernel into sixteen slivers).
pub fn parts_for(work: usize, min: usize) -> usize {
    if work < min.max(2) {
        return 1;
    }
    (work / (min / 2).max(1)).clamp(1, width())
}

/// Runs `f` over consecutive ranges covering `0..n`, split as
/// [`parts_for`]`(n, min)` says (one range, on the calling thread, below
/// `min`). The calling thread takes the first range.
pub fn ranges(n: usize, min: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
    let parts = parts_for(n, min).min(n.max(1));
    let per = n.div_ceil(parts.max(1));
    split(parts, &|i| f(i * per..((i + 1) * per).min(n)));
}

/// A mutable buffer the parts of a split write at once, each its own
/// elements: the caller promises, at each [`Disjoint::slice`], that no two
/// parts' slices overlap.
pub struct Disjoint<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: the parts only reach the buffer through `slice`, whose contract
// keeps their elements disjoint.
unsafe impl<T: Send> Send for Disjoint<T> {}
unsafe impl<T: Send> Sync for Disjoint<T> {}

impl<T> Disjoint<T> {
    /// Shares `v` for the duration of its borrow.
    pub fn new(v: &mut [T]) -> Self {
        Disjoint { ptr: v.as_mut_ptr(), len: v.len() }
    }

    /// Elements `at..at + len` (panics when out of range).
    ///
    /// # Safety
    /// No other live reference, on any thread, covers any of these
    /// elements, and the borrowed buffer outlives the slice.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, at: usize, len: usize) -> &mut [T] {
        assert!(at.checked_add(len).is_some_and(|end| end <= self.len), "internal: Disjoint::slice out of range");
        // SAFETY: in range (checked), and unaliased by the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(parts: usize) -> Vec<usize> {
        let hits: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
        split(parts, &|i| {
            hits[i].fetch_add(1, SeqCst);
        });
        hits.iter().map(|h| h.load(SeqCst)).collect()
    }

    #[test]
    fn ranges_cover_everything_once() {
        for (n, min) in [(0, 1), (1, 1), (5, 1), (1000, 10), (1000, 5000)] {
            let mut hits = vec![0u8; n];
            let out = Disjoint::new(&mut hits);
            ranges(n, min, &|r| {
                // SAFETY: the ranges are disjoint (what this test checks).
                let s = unsafe { out.slice(r.start, r.len()) };
                s.iter_mut().for_each(|h| *h += 1);
            });
            assert!(hits.iter().all(|&h| h == 1), "n {n}");
        }
    }

    #[test]
    fn parts_for_splits_only_work_that_pays() {
        assert_eq!(parts_for(0, 10), 1);
        assert_eq!(parts_for(9, 10), 1);
        assert_eq!(parts_for(10, 10), 2.min(width()));
        assert_eq!(parts_for(1_000, 10), width());
        // Never a part under min / 2 units.
        assert!(parts_for(1_000, 600) <= 3);
    }

    #[test]
    fn every_part_runs_once() {
        for parts in [0, 1, 2, 3, 7, 64] {
            assert_eq!(counts(parts), vec![1; parts], "{parts} parts");
        }
    }

    #[test]
    fn a_split_inside_a_part_runs_inline() {
        let total = AtomicUsize::new(0);
        split(4, &|_| {
            split(3, &|j| {
                total.fetch_add(j + 1, SeqCst);
            });
        });
        assert_eq!(total.load(SeqCst), 4 * 6);
    }

    #[test]
    fn splits_from_many_threads_all_complete() {
        std::thread::scope(|s| {
            for t in 0..4 {
                s.spawn(move || {
                    for r in 0..200 {
                        let parts = 1 + (t + r) % 5;
                        assert_eq!(counts(parts), vec![1; parts]);
                    }
                });
            }
        });
    }

    /// Jobs from one thread, back to back, each with more parts than the
    /// last: a helper that read a job's part count apart from its ticket
    /// once ran a part past the end of a finished job with the next job's
    /// closure, about one run in a hundred of the test above.
    #[test]
    fn a_finished_job_cannot_be_claimed_past_its_end() {
        for _ in 0..3000 {
            for parts in 2..=6 {
                assert_eq!(counts(parts), vec![1; parts]);
            }
        }
    }

    #[test]
    fn a_panicking_part_reaches_the_caller_and_the_pool_still_works() {
        for _ in 0..20 {
            let caught = catch_unwind(|| {
                split(4, &|i| {
                    if i == 3 {
                        panic!("part {i} fails");
                    }
                })
            });
            assert!(caught.is_err());
            assert_eq!(counts(5), vec![1; 5]);
        }
    }

    #[test]
    fn when_every_part_panics_one_panic_reaches_the_caller_and_none_is_left_over() {
        for _ in 0..20 {
            let caught = catch_unwind(|| split(2, &|i| panic!("part {i} fails")));
            assert!(caught.is_err());
            // A helper's payload, dropped while the caller unwound from its
            // own, must not surface in a later job.
            assert!(catch_unwind(|| counts(3)).is_ok_and(|c| c == vec![1; 3]));
        }
    }
}
