//! `tapir memcheck`: PyTorch's memory-leak patterns, side by side.
//!
//! Each scenario runs the closest thing a tapir user would write to a
//! pattern that leaks (or balloons) in PyTorch, records live bytes at every
//! iteration boundary and the peak within each iteration, and, when python3
//! can import torch, runs the PyTorch mirror (benches/torch/memcheck.py)
//! with the same sizes and seeds.

use std::process::Command;
use std::time::Instant;

use anyhow::Context;
use serde_json::{json, Value};
use tapir::nn::{Activation, Mlp, ParamStore};
use tapir::prelude::*;
use tapir::tensor::ops::cross_entropy::CrossEntropyOptions;

use crate::chart::{line_chart, Panel, Series};
use crate::memcheck_args::torch_script;
pub use crate::memcheck_args::Args;

/// What one scenario measured in tapir.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Live bytes at each iteration boundary.
    pub live: Vec<usize>,
    /// Peak live bytes during each iteration.
    pub peak: Vec<usize>,
    /// Bytes the scenario deliberately keeps (returned values), cumulative,
    /// at each boundary: growth is measured beyond these.
    pub kept: Vec<usize>,
}

impl Measured {
    /// Growth per iteration after warm-up, beyond deliberately kept values,
    /// by least squares over the boundary series.
    pub fn slope(&self) -> f64 {
        let pts: Vec<(f64, f64)> = self
            .live
            .iter()
            .zip(&self.kept)
            .enumerate()
            .skip(warmup(self.live.len()))
            .map(|(i, (l, k))| (i as f64, *l as f64 - *k as f64))
            .collect();
        slope(&pts)
    }
    /// Largest peak over all iterations, relative to the first boundary.
    pub fn max_peak_over_start(&self) -> usize {
        let start = self.live.first().copied().unwrap_or(0);
        self.peak.iter().max().copied().unwrap_or(0).saturating_sub(start)
    }
    /// Growth in bytes from the first post-warm-up boundary to the last, beyond kept values.
    pub fn growth(&self) -> i64 {
        let w = warmup(self.live.len());
        if self.live.len() <= w {
            return 0;
        }
        let net = |i: usize| self.live[i] as i64 - self.kept[i] as i64;
        net(self.live.len() - 1) - net(w)
    }
}

fn warmup(n: usize) -> usize {
    (n / 10).clamp(1, 5).min(n.saturating_sub(1))
}

fn slope(pts: &[(f64, f64)]) -> f64 {
    if pts.len() < 2 {
        return 0.0;
    }
    let n = pts.len() as f64;
    let (mx, my) = (pts.iter().map(|p| p.0).sum::<f64>() / n, pts.iter().map(|p| p.1).sum::<f64>() / n);
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx
    }
}

/// A scenario: its name, the PyTorch pattern it mirrors, and what tapir does.
pub struct Scenario {
    /// Name (shared with the PyTorch mirror).
    pub name: &'static str,
    /// The PyTorch code that leaks or balloons.
    pub torch_pattern: &'static str,
    /// What tapir runs instead.
    pub tapir_pattern: &'static str,
    /// Runs it: (size scale, iterations, device) -> measurements.
    pub run: fn(f64, usize, Device) -> Result<Measured>,
}

/// Every scenario, in report order.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "create_graph_cycle",
            torch_pattern: "y = tanh(x); y.backward(torch.ones_like(y), create_graph=True)",
            tapir_pattern: "scope { dy = grad_graph(tanh(x)); grad(dy) }",
            run: create_graph_cycle,
        },
        Scenario {
            name: "pinn_create_graph",
            torch_pattern: "PINN loss on points with requires_grad; loss.backward(create_graph=True); p.grad = None",
            tapir_pattern: "scope { laplacian(net(x), x); grads(loss) }; adam.step",
            run: pinn_create_graph,
        },
        Scenario {
            name: "returned_second_derivative",
            torch_pattern: "d2 = autograd.grad(dy.sum(), x)[0] returned from a function and kept",
            tapir_pattern: "kept.push(scope { ...; grad(dy) })  (a plain tensor)",
            run: returned_second_derivative,
        },
        Scenario {
            name: "accumulated_loss",
            torch_pattern: "total_loss += loss  (loss still attached to its graph)",
            tapir_pattern: "total += scope { ... loss.item() }",
            run: accumulated_loss,
        },
        Scenario {
            name: "eager_graph_growth",
            torch_pattern: "outputs.append(model(x)) in an eager loop on new inputs (seed 001, docs/motivation.md)",
            tapir_pattern: "outputs.push(scope { model(x).value() })",
            run: eager_graph_growth,
        },
        Scenario {
            name: "onehot_cross_entropy",
            torch_pattern:
                "-(one_hot(y) * log_softmax(x)).sum(-1).mean() vs F.cross_entropy (seed 000, docs/motivation.md)",
            tapir_pattern: "x.sparse_cross_entropy(y)  (no one-hot; per-row lse saved)",
            run: onehot_cross_entropy,
        },
        Scenario {
            name: "hessian_optimizer_loop",
            torch_pattern: "loss.backward(create_graph=True); Hv = autograd.grad(g @ v, p); never zero_grad",
            tapir_pattern: "scope { hvp(loss, p, v) }; p -= lr * Hv",
            run: hessian_optimizer_loop,
        },
    ]
}

/// Runs `step` `iters` times, recording `device`'s boundaries and peaks;
/// `step` returns the bytes it deliberately keeps (cumulative).
fn measure(iters: usize, device: Device, mut step: impl FnMut(usize) -> Result<usize>) -> Result<Measured> {
    let mut m =
        Measured { live: Vec::with_capacity(iters), peak: Vec::with_capacity(iters), kept: Vec::with_capacity(iters) };
    for i in 0..iters {
        reset_peak_memory_stats(device);
        let kept = step(i)?;
        m.peak.push(max_memory_allocated(device));
        m.live.push(memory_allocated(device));
        m.kept.push(kept);
    }
    Ok(m)
}

use tapir::tensor::max_memory_allocated;

fn scaled(base: usize, size: f64) -> usize {
    ((base as f64 * size).round() as usize).max(1)
}

/// Seed 003: a first derivative with create_graph, then a second.
pub fn create_graph_cycle(size: f64, iters: usize, dev: Device) -> Result<Measured> {
    let n = scaled(200_000, size);
    let x0 = Rng::new(3).randn([n], DType::F32)?.to_device(dev)?;
    measure(iters, dev, |_| {
        Graph::scope(|g| {
            let x = g.leaf(x0.clone());
            let dy = g.grad_graph(x.tanh()?.sum_all()?, &[x])?[0];
            let _d2 = g.grad(dy.sum_all()?, &[x])?;
            Ok(0)
        })
    })
}

/// A PINN step: Laplacian of an MLP at collocation points, loss, gradients
/// with respect to the parameters, Adam.
pub fn pinn_create_graph(size: f64, iters: usize, dev: Device) -> Result<Measured> {
    let n = scaled(512, size);
    let mut rng = Rng::new(11);
    let mut store = ParamStore::new();
    let net = Mlp::xavier(&mut store, "u", &[2, 64, 64, 1], Activation::Tanh, &mut rng, DType::F32)?;
    store.to_device(dev)?;
    let mut opt = tapir::nn::Adam::new(1e-3);
    let pts = rng.rand([n, 2], DType::F32)?.to_device(dev)?;
    measure(iters, dev, |_| {
        let grads = Graph::scope(|g| {
            let p = store.bind(g);
            let x = g.leaf(pts.clone());
            let u = net.forward(&p, x)?;
            let lap = g.laplacian(u, x)?;
            let loss = lap.add_scalar(1.0)?.square()?.mean_all()?;
            p.grads(loss)
        })?;
        use tapir::nn::Optimizer;
        opt.step(&mut store, &grads)?;
        Ok(0)
    })
}

/// Seed 003's workaround pattern: second derivatives returned and kept.
pub fn returned_second_derivative(size: f64, iters: usize, dev: Device) -> Result<Measured> {
    let n = scaled(100_000, size);
    let x0 = Rng::new(5).randn([n], DType::F32)?.to_device(dev)?;
    let mut kept: Vec<Tensor> = Vec::new();
    let d2 = |x0: &Tensor| {
        Graph::scope(|g| {
            let x = g.leaf(x0.clone());
            let dy = g.grad_graph(x.tanh()?.sum_all()?, &[x])?[0];
            Ok::<_, Error>(g.grad(dy.sum_all()?, &[x])?.remove(0))
        })
    };
    measure(iters, dev, |_| {
        kept.push(d2(&x0)?);
        Ok(kept.iter().map(|t| t.numel() * 4).sum())
    })
}

/// `total_loss += loss` across training steps.
pub fn accumulated_loss(size: f64, iters: usize, dev: Device) -> Result<Measured> {
    let (b, d) = (scaled(256, size), 512);
    let mut rng = Rng::new(7);
    let mut store = ParamStore::new();
    let net = Mlp::new(&mut store, "m", &[d, d, 1], Activation::Relu, &mut rng, DType::F32)?;
    store.to_device(dev)?;
    let mut total = 0.0f64;
    let m = measure(iters, dev, |i| {
        let x = Rng::new(100 + i as u64).randn([b, d], DType::F32)?.to_device(dev)?;
        let (loss, _grads) = Graph::scope(|g| {
            let p = store.bind(g);
            let loss = net.forward(&p, g.constant(x))?.square()?.mean_all()?;
            Ok::<_, Error>((loss.item()?, p.grads(loss)?))
        })?;
        total += loss;
        Ok(0)
    })?;
    std::hint::black_box(total);
    Ok(m)
}

/// Seed 001: a model called eagerly on new inputs, outputs kept.
pub fn eager_graph_growth(size: f64, iters: usize, dev: Device) -> Result<Measured> {
    let (b, d) = (scaled(256, size), 512);
    let mut rng = Rng::new(9);
    let mut store = ParamStore::new();
    let net = Mlp::new(&mut store, "m", &[d, d, d, 10], Activation::Relu, &mut rng, DType::F32)?;
    store.to_device(dev)?;
    let mut outputs: Vec<Tensor> = Vec::new();
    measure(iters, dev, |i| {
        let x = Rng::new(1000 + i as u64).randn([b, d], DType::F32)?.to_device(dev)?;
        outputs.push(Graph::scope(|g| net.forward(&store.bind(g), g.constant(x))?.value())?);
        Ok(outputs.iter().map(|t| t.numel() * 4).sum())
    })
}

/// Seed 000: peak memory of cross-entropy forward+backward.
pub fn onehot_cross_entropy(size: f64, iters: usize, dev: Device) -> Result<Measured> {
    let (n, v) = (scaled(1024, size), 32_000);
    let mut rng = Rng::new(13);
    let x0 = rng.uniform([n, v], -3.0, 3.0, DType::F32)?.to_device(dev)?;
    let labels = rng.randint([n], v as u64, DType::I64)?.to_device(dev)?;
    let iters = iters.min(10);
    measure(iters, dev, |_| {
        Graph::scope(|g| {
            let x = g.leaf(x0.clone());
            let loss = x.sparse_cross_entropy_with(&labels, CrossEntropyOptions::default())?;
            let _grad = g.grad(loss, &[x])?;
            Ok(0)
        })
    })
}

/// A Hessian-vector-product optimizer loop (Newton-CG style steps).
pub fn hessian_optimizer_loop(size: f64, iters: usize, dev: Device) -> Result<Measured> {
    let n = scaled(200_000, size);
    let mut rng = Rng::new(17);
    let a = rng.randn([n], DType::F32)?.to_device(dev)?;
    let mut p = rng.randn([n], DType::F32)?.to_device(dev)?;
    let v = rng.randn([n], DType::F32)?.to_device(dev)?;
    measure(iters, dev, |_| {
        let hv = Graph::scope(|g| {
            let pv = g.leaf(p.clone());
            let loss = g.constant(a.clone()).mul(&pv)?.tanh()?.square()?.sum_all()?;
            g.hvp(loss, pv, &v)
        })?;
        p = p.sub(&hv.mul_scalar(1e-3)?)?;
        Ok(0)
    })
}

/// One scenario's tapir and (optional) PyTorch results.
struct Row {
    name: &'static str,
    tapir: Measured,
    torch: Option<Value>,
}

/// Runs the PyTorch mirror; `Err` carries why it could not run.
fn run_torch(a: &Args, names: &[&str], device: Device) -> std::result::Result<Value, String> {
    let script = torch_script().ok_or("benches/torch/memcheck.py not found")?;
    let probe = Command::new(&a.python).args(["-c", "import torch"]).output();
    match probe {
        Err(_) => return Err(format!("{} not found", a.python)),
        Ok(o) if !o.status.success() => return Err(format!("{} cannot import torch", a.python)),
        Ok(_) => {}
    }
    let out = Command::new(&a.python)
        .arg(&script)
        .args(["--iters", &a.iters.to_string(), "--size", &a.size.to_string(), "--only", &names.join(",")])
        .args(["--device", &device.to_string()])
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.code() == Some(3) {
        // The mirror's way of saying torch has no CUDA here.
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    if !out.status.success() {
        return Err(format!("the PyTorch mirror failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("the PyTorch mirror printed no JSON: {e}"))
}

/// (iteration, MiB above the first value) points of a series.
fn relative(v: impl Iterator<Item = f64>) -> Vec<(f64, f64)> {
    let v: Vec<f64> = v.collect();
    let first = v.first().copied().unwrap_or(0.0);
    v.iter().enumerate().map(|(i, b)| (i as f64, (b - first) / 1048576.0)).collect()
}

fn mib(b: f64) -> String {
    format!("{:.2} MiB", b / (1024.0 * 1024.0))
}

fn torch_slope(v: &Value) -> Option<f64> {
    let series: Vec<f64> = v.get("live")?.as_array()?.iter().filter_map(|x| x.as_f64()).collect();
    let kept: Vec<f64> = v.get("kept")?.as_array()?.iter().filter_map(|x| x.as_f64()).collect();
    let pts: Vec<(f64, f64)> =
        series.iter().zip(&kept).enumerate().skip(warmup(series.len())).map(|(i, (l, k))| (i as f64, l - k)).collect();
    Some(slope(&pts))
}

fn torch_peak(v: &Value) -> Option<f64> {
    let start = v.get("live")?.as_array()?.first()?.as_f64()?;
    let p = v.get("peak")?.as_array()?.iter().filter_map(|x| x.as_f64()).fold(0.0, f64::max);
    Some((p - start).max(0.0))
}

/// The numbers of a JSON array.
fn floats(v: Option<&Value>) -> Vec<f64> {
    v.and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default()
}

/// One scenario's chart panel. Most scenarios draw live bytes at each
/// iteration boundary; the cross-entropy one, whose point is its peak,
/// draws the peak within each iteration (tapir, and PyTorch's
/// F.cross_entropy and one-hot formula); scenarios that keep values on
/// purpose draw the bytes beyond the kept values, the figure the table
/// reports, beside tapir's live bytes with them.
fn panel(r: &Row, torch_label: &str) -> Panel {
    let t = &r.tapir;
    let torch = r.torch.as_ref();
    let f = |v: &[usize]| v.iter().map(|&b| b as f64).collect::<Vec<_>>();
    // tapir first and PyTorch second in every panel, so each keeps its
    // colour across the chart.
    let mut series = Vec::new();
    let (title, y_label) = if r.name == "onehot_cross_entropy" {
        // Peaks above the lowest boundary of the run: a resident set can
        // fall below its first value once the C allocator hands memory
        // back, so the first boundary as the baseline would draw negative
        // peaks.
        let above = |peak: &[f64], live: &[f64]| -> Vec<(f64, f64)> {
            let base = live.iter().copied().fold(f64::INFINITY, f64::min);
            let base = if base.is_finite() { base } else { 0.0 };
            peak.iter().enumerate().map(|(i, p)| (i as f64, (p - base).max(0.0) / 1048576.0)).collect()
        };
        series.push(Series {
            label: "tapir sparse_cross_entropy (exact)".into(),
            points: above(&f(&t.peak), &f(&t.live)),
        });
        if let Some(v) = torch {
            series.push(Series {
                label: format!("{torch_label}: F.cross_entropy"),
                points: above(&floats(v.get("peak")), &floats(v.get("live"))),
            });
            if let Some(o) = v.get("variants").and_then(|x| x.get("onehot_formula")) {
                series.push(Series {
                    label: format!("{torch_label}: one-hot formula"),
                    points: above(&floats(o.get("peak")), &floats(o.get("live"))),
                });
            }
        }
        (format!("{}: peak of forward + backward, each iteration", r.name), "peak MiB above the lowest boundary")
    } else {
        let kept_any = t.kept.iter().any(|&k| k > 0);
        let beyond = |live: &[f64], kept: &[f64]| {
            relative(live.iter().zip(kept.iter().chain(std::iter::repeat(&0.0))).map(|(l, k)| l - k))
        };
        let (live, kept) = (f(&t.live), f(&t.kept));
        let label = if kept_any { "tapir: live beyond kept values (exact)" } else { "tapir: live bytes (exact)" };
        series.push(Series { label: label.into(), points: beyond(&live, &kept) });
        if let Some(v) = torch {
            let (live, kept) = (floats(v.get("live")), floats(v.get("kept")));
            if !live.is_empty() {
                let label =
                    if kept_any { format!("{torch_label} beyond kept values") } else { torch_label.to_string() };
                series.push(Series { label, points: beyond(&live, &kept) });
            }
        }
        if kept_any {
            series
                .push(Series { label: "tapir: live, kept values included".into(), points: relative(live.into_iter()) });
        }
        let title =
            if kept_any { format!("{} (values kept on purpose are shown apart)", r.name) } else { r.name.to_string() };
        (title, "MiB above the first boundary")
    };
    Panel {
        title,
        x_label: "iteration".into(),
        y_label: y_label.into(),
        series,
        log_y: false,
        integer_x: true,
        markers: vec![],
    }
}

/// Runs the command.
pub fn run(a: Args) -> anyhow::Result<()> {
    let mut scale: Vec<&str> = Vec::new();
    let mut leaks = false;
    for s in &a.scenario {
        match s.as_str() {
            "leaks" => leaks = true,
            "scale" => scale.extend(["attention", "checkpoint", "amp"]),
            other => match crate::memcheck_scale::SCALE_SCENARIOS.iter().find(|n| **n == other) {
                Some(n) => scale.push(n),
                None => anyhow::bail!(
                    "no scenario {other:?}: leaks, scale, {}",
                    crate::memcheck_scale::SCALE_SCENARIOS.join(", ")
                ),
            },
        }
    }
    scale.dedup();
    if a.dtype != DType::F32 && !scale.contains(&"attention") {
        anyhow::bail!(
            "--dtype {} applies to the attention scenario (--scenario attention, or scale, which runs it); \
             the others run in f32 (amp compares f32 with bf16 itself)",
            a.dtype.cuda_suffix()
        );
    }
    if leaks {
        run_leaks(&a)?;
    }
    if !scale.is_empty() {
        let started = Instant::now();
        let doc = crate::memcheck_scale::run(&a, &scale, a.device.pick()?)?;
        // Beside the leak report when both ran, else in its place.
        let path = if leaks { a.json.with_extension("scale.json") } else { a.json.clone() };
        std::fs::write(&path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!();
        println!("report: {}   ({:.1} s)", path.display(), started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// The leak patterns (`--scenario leaks`).
fn run_leaks(a: &Args) -> anyhow::Result<()> {
    let all = scenarios();
    let known = || all.iter().map(|s| s.name).collect::<Vec<_>>().join(", ");
    if let Some(bad) = a.only.iter().find(|o| !all.iter().any(|s| &s.name == o)) {
        anyhow::bail!("no scenario is named {bad:?}; known: {}", known());
    }
    let chosen: Vec<&Scenario> =
        all.iter().filter(|s| a.only.is_empty() || a.only.iter().any(|o| o == s.name)).collect();
    anyhow::ensure!(!chosen.is_empty(), "no scenario chosen; known: {}", known());
    let device = a.device.pick()?;
    let started = Instant::now();
    println!("tapir memcheck: {} iterations per scenario, size x{}, on {device}", a.iters, a.size);
    println!("tapir side: exact live bytes from tapir's allocator counters ({device}).");
    let torch = if a.no_torch {
        Err("disabled with --no-torch".to_string())
    } else {
        eprintln!("running the PyTorch mirror (benches/torch/memcheck.py)...");
        run_torch(a, &chosen.iter().map(|s| s.name).collect::<Vec<_>>(), device)
    };
    match &torch {
        Ok(v) => println!(
            "PyTorch side: {} (torch {}).",
            v.get("measure").and_then(|m| m.as_str()).unwrap_or("?"),
            v.get("torch_version").and_then(|m| m.as_str()).unwrap_or("?")
        ),
        Err(why) => println!(
            "PyTorch side skipped: {why}. To compare, install it (`pip install torch`{}) and rerun.",
            if device.is_cpu() { "" } else { ", a build with CUDA" }
        ),
    }
    if torch.is_ok() && device.is_cpu() {
        println!("Note: on the CPU these differ in kind: tapir counts its tensors' bytes exactly; PyTorch's figure is");
        println!("the process's resident set, which also moves with the C allocator. Growth per iteration is what to compare.");
    }
    let mut rows = Vec::new();
    for s in &chosen {
        let t0 = Instant::now();
        let m = (s.run)(a.size, a.iters, device).with_context(|| format!("scenario {}", s.name))?;
        eprintln!("tapir: {} ({:.1} s)", s.name, t0.elapsed().as_secs_f64());
        let t = torch.as_ref().ok().and_then(|v| v.get("scenarios")?.get(s.name).cloned());
        rows.push(Row { name: s.name, tapir: m, torch: t });
    }
    println!();
    println!(
        "{:<28} {:>16} {:>16} {:>16} {:>16}  verdict",
        "scenario", "tapir growth/it", "torch growth/it", "tapir peak", "torch peak"
    );
    let mut report = Vec::new();
    for r in &rows {
        let ts = r.tapir.slope();
        let tp = r.tapir.max_peak_over_start() as f64;
        let (os, op) = match &r.torch {
            Some(v) => (torch_slope(v), torch_peak(v)),
            None => (None, None),
        };
        let fmt_opt = |x: Option<f64>| x.map(mib).unwrap_or_else(|| "-".into());
        let verdict = match (r.tapir.growth(), os) {
            (0, Some(o)) if o > 1024.0 => format!("tapir flat; PyTorch grows {} per iteration", mib(o)),
            (0, _) if r.name == "onehot_cross_entropy" => match op {
                Some(o) if o > 0.0 => format!("tapir flat; peak {:.2}x of PyTorch's", tp / o),
                _ => "tapir flat".to_string(),
            },
            (0, _) => "tapir flat (exactly 0 bytes growth)".to_string(),
            (g, _) => format!("tapir GREW {g} bytes"),
        };
        println!("{:<28} {:>16} {:>16} {:>16} {:>16}  {}", r.name, mib(ts), fmt_opt(os), mib(tp), fmt_opt(op), verdict);
        if let Some(vars) = r.torch.as_ref().and_then(|v| v.get("variants")).and_then(|v| v.as_object()) {
            for (k, v) in vars {
                if let Some(b) = v.get("peak_over_start_bytes").and_then(|b| b.as_f64()) {
                    println!(
                        "{:<28} {:>16} {:>16} {:>16} {:>16}  PyTorch {k}: peak {:.2}x tapir's",
                        "",
                        "",
                        "",
                        "",
                        mib(b),
                        b / tp.max(1.0)
                    );
                }
            }
        }
        report.push(json!({
            "name": r.name,
            "tapir": {
                "live": r.tapir.live, "peak": r.tapir.peak, "kept": r.tapir.kept,
                "growth_bytes": r.tapir.growth(), "slope_bytes_per_iter": ts, "peak_over_start_bytes": tp,
            },
            "torch": r.torch.clone().unwrap_or(Value::Null),
            "torch_slope_bytes_per_iter": os, "torch_peak_over_start_bytes": op,
            "verdict": verdict,
        }));
    }
    let doc = json!({
        "schema": "tapir-memcheck/1",
        "iters": a.iters,
        "size": a.size,
        "device": device.to_string(),
        "tapir_measure": format!("tapir allocator live bytes (exact), {device}"),
        "torch_measure": torch.as_ref().ok().and_then(|v| v.get("measure").cloned()).unwrap_or(Value::Null),
        "torch_skipped": torch.as_ref().err(),
        "scenarios": report,
        "seconds": started.elapsed().as_secs_f64(),
    });
    std::fs::write(&a.json, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", a.json.display()))?;
    let torch_label = match torch.as_ref().ok().and_then(|v| v.get("measure")).and_then(Value::as_str) {
        Some(m) if m.contains("memory_allocated") => "PyTorch (allocator bytes)",
        _ => "PyTorch (resident set)",
    };
    let panels: Vec<Panel> = rows.iter().map(|r| panel(r, torch_label)).collect();
    line_chart(&a.plot, &panels)?;
    println!();
    println!("report: {}   chart: {}   ({:.1} s)", a.json.display(), a.plot.display(), started.elapsed().as_secs_f64());
    Ok(())
}
