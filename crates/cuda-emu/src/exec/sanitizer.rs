//! The sanitizer's checks: every global access against the live
//! allocations, shared and local ones against their sizes, and shared
//! accesses between two barriers against each other (racecheck).

use super::{Block, Fault, ILLEGAL_ADDRESS, LAUNCH_FAILED};
use crate::memory::{first_unwritten, mark_written, LOCAL_WIN, SHARED_WIN, WIN_SIZE};
use crate::ptx::Space;

/// A shared-memory byte's last accesses in the current barrier interval.
#[derive(Clone, Copy, Default)]
pub(crate) struct Shadow {
    pub(super) w_gen: u32,
    pub(super) w_tid: u32,
    pub(super) w_wep: u32,
    pub(super) r_gen: u32,
    pub(super) r_tid: u32,
    pub(super) r_wep: u32,
    /// Readers other than `r_tid` exist: u32::MAX when in several warps,
    /// else their warp.
    pub(super) r_many: u32,
}

pub(super) const NO_MANY: u32 = u32::MAX - 1;

impl<'a> Block<'a> {
    #[cold]
    pub(super) fn fault(&self, code: u32, tid: usize, msg: String) -> Fault {
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

    /// The host address of `len` bytes of global memory at `addr`, after
    /// the memcheck and (when on) initcheck checks.
    #[inline]
    pub(super) fn global(&mut self, tid: usize, addr: u64, len: u64, write: bool) -> Result<*mut u8, Fault> {
        self.global_access(tid, addr, len, !write, write)
    }

    /// As [`Block::global`], for an access that reads (`reads`), writes, or
    /// both (an atomic).
    #[inline]
    pub(super) fn global_access(
        &mut self,
        tid: usize,
        addr: u64,
        len: u64,
        reads: bool,
        writes: bool,
    ) -> Result<*mut u8, Fault> {
        let (b, _, p, w) = match self.last {
            Some(c) if addr >= c.0 && addr.saturating_add(len) <= c.0 + c.1 => c,
            _ => match self.l.mem.find(addr, len) {
                Some(r) => {
                    let c = (r.base, r.len, r.buf.ptr(), r.buf.written());
                    self.last = Some(c);
                    c
                }
                None => {
                    let what = if writes { "write" } else { "read" };
                    let why = self.l.mem.describe(addr, len);
                    return Err(self.fault(
                        ILLEGAL_ADDRESS,
                        tid,
                        format!("invalid __global__ {what} of size {len} at address {addr:#x} ({why})"),
                    ));
                }
            },
        };
        let off = (addr - b) as usize;
        if let Some(w) = w {
            if reads {
                if let Some(k) = first_unwritten(w, off, len as usize) {
                    return Err(self.uninit(tid, addr, len, b + k as u64));
                }
            }
            if writes {
                mark_written(w, off, len as usize);
            }
        }
        // SAFETY: within the region, which the snapshot keeps alive.
        Ok(unsafe { p.add(off) })
    }

    /// The initcheck fault of a read at `addr` whose byte `at` was never written.
    #[cold]
    fn uninit(&self, tid: usize, addr: u64, len: u64, at: u64) -> Fault {
        let r = self.l.mem.find(addr, len).expect("internal: the region was found");
        self.fault(
            LAUNCH_FAILED,
            tid,
            format!(
                "uninitialized __global__ memory read (initcheck) of size {len} at address {addr:#x}: byte {at:#x}, \
                 {} bytes into a {}-byte allocation at {:#x}, was never written since it was allocated (by a \
                 kernel, a copy or a memset)",
                at - r.base,
                r.len,
                r.base
            ),
        )
    }

    /// The host addresses of a warp's global access when every lane's
    /// bytes lie in one live region (the common case of a coalesced
    /// access), checked once for the span of the lanes' addresses; None
    /// sends the caller to the per-lane checks, which report what fails.
    #[inline]
    pub(super) fn warp_global(
        &mut self,
        sp: Space,
        base: &[u64; 32],
        off: i64,
        len: u64,
        exec: u32,
        write: bool,
    ) -> Option<[*mut u8; 32]> {
        if !matches!(sp, Space::Global | Space::Const | Space::Generic) || exec == 0 {
            return None;
        }
        let mut addr = [0u64; 32];
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        for k in 0..32 {
            addr[k] = base[k].wrapping_add(off as u64);
        }
        let full = exec == u32::MAX;
        if full {
            for &a in &addr {
                lo = lo.min(a);
                hi = hi.max(a);
            }
        } else {
            for k in super::warp::lanes(exec) {
                lo = lo.min(addr[k]);
                hi = hi.max(addr[k]);
            }
        }
        // A generic access is a global one when no lane's address falls in
        // the shared or local window (none does when the span misses both).
        if sp == Space::Generic {
            let win = |a: u64| {
                (SHARED_WIN..SHARED_WIN + WIN_SIZE).contains(&a) || (LOCAL_WIN..LOCAL_WIN + WIN_SIZE).contains(&a)
            };
            let span_misses = |w: u64| hi < w || lo >= w + WIN_SIZE;
            if !(span_misses(SHARED_WIN) && span_misses(LOCAL_WIN)) && super::warp::lanes(exec).any(|k| win(addr[k])) {
                return None;
            }
        }
        let end = hi.checked_add(len)?;
        let (b, p, w) = match self.last {
            Some(c) if lo >= c.0 && end <= c.0 + c.1 => (c.0, c.2, c.3),
            _ => {
                let r = self.l.mem.find(lo, end - lo)?;
                let c = (r.base, r.len, r.buf.ptr(), r.buf.written());
                self.last = Some(c);
                (c.0, c.2, c.3)
            }
        };
        if let Some(w) = w {
            if write {
                // A whole warp's lanes side by side in lane order cover
                // the span exactly: one mark for all (the same bits).
                let side_by_side = full && (0..32).all(|k| addr[k] == lo + k as u64 * len);
                if side_by_side {
                    mark_written(w, (lo - b) as usize, (end - lo) as usize);
                } else {
                    for k in super::warp::lanes(exec) {
                        mark_written(w, (addr[k] - b) as usize, len as usize);
                    }
                }
            } else {
                // The span written means every lane's bytes are; else the
                // per-lane path finds the first lane that reads a hole.
                let span = (end - lo) as usize;
                let whole = span <= 64 * len as usize && first_unwritten(w, (lo - b) as usize, span).is_none();
                if !whole {
                    for k in super::warp::lanes(exec) {
                        if first_unwritten(w, (addr[k] - b) as usize, len as usize).is_some() {
                            return None;
                        }
                    }
                }
            }
        }
        let mut out = [std::ptr::null_mut(); 32];
        if full {
            for (o, a) in out.iter_mut().zip(&addr) {
                // SAFETY: within the region, which the snapshot keeps alive.
                *o = unsafe { p.add((a - b) as usize) };
            }
        } else {
            for k in super::warp::lanes(exec) {
                // SAFETY: as above.
                out[k] = unsafe { p.add((addr[k] - b) as usize) };
            }
        }
        Some(out)
    }

    /// The host addresses of a warp's shared-memory access when every
    /// lane's address is a shared one inside the block's shared memory,
    /// after racecheck of each lane in lane order (as the per-lane path
    /// does); Ok(None) sends the caller to the per-lane path, which
    /// reports the lane that falls outside.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn warp_shared(
        &mut self,
        sp: Space,
        base: &[u64; 32],
        off: i64,
        len: u64,
        exec: u32,
        write: bool,
        first_tid: usize,
        wep: u32,
        line: u32,
    ) -> Result<Option<[*mut u8; 32]>, Fault> {
        if !matches!(sp, Space::Shared | Space::Generic) || exec == 0 {
            return Ok(None);
        }
        let mut offs = [0usize; 32];
        for k in super::warp::lanes(exec) {
            let a = base[k].wrapping_add(off as u64);
            let o = match sp {
                Space::Generic if (SHARED_WIN..SHARED_WIN + WIN_SIZE).contains(&a) => a - SHARED_WIN,
                Space::Generic => return Ok(None),
                _ => a,
            };
            if o.saturating_add(len) > self.shared.len() as u64 {
                return Ok(None);
            }
            offs[k] = o as usize;
        }
        if self.l.racecheck {
            for k in super::warp::lanes(exec) {
                self.race(first_tid + k, wep, offs[k], len as usize, write, line)?;
            }
        }
        let mut out = [std::ptr::null_mut(); 32];
        let p = self.shared.as_mut_ptr();
        for k in super::warp::lanes(exec) {
            // SAFETY: bounds checked above.
            out[k] = unsafe { p.add(offs[k]) };
        }
        Ok(Some(out))
    }

    /// Checks and records a shared access of `len` bytes at `off`.
    pub(super) fn race(
        &mut self,
        tid: usize,
        wep: u32,
        off: usize,
        len: usize,
        write: bool,
        line: u32,
    ) -> Result<(), Fault> {
        let me = tid as u32;
        let warp = me / 32;
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
    pub(super) fn resolve(sp: Space, a: u64) -> (Space, u64) {
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
    pub(super) fn ptr(
        &mut self,
        local: &mut [u8],
        params: &mut [u8],
        wep: u32,
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
                    self.race(tid, wep, a as usize, len as usize, write, line)?;
                }
                // SAFETY: bounds checked above.
                Ok(unsafe { self.shared.as_mut_ptr().add(a as usize) })
            }
            Space::Local => {
                if a.saturating_add(len) > local.len() as u64 {
                    return Err(self.fault(
                        ILLEGAL_ADDRESS,
                        tid,
                        format!("invalid __local__ {what} of size {len} at local offset {a:#x} (the thread's stack has {} bytes)", local.len()),
                    ));
                }
                // SAFETY: bounds checked above.
                Ok(unsafe { local.as_mut_ptr().add(a as usize) })
            }
            Space::Param => {
                if a.saturating_add(len) > params.len() as u64 {
                    return Err(self.fault(ILLEGAL_ADDRESS, tid, format!("invalid .param {what} at offset {a:#x}")));
                }
                // SAFETY: bounds checked above.
                Ok(unsafe { params.as_mut_ptr().add(a as usize) })
            }
        }
    }

    /// A pointer for an atomic outside shared memory (which the caller
    /// handles): checked as a write.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn atomic_ptr(
        &mut self,
        local: &mut [u8],
        params: &mut [u8],
        wep: u32,
        tid: usize,
        sp: Space,
        a: u64,
        len: u64,
        line: u32,
    ) -> Result<*mut u8, Fault> {
        match Self::resolve(sp, a) {
            (Space::Global | Space::Const | Space::Generic, a) => self.global_access(tid, a, len, true, true),
            _ => self.ptr(local, params, wep, tid, sp, a, len, true, line),
        }
    }

    /// The bytes at a generic address (global or this lane's local
    /// memory), up to `len` of them, or fewer where the memory ends.
    fn bytes_at(&self, local: &[u8], a: u64, len: usize) -> Vec<u8> {
        match Self::resolve(Space::Generic, a) {
            (Space::Local, off) => local.iter().skip(off as usize).take(len).copied().collect(),
            (Space::Global, a) => match self.l.mem.find(a, 1) {
                Some(r) => {
                    let n = len.min((r.base + r.len - a) as usize);
                    // SAFETY: `n` bytes of the live region from `a`.
                    unsafe { std::slice::from_raw_parts(r.buf.ptr().add((a - r.base) as usize), n) }.to_vec()
                }
                None => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    /// The NUL-terminated string at a generic address.
    pub(super) fn c_string(&self, local: &[u8], a: u64) -> String {
        let b = self.bytes_at(local, a, 4096);
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    }

    /// `printf`'s formatting of the argument buffer at `args`, as the
    /// device lays it out: each argument aligned to its size, floats
    /// promoted to double, strings and pointers as 64-bit addresses.
    pub(super) fn format(&self, local: &[u8], fmt: &str, args: u64) -> String {
        let buf = self.bytes_at(local, args, 1 << 12);
        let mut off = 0usize;
        let mut take = |size: usize| -> u64 {
            off = off.div_ceil(size) * size;
            let mut b = [0u8; 8];
            if let Some(src) = buf.get(off..off + size) {
                b[..size].copy_from_slice(src);
            }
            off += size;
            u64::from_le_bytes(b)
        };
        let mut out = String::new();
        let mut it = fmt.chars().peekable();
        while let Some(c) = it.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let mut spec = String::new();
            while let Some(&n) = it.peek() {
                if "-+ #0123456789.".contains(n) {
                    spec.push(n);
                    it.next();
                } else {
                    break;
                }
            }
            let mut long = 0;
            while matches!(it.peek(), Some('l' | 'h' | 'z' | 'j' | 't')) {
                if it.next() != Some('h') {
                    long += 1;
                }
            }
            let Some(conv) = it.next() else { break };
            let (width, prec) = {
                let body = spec.trim_start_matches(['-', '+', ' ', '#', '0']);
                let mut parts = body.splitn(2, '.');
                (
                    parts.next().and_then(|w| w.parse::<usize>().ok()),
                    parts.next().map(|p| p.parse::<usize>().unwrap_or(0)),
                )
            };
            let left = spec.starts_with('-');
            let zero = spec.starts_with('0') && !left;
            let text = match conv {
                '%' => "%".to_string(),
                'd' | 'i' => {
                    let v = if long > 0 { take(8) as i64 } else { i64::from(take(4) as u32 as i32) };
                    v.to_string()
                }
                'u' => (if long > 0 { take(8) } else { u64::from(take(4) as u32) }).to_string(),
                'x' => format!("{:x}", if long > 0 { take(8) } else { u64::from(take(4) as u32) }),
                'X' => format!("{:X}", if long > 0 { take(8) } else { u64::from(take(4) as u32) }),
                'c' => char::from(take(4) as u8).to_string(),
                'p' => format!("{:#x}", take(8)),
                's' => {
                    let a = take(8);
                    self.c_string(local, a)
                }
                'f' | 'F' => format!("{:.*}", prec.unwrap_or(6), f64::from_bits(take(8))),
                'e' | 'E' => {
                    let s = format!("{:.*e}", prec.unwrap_or(6), f64::from_bits(take(8)));
                    // C writes the exponent with a sign and two digits at least.
                    let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
                    let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
                    let r = format!("{m}e{sign}{digits:0>2}");
                    if conv == 'E' {
                        r.to_uppercase()
                    } else {
                        r
                    }
                }
                'g' | 'G' => format!("{}", f64::from_bits(take(8))),
                other => format!("%{spec}{other}"),
            };
            let w = width.unwrap_or(0);
            if text.len() >= w {
                out.push_str(&text);
            } else if left {
                out.push_str(&format!("{text:<w$}"));
            } else if zero && conv != 's' {
                let (sign, digits) = text.strip_prefix('-').map_or(("", text.as_str()), |d| ("-", d));
                out.push_str(&format!("{sign}{digits:0>width$}", width = w - sign.len()));
            } else {
                out.push_str(&format!("{text:>w$}"));
            }
        }
        out
    }
}
