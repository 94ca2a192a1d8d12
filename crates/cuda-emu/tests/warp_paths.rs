//! The interpreter's warp-wide shortcuts give what lane-by-lane execution
//! gives: a block starts with the zeroed registers it would have had on
//! its own (only those a lane may read before writing are reset between
//! blocks), and a warp's loads and stores checked once for the span of
//! its lanes still fault on the lane, address and allocation the per-lane
//! check names. Hand-written PTX; no GPU, driver or NVRTC needed.

use tapir_cuda_emu::exec::{self, Fault, Launch};
use tapir_cuda_emu::memory::Memory;
use tapir_cuda_emu::ptx;

const HEAD: &str = ".version 8.8\n.target sm_90\n.address_size 64\n";

/// Runs kernel `t(.param .u64 a, .param .u64 b)` over `grid` blocks of
/// `threads` on `workers` host threads, with `a` and `b` two buffers of
/// `words` u64 words (`a` zeroed, `b` counting 0, 1, 2, ...). Returns `a`.
fn launch(body: &str, grid: u32, threads: u32, words: usize, workers: usize) -> Result<Vec<u64>, Fault> {
    let src = format!(
        "{HEAD}.visible .entry t(.param .u64 a, .param .u64 b)\n{{\n.reg .pred %p<8>;\n.reg .b32 %r<16>;\n\
         .reg .b64 %rd<16>;\nld.param.u64 %rd0, [a];\nld.param.u64 %rd1, [b];\n{body}\nret;\n}}\n"
    );
    let mem = Memory::new(1 << 20);
    let module = ptx::load(&src, &|g| g.iter().map(|_| mem.alloc(4096).unwrap()).collect())
        .unwrap_or_else(|e| panic!("the test PTX parses: {e}\n{src}"));
    let bytes = words as u64 * 8;
    let (a, b) = (mem.alloc(bytes).unwrap(), mem.alloc(bytes).unwrap());
    // Written through the host, so initcheck (when on) sees both written.
    let (pa, pb) = (mem.host_ptr(a, bytes).unwrap(), mem.host_ptr(b, bytes).unwrap());
    for k in 0..words {
        // SAFETY: the buffers hold `words` words.
        unsafe {
            pa.cast::<u64>().add(k).write(0);
            pb.cast::<u64>().add(k).write(k as u64);
        }
    }
    let mut params = a.to_le_bytes().to_vec();
    params.extend_from_slice(&b.to_le_bytes());
    let l = Launch {
        module: &module,
        func: 0,
        grid: [grid, 1, 1],
        block: [threads, 1, 1],
        dyn_shared: 0,
        params: &params,
        mem: &mem.snapshot(),
        racecheck: true,
        workers,
    };
    exec::run(&l)?;
    let pa = mem.host_ptr(a, bytes).unwrap();
    // SAFETY: as above.
    Ok((0..words).map(|k| unsafe { pa.cast::<u64>().add(k).read() }).collect())
}

/// Block 0 writes `%r2` under a guard and every block stores it: the
/// later blocks, which never write it, must read the zero a fresh block
/// starts with, not what block 0 left in the worker's register file.
#[test]
fn a_register_written_only_by_an_earlier_block_reads_zero() {
    let body = "mov.u32 %r1, %ctaid.x;\nsetp.eq.u32 %p1, %r1, 0;\n@%p1 mov.u32 %r2, 7;\n\
                @%p1 bra $L_skip;\nadd.u32 %r3, %r3, 1;\n$L_skip:\n\
                mul.wide.u32 %rd2, %r1, 16;\nadd.s64 %rd3, %rd0, %rd2;\n\
                st.global.u32 [%rd3], %r2;\nst.global.u32 [%rd3+8], %r3;";
    for workers in [1, 2] {
        let a = launch(body, 4, 1, 8, workers).unwrap_or_else(|f| panic!("{}", f.message));
        assert_eq!(a, [7, 0, 0, 1, 0, 1, 0, 1], "{workers} workers: r2 then r3 of each block");
    }
}

/// A warp whose lanes load from two allocations (lanes 0-15 from `b`,
/// 16-31 from `a`) is no single region: the per-lane path serves it.
#[test]
fn a_warp_load_spanning_two_allocations_reads_each_lanes_own() {
    let body = "mov.u32 %r1, %tid.x;\nmul.wide.u32 %rd2, %r1, 8;\nsetp.lt.u32 %p1, %r1, 16;\n\
                selp.b64 %rd3, %rd1, %rd0, %p1;\nadd.s64 %rd4, %rd3, %rd2;\nld.global.u64 %rd5, [%rd4];\n\
                add.s64 %rd6, %rd0, %rd2;\nst.global.u64 [%rd6+256], %rd5;";
    let a = launch(body, 1, 32, 64, 1).unwrap_or_else(|f| panic!("{}", f.message));
    let want: Vec<u64> = (0..32).map(|k| if k < 16 { k } else { 0 }).collect();
    assert_eq!(a[32..], want[..]);
}

/// Lanes 0-30 load inside `b`, lane 31 one word past its end: the fault
/// names lane 31 and the allocation it runs past, as lane-by-lane
/// checking does.
#[test]
fn a_warp_load_with_one_lane_past_the_end_names_that_lane() {
    let body = "mov.u32 %r1, %tid.x;\nmul.wide.u32 %rd2, %r1, 8;\nadd.s64 %rd3, %rd1, %rd2;\n\
                ld.global.u64 %rd4, [%rd3+8];\nadd.s64 %rd5, %rd0, %rd2;\nst.global.u64 [%rd5], %rd4;";
    let f = launch(body, 1, 32, 32, 1).expect_err("lane 31 reads past the end");
    assert_eq!(f.code, exec::ILLEGAL_ADDRESS);
    assert!(f.message.contains("thread (31, 0, 0)"), "{}", f.message);
    assert!(f.message.contains("past the end of a 256-byte allocation"), "{}", f.message);
}
