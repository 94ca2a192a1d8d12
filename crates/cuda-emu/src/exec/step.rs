//! One warp-instruction: the decoded instruction is dispatched once, and
//! its effect is applied to every executing lane of the warp.
//!
//! Register-to-register instructions run as loops over the lanes with the
//! operation chosen outside the loop (the frequent type and operation
//! pairs get loops of their own), memory instructions check each lane's
//! access, and control instructions report what happens to the group's
//! program counter ([`Flow`]).

use super::counters::{self, Access, Class};
use super::numeric::*;
use super::warp::{branch, lanes, Flow, Warp, FULL, WARP};
use super::{Block, Fault, ASSERT, ILLEGAL_ADDRESS, LAUNCH_FAILED, MISALIGNED_ADDRESS};
use crate::memory::SHARED_WIN;
use crate::ptx::*;

/// A control instruction whose guard holds for only part of the group:
/// the lanes that execute it stay at `pc` (and run it as a group of their
/// own), the others go on.
#[inline]
fn guarded(active: u32, exec: u32, pc: u32) -> Option<Flow> {
    if exec == active {
        None
    } else if exec == 0 {
        Some(Flow::Next(active))
    } else {
        Some(Flow::Split(exec, pc))
    }
}

/// The `sz`-byte (1, 2, 4 or 8) little-endian value at `p`, as a fixed
/// size read rather than a copy of a variable length.
///
/// # Safety
/// `p` must be valid for reading `sz` bytes.
#[inline(always)]
unsafe fn read_le(p: *const u8, sz: usize) -> u64 {
    match sz {
        1 => u64::from(*p),
        2 => u64::from(u16::from_le(p.cast::<u16>().read_unaligned())),
        4 => u64::from(u32::from_le(p.cast::<u32>().read_unaligned())),
        _ => u64::from_le(p.cast::<u64>().read_unaligned()),
    }
}

/// Writes the low `sz` bytes (1, 2, 4 or 8) of `v` at `p`, little-endian.
///
/// # Safety
/// `p` must be valid for writing `sz` bytes.
#[inline(always)]
unsafe fn write_le(p: *mut u8, sz: usize, v: u64) {
    match sz {
        1 => *p = v as u8,
        2 => p.cast::<u16>().write_unaligned((v as u16).to_le()),
        4 => p.cast::<u32>().write_unaligned((v as u32).to_le()),
        _ => p.cast::<u64>().write_unaligned(v.to_le()),
    }
}

/// The lane a shuffle of `mode` in lane `j` reads, with the lane operand
/// `b` and the clamp and segment mask `c`, and whether that lane is valid
/// (the PTX ISA's `shfl.sync` pseudocode).
#[inline(always)]
fn shfl_source(mode: ShflMode, j: usize, b: u64, c: u64) -> (i32, bool) {
    let bval = (b & 31) as i32;
    let cv = c as u32;
    let cval = (cv & 31) as i32;
    let segmask = ((cv >> 8) & 31) as i32;
    let lane = j as i32;
    let max_lane = (lane & segmask) | (cval & !segmask);
    let min_lane = lane & segmask;
    match mode {
        ShflMode::Up => (lane - bval, lane - bval >= max_lane),
        ShflMode::Down => (lane + bval, lane + bval <= max_lane),
        ShflMode::Bfly => (lane ^ bval, (lane ^ bval) <= max_lane),
        ShflMode::Idx => {
            let jj = min_lane | (bval & !segmask);
            (jj, jj <= max_lane)
        }
    }
}

impl Warp {
    /// Register `r` of every lane.
    #[inline(always)]
    fn reg(&self, r: u16) -> &[u64] {
        &self.regs[r as usize * WARP..r as usize * WARP + WARP]
    }

    /// Operand `o` of lane `l`.
    #[inline(always)]
    fn rd(&self, o: Opnd, l: usize) -> u64 {
        match o {
            Opnd::R(r) => self.regs[r as usize * WARP + l],
            Opnd::I(v) => v,
        }
    }

    /// Where operand `o` is read: register `r`'s lanes one apart, or the
    /// immediate itself with a stride of 0, so a lane loop reads either
    /// without copying a warp's worth of values first.
    #[inline(always)]
    pub(super) fn src(&self, o: &Opnd) -> (*const u64, usize) {
        match o {
            Opnd::R(r) => (self.regs[*r as usize * WARP..][..WARP].as_ptr(), 1),
            Opnd::I(v) => (v as *const u64, 0),
        }
    }

    /// Operand `o` of every lane.
    #[inline(always)]
    fn vals(&self, o: Opnd) -> [u64; WARP] {
        match o {
            Opnd::R(r) => self.reg(r).try_into().expect("internal: a warp of registers"),
            Opnd::I(v) => [v; WARP],
        }
    }

    /// `d = f(a, b, c)` for the lanes `m`, each lane's operands read before
    /// its result is written (a destination may be an operand).
    #[inline(always)]
    pub(super) fn map3(&mut self, m: u32, d: u16, a: &Opnd, b: &Opnd, c: &Opnd, f: impl Fn(u64, u64, u64) -> u64) {
        let ((pa, sa), (pb, sb), (pc, sc)) = (self.src(a), self.src(b), self.src(c));
        let out = self.regs[d as usize * WARP..][..WARP].as_mut_ptr();
        // SAFETY: each pointer is a register's 32 lanes (stride 1) or one
        // immediate (stride 0) living in the caller's `Inst`; `l < 32`.
        // Reads of lane `l` come before its write, so aliasing is benign.
        unsafe {
            if m == FULL {
                for l in 0..WARP {
                    *out.add(l) = f(*pa.add(l * sa), *pb.add(l * sb), *pc.add(l * sc));
                }
            } else {
                for l in lanes(m) {
                    *out.add(l) = f(*pa.add(l * sa), *pb.add(l * sb), *pc.add(l * sc));
                }
            }
        }
    }

    #[inline(always)]
    pub(super) fn map2(&mut self, m: u32, d: u16, a: &Opnd, b: &Opnd, f: impl Fn(u64, u64) -> u64) {
        self.map3(m, d, a, b, &Opnd::I(0), |x, y, _| f(x, y))
    }

    #[inline(always)]
    pub(super) fn map1(&mut self, m: u32, d: u16, a: &Opnd, f: impl Fn(u64) -> u64) {
        self.map3(m, d, a, &Opnd::I(0), &Opnd::I(0), |x, _, _| f(x))
    }

    /// Executes `inst` at `pc` for the group `active`, of which `exec` are
    /// the lanes whose guard holds.
    pub(super) fn step(
        &mut self,
        blk: &mut Block,
        inst: &Inst,
        pc: u32,
        active: u32,
        exec: u32,
    ) -> Result<Flow, Fault> {
        match inst.ins {
            Ins::Bra { target } => return Ok(branch(active, exec, target)),
            Ins::Ld { .. } | Ins::St { .. } | Ins::Atom { .. } => self.memory(blk, inst, exec)?,
            Ins::Bar => {
                if let Some(f) = guarded(active, exec, pc) {
                    return Ok(f);
                }
                self.bar |= active;
                self.park_at(active, pc);
                return Ok(Flow::Repick);
            }
            Ins::Mma { .. } | Ins::Ldmatrix { .. } => {
                self.tensor(blk, inst, exec)?;
            }
            Ins::WarpSync { .. } | Ins::Shfl { .. } | Ins::Vote { .. } => {
                if let Some(f) = guarded(active, exec, pc) {
                    return Ok(f);
                }
                return self.collective(blk, inst, pc, active);
            }
            Ins::Call { func, ret, ref args } => {
                if let Some(f) = guarded(active, exec, pc) {
                    return Ok(f);
                }
                let callee = &blk.l.module.funcs[func as usize];
                if !callee.defined && matches!(callee.name.as_str(), "__assertfail" | "vprintf") {
                    self.builtin(blk, callee, ret, args, active)?;
                    return Ok(Flow::Next(active));
                }
                if !callee.defined {
                    let l = exec.trailing_zeros() as usize;
                    return Err(blk.fault(
                        LAUNCH_FAILED,
                        self.base as usize + l,
                        format!("call of {} which has no body", callee.name),
                    ));
                }
                self.call(blk, func, ret, args, active, pc);
                return Ok(Flow::Repick);
            }
            Ins::Ret => {
                if let Some(f) = guarded(active, exec, pc) {
                    return Ok(f);
                }
                if self.frames.is_empty() {
                    self.done |= active;
                } else {
                    self.returned |= active;
                }
                return Ok(Flow::Repick);
            }
            Ins::Exit => {
                if let Some(f) = guarded(active, exec, pc) {
                    return Ok(f);
                }
                self.done |= active;
                return Ok(Flow::Repick);
            }
            Ins::Depot { d } => {
                let size = blk.l.module.funcs[self.func as usize].local_size as usize;
                for l in lanes(exec) {
                    self.regs[d as usize * WARP + l] = (self.local[l].len() - size) as u64;
                }
            }
            Ins::Nop => {}
            _ => {
                if exec != 0 {
                    if let Err(m) = self.alu(inst, exec) {
                        return Err(blk.fault(LAUNCH_FAILED, self.base as usize + exec.trailing_zeros() as usize, m));
                    }
                }
            }
        }
        Ok(Flow::Next(active))
    }

    pub(super) fn park_at(&mut self, m: u32, pc: u32) {
        for l in lanes(m) {
            self.pcs[l] = pc;
        }
    }

    /// `shfl.sync`, `vote.sync` or `bar.warp.sync` reached by `active`: it
    /// completes when every lane of each arrived lane's member mask is
    /// here (lanes parked at it earlier included), else the group parks.
    fn collective(&mut self, blk: &mut Block, inst: &Inst, pc: u32, active: u32) -> Result<Flow, Fault> {
        let mut group = active;
        for l in lanes(self.coll & self.frame) {
            if self.pcs[l] == pc {
                group |= 1 << l;
            }
        }
        let mask_op = match inst.ins {
            Ins::Shfl { mask, .. } | Ins::Vote { mask, .. } | Ins::WarpSync { mask } => mask,
            _ => unreachable!("internal: not a collective"),
        };
        // A member mask that is an immediate is the same for every lane:
        // when it names only lanes here, the collective is ready at once.
        let uniform_ready = matches!(mask_op, Opnd::I(v) if v as u32 & self.exists & !group == 0);
        let mut ready = true;
        for l in lanes(if uniform_ready { 0 } else { group }) {
            let m = self.rd(mask_op, l) as u32 & self.exists;
            if m & !group != 0 {
                ready = false;
                if let Some(q) = lanes(m & self.done).next() {
                    return Err(blk.fault(
                        LAUNCH_FAILED,
                        self.base as usize + l,
                        format!(
                            "a warp collective at PTX line {} names lane {q} in its member mask {m:#010x}, but that \
                             lane has exited",
                            inst.line
                        ),
                    ));
                }
            }
        }
        if !ready {
            self.coll |= active;
            self.park_at(active, pc);
            return Ok(Flow::Repick);
        }
        self.coll &= !group;
        match inst.ins {
            Ins::Shfl { mode, d, dp, a, b, c, .. } => {
                // A loop for each mode, the mode a constant in it.
                let (vals, bs, cs) = (self.vals(a), self.vals(b), self.vals(c));
                let out = (d, dp, &vals, &bs, &cs, group);
                match mode {
                    ShflMode::Up => self.shfl_lanes(out, |l, b, c| shfl_source(ShflMode::Up, l, b, c)),
                    ShflMode::Down => self.shfl_lanes(out, |l, b, c| shfl_source(ShflMode::Down, l, b, c)),
                    ShflMode::Bfly => self.shfl_lanes(out, |l, b, c| shfl_source(ShflMode::Bfly, l, b, c)),
                    ShflMode::Idx => self.shfl_lanes(out, |l, b, c| shfl_source(ShflMode::Idx, l, b, c)),
                }
            }
            Ins::Vote { mode, d, a, neg, mask } => {
                let mut ballot = 0u32;
                for j in lanes(group) {
                    if (self.rd(a, j) != 0) != neg {
                        ballot |= 1 << j;
                    }
                }
                for j in lanes(group) {
                    let m = self.rd(mask, j) as u32 & self.exists;
                    self.regs[d as usize * WARP + j] = match mode {
                        VoteMode::Ballot => u64::from(ballot & m),
                        VoteMode::All => u64::from(ballot & m == m),
                        VoteMode::Any => u64::from(ballot & m != 0),
                        VoteMode::Uni => u64::from(ballot & m == m || ballot & m == 0),
                    };
                }
            }
            _ => {}
        }
        self.wep += 1;
        Ok(Flow::Next(group))
    }

    /// A shuffle's results for the lanes `group`: lane `j` reads the value
    /// `vals` holds at the lane `src(j, b[j], c[j])` names when that lane
    /// is valid and in the group, else its own; `dp` gets the validity.
    #[inline(always)]
    #[allow(clippy::type_complexity)]
    fn shfl_lanes(
        &mut self,
        (d, dp, vals, bs, cs, group): (u16, Option<u16>, &[u64; WARP], &[u64; WARP], &[u64; WARP], u32),
        src: impl Fn(usize, u64, u64) -> (i32, bool),
    ) {
        for j in lanes(group) {
            let (jj, p) = src(j, bs[j], cs[j]);
            let s = if p { jj as usize } else { j };
            let v = if s < WARP && group & (1 << s) != 0 { vals[s] } else { vals[j] };
            self.regs[d as usize * WARP + j] = v & 0xffff_ffff;
            if let Some(dp) = dp {
                self.regs[dp as usize * WARP + j] = u64::from(p);
            }
        }
    }

    /// `mma.sync.aligned` or `ldmatrix.sync.aligned`, which the whole warp
    /// executes together (`.aligned`): a warp of fewer than 32 lanes, some
    /// lanes elsewhere (diverged, exited, waiting at a barrier) or a guard
    /// false for some lanes is undefined on the hardware, and a fault here,
    /// as synccheck reports a barrier some threads miss.
    fn tensor(&mut self, blk: &mut Block, inst: &Inst, exec: u32) -> Result<(), Fault> {
        let name = if matches!(inst.ins, Ins::Mma { .. }) { "mma.sync.aligned" } else { "ldmatrix.sync.aligned" };
        if exec != FULL {
            let l = (!exec & self.exists).trailing_zeros().min(exec.trailing_zeros()) as usize;
            return Err(blk.fault(
                LAUNCH_FAILED,
                self.base as usize + l.min(WARP - 1),
                format!(
                    "warp-synchronous error (synccheck): {name} at PTX line {} needs every lane of the warp                      converged, but only lanes {exec:#010x} execute it (the warp's lanes {:#010x} exist)",
                    inst.line, self.exists
                ),
            ));
        }
        match inst.ins {
            Ins::Mma { bf16, d, a, b, c } => {
                self.mma(bf16, d, a, b, c);
                Ok(())
            }
            Ins::Ldmatrix { n, trans, d, addr } => self.ldmatrix(blk, inst.line, n, trans, d, addr),
            _ => unreachable!("internal: not a tensor-core instruction"),
        }
    }

    /// D = A B + C of one m16n8k16 product, gathered from and scattered to
    /// the PTX ISA's fragments (lane l: group g = l / 4, t = l % 4; A's
    /// registers hold rows g, g + 8, g, g + 8 at columns 2t, 2t, 2t + 8,
    /// 2t + 8 (two halves each, the lower column in the low 16 bits); B's
    /// rows 2t and 2t + 8 (two rows each) of column g; C and D rows g, g,
    /// g + 8, g + 8 at columns 2t, 2t + 1, 2t, 2t + 1).
    ///
    /// Accumulation: the ISA leaves the order and the intermediate
    /// precision open. Each product of two f16 or bf16 values is exact in
    /// f64 (at most 22 significant bits, exponents far inside f64's), the
    /// sum runs in f64 from C then k = 0..15, and is rounded once to f32
    /// (to nearest, ties to even). So the result is the exact
    /// `c + sum a_k b_k` rounded to f32, up to the f64 sum's error: at most
    /// `16 * 2^-53 * (|c| + sum |a_k b_k|)` before that rounding. Where every
    /// partial sum is exact in f64 (small integers, say) it is the exact
    /// value rounded once, the most accurate result an f32 D can hold, which
    /// every conforming order reaches too.
    fn mma(&mut self, bf16: bool, d: [u16; 4], a: [u16; 4], b: [u16; 2], c: [u16; 4]) {
        let ty = if bf16 { Ty::Bf16 } else { Ty::F16 };
        let half = |v: u64, k: u32| to_f64(ty, (v >> (16 * k)) & 0xffff);
        let mut am = [[0f64; 16]; 16];
        let mut bm = [[0f64; 8]; 16];
        let mut cm = [[0f64; 8]; 16];
        for l in 0..WARP {
            let (g, t) = (l / 4, l % 4);
            let r = |x: u16| self.regs[x as usize * WARP + l];
            for (k, (row, col)) in
                [(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)].into_iter().enumerate()
            {
                am[row][col] = half(r(a[k]), 0);
                am[row][col + 1] = half(r(a[k]), 1);
            }
            for (k, row) in [2 * t, 2 * t + 8].into_iter().enumerate() {
                bm[row][g] = half(r(b[k]), 0);
                bm[row + 1][g] = half(r(b[k]), 1);
            }
            for (k, (row, col)) in
                [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)].into_iter().enumerate()
            {
                cm[row][col] = f64::from(f32b(r(c[k])));
            }
        }
        let mut dm = [[0f32; 8]; 16];
        for (i, row) in dm.iter_mut().enumerate() {
            for (j, out) in row.iter_mut().enumerate() {
                let mut s = cm[i][j];
                for (k, bk) in bm.iter().enumerate() {
                    s += am[i][k] * bk[j];
                }
                *out = s as f32;
            }
        }
        for l in 0..WARP {
            let (g, t) = (l / 4, l % 4);
            for (k, (row, col)) in
                [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)].into_iter().enumerate()
            {
                self.regs[d[k] as usize * WARP + l] = bf32(dm[row][col]);
            }
        }
    }

    /// `ldmatrix`: lane 8i + r gives the address of row r of matrix i; every
    /// row is 16 bytes of shared memory at a 16-byte aligned address,
    /// checked (bounds, races, alignment) as the read of the lane that
    /// gave it. Lane l receives, for each matrix, elements 2 (l % 4) and
    /// 2 (l % 4) + 1 of row l / 4 (`.trans`: rows 2 (l % 4) and 2 (l % 4) + 1
    /// of column l / 4), the first in the low 16 bits.
    #[allow(clippy::too_many_arguments)]
    fn ldmatrix(
        &mut self,
        blk: &mut Block,
        line: u32,
        n: u8,
        trans: bool,
        d: [u16; 4],
        addr: Addr,
    ) -> Result<(), Fault> {
        let givers = 8 * usize::from(n);
        let mut rows = [[0u16; 8]; 32];
        let mut offs: Vec<(usize, u64)> = Vec::with_capacity(givers);
        for (l, row) in rows.iter_mut().enumerate().take(givers) {
            let a = self.rd(addr.base, l).wrapping_add(addr.off as u64);
            let tid = self.base as usize + l;
            if !a.is_multiple_of(16) {
                return Err(blk.fault(
                    MISALIGNED_ADDRESS,
                    tid,
                    format!("misaligned ldmatrix row address {a:#x} at PTX line {line} (rows are 16-byte aligned)"),
                ));
            }
            let p = self.lane_ptr(blk, l, Space::Shared, a, 16, false, line)?;
            for (k, e) in row.iter_mut().enumerate() {
                // SAFETY: `ptr` checked the row's 16 bytes.
                *e = unsafe { read_le(p.add(2 * k), 2) } as u16;
            }
            offs.push((l, a));
        }
        if blk.prof {
            blk.counters.mix[Class::LdShared as usize] += 1;
            counters::shared(&mut blk.counters, &offs, 16);
        }
        for (i, &di) in d.iter().enumerate().take(usize::from(n)) {
            let m = &rows[8 * i..8 * i + 8];
            for l in 0..WARP {
                let (r, c) = (l / 4, 2 * (l % 4));
                let (lo, hi) = if trans { (m[c][r], m[c + 1][r]) } else { (m[r][c], m[r][c + 1]) };
                self.regs[di as usize * WARP + l] = u64::from(lo) | u64::from(hi) << 16;
            }
        }
        Ok(())
    }

    /// A load, store or atomic of the lanes `exec`.
    fn memory(&mut self, blk: &mut Block, inst: &Inst, exec: u32) -> Result<(), Fault> {
        if blk.prof && exec != 0 {
            self.count_memory(blk, inst, exec);
        }
        match inst.ins {
            Ins::Ld { sp, t, n, d, addr, wide } => {
                let base = self.vals(addr.base);
                let sz = t.size() as usize;
                // PTX extends a signed load to the destination's width.
                let dw: u32 = if wide { 64 } else { 32 };
                let extend = t.signed() && sz * 8 < dw as usize;
                if sp == Space::Param {
                    if let (Opnd::I(base), true) = (addr.base, blk.params_uniform) {
                        return self.ld_param_uniform(
                            blk,
                            base.wrapping_add(addr.off as u64) as usize,
                            t,
                            n,
                            d,
                            wide,
                            exec,
                        );
                    }
                    // Each lane's own parameter area, bounds-checked here.
                    let len = sz * n as usize;
                    for l in lanes(exec) {
                        let a = base[l].wrapping_add(addr.off as u64) as usize;
                        let Some(src) = self.params[l].get(a..a.saturating_add(len)) else {
                            return Err(blk.fault(
                                ILLEGAL_ADDRESS,
                                self.base as usize + l,
                                format!("invalid .param read at offset {a:#x}"),
                            ));
                        };
                        for (k, &dk) in d.iter().enumerate().take(n as usize) {
                            let b = &src[k * sz..(k + 1) * sz];
                            // SAFETY: `b` holds `sz` bytes.
                            let mut v = unsafe { read_le(b.as_ptr(), sz) };
                            if extend {
                                v = (sext(v, bits(t)) as u64) & mask_of(dw);
                            }
                            self.regs[dk as usize * WARP + l] = v;
                        }
                    }
                    return Ok(());
                }
                let len = (sz * n as usize) as u64;
                // The whole warp's access in one global region, or in shared
                // memory (a match here: a helper returning the 32 pointers
                // in a Result cost a copy of them per access).
                let fast = match blk.warp_global(sp, &base, addr.off, len, exec, false) {
                    Some(p) => Some(p),
                    None => {
                        blk.warp_shared(sp, &base, addr.off, len, exec, false, self.base as usize, self.wep, inst.line)?
                    }
                };
                if let Some(p) = fast {
                    if extend {
                        for l in lanes(exec) {
                            for (k, &dk) in d.iter().enumerate().take(n as usize) {
                                // SAFETY: `warp_global` checked every lane's bytes.
                                let v = unsafe { read_le(p[l].add(k * sz), sz) };
                                self.regs[dk as usize * WARP + l] = (sext(v, bits(t)) as u64) & mask_of(dw);
                            }
                        }
                    } else {
                        // SAFETY: `warp_global` or `warp_shared` checked every lane's bytes.
                        unsafe { self.load_lanes(&p, exec, &d[..n as usize], sz) };
                    }
                    return Ok(());
                }
                for l in lanes(exec) {
                    let a = base[l].wrapping_add(addr.off as u64);
                    let p = self.lane_ptr(blk, l, sp, a, len, false, inst.line)?;
                    for (k, &dk) in d.iter().enumerate().take(n as usize) {
                        // SAFETY: `ptr` checked the whole vector's bytes.
                        let mut v = unsafe { read_le(p.add(k * sz), sz) };
                        if extend {
                            v = (sext(v, bits(t)) as u64) & mask_of(dw);
                        }
                        self.regs[dk as usize * WARP + l] = v;
                    }
                }
            }
            Ins::St { sp, t, n, v, addr } => {
                let base = self.vals(addr.base);
                let sz = t.size() as usize;
                let len = (sz * n as usize) as u64;
                // The whole warp's access in one global region, or in shared
                // memory (a match here: a helper returning the 32 pointers
                // in a Result cost a copy of them per access).
                let fast = match blk.warp_global(sp, &base, addr.off, len, exec, true) {
                    Some(p) => Some(p),
                    None => {
                        blk.warp_shared(sp, &base, addr.off, len, exec, true, self.base as usize, self.wep, inst.line)?
                    }
                };
                if let Some(p) = fast {
                    // SAFETY: as for loads.
                    unsafe { self.store_lanes(&p, exec, &v[..n as usize], sz) };
                    return Ok(());
                }
                for l in lanes(exec) {
                    let a = base[l].wrapping_add(addr.off as u64);
                    let p = self.lane_ptr(blk, l, sp, a, len, true, inst.line)?;
                    for (k, o) in v.iter().enumerate().take(n as usize) {
                        // SAFETY: as for loads.
                        unsafe { write_le(p.add(k * sz), sz, self.rd(*o, l)) };
                    }
                }
            }
            Ins::Atom { sp, op, t, n, d, addr, b, c } => {
                // A vector is checked as one access of all its elements.
                let (esz, n) = (u64::from(t.size()), n as usize);
                let sz = esz * n as u64;
                for l in lanes(exec) {
                    let a = self.rd(addr.base, l).wrapping_add(addr.off as u64);
                    let cv = self.rd(c, l);
                    let tid = self.base as usize + l;
                    if !a.is_multiple_of(sz) {
                        return Err(blk.fault(
                            MISALIGNED_ADDRESS,
                            tid,
                            format!("misaligned atomic of size {sz} at address {a:#x}"),
                        ));
                    }
                    // Atomics order their accesses, so racecheck does not see them.
                    let (rsp, _) = Block::resolve(sp, a);
                    let p = if rsp == Space::Shared {
                        let off = a - if sp == Space::Generic { SHARED_WIN } else { 0 };
                        if off.saturating_add(sz) > blk.shared.len() as u64 {
                            return Err(blk.fault(
                                ILLEGAL_ADDRESS,
                                tid,
                                format!("invalid __shared__ atomic at offset {off:#x}"),
                            ));
                        }
                        // SAFETY: bounds checked.
                        unsafe { blk.shared.as_mut_ptr().add(off as usize) }
                    } else {
                        blk.atomic_ptr(&mut self.local[l], &mut self.params[l], self.wep, tid, sp, a, sz, inst.line)?
                    };
                    for (k, bk) in b.iter().enumerate().take(n) {
                        let bv = self.rd(*bk, l);
                        // SAFETY: aligned and in bounds (the whole vector);
                        // other blocks may touch the word concurrently.
                        let old = unsafe { atomic(p.add(k * esz as usize), op, t, bv, cv) };
                        if let Some(d) = d {
                            self.regs[d[k] as usize * WARP + l] = old;
                        }
                    }
                }
            }
            _ => unreachable!("internal: not a memory instruction"),
        }
        Ok(())
    }

    /// The host address of lane `l`'s access of `len` bytes at `a`,
    /// checked as that lane's (its local and parameter memory included).
    #[allow(clippy::too_many_arguments)]
    fn lane_ptr(
        &mut self,
        blk: &mut Block,
        l: usize,
        sp: Space,
        a: u64,
        len: u64,
        write: bool,
        line: u32,
    ) -> Result<*mut u8, Fault> {
        let tid = self.base as usize + l;
        blk.ptr(&mut self.local[l], &mut self.params[l], self.wep, tid, sp, a, len, write, line)
    }

    /// Loads `d.len()` consecutive values of `sz` bytes from each lane's
    /// address `p[l]` of the lanes `exec` into the registers `d`, zero
    /// extended; the sizes of a whole warp's 4- and 8-byte loads are
    /// constants in loops of their own.
    ///
    /// # Safety
    /// Each `p[l]` of `exec` must be valid for reading `d.len() * sz` bytes.
    #[inline]
    unsafe fn load_lanes(&mut self, p: &[*mut u8; WARP], exec: u32, d: &[u16], sz: usize) {
        for (k, &dk) in d.iter().enumerate() {
            let out = &mut self.regs[dk as usize * WARP..][..WARP];
            match (exec, sz) {
                (FULL, 4) => {
                    for (o, q) in out.iter_mut().zip(p) {
                        *o = u64::from(u32::from_le(q.add(k * 4).cast::<u32>().read_unaligned()));
                    }
                }
                (FULL, 8) => {
                    for (o, q) in out.iter_mut().zip(p) {
                        *o = u64::from_le(q.add(k * 8).cast::<u64>().read_unaligned());
                    }
                }
                _ => {
                    for l in lanes(exec) {
                        out[l] = read_le(p[l].add(k * sz), sz);
                    }
                }
            }
        }
    }

    /// Stores the values `v` (`sz` bytes each, consecutive) of each lane
    /// of `exec` at its address `p[l]`, lane by lane in lane order (where
    /// lanes overlap, the highest lane's bytes are the ones left).
    ///
    /// # Safety
    /// Each `p[l]` of `exec` must be valid for writing `v.len() * sz` bytes.
    #[inline]
    unsafe fn store_lanes(&self, p: &[*mut u8; WARP], exec: u32, v: &[Opnd], sz: usize) {
        if exec == FULL && sz == 4 {
            for (l, q) in p.iter().enumerate() {
                for (k, o) in v.iter().enumerate() {
                    q.add(k * 4).cast::<u32>().write_unaligned((self.rd(*o, l) as u32).to_le());
                }
            }
            return;
        }
        for l in lanes(exec) {
            for (k, o) in v.iter().enumerate() {
                write_le(p[l].add(k * sz), sz, self.rd(*o, l));
            }
        }
    }

    /// `ld.param` at the fixed offset `a` when every lane's parameter
    /// area is the launch's (`Block::params_uniform`): read once, for the
    /// first lane (which the per-lane path would check, and report, first),
    /// and broadcast.
    #[allow(clippy::too_many_arguments)]
    fn ld_param_uniform(
        &mut self,
        blk: &Block,
        a: usize,
        t: Ty,
        n: u8,
        d: [u16; 4],
        wide: bool,
        exec: u32,
    ) -> Result<(), Fault> {
        if exec == 0 {
            return Ok(());
        }
        let first = exec.trailing_zeros() as usize;
        let sz = t.size() as usize;
        let dw: u32 = if wide { 64 } else { 32 };
        let extend = t.signed() && sz * 8 < dw as usize;
        let Some(src) = self.params[first].get(a..a.saturating_add(sz * n as usize)) else {
            return Err(blk.fault(
                ILLEGAL_ADDRESS,
                self.base as usize + first,
                format!("invalid .param read at offset {a:#x}"),
            ));
        };
        let mut vals = [0u64; 4];
        for (k, v) in vals.iter_mut().enumerate().take(n as usize) {
            // SAFETY: `src` holds `n` values of `sz` bytes.
            *v = unsafe { read_le(src.as_ptr().add(k * sz), sz) };
            if extend {
                *v = (sext(*v, bits(t)) as u64) & mask_of(dw);
            }
        }
        for (k, &dk) in d.iter().enumerate().take(n as usize) {
            let out = &mut self.regs[dk as usize * WARP..][..WARP];
            if exec == FULL {
                out.fill(vals[k]);
            } else {
                for l in lanes(exec) {
                    out[l] = vals[k];
                }
            }
        }
        Ok(())
    }

    /// The profiler's counters of a load, store or atomic of the lanes
    /// `exec` (not empty): its class by the space each lane's address
    /// falls in, global sectors, shared wavefronts, same-address atomics.
    #[cold]
    fn count_memory(&self, blk: &mut Block, inst: &Inst, exec: u32) {
        let (sp, addr, len, kind) = match inst.ins {
            Ins::Ld { sp, t, n, addr, .. } => (sp, addr, u64::from(t.size()) * u64::from(n), Access::Load),
            Ins::St { sp, t, n, addr, .. } => (sp, addr, u64::from(t.size()) * u64::from(n), Access::Store),
            Ins::Atom { sp, t, n, addr, .. } => (sp, addr, u64::from(t.size()) * u64::from(n), Access::Atomic),
            _ => return,
        };
        let c = &mut blk.counters;
        let load = kind == Access::Load;
        if matches!(sp, Space::Param | Space::Const) {
            c.mix[if sp == Space::Param { Class::LdParam } else { Class::LdConst } as usize] += 1;
            return;
        }
        let (mut global, mut ng) = ([0u64; WARP], 0);
        let mut shared: Vec<(usize, u64)> = Vec::new();
        let mut local = false;
        let mut all = Vec::with_capacity(WARP);
        for l in lanes(exec) {
            let a = self.rd(addr.base, l).wrapping_add(addr.off as u64);
            all.push(a);
            match Block::resolve(sp, a) {
                (Space::Shared, off) => shared.push((l, off)),
                (Space::Local, _) => local = true,
                (_, a) => {
                    global[ng] = a;
                    ng += 1;
                }
            }
        }
        if ng > 0 {
            counters::global(c, &mut blk.fp, kind, &global[..ng], len);
        }
        if kind == Access::Atomic {
            counters::atomic_lanes(c, &mut all);
            return;
        }
        if !shared.is_empty() {
            c.mix[if load { Class::LdShared } else { Class::StShared } as usize] += 1;
            counters::shared(c, &shared, len);
        }
        if local {
            c.mix[if load { Class::LdLocal } else { Class::StLocal } as usize] += 1;
        }
    }

    /// A register-to-register instruction of the lanes `m`; Err for an
    /// operation the interpreter lacks.
    fn alu(&mut self, inst: &Inst, m: u32) -> Result<(), String> {
        match inst.ins {
            Ins::Bin { op, t, ftz, rnd, d, a, b } => self.bin_op(op, t, ftz, rnd, d, a, b, m, inst.line)?,
            Ins::Un { op, t, ftz, d, a } => self.map1(m, d, &a, |x| un(op, t, ftz, x)),
            Ins::Fma { t, rnd, ftz, d, a, b, c } => self.map3(m, d, &a, &b, &c, |x, y, z| fma(t, rnd, ftz, x, y, z)),
            Ins::Mad { t, hi, wide, cc_in, cc_out, d, a, b, c } => {
                for l in lanes(m) {
                    let (x, y, z) = (self.rd(a, l), self.rd(b, l), self.rd(c, l));
                    let mut cc = self.cc >> l & 1 == 1;
                    self.regs[d as usize * WARP + l] = mad(t, hi, wide, cc_in, cc_out, x, y, z, &mut cc);
                    self.cc = self.cc & !(1 << l) | u32::from(cc) << l;
                }
            }
            Ins::Setp { cmp, t, ftz, d, dn, a, b, comb } => {
                let (x, y) = (self.vals(a), self.vals(b));
                let cv = comb.map(|(_, c, _)| self.vals(c));
                for l in lanes(m) {
                    let mut r = setp(cmp, t, ftz, x[l], y[l]);
                    let mut rn = !r;
                    if let (Some((op, _, neg)), Some(cv)) = (comb, &cv) {
                        let c = (cv[l] != 0) != neg;
                        let f = |x: bool| match op {
                            BoolOp::And => x & c,
                            BoolOp::Or => x | c,
                            BoolOp::Xor => x ^ c,
                        };
                        r = f(r);
                        rn = f(rn);
                    }
                    self.regs[d as usize * WARP + l] = u64::from(r);
                    if let Some(dn) = dn {
                        self.regs[dn as usize * WARP + l] = u64::from(rn);
                    }
                }
            }
            Ins::Cvt { dt, st, rnd, sat, ftz, d, a } => self.map1(m, d, &a, |x| cvt(dt, st, rnd, sat, ftz, x)),
            Ins::CvtPack { bf16, rnd, d, a, b } => self.map2(m, d, &a, &b, |x, y| cvt_pack(bf16, rnd, x, y)),
            Ins::Bfi { t, d, a, b, pos, len } => {
                for l in lanes(m) {
                    let v = bfi(t, self.rd(a, l), self.rd(b, l), self.rd(pos, l), self.rd(len, l));
                    self.regs[d as usize * WARP + l] = v;
                }
            }
            Ins::Bfe { t, d, a, pos, len } => self.map3(m, d, &a, &pos, &len, |x, p, n| bfe(t, x, p, n)),
            Ins::Pack { d, n, w, v } => {
                for l in lanes(m) {
                    let mut r = 0u64;
                    for (k, o) in v.iter().enumerate().take(n as usize) {
                        r |= (self.rd(*o, l) & mask_of(u32::from(w))) << (k as u32 * u32::from(w));
                    }
                    self.regs[d as usize * WARP + l] = r;
                }
            }
            Ins::Unpack { d, n, w, a } => {
                for l in lanes(m) {
                    let x = self.rd(a, l);
                    for (k, &dk) in d.iter().enumerate().take(n as usize) {
                        self.regs[dk as usize * WARP + l] = (x >> (k as u32 * u32::from(w))) & mask_of(u32::from(w));
                    }
                }
            }
            // `lower` gives the others (selp, the predicate logic, cvta,
            // prmt) a lane loop in every form, so they never come here.
            _ => return Err(format!("internal: no lane loop for the instruction at PTX line {}", inst.line)),
        }
        Ok(())
    }

    /// `op` of the lanes `m`, the carry flag read and written for the
    /// carry chains; Err for a pair `bin` does not define.
    #[allow(clippy::too_many_arguments)]
    fn bin_op(
        &mut self,
        op: BinOp,
        t: Ty,
        ftz: bool,
        rnd: Rnd,
        d: u16,
        a: Opnd,
        b: Opnd,
        m: u32,
        line: u32,
    ) -> Result<(), String> {
        if matches!(op, BinOp::AddCc { .. } | BinOp::SubCc { .. }) {
            for l in lanes(m) {
                let mut cc = self.cc >> l & 1 == 1;
                let v = bin(op, t, ftz, rnd, self.rd(a, l), self.rd(b, l), &mut cc);
                self.regs[d as usize * WARP + l] = v.unwrap_or(0);
                self.cc = self.cc & !(1 << l) | u32::from(cc) << l;
            }
            return Ok(());
        }
        if bin(op, t, ftz, rnd, 0, 0, &mut false).is_none() {
            return Err(format!("unsupported operation {op:?}.{t:?} at PTX line {line}"));
        }
        self.map2(m, d, &a, &b, |x, y| bin(op, t, ftz, rnd, x, y, &mut false).unwrap_or(0));
        Ok(())
    }

    /// The functions the CUDA runtime provides on the device without a
    /// body in PTX: `__assertfail` (device `assert`) fails the launch with
    /// CUDA_ERROR_ASSERT and the message the hardware prints; `vprintf`
    /// formats its argument buffer and prints it on stderr, lane by lane.
    fn builtin(&mut self, blk: &mut Block, callee: &Func, ret: Option<u32>, args: &[u32], m: u32) -> Result<(), Fault> {
        let arg = |w: &Warp, l: usize, k: usize| -> u64 {
            let (Some(&off), Some(p)) = (args.get(k), callee.params.get(k)) else { return 0 };
            let mut b = [0u8; 8];
            let n = (p.size as usize).min(8);
            if let Some(src) = w.params[l].get(off as usize..off as usize + n) {
                b[..n].copy_from_slice(src);
            }
            u64::from_le_bytes(b)
        };
        for l in lanes(m) {
            let tid = self.base as usize + l;
            if callee.name == "__assertfail" {
                let msg = blk.c_string(&self.local[l], arg(self, l, 0));
                let file = blk.c_string(&self.local[l], arg(self, l, 1));
                let line = arg(self, l, 2) as u32;
                let func = blk.c_string(&self.local[l], arg(self, l, 3));
                let b = blk.l.block;
                let t = [tid as u32 % b[0], tid as u32 / b[0] % b[1], tid as u32 / (b[0] * b[1])];
                let c = blk.ctaid;
                return Err(blk.fault(
                    ASSERT,
                    tid,
                    format!(
                        "{file}:{line}: {func}: block: [{},{},{}], thread: [{},{},{}] Assertion `{msg}` failed, in",
                        c[0], c[1], c[2], t[0], t[1], t[2]
                    ),
                ));
            }
            let fmt = blk.c_string(&self.local[l], arg(self, l, 0));
            let out = blk.format(&self.local[l], &fmt, arg(self, l, 1));
            super::print(&out);
            if let (Some(r), Some(rp)) = (ret, &callee.ret) {
                let n = (rp.size as usize).min(4);
                if let Some(dst) = self.params[l].get_mut(r as usize..r as usize + n) {
                    dst.copy_from_slice(&(out.len() as u32).to_le_bytes()[..n]);
                }
            }
        }
        Ok(())
    }
}
