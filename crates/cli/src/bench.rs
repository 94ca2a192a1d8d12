//! `tapir bench`: timings of tapir beside its PyTorch mirror
//! (benches/torch/bench.py), same shapes and seeds, in one run, as ratios.
//!
//! Absolute times on a shared machine are noisy; each case reports the
//! median of several repetitions (at least 0.3 s of them) and the tapir /
//! PyTorch ratio. `--rounds N` repeats both sides N times (tapir's cases,
//! then the mirror's), so a machine whose speed drifts over minutes shows
//! as a range of ratios; the median ratio is reported.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::{json, Value};
use tapir::nn::{Activation, Adam, Mlp, Optimizer, ParamStore};
use tapir::prelude::*;

use crate::device::DeviceArg;

/// Arguments of `tapir bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Cases to run (comma-separated); all by default.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Repetitions per case, at least: each case also repeats for at least
    /// 0.3 s (the median is reported).
    #[arg(long, default_value_t = 15)]
    pub reps: usize,
    /// Skip the PyTorch side.
    #[arg(long)]
    pub no_torch: bool,
    /// Rounds of both sides over every chosen case; the median of the
    /// rounds is reported, with the range of their ratios.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// The python interpreter for the PyTorch side.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Where to write the JSON figures.
    #[arg(long, default_value = "bench.json")]
    pub json: PathBuf,
    /// Where to write the PNG chart of the tapir / PyTorch time ratios
    /// (nothing is drawn when the PyTorch side did not run).
    #[arg(long, default_value = "bench.png")]
    pub plot: PathBuf,
    /// Where to run: cpu, cuda, cuda:N, or auto (CUDA when present, else the
    /// CPU). The PyTorch mirror runs on the same device.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
}

/// Each case repeats at least `--reps` times and for at least this long
/// (benches/torch/bench.py keeps the same floor). Fifteen repetitions of a
/// 0.34 ms step are 5 ms, short enough that a round fell on whatever the
/// machine did then: tapir's mlp_grad rounds were 0.336 ms or 0.63 ms (one
/// thread's time) right after the mirror's process exited, where 300
/// repetitions gave 0.335-0.338 ms in every round.
const MIN_SECONDS: f64 = 0.3;

/// Median wall time of `f` in milliseconds on `device`, after one warm-up
/// call, over at least `reps` calls and [`MIN_SECONDS`]; on CUDA each
/// call's time includes waiting for its kernels.
fn median_ms(reps: usize, device: Device, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut f = move || -> Result<()> {
        f()?;
        if !device.is_cpu() {
            tapir::tensor::cuda::synchronize(device)?;
        }
        Ok(())
    };
    f()?;
    let start = Instant::now();
    let mut t = Vec::new();
    while t.len() < reps.max(1) || start.elapsed().as_secs_f64() < MIN_SECONDS {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64() * 1e3);
    }
    t.sort_by(|a, b| a.total_cmp(b));
    Ok(t[t.len() / 2])
}

/// One benchmark case.
pub struct Case {
    /// Name shared with the PyTorch mirror.
    pub name: &'static str,
    /// What it measures.
    pub what: &'static str,
    /// Runs it, returning the median milliseconds.
    pub run: fn(usize, Device) -> Result<f64>,
    /// Peak bytes allocated during one run above the bytes live before it
    /// (for the memory cases), measured by a separate run.
    pub peak: Option<fn(Device) -> Result<usize>>,
}

/// Every case.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "scalar_chain",
            what: "10,000 scalar ops forward + backward (graph overhead)",
            run: scalar_chain,
            peak: None,
        },
        Case {
            name: "mlp_grad",
            what: "gradient of an MLP 2-64-64-64-1 tanh loss, 1,024 points",
            run: mlp_grad,
            peak: None,
        },
        Case {
            name: "mlp_hvp",
            what: "Hessian-vector product of the same loss w.r.t. the parameters",
            run: mlp_hvp,
            peak: None,
        },
        Case {
            name: "poisson_step",
            what: "Poisson PINN step: Laplacian, loss, backward, Adam (N=1,024)",
            run: poisson_step,
            peak: None,
        },
        Case {
            name: "laplacian_d10",
            what: "exact Laplacian of an MLP (width 128, depth 3, batch 256), d=10",
            run: |r, d| laplacian(r, d, 10, false),
            peak: None,
        },
        Case { name: "laplacian_d100", what: "the same, d=100", run: |r, d| laplacian(r, d, 100, false), peak: None },
        Case {
            name: "laplacian_d10_nested",
            what: "d=10 by nested autodiff in tapir (the alternative)",
            run: |r, d| laplacian(r, d, 10, true),
            peak: None,
        },
        Case {
            name: "laplacian_d100_nested",
            what: "d=100 by nested autodiff in tapir (the alternative)",
            run: |r, d| laplacian(r, d, 100, true),
            peak: None,
        },
        Case {
            name: "ce_4096x32000",
            what: "sparse cross-entropy forward+backward, N=4,096, V=32,000",
            run: |r, d| ce_time(r, d, 4096, 32_000),
            peak: Some(|d| ce_peak(d, 4096, 32_000)),
        },
        Case {
            name: "ce_8192x50257",
            what: "sparse cross-entropy forward+backward, N=8,192, V=50,257",
            run: |r, d| ce_time(r, d, 8192, 50_257),
            peak: Some(|d| ce_peak(d, 8192, 50_257)),
        },
        Case {
            name: "linear_ce_4096x32000x768",
            what: "fused linear + cross-entropy forward+backward, N=4,096, V=32,000, D=768",
            run: |r, d| linear_ce_time(r, d, 4096, 32_000, 768),
            peak: Some(|d| linear_ce_peak(d, 4096, 32_000, 768)),
        },
    ]
}

/// The cases at a GPU's scale, run only on CUDA (the CPU has neither the
/// memory nor the time for them): both losses at the shapes of a mini-GPT
/// and of a 128K-vocabulary model, the fused head in bf16.
pub fn cuda_cases() -> Vec<Case> {
    vec![
        Case {
            name: "ce_32768x32000",
            what: "sparse cross-entropy forward+backward, N=32,768, V=32,000",
            run: |r, d| ce_time(r, d, 32_768, 32_000),
            peak: Some(|d| ce_peak(d, 32_768, 32_000)),
        },
        Case {
            name: "ce_8192x128256",
            what: "sparse cross-entropy forward+backward, N=8,192, V=128,256",
            run: |r, d| ce_time(r, d, 8192, 128_256),
            peak: Some(|d| ce_peak(d, 8192, 128_256)),
        },
        Case {
            name: "linear_ce_8192x128256x4096_bf16",
            what: "fused linear + cross-entropy forward+backward in bf16, N=8,192, V=128,256, D=4,096",
            run: |r, d| linear_ce_time_in(r, d, 8192, 128_256, 4096, DType::BF16),
            peak: Some(|d| linear_ce_peak_in(d, 8192, 128_256, 4096, DType::BF16)),
        },
    ]
}

fn ce_inputs(device: Device, n: usize, v: usize) -> Result<(Tensor, Tensor)> {
    let mut rng = Rng::new(0);
    let x = rng.uniform([n, v], -3.0, 3.0, DType::F32)?.to_device(device)?;
    Ok((x, rng.randint([n], v as u64, DType::I64)?.to_device(device)?))
}

fn ce_step(x: &Tensor, labels: &Tensor) -> Result<()> {
    Graph::scope(|g| {
        let xv = g.leaf(x.clone());
        let loss = xv.sparse_cross_entropy(labels)?;
        std::hint::black_box(g.grad(loss, &[xv])?);
        Ok(())
    })
}

fn ce_time(reps: usize, device: Device, n: usize, v: usize) -> Result<f64> {
    let (x, l) = ce_inputs(device, n, v)?;
    median_ms(reps.min(5), device, || ce_step(&x, &l))
}

fn ce_peak(device: Device, n: usize, v: usize) -> Result<usize> {
    let (x, l) = ce_inputs(device, n, v)?;
    reset_peak_memory_stats(device);
    let base = memory_allocated(device);
    ce_step(&x, &l)?;
    Ok(tapir::tensor::max_memory_allocated(device) - base)
}

/// Hidden states `[n, d]`, a vocabulary matrix `[v, d]` and labels, drawn
/// in f32 on the host and stored in `dtype` on `device`.
fn linear_ce_inputs(device: Device, n: usize, v: usize, d: usize, dtype: DType) -> Result<(Tensor, Tensor, Tensor)> {
    let mut rng = Rng::new(0);
    Ok((
        rng.randn([n, d], DType::F32)?.cast(dtype)?.to_device(device)?,
        rng.normal_tensor([v, d], 0.0, 0.02, DType::F32)?.cast(dtype)?.to_device(device)?,
        rng.randint([n], v as u64, DType::I64)?.to_device(device)?,
    ))
}

fn linear_ce_step(h: &Tensor, w: &Tensor, labels: &Tensor) -> Result<()> {
    Graph::scope(|g| {
        let (hv, wv) = (g.leaf(h.clone()), g.leaf(w.clone()));
        let opts = tapir::tensor::ops::cross_entropy::CrossEntropyOptions::default();
        let loss = hv.linear_cross_entropy(&wv, None, labels, opts, None)?;
        std::hint::black_box(g.grad(loss, &[hv, wv])?);
        Ok(())
    })
}

fn linear_ce_time(reps: usize, device: Device, n: usize, v: usize, d: usize) -> Result<f64> {
    linear_ce_time_in(reps, device, n, v, d, DType::F32)
}

fn linear_ce_time_in(reps: usize, device: Device, n: usize, v: usize, d: usize, dtype: DType) -> Result<f64> {
    let (h, w, l) = linear_ce_inputs(device, n, v, d, dtype)?;
    median_ms(reps.min(3), device, || linear_ce_step(&h, &w, &l))
}

fn linear_ce_peak(device: Device, n: usize, v: usize, d: usize) -> Result<usize> {
    linear_ce_peak_in(device, n, v, d, DType::F32)
}

fn linear_ce_peak_in(device: Device, n: usize, v: usize, d: usize, dtype: DType) -> Result<usize> {
    let (h, w, l) = linear_ce_inputs(device, n, v, d, dtype)?;
    reset_peak_memory_stats(device);
    let base = memory_allocated(device);
    linear_ce_step(&h, &w, &l)?;
    Ok(tapir::tensor::max_memory_allocated(device) - base)
}

fn scalar_chain(reps: usize, device: Device) -> Result<f64> {
    let x0 = Tensor::from_vec(vec![0.5f32], [1])?.to_device(device)?;
    median_ms(reps, device, || {
        Graph::scope(|g| {
            let x = g.leaf(x0.clone());
            let mut y = x;
            for i in 0..10_000 {
                y = match i % 4 {
                    0 => y.mul_scalar(1.0001)?,
                    1 => y.add_scalar(1e-4)?,
                    2 => y.mul(&x)?.mul_scalar(0.5)?.add(&y)?.mul_scalar(0.6)?,
                    _ => y.tanh()?,
                };
            }
            g.grad(y.sum_all()?, &[x])?;
            Ok(())
        })
    })
}

fn mlp(seed: u64, widths: &[usize], device: Device) -> Result<(ParamStore, Mlp)> {
    let mut store = ParamStore::new();
    let net = Mlp::xavier(&mut store, "u", widths, Activation::Tanh, &mut Rng::new(seed), DType::F32)?;
    store.to_device(device)?;
    Ok((store, net))
}

fn mlp_grad(reps: usize, device: Device) -> Result<f64> {
    let (store, net) = mlp(0, &[2, 64, 64, 64, 1], device)?;
    let x = Rng::new(1).rand([1024, 2], DType::F32)?.to_device(device)?;
    median_ms(reps, device, || {
        Graph::scope(|g| {
            let p = store.bind(g);
            let loss = net.forward(&p, g.constant(x.clone()))?.square()?.mean_all()?;
            p.grads(loss)?;
            Ok(())
        })
    })
}

fn mlp_hvp(reps: usize, device: Device) -> Result<f64> {
    let (store, net) = mlp(0, &[2, 64, 64, 64, 1], device)?;
    let x = Rng::new(1).rand([1024, 2], DType::F32)?.to_device(device)?;
    let mut rng = Rng::new(2);
    let v: Vec<Tensor> = store
        .ids()
        .map(|id| rng.randn(store.get(id).shape().clone(), DType::F32)?.to_device(device))
        .collect::<Result<_>>()?;
    median_ms(reps, device, || {
        Graph::scope(|g| {
            let p = store.bind(g);
            let loss = net.forward(&p, g.constant(x.clone()))?.square()?.mean_all()?;
            let vars: Vec<Var<'_>> = store.ids().map(|id| p.var(id)).collect::<Result<_>>()?;
            let gs = g.grad_graph(loss, &vars)?;
            let hv = g.jvp(&gs, &vars, &v)?;
            std::hint::black_box(hv);
            Ok(())
        })
    })
}

fn poisson_step(reps: usize, device: Device) -> Result<f64> {
    let (mut store, net) = mlp(0, &[2, 64, 64, 64, 1], device)?;
    let x = Rng::new(1).rand([1024, 2], DType::F32)?.to_device(device)?;
    let f = x.narrow(1, 0, 1)?.mul_scalar(std::f64::consts::PI)?.sin()?;
    let mut opt = Adam::new(1e-3);
    median_ms(reps, device, || {
        let grads = Graph::scope(|g| {
            let p = store.bind(g);
            let jet = net.forward_jet(&p, g.constant(x.clone()), &[0, 1])?;
            let loss = jet.laplacian.add(&g.constant(f.clone()))?.square()?.mean_all()?;
            p.grads(loss)
        })?;
        opt.step(&mut store, &grads)
    })
}

fn laplacian(reps: usize, device: Device, d: usize, nested: bool) -> Result<f64> {
    let (store, net) = mlp(0, &[d, 128, 128, 128, 1], device)?;
    let x = Rng::new(1).randn([256, d], DType::F32)?.to_device(device)?;
    median_ms(reps, device, || {
        Graph::scope(|g| {
            let p = store.bind(g);
            let xv = g.leaf(x.clone());
            let lap = if nested {
                g.laplacian(net.forward(&p, xv)?, xv)?
            } else {
                net.forward_jet(&p, xv, &(0..d).collect::<Vec<_>>())?.laplacian
            };
            std::hint::black_box(lap.value()?);
            Ok(())
        })
    })
}

/// A tapir / PyTorch time ratio in words: below 1 tapir took less time.
/// Within 2% either way the two are called even: closer than this
/// machine's run-to-run spread.
pub fn time_verdict(ratio: f64) -> &'static str {
    if !ratio.is_finite() {
        "?"
    } else if ratio < 0.98 {
        "faster"
    } else if ratio > 1.02 {
        "slower"
    } else {
        "even"
    }
}

/// A ratio with its verdict, e.g. `1.212x slower`.
fn ratio_words(ratio: f64) -> String {
    format!("{ratio:.3}x {}", time_verdict(ratio))
}

fn torch_script() -> Option<PathBuf> {
    [
        PathBuf::from("benches/torch/bench.py"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/torch/bench.py"),
    ]
    .into_iter()
    .find(|p| p.exists())
}

/// Runs the command.
pub fn run(a: Args) -> anyhow::Result<()> {
    let device = a.device.pick()?;
    let mut all = cases();
    let cuda_only = cuda_cases();
    if let Some(bad) = a.only.iter().find(|o| !all.iter().chain(&cuda_only).any(|c| &c.name == o)) {
        let known: Vec<&str> = all.iter().map(|c| c.name).collect();
        let gpu: Vec<&str> = cuda_only.iter().map(|c| c.name).collect();
        anyhow::bail!("no case is named {bad:?}; known: {}; on CUDA also: {}", known.join(", "), gpu.join(", "));
    }
    if let Some(c) = cuda_only.iter().find(|c| device.is_cpu() && a.only.iter().any(|o| o == c.name)) {
        anyhow::bail!("case {} runs on CUDA only (pass --device cuda)", c.name);
    }
    if !device.is_cpu() {
        all.extend(cuda_only);
    }
    let chosen: Vec<Case> =
        all.into_iter().filter(|c| a.only.is_empty() || a.only.iter().any(|o| o == c.name)).collect();
    anyhow::ensure!(!chosen.is_empty(), "no case chosen");
    let on = match device {
        Device::Cpu => format!(
            "CPU ({}), {} threads, kernels: {}, buffers aligned to {} B",
            crate::device::cpu_model(),
            rayon_threads(),
            crate::device::cpu_kernels(),
            tapir::buffer_alignment()
        ),
        d => d.to_string(),
    };
    println!(
        "tapir bench: median of at least {} repetitions and {MIN_SECONDS} s a case, milliseconds (f32, {on})",
        a.reps
    );
    let script = if a.no_torch {
        None
    } else {
        let found = torch_script();
        if found.is_none() {
            println!("PyTorch side skipped: benches/torch/bench.py not found");
        }
        found
    };
    let rounds = a.rounds.max(1);
    // Per case: tapir's median of each round, torch's, and torch's last report.
    let mut tapir_ms: Vec<Vec<f64>> = vec![Vec::new(); chosen.len()];
    let mut torch_ms: Vec<Vec<f64>> = vec![Vec::new(); chosen.len()];
    let mut torch_last: Vec<Option<Value>> = vec![None; chosen.len()];
    let mut peaks: Vec<Option<usize>> = vec![None; chosen.len()];
    let mut torch_ok = script.is_some();
    let names: Vec<&str> = chosen.iter().map(|c| c.name).collect();
    for round in 0..rounds {
        for (i, c) in chosen.iter().enumerate() {
            let ms = (c.run)(a.reps, device)?;
            if round == 0 {
                peaks[i] = c.peak.map(|p| p(device)).transpose()?;
            }
            eprintln!("tapir {:<24} {ms:>10.3} ms", c.name);
            tapir_ms[i].push(ms);
        }
        // The mirror runs every chosen case in one process, in the same
        // order: alone, a case measured slower in a fresh PyTorch process
        // (mlp_hvp 2.96-4.8 ms against 2.55 ms after the cases before it).
        let (true, Some(script)) = (torch_ok, &script) else { continue };
        match torch_cases(&a.python, script, a.reps, &names, device) {
            Ok(v) => {
                for (i, c) in chosen.iter().enumerate() {
                    if let Some(t) = v.get("cases").and_then(|m| m.get(c.name)).and_then(Value::as_f64) {
                        eprintln!("torch {:<24} {t:>10.3} ms", c.name);
                        torch_ms[i].push(t);
                    }
                    torch_last[i] = Some(v.clone());
                }
            }
            Err(why) => {
                println!("PyTorch side skipped: {why}");
                torch_ok = false;
            }
        }
    }
    let median = |v: &[f64]| -> Option<f64> {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).copied()
    };
    let rows: Vec<(&Case, f64, Option<usize>)> = chosen
        .iter()
        .enumerate()
        .map(|(i, c)| (c, median(&tapir_ms[i]).expect("internal: at least one round"), peaks[i]))
        .collect();
    println!();
    // The ratio is tapir's time over PyTorch's: "faster" below 1.
    println!("{:<24} {:>12} {:>12} {:>16}  what", "case", "tapir ms", "torch ms", "tapir/torch time");
    let mut out = Vec::new();
    for (i, (c, ms, peak)) in rows.iter().enumerate() {
        let torch = torch_last[i].as_ref();
        let t = median(&torch_ms[i]);
        let torch_mem = torch.and_then(|v| v.get("peak_bytes")?.get(c.name).cloned());
        // The median of the rounds' ratios, and their range.
        let ratios: Vec<f64> = tapir_ms[i].iter().zip(&torch_ms[i]).map(|(a, b)| a / b).collect();
        let ratio = median(&ratios);
        println!(
            "{:<24} {:>12.3} {:>12} {:>16}  {}",
            c.name,
            ms,
            t.map(|t| format!("{t:.3}")).unwrap_or_else(|| "-".into()),
            ratio.map(ratio_words).unwrap_or_else(|| "-".into()),
            c.what
        );
        if ratios.len() > 1 {
            let (lo, hi) = ratios.iter().fold((f64::INFINITY, 0.0f64), |(l, h), &r| (l.min(r), h.max(r)));
            println!("{:<24} ratios over {} rounds: {} to {}", "", ratios.len(), ratio_words(lo), ratio_words(hi));
        }
        if let Some(p) = peak {
            let mib = |b: f64| b / 1048576.0;
            let mut line = format!("{:<24} peak extra memory: tapir {:.1} MiB", "", mib(*p as f64));
            if let Some(m) = torch_mem.as_ref().and_then(|m| m.as_object()) {
                for (k, b) in m {
                    if let Some(b) = b.as_f64() {
                        let r = *p as f64 / b;
                        let words = if r < 1.0 {
                            "less"
                        } else if r > 1.0 {
                            "more"
                        } else {
                            "the same"
                        };
                        line += &format!("; PyTorch {k} {:.1} MiB (tapir/PyTorch {r:.3}x, {words})", mib(b));
                    }
                }
            }
            println!("{line}");
            if let Some(o) = torch.and_then(|v| v.get("onehot_ms")?.get(c.name)?.as_f64()) {
                println!(
                    "{:<24} PyTorch one-hot formula (seed 000): {o:.1} ms (tapir/one-hot {})",
                    "",
                    ratio_words(ms / o)
                );
            }
        }
        out.push(json!({"name": c.name, "what": c.what, "tapir_ms": ms, "torch_ms": t, "ratio": ratio,
            "round_ratios": ratios, "tapir_peak_extra_bytes": peak, "torch_peak_extra_bytes": torch_mem}));
    }
    if let (Some(h), Some(gr)) =
        (rows.iter().find(|r| r.0.name == "mlp_hvp"), rows.iter().find(|r| r.0.name == "mlp_grad"))
    {
        println!("\nmlp_hvp / mlp_grad in tapir: {:.2}x", h.1 / gr.1);
    }
    let version = torch_last.iter().flatten().find_map(|v| v.get("torch_version").cloned());
    let doc = json!({"schema": "tapir-bench/1", "reps": a.reps, "rounds": rounds, "device": device.to_string(), "cases": out,
        "torch_version": version, "host_cpu": crate::device::cpu_model(), "cpu_kernels": crate::device::cpu_kernels(),
        "buffer_align": tapir::buffer_alignment(),
        "threads": rayon_threads()});
    std::fs::write(&a.json, serde_json::to_string_pretty(&doc)?)?;
    let bars: Vec<(String, f64)> =
        out.iter().filter_map(|c| Some((c.get("name")?.as_str()?.to_string(), c.get("ratio")?.as_f64()?))).collect();
    if bars.is_empty() {
        println!("figures: {} (no chart: no PyTorch times to compare with)", a.json.display());
    } else {
        crate::chart::bar_chart(
            &a.plot,
            "tapir time / PyTorch time, median per case (below 1: tapir is faster)",
            "tapir / PyTorch (log scale)",
            &bars,
            1.0,
        )?;
        println!("figures: {}   chart: {}", a.json.display(), a.plot.display());
    }
    Ok(())
}

/// The PyTorch mirror's report on the named cases.
fn torch_cases(
    python: &str,
    script: &Path,
    reps: usize,
    names: &[&str],
    device: Device,
) -> std::result::Result<Value, String> {
    // PyTorch names the devices as tapir does (cpu, cuda:N).
    let o = Command::new(python)
        .arg(script)
        .args(["--reps", &reps.to_string(), "--only", &names.join(","), "--device", &device.to_string()])
        .output()
        .map_err(|e| format!("{python}: {e}"))?;
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("failed").to_string());
    }
    serde_json::from_slice(&o.stdout).map_err(|e| format!("unreadable report: {e}"))
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::{ratio_words, time_verdict};

    #[test]
    fn each_ratio_says_which_side_is_faster() {
        // tapir's time over PyTorch's: below 1 tapir is faster.
        assert_eq!(ratio_words(1.212), "1.212x slower");
        assert_eq!(ratio_words(0.33), "0.330x faster");
        assert_eq!(time_verdict(1.01), "even");
        assert_eq!(time_verdict(0.99), "even");
        assert_eq!(time_verdict(f64::NAN), "?");
    }
}
