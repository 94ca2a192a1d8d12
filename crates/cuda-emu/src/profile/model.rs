//! The H200 model: one documented place for every figure and the formula
//! that turns a kernel's exact counters into a modeled time (see
//! docs/gpu-model.md for each figure's source and what the model ignores).

use crate::exec::{Class, Counters, SECTOR};

/// The device figures the model uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gpu {
    pub name: &'static str,
    pub sms: u32,
    /// Boost clock, Hz.
    pub clock_hz: f64,
    /// HBM bandwidth, bytes a second.
    pub dram_bw: f64,
    pub l2_bytes: u64,
    /// Peak FLOP/s: f32 on the CUDA cores, dense tensor-core bf16/f16,
    /// dense TF32, f64 tensor cores.
    pub f32_flops: f64,
    pub bf16_flops: f64,
    pub tf32_flops: f64,
    pub f64_flops: f64,
    /// Per-SM limits (compute capability 9.0).
    pub max_warps_sm: u32,
    pub max_blocks_sm: u32,
    pub regs_sm: u32,
    pub shared_sm: u64,
    /// Shared memory the system reserves per resident block.
    pub shared_reserved_block: u64,
    /// Warp-instructions an SM issues a cycle (one per scheduler).
    pub issue_sm: f64,
    /// Warp-instructions a cycle an SM's pipes complete, by class: the
    /// lanes a cycle of the CUDA programming guide's throughput table over 32.
    pub sfu_sm: f64,
    pub f64_sm: f64,
    /// Integer and logic instructions on the ALU pipe.
    pub int_sm: f64,
    /// Integer multiplies and multiply-adds, on the FMA pipe: a pipe of
    /// their own beside the ALU's (docs/gpu-model.md, "Figures").
    pub int_mul_sm: f64,
    /// Shared-memory wavefronts an SM serves a cycle.
    pub shared_sm_wavefronts: f64,
    /// Warps a scheduler needs to hide arithmetic latency (assumed).
    pub warps_to_hide: f64,
    /// DRAM latency under load, seconds, and global requests a warp keeps in
    /// flight: Little's law bounds the bandwidth a grid can draw (assumed).
    pub dram_latency_s: f64,
    pub requests_in_flight_warp: f64,
    /// Per-launch overhead, seconds (assumed).
    pub launch_s: f64,
    /// Fractions of peak a cuBLAS product reaches (assumed).
    pub blas_compute_fraction: f64,
    pub blas_bw_fraction: f64,
}

/// The NVIDIA H200 SXM (docs/gpu-model.md gives each figure's source).
pub const H200: Gpu = Gpu {
    name: "NVIDIA H200 SXM (model)",
    sms: 132,
    clock_hz: 1.98e9,
    dram_bw: 4.8e12,
    l2_bytes: 50 * 1000 * 1000,
    f32_flops: 67e12,
    bf16_flops: 989e12,
    tf32_flops: 494.5e12,
    f64_flops: 67e12,
    max_warps_sm: 64,
    max_blocks_sm: 32,
    regs_sm: 65536,
    shared_sm: 228 * 1024,
    shared_reserved_block: 1024,
    issue_sm: 4.0,
    sfu_sm: 16.0 / 32.0,
    f64_sm: 64.0 / 32.0,
    int_sm: 64.0 / 32.0,
    int_mul_sm: 64.0 / 32.0,
    shared_sm_wavefronts: 1.0,
    warps_to_hide: 4.0,
    dram_latency_s: 600e-9,
    requests_in_flight_warp: 2.0,
    launch_s: 2e-6,
    blas_compute_fraction: 0.7,
    blas_bw_fraction: 0.8,
};

/// Resident blocks and occupancy of a kernel on one SM.
#[derive(Debug, Clone, PartialEq)]
pub struct Occupancy {
    pub block_threads: u64,
    /// Registers a thread, when a cubin said (else the register limit is
    /// not applied).
    pub regs: Option<u32>,
    /// Shared bytes a block (static + dynamic, without the reserve).
    pub shared: u64,
    pub blocks_sm: u32,
    pub warps_sm: u32,
    /// Resident warps over the SM's maximum.
    pub occupancy: f64,
    /// What limits `blocks_sm`: "threads", "blocks", "registers", "shared".
    pub limiter: &'static str,
    /// Blocks a launch over (blocks_sm x SMs): how many waves it makes.
    pub waves: f64,
}

/// The occupancy of blocks of `block_threads` threads, `regs` registers
/// a thread and `shared` bytes a block, `blocks` blocks a launch.
pub fn occupancy(gpu: &Gpu, block_threads: u64, regs: Option<u32>, shared: u64, blocks: f64) -> Occupancy {
    let warps_block = block_threads.div_ceil(32).max(1) as u32;
    let mut lim = [
        (gpu.max_warps_sm / warps_block, "threads"),
        (gpu.max_blocks_sm, "blocks"),
        (u32::MAX, "registers"),
        (u32::MAX, "shared"),
    ];
    if let Some(r) = regs {
        // Registers are allocated per warp in units of 256.
        let per_warp = (r.max(1) * 32).div_ceil(256) * 256;
        lim[2].0 = (gpu.regs_sm / per_warp) / warps_block;
    }
    if shared > 0 {
        lim[3].0 = (gpu.shared_sm / (shared + gpu.shared_reserved_block)) as u32;
    }
    let (blocks_sm, limiter) = lim.iter().copied().min_by_key(|(n, _)| *n).expect("four limits");
    let warps_sm = blocks_sm * warps_block;
    Occupancy {
        block_threads,
        regs,
        shared,
        blocks_sm,
        warps_sm,
        occupancy: f64::from(warps_sm) / f64::from(gpu.max_warps_sm),
        limiter,
        waves: if blocks_sm == 0 { f64::INFINITY } else { blocks / (f64::from(blocks_sm) * f64::from(gpu.sms)) },
    }
}

/// A kernel's modeled time and its terms, all summed over its launches.
#[derive(Debug, Clone, PartialEq)]
pub struct Modeled {
    /// Bytes moved to and from DRAM under the L2 model.
    pub dram_bytes: f64,
    /// DRAM time at the bandwidth the grid can draw (peak, or less when
    /// too few bytes are in flight).
    pub dram_s: f64,
    /// The bandwidth that was: bytes a second.
    pub achievable_bw: f64,
    pub issue_s: f64,
    pub shared_s: f64,
    /// FLOPs on the tensor pipe (`mma.sync`), and their time at the dense
    /// bf16/f16 tensor peak over the active SMs.
    pub tensor_flops: f64,
    pub tensor_s: f64,
    pub launch_s: f64,
    /// max(dram, issue, shared, tensor) + launch.
    pub total_s: f64,
    /// Which term is the largest: "dram", "issue", "shared", "tensor".
    pub bound: &'static str,
    /// The larger of the two ceilings' times over the modeled time: the
    /// DRAM bytes at peak bandwidth, and the tensor FLOPs at the tensor
    /// peak. A kernel doing no `mma` is judged on its bytes only; one
    /// doing them on the tensor roofline when that is the higher ceiling
    /// (never on the f32 FMA peak: its FMAs are issue time).
    pub roofline: f64,
}

/// The model: DRAM time (unique sectors while a launch's footprint fits in
/// L2, each block's unique sectors otherwise, at the peak bandwidth or the
/// Little's-law bound of the bytes resident warps keep in flight), issue
/// time (warp-instructions over the SMs the grid occupies, each class at
/// its pipe's rate, derated below `warps_to_hide` warps a scheduler),
/// shared-memory time (wavefronts) and tensor time (`mma` FLOPs at the
/// dense tensor peak); the largest of the four, plus the launches'
/// overhead.
pub fn model(gpu: &Gpu, c: &Counters, occ: &Occupancy) -> Modeled {
    let launches = c.launches.max(1) as f64;
    let fits = c.max_footprint_sectors * SECTOR <= gpu.l2_bytes;
    let sectors = if fits {
        c.unique_read_sectors + c.unique_write_sectors
    } else {
        c.block_unique_read_sectors + c.block_unique_write_sectors
    };
    let dram_bytes = (sectors * SECTOR) as f64;
    // SMs with work: a launch of fewer blocks than SMs leaves some idle.
    let blocks_launch = c.blocks as f64 / launches;
    let active_sms = blocks_launch.min(f64::from(gpu.sms)).max(1.0);
    let resident_warps = (f64::from(occ.warps_sm)).min(blocks_launch * occ.block_threads.div_ceil(32) as f64);
    let requests = c.load_requests + c.store_requests + c.atomic_requests;
    let bytes_request = if requests == 0 {
        0.0
    } else {
        ((c.load_sectors + c.store_sectors + c.atomic_sectors) * SECTOR) as f64 / requests as f64
    };
    let in_flight = active_sms * resident_warps.max(1.0) * bytes_request * gpu.requests_in_flight_warp;
    let achievable_bw =
        if bytes_request == 0.0 { gpu.dram_bw } else { gpu.dram_bw.min(in_flight / gpu.dram_latency_s) };
    let dram_s = dram_bytes / achievable_bw;
    let per = |class: Class| c.of(class) as f64;
    let cycles_all = [
        c.warp_instructions as f64 / gpu.issue_sm,
        per(Class::Sfu) / gpu.sfu_sm,
        per(Class::F64) / gpu.f64_sm,
        per(Class::Int) / gpu.int_sm,
        per(Class::IntMul) / gpu.int_mul_sm,
    ]
    .into_iter()
    .fold(0.0, f64::max);
    let warps_scheduler = resident_warps / 4.0;
    let hide = (warps_scheduler / gpu.warps_to_hide).clamp(1e-3, 1.0);
    let issue_s = cycles_all / active_sms / gpu.clock_hz / hide;
    let shared_s = c.shared_wavefronts as f64 / gpu.shared_sm_wavefronts / active_sms / gpu.clock_hz;
    let tensor_flops = c.tensor_flops() as f64;
    let tensor_s = tensor_flops / (gpu.bf16_flops / f64::from(gpu.sms)) / active_sms;
    let launch_s = launches * gpu.launch_s;
    let (busy, bound) = [(dram_s, "dram"), (issue_s, "issue"), (shared_s, "shared"), (tensor_s, "tensor")]
        .into_iter()
        .fold((0.0, "dram"), |a, b| if b.0 > a.0 { b } else { a });
    let total_s = busy + launch_s;
    Modeled {
        dram_bytes,
        dram_s,
        achievable_bw,
        issue_s,
        shared_s,
        tensor_flops,
        tensor_s,
        launch_s,
        total_s,
        bound,
        roofline: if total_s > 0.0 {
            (dram_bytes / gpu.dram_bw).max(tensor_flops / gpu.bf16_flops) / total_s
        } else {
            0.0
        },
    }
}

/// A cuBLAS product's modeled time: its FLOPs at `blas_compute_fraction`
/// of the peak of its input type, or its bytes at `blas_bw_fraction` of
/// the bandwidth, whichever is longer, plus one launch.
pub fn gemm_time(gpu: &Gpu, flops: f64, bytes: f64, peak: f64) -> f64 {
    (flops / (peak * gpu.blas_compute_fraction)).max(bytes / (gpu.dram_bw * gpu.blas_bw_fraction)) + gpu.launch_s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1e-30)
    }

    #[test]
    fn occupancy_is_limited_by_threads_registers_or_shared() {
        // 256 threads, 32 registers: 8 blocks of 8 warps fill 64 warps.
        let o = occupancy(&H200, 256, Some(32), 0, 1056.0);
        assert_eq!((o.blocks_sm, o.warps_sm, o.limiter), (8, 64, "threads"));
        assert!(close(o.occupancy, 1.0) && close(o.waves, 1.0));
        // 128 registers a thread: 4096 a warp, 16 warps, 2 blocks of 256.
        let o = occupancy(&H200, 256, Some(128), 0, 1.0);
        assert_eq!((o.blocks_sm, o.limiter), (2, "registers"));
        assert!(close(o.occupancy, 0.25));
        // 48 KiB a block plus the 1 KiB reserve: 228 KiB hold 4.
        let o = occupancy(&H200, 128, None, 48 * 1024, 1.0);
        assert_eq!((o.blocks_sm, o.limiter), (4, "shared"));
        // 32-thread blocks hit the 32-blocks limit at half occupancy.
        let o = occupancy(&H200, 32, None, 0, 1.0);
        assert_eq!((o.blocks_sm, o.limiter), (32, "blocks"));
        assert!(close(o.occupancy, 0.5));
    }

    /// A launch that reads 1 GB and writes 1 GB with 16-byte loads fills the
    /// device: DRAM-bound at the peak bandwidth.
    #[test]
    fn a_streaming_kernel_is_dram_bound_at_peak() {
        let n_req = (1e9 / 512.0) as u64;
        let c = Counters {
            launches: 1,
            blocks: 1 << 20,
            block_threads: 256,
            warp_instructions: 10 * n_req,
            load_requests: n_req,
            load_sectors: 16 * n_req,
            store_requests: n_req,
            store_sectors: 16 * n_req,
            // Past the L2: each block's own sectors are DRAM sectors.
            max_footprint_sectors: 2 * 16 * n_req,
            block_unique_read_sectors: 16 * n_req,
            block_unique_write_sectors: 16 * n_req,
            // Counted once per launch, as they would be in L2 (not used here).
            unique_read_sectors: 1,
            ..Counters::default()
        };
        let o = occupancy(&H200, 256, Some(32), 0, c.blocks as f64);
        let m = model(&H200, &c, &o);
        assert_eq!(m.bound, "dram");
        assert!(close(m.dram_bytes, 2.0 * 16.0 * 32.0 * n_req as f64));
        assert!(close(m.dram_s, m.dram_bytes / 4.8e12));
        // Issue: 10 n_req warp-instructions over 132 SMs issuing 4 a cycle at 1.98 GHz.
        assert!(close(m.issue_s, 10.0 * n_req as f64 / 4.0 / 132.0 / 1.98e9));
        assert!(close(m.total_s, m.dram_s + 2e-6));
        assert!(m.roofline > 0.99 && m.roofline < 1.0);
    }

    /// Integer multiplies and the other integer instructions go to two
    /// pipes of 64 lanes each (FMA and ALU): as many of each as of the two
    /// together on one pipe would take half the cycles.
    #[test]
    fn integer_multiplies_and_logic_issue_on_separate_pipes() {
        let n = 1u64 << 20;
        let mut c = Counters { launches: 1, blocks: 1 << 12, block_threads: 256, ..Counters::default() };
        c.warp_instructions = 2 * n;
        c.mix[Class::Int as usize] = n;
        c.mix[Class::IntMul as usize] = n;
        let o = occupancy(&H200, 256, Some(32), 0, c.blocks as f64);
        let m = model(&H200, &c, &o);
        // n on each pipe at 2 a cycle (n / 2), the same as 2n issued at 4.
        assert!(close(m.issue_s, n as f64 / 2.0 / 132.0 / 1.98e9), "{m:?}");
        c.mix[Class::Int as usize] = 2 * n;
        c.mix[Class::IntMul as usize] = 0;
        let m = model(&H200, &c, &o);
        assert!(close(m.issue_s, n as f64 / 132.0 / 1.98e9), "all on the ALU pipe: {m:?}");
    }

    /// 2-byte lanes keep 64 B a request in flight: 132 SMs x 64 warps x 64 B
    /// x 2 requests over 600 ns is 1.8 TB/s, short of the 4.8.
    #[test]
    fn narrow_requests_are_latency_bound() {
        let n_req = 1u64 << 20;
        let c = Counters {
            launches: 1,
            blocks: 1 << 16,
            block_threads: 256,
            warp_instructions: 4 * n_req,
            load_requests: n_req,
            load_sectors: 2 * n_req,
            unique_read_sectors: 2 * n_req,
            block_unique_read_sectors: 2 * n_req,
            max_footprint_sectors: 2 * n_req,
            ..Counters::default()
        };
        let o = occupancy(&H200, 256, Some(16), 0, c.blocks as f64);
        let m = model(&H200, &c, &o);
        let bw = 132.0 * 64.0 * 64.0 * 2.0 / 600e-9;
        assert!(close(m.achievable_bw, bw));
        assert!(close(m.dram_s, 64.0 * n_req as f64 / bw));
        assert!(m.roofline < bw / 4.8e12);
    }

    /// One block of 32 threads: one SM, one warp on one of its four
    /// schedulers, which needs four to hide latency: derated 16x.
    #[test]
    fn a_tiny_launch_is_issue_and_launch_bound() {
        let c = Counters {
            launches: 1,
            blocks: 1,
            block_threads: 32,
            warp_instructions: 1000,
            mix: {
                let mut m = [0; crate::exec::NCLASS];
                m[Class::Sfu as usize] = 100;
                m
            },
            ..Counters::default()
        };
        let o = occupancy(&H200, 32, None, 0, 1.0);
        let m = model(&H200, &c, &o);
        assert_eq!(m.bound, "issue");
        // max(1000 / 4, 100 / 0.5) = 250 cycles on 1 SM.
        assert!(close(m.issue_s, 250.0 / 1.98e9 * 16.0));
        assert!(close(m.total_s, m.issue_s + 2e-6));
    }

    /// A grid of mma.sync on every SM, little else: tensor-bound, and its
    /// roofline is the tensor peak's, not the DRAM's.
    #[test]
    fn an_mma_kernel_is_judged_on_the_tensor_roofline() {
        let mmas = 1u64 << 30;
        let c = Counters {
            launches: 1,
            blocks: 1 << 14,
            block_threads: 128,
            warp_instructions: mmas + mmas / 8,
            mix: {
                let mut m = [0; crate::exec::NCLASS];
                m[Class::Tensor as usize] = mmas;
                m
            },
            unique_read_sectors: 1 << 20,
            max_footprint_sectors: 1 << 20,
            ..Counters::default()
        };
        let o = occupancy(&H200, 128, Some(64), 0, c.blocks as f64);
        let m = model(&H200, &c, &o);
        assert_eq!(m.bound, "tensor");
        let flops = 4096.0 * mmas as f64;
        assert!(close(m.tensor_flops, flops));
        assert!(close(m.tensor_s, flops / 989e12));
        assert!(close(m.roofline, (flops / 989e12) / m.total_s));
        assert!(m.roofline > 0.99 && m.roofline < 1.0);
    }

    #[test]
    fn gemm_is_compute_or_bandwidth_bound() {
        // 8192^3 bf16: 1.1 TFLOP at 70% of 989 TFLOP/s.
        let f = 2.0 * 8192f64.powi(3);
        let t = gemm_time(&H200, f, 3.0 * 8192.0 * 8192.0 * 2.0, H200.bf16_flops);
        assert!(close(t, f / (989e12 * 0.7) + 2e-6));
        // A matrix-vector product is bandwidth-bound.
        let t = gemm_time(&H200, 2.0 * 8192.0 * 8192.0, 8192.0 * 8192.0 * 4.0, H200.f32_flops);
        assert!(close(t, 8192.0 * 8192.0 * 4.0 / (4.8e12 * 0.8) + 2e-6));
    }
}
