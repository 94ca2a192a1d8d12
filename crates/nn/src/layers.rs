//! Layers: plain data holding parameter ids; `forward` runs inside a scope
//! on the parameters bound there.

use tapir_autograd::Var;
use tapir_tensor::{DType, Diff, MatmulOps, Result, Rng, UnaryOps};

use crate::init;
use crate::params::{Bound, ParamId, ParamStore};

/// `y = x W^T + b`, W `[out, in]` (torch's layout and default init).
#[derive(Debug, Clone, Copy)]
pub struct Linear {
    /// Weight `[out, in]`.
    pub weight: ParamId,
    /// Bias `[out]`, if any.
    pub bias: Option<ParamId>,
}

impl Linear {
    /// A new layer named `name` in `store`, initialised like torch's
    /// nn.Linear (uniform in +-1/sqrt(in)).
    pub fn new(
        store: &mut ParamStore,
        name: &str,
        input: usize,
        output: usize,
        bias: bool,
        rng: &mut Rng,
        dtype: DType,
    ) -> Result<Self> {
        let a = 1.0 / (input.max(1) as f64).sqrt();
        let weight = store.add(format!("{name}.weight"), rng.uniform([output, input], -a, a, dtype)?)?;
        let bias = if bias {
            Some(store.add_to_group(format!("{name}.bias"), "no_decay", rng.uniform([output], -a, a, dtype)?)?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }

    /// A new layer with Xavier-normal weights and zero bias (the usual PINN init).
    pub fn xavier(
        store: &mut ParamStore,
        name: &str,
        input: usize,
        output: usize,
        rng: &mut Rng,
        dtype: DType,
    ) -> Result<Self> {
        let weight = store.add(format!("{name}.weight"), init::xavier_normal(rng, [output, input], 1.0, dtype)?)?;
        let bias = Some(store.add_to_group(
            format!("{name}.bias"),
            "no_decay",
            tapir_tensor::Tensor::zeros([output], dtype),
        )?);
        Ok(Linear { weight, bias })
    }

    /// Applies the layer.
    pub fn forward<'g>(&self, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
        x.linear(&p.var(self.weight), self.bias.map(|b| p.var(b)).as_ref())
    }
}

/// Elementwise activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// tanh
    Tanh,
    /// max(x, 0)
    Relu,
    /// GELU (erf form)
    Gelu,
    /// GELU (tanh approximation)
    GeluTanh,
    /// sin (SIREN-style networks)
    Sin,
}

impl Activation {
    /// Applies the activation to any differentiable value.
    pub fn apply<T: Diff>(self, x: &T) -> Result<T> {
        match self {
            Activation::Tanh => x.tanh(),
            Activation::Relu => x.relu(),
            Activation::Gelu => x.gelu(),
            Activation::GeluTanh => x.gelu_tanh(),
            Activation::Sin => x.sin(),
        }
    }
}

/// A multilayer perceptron: Linear, activation, ..., Linear.
#[derive(Debug, Clone)]
pub struct Mlp {
    /// The layers, first to last.
    pub layers: Vec<Linear>,
    /// The activation between layers.
    pub activation: Activation,
}

impl Mlp {
    /// An MLP with the given widths (`[in, hidden.., out]`), torch-style init.
    pub fn new(
        store: &mut ParamStore,
        name: &str,
        widths: &[usize],
        activation: Activation,
        rng: &mut Rng,
        dtype: DType,
    ) -> Result<Self> {
        let layers = widths
            .windows(2)
            .enumerate()
            .map(|(i, w)| Linear::new(store, &format!("{name}.{i}"), w[0], w[1], true, rng, dtype))
            .collect::<Result<_>>()?;
        Ok(Mlp { layers, activation })
    }

    /// An MLP with Xavier-normal weights and zero biases.
    pub fn xavier(
        store: &mut ParamStore,
        name: &str,
        widths: &[usize],
        activation: Activation,
        rng: &mut Rng,
        dtype: DType,
    ) -> Result<Self> {
        let layers = widths
            .windows(2)
            .enumerate()
            .map(|(i, w)| Linear::xavier(store, &format!("{name}.{i}"), w[0], w[1], rng, dtype))
            .collect::<Result<_>>()?;
        Ok(Mlp { layers, activation })
    }

    /// Applies the network.
    pub fn forward<'g>(&self, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
        let mut h = x;
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(p, h)?;
            if i + 1 < self.layers.len() {
                h = self.activation.apply(&h)?;
            }
        }
        Ok(h)
    }
}
