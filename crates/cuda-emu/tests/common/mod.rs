//! Helpers shared by the emulator's tests.

#![allow(dead_code)]

use tapir_tensor::cuda::nvrtc_library;

/// Whether NVRTC can be used; panics when it cannot but is required.
pub fn nvrtc_or_skip(test: &str) -> bool {
    match nvrtc_library() {
        Ok(_) => true,
        Err(e) => {
            assert!(std::env::var("TAPIR_REQUIRE_NVRTC").as_deref() != Ok("1"), "TAPIR_REQUIRE_NVRTC=1 but {e}");
            println!("{test}: skipped, NVRTC not found (set TAPIR_REQUIRE_NVRTC=1 to make this a failure)");
            false
        }
    }
}

/// Selects the emulated device for this test process and loads it through
/// tapir-tensor's switch; false (after saying so) when it cannot be
/// loaded, a failure under TAPIR_REQUIRE_CUDA=1.
pub fn emulator_or_skip(test: &str) -> bool {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        // Every test of this binary comes through here before touching the
        // environment or cudarc, so no other thread reads it meanwhile.
        std::env::set_var("TAPIR_CUDA", "emulated");
        if std::env::var_os("TAPIR_CUDA_EMU_MEMORY").is_none() {
            std::env::set_var("TAPIR_CUDA_EMU_MEMORY", "1G");
        }
        // The emulator's own tests run with initcheck on (its test reads
        // unwritten memory on purpose; the others show it has no false alarms).
        if std::env::var_os("TAPIR_CUDA_EMU_INITCHECK").is_none() {
            std::env::set_var("TAPIR_CUDA_EMU_INITCHECK", "1");
        }
    });
    match tapir_tensor::cuda::driver_library() {
        Ok(lib) if lib.contains("libtapir_cuda_emu") => true,
        Ok(lib) => panic!("TAPIR_CUDA=emulated but the driver in use is {lib}"),
        Err(e) => {
            assert!(std::env::var("TAPIR_REQUIRE_CUDA").as_deref() != Ok("1"), "TAPIR_REQUIRE_CUDA=1 but {e}");
            println!("{test}: skipped, {e} (set TAPIR_REQUIRE_CUDA=1 to make this a failure)");
            false
        }
    }
}

/// Whether the cuBLAS stand-in is loaded (it is built by
/// `cargo build -p tapir-cuda-emu-cublas`, or any workspace build).
pub fn cublas_or_skip(test: &str) -> bool {
    // SAFETY: opening by name only finds the object the switch loaded, or a system cuBLAS.
    let ours = unsafe { libloading::Library::new("libcublas.so") }
        .is_ok_and(|l| unsafe { l.get::<unsafe extern "C" fn()>(b"cublasCreate_v2\0") }.is_ok());
    if !ours {
        let why = "the cuBLAS stand-in libtapir_cuda_emu_cublas.so was not found beside the test binary \
                   (build it with `cargo build -p tapir-cuda-emu-cublas`)";
        assert!(std::env::var("TAPIR_REQUIRE_CUDA").as_deref() != Ok("1"), "TAPIR_REQUIRE_CUDA=1 but {why}");
        println!("{test}: skipped, {why}");
    }
    ours
}

/// The emulator's last failure message on this thread.
pub fn last_error() -> String {
    // SAFETY: the emulator is loaded (the caller checked); the symbol has this signature.
    unsafe {
        let lib = libloading::Library::new("libcuda.so").expect("the emulator is loaded");
        let f = lib
            .get::<unsafe extern "C" fn(*mut std::ffi::c_char, usize) -> usize>(b"tapirEmuLastError\0")
            .expect("the emulator exports tapirEmuLastError");
        let mut buf = vec![0u8; 4096];
        let n = f(buf.as_mut_ptr().cast(), buf.len());
        buf.truncate(n.min(buf.len() - 1));
        String::from_utf8_lossy(&buf).into_owned()
    }
}

/// A deterministic sequence in [-range, range), three decimals.
pub fn data(n: usize, seed: u32, range: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    let steps = (2000.0 * range) as u32;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % steps) as f32 / 1000.0 - range
        })
        .collect()
}

/// Tests of one binary share the emulated device, whose context a kernel
/// fault leaves failing every call (the sticky error) until it is reset:
/// a test that faults takes the device alone ([`faulting`]), every other
/// test of a binary with such a test takes it shared.
static DEVICE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Shares the device with the other tests that do not fault.
pub fn shared_device() -> std::sync::RwLockReadGuard<'static, ()> {
    DEVICE.read().unwrap_or_else(|p| p.into_inner())
}

/// The device alone, for a test whose verdict depends on what the host has
/// seen complete (the stream-order hazard checks): another test's
/// `cuCtxSynchronize` orders every stream's work before the host's next
/// call, as it does on hardware, and would hide the hazard being tested.
#[allow(dead_code)]
pub fn alone() -> std::sync::RwLockWriteGuard<'static, ()> {
    DEVICE.write().unwrap_or_else(|p| p.into_inner())
}

/// The device alone, for a test whose kernel faults; dropping it resets
/// every device's primary context, which clears the sticky error.
pub struct Faulting(#[allow(dead_code)] std::sync::RwLockWriteGuard<'static, ()>);

pub fn faulting() -> Faulting {
    Faulting(DEVICE.write().unwrap_or_else(|p| p.into_inner()))
}

impl Drop for Faulting {
    fn drop(&mut self) {
        if tapir_tensor::cuda::driver_library().is_err() {
            return;
        }
        let mut n = 0;
        // SAFETY: plain driver calls; the emulator is loaded (the test got this far).
        unsafe {
            if cudarc::driver::sys::cuDeviceGetCount(&mut n) == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
                for d in 0..n {
                    cudarc::driver::sys::cuDevicePrimaryCtxReset_v2(d);
                }
            }
        }
    }
}
