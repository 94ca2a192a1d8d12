//! The schedule within a block: threads run until they park at a barrier
//! or a warp collective, then collectives and barriers complete.

use super::sanitizer::Shadow;
use super::step::{St, Th};
use super::{Block, Fault, Launch, LAUNCH_FAILED};
use crate::ptx::*;

/// A worker's state: a block's shared memory and shadow, and its threads.
pub(super) struct Worker<'a> {
    pub(super) blk: Block<'a>,
    threads: Vec<Th>,
}

impl<'a> Worker<'a> {
    pub(super) fn new(l: &'a Launch<'a>) -> Worker<'a> {
        let f = &l.module.funcs[l.func];
        let nthreads = (l.block[0] * l.block[1] * l.block[2]) as usize;
        let shared_len = (f.shared_size.div_ceil(16) * 16 + l.dyn_shared) as usize;
        let blk = Block {
            l,
            ctaid: [0; 3],
            shared: vec![0u8; shared_len],
            shadow: vec![Shadow::default(); if l.racecheck { shared_len } else { 0 }],
            gen: 0,
            wep: vec![0; nthreads.div_ceil(32)],
            last: None,
            count: 0,
        };
        let threads = (0..nthreads)
            .map(|_| Th {
                pc: 0,
                func: l.func as u32,
                regs: vec![0; f.nregs],
                params: Vec::new(),
                local: Vec::new(),
                frames: Vec::new(),
                cc: false,
                st: St::Run,
            })
            .collect();
        Worker { blk, threads }
    }

    /// Runs block number `id` (x fastest, as the hardware numbers them).
    pub(super) fn block(&mut self, id: u64) -> Result<(), Fault> {
        let l = self.blk.l;
        let f = &l.module.funcs[l.func];
        let (gx, gy) = (u64::from(l.grid[0]), u64::from(l.grid[1]));
        let (bx, by, bz) = ((id % gx) as u32, (id / gx % gy) as u32, (id / (gx * gy)) as u32);
        let nthreads = self.threads.len();
        self.blk.ctaid = [bx, by, bz];
        self.blk.gen += 1;
        for (tid, th) in self.threads.iter_mut().enumerate() {
            let t = tid as u32;
            th.pc = 0;
            th.func = l.func as u32;
            th.frames.clear();
            th.cc = false;
            th.st = St::Run;
            th.regs.clear();
            th.regs.resize(f.nregs, 0);
            let x = t % l.block[0];
            let y = t / l.block[0] % l.block[1];
            let z = t / (l.block[0] * l.block[1]);
            let sp = [
                x,
                y,
                z,
                l.block[0],
                l.block[1],
                l.block[2],
                bx,
                by,
                bz,
                l.grid[0],
                l.grid[1],
                l.grid[2],
                t % 32,
                t / 32,
                nthreads.div_ceil(32) as u32,
                32,
            ];
            for (k, v) in sp.iter().enumerate() {
                th.regs[k] = u64::from(*v);
            }
            th.params.clear();
            th.params.extend_from_slice(l.params);
            th.params.resize((f.param_size as usize).max(l.params.len()), 0);
            th.local.clear();
            th.local.resize(f.local_size as usize, 0);
        }
        run_block(&mut self.blk, &mut self.threads)
    }
}

fn run_block(blk: &mut Block, threads: &mut [Th]) -> Result<(), Fault> {
    let n = threads.len();
    loop {
        for (tid, th) in threads.iter_mut().enumerate() {
            if th.st == St::Run {
                th.st = blk.run(th, tid)?;
            }
        }
        if threads.iter().all(|t| t.st == St::Done) {
            return Ok(());
        }
        let mut progressed = false;
        for w in 0..n.div_ceil(32) {
            let lo = w * 32;
            let hi = (lo + 32).min(n);
            if warp_collectives(blk, &mut threads[lo..hi], lo)? {
                progressed = true;
            }
        }
        if progressed {
            continue;
        }
        let waiting_bar = threads.iter().filter(|t| t.st == St::Bar).count();
        let done = threads.iter().filter(|t| t.st == St::Done).count();
        if waiting_bar + done == n {
            for th in threads.iter_mut() {
                if th.st == St::Bar {
                    th.st = St::Run;
                    th.pc += 1;
                }
            }
            blk.gen += 1;
            continue;
        }
        // Nothing can move: some lanes wait at a collective their peers never reach.
        let (tid, th) = threads.iter().enumerate().find(|(_, t)| t.st == St::Warp).expect("internal: a stuck thread");
        let line = blk.l.module.funcs[th.func as usize].insts[th.pc as usize].line;
        return Err(blk.fault(
            LAUNCH_FAILED,
            tid,
            format!(
                "deadlock: a warp collective at PTX line {line} waits for lanes of its member mask that \
                 have exited or wait at a barrier or another collective"
            ),
        ));
    }
}

/// Completes the warp collectives whose member masks have all arrived;
/// true when any did.
fn warp_collectives(blk: &mut Block, lanes: &mut [Th], base: usize) -> Result<bool, Fault> {
    let module = blk.l.module;
    let exists: u32 = if lanes.len() == 32 { u32::MAX } else { (1u32 << lanes.len()) - 1 };
    let mut progressed = false;
    // Group waiting lanes by the instruction they wait at.
    let mut handled = 0u32;
    for k in 0..lanes.len() {
        if lanes[k].st != St::Warp || handled & (1 << k) != 0 {
            continue;
        }
        let (func, pc) = (lanes[k].func, lanes[k].pc);
        let mut group = 0u32;
        for (j, t) in lanes.iter().enumerate() {
            if t.st == St::Warp && t.func == func && t.pc == pc {
                group |= 1 << j;
            }
        }
        handled |= group;
        let inst = &module.funcs[func as usize].insts[pc as usize];
        let rd = |t: &Th, o: Opnd| match o {
            Opnd::R(r) => t.regs[r as usize],
            Opnd::I(v) => v,
        };
        let mask_op = match inst.ins {
            Ins::Shfl { mask, .. } | Ins::Vote { mask, .. } | Ins::WarpSync { mask } => mask,
            _ => unreachable!("internal: parked at a non-collective"),
        };
        // Every lane's member mask (lanes beyond the block do not exist) must be in the group.
        let mut ready = true;
        for j in 0..lanes.len() {
            if group & (1 << j) != 0 {
                let m = rd(&lanes[j], mask_op) as u32 & exists;
                if m & !group != 0 {
                    ready = false;
                    let exited = (0..lanes.len()).find(|&q| m & (1 << q) != 0 && lanes[q].st == St::Done);
                    if let Some(q) = exited {
                        return Err(blk.fault(
                            LAUNCH_FAILED,
                            base + j,
                            format!(
                                "a warp collective at PTX line {} names lane {q} in its member mask {m:#010x}, \
                                 but that lane has exited",
                                inst.line
                            ),
                        ));
                    }
                }
            }
        }
        if !ready {
            continue;
        }
        match inst.ins {
            Ins::Shfl { mode, d, dp, a, b, c, .. } => {
                let vals: Vec<u64> = lanes.iter().map(|t| rd(t, a)).collect();
                for j in 0..lanes.len() {
                    if group & (1 << j) == 0 {
                        continue;
                    }
                    let t = &lanes[j];
                    let bval = (rd(t, b) & 31) as i32;
                    let cv = rd(t, c) as u32;
                    let cval = (cv & 31) as i32;
                    let segmask = ((cv >> 8) & 31) as i32;
                    let lane = j as i32;
                    let max_lane = (lane & segmask) | (cval & !segmask);
                    let min_lane = lane & segmask;
                    let (jj, p) = match mode {
                        ShflMode::Up => (lane - bval, lane - bval >= max_lane),
                        ShflMode::Down => (lane + bval, lane + bval <= max_lane),
                        ShflMode::Bfly => (lane ^ bval, (lane ^ bval) <= max_lane),
                        ShflMode::Idx => {
                            let jj = min_lane | (bval & !segmask);
                            (jj, jj <= max_lane)
                        }
                    };
                    let src = if p { jj as usize } else { j };
                    let v = if src < lanes.len() && group & (1 << src) != 0 { vals[src] } else { vals[j] };
                    let t = &mut lanes[j];
                    t.regs[d as usize] = v & 0xffff_ffff;
                    if let Some(dp) = dp {
                        t.regs[dp as usize] = u64::from(p);
                    }
                }
            }
            Ins::Vote { mode, d, a, neg, .. } => {
                let mut ballot = 0u32;
                for (j, t) in lanes.iter().enumerate() {
                    if group & (1 << j) != 0 && ((rd(t, a) != 0) != neg) {
                        ballot |= 1 << j;
                    }
                }
                for (j, lane) in lanes.iter_mut().enumerate() {
                    if group & (1 << j) == 0 {
                        continue;
                    }
                    let m = rd(lane, mask_op) as u32 & exists;
                    let v = match mode {
                        VoteMode::Ballot => u64::from(ballot & m),
                        VoteMode::All => u64::from(ballot & m == m),
                        VoteMode::Any => u64::from(ballot & m != 0),
                        VoteMode::Uni => u64::from(ballot & m == m || ballot & m == 0),
                    };
                    lane.regs[d as usize] = v;
                }
            }
            _ => {}
        }
        blk.wep[base / 32] += 1;
        for (j, t) in lanes.iter_mut().enumerate() {
            if group & (1 << j) != 0 {
                t.st = St::Run;
                t.pc += 1;
            }
        }
        progressed = true;
    }
    Ok(progressed)
}
