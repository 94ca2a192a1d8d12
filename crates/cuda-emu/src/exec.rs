//! The interpreter: runs one launch of a decoded kernel, block by block.
//!
//! Each thread has its own program counter and registers. A block runs its
//! threads one after another, each until it reaches a barrier, a warp
//! collective (`shfl.sync`, `vote.sync`, `bar.warp.sync`) or its exit; a
//! collective completes once every lane of its member mask has arrived,
//! and `bar.sync` once every live thread of the block has. That is one
//! legal schedule of the hardware's, and it makes every access visible to
//! the sanitizer: global accesses are checked against the live
//! allocations, local and shared ones against their sizes, and shared
//! accesses between two barriers against each other (racecheck).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use half::{bf16, f16};

use crate::memory::{Snapshot, LOCAL_WIN, SHARED_WIN, WIN_SIZE};
use crate::ptx::*;

/// CUDA_ERROR_ILLEGAL_ADDRESS.
pub const ILLEGAL_ADDRESS: u32 = 700;
/// CUDA_ERROR_MISALIGNED_ADDRESS.
pub const MISALIGNED_ADDRESS: u32 = 716;
/// CUDA_ERROR_LAUNCH_FAILED: used for races, deadlocks and traps.
pub const LAUNCH_FAILED: u32 = 719;

/// Why a launch failed: the driver's code and a message naming the
/// kernel, block, thread and address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub code: u32,
    pub message: String,
}

/// One launch.
pub struct Launch<'a> {
    pub module: &'a Module,
    pub func: usize,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dyn_shared: u32,
    /// The kernel's parameter area, laid out as its `.entry` says.
    pub params: &'a [u8],
    pub mem: &'a Snapshot,
    /// Whether shared-memory hazards fail the launch.
    pub racecheck: bool,
    /// Host threads to run blocks on (1: one after another on the caller's).
    pub workers: usize,
}

/// What a launch did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    /// Thread-instructions executed (an instruction counted once per thread).
    pub instructions: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum St {
    Run,
    /// Parked at `bar.sync`.
    Bar,
    /// Parked at a warp collective.
    Warp,
    Done,
}

struct Frame {
    func: u32,
    pc: u32,
    regs: Vec<u64>,
    params: Vec<u8>,
    local_len: usize,
    ret_off: Option<u32>,
}

struct Th {
    pc: u32,
    func: u32,
    regs: Vec<u64>,
    params: Vec<u8>,
    local: Vec<u8>,
    frames: Vec<Frame>,
    cc: bool,
    st: St,
}

/// A shared-memory byte's last accesses in the current barrier interval.
#[derive(Clone, Copy, Default)]
struct Shadow {
    w_gen: u32,
    w_tid: u32,
    w_wep: u32,
    r_gen: u32,
    r_tid: u32,
    r_wep: u32,
    /// Readers other than `r_tid` exist: u32::MAX when in several warps,
    /// else their warp.
    r_many: u32,
}

const NO_MANY: u32 = u32::MAX - 1;

struct Block<'a> {
    l: &'a Launch<'a>,
    ctaid: [u32; 3],
    shared: Vec<u8>,
    shadow: Vec<Shadow>,
    gen: u32,
    wep: Vec<u32>,
    /// The last region hit, to skip the search on the next access.
    last: Option<(u64, u64, *mut u8)>,
    count: u64,
}

fn f32b(v: u64) -> f32 {
    f32::from_bits(v as u32)
}
fn f64b(v: u64) -> f64 {
    f64::from_bits(v)
}
fn bf32(v: f32) -> u64 {
    u64::from(v.to_bits())
}

fn ftz32(x: f32) -> f32 {
    if x.is_subnormal() {
        f32::from_bits(x.to_bits() & 0x8000_0000)
    } else {
        x
    }
}
fn ftz64(x: f64) -> f64 {
    if x.is_subnormal() {
        f64::from_bits(x.to_bits() & (1 << 63))
    } else {
        x
    }
}

/// Width in bits of an integer type (pred counts as 1 byte).
fn bits(t: Ty) -> u32 {
    t.size() * 8
}
fn mask_of(w: u32) -> u64 {
    if w >= 64 {
        u64::MAX
    } else {
        (1u64 << w) - 1
    }
}
/// Sign-extends the low `w` bits.
fn sext(v: u64, w: u32) -> i64 {
    if w >= 64 {
        v as i64
    } else {
        ((v << (64 - w)) as i64) >> (64 - w)
    }
}

/// `$name(x, up)`: the next `$t` after `x` toward +inf (`up`) or -inf.
macro_rules! next_float {
    ($name:ident, $t:ty) => {
        fn $name(x: $t, up: bool) -> $t {
            if x.is_nan() || (x.is_infinite() && (x > 0.0) == up) {
                return x;
            }
            if x == 0.0 {
                let tiny = <$t>::from_bits(1);
                return if up { tiny } else { -tiny };
            }
            let b = x.to_bits();
            let b = if (x > 0.0) == up { b + 1 } else { b - 1 };
            <$t>::from_bits(b)
        }
    };
}
next_float!(next_f32, f32);
next_float!(next_f64, f64);

/// Rounds the exact value `s + e` (an f64 and its error term) to f32 with
/// a directed mode; the nearest mode is the plain cast.
fn round_f32(s: f64, e: f64, rnd: Rnd) -> f32 {
    let r = s as f32;
    if matches!(rnd, Rnd::None | Rnd::Rn) || !r.is_finite() && s.is_nan() {
        return r;
    }
    // The sign of (exact - r), computed without rounding it away.
    let diff = if r.is_infinite() {
        if s.is_infinite() {
            0.0
        } else {
            -f64::from(r.signum())
        }
    } else {
        (s - f64::from(r)) + e
    };
    let want_up = match rnd {
        Rnd::Rp => true,
        Rnd::Rm => false,
        // Toward zero: down when positive.
        _ => r < 0.0 || (r == 0.0 && (s < 0.0 || (s == 0.0 && e < 0.0))),
    };
    if diff > 0.0 && want_up {
        next_f32(r, true)
    } else if diff < 0.0 && !want_up {
        next_f32(r, false)
    } else if r.is_infinite() && diff != 0.0 {
        // Overflowed to infinity though the exact value is finite.
        if (r > 0.0) != want_up {
            next_f32(r, r < 0.0)
        } else {
            r
        }
    } else {
        r
    }
}

/// Rounds `s + e` (exact as a pair) to f64 with a directed mode.
fn round_f64(s: f64, e: f64, rnd: Rnd) -> f64 {
    if matches!(rnd, Rnd::None | Rnd::Rn) || e == 0.0 || !s.is_finite() {
        return s;
    }
    let up = match rnd {
        Rnd::Rp => true,
        Rnd::Rm => false,
        _ => s < 0.0,
    };
    if e > 0.0 && up {
        next_f64(s, true)
    } else if e < 0.0 && !up {
        next_f64(s, false)
    } else {
        s
    }
}

fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    let e = (a - (s - bb)) + (b - bb);
    (s, if s.is_finite() { e } else { 0.0 })
}

fn cmp_f(cmp: Cmp, a: f64, b: f64) -> bool {
    let un = a.is_nan() || b.is_nan();
    match cmp {
        Cmp::Eq => !un && a == b,
        Cmp::Ne => !un && a != b,
        Cmp::Lt => !un && a < b,
        Cmp::Le => !un && a <= b,
        Cmp::Gt => !un && a > b,
        Cmp::Ge => !un && a >= b,
        Cmp::Equ => un || a == b,
        Cmp::Neu => un || a != b,
        Cmp::Ltu => un || a < b,
        Cmp::Leu => un || a <= b,
        Cmp::Gtu => un || a > b,
        Cmp::Geu => un || a >= b,
        Cmp::Num => !un,
        Cmp::Nan => un,
        Cmp::Lo => a < b,
        Cmp::Ls => a <= b,
        Cmp::Hi => a > b,
        Cmp::Hs => a >= b,
    }
}

fn cmp_i(cmp: Cmp, t: Ty, a: u64, b: u64) -> bool {
    let w = bits(t);
    let (ua, ub) = (a & mask_of(w), b & mask_of(w));
    let (sa, sb) = (sext(a, w), sext(b, w));
    let s = t.signed();
    match cmp {
        Cmp::Eq | Cmp::Equ => ua == ub,
        Cmp::Ne | Cmp::Neu => ua != ub,
        Cmp::Lt | Cmp::Ltu => {
            if s {
                sa < sb
            } else {
                ua < ub
            }
        }
        Cmp::Le | Cmp::Leu => {
            if s {
                sa <= sb
            } else {
                ua <= ub
            }
        }
        Cmp::Gt | Cmp::Gtu => {
            if s {
                sa > sb
            } else {
                ua > ub
            }
        }
        Cmp::Ge | Cmp::Geu => {
            if s {
                sa >= sb
            } else {
                ua >= ub
            }
        }
        Cmp::Lo => ua < ub,
        Cmp::Ls => ua <= ub,
        Cmp::Hi => ua > ub,
        Cmp::Hs => ua >= ub,
        Cmp::Num => true,
        Cmp::Nan => false,
    }
}

/// min/max of floats as PTX defines them: a NaN operand yields the other
/// operand, and -0 orders below +0.
fn fminmax(a: f64, b: f64, max: bool) -> f64 {
    if a.is_nan() {
        return b;
    }
    if b.is_nan() {
        return a;
    }
    if a == b {
        // Both zero, maybe of different signs.
        let (x, y) = (a.to_bits(), b.to_bits());
        return f64::from_bits(if max { x & y } else { x | y });
    }
    if (a > b) == max {
        a
    } else {
        b
    }
}

fn fminmax32(a: f32, b: f32, max: bool) -> f32 {
    if a.is_nan() && b.is_nan() {
        return f32::from_bits(0x7fff_ffff);
    }
    fminmax(f64::from(a), f64::from(b), max) as f32
}

/// Reads an f16/bf16/f32/f64 source as f64.
fn to_f64(t: Ty, v: u64) -> f64 {
    match t {
        Ty::F16 => f64::from(f16::from_bits(v as u16).to_f32()),
        Ty::Bf16 => f64::from(bf16::from_bits(v as u16).to_f32()),
        Ty::F32 => f64::from(f32b(v)),
        _ => f64b(v),
    }
}

fn cvt(dt: Ty, st: Ty, rnd: Rnd, sat: bool, ftz: bool, v: u64) -> u64 {
    if st.float() {
        let x = to_f64(st, v);
        let x = if ftz && st == Ty::F32 { f64::from(ftz32(x as f32)) } else { x };
        if dt.float() {
            // Float to float: rounding to an integer (rni/rzi/rmi/rpi),
            // or to the destination's precision (rn/rz/rm/rp).
            let x = match rnd {
                Rnd::Rni => x.round_ties_even(),
                Rnd::Rzi => x.trunc(),
                Rnd::Rmi => x.floor(),
                Rnd::Rpi => x.ceil(),
                _ => x,
            };
            let x = if sat {
                if x.is_nan() {
                    0.0
                } else {
                    x.clamp(0.0, 1.0)
                }
            } else {
                x
            };
            return match dt {
                Ty::F64 => x.to_bits(),
                Ty::F32 => {
                    let r = if st == Ty::F64 { round_f32(x, 0.0, rnd) } else { x as f32 };
                    bf32(if ftz { ftz32(r) } else { r })
                }
                Ty::F16 => u64::from(f16::from_f64(x).to_bits()),
                _ => u64::from(bf16::from_f64(x).to_bits()),
            };
        }
        // Float to integer: round, then saturate; NaN becomes 0.
        let x = match rnd {
            Rnd::Rni | Rnd::Rn => x.round_ties_even(),
            Rnd::Rmi | Rnd::Rm => x.floor(),
            Rnd::Rpi | Rnd::Rp => x.ceil(),
            _ => x.trunc(),
        };
        let w = bits(dt);
        return if dt.signed() {
            let lo = -(2f64.powi(w as i32 - 1));
            let hi = 2f64.powi(w as i32 - 1) - 1.0;
            let r = if x.is_nan() { 0.0 } else { x.clamp(lo, hi) };
            (r as i64 as u64) & mask_of(w)
        } else {
            let hi = 2f64.powi(w as i32) - 1.0;
            let r = if x.is_nan() { 0.0 } else { x.clamp(0.0, hi) };
            (r as u64) & mask_of(w)
        };
    }
    // Integer source.
    let sw = bits(st);
    if dt.float() {
        let x = if st.signed() { sext(v, sw) as f64 } else { (v & mask_of(sw)) as f64 };
        // 64-bit sources may not be exact in f64; casting the integer directly rounds once.
        return match dt {
            Ty::F64 => {
                if st.signed() {
                    (sext(v, sw) as f64).to_bits()
                } else {
                    ((v & mask_of(sw)) as f64).to_bits()
                }
            }
            Ty::F32 => {
                let r = if sw == 64 {
                    if st.signed() {
                        v as i64 as f32
                    } else {
                        v as f32
                    }
                } else {
                    round_f32(x, 0.0, rnd)
                };
                bf32(r)
            }
            Ty::F16 => u64::from(f16::from_f64(x).to_bits()),
            _ => u64::from(bf16::from_f64(x).to_bits()),
        };
    }
    let dw = bits(dt);
    if sat {
        let x: i128 = if st.signed() { i128::from(sext(v, sw)) } else { i128::from(v & mask_of(sw)) };
        let (lo, hi): (i128, i128) =
            if dt.signed() { (-(1i128 << (dw - 1)), (1i128 << (dw - 1)) - 1) } else { (0, (1i128 << dw) - 1) };
        return (x.clamp(lo, hi) as u64) & mask_of(dw);
    }
    let x = if st.signed() { sext(v, sw) as u64 } else { v & mask_of(sw) };
    x & mask_of(dw)
}

impl<'a> Block<'a> {
    #[cold]
    fn fault(&self, code: u32, tid: usize, msg: String) -> Fault {
        let b = self.l.block;
        let t = [tid as u32 % b[0], tid as u32 / b[0] % b[1], tid as u32 / (b[0] * b[1])];
        let f = &self.l.module.funcs[self.l.func];
        Fault {
            code,
            message: format!(
                "{msg}: kernel {}, block ({}, {}, {}), thread ({}, {}, {})",
                f.name, self.ctaid[0], self.ctaid[1], self.ctaid[2], t[0], t[1], t[2]
            ),
        }
    }

    /// The host address of `len` bytes of global memory at `addr`.
    #[inline]
    fn global(&mut self, tid: usize, addr: u64, len: u64, write: bool) -> Result<*mut u8, Fault> {
        if let Some((b, l, p)) = self.last {
            if addr >= b && addr.saturating_add(len) <= b + l {
                // SAFETY: within the region, which the snapshot keeps alive.
                return Ok(unsafe { p.add((addr - b) as usize) });
            }
        }
        match self.l.mem.find(addr, len) {
            Some(r) => {
                self.last = Some((r.base, r.len, r.buf.ptr()));
                // SAFETY: as above.
                Ok(unsafe { r.buf.ptr().add((addr - r.base) as usize) })
            }
            None => {
                let what = if write { "write" } else { "read" };
                let why = self.l.mem.describe(addr, len);
                Err(self.fault(
                    ILLEGAL_ADDRESS,
                    tid,
                    format!("invalid __global__ {what} of size {len} at address {addr:#x} ({why})"),
                ))
            }
        }
    }

    /// Checks and records a shared access of `len` bytes at `off`.
    fn race(&mut self, tid: usize, off: usize, len: usize, write: bool, line: u32) -> Result<(), Fault> {
        let me = tid as u32;
        let warp = me / 32;
        let wep = self.wep[warp as usize];
        let gen = self.gen;
        for k in off..off + len {
            let e = self.shadow[k];
            let ordered = |other: u32, other_wep: u32| other / 32 == warp && other_wep < wep;
            let mut hazard = None;
            if e.w_gen == gen && e.w_tid != me && !ordered(e.w_tid, e.w_wep) {
                hazard = Some((e.w_tid, "write"));
            }
            if write && hazard.is_none() && e.r_gen == gen {
                let single = e.r_tid != me && !ordered(e.r_tid, e.r_wep);
                let many = e.r_many != NO_MANY && (e.r_many != warp || e.r_wep >= wep);
                if single || many {
                    hazard = Some((e.r_tid, "read"));
                }
            }
            if let Some((other, what)) = hazard {
                let b = self.l.block;
                let o = [other % b[0], other / b[0] % b[1], other / (b[0] * b[1])];
                let mine = if write { "write" } else { "read" };
                return Err(self.fault(
                    LAUNCH_FAILED,
                    tid,
                    format!(
                        "shared-memory race (racecheck): a {mine} at shared offset {k:#x} (PTX line {line}) \
                         and a {what} by thread ({}, {}, {}) with no barrier between them, found in",
                        o[0], o[1], o[2]
                    ),
                ));
            }
            let s = &mut self.shadow[k];
            if write {
                s.w_gen = gen;
                s.w_tid = me;
                s.w_wep = wep;
            } else if s.r_gen != gen {
                s.r_gen = gen;
                s.r_tid = me;
                s.r_wep = wep;
                s.r_many = NO_MANY;
            } else if s.r_tid != me {
                s.r_many = if s.r_many == NO_MANY || s.r_many == warp { warp } else { u32::MAX };
                s.r_wep = s.r_wep.max(wep);
            }
        }
        Ok(())
    }

    /// Resolves an address of space `sp` to (space, offset-or-address).
    #[inline]
    fn resolve(sp: Space, a: u64) -> (Space, u64) {
        match sp {
            Space::Generic => {
                if (SHARED_WIN..SHARED_WIN + WIN_SIZE).contains(&a) {
                    (Space::Shared, a - SHARED_WIN)
                } else if (LOCAL_WIN..LOCAL_WIN + WIN_SIZE).contains(&a) {
                    (Space::Local, a - LOCAL_WIN)
                } else {
                    (Space::Global, a)
                }
            }
            Space::Const => (Space::Global, a),
            s => (s, a),
        }
    }

    /// A pointer to `len` bytes of memory for thread `tid`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn ptr(
        &mut self,
        th: &mut Th,
        tid: usize,
        sp: Space,
        a: u64,
        len: u64,
        write: bool,
        line: u32,
    ) -> Result<*mut u8, Fault> {
        let (sp, a) = Self::resolve(sp, a);
        let what = if write { "write" } else { "read" };
        match sp {
            Space::Global | Space::Const | Space::Generic => self.global(tid, a, len, write),
            Space::Shared => {
                if a.saturating_add(len) > self.shared.len() as u64 {
                    return Err(self.fault(
                        ILLEGAL_ADDRESS,
                        tid,
                        format!(
                            "invalid __shared__ {what} of size {len} at shared offset {a:#x} (the block has {} bytes of shared memory)",
                            self.shared.len()
                        ),
                    ));
                }
                if self.l.racecheck {
                    self.race(tid, a as usize, len as usize, write, line)?;
                }
                // SAFETY: bounds checked above.
                Ok(unsafe { self.shared.as_mut_ptr().add(a as usize) })
            }
            Space::Local => {
                if a.saturating_add(len) > th.local.len() as u64 {
                    return Err(self.fault(
                        ILLEGAL_ADDRESS,
                        tid,
                        format!("invalid __local__ {what} of size {len} at local offset {a:#x} (the thread's stack has {} bytes)", th.local.len()),
                    ));
                }
                // SAFETY: bounds checked above.
                Ok(unsafe { th.local.as_mut_ptr().add(a as usize) })
            }
            Space::Param => {
                if a.saturating_add(len) > th.params.len() as u64 {
                    return Err(self.fault(ILLEGAL_ADDRESS, tid, format!("invalid .param {what} at offset {a:#x}")));
                }
                // SAFETY: bounds checked above.
                Ok(unsafe { th.params.as_mut_ptr().add(a as usize) })
            }
        }
    }

    /// Runs thread `tid` until it parks or exits.
    fn run(&mut self, th: &mut Th, tid: usize) -> Result<St, Fault> {
        let module = self.l.module;
        let mut insts: &[Inst] = &module.funcs[th.func as usize].insts;
        let mut pc = th.pc as usize;
        let mut count = 0u64;
        macro_rules! rd {
            ($o:expr) => {
                match $o {
                    Opnd::R(r) => th.regs[r as usize],
                    Opnd::I(v) => v,
                }
            };
        }
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
                Ins::Bin { op, t, ftz, rnd, d, a, b } => {
                    let (a, b) = (rd!(a), rd!(b));
                    th.regs[d as usize] = match self.bin(op, t, ftz, rnd, a, b, &mut th.cc) {
                        Some(v) => v,
                        None => {
                            break Err(self.fault(
                                LAUNCH_FAILED,
                                tid,
                                format!("unsupported operation {op:?}.{t:?} at PTX line {}", inst.line),
                            ))
                        }
                    };
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
                        let (x, y) = if ftz && t == Ty::F32 {
                            (f64::from(ftz32(x as f32)), f64::from(ftz32(y as f32)))
                        } else {
                            (x, y)
                        };
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
                Ins::Ld { sp, t, n, d, addr, wide } => {
                    let a = rd!(addr.base).wrapping_add(addr.off as u64);
                    let sz = u64::from(t.size());
                    let p = match self.ptr(th, tid, sp, a, sz * u64::from(n), false, inst.line) {
                        Ok(p) => p,
                        Err(e) => break Err(e),
                    };
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
                    let p = match self.ptr(th, tid, sp, a, sz * u64::from(n), true, inst.line) {
                        Ok(p) => p,
                        Err(e) => break Err(e),
                    };
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
                        break Err(self.fault(
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
                            break Err(self.fault(
                                ILLEGAL_ADDRESS,
                                tid,
                                format!("invalid __shared__ atomic at offset {off:#x}"),
                            ));
                        }
                        // SAFETY: bounds checked.
                        unsafe { self.shared.as_mut_ptr().add(off as usize) }
                    } else {
                        match self.ptr(th, tid, sp, a, sz, true, inst.line) {
                            Ok(p) => p,
                            Err(e) => break Err(e),
                        }
                    };
                    // SAFETY: aligned and in bounds; other blocks may touch the word concurrently.
                    let old = unsafe { atomic(p, op, t, b, c) };
                    if let Some(d) = d {
                        th.regs[d as usize] = old;
                    }
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
                Ins::Bra { target } => {
                    pc = target as usize;
                    continue;
                }
                Ins::Bar => break Ok(St::Bar),
                Ins::WarpSync { .. } | Ins::Shfl { .. } | Ins::Vote { .. } => break Ok(St::Warp),
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

    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn bin(&self, op: BinOp, t: Ty, ftz: bool, rnd: Rnd, a: u64, b: u64, cc: &mut bool) -> Option<u64> {
        if t.float() {
            return Some(match t {
                Ty::F32 => {
                    let (x, y) = (f32b(a), f32b(b));
                    let (x, y) = if ftz { (ftz32(x), ftz32(y)) } else { (x, y) };
                    let directed = !matches!(rnd, Rnd::Rn | Rnd::None);
                    let r = match op {
                        BinOp::Add if directed => {
                            let (s, e) = two_sum(f64::from(x), f64::from(y));
                            round_f32(s, e, rnd)
                        }
                        BinOp::Sub if directed => {
                            let (s, e) = two_sum(f64::from(x), -f64::from(y));
                            round_f32(s, e, rnd)
                        }
                        BinOp::Mul if directed => round_f32(f64::from(x) * f64::from(y), 0.0, rnd),
                        BinOp::Div if directed => {
                            let q = f64::from(x) / f64::from(y);
                            let r = (-q).mul_add(f64::from(y), f64::from(x));
                            round_f32(q, if y > 0.0 { r } else { -r }, rnd)
                        }
                        BinOp::Add => x + y,
                        BinOp::Sub => x - y,
                        BinOp::Mul => x * y,
                        BinOp::Div => x / y,
                        BinOp::Min => fminmax32(x, y, false),
                        BinOp::Max => fminmax32(x, y, true),
                        _ => return None,
                    };
                    bf32(if ftz { ftz32(r) } else { r })
                }
                Ty::F64 => {
                    let (x, y) = (f64b(a), f64b(b));
                    let directed = !matches!(rnd, Rnd::Rn | Rnd::None);
                    match op {
                        BinOp::Add if directed => {
                            let (s, e) = two_sum(x, y);
                            round_f64(s, e, rnd)
                        }
                        BinOp::Sub if directed => {
                            let (s, e) = two_sum(x, -y);
                            round_f64(s, e, rnd)
                        }
                        BinOp::Mul if directed => {
                            let p = x * y;
                            round_f64(p, x.mul_add(y, -p), rnd)
                        }
                        BinOp::Add => x + y,
                        BinOp::Sub => x - y,
                        BinOp::Mul => x * y,
                        BinOp::Div => x / y,
                        BinOp::Min => {
                            if x.is_nan() && y.is_nan() {
                                f64::from_bits(0x7fff_ffff_ffff_ffff)
                            } else {
                                fminmax(x, y, false)
                            }
                        }
                        BinOp::Max => {
                            if x.is_nan() && y.is_nan() {
                                f64::from_bits(0x7fff_ffff_ffff_ffff)
                            } else {
                                fminmax(x, y, true)
                            }
                        }
                        _ => return None,
                    }
                    .to_bits()
                }
                _ => return None,
            });
        }
        let w = bits(t);
        let m = mask_of(w);
        let (ua, ub) = (a & m, b & m);
        let (sa, sb) = (sext(a, w), sext(b, w));
        let s = t.signed();
        Some(match op {
            BinOp::Add => ua.wrapping_add(ub) & m,
            BinOp::Sub => ua.wrapping_sub(ub) & m,
            BinOp::Mul => ua.wrapping_mul(ub) & m,
            BinOp::MulHi => {
                if s {
                    ((i128::from(sa) * i128::from(sb)) >> w) as u64 & m
                } else {
                    ((u128::from(ua) * u128::from(ub)) >> w) as u64 & m
                }
            }
            BinOp::MulWide => {
                if s {
                    (sa.wrapping_mul(sb) as u64) & mask_of(2 * w)
                } else {
                    ua.wrapping_mul(ub) & mask_of(2 * w)
                }
            }
            // Division by zero has no defined result in PTX; this gives
            // what the hardware does for unsigned (all ones) and -1 / the
            // dividend for signed quotients / remainders.
            BinOp::Div => {
                if ub == 0 {
                    m
                } else if s {
                    (sa.wrapping_div(sb) as u64) & m
                } else {
                    ua / ub
                }
            }
            BinOp::Rem => {
                if ub == 0 {
                    ua
                } else if s {
                    (sa.wrapping_rem(sb) as u64) & m
                } else {
                    ua % ub
                }
            }
            BinOp::Min => {
                if s {
                    (sa.min(sb) as u64) & m
                } else {
                    ua.min(ub)
                }
            }
            BinOp::Max => {
                if s {
                    (sa.max(sb) as u64) & m
                } else {
                    ua.max(ub)
                }
            }
            BinOp::And => ua & ub,
            BinOp::Or => ua | ub,
            BinOp::Xor => ua ^ ub,
            // Shift amounts past the width clamp to the width.
            BinOp::Shl => {
                let n = (b & 0xffff_ffff) as u32;
                if n >= w {
                    0
                } else {
                    (ua << n) & m
                }
            }
            BinOp::Shr => {
                let n = ((b & 0xffff_ffff) as u32).min(w);
                if s {
                    ((sa >> n.min(63)) as u64) & m
                } else if n >= w {
                    0
                } else {
                    ua >> n
                }
            }
            BinOp::AddCc { carry_in, carry_out } => {
                let sum = u128::from(ua) + u128::from(ub) + u128::from(carry_in && *cc);
                if carry_out {
                    *cc = (sum >> w) & 1 == 1;
                }
                (sum as u64) & m
            }
            BinOp::SubCc { carry_in, carry_out } => {
                let bin = u128::from(carry_in && *cc);
                let diff = u128::from(ua).wrapping_sub(u128::from(ub)).wrapping_sub(bin);
                if carry_out {
                    *cc = (diff >> w) & 1 == 1;
                }
                (diff as u64) & m
            }
        })
    }
}

fn un(op: UnOp, t: Ty, ftz: bool, a: u64) -> u64 {
    let w = bits(t);
    let m = mask_of(w);
    match (op, t) {
        (UnOp::Mov, _) => {
            if t == Ty::Pred {
                u64::from(a != 0)
            } else {
                a & m
            }
        }
        (UnOp::Neg, Ty::F32) => a ^ 0x8000_0000,
        (UnOp::Neg, Ty::F64) => a ^ (1 << 63),
        (UnOp::Neg, Ty::F16 | Ty::Bf16) => a ^ 0x8000,
        (UnOp::Neg, _) => a.wrapping_neg() & m,
        (UnOp::Abs, Ty::F32) => a & 0x7fff_ffff,
        (UnOp::Abs, Ty::F64) => a & !(1 << 63),
        (UnOp::Abs, Ty::F16 | Ty::Bf16) => a & 0x7fff,
        (UnOp::Abs, _) => (sext(a, w).wrapping_abs() as u64) & m,
        (UnOp::Not, _) => !a & m,
        (UnOp::Clz, _) => u64::from(((a & m) << (64 - w)).leading_zeros().min(w)),
        (UnOp::Popc, _) => u64::from((a & m).count_ones()),
        (UnOp::Brev, _) => ((a & m).reverse_bits() >> (64 - w)) & m,
        (op, Ty::F32) => {
            let x = f32b(a);
            let x = if ftz { ftz32(x) } else { x };
            let r = match op {
                UnOp::Rcp { .. } => 1.0 / x,
                UnOp::Sqrt { .. } => x.sqrt(),
                UnOp::Rsqrt => 1.0 / x.sqrt(),
                UnOp::Ex2 => x.exp2(),
                UnOp::Lg2 => x.log2(),
                UnOp::Sin => x.sin(),
                UnOp::Cos => x.cos(),
                _ => x,
            };
            bf32(if ftz { ftz32(r) } else { r })
        }
        (op, _) => {
            let x = f64b(a);
            let x = if ftz { ftz64(x) } else { x };
            let r = match op {
                UnOp::Rcp { approx } => {
                    let r = 1.0 / x;
                    if approx {
                        ftz64(r)
                    } else {
                        r
                    }
                }
                UnOp::Sqrt { .. } => x.sqrt(),
                UnOp::Rsqrt => 1.0 / x.sqrt(),
                UnOp::Ex2 => x.exp2(),
                UnOp::Lg2 => x.log2(),
                UnOp::Sin => x.sin(),
                UnOp::Cos => x.cos(),
                _ => x,
            };
            r.to_bits()
        }
    }
}

/// The new value of an atomic read-modify-write on `old` (`t`'s width).
fn rmw(op: AtomOp, t: Ty, old: u64, b: u64, c: u64) -> u64 {
    let w = bits(t);
    let m = mask_of(w);
    let (so, sb) = (sext(old, w), sext(b, w));
    let float = |f: fn(f64, f64) -> f64| -> u64 {
        if t == Ty::F32 {
            u64::from((f(to_f64(t, old), to_f64(t, b)) as f32).to_bits())
        } else {
            f(f64b(old), f64b(b)).to_bits()
        }
    };
    let v = match op {
        AtomOp::Add if t.float() => float(|x, y| x + y),
        AtomOp::Min if t.float() => float(|x, y| fminmax(x, y, false)),
        AtomOp::Max if t.float() => float(|x, y| fminmax(x, y, true)),
        AtomOp::Add => old.wrapping_add(b),
        AtomOp::Min if t.signed() => so.min(sb) as u64,
        AtomOp::Max if t.signed() => so.max(sb) as u64,
        AtomOp::Min => (old & m).min(b & m),
        AtomOp::Max => (old & m).max(b & m),
        AtomOp::And => old & b,
        AtomOp::Or => old | b,
        AtomOp::Xor => old ^ b,
        AtomOp::Exch => b,
        AtomOp::Cas => {
            if old & m == b & m {
                c
            } else {
                old
            }
        }
        AtomOp::Inc => {
            if old & m >= b & m {
                0
            } else {
                old + 1
            }
        }
        AtomOp::Dec => {
            if old & m == 0 || old & m > b & m {
                b
            } else {
                old - 1
            }
        }
    };
    v & m
}

/// Performs an atomic read-modify-write at `p`, returning the old value.
///
/// # Safety
/// `p` must be valid and aligned for the type's size.
unsafe fn atomic(p: *mut u8, op: AtomOp, t: Ty, b: u64, c: u64) -> u64 {
    let f = |old: u64| Some(rmw(op, t, old, b, c));
    match t.size() {
        // SAFETY: the caller guarantees alignment and validity.
        8 => unsafe { AtomicU64::from_ptr(p.cast()) }
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, f)
            .unwrap_or_else(|o| o),
        // SAFETY: as above.
        4 => u64::from(
            unsafe { AtomicU32::from_ptr(p.cast()) }
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| f(u64::from(o)).map(|v| v as u32))
                .unwrap_or_else(|o| o),
        ),
        // The decoder rejects narrower atomics.
        _ => unreachable!("internal: a {}-byte atomic", t.size()),
    }
}

/// A worker's state: a block's shared memory and shadow, and its threads.
struct Worker<'a> {
    blk: Block<'a>,
    threads: Vec<Th>,
}

impl<'a> Worker<'a> {
    fn new(l: &'a Launch<'a>) -> Worker<'a> {
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
    fn block(&mut self, id: u64) -> Result<(), Fault> {
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

/// Runs the whole launch. Blocks are handed out in order from a shared
/// counter to `l.workers` host threads; after a fault no block numbered
/// above it starts, and the fault of the lowest-numbered failing block is
/// returned, so the report does not depend on the number of workers.
pub fn run(l: &Launch) -> Result<Stats, Fault> {
    let nblocks = u64::from(l.grid[0]) * u64::from(l.grid[1]) * u64::from(l.grid[2]);
    let workers = (l.workers.max(1) as u64).min(nblocks).max(1) as usize;
    if workers == 1 {
        let mut w = Worker::new(l);
        for id in 0..nblocks {
            w.block(id)?;
        }
        return Ok(Stats { instructions: w.blk.count });
    }
    let next = AtomicU64::new(0);
    let first_fault = AtomicU64::new(u64::MAX);
    let results: Vec<(u64, Option<(u64, Fault)>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut w = Worker::new(l);
                    loop {
                        let id = next.fetch_add(1, Ordering::Relaxed);
                        if id >= nblocks || id > first_fault.load(Ordering::Relaxed) {
                            return (w.blk.count, None);
                        }
                        if let Err(f) = w.block(id) {
                            first_fault.fetch_min(id, Ordering::Relaxed);
                            return (w.blk.count, Some((id, f)));
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("internal: an interpreter worker panicked")).collect()
    });
    let instructions = results.iter().map(|r| r.0).sum();
    match results.into_iter().filter_map(|r| r.1).min_by_key(|(id, _)| *id) {
        Some((_, f)) => Err(f),
        None => Ok(Stats { instructions }),
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
