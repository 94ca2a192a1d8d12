//! A GPT: token and position embeddings, pre-norm blocks (LayerNorm,
//! causal self-attention, residual; LayerNorm, GELU MLP, residual), a final
//! LayerNorm and a head, optionally tied to the token embedding. The loss
//! is the fused linear cross-entropy, so the `[B*T, vocab]` logits of a
//! training step never exist.

use tapir_autograd::Var;
use tapir_tensor::ops::CrossEntropyOptions;
use tapir_tensor::{BinaryOps, CrossEntropyOps, DType, Diff, Error, Result, Rng, ShapeOps, Tensor};

use crate::attention::{CausalAttention, CausalSelfAttention};
use crate::layers::{Activation, Dropout, Embedding, Linear, Mlp};
use crate::norm::LayerNorm;
use crate::params::{Bound, ParamStore};

/// The shape of a [`Gpt`].
#[derive(Debug, Clone, PartialEq)]
pub struct GptConfig {
    /// Number of token ids.
    pub vocab: usize,
    /// Longest sequence (number of learned positions).
    pub block_size: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Number of blocks.
    pub n_layer: usize,
    /// Attention heads per block.
    pub n_head: usize,
    /// Hidden width of each MLP as a multiple of `d_model`.
    pub mlp_ratio: usize,
    /// Dropout on embeddings, attention weights and residual branches.
    pub dropout: f64,
    /// Use the token embedding as the output head (no separate head).
    pub tie_weights: bool,
}

impl Default for GptConfig {
    fn default() -> Self {
        GptConfig {
            vocab: 16,
            block_size: 16,
            d_model: 64,
            n_layer: 2,
            n_head: 4,
            mlp_ratio: 4,
            dropout: 0.0,
            tie_weights: true,
        }
    }
}

/// One pre-norm transformer block.
#[derive(Debug, Clone)]
pub struct Block {
    /// Norm before attention.
    pub ln1: LayerNorm,
    /// Causal self-attention.
    pub attn: CausalSelfAttention,
    /// Norm before the MLP.
    pub ln2: LayerNorm,
    /// `d_model -> mlp_ratio * d_model -> d_model`, GELU (tanh form).
    pub mlp: Mlp,
    /// Dropout on each residual branch.
    pub drop: Dropout,
    /// Run attention as its composition (scores by a matmul, the causal
    /// softmax, a matmul with the values), which holds `[B, H, T, T]`
    /// scores and probabilities, instead of the fused op: the baseline a
    /// memory comparison needs (false from [`Block::new`]).
    pub composed_attention: bool,
}

impl Block {
    /// A block with GPT-2's init: weights N(0, 0.02^2), and the two
    /// projections into the residual stream scaled by `1 / sqrt(2 n_layer)`.
    pub fn new(store: &mut ParamStore, name: &str, cfg: &GptConfig, rng: &mut Rng, dtype: DType) -> Result<Self> {
        let (c, std) = (cfg.d_model, 0.02);
        let proj_std = std / (2.0 * cfg.n_layer.max(1) as f64).sqrt();
        let ln1 = LayerNorm::new(store, &format!("{name}.ln1"), c, true, dtype)?;
        let mut attn =
            CausalSelfAttention::new(store, &format!("{name}.attn"), c, cfg.n_head, std, proj_std, rng, dtype)?;
        attn.attn_drop = Dropout::new(cfg.dropout)?;
        let ln2 = LayerNorm::new(store, &format!("{name}.ln2"), c, true, dtype)?;
        let hidden = cfg.mlp_ratio * c;
        let mlp = Mlp {
            layers: vec![
                Linear::normal(store, &format!("{name}.mlp.fc"), c, hidden, std, rng, dtype)?,
                Linear::normal(store, &format!("{name}.mlp.proj"), hidden, c, proj_std, rng, dtype)?,
            ],
            activation: Activation::GeluTanh,
        };
        Ok(Block { ln1, attn, ln2, mlp, drop: Dropout::new(cfg.dropout)?, composed_attention: false })
    }

    /// `x + attn(ln1(x))`, then `+ mlp(ln2(.))`, on `[B, T, C]`. Without
    /// residual dropout each sum happens inside the branch's last linear
    /// layer, so the branch's output is never kept on its own.
    pub fn forward<'g>(&self, p: &Bound<'g>, x: Var<'g>, mut rng: Option<&mut Rng>) -> Result<Var<'g>> {
        let dropping = rng.is_some() && self.drop.p > 0.0;
        let h = self.ln1.forward(p, x)?;
        let x = if self.composed_attention && !(rng.is_some() && self.attn.attn_drop.p > 0.0) {
            let att = &self.attn;
            let (q, k, v) = (att.q.forward(p, h)?, att.k.forward(p, h)?, att.v.forward(p, h)?);
            let c = q.shape().dims()[2];
            let op = CausalAttention { heads: att.heads, scale: 1.0 / ((c / att.heads) as f64).sqrt() };
            let y = op.composed(&q, &k, &v)?;
            if dropping {
                x.add(&self.drop.forward(att.proj.forward(p, y)?, rng.as_deref_mut())?)?
            } else {
                att.proj.forward_residual(p, y, x)?
            }
        } else if dropping {
            let a = self.attn.forward(p, h, rng.as_deref_mut())?;
            x.add(&self.drop.forward(a, rng.as_deref_mut())?)?
        } else {
            self.attn.forward_residual(p, h, x, rng.as_deref_mut())?
        };
        let (fc, proj) = (&self.mlp.layers[0], &self.mlp.layers[1]);
        // ln2 feeds one Linear, so under a low precision it stores its
        // output in that Linear's dtype (the same numbers, half the bytes
        // kept). Not ln1: it feeds three (q, k and v), whose gradients would
        // then be summed in the low dtype, where autocast sums them in f32.
        let h = self.mlp.activation.apply(&fc.forward(p, self.ln2.forward_into_linear(p, x)?)?)?;
        if dropping {
            x.add(&self.drop.forward(proj.forward(p, h)?, rng)?)
        } else {
            proj.forward_residual(p, h, x)
        }
    }
}

/// A decoder-only transformer language model.
#[derive(Debug, Clone)]
pub struct Gpt {
    /// Its shape.
    pub cfg: GptConfig,
    /// Token embedding `[vocab, d_model]`.
    pub wte: Embedding,
    /// Position embedding `[block_size, d_model]`.
    pub wpe: Embedding,
    /// The blocks.
    pub blocks: Vec<Block>,
    /// Final norm.
    pub ln_f: LayerNorm,
    /// Output head `[vocab, d_model]`, or `None` when tied to `wte`.
    pub head: Option<Linear>,
    /// Dropout on the embeddings.
    pub drop: Dropout,
    /// Activation checkpointing: each block runs as one
    /// [`Graph::checkpoint`](tapir_autograd::Graph::checkpoint) node that
    /// keeps only its input between the forward and the backward, which
    /// recomputes the block's activations (false from [`Gpt::new`]).
    pub checkpoint: bool,
}

impl Gpt {
    /// A new model with its parameters in `store`.
    pub fn new(store: &mut ParamStore, cfg: GptConfig, rng: &mut Rng, dtype: DType) -> Result<Self> {
        if cfg.vocab == 0 || cfg.block_size == 0 || cfg.d_model == 0 {
            return Err(Error::invalid_arg("Gpt::new", format!("empty model: {cfg:?}")));
        }
        let wte = Embedding::new(store, "wte", cfg.vocab, cfg.d_model, 0.02, rng, dtype)?;
        let wpe = Embedding::new(store, "wpe", cfg.block_size, cfg.d_model, 0.02, rng, dtype)?;
        let blocks =
            (0..cfg.n_layer).map(|i| Block::new(store, &format!("h.{i}"), &cfg, rng, dtype)).collect::<Result<_>>()?;
        let ln_f = LayerNorm::new(store, "ln_f", cfg.d_model, true, dtype)?;
        let head = if cfg.tie_weights {
            None
        } else {
            let w = store.add("head.weight", crate::init::normal(rng, [cfg.vocab, cfg.d_model], 0.02, dtype)?)?;
            Some(Linear { weight: w, bias: None })
        };
        let drop = Dropout::new(cfg.dropout)?;
        Ok(Gpt { cfg, wte, wpe, blocks, ln_f, head, drop, checkpoint: false })
    }

    /// Every block's attention as its composition (`true`) or the fused
    /// op (`false`, the default); see [`Block::composed_attention`].
    pub fn set_composed_attention(&mut self, composed: bool) {
        for b in &mut self.blocks {
            b.composed_attention = composed;
        }
    }

    /// The final hidden states `[B, T, d_model]` for token ids `[B, T]`
    /// (i32/i64, `T <= block_size`). `rng` drives dropout in training;
    /// `None` evaluates.
    pub fn hidden<'g>(&self, p: &Bound<'g>, ids: &Tensor, mut rng: Option<&mut Rng>) -> Result<Var<'g>> {
        let t = match ids.dims() {
            [_, t] if *t <= self.cfg.block_size && *t > 0 => *t,
            _ => {
                return Err(Error::InvalidShape {
                    op: "Gpt",
                    shape: Box::new(ids.shape().clone()),
                    reason: format!("ids must be [batch, time] with 0 < time <= {}", self.cfg.block_size),
                })
            }
        };
        let x = self.wte.forward(p, ids)?.add(&self.wpe.first(p, t)?)?;
        let mut x = self.drop.forward(x, rng.as_deref_mut())?;
        for b in &self.blocks {
            x = if self.checkpoint {
                // The block sees the parameters as the node's inputs (so
                // their gradients flow out) and draws its dropout from a
                // seed of its own, the same in the forward and in the
                // recomputation.
                let block = b.clone();
                let seed = rng.as_deref_mut().map(|r| r.next_u64());
                let precision = p.precision();
                let inputs: Vec<Var<'g>> = std::iter::once(x).chain(p.vars().iter().copied()).collect();
                p.graph().checkpoint(&inputs, move |h, vs| {
                    let bound = Bound::from_vars(h, vs[1..].to_vec()).with_precision(precision);
                    let mut rng = seed.map(Rng::new);
                    block.forward(&bound, vs[0], rng.as_mut())
                })?
            } else {
                b.forward(p, x, rng.as_deref_mut())?
            };
        }
        self.ln_f.forward(p, x)
    }

    /// The output head's weight `[vocab, d_model]` (the token embedding when tied).
    pub fn head_weight<'g>(&self, p: &Bound<'g>) -> Result<Var<'g>> {
        p.var(self.head.map_or(self.wte.weight, |h| h.weight))
    }

    /// Logits `[B, T, vocab]`.
    pub fn logits<'g>(&self, p: &Bound<'g>, ids: &Tensor, rng: Option<&mut Rng>) -> Result<Var<'g>> {
        let h = self.hidden(p, ids, rng)?;
        Linear { weight: self.head.map_or(self.wte.weight, |h| h.weight), bias: None }.forward(p, h)
    }

    /// Mean next-token cross-entropy against `targets` `[B, T]` (positions
    /// labelled -100 are ignored), through the fused linear cross-entropy.
    pub fn loss<'g>(&self, p: &Bound<'g>, ids: &Tensor, targets: &Tensor, rng: Option<&mut Rng>) -> Result<Var<'g>> {
        if targets.dims() != ids.dims() {
            return Err(Error::ShapeMismatch {
                op: "Gpt::loss",
                lhs: Box::new(ids.shape().clone()),
                rhs: Box::new(targets.shape().clone()),
            });
        }
        let h = self.hidden(p, ids, rng)?;
        let n = ids.numel();
        h.reshape([n, self.cfg.d_model])?.linear_cross_entropy(
            &self.head_weight(p)?,
            None,
            &targets.reshape([n])?,
            CrossEntropyOptions::default(),
            None,
        )
    }
}
