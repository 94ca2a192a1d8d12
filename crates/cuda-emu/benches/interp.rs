//! The interpreter's speed: thread-instructions a second on one core, for
//! a cross-entropy forward and backward over [256, 4096] f32 logits and a
//! contiguous elementwise product of 1 Mi elements.
//!
//! `cargo bench -p tapir-cuda-emu --bench interp` (needs NVRTC, found as
//! tapir-tensor finds it: TAPIR_NVRTC_LIB or the pip package). With
//! `TAPIR_CUDA_EMU_INITCHECK=1` the buffers carry initcheck's shadow, which
//! measures its cost. `TAPIR_CUDA_EMU_BENCH_RUNS=N` runs each launch N times
//! (default 5) and reports the median; `TAPIR_CUDA_EMU_BENCH_PTX=dir` keeps
//! the PTX in `dir` for later runs (see `ptx_of`).

use std::time::Instant;

use tapir_cuda_emu::exec::{self, Launch};
use tapir_cuda_emu::memory::Memory;
use tapir_cuda_emu::ptx::{self, Module};
use tapir_tensor::cuda::{compile_kernel, DEFAULT_ARCH};

/// Lays `args` (each little-endian bytes) out as the entry's parameters.
fn params(m: &Module, func: usize, args: &[Vec<u8>]) -> Vec<u8> {
    let f = &m.funcs[func];
    let mut out = vec![0u8; f.param_size as usize];
    for (p, a) in f.params.iter().zip(args) {
        out[p.offset as usize..p.offset as usize + a.len()].copy_from_slice(a);
    }
    out
}

fn entry(m: &Module, name: &str) -> usize {
    m.funcs.iter().position(|f| f.entry && f.name == name).expect("the kernel exists")
}

fn upload(mem: &Memory, bytes: &[u8]) -> u64 {
    let a = mem.alloc(bytes.len() as u64).expect("memory");
    let p = mem.host_ptr(a, bytes.len() as u64).expect("just allocated");
    // SAFETY: the allocation holds `bytes.len()` bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
    a
}

fn b<T: Copy>(v: T) -> Vec<u8> {
    // SAFETY: plain-old-data scalars.
    unsafe { std::slice::from_raw_parts((&v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }.to_vec()
}

/// Runs the launch `TAPIR_CUDA_EMU_BENCH_RUNS` times (default 5) and
/// prints the median speed with the range, since one run of a few hundred
/// milliseconds on a shared machine is noisy.
fn time(name: &str, l: &Launch) {
    let runs: usize = std::env::var("TAPIR_CUDA_EMU_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let mut secs = Vec::new();
    let mut stats = None;
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        stats = Some(exec::run(l).expect("the launch succeeds"));
        secs.push(t.elapsed().as_secs_f64());
    }
    secs.sort_by(f64::total_cmp);
    let stats = stats.expect("one run at least");
    let c = stats.counters;
    let speed = |s: f64| stats.instructions as f64 / s / 1e6;
    println!(
        "{name}: {:.3} s, {} thread-instructions ({} warp-instructions, {:.1} active lanes), {:.1} M thread-instructions/s \
         (median of {}, {:.1} to {:.1})",
        secs[secs.len() / 2],
        stats.instructions,
        c.warp_instructions,
        c.thread_instructions as f64 / c.warp_instructions.max(1) as f64,
        speed(secs[secs.len() / 2]),
        secs.len(),
        speed(secs[secs.len() - 1]),
        speed(secs[0])
    );
}

/// The PTX of kernel file `name`: NVRTC's, or with
/// `TAPIR_CUDA_EMU_BENCH_PTX=dir` the copy kept in `dir` (written there by
/// the first run), so that `valgrind --tool=callgrind` counts the
/// interpreter without NVRTC's compile.
fn ptx_of(name: &str) -> Result<String, String> {
    let kept = std::env::var_os("TAPIR_CUDA_EMU_BENCH_PTX").map(|d| std::path::Path::new(&d).join(name));
    if let Some(text) = kept.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
        return Ok(text);
    }
    let ptx = compile_kernel(name, DEFAULT_ARCH).map_err(|e| e.to_string())?;
    if let Some(p) = kept {
        std::fs::write(&p, &ptx).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(ptx)
}

fn main() {
    let (ce, ew) = match (ptx_of("cross_entropy.cu"), ptx_of("elementwise.cu")) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            println!("interp bench skipped: {e}");
            return;
        }
    };
    let mem = Memory::new(1 << 30);
    let t = Instant::now();
    let ce = ptx::load(&ce, &|g| g.iter().map(|_| mem.alloc(4096).unwrap()).collect()).unwrap();
    let ew = ptx::load(&ew, &|g| g.iter().map(|_| mem.alloc(4096).unwrap()).collect()).unwrap();
    println!("parse + decode of cross_entropy.cu and elementwise.cu: {:.3} s", t.elapsed().as_secs_f64());

    let (rows, v) = (256usize, 4096usize);
    let x: Vec<f32> = (0..rows * v).map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0).collect();
    let labels: Vec<i64> = (0..rows).map(|r| ((r * 31) % v) as i64).collect();
    let xb: Vec<u8> = x.iter().flat_map(|f| f.to_le_bytes()).collect();
    let lb: Vec<u8> = labels.iter().flat_map(|l| l.to_le_bytes()).collect();
    let (dx, dl) = (upload(&mem, &xb), upload(&mem, &lb));
    let (lse, loss) = (mem.alloc(rows as u64 * 4).unwrap(), mem.alloc(rows as u64 * 4).unwrap());
    let bad = upload(&mem, &u64::MAX.to_le_bytes());
    // Zeroed through the host, so initcheck sees it written, as a memset would.
    let valid = upload(&mem, &[0u8; 8]);
    let g = upload(&mem, &1f32.to_le_bytes());
    let fwd = entry(&ce, "ce_fwd_f32_i64");
    let pf = params(
        &ce,
        fwd,
        &[b(rows as i64), b(v as i64), b(dx), b(0u64), b(dl), b(-100i64), b(0f64), b(lse), b(loss), b(bad), b(valid)],
    );
    let bwd = entry(&ce, "ce_bwd_f32_i64");
    let pb = params(
        &ce,
        bwd,
        &[
            b(rows as i64),
            b(v as i64),
            b(dx),
            b(0u64),
            b(lse),
            b(dl),
            b(-100i64),
            b(0f64),
            b(g),
            b(0i64),
            b(1.0 / rows as f64),
        ],
    );
    let snap = mem.snapshot();
    let launch = |m: &'static str, module: &Module, func: usize, grid: u32, block: u32, p: &[u8]| {
        let l = Launch {
            module,
            func,
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            dyn_shared: 0,
            params: p,
            mem: &snap,
            racecheck: true,
            workers: 1,
        };
        time(m, &l);
    };
    let t = Instant::now();
    launch("ce_fwd_f32_i64 [256, 4096]", &ce, fwd, rows as u32, 256, &pf);
    launch("ce_bwd_f32_i64 [256, 4096]", &ce, bwd, rows as u32, 256, &pb);
    println!("cross-entropy forward + backward: {:.3} s", t.elapsed().as_secs_f64());

    let n = 1usize << 20;
    let zeros = vec![0u8; n * 4];
    let (a, c) = (upload(&mem, &zeros), upload(&mem, &zeros));
    let out = mem.alloc(n as u64 * 4).unwrap();
    let snap2 = mem.snapshot();
    let mul = entry(&ew, "mul_f32");
    let pm = params(&ew, mul, &[b(n as i64), b(1i32), b(0u64), b(a), b(0i64), b(c), b(0i64), b(out)]);
    let l = Launch {
        module: &ew,
        func: mul,
        grid: [1024, 1, 1],
        block: [256, 1, 1],
        dyn_shared: 0,
        params: &pm,
        mem: &snap2,
        racecheck: true,
        workers: 1,
    };
    time("mul_f32 contiguous, 1 Mi elements", &l);
}
