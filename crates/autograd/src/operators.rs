//! Derivative operators built on reverse and forward mode: Hessian-vector
//! products, Jacobians, Hessians, and the per-sample operators PDE solvers
//! need (Laplacian, Hessian diagonal) on batched points `[N, d]`.

use tapir_tensor::{BinaryOps, DType, Device, Diff, Error, ReduceOps, Result, ShapeOps, Tensor};

use crate::backward::GradOptions;
use crate::graph::{Graph, Var};

// The tangents and probes below are built on the host, where they are a
// few lines, and copied to the device of the value they go with (a no-op
// on the CPU): the operators then run wherever their inputs live.

/// A tangent shaped `shape`, 1 at row-major position `flat`, 0 elsewhere.
fn unit(shape: &[usize], dtype: DType, device: Device, flat: usize) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut v = vec![0.0; n];
    v[flat] = 1.0;
    Tensor::from_vec(v, [n])?.cast(dtype)?.reshape(shape.to_vec())?.to_device(device)
}

/// A `[N, d]` tangent that is 1 in column `i` and 0 elsewhere.
fn column(n: usize, d: usize, i: usize, dtype: DType, device: Device) -> Result<Tensor> {
    let mut v = vec![0.0; n * d];
    for r in 0..n {
        v[r * d + i] = 1.0;
    }
    Tensor::from_vec(v, [n, d])?.cast(dtype)?.to_device(device)
}

fn check_points(g: &Graph, op: &'static str, u: &Var<'_>, x: &Var<'_>) -> Result<(usize, usize)> {
    g.check_own(op, &[*u])?;
    g.check_own(op, &[*x])?;
    let xs = x.shape();
    if xs.rank() != 2 {
        return Err(Error::InvalidShape { op, shape: Box::new(xs), reason: "points must be [N, d]".into() });
    }
    let (n, d) = (xs.dims()[0], xs.dims()[1]);
    let us = u.shape();
    let ok = us.dims() == [n] || us.dims() == [n, 1];
    if !ok {
        return Err(Error::ShapeMismatch { op, lhs: Box::new(us), rhs: Box::new(xs) });
    }
    Ok((n, d))
}

impl Graph {
    /// Hessian-vector product `H v` of a scalar `f` with respect to `x`, by
    /// forward-over-reverse, as a plain tensor: about the cost of two
    /// gradients, and the Hessian is never formed.
    ///
    /// ```
    /// use tapir::prelude::*;
    ///
    /// // f = sum(x^3) has the Hessian diag(6 x).
    /// let hv = Graph::scope(|g| {
    ///     let x = g.leaf(Tensor::from_vec(vec![1.0f64, 2.0], [2])?);
    ///     let f = x.powf(3.0)?.sum_all()?;
    ///     g.hvp(f, x, &Tensor::from_vec(vec![1.0f64, 1.0], [2])?)
    /// })?;
    /// assert_eq!(hv.to_vec::<f64>()?, vec![6.0, 12.0]);
    /// # Ok::<(), Error>(())
    /// ```
    pub fn hvp(&self, f: Var<'_>, x: Var<'_>, v: &Tensor) -> Result<Tensor> {
        let (f, x) = (self.same("hvp", f)?, self.same("hvp", x)?);
        let gx = self.grad_graph(f, &[x])?[0];
        Ok(self.jvp(&[gx], &[x], std::slice::from_ref(v))?.remove(0))
    }

    /// `H v`, recorded (differentiable again).
    pub fn hvp_graph<'g>(&'g self, f: Var<'g>, x: Var<'g>, v: Var<'g>) -> Result<Var<'g>> {
        self.check_own("hvp_graph", &[f, x, v])?;
        let gx = self.grad_graph(f, &[x])?[0];
        Ok(self.jvp_graph(&[gx], &[x], &[v])?.remove(0))
    }

    /// The full Jacobian of `y` with respect to `x`, shaped
    /// `y.shape ++ x.shape`: forward mode column by column when `x` is the
    /// smaller, reverse mode row by row otherwise. For small problems. The
    /// result lives on `y`'s device.
    pub fn jacobian(&self, y: Var<'_>, x: Var<'_>) -> Result<Tensor> {
        let (y, x) = (self.same("jacobian", y)?, self.same("jacobian", x)?);
        let (ys, xs) = (y.shape(), x.shape());
        let (m, n) = (ys.numel(), xs.numel());
        let mut out = vec![0.0f64; m * n];
        if n <= m {
            for j in 0..n {
                let col = self.jvp(&[y], &[x], &[unit(xs.dims(), x.dtype(), x.device(), j)?])?.remove(0).to_vec_f64();
                for i in 0..m {
                    out[i * n + j] = col[i];
                }
            }
        } else {
            for i in 0..m {
                let seed = unit(ys.dims(), y.dtype(), y.device(), i)?;
                let opts = GradOptions { grad_outputs: Some(vec![seed]), retain_graph: true };
                let row = self.grad_with(&[y], &[x], opts)?.remove(0).to_vec_f64();
                out[i * n..(i + 1) * n].copy_from_slice(&row);
            }
        }
        let mut shape = ys.dims().to_vec();
        shape.extend_from_slice(xs.dims());
        Tensor::from_vec(out, shape)?.cast(y.dtype())?.to_device(y.device())
    }

    /// The full Hessian of a scalar `f` with respect to `x`, shaped
    /// `x.shape ++ x.shape`, by one forward-over-reverse pass per element of
    /// `x`. For small inputs. The result lives on `f`'s device.
    pub fn hessian(&self, f: Var<'_>, x: Var<'_>) -> Result<Tensor> {
        let (f, x) = (self.same("hessian", f)?, self.same("hessian", x)?);
        if f.numel() != 1 {
            return Err(Error::InvalidShape {
                op: "hessian",
                shape: Box::new(f.shape()),
                reason: "needs a scalar".into(),
            });
        }
        let gx = self.grad_graph(f, &[x])?[0];
        let xs = x.shape();
        let n = xs.numel();
        let mut out = Vec::with_capacity(n * n);
        for j in 0..n {
            out.extend(self.jvp(&[gx], &[x], &[unit(xs.dims(), x.dtype(), x.device(), j)?])?.remove(0).to_vec_f64());
        }
        let mut shape = xs.dims().to_vec();
        shape.extend_from_slice(xs.dims());
        // H is symmetric, so the column-major fill is also row-major.
        Tensor::from_vec(out, shape)?.cast(f.dtype())?.to_device(f.device())
    }

    /// Per-sample second derivatives `d^2 u / dx_i^2` for the listed
    /// coordinates `dims`, of `u` (`[N]` or `[N, 1]`) with respect to points
    /// `x` (`[N, d]`), recorded. Samples must not interact (each `u[n]`
    /// depends on `x[n]` only), as in a network applied row by row. One
    /// forward-over-reverse pass per listed coordinate; the full Hessian is
    /// never formed. Returns `[N, dims.len()]`.
    pub fn second_partials<'g>(&'g self, u: Var<'g>, x: Var<'g>, dims: &[usize]) -> Result<Var<'g>> {
        let (n, d) = check_points(self, "second_partials", &u, &x)?;
        if let Some(&bad) = dims.iter().find(|&&i| i >= d) {
            return Err(Error::IndexOutOfRange { op: "second_partials", index: bad as i64, position: 0, size: d });
        }
        let gx = self.grad_graph(u.sum_all()?, &[x])?[0];
        let cols = dims
            .iter()
            .map(|&i| {
                let e = self.constant(column(n, d, i, x.dtype(), x.device())?);
                self.jvp_graph(&[gx], &[x], &[e])?[0].narrow(1, i, 1)
            })
            .collect::<Result<Vec<_>>>()?;
        if cols.is_empty() {
            // No coordinates (d = 0, or none listed): an [N, 0] block, as
            // torch gives, where concat would have nothing to join.
            return gx.narrow(1, 0, 0);
        }
        let refs: Vec<&Var<'g>> = cols.iter().collect();
        Var::concat(&refs, 1)
    }

    /// The Hessian diagonal per sample, `[N, d]`, recorded.
    pub fn hessian_diag<'g>(&'g self, u: Var<'g>, x: Var<'g>) -> Result<Var<'g>> {
        let (_, d) = check_points(self, "hessian_diag", &u, &x)?;
        self.second_partials(u, x, &(0..d).collect::<Vec<_>>())
    }

    /// The Laplacian per sample (trace of each sample's Hessian), `[N]`,
    /// recorded so it can sit inside a loss. `u` is `[N]` or `[N, 1]` and
    /// `x` the points `[N, d]`; samples must not interact, as in a network
    /// applied row by row.
    ///
    /// ```
    /// use tapir::prelude::*;
    ///
    /// // u = x^2 + 3 y^2 has the Laplacian 2 + 6 = 8 at every point.
    /// let lap = Graph::scope(|g| {
    ///     let x = g.leaf(Tensor::from_vec(vec![0.5f64, 1.0, -2.0, 0.25], [2, 2])?);
    ///     let w = g.constant(Tensor::from_vec(vec![1.0f64, 3.0], [1, 2])?);
    ///     let u = x.square()?.mul(&w)?.sum(&[1], false)?; // [N]
    ///     g.laplacian(u, x)?.value()
    /// })?;
    /// assert_eq!(lap.to_vec::<f64>()?, vec![8.0, 8.0]);
    /// # Ok::<(), Error>(())
    /// ```
    pub fn laplacian<'g>(&'g self, u: Var<'g>, x: Var<'g>) -> Result<Var<'g>> {
        self.hessian_diag(u, x)?.sum(&[1], false)
    }

    /// Mixed second partial `d^2 u / (dx_i dx_j)` per sample, `[N, 1]`,
    /// recorded (for terms like `u_xt`).
    pub fn mixed_partial<'g>(&'g self, u: Var<'g>, x: Var<'g>, i: usize, j: usize) -> Result<Var<'g>> {
        let (n, d) = check_points(self, "mixed_partial", &u, &x)?;
        if i >= d || j >= d {
            return Err(Error::IndexOutOfRange { op: "mixed_partial", index: i.max(j) as i64, position: 0, size: d });
        }
        let gx = self.grad_graph(u.sum_all()?, &[x])?[0];
        let e = self.constant(column(n, d, j, x.dtype(), x.device())?);
        self.jvp_graph(&[gx], &[x], &[e])?[0].narrow(1, i, 1)
    }

    /// Gradient of `u` per sample with respect to points `x`, `[N, d]`, recorded.
    pub fn point_gradient<'g>(&'g self, u: Var<'g>, x: Var<'g>) -> Result<Var<'g>> {
        check_points(self, "point_gradient", &u, &x)?;
        Ok(self.grad_graph(u.sum_all()?, &[x])?[0])
    }

    /// Hutchinson's estimate of the per-sample Laplacian with `probes`
    /// Rademacher vectors: `mean_k v_k . (H v_k)`, recorded. Unbiased; for
    /// large `d`, where the exact trace costs `d` passes.
    pub fn laplacian_hutchinson<'g>(
        &'g self,
        u: Var<'g>,
        x: Var<'g>,
        probes: usize,
        rng: &mut tapir_tensor::Rng,
    ) -> Result<Var<'g>> {
        let (n, d) = check_points(self, "laplacian_hutchinson", &u, &x)?;
        if probes == 0 {
            return Err(Error::invalid_arg("laplacian_hutchinson", "needs at least one probe"));
        }
        let gx = self.grad_graph(u.sum_all()?, &[x])?[0];
        let mut total: Option<Var<'g>> = None;
        for _ in 0..probes {
            let signs: Vec<f64> = (0..n * d).map(|_| if rng.next_u64() & 1 == 0 { -1.0 } else { 1.0 }).collect();
            let v = self.constant(Tensor::from_vec(signs, [n, d])?.cast(x.dtype())?.to_device(x.device())?);
            let hv = self.jvp_graph(&[gx], &[x], &[v])?.remove(0);
            let q = hv.mul(&v)?.sum(&[1], false)?;
            total = Some(match total {
                Some(t) => t.add(&q)?,
                None => q,
            });
        }
        total.expect("internal: probes > 0").mul_scalar(1.0 / probes as f64)
    }

    /// Re-brands a handle of this graph (checked at run time) so operators
    /// taking `&self` can mix it with handles they create.
    fn same<'g>(&'g self, op: &str, v: Var<'_>) -> Result<Var<'g>> {
        self.check_own(op, &[v])?;
        Ok(self.var(v.id))
    }
}

use tapir_tensor::UnaryOps as _;
