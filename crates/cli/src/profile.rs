//! `tapir profile`: runs a case on the emulated CUDA device and prints a
//! kernel summary like Nsight Systems' (kernel, launches, bytes, modeled
//! time on an H200, roofline fraction, coalescing, bank conflicts,
//! occupancy), with a chart of where the time goes.
//!
//! The counters are the emulator's (exact, see `tapir-cuda-emu`'s
//! `exec::Counters`) and the model is its `profile::model`, both read from
//! the JSON profile the emulator writes at exit: the case runs in a child
//! process with `TAPIR_CUDA=emulated` and `TAPIR_CUDA_EMU_PROFILE` set.
//! Registers a thread come from cubins this command compiles for sm_90
//! with NVRTC (`nvrtcGetCUBIN`; the emulator sees only PTX, which has no
//! register allocation) and passes in `TAPIR_CUDA_EMU_CUBINS`.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use clap::Parser;
use serde_json::Value;
use tapir::nn::{Adam, Gpt, GptConfig, Grads, Optimizer, ParamStore, Sgd};
use tapir::prelude::*;

/// The cases, by name.
pub const CASES: &[(&str, &str)] = &[
    ("sparse-ce", "sparse cross-entropy forward and backward over [rows, cols] logits"),
    ("softmax", "softmax over the last axis of [rows, cols]"),
    ("log-softmax", "log_softmax over the last axis of [rows, cols]"),
    ("sum", "sum over the last axis of [rows, cols]"),
    ("add", "elementwise sum of two [rows, cols] tensors"),
    ("cast", "cast of [rows, cols] f32 to the case's dtype"),
    ("adam", "one Adam step of a [rows, cols] parameter in the case's dtype (its gradient included)"),
    ("sgd", "two momentum SGD steps of a [rows, cols] parameter in the case's dtype, from given gradients"),
    (
        "embedding",
        "lookup of rows ids in a [rows, cols] table, and its gradient (index_add); rows of fewer than 128 elements \
         take index_select's kernel",
    ),
    ("index-add-hot", "index_add of a [rows, cols] gradient into 16 rows (many rows into few: the same-address case)"),
    (
        "gather",
        "gather along axis 0 of a [rows, cols] tensor by a [rows, cols] index whose rows each repeat one random row \
         (rows picked through gather), and its gradient (scatter_add)",
    ),
    (
        "gather-last",
        "gather along the last axis of a [rows, cols] tensor by random [rows, cols] indices, and its gradient \
         (scatter_add)",
    ),
    ("random", "uniform then normal draws of [rows, cols] in the case's dtype, generated on the device"),
    (
        "linear-ce",
        "fused linear cross-entropy of hidden states [rows, 256] through a [cols, 256] head with a bias, forward and \
         backward (the logits in chunks, never whole)",
    ),
    (
        "jet",
        "a tanh layer's forward-Laplacian updates over [rows, cols] with two input dims: tanh_jet and tanh_jac \
         forward and their gradients",
    ),
    (
        "attention",
        "fused causal attention forward of q, k, v [1, rows, cols] in heads of 64 (the tensor-core kernel for bf16 \
         and f16)",
    ),
    (
        "attention-grad",
        "the attention case's forward and then its fused backward (the log-sum-exp recomputed, g . y, dq, dk and dv) \
         for a random upstream gradient (tensor-core kernels for bf16 and f16)",
    ),
    (
        "gpt-step",
        "one training step (loss, gradients, Adam) of the default mini-GPT (2 layers, d_model 64, 16 positions) with \
         a vocabulary of cols, on rows sequences",
    ),
];

/// Profiles a case on the emulated device, modeled as an H200.
#[derive(Parser, Debug, Clone)]
pub struct Args {
    /// The case: sparse-ce, softmax, sum, add, cast, adam, sgd, embedding,
    /// index-add-hot, gather, gather-last, random, linear-ce, attention,
    /// attention-grad or gpt-step.
    #[arg(long, default_value = "sparse-ce")]
    pub case: String,
    /// Rows of the case's input.
    #[arg(long, default_value_t = 256)]
    pub rows: usize,
    /// Columns of the case's input (the vocabulary for sparse-ce).
    #[arg(long, default_value_t = 4096)]
    pub cols: usize,
    /// Element type of the input: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Also keep the emulator's JSON profile here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Do not compile cubins for register counts (occupancy then applies
    /// the thread, block and shared-memory limits only).
    #[arg(long)]
    pub no_cubins: bool,
    /// Runs the case itself (what the parent starts, with the emulator
    /// selected and profiling).
    #[arg(long, hide = true)]
    pub child: bool,
}

fn dtype(s: &str) -> anyhow::Result<DType> {
    match s {
        "f32" => Ok(DType::F32),
        "bf16" => Ok(DType::BF16),
        "f16" => Ok(DType::F16),
        _ => bail!("unknown --dtype `{s}`: expected f32, bf16 or f16"),
    }
}

/// Runs the case on `device` once.
pub fn run_case(a: &Args, device: Device) -> anyhow::Result<()> {
    let (n, v, dt) = (a.rows, a.cols, dtype(&a.dtype)?);
    let mut rng = Rng::new(0);
    let x = rng.uniform([n, v], -3.0, 3.0, DType::F32)?.cast(dt)?.to_device(device)?;
    match a.case.as_str() {
        "sparse-ce" => {
            let labels = rng.randint([n], v as u64, DType::I64)?.to_device(device)?;
            Graph::scope(|g| {
                let xv = g.leaf(x.clone());
                let loss = xv.sparse_cross_entropy(&labels)?;
                std::hint::black_box(g.grad(loss, &[xv])?);
                Ok::<_, Error>(())
            })?;
        }
        "softmax" => drop(std::hint::black_box(x.softmax(-1)?)),
        "log-softmax" => drop(std::hint::black_box(x.log_softmax(-1)?)),
        "sum" => drop(std::hint::black_box(x.sum(&[-1], false)?)),
        "add" => {
            let y = rng.uniform([n, v], -3.0, 3.0, DType::F32)?.cast(dt)?.to_device(device)?;
            drop(std::hint::black_box(x.add(&y)?));
        }
        "cast" => {
            let y = rng.uniform([n, v], -3.0, 3.0, DType::F32)?.to_device(device)?;
            drop(std::hint::black_box(y.cast(dt)?));
        }
        "adam" => {
            let mut store = ParamStore::new();
            let p = store.add("w", x)?;
            let grads = Graph::scope(|g| {
                let b = store.bind(g);
                b.grads(b.var(p)?.square()?.sum_all()?)
            })?;
            let mut opt = Adam::new(1e-3);
            opt.step(&mut store, &grads)?;
        }
        "sgd" => {
            let mut store = ParamStore::new();
            store.add("w", x)?;
            let mut opt = Sgd::with_momentum(1e-3, 0.9, false);
            // The second step reads the momentum buffer the first wrote.
            for _ in 0..2 {
                let g = rng.uniform([n, v], -1.0, 1.0, DType::F32)?.cast(dt)?.to_device(device)?;
                opt.step(&mut store, &Grads::from_tensors(vec![g]))?;
            }
        }
        "embedding" => {
            let ids = rng.randint([n], n as u64, DType::I64)?.to_device(device)?;
            Graph::scope(|g| {
                let table = g.leaf(x.clone());
                let loss = table.embedding(&ids)?.sum_all()?;
                std::hint::black_box(g.grad(loss, &[table])?);
                Ok::<_, Error>(())
            })?;
        }
        "index-add-hot" => {
            let ids = rng.randint([n], 16, DType::I64)?.to_device(device)?;
            let op = tapir::tensor::ops::index::IndexAdd { axis: 0, idx: ids, size: 16 };
            drop(std::hint::black_box(tapir::tensor::ops::forward(&op, &[&x])?));
        }
        "gather" | "gather-last" => {
            let idx = if a.case == "gather" {
                rng.randint([n, 1], n as u64, DType::I64)?.expand([n, v])?.contiguous()?
            } else {
                rng.randint([n, v], v as u64, DType::I64)?
            }
            .to_device(device)?;
            let axis = if a.case == "gather" { 0 } else { 1 };
            Graph::scope(|g| {
                let xv = g.leaf(x.clone());
                let loss = xv.gather(axis, &idx)?.sum_all()?;
                std::hint::black_box(g.grad(loss, &[xv])?);
                Ok::<_, Error>(())
            })?;
        }
        "random" => {
            drop(std::hint::black_box(rng.uniform_on([n, v], -1.0, 1.0, dt, device)?));
            drop(std::hint::black_box(rng.normal_tensor_on([n, v], 0.0, 1.0, dt, device)?));
        }
        "linear-ce" => {
            const D: usize = 256;
            let h = rng.normal_tensor([n, D], 0.0, 1.0, DType::F32)?.cast(dt)?.to_device(device)?;
            let w = rng.normal_tensor([v, D], 0.0, 0.05, DType::F32)?.cast(dt)?.to_device(device)?;
            let b = rng.uniform([v], -0.1, 0.1, DType::F32)?.cast(dt)?.to_device(device)?;
            let labels = rng.randint([n], v as u64, DType::I64)?.to_device(device)?;
            Graph::scope(|g| {
                let (hv, wv, bv) = (g.leaf(h.clone()), g.leaf(w.clone()), g.leaf(b.clone()));
                let loss = hv.linear_cross_entropy(&wv, Some(&bv), &labels, CrossEntropyOptions::default(), None)?;
                std::hint::black_box(g.grad(loss, &[hv, wv, bv])?);
                Ok::<_, Error>(())
            })?;
        }
        "jet" => {
            use tapir::tensor::ops::Derivative;
            let mut draw = |shape: &[usize], lo: f64, hi: f64| -> Result<Tensor> {
                rng.uniform(shape.to_vec(), lo, hi, DType::F32)?.cast(dt)?.to_device(device)
            };
            let (a, s, l, g) = (
                draw(&[n, v], -0.9, 0.9)?,
                draw(&[n, v], 0.0, 2.0)?,
                draw(&[n, v], -1.0, 1.0)?,
                draw(&[n, v], -1.0, 1.0)?,
            );
            let (j, gj) = (draw(&[n, 2, v], -1.0, 1.0)?, draw(&[n, 2, v], -1.0, 1.0)?);
            let y = tapir::nn::tanh_jet(&a, &s, Some(&l))?;
            std::hint::black_box(tapir::nn::TanhJet.vjp_eager(vec![a.clone(), s, l].into(), y, g)?);
            let y = tapir::nn::tanh_jac(&j, &a)?;
            std::hint::black_box(tapir::nn::TanhJac.vjp_eager(vec![j, a].into(), y, gj)?);
        }
        "attention" | "attention-grad" => {
            if v == 0 || v % 64 != 0 {
                bail!("--case {} takes --cols a multiple of 64 (heads 64 wide), not {v}", a.case);
            }
            let mut qkv = Vec::new();
            for _ in 0..3 {
                qkv.push(rng.normal_tensor([1, n, v], 0.0, 1.0, DType::F32)?.cast(dt)?.to_device(device)?);
            }
            let y = tapir::nn::causal_attention(&qkv[0], &qkv[1], &qkv[2], v / 64)?;
            if a.case == "attention-grad" {
                use tapir::tensor::ops::Derivative;
                let g = rng.normal_tensor([1, n, v], 0.0, 1.0, DType::F32)?.cast(dt)?.to_device(device)?;
                let op = tapir::nn::CausalAttention { heads: v / 64, scale: 0.125 };
                std::hint::black_box(op.vjp_eager(qkv.into(), y, g)?);
            } else {
                drop(std::hint::black_box(y));
            }
        }
        "gpt-step" => {
            let cfg = GptConfig { vocab: v, ..GptConfig::default() };
            let t = cfg.block_size;
            let mut store = ParamStore::new();
            let model = Gpt::new(&mut store, cfg, &mut rng, dt)?;
            store.to_device(device)?;
            let ids = rng.randint([n, t], v as u64, DType::I64)?.to_device(device)?;
            let targets = rng.randint([n, t], v as u64, DType::I64)?.to_device(device)?;
            let grads = Graph::scope(|g| {
                let b = store.bind(g);
                let loss = model.loss(&b, &ids, &targets, None)?;
                b.grads(loss)
            })?;
            Adam::new(1e-3).step(&mut store, &grads)?;
        }
        other => {
            let names: Vec<&str> = CASES.iter().map(|c| c.0).collect();
            bail!("unknown --case `{other}`: expected one of {}", names.join(", "))
        }
    }
    tapir::tensor::cuda::synchronize(device)?;
    Ok(())
}

/// Compiles every kernel file to a cubin for sm_90 under `dir`; the
/// kernels compiled, or why none could be.
pub fn write_cubins(dir: &Path) -> Result<usize, String> {
    use cudarc::nvrtc::{result, sys};
    tapir::tensor::cuda::nvrtc_library().map_err(|e| e.to_string())?;
    let mut n = 0;
    for (name, src) in tapir::tensor::cuda::KERNELS {
        let file = Path::new(name).file_name().map_or(name.to_string(), |f| f.to_string_lossy().into_owned());
        let full = format!("{}\n#line 1 \"{file}\"\n{src}", tapir::tensor::cuda::PRELUDE);
        let (Ok(csrc), Ok(cname)) = (CString::new(full), CString::new(file.clone())) else { continue };
        let prog = result::create_program(&csrc, Some(&cname)).map_err(|e| format!("{file}: {e:?}"))?;
        let opts = ["--gpu-architecture=sm_90", "--std=c++17"];
        // SAFETY: a program just created, destroyed below.
        let built = unsafe { result::compile_program(prog, &opts) };
        let mut cubin = Vec::new();
        if built.is_ok() {
            let mut size = 0usize;
            // SAFETY: the program compiled; the buffer holds `size` bytes.
            unsafe {
                if sys::nvrtcGetCUBINSize(prog, &mut size).result().is_ok() {
                    cubin = vec![0u8; size];
                    if sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()).result().is_err() {
                        cubin.clear();
                    }
                }
            }
        }
        // SAFETY: created above and not used after.
        let _ = unsafe { result::destroy_program(prog) };
        if cubin.is_empty() {
            return Err(format!("{file}: NVRTC produced no cubin for sm_90"));
        }
        std::fs::write(dir.join(format!("{file}.cubin")), cubin).map_err(|e| e.to_string())?;
        n += 1;
    }
    Ok(n)
}

/// Runs the case in a child process (`exe`, the tapir binary) on the
/// emulated device and returns the emulator's JSON profile.
pub fn profile(exe: &Path, a: &Args) -> anyhow::Result<Value> {
    let scratch = Scratch(std::env::temp_dir().join(format!("tapir-profile-{}-{}", std::process::id(), a.case)));
    let dir = &scratch.0;
    std::fs::create_dir_all(dir)?;
    let cubins = dir.join("cubins");
    std::fs::create_dir_all(&cubins)?;
    if !a.no_cubins {
        match write_cubins(&cubins) {
            Ok(n) => eprintln!("registers from {n} cubins compiled for sm_90"),
            Err(e) => eprintln!("no registers a thread (occupancy without the register limit): {e}"),
        }
    }
    let json = dir.join("profile.json");
    let out = Command::new(exe)
        .args(["profile", "--child", "--case", &a.case, "--dtype", &a.dtype])
        .args(["--rows", &a.rows.to_string(), "--cols", &a.cols.to_string()])
        .env("TAPIR_CUDA", "emulated")
        .env("TAPIR_CUDA_EMU_PROFILE", &json)
        .env("TAPIR_CUDA_EMU_CUBINS", &cubins)
        .output()
        .with_context(|| format!("starting {}", exe.display()))?;
    if !out.status.success() {
        bail!("the case failed on the emulated device: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = std::fs::read_to_string(&json)
        .with_context(|| format!("the emulator wrote no profile to {}", json.display()))?;
    if let Some(p) = &a.json {
        std::fs::write(p, &text)?;
    }
    Ok(serde_json::from_str(&text)?)
}

/// A folder of the run's files, removed when the run ends, failed ones
/// included (an error left the cubins behind in the temporary folder).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// The kernel summary of a profile, as text.
pub fn table(p: &Value) -> String {
    let mut rows: Vec<(String, f64)> = Vec::new();
    let mut out = String::new();
    let total = f(&p["total_modeled_us"]);
    out.push_str(&format!("{}\n", p["gpu"]["name"].as_str().unwrap_or("?")));
    out.push_str(&format!(
        "{:>6} {:>10} {:>7} {:>11} {:>11} {:>9} {:>6} {:>8} {:>6} {:>5} {:>6} {:>6}  {}\n",
        "time%",
        "model µs",
        "launch",
        "warp-instr",
        "DRAM bytes",
        "roofline",
        "bound",
        "sect/req",
        "sect%",
        "bank",
        "regs",
        "occ%",
        "kernel"
    ));
    for k in p["kernels"].as_array().into_iter().flatten() {
        let m = &k["modeled"];
        let t = f(&m["total_us"]);
        let name = k["name"].as_str().unwrap_or("?").to_string();
        rows.push((name.clone(), t));
        let occ = &k["occupancy"];
        out.push_str(&format!(
            "{:>5.1}% {:>10.2} {:>7} {:>11} {:>11} {:>8.1}% {:>6} {:>8.2} {:>5.1}% {:>5} {:>6} {:>5.0}%  {}\n",
            100.0 * t / total,
            t,
            k["launches"].as_u64().unwrap_or(0),
            k["warp_instructions"].as_u64().unwrap_or(0),
            crate::chart::bytes(f(&m["dram_bytes"])),
            100.0 * f(&m["roofline"]),
            m["bound"].as_str().unwrap_or("?"),
            f(&k["sectors_per_request"]),
            100.0 * f(&k["sector_efficiency"]),
            k["bank_conflicts"].as_u64().unwrap_or(0),
            k["regs"].as_u64().map_or("?".into(), |r| r.to_string()),
            100.0 * f(&occ["occupancy"]),
            name
        ));
    }
    for l in p["library"].as_array().into_iter().flatten() {
        let t = f(&l["modeled_us"]);
        let name = l["name"].as_str().unwrap_or("?").to_string();
        rows.push((name.clone(), t));
        out.push_str(&format!(
            "{:>5.1}% {:>10.2} {:>7} {:>11} {:>11} {:>9} {:>6} {:>8} {:>6} {:>5} {:>6} {:>6}  {}\n",
            100.0 * t / total,
            t,
            l["calls"].as_u64().unwrap_or(0),
            "",
            crate::chart::bytes(f(&l["bytes"])),
            "",
            "blas",
            "",
            "",
            "",
            "",
            "",
            name
        ));
    }
    out.push_str(&format!("total modeled time: {total:.2} µs\n\nwhere the time goes:\n"));
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (name, t) in rows {
        let w = if total > 0.0 { (50.0 * t / total).round() as usize } else { 0 };
        out.push_str(&format!(
            "{:<40} {}{} {:.1}%\n",
            name,
            "#".repeat(w),
            " ".repeat(50 - w.min(50)),
            100.0 * t / total
        ));
    }
    out
}

/// `tapir profile`.
pub fn run(a: Args) -> anyhow::Result<()> {
    if a.child {
        let device = Device::cuda(0).context("the emulated CUDA device (TAPIR_CUDA=emulated)")?;
        return run_case(&a, device);
    }
    dtype(&a.dtype)?;
    let exe = std::env::current_exe()?;
    let p = profile(&exe, &a)?;
    println!(
        "case {} [{} x {}] {} on the emulated device, modeled as an H200 (docs/gpu-model.md)",
        a.case, a.rows, a.cols, a.dtype
    );
    print!("{}", table(&p));
    Ok(())
}
