//! tapir-tensor with `tapir_tensor::AlignedAlloc` as the process's global
//! allocator, as the `tapir` command runs it: fresh and cached tensor
//! buffers start on cache lines, the memory counters stay exact through
//! the CPU cache and `empty_cache` (which frees through the allocator),
//! and results are those of the plain kernels. A binary of its own, so the
//! allocator and the process-wide counters are this file's alone.

use tapir_tensor::prelude::*;
use tapir_tensor::{buffer_alignment, cache, memory_stats, CpuElement};

#[global_allocator]
static ALLOC: tapir_tensor::AlignedAlloc = tapir_tensor::AlignedAlloc;

fn on_a_line<T: CpuElement>(t: &Tensor) -> bool {
    (t.as_slice::<T>().expect("a contiguous CPU tensor").as_ptr() as usize).is_multiple_of(64)
}

#[test]
fn buffers_start_on_cache_lines_and_the_counters_stay_exact() -> Result<()> {
    assert_eq!(buffer_alignment(), 64);
    let before = memory_stats(Device::Cpu);
    {
        let x = Rng::new(0).randn([512, 1000], DType::F32)?;
        let y = x.exp()?.add(&x)?;
        let sums = y.sum(&[-1], false)?;
        let wide = x.cast(DType::F64)?;
        assert!(on_a_line::<f32>(&x) && on_a_line::<f32>(&y) && on_a_line::<f64>(&wide));
        // The sums against a plain f64 sum of each row.
        let (yv, sv) = (y.to_vec::<f32>()?, sums.to_vec::<f32>()?);
        for (r, s) in sv.iter().enumerate() {
            let want: f64 = yv[r * 1000..(r + 1) * 1000].iter().map(|&v| v as f64).sum();
            assert!((*s as f64 - want).abs() <= 1e-5 * want.abs().max(1.0), "row {r}: {s} vs {want}");
        }
        // A freed buffer comes back from the CPU cache on a cache line too.
        drop(y);
        let again = x.exp()?.add(&x)?;
        assert!(on_a_line::<f32>(&again));
    }
    let after = memory_stats(Device::Cpu);
    assert_eq!(after.allocated, before.allocated, "live bytes after the scope");
    cache::empty_cache();
    let emptied = memory_stats(Device::Cpu);
    assert_eq!(emptied.reserved, emptied.allocated, "empty_cache returns every cached byte");
    let fresh = Rng::new(1).randn([512, 1000], DType::F32)?;
    assert!(on_a_line::<f32>(&fresh));
    Ok(())
}

/// A `Vec` grown element by element through the 4 KiB line and shrunk
/// back keeps every element (reallocation across the allocator's two
/// classes, through the global allocator itself).
#[test]
fn vectors_grow_and_shrink_across_the_threshold() {
    let mut v: Vec<u32> = Vec::new();
    for i in 0..20_000u32 {
        v.push(i);
    }
    assert!((v.as_ptr() as usize).is_multiple_of(64));
    v.truncate(100);
    v.shrink_to_fit();
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u32));
    v.extend(100..5_000u32);
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u32));
}
