//! Cliques whose ranks may live in different processes: the ranks of one
//! `ncclCommInitRank` id meet in a folder named by the id (under
//! `/dev/shm` where the machine has it, so nothing touches a disk;
//! `TAPIR_CUDA_EMU_NCCL_DIR` chooses another), as processes on one machine
//! sharing memory would. Each rank's emulated device memory is its own
//! process's, so a collective is an exchange of files:
//!
//! - joining: rank r writes `rank-r` (the world size and its pid) and waits
//!   until every rank's file is there;
//! - the n-th collective: each rank writes `c<n>-r<rank>` (a line naming
//!   the collective, then its input bytes), waits for every rank's, reads
//!   them all, computes its own output (every rank the same sums in the
//!   same rank order, so every rank gets the same bits), then writes
//!   `d<n>-r<rank>`; whoever sees every rank's `d` file removes the
//!   collective's files;
//! - leaving: `gone-r`; whoever sees every rank gone removes the folder.
//!
//! Every file appears whole (written beside its name, then renamed). A rank
//! waiting for the others fails, naming them, when one of their processes
//! has exited (checked by pid), when a rank aborted with work queued (the
//! `broken` file says why), or after the timeout.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One rank's view of a clique across processes.
pub(crate) struct Shared {
    dir: PathBuf,
    pub(crate) nranks: usize,
    pub(crate) rank: usize,
    /// Each rank's process, to tell a rank that died from a slow one.
    pids: Vec<i32>,
}

/// Where the cliques' folders go.
fn base() -> PathBuf {
    if let Some(d) = std::env::var_os("TAPIR_CUDA_EMU_NCCL_DIR") {
        return PathBuf::from(d);
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// The folder of an id: its bytes that make it unique (the maker's pid, a
/// counter and a clock reading; see `ncclGetUniqueId`), in hex.
fn dir_of(id: &[u8; 128]) -> PathBuf {
    let hex: String = id[8..32].iter().map(|b| format!("{b:02x}")).collect();
    base().join(format!("tapir-emu-nccl-{hex}"))
}

/// Writes `data` as `dir/name`, whole or not at all.
fn put(dir: &Path, name: &str, data: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, dir.join(name))
}

/// Whether the process `pid` has exited.
fn gone(pid: i32) -> bool {
    // SAFETY: signal 0 sends nothing; it only asks whether the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Sleeps a little longer each time: a collective's ranks usually arrive
/// within microseconds of each other, a slow rank may take seconds.
struct Backoff(u32);

impl Backoff {
    fn wait(&mut self) {
        self.0 = (self.0 + 1).min(12);
        if self.0 < 4 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(1 << self.0));
        }
    }
}

impl Shared {
    /// Rank `rank` of `nranks` joins the clique of `id`; returns once every
    /// rank has, or fails naming those that did not come within `timeout`.
    pub(crate) fn join(id: &[u8; 128], nranks: usize, rank: usize, timeout: Duration) -> Result<Shared, String> {
        let dir = dir_of(id);
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        let mine = dir.join(format!("rank-{rank}"));
        if mine.exists() {
            return Err(format!("ncclCommInitRank: rank {rank} joined this id twice"));
        }
        let me = format!("{nranks} {}\n", std::process::id());
        put(&dir, &format!("rank-{rank}"), me.as_bytes())
            .map_err(|e| format!("cannot write {}: {e}", mine.display()))?;
        let start = Instant::now();
        let mut backoff = Backoff(0);
        let mut pids = vec![0; nranks];
        let mut seen = vec![false; nranks];
        loop {
            for (r, pid) in pids.iter_mut().enumerate() {
                if seen[r] {
                    continue;
                }
                let text = match std::fs::read_to_string(dir.join(format!("rank-{r}"))) {
                    Ok(t) => t,
                    Err(e) if e.kind() == ErrorKind::NotFound => continue,
                    Err(e) => return Err(format!("reading rank {r}'s entry in {}: {e}", dir.display())),
                };
                let mut it = text.split_whitespace().map(|w| w.parse::<i64>().unwrap_or(-1));
                let (n, p) = (it.next().unwrap_or(-1), it.next().unwrap_or(-1));
                if n != nranks as i64 {
                    return Err(format!(
                        "ncclCommInitRank: rank {rank} says {nranks} ranks, rank {r} of this id said {n}"
                    ));
                }
                *pid = p as i32;
                seen[r] = true;
            }
            if seen.iter().all(|&s| s) {
                return Ok(Shared { dir, nranks, rank, pids });
            }
            if start.elapsed() >= timeout {
                let missing: Vec<usize> = (0..nranks).filter(|&r| !seen[r]).collect();
                return Err(format!("ncclCommInitRank: ranks {missing:?} of {nranks} never joined within {timeout:?}"));
            }
            backoff.wait();
        }
    }

    /// Why the clique can run nothing more, if a rank said so.
    pub(crate) fn broken(&self) -> Option<String> {
        std::fs::read_to_string(self.dir.join("broken")).ok()
    }

    /// Marks the clique broken (the first reason stays).
    pub(crate) fn break_with(&self, why: &str) {
        if self.broken().is_none() {
            let _ = put(&self.dir, "broken", why.as_bytes());
        }
    }

    /// Collective `seq` (0-based): publishes this rank's `what` and input,
    /// waits for every rank's, and returns them in rank order.
    pub(crate) fn exchange(
        &self,
        seq: u64,
        what: &str,
        input: &[u8],
        timeout: Duration,
    ) -> Result<Vec<(String, Vec<u8>)>, String> {
        if let Some(why) = self.broken() {
            return Err(format!("the communicator is broken: {why}"));
        }
        let mut data = Vec::with_capacity(what.len() + 1 + input.len());
        data.extend_from_slice(what.as_bytes());
        data.push(b'\n');
        data.extend_from_slice(input);
        put(&self.dir, &format!("c{seq}-r{}", self.rank), &data)
            .map_err(|e| format!("cannot write collective {} in {}: {e}", seq + 1, self.dir.display()))?;
        let mut parts: Vec<Option<(String, Vec<u8>)>> = vec![None; self.nranks];
        let start = Instant::now();
        let mut last_check = Instant::now();
        let mut backoff = Backoff(0);
        loop {
            for (r, part) in parts.iter_mut().enumerate() {
                if part.is_some() {
                    continue;
                }
                let bytes = match std::fs::read(self.dir.join(format!("c{seq}-r{r}"))) {
                    Ok(b) => b,
                    Err(e) if e.kind() == ErrorKind::NotFound => continue,
                    Err(e) => return Err(format!("reading rank {r}'s part of collective {}: {e}", seq + 1)),
                };
                let nl = bytes.iter().position(|&b| b == b'\n').unwrap_or(bytes.len());
                let head = String::from_utf8_lossy(&bytes[..nl]).into_owned();
                *part = Some((head, bytes.get(nl + 1..).unwrap_or_default().to_vec()));
            }
            if parts.iter().all(Option::is_some) {
                break;
            }
            let missing: Vec<usize> = (0..self.nranks).filter(|&r| parts[r].is_none()).collect();
            if let Some(why) = self.broken() {
                return Err(format!("the communicator is broken: {why}"));
            }
            if last_check.elapsed() >= Duration::from_millis(50) {
                last_check = Instant::now();
                if let Some(&r) = missing.iter().find(|&&r| gone(self.pids[r])) {
                    let why = format!(
                        "rank {r} (process {}) exited before collective {} ({what}); rank {} waited for it",
                        self.pids[r],
                        seq + 1,
                        self.rank
                    );
                    self.break_with(&why);
                    return Err(why);
                }
            }
            if start.elapsed() >= timeout {
                let why =
                    format!("rank {} waited {timeout:?} at {what} for ranks {missing:?}, which never came", self.rank);
                self.break_with(&why);
                return Err(why);
            }
            backoff.wait();
        }
        // Every part is read: once every rank says so, the files can go.
        let _ = put(&self.dir, &format!("d{seq}-r{}", self.rank), b"");
        if (0..self.nranks).all(|r| self.dir.join(format!("d{seq}-r{r}")).exists()) {
            for r in 0..self.nranks {
                let _ = std::fs::remove_file(self.dir.join(format!("c{seq}-r{r}")));
                let _ = std::fs::remove_file(self.dir.join(format!("d{seq}-r{r}")));
            }
        }
        Ok(parts.into_iter().map(|p| p.expect("internal: every part was read")).collect())
    }
}

/// Leaving: the last rank to leave (counting those whose process exited
/// without a word) removes the clique's folder.
impl Drop for Shared {
    fn drop(&mut self) {
        let _ = put(&self.dir, &format!("gone-{}", self.rank), b"");
        if (0..self.nranks).all(|r| self.dir.join(format!("gone-{r}")).exists() || gone(self.pids[r])) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
