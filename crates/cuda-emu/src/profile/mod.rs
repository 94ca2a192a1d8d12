//! The emulator as a profiler: every kernel's exact counters (see
//! [`crate::exec::Counters`]), the H200 model of [`model`], occupancy from
//! the registers a cubin reports ([`cubin`]), written as JSON.
//!
//! `TAPIR_CUDA_EMU_PROFILE=<path>` turns the counters on and writes the
//! profile to `path` when the process exits. `TAPIR_CUDA_EMU_CUBINS=<dir>`
//! names a folder of cubins (`*.cubin`, NVRTC's output for sm_90) whose
//! kernels' registers the occupancy uses; without one, occupancy applies
//! the thread, block and shared-memory limits only. `tapir profile` sets
//! both and prints the table.

pub mod cubin;
pub mod model;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Mutex, Once};

use crate::exec::{kernel_counters, Class, Counters};
use model::{Gpu, H200};

/// A library call (a cuBLAS product), summed by name.
#[derive(Debug, Clone, PartialEq)]
pub struct LibCall {
    pub name: String,
    pub calls: u64,
    pub flops: f64,
    pub bytes: f64,
    pub modeled_s: f64,
}

static LIBRARY: Mutex<Vec<LibCall>> = Mutex::new(Vec::new());

/// The library calls made so far in this process, in first-call order.
pub fn library_calls() -> Vec<LibCall> {
    LIBRARY.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Records a cuBLAS product: `flops` and `bytes` (of A, B, and C read when
/// beta is not zero, and written), at the peak `peak` FLOP/s of its types.
pub fn record_library(name: String, flops: f64, bytes: f64, peak: f64) {
    let t = model::gemm_time(&H200, flops, bytes, peak);
    let mut l = LIBRARY.lock().unwrap_or_else(|p| p.into_inner());
    match l.iter_mut().find(|c| c.name == name) {
        Some(c) => {
            c.calls += 1;
            c.flops += flops;
            c.bytes += bytes;
            c.modeled_s += t;
        }
        None => l.push(LibCall { name, calls: 1, flops, bytes, modeled_s: t }),
    }
    drop(l);
    launched();
}

/// Called after each launch: the first, with `TAPIR_CUDA_EMU_PROFILE`
/// set, arranges for the profile to be written at exit.
pub(crate) fn launched() {
    static AT_EXIT: Once = Once::new();
    AT_EXIT.call_once(|| {
        if path().is_some() {
            extern "C" {
                fn atexit(cb: extern "C" fn()) -> std::ffi::c_int;
            }
            // SAFETY: registers a function that takes no arguments and
            // does not unwind (write_at_exit catches everything).
            unsafe { atexit(write_at_exit) };
        }
    });
}

fn path() -> Option<std::path::PathBuf> {
    std::env::var_os("TAPIR_CUDA_EMU_PROFILE").filter(|p| !p.is_empty()).map(Into::into)
}

extern "C" fn write_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(p) = path() {
            if let Err(e) = write(&p) {
                eprintln!("tapir-cuda-emu: could not write the profile to {}: {e}", p.display());
            }
        }
    });
}

/// Writes the profile of everything run so far to `path`.
pub fn write(path: &std::path::Path) -> std::io::Result<()> {
    std::fs::write(path, json(&H200, &cubin_attrs()))
}

/// The kernels of every cubin in `TAPIR_CUDA_EMU_CUBINS`, by name.
pub fn cubin_attrs() -> HashMap<String, cubin::KernelAttrs> {
    let mut out = HashMap::new();
    let Some(dir) = std::env::var_os("TAPIR_CUDA_EMU_CUBINS") else { return out };
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        if e.path().extension().is_some_and(|x| x == "cubin") {
            if let Some(ks) = std::fs::read(e.path()).ok().and_then(|b| cubin::kernels(&b)) {
                out.extend(ks.into_iter().map(|k| (k.name.clone(), k)));
            }
        }
    }
    out
}

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// A finite number as JSON (non-finite ones as null).
fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".into()
    }
}

/// One kernel's occupancy and modeled time.
pub fn kernel_model(gpu: &Gpu, c: &Counters, attrs: Option<&cubin::KernelAttrs>) -> (model::Occupancy, model::Modeled) {
    let blocks = c.blocks as f64 / c.launches.max(1) as f64;
    let occ = model::occupancy(gpu, c.block_threads, attrs.map(|a| a.regs), c.block_shared, blocks);
    let m = model::model(gpu, c, &occ);
    (occ, m)
}

/// The profile as JSON: the model's figures, each kernel's counters,
/// occupancy and modeled time, the library calls, and the total.
pub fn json(gpu: &Gpu, attrs: &HashMap<String, cubin::KernelAttrs>) -> String {
    let mut o = String::new();
    let g = gpu;
    let _ = write!(
        o,
        "{{\n\"gpu\": {{\"name\": {}, \"sms\": {}, \"clock_hz\": {}, \"dram_bw\": {}, \"l2_bytes\": {}, \"f32_flops\": {}, \
         \"bf16_flops\": {}, \"launch_s\": {}, \"dram_latency_s\": {}, \"requests_in_flight_warp\": {}}},\n\
         \"profiling\": {},\n\"kernels\": [",
        esc(g.name),
        g.sms,
        num(g.clock_hz),
        num(g.dram_bw),
        g.l2_bytes,
        num(g.f32_flops),
        num(g.bf16_flops),
        num(g.launch_s),
        num(g.dram_latency_s),
        num(g.requests_in_flight_warp),
        crate::exec::profiling()
    );
    let mut total = 0.0;
    for (i, (name, c)) in kernel_counters().iter().enumerate() {
        let a = attrs.get(name);
        let (occ, m) = kernel_model(gpu, c, a);
        total += m.total_s;
        let mix: Vec<String> = Class::ALL.iter().map(|k| format!("{}: {}", esc(k.name()), c.of(*k))).collect();
        let _ = write!(
            o,
            "{}\n{{\"name\": {}, \"launches\": {}, \"threads\": {}, \"blocks\": {}, \"block_threads\": {}, \
             \"block_shared\": {}, \"warp_instructions\": {}, \"thread_instructions\": {}, \"mean_active_lanes\": {}, \
             \"barriers\": {}, \"mix\": {{{}}}, \"load_requests\": {}, \"load_sectors\": {}, \"load_bytes\": {}, \
             \"store_requests\": {}, \"store_sectors\": {}, \"store_bytes\": {}, \"atomic_requests\": {}, \
             \"atomic_sectors\": {}, \"atomic_bytes\": {}, \"sectors_per_request\": {}, \"sector_efficiency\": {}, \
             \"unique_read_sectors\": {}, \"unique_write_sectors\": {}, \"block_unique_read_sectors\": {}, \
             \"block_unique_write_sectors\": {}, \"max_footprint_sectors\": {}, \
             \"shared_requests\": {}, \"shared_wavefronts\": {}, \"shared_ideal_wavefronts\": {}, \
             \"bank_conflicts\": {}, \"atomic_lanes\": {}, \"atomic_same_address\": {}, \"regs\": {}, \
             \"frame\": {}, \"occupancy\": {{\"blocks_sm\": {}, \"warps_sm\": {}, \"occupancy\": {}, \"limiter\": {}, \
             \"waves\": {}}}, \"modeled\": {{\"dram_bytes\": {}, \"dram_us\": {}, \"achievable_bw\": {}, \
             \"issue_us\": {}, \"shared_us\": {}, \"tensor_flops\": {}, \"tensor_us\": {}, \"launch_us\": {}, \
             \"total_us\": {}, \"bound\": {}, \"roofline\": {}}}}}",
            if i == 0 { "" } else { "," },
            esc(name),
            c.launches,
            c.threads,
            c.blocks,
            c.block_threads,
            c.block_shared,
            c.warp_instructions,
            c.thread_instructions,
            num(c.thread_instructions as f64 / c.warp_instructions.max(1) as f64),
            c.barriers,
            mix.join(", "),
            c.load_requests,
            c.load_sectors,
            c.load_bytes,
            c.store_requests,
            c.store_sectors,
            c.store_bytes,
            c.atomic_requests,
            c.atomic_sectors,
            c.atomic_bytes,
            num(c.sectors_per_request()),
            num(c.sector_efficiency()),
            c.unique_read_sectors,
            c.unique_write_sectors,
            c.block_unique_read_sectors,
            c.block_unique_write_sectors,
            c.max_footprint_sectors,
            c.shared_requests,
            c.shared_wavefronts,
            c.shared_ideal_wavefronts,
            c.bank_conflicts(),
            c.atomic_lanes,
            c.atomic_same_address,
            a.map_or("null".into(), |a| a.regs.to_string()),
            a.map_or("null".into(), |a| a.frame.to_string()),
            occ.blocks_sm,
            occ.warps_sm,
            num(occ.occupancy),
            esc(occ.limiter),
            num(occ.waves),
            num(m.dram_bytes),
            num(m.dram_s * 1e6),
            num(m.achievable_bw),
            num(m.issue_s * 1e6),
            num(m.shared_s * 1e6),
            num(m.tensor_flops),
            num(m.tensor_s * 1e6),
            num(m.launch_s * 1e6),
            num(m.total_s * 1e6),
            esc(m.bound),
            num(m.roofline),
        );
    }
    o.push_str("\n],\n\"library\": [");
    for (i, l) in library_calls().iter().enumerate() {
        total += l.modeled_s;
        let _ = write!(
            o,
            "{}\n{{\"name\": {}, \"calls\": {}, \"flops\": {}, \"bytes\": {}, \"modeled_us\": {}}}",
            if i == 0 { "" } else { "," },
            esc(&l.name),
            l.calls,
            num(l.flops),
            num(l.bytes),
            num(l.modeled_s * 1e6)
        );
    }
    let _ = write!(o, "\n],\n\"total_modeled_us\": {}\n}}\n", num(total * 1e6));
    o
}
