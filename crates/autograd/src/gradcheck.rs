//! The gradient checker: derivatives against central differences along
//! random directions, in f64, in reverse and forward mode, recursing for
//! higher orders (the derivative of a checked derivative is checked again).

use tapir_tensor::{BinaryOps, DType, Diff, Error, ReduceOps, Rng, ShapeOps, Tensor, UnaryOps};

use crate::backward::GradOptions;
use crate::graph::{Graph, Var};

/// A derivative that disagrees with finite differences, or a failure while
/// evaluating.
#[derive(Debug, Clone, PartialEq)]
pub enum CheckError {
    /// Evaluating the function or a derivative failed.
    Eval(Error),
    /// A derivative disagrees with central differences.
    Mismatch {
        /// Derivative order being checked (1 = first derivatives).
        order: usize,
        /// Which chain of modes produced it, e.g. "rev" or "fwd(rev)".
        mode: String,
        /// The autodiff directional derivative.
        analytic: f64,
        /// The central-difference estimate.
        numeric: f64,
    },
}

impl std::fmt::Display for CheckError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckError::Eval(e) => write!(f, "evaluation failed: {e}"),
            CheckError::Mismatch { order, mode, analytic, numeric } => write!(
                f,
                "order-{order} {mode} derivative {analytic:.10e} disagrees with central differences {numeric:.10e}"
            ),
        }
    }
}

impl From<Error> for CheckError {
    fn from(e: Error) -> Self {
        CheckError::Eval(e)
    }
}

/// `?` on [`check_grads`] works in a function returning `tapir::Result`: an
/// evaluation failure converts to the tensor error it carries, a mismatch
/// to [`Error::GradCheck`] with the same message.
impl From<CheckError> for Error {
    fn from(e: CheckError) -> Self {
        match e {
            CheckError::Eval(e) => e,
            mismatch => Error::GradCheck { message: mismatch.to_string() },
        }
    }
}

/// Settings of [`check_grads`].
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Highest derivative order to check (1 or more).
    pub order: usize,
    /// Check reverse mode.
    pub reverse: bool,
    /// Check forward mode.
    pub forward: bool,
    /// Finite-difference step.
    pub eps: f64,
    /// Relative tolerance.
    pub rtol: f64,
    /// Absolute tolerance.
    pub atol: f64,
    /// Seed of the random directions.
    pub seed: u64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions { order: 2, reverse: true, forward: true, eps: 1e-6, rtol: 1e-5, atol: 1e-7, seed: 0 }
    }
}

/// A function of several inputs to check: built fresh inside each scope.
pub type CheckFn<'a> = dyn for<'g> Fn(&'g Graph, &[Var<'g>]) -> tapir_tensor::Result<Var<'g>> + 'a;

/// Checks `f`'s derivatives at `inputs` (converted to f64) up to
/// `opts.order`, in the modes asked, JAX `check_grads`-style.
///
/// ```
/// use tapir::prelude::*;
///
/// let x = Tensor::from_vec(vec![0.3f64, -0.7, 1.1], [3])?;
/// check_grads(&|_g, v| v[0].tanh()?.mul(&v[0])?.sum_all(), &[x], &CheckOptions::default()).unwrap();
/// # Ok::<(), Error>(())
/// ```
pub fn check_grads(f: &CheckFn<'_>, inputs: &[Tensor], opts: &CheckOptions) -> Result<(), CheckError> {
    let inputs = inputs.iter().map(|t| t.cast(DType::F64)).collect::<tapir_tensor::Result<Vec<_>>>()?;
    let mut rng = Rng::new(opts.seed);
    check_rec(f, &inputs, opts, opts.order, 1, "", &mut rng)
}

fn dot(a: &Tensor, b: &Tensor) -> tapir_tensor::Result<f64> {
    a.mul(b)?.sum_all()?.item()
}

/// <r, f(x)> as a number.
fn eval(f: &CheckFn<'_>, xs: &[Tensor], r: &Tensor) -> tapir_tensor::Result<f64> {
    Graph::scope(|g| {
        let vs: Vec<Var<'_>> = xs.iter().map(|x| g.leaf(x.clone())).collect();
        dot(&f(g, &vs)?.value()?, r)
    })
}

#[allow(clippy::too_many_arguments)]
fn check_rec(
    f: &CheckFn<'_>,
    xs: &[Tensor],
    opts: &CheckOptions,
    remaining: usize,
    order: usize,
    outer: &str,
    rng: &mut Rng,
) -> Result<(), CheckError> {
    // Random cotangent for the output and directions for the inputs.
    let (out_shape, out_device) = Graph::scope(|g| {
        let vs: Vec<Var<'_>> = xs.iter().map(|x| g.leaf(x.clone())).collect();
        let y = f(g, &vs)?;
        Ok::<_, Error>((y.shape(), y.device()))
    })?;
    // Drawn on the host, so the directions are the same numbers on every
    // device, then placed beside the values they multiply.
    let r = rng.randn(out_shape, DType::F64)?.to_device(out_device)?;
    let dirs: Vec<Tensor> = xs
        .iter()
        .map(|x| rng.randn(x.shape().clone(), DType::F64)?.to_device(x.device()))
        .collect::<tapir_tensor::Result<_>>()?;

    let shifted = |t: f64| -> tapir_tensor::Result<Vec<Tensor>> {
        xs.iter().zip(&dirs).map(|(x, d)| x.add(&d.mul_scalar(t)?)).collect()
    };
    let numeric = (eval(f, &shifted(opts.eps)?, &r)? - eval(f, &shifted(-opts.eps)?, &r)?) / (2.0 * opts.eps);
    let compare = |mode: &str, analytic: f64| -> Result<(), CheckError> {
        if (analytic - numeric).abs() <= opts.atol + opts.rtol * numeric.abs() && analytic.is_finite() {
            Ok(())
        } else {
            Err(CheckError::Mismatch { order, mode: wrap(mode, outer), analytic, numeric })
        }
    };
    if opts.reverse {
        let grads = Graph::scope(|g| {
            let vs: Vec<Var<'_>> = xs.iter().map(|x| g.leaf(x.clone())).collect();
            let y = f(g, &vs)?;
            g.grad_with(&[y], &vs, GradOptions { grad_outputs: Some(vec![r.clone()]), retain_graph: false })
        })?;
        let mut a = 0.0;
        for (gi, d) in grads.iter().zip(&dirs) {
            a += dot(gi, d)?;
        }
        compare("rev", a)?;
    }
    if opts.forward {
        let t = Graph::scope(|g| {
            let vs: Vec<Var<'_>> = xs.iter().map(|x| g.leaf(x.clone())).collect();
            let y = f(g, &vs)?;
            Ok::<_, Error>(g.jvp(&[y], &vs, &dirs)?.remove(0))
        })?;
        compare("fwd", dot(&t, &r)?)?;
    }
    if remaining <= 1 {
        return Ok(());
    }
    // The next order: the derivative itself, as a recorded function of x.
    if opts.reverse {
        let (r2, w) = (r.clone(), dirs.clone());
        let df = higher_ranked(move |g, vs| {
            let y = f(g, vs)?;
            let s = y.mul(&g.constant(r2.clone()))?.sum_all()?;
            let grads = g.grad_graph(s, vs)?;
            let mut acc: Option<Var<'_>> = None;
            for (gi, wi) in grads.iter().zip(&w) {
                let term = gi.mul(&g.constant(wi.clone()))?.sum_all()?;
                acc = Some(match acc {
                    Some(a) => a.add(&term)?,
                    None => term,
                });
            }
            acc.ok_or_else(|| Error::invalid_arg("check_grads", "no inputs"))
        });
        check_rec(&df, xs, opts, remaining - 1, order + 1, &wrap("rev", outer), rng)?;
    }
    if opts.forward {
        let (r2, w) = (r.clone(), dirs.clone());
        let df = higher_ranked(move |g, vs| {
            let y = f(g, vs)?;
            let ts: Vec<Var<'_>> = w.iter().map(|t| g.constant(t.clone())).collect();
            let jy = g.jvp_graph(&[y], vs, &ts)?.remove(0);
            jy.mul(&g.constant(r2.clone()))?.sum_all()
        });
        check_rec(&df, xs, opts, remaining - 1, order + 1, &wrap("fwd", outer), rng)?;
    }
    Ok(())
}

fn wrap(mode: &str, outer: &str) -> String {
    if outer.is_empty() {
        mode.to_string()
    } else {
        format!("{mode}({outer})")
    }
}

/// Pins a closure to the higher-ranked signature of [`CheckFn`].
fn higher_ranked<F>(f: F) -> F
where
    F: for<'g> Fn(&'g Graph, &[Var<'g>]) -> tapir_tensor::Result<Var<'g>>,
{
    f
}
impl std::error::Error for CheckError {}
