//! Hessian-vector products: `g.hvp(f, x, v)` computes `H v` by
//! forward-over-reverse (a JVP of the gradient), at about the cost of two
//! gradients and without ever forming `H`.
//!
//! First it checks `H v` against the full Hessian on a small function,
//! then it uses it for what it is for: Newton steps for logistic regression
//! solved by conjugate gradients, where each CG iteration needs one `H v`.
//!
//! Run: `cargo run --release --example 05_hessian_vector_products` (add
//! `-- --device cuda` for CUDA).

use tapir::prelude::*;

mod common;

/// Mean logistic loss `mean(log(1 + exp(-y * (X w))))` for labels +-1,
/// plus a small ridge penalty `1e-3 |w|^2 / 2` that makes it strictly
/// convex, so Newton's method converges quadratically from any start.
fn logistic<T: Diff>(x: &T, y: &T, w: &T) -> Result<T> {
    let margin = x.matmul(w)?.mul(y)?; // [N, 1]
    let data = margin.neg()?.exp()?.add_scalar(1.0)?.log()?.mean_all()?;
    data.add(&w.square()?.sum_all()?.mul_scalar(0.5e-3)?)
}

/// `sum(sin(x) * x^2) + (x0 x1)^2`, generic over `Diff` so one definition
/// serves every scope.
fn f<T: Diff>(x: &T) -> Result<T> {
    let a = x.sin()?.mul(&x.square()?)?.sum_all()?;
    let p = x.narrow(0, 0, 1)?.mul(&x.narrow(0, 1, 1)?)?.square()?.sum_all()?;
    a.add(&p)
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn main() -> anyhow::Result<()> {
    let device = common::device()?;
    // 1. H v against the full Hessian, on f(x) = sum(sin(x) * x^2) + (x0 x1)^2.
    let x0 = Tensor::from_vec(vec![0.3f64, -1.1, 2.0], [3])?.to_device(device)?;
    let v = Tensor::from_vec(vec![1.0f64, 0.5, -2.0], [3])?.to_device(device)?;
    let (hv, h) = Graph::scope(|g| {
        let x = g.leaf(x0.clone());
        let y = f(&x)?;
        Ok::<_, Error>((g.hvp(y, x, &v)?, g.hessian(y, x)?))
    })?;
    let hv_full = h.matmul(&v.reshape([3, 1])?)?.reshape([3])?;
    println!("H v by forward-over-reverse: {hv}");
    println!("H v from the full Hessian:   {hv_full}");
    let gap = hv.to_vec::<f64>()?.iter().zip(hv_full.to_vec::<f64>()?).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    anyhow::ensure!(gap < 1e-12, "H v differs from the Hessian's product by {gap}");

    // 2. Newton-CG on logistic regression: N points in d dimensions.
    let (n, d) = (2_000, 20);
    let mut rng = Rng::new(1);
    let x = rng.randn_on([n, d], DType::F64, device)?;
    let w_true = rng.randn_on([d, 1], DType::F64, device)?;
    let noise = rng.randn_on([n, 1], DType::F64, device)?.mul_scalar(2.0)?;
    let y = x.matmul(&w_true)?.add(&noise)?.sign()?; // labels +-1
    let mut w = Tensor::zeros_on([d, 1], DType::F64, device)?;
    println!("\nNewton-CG for logistic regression, {n} points, {d} features:");
    for newton in 0..10 {
        // The loss and gradient at w, in a scope of their own.
        let (loss, grad) = Graph::scope(|g| {
            let wv = g.leaf(w.clone());
            let l = logistic(&g.constant(x.clone()), &g.constant(y.clone()), &wv)?;
            Ok::<_, Error>((l.item()?, g.grad(l, &[wv])?.remove(0)))
        })?;
        let gvec = grad.to_vec::<f64>()?;
        let gnorm = dot(&gvec, &gvec).sqrt();
        // Solve H p = -g by conjugate gradients; every iteration is one H v,
        // each in its own scope, so nothing accumulates between them.
        let hvp = |p: &[f64]| -> Result<Vec<f64>> {
            let pt = Tensor::from_vec(p.to_vec(), [d, 1])?.to_device(device)?;
            Graph::scope(|g| {
                let wv = g.leaf(w.clone());
                let l = logistic(&g.constant(x.clone()), &g.constant(y.clone()), &wv)?;
                g.hvp(l, wv, &pt)?.to_vec::<f64>()
            })
        };
        let mut p = vec![0.0; d];
        let mut r: Vec<f64> = gvec.iter().map(|g| -g).collect();
        let mut dir = r.clone();
        let mut rr = dot(&r, &r);
        let mut cg = 0;
        while cg < d && rr.sqrt() > 1e-10 * gnorm.max(1e-300) {
            let hd = hvp(&dir)?;
            let alpha = rr / dot(&dir, &hd);
            for i in 0..d {
                p[i] += alpha * dir[i];
                r[i] -= alpha * hd[i];
            }
            let rr_next = dot(&r, &r);
            for i in 0..d {
                dir[i] = r[i] + rr_next / rr * dir[i];
            }
            rr = rr_next;
            cg += 1;
        }
        println!("newton {newton}  loss {loss:.10}  |grad| {gnorm:.2e}  ({cg} CG iterations, one H v each)");
        if gnorm < 1e-12 {
            break;
        }
        w = w.add(&Tensor::from_vec(p, [d, 1])?.to_device(device)?)?;
    }
    let (loss, grad) = Graph::scope(|g| {
        let wv = g.leaf(w.clone());
        let l = logistic(&g.constant(x.clone()), &g.constant(y.clone()), &wv)?;
        Ok::<_, Error>((l.item()?, g.grad(l, &[wv])?.remove(0)))
    })?;
    let gnorm = dot(&grad.to_vec::<f64>()?, &grad.to_vec::<f64>()?).sqrt();
    println!("final     loss {loss:.10}  |grad| {gnorm:.2e}: quadratic convergence, the gradient's norm squaring in the last steps");
    anyhow::ensure!(gnorm < 1e-8, "Newton-CG did not converge (|grad| {gnorm})");
    Ok(())
}
