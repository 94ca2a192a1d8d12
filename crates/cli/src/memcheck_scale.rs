//! `tapir memcheck --scenario attention|checkpoint|amp|context`: memory at
//! training scale, each beside PyTorch in one run.
//!
//! - `attention`: causal attention forward and backward on q, k, v
//!   `[B, T, C]`, tapir's fused op against PyTorch's eager attention
//!   (scores, mask, softmax, matmul) and `F.scaled_dot_product_attention`.
//! - `checkpoint`: a training step of the `tapir gpt` model with and
//!   without activation checkpointing per block (`torch.utils.checkpoint`).
//! - `amp`: the same step in f32 and in bf16 mixed precision
//!   (`torch.autocast(dtype=torch.bfloat16)`).
//! - `context`: (tapir alone) the `tapir gpt` model's training step at
//!   growing context on one device, fused attention against the composed
//!   path, to find the longest context whose measured peak fits a budget.
//!
//! Every figure is one step's peak above the bytes live before it, the
//! bytes the step leaves live, and the median time of `--reps` steps after
//! a warm-up step. tapir's bytes come from its allocator counters (exact on
//! every device, the emulated one included); PyTorch's from
//! `torch.cuda.max_memory_allocated`, or on the CPU from the allocator shim
//! (`benches/torch/cpu_alloc_shim.c`, compiled with `cc` and preloaded).

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::Context;
use serde_json::{json, Value};
use tapir::nn::{causal_attention, Adam, CausalAttention, Gpt, GptConfig, Optimizer, ParamStore, Precision};
use tapir::prelude::*;

use crate::memcheck_args::{torch_script, Args};

/// The scale scenarios' names, in report order.
pub const SCALE_SCENARIOS: [&str; 4] = ["attention", "checkpoint", "amp", "context"];

/// One variant's measurement.
#[derive(Debug, Clone, Default)]
pub struct Figure {
    /// Peak bytes during the measured step, above the bytes live before it.
    pub peak: usize,
    /// Bytes live after the step minus before it.
    pub live: i64,
    /// Median seconds a step.
    pub seconds: f64,
}

impl Figure {
    fn json(&self) -> Value {
        json!({"peak_bytes": self.peak, "live_bytes": self.live, "seconds": self.seconds})
    }
}

fn sync(dev: Device) -> Result<()> {
    if dev.is_cpu() {
        Ok(())
    } else {
        tapir::tensor::cuda::synchronize(dev)
    }
}

/// One warm-up step, one measured for bytes, then `reps` timed; with
/// `reps` 0, the one step measured for bytes is all (its time includes
/// first use: for the emulated device, where a step takes minutes).
pub fn measure(dev: Device, reps: usize, mut step: impl FnMut() -> Result<()>) -> Result<Figure> {
    if reps > 0 {
        step()?;
    }
    sync(dev)?;
    let base = memory_allocated(dev);
    reset_peak_memory_stats(dev);
    let t0 = Instant::now();
    step()?;
    sync(dev)?;
    let first = t0.elapsed().as_secs_f64();
    let peak = max_memory_allocated(dev).saturating_sub(base);
    let live = memory_allocated(dev) as i64 - base as i64;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = Instant::now();
        step()?;
        sync(dev)?;
        times.push(t0.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let seconds = if times.is_empty() { first } else { times[times.len() / 2] };
    Ok(Figure { peak, live, seconds })
}

/// The fused attention step's peak above q, k, v and the seed, in bytes,
/// for elements of `size` bytes (4 for f32, 2 for bf16 and f16): the
/// output and the three gradients `[B, T, C]`, and two f32 rows per
/// (batch, head) (crates/nn/tests/attention_memory.rs asserts it).
pub fn fused_attention_formula(b: usize, t: usize, c: usize, heads: usize, size: usize) -> usize {
    size * 4 * b * t * c + 4 * 2 * b * heads * t
}

/// What the composed path (scores from a matmul, the causal softmax, a
/// matmul) would hold at least: its scores and probabilities, two
/// `[B, H, T, T]` tensors of `size`-byte elements, alive together in the
/// forward (the backward holds more of that shape).
pub fn composed_attention_floor(b: usize, t: usize, heads: usize, size: usize) -> usize {
    2 * size * b * heads * t * t
}

/// Forward and backward of tapir's causal attention in `dtype`, the
/// output's gradient given (PyTorch's `y.backward(g)`): the fused op, or
/// with `composed` the composition from matmuls and the causal softmax.
#[allow(clippy::too_many_arguments)]
pub fn attention_figure(
    dev: Device,
    dtype: DType,
    b: usize,
    t: usize,
    heads: usize,
    d: usize,
    reps: usize,
    composed: bool,
) -> Result<Figure> {
    let c = heads * d;
    let [q, k, v, gy] = [1u64, 2, 3, 4].map(|s| {
        Rng::new(s).normal_tensor([b, t, c], 0.0, 1.0, DType::F32).and_then(|x| x.cast(dtype)?.to_device(dev))
    });
    let (q, k, v, gy) = (q?, k?, v?, gy?);
    let op = CausalAttention { heads, scale: 1.0 / (d as f64).sqrt() };
    measure(dev, reps, || {
        Graph::scope(|g| {
            let [ql, kl, vl] = [&q, &k, &v].map(|x| g.leaf(x.clone()));
            let y = if composed { op.composed(&ql, &kl, &vl)? } else { causal_attention(&ql, &kl, &vl, heads)? };
            let opts = GradOptions { grad_outputs: Some(vec![gy.clone()]), ..Default::default() };
            let d = g.grad_with(&[y], &[ql, kl, vl], opts)?;
            debug_assert_eq!(d.len(), 3);
            Ok(())
        })
    })
}

/// The `tapir gpt` model at a shape, its AdamW and one batch.
pub struct GptRig {
    store: ParamStore,
    model: Gpt,
    opt: Adam,
    x: Tensor,
    y: Tensor,
    precision: Precision,
}

/// The model's shape in the scale scenarios.
#[derive(Debug, Clone, Copy)]
pub struct GptShape {
    /// Vocabulary.
    pub vocab: usize,
    /// Context (and block size).
    pub t: usize,
    /// Sequences a step.
    pub batch: usize,
    /// Width.
    pub d_model: usize,
    /// Blocks.
    pub layers: usize,
    /// Heads.
    pub heads: usize,
}

impl GptRig {
    /// A model of `shape` on `dev` (initialised on the host with seed 0),
    /// checkpointed, composed or in mixed precision as asked.
    pub fn new(dev: Device, s: GptShape, checkpoint: bool, composed: bool, precision: Precision) -> Result<Self> {
        let cfg = GptConfig {
            vocab: s.vocab,
            block_size: s.t,
            d_model: s.d_model,
            n_layer: s.layers,
            n_head: s.heads,
            mlp_ratio: 4,
            dropout: 0.0,
            tie_weights: true,
        };
        let mut rng = Rng::new(0);
        let mut store = ParamStore::new();
        let mut model = Gpt::new(&mut store, cfg, &mut rng, DType::F32)?;
        model.checkpoint = checkpoint;
        model.set_composed_attention(composed);
        store.to_device(dev)?;
        let mut opt = Adam::adamw(3e-3, 0.1);
        opt.beta2 = 0.99;
        let x = rng.randint([s.batch, s.t], s.vocab as u64, DType::I64)?.to_device(dev)?;
        let y = rng.randint([s.batch, s.t], s.vocab as u64, DType::I64)?.to_device(dev)?;
        Ok(GptRig { store, model, opt, x, y, precision })
    }

    /// Forward, backward and the AdamW step; the loss.
    pub fn step(&mut self) -> Result<f64> {
        let (model, x, y, precision) = (&self.model, &self.x, &self.y, self.precision);
        let (loss, grads) = Graph::scope(|g| {
            let p = self.store.bind(g).with_precision(precision);
            let loss = model.loss(&p, x, y, None)?;
            Ok::<_, Error>((loss.item()?, p.grads(loss)?))
        })?;
        self.opt.step(&mut self.store, &grads)?;
        Ok(loss)
    }
}

fn gpt_figure(dev: Device, s: GptShape, variant: &str, reps: usize) -> Result<Figure> {
    let precision = if variant == "bf16" { Precision::Bf16 } else { Precision::Full };
    let mut rig = GptRig::new(dev, s, variant == "checkpoint", false, precision)?;
    measure(dev, reps, || rig.step().map(drop))
}

/// Whether an error is the device running out of memory.
fn out_of_memory(e: &Error) -> bool {
    let m = e.to_string().to_lowercase();
    m.contains("out of memory") || m.contains("out_of_memory")
}

/// One training step of the model at context `t` (batch 1), absolute peak
/// bytes on the device (everything live counts against its memory), or
/// `None` when the device ran out of memory.
fn context_peak(dev: Device, s: GptShape, t: usize, composed: bool) -> Result<Option<usize>> {
    sync(dev)?;
    reset_peak_memory_stats(dev);
    let run = || -> Result<()> {
        let mut rig = GptRig::new(dev, GptShape { t, ..s }, false, composed, Precision::Full)?;
        rig.step()?;
        sync(dev)
    };
    match run() {
        Ok(()) => Ok(Some(max_memory_allocated(dev))),
        Err(e) if out_of_memory(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Contexts measured and their peaks (`None`: out of memory).
type Points = Vec<(usize, Option<usize>)>;

/// The longest context (a multiple of `unit`) whose one-step peak fits
/// `budget`: predicted from peaks at small contexts (a line for the fused
/// path, a parabola through three for the composed one), then checked by
/// running it and the next multiple. Returns (the measured points, the
/// largest context that fitted, its peak).
fn longest_context(
    dev: Device,
    s: GptShape,
    composed: bool,
    budget: usize,
    unit: usize,
    log: &mut dyn FnMut(String),
) -> Result<(Points, usize, usize)> {
    let probes: &[usize] = if composed { &[2 * unit, 4 * unit, 6 * unit] } else { &[4 * unit, 8 * unit] };
    let mut points: Points = Vec::new();
    let probe =
        |t: usize, points: &mut Vec<(usize, Option<usize>)>, log: &mut dyn FnMut(String)| -> Result<Option<usize>> {
            let t0 = Instant::now();
            let p = context_peak(dev, s, t, composed)?;
            log(format!(
                "  {} T={t}: {} ({:.1} s)",
                if composed { "composed" } else { "fused" },
                p.map_or("out of memory".to_string(), |b| format!("peak {b} bytes")),
                t0.elapsed().as_secs_f64()
            ));
            points.push((t, p));
            Ok(p)
        };
    let mut fit = Vec::new();
    for &t in probes {
        match probe(t, &mut points, log)? {
            Some(p) => fit.push((t as f64, p as f64)),
            None => return Ok((points, 0, 0)),
        }
    }
    let budget_f = budget as f64;
    let predicted = if composed {
        // Through three points: peak = a + b t + c t^2.
        let [(x0, y0), (x1, y1), (x2, y2)] = [fit[0], fit[1], fit[2]];
        let c = ((y2 - y1) / (x2 - x1) - (y1 - y0) / (x1 - x0)) / (x2 - x0);
        let b = (y1 - y0) / (x1 - x0) - c * (x1 + x0);
        let a = y0 - b * x0 - c * x0 * x0;
        if c > 0.0 {
            (-b + (b * b - 4.0 * c * (a - budget_f)).max(0.0).sqrt()) / (2.0 * c)
        } else {
            (budget_f - a) / b.max(1.0)
        }
    } else {
        let [(x0, y0), (x1, y1)] = [fit[0], fit[1]];
        let b = (y1 - y0) / (x1 - x0);
        x0 + (budget_f - y0) / b.max(1.0)
    };
    let mut t = ((predicted.max(0.0) as usize) / unit).max(1) * unit;
    log(format!("  predicted longest context {predicted:.0}, trying T={t}"));
    // Walk down from the prediction until a context fits, then confirm the
    // next multiple does not (a bounded number of runs either way).
    let (mut best, mut best_peak) = (0, 0);
    for _ in 0..6 {
        match probe(t, &mut points, log)? {
            Some(p) if p <= budget => {
                (best, best_peak) = (t, p);
                break;
            }
            _ if t > unit => t -= unit,
            _ => break,
        }
    }
    if best > 0 {
        for _ in 0..6 {
            let next = best + unit;
            match probe(next, &mut points, log)? {
                Some(p) if p <= budget => (best, best_peak) = (next, p),
                _ => break,
            }
        }
    }
    Ok((points, best, best_peak))
}

fn mib(b: f64) -> String {
    format!("{:.2} MiB", b / 1048576.0)
}

fn ms(s: f64) -> String {
    format!("{:.1} ms", 1e3 * s)
}

/// The allocator shim PyTorch's CPU side is measured with, compiled into
/// the temporary folder with `cc`; `Err` says why not.
fn shim() -> std::result::Result<PathBuf, String> {
    let src = [
        PathBuf::from("benches/torch/cpu_alloc_shim.c"),
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/torch/cpu_alloc_shim.c"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .ok_or("benches/torch/cpu_alloc_shim.c not found")?;
    let out = std::env::temp_dir().join(format!("tapir-memcheck-shim-{}.so", std::process::id()));
    let st = Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .args(["-ldl", "-lpthread"])
        .output()
        .map_err(|e| format!("cc: {e}"))?;
    if !st.status.success() {
        return Err(format!("cc failed: {}", String::from_utf8_lossy(&st.stderr)));
    }
    Ok(out)
}

/// PyTorch's side of the chosen scale scenarios; `Err` says why it did not run.
fn run_torch(a: &Args, names: &[&str], dev: Device) -> std::result::Result<Value, String> {
    let script = torch_script().ok_or("benches/torch/memcheck.py not found")?;
    match Command::new(&a.python).args(["-c", "import torch"]).output() {
        Err(_) => return Err(format!("{} not found", a.python)),
        Ok(o) if !o.status.success() => return Err(format!("{} cannot import torch", a.python)),
        Ok(_) => {}
    }
    let mut cmd = Command::new(&a.python);
    let list = |v: &[usize]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
    cmd.arg(&script)
        .args(["--scenario", &names.join(","), "--device", &dev.to_string()])
        .args(["--t", &list(&attention_ts(a, dev))])
        .args(["--batch", &a.batch.to_string(), "--heads", &a.heads.to_string()])
        .args(["--head-dim", &a.head_dim.to_string(), "--reps", &a.reps.to_string()])
        .args(["--dtype", a.dtype.cuda_suffix()])
        .args(["--eager-max-t", &a.eager_max_t.to_string(), "--vocab", &a.vocab.to_string()])
        .args(["--gpt-t", &a.gpt_t.to_string(), "--gpt-batch", &a.gpt_batch.to_string()])
        .args(["--d-model", &a.d_model.to_string(), "--layers", &a.layers.to_string()]);
    let shim = if dev.is_cpu() { Some(shim()) } else { None };
    if let Some(Ok(path)) = &shim {
        cmd.env("LD_PRELOAD", path);
    }
    let out = cmd.output().map_err(|e| e.to_string());
    if let Some(Ok(path)) = &shim {
        let _ = std::fs::remove_file(path);
    }
    let out = out?;
    if out.status.code() == Some(3) {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    if !out.status.success() {
        return Err(format!("the PyTorch mirror failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let mut v: Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("the PyTorch mirror printed no JSON: {e}"))?;
    if let Some(Err(why)) = shim {
        v["shim_error"] = json!(why);
    }
    Ok(v)
}

/// The attention scenario's sequence lengths: `--t`, else 1,024 to 8,192
/// on the CPU and 256 on an emulated or real CUDA device (say more with
/// `--t`; the emulator takes minutes past 1,024).
fn attention_ts(a: &Args, dev: Device) -> Vec<usize> {
    if !a.t.is_empty() {
        a.t.clone()
    } else if dev.is_cpu() {
        vec![1024, 2048, 4096, 8192]
    } else {
        vec![256]
    }
}

fn torch_fig(v: Option<&Value>) -> (String, String, String) {
    let get = |k: &str| v.and_then(|v| v.get(k)).and_then(Value::as_f64);
    if let Some(why) = v.and_then(|v| v.get("skipped")).and_then(Value::as_str) {
        return (format!("skipped: {why}"), String::new(), String::new());
    }
    (
        get("peak_bytes").map_or("-".into(), mib),
        get("live_bytes").map_or("-".into(), |b| format!("{b:.0} B")),
        get("seconds").map_or("-".into(), ms),
    )
}

fn ratio(a: f64, b: Option<f64>) -> String {
    match b {
        Some(b) if a > 0.0 => format!("{:.2}x", b / a),
        _ => "-".into(),
    }
}

/// Runs the chosen scale scenarios, prints their tables and returns their JSON.
pub fn run(a: &Args, names: &[&str], dev: Device) -> anyhow::Result<Value> {
    let emulated = !dev.is_cpu() && std::env::var("TAPIR_CUDA").is_ok_and(|v| v == "emulated");
    println!(
        "tapir memcheck --scenario {}: on {dev}{}",
        names.join(","),
        if emulated { " (the emulated device: bytes exact, times are the interpreter's, not a GPU's)" } else { "" }
    );
    let cpu = crate::device::cpu_model();
    println!("host CPU: {cpu} ({} threads)", std::thread::available_parallelism().map_or(1, |n| n.get()));
    let torch_names: Vec<&str> = names.iter().copied().filter(|n| *n != "context").collect();
    let torch = if torch_names.is_empty() {
        Err("no PyTorch side for these scenarios".to_string())
    } else if a.no_torch {
        Err("disabled with --no-torch".to_string())
    } else {
        eprintln!("running the PyTorch mirror (benches/torch/memcheck.py --scenario {})...", torch_names.join(","));
        run_torch(a, &torch_names, dev)
    };
    match &torch {
        Ok(v) => println!(
            "PyTorch side: torch {}, {} threads, bytes from {}.",
            v.get("torch_version").and_then(Value::as_str).unwrap_or("?"),
            v.get("threads").and_then(Value::as_u64).unwrap_or(0),
            v.get("measure").and_then(Value::as_str).unwrap_or("?")
        ),
        Err(why) if !torch_names.is_empty() => println!("PyTorch side skipped: {why}."),
        Err(_) => {}
    }
    let tv = |scenario: &str| torch.as_ref().ok().and_then(|v| v.get("scenarios")?.get(scenario).cloned());
    if a.reps == 0 {
        println!("tapir side: exact bytes from tapir's allocator counters ({dev}); one step each (--reps 0), its time including first use.");
    } else {
        println!("tapir side: exact bytes from tapir's allocator counters ({dev}); times are medians of {} steps after a warm-up.", a.reps);
    }
    let mut doc = serde_json::Map::new();
    for &name in names {
        let t0 = Instant::now();
        println!();
        match name {
            "attention" => {
                let (b, h, d, dt) = (a.batch, a.heads, a.head_dim, a.dtype);
                let dts = dt.cuda_suffix();
                println!("attention: causal, forward + backward, B={b}, H={h}, D={d} (C={}), {dts}", h * d);
                println!(
                    "{:>6} {:>12} {:>14} {:>9} {:>10} | {:>14} {:>10} | {:>12} {:>10} {:>7} | {:>12} {:>10} {:>7}",
                    "T",
                    "tapir peak",
                    "CUDA formula",
                    "live",
                    "time",
                    "composed peak",
                    "time",
                    "eager peak",
                    "time",
                    "peak x",
                    "SDPA peak",
                    "time",
                    "peak x"
                );
                let tt = tv("attention");
                let mut rows = Vec::new();
                for t in attention_ts(a, dev) {
                    let f = attention_figure(dev, dt, b, t, h, d, a.reps, false)
                        .with_context(|| format!("attention T={t}"))?;
                    let formula = fused_attention_formula(b, t, h * d, h, dt.size_in_bytes());
                    let composed = if t <= a.composed_max_t {
                        Some(
                            attention_figure(dev, dt, b, t, h, d, a.reps, true)
                                .with_context(|| format!("composed attention T={t}"))?,
                        )
                    } else {
                        None
                    };
                    let (cp, ct) = match &composed {
                        Some(c) => (mib(c.peak as f64), ms(c.seconds)),
                        None => (
                            format!(">{}", mib(composed_attention_floor(b, t, h, dt.size_in_bytes()) as f64)),
                            "-".to_string(),
                        ),
                    };
                    let tr = tt.as_ref().and_then(|v| v.get(t.to_string()));
                    let (e, s) = (tr.and_then(|r| r.get("eager")), tr.and_then(|r| r.get("sdpa")));
                    let (ep, _, et) = torch_fig(e);
                    let (sp, _, st) = torch_fig(s);
                    let peak_of = |v: Option<&Value>| v.and_then(|v| v.get("peak_bytes")).and_then(Value::as_f64);
                    println!(
                        "{t:>6} {:>12} {:>14} {:>9} {:>10} | {cp:>14} {ct:>10} | {ep:>12} {et:>10} {:>7} | {sp:>12} {st:>10} {:>7}",
                        mib(f.peak as f64),
                        if f.peak == formula { "= formula".to_string() } else { format!("{formula} B") },
                        format!("{} B", f.live),
                        ms(f.seconds),
                        ratio(f.peak as f64, peak_of(e)),
                        ratio(f.peak as f64, peak_of(s)),
                    );
                    rows.push(json!({"t": t, "tapir": f.json(), "formula_bytes": formula,
                                     "composed": composed.map(|c| c.json()),
                                     "composed_floor_bytes": composed_attention_floor(b, t, h, dt.size_in_bytes()),
                                     "torch": tr.cloned()}));
                }
                println!(
                    "(formula: {} B T C + 8 B H T bytes above q, k, v and the output's gradient ({dts}); the composed \
                     path runs up to --composed-max-t {}, past it '>' is its floor, two [B, H, T, T] {dts} tensors; \
                     'peak x' is PyTorch's peak over tapir's fused one)",
                    4 * dt.size_in_bytes(),
                    a.composed_max_t
                );
                doc.insert(name.into(), json!({"batch": b, "heads": h, "head_dim": d, "dtype": dts, "rows": rows}));
            }
            "checkpoint" | "amp" => {
                let s = GptShape {
                    vocab: a.vocab,
                    t: a.gpt_t,
                    batch: a.gpt_batch,
                    d_model: a.d_model,
                    layers: a.layers,
                    heads: a.heads,
                };
                let variants: [&str; 2] =
                    if name == "checkpoint" { ["plain", "checkpoint"] } else { ["plain", "bf16"] };
                println!(
                    "{name}: one training step (forward, backward, AdamW) of the tapir gpt model: vocab {}, T={}, batch {}, d_model {}, {} layers, {} heads",
                    s.vocab, s.t, s.batch, s.d_model, s.layers, s.heads
                );
                println!(
                    "{:>11} {:>12} {:>9} {:>10} | {:>12} {:>9} {:>10} | {:>7} {:>7}",
                    "variant", "tapir peak", "live", "time", "torch peak", "live", "time", "peak x", "time x"
                );
                let tt = tv(name);
                let mut rows = Vec::new();
                for v in variants {
                    let f = gpt_figure(dev, s, v, a.reps).with_context(|| format!("{name}: {v}"))?;
                    let tr = tt.as_ref().and_then(|x| x.get(v));
                    let (tp, tl, ts) = torch_fig(tr);
                    let get = |k: &str| tr.and_then(|x| x.get(k)).and_then(Value::as_f64);
                    println!(
                        "{v:>11} {:>12} {:>9} {:>10} | {tp:>12} {tl:>9} {ts:>10} | {:>7} {:>7}",
                        mib(f.peak as f64),
                        format!("{} B", f.live),
                        ms(f.seconds),
                        ratio(f.peak as f64, get("peak_bytes")),
                        ratio(f.seconds, get("seconds")),
                    );
                    rows.push(json!({"variant": v, "tapir": f.json(), "torch": tr.cloned()}));
                }
                println!("('peak x' and 'time x' are PyTorch's over tapir's)");
                doc.insert(
                    name.into(),
                    json!({"vocab": s.vocab, "t": s.t, "batch": s.batch, "d_model": s.d_model,
                           "layers": s.layers, "heads": s.heads, "rows": rows}),
                );
            }
            "context" => {
                let s = GptShape {
                    vocab: a.vocab,
                    t: 0,
                    batch: 1,
                    d_model: a.context_d_model,
                    layers: a.context_layers,
                    heads: a.heads,
                };
                let budget = (a.budget_mib * 1048576.0) as usize;
                println!(
                    "context: the longest T whose training step (batch 1, vocab {}, d_model {}, {} layers, {} heads, AdamW) peaks within {} on {dev}",
                    s.vocab, s.d_model, s.layers, s.heads, mib(budget as f64)
                );
                if !dev.is_cpu() {
                    let cap = std::env::var("TAPIR_CUDA_EMU_MEMORY").unwrap_or_else(|_| "unset".into());
                    println!(
                        "(TAPIR_CUDA_EMU_MEMORY={cap}; a context fits when its measured peak is within the budget: the \
                         caching allocator reserves whole segments beyond the peak, so give the device some more)"
                    );
                }
                let mut out = serde_json::Map::new();
                for composed in [false, true] {
                    let path = if composed { "composed" } else { "fused" };
                    let (points, best, peak) =
                        longest_context(dev, s, composed, budget, a.context_unit, &mut |l| println!("{l}"))?;
                    println!("  {path}: longest context {best} (peak {})", mib(peak as f64));
                    out.insert(
                        path.into(),
                        json!({"longest_t": best, "peak_bytes": peak,
                               "points": points.iter().map(|(t, p)| json!({"t": t, "peak_bytes": p})).collect::<Vec<_>>()}),
                    );
                }
                doc.insert(
                    name.into(),
                    json!({"budget_bytes": budget, "vocab": s.vocab, "d_model": s.d_model, "layers": s.layers,
                           "heads": s.heads, "paths": out}),
                );
            }
            other => anyhow::bail!("no scale scenario {other:?}"),
        }
        eprintln!("tapir: {name} ({:.1} s)", t0.elapsed().as_secs_f64());
    }
    Ok(json!({
        "schema": "tapir-memcheck-scale/1",
        "device": dev.to_string(),
        "emulated": emulated,
        "host_cpu": cpu,
        "reps": a.reps,
        "tapir_measure": format!("tapir allocator bytes (exact), {dev}"),
        "torch": torch.as_ref().ok().map(|v| json!({"version": v.get("torch_version"), "measure": v.get("measure"), "threads": v.get("threads")})),
        "torch_skipped": torch.as_ref().err(),
        "torch_raw": torch.as_ref().ok(),
        "scenarios": doc,
    }))
}
