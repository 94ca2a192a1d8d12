//! The crate's unsafe code, driven through its public face in cases small
//! enough for Miri: the pool's job hand-off and disjoint writes, the buffer
//! cache and the storage that adopts its buffers, and the zeroed
//! allocations. Under Miri (`cargo +nightly miri test -p tapir-tensor
//! --test unsafe_paths`) the portable kernels run, and every access these
//! paths make is checked; on the stable toolchain the same cases run as
//! ordinary tests.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use tapir_tensor::cache;
use tapir_tensor::cpu::pool::{self, Disjoint};
use tapir_tensor::prelude::*;

/// Fewer repetitions under Miri, which interprets every instruction.
const REPS: usize = if cfg!(miri) { 3 } else { 200 };

#[test]
fn pool_parts_each_run_once_and_write_disjoint_ranges() {
    for parts in [0, 1, 2, 3, 5] {
        let hits: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
        pool::split(parts, &|i| {
            hits[i].fetch_add(1, SeqCst);
        });
        assert!(hits.iter().all(|h| h.load(SeqCst) == 1), "{parts} parts");
    }
    for (n, min) in [(0, 1), (7, 1), (100, 8), (1000, 64)] {
        let mut out = vec![0u32; n];
        let shared = Disjoint::new(&mut out);
        pool::ranges(n, min, &|r| {
            // SAFETY: the pool hands out disjoint ranges of 0..n.
            let s = unsafe { shared.slice(r.start, r.len()) };
            for (k, v) in s.iter_mut().enumerate() {
                *v += (r.start + k) as u32 + 1;
            }
        });
        assert_eq!(out, (1..=n as u32).collect::<Vec<_>>(), "n {n}");
    }
}

#[test]
fn pool_jobs_from_several_threads_and_nested_splits_complete() {
    std::thread::scope(|s| {
        for t in 0..3 {
            s.spawn(move || {
                for r in 0..REPS {
                    let parts = 1 + (t + r) % 4;
                    let total = AtomicUsize::new(0);
                    pool::split(parts, &|i| {
                        pool::split(2, &|j| {
                            total.fetch_add(i * 2 + j + 1, SeqCst);
                        });
                    });
                    let want: usize = (1..=parts * 2).sum();
                    assert_eq!(total.load(SeqCst), want);
                }
            });
        }
    });
}

#[test]
fn a_panicking_part_reaches_the_caller_and_the_pool_goes_on() {
    let caught = std::panic::catch_unwind(|| {
        pool::split(3, &|i| {
            if i == 2 {
                panic!("part {i} fails");
            }
        })
    });
    assert!(caught.is_err());
    let n = AtomicUsize::new(0);
    pool::split(4, &|_| {
        n.fetch_add(1, SeqCst);
    });
    assert_eq!(n.load(SeqCst), 4);
}

#[test]
fn cached_buffers_are_reused_and_adopted() {
    // 64 KiB and more are cached when freed: the second output of the same
    // size takes the first one's buffer, which a new storage adopts.
    let n = 20_000;
    let x = Tensor::full([n], 0.5, DType::F32).expect("input");
    for _ in 0..3 {
        let y = x.exp().expect("exp");
        let z = y.mul_scalar(2.0).expect("mul");
        drop(y);
        let w = z.add_scalar(1.0).expect("add");
        let v = w.narrow(0, n - 2, 2).expect("view").to_vec::<f32>().expect("values");
        // Not bit-exact: Miri perturbs the last bits of transcendental
        // functions on purpose, and the kernel's exp is its own.
        let want = 0.5f32.exp() * 2.0 + 1.0;
        assert!(v.iter().all(|&e| (e - want).abs() < 1e-5), "{v:?} vs {want}");
    }
    cache::empty_cache();
    let filled = cache::filled(n, 7u16).expect("filled");
    assert!(filled.len() == n && filled.iter().all(|&v| v == 7));
}

#[test]
fn zeroed_allocations_read_as_zero_and_write_in_place() {
    // Below the lazy threshold (a written buffer, possibly from the cache)
    // and above it (zeroed pages from the allocator).
    for n in [3, 20_000, (32 << 20) / 4 + 1] {
        let mut t = Tensor::zeros([n], DType::F32).expect("zeros");
        let ends = |t: &Tensor| {
            let a = t.narrow(0, 0, 1).and_then(|v| v.to_vec::<f32>()).expect("first");
            let b = t.narrow(0, n - 1, 1).and_then(|v| v.to_vec::<f32>()).expect("last");
            (a[0], b[0])
        };
        assert_eq!(ends(&t), (0.0, 0.0));
        let d = t.make_mut::<f32>().expect("unique");
        d[0] = 1.0;
        d[n - 1] = 2.0;
        assert_eq!(ends(&t), (1.0, 2.0));
    }
    let z = Tensor::zeros([4, 0, 3], DType::I64).expect("empty");
    assert_eq!(z.numel(), 0);
}

#[test]
fn split_kernels_write_every_element() {
    // Outputs of 32 Ki elements and more are split over the pool.
    let n = 40_000;
    let x = Tensor::arange(0.0, n as f64, 1.0, DType::F64).expect("arange");
    let y = x.mul_scalar(0.5).and_then(|y| y.add(&x)).expect("split elementwise");
    let s = y.sum_all().and_then(|s| s.item()).expect("sum");
    assert_eq!(s, 1.5 * (n as f64 - 1.0) * n as f64 / 2.0);
}
