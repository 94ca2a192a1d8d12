//! Optimizers. Updates happen in place on the parameters, and optimizer
//! state is allocated once, on the first step: a steady training loop makes
//! no allocation in `step`.
//!
//! This file says what each optimizer does (its settings, its state, which
//! parameters decay); one step of one parameter runs on the parameter's
//! device through tapir-tensor's device-free steps
//! ([`tapir_tensor::ops::optim`]), whose kernels each device implements.
//! Parameters may be f32, f64, f16 or bf16; the state of a half-precision
//! parameter is kept in f32 and its update computed in f32.

use tapir_tensor::ops::optim::{adam_step, sgd_step, AdamStep, SgdStep};
use tapir_tensor::{Error, Result, ShapeOps, Tensor};

use crate::params::{Grads, ParamStore};

/// Something that updates parameters from gradients.
pub trait Optimizer {
    /// One update of every parameter from its gradient.
    fn step(&mut self, store: &mut ParamStore, grads: &Grads) -> Result<()>;
    /// The current learning rate.
    fn lr(&self) -> f64;
    /// Sets the learning rate (for schedules).
    fn set_lr(&mut self, lr: f64);
    /// The state a checkpoint must hold to resume bit-for-bit.
    fn state_dict(&self) -> OptimizerState;
    /// Restores state saved by [`Optimizer::state_dict`] (of the same kind,
    /// with one entry per parameter; a checkpoint checks shapes first).
    fn load_state_dict(&mut self, state: OptimizerState) -> Result<()>;
}

/// An optimizer's state as plain tensors: what a checkpoint stores.
#[derive(Debug, Clone)]
pub struct OptimizerState {
    /// Which optimizer ("sgd", "adam"); loading into another kind is an error.
    pub kind: &'static str,
    /// Steps taken.
    pub step: u64,
    /// Names of the per-parameter state tensors, torch's names
    /// ("momentum_buffer"; "exp_avg", "exp_avg_sq").
    pub slot_names: &'static [&'static str],
    /// Per parameter (store order), one tensor per slot; empty before the
    /// first step, when no state exists yet.
    pub slots: Vec<Vec<Tensor>>,
}

fn load_checked(
    op: &'static str,
    kind: &'static str,
    slot_names: &'static [&'static str],
    state: OptimizerState,
) -> Result<(u64, Vec<Vec<Tensor>>)> {
    if state.kind != kind {
        return Err(Error::invalid_arg(op, format!("state of a {:?} optimizer given to {kind:?}", state.kind)));
    }
    if let Some(bad) = state.slots.iter().position(|s| s.len() != slot_names.len()) {
        return Err(Error::invalid_arg(
            op,
            format!("parameter {bad} has {} state tensors, expected {}", state.slots[bad].len(), slot_names.len()),
        ));
    }
    Ok((state.step, state.slots))
}

/// Zeros for one parameter's optimizer state: the parameter's shape, in the
/// dtype its update is computed in (f32 for f16 and bf16 parameters), on
/// the parameter's device.
fn state_zeros(p: &Tensor) -> Result<Tensor> {
    Tensor::zeros_on(p.shape().clone(), p.dtype().compute(), p.device())
}

/// Moves any state tensor that is not on its parameter's device there (a
/// checkpoint read on the host, or a store moved after the first step), so
/// the update runs where the parameter lives. A no-op in a steady loop.
fn follow_params(store: &ParamStore, states: &mut [Vec<Tensor>]) -> Result<()> {
    for (id, slots) in store.ids().zip(states.iter_mut()) {
        let dev = store.get(id).device();
        for st in slots.iter_mut().filter(|st| st.device() != dev) {
            *st = st.to_device(dev)?;
        }
    }
    Ok(())
}

/// Loaded state in the dtype the update computes in: a checkpoint written
/// with half-precision moments is widened once, here.
fn widen_state(slots: Vec<Vec<Tensor>>) -> Result<Vec<Vec<Tensor>>> {
    slots.into_iter().map(|s| s.into_iter().map(|t| t.cast(t.dtype().compute())).collect()).collect()
}

/// Stochastic gradient descent with momentum, Nesterov and (coupled, L2)
/// weight decay, with torch.optim.SGD's update rule.
///
/// ```
/// use tapir::prelude::*;
///
/// // One step on the loss sum(p^2) from p = [1, -2]: p -= 0.1 * 2p.
/// let mut store = ParamStore::new();
/// let p = store.add("p", Tensor::from_vec(vec![1.0f64, -2.0], [2])?)?;
/// let mut opt = Sgd::new(0.1);
/// let grads = Graph::scope(|g| {
///     let b = store.bind(g);
///     b.grads(b.var(p)?.square()?.sum_all()?)
/// })?;
/// opt.step(&mut store, &grads)?;
/// assert_eq!(store.get(p).to_vec::<f64>()?, vec![0.8, -1.6]);
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0 disables).
    pub momentum: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    steps: u64,
    state: Vec<Vec<Tensor>>,
}

impl Sgd {
    /// Plain SGD.
    pub fn new(lr: f64) -> Self {
        Sgd { lr, momentum: 0.0, nesterov: false, weight_decay: 0.0, steps: 0, state: Vec::new() }
    }
    /// With momentum (and optionally Nesterov).
    pub fn with_momentum(lr: f64, momentum: f64, nesterov: bool) -> Self {
        Sgd { lr, momentum, nesterov, weight_decay: 0.0, steps: 0, state: Vec::new() }
    }
}

impl Optimizer for Sgd {
    fn step(&mut self, store: &mut ParamStore, grads: &Grads) -> Result<()> {
        grads.check_fits(store, "Sgd::step")?;
        let first = self.state.is_empty();
        self.steps += 1;
        if first {
            self.state = store
                .ids()
                .map(|id| if self.momentum != 0.0 { Ok(vec![state_zeros(store.get(id))?]) } else { Ok(vec![]) })
                .collect::<Result<_>>()?;
        }
        follow_params(store, &mut self.state)?;
        let (lr, mu, wd, nesterov) = (self.lr, self.momentum, self.weight_decay, self.nesterov);
        for (id, g) in grads.iter() {
            let k = SgdStep { lr, momentum: mu, weight_decay: wd, nesterov, first };
            let buf = self.state[id.index()].first_mut();
            sgd_step(store.get_mut(id), g, buf, k)?;
        }
        Ok(())
    }
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn state_dict(&self) -> OptimizerState {
        let slots = if self.momentum != 0.0 { self.state.clone() } else { vec![] };
        OptimizerState { kind: "sgd", step: self.steps, slot_names: &["momentum_buffer"], slots }
    }
    fn load_state_dict(&mut self, state: OptimizerState) -> Result<()> {
        let (step, slots) = load_checked("Sgd::load_state_dict", "sgd", &["momentum_buffer"], state)?;
        self.steps = step;
        self.state = widen_state(slots)?;
        Ok(())
    }
}

/// Adam, and AdamW when `decoupled` (torch.optim.Adam / AdamW update rules).
///
/// Parameters may be f32, f64, f16 or bf16; the moments of a half-precision
/// parameter are kept in f32 and its update is computed in f32.
///
/// ```
/// use tapir::prelude::*;
///
/// // Minimise (p - 3)^2 from p = 0, with the parameter stored in bf16.
/// let mut store = ParamStore::new();
/// let p = store.add("p", Tensor::zeros([1], DType::BF16)?)?;
/// let mut opt = Adam::new(0.1);
/// for _ in 0..300 {
///     let grads = Graph::scope(|g| {
///         let b = store.bind(g);
///         b.grads(b.var(p)?.add_scalar(-3.0)?.square()?.sum_all()?)
///     })?;
///     opt.step(&mut store, &grads)?;
/// }
/// assert!((store.get(p).item()? - 3.0).abs() < 0.05);
/// assert_eq!(opt.state()[0][0].dtype(), DType::F32); // the first moment
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Adam {
    /// Learning rate.
    pub lr: f64,
    /// Decay of the first moment.
    pub beta1: f64,
    /// Decay of the second moment.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Weight decay: L2 (Adam) or decoupled (AdamW).
    pub weight_decay: f64,
    /// Decoupled weight decay (AdamW).
    pub decoupled: bool,
    /// Groups whose parameters get no weight decay (e.g. "no_decay").
    pub no_decay_groups: Vec<String>,
    t: u64,
    state: Vec<Vec<Tensor>>,
}

impl Adam {
    /// Adam with torch's defaults (betas 0.9, 0.999, eps 1e-8).
    pub fn new(lr: f64) -> Self {
        Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            no_decay_groups: vec![],
            t: 0,
            state: Vec::new(),
        }
    }
    /// AdamW with decoupled `weight_decay`, skipping the "no_decay" group.
    pub fn adamw(lr: f64, weight_decay: f64) -> Self {
        Adam { weight_decay, decoupled: true, no_decay_groups: vec!["no_decay".into()], ..Adam::new(lr) }
    }
    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.t
    }
    /// The moment estimates of every parameter (m, v), for checkpoints.
    pub fn state(&self) -> &[Vec<Tensor>] {
        &self.state
    }
    /// Restores moments and the step count (from a checkpoint).
    pub fn restore(&mut self, t: u64, state: Vec<Vec<Tensor>>) {
        self.t = t;
        self.state = state;
    }
}

impl Optimizer for Adam {
    fn step(&mut self, store: &mut ParamStore, grads: &Grads) -> Result<()> {
        grads.check_fits(store, "Adam::step")?;
        if self.state.is_empty() {
            self.state = store
                .ids()
                .map(|id| Ok(vec![state_zeros(store.get(id))?, state_zeros(store.get(id))?]))
                .collect::<Result<_>>()?;
        }
        self.t += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let bc1 = 1.0 - b1.powi(self.t as i32);
        let bc2 = 1.0 - b2.powi(self.t as i32);
        let decay: Vec<f64> = store
            .ids()
            .map(|id| if self.no_decay_groups.iter().any(|g| g == store.group(id)) { 0.0 } else { self.weight_decay })
            .collect();
        let (lr, eps, decoupled) = (self.lr, self.eps, self.decoupled);
        follow_params(store, &mut self.state)?;
        for (id, g) in grads.iter() {
            let k = AdamStep {
                lr,
                weight_decay: decay[id.index()],
                beta1: b1,
                beta2: b2,
                step: lr / bc1,
                inv_bc2_sqrt: 1.0 / bc2.sqrt(),
                eps,
                decoupled,
            };
            let (m, v) = self.state[id.index()].split_at_mut(1);
            adam_step(store.get_mut(id), &mut m[0], &mut v[0], g, k)?;
        }
        Ok(())
    }
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn state_dict(&self) -> OptimizerState {
        OptimizerState { kind: "adam", step: self.t, slot_names: &["exp_avg", "exp_avg_sq"], slots: self.state.clone() }
    }
    fn load_state_dict(&mut self, state: OptimizerState) -> Result<()> {
        let (step, slots) = load_checked("Adam::load_state_dict", "adam", &["exp_avg", "exp_avg_sq"], state)?;
        self.t = step;
        self.state = widen_state(slots)?;
        Ok(())
    }
}

/// Learning-rate schedules.
#[derive(Debug, Clone, Copy)]
pub enum Schedule {
    /// Constant.
    Constant,
    /// Linear warm-up over `warmup` steps, then cosine decay to
    /// `min_factor * base` at `total` steps.
    WarmupCosine {
        /// Warm-up steps.
        warmup: usize,
        /// Total steps.
        total: usize,
        /// Final learning rate as a fraction of the base.
        min_factor: f64,
    },
    /// Exponential decay from the base to `final_factor * base` over `total` steps.
    Exponential {
        /// Total steps.
        total: usize,
        /// Final learning rate as a fraction of the base.
        final_factor: f64,
    },
}

impl Schedule {
    /// The learning rate at `step` (0-based) for base rate `base`.
    pub fn lr(&self, base: f64, step: usize) -> f64 {
        match *self {
            Schedule::Constant => base,
            Schedule::WarmupCosine { warmup, total, min_factor } => {
                if step < warmup {
                    base * (step + 1) as f64 / warmup as f64
                } else {
                    let span = total.saturating_sub(warmup).max(1) as f64;
                    let t = ((step - warmup) as f64 / span).min(1.0);
                    let min = base * min_factor;
                    min + (base - min) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
                }
            }
            Schedule::Exponential { total, final_factor } => {
                base * final_factor.powf((step as f64 / total.max(1) as f64).min(1.0))
            }
        }
    }
}
