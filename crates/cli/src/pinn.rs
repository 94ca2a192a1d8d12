//! `tapir pinn`: physics-informed networks on PDEs with known solutions.
//!
//! The residual's derivatives come from the forward-Laplacian jet
//! (`Mlp::forward_jet`): value, gradient and the needed second derivatives
//! of the network in one recorded forward pass, then one backward pass for
//! the parameters. Every step runs in its own graph scope, so live memory at
//! every step boundary is identical; the command checks it.

use std::f64::consts::PI;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use tapir::nn::dist::{Communicator, DataParallel, DdpOptions, ReduceOp};
use tapir::nn::{Activation, Adam, Bound, Grads, Lbfgs, LineSearch, Mlp, Optimizer, ParamStore, Schedule};
use tapir::prelude::*;

use crate::chart::{bytes, heatmaps, line_chart, num, Field, Marker, Panel, Series};
use crate::device::DeviceArg;
use crate::gpt::{communicator, device_list, on_devices, or_abort, rank_report, Dist};

/// Which PDE.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// -Laplacian(u) = 2 pi^2 sin(pi x) sin(pi y) on the unit square, u = 0 on its boundary.
    Poisson,
    /// u_t = alpha u_xx for x and t in (0, 1), u(x,0) = sin(pi x), u = 0 at x = 0, 1.
    Heat,
    /// u_t + u u_x = (0.01/pi) u_xx for x in (-1, 1) and t in (0, 1), u(x,0) = -sin(pi x), u(+-1,t) = 0.
    Burgers,
}

/// A floating-point precision for one phase of the training.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// 32-bit floats.
    F32,
    /// 64-bit floats.
    F64,
    /// For L-BFGS: f32 until its line search finds no decrease along the
    /// gradient (f32 rounding), then f64 from there.
    F32ThenF64,
}

impl Precision {
    /// The dtype the phase starts in.
    fn dtype(self) -> DType {
        match self {
            Precision::F32 | Precision::F32ThenF64 => DType::F32,
            Precision::F64 => DType::F64,
        }
    }
}

/// L-BFGS's line search (`tapir_nn::LineSearch`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Search {
    /// Backtracking to the Armijo condition.
    Backtracking,
    /// The strong Wolfe conditions.
    StrongWolfe,
}

impl Search {
    fn line_search(self) -> LineSearch {
        match self {
            Search::Backtracking => LineSearch::Backtracking,
            Search::StrongWolfe => LineSearch::StrongWolfe,
        }
    }
}

/// Arguments of `tapir pinn`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The problem to solve.
    #[arg(value_enum)]
    pub problem: Problem,
    /// Adam steps (default: 10,000; 2,000 for burgers).
    #[arg(long)]
    pub steps: Option<usize>,
    /// L-BFGS iterations after Adam, on any device (default: 2,500 for
    /// poisson, 300 for heat, 7,100 for burgers; PINN practice is Adam,
    /// then L-BFGS). With `--lbfgs-precision f32-then-f64` this is a budget
    /// in f32 iterations: each f64 iteration after the switch counts as
    /// --lbfgs-f64-cost of them.
    #[arg(long)]
    pub lbfgs: Option<usize>,
    /// Initial Adam learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Final Adam learning rate (exponential decay).
    #[arg(long, default_value_t = 1e-4)]
    pub lr_final: f64,
    /// Hidden widths of the tanh MLP (default: 64,64,64; for burgers
    /// 20,20,20,20,20,20,20,20,20, Raissi et al.'s nine layers of 20).
    #[arg(long, value_delimiter = ',')]
    pub hidden: Option<Vec<usize>>,
    /// Interior collocation points (default: 2,000; 3,200 for burgers,
    /// whose shock needs them: docs/performance.md, "More points for the
    /// shock").
    #[arg(long)]
    pub interior: Option<usize>,
    /// Boundary (and initial-condition) points: for heat and burgers, a
    /// third each on the initial line t = 0 and on the two spatial
    /// boundaries.
    #[arg(long, default_value_t = 400)]
    pub boundary: usize,
    /// Extra points on the initial line t = 0 (heat, burgers), drawn after
    /// --boundary's and fitted in the same mean misfit.
    #[arg(long, default_value_t = 0)]
    pub ic_points: usize,
    /// Weight of the initial line's squared misfits (all of its points,
    /// --boundary's and --ic-points') in the mean misfit; the spatial
    /// boundaries keep weight 1 (heat, burgers; default: 1 for heat, 10
    /// for burgers).
    #[arg(long)]
    pub ic_weight: Option<f64>,
    /// Residual-based collocation points: every --adaptive-every L-BFGS
    /// iterations, for --adaptive-rounds rounds, the PDE residual of the
    /// network is evaluated at
    /// --adaptive-candidates fresh random points and this many of them,
    /// where it is largest, join the interior points; L-BFGS restarts its
    /// history after each round (the loss changed). Default: 0 (none).
    #[arg(long, default_value_t = 0)]
    pub adaptive: usize,
    /// Rounds of --adaptive points.
    #[arg(long, default_value_t = 1)]
    pub adaptive_rounds: usize,
    /// L-BFGS iterations between two rounds of --adaptive points.
    #[arg(long, default_value_t = 1000)]
    pub adaptive_every: usize,
    /// Random points whose residual a round of --adaptive points ranks.
    #[arg(long, default_value_t = 20_000)]
    pub adaptive_candidates: usize,
    /// Compute in f64 instead of f32.
    #[arg(long)]
    pub f64: bool,
    /// Precision of the L-BFGS phase: the parameters, points and grid are
    /// cast when it starts. For
    /// L-BFGS past where f32 rounding stops it: on burgers, f32 L-BFGS
    /// stalls near a loss of 4e-6 with a 3 x 64 network and at 2.5e-4 and
    /// below with the default 9 x 20 one, while an f64 evaluation costs
    /// 1.6-3x an f32 one on a Zen 4 CPU (docs/performance.md, "PINN
    /// accuracy"). `f32-then-f64` runs f32 L-BFGS until it stalls (its
    /// line search finds no decrease along the gradient, or the loss gains
    /// under 0.1% in 100 iterations), then casts once and goes on
    /// in f64 for the budget left (see --lbfgs-f64-cost); without it, a
    /// stall ends L-BFGS.
    /// Default: `f32-then-f64` for burgers (without --f64), else the Adam
    /// phase's precision.
    #[arg(long, value_enum)]
    pub lbfgs_precision: Option<Precision>,
    /// With `--lbfgs-precision f32-then-f64`: how many of --lbfgs's
    /// iterations one f64 iteration after the switch counts as. With f64
    /// tanh in straight-line code and f64 weight gradients on tapir's own
    /// kernel, an f64 evaluation costs 1.8-2.4 f32 ones on burgers on a
    /// Zen 4 CPU, for the default 9 x 20 network and for 3 x 64
    /// (docs/performance.md, "More points for the shock"). The default
    /// charges 2.7, more than that: with it the default's 3,200 points fit
    /// the reference time, and a run's cost still depends little on where
    /// f32 stalls; 1 counts iterations alone.
    #[arg(long, default_value_t = 2.7)]
    pub lbfgs_f64_cost: f64,
    /// L-BFGS's line search: `backtracking` halves the first trial step
    /// until the loss falls enough (never a longer step), `strong-wolfe`
    /// also grows it and asks the slope to flatten (the strong Wolfe
    /// conditions, as scipy's L-BFGS-B and torch's `strong_wolfe`).
    /// Default: `strong-wolfe` for burgers, else `backtracking`.
    #[arg(long, value_enum)]
    pub line_search: Option<Search>,
    /// Seed for points and weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Evaluate the error every this many steps.
    #[arg(long, default_value_t = 500)]
    pub eval_every: usize,
    /// PNG of the solution and the pointwise error.
    #[arg(long, default_value = "pinn.png")]
    pub plot: PathBuf,
    /// PNG of the loss, error and live memory per step.
    #[arg(long, default_value = "pinn-training.png")]
    pub curves: PathBuf,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Use a plain network for burgers instead of one odd in x by
    /// construction (`u(x, t) = (N(x, t) - N(-x, t)) / 2`, which pins the
    /// shock at x = 0).
    #[arg(long)]
    pub plain: bool,
    /// Where to train: cpu, cuda, cuda:N, or auto (CUDA when present, else
    /// the CPU). L-BFGS runs on the CPU only, so on CUDA the default is no
    /// L-BFGS iterations.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
    /// Data parallelism: `mpi` trains on every rank of `mpirun -np N tapir
    /// pinn ... --dist mpi` (a build with `--features mpi`). Each rank
    /// takes its 1/N of the interior and of the boundary points (both
    /// counts multiples of N), losses and gradients are averaged over
    /// ranks, so N ranks follow one process; rank 0 prints and plots.
    #[arg(long, value_enum, default_value_t = Dist::None)]
    pub dist: Dist,
    /// Data parallelism over several CUDA devices of this process, e.g.
    /// `cuda:0,cuda:1`: one thread and one NCCL communicator per device,
    /// each with its 1/N of the points, as the ranks of `--dist mpi`
    /// (a build with the `nccl` feature, on by default). Replaces --device.
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<DeviceArg>,
    /// Write the run's figures (losses, errors, time, ranks) as JSON here
    /// (rank 0's file).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl Args {
    /// Adam steps: --steps, or the problem's default.
    pub fn adam_steps(&self) -> usize {
        self.steps.unwrap_or(if self.problem == Problem::Burgers { 2_000 } else { 10_000 })
    }

    /// L-BFGS iterations (a budget in f32 iterations with f32-then-f64):
    /// --lbfgs, or the problem's default.
    pub fn lbfgs_iterations(&self) -> usize {
        self.lbfgs.unwrap_or(match self.problem {
            Problem::Heat => 300,
            Problem::Poisson => 2500,
            Problem::Burgers => 7100,
        })
    }

    /// Interior collocation points: --interior, or the problem's default.
    pub fn interior_points(&self) -> usize {
        self.interior.unwrap_or(if self.problem == Problem::Burgers { 3_200 } else { 2_000 })
    }

    /// Hidden widths: --hidden, or the problem's default.
    pub fn hidden_widths(&self) -> Vec<usize> {
        self.hidden.clone().unwrap_or_else(|| match self.problem {
            Problem::Burgers => vec![20; 9],
            Problem::Poisson | Problem::Heat => vec![64; 3],
        })
    }

    /// L-BFGS's line search: --line-search, or the problem's default.
    pub fn search(&self) -> Search {
        self.line_search.unwrap_or(if self.problem == Problem::Burgers {
            Search::StrongWolfe
        } else {
            Search::Backtracking
        })
    }

    /// The initial line's weight: --ic-weight, or the problem's default.
    pub fn initial_weight(&self) -> f64 {
        self.ic_weight.unwrap_or(if self.problem == Problem::Burgers { 10.0 } else { 1.0 })
    }

    /// The L-BFGS phase's precision when it differs from Adam's:
    /// --lbfgs-precision, or f32-then-f64 for burgers in f32.
    pub fn lbfgs_phase_precision(&self) -> Option<Precision> {
        self.lbfgs_precision.or((self.problem == Problem::Burgers && !self.f64).then_some(Precision::F32ThenF64))
    }
}

/// L-BFGS has stalled when its loss fell by less than `SLOW_GAIN` of itself
/// over the last `SLOW_ITERS` iterations in one dtype and one set of points
/// (a healthy Burgers run loses several percent of its loss in 100
/// iterations, even in its slow f64 tail): `Lbfgs::min_progress`.
const SLOW_ITERS: usize = 100;
const SLOW_GAIN: f64 = 1e-3;

/// Whether the network is made odd in x: `u(x, t) = (N(x, t) - N(-x, t)) / 2`.
///
/// Burgers' solution here is odd in x (the initial condition is, and the
/// equation is invariant under x -> -x, u -> -u), so its shock sits exactly
/// at x = 0 for all time. A plain network learns the shock a fraction of a
/// grid step off centre, and with a shock this thin (width about 2 nu / u,
/// under 0.01) that alone costs about 10% relative L2 error; the odd
/// network pins it. `--plain` turns this off.
pub fn odd_in_x(a: &Args) -> bool {
    a.problem == Problem::Burgers && !a.plain
}

/// The heat equation's diffusivity.
const ALPHA: f64 = 0.1;
/// Burgers' viscosity.
const NU: f64 = 0.01 / PI;

/// Domain of the two inputs (x, and y or t).
fn domain(p: Problem) -> ((f64, f64), (f64, f64)) {
    match p {
        Problem::Poisson | Problem::Heat => ((0.0, 1.0), (0.0, 1.0)),
        Problem::Burgers => ((-1.0, 1.0), (0.0, 1.0)),
    }
}

/// The exact (or reference) solution at (x, y-or-t).
pub fn exact(p: Problem, x: f64, y: f64, gh: &GaussHermite) -> f64 {
    match p {
        Problem::Poisson => (PI * x).sin() * (PI * y).sin(),
        Problem::Heat => (PI * x).sin() * (-ALPHA * PI * PI * y).exp(),
        Problem::Burgers => burgers_cole_hopf(x, y, gh),
    }
}

/// Gauss-Hermite nodes and weights (weight e^{-z^2}). The nodes are the
/// roots of the n-th Hermite function, bracketed by a scan for sign changes
/// (the roots are at least pi / sqrt(2n + 1) apart) and polished by
/// bisection; the weights come from the derivative there.
pub struct GaussHermite {
    /// Nodes.
    pub z: Vec<f64>,
    /// Weights.
    pub w: Vec<f64>,
}

impl GaussHermite {
    /// The orthonormal Hermite functions' recurrence: returns (h_n(x), h_{n-1}(x))
    /// for h_k(x) = H_k(x) e^{-x^2/2} / sqrt(2^k k! sqrt(pi)).
    fn hermite(n: usize, x: f64) -> (f64, f64) {
        let (mut p1, mut p2) = (PI.powf(-0.25) * (-x * x / 2.0).exp(), 0.0);
        for j in 1..=n {
            let p3 = p2;
            p2 = p1;
            p1 = x * (2.0 / j as f64).sqrt() * p2 - ((j - 1) as f64 / j as f64).sqrt() * p3;
        }
        (p1, p2)
    }

    /// The n-point rule.
    pub fn new(n: usize) -> Self {
        let edge = (2.0 * n as f64 + 1.0).sqrt() + 1.0;
        let step = PI / (2.0 * n as f64 + 1.0).sqrt() / 8.0;
        let (mut z, mut w) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut a = -edge;
        let mut fa = Self::hermite(n, a).0;
        while a < edge && z.len() < n {
            let b = a + step;
            let fb = Self::hermite(n, b).0;
            if fa == 0.0 || fa.signum() != fb.signum() {
                let (mut lo, mut hi, mut flo) = (a, b, fa);
                for _ in 0..200 {
                    let mid = 0.5 * (lo + hi);
                    if mid <= lo || mid >= hi {
                        break;
                    }
                    let fm = Self::hermite(n, mid).0;
                    if fm.signum() == flo.signum() {
                        (lo, flo) = (mid, fm);
                    } else {
                        hi = mid;
                    }
                }
                let x = 0.5 * (lo + hi);
                // With h_k the orthonormal Hermite functions, the weight of
                // the e^{-z^2} rule at a root x is e^{-x^2} / (n h_{n-1}(x)^2).
                let h1 = Self::hermite(n, x).1;
                z.push(x);
                w.push((-x * x).exp() / (n as f64 * h1 * h1));
            }
            (a, fa) = (b, fb);
        }
        GaussHermite { z, w }
    }
}

/// Burgers' solution by the Cole-Hopf transformation: with eta = sqrt(4 nu t) z,
/// u = -sum w sin(pi (x - eta)) E / sum w E, E = exp(-cos(pi (x - eta)) / (2 pi nu)).
pub fn burgers_cole_hopf(x: f64, t: f64, gh: &GaussHermite) -> f64 {
    if t <= 0.0 {
        return -(PI * x).sin();
    }
    let c = (4.0 * NU * t).sqrt();
    let k = 1.0 / (2.0 * PI * NU);
    let logs: Vec<f64> = gh.z.iter().map(|z| -(PI * (x - c * z)).cos() * k).collect();
    let m = logs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let (mut num, mut den) = (0.0, 0.0);
    for ((z, w), l) in gh.z.iter().zip(&gh.w).zip(&logs) {
        let e = w * (l - m).exp();
        num += (PI * (x - c * z)).sin() * e;
        den += e;
    }
    -num / den
}

/// Collocation points of a problem.
struct Points {
    /// Interior points [N, 2].
    interior: Tensor,
    /// Boundary and initial points [M, 2] and their target values [M, 1].
    edge: Tensor,
    edge_u: Tensor,
    /// Each edge point's weight in the mean misfit [M, 1], when not all 1.
    edge_w: Option<Tensor>,
    /// `[-1, 1]`, to mirror points in x (for the odd network).
    mirror: Tensor,
    /// The source term at the interior points [N, 1] (Poisson).
    source: Tensor,
}

impl Points {
    /// Rank `rank`'s 1/`world` of the interior and edge points (rows).
    fn shard(self, rank: usize, world: usize) -> Result<Points> {
        let part = |t: &Tensor| -> Result<Tensor> {
            let n = t.dims()[0] / world;
            t.narrow(0, rank * n, n)?.contiguous()
        };
        Ok(Points {
            interior: part(&self.interior)?,
            edge: part(&self.edge)?,
            edge_u: part(&self.edge_u)?,
            edge_w: self.edge_w.as_ref().map(part).transpose()?,
            source: part(&self.source)?,
            mirror: self.mirror,
        })
    }
}

/// `n` points drawn uniformly from the problem's domain, as (x, y) pairs.
fn uniform_points(p: Problem, rng: &mut Rng, n: usize) -> Vec<f64> {
    let ((x0, x1), (y0, y1)) = domain(p);
    let mut v = Vec::with_capacity(n * 2);
    for _ in 0..n {
        v.push(x0 + (x1 - x0) * rng.next_f64());
        v.push(y0 + (y1 - y0) * rng.next_f64());
    }
    v
}

/// Poisson's source term at (x, y).
fn source_at(x: f64, y: f64) -> f64 {
    2.0 * PI * PI * (PI * x).sin() * (PI * y).sin()
}

/// The points of a run: --interior's drawn from the seed, then `extra`
/// interior points ((x, y) pairs, the residual-based ones), then the edges.
fn sample(p: Problem, a: &Args, extra: &[f64], dtype: DType, device: Device, gh: &GaussHermite) -> Result<Points> {
    let mut rng = Rng::new(a.seed);
    let ((x0, x1), (y0, y1)) = domain(p);
    let mut inner = uniform_points(p, &mut rng, a.interior_points());
    inner.extend_from_slice(extra);
    let n = inner.len() / 2;
    // Edges: for Poisson all four sides; for the evolution problems the two
    // spatial boundaries and the initial line t = 0.
    let m = a.boundary;
    let mut edge = Vec::with_capacity(m * 2);
    for i in 0..m {
        let s = rng.next_f64();
        let side = i % if p == Problem::Poisson { 4 } else { 3 };
        let (x, y) = match side {
            0 => (x0 + (x1 - x0) * s, y0), // bottom: y = 0 (t = 0 for evolution)
            1 => (x0, y0 + (y1 - y0) * s), // left
            2 => (x1, y0 + (y1 - y0) * s), // right
            _ => (x0 + (x1 - x0) * s, y1), // top (Poisson only)
        };
        edge.push(x);
        edge.push(y);
    }
    // Extra initial-line points, drawn after the others so that the
    // default (none) draws the same points as before.
    for _ in 0..a.ic_points {
        edge.push(x0 + (x1 - x0) * rng.next_f64());
        edge.push(y0);
    }
    let m = m + a.ic_points;
    let w = a.initial_weight();
    let edge_w = (w != 1.0).then(|| edge.chunks(2).map(|c| if c[1] == y0 { w } else { 1.0 }).collect::<Vec<f64>>());
    let edge_u: Vec<f64> = edge.chunks(2).map(|c| exact(p, c[0], c[1], gh)).collect();
    let source: Vec<f64> = inner.chunks(2).map(|c| source_at(c[0], c[1])).collect();
    // The points are drawn on the host (the same ones on every device) and
    // then moved once.
    let put = |v: Vec<f64>, shape: [usize; 2]| Tensor::from_vec(v, shape)?.cast(dtype)?.to_device(device);
    Ok(Points {
        interior: put(inner, [n, 2])?,
        edge: put(edge, [m, 2])?,
        edge_u: put(edge_u, [m, 1])?,
        edge_w: edge_w.map(|w| put(w, [m, 1])).transpose()?,
        source: put(source, [n, 1])?,
        mirror: put(vec![-1.0f64, 1.0], [1, 2])?,
    })
}

/// The PDE residual from the solution's value `u` `[N, 1]`, its gradient
/// `[N, 2]` (x, then y or t), its second derivatives summed over the
/// problem's diffusion dims `[N, 1]` (both dims for Poisson, x alone
/// otherwise) and the source term `[N, 1]` (Poisson). Zero at the exact
/// solution.
pub fn residual<T: Diff>(prob: Problem, u: &T, grad: &T, second: &T, source: &T) -> Result<T> {
    let n = u.shape().dims()[0];
    match prob {
        Problem::Poisson => second.add(source),
        Problem::Heat | Problem::Burgers => {
            let u_x = grad.narrow(1, 0, 1)?.reshape([n, 1])?;
            let u_t = grad.narrow(1, 1, 1)?.reshape([n, 1])?;
            if prob == Problem::Heat {
                u_t.sub(&second.mul_scalar(ALPHA)?)
            } else {
                u_t.add(&u.mul(&u_x)?)?.sub(&second.mul_scalar(NU)?)
            }
        }
    }
}

/// The input dims whose second derivatives the residual needs.
fn diffusion_dims(prob: Problem) -> &'static [usize] {
    match prob {
        Problem::Poisson => &[0, 1],
        Problem::Heat | Problem::Burgers => &[0],
    }
}

/// The solution's value `[N, 1]`, gradient `[N, 2]` and second
/// derivatives summed over `dims` `[N, 1]` at `pts`, from one jet of the
/// network, or two when it is made odd in x (at the points and at their
/// mirror images).
pub fn solution<'g>(
    net: &Mlp,
    p: &Bound<'g>,
    pts: &Tensor,
    dims: &[usize],
    mirror: Option<&Tensor>,
) -> Result<[Var<'g>; 3]> {
    let g = p.graph();
    let n = pts.dims()[0];
    let jet_at = |x: Tensor| net.forward_jet(p, g.constant(x), dims);
    let Some(m) = mirror else {
        let jet = jet_at(pts.clone())?;
        return Ok([jet.value, jet.jacobian.reshape([n, 2])?, jet.laplacian]);
    };
    // One jet over the points and their mirror images, [2N, 2]. With
    // u(x) = (N(x) - N(-x)) / 2: d/dx of N(-x) is -N_x(-x) (so the x
    // component of the mirrored gradient flips twice), d2/dx2 is N_xx(-x).
    let both = Tensor::concat(&[pts, &pts.mul(m)?], 0)?;
    let jet = jet_at(both)?;
    let half = |v: &Var<'g>, flip: Option<&Tensor>| -> Result<Var<'g>> {
        let (a, b) = (v.narrow(0, 0, n)?, v.narrow(0, n, n)?);
        let b = match flip {
            Some(f) => b.mul(&g.constant(f.clone()))?,
            None => b,
        };
        a.sub(&b)?.mul_scalar(0.5)
    };
    let grad = jet.jacobian.reshape([2 * n, 2])?;
    Ok([half(&jet.value, None)?, half(&grad, Some(m))?, half(&jet.laplacian, None)?])
}

/// The network's values at `pts` (odd in x when `mirror` is given).
pub fn values<'g>(net: &Mlp, p: &Bound<'g>, pts: &Tensor, mirror: Option<&Tensor>) -> Result<Var<'g>> {
    let g = p.graph();
    let at = |x: Tensor| net.forward(p, g.constant(x));
    let u = at(pts.clone())?;
    match mirror {
        None => Ok(u),
        Some(m) => u.sub(&at(pts.mul(m)?)?)?.mul_scalar(0.5),
    }
}

/// The `k` of `m` points drawn from `rng` where the network's PDE residual
/// is largest in magnitude, as (x, y) pairs, the largest first (ties by
/// draw order, so every rank picks the same). The residual is evaluated in
/// one jet over all `m` (and their mirror images with `mirror`).
#[allow(clippy::too_many_arguments)]
pub fn worst_points(
    prob: Problem,
    net: &Mlp,
    store: &ParamStore,
    mirror: Option<&Tensor>,
    rng: &mut Rng,
    (k, m): (usize, usize),
    dtype: DType,
    device: Device,
) -> Result<Vec<f64>> {
    let cand = uniform_points(prob, rng, m);
    let src: Vec<f64> = cand.chunks(2).map(|c| source_at(c[0], c[1])).collect();
    let put = |v: Vec<f64>, shape: [usize; 2]| Tensor::from_vec(v, shape)?.cast(dtype)?.to_device(device);
    let (pts, src) = (put(cand.clone(), [m, 2])?, put(src, [m, 1])?);
    let r = Graph::scope(|g| {
        let p = store.bind(g);
        let [u, grad, second] = solution(net, &p, &pts, diffusion_dims(prob), mirror)?;
        Ok::<_, Error>(residual(prob, &u, &grad, &second, &g.constant(src))?.value()?.to_vec_f64())
    })?;
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&i, &j| r[j].abs().total_cmp(&r[i].abs()).then(i.cmp(&j)));
    Ok(order[..k.min(m)].iter().flat_map(|&i| [cand[2 * i], cand[2 * i + 1]]).collect())
}

/// The PINN loss of `net` at the points: mean squared residual plus mean
/// squared boundary/initial misfit (each point's square weighted, with
/// `--ic-weight`).
fn loss<'g>(prob: Problem, net: &Mlp, p: &Bound<'g>, pts: &Points, odd: bool) -> Result<Var<'g>> {
    let g = p.graph();
    let mirror = odd.then_some(&pts.mirror);
    let [u, grad, second] = solution(net, p, &pts.interior, diffusion_dims(prob), mirror)?;
    let r = residual(prob, &u, &grad, &second, &g.constant(pts.source.clone()))?;
    let misfit = values(net, p, &pts.edge, mirror)?.sub(&g.constant(pts.edge_u.clone()))?;
    let sq = match &pts.edge_w {
        Some(w) => misfit.square()?.mul(&g.constant(w.clone()))?,
        None => misfit.square()?,
    };
    r.square()?.mean_all()?.add(&sq.mean_all()?)
}

/// The loss and its parameters' gradients at `store`; over several ranks
/// both are averaged (the gradients by `ddp`, in buckets during the
/// backward).
#[allow(clippy::too_many_arguments)]
fn loss_and_grads(
    prob: Problem,
    net: &Mlp,
    pts: &Points,
    odd: bool,
    store: &ParamStore,
    comm: &Communicator,
    ddp: Option<&mut DataParallel<'_>>,
) -> Result<(f64, Grads)> {
    let (l, grads) = Graph::scope(|g| {
        let p = store.bind(g);
        let l = loss(prob, net, &p, pts, odd)?;
        let value = l.item()?;
        let grads = match ddp {
            Some(ddp) => ddp.grads(&p, l)?,
            None => p.grads(l)?,
        };
        Ok::<_, Error>((value, grads))
    })?;
    if comm.world_size() == 1 {
        return Ok((l, grads));
    }
    // On the points' device: a device backend (NCCL) reduces only there.
    let mut t = Tensor::from_vec(vec![l], [1])?.to_device(pts.source.device())?;
    comm.all_reduce(&mut t, ReduceOp::Average)?;
    Ok((t.to_vec::<f64>()?[0], grads))
}

/// The evaluation grid (101 x 101), the exact values on it, and the
/// network's relative L2 error there.
struct Grid {
    pts: Tensor,
    exact: Vec<f64>,
    n: usize,
}

impl Grid {
    fn new(p: Problem, dtype: DType, device: Device, gh: &GaussHermite) -> Result<Self> {
        let ((x0, x1), (y0, y1)) = domain(p);
        Self::linspace(p, dtype, device, gh, (x0, x1, 101), (y0, y1, 101))
    }

    /// Raissi et al.'s evaluation grid for burgers (their `burgers_shock.mat`):
    /// 256 x from -1 to 1 (so none at the shock, x = 0) by 100 t from 0 to
    /// 0.99.
    fn paper(p: Problem, dtype: DType, device: Device, gh: &GaussHermite) -> Result<Self> {
        Self::linspace(p, dtype, device, gh, (-1.0, 1.0, 256), (0.0, 0.99, 100))
    }

    /// `nx` evenly spaced x from `x0` to `x1` by `ny` y from `y0` to `y1`,
    /// x fastest.
    fn linspace(
        p: Problem,
        dtype: DType,
        device: Device,
        gh: &GaussHermite,
        (x0, x1, nx): (f64, f64, usize),
        (y0, y1, ny): (f64, f64, usize),
    ) -> Result<Self> {
        let mut pts = Vec::with_capacity(nx * ny * 2);
        let mut ex = Vec::with_capacity(nx * ny);
        for j in 0..ny {
            for i in 0..nx {
                let (x, y) = (x0 + (x1 - x0) * i as f64 / (nx - 1) as f64, y0 + (y1 - y0) * j as f64 / (ny - 1) as f64);
                pts.push(x);
                pts.push(y);
                ex.push(exact(p, x, y, gh));
            }
        }
        Ok(Grid { pts: Tensor::from_vec(pts, [nx * ny, 2])?.cast(dtype)?.to_device(device)?, exact: ex, n: nx })
    }

    fn predict(&self, net: &Mlp, store: &ParamStore, mirror: Option<&Tensor>) -> Result<Vec<f64>> {
        Graph::scope(|g| Ok(values(net, &store.bind(g), &self.pts, mirror)?.value()?.to_vec_f64()))
    }

    fn rel_l2(&self, u: &[f64]) -> f64 {
        let num: f64 = u.iter().zip(&self.exact).map(|(a, b)| (a - b) * (a - b)).sum();
        let den: f64 = self.exact.iter().map(|b| b * b).sum();
        (num / den).sqrt()
    }
}

/// What a run measured.
pub struct Outcome {
    /// Relative L2 error on the grid after training.
    pub rel_l2: f64,
    /// Relative L2 error before training.
    pub initial_rel_l2: f64,
    /// Live bytes at every step boundary.
    pub live: Vec<usize>,
    /// Loss per step.
    pub losses: Vec<f64>,
    /// Relative L2 error on the grid at each evaluation: (step, error),
    /// step 0 before training.
    pub errors: Vec<(usize, f64)>,
    /// Wall time.
    pub seconds: f64,
    /// This process's rank and the number of ranks (0 and 1 alone).
    pub rank: usize,
    /// Ranks training together.
    pub world: usize,
    /// Seconds this rank spent in the gradients' all-reduces.
    pub allreduce_s: f64,
    /// Burgers only: the relative L2 error on the grid Raissi et al. (2019)
    /// report theirs on (x at 256 even steps of [-1, 1], t = 0, 0.01, ..,
    /// 0.99), against the same Cole-Hopf solution.
    pub paper_grid_rel_l2: Option<f64>,
    /// The index in `live` where the L-BFGS phase starts when it runs in
    /// another dtype than Adam (its parameters, points and grid are cast and
    /// Adam's moments freed, so the level changes there once).
    pub phase_switch: Option<usize>,
    /// The indices in `live` where a round of --adaptive points joined the
    /// interior (the points grow, so the level changes there too).
    pub point_rounds: Vec<usize>,
    /// Loss and gradient evaluations L-BFGS made, its line searches'
    /// included.
    pub lbfgs_evals: usize,
}

impl Outcome {
    /// Whether live memory is identical at every step boundary after the
    /// first, within each phase (split at [`Outcome::phase_switch`] and at
    /// each of [`Outcome::point_rounds`]).
    pub fn live_flat(&self) -> bool {
        let flat = |v: &[usize]| v.iter().skip(1).all(|&b| b == v[1.min(v.len().saturating_sub(1))]);
        let mut cuts: Vec<usize> = self.phase_switch.iter().chain(&self.point_rounds).copied().collect();
        cuts.retain(|&k| k <= self.live.len());
        cuts.sort_unstable();
        cuts.dedup();
        let mut start = 0;
        cuts.push(self.live.len());
        cuts.into_iter().all(|k| {
            let ok = flat(&self.live[start..k]);
            start = k;
            ok
        })
    }
}

/// Trains and evaluates; the CLI and the tests share this.
pub fn train(a: &Args) -> anyhow::Result<Outcome> {
    if a.devices.is_empty() {
        let (comm, device, _) = communicator(a.dist, a.device)?;
        return or_abort(&comm, train_on(a, &comm, device));
    }
    if a.dist != Dist::None {
        bail!("--devices and --dist are two ways to spread the training; give one");
    }
    let devices = device_list(&a.devices)?;
    if devices.len() == 1 {
        return train_on(a, &Communicator::single(), devices[0]);
    }
    let mut outcomes = on_devices(&devices, |comm, device| train_on(a, comm, device))?;
    // Rank 0's outcome goes back; the others report here.
    for o in &outcomes[1..] {
        rank_report(o.rank, o.world, "", o.allreduce_s, o.seconds);
    }
    Ok(outcomes.swap_remove(0))
}

/// The training of one rank of `comm` on `device`.
fn train_on(a: &Args, comm: &Communicator, device: Device) -> anyhow::Result<Outcome> {
    let dtype = if a.f64 { DType::F64 } else { DType::F32 };
    let prob = a.problem;
    let (rank, world) = (comm.rank(), comm.world_size());
    // Rank 0 speaks for the job.
    let speak = rank == 0;
    let steps = a.adam_steps();
    let ic_weight = a.initial_weight();
    let precision = a.lbfgs_phase_precision();
    if speak {
        println!(
            "tapir pinn {:?}: MLP 2-{}-1 tanh, {} interior + {} boundary points, Adam {} -> {} over {} steps, {}, --device {}{}",
            a.problem,
            a.hidden_widths().iter().map(|w| w.to_string()).collect::<Vec<_>>().join("-"),
            a.interior_points(),
            a.boundary,
            a.lr,
            a.lr_final,
            steps,
            if a.f64 { "f64" } else { "f32" },
            a.device,
            if world > 1 { format!(", {world} ranks (MPI), each with 1/{world} of the points") } else { String::new() }
        );
    }
    if prob == Problem::Poisson && (a.ic_points > 0 || ic_weight != 1.0) {
        bail!(
            "--ic-points and --ic-weight are for the evolution problems (heat, burgers): poisson has no initial line"
        );
    }
    if a.f64 && precision == Some(Precision::F32ThenF64) {
        bail!("--lbfgs-precision f32-then-f64 follows an f32 Adam phase (without --f64)");
    }
    if !(ic_weight.is_finite() && ic_weight >= 0.0) {
        bail!("--ic-weight must be a finite weight >= 0, not {ic_weight}");
    }
    if a.adaptive > 0 && (a.adaptive > a.adaptive_candidates || a.adaptive_every == 0) {
        bail!(
            "--adaptive ({}) takes the worst of --adaptive-candidates ({}) random points, every --adaptive-every ({}) \
             L-BFGS iterations: it must be at most the candidates, and the interval at least 1",
            a.adaptive,
            a.adaptive_candidates,
            a.adaptive_every
        );
    }
    if !(a.lbfgs_f64_cost.is_finite() && a.lbfgs_f64_cost > 0.0) {
        bail!("--lbfgs-f64-cost must be a finite cost > 0, not {}", a.lbfgs_f64_cost);
    }
    let edges = a.boundary + a.ic_points;
    if world > 1 && !a.adaptive.is_multiple_of(world) {
        bail!("--adaptive ({}) must be a multiple of the {world} ranks, as --interior is", a.adaptive);
    }
    if world > 1 && !(a.interior_points().is_multiple_of(world) && edges.is_multiple_of(world)) {
        anyhow::bail!(
            "--dist mpi on {world} ranks: --interior ({}) and --boundary plus --ic-points ({edges}) must be multiples \
             of {world}, so that every rank's mean is over as many points and their average is the whole mean",
            a.interior_points(),
        );
    }
    if speak && (a.ic_points > 0 || ic_weight != 1.0) {
        println!(
            "initial line t = 0: {} extra points beside --boundary's, its squared misfits weighted {ic_weight}",
            a.ic_points
        );
    }
    let lbfgs_iters = a.lbfgs_iterations();
    if speak && precision == Some(Precision::F32ThenF64) && lbfgs_iters > 0 {
        println!(
            "L-BFGS: a budget of {lbfgs_iters} f32 iterations, f32 until it stalls, then f64 with each iteration \
             counted as {}",
            a.lbfgs_f64_cost
        );
    }
    let gh = GaussHermite::new(200);
    // Every rank draws every point from the seed, then keeps its share.
    let points = |dtype: DType, extra: &[f64]| -> Result<Points> {
        let pts = sample(prob, a, extra, dtype, device, &gh)?;
        if world > 1 {
            pts.shard(rank, world)
        } else {
            Ok(pts)
        }
    };
    // The residual-based interior points ((x, y) pairs), kept on the host
    // so that a dtype switch rebuilds them with the rest.
    let mut extra: Vec<f64> = Vec::new();
    let mut adaptive_rng = Rng::new(a.seed.wrapping_add(2));
    let mut pts = points(dtype, &extra)?;
    let mut grid = Grid::new(prob, dtype, device, &gh)?;
    let mut rng = Rng::new(a.seed.wrapping_add(1));
    let mut store = ParamStore::new();
    let mut widths = vec![2];
    widths.extend(a.hidden_widths());
    widths.push(1);
    let net = Mlp::xavier(&mut store, "u", &widths, Activation::Tanh, &mut rng, dtype)?;
    // The weights are drawn on the host so a seed gives the same network on
    // every device.
    store.to_device(device)?;
    // Every rank starts from rank 0's parameters; the bucket buffers are
    // made here, once.
    let mut ddp = if world > 1 { Some(DataParallel::new(comm, &mut store, DdpOptions::default())?) } else { None };
    let odd = odd_in_x(a);
    let initial_rel_l2 = grid.rel_l2(&grid.predict(&net, &store, odd.then_some(&pts.mirror))?);
    // An Option: it is dropped where L-BFGS changes dtype.
    let mut adam = Some(Adam::new(a.lr));
    let schedule = Schedule::Exponential { total: steps, final_factor: a.lr_final / a.lr };
    let bar = if a.quiet || !speak { ProgressBar::hidden() } else { ProgressBar::new((steps + lbfgs_iters) as u64) };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}")
            .expect("valid template"),
    );
    let started = Instant::now();
    let mut live = Vec::with_capacity(steps + lbfgs_iters);
    let mut losses = Vec::with_capacity(steps + lbfgs_iters);
    let mut err = initial_rel_l2;
    let mut errors = vec![(0, initial_rel_l2)];
    let evaluate = |grid: &Grid, pts: &Points, store: &ParamStore| -> Result<f64> {
        Ok(grid.rel_l2(&grid.predict(&net, store, odd.then_some(&pts.mirror))?))
    };
    for step in 0..steps {
        let lr = schedule.lr(a.lr, step);
        let (l, grads) = loss_and_grads(prob, &net, &pts, odd, &store, comm, ddp.as_mut())?;
        let opt = adam.as_mut().expect("Adam lives through its phase");
        opt.set_lr(lr);
        opt.step(&mut store, &grads)?;
        drop(grads);
        live.push(memory_allocated(device));
        losses.push(l);
        if (step + 1) % a.eval_every == 0 || step + 1 == steps {
            err = evaluate(&grid, &pts, &store)?;
            errors.push((step + 1, err));
            if speak {
                bar.suspend(|| {
                    println!(
                        "adam  {:>6}  loss {:<9} rel L2 {:<9} live {}",
                        step + 1,
                        num(l),
                        num(err),
                        bytes(memory_allocated(device) as f64)
                    )
                });
            }
        }
        bar.set_message(format!("adam loss {} rel L2 {}", num(l), num(err)));
        bar.inc(1);
    }
    let mut lbfgs_dtype = precision.map_or(dtype, Precision::dtype);
    let then_f64 = precision == Some(Precision::F32ThenF64);
    // Where the live memory's level may change: the L-BFGS phase holds
    // other dtypes and no Adam state.
    let mut phase_switch = None;
    // Adam's moments are no longer needed; the parameters, the points
    // (drawn again from the same seed: the same points) and the grid are
    // rebuilt in the new dtype.
    macro_rules! switch_dtype {
        ($to:expr) => {{
            let to: DType = $to;
            drop(adam.take());
            let ids: Vec<_> = store.ids().collect();
            for id in ids {
                let t = store.get_mut(id);
                *t = t.cast(to)?;
            }
            pts = points(to, &extra)?;
            grid = Grid::new(prob, to, device, &gh)?;
            if world > 1 {
                // The gradient buckets hold the old dtype.
                ddp = Some(DataParallel::new(comm, &mut store, DdpOptions::default())?);
            }
        }};
    }
    if lbfgs_iters > 0 && lbfgs_dtype != dtype {
        switch_dtype!(lbfgs_dtype);
        phase_switch = Some(steps);
    }
    let mut point_rounds = Vec::new();
    let mut lbfgs = Lbfgs::new(50).with_line_search(a.search().line_search());
    // No progress: a line search can go on accepting steps that move the
    // loss by its rounding alone (seen in f32 at a loss of 1.7e-2 with a
    // 9 x 20 network), a stall the search does not report; it is handled
    // as one. `reset` at each change of dtype or points starts the window
    // again.
    lbfgs.min_progress = Some((SLOW_ITERS, SLOW_GAIN));
    let mut lbfgs_evals = 0;
    // The iterations are a budget: with f32-then-f64, an f64 iteration after
    // the switch counts as --lbfgs-f64-cost f32 ones (about its cost), so
    // that the phase's cost does not depend on where f32 stalls. An
    // iteration runs only if it fits. Counted, not summed, so that no
    // rounding decides the last one.
    let (mut cheap, mut dear) = (0usize, 0usize);
    let fits = |cheap: usize, dear: usize, dt: DType| {
        let (cheap, dear) = if then_f64 && dt == DType::F64 { (cheap, dear + 1) } else { (cheap + 1, dear) };
        cheap as f64 + dear as f64 * a.lbfgs_f64_cost <= lbfgs_iters as f64 + 1e-9
    };
    let mut it = 0;
    while fits(cheap, dear, lbfgs_dtype) {
        if a.adaptive > 0 && point_rounds.len() < a.adaptive_rounds && it > 0 && it % a.adaptive_every == 0 {
            // A round of residual-based points: the interior grows by
            // --adaptive, the loss changes with it and the history goes.
            let (mirror, k) = (odd.then_some(&pts.mirror), (a.adaptive, a.adaptive_candidates));
            extra.extend(worst_points(prob, &net, &store, mirror, &mut adaptive_rng, k, lbfgs_dtype, device)?);
            pts = points(lbfgs_dtype, &extra)?;
            if speak {
                bar.suspend(|| {
                    println!(
                        "adaptive: {} of {} random points where the residual is largest join the interior ({} now)",
                        a.adaptive,
                        a.adaptive_candidates,
                        a.interior_points() + extra.len() / 2
                    )
                });
            }
            point_rounds.push(live.len());
            lbfgs.reset();
        }
        let st =
            lbfgs.step(&mut store, |s: &ParamStore| loss_and_grads(prob, &net, &pts, odd, s, comm, ddp.as_mut()))?;
        live.push(memory_allocated(device));
        losses.push(st.loss);
        lbfgs_evals += st.evals;
        if then_f64 && lbfgs_dtype == DType::F64 {
            dear += 1;
        } else {
            cheap += 1;
        }
        let stuck = st.stalled || st.no_progress;
        let stalled = stuck && !(then_f64 && lbfgs_dtype == DType::F32);
        let next_dtype = if stuck && !stalled { DType::F64 } else { lbfgs_dtype };
        let last = !fits(cheap, dear, next_dtype) || st.converged || stalled;
        if (it + 1) % 50 == 0 || last {
            err = evaluate(&grid, &pts, &store)?;
            errors.push((steps + it + 1, err));
            if speak {
                bar.suspend(|| {
                    println!(
                        "lbfgs {:>6}  loss {:<9} rel L2 {:<9} live {}",
                        it + 1,
                        num(st.loss),
                        num(err),
                        bytes(memory_allocated(device) as f64)
                    )
                });
            }
        }
        bar.set_message(format!("lbfgs loss {} rel L2 {}", num(st.loss), num(err)));
        bar.inc(1);
        let why = if st.stalled {
            "no decrease along the gradient".to_string()
        } else {
            format!("no progress over {SLOW_ITERS} iterations")
        };
        if stuck && !stalled {
            // f32 rounding stops the progress: on in f64 from here. The
            // history and the last evaluation are f32's, so they go.
            if speak {
                bar.suspend(|| {
                    println!("lbfgs {:>6}  stalled in f32 ({why}) at loss {}: on in f64", it + 1, num(st.loss))
                });
            }
            if phase_switch.is_none() {
                phase_switch = Some(steps + it + 1);
            }
            lbfgs_dtype = DType::F64;
            switch_dtype!(lbfgs_dtype);
            lbfgs.reset();
        }
        if st.converged || stalled {
            // The bar's end is where training ended, so it reads complete.
            bar.set_length(bar.position());
            if speak {
                bar.suspend(|| {
                    if st.converged {
                        println!("lbfgs converged after {} iterations", it + 1)
                    } else {
                        println!(
                            "lbfgs stopped after {} iterations: {why} at loss {} ({} rounding)",
                            it + 1,
                            num(st.loss),
                            if lbfgs_dtype == DType::F32 { "f32" } else { "f64" }
                        )
                    }
                });
            }
            break;
        }
        it += 1;
    }
    // Ended by the budget, perhaps short of --lbfgs iterations.
    bar.set_length(bar.position());
    bar.finish();
    let mirror = odd.then_some(&pts.mirror);
    let u = grid.predict(&net, &store, mirror)?;
    let rel_l2 = grid.rel_l2(&u);
    let seconds = started.elapsed().as_secs_f64();
    // After the clock stops: the paper's grid is an extra 25,600 points.
    let paper_grid_rel_l2 = if prob == Problem::Burgers && speak {
        let paper = Grid::paper(prob, if phase_switch.is_some() { lbfgs_dtype } else { dtype }, device, &gh)?;
        Some(paper.rel_l2(&paper.predict(&net, &store, mirror)?))
    } else {
        None
    };
    let allreduce_s = ddp.as_ref().map_or(Ok(0.0), DataParallel::comm_seconds)?;
    if !speak {
        return Ok(Outcome {
            rel_l2,
            initial_rel_l2,
            live,
            losses,
            errors,
            seconds,
            rank,
            world,
            allreduce_s,
            phase_switch,
            paper_grid_rel_l2,
            point_rounds,
            lbfgs_evals,
        });
    }
    if !a.plot.as_os_str().is_empty() {
        let ((x0, x1), (y0, y1)) = domain(prob);
        let ylab = if prob == Problem::Poisson { "y" } else { "t" };
        let field = |title: &str, values: Vec<f64>| Field {
            title: title.into(),
            values,
            nx: grid.n,
            ny: grid.n,
            x: (x0, x1),
            y: (y0, y1),
            labels: ("x".into(), ylab.into()),
        };
        let errs: Vec<f64> = u.iter().zip(&grid.exact).map(|(a, b)| (a - b).abs()).collect();
        heatmaps(
            &a.plot,
            &[field("tapir u", u.clone()), field("exact u", grid.exact.clone()), field("|error|", errs)],
        )?;
    }
    if !a.curves.as_os_str().is_empty() {
        let pts = |v: &[f64]| v.iter().enumerate().map(|(i, &y)| ((i + 1) as f64, y)).collect::<Vec<_>>();
        let mem: Vec<f64> = live.iter().map(|&b| b as f64 / 1024.0).collect();
        // Where Adam ends and L-BFGS starts, on every panel.
        let switch = || {
            (lbfgs_iters > 0 && steps > 0)
                .then(|| Marker { x: steps as f64 + 0.5, label: "Adam ends, L-BFGS starts".into() })
                .into_iter()
                .collect::<Vec<_>>()
        };
        line_chart(
            &a.curves,
            &[
                Panel {
                    title: "training loss".into(),
                    x_label: "step (Adam, then L-BFGS iterations)".into(),
                    y_label: "loss".into(),
                    series: vec![Series { label: "loss".into(), points: pts(&losses) }],
                    log_y: true,
                    integer_x: true,
                    markers: switch(),
                },
                Panel {
                    title: "relative L2 error on the 101 x 101 grid".into(),
                    x_label: "step".into(),
                    y_label: "relative L2 error".into(),
                    series: vec![Series {
                        label: "error".into(),
                        points: errors.iter().map(|&(s, e)| (s as f64, e)).collect(),
                    }],
                    log_y: true,
                    integer_x: true,
                    markers: switch(),
                },
                Panel {
                    title: "live memory at step boundaries (exact allocator count)".into(),
                    x_label: "step".into(),
                    y_label: "KiB".into(),
                    series: vec![Series { label: "live".into(), points: pts(&mem) }],
                    log_y: false,
                    integer_x: true,
                    markers: switch(),
                },
            ],
        )?;
    }
    Ok(Outcome {
        rel_l2,
        initial_rel_l2,
        live,
        losses,
        errors,
        seconds,
        rank,
        world,
        allreduce_s,
        phase_switch,
        paper_grid_rel_l2,
        point_rounds,
        lbfgs_evals,
    })
}

/// Runs the command.
pub fn run(a: Args) -> anyhow::Result<()> {
    let o = train(&a).context("training")?;
    let flat = o.live_flat();
    if o.world > 1 {
        rank_report(o.rank, o.world, "", o.allreduce_s, o.seconds);
    }
    if o.rank != 0 {
        anyhow::ensure!(flat, "live memory changed between step boundaries (rank {})", o.rank);
        return Ok(());
    }
    if let Some(path) = &a.json {
        let v = serde_json::json!({
            "losses": o.losses,
            "errors": o.errors,
            "rel_l2": o.rel_l2,
            "initial_rel_l2": o.initial_rel_l2,
            "seconds": o.seconds,
            "live": o.live,
            "world": o.world,
            "allreduce_s": o.allreduce_s,
            "phase_switch": o.phase_switch,
            "point_rounds": o.point_rounds,
            "lbfgs_evals": o.lbfgs_evals,
            "paper_grid_rel_l2": o.paper_grid_rel_l2,
            "adam_steps": a.adam_steps(),
            "lbfgs_iterations": o.losses.len().saturating_sub(a.adam_steps()),
            "host_cpu": crate::device::cpu_model(),
            "cpu_kernels": crate::device::cpu_kernels(),
            "buffer_align": tapir::buffer_alignment(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("relative L2 error on a 101 x 101 grid: {} (initially {})", num(o.rel_l2), num(o.initial_rel_l2));
    if let Some(e) = o.paper_grid_rel_l2 {
        println!("relative L2 error on Raissi et al.'s 256 x 100 grid (t = 0, 0.01, .., 0.99): {}", num(e));
    }
    let lbfgs_live = match o.phase_switch {
        Some(k) => format!(", L-BFGS phase {}", bytes(o.live.get(k + 1).copied().unwrap_or(0) as f64)),
        None => String::new(),
    };
    println!(
        "live memory at every step boundary after the first{}: {} ({}{}, {} boundaries)",
        if o.phase_switch.is_some() { " of each phase" } else { "" },
        if flat { "identical" } else { "NOT identical" },
        bytes(o.live.get(1).copied().unwrap_or(0) as f64),
        lbfgs_live,
        o.live.len()
    );
    println!(
        "time: {} s ({} ms/step)   plots: {}, {}",
        num(o.seconds),
        num(1e3 * o.seconds / o.live.len().max(1) as f64),
        a.plot.display(),
        a.curves.display()
    );
    anyhow::ensure!(flat, "live memory changed between step boundaries");
    Ok(())
}
