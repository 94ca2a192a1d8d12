//! What the interpreter counts of a launch, as a profiler's hardware
//! counters would: exact, and the same whatever the number of host threads.
//!
//! Always counted (cheap): launches, threads, blocks, warp-instructions
//! and their active lanes, barriers. Counted only while profiling is on
//! ([`set_profiling`], or `TAPIR_CUDA_EMU_PROFILE` set): the instruction
//! mix, global requests and the 32-byte sectors they touch, the unique
//! sectors a launch reads and writes, shared-memory wavefronts and bank
//! conflicts, and same-address atomics within a warp.
//!
//! Definitions (Nsight Compute's, as far as an interpreter can see them):
//!
//! - a global *request* is one warp-instruction that loads or stores global
//!   memory; its *sectors* are the distinct aligned 32-byte blocks its
//!   active lanes touch. Sectors per request is the coalescing figure (4
//!   for 32 lanes reading consecutive f32, 16 for 16-byte vector loads);
//!   bytes asked for over 32 x sectors is the sector efficiency.
//! - the *unique* sectors of a launch are those any of its lanes read (or
//!   wrote, or touched with an atomic, which counts as both); under the L2
//!   model of `profile`, each is one DRAM transfer while the launch's
//!   footprint fits in L2. Past that, the model takes each block's unique
//!   sectors (reuse within a block, which a block's small working set gets
//!   from L1 and L2, but none across blocks).
//! - shared memory has 32 banks of 4 bytes. A warp-instruction is served
//!   in phases of at most 128 bytes (all 32 lanes for accesses of up to 4
//!   bytes, half-warps for 8 bytes, quarter-warps for 16); a phase takes as
//!   many wavefronts as the largest number of distinct 4-byte words any
//!   one bank holds among its lanes' bytes (lanes reading the same word
//!   share it). Bank conflicts are wavefronts beyond one per phase.
//! - a same-address atomic is a lane whose atomic hits an address another
//!   active lane of its warp-instruction also hits (lanes minus distinct
//!   addresses): the hardware serialises those.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU8, Ordering};

use crate::ptx::{BinOp, Ins, Ty, UnOp};

/// Bytes in a sector, the unit of DRAM and L2 traffic.
pub const SECTOR: u64 = 32;
/// Shared-memory banks, each 4 bytes wide.
pub const BANKS: usize = 32;

/// The instruction mix: each warp-instruction falls in one class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// f32 arithmetic, comparison and moves of f32 values.
    F32,
    /// f16/bf16 arithmetic (scalar or packed).
    Half,
    F64,
    /// Integer, logic, predicate and address arithmetic, moves: the ALU
    /// pipe's work, integer multiplies aside.
    Int,
    /// Integer multiplies and multiply-adds (`mul`, `mul.hi`, `mul.wide`,
    /// `mad` on integers): on sm_70 to sm_90 they run on the FMA pipe
    /// (`IMAD`), not the ALU pipe (docs/gpu-model.md).
    IntMul,
    /// The special-function unit: `ex2`, `lg2`, `sin`, `cos`, `rcp.approx`,
    /// `sqrt.approx`, `rsqrt`.
    Sfu,
    /// `cvt` between types.
    Cvt,
    LdGlobal,
    StGlobal,
    LdShared,
    StShared,
    LdLocal,
    StLocal,
    /// Kernel or device-function parameters.
    LdParam,
    LdConst,
    Shfl,
    Vote,
    Atomic,
    Barrier,
    /// Branches, calls, returns, exits, fences.
    Control,
    /// Tensor-core matrix multiply-accumulates (`mma.sync`), each
    /// [`MMA_FLOPS`] floating-point operations on the tensor pipe.
    Tensor,
}

/// Classes in the mix.
pub const NCLASS: usize = 21;

/// FLOPs of one `mma.sync` m16n8k16: 16 x 8 outputs, 16 multiply-adds each.
pub const MMA_FLOPS: u64 = 2 * 16 * 8 * 16;

impl Class {
    /// Every class, in the mix's order.
    pub const ALL: [Class; NCLASS] = [
        Class::F32,
        Class::Half,
        Class::F64,
        Class::Int,
        Class::IntMul,
        Class::Sfu,
        Class::Cvt,
        Class::LdGlobal,
        Class::StGlobal,
        Class::LdShared,
        Class::StShared,
        Class::LdLocal,
        Class::StLocal,
        Class::LdParam,
        Class::LdConst,
        Class::Shfl,
        Class::Vote,
        Class::Atomic,
        Class::Barrier,
        Class::Control,
        Class::Tensor,
    ];

    /// Its name in the profile's JSON.
    pub fn name(self) -> &'static str {
        match self {
            Class::F32 => "f32",
            Class::Half => "half",
            Class::F64 => "f64",
            Class::Int => "int",
            Class::IntMul => "int_mul",
            Class::Sfu => "sfu",
            Class::Cvt => "cvt",
            Class::LdGlobal => "ld_global",
            Class::StGlobal => "st_global",
            Class::LdShared => "ld_shared",
            Class::StShared => "st_shared",
            Class::LdLocal => "ld_local",
            Class::StLocal => "st_local",
            Class::LdParam => "ld_param",
            Class::LdConst => "ld_const",
            Class::Shfl => "shfl",
            Class::Vote => "vote",
            Class::Atomic => "atomic",
            Class::Barrier => "barrier",
            Class::Control => "control",
            Class::Tensor => "tensor",
        }
    }
}

fn by_type(t: Ty) -> Class {
    match t {
        Ty::F32 => Class::F32,
        Ty::F16 | Ty::Bf16 => Class::Half,
        Ty::F64 => Class::F64,
        _ => Class::Int,
    }
}

/// The class of a register or control instruction; None for loads,
/// stores and atomics, which the memory path counts by the space their
/// lanes' addresses resolve to.
pub(super) fn class(ins: &Ins) -> Option<Class> {
    Some(match *ins {
        Ins::Bin { op: BinOp::Mul | BinOp::MulHi | BinOp::MulWide, t, .. } if !t.float() => Class::IntMul,
        Ins::Mad { .. } => Class::IntMul,
        Ins::Bin { t, .. } | Ins::Fma { t, .. } | Ins::Setp { t, .. } | Ins::Selp { t, .. } => by_type(t),
        Ins::Un { op, t, .. } => match op {
            UnOp::Ex2 | UnOp::Lg2 | UnOp::Sin | UnOp::Cos | UnOp::Rsqrt => Class::Sfu,
            UnOp::Rcp { approx: true } | UnOp::Sqrt { approx: true } => Class::Sfu,
            _ => by_type(t),
        },
        Ins::Cvt { .. } | Ins::CvtPack { .. } => Class::Cvt,
        // ldmatrix is counted with the shared loads, by the path that runs it.
        Ins::Ld { .. } | Ins::St { .. } | Ins::Atom { .. } | Ins::Ldmatrix { .. } => return None,
        Ins::Mma { .. } => Class::Tensor,
        Ins::Shfl { .. } => Class::Shfl,
        Ins::Vote { .. } => Class::Vote,
        Ins::Bar => Class::Barrier,
        Ins::Bra { .. } | Ins::Call { .. } | Ins::Ret | Ins::Exit | Ins::Nop | Ins::WarpSync { .. } => Class::Control,
        _ => Class::Int,
    })
}

/// What the interpreter counts of a launch (or, summed, of all launches
/// of one kernel): exact, and the same whatever the number of host
/// threads. The fields after `barriers` stay zero unless profiling.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    pub launches: u64,
    pub threads: u64,
    /// Warp-instructions executed: one per instruction a warp issued.
    pub warp_instructions: u64,
    /// Their active lanes, summed: `thread_instructions / warp_instructions`
    /// is the mean active lanes (32 when no warp ever diverges).
    pub thread_instructions: u64,
    /// Block-wide barriers completed.
    pub barriers: u64,
    /// Blocks run.
    pub blocks: u64,
    /// The largest block (threads) and shared memory a block (static plus
    /// dynamic bytes) any launch used: what occupancy is computed from.
    pub block_threads: u64,
    pub block_shared: u64,
    /// Warp-instructions by [`Class`], in [`Class::ALL`]'s order.
    pub mix: [u64; NCLASS],
    /// Global load requests (warp-instructions), the sectors they touched
    /// (summed over requests) and the bytes their lanes asked for (each
    /// byte once a request: lanes reading one value ask for it once).
    pub load_requests: u64,
    pub load_sectors: u64,
    pub load_bytes: u64,
    /// The same for global stores.
    pub store_requests: u64,
    pub store_sectors: u64,
    pub store_bytes: u64,
    /// Global atomic requests, and their sectors and bytes.
    pub atomic_requests: u64,
    pub atomic_sectors: u64,
    pub atomic_bytes: u64,
    /// Sectors each launch read and wrote, counted once per launch (an
    /// atomic's sector counts as both), summed over launches.
    pub unique_read_sectors: u64,
    pub unique_write_sectors: u64,
    /// Sectors each block read and wrote, counted once per block, summed
    /// over blocks and launches: the DRAM traffic the L2 model takes when a
    /// launch's footprint does not fit (reuse within a block only).
    pub block_unique_read_sectors: u64,
    pub block_unique_write_sectors: u64,
    /// The largest footprint (sectors read or written, counted once) of
    /// one launch: the L2 model holds while it fits in L2.
    pub max_footprint_sectors: u64,
    /// Shared-memory loads and stores (warp-instructions), the wavefronts
    /// they took, and the least they could have taken (one a phase): bank
    /// conflicts are `shared_wavefronts - shared_ideal_wavefronts`.
    pub shared_requests: u64,
    pub shared_wavefronts: u64,
    pub shared_ideal_wavefronts: u64,
    /// Lanes executing atomics (any space), and of those, lanes whose
    /// address another lane of the same warp-instruction also hits (lanes
    /// minus distinct addresses).
    pub atomic_lanes: u64,
    pub atomic_same_address: u64,
}

impl Counters {
    pub fn add(&mut self, o: &Counters) {
        self.launches += o.launches;
        self.threads += o.threads;
        self.warp_instructions += o.warp_instructions;
        self.thread_instructions += o.thread_instructions;
        self.barriers += o.barriers;
        self.blocks += o.blocks;
        self.block_threads = self.block_threads.max(o.block_threads);
        self.block_shared = self.block_shared.max(o.block_shared);
        for (a, b) in self.mix.iter_mut().zip(o.mix) {
            *a += b;
        }
        self.load_requests += o.load_requests;
        self.load_sectors += o.load_sectors;
        self.load_bytes += o.load_bytes;
        self.store_requests += o.store_requests;
        self.store_sectors += o.store_sectors;
        self.store_bytes += o.store_bytes;
        self.atomic_requests += o.atomic_requests;
        self.atomic_sectors += o.atomic_sectors;
        self.atomic_bytes += o.atomic_bytes;
        self.unique_read_sectors += o.unique_read_sectors;
        self.unique_write_sectors += o.unique_write_sectors;
        self.block_unique_read_sectors += o.block_unique_read_sectors;
        self.block_unique_write_sectors += o.block_unique_write_sectors;
        self.max_footprint_sectors = self.max_footprint_sectors.max(o.max_footprint_sectors);
        self.shared_requests += o.shared_requests;
        self.shared_wavefronts += o.shared_wavefronts;
        self.shared_ideal_wavefronts += o.shared_ideal_wavefronts;
        self.atomic_lanes += o.atomic_lanes;
        self.atomic_same_address += o.atomic_same_address;
    }

    /// Warp-instructions of class `c`.
    pub fn of(&self, c: Class) -> u64 {
        self.mix[c as usize]
    }

    /// FLOPs on the tensor pipe: [`MMA_FLOPS`] a `mma.sync`.
    pub fn tensor_flops(&self) -> u64 {
        self.of(Class::Tensor) * MMA_FLOPS
    }

    /// Shared-memory bank conflicts: wavefronts beyond one a phase.
    pub fn bank_conflicts(&self) -> u64 {
        self.shared_wavefronts - self.shared_ideal_wavefronts
    }

    /// Mean sectors per global load or store request (0 with none).
    pub fn sectors_per_request(&self) -> f64 {
        let r = self.load_requests + self.store_requests;
        if r == 0 {
            0.0
        } else {
            (self.load_sectors + self.store_sectors) as f64 / r as f64
        }
    }

    /// Bytes the lanes asked for over the bytes of the sectors their
    /// global loads and stores touched (1 with none).
    pub fn sector_efficiency(&self) -> f64 {
        let s = self.load_sectors + self.store_sectors;
        if s == 0 {
            1.0
        } else {
            (self.load_bytes + self.store_bytes) as f64 / (s * SECTOR) as f64
        }
    }
}

static PROFILING: AtomicU8 = AtomicU8::new(UNSET);
const UNSET: u8 = 2;

/// Whether launches count the profiler's counters: set by
/// [`set_profiling`], else on when `TAPIR_CUDA_EMU_PROFILE` is set.
pub fn profiling() -> bool {
    match PROFILING.load(Ordering::Relaxed) {
        UNSET => {
            let on = std::env::var_os("TAPIR_CUDA_EMU_PROFILE").is_some_and(|p| !p.is_empty());
            PROFILING.store(u8::from(on), Ordering::Relaxed);
            on
        }
        v => v == 1,
    }
}

/// Turns the profiler's counters on or off for later launches.
pub fn set_profiling(on: bool) {
    PROFILING.store(u8::from(on), Ordering::Relaxed);
}

/// A multiplicative hash for sector numbers (SipHash is the cost here).
#[derive(Default)]
pub(super) struct SectorHash(u64);

impl Hasher for SectorHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ v >> 29).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub(super) type SectorSet = HashSet<u64, BuildHasherDefault<SectorHash>>;

/// A worker's view of a launch while profiling: the sectors its blocks
/// read and wrote.
#[derive(Default)]
pub(super) struct Footprint {
    pub(super) read: SectorSet,
    pub(super) written: SectorSet,
    /// The same, of the block being run.
    block_read: SectorSet,
    block_written: SectorSet,
}

impl Footprint {
    /// Adds another worker's sectors.
    pub(super) fn merge(&mut self, o: Footprint) {
        if self.read.len() < o.read.len() {
            let mine = std::mem::replace(&mut self.read, o.read);
            self.read.extend(mine);
        } else {
            self.read.extend(o.read);
        }
        if self.written.len() < o.written.len() {
            let mine = std::mem::replace(&mut self.written, o.written);
            self.written.extend(mine);
        } else {
            self.written.extend(o.written);
        }
    }

    /// Ends a block: its unique sectors, into the counters.
    pub(super) fn end_block(&mut self, c: &mut Counters) {
        c.block_unique_read_sectors += self.block_read.len() as u64;
        c.block_unique_write_sectors += self.block_written.len() as u64;
        self.block_read.clear();
        self.block_written.clear();
    }

    /// The launch's unique sectors, into its counters.
    pub(super) fn finish(&self, c: &mut Counters) {
        c.unique_read_sectors = self.read.len() as u64;
        c.unique_write_sectors = self.written.len() as u64;
        let both = if self.read.len() < self.written.len() {
            self.read.iter().filter(|s| self.written.contains(*s)).count()
        } else {
            self.written.iter().filter(|s| self.read.contains(*s)).count()
        };
        c.max_footprint_sectors = (self.read.len() + self.written.len() - both) as u64;
    }
}

/// How a global warp-instruction uses memory.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    Load,
    Store,
    Atomic,
}

/// The distinct sectors of `len` bytes at each address of `addrs` (the
/// active lanes'), sorted.
fn sectors(addrs: &[u64], len: u64, out: &mut Vec<u64>) {
    out.clear();
    for &a in addrs {
        let (first, last) = (a / SECTOR, (a + len.max(1) - 1) / SECTOR);
        for s in first..=last {
            out.push(s);
        }
    }
    out.sort_unstable();
    out.dedup();
}

/// Counts a global warp-instruction of the active lanes' `addrs`, each
/// `len` bytes.
pub(super) fn global(c: &mut Counters, fp: &mut Footprint, kind: Access, addrs: &[u64], len: u64) {
    if addrs.is_empty() {
        return;
    }
    let mut s = Vec::with_capacity(addrs.len() * 2);
    sectors(addrs, len, &mut s);
    // Bytes asked for, each once: lanes reading one value (a broadcast)
    // ask for its bytes once.
    let mut a = addrs.to_vec();
    a.sort_unstable();
    a.dedup();
    let bytes = a.windows(2).map(|w| (w[1] - w[0]).min(len)).sum::<u64>() + len;
    let n = s.len() as u64;
    match kind {
        Access::Load => {
            c.mix[Class::LdGlobal as usize] += 1;
            c.load_requests += 1;
            c.load_sectors += n;
            c.load_bytes += bytes;
            fp.read.extend(&s);
            fp.block_read.extend(&s);
        }
        Access::Store => {
            c.mix[Class::StGlobal as usize] += 1;
            c.store_requests += 1;
            c.store_sectors += n;
            c.store_bytes += bytes;
            fp.written.extend(&s);
            fp.block_written.extend(&s);
        }
        Access::Atomic => {
            c.atomic_requests += 1;
            c.atomic_sectors += n;
            c.atomic_bytes += bytes;
            fp.read.extend(&s);
            fp.written.extend(&s);
            fp.block_read.extend(&s);
            fp.block_written.extend(&s);
        }
    }
}

/// Counts a shared-memory load or store of the active lanes, given as
/// (lane, offset) pairs in lane order, each `len` bytes.
pub(super) fn shared(c: &mut Counters, lanes: &[(usize, u64)], len: u64) {
    if lanes.is_empty() {
        return;
    }
    c.shared_requests += 1;
    let per_phase = match len {
        0..=4 => 32,
        5..=8 => 16,
        _ => 8,
    };
    let mut words: Vec<u64> = Vec::with_capacity(64);
    let mut phase_start = 0;
    while phase_start < lanes.len() {
        let phase = lanes[phase_start].0 / per_phase;
        let mut end = phase_start;
        words.clear();
        while end < lanes.len() && lanes[end].0 / per_phase == phase {
            let off = lanes[end].1;
            for w in off / 4..=(off + len.max(1) - 1) / 4 {
                words.push(w);
            }
            end += 1;
        }
        words.sort_unstable();
        words.dedup();
        let mut per_bank = [0u32; BANKS];
        for &w in &words {
            per_bank[(w % BANKS as u64) as usize] += 1;
        }
        c.shared_wavefronts += u64::from(per_bank.iter().copied().max().unwrap_or(1).max(1));
        c.shared_ideal_wavefronts += 1;
        phase_start = end;
    }
}

/// Counts an atomic warp-instruction's lanes hitting one address.
pub(super) fn atomic_lanes(c: &mut Counters, addrs: &mut [u64]) {
    c.mix[Class::Atomic as usize] += 1;
    c.atomic_lanes += addrs.len() as u64;
    addrs.sort_unstable();
    let distinct = addrs.windows(2).filter(|w| w[0] != w[1]).count() + usize::from(!addrs.is_empty());
    c.atomic_same_address += (addrs.len() - distinct) as u64;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lanes_at(f: impl Fn(u64) -> u64) -> Vec<(usize, u64)> {
        (0..32).map(|l| (l as usize, f(l))).collect()
    }

    #[test]
    fn consecutive_words_take_one_wavefront_and_a_stride_of_two_takes_two() {
        let mut c = Counters::default();
        shared(&mut c, &lanes_at(|l| 4 * l), 4);
        assert_eq!((c.shared_wavefronts, c.bank_conflicts()), (1, 0));
        let mut c = Counters::default();
        shared(&mut c, &lanes_at(|l| 8 * l), 4);
        assert_eq!((c.shared_wavefronts, c.bank_conflicts()), (2, 1));
        // A column of a 32 x 32 f32 tile: every lane in bank 0.
        let mut c = Counters::default();
        shared(&mut c, &lanes_at(|l| 128 * l), 4);
        assert_eq!((c.shared_wavefronts, c.bank_conflicts()), (32, 31));
        // Padding the row to 33 words removes the conflict.
        let mut c = Counters::default();
        shared(&mut c, &lanes_at(|l| 132 * l), 4);
        assert_eq!(c.bank_conflicts(), 0);
    }

    #[test]
    fn a_broadcast_is_one_wavefront_and_vectors_go_in_phases() {
        let mut c = Counters::default();
        shared(&mut c, &lanes_at(|_| 64), 4);
        assert_eq!((c.shared_wavefronts, c.bank_conflicts()), (1, 0));
        // 16-byte accesses: four quarter-warp phases, none conflicting.
        let mut c = Counters::default();
        shared(&mut c, &lanes_at(|l| 16 * l), 16);
        assert_eq!((c.shared_wavefronts, c.shared_ideal_wavefronts), (4, 4));
        // 8 lanes of 16 bytes at a 32-byte stride: two words a bank.
        let mut c = Counters::default();
        shared(&mut c, &lanes_at(|l| 32 * l), 16);
        assert_eq!((c.shared_wavefronts, c.bank_conflicts()), (8, 4));
    }

    #[test]
    fn sectors_count_coalescing() {
        let (mut c, mut fp) = (Counters::default(), Footprint::default());
        let f32s: Vec<u64> = (0..32).map(|l| 4096 + 4 * l).collect();
        global(&mut c, &mut fp, Access::Load, &f32s, 4);
        assert_eq!((c.load_requests, c.load_sectors, c.load_bytes), (1, 4, 128));
        let strided: Vec<u64> = (0..32).map(|l| 4096 + 128 * l).collect();
        global(&mut c, &mut fp, Access::Load, &strided, 4);
        assert_eq!((c.load_requests, c.load_sectors), (2, 36));
        // 132 distinct sectors read; the first 4 are read again by the second request.
        fp.finish(&mut c);
        assert_eq!(c.unique_read_sectors, 4 + 31);
        assert!((c.sector_efficiency() - 256.0 / (36.0 * 32.0)).abs() < 1e-12);
        // 32 lanes reading one f32 ask for 4 bytes of one sector.
        let mut c = Counters::default();
        global(&mut c, &mut fp, Access::Load, &[64; 32], 4);
        assert_eq!((c.load_sectors, c.load_bytes), (1, 4));
        // A misaligned 8-byte access straddles two sectors.
        let mut c = Counters::default();
        global(&mut c, &mut fp, Access::Store, &[28], 8);
        assert_eq!(c.store_sectors, 2);
    }

    #[test]
    fn same_address_atomics_are_lanes_beyond_the_distinct_addresses() {
        let mut c = Counters::default();
        atomic_lanes(&mut c, &mut [8; 32]);
        assert_eq!((c.atomic_lanes, c.atomic_same_address), (32, 31));
        let mut distinct: Vec<u64> = (0..32).map(|l| 4 * l).collect();
        atomic_lanes(&mut c, &mut distinct);
        assert_eq!((c.atomic_lanes, c.atomic_same_address), (64, 31));
    }
}
