//! Normalisation over the last axis: LayerNorm and RMSNorm.
//!
//! Each runs as one op, [`NormOp`]: a one-pass forward per row, and a
//! backward that (when not recording) recomputes the row's mean and
//! reciprocal deviation from the input and writes the three gradients in
//! one pass. Composed from mean, sub, square, rsqrt and mul instead, a
//! LayerNorm records about ten nodes whose values all stay alive until the
//! backward pass, and its backward makes some twenty passes. Under
//! `create_graph` the rule switches to that composed, differentiable
//! formulation, so derivatives of every order still work;
//! [`LayerNorm::forward_composed`] is the composition itself, kept as the
//! reference the op is tested against.

use smallvec::SmallVec;
use tapir_autograd::Var;
use tapir_tensor::cpu::pool::{self, Disjoint};
use tapir_tensor::ops::{add_opt, Arity, InputGrads, Op, Saved};
use tapir_tensor::{BinaryOps, DType, Device, Diff, Error, Float, ReduceOps, Result, ShapeOps, Tensor, UnaryOps};

use crate::params::{Bound, ParamId, ParamStore};

/// torch.nn.LayerNorm over the last axis:
/// `(x - mean) / sqrt(var + eps) * weight + bias`, with the biased variance.
#[derive(Debug, Clone, Copy)]
pub struct LayerNorm {
    /// Scale `[dim]` (ones at init), if affine.
    pub weight: Option<ParamId>,
    /// Shift `[dim]` (zeros at init), if affine with bias.
    pub bias: Option<ParamId>,
    /// Added to the variance.
    pub eps: f64,
}

impl LayerNorm {
    /// A LayerNorm of width `dim` with a scale and, if `bias`, a shift. Both
    /// go in the "no_decay" group.
    pub fn new(store: &mut ParamStore, name: &str, dim: usize, bias: bool, dtype: DType) -> Result<Self> {
        let weight = Some(store.add_to_group(format!("{name}.weight"), "no_decay", Tensor::ones([dim], dtype)?)?);
        let bias = if bias {
            Some(store.add_to_group(format!("{name}.bias"), "no_decay", Tensor::zeros([dim], dtype)?)?)
        } else {
            None
        };
        Ok(LayerNorm { weight, bias, eps: 1e-5 })
    }

    /// Normalises `x` over its last axis (one [`NormOp`]).
    pub fn forward<'g>(&self, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
        let (w, b) = (self.weight.map(|w| p.var(w)).transpose()?, self.bias.map(|b| p.var(b)).transpose()?);
        norm(&x, w.as_ref(), b.as_ref(), self.eps, false)
    }

    /// The same function composed from mean, sub, square, rsqrt and mul: the
    /// reference [`LayerNorm::forward`] is tested against.
    pub fn forward_composed<'g>(&self, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
        let xc = x.sub(&x.mean(&[-1], true)?)?;
        let rstd = xc.square()?.mean(&[-1], true)?.add_scalar(self.eps)?.rsqrt()?;
        affine(p, xc.mul(&rstd)?, self.weight, self.bias)
    }
}

/// RMSNorm over the last axis: `x / sqrt(mean(x^2) + eps) * weight`.
#[derive(Debug, Clone, Copy)]
pub struct RmsNorm {
    /// Scale `[dim]` (ones at init).
    pub weight: Option<ParamId>,
    /// Added to the mean square.
    pub eps: f64,
}

impl RmsNorm {
    /// An RMSNorm of width `dim` with a scale in the "no_decay" group.
    pub fn new(store: &mut ParamStore, name: &str, dim: usize, dtype: DType) -> Result<Self> {
        let weight = Some(store.add_to_group(format!("{name}.weight"), "no_decay", Tensor::ones([dim], dtype)?)?);
        Ok(RmsNorm { weight, eps: 1e-6 })
    }

    /// Normalises `x` over its last axis (one [`NormOp`]).
    pub fn forward<'g>(&self, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
        norm(&x, self.weight.map(|w| p.var(w)).transpose()?.as_ref(), None, self.eps, true)
    }

    /// The same function composed from square, mean, rsqrt and mul.
    pub fn forward_composed<'g>(&self, p: &Bound<'g>, x: Var<'g>) -> Result<Var<'g>> {
        let rms = x.square()?.mean(&[-1], true)?.add_scalar(self.eps)?.rsqrt()?;
        affine(p, x.mul(&rms)?, self.weight, None)
    }
}

fn affine<'g>(p: &Bound<'g>, y: Var<'g>, w: Option<ParamId>, b: Option<ParamId>) -> Result<Var<'g>> {
    let y = match w {
        Some(w) => y.mul(&p.var(w)?)?,
        None => y,
    };
    match b {
        Some(b) => y.add(&p.var(b)?),
        None => Ok(y),
    }
}

/// `(x - mean) * rstd * w + b` over the last axis, `rstd = 1 / sqrt(var +
/// eps)` (LayerNorm), or with `rms` no mean and `rstd = 1 / sqrt(mean(x^2) +
/// eps)` (RMSNorm). Inputs: `x`, then the scale `w` if `has_weight`, then
/// the shift `b` if `has_bias`, each `[dim]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormOp {
    /// Added to the variance (mean square).
    pub eps: f64,
    /// RMSNorm: no centring.
    pub rms: bool,
    /// A scale input follows `x`.
    pub has_weight: bool,
    /// A shift input follows (after the scale, if any).
    pub has_bias: bool,
}

/// Applies [`NormOp`] over the last axis of `x`.
pub fn norm<T: Diff>(x: &T, w: Option<&T>, b: Option<&T>, eps: f64, rms: bool) -> Result<T> {
    let op = NormOp { eps, rms, has_weight: w.is_some(), has_bias: b.is_some() };
    let mut inputs = vec![x];
    inputs.extend(w);
    inputs.extend(b);
    T::apply(op, &inputs)
}

/// From this many elements on, the row kernels split their rows over the
/// pool's threads.
const SPLIT_ROWS_MIN_ELEMS: usize = tapir_tensor::cpu::iter::SPLIT_MIN;

/// Mean (0 for RMS) and reciprocal deviation of one row.
#[inline]
fn row_stats<F: Float>(r: &[F], eps: F, rms: bool) -> (F, F) {
    let n = F::from_f64(r.len() as f64);
    let mean = if rms { F::ZERO } else { r.iter().copied().sum::<F>() / n };
    let var = r.iter().map(|&v| (v - mean) * (v - mean)).sum::<F>() / n;
    (mean, F::ONE / (var + eps).sqrt())
}

/// The forward kernel on contiguous rows of width `d`, its rows split over
/// the pool's threads.
fn forward_rows<F: Float>(x: &[F], w: Option<&[F]>, b: Option<&[F]>, d: usize, eps: F, rms: bool) -> Result<Vec<F>> {
    let mut out = tapir_tensor::cache::filled(x.len(), F::ZERO)?;
    let shared = Disjoint::new(&mut out);
    let rows = x.len() / d.max(1);
    pool::ranges(rows, SPLIT_ROWS_MIN_ELEMS / d.max(1), &|part| {
        // SAFETY: the parts' row ranges are disjoint.
        let out = unsafe { shared.slice(part.start * d, part.len() * d) };
        for (r, o) in x[part.start * d..part.end * d].chunks(d).zip(out.chunks_mut(d)) {
            let (mean, rstd) = row_stats(r, eps, rms);
            for i in 0..d {
                let h = (r[i] - mean) * rstd;
                o[i] = h * w.map_or(F::ONE, |w| w[i]) + b.map_or(F::ZERO, |b| b[i]);
            }
        }
    });
    Ok(out)
}

/// Rows per block of the backward kernel's partial sums of dw and db.
const BLOCK_ROWS: usize = 64;

/// The backward kernel: (dx, dw, db) from x, w and g in one pass per row.
/// Rows go in blocks of [`BLOCK_ROWS`], each summing its own dw and db, the
/// blocks spread over the pool's threads; the blocks' sums are then added in
/// order, so no bit depends on the number of threads.
fn backward_rows<F: Float>(x: &[F], w: Option<&[F]>, g: &[F], d: usize, eps: F, rms: bool) -> Result<[Vec<F>; 3]> {
    let mut dx = tapir_tensor::cache::filled(x.len(), F::ZERO)?;
    let rows = x.len() / d.max(1);
    let blocks = rows.div_ceil(BLOCK_ROWS);
    let mut sums = vec![F::ZERO; 2 * d * blocks];
    let (shared, shared_sums) = (Disjoint::new(&mut dx), Disjoint::new(&mut sums));
    let inv_d = F::ONE / F::from_f64(d as f64);
    let block = |k: usize| {
        let (r0, r1) = (k * BLOCK_ROWS, ((k + 1) * BLOCK_ROWS).min(rows));
        // SAFETY: block k alone writes rows r0..r1 of dx and its own sums.
        let (dx, sums) = unsafe { (shared.slice(r0 * d, (r1 - r0) * d), shared_sums.slice(2 * d * k, 2 * d)) };
        let (dw, db) = sums.split_at_mut(d);
        let mut h = vec![F::ZERO; d];
        for ((r, gr), o) in x[r0 * d..r1 * d].chunks(d).zip(g[r0 * d..r1 * d].chunks(d)).zip(dx.chunks_mut(d)) {
            let (mean, rstd) = row_stats(r, eps, rms);
            let (mut s1, mut s2) = (F::ZERO, F::ZERO);
            for i in 0..d {
                h[i] = (r[i] - mean) * rstd;
                dw[i] += gr[i] * h[i];
                db[i] += gr[i];
                let gh = gr[i] * w.map_or(F::ONE, |w| w[i]);
                s1 += gh;
                s2 += gh * h[i];
            }
            let (m1, m2) = (if rms { F::ZERO } else { s1 * inv_d }, s2 * inv_d);
            for i in 0..d {
                let gh = gr[i] * w.map_or(F::ONE, |w| w[i]);
                o[i] = rstd * (gh - m1 - h[i] * m2);
            }
        }
    };
    pool::ranges(blocks, SPLIT_ROWS_MIN_ELEMS.div_ceil(BLOCK_ROWS * d.max(1)), &|r| r.for_each(block));
    let (mut dw, mut db) = (vec![F::ZERO; d], vec![F::ZERO; d]);
    for part in sums.chunks(2 * d) {
        for i in 0..d {
            dw[i] += part[i];
            db[i] += part[d + i];
        }
    }
    Ok([dx, dw, db])
}

impl NormOp {
    /// The normalised input `(x - mean) * rstd` and `rstd`, in differentiable ops.
    fn normalized<T: Diff>(&self, x: &T) -> Result<(T, T)> {
        let xc = if self.rms { x.clone() } else { x.sub(&x.mean(&[-1], true)?)? };
        let rstd = xc.square()?.mean(&[-1], true)?.add_scalar(self.eps)?.rsqrt()?;
        Ok((xc.mul(&rstd)?, rstd))
    }

    /// `rstd * (v - mean(v) - h * mean(v * h))` (no `mean(v)` for RMS): the
    /// normalisation's Jacobian applied to `v` (it is symmetric).
    fn project<T: Diff>(&self, h: &T, rstd: &T, v: &T) -> Result<T> {
        let mut u = v.sub(&h.mul(&v.mul(h)?.mean(&[-1], true)?)?)?;
        if !self.rms {
            u = u.sub(&v.mean(&[-1], true)?)?;
        }
        u.mul(rstd)
    }

    /// The eager backward: one pass over f32 or f64 rows.
    fn vjp_kernel(&self, x: &Tensor, w: Option<&Tensor>, g: &Tensor) -> Result<Option<[Tensor; 3]>> {
        let d = *x.dims().last().expect("internal: rank checked");
        if x.device() != Device::Cpu {
            return Ok(None);
        }
        let (x, g, w) = (x.contiguous()?, g.contiguous()?, w.map(|w| w.contiguous()).transpose()?);
        macro_rules! run {
            ($F:ty) => {{
                let (Some(xv), Some(gv)) = (x.as_slice::<$F>(), g.as_slice::<$F>()) else { return Ok(None) };
                let wv = match &w {
                    Some(w) => match w.as_slice::<$F>() {
                        Some(s) => Some(s),
                        None => return Ok(None),
                    },
                    None => None,
                };
                let [dx, dw, db] = backward_rows(xv, wv, gv, d, self.eps as $F, self.rms)?;
                Ok(Some([
                    Tensor::from_vec(dx, x.shape().clone())?,
                    Tensor::from_vec(dw, [d])?,
                    Tensor::from_vec(db, [d])?,
                ]))
            }};
        }
        match x.dtype() {
            DType::F32 => run!(f32),
            DType::F64 => run!(f64),
            _ => Ok(None),
        }
    }
}

impl Op for NormOp {
    fn name(&self) -> &'static str {
        if self.rms {
            "rms_norm"
        } else {
            "layer_norm"
        }
    }
    fn arity(&self) -> Arity {
        Arity::exactly(1 + self.has_weight as usize + self.has_bias as usize)
    }

    fn saves(&self) -> Saved {
        // x and the weight (when there is one); never the bias or the output.
        if self.has_weight {
            Saved::input(0).and_input(1)
        } else {
            Saved::input(0)
        }
    }
    fn forward_cpu(&self, xs: &[&Tensor]) -> Result<Tensor> {
        let x = xs[0];
        let d = match x.dims().last() {
            Some(&d) if d > 0 => d,
            _ => {
                return Err(Error::InvalidShape {
                    op: self.name(),
                    shape: x.shape().clone(),
                    reason: "needs a non-empty last axis".into(),
                })
            }
        };
        let (w, b) = (self.has_weight.then(|| xs[1]), self.has_bias.then(|| xs[xs.len() - 1]));
        for p in w.iter().chain(b.iter()) {
            if p.dims() != [d] {
                return Err(Error::ShapeMismatch { op: self.name(), lhs: x.shape().clone(), rhs: p.shape().clone() });
            }
            if p.dtype() != x.dtype() {
                return Err(Error::DTypeMismatch { op: self.name(), lhs: x.dtype(), rhs: p.dtype() });
            }
        }
        if xs.iter().any(|t| t.device() != Device::Cpu) {
            // The kernel reads host memory; elsewhere, the composition.
            let (h, _) = self.normalized(x)?;
            let h = match w {
                Some(w) => h.mul(w)?,
                None => h,
            };
            return match b {
                Some(b) => h.add(b),
                None => Ok(h),
            };
        }
        let (xc, wc, bc) =
            (x.contiguous()?, w.map(|t| t.contiguous()).transpose()?, b.map(|t| t.contiguous()).transpose()?);
        macro_rules! run {
            ($F:ty) => {{
                fn s(t: &Option<Tensor>) -> Option<&[$F]> {
                    t.as_ref().map(|t| t.as_slice::<$F>().expect("internal: contiguous"))
                }
                let out = forward_rows(
                    xc.as_slice::<$F>().expect("internal: contiguous"),
                    s(&wc),
                    s(&bc),
                    d,
                    self.eps as $F,
                    self.rms,
                )?;
                Tensor::from_vec(out, x.shape().clone())
            }};
        }
        match x.dtype() {
            DType::F32 => run!(f32),
            DType::F64 => run!(f64),
            DType::F16 | DType::BF16 => {
                let up: Vec<Tensor> = xs.iter().map(|t| t.cast(DType::F32)).collect::<Result<_>>()?;
                let refs: Vec<&Tensor> = up.iter().collect();
                self.forward_cpu(&refs)?.cast(x.dtype())
            }
            dtype => Err(Error::UnsupportedDType { op: self.name(), dtype, expected: "a float dtype" }),
        }
    }
    /// The fused backward kernel where it applies, else the differentiable rule.
    fn vjp_eager(&self, xs: SmallVec<[Tensor; 3]>, y: Tensor, g: Tensor) -> Result<InputGrads<Tensor>> {
        let w = self.has_weight.then(|| &xs[1]);
        if let Some([dx, dw, db]) = self.vjp_kernel(&xs[0], w, &g)? {
            let mut out: InputGrads<Tensor> = smallvec::smallvec![Some(dx)];
            if self.has_weight {
                out.push(Some(dw));
            }
            if self.has_bias {
                out.push(Some(db));
            }
            return Ok(out);
        }
        let refs: SmallVec<[&Tensor; 3]> = xs.iter().collect();
        self.vjp(&refs, &y, &g)
    }
    fn vjp<T: Diff>(&self, xs: &[&T], _: &T, g: &T) -> Result<InputGrads<T>> {
        let x = xs[0];
        let w = self.has_weight.then(|| xs[1]);
        let mut out = InputGrads::new();
        // The differentiable formulation (also where the kernel does not apply).
        let (h, rstd) = self.normalized(x)?;
        let gh = match w {
            Some(w) => g.mul(w)?,
            None => g.clone(),
        };
        out.push(Some(self.project(&h, &rstd, &gh)?));
        if let Some(w) = w {
            out.push(Some(g.mul(&h)?.sum_to(w.shape())?));
        }
        if self.has_bias {
            out.push(Some(g.sum_to(xs[xs.len() - 1].shape())?));
        }
        Ok(out)
    }
    fn jvp<T: Diff>(&self, xs: &[&T], y: &T, ts: &[Option<&T>]) -> Result<Option<T>> {
        let x = xs[0];
        let w = self.has_weight.then(|| xs[1]);
        let (tw, tb) =
            (if self.has_weight { ts[1] } else { None }, if self.has_bias { ts[ts.len() - 1] } else { None });
        let (h, rstd) = self.normalized(x)?;
        let th = ts[0].map(|t| self.project(&h, &rstd, t)).transpose()?;
        let th = match (th, w) {
            (Some(t), Some(w)) => Some(t.mul(w)?),
            (t, _) => t,
        };
        let tw = tw.map(|t| h.mul(t)).transpose()?;
        let tb = tb.map(|t| t.broadcast_to(y.shape())).transpose()?;
        add_opt(add_opt(th, tw)?, tb)
    }
}
