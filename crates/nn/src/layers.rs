//! Layers: plain data holding parameter ids; `forward` runs inside a scope
//! on the parameters bound there.

use tapir_autograd::Var;
use tapir_tensor::{BinaryOps, DType, Diff, Error, IndexOps, Result, Rng, ShapeOps, Tensor, UnaryOps};

use crate::affine::{affine_with, low_precision_affine, Affine, LowPrecisionAffine};
use crate::init;
use crate::params::{Bound, ParamId, ParamStore};

/// `y = x W^T + b`, W `[out, in]` (torch's layout and default init).
///
/// [`Affine`]: crate::Affine
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

    /// A new layer with N(0, std^2) weights and zero bias (GPT-2's init).
    #[allow(clippy::too_many_arguments)]
    pub fn normal(
        store: &mut ParamStore,
        name: &str,
        input: usize,
        output: usize,
        std: f64,
        rng: &mut Rng,
        dtype: DType,
    ) -> Result<Self> {
        let weight = store.add(format!("{name}.weight"), init::normal(rng, [output, input], std, dtype)?)?;
        let bias = Some(store.add_to_group(format!("{name}.bias"), "no_decay", Tensor::zeros([output], dtype)?)?);
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
            tapir_tensor::Tensor::zeros([output], dtype)?,
        )?);
        Ok(Linear { weight, bias })
    }

    /// Applies the layer to `x` of shape `[..., in]`, as one [`Affine`]
    /// op. Leading dims are folded into one (a view), so the product is one
    /// matrix multiply, and the weight's gradient one more, rather than a
    /// batch of them summed.
    pub fn forward<'g>(&self, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
        self.apply(p, x, Affine::default(), None)
    }

    /// `tanh(linear(x))` as one op: the pre-activation is never stored, and
    /// tanh is applied by each thread to its rows of the product.
    pub fn forward_tanh<'g>(&self, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
        self.apply(p, x, Affine { tanh: true, ..Affine::default() }, None)
    }

    /// `r + linear(x)` as one op: a residual branch whose output is never
    /// kept apart from the sum.
    pub fn forward_residual<'g>(&self, p: &Bound<'g>, x: Var<'g>, r: Var<'g>) -> Result<Var<'g>> {
        self.apply(p, x, Affine::default(), Some(r))
    }

    /// Input and output features, from the weight `[out, in]`.
    fn features(w: &Var<'_>) -> Option<(usize, usize)> {
        match w.shape().dims() {
            &[out, input] => Some((input, out)),
            _ => None,
        }
    }

    /// Checks `x` against the layer before any op runs, so a wrong input
    /// is reported in the layer's terms (which layer, which dimension, what
    /// it expects) rather than as the product's operand shapes. `op` and
    /// `which` name the layer for the message ("Mlp", "layer 0 of 3"; an
    /// empty `which` for a layer on its own).
    fn check_input(&self, op: &'static str, which: &str, x: &Var<'_>, w: &Var<'_>) -> Result<()> {
        let Some((input, out)) = Self::features(w) else {
            return Err(Error::InvalidShape {
                op,
                shape: Box::new(w.shape()),
                reason: "the weight must be [out_features, in_features]".into(),
            });
        };
        let layer = if which.is_empty() {
            format!("Linear {input} -> {out}")
        } else {
            format!("{which} (Linear {input} -> {out})")
        };
        let shape = x.shape();
        match shape.dims().last() {
            None => Err(Error::InvalidShape {
                op,
                shape: Box::new(shape),
                reason: format!("{layer} needs an input of rank 1 or more, [..., {input}]"),
            }),
            Some(&got) if got != input => Err(Error::InvalidShape {
                op,
                shape: Box::new(shape),
                reason: format!(
                    "{layer} expects {input} input feature{} in the last dimension, got {got}",
                    if input == 1 { "" } else { "s" }
                ),
            }),
            Some(_) => Ok(()),
        }
    }

    fn apply<'g>(&self, p: &Bound<'g>, x: Var<'g>, mut op: Affine, r: Option<Var<'g>>) -> Result<Var<'g>> {
        let (w, b) = (p.var(self.weight)?, self.bias.map(|b| p.var(b)).transpose()?);
        self.check_input("Linear", "", &x, &w)?;
        if let Some(dtype) = p.precision().compute_dtype() {
            // Mixed precision: the product in the low dtype as one node
            // whose casts are temporaries (the gradients come back in the
            // weights' dtype); a residual is added after, in its own (f32)
            // dtype. A tanh layer never has a residual here, so tanh
            // applies to the low product alone.
            let input_grad = x.requires_grad();
            let low = LowPrecisionAffine { dtype, input_grad, bias: false, residual: false, tanh: op.tanh };
            return low_precision_affine(low, &x, &w, b.as_ref(), r.as_ref());
        }
        let dims = x.shape().dims().to_vec();
        op.input_grad = x.requires_grad();
        let rank = dims.len();
        let rows: usize = dims[..rank - 1].iter().product();
        let out_dim = w.shape().dims()[0];
        let flat = |v: Var<'g>, d: usize| if rank == 2 { Ok(v) } else { v.reshape([rows, d]) };
        let r = r.map(|r| flat(r, out_dim)).transpose()?;
        let y = affine_with(op, &flat(x, dims[rank - 1])?, &w, b.as_ref(), r.as_ref())?;
        if rank == 2 {
            return Ok(y);
        }
        let mut out = dims;
        out[rank - 1] = out_dim;
        y.reshape(out)
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
        Self::build(name, widths, activation, |n, i, o| Linear::new(store, &n, i, o, true, rng, dtype))
    }

    /// One layer per consecutive pair of widths, named `{name}.{k}`.
    fn build(
        name: &str,
        widths: &[usize],
        activation: Activation,
        mut layer: impl FnMut(String, usize, usize) -> Result<Linear>,
    ) -> Result<Self> {
        let layers = widths
            .windows(2)
            .enumerate()
            .map(|(k, w)| layer(format!("{name}.{k}"), w[0], w[1]))
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
        Self::build(name, widths, activation, |n, i, o| Linear::xavier(store, &n, i, o, rng, dtype))
    }

    /// Applies the network. A tanh hidden layer is one op
    /// ([`Linear::forward_tanh`]).
    ///
    /// An input whose last dimension is not the network's input width is
    /// an [`Error::InvalidShape`] that says so:
    ///
    /// ```
    /// use tapir::prelude::*;
    ///
    /// let mut store = ParamStore::new();
    /// let net = Mlp::new(&mut store, "net", &[2, 16, 1], Activation::Tanh, &mut Rng::new(0), DType::F32)?;
    /// let err = Graph::scope(|g| net.forward(&store.bind(g), g.constant(Tensor::zeros([8, 1], DType::F32)?))?.value())
    ///     .unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     "Mlp: invalid shape [8, 1]: layer 0 of 2 (Linear 2 -> 16) expects 2 input features in the last dimension, got 1"
    /// );
    /// # Ok::<(), Error>(())
    /// ```
    pub fn forward<'g>(&self, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
        if let Some(first) = self.layers.first() {
            let which = format!("layer 0 of {}", self.layers.len());
            first.check_input("Mlp", &which, &x, &p.var(first.weight)?)?;
        }
        let mut h = x;
        for (i, l) in self.layers.iter().enumerate() {
            let hidden = i + 1 < self.layers.len();
            h = match (hidden, self.activation) {
                (true, Activation::Tanh) => l.forward_tanh(p, h)?,
                (true, act) => act.apply(&l.forward(p, h)?)?,
                (false, _) => l.forward(p, h)?,
            };
        }
        Ok(h)
    }
}

/// A lookup table of `[num, dim]` vectors indexed by integer ids (torch's
/// nn.Embedding, initialised N(0, 1) by [`Embedding::new`]).
#[derive(Debug, Clone, Copy)]
pub struct Embedding {
    /// The table `[num, dim]`.
    pub weight: ParamId,
}

impl Embedding {
    /// A new table with N(0, std^2) entries (torch's default is std 1; GPTs use 0.02).
    pub fn new(
        store: &mut ParamStore,
        name: &str,
        num: usize,
        dim: usize,
        std: f64,
        rng: &mut Rng,
        dtype: DType,
    ) -> Result<Self> {
        Ok(Embedding { weight: store.add(format!("{name}.weight"), init::normal(rng, [num, dim], std, dtype)?)? })
    }

    /// The rows of `ids` (i32/i64, any shape): `[..ids.shape, dim]`. An id
    /// outside the table is an error naming it.
    pub fn forward<'g>(&self, p: &Bound<'g>, ids: &Tensor) -> Result<Var<'g>> {
        p.var(self.weight)?.embedding(ids)
    }

    /// The first `n` rows `[n, dim]` (a view): learned positions `0..n`.
    pub fn first<'g>(&self, p: &Bound<'g>, n: usize) -> Result<Var<'g>> {
        p.var(self.weight)?.narrow(0, 0, n)
    }
}

/// Inverted dropout: in training each element is zeroed with probability
/// `p` and the rest scaled by `1 / (1 - p)`; in evaluation it is the
/// identity. The random mask comes from the generator the caller passes, so
/// a run is reproducible from its seed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    /// Probability of zeroing an element, in `[0, 1)`.
    pub p: f64,
}

impl Dropout {
    /// Dropout with probability `p` (an error outside `[0, 1)`).
    pub fn new(p: f64) -> Result<Self> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::invalid_arg("Dropout::new", format!("p = {p} is outside [0, 1)")));
        }
        Ok(Dropout { p })
    }

    /// Applies dropout when `rng` is given (training), else returns `x`
    /// (evaluation). With `p == 0` nothing is drawn.
    pub fn forward<'g>(&self, x: Var<'g>, rng: Option<&mut Rng>) -> Result<Var<'g>> {
        let Some(rng) = rng else { return Ok(x) };
        if self.p == 0.0 {
            return Ok(x);
        }
        let keep = 1.0 - self.p;
        let shape = x.shape();
        let mask: Vec<f64> = (0..shape.numel()).map(|_| if rng.next_f64() < keep { 1.0 / keep } else { 0.0 }).collect();
        // Drawn on the host from the caller's generator, so a seed drops
        // the same elements on every device.
        let mask = Tensor::from_vec(mask, shape)?.cast(x.dtype())?.to_device(x.device())?;
        x.mul(&x.graph().constant(mask))
    }
}
