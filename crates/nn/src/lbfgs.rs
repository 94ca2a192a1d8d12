//! L-BFGS for the second phase of PINN training (Adam first, then L-BFGS),
//! with a choice of line search: backtracking to the Armijo condition, or
//! a search for a step meeting the strong Wolfe conditions (as scipy's and
//! torch's `strong_wolfe` L-BFGS do).

use std::collections::VecDeque;

use tapir_tensor::{DType, Error, Result, ShapeOps, Tensor};

use crate::params::{Grads, ParamStore};

/// How an L-BFGS step searches along its direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineSearch {
    /// Halve the step, from the first trial, until the loss falls enough
    /// (the Armijo condition). Never tries a step longer than the first,
    /// so a direction the history scaled too short stays short.
    Backtracking,
    /// Find a step that lowers the loss enough and where the slope along
    /// the direction has shrunk to at most `c2` of its starting magnitude
    /// (the strong Wolfe conditions): longer steps while the loss keeps
    /// falling, then cubic interpolation inside the bracket found. Every
    /// accepted step then has `s . y > 0`, so each pair it stores carries
    /// real curvature.
    StrongWolfe,
}

/// Limited-memory BFGS over all parameters of a store, in f64.
#[derive(Debug, Clone)]
pub struct Lbfgs {
    /// Number of (s, y) pairs kept.
    pub history: usize,
    /// The first step tried along each direction (1 is the natural scale).
    pub lr: f64,
    /// The line search (default: backtracking).
    pub line_search: LineSearch,
    /// Sufficient-decrease (Armijo) constant.
    pub c1: f64,
    /// Curvature constant of the strong Wolfe conditions.
    pub c2: f64,
    /// Most function evaluations per step, the one at its start included
    /// when it is not reused.
    pub max_evals: usize,
    /// Stop when the gradient's max-norm falls below this.
    pub tolerance_grad: f64,
    /// `Some((window, gain))`: a step reports [`LbfgsStep::no_progress`]
    /// when the loss fell by less than `gain` of itself over the last
    /// `window` steps since the last [`Lbfgs::reset`]. A line search can go
    /// on accepting steps that move the loss by its rounding alone, a stall
    /// that no single step shows. Default: `None` (not checked).
    pub min_progress: Option<(usize, f64)>,
    /// The losses after each step since the last reset, the last `window +
    /// 1` of them.
    recent: VecDeque<f64>,
    s: VecDeque<Vec<f64>>,
    y: VecDeque<Vec<f64>>,
    /// The point the last step accepted, with its loss and gradient: the
    /// next step starts there without evaluating it again.
    last: Option<(Vec<f64>, f64, Vec<f64>)>,
}

/// What one L-BFGS iteration did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LbfgsStep {
    /// Loss before the step.
    pub loss_before: f64,
    /// Loss after the step.
    pub loss: f64,
    /// Function evaluations the step used.
    pub evals: usize,
    /// True when the gradient was already below tolerance (no step taken).
    pub converged: bool,
    /// True when the line search found no decrease along the plain
    /// (steepest-descent) direction, with no curvature history to try
    /// instead: the parameters are where the step began, and every further
    /// step from here would repeat the same search, so the caller should
    /// stop. This is where rounding ends the progress (an f32 loss near
    /// its floor); a failure along a quasi-Newton direction only drops the
    /// history and is not reported here, since the next step tries the
    /// gradient.
    pub stalled: bool,
    /// True when [`Lbfgs::min_progress`] is set and the loss fell by less
    /// than its gain over its window of steps.
    pub no_progress: bool,
}

fn flatten(ts: impl Iterator<Item = Tensor>) -> Vec<f64> {
    ts.flat_map(|t| t.to_vec_f64()).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Writes `x` back into the store's parameters, in place.
fn unflatten(store: &mut ParamStore, x: &[f64]) -> Result<()> {
    let ids: Vec<_> = store.ids().collect();
    let mut at = 0;
    for id in ids {
        let t = store.get_mut(id);
        let n = t.numel();
        let src = &x[at..at + n];
        if t.device() != tapir_tensor::Device::Cpu && matches!(t.dtype(), DType::F32 | DType::F64) {
            // Off the host, the new values are built there and copied over
            // (L-BFGS's history is kept on the host in f64).
            let host = Tensor::from_vec(src.to_vec(), t.shape().clone())?.cast(t.dtype())?;
            *t = host.to_device(t.device())?;
            at += n;
            continue;
        }
        match t.dtype() {
            DType::F64 => t.make_mut::<f64>()?.copy_from_slice(src),
            DType::F32 => t.make_mut::<f32>()?.iter_mut().zip(src).for_each(|(d, &s)| *d = s as f32),
            dtype => {
                return Err(Error::UnsupportedDType { op: "Lbfgs::step", dtype, expected: "f32 or f64 parameters" })
            }
        }
        at += n;
    }
    Ok(())
}

/// One point on the search line: the step length, the loss there, its
/// gradient and the slope along the direction.
struct Trial {
    t: f64,
    f: f64,
    g: Vec<f64>,
    slope: f64,
}

/// The line `x0 + t dir` through the parameters, evaluated on demand.
struct Line<'a, F> {
    store: &'a mut ParamStore,
    f: F,
    x0: &'a [f64],
    dir: &'a [f64],
    /// The start's loss and slope.
    f0: f64,
    slope0: f64,
    /// Evaluations so far, and the most allowed.
    evals: usize,
    max_evals: usize,
    /// The step the parameters are at.
    at: f64,
}

impl<F: FnMut(&ParamStore) -> Result<(f64, Grads)>> Line<'_, F> {
    fn move_to(&mut self, t: f64) -> Result<()> {
        if t == 0.0 {
            // Exactly the start, whatever the direction holds.
            unflatten(self.store, self.x0)?;
        } else {
            let x: Vec<f64> = self.x0.iter().zip(self.dir).map(|(a, d)| a + t * d).collect();
            unflatten(self.store, &x)?;
        }
        self.at = t;
        Ok(())
    }

    /// The loss, gradient and slope at step `t`. A failed evaluation leaves
    /// the parameters where the step began.
    fn probe(&mut self, t: f64) -> Result<Trial> {
        self.move_to(t)?;
        let r = (self.f)(self.store).and_then(|(f, g)| g.check_fits(self.store, "Lbfgs::step").map(|()| (f, g)));
        let (f, g) = match r {
            Ok(v) => v,
            Err(e) => {
                self.move_to(0.0)?;
                return Err(e);
            }
        };
        self.evals += 1;
        let g = flatten(g.iter().map(|(_, g)| g.clone()));
        let slope = dot(&g, self.dir);
        Ok(Trial { t, f, g, slope })
    }

    fn spent(&self) -> bool {
        self.evals >= self.max_evals
    }

    /// Sufficient decrease at `c1`.
    fn armijo(&self, p: &Trial, c1: f64) -> bool {
        p.f.is_finite() && p.f <= self.f0 + c1 * p.t * self.slope0
    }

    /// Halves the step from `t` until it decreases the loss enough.
    fn backtrack(&mut self, mut t: f64, c1: f64) -> Result<Option<Trial>> {
        loop {
            let p = self.probe(t)?;
            if self.armijo(&p, c1) {
                return Ok(Some(p));
            }
            if self.spent() {
                return Ok(None);
            }
            t *= 0.5;
        }
    }

    /// A step meeting the strong Wolfe conditions, starting at `t`: grow
    /// the step while the loss falls and the slope stays negative, then
    /// narrow the bracket that holds an acceptable step. When the
    /// evaluations run out, the lowest point with sufficient decrease.
    fn strong_wolfe(&mut self, t: f64, c1: f64, c2: f64) -> Result<Option<Trial>> {
        let flat = |p: &Trial, s0: f64| p.slope.abs() <= -c2 * s0;
        let mut prev = Trial { t: 0.0, f: self.f0, g: Vec::new(), slope: self.slope0 };
        let mut p = self.probe(t)?;
        // Bracketing: (lo, hi) with lo the lower, sufficiently decreasing
        // end, and an acceptable step between them.
        let (mut lo, mut hi) = loop {
            if !self.armijo(&p, c1) || (prev.t > 0.0 && p.f >= prev.f) {
                break (prev, p);
            }
            if flat(&p, self.slope0) {
                return Ok(Some(p));
            }
            if p.slope >= 0.0 {
                break (p, prev);
            }
            if self.spent() {
                return Ok(Some(p));
            }
            // Still falling: a longer step, where the cubic through the
            // two points has its minimum, between 1.1 and 10 times this one.
            let (min, max) = (1.1 * p.t, 10.0 * p.t);
            let next = cubic_min(&prev, &p).filter(|t| *t >= min && *t <= max).unwrap_or(max);
            let q = self.probe(next)?;
            prev = std::mem::replace(&mut p, q);
        };
        while !self.spent() {
            let (a, b) = (lo.t.min(hi.t), lo.t.max(hi.t));
            let margin = 0.1 * (b - a);
            let t = cubic_min(&lo, &hi).filter(|t| *t >= a + margin && *t <= b - margin).unwrap_or(0.5 * (a + b));
            if t <= a || t >= b {
                // The bracket is down to rounding.
                break;
            }
            let p = self.probe(t)?;
            if !self.armijo(&p, c1) || p.f >= lo.f {
                hi = p;
            } else {
                if flat(&p, self.slope0) {
                    return Ok(Some(p));
                }
                if p.slope * (hi.t - lo.t) >= 0.0 {
                    hi = lo;
                }
                lo = p;
            }
        }
        Ok((lo.t > 0.0).then_some(lo))
    }
}

/// Where the cubic matching the values and slopes at `p` and `q` has its
/// minimum, if it has one.
fn cubic_min(p: &Trial, q: &Trial) -> Option<f64> {
    let d1 = p.slope + q.slope - 3.0 * (p.f - q.f) / (p.t - q.t);
    // A negative or NaN discriminant: no minimum (NaN's sqrt stays NaN).
    let d2 = (d1 * d1 - p.slope * q.slope).sqrt().copysign(q.t - p.t);
    let t = q.t - (q.t - p.t) * (q.slope + d2 - d1) / (q.slope - p.slope + 2.0 * d2);
    t.is_finite().then_some(t)
}

impl Lbfgs {
    /// L-BFGS keeping `history` pairs, backtracking, with torch's defaults
    /// otherwise.
    pub fn new(history: usize) -> Self {
        Lbfgs {
            history: history.max(1),
            lr: 1.0,
            line_search: LineSearch::Backtracking,
            c1: 1e-4,
            c2: 0.9,
            max_evals: 25,
            tolerance_grad: 1e-9,
            min_progress: None,
            recent: VecDeque::new(),
            s: VecDeque::new(),
            y: VecDeque::new(),
            last: None,
        }
    }

    /// The same, searching each line with `line_search`.
    pub fn with_line_search(mut self, line_search: LineSearch) -> Self {
        self.line_search = line_search;
        self
    }

    /// Forgets the curvature history and the last point, for when the
    /// objective changes (new collocation points, a new batch): the history
    /// and the reused last evaluation both assume the same `f` every step.
    pub fn reset(&mut self) {
        self.s.clear();
        self.y.clear();
        self.last = None;
        self.recent.clear();
    }

    /// Records the loss after a step; whether the last `window` steps
    /// gained less than `gain` of the loss (see [`Lbfgs::min_progress`]).
    fn no_progress_after(&mut self, loss: f64) -> bool {
        let Some((window, gain)) = self.min_progress else { return false };
        self.recent.push_back(loss);
        if self.recent.len() > window + 1 {
            self.recent.pop_front();
        }
        match (self.recent.len() > window, self.recent.front()) {
            (true, Some(&old)) => old - loss < gain * old,
            _ => false,
        }
    }

    /// One iteration: a quasi-Newton direction from the history, then a
    /// line search along it. `f` evaluates the loss and its gradients at
    /// the store's current parameters; it must be the same function every
    /// step (see [`Lbfgs::reset`]). When the parameters are where the
    /// previous step left them, its last evaluation is reused, so a step
    /// whose first trial is accepted costs one evaluation.
    pub fn step(
        &mut self,
        store: &mut ParamStore,
        mut f: impl FnMut(&ParamStore) -> Result<(f64, Grads)>,
    ) -> Result<LbfgsStep> {
        let x0 = flatten(store.ids().map(|id| store.get(id).clone()));
        if self.s.front().is_some_and(|s| s.len() != x0.len()) {
            // Parameters were added or replaced since the last step: the
            // curvature pairs describe another space.
            self.reset();
        }
        let (f0, g0, evals) = match self.last.take() {
            // The parameters are where the last step left them: reuse.
            Some((x, f0, g0)) if x == x0 => (f0, g0, 0),
            _ => {
                let (f0, g0) = f(store)?;
                g0.check_fits(store, "Lbfgs::step")?;
                (f0, flatten(g0.iter().map(|(_, g)| g.clone())), 1)
            }
        };
        if !f0.is_finite() {
            return Err(Error::NonFinite { op: "Lbfgs::step", value: f0, position: 0 });
        }
        if g0.iter().fold(0.0f64, |m, g| m.max(g.abs())) <= self.tolerance_grad {
            return Ok(LbfgsStep {
                loss_before: f0,
                loss: f0,
                evals,
                converged: true,
                stalled: false,
                no_progress: false,
            });
        }
        // Two-loop recursion: d = -H g.
        let mut q = g0.clone();
        let mut alphas = Vec::with_capacity(self.s.len());
        for (s, y) in self.s.iter().zip(&self.y).rev() {
            let rho = 1.0 / dot(y, s);
            let a = rho * dot(s, &q);
            q.iter_mut().zip(y).for_each(|(qi, yi)| *qi -= a * yi);
            alphas.push((a, rho));
        }
        let gamma = match (self.s.back(), self.y.back()) {
            (Some(s), Some(y)) => dot(s, y) / dot(y, y),
            _ => (1.0 / g0.iter().map(|g| g.abs()).sum::<f64>()).min(1.0) * self.lr,
        };
        q.iter_mut().for_each(|qi| *qi *= gamma);
        for ((s, y), (a, rho)) in self.s.iter().zip(&self.y).zip(alphas.into_iter().rev()) {
            let b = rho * dot(y, &q);
            q.iter_mut().zip(s).for_each(|(qi, si)| *qi += (a - b) * si);
        }
        let mut dir: Vec<f64> = q.iter().map(|v| -v).collect();
        let mut slope = dot(&g0, &dir);
        // Whether the direction is the plain gradient's (no history).
        let mut plain = self.s.is_empty();
        if slope >= 0.0 {
            // Not a descent direction (stale curvature): restart from -g.
            self.s.clear();
            self.y.clear();
            let k = (1.0 / g0.iter().map(|g| g.abs()).sum::<f64>()).min(1.0) * self.lr;
            dir = g0.iter().map(|g| -k * g).collect();
            slope = dot(&g0, &dir);
            plain = true;
        }
        // Without history the direction is already scaled (torch's first step).
        let t = if self.s.is_empty() { 1.0 } else { self.lr };
        let mut line =
            Line { store, f: &mut f, x0: &x0, dir: &dir, f0, slope0: slope, evals, max_evals: self.max_evals, at: 0.0 };
        let found = match self.line_search {
            LineSearch::Backtracking => line.backtrack(t, self.c1),
            LineSearch::StrongWolfe => line.strong_wolfe(t, self.c1, self.c2),
        };
        // An error leaves the parameters where the step began (probe).
        let found = found?;
        let evals = line.evals;
        let Some(p) = found else {
            line.move_to(0.0)?;
            self.s.clear();
            self.y.clear();
            // The parameters are back at x0 exactly (f32 values survive
            // the round trip through f64), so the next step reuses this
            // evaluation instead of repeating it.
            self.last = Some((x0, f0, g0));
            let no_progress = self.no_progress_after(f0);
            return Ok(LbfgsStep { loss_before: f0, loss: f0, evals, converged: false, stalled: plain, no_progress });
        };
        if line.at != p.t {
            // The search ended elsewhere than at the step it accepts.
            line.move_to(p.t)?;
        }
        let s: Vec<f64> = dir.iter().map(|d| p.t * d).collect();
        let y: Vec<f64> = p.g.iter().zip(&g0).map(|(a, b)| a - b).collect();
        if dot(&s, &y) > 1e-10 * dot(&y, &y).sqrt() * dot(&s, &s).sqrt() {
            self.s.push_back(s);
            self.y.push_back(y);
            if self.s.len() > self.history {
                self.s.pop_front();
                self.y.pop_front();
            }
        }
        // As stored (f32 parameters round `x`).
        let stored = flatten(store.ids().map(|id| store.get(id).clone()));
        self.last = Some((stored, p.f, p.g));
        let no_progress = self.no_progress_after(p.f);
        Ok(LbfgsStep { loss_before: f0, loss: p.f, evals, converged: false, stalled: false, no_progress })
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn store(w: Vec<f64>) -> ParamStore {
        let mut s = ParamStore::new();
        let n = w.len();
        s.add("w", Tensor::from_vec(w, [n]).expect("w")).expect("param");
        s
    }

    fn w(s: &ParamStore) -> Vec<f64> {
        s.get(s.id("w").expect("id")).to_vec::<f64>().expect("w")
    }

    /// sum c_i (w_i - 3)^2, c_i = 10^i, and its gradient.
    fn quad(s: &ParamStore) -> Result<(f64, Grads)> {
        let v = w(s);
        let c = |i: usize| 10f64.powi(i as i32);
        let loss = v.iter().enumerate().map(|(i, x)| c(i) * (x - 3.0) * (x - 3.0)).sum();
        let g = v.iter().enumerate().map(|(i, x)| 2.0 * c(i) * (x - 3.0)).collect::<Vec<_>>();
        Ok((loss, Grads::from_tensors(vec![Tensor::from_vec(g, [v.len()])?])))
    }

    const SEARCHES: [LineSearch; 2] = [LineSearch::Backtracking, LineSearch::StrongWolfe];

    #[test]
    fn stops_when_no_decrease_is_possible() {
        SEARCHES.into_iter().for_each(no_decrease_is_possible_with);
    }

    fn no_decrease_is_possible_with(search: LineSearch) {
        // A loss no step can lower (its gradient points nowhere useful):
        // the search along the plain gradient fails, which is reported, and
        // the parameters stay where they were.
        let mut s = store(vec![1.0, -2.0, 0.5]);
        let mut opt = Lbfgs::new(5).with_line_search(search);
        let calls = std::cell::Cell::new(0usize);
        let flat = |_: &ParamStore| -> Result<(f64, Grads)> {
            calls.set(calls.get() + 1);
            Ok((1.0, Grads::from_tensors(vec![Tensor::ones([3], DType::F64)?])))
        };
        let st = opt.step(&mut s, flat).expect("step");
        assert!(st.stalled && !st.converged, "{st:?}");
        assert_eq!((st.loss, st.loss_before), (1.0, 1.0));
        assert_eq!(st.evals, opt.max_evals);
        assert_eq!(calls.get(), opt.max_evals);
        assert_eq!(w(&s), [1.0, -2.0, 0.5]);
        // Another step repeats the same search (so a caller stops), but not
        // the evaluation at the start point: it is reused.
        let st = opt.step(&mut s, flat).expect("step");
        assert!(st.stalled, "{st:?}");
        assert_eq!(st.evals, opt.max_evals);
        assert_eq!(calls.get(), 2 * opt.max_evals);
        assert_eq!(w(&s), [1.0, -2.0, 0.5]);
    }

    #[test]
    fn a_failed_quasi_newton_search_is_not_a_stall() {
        SEARCHES.into_iter().for_each(failed_quasi_newton_search_with);
    }

    fn failed_quasi_newton_search_with(search: LineSearch) {
        // Two good steps build a history; then the loss rises everywhere
        // off the current point. The first failure, along the quasi-Newton
        // direction, drops the history and is not a stall; the next search,
        // along the gradient, fails too and is.
        let mut s = store(vec![1.0, -2.0, 0.5]);
        let mut opt = Lbfgs::new(5).with_line_search(search);
        for _ in 0..2 {
            let st = opt.step(&mut s, quad).expect("step");
            assert!(!st.stalled && st.loss < st.loss_before, "{st:?}");
        }
        let at = w(&s);
        let walled = |s: &ParamStore| -> Result<(f64, Grads)> {
            let (l, g) = quad(s)?;
            Ok((if w(s) == at { l } else { l + 1e3 }, g))
        };
        let st = opt.step(&mut s, walled).expect("step");
        assert!(!st.stalled && !st.converged, "{st:?}");
        assert_eq!(w(&s), at);
        let st = opt.step(&mut s, walled).expect("step");
        assert!(st.stalled, "{st:?}");
        assert_eq!(w(&s), at);
        // Where progress is possible again, the steps go on.
        let st = opt.step(&mut s, quad).expect("step");
        assert!(!st.stalled && st.loss < st.loss_before, "{st:?}");
    }

    #[test]
    fn progress_is_never_a_stall() {
        for search in SEARCHES {
            let mut s = store(vec![1.0, -2.0, 0.5]);
            let mut opt = Lbfgs::new(5).with_line_search(search);
            for _ in 0..100 {
                let st = opt.step(&mut s, quad).expect("step");
                assert!(!st.stalled, "{search:?}: {st:?}");
                if st.converged {
                    break;
                }
            }
            assert!(w(&s).iter().all(|x| (x - 3.0).abs() < 1e-9), "{search:?}: {:?}", w(&s));
        }
    }

    /// The loss and gradient at `x` as plain vectors.
    fn at(f: fn(&ParamStore) -> Result<(f64, Grads)>, x: &[f64]) -> (f64, Vec<f64>) {
        let (l, g) = f(&store(x.to_vec())).expect("f");
        (l, flatten(g.iter().map(|(_, g)| g.clone())))
    }

    /// Rosenbrock's function in two dimensions.
    fn rosenbrock(s: &ParamStore) -> Result<(f64, Grads)> {
        let v = w(s);
        let (x, y) = (v[0], v[1]);
        let loss = (1.0 - x) * (1.0 - x) + 100.0 * (y - x * x) * (y - x * x);
        let g = vec![-2.0 * (1.0 - x) - 400.0 * x * (y - x * x), 200.0 * (y - x * x)];
        Ok((loss, Grads::from_tensors(vec![Tensor::from_vec(g, [2])?])))
    }

    #[test]
    fn strong_wolfe_steps_meet_both_conditions() {
        // Every accepted step s from x0 to x1 lowers the loss by c1 of the
        // slope (f1 <= f0 + c1 g0.s) and flattens the slope to c2 of its
        // magnitude (|g1.s| <= c2 |g0.s|), which makes s.y > 0.
        type F = fn(&ParamStore) -> Result<(f64, Grads)>;
        let cases: [(F, Vec<f64>, f64); 2] =
            [(quad, vec![1.0, -2.0, 0.5, 7.0], 3.0), (rosenbrock, vec![-1.2, 1.0], 1.0)];
        for (f, x, min) in cases {
            let mut s = store(x);
            let mut opt = Lbfgs::new(5).with_line_search(LineSearch::StrongWolfe);
            let mut steps = 0;
            for _ in 0..200 {
                let x0 = w(&s);
                let st = opt.step(&mut s, f).expect("step");
                if st.converged || st.loss < 1e-18 {
                    break;
                }
                steps += 1;
                let x1 = w(&s);
                let ((f0, g0), (f1, g1)) = (at(f, &x0), at(f, &x1));
                let step: Vec<f64> = x1.iter().zip(&x0).map(|(a, b)| a - b).collect();
                let (slope0, slope1) = (dot(&g0, &step), dot(&g1, &step));
                assert!(!st.stalled && st.evals < opt.max_evals, "{st:?}");
                assert_eq!((st.loss_before, st.loss), (f0, f1));
                assert!(slope0 < 0.0 && f1 <= f0 + opt.c1 * slope0, "step {steps}: {f0} -> {f1}, slope {slope0}");
                assert!(slope1.abs() <= opt.c2 * slope0.abs(), "step {steps}: slope {slope0} -> {slope1}");
            }
            assert!(steps > 3, "{steps} steps");
            assert!(w(&s).iter().all(|v| (v - min).abs() < 1e-6), "{:?}", w(&s));
        }
    }

    /// `a/2 |w - 3|^2` with a small curvature `a`: L-BFGS's first direction
    /// (the gradient, scaled to an L1 norm of at most 1) is `1/a` times too
    /// short.
    fn shallow(s: &ParamStore) -> Result<(f64, Grads)> {
        let a = 1.2e-3;
        let v = w(s);
        let loss = v.iter().map(|x| 0.5 * a * (x - 3.0) * (x - 3.0)).sum();
        let g = v.iter().map(|x| a * (x - 3.0)).collect::<Vec<_>>();
        Ok((loss, Grads::from_tensors(vec![Tensor::from_vec(g, [v.len()])?])))
    }

    #[test]
    fn strong_wolfe_grows_a_step_too_short_and_backtracking_does_not() {
        let start = vec![1.0, -2.0, 0.5];
        let (f0, _) = at(shallow, &start);
        let mut s = store(start.clone());
        let st = Lbfgs::new(5).step(&mut s, shallow).expect("step");
        // Backtracking accepts the first trial, 1.2 thousandths of the way.
        assert_eq!(st.evals, 2, "{st:?}");
        assert!(st.loss > 0.99 * f0, "{st:?}");
        let mut s = store(start);
        let mut opt = Lbfgs::new(5).with_line_search(LineSearch::StrongWolfe);
        let st = opt.step(&mut s, shallow).expect("step");
        // The strong Wolfe search grows the step, 10x at a time at most,
        // until the slope along it is down to c2 = 0.9 of the start's: at
        // t = 1, 10 and 100 it is 1 - t a = 0.9988, 0.988 and 0.88, so the
        // search stops at 100 and the loss falls to 0.88^2 of f0.
        assert_eq!(st.evals, 4, "{st:?}");
        assert!((st.loss / f0 - 0.88 * 0.88).abs() < 1e-9, "{st:?}");
        // The next direction carries the curvature that step measured and
        // lands on the minimum.
        let st = opt.step(&mut s, shallow).expect("step");
        assert!(st.loss < 1e-20, "{st:?}");
    }

    #[test]
    fn no_progress_means_under_the_gain_over_the_window() {
        // A loss that a function of the step count sets, whatever the
        // parameters: `losses[k]` after the k-th step.
        let run = |losses: Vec<f64>, min_progress| {
            let mut s = store(vec![1.0, -2.0, 0.5]);
            let mut opt = Lbfgs::new(5);
            opt.min_progress = min_progress;
            let mut k = 0;
            let mut flags = Vec::new();
            // Each step evaluates its start (reused after the first) and
            // accepts its first trial: one new loss a step.
            let mut f = |_: &ParamStore| -> Result<(f64, Grads)> {
                let l = losses[k.min(losses.len() - 1)];
                k += 1;
                Ok((l, Grads::from_tensors(vec![Tensor::full([3], 1e-3, DType::F64)?])))
            };
            for _ in 0..losses.len() - 1 {
                let st = opt.step(&mut s, &mut f).expect("step");
                flags.push(st.no_progress);
            }
            (flags, opt)
        };
        // 0.05% over each 100 steps is none at a gain of 0.1%, from the
        // 101st step on (the window compares the loss after a step with
        // the loss after the step 100 before it).
        let crawl: Vec<f64> = (0..300).map(|i| 1e-2 * (1.0 - 5e-6 * i as f64)).collect();
        let (flags, mut opt) = run(crawl.clone(), Some((100, 1e-3)));
        assert!(flags[..100].iter().all(|f| !f), "{:?}", &flags[..100]);
        assert!(flags[100..].iter().all(|&f| f));
        // Off by default; a reset starts the window again.
        assert!(run(crawl.clone(), None).0.iter().all(|f| !f));
        opt.reset();
        assert!(opt.recent.is_empty());
        // A slow tail, 4% a hundred steps, is progress.
        let tail: Vec<f64> = (0..300).map(|i| 3e-5 * 0.96f64.powf(i as f64 / 100.0)).collect();
        assert!(run(tail, Some((100, 1e-3))).0.iter().all(|f| !f));
    }
}
