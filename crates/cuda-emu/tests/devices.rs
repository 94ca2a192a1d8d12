//! Several emulated devices (`TAPIR_CUDA_EMU_DEVICES=2`): each with its own
//! memory and contexts, copies between them, and peer access for kernels.

mod common;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, DevicePtr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

/// Asks for two devices before the emulator is first loaded in this process.
fn two_devices_or_skip(test: &str) -> bool {
    static INIT: std::sync::Once = std::sync::Once::new();
    // Every test of this binary comes through here first, so no other
    // thread reads the environment meanwhile.
    INIT.call_once(|| std::env::set_var("TAPIR_CUDA_EMU_DEVICES", "2"));
    common::emulator_or_skip(test)
}

/// `dst[i] = src[i]` for the block's threads, written by hand so the test
/// needs no NVRTC.
const COPY_PTX: &str = r#"
.version 8.8
.target sm_90
.address_size 64
.visible .entry copy(.param .u64 dst, .param .u64 src)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [dst];
    ld.param.u64 %rd2, [src];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.u32 %r2, [%rd4];
    add.s64 %rd5, %rd1, %rd3;
    st.global.u32 [%rd5], %r2;
    ret;
}
"#;

#[test]
fn two_devices_copying_peer_to_peer() {
    if !two_devices_or_skip("two_devices_copying_peer_to_peer") {
        return;
    }
    assert_eq!(CudaContext::device_count().unwrap(), 2);
    let (c0, c1) = (CudaContext::new(0).unwrap(), CudaContext::new(1).unwrap());
    assert_ne!(c0.cu_ctx(), c1.cu_ctx(), "one context a device");
    let (s0, s1) = (c0.default_stream(), c1.default_stream());

    // Each device has its own memory: an allocation on device 1 leaves
    // device 0's free bytes as they were.
    c0.bind_to_thread().unwrap();
    let (free0, _) = cudarc::driver::result::mem_get_info().unwrap();
    let big = s1.alloc_zeros::<u8>(1 << 20).unwrap();
    c0.bind_to_thread().unwrap();
    assert_eq!(cudarc::driver::result::mem_get_info().unwrap().0, free0);
    c1.bind_to_thread().unwrap();
    assert!(cudarc::driver::result::mem_get_info().unwrap().0 <= free0 - (1 << 20));
    drop(big);

    // A copy from device 0 to device 1 (cudarc uses cuMemcpyPeerAsync
    // between contexts), and back.
    let host: Vec<u32> = (0..256).map(|i| i * 7 + 1).collect();
    let a = s0.clone_htod(&host).unwrap();
    // Device 1's stream is not ordered after device 0's: wait for the copy in.
    s0.synchronize().unwrap();
    // cudarc submits the peer copy to the null stream while the source's
    // context is current (after recording the source's event), which is
    // that context's legacy stream, not ordered with the destination's:
    // the stream-order check reports reading the copy's result without a
    // synchronize of the source context first.
    let b = s1.clone_dtod(&a).unwrap();
    c0.synchronize().unwrap();
    assert_eq!(s1.clone_dtoh(&b).unwrap(), host);
    let back = s0.clone_dtod(&b).unwrap();
    c1.synchronize().unwrap();
    assert_eq!(s0.clone_dtoh(&back).unwrap(), host);
    let pa = a.device_ptr(&s0).0;
    let pb = b.device_ptr(&s1).0;
    assert_ne!(pa >> 40, pb >> 40, "the devices' addresses are in ranges of their own: {pa:#x} {pb:#x}");

    // A peer copy names the contexts the addresses belong to.
    // SAFETY: the emulator checks the addresses against the contexts before copying.
    let rc = unsafe { sys::cuMemcpyPeer(pb, c0.cu_ctx(), pa, c0.cu_ctx(), 4) };
    assert_eq!(rc, CUresult::CUDA_ERROR_INVALID_VALUE);
    assert!(common::last_error().contains("is not memory of device 0"), "{}", common::last_error());

    let mut can = -1;
    // SAFETY: out-pointers.
    unsafe {
        assert_eq!(sys::cuDeviceCanAccessPeer(&mut can, 0, 1), CUresult::CUDA_SUCCESS);
        assert_eq!(can, 1);
        assert_eq!(sys::cuDeviceCanAccessPeer(&mut can, 1, 1), CUresult::CUDA_SUCCESS);
        assert_eq!(can, 0);
    }

    // A kernel on device 1 reading device 0's memory: an illegal address
    // until device 1's context enables peer access to device 0.
    let m1 = c1.load_module(Ptx::from_src(COPY_PTX)).unwrap();
    let f = m1.load_function("copy").unwrap();
    let out = s1.alloc_zeros::<u32>(256).unwrap();
    let pout = out.device_ptr(&s1).0;
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let launch = || {
        let mut l = s1.launch_builder(&f);
        l.arg(&pout).arg(&pa);
        // SAFETY: the kernel takes two device addresses.
        unsafe { l.launch(cfg) }
    };
    // The fault is reported at the next synchronize (or by the launch, in
    // the synchronous mode), and sticks to device 1's context until reset.
    let fault = || launch().and_then(|_| s1.synchronize());
    let err = fault().expect_err("device 0's memory is not reachable from device 1 without peer access");
    assert_eq!(err.0, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, "{err:?}");
    // SAFETY: a plain driver call.
    assert_eq!(unsafe { sys::cuDevicePrimaryCtxReset_v2(1) }, CUresult::CUDA_SUCCESS);
    c1.bind_to_thread().unwrap();
    // SAFETY: a context handle of this process.
    unsafe {
        assert_eq!(sys::cuCtxEnablePeerAccess(c0.cu_ctx(), 0), CUresult::CUDA_SUCCESS);
        assert_eq!(sys::cuCtxEnablePeerAccess(c0.cu_ctx(), 0), CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    }
    launch().unwrap();
    assert_eq!(s1.clone_dtoh(&out).unwrap(), host);
    c1.bind_to_thread().unwrap();
    // SAFETY: as above.
    unsafe {
        assert_eq!(sys::cuCtxDisablePeerAccess(c0.cu_ctx()), CUresult::CUDA_SUCCESS);
        assert_eq!(sys::cuCtxDisablePeerAccess(c0.cu_ctx()), CUresult::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    }
    assert_eq!(fault().expect_err("peer access is off again").0, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    // SAFETY: as above.
    assert_eq!(unsafe { sys::cuDevicePrimaryCtxReset_v2(1) }, CUresult::CUDA_SUCCESS);
}
