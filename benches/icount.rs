//! The cases of the instruction-count guard (scripts/icount-guard.sh): each
//! runs one small, fixed piece of work once, so that valgrind's count of
//! the instructions it executes repeats from run to run on a shared
//! machine where times do not.
//!
//!     cargo build --bench icount
//!     target/debug/deps/icount-* CASE     (the script finds the binary)
//!
//! `CASE --setup` makes the case's inputs and stops: the script subtracts
//! its count (the process's start, the inputs, the exit) from the case's,
//! so each figure counts the work alone. The sizes are small so that the whole
//! guard runs in seconds under valgrind; the speed of the large, memory-bound
//! cases stays with `tapir bench`.

use tapir::nn::{Activation, Mlp, ParamStore};
use tapir::prelude::*;

/// A case's work.
type Work = fn() -> Result<()>;

/// Every case, by name, with its work.
const CASES: &[(&str, Work)] = &[
    ("matmul_f32_128", || matmul(DType::F32, 128)),
    ("matmul_f64_128", || matmul(DType::F64, 128)),
    ("sparse_ce_64x2000", sparse_ce),
    ("linear_ce_64x2000x64", linear_ce),
    ("mlp_grad_256", mlp_grad),
    ("mlp_hvp_256", mlp_hvp),
    ("scalar_chain_2000", scalar_chain),
    ("sum_last_axis_256x1024", sum_last_axis),
];

fn matmul(dtype: DType, n: usize) -> Result<()> {
    let mut rng = Rng::new(1);
    let (a, b) = (rng.randn([n, n], dtype)?, rng.randn([n, n], dtype)?);
    if setup_only() {
        return Ok(());
    }
    std::hint::black_box(a.matmul(&b)?);
    Ok(())
}

fn sparse_ce() -> Result<()> {
    let mut rng = Rng::new(2);
    let x = rng.uniform([64, 2000], -3.0, 3.0, DType::F32)?;
    let labels = rng.randint([64], 2000, DType::I64)?;
    if setup_only() {
        return Ok(());
    }
    Graph::scope(|g| {
        let xv = g.leaf(x.clone());
        let loss = xv.sparse_cross_entropy(&labels)?;
        std::hint::black_box(g.grad(loss, &[xv])?);
        Ok(())
    })
}

fn linear_ce() -> Result<()> {
    let mut rng = Rng::new(3);
    let h = rng.randn([64, 64], DType::F32)?;
    let w = rng.normal_tensor([2000, 64], 0.0, 0.02, DType::F32)?;
    let labels = rng.randint([64], 2000, DType::I64)?;
    if setup_only() {
        return Ok(());
    }
    Graph::scope(|g| {
        let (hv, wv) = (g.leaf(h.clone()), g.leaf(w.clone()));
        let opts = tapir::tensor::ops::cross_entropy::CrossEntropyOptions::default();
        let loss = hv.linear_cross_entropy(&wv, None, &labels, opts, None)?;
        std::hint::black_box(g.grad(loss, &[hv, wv])?);
        Ok(())
    })
}

fn mlp() -> Result<(ParamStore, Mlp, Tensor)> {
    let mut store = ParamStore::new();
    let net = Mlp::xavier(&mut store, "u", &[2, 64, 64, 64, 1], Activation::Tanh, &mut Rng::new(0), DType::F32)?;
    let x = Rng::new(1).rand([256, 2], DType::F32)?;
    Ok((store, net, x))
}

fn mlp_grad() -> Result<()> {
    let (store, net, x) = mlp()?;
    if setup_only() {
        return Ok(());
    }
    Graph::scope(|g| {
        let p = store.bind(g);
        let loss = net.forward(&p, g.constant(x.clone()))?.square()?.mean_all()?;
        std::hint::black_box(p.grads(loss)?);
        Ok(())
    })
}

fn mlp_hvp() -> Result<()> {
    let (store, net, x) = mlp()?;
    let mut rng = Rng::new(2);
    let v: Vec<Tensor> =
        store.ids().map(|id| rng.randn(store.get(id).shape().clone(), DType::F32)).collect::<Result<_>>()?;
    if setup_only() {
        return Ok(());
    }
    Graph::scope(|g| {
        let p = store.bind(g);
        let loss = net.forward(&p, g.constant(x.clone()))?.square()?.mean_all()?;
        let vars: Vec<Var<'_>> = store.ids().map(|id| p.var(id)).collect::<Result<_>>()?;
        let gs = g.grad_graph(loss, &vars)?;
        std::hint::black_box(g.jvp(&gs, &vars, &v)?);
        Ok(())
    })
}

fn scalar_chain() -> Result<()> {
    let x0 = Tensor::from_vec(vec![0.5f32], [1])?;
    if setup_only() {
        return Ok(());
    }
    Graph::scope(|g| {
        let x = g.leaf(x0.clone());
        let mut y = x;
        for i in 0..2000 {
            y = match i % 4 {
                0 => y.mul_scalar(1.0001)?,
                1 => y.add_scalar(1e-4)?,
                2 => y.mul(&x)?.mul_scalar(0.5)?.add(&y)?.mul_scalar(0.6)?,
                _ => y.tanh()?,
            };
        }
        std::hint::black_box(g.grad(y.sum_all()?, &[x])?);
        Ok(())
    })
}

fn sum_last_axis() -> Result<()> {
    let x = Rng::new(4).randn([256, 1024], DType::F32)?;
    if setup_only() {
        return Ok(());
    }
    std::hint::black_box(x.sum(&[-1], false)?);
    Ok(())
}

/// Whether the run stops after making the case's inputs (`CASE --setup`):
/// the script subtracts that count, so a case's figure is its work alone.
fn setup_only() -> bool {
    std::env::args().nth(2).as_deref() == Some("--setup")
}

fn main() {
    let names: Vec<&str> = CASES.iter().map(|c| c.0).collect();
    let Some(name) = std::env::args().nth(1).filter(|a| !a.starts_with("--")) else {
        // `cargo bench` runs this with no case (or `--bench`): list them.
        println!("cases: {}", names.join(" "));
        return;
    };
    match CASES.iter().find(|c| c.0 == name) {
        Some((_, run)) => {
            if let Err(e) = run() {
                eprintln!("case {name} failed: {e}");
                std::process::exit(1);
            }
        }
        None => {
            eprintln!("no case {name:?}; cases: {}", names.join(" "));
            std::process::exit(2);
        }
    }
}
