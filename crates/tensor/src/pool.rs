//! A small pool of spinning helper threads for splitting one kernel into a
//! few parts: the matrix products and elementwise passes of tens of
//! microseconds that dominate a PDE solver's or a small model's step.
//!
//! rayon puts idle workers to sleep within microseconds, and waking one
//! takes an inter-processor interrupt that costs tens of microseconds on a
//! virtual machine; splitting an 80 us product that way measured slower
//! than running it on one thread. Here a helper that has just finished a
//! part keeps polling for the next job for [`SPIN`] before it parks, the way
//! OpenMP runtimes keep their threads (torch's CPU kernels get their
//! speed-up on small products from exactly that). A step's kernels come a
//! few microseconds apart, so the helpers stay awake through a step and
//! sleep between steps.
//!
//! The caller always works too: it claims parts from the same counter as
//! the helpers, so a job finishes even when no helper shows up (a helper
//! descheduled by another process costs at most the parts it took).
//! The pool has one helper fewer than rayon's thread count (the
//! `RAYON_NUM_THREADS` variable, else one per CPU), so `RAYON_NUM_THREADS=1`
//! runs every kernel on the calling thread.
//! One job runs at a time; a split requested while another is in flight
//! (from another thread, or from inside a part) runs on the calling thread.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a helper polls for a new job after its last one.
const SPIN: Duration = Duration::from_millis(2);

/// One split in flight: `f(i)` for every `i < parts`.
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    parts: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    /// A panic out of a part a helper ran, for the caller to resume.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

/// Counts a part as done when dropped, so a part that panics still counts
/// and nobody waits for it forever.
struct Done<'a>(&'a AtomicUsize);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

impl Job {
    /// Claims and runs parts until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, SeqCst);
            if i >= self.parts {
                return;
            }
            let _done = Done(&self.done);
            // SAFETY: `f` outlives the job: `split` waits for every claimed
            // part (and for every helper to let go of the job) before it
            // returns, unwinding included.
            unsafe { (*self.f)(i) };
        }
    }
}

/// Waits, when dropped (also while unwinding), until every claimed part has
/// run and no helper holds the job, then frees the pool for the next job.
struct Finish<'a> {
    pool: &'a Pool,
    job: &'a Job,
}

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        let claimed = || self.job.next.load(SeqCst).min(self.job.parts);
        wait_until(|| self.job.done.load(SeqCst) >= claimed());
        self.pool.job.store(std::ptr::null_mut(), SeqCst);
        wait_until(|| self.pool.active.load(SeqCst) == 0);
        self.pool.busy.store(false, SeqCst);
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

struct Pool {
    /// Helper threads running (set once, after they are spawned).
    helpers: AtomicUsize,
    /// The job in flight, or null.
    job: AtomicPtr<Job>,
    /// Bumped for every job published.
    epoch: AtomicUsize,
    /// Helpers between taking `job` and letting go of it.
    active: AtomicUsize,
    /// Held by the caller of the job in flight.
    busy: AtomicBool,
    /// Helpers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<&'static Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let wanted = rayon::current_num_threads().saturating_sub(1);
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            helpers: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            epoch: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
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
    let mut seen = pool.epoch.load(SeqCst);
    let mut idle_since = Instant::now();
    let mut polls = 0u32;
    loop {
        let epoch = pool.epoch.load(SeqCst);
        if epoch != seen {
            seen = epoch;
            pool.active.fetch_add(1, SeqCst);
            let job = pool.job.load(SeqCst);
            if !job.is_null() {
                // SAFETY: the caller keeps the job alive while `active` is
                // non-zero (it clears `job`, then waits for `active` to drop).
                let job = unsafe { &*job };
                if let Err(payload) = catch_unwind(AssertUnwindSafe(|| job.work())) {
                    *job.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(payload);
                }
            }
            pool.active.fetch_sub(1, SeqCst);
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
        let mut guard = pool.lock.lock().unwrap_or_else(|e| e.into_inner());
        pool.sleepers.fetch_add(1, SeqCst);
        while pool.epoch.load(SeqCst) == seen {
            guard = pool.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        pool.sleepers.fetch_sub(1, SeqCst);
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
/// the helpers; returns when every part has run.
pub fn split(parts: usize, f: &(dyn Fn(usize) + Sync)) {
    let pool = pool();
    if parts <= 1 || pool.helpers.load(Relaxed) == 0 || pool.busy.swap(true, SeqCst) {
        (0..parts).for_each(f);
        return;
    }
    // SAFETY (of the lifetime erasure): the job and `f` stay alive until
    // this function returns, and it returns only after no helper holds them.
    let f: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
    let job = Job { f, parts, next: AtomicUsize::new(0), done: AtomicUsize::new(0), panic: Mutex::new(None) };
    {
        let _finish = Finish { pool, job: &job };
        pool.job.store(&job as *const Job as *mut Job, SeqCst);
        pool.epoch.fetch_add(1, SeqCst);
        if pool.sleepers.load(SeqCst) > 0 {
            let _guard = pool.lock.lock().unwrap_or_else(|e| e.into_inner());
            pool.wake.notify_all();
        }
        job.work();
    }
    if let Some(payload) = job.panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
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
}
