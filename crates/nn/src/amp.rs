//! Mixed precision (PyTorch's `torch.autocast` and `GradScaler`).
//!
//! The parameters stay in f32 (the master weights the optimizer updates);
//! a [`Precision`] set once on the bound parameters
//! ([`Bound::with_precision`](crate::Bound::with_precision)) makes every
//! [`Linear`](crate::Linear) layer cast its input, weight and bias to the
//! low dtype and multiply there (f32 accumulation in the kernels), as one
//! [`LowPrecisionAffine`](crate::LowPrecisionAffine) node whose casts are
//! temporaries (so a bf16 step keeps less than an f32 one), and
//! attention on those projections runs in it too. Everything else stays
//! in f32: norms (their inputs are cast up; one that feeds a single Linear,
//! [`LayerNorm::forward_into_linear`](crate::LayerNorm::forward_into_linear),
//! stores its output in the low dtype the Linear reads), softmax inside the fused
//! attention (f32 arithmetic), residual sums (an f32 plus a bf16 is an
//! f32), the embedding lookups and the loss. The op's rule casts each
//! gradient back, so the gradients arrive in the parameters' f32.
//!
//! f16's narrow range overflows gradients, so an f16 run scales its loss
//! by a [`GradScaler`], which unscales the gradients, skips the step (and
//! halves the scale) when any is inf or NaN, and doubles the scale after a
//! run of good steps.

use tapir_autograd::Var;
use tapir_tensor::{Error, ReduceOps, Result, UnaryOps};

use crate::optim::Optimizer;
use crate::params::{Grads, ParamStore};
pub use crate::precision::Precision;

/// Dynamic loss scaling for f16 training, with PyTorch's defaults: start
/// at 2^16, halve on a step with a non-finite gradient (which is skipped),
/// double after 2,000 good steps in a row.
#[derive(Debug, Clone, PartialEq)]
pub struct GradScaler {
    /// The factor the loss is multiplied by.
    pub scale: f64,
    /// Multiplies the scale after `growth_interval` good steps.
    pub growth_factor: f64,
    /// Multiplies the scale after a skipped step.
    pub backoff_factor: f64,
    /// Good steps in a row before the scale grows.
    pub growth_interval: usize,
    good_steps: usize,
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler { scale: 65_536.0, growth_factor: 2.0, backoff_factor: 0.5, growth_interval: 2000, good_steps: 0 }
    }
}

impl GradScaler {
    /// A scaler starting at `scale`.
    pub fn new(scale: f64) -> Result<Self> {
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::invalid_arg("GradScaler::new", format!("scale {scale} must be finite and positive")));
        }
        Ok(GradScaler { scale, ..GradScaler::default() })
    }

    /// The loss times the scale, to differentiate instead of the loss.
    pub fn scale_loss<'g>(&self, loss: Var<'g>) -> Result<Var<'g>> {
        loss.mul_scalar(self.scale)
    }

    /// The gradients divided by the scale, or `None` when any is inf or
    /// NaN (one finiteness check per gradient tensor, read as one number).
    pub fn unscale(&self, grads: &Grads) -> Result<Option<Grads>> {
        let inv = 1.0 / self.scale;
        let mut out = Vec::with_capacity(grads.len());
        for (_, g) in grads.iter() {
            // sum(|g|) is finite exactly when every element is.
            if !g.abs()?.sum_all()?.item()?.is_finite() {
                return Ok(None);
            }
            out.push(g.mul_scalar(inv)?);
        }
        Ok(Some(Grads::from_tensors(out)))
    }

    /// Unscales `grads` and steps `opt` with them, or skips the step when
    /// any is non-finite; then updates the scale. Returns whether the
    /// parameters were updated (a skipped step leaves them untouched).
    pub fn step(&mut self, opt: &mut dyn Optimizer, store: &mut ParamStore, grads: &Grads) -> Result<bool> {
        let unscaled = self.unscale(grads)?;
        if let Some(g) = &unscaled {
            opt.step(store, g)?;
        }
        self.update(unscaled.is_some());
        Ok(unscaled.is_some())
    }

    /// Adjusts the scale after a step that was taken (`finite`) or
    /// skipped: for a caller that unscales and steps itself (to clip the
    /// unscaled gradients first).
    pub fn update(&mut self, finite: bool) {
        if finite {
            self.good_steps += 1;
            if self.good_steps >= self.growth_interval {
                self.scale *= self.growth_factor;
                self.good_steps = 0;
            }
        } else {
            self.scale *= self.backoff_factor;
            self.good_steps = 0;
        }
    }
}
