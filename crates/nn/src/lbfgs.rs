//! L-BFGS with a backtracking (Armijo) line search, for the second phase of
//! PINN training (Adam first, then L-BFGS).

use std::collections::VecDeque;

use tapir_tensor::{DType, Error, Result, ShapeOps, Tensor};

use crate::params::{Grads, ParamStore};

/// Limited-memory BFGS over all parameters of a store, in f64.
#[derive(Debug, Clone)]
pub struct Lbfgs {
    /// Number of (s, y) pairs kept.
    pub history: usize,
    /// The first step tried along each direction (1 is the natural scale).
    pub lr: f64,
    /// Armijo sufficient-decrease constant.
    pub c1: f64,
    /// Most function evaluations per line search.
    pub max_evals: usize,
    /// Stop when the gradient's max-norm falls below this.
    pub tolerance_grad: f64,
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
    /// Function evaluations the line search used.
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
            dtype => return Err(Error::UnsupportedDType { op: "Lbfgs", dtype, expected: "f32 or f64 parameters" }),
        }
        at += n;
    }
    Ok(())
}

impl Lbfgs {
    /// L-BFGS keeping `history` pairs, with torch's defaults otherwise.
    pub fn new(history: usize) -> Self {
        Lbfgs {
            history: history.max(1),
            lr: 1.0,
            c1: 1e-4,
            max_evals: 25,
            tolerance_grad: 1e-9,
            s: VecDeque::new(),
            y: VecDeque::new(),
            last: None,
        }
    }

    /// Forgets the curvature history and the last point, for when the
    /// objective changes (new collocation points, a new batch): the history
    /// and the reused last evaluation both assume the same `f` every step.
    pub fn reset(&mut self) {
        self.s.clear();
        self.y.clear();
        self.last = None;
    }

    /// One iteration: a quasi-Newton direction from the history, then a
    /// backtracking line search along it. `f` evaluates the loss and its
    /// gradients at the store's current parameters; it must be the same
    /// function every step (see [`Lbfgs::reset`]). When the parameters are
    /// where the previous step left them, its last evaluation is reused, so
    /// a step whose first trial is accepted costs one evaluation.
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
        let (f0, g0, mut evals) = match self.last.take() {
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
            return Ok(LbfgsStep { loss_before: f0, loss: f0, evals, converged: true, stalled: false });
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
        // Backtracking line search with the Armijo condition.
        // Without history the direction is already scaled (torch's first step).
        let mut t = if self.s.is_empty() { 1.0 } else { self.lr };
        loop {
            let x: Vec<f64> = x0.iter().zip(&dir).map(|(a, d)| a + t * d).collect();
            unflatten(store, &x)?;
            // A failed evaluation leaves the parameters where the step began.
            let (ft, gt) = match f(store).and_then(|(ft, gt)| gt.check_fits(store, "Lbfgs::step").map(|()| (ft, gt))) {
                Ok(v) => v,
                Err(e) => {
                    unflatten(store, &x0)?;
                    return Err(e);
                }
            };
            evals += 1;
            if ft.is_finite() && ft <= f0 + self.c1 * t * slope {
                let g1 = flatten(gt.iter().map(|(_, g)| g.clone()));
                let s: Vec<f64> = dir.iter().map(|d| t * d).collect();
                let y: Vec<f64> = g1.iter().zip(&g0).map(|(a, b)| a - b).collect();
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
                self.last = Some((stored, ft, g1));
                return Ok(LbfgsStep { loss_before: f0, loss: ft, evals, converged: false, stalled: false });
            }
            if evals >= self.max_evals {
                unflatten(store, &x0)?;
                self.s.clear();
                self.y.clear();
                // The parameters are back at x0 exactly (f32 values survive
                // the round trip through f64), so the next step reuses this
                // evaluation instead of repeating it.
                self.last = Some((x0, f0, g0));
                return Ok(LbfgsStep { loss_before: f0, loss: f0, evals, converged: false, stalled: plain });
            }
            t *= 0.5;
        }
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

    #[test]
    fn stops_when_no_decrease_is_possible() {
        // A loss no step can lower (its gradient points nowhere useful):
        // the search along the plain gradient fails, which is reported, and
        // the parameters stay where they were.
        let mut s = store(vec![1.0, -2.0, 0.5]);
        let mut opt = Lbfgs::new(5);
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
        // Two good steps build a history; then the loss rises everywhere
        // off the current point. The first failure, along the quasi-Newton
        // direction, drops the history and is not a stall; the next search,
        // along the gradient, fails too and is.
        let mut s = store(vec![1.0, -2.0, 0.5]);
        let mut opt = Lbfgs::new(5);
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
        let mut s = store(vec![1.0, -2.0, 0.5]);
        let mut opt = Lbfgs::new(5);
        for _ in 0..100 {
            let st = opt.step(&mut s, quad).expect("step");
            assert!(!st.stalled, "{st:?}");
            if st.converged {
                break;
            }
        }
        assert!(w(&s).iter().all(|x| (x - 3.0).abs() < 1e-9), "{:?}", w(&s));
    }
}
