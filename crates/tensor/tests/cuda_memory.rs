//! Exact memory counters of a CUDA device: live bytes, the caching
//! allocator's reuse, `empty_cache` and out of memory. The counters are
//! process-wide, so this binary's tests take one lock and run one at a time.
//!
//! Without a CUDA device each test says so and passes, unless
//! `TAPIR_REQUIRE_CUDA=1` makes the skip a failure.

use std::sync::Mutex;

use tapir_tensor::cuda::{empty_cache, memory_summary};
use tapir_tensor::prelude::*;

static SERIAL: Mutex<()> = Mutex::new(());

#[path = "support/cuda.rs"]
mod support;
use support::cuda;

/// A small elementwise "step" on the device: a few temporaries, one result.
fn step(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let h = x.mul(w)?.tanh()?;
    let y = h.add(&x.exp()?)?.gt_scalar(0.5)?;
    y.mul(&h)
}

#[tapir_testing::cuda_test]
fn cuda_memory_live_bytes_are_exact_and_come_back_after_a_scope() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(dev) = cuda("cuda_memory_live_bytes_are_exact_and_come_back_after_a_scope") else { return };
    let before = memory_stats(dev);
    let x = Tensor::from_vec(vec![0.5f32; 256], [16, 16]).unwrap().to_device(dev).unwrap();
    assert_eq!(memory_stats(dev).allocated, before.allocated + 1024, "256 f32 on the device");
    let y = Tensor::from_vec(vec![1.0f64; 10], [10]).unwrap().to_device(dev).unwrap();
    assert_eq!(memory_stats(dev).allocated, before.allocated + 1024 + 80);
    {
        let z = step(&x, &x).unwrap();
        assert_eq!(memory_stats(dev).allocated, before.allocated + 1024 + 80 + 1024, "the temporaries are gone");
        drop(z);
    }
    drop((x, y));
    let after = memory_stats(dev);
    assert_eq!(after.allocated, before.allocated, "live bytes back where they were");
    // The blocks stay cached: reserved memory is whole segments, still held.
    assert!(after.reserved >= 2 << 20, "{after:?}");
    assert_eq!(after.reserved % (2 << 20), 0, "segments are 2 MiB multiples: {after:?}");
}

#[tapir_testing::cuda_test]
fn cuda_memory_a_second_identical_step_makes_no_driver_allocation() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(dev) = cuda("cuda_memory_a_second_identical_step_makes_no_driver_allocation") else { return };
    let x = Tensor::from_vec((0..4096).map(|i| i as f32 / 4096.0).collect(), [64, 64]).unwrap().to_device(dev).unwrap();
    // A large-pool block too (3 MiB).
    let big = Tensor::from_vec(vec![0.25f32; 3 << 18], [3 << 18]).unwrap().to_device(dev).unwrap();
    let run = || {
        let a = step(&x, &x).unwrap();
        let b = big.mul(&big).unwrap().add(&big).unwrap();
        (a.sum_all_host(), b.numel())
    };
    let first = run();
    let warm = memory_stats(dev);
    for _ in 0..3 {
        assert_eq!(run(), first, "same values each step");
    }
    let s = memory_stats(dev);
    assert_eq!(s.system_allocations, warm.system_allocations, "no driver allocation after warm-up");
    assert_eq!((s.allocated, s.reserved), (warm.allocated, warm.reserved));
    assert!(s.allocations > warm.allocations, "the steps did allocate, from the cache");
}

/// A host-side sum, so a step's result is checked without a CUDA reduction.
trait SumHost {
    fn sum_all_host(&self) -> u64;
}
impl SumHost for Tensor {
    fn sum_all_host(&self) -> u64 {
        self.to_vec_f64().iter().sum::<f64>().to_bits()
    }
}

#[tapir_testing::cuda_test]
fn cuda_memory_peaks_reset_and_empty_cache_returns_idle_segments() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(dev) = cuda("cuda_memory_peaks_reset_and_empty_cache_returns_idle_segments") else { return };
    empty_cache(dev);
    let base = memory_stats(dev);
    reset_peak_memory_stats(dev);
    let t = Tensor::from_vec(vec![1.0f32; 1 << 20], [1 << 20]).unwrap().to_device(dev).unwrap(); // 4 MiB
    let s = memory_stats(dev);
    assert_eq!(s.allocated, base.allocated + (4 << 20));
    assert_eq!(s.peak, base.allocated + (4 << 20));
    // 4 MiB is under 10 MiB: a 20 MiB large-pool segment.
    assert_eq!(s.reserved, base.reserved + (20 << 20));
    assert_eq!(s.peak_reserved, s.reserved);
    assert_eq!(s.system_allocations, base.system_allocations + 1);
    drop(t);
    let s = memory_stats(dev);
    assert_eq!(
        (s.allocated, s.peak, s.reserved),
        (base.allocated, base.allocated + (4 << 20), base.reserved + (20 << 20))
    );
    reset_peak_memory_stats(dev);
    assert_eq!(memory_stats(dev).peak, base.allocated);
    empty_cache(dev);
    let s = memory_stats(dev);
    assert_eq!(s.reserved, base.reserved, "the idle segment went back");
    assert_eq!(s.system_frees, base.system_frees + 1);
    assert_eq!(s.peak_reserved, base.reserved + (20 << 20), "the peak stays until reset");
    let summary = memory_summary(dev);
    println!("{summary}");
    assert!(summary.contains("driver frees") && summary.contains("cuda:0"), "{summary}");
}

#[tapir_testing::cuda_test]
fn cuda_memory_out_of_memory_empties_the_cache_retries_and_leaves_nothing_behind() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(dev) = cuda("cuda_memory_out_of_memory_empties_the_cache_retries_and_leaves_nothing_behind") else {
        return;
    };
    // Something cached, which the retry returns to the driver.
    let cached = Tensor::from_vec(vec![1.0f32; 1 << 20], [1 << 20]).unwrap().to_device(dev).unwrap();
    drop(cached);
    let live = Tensor::from_vec(vec![2.0f32], [1]).unwrap().to_device(dev).unwrap();
    let before = memory_stats(dev);
    // 2^40 f32 (4 TiB): more than any device has. A broadcast view costs
    // nothing; its contiguous copy asks the allocator for all of it.
    let huge = live.broadcast_to([1usize << 40]).unwrap();
    let err = huge.contiguous_().unwrap_err();
    let Error::OutOfMemory { device, requested, stats } = err else { panic!("{err}") };
    assert_eq!((device, requested), (dev, 4 << 40));
    assert_eq!(stats.ooms, before.ooms + 1);
    assert_eq!(stats.alloc_retries, before.alloc_retries + 1);
    let s = memory_stats(dev);
    assert_eq!(s.allocated, before.allocated, "nothing allocated is lost or leaked");
    assert!(s.system_frees > before.system_frees, "the retry emptied the cache first");
    assert_eq!(live.to_vec_f64(), vec![2.0], "live memory is untouched");
    // The next allocation that fits succeeds.
    let ok = live.broadcast_to([1024]).unwrap().contiguous_().unwrap();
    assert_eq!(ok.to_vec_f64(), vec![2.0; 1024]);
}
