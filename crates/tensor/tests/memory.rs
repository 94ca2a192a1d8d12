//! Exact memory accounting: live bytes, peak,
//! reserved, largest allocation, with torch.cuda's semantics.
//!
//! The counters are process-wide, so every test here takes `LOCK` and
//! measures deltas from its own baseline. This is the only test file that
//! asserts exact byte counts; it runs as its own binary (process), so tests
//! in other files cannot disturb it.

use std::sync::{Mutex, MutexGuard};

use tapir_tensor::prelude::*;
use tapir_tensor::{max_memory_allocated, MemoryStats};

static LOCK: Mutex<()> = Mutex::new(());

/// Serialises the tests of this file; a failed (panicked) test must not
/// take the others down with it.
fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn live() -> usize {
    memory_allocated(Device::Cpu)
}

fn stats() -> MemoryStats {
    memory_stats(Device::Cpu)
}

type R = anyhow::Result<()>;

#[test]
fn each_dtype_counts_its_exact_bytes() -> R {
    let _g = lock();
    let base = live();
    let cases = [(DType::F32, 4), (DType::F64, 8), (DType::F16, 2), (DType::BF16, 2), (DType::I32, 4), (DType::I64, 8)];
    for (dtype, size) in cases {
        let t = Tensor::zeros([10, 10], dtype).expect("alloc");
        assert_eq!(live() - base, 100 * size, "{dtype}");
        assert_eq!(t.storage_bytes(), 100 * size);
        let o = Tensor::ones([3, 7], dtype).expect("alloc");
        assert_eq!(live() - base, 121 * size, "{dtype}");
        drop(t);
        assert_eq!(live() - base, 21 * size, "{dtype}");
        drop(o);
        assert_eq!(live(), base, "{dtype}");
    }
    // Every constructor is counted.
    let a = Tensor::from_vec(vec![0.0f64; 33], [33])?;
    assert_eq!(live() - base, 264);
    let b = Tensor::from_slice(&[1i32, 2, 3], [3])?;
    assert_eq!(live() - base, 264 + 12);
    let c = Tensor::arange(0.0, 10.0, 1.0, DType::I64)?;
    assert_eq!(live() - base, 264 + 12 + 80);
    let d = Tensor::eye(5, DType::F16).expect("alloc");
    assert_eq!(live() - base, 264 + 12 + 80 + 50);
    let e = Tensor::full([2, 2], 1.5, DType::BF16).expect("alloc");
    let f = Tensor::scalar(1.0);
    let r = Rng::new(0).randn([25], DType::F32)?;
    assert_eq!(live() - base, 264 + 12 + 80 + 50 + 8 + 4 + 100);
    // Empty tensors take no bytes.
    let z = Tensor::zeros([0, 1000], DType::F64).expect("alloc");
    assert_eq!(live() - base, 264 + 12 + 80 + 50 + 8 + 4 + 100);
    drop((a, b, c, d, e, f, r, z));
    assert_eq!(live(), base);
    Ok(())
}

#[test]
fn views_add_zero_bytes() -> R {
    let _g = lock();
    let base = live();
    let x = Tensor::zeros([64, 32], DType::F32).expect("alloc");
    let bytes = 64 * 32 * 4;
    assert_eq!(live() - base, bytes);
    let views = vec![
        x.clone(),
        x.reshape([32, 64])?,
        x.reshape([2, 32, 32])?,
        x.flatten()?,
        x.t()?,
        x.transpose(0, 1)?,
        x.permute(&[1, 0])?,
        x.narrow(0, 10, 20)?,
        x.narrow(1, 3, 5)?,
        x.t()?.narrow(1, 2, 2)?,
        x.unsqueeze(0)?,
        x.unsqueeze(0)?.squeeze(0)?,
        x.t()?.unsqueeze(1)?,
        x.narrow(0, 0, 1)?.broadcast_to([8, 64, 32])?,
        x.expand([3, 64, 32])?,
        x.contiguous()?,
        x.contiguous_()?,
        x.narrow(0, 4, 4)?.contiguous()?,
        x.cast(DType::F32)?,
        x.sum_to([64, 32])?,
        x.broadcast_to([64, 32])?,
        x.to_device(Device::Cpu)?,
    ];
    for v in &views {
        assert!(v.same_storage(&x));
    }
    assert_eq!(live() - base, bytes, "views must not allocate");
    // A view keeps its storage alive after the original handle is gone.
    drop(x);
    assert_eq!(live() - base, bytes);
    let copy = views[4].contiguous();
    assert_eq!(live() - base, 2 * bytes, "contiguous() of a transpose copies");
    drop(views);
    assert_eq!(live() - base, bytes);
    drop(copy);
    assert_eq!(live(), base);
    Ok(())
}

#[test]
fn dropping_everything_returns_to_baseline() -> R {
    let _g = lock();
    let base = live();
    {
        let mut rng = Rng::new(1);
        let a = rng.randn([32, 16], DType::F32)?;
        let b = rng.randn([16, 8], DType::F32)?;
        let y = a.matmul(&b)?.tanh()?.softmax(1)?.log()?;
        let s = y.sum(&[0], true)?.mean_all()?;
        let idx = Tensor::from_vec(vec![0i64, 3, 5], [3])?;
        let _sel = y.index_select(1, &idx)?;
        let _c = Tensor::concat(&[&a, &a], 0)?.cast(DType::F16)?;
        let _st = Tensor::stack(&[&b, &b], 0)?.t()?.contiguous();
        assert!(s.item()?.is_finite());
        assert!(live() > base);
    }
    assert_eq!(live(), base);
    Ok(())
}

#[test]
fn peak_semantics_match_torch() -> R {
    let _g = lock();
    let base = live();
    reset_peak_memory_stats(Device::Cpu);
    assert_eq!(max_memory_allocated(Device::Cpu), base, "reset sets peak to live");
    assert_eq!(stats().largest_allocation, 0, "reset clears the largest allocation");

    let a = Tensor::zeros([1000], DType::F32).expect("alloc"); // 4000 B
    let b = Tensor::zeros([1000], DType::F64).expect("alloc"); // 8000 B
    assert_eq!(max_memory_allocated(Device::Cpu), base + 12_000);
    drop(a);
    assert_eq!(live(), base + 8000);
    assert_eq!(max_memory_allocated(Device::Cpu), base + 12_000, "peak stays");
    let c = Tensor::zeros([100], DType::F32).expect("alloc"); // 400 B
    assert_eq!(max_memory_allocated(Device::Cpu), base + 12_000);
    assert_eq!(stats().peak, max_memory_allocated(Device::Cpu));
    assert_eq!(stats().largest_allocation, 8000);

    // Reset: the peak becomes the current live bytes.
    reset_peak_memory_stats(Device::Cpu);
    assert_eq!(max_memory_allocated(Device::Cpu), base + 8400);
    assert_eq!(stats().largest_allocation, 0);
    let d = Tensor::zeros([250], DType::I32).expect("alloc"); // 1000 B
    assert_eq!(max_memory_allocated(Device::Cpu), base + 9400);
    assert_eq!(stats().largest_allocation, 1000);
    drop((b, c, d));
    assert_eq!(live(), base);
    assert_eq!(max_memory_allocated(Device::Cpu), base + 9400);
    reset_peak_memory_stats(Device::Cpu);
    assert_eq!(max_memory_allocated(Device::Cpu), base);
    Ok(())
}

#[test]
fn stats_counters_and_reserved() -> R {
    let _g = lock();
    // Large buffers freed by earlier tests may sit in the CPU cache.
    tapir_tensor::cache::empty_cache();
    let s0 = stats();
    let t = Tensor::zeros([7], DType::F64).expect("alloc");
    let s1 = stats();
    assert_eq!(s1.allocated - s0.allocated, 56);
    assert_eq!(s1.allocations - s0.allocations, 1);
    assert_eq!(s1.system_allocations - s0.system_allocations, 1);
    // Small CPU buffers go back to the system: reserved tracks allocated.
    assert_eq!(s1.reserved - s0.reserved, 56);
    assert_eq!(s1.reserved, s1.allocated);
    let v = t.t().ok(); // rank 1: an error, no allocation
    assert!(v.is_none());
    let w = t.reshape([7, 1])?;
    assert_eq!(stats().allocations, s1.allocations, "views are not allocations");
    drop((t, w));
    let s2 = stats();
    assert_eq!(s2.allocated, s0.allocated);
    assert_eq!(s2.reserved, s0.reserved);
    assert_eq!(s2.allocations, s1.allocations, "a free is not an allocation");
    assert_eq!(memory_allocated(Device::Cpu), s2.allocated);
    let text = s2.to_string();
    assert!(text.contains("allocated") && text.contains("peak"), "{text}");
    // Other devices have their own counters, untouched by CPU tensors.
    assert_eq!(memory_stats(Device::Cuda(15)).allocated, 0);
    Ok(())
}

#[test]
fn op_outputs_allocate_exactly_their_size() -> R {
    let _g = lock();
    let a = Tensor::ones([64, 48], DType::F32).expect("alloc");
    let b = Tensor::ones([48, 32], DType::F32).expect("alloc");
    let row = Tensor::ones([48], DType::F32).expect("alloc");
    let base = live();
    reset_peak_memory_stats(Device::Cpu);

    // An f32 binary op allocates its output and nothing else.
    let s = a.add(&row)?;
    assert_eq!(live() - base, 64 * 48 * 4);
    assert_eq!(max_memory_allocated(Device::Cpu) - base, 64 * 48 * 4);
    drop(s);

    // matmul reads a transposed operand in place: only the output is allocated.
    reset_peak_memory_stats(Device::Cpu);
    let bt = Tensor::ones([32, 48], DType::F32).expect("alloc");
    let base = live();
    let y = a.matmul(&bt.t()?)?;
    assert_eq!(y.dims(), &[64, 32]);
    assert_eq!(max_memory_allocated(Device::Cpu) - base, 64 * 32 * 4);
    assert_eq!(live() - base, 64 * 32 * 4);
    let y2 = a.matmul(&b)?;
    assert_eq!(live() - base, 2 * 64 * 32 * 4);
    drop((y, y2, bt));

    // A row-wise reduction of a contiguous tensor copies nothing.
    let base = live();
    reset_peak_memory_stats(Device::Cpu);
    let r = a.sum(&[1], false)?;
    assert_eq!(max_memory_allocated(Device::Cpu) - base, 64 * 4);
    drop(r);
    reset_peak_memory_stats(Device::Cpu);
    let r0 = a.sum(&[0], true)?;
    assert_eq!(max_memory_allocated(Device::Cpu) - base, 48 * 4);
    drop(r0);

    // Unary f32 ops allocate only their output; f16 ops compute in f32, so
    // they may hold f32 temporaries, but leave only their f16 output.
    reset_peak_memory_stats(Device::Cpu);
    let e = a.exp()?;
    assert_eq!(max_memory_allocated(Device::Cpu) - base, 64 * 48 * 4);
    drop(e);
    let h = a.cast(DType::F16)?;
    let base = live();
    assert_eq!(h.storage_bytes(), 64 * 48 * 2);
    reset_peak_memory_stats(Device::Cpu);
    let he = h.exp()?;
    assert_eq!(live() - base, 64 * 48 * 2);
    // At most an f32 copy of the input, the f32 result and the f16 result.
    let peak = max_memory_allocated(Device::Cpu) - base;
    assert!(peak <= 64 * 48 * (4 + 4 + 2), "f16 exp peaked at {peak} B");
    drop((he, h));
    drop((a, b, row));
    Ok(())
}

#[test]
fn errors_leave_no_memory_behind() -> R {
    let _g = lock();
    let x = Tensor::ones([16, 8], DType::F32).expect("alloc");
    let h = Tensor::ones([16, 8], DType::F16).expect("alloc");
    let (i, l) = (Tensor::ones([16, 8], DType::I32)?, Tensor::ones([16, 8], DType::I64)?.neg()?);
    let base = live();
    assert!(x.add(&Tensor::ones([3], DType::F32).expect("alloc")).is_err());
    assert!(h.t()?.matmul(&h.t()?).is_err());
    assert!(x.t()?.index_select(0, &Tensor::from_vec(vec![0i64, 99], [2])?).is_err());
    assert!(x.t()?.gather(1, &Tensor::from_vec(vec![-1i64], [1, 1])?).is_err());
    assert!(x.sum(&[5], false).is_err());
    assert!(x.reshape([7]).is_err());
    assert!(x.clamp(1.0, 0.0).is_err());
    assert!(x.t()?.to_vec::<f64>().is_err());
    assert!(Tensor::from_vec(vec![0.0f32; 10], [3, 3]).is_err());
    assert!(Tensor::concat(&[&x, &h], 0).is_err());
    assert!(h.exp()?.t()?.add(&x).is_err());
    // Promotion casts `i` to int64 before pow finds a negative exponent.
    assert!(i.pow(&l).is_err());
    assert_eq!(live(), base, "a failed op must free everything it allocated");
    drop((x, h, i, l));
    Ok(())
}

#[test]
fn copy_on_write_allocates_only_when_shared() -> R {
    let _g = lock();
    let base = live();
    let mut a = Tensor::zeros([100], DType::F32).expect("alloc");
    a.make_mut::<f32>()?[0] = 1.0;
    assert_eq!(live() - base, 400, "a unique tensor is written in place");
    let shared = a.clone();
    a.make_mut::<f32>()?[1] = 2.0;
    assert_eq!(live() - base, 800, "a shared tensor is copied first");
    assert!(!a.same_storage(&shared));
    drop(shared);
    assert_eq!(live() - base, 400);
    drop(a);
    assert_eq!(live(), base);
    Ok(())
}

#[test]
fn freed_large_buffers_are_cached_reserved_and_reused() -> R {
    let _g = lock();
    tapir_tensor::cache::empty_cache();
    let s0 = stats();
    assert_eq!(s0.reserved, s0.allocated);
    let x = Tensor::ones([64, 1024], DType::F32)?; // 256 KiB, not from the cache
    let y = x.tanh()?; // a kernel output: the cache is asked first
    let bytes = 64 * 1024 * 4;
    drop(y);
    let s1 = stats();
    // Freed, so not allocated, but kept: still reserved.
    assert_eq!(s1.allocated, s0.allocated + bytes);
    assert_eq!(s1.reserved, s1.allocated + bytes);
    assert_eq!(tapir_tensor::cache::cached_bytes(), bytes);
    // The next output of that size reuses it: no system allocation, and
    // reserved does not grow.
    let z = x.exp()?;
    let s2 = stats();
    assert_eq!(s2.allocated, s0.allocated + 2 * bytes);
    assert_eq!(s2.reserved, s2.allocated);
    assert_eq!(s2.system_allocations, s1.system_allocations);
    assert_eq!(s2.allocations, s1.allocations + 1);
    assert!(z.to_vec::<f32>()?.iter().all(|&v| (v - 1f32.exp()).abs() < 1e-6));
    drop((x, z));
    tapir_tensor::cache::empty_cache();
    let s3 = stats();
    assert_eq!(s3.allocated, s0.allocated);
    assert_eq!(s3.reserved, s0.reserved);
    Ok(())
}

/// Each cached buffer carries its provenance until a storage adopts it:
/// two taken from the cache before either becomes a tensor, adopted in the
/// other order, are both reuses (no system allocation, reserved flat).
#[test]
fn two_cached_buffers_taken_before_either_is_adopted_count_exactly() -> R {
    let _g = lock();
    tapir_tensor::cache::empty_cache();
    let n = 64 * 1024; // 256 KiB of f32, cached when freed
    let bytes = n * 4;
    let x = Tensor::ones([n], DType::F32)?;
    drop((x.exp()?, x.tanh()?));
    assert_eq!(tapir_tensor::cache::cached_bytes(), 2 * bytes);
    let s0 = stats();
    let first = tapir_tensor::cache::filled(n, 1.0f32)?;
    let second = tapir_tensor::cache::filled(n, 2.0f32)?;
    assert_eq!(tapir_tensor::cache::cached_bytes(), 0);
    let b = Tensor::from_vec(second, [n])?;
    let a = Tensor::from_vec(first, [n])?;
    let s1 = stats();
    assert_eq!(s1.allocated, s0.allocated + 2 * bytes);
    assert_eq!(s1.reserved, s0.reserved, "both bytes were reserved already, in the cache");
    assert_eq!(s1.allocations, s0.allocations + 2);
    assert_eq!(s1.system_allocations, s0.system_allocations, "neither is a system allocation");
    assert_eq!((a.to_vec::<f32>()?[0], b.to_vec::<f32>()?[n - 1]), (1.0, 2.0));
    // A fresh buffer is still a system allocation.
    let c = Tensor::from_vec(tapir_tensor::cache::filled(n, 3.0f32)?, [n])?;
    assert_eq!(stats().system_allocations, s1.system_allocations + 1);
    drop((a, b, c));
    tapir_tensor::cache::empty_cache();
    let s2 = stats();
    assert_eq!((s2.allocated, s2.reserved), (s0.allocated, s0.allocated));
    drop(x);
    Ok(())
}
