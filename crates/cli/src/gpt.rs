//! `tapir gpt`: trains a character-level mini-GPT natively in Rust.
//!
//! The built-in task needs no download: sums of two random 2-digit numbers
//! written as text (`37+48=85`). Every pair is enumerated, a seeded share
//! is held out, and the model is scored by exact match of its greedy
//! answer after `=` on the held-out pairs it never saw. With `--data` it
//! trains on any text file instead (next-character prediction).
//!
//! Each step's graph lives inside one `Graph::scope`, so the live bytes at
//! every step boundary after the first (when the optimizer allocates its
//! moments) must be identical; the command checks and reports it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use tapir::nn::dist::{Communicator, DataParallel, DdpOptions, ReduceOp};
use tapir::nn::{checkpoint, Adam, Gpt, GptConfig, GradScaler, Optimizer, ParamStore, Precision, Schedule};
use tapir::prelude::*;

use crate::chart::{self, Panel, Series};
use crate::device::DeviceArg;

/// Arguments of `tapir gpt`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Train on this text file (character-level) instead of the built-in sums.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Digits of each addend in the built-in task (1 to 3).
    #[arg(long, default_value_t = 2)]
    pub digits: u32,
    /// Share of the sums held out for testing.
    #[arg(long, default_value_t = 0.1)]
    pub test_fraction: f64,
    /// Training steps (in total, counting those of a resumed checkpoint).
    #[arg(long, default_value_t = 2000)]
    pub steps: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Seed of the initialisation, the data split and the batches.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Width of the residual stream.
    #[arg(long, default_value_t = 64)]
    pub d_model: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Context length in characters (the sums need 3 * digits + 3).
    #[arg(long, default_value_t = 16)]
    pub block: usize,
    /// Dropout probability.
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f64,
    /// Use a separate output head instead of tying it to the token embedding.
    #[arg(long)]
    pub untied: bool,
    /// Peak learning rate (AdamW).
    #[arg(long, default_value_t = 3e-3)]
    pub lr: f64,
    /// Decoupled weight decay (not applied to norms and biases).
    #[arg(long, default_value_t = 0.1)]
    pub weight_decay: f64,
    /// Linear warm-up steps before the cosine decay.
    #[arg(long, default_value_t = 100)]
    pub warmup: usize,
    /// Clip gradients to this global norm (0 disables).
    #[arg(long, default_value_t = 1.0)]
    pub clip: f64,
    /// Evaluate held-out accuracy every this many steps (0: only at the end).
    #[arg(long, default_value_t = 250)]
    pub eval_every: usize,
    /// Write a PNG chart of loss and live memory per step here.
    #[arg(long, default_value = "gpt.png")]
    pub chart: PathBuf,
    /// Do not write the chart.
    #[arg(long)]
    pub no_chart: bool,
    /// Save a checkpoint (safetensors: parameters, AdamW state, config) here.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Also save every this many steps (0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub save_every: usize,
    /// Resume from a checkpoint; its model shape overrides the shape flags.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Stop after this many steps of this invocation (the schedule still
    /// spans --steps): a long run in parts, continued with --resume.
    #[arg(long)]
    pub stop_after: Option<usize>,
    /// After training, print this many samples: held-out sums with the
    /// model's answers, or characters of generated text with --data.
    #[arg(long)]
    pub sample: Option<usize>,
    /// Text to start the generated sample from (--data).
    #[arg(long, default_value = "")]
    pub prompt: String,
    /// Sampling temperature for generated text (0: greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Activation checkpointing: keep only each transformer block's input
    /// between the forward and the backward, and recompute the block's
    /// activations in the backward (torch.utils.checkpoint per block):
    /// fewer live bytes for about one more forward of compute.
    #[arg(long)]
    pub checkpoint: bool,
    /// Mixed precision: f32 (off), bf16, or f16 (with a dynamic loss
    /// scaler that skips steps whose gradients overflow). The parameters
    /// and the optimizer stay in f32; the layers' products run in the
    /// low dtype, norms, softmax, residuals and the loss in f32.
    #[arg(long, default_value = "f32")]
    pub precision: String,
    /// The f16 loss scaler's starting scale (PyTorch's init_scale,
    /// 65,536 by default); a step whose scaled gradients overflow is
    /// skipped and the scale halved.
    #[arg(long)]
    pub loss_scale: Option<f64>,
    /// Attention as its composition (a matmul for the scores, the causal
    /// softmax, a matmul with the values: [B, heads, T, T] scores and
    /// probabilities kept for the backward) instead of the fused op that
    /// holds nothing quadratic in T; a baseline for memory comparisons.
    #[arg(long)]
    pub composed_attention: bool,
    /// Where to train: cpu, cuda, cuda:N, or auto (CUDA when present, else
    /// the CPU). Memory figures are that device's.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
    /// Data parallelism: `mpi` trains on every rank of `mpirun -np N tapir
    /// gpt --dist mpi` (a build with `--features mpi`). Each rank takes its
    /// --batch sequences of every global batch of N x --batch, so N ranks
    /// follow the one-rank run with N times the batch; gradients are
    /// averaged in buckets during the backward, rank 0 prints, evaluates
    /// and saves. With `--device cuda:N` each rank drives GPU N + its rank
    /// on the node (mod the GPUs there) and reduces with NCCL, whose id
    /// rank 0 sends over MPI.
    #[arg(long, value_enum, default_value_t = Dist::None)]
    pub dist: Dist,
    /// Data parallelism over several CUDA devices of this process, e.g.
    /// `cuda:0,cuda:1`: one thread and one NCCL communicator per device
    /// (a build with the `nccl` feature, on by default; NCCL is found at
    /// run time). Each device takes its --batch sequences of every global
    /// batch of N x --batch, as the ranks of `--dist mpi` do; rank 0
    /// (the first device) prints, evaluates and saves. Replaces --device.
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<DeviceArg>,
    /// Write the run's figures (losses, live bytes, throughput, ranks) as
    /// JSON here (rank 0's file, with every rank's throughput).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// How `tapir gpt` and `tapir pinn` spread their training over processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Dist {
    /// One process.
    #[default]
    None,
    /// The ranks of the MPI job this process belongs to.
    Mpi,
}

/// Every rank's line on stderr after a `--dist` run: `what` (may be empty),
/// then its time in the all-reduces against its training time. One write,
/// so the ranks' lines do not cut into each other.
pub(crate) fn rank_report(rank: usize, world: usize, what: &str, allreduce_s: f64, train_s: f64) {
    let line = format!(
        "rank {rank} of {world}: {what}all-reduce {allreduce_s:.3} s of {train_s:.3} s training ({:.0}%)\n",
        100.0 * allreduce_s / train_s.max(1e-9)
    );
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
}

/// The communicator of `--dist` and the device this rank trains on, with
/// the name of the transport. Under `--dist mpi` a CUDA `--device cuda:N`
/// is the first GPU of each node: a rank drives `cuda:(N + its local rank)
/// mod count` and reduces on it with NCCL (the id sent over MPI), when
/// tapir has NCCL; the CPU's ranks reduce over MPI.
pub(crate) fn communicator(dist: Dist, device: DeviceArg) -> anyhow::Result<(Communicator, Device, &'static str)> {
    match (dist, device) {
        (Dist::None, _) => Ok((Communicator::single(), device.pick()?, "")),
        #[cfg(all(feature = "mpi", feature = "nccl"))]
        (Dist::Mpi, DeviceArg::Cuda(first)) => {
            // The driver's reason, when CUDA cannot be used at all.
            device.pick()?;
            let (comm, device) =
                Communicator::mpi_nccl(first).context("--dist mpi on CUDA: joining the ranks over NCCL")?;
            Ok((comm, device, "NCCL, its id over MPI"))
        }
        #[cfg(feature = "mpi")]
        (Dist::Mpi, _) => Ok((Communicator::mpi()?, device.pick()?, "MPI")),
        #[cfg(not(feature = "mpi"))]
        (Dist::Mpi, _) => bail!(
            "--dist mpi: this tapir was built without MPI; build it with `cargo build --release -p tapir-cli \
             --features mpi` (Open MPI and libclang from the system packages: apt-get install openmpi-bin \
             libopenmpi-dev libclang-dev) and start it with `mpirun -np N target/release/tapir gpt --dist mpi` \
             (or `pinn ... --dist mpi`)"
        ),
    }
}

impl Default for Args {
    fn default() -> Self {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrap {
            #[command(flatten)]
            args: Args,
        }
        Wrap::parse_from(["gpt"]).args
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Steps run in this invocation.
    pub steps_run: usize,
    /// Loss of each step run.
    pub losses: Vec<f32>,
    /// Live bytes after each step (the first step allocates the optimizer's
    /// moments, so every entry must be equal).
    pub live: Vec<usize>,
    /// Peak bytes during each step.
    pub peak: Vec<usize>,
    /// True when live bytes were identical at every step boundary from the
    /// first step the optimizer took (which allocates its moments; an f16
    /// step skipped before it allocates nothing).
    pub memory_flat: bool,
    /// The index in [`Summary::live`] of that first step.
    pub flat_from: usize,
    /// Held-out exact-match accuracy at the end (sums only).
    pub accuracy: Option<f64>,
    /// (step, accuracy) of each evaluation.
    pub evals: Vec<(usize, f64)>,
    /// Mean cross-entropy of the answer characters of the held-out sums
    /// (teacher-forced, in f32) at the end (sums only).
    pub held_out_loss: Option<f64>,
    /// (step, held-out loss) of each evaluation.
    pub held_out_losses: Vec<(usize, f64)>,
    /// The f16 loss scaler's scale after each step (empty without one).
    pub scales: Vec<f64>,
    /// Steps skipped because their scaled gradients overflowed (f16).
    pub skipped: Vec<usize>,
    /// Seconds of the whole run (evaluations and checkpoints included).
    pub wall_s: f64,
    /// Seconds of the training steps alone: batches, forward, backward and
    /// the optimizer, without evaluations or checkpoints.
    pub train_s: f64,
    /// Seconds of the held-out evaluations.
    pub eval_s: f64,
    /// Seconds until held-out accuracy first reached 95%, if it did.
    pub time_to_95: Option<f64>,
    /// Training tokens per second of training time ([`Summary::train_s`]).
    pub tokens_per_s: f64,
    /// Samples printed with --sample.
    pub samples: Vec<String>,
    /// This process's rank and the number of ranks (0 and 1 alone).
    pub rank: usize,
    /// Ranks training together.
    pub world: usize,
    /// Seconds this rank spent in the gradients' all-reduces.
    pub allreduce_s: f64,
    /// Every rank's training tokens per second, by rank.
    pub rank_tokens_per_s: Vec<f64>,
    /// What carries the ranks' collectives: "MPI" or "NCCL" (empty alone).
    pub transport: &'static str,
    /// With --devices, every rank's (tokens/s, all-reduce s, training s),
    /// by rank: the ranks are threads of this process.
    pub threads: Vec<(f64, f64, f64)>,
}

/// A character vocabulary.
#[derive(Debug, Clone)]
struct Vocab {
    chars: Vec<char>,
}

impl Vocab {
    fn new(chars: Vec<char>) -> Self {
        Vocab { chars }
    }
    fn id(&self, c: char) -> Option<usize> {
        self.chars.iter().position(|&d| d == c)
    }
    fn encode(&self, s: &str) -> anyhow::Result<Vec<i64>> {
        s.chars()
            .map(|c| self.id(c).map(|i| i as i64).with_context(|| format!("character {c:?} is not in the vocabulary")))
            .collect()
    }
    fn decode(&self, ids: &[i64]) -> String {
        ids.iter().map(|&i| self.chars.get(i as usize).copied().unwrap_or('?')).collect()
    }
}

const SUM_CHARS: &str = "0123456789+=\n";
const END: char = '\n';

/// The sums task: every pair of `digits`-digit numbers, split into train and test.
struct Sums {
    digits: u32,
    vocab: Vocab,
    train: Vec<(u32, u32)>,
    test: Vec<(u32, u32)>,
}

impl Sums {
    fn new(digits: u32, test_fraction: f64, seed: u64) -> anyhow::Result<Self> {
        if !(1..=3).contains(&digits) {
            bail!("--digits must be 1, 2 or 3");
        }
        if !(0.0..1.0).contains(&test_fraction) {
            bail!("--test-fraction must be in [0, 1)");
        }
        let lo = if digits == 1 { 0 } else { 10u32.pow(digits - 1) };
        let hi = 10u32.pow(digits);
        let mut pairs: Vec<(u32, u32)> = (lo..hi).flat_map(|a| (lo..hi).map(move |b| (a, b))).collect();
        // Fisher-Yates with the run's seed: the split is part of the run.
        let mut rng = Rng::new(seed ^ 0x5u64.rotate_left(60));
        for i in (1..pairs.len()).rev() {
            pairs.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let n_test = ((pairs.len() as f64) * test_fraction).round() as usize;
        let train = pairs.split_off(n_test);
        Ok(Sums { digits, vocab: Vocab::new(SUM_CHARS.chars().collect()), train, test: pairs })
    }
    /// Characters of the prompt `a+b=`.
    fn prompt_len(&self) -> usize {
        2 * self.digits as usize + 2
    }
    /// Characters of the longest full line `a+b=c\n`.
    fn line_len(&self) -> usize {
        self.prompt_len() + self.digits as usize + 2
    }
    fn line(&self, a: u32, b: u32) -> String {
        let w = self.digits as usize;
        format!("{a:0w$}+{b:0w$}={}{END}", a + b)
    }
    /// Inputs and targets `[n, line_len - 1]`: targets are the answer and
    /// the end mark; the prompt and the padding after the end are ignored.
    fn batch(&self, rng: &mut Rng, n: usize) -> anyhow::Result<(Tensor, Tensor)> {
        let pairs: Vec<(u32, u32)> = (0..n).map(|_| self.train[rng.below(self.train.len() as u64) as usize]).collect();
        self.rows(&pairs)
    }
    /// Inputs and targets of these sums, as [`Sums::batch`] makes them.
    fn rows(&self, pairs: &[(u32, u32)]) -> anyhow::Result<(Tensor, Tensor)> {
        let (n, t) = (pairs.len(), self.line_len() - 1);
        let (mut xs, mut ys) = (Vec::with_capacity(n * t), Vec::with_capacity(n * t));
        for &(a, b) in pairs {
            let mut ids = self.vocab.encode(&self.line(a, b))?;
            let answer_end = ids.len() - 1; // index of the end mark
            ids.resize(t + 1, self.vocab.id(END).expect("internal: end mark") as i64);
            xs.extend_from_slice(&ids[..t]);
            for (i, &y) in ids[1..].iter().enumerate() {
                let target = i + 1;
                ys.push(if target >= self.prompt_len() && target <= answer_end { y } else { -100 });
            }
        }
        Ok((Tensor::from_vec(xs, [n, t])?, Tensor::from_vec(ys, [n, t])?))
    }
}

/// A text file as character ids.
struct Text {
    vocab: Vocab,
    ids: Vec<i64>,
}

impl Text {
    fn load(path: &Path) -> anyhow::Result<Self> {
        let s = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut chars: Vec<char> = s.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        let vocab = Vocab::new(chars);
        let ids = vocab.encode(&s)?;
        if ids.len() < 2 {
            bail!("{} holds fewer than two characters", path.display());
        }
        Ok(Text { vocab, ids })
    }
    /// Random windows: inputs and next-character targets `[n, t]`.
    fn batch(&self, rng: &mut Rng, n: usize, t: usize) -> anyhow::Result<(Tensor, Tensor)> {
        let t = t.min(self.ids.len() - 1);
        let (mut xs, mut ys) = (Vec::with_capacity(n * t), Vec::with_capacity(n * t));
        for _ in 0..n {
            let s = rng.below((self.ids.len() - t) as u64) as usize;
            xs.extend_from_slice(&self.ids[s..s + t]);
            ys.extend_from_slice(&self.ids[s + 1..s + t + 1]);
        }
        Ok((Tensor::from_vec(xs, [n, t])?, Tensor::from_vec(ys, [n, t])?))
    }
}

enum Task {
    Sums(Sums),
    Text(Text),
}

impl Task {
    fn vocab(&self) -> &Vocab {
        match self {
            Task::Sums(s) => &s.vocab,
            Task::Text(t) => &t.vocab,
        }
    }
}

/// Greedy answers of the model to `a+b=` for each pair, in one batch per
/// generated character (every prompt has the same length).
fn answers(model: &Gpt, store: &ParamStore, sums: &Sums, pairs: &[(u32, u32)]) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::with_capacity(pairs.len());
    for chunk in pairs.chunks(1024) {
        let n = chunk.len();
        let mut rows: Vec<Vec<i64>> = chunk
            .iter()
            .map(|&(a, b)| {
                let line = sums.line(a, b);
                sums.vocab.encode(&line[..sums.prompt_len()])
            })
            .collect::<anyhow::Result<_>>()?;
        for _ in 0..sums.digits + 2 {
            let t = rows[0].len();
            let ids = Tensor::from_vec(rows.concat(), [n, t])?;
            let next = greedy_next(model, store, &ids)?;
            for (r, c) in rows.iter_mut().zip(next) {
                r.push(c);
            }
        }
        for r in rows {
            let s = sums.vocab.decode(&r[sums.prompt_len()..]);
            out.push(s.split(END).next().unwrap_or("").to_string());
        }
    }
    Ok(out)
}

/// The logits of the last position of each row of `ids` `[n, t]`, as `[n, vocab]`.
fn last_logits(model: &Gpt, store: &ParamStore, ids: &Tensor) -> Result<Tensor> {
    Graph::scope(|g| {
        let p = store.bind(g);
        let (n, t) = (ids.dims()[0], ids.dims()[1]);
        let ids = ids.to_device(store.device()?)?;
        let h = model.hidden(&p, &ids, None)?;
        let last = h.narrow(1, t - 1, 1)?.reshape([n, model.cfg.d_model])?;
        last.linear(&model.head_weight(&p)?, None)?.value()
    })
}

fn greedy_next(model: &Gpt, store: &ParamStore, ids: &Tensor) -> Result<Vec<i64>> {
    last_logits(model, store, ids)?.argmax(-1, false)?.to_vec::<i64>()
}

/// Held-out exact-match accuracy.
fn accuracy(model: &Gpt, store: &ParamStore, sums: &Sums) -> anyhow::Result<f64> {
    if sums.test.is_empty() {
        return Ok(f64::NAN);
    }
    let got = answers(model, store, sums, &sums.test)?;
    let right = sums.test.iter().zip(&got).filter(|(&(a, b), g)| (a + b).to_string() == **g).count();
    Ok(right as f64 / sums.test.len() as f64)
}

/// Mean cross-entropy of the answers (and end marks) of the held-out sums,
/// teacher-forced, in f32: the training loss's measure on data never
/// trained on.
fn held_out_loss(model: &Gpt, store: &ParamStore, sums: &Sums) -> anyhow::Result<f64> {
    if sums.test.is_empty() {
        return Ok(f64::NAN);
    }
    let device = store.device()?;
    let (mut total, mut count) = (0.0, 0usize);
    for chunk in sums.test.chunks(1024) {
        let (x, y) = sums.rows(chunk)?;
        let (x, y) = (x.to_device(device)?, y.to_device(device)?);
        let loss = Graph::scope(|g| model.loss(&store.bind(g), &x, &y, None)?.item())?;
        // Every sum of a chunk has the same number of counted targets
        // only when the answers have the same length: weight by them.
        let counted = y.to_vec::<i64>()?.iter().filter(|&&v| v != -100).count();
        total += loss * counted as f64;
        count += counted;
    }
    Ok(total / count.max(1) as f64)
}

/// `prompt` followed by `n` generated characters.
fn generate(
    model: &Gpt,
    store: &ParamStore,
    vocab: &Vocab,
    prompt: &str,
    n: usize,
    temperature: f64,
    rng: &mut Rng,
) -> anyhow::Result<String> {
    let mut ids = if prompt.is_empty() { vec![0] } else { vocab.encode(prompt)? };
    // The prompt is printed with its continuation; an empty prompt starts
    // from the first character of the vocabulary, which is not printed.
    let start = if prompt.is_empty() { 1 } else { 0 };
    for _ in 0..n {
        let ctx = &ids[ids.len().saturating_sub(model.cfg.block_size)..];
        let logits = last_logits(model, store, &Tensor::from_vec(ctx.to_vec(), [1, ctx.len()])?)?.to_vec_f64();
        let next = if temperature <= 0.0 {
            logits.iter().enumerate().fold((0, f64::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0
        } else {
            let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = logits.iter().map(|&v| ((v - m) / temperature).exp()).collect();
            let mut u = rng.next_f64() * w.iter().sum::<f64>();
            w.iter()
                .position(|&wi| {
                    u -= wi;
                    u <= 0.0
                })
                .unwrap_or(w.len() - 1)
        };
        ids.push(next as i64);
    }
    Ok(vocab.decode(&ids[start..]))
}

fn config_metadata(cfg: &GptConfig, task: &str, vocab: &Vocab, seed: u64, step: usize) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        m.insert(k.to_string(), v);
    };
    put("gpt.vocab", vocab.chars.iter().collect());
    put("gpt.block_size", cfg.block_size.to_string());
    put("gpt.d_model", cfg.d_model.to_string());
    put("gpt.n_layer", cfg.n_layer.to_string());
    put("gpt.n_head", cfg.n_head.to_string());
    put("gpt.mlp_ratio", cfg.mlp_ratio.to_string());
    put("gpt.dropout", cfg.dropout.to_string());
    put("gpt.tie_weights", cfg.tie_weights.to_string());
    put("train.task", task.to_string());
    put("train.seed", seed.to_string());
    put("train.step", step.to_string());
    m
}

fn config_from_metadata(m: &BTreeMap<String, String>) -> anyhow::Result<(GptConfig, String, u64, usize)> {
    fn get<T: std::str::FromStr>(m: &BTreeMap<String, String>, k: &str) -> anyhow::Result<T> {
        m.get(k)
            .with_context(|| format!("checkpoint metadata lacks {k:?}: not a `tapir gpt` checkpoint"))?
            .parse()
            .map_err(|_| anyhow::anyhow!("checkpoint metadata {k:?} is malformed"))
    }
    let vocab: String = get(m, "gpt.vocab")?;
    let cfg = GptConfig {
        vocab: vocab.chars().count(),
        block_size: get(m, "gpt.block_size")?,
        d_model: get(m, "gpt.d_model")?,
        n_layer: get(m, "gpt.n_layer")?,
        n_head: get(m, "gpt.n_head")?,
        mlp_ratio: get(m, "gpt.mlp_ratio")?,
        dropout: get(m, "gpt.dropout")?,
        tie_weights: get(m, "gpt.tie_weights")?,
    };
    Ok((cfg, get(m, "train.task")?, get(m, "train.seed")?, get(m, "train.step")?))
}

fn mib(b: usize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// The CUDA devices of `--devices`, each checked.
pub(crate) fn device_list(list: &[DeviceArg]) -> anyhow::Result<Vec<Device>> {
    list.iter()
        .map(|d| match d {
            DeviceArg::Cuda(_) => d.pick(),
            other => bail!("--devices takes CUDA devices (cuda:0,cuda:1,...), not {other}"),
        })
        .collect()
}

/// Trains as `a` says and returns what it measured (the command's output
/// is printed by [`run`]): on one device, on the ranks of `--dist`, or on
/// the devices of `--devices`, one thread each (rank 0's summary, with
/// every rank's figures).
pub fn train(a: &Args) -> anyhow::Result<Summary> {
    if a.devices.is_empty() {
        let (comm, device, transport) = communicator(a.dist, a.device)?;
        return or_abort(&comm, train_on(a, &comm, device, transport));
    }
    if a.dist != Dist::None {
        bail!("--devices and --dist are two ways to spread the training; give one");
    }
    let devices = device_list(&a.devices)?;
    if devices.len() == 1 {
        return train_on(a, &Communicator::single(), devices[0], "");
    }
    let mut summaries = on_devices(&devices, |comm, device| train_on(a, comm, device, "NCCL"))?;
    let threads = summaries.iter().map(|s| (s.tokens_per_s, s.allreduce_s, s.train_s)).collect();
    let mut first = summaries.swap_remove(0);
    first.threads = threads;
    Ok(first)
}

/// `train(comm, device)` on each of `devices`, one thread and one NCCL
/// communicator each (a rank that fails ends the process); the results in
/// rank order.
pub(crate) fn on_devices<T: Send>(
    devices: &[Device],
    train: impl Fn(&Communicator, Device) -> anyhow::Result<T> + Sync,
) -> anyhow::Result<Vec<T>> {
    let comms = nccl_communicators(devices)?;
    let results: Vec<anyhow::Result<T>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(devices)
            .map(|(comm, &device)| {
                let train = &train;
                s.spawn(move || or_abort(&comm, train(&comm, device)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a rank's thread panicked"))))
            .collect()
    });
    results.into_iter().collect()
}

/// A rank's result, except that a rank that failed ends the whole job
/// (every rank, with its message) instead of returning: the other ranks
/// would otherwise wait for it forever in their next all-reduce.
pub(crate) fn or_abort<T>(comm: &Communicator, r: anyhow::Result<T>) -> anyhow::Result<T> {
    match r {
        Err(e) if comm.world_size() > 1 => comm.abort(&format!("{e:#}")),
        r => r,
    }
}

/// One NCCL communicator per device.
#[cfg(feature = "nccl")]
fn nccl_communicators(devices: &[Device]) -> anyhow::Result<Vec<Communicator>> {
    Communicator::nccl_devices(devices).context("--devices: making the NCCL communicators")
}

#[cfg(not(feature = "nccl"))]
fn nccl_communicators(_devices: &[Device]) -> anyhow::Result<Vec<Communicator>> {
    bail!("--devices: this tapir was built without NCCL; build it with `cargo build --release -p tapir-cli --features nccl`")
}

/// The training of one rank (all of it alone) on `device`.
fn train_on(a: &Args, comm: &Communicator, device: Device, transport: &'static str) -> anyhow::Result<Summary> {
    let (rank, world) = (comm.rank(), comm.world_size());
    // Rank 0 speaks for the job.
    let quiet = a.quiet || rank != 0;
    let task_name = match &a.data {
        Some(p) => format!("text:{}", p.display()),
        None => format!("sums:{}", a.digits),
    };
    // A resumed run takes its model shape, task and seed from the checkpoint.
    let resumed = match &a.resume {
        Some(path) => {
            let ck = checkpoint::Checkpoint::read(path)?;
            Some(config_from_metadata(&ck.metadata)?)
        }
        None => None,
    };
    let seed = resumed.as_ref().map_or(a.seed, |r| r.2);
    let task = match &a.data {
        Some(p) => Task::Text(Text::load(p)?),
        None => Task::Sums(Sums::new(a.digits, a.test_fraction, seed)?),
    };
    if let Some((_, t, _, _)) = &resumed {
        if *t != task_name {
            bail!("the checkpoint was trained on {t}, this run is {task_name}");
        }
    }
    let vocab = task.vocab().clone();
    let cfg = match &resumed {
        Some((cfg, ..)) => cfg.clone(),
        None => GptConfig {
            vocab: vocab.chars.len(),
            block_size: a.block,
            d_model: a.d_model,
            n_layer: a.layers,
            n_head: a.heads,
            mlp_ratio: 4,
            dropout: a.dropout,
            tie_weights: !a.untied,
        },
    };
    if cfg.vocab != vocab.chars.len() {
        bail!("the checkpoint's vocabulary has {} characters, the data {}", cfg.vocab, vocab.chars.len());
    }
    let seq = match &task {
        Task::Sums(s) => s.line_len() - 1,
        Task::Text(_) => cfg.block_size,
    };
    if seq > cfg.block_size {
        bail!("--block {} is shorter than the {seq} characters a sum needs", cfg.block_size);
    }

    let mut rng = Rng::new(seed);
    let mut store = ParamStore::new();
    let mut model = Gpt::new(&mut store, cfg.clone(), &mut rng, DType::F32)?;
    model.checkpoint = a.checkpoint;
    model.set_composed_attention(a.composed_attention);
    let mut opt = Adam::adamw(a.lr, a.weight_decay);
    opt.beta2 = 0.99;
    let mut start = 0;
    if let Some(path) = &a.resume {
        let meta = checkpoint::load(path, &mut store, Some(&mut opt))?;
        start = config_from_metadata(&meta)?.3;
        if !quiet {
            eprintln!("resumed {} at step {start}", path.display());
        }
    }
    // The weights are drawn (or loaded) on the host, so a seed or a
    // checkpoint gives the same model on every device.
    store.to_device(device)?;
    // Every rank starts from rank 0's parameters; the bucket buffers are
    // made here, once.
    let mut ddp = if world > 1 { Some(DataParallel::new(comm, &mut store, DdpOptions::default())?) } else { None };
    let schedule = Schedule::WarmupCosine { warmup: a.warmup, total: a.steps, min_factor: 0.1 };
    // Each step's batch and dropout masks come from a generator seeded by
    // (seed, step), so a resumed run draws exactly what the uninterrupted
    // run would have drawn: resuming is bit-for-bit.
    let step_rng = |step: usize, stream: u64| {
        Rng::new(seed ^ (step as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ stream.rotate_left(32))
    };

    if !quiet {
        eprintln!(
            "tapir gpt: {task_name}, {} parameters ({:.2} MiB), d_model {}, {} layers, {} heads, context {}, batch {}, steps {}..{}, on {device}{}",
            store.numel(),
            mib(store.bytes()),
            cfg.d_model,
            cfg.n_layer,
            cfg.n_head,
            cfg.block_size,
            a.batch,
            start,
            a.steps,
            if world > 1 {
                format!(", rank 0 of {world} ({transport}): a global batch of {}", world * a.batch)
            } else {
                String::new()
            }
        );
    }
    let end = a.stop_after.map_or(a.steps, |n| a.steps.min(start + n));
    let bar = if quiet { ProgressBar::hidden() } else { ProgressBar::new(end as u64) };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}")
            .expect("internal: template"),
    );
    bar.set_position(start as u64);

    let t0 = Instant::now();
    let mut summary = Summary {
        steps_run: 0,
        losses: vec![],
        live: vec![],
        peak: vec![],
        memory_flat: true,
        flat_from: 0,
        accuracy: None,
        evals: vec![],
        held_out_loss: None,
        held_out_losses: vec![],
        scales: vec![],
        skipped: vec![],
        wall_s: 0.0,
        train_s: 0.0,
        eval_s: 0.0,
        time_to_95: None,
        tokens_per_s: 0.0,
        samples: vec![],
        rank,
        world,
        allreduce_s: 0.0,
        rank_tokens_per_s: vec![],
        transport,
        threads: vec![],
    };
    let precision = Precision::parse(&a.precision)?;
    let mut scaler = match (precision, a.loss_scale) {
        (Precision::F16, Some(scale)) => Some(GradScaler::new(scale)?),
        (Precision::F16, None) => Some(GradScaler::default()),
        (_, Some(_)) => bail!("--loss-scale applies to --precision f16 only"),
        (_, None) => None,
    };
    let mut tokens = 0usize;
    let mut took_step = false;
    let meta = |step: usize| config_metadata(&cfg, &task_name, &vocab, seed, step);
    for step in start..end {
        let step_t0 = Instant::now();
        opt.set_lr(schedule.lr(a.lr, step));
        let mut data_rng = step_rng(step, 1);
        let mut drop_rng = step_rng(step, 2 + rank as u64);
        // Every rank draws the same global batch and keeps its own rows.
        let (x, y) = match &task {
            Task::Sums(s) => s.batch(&mut data_rng, a.batch * world)?,
            Task::Text(t) => t.batch(&mut data_rng, a.batch * world, seq)?,
        };
        let (x, y) = if world > 1 {
            (x.narrow(0, rank * a.batch, a.batch)?.contiguous()?, y.narrow(0, rank * a.batch, a.batch)?.contiguous()?)
        } else {
            (x, y)
        };
        let (x, y) = (x.to_device(device)?, y.to_device(device)?);
        tokens += x.numel();
        reset_peak_memory_stats(device);
        let training = cfg.dropout > 0.0;
        let (loss, grads) = Graph::scope(|g| {
            let p = store.bind(g).with_precision(precision);
            let loss = model.loss(&p, &x, &y, training.then_some(&mut drop_rng))?;
            let value = loss.item()? as f32;
            let seed = match &scaler {
                Some(s) => s.scale_loss(loss)?,
                None => loss,
            };
            let grads = match &mut ddp {
                Some(ddp) => ddp.grads(&p, seed)?,
                None => p.grads(seed)?,
            };
            Ok::<_, Error>((value, grads))
        })?;
        // The loss of the global batch: the mean of the ranks' means.
        let loss = if world > 1 {
            // On the rank's device: NCCL reduces device tensors only.
            let mut l = Tensor::from_vec(vec![loss], [1])?.to_device(device)?;
            comm.all_reduce(&mut l, ReduceOp::Average)?;
            l.to_vec::<f32>()?[0]
        } else {
            loss
        };
        // With a loss scaler, the gradients unscaled, or none when they
        // overflowed (the step is skipped and the scale backs off).
        let grads = match &mut scaler {
            Some(s) => {
                let unscaled = s.unscale(&grads)?;
                s.update(unscaled.is_some());
                summary.scales.push(s.scale);
                if unscaled.is_none() {
                    summary.skipped.push(step);
                }
                unscaled
            }
            None => Some(grads),
        };
        let stepped = grads.is_some();
        if let Some(mut grads) = grads {
            if a.clip > 0.0 {
                grads.clip_global_norm(a.clip)?;
            }
            opt.step(&mut store, &grads)?;
        }
        drop((x, y));
        let stats = memory_stats(device);
        if !stepped && !took_step {
            // Nothing is compared before the optimizer's first step.
            summary.flat_from = summary.live.len() + 1;
        }
        took_step |= stepped;
        if let Some(&first) = summary.live.get(summary.flat_from) {
            if stats.allocated != first {
                summary.memory_flat = false;
            }
        }
        summary.live.push(stats.allocated);
        summary.peak.push(stats.peak);
        summary.losses.push(loss);
        summary.steps_run += 1;
        if !loss.is_finite() {
            bail!("the loss became {loss} at step {step}; try a lower --lr");
        }
        summary.train_s += step_t0.elapsed().as_secs_f64();
        let done = step + 1;
        bar.set_position(done as u64);
        bar.set_message(format!(
            "loss {loss:.4} | {:.0} tok/s | live {:.2} MiB",
            tokens as f64 / summary.train_s.max(1e-9),
            mib(stats.allocated)
        ));
        if let Task::Sums(s) = &task {
            if rank == 0 && ((a.eval_every > 0 && done % a.eval_every == 0) || done == end) {
                let eval_t0 = Instant::now();
                let acc = accuracy(&model, &store, s)?;
                let held = held_out_loss(&model, &store, s)?;
                summary.eval_s += eval_t0.elapsed().as_secs_f64();
                summary.evals.push((done, acc));
                summary.held_out_losses.push((done, held));
                if acc >= 0.95 && summary.time_to_95.is_none() {
                    summary.time_to_95 = Some(t0.elapsed().as_secs_f64());
                }
                let line = format!(
                    "step {done:>5}  loss {loss:.4}  held-out exact match {:5.1}%, loss {held:.4}  ({:.0} s)",
                    100.0 * acc,
                    t0.elapsed().as_secs_f64()
                );
                if bar.is_hidden() {
                    if !quiet {
                        eprintln!("{line}");
                    }
                } else {
                    bar.println(line);
                }
            }
        }
        if let Some(path) = &a.save {
            if rank == 0 && a.save_every > 0 && done % a.save_every == 0 && done != end {
                checkpoint::save(path, &store, Some(&opt), &meta(done))?;
            }
        }
    }
    bar.finish_and_clear();
    summary.wall_s = t0.elapsed().as_secs_f64();
    summary.tokens_per_s = tokens as f64 / summary.train_s.max(1e-9);
    summary.accuracy = summary.evals.last().map(|e| e.1);
    summary.held_out_loss = summary.held_out_losses.last().map(|e| e.1);
    summary.allreduce_s = ddp.as_ref().map_or(Ok(0.0), DataParallel::comm_seconds)?;
    summary.rank_tokens_per_s = if world > 1 {
        comm.all_gather(&Tensor::from_vec(vec![summary.tokens_per_s], [1])?.to_device(device)?)?.to_vec::<f64>()?
    } else {
        vec![summary.tokens_per_s]
    };
    if rank != 0 {
        return Ok(summary);
    }
    if let Some(path) = &a.save {
        checkpoint::save(path, &store, Some(&opt), &meta(end.max(start)))?;
    }
    if let Some(n) = a.sample {
        match &task {
            Task::Sums(s) => {
                let pairs: Vec<(u32, u32)> = s.test.iter().take(n).copied().collect();
                let got = answers(&model, &store, s, &pairs)?;
                for (&(x, y), g) in pairs.iter().zip(got) {
                    let w = s.digits as usize;
                    let mark = if g == (x + y).to_string() { "ok" } else { "WRONG" };
                    summary.samples.push(format!("{x:0w$}+{y:0w$}={g:<5} {mark}"));
                }
            }
            Task::Text(_) => {
                let mut r = Rng::new(seed.wrapping_add(99));
                summary.samples.push(generate(&model, &store, &vocab, &a.prompt, n, a.temperature, &mut r)?);
            }
        }
    }
    if !a.no_chart && summary.steps_run > 0 {
        write_chart(&a.chart, start, &summary)?;
    }
    Ok(summary)
}

/// The figures of `--json`.
fn write_json(path: &Path, s: &Summary) -> anyhow::Result<()> {
    let v = serde_json::json!({
        "steps_run": s.steps_run,
        "losses": s.losses,
        "live": s.live,
        "peak": s.peak,
        "memory_flat": s.memory_flat,
        "accuracy": s.accuracy,
        "held_out_loss": s.held_out_loss,
        "skipped_steps": s.skipped,
        "train_s": s.train_s,
        "tokens_per_s": s.tokens_per_s,
        "world": s.world,
        "rank_tokens_per_s": s.rank_tokens_per_s,
        "allreduce_s": s.allreduce_s,
    });
    std::fs::write(path, serde_json::to_string_pretty(&v)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

fn write_chart(path: &Path, start: usize, s: &Summary) -> anyhow::Result<()> {
    let step = |i: usize| (start + i + 1) as f64;
    let mut panels = vec![Panel {
        title: "training loss (answer characters)".into(),
        x_label: "step".into(),
        y_label: "cross-entropy".into(),
        series: vec![Series {
            label: "loss".into(),
            points: s.losses.iter().enumerate().map(|(i, &l)| (step(i), l as f64)).collect(),
        }],
        log_y: true,
        integer_x: true,
        markers: vec![],
    }];
    panels.push(Panel {
        title: "memory per step (exact allocator counts)".into(),
        x_label: "step".into(),
        y_label: "MiB".into(),
        series: vec![
            Series {
                label: "live at step boundary".into(),
                points: s.live.iter().enumerate().map(|(i, &b)| (step(i), mib(b))).collect(),
            },
            Series {
                label: "peak within step".into(),
                points: s.peak.iter().enumerate().map(|(i, &b)| (step(i), mib(b))).collect(),
            },
        ],
        log_y: false,
        integer_x: true,
        markers: vec![],
    });
    if !s.evals.is_empty() {
        panels.push(Panel {
            title: "held-out exact match".into(),
            x_label: "step".into(),
            y_label: "%".into(),
            series: vec![Series {
                label: "accuracy".into(),
                points: s.evals.iter().map(|&(st, a)| (st as f64, 100.0 * a)).collect(),
            }],
            log_y: false,
            integer_x: true,
            markers: vec![],
        });
    }
    chart::line_chart(path, &panels)
}

/// Runs the command and prints its report.
pub fn run(a: Args) -> anyhow::Result<()> {
    let s = train(&a)?;
    if s.threads.is_empty() && s.world > 1 {
        rank_report(s.rank, s.world, &format!("{:.0} tokens/s, ", s.tokens_per_s), s.allreduce_s, s.train_s);
    }
    for (r, &(tokens, allreduce, train)) in s.threads.iter().enumerate() {
        rank_report(r, s.world, &format!("{tokens:.0} tokens/s, "), allreduce, train);
    }
    if s.rank != 0 {
        return Ok(());
    }
    if let Some(path) = &a.json {
        write_json(path, &s)?;
    }
    for line in &s.samples {
        println!("{line}");
    }
    if s.steps_run == 0 {
        println!("nothing to do: the checkpoint is already at step {}", a.steps);
        return Ok(());
    }
    let last = s.losses.last().copied().unwrap_or(f32::NAN);
    println!("steps        {}  (final loss {last:.4})", s.steps_run);
    println!(
        "training     {:.1} s  ({:.0} tokens/s, {:.1} ms a step)",
        s.train_s,
        s.tokens_per_s,
        1e3 * s.train_s / s.steps_run as f64
    );
    if !s.evals.is_empty() {
        println!("evaluation   {:.1} s  ({} held-out evaluations)", s.eval_s, s.evals.len());
    }
    println!("wall time    {:.1} s  (the whole loop)", s.wall_s);
    if !s.skipped.is_empty() {
        println!(
            "loss scaler  {} steps skipped (gradients overflowed), scale now {}",
            s.skipped.len(),
            s.scales.last().copied().unwrap_or(f64::NAN)
        );
    }
    if let Some(acc) = s.accuracy {
        println!("held-out     {:.2}% exact match, loss {:.4}", 100.0 * acc, s.held_out_loss.unwrap_or(f64::NAN));
        match s.time_to_95 {
            Some(t) => println!("reached 95%  after {t:.1} s"),
            None => println!("reached 95%  no"),
        }
    }
    if s.world > 1 {
        println!(
            "ranks        {} over {}: {:.0} tokens/s in all ({} by rank); all-reduce {:.2} s on rank 0",
            s.world,
            s.transport,
            s.rank_tokens_per_s.iter().sum::<f64>(),
            s.rank_tokens_per_s.iter().map(|t| format!("{t:.0}")).collect::<Vec<_>>().join(", "),
            s.allreduce_s
        );
    }
    let peak = s.peak.iter().copied().max().unwrap_or(0);
    match (s.live.get(s.flat_from), s.memory_flat) {
        (Some(&b), true) => println!(
            "memory       live {} at every step boundary from the optimizer's first step ({} boundaries, flat); peak {}",
            chart::bytes(b as f64),
            s.live.len() - s.flat_from,
            chart::bytes(peak as f64)
        ),
        (Some(_), false) => {
            let (lo, hi) = (s.live.iter().min().unwrap_or(&0), s.live.iter().max().unwrap_or(&0));
            println!(
                "memory       NOT flat: live bytes ranged {}..{} across step boundaries",
                chart::bytes(*lo as f64),
                chart::bytes(*hi as f64)
            );
        }
        (None, _) => println!("memory       one step only: nothing to compare"),
    }
    if !a.no_chart {
        println!("chart        {}", a.chart.display());
    }
    if let Some(p) = &a.save {
        println!("checkpoint   {}", p.display());
    }
    if !s.memory_flat {
        bail!("live memory changed between step boundaries");
    }
    Ok(())
}
