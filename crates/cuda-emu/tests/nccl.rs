//! The NCCL stand-in (`nccl/`) through cudarc's own `nccl` bindings, on two
//! emulated devices: every rank at once from one thread in a group
//! (`ncclCommInitAll`, as cudarc's `single_thread` test does), ranks on
//! threads joining by a unique id (`multi_thread`), and the failures:
//! ranks that disagree, and a rank that never comes. A failing collective
//! is its devices' sticky error, so those tests hold the devices alone
//! and reset them after.

mod common;

use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, DevicePtr};
use cudarc::nccl::{result, sys as nccl};

static LOCK: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Two emulated devices and the NCCL stand-in, or false after saying why.
fn nccl_or_skip(test: &str) -> bool {
    static INIT: std::sync::Once = std::sync::Once::new();
    // Every test of this binary comes through here first, so no other
    // thread reads the environment meanwhile. A short wait for missing
    // ranks, so the test of one stays short.
    INIT.call_once(|| {
        std::env::set_var("TAPIR_CUDA_EMU_DEVICES", "2");
        std::env::set_var("TAPIR_CUDA_EMU_NCCL_TIMEOUT", "3");
    });
    if !common::emulator_or_skip(test) {
        return false;
    }
    match tapir_tensor::cuda::nccl::nccl_library() {
        Ok(lib) => {
            assert!(lib.contains("libtapir_cuda_emu_nccl"), "{lib}");
            true
        }
        Err(e) => {
            assert!(std::env::var("TAPIR_REQUIRE_CUDA").as_deref() != Ok("1"), "TAPIR_REQUIRE_CUDA=1 but {e}");
            println!("{test}: skipped, {e}");
            false
        }
    }
}

#[test]
fn every_rank_from_one_thread_in_a_group() {
    let _s = serial();
    if !nccl_or_skip("every_rank_from_one_thread_in_a_group") {
        return;
    }
    assert_eq!(result::get_nccl_version().unwrap(), 23000);
    let n = 5;
    let streams: Vec<_> = (0..2).map(|i| CudaContext::new(i).unwrap().default_stream()).collect();
    let sends: Vec<_> =
        streams.iter().enumerate().map(|(i, s)| s.clone_htod(&vec![(i + 1) as f32; n]).unwrap()).collect();
    let recvs: Vec<_> = streams.iter().map(|s| s.alloc_zeros::<f32>(n).unwrap()).collect();
    let mut comms = vec![std::ptr::null_mut(); 2];
    // SAFETY: room for two handles; the devices exist.
    unsafe { result::comm_init_all(comms.as_mut_ptr(), 2, [0, 1].as_ptr()) }.unwrap();
    for (i, &c) in comms.iter().enumerate() {
        // SAFETY: live handles.
        unsafe {
            assert_eq!(result::comm_count(c).unwrap(), 2);
            assert_eq!(result::comm_cu_device(c).unwrap(), i as i32);
            assert_eq!(result::comm_user_rank(c).unwrap(), i as i32);
        }
    }
    result::group_start().unwrap();
    for i in 0..2 {
        let (s, _) = sends[i].device_ptr(&streams[i]);
        let (r, _) = recvs[i].device_ptr(&streams[i]);
        // SAFETY: `n` floats each, on device i, its default stream.
        unsafe {
            result::all_reduce(
                s as *const c_void,
                r as *mut c_void,
                n,
                nccl::ncclDataType_t::ncclFloat32,
                nccl::ncclRedOp_t::ncclSum,
                comms[i],
                streams[i].cu_stream() as nccl::cudaStream_t,
            )
        }
        .unwrap();
    }
    result::group_end().unwrap();
    for i in 0..2 {
        assert_eq!(streams[i].clone_dtoh(&recvs[i]).unwrap(), vec![3.0; n]);
    }
    for c in comms {
        // SAFETY: made above, destroyed once, nothing queued.
        unsafe { result::comm_destroy(c) }.unwrap();
    }
}

#[test]
fn ranks_on_threads_join_by_a_unique_id() {
    let _s = serial();
    if !nccl_or_skip("ranks_on_threads_join_by_a_unique_id") {
        return;
    }
    let id = result::get_uniqueid().unwrap();
    let n = 3;
    let gathered: Vec<Vec<i64>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                sc.spawn(move || {
                    let stream = CudaContext::new(rank).unwrap().default_stream();
                    let send = stream.clone_htod(&vec![10 * rank as i64 + 1; n]).unwrap();
                    let recv = stream.alloc_zeros::<i64>(2 * n).unwrap();
                    let mut comm = std::mem::MaybeUninit::uninit();
                    // SAFETY: an out-pointer; the id is shared by both ranks.
                    let comm = unsafe {
                        result::comm_init_rank(comm.as_mut_ptr(), 2, id, rank as i32).unwrap();
                        comm.assume_init()
                    };
                    let (s, _) = send.device_ptr(&stream);
                    let (r, _) = recv.device_ptr(&stream);
                    // SAFETY: `n` elements sent, `2n` received, on this rank's device.
                    unsafe {
                        result::all_gather(
                            s as *const c_void,
                            r as *mut c_void,
                            n,
                            nccl::ncclDataType_t::ncclInt64,
                            comm,
                            stream.cu_stream() as nccl::cudaStream_t,
                        )
                    }
                    .unwrap();
                    let out = stream.clone_dtoh(&recv).unwrap();
                    // SAFETY: made above, destroyed once.
                    unsafe { result::comm_destroy(comm) }.unwrap();
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for g in gathered {
        assert_eq!(g, vec![1, 1, 1, 11, 11, 11]);
    }
}

/// Each device's context reset (clearing a sticky error), for the next test.
fn reset_both() {
    for d in 0..2 {
        // SAFETY: a plain driver call.
        assert_eq!(unsafe { sys::cuDevicePrimaryCtxReset_v2(d) }, CUresult::CUDA_SUCCESS);
    }
}

/// One collective of `kind` on device `rank`'s default stream (f32, 4
/// elements in and out), then a synchronize: its result.
fn collective(comm: nccl::ncclComm_t, rank: usize, kind: &str) -> Result<(), sys::CUresult> {
    let stream = CudaContext::new(rank).unwrap().default_stream();
    let buf = stream.clone_htod(&[1.0f32; 4]).unwrap();
    let (p, _) = buf.device_ptr(&stream);
    let cu = stream.cu_stream() as nccl::cudaStream_t;
    let f32t = nccl::ncclDataType_t::ncclFloat32;
    // SAFETY: four floats on this rank's device, in place.
    unsafe {
        match kind {
            "all_reduce" => {
                result::all_reduce(p as *const c_void, p as *mut c_void, 4, f32t, nccl::ncclRedOp_t::ncclSum, comm, cu)
            }
            _ => result::broadcast(p as *const c_void, p as *mut c_void, 4, f32t, 0, comm, cu),
        }
    }
    .unwrap();
    stream.synchronize().map_err(|e| e.0)
}

#[test]
fn ranks_that_disagree_fail_on_every_rank_naming_both_calls() {
    let _s = serial();
    if !nccl_or_skip("ranks_that_disagree_fail_on_every_rank_naming_both_calls") {
        return;
    }
    let mut comms = vec![std::ptr::null_mut(); 2];
    // SAFETY: room for two handles.
    unsafe { result::comm_init_all(comms.as_mut_ptr(), 2, std::ptr::null()) }.unwrap();
    let (c0, c1) = (comms[0] as usize, comms[1] as usize);
    let results: Vec<(Result<(), CUresult>, String)> = std::thread::scope(|sc| {
        let a = sc.spawn(move || (collective(c0 as _, 0, "all_reduce"), common::last_error()));
        let b = sc.spawn(move || (collective(c1 as _, 1, "broadcast"), common::last_error()));
        vec![a.join().unwrap(), b.join().unwrap()]
    });
    for (r, msg) in &results {
        assert_eq!(*r, Err(CUresult::CUDA_ERROR_LAUNCH_FAILED), "{msg}");
        assert!(
            msg.contains("ncclAllReduce of 4 F32 (Sum)") && msg.contains("ncclBroadcast of 4 F32 from root 0"),
            "{msg}"
        );
    }
    for c in comms {
        // SAFETY: made above; their work has run.
        unsafe { result::comm_destroy(c) }.unwrap();
    }
    reset_both();
}

#[test]
fn a_rank_that_never_comes_fails_the_others_after_the_timeout() {
    let _s = serial();
    if !nccl_or_skip("a_rank_that_never_comes_fails_the_others_after_the_timeout") {
        return;
    }
    let mut comms = vec![std::ptr::null_mut(); 2];
    // SAFETY: room for two handles.
    unsafe { result::comm_init_all(comms.as_mut_ptr(), 2, std::ptr::null()) }.unwrap();
    let t0 = std::time::Instant::now();
    let r = collective(comms[0], 0, "all_reduce");
    let waited = t0.elapsed();
    let msg = common::last_error();
    assert_eq!(r, Err(CUresult::CUDA_ERROR_LAUNCH_FAILED), "{msg}");
    assert!(msg.contains("for ranks [1], which never came"), "{msg}");
    assert!(waited.as_secs_f64() >= 2.9 && waited.as_secs_f64() < 30.0, "waited {waited:?}");
    // The communicator is broken from then on, for every rank.
    assert_eq!(collective(comms[1], 1, "all_reduce"), Err(CUresult::CUDA_ERROR_LAUNCH_FAILED));
    assert!(common::last_error().contains("the communicator is broken"), "{}", common::last_error());
    for c in comms {
        // SAFETY: made above; their work has run.
        unsafe { result::comm_abort(c) }.unwrap();
    }
    reset_both();
}

/// The id's 128 bytes as hex, to hand to another process.
fn id_hex(id: &nccl::ncclUniqueId) -> String {
    id.internal.iter().map(|&c| format!("{:02x}", c as u8)).collect()
}

fn id_from_hex(hex: &str) -> nccl::ncclUniqueId {
    let mut internal = [0 as std::ffi::c_char; 128];
    for (i, c) in internal.iter_mut().enumerate() {
        *c = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap() as std::ffi::c_char;
    }
    nccl::ncclUniqueId { internal }
}

/// This test binary again, as rank 1 of the id, running `role`.
fn spawn_rank1(test: &str, id: &nccl::ncclUniqueId, role: &str) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env("TAPIR_NCCL_TEST_CHILD", format!("{role}:{}", id_hex(id)))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Rank `rank` of 2 on device 0 of its own process.
fn join(id: nccl::ncclUniqueId, rank: i32) -> nccl::ncclComm_t {
    let _ctx = CudaContext::new(0).unwrap();
    let mut comm = std::mem::MaybeUninit::uninit();
    // SAFETY: an out-pointer; the id is the job's.
    unsafe {
        result::comm_init_rank(comm.as_mut_ptr(), 2, id, rank).unwrap();
        comm.assume_init()
    }
}

/// An all-reduce (sum, f64), an all-gather (i32) and a broadcast from rank
/// 1 (f16), each rank's inputs made from its rank: what this rank gets.
fn three_collectives(comm: nccl::ncclComm_t, rank: usize) -> (Vec<f64>, Vec<i32>, Vec<half::f16>) {
    let stream = CudaContext::new(0).unwrap().default_stream();
    let cu = stream.cu_stream() as nccl::cudaStream_t;
    let sum = stream.clone_htod(&[0.25 + rank as f64, -(rank as f64), 1e-3]).unwrap();
    let mine = stream.clone_htod(&[rank as i32 * 10, rank as i32 * 10 + 1]).unwrap();
    let gathered = stream.alloc_zeros::<i32>(4).unwrap();
    let bcast = stream.clone_htod(&[half::f16::from_f32(rank as f32 + 0.5); 5]).unwrap();
    let (s, _) = sum.device_ptr(&stream);
    let (m, _) = mine.device_ptr(&stream);
    let (g, _) = gathered.device_ptr(&stream);
    let (b, _) = bcast.device_ptr(&stream);
    // SAFETY: the lengths above, on this rank's device and stream.
    unsafe {
        let sum_op = nccl::ncclRedOp_t::ncclSum;
        result::all_reduce(
            s as *const c_void,
            s as *mut c_void,
            3,
            nccl::ncclDataType_t::ncclFloat64,
            sum_op,
            comm,
            cu,
        )
        .unwrap();
        result::all_gather(m as *const c_void, g as *mut c_void, 2, nccl::ncclDataType_t::ncclInt32, comm, cu).unwrap();
        result::broadcast(b as *const c_void, b as *mut c_void, 5, nccl::ncclDataType_t::ncclFloat16, 1, comm, cu)
            .unwrap();
    }
    (stream.clone_dtoh(&sum).unwrap(), stream.clone_dtoh(&gathered).unwrap(), stream.clone_dtoh(&bcast).unwrap())
}

/// Two processes, one rank each, joined by an id made in the first and
/// handed to the second (as rank 0 of an `mpirun` job sends it over MPI):
/// each gets every collective's result, computed from both processes'
/// device memory.
#[test]
fn ranks_in_two_processes_join_by_a_unique_id() {
    const TEST: &str = "ranks_in_two_processes_join_by_a_unique_id";
    if let Ok(child) = std::env::var("TAPIR_NCCL_TEST_CHILD") {
        if let Some(hex) = child.strip_prefix("collectives:") {
            if !nccl_or_skip(TEST) {
                std::process::exit(3);
            }
            let comm = join(id_from_hex(hex), 1);
            let got = three_collectives(comm, 1);
            // SAFETY: made above, its work done.
            unsafe { result::comm_destroy(comm) }.unwrap();
            println!("RANK1 {got:?}");
        }
        return;
    }
    let _s = serial();
    if !nccl_or_skip(TEST) {
        return;
    }
    let id = result::get_uniqueid().unwrap();
    let child = spawn_rank1(TEST, &id, "collectives");
    let comm = join(id, 0);
    let got = three_collectives(comm, 0);
    // SAFETY: made above, its work done.
    unsafe { result::comm_destroy(comm) }.unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "rank 1: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let want = (vec![1.5, -1.0, 2e-3], vec![0, 1, 10, 11], vec![half::f16::from_f32(1.5); 5]);
    assert_eq!(got, want);
    assert!(stdout.contains(&format!("RANK1 {want:?}")), "rank 1 got another result: {stdout}");
}

/// A rank whose process exits after joining, before a collective the other
/// waits at: the other fails within seconds (not the timeout), naming it.
#[test]
fn a_rank_whose_process_exits_fails_the_other_at_once() {
    const TEST: &str = "a_rank_whose_process_exits_fails_the_other_at_once";
    if let Ok(child) = std::env::var("TAPIR_NCCL_TEST_CHILD") {
        if let Some(hex) = child.strip_prefix("exit:") {
            if !nccl_or_skip(TEST) {
                std::process::exit(3);
            }
            let _comm = join(id_from_hex(hex), 1);
            // Gone without a word, as a killed rank is.
            std::process::exit(9);
        }
        return;
    }
    let _s = serial();
    if !nccl_or_skip(TEST) {
        return;
    }
    let id = result::get_uniqueid().unwrap();
    let mut child = spawn_rank1(TEST, &id, "exit");
    let comm = join(id, 0);
    assert_eq!(child.wait().unwrap().code(), Some(9));
    let t0 = std::time::Instant::now();
    let r = collective(comm, 0, "all_reduce");
    let msg = common::last_error();
    assert_eq!(r, Err(CUresult::CUDA_ERROR_LAUNCH_FAILED), "{msg}");
    assert!(msg.contains("rank 1 (process") && msg.contains("exited before collective 1"), "{msg}");
    // The test binary's timeout is 3 s: this came from the exit, not from it.
    assert!(t0.elapsed().as_secs_f64() < 2.0, "took {:?}", t0.elapsed());
    // SAFETY: made above.
    unsafe { result::comm_abort(comm) }.unwrap();
    reset_both();
}
