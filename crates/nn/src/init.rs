//! Seeded initialisers.

use tapir_tensor::{DType, Result, Rng, Shape, Tensor};

/// Normal with mean 0 and standard deviation `std`.
pub fn normal(rng: &mut Rng, shape: impl Into<Shape>, std: f64, dtype: DType) -> Result<Tensor> {
    rng.normal_tensor(shape, 0.0, std, dtype)
}

/// Fan-in and fan-out of a weight shaped `[out, in, ...]`.
fn fans(shape: &Shape) -> (f64, f64) {
    let d = shape.dims();
    let receptive: usize = d.iter().skip(2).product();
    match d.len() {
        0 => (1.0, 1.0),
        1 => (d[0] as f64, d[0] as f64),
        _ => ((d[1] * receptive) as f64, (d[0] * receptive) as f64),
    }
}

/// Xavier/Glorot uniform: U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)).
pub fn xavier_uniform(rng: &mut Rng, shape: impl Into<Shape>, gain: f64, dtype: DType) -> Result<Tensor> {
    let shape = shape.into();
    let (fi, fo) = fans(&shape);
    let a = gain * (6.0 / (fi + fo)).sqrt();
    rng.uniform(shape, -a, a, dtype)
}

/// Xavier/Glorot normal: N(0, gain^2 * 2 / (fan_in + fan_out)).
pub fn xavier_normal(rng: &mut Rng, shape: impl Into<Shape>, gain: f64, dtype: DType) -> Result<Tensor> {
    let shape = shape.into();
    let (fi, fo) = fans(&shape);
    rng.normal_tensor(shape, 0.0, gain * (2.0 / (fi + fo)).sqrt(), dtype)
}

/// Kaiming/He normal for ReLU-like layers: N(0, 2 / fan_in).
pub fn kaiming_normal(rng: &mut Rng, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
    let shape = shape.into();
    let (fi, _) = fans(&shape);
    rng.normal_tensor(shape, 0.0, (2.0 / fi).sqrt(), dtype)
}

/// Kaiming/He uniform: U(-a, a), a = sqrt(6 / fan_in).
pub fn kaiming_uniform(rng: &mut Rng, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
    let shape = shape.into();
    let (fi, _) = fans(&shape);
    let a = (6.0 / fi).sqrt();
    rng.uniform(shape, -a, a, dtype)
}
