//! Stream-order hazards: which operations of different streams touch the
//! same allocation with nothing ordering them.
//!
//! Every operation submitted to a stream gets a vector clock: for each
//! stream, the last of its operations that happens before this one (its
//! own stream's earlier operations, what `cuStreamWaitEvent` and the
//! legacy stream's implicit waits bring in, and everything the host had
//! seen complete when it submitted). Each allocation keeps its last write
//! and the last read of each stream; an access that neither happens after
//! the other stream's write, nor (for a write) after its reads, is a
//! hazard. The check is made when the operation is submitted, so it does
//! not depend on how the workers happened to be scheduled: work that
//! finished by luck, with no event or synchronisation between, is reported
//! all the same.

use super::*;

/// A vector clock: `(stream, sequence number)` pairs, at most one a stream.
#[derive(Clone, Default, Debug)]
pub struct Clock(Vec<(usize, u64)>);

impl Clock {
    /// The last operation of `stream` this clock has seen (0: none).
    pub fn get(&self, stream: usize) -> u64 {
        self.0.iter().find(|e| e.0 == stream).map_or(0, |e| e.1)
    }

    /// Raises the entry of `stream` to `seq`.
    pub fn raise(&mut self, stream: usize, seq: u64) {
        match self.0.iter_mut().find(|e| e.0 == stream) {
            Some(e) => e.1 = e.1.max(seq),
            None => self.0.push((stream, seq)),
        }
    }

    /// Joins `other` into this clock.
    pub fn join(&mut self, other: &Clock) {
        for &(s, q) in &other.0 {
            self.raise(s, q);
        }
    }
}

/// One operation, as a hazard report names it.
#[derive(Clone, Debug)]
pub struct Epoch {
    pub stream: usize,
    pub seq: u64,
    pub what: Arc<str>,
}

impl Epoch {
    /// Whether this operation happens before one with clock `c` on stream `s`.
    fn before(&self, s: usize, c: &Clock) -> bool {
        self.stream == s || c.get(self.stream) >= self.seq
    }
}

/// An allocation's recent accesses.
#[derive(Default)]
struct History {
    len: u64,
    write: Option<Epoch>,
    reads: Vec<Epoch>,
}

/// An access an operation makes: the allocation at `base` (`len` bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub base: u64,
    pub len: u64,
    pub write: bool,
}

/// The accesses of every allocation, and the host's clock.
#[derive(Default)]
pub struct Tracker {
    hist: HashMap<u64, History>,
    /// What the host has seen complete (stream and event synchronisation,
    /// successful queries, blocking copies).
    pub host: Clock,
    /// Hazards reported so far.
    pub reported: u64,
}

fn stream_name(s: usize) -> String {
    match lock(&emu().streams).get(&s) {
        Some(_) => format!("stream {s:#x}"),
        None => match emu().devices.iter().position(|d| d.legacy.get().is_some_and(|l| l.id == s)) {
            Some(d) => format!("the legacy stream of device {d}"),
            None => format!("stream {s:#x} (destroyed)"),
        },
    }
}

impl Tracker {
    /// Checks the accesses `acc` of operation `op` (with clock `c`) against
    /// the history and records them; on a hazard records nothing and
    /// returns the report.
    pub fn access(&mut self, op: &Epoch, c: &Clock, acc: &[Access]) -> Result<(), String> {
        for a in acc {
            let Some(h) = self.hist.get(&a.base) else { continue };
            let verb = if a.write { "writes" } else { "reads" };
            let clash = match h.write.as_ref().filter(|w| !w.before(op.stream, c)) {
                Some(w) => Some(report(op, verb, a, w, "writes")),
                None if a.write => {
                    h.reads.iter().find(|r| !r.before(op.stream, c)).map(|r| report(op, verb, a, r, "reads"))
                }
                None => None,
            };
            if let Some(msg) = clash {
                self.reported += 1;
                return Err(msg);
            }
        }
        for a in acc {
            let h = self.hist.entry(a.base).or_default();
            h.len = a.len;
            if a.write {
                h.write = Some(op.clone());
                h.reads.clear();
            } else {
                h.reads.retain(|r| r.stream != op.stream);
                h.reads.push(op.clone());
            }
        }
        Ok(())
    }
}

/// A hazard's message: `op` makes access `a` (`verb`), which `other` also makes.
fn report(op: &Epoch, verb: &str, a: &Access, other: &Epoch, other_verb: &str) -> String {
    format!(
        "stream-order hazard: {} on {} {verb} the {}-byte allocation at {:#x}, which {} on {} {other_verb} \
             with no event or synchronization ordering the two (cuEventRecord + cuStreamWaitEvent, or a \
             synchronize, between them)",
        op.what,
        stream_name(op.stream),
        a.len,
        a.base,
        other.what,
        stream_name(other.stream)
    )
}

impl Tracker {
    /// Checks a free of the allocation at `base` by an operation with
    /// clock `c` on stream `s` (`usize::MAX`: the host): every earlier
    /// access must happen before it. Forgets the allocation either way.
    pub fn free(&mut self, base: u64, s: usize, c: &Clock, what: &str) -> Result<(), String> {
        let Some(h) = self.hist.remove(&base) else { return Ok(()) };
        let pending = h.write.iter().chain(h.reads.iter()).find(|e| !e.before(s, c));
        match pending {
            None => Ok(()),
            Some(e) => {
                self.reported += 1;
                let on = if s == usize::MAX { String::new() } else { format!(" on {}", stream_name(s)) };
                Err(format!(
                    "stream-order hazard: {what}{on} frees the {}-byte allocation at {base:#x}, which {} on {} \
                     still uses with nothing ordering the free after it (synchronize, or free on that stream)",
                    h.len,
                    e.what,
                    stream_name(e.stream)
                ))
            }
        }
    }
}

/// Which parameters of a kernel hold pointers it reads or writes global
/// memory through: bit `k` for parameter `k`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ParamUse {
    pub read: u64,
    pub write: u64,
}

/// Finds, by following how each register is computed from the
/// parameters (flow-insensitively, to a fixed point), which parameters'
/// values reach the address of a global or generic load, store or atomic.
/// A kernel that calls functions, takes a parameter's address or has more
/// than 64 parameters counts every parameter as read and written.
pub fn param_use(f: &ptx::Func) -> ParamUse {
    use ptx::{Ins, Opnd, Space};
    let all = if f.params.len() >= 64 { u64::MAX } else { (1u64 << f.params.len()) - 1 };
    let everything = ParamUse { read: all, write: all };
    if f.params.len() > 64 || f.insts.iter().any(|i| matches!(i.ins, Ins::Call { .. })) {
        return everything;
    }
    let mut taint = vec![0u64; f.nregs.max(1)];
    let of = |t: &[u64], o: &Opnd| match *o {
        Opnd::R(r) => t.get(r as usize).copied().unwrap_or(0),
        Opnd::I(_) => 0,
    };
    let param_at = |off: u64| -> u64 {
        f.params
            .iter()
            .position(|p| off >= u64::from(p.offset) && off < u64::from(p.offset + p.size.max(1)))
            .map_or(0, |k| 1 << k)
    };
    let memory = |sp: Space| matches!(sp, Space::Global | Space::Generic);
    let mut uses = ParamUse::default();
    loop {
        let mut changed = false;
        let mut set = |t: &mut Vec<u64>, d: u16, v: u64| {
            if let Some(x) = t.get_mut(d as usize) {
                if *x | v != *x {
                    *x |= v;
                    changed = true;
                }
            }
        };
        for inst in &f.insts {
            match &inst.ins {
                Ins::Bin { d, a, b, .. } => {
                    let v = of(&taint, a) | of(&taint, b);
                    set(&mut taint, *d, v);
                }
                Ins::Un { d, a, .. } | Ins::Cvt { d, a, .. } | Ins::Cvta { d, a, .. } => {
                    let v = of(&taint, a);
                    set(&mut taint, *d, v);
                }
                Ins::Fma { d, a, b, c, .. }
                | Ins::Mad { d, a, b, c, .. }
                | Ins::Prmt { d, a, b, c }
                | Ins::Lop3 { d, a, b, c, .. } => {
                    let v = of(&taint, a) | of(&taint, b) | of(&taint, c);
                    set(&mut taint, *d, v);
                }
                Ins::Selp { d, a, b, .. } => {
                    let v = of(&taint, a) | of(&taint, b);
                    set(&mut taint, *d, v);
                }
                Ins::Bfi { d, a, b, .. } => {
                    let v = of(&taint, a) | of(&taint, b);
                    set(&mut taint, *d, v);
                }
                Ins::Bfe { d, a, .. } => {
                    let v = of(&taint, a);
                    set(&mut taint, *d, v);
                }
                Ins::Shfl { d, a, .. } => {
                    let v = of(&taint, a);
                    set(&mut taint, *d, v);
                }
                Ins::Pack { d, n, v: src, .. } => {
                    let v = src.iter().take(*n as usize).fold(0, |acc, o| acc | of(&taint, o));
                    set(&mut taint, *d, v);
                }
                Ins::Unpack { d, n, a, .. } => {
                    let v = of(&taint, a);
                    for r in d.iter().take(*n as usize) {
                        set(&mut taint, *r, v);
                    }
                }
                Ins::Ld { sp: Space::Param, d, n, addr, .. } => {
                    let v = match addr.base {
                        Opnd::I(b) => param_at(b.wrapping_add(addr.off as u64)),
                        // A parameter's address taken: any of them.
                        Opnd::R(_) => return everything,
                    };
                    for r in d.iter().take(*n as usize) {
                        set(&mut taint, *r, v);
                    }
                }
                Ins::Ld { sp, addr, .. } if memory(*sp) => uses.read |= of(&taint, &addr.base),
                Ins::St { sp, addr, .. } if memory(*sp) => uses.write |= of(&taint, &addr.base),
                Ins::Atom { sp, addr, .. } if memory(*sp) => {
                    let v = of(&taint, &addr.base);
                    uses.read |= v;
                    uses.write |= v;
                }
                _ => {}
            }
        }
        if !changed {
            break;
        }
    }
    uses
}
