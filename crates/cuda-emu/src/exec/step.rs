//! One thread's steps: fetch, decode-free dispatch of the decoded
//! instruction, and its effect on registers and memory.

use super::numeric::*;
use super::{Block, Fault, ILLEGAL_ADDRESS, LAUNCH_FAILED, MISALIGNED_ADDRESS};
use crate::memory::{LOCAL_WIN, SHARED_WIN};
use crate::ptx::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum St {
    Run,
    /// Parked at `bar.sync`.
    Bar,
    /// Parked at a warp collective.
    Warp,
    Done,
}

pub(super) struct Frame {
    pub(super) func: u32,
    pub(super) pc: u32,
    pub(super) regs: Vec<u64>,
    pub(super) params: Vec<u8>,
    pub(super) local_len: usize,
    pub(super) ret_off: Option<u32>,
}

pub(super) struct Th {
    pub(super) pc: u32,
    pub(super) func: u32,
    pub(super) regs: Vec<u64>,
    pub(super) params: Vec<u8>,
    pub(super) local: Vec<u8>,
    pub(super) frames: Vec<Frame>,
    pub(super) cc: bool,
    pub(super) st: St,
}

impl<'a> Block<'a> {
    /// Runs thread `tid` until it parks or exits.
    pub(super) fn run(&mut self, th: &mut Th, tid: usize) -> Result<St, Fault> {
        let module = self.l.module;
        let mut insts: &[Inst] = &module.funcs[th.func as usize].insts;
        let mut pc = th.pc as usize;
        let mut count = 0u64;
        let result = loop {
            let inst = &insts[pc];
            count += 1;
            if let Some((p, neg)) = inst.guard {
                if (th.regs[p as usize] != 0) == neg {
                    pc += 1;
                    continue;
                }
            }
            match inst.ins {
                Ins::Bra { target } => {
                    pc = target as usize;
                    continue;
                }
                Ins::Bar => break Ok(St::Bar),
                Ins::WarpSync { .. } | Ins::Shfl { .. } | Ins::Vote { .. } => break Ok(St::Warp),
                Ins::Ld { .. } | Ins::St { .. } | Ins::Atom { .. } => {
                    if let Err(e) = self.memory(th, tid, inst) {
                        break Err(e);
                    }
                }
                Ins::Depot { d } => {
                    th.regs[d as usize] = self.depot_base(th);
                }
                Ins::Call { func, ret, ref args } => {
                    let callee = &module.funcs[func as usize];
                    if !callee.defined {
                        break Err(self.fault(
                            LAUNCH_FAILED,
                            tid,
                            format!("call of {} which has no body", callee.name),
                        ));
                    }
                    let mut params = vec![0u8; callee.param_size as usize];
                    for (k, &off) in args.iter().enumerate() {
                        let Some(p) = callee.params.get(k) else { break };
                        let (o, s) = (off as usize, p.size as usize);
                        if o + s <= th.params.len() {
                            params[p.offset as usize..p.offset as usize + s].copy_from_slice(&th.params[o..o + s]);
                        }
                    }
                    let mut regs = vec![0u64; callee.nregs];
                    regs[..NSPECIAL as usize].copy_from_slice(&th.regs[..NSPECIAL as usize]);
                    let local_len = th.local.len();
                    if callee.local_size > 0 {
                        let al = callee.local_align as usize;
                        let start = local_len.div_ceil(al) * al;
                        th.local.resize(start + callee.local_size as usize, 0);
                    }
                    th.frames.push(Frame {
                        func: th.func,
                        pc: pc as u32 + 1,
                        regs: std::mem::replace(&mut th.regs, regs),
                        params: std::mem::replace(&mut th.params, params),
                        local_len,
                        ret_off: ret,
                    });
                    th.func = func;
                    insts = &callee.insts;
                    pc = 0;
                    continue;
                }
                Ins::Ret => {
                    let Some(f) = th.frames.pop() else { break Ok(St::Done) };
                    let callee = &module.funcs[th.func as usize];
                    let ret_params = std::mem::replace(&mut th.params, f.params);
                    if let (Some(off), Some(r)) = (f.ret_off, &callee.ret) {
                        let (o, s) = (off as usize, r.size as usize);
                        if o + s <= th.params.len() {
                            th.params[o..o + s].copy_from_slice(&ret_params[r.offset as usize..r.offset as usize + s]);
                        }
                    }
                    th.regs = f.regs;
                    th.local.truncate(f.local_len);
                    th.func = f.func;
                    insts = &module.funcs[th.func as usize].insts;
                    pc = f.pc as usize;
                    continue;
                }
                Ins::Exit => break Ok(St::Done),
                Ins::Nop => {}
                _ => {
                    if let Err(m) = alu(th, inst) {
                        break Err(self.fault(LAUNCH_FAILED, tid, m));
                    }
                }
            }
            pc += 1;
        };
        th.pc = pc as u32;
        self.count += count;
        result
    }

    /// The local address of the current frame's depot: the frames' depots
    /// are stacked, each aligned as declared.
    fn depot_base(&self, th: &Th) -> u64 {
        let f = &self.l.module.funcs[th.func as usize];
        let size = f.local_size as usize;
        (th.local.len() - size) as u64
    }

    /// A load, store or atomic of thread `tid`.
    fn memory(&mut self, th: &mut Th, tid: usize, inst: &Inst) -> Result<(), Fault> {
        macro_rules! rd {
            ($o:expr) => {
                match $o {
                    Opnd::R(r) => th.regs[r as usize],
                    Opnd::I(v) => v,
                }
            };
        }
        match inst.ins {
            Ins::Ld { sp, t, n, d, addr, wide } => {
                let a = rd!(addr.base).wrapping_add(addr.off as u64);
                let sz = u64::from(t.size());
                let p = self.ptr(th, tid, sp, a, sz * u64::from(n), false, inst.line)?;
                for (k, &dk) in d.iter().enumerate().take(n as usize) {
                    let mut buf = [0u8; 8];
                    // SAFETY: `ptr` checked the whole vector's bytes.
                    unsafe { std::ptr::copy_nonoverlapping(p.add(k * sz as usize), buf.as_mut_ptr(), sz as usize) };
                    let mut v = u64::from_le_bytes(buf);
                    // PTX extends a signed load to the destination's width.
                    let dw: u64 = if wide { 8 } else { 4 };
                    if t.signed() && sz < dw {
                        v = (sext(v, bits(t)) as u64) & mask_of(dw as u32 * 8);
                    }
                    th.regs[dk as usize] = v;
                }
            }
            Ins::St { sp, t, n, v, addr } => {
                let a = rd!(addr.base).wrapping_add(addr.off as u64);
                let sz = u64::from(t.size());
                let p = self.ptr(th, tid, sp, a, sz * u64::from(n), true, inst.line)?;
                for (k, o) in v.iter().enumerate().take(n as usize) {
                    let bytes = rd!(*o).to_le_bytes();
                    // SAFETY: as for loads.
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.add(k * sz as usize), sz as usize) };
                }
            }
            Ins::Atom { sp, op, t, d, addr, b, c } => {
                let a = rd!(addr.base).wrapping_add(addr.off as u64);
                let (b, c) = (rd!(b), rd!(c));
                let sz = u64::from(t.size());
                if a % sz != 0 {
                    return Err(self.fault(
                        MISALIGNED_ADDRESS,
                        tid,
                        format!("misaligned atomic of size {sz} at address {a:#x}"),
                    ));
                }
                // Atomics order their accesses, so racecheck does not see them.
                let (rsp, _) = Self::resolve(sp, a);
                let p = if rsp == Space::Shared {
                    let off = a - if sp == Space::Generic { SHARED_WIN } else { 0 };
                    if off.saturating_add(sz) > self.shared.len() as u64 {
                        return Err(self.fault(
                            ILLEGAL_ADDRESS,
                            tid,
                            format!("invalid __shared__ atomic at offset {off:#x}"),
                        ));
                    }
                    // SAFETY: bounds checked.
                    unsafe { self.shared.as_mut_ptr().add(off as usize) }
                } else {
                    self.ptr(th, tid, sp, a, sz, true, inst.line)?
                };
                // SAFETY: aligned and in bounds; other blocks may touch the word concurrently.
                let old = unsafe { atomic(p, op, t, b, c) };
                if let Some(d) = d {
                    th.regs[d as usize] = old;
                }
            }
            _ => unreachable!("internal: not a memory instruction"),
        }
        Ok(())
    }
}

/// A register-to-register instruction of one thread; Err for an operation
/// the interpreter lacks.
fn alu(th: &mut Th, inst: &Inst) -> Result<(), String> {
    macro_rules! rd {
        ($o:expr) => {
            match $o {
                Opnd::R(r) => th.regs[r as usize],
                Opnd::I(v) => v,
            }
        };
    }
    match inst.ins {
        Ins::Bin { op, t, ftz, rnd, d, a, b } => {
            let (a, b) = (rd!(a), rd!(b));
            th.regs[d as usize] = bin(op, t, ftz, rnd, a, b, &mut th.cc)
                .ok_or_else(|| format!("unsupported operation {op:?}.{t:?} at PTX line {}", inst.line))?;
        }
        Ins::Un { op, t, ftz, d, a } => {
            let a = rd!(a);
            th.regs[d as usize] = un(op, t, ftz, a);
        }
        Ins::Fma { t, rnd, ftz, d, a, b, c } => {
            let (a, b, c) = (rd!(a), rd!(b), rd!(c));
            th.regs[d as usize] = match t {
                Ty::F32 => {
                    let (x, y, z) = (f32b(a), f32b(b), f32b(c));
                    let (x, y, z) = if ftz { (ftz32(x), ftz32(y), ftz32(z)) } else { (x, y, z) };
                    let r = if matches!(rnd, Rnd::Rn | Rnd::None) {
                        x.mul_add(y, z)
                    } else {
                        let p = f64::from(x) * f64::from(y);
                        let (s, e) = two_sum(p, f64::from(z));
                        round_f32(s, e, rnd)
                    };
                    bf32(if ftz { ftz32(r) } else { r })
                }
                _ => f64b(a).mul_add(f64b(b), f64b(c)).to_bits(),
            };
        }
        Ins::Mad { t, hi, wide, cc_in, cc_out, d, a, b, c } => {
            let (a, b, c) = (rd!(a), rd!(b), rd!(c));
            let w = bits(t);
            let cin = u128::from(cc_in && th.cc);
            let prod: u128 = if t.signed() {
                (i128::from(sext(a, w)) * i128::from(sext(b, w))) as u128
            } else {
                u128::from(a & mask_of(w)) * u128::from(b & mask_of(w))
            };
            let (part, ow) = if wide {
                (prod & u128::from(mask_of(2 * w)), 2 * w)
            } else if hi {
                ((prod >> w) & u128::from(mask_of(w)), w)
            } else {
                (prod & u128::from(mask_of(w)), w)
            };
            let cc = if t.signed() && wide { sext(c, ow) as u128 } else { u128::from(c & mask_of(ow)) };
            let sum = part.wrapping_add(cc).wrapping_add(cin);
            if cc_out {
                th.cc = (sum >> ow) & 1 == 1;
            }
            th.regs[d as usize] = (sum as u64) & mask_of(ow);
        }
        Ins::Setp { cmp, t, ftz, d, dn, a, b, comb } => {
            let (a, b) = (rd!(a), rd!(b));
            let mut r = if t.float() {
                let (x, y) = (to_f64(t, a), to_f64(t, b));
                let (x, y) =
                    if ftz && t == Ty::F32 { (f64::from(ftz32(x as f32)), f64::from(ftz32(y as f32))) } else { (x, y) };
                cmp_f(cmp, x, y)
            } else {
                cmp_i(cmp, t, a, b)
            };
            let mut rn = !r;
            if let Some((op, c, neg)) = comb {
                let c = (rd!(c) != 0) != neg;
                let f = |x: bool| match op {
                    BoolOp::And => x & c,
                    BoolOp::Or => x | c,
                    BoolOp::Xor => x ^ c,
                };
                r = f(r);
                rn = f(rn);
            }
            th.regs[d as usize] = u64::from(r);
            if let Some(dn) = dn {
                th.regs[dn as usize] = u64::from(rn);
            }
        }
        Ins::Selp { t, d, a, b, p } => {
            let v = if rd!(p) != 0 { rd!(a) } else { rd!(b) };
            th.regs[d as usize] = v & mask_of(bits(t));
        }
        Ins::PredBin { op, d, a, b } => {
            let (a, b) = (rd!(a) != 0, rd!(b) != 0);
            th.regs[d as usize] = u64::from(match op {
                BoolOp::And => a & b,
                BoolOp::Or => a | b,
                BoolOp::Xor => a ^ b,
            });
        }
        Ins::PredNot { d, a } => th.regs[d as usize] = u64::from(rd!(a) == 0),
        Ins::Cvt { dt, st, rnd, sat, ftz, d, a } => {
            let a = rd!(a);
            th.regs[d as usize] = cvt(dt, st, rnd, sat, ftz, a);
        }
        Ins::Cvta { to, sp, d, a } => {
            let a = rd!(a);
            let win = match sp {
                Space::Shared => SHARED_WIN,
                Space::Local => LOCAL_WIN,
                _ => 0,
            };
            th.regs[d as usize] = if to { a.wrapping_sub(win) } else { a.wrapping_add(win) };
        }
        Ins::Prmt { d, a, b, c } => {
            let (a, b, c) = (rd!(a) as u32, rd!(b) as u32, rd!(c) as u32);
            let bytes = (u64::from(b) << 32 | u64::from(a)).to_le_bytes();
            let mut r = 0u32;
            for k in 0..4 {
                let sel = (c >> (4 * k)) & 0xf;
                let mut byte = bytes[(sel & 7) as usize];
                if sel & 8 != 0 {
                    byte = if byte & 0x80 != 0 { 0xff } else { 0 };
                }
                r |= u32::from(byte) << (8 * k);
            }
            th.regs[d as usize] = u64::from(r);
        }
        Ins::Bfi { t, d, a, b, pos, len } => {
            let (a, b) = (rd!(a), rd!(b));
            let w = bits(t);
            let (pos, len) = ((rd!(pos) & 0xff) as u32, (rd!(len) & 0xff) as u32);
            let mut r = b;
            for k in 0..len {
                if pos + k >= w {
                    break;
                }
                let bit = (a >> k) & 1;
                r = (r & !(1u64 << (pos + k))) | (bit << (pos + k));
            }
            th.regs[d as usize] = r & mask_of(w);
        }
        Ins::Bfe { t, d, a, pos, len } => {
            let a = rd!(a);
            let w = bits(t);
            let (pos, len) = ((rd!(pos) & 0xff) as u32, (rd!(len) & 0xff) as u32);
            let mut r = 0u64;
            let msb = if pos + len == 0 || pos >= w { 0 } else { (a >> (pos + len - 1).min(w - 1)) & 1 };
            for k in 0..w {
                let bit = if k < len && pos + k < w {
                    (a >> (pos + k)) & 1
                } else if t.signed() {
                    msb
                } else {
                    0
                };
                r |= bit << k;
            }
            th.regs[d as usize] = r & mask_of(w);
        }
        Ins::Pack { d, n, w, v } => {
            let mut r = 0u64;
            for (k, o) in v.iter().enumerate().take(n as usize) {
                r |= (rd!(*o) & mask_of(u32::from(w))) << (k as u32 * u32::from(w));
            }
            th.regs[d as usize] = r;
        }
        Ins::Unpack { d, n, w, a } => {
            let a = rd!(a);
            for (k, &dk) in d.iter().enumerate().take(n as usize) {
                th.regs[dk as usize] = (a >> (k as u32 * u32::from(w))) & mask_of(u32::from(w));
            }
        }
        _ => unreachable!("internal: not a register instruction"),
    }
    Ok(())
}
