//! The sanitizer: out-of-bounds and after-free accesses, shared-memory
//! races, barriers reached at different sites (synccheck), reads of
//! never-written memory (initcheck, on in these tests), and launch limits,
//! each reported as the driver and compute-sanitizer would.

mod common;

use std::sync::Arc;

use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use tapir_tensor::cuda::{compile_source, DEFAULT_ARCH};

const SRC: &str = r#"
extern "C" __global__ void fill_upto(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = 1.0f;   // one past the end: i == n
}

extern "C" __global__ void fill(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 1.0f;
}

template <bool SYNC> __device__ void tree_sum(const float* x, float* out) {
    __shared__ float s[256];
    int t = threadIdx.x;
    s[t] = x[t];
    if (SYNC) __syncthreads();
    for (int k = 128; k > 0; k >>= 1) {
        if (t < k) s[t] += s[t + k];
        __syncthreads();
    }
    if (t == 0) *out = s[0];
}
extern "C" __global__ void sum_synced(const float* x, float* out) { tree_sum<true>(x, out); }
extern "C" __global__ void sum_racy(const float* x, float* out) { tree_sum<false>(x, out); }

extern "C" __global__ void warp_sum(const float* x, float* out) {
    float v = x[threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    if (threadIdx.x == 0) *out = v;
}

extern "C" __global__ void copy(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}

// Threads below k wait at the first barrier, the others at the second.
extern "C" __global__ void divergent_barrier(float* out, int k) {
    __shared__ float s[64];
    int t = threadIdx.x;
    s[t] = (float)t;
    if (t < k) {
        __syncthreads();
        out[t] = s[63 - t];
    }
    __syncthreads();
    out[t] += 1.0f;
}

extern "C" __global__ void dyn_shared(float* out, int n) {
    extern __shared__ float buf[];
    buf[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    if (threadIdx.x < n) out[threadIdx.x] = buf[n - 1 - threadIdx.x];
}
"#;

fn setup(test: &str) -> Option<(Arc<CudaStream>, Arc<cudarc::driver::CudaModule>)> {
    if !common::emulator_or_skip(test) || !common::nvrtc_or_skip(test) {
        return None;
    }
    let s = CudaContext::new(0).unwrap().default_stream();
    let ptx = compile_source("sanitizer.cu", SRC, DEFAULT_ARCH).expect("the test kernels compile");
    let m = s.context().load_module(Ptx::from_src(ptx)).unwrap();
    Some((s, m))
}

fn f(m: &Arc<cudarc::driver::CudaModule>, name: &str) -> CudaFunction {
    m.load_function(name).unwrap()
}

/// A launch's fault: returned by the launch in the synchronous mode
/// (`TAPIR_CUDA_EMU_SYNC=1`), by the next synchronize otherwise.
fn fault<T>(launched: Result<T, cudarc::driver::DriverError>, s: &CudaStream) -> cudarc::driver::DriverError {
    match launched {
        Err(e) => e,
        Ok(_) => s.synchronize().expect_err("the kernel faults"),
    }
}

/// Clears the context's sticky error, as a test that goes on after a fault must.
fn reset() {
    // SAFETY: a plain driver call; the calling test holds the device alone.
    let rc = unsafe { cudarc::driver::sys::cuDevicePrimaryCtxReset_v2(0) };
    assert_eq!(rc, CUresult::CUDA_SUCCESS);
}

fn cfg(grid: u32, block: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

#[test]
fn one_element_past_the_buffer_names_thread_and_address() {
    let _device = common::faulting();
    let Some((s, m)) = setup("one_element_past_the_buffer_names_thread_and_address") else { return };
    let n = 100i32;
    let mut out = s.alloc_zeros::<f32>(n as usize).unwrap();
    let base = {
        let (p, _g) = out.device_ptr(&s);
        p
    };
    let func = f(&m, "fill_upto");
    let mut l = s.launch_builder(&func);
    l.arg(&mut out).arg(&n);
    // SAFETY: (out, n); the kernel's bug is what is tested.
    let err = fault(unsafe { l.launch(cfg(2, 64)) }, &s);
    assert_eq!(err.0, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    let msg = common::last_error();
    println!("{msg}");
    let addr = format!("{:#x}", base + 4 * 100);
    assert!(msg.contains("invalid __global__ write of size 4"), "{msg}");
    assert!(msg.contains(&addr), "the message names address {addr}: {msg}");
    assert!(msg.contains("block (1, 0, 0), thread (36, 0, 0)"), "thread 100 is block 1, thread 36: {msg}");
    assert!(msg.contains("kernel fill_upto"), "{msg}");
    assert!(msg.contains("past the end of a 400-byte allocation"), "{msg}");
    reset();
    // The correct kernel on the same buffer passes.
    let func = f(&m, "fill");
    let mut l = s.launch_builder(&func);
    l.arg(&mut out).arg(&n);
    // SAFETY: (out, n).
    unsafe { l.launch(cfg(2, 64)) }.unwrap();
    assert_eq!(s.clone_dtoh(&out).unwrap(), vec![1f32; 100]);
}

#[test]
fn access_after_free_is_an_illegal_address() {
    let _device = common::faulting();
    let Some((s, m)) = setup("access_after_free_is_an_illegal_address") else { return };
    let mut p = 0u64;
    // SAFETY: raw driver calls on a pointer this test owns.
    unsafe {
        assert_eq!(cudarc::driver::sys::cuMemAlloc_v2(&mut p, 256), CUresult::CUDA_SUCCESS);
        assert_eq!(cudarc::driver::sys::cuMemFree_v2(p), CUresult::CUDA_SUCCESS);
    }
    let func = f(&m, "fill");
    let n = 64i32;
    let mut l = s.launch_builder(&func);
    l.arg(&p).arg(&n);
    // SAFETY: the pointer is stale on purpose.
    let err = fault(unsafe { l.launch(cfg(1, 64)) }, &s);
    assert_eq!(err.0, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    let msg = common::last_error();
    assert!(msg.contains("was freed"), "{msg}");
    assert!(msg.contains("thread (0, 0, 0)"), "{msg}");
}

#[test]
fn a_reduction_without_its_syncthreads_is_a_race() {
    let _device = common::faulting();
    let Some((s, m)) = setup("a_reduction_without_its_syncthreads_is_a_race") else { return };
    let x: Vec<f32> = (0..256).map(|i| i as f32).collect();
    let dx = s.clone_htod(&x).unwrap();
    let mut out = s.alloc_zeros::<f32>(1).unwrap();
    let func = f(&m, "sum_synced");
    let mut l = s.launch_builder(&func);
    l.arg(&dx).arg(&mut out);
    // SAFETY: (x, out) with 256 threads.
    unsafe { l.launch(cfg(1, 256)) }.unwrap();
    assert_eq!(s.clone_dtoh(&out).unwrap(), vec![(0..256).sum::<i32>() as f32]);
    let func = f(&m, "sum_racy");
    let mut l = s.launch_builder(&func);
    l.arg(&dx).arg(&mut out);
    // SAFETY: as above.
    let err = fault(unsafe { l.launch(cfg(1, 256)) }, &s);
    assert_eq!(err.0, CUresult::CUDA_ERROR_LAUNCH_FAILED);
    let msg = common::last_error();
    println!("{msg}");
    assert!(msg.contains("shared-memory race"), "{msg}");
    assert!(msg.contains("kernel sum_racy"), "{msg}");
}

#[test]
fn warp_shuffles_wait_for_their_lanes() {
    let _device = common::shared_device();
    let Some((s, m)) = setup("warp_shuffles_wait_for_their_lanes") else { return };
    let x: Vec<f32> = (0..32).map(|i| (i * i) as f32).collect();
    let dx = s.clone_htod(&x).unwrap();
    let mut out = s.alloc_zeros::<f32>(1).unwrap();
    let func = f(&m, "warp_sum");
    let mut l = s.launch_builder(&func);
    l.arg(&dx).arg(&mut out);
    // SAFETY: (x, out) with one warp.
    unsafe { l.launch(cfg(1, 32)) }.unwrap();
    assert_eq!(s.clone_dtoh(&out).unwrap(), vec![x.iter().sum::<f32>()]);
}

#[test]
fn launch_limits_return_the_drivers_errors() {
    let _device = common::shared_device();
    let Some((s, m)) = setup("launch_limits_return_the_drivers_errors") else { return };
    let mut out = s.alloc_zeros::<f32>(4096).unwrap();
    let n = 4096i32;
    let func = f(&m, "fill");
    for (grid, block) in
        [((1, 1, 1), (2048, 1, 1)), ((1, 1, 1), (1, 1, 65)), ((1, 65536, 1), (32, 1, 1)), ((0, 1, 1), (32, 1, 1))]
    {
        let mut l = s.launch_builder(&func);
        l.arg(&mut out).arg(&n);
        let c = LaunchConfig { grid_dim: grid, block_dim: block, shared_mem_bytes: 0 };
        // SAFETY: rejected before it runs.
        let err = unsafe { l.launch(c) }.expect_err("past the limits");
        assert_eq!(err.0, CUresult::CUDA_ERROR_INVALID_VALUE, "grid {grid:?} block {block:?}");
    }
    assert!(common::last_error().contains("zero"), "{}", common::last_error());
    // 1,024 threads is the limit, and allowed.
    let mut l = s.launch_builder(&func);
    l.arg(&mut out).arg(&n);
    // SAFETY: (out, n).
    unsafe { l.launch(cfg(4, 1024)) }.unwrap();
    // Dynamic shared memory: 48 KiB unless the function's attribute raises it.
    let func = f(&m, "dyn_shared");
    let big = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (64, 1, 1), shared_mem_bytes: 64 * 1024 };
    let mut l = s.launch_builder(&func);
    l.arg(&mut out).arg(&64i32);
    // SAFETY: rejected before it runs.
    let err = unsafe { l.launch(big) }.expect_err("64 KiB needs the attribute");
    assert_eq!(err.0, CUresult::CUDA_ERROR_INVALID_VALUE);
    func.set_attribute(
        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        64 * 1024,
    )
    .unwrap();
    let mut l = s.launch_builder(&func);
    l.arg(&mut out).arg(&64i32);
    // SAFETY: (out, n) with 64 threads and enough shared memory.
    unsafe { l.launch(big) }.unwrap();
    let got = s.clone_dtoh(&out).unwrap();
    assert_eq!(got[0], 63.0);
    assert_eq!(got[63], 0.0);
}

#[test]
fn threads_waiting_at_different_barriers_are_reported() {
    let _device = common::faulting();
    let Some((s, m)) = setup("threads_waiting_at_different_barriers_are_reported") else { return };
    let func = f(&m, "divergent_barrier");
    let mut out = s.alloc_zeros::<f32>(64).unwrap();
    // Every thread takes the branch: both barriers are reached by all.
    let mut l = s.launch_builder(&func);
    l.arg(&mut out).arg(&64i32);
    // SAFETY: (out, k) with 64 threads.
    unsafe { l.launch(cfg(1, 64)) }.unwrap();
    let want: Vec<f32> = (0..64).map(|t| (64 - t) as f32).collect();
    assert_eq!(s.clone_dtoh(&out).unwrap(), want);
    // Threads 0..16 wait at the barrier inside the branch, the rest at the one after it.
    let mut l = s.launch_builder(&func);
    l.arg(&mut out).arg(&16i32);
    // SAFETY: as above; the kernel's bug is what is tested.
    let err = fault(unsafe { l.launch(cfg(1, 64)) }, &s);
    assert_eq!(err.0, CUresult::CUDA_ERROR_LAUNCH_FAILED);
    let msg = common::last_error();
    println!("{msg}");
    assert!(msg.contains("synccheck") && msg.contains("different barriers"), "{msg}");
    assert!(msg.contains("kernel divergent_barrier"), "{msg}");
    let lines: Vec<&str> =
        msg.split("PTX line ").skip(1).map(|r| r.split(|c: char| !c.is_ascii_digit()).next().unwrap()).collect();
    assert_eq!(lines.len(), 2, "both barrier sites are named: {msg}");
    assert_ne!(lines[0], lines[1], "two different sites: {msg}");
}

#[test]
fn a_read_of_never_written_memory_is_reported() {
    let _device = common::faulting();
    let Some((s, m)) = setup("a_read_of_never_written_memory_is_reported") else { return };
    let func = f(&m, "copy");
    let n = 64i32;
    let mut y = s.alloc_zeros::<f32>(64).unwrap();
    // SAFETY: left unwritten on purpose; only the emulator reads it.
    let mut x = unsafe { s.alloc::<f32>(64) }.unwrap();
    let base = {
        let (p, _g) = x.device_ptr(&s);
        p
    };
    let mut l = s.launch_builder(&func);
    l.arg(&x).arg(&mut y).arg(&n);
    // SAFETY: (x, y, n); reading x is the bug tested.
    let err = fault(unsafe { l.launch(cfg(1, 64)) }, &s);
    assert_eq!(err.0, CUresult::CUDA_ERROR_LAUNCH_FAILED);
    let msg = common::last_error();
    println!("{msg}");
    assert!(msg.contains("initcheck") && msg.contains("never written"), "{msg}");
    assert!(msg.contains(&format!("{base:#x}")), "the message names the allocation: {msg}");
    assert!(msg.contains("kernel copy, block (0, 0, 0), thread (0, 0, 0)"), "{msg}");
    reset();
    // A kernel writes the first half: reading it passes, reading past it does not.
    let fill = f(&m, "fill");
    let mut l = s.launch_builder(&fill);
    l.arg(&mut x).arg(&32i32);
    // SAFETY: (out, n).
    unsafe { l.launch(cfg(1, 64)) }.unwrap();
    let mut l = s.launch_builder(&func);
    l.arg(&x).arg(&mut y).arg(&32i32);
    // SAFETY: (x, y, n) within the written half.
    unsafe { l.launch(cfg(1, 64)) }.unwrap();
    let mut l = s.launch_builder(&func);
    l.arg(&x).arg(&mut y).arg(&n);
    // SAFETY: as above; element 32 on is unwritten.
    fault(unsafe { l.launch(cfg(1, 64)) }, &s);
    assert!(common::last_error().contains("thread (32, 0, 0)"), "{}", common::last_error());
    reset();
    // A memset and a copy from the host count as writes.
    s.memset_zeros(&mut x).unwrap();
    let mut l = s.launch_builder(&func);
    l.arg(&x).arg(&mut y).arg(&n);
    // SAFETY: (x, y, n), all written.
    unsafe { l.launch(cfg(1, 64)) }.unwrap();
    // SAFETY: unwritten again, then copied into.
    let mut z = unsafe { s.alloc::<f32>(64) }.unwrap();
    let host: Vec<f32> = (0..64).map(|i| i as f32).collect();
    s.memcpy_htod(&host, &mut z).unwrap();
    let mut l = s.launch_builder(&func);
    l.arg(&z).arg(&mut y).arg(&n);
    // SAFETY: (z, y, n).
    unsafe { l.launch(cfg(1, 64)) }.unwrap();
    assert_eq!(s.clone_dtoh(&y).unwrap(), host);
}
