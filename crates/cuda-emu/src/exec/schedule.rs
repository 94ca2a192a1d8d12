//! The schedule: blocks handed to workers, warps within a block, and the
//! lanes of a warp.
//!
//! A warp runs the group of its lanes at the lowest program counter, all of
//! them together, one decode and dispatch per warp-instruction under an
//! active mask. A branch that splits the group leaves the lanes at the
//! higher address waiting; the lower group runs until its program counter
//! reaches theirs, where the two merge again (min-pc reconvergence: for the
//! structured code NVRTC emits, that is the branch's immediate
//! post-dominator). A warp runs until none of its lanes can move (each has
//! exited or waits at `bar.sync` or at a warp collective whose members have
//! not all arrived); the block then completes its barrier, once every live
//! thread waits at the same one. Everything depends only on the kernel and
//! its inputs, never on the host threads.

use super::counters::{class, Footprint};
use super::lower::{lower, Op};
use super::sanitizer::Shadow;
use super::warp::{branch, lanes, nonzero_lanes, return_regs, Flow, Frame, Warp, FULL, WARP};
use super::{Block, Counters, Fault, Launch, LAUNCH_FAILED};
use crate::ptx::*;

impl Warp {
    /// Runs until no lane can move.
    pub(super) fn run(&mut self, blk: &mut Block) -> Result<(), Fault> {
        loop {
            let r = self.runnable();
            if r == 0 {
                if !self.frames.is_empty() && self.frame & !(self.done | self.returned) == 0 {
                    self.pop_frame(blk);
                    continue;
                }
                return Ok(());
            }
            let pc = lanes(r).map(|l| self.pcs[l]).min().expect("internal: a runnable lane");
            let group = lanes(r).filter(|&l| self.pcs[l] == pc).fold(0, |m, l| m | 1 << l);
            self.run_group(blk, pc, group)?;
        }
    }

    /// The lowest program counter among `m`'s lanes, and those lanes.
    #[inline]
    fn lowest(&self, m: u32) -> (u32, u32) {
        let pc = lanes(m).map(|l| self.pcs[l]).min().unwrap_or(u32::MAX);
        (pc, lanes(m).filter(|&l| self.pcs[l] == pc).fold(0, |a, l| a | 1 << l))
    }

    /// The lanes whose predicate register `p` holds (fails, if `neg`).
    #[inline(always)]
    fn guard(&self, p: u16, neg: bool) -> u32 {
        let r: &[u64; WARP] = self.regs[p as usize * WARP..][..WARP].try_into().expect("internal: a warp of registers");
        let g = nonzero_lanes(r);
        if neg {
            !g
        } else {
            g
        }
    }

    fn park(&mut self, m: u32, pc: u32) {
        for l in lanes(m) {
            self.pcs[l] = pc;
        }
    }

    /// Runs the group `active` from `pc` until it splits, parks, or passes
    /// lanes waiting further on, merging with waiting lanes it reaches.
    fn run_group(&mut self, blk: &mut Block, mut pc: u32, mut active: u32) -> Result<(), Fault> {
        let module = blk.l.module;
        let func = &module.funcs[self.func as usize];
        let insts: &[Inst] = &func.insts;
        let ops: &[Op] = func.derived.get_or_init(|| lower(func)).expect("internal: a function's lowered instructions");
        let mut others = self.runnable() & !active;
        let (mut wait, mut at_wait) = self.lowest(others);
        let (mut winst, mut lanes_n) = (0u64, 0u64);
        // The group's size, counted again only when the group changes
        // (the build targets no POPCNT instruction).
        let mut n_active = u64::from(active.count_ones());
        let result = loop {
            if pc == wait {
                active |= at_wait;
                n_active = u64::from(active.count_ones());
                others &= !at_wait;
                (wait, at_wait) = self.lowest(others);
            }
            let op = &ops[pc as usize];
            winst += 1;
            lanes_n += n_active;
            if blk.prof {
                if let Some(c) = class(&insts[pc as usize].ins) {
                    blk.counters.mix[c as usize] += 1;
                }
            }
            let exec = match op.guard {
                None => active,
                Some((p, neg)) => self.guard(p, neg) & active,
            };
            // A lowered register instruction: its lane loop, and on.
            if let Some(run) = op.run {
                if exec != 0 {
                    run(self, op, exec);
                }
                pc += 1;
                if pc > wait {
                    self.park(active, pc);
                    break Ok(());
                }
                continue;
            }
            let flow = match op.bra {
                // A branch, as `step` decides it, without the call.
                Some(target) => branch(active, exec, target),
                None => match self.step(blk, &insts[pc as usize], pc, active, exec) {
                    Ok(f) => f,
                    Err(e) => break Err(e),
                },
            };
            match flow {
                Flow::Next(m) => {
                    if m != active {
                        active = m;
                        n_active = u64::from(active.count_ones());
                    }
                    pc += 1;
                }
                Flow::Jump(t) => pc = t,
                Flow::Split(taken, t) => {
                    self.park(taken, t);
                    self.park(active & !taken, pc + 1);
                    // A control instruction split by its guard runs again
                    // for the lanes that execute it: count it once.
                    if t == pc {
                        winst -= 1;
                        lanes_n -= u64::from(taken.count_ones());
                        if blk.prof {
                            if let Some(c) = class(&insts[pc as usize].ins) {
                                blk.counters.mix[c as usize] -= 1;
                            }
                        }
                    }
                    break Ok(());
                }
                Flow::Repick => break Ok(()),
            }
            if pc > wait {
                self.park(active, pc);
                break Ok(());
            }
        };
        blk.counters.warp_instructions += winst;
        blk.counters.thread_instructions += lanes_n;
        result
    }

    /// Enters device function `func` with the lanes `callers`, which
    /// continue at `pc + 1` when they return.
    pub(super) fn call(&mut self, blk: &Block, callee_ix: u32, ret: Option<u32>, args: &[u32], callers: u32, pc: u32) {
        let module = blk.l.module;
        let callee = &module.funcs[callee_ix as usize];
        let mut regs = vec![0u64; callee.nregs * WARP];
        regs[..NSPECIAL as usize * WARP].copy_from_slice(&self.regs[..NSPECIAL as usize * WARP]);
        let mut params = vec![Vec::new(); WARP];
        let mut local_len = [0usize; WARP];
        for l in lanes(callers) {
            let mut p = vec![0u8; callee.param_size as usize];
            for (k, &off) in args.iter().enumerate() {
                let Some(cp) = callee.params.get(k) else { break };
                let (o, s) = (off as usize, cp.size as usize);
                if o + s <= self.params[l].len() {
                    p[cp.offset as usize..cp.offset as usize + s].copy_from_slice(&self.params[l][o..o + s]);
                }
            }
            params[l] = p;
            local_len[l] = self.local[l].len();
            if callee.local_size > 0 {
                let al = callee.local_align as usize;
                let start = local_len[l].div_ceil(al) * al;
                self.local[l].resize(start + callee.local_size as usize, 0);
            }
        }
        self.frames.push(Frame {
            func: self.func,
            regs: std::mem::replace(&mut self.regs, regs),
            pcs: self.pcs,
            mask: self.frame,
            returned: self.returned,
            callers,
            ret_pc: pc + 1,
            ret_off: ret,
            params: std::mem::replace(&mut self.params, params),
            local_len,
        });
        self.func = callee_ix;
        self.frame = callers;
        self.returned = 0;
        self.park(callers, 0);
    }

    /// Leaves the current device function once all its lanes have
    /// returned or exited.
    fn pop_frame(&mut self, blk: &Block) {
        let f = self.frames.pop().expect("internal: a frame to pop");
        let callee = &blk.l.module.funcs[self.func as usize];
        let back = f.callers & !self.done;
        let ret_params = std::mem::replace(&mut self.params, f.params);
        for l in lanes(back) {
            if let (Some(off), Some(r)) = (f.ret_off, &callee.ret) {
                let (o, s) = (off as usize, r.size as usize);
                if o + s <= self.params[l].len() && r.offset as usize + s <= ret_params[l].len() {
                    self.params[l][o..o + s].copy_from_slice(&ret_params[l][r.offset as usize..r.offset as usize + s]);
                }
            }
        }
        for l in lanes(f.callers) {
            self.local[l].truncate(f.local_len[l]);
        }
        self.regs = f.regs;
        self.func = f.func;
        self.pcs = f.pcs;
        self.park(back, f.ret_pc);
        self.frame = f.mask;
        self.returned = f.returned;
    }
}

impl Drop for Worker<'_> {
    fn drop(&mut self) {
        return_regs(self.warps.iter_mut().map(|w| std::mem::take(&mut w.regs)));
    }
}

/// A worker's state: a block's shared memory and shadow, and its warps.
pub(super) struct Worker<'a> {
    pub(super) blk: Block<'a>,
    warps: Vec<Warp>,
    /// Whether the kernel leaves its parameter area as the launch wrote
    /// it (no `st.param`, no calls), so blocks after the first reuse it.
    params_kept: bool,
    /// Whether a block has run here (and set up what later ones keep).
    started: bool,
}

impl<'a> Worker<'a> {
    pub(super) fn new(l: &'a Launch<'a>, prof: bool) -> Worker<'a> {
        let f = &l.module.funcs[l.func];
        let nthreads = (l.block[0] * l.block[1] * l.block[2]) as usize;
        let shared_len = (f.shared_size.div_ceil(16) * 16 + l.dyn_shared) as usize;
        let params_kept = !f.insts.iter().any(|i| matches!(i.ins, Ins::St { sp: Space::Param, .. } | Ins::Call { .. }));
        let blk = Block {
            l,
            ctaid: [0; 3],
            shared: vec![0u8; shared_len],
            shadow: vec![Shadow::default(); if l.racecheck { shared_len } else { 0 }],
            gen: 0,
            last: None,
            counters: Counters::default(),
            params_uniform: params_kept,
            prof,
            fp: Footprint::default(),
        };
        let warps = (0..nthreads.div_ceil(WARP))
            .map(|w| Warp::new((w * WARP) as u32, (nthreads - w * WARP).min(WARP), f))
            .collect();
        Worker { blk, warps, params_kept, started: false }
    }

    /// Runs block number `id` (x fastest, as the hardware numbers them).
    pub(super) fn block(&mut self, id: u64) -> Result<(), Fault> {
        let l = self.blk.l;
        let f = &l.module.funcs[l.func];
        let (gx, gy) = (u64::from(l.grid[0]), u64::from(l.grid[1]));
        let (bx, by, bz) = ((id % gx) as u32, (id / gx % gy) as u32, (id / (gx * gy)) as u32);
        let nwarps = self.warps.len() as u32;
        self.blk.ctaid = [bx, by, bz];
        self.blk.gen += 1;
        self.blk.counters.threads += u64::from(l.block[0] * l.block[1] * l.block[2]);
        self.blk.counters.blocks += 1;
        let (started, params_kept) = (self.started, self.params_kept);
        self.started = true;
        for w in &mut self.warps {
            // A block that faulted inside a device function left the
            // caller's registers in its frames: start from the entry's.
            if let Some(f0) = w.frames.drain(..).next() {
                w.regs = f0.regs;
                w.params = f0.params;
            }
            w.func = l.func as u32;
            w.pcs = [0; WARP];
            w.frame = w.exists;
            w.done = !w.exists;
            w.bar = 0;
            w.coll = 0;
            w.returned = 0;
            w.cc = 0;
            // Only the registers a lane may read before writing need the
            // zeros they start with (`Func::zeroed`); the rest of the file
            // keeps the previous block's values, which nothing reads.
            let first = !started || w.regs.len() != f.nregs * WARP;
            if first {
                w.regs.clear();
                w.regs.resize(f.nregs * WARP, 0);
            } else {
                for &r in &f.zeroed {
                    w.regs[r as usize * WARP..(r as usize + 1) * WARP].fill(0);
                }
            }
            // The special registers are read-only and the parameter area
            // of a kernel that stores to none and calls nothing too: after
            // the first block only the block index changes.
            if !first {
                for l_ in lanes(w.exists) {
                    for (k, v) in [bx, by, bz].into_iter().enumerate() {
                        w.regs[(6 + k) * WARP + l_] = u64::from(v);
                    }
                    if !params_kept {
                        let p = &mut w.params[l_];
                        p.clear();
                        p.extend_from_slice(l.params);
                        p.resize((f.param_size as usize).max(l.params.len()), 0);
                    }
                    if f.local_size > 0 {
                        w.local[l_].clear();
                        w.local[l_].resize(f.local_size as usize, 0);
                    }
                }
                continue;
            }
            for l_ in lanes(w.exists) {
                let t = w.base + l_ as u32;
                let sp = [
                    t % l.block[0],
                    t / l.block[0] % l.block[1],
                    t / (l.block[0] * l.block[1]),
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
                    nwarps,
                    32,
                ];
                for (k, v) in sp.iter().enumerate() {
                    w.regs[k * WARP + l_] = u64::from(*v);
                }
                let p = &mut w.params[l_];
                p.clear();
                p.extend_from_slice(l.params);
                p.resize((f.param_size as usize).max(l.params.len()), 0);
                w.local[l_].clear();
                w.local[l_].resize(f.local_size as usize, 0);
            }
        }
        let r = run_block(&mut self.blk, &mut self.warps);
        if self.blk.prof {
            self.blk.fp.end_block(&mut self.blk.counters);
        }
        r
    }
}

/// Runs a block's warps until all have exited, completing barriers.
fn run_block(blk: &mut Block, warps: &mut [Warp]) -> Result<(), Fault> {
    loop {
        for w in warps.iter_mut() {
            w.run(blk)?;
        }
        if warps.iter().all(|w| w.done == FULL) {
            return Ok(());
        }
        // No lane can move: every live thread should wait at one barrier.
        if let Some(w) = warps.iter().find(|w| w.coll != 0) {
            return Err(stuck_collective(blk, w, warps));
        }
        let mut site: Option<(usize, u32, u32)> = None;
        for w in warps.iter() {
            let live = !w.done;
            let at_bar = w.bar;
            if live & !at_bar != 0 {
                let l = lanes(live & !at_bar).next().expect("internal: a lane");
                return Err(blk.fault(
                    LAUNCH_FAILED,
                    (w.base as usize) + l,
                    "deadlock: this thread is suspended in a caller while the rest of its warp waits at a barrier \
                     inside a device function"
                        .into(),
                ));
            }
            for l in lanes(at_bar) {
                let here = (w.base as usize + l, w.func, w.pcs[l]);
                match site {
                    None => site = Some(here),
                    Some((tid, func, pc)) if (func, pc) != (here.1, here.2) => {
                        let line = |f: u32, p: u32| module_line(blk, f, p);
                        let b = blk.l.block;
                        let o = [tid as u32 % b[0], tid as u32 / b[0] % b[1], tid as u32 / (b[0] * b[1])];
                        return Err(blk.fault(
                            LAUNCH_FAILED,
                            here.0,
                            format!(
                                "barrier error (synccheck): threads wait at different barriers, this thread at \
                                 the barrier at PTX line {} and thread ({}, {}, {}) at the barrier at PTX line {}, \
                                 found in",
                                line(here.1, here.2),
                                o[0],
                                o[1],
                                o[2],
                                line(func, pc)
                            ),
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        for w in warps.iter_mut() {
            for l in lanes(w.bar) {
                w.pcs[l] += 1;
            }
            w.bar = 0;
        }
        blk.gen += 1;
        blk.counters.barriers += 1;
    }
}

fn module_line(blk: &Block, func: u32, pc: u32) -> u32 {
    blk.l.module.funcs[func as usize].insts[pc as usize].line
}

/// The fault of a warp whose lanes wait at a collective that cannot
/// complete: a member lane has exited, or waits somewhere else.
#[cold]
fn stuck_collective(blk: &Block, w: &Warp, warps: &[Warp]) -> Fault {
    let l = lanes(w.coll).next().expect("internal: a parked lane");
    let pc = w.pcs[l];
    let inst = &blk.l.module.funcs[w.func as usize].insts[pc as usize];
    let mask_op = match inst.ins {
        Ins::Shfl { mask, .. } | Ins::Vote { mask, .. } | Ins::WarpSync { mask } => mask,
        _ => Opnd::I(u64::from(FULL)),
    };
    for l in lanes(w.coll) {
        let m = match mask_op {
            Opnd::R(r) => w.regs[r as usize * WARP + l],
            Opnd::I(v) => v,
        } as u32
            & w.exists;
        if let Some(q) = lanes(m & w.done).next() {
            return blk.fault(
                LAUNCH_FAILED,
                w.base as usize + l,
                format!(
                    "a warp collective at PTX line {} names lane {q} in its member mask {m:#010x}, but that lane \
                     has exited",
                    inst.line
                ),
            );
        }
    }
    let elsewhere = warps
        .iter()
        .find_map(|o| lanes(o.bar).next().map(|b| (o.base as usize + b, module_line(blk, o.func, o.pcs[b]))));
    let also = match elsewhere {
        Some((tid, line)) => {
            let b = blk.l.block;
            let t = tid as u32;
            format!(
                " (thread ({}, {}, {}) waits at the barrier at PTX line {line})",
                t % b[0],
                t / b[0] % b[1],
                t / (b[0] * b[1])
            )
        }
        None => String::new(),
    };
    blk.fault(
        LAUNCH_FAILED,
        w.base as usize + l,
        format!(
            "deadlock: a warp collective at PTX line {} waits for lanes of its member mask that have exited or \
             wait at a barrier or another collective{also}",
            inst.line
        ),
    )
}
