//! C entry points that time tapir-tensor's benchmark kernels, loaded by
//! `benches/torch/tensor_ops.py --interleave` through ctypes: tapir and
//! PyTorch then run in one process, alternating, so both see every phase
//! of a machine whose speed drifts (on the 2-core development VM a memory-
//! bound kernel moves between 10 and 20 Gelem/s over minutes).
//!
//! The ids and shapes are those of `crates/tensor/benches/tensor_ops.rs`.

use std::collections::HashMap;
use std::ffi::{c_char, CStr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tapir_tensor::prelude::*;

/// Large buffers on cache lines, as in the `tapir` command (and as
/// PyTorch's own allocator gives them), so both sides read alike.
#[global_allocator]
static ALLOC: tapir_tensor::AlignedAlloc = tapir_tensor::AlignedAlloc;

type Kernel = Box<dyn Fn() -> Result<Tensor> + Send>;

/// Inputs built once per id (as the criterion bench builds them once), so
/// every round reads the same buffers.
static KERNELS: Mutex<Option<HashMap<String, Kernel>>> = Mutex::new(None);

fn kernel(id: &str) -> Result<Option<Kernel>> {
    const ELEMS: usize = 1 << 24;
    Ok(Some(match id {
        "matmul_f32/256" | "matmul_f32/1024" | "matmul_f32/2048" => {
            let n: usize = id["matmul_f32/".len()..].parse().expect("internal: a size in the id");
            let mut rng = Rng::new(n as u64);
            let (a, b) = (rng.randn([n, n], DType::F32)?, rng.randn([n, n], DType::F32)?);
            Box::new(move || a.matmul(&b))
        }
        "add_f32/16M" | "exp_f32/16M" => {
            let mut rng = Rng::new(1);
            let (a, b) = (rng.randn([ELEMS], DType::F32)?, rng.randn([ELEMS], DType::F32)?);
            if id.starts_with("add") {
                Box::new(move || a.add(&b))
            } else {
                Box::new(move || a.exp())
            }
        }
        "sum_last_axis_f32/4096x4096" => {
            let x = Rng::new(2).randn([4096, 4096], DType::F32)?;
            Box::new(move || x.sum(&[-1], false))
        }
        _ => return Ok(None),
    }))
}

/// Mean nanoseconds per call of benchmark `id` over about `seconds` of
/// calls (after one warm-up call), or a negative number when `id` is
/// unknown, not UTF-8, or the kernel fails.
///
/// # Safety
/// `id` is a valid NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tapir_bench_mean_ns(id: *const c_char, seconds: f64) -> f64 {
    // SAFETY: the caller's contract.
    let Ok(id) = unsafe { CStr::from_ptr(id) }.to_str() else { return -1.0 };
    let mut guard = KERNELS.lock().unwrap_or_else(|e| e.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    if !map.contains_key(id) {
        match kernel(id) {
            Ok(Some(k)) => {
                map.insert(id.to_string(), k);
            }
            _ => return -1.0,
        }
    }
    let k = &map[id];
    if k().is_err() {
        return -1.0;
    }
    let budget = Duration::from_secs_f64(seconds.max(0.0));
    let (start, mut calls) = (Instant::now(), 0u32);
    while calls < 3 || start.elapsed() < budget {
        if k().is_err() {
            return -1.0;
        }
        calls += 1;
    }
    start.elapsed().as_nanos() as f64 / f64::from(calls)
}

/// The CUDA benchmarks of scripts/gpu-check.sh (`benches/torch/cuda_ops.py`
/// is their mirror): `cuda/<op>/<size>`, on device 0. `TAPIR_BENCH_SMALL=1`
/// shrinks every size so the harness itself can be checked on the emulated
/// device (which measures correctness, never speed).
mod cuda {
    use super::*;

    type CudaKernel = Box<dyn Fn() -> Result<Tensor> + Send>;

    pub static KERNELS: Mutex<Option<HashMap<String, CudaKernel>>> = Mutex::new(None);
    /// Driver allocations made by the timed calls of the last benchmark.
    pub static LAST_SYSTEM_ALLOCS: Mutex<u64> = Mutex::new(0);

    fn small() -> bool {
        std::env::var("TAPIR_BENCH_SMALL").is_ok_and(|v| v == "1")
    }

    /// The sizes an id names, shrunk under `TAPIR_BENCH_SMALL=1`.
    pub fn sizes(id: &str) -> Option<(&str, Vec<usize>)> {
        let (op, size) = id.strip_prefix("cuda/")?.rsplit_once('/')?;
        let dims: Option<Vec<usize>> = size.split('x').map(|d| d.parse().ok()).collect();
        let dims = dims?;
        Some((op, if small() { dims.iter().map(|&d| (d / 256).max(4)).collect() } else { dims }))
    }

    pub fn kernel(id: &str) -> Result<Option<CudaKernel>> {
        let Some((op, dims)) = sizes(id) else { return Ok(None) };
        let dev = Device::cuda(0)?;
        let mut rng = Rng::new(7);
        let on = |t: Tensor| t.to_device(dev);
        Ok(Some(match (op, dims.as_slice()) {
            ("matmul_f32" | "matmul_bf16", &[n]) => {
                let dt = if op == "matmul_f32" { DType::F32 } else { DType::BF16 };
                let a = on(rng.randn([n, n], DType::F32)?.cast(dt)?)?;
                let b = on(rng.randn([n, n], DType::F32)?.cast(dt)?)?;
                Box::new(move || a.matmul(&b))
            }
            ("add_f32", &[n]) => {
                let (a, b) = (on(rng.randn([n], DType::F32)?)?, on(rng.randn([n], DType::F32)?)?);
                Box::new(move || a.add(&b))
            }
            ("exp_f32", &[n]) => {
                let a = on(rng.randn([n], DType::F32)?)?;
                Box::new(move || a.exp())
            }
            ("sum_last_axis_f32", &[r, c]) => {
                let x = on(rng.randn([r, c], DType::F32)?)?;
                Box::new(move || x.sum(&[-1], false))
            }
            ("transpose_copy_f32", &[r, c]) => {
                let x = on(rng.randn([r, c], DType::F32)?)?;
                Box::new(move || x.t()?.contiguous())
            }
            _ => return Ok(None),
        }))
    }
}

/// Mean nanoseconds per call of CUDA benchmark `id` (`cuda/add_f32/268435456`)
/// over about `seconds` of calls, the device synchronized before the clock
/// starts and after the last call; a negative number when the id is unknown,
/// no CUDA device is present or a kernel fails. The driver allocations the
/// timed calls made are kept for [`tapir_bench_cuda_system_allocs`].
///
/// # Safety
/// `id` is a valid NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tapir_bench_cuda_mean_ns(id: *const c_char, seconds: f64) -> f64 {
    // SAFETY: the caller's contract.
    let Ok(id) = unsafe { CStr::from_ptr(id) }.to_str() else { return -1.0 };
    let run = || -> Result<f64> {
        let mut guard = cuda::KERNELS.lock().unwrap_or_else(|e| e.into_inner());
        let map = guard.get_or_insert_with(HashMap::new);
        if !map.contains_key(id) {
            let k = cuda::kernel(id)?.ok_or_else(|| Error::invalid_arg("bench", format!("unknown id {id}")))?;
            map.insert(id.to_string(), k);
        }
        let k = &map[id];
        let dev = Device::cuda(0)?;
        drop(k()?);
        tapir_tensor::cuda::synchronize(dev)?;
        let before = memory_stats(dev).system_allocations;
        let budget = Duration::from_secs_f64(seconds.max(0.0));
        let (start, mut calls) = (Instant::now(), 0u32);
        while calls < 3 || start.elapsed() < budget {
            drop(k()?);
            calls += 1;
            if calls % 16 == 0 {
                // Keep the queue short, so the clock reads work done.
                tapir_tensor::cuda::synchronize(dev)?;
            }
        }
        tapir_tensor::cuda::synchronize(dev)?;
        let ns = start.elapsed().as_nanos() as f64 / f64::from(calls);
        *cuda::LAST_SYSTEM_ALLOCS.lock().unwrap_or_else(|e| e.into_inner()) =
            memory_stats(dev).system_allocations - before;
        Ok(ns)
    };
    run().unwrap_or(-1.0)
}

/// Driver allocations made by the timed calls of the last
/// [`tapir_bench_cuda_mean_ns`] (0 in a steady loop after warm-up).
#[no_mangle]
pub extern "C" fn tapir_bench_cuda_system_allocs() -> u64 {
    *cuda::LAST_SYSTEM_ALLOCS.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_known_ids_and_rejects_unknown_ones() {
        let ok = std::ffi::CString::new("matmul_f32/256").unwrap();
        // SAFETY: a valid C string.
        assert!(unsafe { tapir_bench_mean_ns(ok.as_ptr(), 0.0) } > 0.0);
        let bad = std::ffi::CString::new("no_such/1").unwrap();
        // SAFETY: a valid C string.
        assert!(unsafe { tapir_bench_mean_ns(bad.as_ptr(), 0.0) } < 0.0);
    }

    #[test]
    fn cuda_ids_parse_and_unknown_ones_are_rejected() {
        assert_eq!(cuda::sizes("cuda/sum_last_axis_f32/64x32").map(|(op, _)| op), Some("sum_last_axis_f32"));
        assert!(cuda::sizes("matmul_f32/256").is_none());
        let bad = std::ffi::CString::new("cuda/no_such/4").unwrap();
        // SAFETY: a valid C string.
        assert!(unsafe { tapir_bench_cuda_mean_ns(bad.as_ptr(), 0.0) } < 0.0);
    }
}
