//! Which dtype a forward's matrix products run in ([`Precision`]), set
//! once on the bound parameters and read by the layers; the rest of mixed
//! precision (the loss scaler) is the `amp` module's. Its own file so the
//! parameters, which carry it, do not import the scaler, which updates
//! them.

use tapir_tensor::{DType, Error, Result};

/// Which dtype the matrix products of a forward run in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Everything in the parameters' dtype.
    #[default]
    Full,
    /// Products in bf16 (f32's range, 8 bits of mantissa): no loss scaling.
    Bf16,
    /// Products in f16 (10 bits of mantissa, a range to 65,504): use a
    /// `GradScaler`.
    F16,
}

impl Precision {
    /// The dtype products run in, or `None` for the parameters' own.
    pub fn compute_dtype(self) -> Option<DType> {
        match self {
            Precision::Full => None,
            Precision::Bf16 => Some(DType::BF16),
            Precision::F16 => Some(DType::F16),
        }
    }

    /// From `f32`, `bf16` or `f16` (the CLI's words).
    pub fn parse(s: &str) -> Result<Precision> {
        match s {
            "f32" | "full" => Ok(Precision::Full),
            "bf16" => Ok(Precision::Bf16),
            "f16" => Ok(Precision::F16),
            other => Err(Error::invalid_arg("Precision::parse", format!("{other:?}: expected f32, bf16 or f16"))),
        }
    }
}
