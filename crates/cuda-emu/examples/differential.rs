//! The emulator against a real GPU: the same kernels, inputs and launches
//! on whichever device tapir's switch selects, their outputs written to a
//! file; a second mode compares two such files.
//!
//! ```sh
//! TAPIR_CUDA=emulated cargo run -p tapir-cuda-emu --example differential -- run emu.txt
//! cargo run -p tapir-cuda-emu --example differential -- run gpu.txt          # on a GPU machine
//! cargo run -p tapir-cuda-emu --example differential -- compare emu.txt gpu.txt
//! ```
//!
//! Outputs must agree bit for bit, except those of kernels that use an
//! `.approx` instruction (found in their decoded PTX), which may differ by
//! the instructions' documented error: a relative 2^-20 here (the
//! hardware's ex2/lg2 are within 2 ulp, and a few such steps compound).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use tapir_cuda_emu::ptx::{self, Ins, UnOp};
use tapir_tensor::backend::{Binary, Unary};
use tapir_tensor::cuda::{compile_kernel, driver_library, DEFAULT_ARCH};
use tapir_tensor::DType;

/// Deterministic inputs in [-4, 4), with a few special values mixed in.
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|i| match i % 97 {
            13 => 0.0,
            31 => -0.0,
            59 => 1e-39,
            _ => {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 8000) as f32 / 1000.0 - 4.0
            }
        })
        .collect()
}

/// Whether kernel `name` of the PTX `src` (or a function it calls) uses an
/// `.approx` instruction.
fn uses_approx(src: &str, name: &str) -> bool {
    let Ok(m) = ptx::load(src, &|g| (0..g.len() as u64).map(|k| 0x7f00_0000_0000 + k * 4096).collect()) else {
        return true;
    };
    let approx = |f: &ptx::Func| {
        f.insts.iter().any(|i| {
            matches!(
                i.ins,
                Ins::Un {
                    op: UnOp::Ex2
                        | UnOp::Lg2
                        | UnOp::Rsqrt
                        | UnOp::Sin
                        | UnOp::Cos
                        | UnOp::Rcp { approx: true }
                        | UnOp::Sqrt { approx: true },
                    ..
                }
            )
        })
    };
    let Some(k) = m.funcs.iter().position(|f| f.name == name) else { return true };
    let mut seen = vec![k];
    let mut i = 0;
    while i < seen.len() {
        let f = &m.funcs[seen[i]];
        if approx(f) {
            return true;
        }
        for inst in &f.insts {
            if let Ins::Call { func, .. } = inst.ins {
                if !seen.contains(&(func as usize)) {
                    seen.push(func as usize);
                }
            }
        }
        i += 1;
    }
    false
}

struct Runner {
    s: Arc<CudaStream>,
    modules: BTreeMap<&'static str, (Arc<CudaModule>, String)>,
    out: String,
}

impl Runner {
    fn module(&mut self, file: &'static str) -> (Arc<CudaModule>, String) {
        if let Some(m) = self.modules.get(file) {
            return m.clone();
        }
        let src = compile_kernel(file, DEFAULT_ARCH).expect("kernels compile");
        let m = self.s.context().load_module(Ptx::from_src(src.clone())).expect("the device loads the PTX");
        self.modules.insert(file, (m.clone(), src.clone()));
        (m, src)
    }

    fn record(&mut self, name: &str, approx: bool, bits: impl Iterator<Item = u64>) {
        let words: Vec<String> = bits.map(|b| format!("{b:x}")).collect();
        writeln!(self.out, "{name} {} {}", if approx { "approx" } else { "exact" }, words.join(",")).unwrap();
    }

    /// Elementwise unary kernels over `n` contiguous f32s (a function's
    /// parameters, where it takes any, are 0.5 and 2).
    fn unary(&mut self, name: &str) {
        let (m, src) = self.module("elementwise.cu");
        let f = m.load_function(name).unwrap();
        let n = 4096usize;
        let x = self.s.clone_htod(&data(n, 1)).unwrap();
        let mut out = self.s.alloc_zeros::<f32>(n).unwrap();
        let (n64, ndim, null, zero, p0, p1) = (n as i64, 1i32, 0u64, 0i64, 0.5f64, 2.0f64);
        let mut l = self.s.launch_builder(&f);
        l.arg(&n64).arg(&ndim).arg(&null).arg(&x).arg(&zero).arg(&p0).arg(&p1).arg(&mut out);
        // SAFETY: unary(n, ndim, info, x, x_off, p0, p1, out).
        unsafe { l.launch(LaunchConfig::for_num_elems(n as u32)) }.unwrap();
        let got = self.s.clone_dtoh(&out).unwrap();
        self.record(name, uses_approx(&src, name), got.iter().map(|v| u64::from(v.to_bits())));
    }

    fn binary(&mut self, name: &str) {
        let (m, src) = self.module("elementwise.cu");
        let f = m.load_function(name).unwrap();
        let n = 4096usize;
        let a = self.s.clone_htod(&data(n, 2)).unwrap();
        let b = self.s.clone_htod(&data(n, 3)).unwrap();
        let mut out = self.s.alloc_zeros::<f32>(n).unwrap();
        let (n64, ndim, null, zero) = (n as i64, 1i32, 0u64, 0i64);
        let mut l = self.s.launch_builder(&f);
        l.arg(&n64).arg(&ndim).arg(&null).arg(&a).arg(&zero).arg(&b).arg(&zero).arg(&mut out);
        // SAFETY: binary(n, ndim, info, a, a_off, b, b_off, out).
        unsafe { l.launch(LaunchConfig::for_num_elems(n as u32)) }.unwrap();
        let got = self.s.clone_dtoh(&out).unwrap();
        self.record(name, uses_approx(&src, name), got.iter().map(|v| u64::from(v.to_bits())));
    }

    /// A row kernel `(rows, cols, x, out)` with one block of 256 per row.
    fn rows(&mut self, file: &'static str, name: &str, out_per_row: bool) {
        let (m, src) = self.module(file);
        let f = m.load_function(name).unwrap();
        let (rows, cols) = (16usize, 1000usize);
        let x = self.s.clone_htod(&data(rows * cols, 4)).unwrap();
        let len = if out_per_row { rows } else { rows * cols };
        let mut out = self.s.alloc_zeros::<f32>(len).unwrap();
        let (r, c) = (rows as i64, cols as i64);
        let mut l = self.s.launch_builder(&f);
        l.arg(&r).arg(&c).arg(&x).arg(&mut out);
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: (rows, cols, x, out).
        unsafe { l.launch(cfg) }.unwrap();
        let got = self.s.clone_dtoh(&out).unwrap();
        self.record(name, uses_approx(&src, name), got.iter().map(|v| u64::from(v.to_bits())));
    }

    fn cross_entropy(&mut self) {
        let (m, src) = self.module("cross_entropy.cu");
        let (rows, v) = (32usize, 2000usize);
        let x = self.s.clone_htod(&data(rows * v, 5)).unwrap();
        let labels: Vec<i64> = (0..rows).map(|r| if r == 7 { -100 } else { ((r * 37) % v) as i64 }).collect();
        let dl = self.s.clone_htod(&labels).unwrap();
        let mut lse = self.s.alloc_zeros::<f32>(rows).unwrap();
        let mut loss = self.s.alloc_zeros::<f32>(rows).unwrap();
        let mut bad = self.s.clone_htod(&[u64::MAX]).unwrap();
        let mut valid = self.s.alloc_zeros::<u64>(1).unwrap();
        let f = m.load_function("ce_fwd_f32_i64").unwrap();
        let (r, vv, ignore, smooth) = (rows as i64, v as i64, -100i64, 0.1f64);
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // No bias (a null pointer: the kernels' bias is optional).
        let no_bias = 0u64;
        let mut l = self.s.launch_builder(&f);
        l.arg(&r).arg(&vv).arg(&x).arg(&no_bias).arg(&dl).arg(&ignore).arg(&smooth);
        l.arg(&mut lse).arg(&mut loss).arg(&mut bad).arg(&mut valid);
        // SAFETY: ce_fwd(rows, v, x, bias, labels, ignore_index, smoothing, lse, loss, bad_row, valid).
        unsafe { l.launch(cfg) }.unwrap();
        let approx = uses_approx(&src, "ce_fwd_f32_i64");
        let got = self.s.clone_dtoh(&loss).unwrap();
        self.record("ce_fwd_f32_i64", approx, got.iter().map(|v| u64::from(v.to_bits())));
        let mut x = x;
        let g = self.s.clone_htod(&[1f32]).unwrap();
        let f = m.load_function("ce_bwd_f32_i64").unwrap();
        let (gs, scale) = (0i64, 1.0 / 31.0f64);
        let mut l = self.s.launch_builder(&f);
        l.arg(&r).arg(&vv).arg(&mut x).arg(&no_bias).arg(&lse).arg(&dl).arg(&ignore).arg(&smooth);
        l.arg(&g).arg(&gs).arg(&scale);
        // SAFETY: ce_bwd(rows, v, x, bias, lse, labels, ignore_index, smoothing, g, g_stride, scale).
        unsafe { l.launch(cfg) }.unwrap();
        let got = self.s.clone_dtoh(&x).unwrap();
        self.record("ce_bwd_f32_i64", uses_approx(&src, "ce_bwd_f32_i64"), got.iter().map(|v| u64::from(v.to_bits())));
    }

    fn cast(&mut self, name: &str) {
        let (m, src) = self.module("cast.cu");
        let f = m.load_function(name).unwrap();
        let n = 4096usize;
        let x: Vec<f32> = data(n, 6).iter().map(|v| v * 20000.0).collect();
        let dx = self.s.clone_htod(&x).unwrap();
        let mut out = self.s.alloc_zeros::<u32>(n).unwrap();
        let n64 = n as i64;
        let mut l = self.s.launch_builder(&f);
        l.arg(&n64).arg(&dx).arg(&mut out);
        // SAFETY: cast(n, x, out); out is large enough for any 4-byte-or-less element.
        unsafe { l.launch(LaunchConfig::for_num_elems(n as u32)) }.unwrap();
        let got = self.s.clone_dtoh(&out).unwrap();
        self.record(name, uses_approx(&src, name), got.iter().map(|&v| u64::from(v)));
    }
}

fn run(path: &str) {
    let lib = driver_library().unwrap_or_else(|e| panic!("no CUDA driver: {e}"));
    let s = CudaContext::new(0).expect("a device").default_stream();
    let mut r = Runner { s, modules: BTreeMap::new(), out: String::new() };
    // Every function of the two families, by the names their kernels have
    // (the families' lists, which the op registry is made from).
    for u in Unary::ALL {
        r.unary(&u.cuda_kernel(DType::F32));
    }
    for b in Binary::ALL {
        let name = b.cuda_kernel(DType::F32);
        if r.module("elementwise.cu").0.load_function(&name).is_ok() {
            r.binary(&name);
        }
    }
    r.rows("reduce.cu", "sum_last_f32", true);
    r.rows("reduce.cu", "max_last_f32", true);
    r.rows("softmax.cu", "softmax_f32", false);
    r.rows("softmax.cu", "log_softmax_f32", false);
    r.cross_entropy();
    r.cast("cast_f32_f16");
    r.cast("cast_f32_i32");
    r.cast("cast_f32_bf16");
    std::fs::write(path, &r.out).expect("the output file is writable");
    println!("{} kernels on {lib} written to {path}", r.out.lines().count());
}

fn parse(path: &str) -> BTreeMap<String, (bool, Vec<u64>)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .filter_map(|l| {
            let mut it = l.split(' ');
            let (name, kind, words) = (it.next()?, it.next()?, it.next().unwrap_or(""));
            let bits =
                words.split(',').filter(|w| !w.is_empty()).map(|w| u64::from_str_radix(w, 16).unwrap()).collect();
            Some((name.to_string(), (kind == "approx", bits)))
        })
        .collect()
}

/// Whether two f32 bit patterns agree within the `.approx` tolerance.
fn close(a: u64, b: u64) -> bool {
    let (x, y) = (f32::from_bits(a as u32), f32::from_bits(b as u32));
    if x.is_nan() && y.is_nan() {
        return true;
    }
    x == y || (x - y).abs() <= 2f32.powi(-20) * x.abs().max(y.abs()).max(1e-30)
}

fn compare(a: &str, b: &str) -> bool {
    let (ma, mb) = (parse(a), parse(b));
    let mut ok = true;
    for (name, (approx, xs)) in &ma {
        let Some((_, ys)) = mb.get(name) else {
            println!("{name}: only in {a}");
            ok = false;
            continue;
        };
        let bad: Vec<usize> = (0..xs.len().max(ys.len()))
            .filter(|&i| match (xs.get(i), ys.get(i)) {
                (Some(&x), Some(&y)) => x != y && !(*approx && close(x, y)),
                _ => true,
            })
            .collect();
        if bad.is_empty() {
            println!(
                "{name}: {} values agree ({})",
                xs.len(),
                if *approx { "within .approx tolerance" } else { "bit for bit" }
            );
        } else {
            ok = false;
            let i = bad[0];
            println!(
                "{name}: {} of {} values differ; first at {i}: {:#x} vs {:#x}",
                bad.len(),
                xs.len(),
                xs.get(i).copied().unwrap_or(0),
                ys.get(i).copied().unwrap_or(0)
            );
        }
    }
    ok
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["run", path] => run(path),
        ["compare", a, b] => {
            if !compare(a, b) {
                std::process::exit(1);
            }
        }
        _ => {
            eprintln!("usage: differential run FILE | differential compare FILE FILE");
            std::process::exit(2);
        }
    }
}
