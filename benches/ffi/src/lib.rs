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
}
