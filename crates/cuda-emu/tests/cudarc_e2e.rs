//! cudarc end to end against the emulator: a context, allocations, copies,
//! NVRTC-compiled kernels of kernels/ launched with `launch_builder`,
//! cuBLAS products and vector routines against naive ones, out-of-memory at
//! the capacity, limits read back, and the library found as `libcuda.so.1`.

mod common;

use std::sync::Arc;

use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{CudaContext, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use tapir_tensor::cuda::{compile_kernel, DEFAULT_ARCH};

fn stream() -> Arc<CudaStream> {
    CudaContext::new(0).expect("the emulated device gives a context").default_stream()
}

#[test]
fn context_device_and_copies() {
    if !common::emulator_or_skip("context_device_and_copies") {
        return;
    }
    let ctx = CudaContext::new(0).unwrap();
    let name = ctx.name().unwrap();
    assert!(name.contains("emulated"), "{name}");
    let (major, minor) = (
        ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR).unwrap(),
        ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR).unwrap(),
    );
    assert_eq!((major, minor), (9, 0));
    let s = ctx.default_stream();
    let host: Vec<u32> = (0..1000).collect();
    let d = s.clone_htod(&host).unwrap();
    let mut e = s.alloc_zeros::<u32>(1000).unwrap();
    s.memcpy_dtod(&d, &mut e).unwrap();
    let back = s.clone_dtoh(&e).unwrap();
    assert_eq!(back, host);
    let mut z = s.alloc_zeros::<u8>(17).unwrap();
    s.memset_zeros(&mut z).unwrap();
    assert_eq!(s.clone_dtoh(&z).unwrap(), vec![0u8; 17]);
    let own = ctx.new_stream().unwrap();
    let f = own.clone_htod(&[1.5f32, 2.5]).unwrap();
    own.synchronize().unwrap();
    assert_eq!(own.clone_dtoh(&f).unwrap(), vec![1.5, 2.5]);
}

#[test]
fn out_of_memory_at_the_capacity() {
    if !common::emulator_or_skip("out_of_memory_at_the_capacity") {
        return;
    }
    let s = stream();
    let (free, total) = cudarc::driver::result::mem_get_info().unwrap();
    assert!(free <= total && total > 0);
    // SAFETY: the buffer is never read.
    let err = unsafe { s.alloc::<u8>(total + 1) }.expect_err("an allocation past the capacity fails");
    assert_eq!(err.0, cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY, "{err:?}");
    assert!(common::last_error().contains("out of memory"), "{}", common::last_error());
    // The device is still usable afterwards.
    let ok = s.clone_htod(&[7u8; 64]).unwrap();
    assert_eq!(s.clone_dtoh(&ok).unwrap(), vec![7u8; 64]);
}

#[test]
fn elementwise_kernel_through_launch_builder() {
    if !common::emulator_or_skip("elementwise_kernel_through_launch_builder")
        || !common::nvrtc_or_skip("elementwise_kernel_through_launch_builder")
    {
        return;
    }
    let s = stream();
    let ptx = compile_kernel("elementwise.cu", DEFAULT_ARCH).unwrap();
    let module = s.context().load_module(Ptx::from_src(ptx)).unwrap();
    let n = 1000usize;
    let a = common::data(n, 1, 2.0);
    let b = common::data(n, 2, 2.0);
    let (da, db) = (s.clone_htod(&a).unwrap(), s.clone_htod(&b).unwrap());
    let mut out = s.alloc_zeros::<f32>(n).unwrap();
    // mul_f32(n, ndim, info, a, a_off, b, b_off, out), contiguous (info null).
    let f = module.load_function("mul_f32").unwrap();
    let cfg = LaunchConfig { grid_dim: (4, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let (n64, ndim, null, zero) = (n as i64, 1i32, 0u64, 0i64);
    let mut l = s.launch_builder(&f);
    l.arg(&n64).arg(&ndim).arg(&null).arg(&da).arg(&zero).arg(&db).arg(&zero).arg(&mut out);
    // SAFETY: the arguments match the kernel's signature.
    unsafe { l.launch(cfg) }.unwrap();
    let got = s.clone_dtoh(&out).unwrap();
    for i in 0..n {
        assert_eq!(got[i].to_bits(), (a[i] * b[i]).to_bits(), "element {i}");
    }
    // exp_f32(n, ndim, info, x, x_off, p0, p1, out): within an ulp or two of the CPU's.
    let f = module.load_function("exp_f32").unwrap();
    let (p0, p1) = (0f64, 0f64);
    let mut l = s.launch_builder(&f);
    l.arg(&n64).arg(&ndim).arg(&null).arg(&da).arg(&zero).arg(&p0).arg(&p1).arg(&mut out);
    // SAFETY: as above.
    unsafe { l.launch(cfg) }.unwrap();
    let got = s.clone_dtoh(&out).unwrap();
    for i in 0..n {
        let want = a[i].exp();
        assert!((got[i] - want).abs() <= 4.0 * f32::EPSILON * want, "exp({}) = {} not {want}", a[i], got[i]);
    }
}

#[test]
fn softmax_kernel_row_by_row() {
    if !common::emulator_or_skip("softmax_kernel_row_by_row") || !common::nvrtc_or_skip("softmax_kernel_row_by_row") {
        return;
    }
    let s = stream();
    let (rows, cols) = (8usize, 1000usize);
    let x = common::data(rows * cols, 3, 2.0);
    let dx = s.clone_htod(&x).unwrap();
    let module = s.context().load_module(Ptx::from_src(compile_kernel("softmax.cu", DEFAULT_ARCH).unwrap())).unwrap();
    let f = module.load_function("softmax_f32").unwrap();
    let mut out = s.alloc_zeros::<f32>(rows * cols).unwrap();
    let (r, c) = (rows as i64, cols as i64);
    let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut l = s.launch_builder(&f);
    l.arg(&r).arg(&c).arg(&dx).arg(&mut out);
    // SAFETY: softmax_f32(rows, cols, x, out).
    unsafe { l.launch(cfg) }.unwrap();
    let got = s.clone_dtoh(&out).unwrap();
    for row in 0..rows {
        let xs = &x[row * cols..(row + 1) * cols];
        let m = xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let z: f64 = xs.iter().map(|v| f64::from((v - m).exp())).sum();
        for j in 0..cols {
            let want = (f64::from((xs[j] - m).exp()) / z) as f32;
            let g = got[row * cols + j];
            assert!((g - want).abs() <= 1e-6 + 1e-5 * want, "row {row} col {j}: {g} vs {want}");
        }
    }
    println!("emulator: {} thread-instructions so far", instructions());
}

fn instructions() -> u64 {
    // SAFETY: the emulator is loaded; the symbol has this signature.
    unsafe {
        let lib = libloading::Library::new("libcuda.so").unwrap();
        lib.get::<unsafe extern "C" fn() -> u64>(b"tapirEmuInstructions\0").unwrap()()
    }
}

/// The column-major product `op(A) op(B)` of an `m x k` and a `k x n`, naively.
#[allow(clippy::too_many_arguments)]
fn naive(ta: bool, tb: bool, m: usize, n: usize, k: usize, a: &[f32], lda: usize, b: &[f32], ldb: usize) -> Vec<f64> {
    let mut c = vec![0f64; m * n];
    for j in 0..n {
        for i in 0..m {
            let mut s = 0f64;
            for l in 0..k {
                let x = if ta { a[l + i * lda] } else { a[i + l * lda] };
                let y = if tb { b[j + l * ldb] } else { b[l + j * ldb] };
                s += f64::from(x) * f64::from(y);
            }
            c[i + j * m] = s;
        }
    }
    c
}

#[test]
fn cublas_gemm_against_a_naive_product() {
    if !common::emulator_or_skip("cublas_gemm_against_a_naive_product")
        || !common::cublas_or_skip("cublas_gemm_against_a_naive_product")
    {
        return;
    }
    let s = stream();
    let blas = CudaBlas::new(s.clone()).unwrap();
    let (m, n, k) = (37usize, 23usize, 41usize);
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let (lda, ldb) = (if ta { k } else { m }, if tb { n } else { k });
        let a = common::data(m * k, 5, 2.0);
        let b = common::data(k * n, 6, 2.0);
        let (da, db) = (s.clone_htod(&a).unwrap(), s.clone_htod(&b).unwrap());
        let mut dc = s.alloc_zeros::<f32>(m * n).unwrap();
        let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
        let cfg = GemmConfig {
            transa: op(ta),
            transb: op(tb),
            m: m as i32,
            n: n as i32,
            k: k as i32,
            alpha: 1.0f32,
            lda: lda as i32,
            ldb: ldb as i32,
            beta: 0.0f32,
            ldc: m as i32,
        };
        // SAFETY: the buffers hold the matrices the configuration describes.
        unsafe { blas.gemm(cfg, &da, &db, &mut dc) }.unwrap();
        let got = s.clone_dtoh(&dc).unwrap();
        let want = naive(ta, tb, m, n, k, &a, lda, &b, ldb);
        for i in 0..m * n {
            assert!((f64::from(got[i]) - want[i]).abs() < 1e-4, "({ta}, {tb}) element {i}: {} vs {}", got[i], want[i]);
        }
        // A strided batch of two, the second scaled by alpha = 2 plus beta * C.
        let a2: Vec<f32> = a.iter().chain(a.iter()).copied().collect();
        let b2: Vec<f32> = b.iter().chain(b.iter()).copied().collect();
        let (da2, db2) = (s.clone_htod(&a2).unwrap(), s.clone_htod(&b2).unwrap());
        let mut dc2 = s.clone_htod(&vec![1f32; 2 * m * n]).unwrap();
        let bcfg = StridedBatchedConfig {
            gemm: GemmConfig { alpha: 2.0f32, beta: 1.0f32, ..cfg },
            batch_size: 2,
            stride_a: (m * k) as i64,
            stride_b: (k * n) as i64,
            stride_c: (m * n) as i64,
        };
        // SAFETY: as above.
        unsafe { blas.gemm_strided_batched(bcfg, &da2, &db2, &mut dc2) }.unwrap();
        let got = s.clone_dtoh(&dc2).unwrap();
        for i in 0..2 * m * n {
            let w = 2.0 * want[i % (m * n)] + 1.0;
            assert!((f64::from(got[i]) - w).abs() < 1e-3, "batched element {i}: {} vs {w}", got[i]);
        }
    }
    // A leading dimension smaller than the rows is CUBLAS_STATUS_INVALID_VALUE.
    let da = s.alloc_zeros::<f32>(m * k).unwrap();
    let db = s.alloc_zeros::<f32>(k * n).unwrap();
    let mut dc = s.alloc_zeros::<f32>(m * n).unwrap();
    let bad = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: m as i32,
        n: n as i32,
        k: k as i32,
        alpha: 1.0f32,
        lda: m as i32 - 1,
        ldb: k as i32,
        beta: 0.0f32,
        ldc: m as i32,
    };
    // SAFETY: rejected before any access.
    let err = unsafe { blas.gemm(bad, &da, &db, &mut dc) }.expect_err("lda < m is rejected");
    assert_eq!(err.0, cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE);
}

#[test]
fn cublas_gemm_ex_bf16_and_f16_inputs() {
    if !common::emulator_or_skip("cublas_gemm_ex_bf16_and_f16_inputs")
        || !common::cublas_or_skip("cublas_gemm_ex_bf16_and_f16_inputs")
    {
        return;
    }
    use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType};
    use cudarc::driver::{DevicePtr, DevicePtrMut};
    let s = stream();
    let blas = CudaBlas::new(s.clone()).unwrap();
    let (m, n, k) = (16usize, 9usize, 33usize);
    let a = common::data(m * k, 7, 2.0);
    let b = common::data(k * n, 8, 2.0);
    let want = naive(false, false, m, n, k, &a, m, &b, k);
    for (ty, bits) in [
        (cudaDataType::CUDA_R_16BF, (|x: f32| half::bf16::from_f32(x).to_bits()) as fn(f32) -> u16),
        (cudaDataType::CUDA_R_16F, |x: f32| half::f16::from_f32(x).to_bits()),
    ] {
        let ah: Vec<u16> = a.iter().map(|&x| bits(x)).collect();
        let bh: Vec<u16> = b.iter().map(|&x| bits(x)).collect();
        let (da, db) = (s.clone_htod(&ah).unwrap(), s.clone_htod(&bh).unwrap());
        let mut dc = s.alloc_zeros::<f32>(m * n).unwrap();
        let (alpha, beta) = (1.0f32, 0.0f32);
        {
            let (pa, _ga) = da.device_ptr(&s);
            let (pb, _gb) = db.device_ptr(&s);
            let (pc, _gc) = dc.device_ptr_mut(&s);
            // SAFETY: the buffers hold the matrices described.
            let rc = unsafe {
                cudarc::cublas::sys::cublasGemmEx(
                    *blas.handle(),
                    cublasOperation_t::CUBLAS_OP_N,
                    cublasOperation_t::CUBLAS_OP_N,
                    m as i32,
                    n as i32,
                    k as i32,
                    (&alpha as *const f32).cast(),
                    pa as *const _,
                    ty,
                    m as i32,
                    pb as *const _,
                    ty,
                    k as i32,
                    (&beta as *const f32).cast(),
                    pc as *mut _,
                    cudaDataType::CUDA_R_32F,
                    m as i32,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            };
            assert_eq!(rc, cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS);
        }
        let got = s.clone_dtoh(&dc).unwrap();
        // Inputs rounded to 8 (bf16) or 11 (f16) significant bits.
        for i in 0..m * n {
            assert!((f64::from(got[i]) - want[i]).abs() < 0.25, "{ty:?} element {i}: {} vs {}", got[i], want[i]);
        }
    }
}

/// Every driver entry point cudarc 0.19's driver module (`result.rs` and the
/// safe API) can call: cudarc resolves each on first use and panics when
/// one is missing, so each must exist, even if only to say not supported.
const CUDARC_DRIVER_SYMBOLS: &[&str] = &[
    "cuCtxCreate_v3",
    "cuCtxCreate_v4",
    "cuCtxDestroy_v2",
    "cuCtxGetCacheConfig",
    "cuCtxGetCurrent",
    "cuCtxGetLimit",
    "cuCtxGetStreamPriorityRange",
    "cuCtxSetCacheConfig",
    "cuCtxSetCurrent",
    "cuCtxSetFlags",
    "cuCtxSetLimit",
    "cuCtxSynchronize",
    "cuDestroyExternalMemory",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetCount",
    "cuDeviceGetDefaultMemPool",
    "cuDeviceGetMemPool",
    "cuDeviceGetName",
    "cuDeviceGetUuid",
    "cuDeviceGetUuid_v2",
    "cuDevicePrimaryCtxRelease_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDeviceSetMemPool",
    "cuDeviceTotalMem_v2",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventElapsedTime",
    "cuEventElapsedTime_v2",
    "cuEventQuery",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuExternalMemoryGetMappedBuffer",
    "cuFuncGetAttribute",
    "cuFuncSetAttribute",
    "cuFuncSetCacheConfig",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphUpload",
    "cuImportExternalMemory",
    "cuInit",
    "cuLaunchCooperativeKernel",
    "cuLaunchHostFunc",
    "cuLaunchKernel",
    "cuMemAdvise_v2",
    "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocManaged",
    "cuMemAlloc_v2",
    "cuMemFreeAsync",
    "cuMemFreeHost",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuMemHostAlloc",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemPoolGetAttribute",
    "cuMemPoolSetAttribute",
    "cuMemPoolTrimTo",
    "cuMemPrefetchAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyDtoD_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyPeerAsync",
    "cuMemsetD8Async",
    "cuMemsetD8_v2",
    "cuModuleGetFunction",
    "cuModuleGetGlobal_v2",
    "cuModuleLoad",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuOccupancyAvailableDynamicSMemPerBlock",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
    "cuOccupancyMaxActiveClusters",
    "cuOccupancyMaxPotentialBlockSize",
    "cuOccupancyMaxPotentialBlockSizeWithFlags",
    "cuOccupancyMaxPotentialClusterSize",
    "cuProfilerStart",
    "cuProfilerStop",
    "cuStreamAttachMemAsync",
    "cuStreamBeginCapture_v2",
    "cuStreamCreate",
    "cuStreamCreateWithPriority",
    "cuStreamDestroy_v2",
    "cuStreamEndCapture",
    "cuStreamIsCapturing",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuGetExportTable",
];

/// The cuBLAS entry points cudarc's cublas module can call.
const CUDARC_CUBLAS_SYMBOLS: &[&str] = &[
    "cublasCreate_v2",
    "cublasDestroy_v2",
    "cublasSetStream_v2",
    "cublasSgemm_v2",
    "cublasDgemm_v2",
    "cublasGemmEx",
    "cublasSgemmStridedBatched",
    "cublasDgemmStridedBatched",
    "cublasGemmStridedBatchedEx",
    "cublasGemmGroupedBatchedEx",
    "cublasGetPointerMode_v2",
    "cublasSetPointerMode_v2",
    "cublasSasum_v2",
    "cublasDasum_v2",
    "cublasSgemv_v2",
    "cublasDgemv_v2",
    "cublasSdot_v2",
    "cublasDdot_v2",
    "cublasSnrm2_v2",
    "cublasDnrm2_v2",
    "cublasSaxpy_v2",
    "cublasDaxpy_v2",
    "cublasSscal_v2",
    "cublasDscal_v2",
];

#[test]
fn every_symbol_cudarc_may_call_is_exported() {
    if !common::emulator_or_skip("every_symbol_cudarc_may_call_is_exported") {
        return;
    }
    // SAFETY: opening by name finds the emulator the switch loaded.
    let lib = unsafe { libloading::Library::new("libcuda.so") }.unwrap();
    let missing: Vec<&str> = CUDARC_DRIVER_SYMBOLS
        .iter()
        .copied()
        // SAFETY: only looks the symbol up.
        .filter(|s| unsafe { lib.get::<unsafe extern "C" fn()>(s.as_bytes()) }.is_err())
        .collect();
    assert!(missing.is_empty(), "driver symbols missing: {missing:?}");
    if !common::cublas_or_skip("every_symbol_cudarc_may_call_is_exported") {
        return;
    }
    // SAFETY: as above.
    let blas = unsafe { libloading::Library::new("libcublas.so") }.unwrap();
    let missing: Vec<&str> = CUDARC_CUBLAS_SYMBOLS
        .iter()
        .copied()
        // SAFETY: only looks the symbol up.
        .filter(|s| unsafe { blas.get::<unsafe extern "C" fn()>(s.as_bytes()) }.is_err())
        .collect();
    assert!(missing.is_empty(), "cuBLAS symbols missing: {missing:?}");
}

/// `x` with increment `inc` as BLAS reads it: element `i` at `i * inc`,
/// or counted from the far end when `inc` is negative.
fn strided(x: &[f64], n: usize, inc: i32) -> Vec<f64> {
    let step = inc.unsigned_abs() as usize;
    let v: Vec<f64> = (0..n).map(|i| x[i * step]).collect();
    if inc < 0 {
        v.into_iter().rev().collect()
    } else {
        v
    }
}

/// Level-1 routines and gemv of f32 and f64 against naive sums, with
/// strides (negative ones included), and under CUBLAS_POINTER_MODE_DEVICE.
#[test]
fn cublas_vector_routines_against_naive_sums() {
    if !common::emulator_or_skip("cublas_vector_routines_against_naive_sums")
        || !common::cublas_or_skip("cublas_vector_routines_against_naive_sums")
    {
        return;
    }
    use cudarc::cublas::sys::{self as cb, cublasPointerMode_t, cublasStatus_t};
    use cudarc::cublas::{Asum, AsumConfig, Gemv, GemvConfig};
    use cudarc::driver::{DevicePtr, DevicePtrMut};
    let ok = |rc: cublasStatus_t| assert_eq!(rc, cublasStatus_t::CUBLAS_STATUS_SUCCESS);
    let s = stream();
    let blas = CudaBlas::new(s.clone()).unwrap();
    let h = *blas.handle();
    let n = 301usize;
    let xf = common::data(3 * n, 11, 2.0);
    let yf = common::data(3 * n, 12, 2.0);
    let x64: Vec<f64> = xf.iter().map(|&v| f64::from(v)).collect();
    let y64: Vec<f64> = yf.iter().map(|&v| f64::from(v)).collect();
    let (dx, dy) = (s.clone_htod(&xf).unwrap(), s.clone_htod(&yf).unwrap());
    let (dx64, dy64) = (s.clone_htod(&x64).unwrap(), s.clone_htod(&y64).unwrap());
    for (incx, incy) in [(1i32, 1i32), (2, 3), (-2, 1), (3, -1)] {
        let xs = strided(&x64, n, incx);
        let ys = strided(&y64, n, incy);
        let (px, _gx) = dx.device_ptr(&s);
        let (py, _gy) = dy.device_ptr(&s);
        let (px64, _gx64) = dx64.device_ptr(&s);
        let (py64, _gy64) = dy64.device_ptr(&s);
        let ni = n as i32;
        let dot: f64 = xs.iter().zip(&ys).map(|(a, b)| a * b).sum();
        let (mut rf, mut rd) = (0f32, 0f64);
        // SAFETY: the buffers hold n elements at these increments; the results are host scalars.
        unsafe {
            ok(cb::cublasSdot_v2(h, ni, px as *const f32, incx, py as *const f32, incy, &mut rf));
            ok(cb::cublasDdot_v2(h, ni, px64 as *const f64, incx, py64 as *const f64, incy, &mut rd));
        }
        assert!((f64::from(rf) - dot).abs() < 1e-3, "sdot ({incx}, {incy}): {rf} vs {dot}");
        assert!((rd - dot).abs() < 1e-9, "ddot ({incx}, {incy}): {rd} vs {dot}");
        if incx > 0 {
            let nrm = xs.iter().map(|v| v * v).sum::<f64>().sqrt();
            // SAFETY: as above.
            unsafe {
                ok(cb::cublasSnrm2_v2(h, ni, px as *const f32, incx, &mut rf));
                ok(cb::cublasDnrm2_v2(h, ni, px64 as *const f64, incx, &mut rd));
            }
            assert!((f64::from(rf) - nrm).abs() < 1e-4 * nrm, "snrm2 {incx}: {rf} vs {nrm}");
            assert!((rd - nrm).abs() < 1e-12 * nrm, "dnrm2 {incx}: {rd} vs {nrm}");
        }
    }
    // asum through cudarc's safe wrapper, which passes a host result.
    let asum: f64 = strided(&x64, n, 2).iter().map(|v| v.abs()).sum();
    let mut r = 0f32;
    // SAFETY: x holds n elements at increment 2.
    unsafe { blas.asum(AsumConfig { n: n as i32, incx: 2 }, &dx, &mut r) }.unwrap();
    assert!((f64::from(r) - asum).abs() < 1e-3, "sasum {r} vs {asum}");
    let mut r64 = 0f64;
    // SAFETY: as above.
    unsafe { blas.asum(AsumConfig { n: n as i32, incx: 2 }, &dx64, &mut r64) }.unwrap();
    assert!((r64 - asum).abs() < 1e-9, "dasum {r64} vs {asum}");
    // axpy and scal write y and x in place: y = 1.5 x + y over increments (2, -1), then x *= -0.5.
    {
        let mut dy2 = s.clone_htod(&y64).unwrap();
        let mut dx2 = s.clone_htod(&x64).unwrap();
        let (alpha, half) = (1.5f64, -0.5f64);
        {
            let (px, _gx) = dx2.device_ptr_mut(&s);
            let (py, _gy) = dy2.device_ptr_mut(&s);
            // SAFETY: both hold n elements at these increments.
            unsafe {
                ok(cb::cublasDaxpy_v2(h, n as i32, &alpha, px as *const f64, 2, py as *mut f64, -1));
                ok(cb::cublasDscal_v2(h, n as i32, &half, px as *mut f64, 1));
            }
        }
        let got_y = s.clone_dtoh(&dy2).unwrap();
        let got_x = s.clone_dtoh(&dx2).unwrap();
        let xs = strided(&x64, n, 2);
        for i in 0..n {
            // y with increment -1: element i of the vector is y[n - 1 - i].
            let want = 1.5 * xs[i] + y64[n - 1 - i];
            assert!((got_y[n - 1 - i] - want).abs() < 1e-12, "daxpy element {i}: {} vs {want}", got_y[n - 1 - i]);
            assert_eq!(got_x[i], -0.5 * x64[i], "dscal element {i}");
        }
        assert_eq!(got_y[n..], y64[n..], "daxpy wrote past its vector");
        assert_eq!(got_x[n..], x64[n..], "dscal wrote past its vector");
    }
    // gemv both ways through cudarc's safe wrapper: y = 2 op(A) x - y.
    let (m, k, lda) = (29usize, 17usize, 31usize);
    let a = common::data(lda * k, 13, 2.0);
    let da = s.clone_htod(&a).unwrap();
    for trans in [false, true] {
        let (rows, cols) = if trans { (k, m) } else { (m, k) };
        let xv = common::data(cols, 14, 2.0);
        let y0 = common::data(rows, 15, 2.0);
        let dxv = s.clone_htod(&xv).unwrap();
        let mut dyv = s.clone_htod(&y0).unwrap();
        let cfg = GemvConfig {
            trans: if trans { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N },
            m: m as i32,
            n: k as i32,
            alpha: 2.0f32,
            lda: lda as i32,
            incx: 1,
            beta: -1.0f32,
            incy: 1,
        };
        // SAFETY: A is lda x k, x and y hold op(A)'s columns and rows.
        unsafe { blas.gemv(cfg, &da, &dxv, &mut dyv) }.unwrap();
        let got = s.clone_dtoh(&dyv).unwrap();
        for i in 0..rows {
            let acc: f64 = (0..cols)
                .map(|j| f64::from(if trans { a[j + i * lda] } else { a[i + j * lda] }) * f64::from(xv[j]))
                .sum();
            let want = 2.0 * acc - f64::from(y0[i]);
            assert!((f64::from(got[i]) - want).abs() < 1e-4, "gemv trans={trans} row {i}: {} vs {want}", got[i]);
        }
        // lda < m is CUBLAS_STATUS_INVALID_VALUE, as cuBLAS checks.
        // SAFETY: rejected before any access.
        let err = unsafe { blas.gemv(GemvConfig { lda: m as i32 - 1, ..cfg }, &da, &dxv, &mut dyv) }
            .expect_err("lda < m is rejected");
        assert_eq!(err.0, cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE);
    }
    // Device pointer mode: the scalar and the result live in device memory.
    blas.set_pointer_mode(cublasPointerMode_t::CUBLAS_POINTER_MODE_DEVICE).unwrap();
    assert_eq!(blas.get_pointer_mode().unwrap(), cublasPointerMode_t::CUBLAS_POINTER_MODE_DEVICE);
    let mut dres = s.alloc_zeros::<f64>(1).unwrap();
    {
        let (px64, _gx) = dx64.device_ptr(&s);
        let (pr, _gr) = dres.device_ptr_mut(&s);
        // SAFETY: x holds n elements; the result is one device f64.
        unsafe { ok(cb::cublasDasum_v2(h, n as i32, px64 as *const f64, 2, pr as *mut f64)) };
    }
    let got = s.clone_dtoh(&dres).unwrap()[0];
    assert!((got - asum).abs() < 1e-9, "dasum into device memory: {got} vs {asum}");
    let dalpha = s.clone_htod(&[3.0f32]).unwrap();
    let dbeta = s.clone_htod(&[0.0f32]).unwrap();
    let (gm, gn, gk) = (5usize, 4usize, 3usize);
    let ga = common::data(gm * gk, 16, 2.0);
    let gb = common::data(gk * gn, 17, 2.0);
    let (dga, dgb) = (s.clone_htod(&ga).unwrap(), s.clone_htod(&gb).unwrap());
    let mut dgc = s.alloc_zeros::<f32>(gm * gn).unwrap();
    {
        let (pal, _g1) = dalpha.device_ptr(&s);
        let (pbe, _g2) = dbeta.device_ptr(&s);
        let (pa, _g3) = dga.device_ptr(&s);
        let (pb, _g4) = dgb.device_ptr(&s);
        let (pc, _g5) = dgc.device_ptr_mut(&s);
        let (mi, ni, ki) = (gm as i32, gn as i32, gk as i32);
        let nop = cublasOperation_t::CUBLAS_OP_N;
        // SAFETY: the matrices are as described; alpha and beta are device f32s.
        unsafe {
            ok(cb::cublasSgemm_v2(
                h,
                nop,
                nop,
                mi,
                ni,
                ki,
                pal as *const f32,
                pa as *const f32,
                mi,
                pb as *const f32,
                ki,
                pbe as *const f32,
                pc as *mut f32,
                mi,
            ))
        };
    }
    let got = s.clone_dtoh(&dgc).unwrap();
    let want = naive(false, false, gm, gn, gk, &ga, gm, &gb, gk);
    for i in 0..gm * gn {
        assert!((f64::from(got[i]) - 3.0 * want[i]).abs() < 1e-4, "sgemm, device alpha = 3, element {i}");
    }
    // A host address in device mode is not a device allocation: an error, not a crash.
    let host_result = 0f64;
    let (px64, _gx) = dx64.device_ptr(&s);
    // SAFETY: the emulator checks the (bogus) device address before writing.
    let rc = unsafe { cb::cublasDasum_v2(h, n as i32, px64 as *const f64, 1, &host_result as *const f64 as *mut f64) };
    assert_eq!(rc, cublasStatus_t::CUBLAS_STATUS_EXECUTION_FAILED);
    assert!(common::last_error().contains("pointer mode is DEVICE"), "{}", common::last_error());
}

/// Limits and the cache configuration read back what was set.
#[test]
fn limits_and_cache_config_read_back_what_was_set() {
    if !common::emulator_or_skip("limits_and_cache_config_read_back_what_was_set") {
        return;
    }
    use cudarc::driver::sys::{self as ds, CUfunc_cache, CUlimit, CUresult};
    let ctx = CudaContext::new(0).unwrap();
    ctx.bind_to_thread().unwrap();
    let get = |l: CUlimit| {
        let mut v = 0usize;
        // SAFETY: an out-pointer.
        assert_eq!(unsafe { ds::cuCtxGetLimit(&mut v, l) }, CUresult::CUDA_SUCCESS);
        v
    };
    for (l, v) in [(CUlimit::CU_LIMIT_STACK_SIZE, 4096usize), (CUlimit::CU_LIMIT_PRINTF_FIFO_SIZE, 3 << 20)] {
        assert_ne!(get(l), v, "{l:?} already {v}");
        // SAFETY: plain values.
        assert_eq!(unsafe { ds::cuCtxSetLimit(l, v) }, CUresult::CUDA_SUCCESS);
        assert_eq!(get(l), v, "{l:?}");
    }
    // SAFETY: as above.
    unsafe {
        assert_eq!(ds::cuCtxSetCacheConfig(CUfunc_cache::CU_FUNC_CACHE_PREFER_L1), CUresult::CUDA_SUCCESS);
        let mut c = CUfunc_cache::CU_FUNC_CACHE_PREFER_NONE;
        assert_eq!(ds::cuCtxGetCacheConfig(&mut c), CUresult::CUDA_SUCCESS);
        assert_eq!(c, CUfunc_cache::CU_FUNC_CACHE_PREFER_L1);
        assert_eq!(ds::cuCtxSetCacheConfig(CUfunc_cache::CU_FUNC_CACHE_PREFER_NONE), CUresult::CUDA_SUCCESS);
    }
}

/// The emulator on the loader's path as `libcuda.so.1`, the name NVRTC
/// opens by itself: NVRTC asks it for `cuGetExportTable`, and compiling
/// must work (it crashed inside libnvrtc while the symbol was missing).
/// Runs in a child process, whose loader path can be set.
#[test]
fn found_as_libcuda_so_1_with_nvrtc_in_the_process() {
    const CHILD: &str = "TAPIR_EMU_TEST_AS_LIBCUDA_SO_1";
    if std::env::var_os(CHILD).is_some() {
        let ptx = compile_kernel("elementwise.cu", DEFAULT_ARCH).expect("NVRTC compiles with the emulator loaded");
        assert!(ptx.contains(".entry"));
        // SAFETY: opening by name returns the object NVRTC loaded (or loads the emulator from the path set).
        let lib = unsafe { libloading::Library::new("libcuda.so.1") }.unwrap();
        // SAFETY: only looks the symbol up.
        assert!(
            unsafe { lib.get::<unsafe extern "C" fn() -> u64>(b"tapirEmuInstructions\0") }.is_ok(),
            "libcuda.so.1 in this process is not the emulator"
        );
        println!("child: NVRTC compiled {} bytes of PTX beside the emulator as libcuda.so.1", ptx.len());
        return;
    }
    if !common::emulator_or_skip("found_as_libcuda_so_1_with_nvrtc_in_the_process")
        || !common::nvrtc_or_skip("found_as_libcuda_so_1_with_nvrtc_in_the_process")
    {
        return;
    }
    let emu = tapir_tensor::cuda::driver_library().unwrap();
    let dir = std::env::temp_dir().join(format!("tapir-emu-libcuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("libcuda.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&emu, &link).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "found_as_libcuda_so_1_with_nvrtc_in_the_process", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env_remove("TAPIR_CUDA")
        .env("LD_LIBRARY_PATH", &dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the child failed ({:?}):\n{text}", out.status);
    assert!(text.contains("child: NVRTC compiled"), "{text}");
}
