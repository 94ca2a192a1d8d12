//! Element types.

use half::{bf16, f16};

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DType {
    /// 32-bit float, the default.
    #[default]
    F32,
    /// 64-bit float, used by the gradient checker.
    F64,
    /// IEEE half precision (storage; arithmetic accumulates in f32).
    F16,
    /// bfloat16 (storage; arithmetic accumulates in f32).
    BF16,
    /// 32-bit signed integer (labels, indices).
    I32,
    /// 64-bit signed integer (labels, indices).
    I64,
}

impl DType {
    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// True for the four floating-point dtypes.
    pub fn is_float(self) -> bool {
        !self.is_int()
    }

    /// True for i32 and i64.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// The dtype arithmetic on this dtype is carried out in: f16 and bf16
    /// compute in f32, everything else in itself.
    pub fn compute(self) -> DType {
        match self {
            DType::F16 | DType::BF16 => DType::F32,
            d => d,
        }
    }

    /// The dtype of a binary op's result on operands of dtypes `a` and `b`,
    /// as torch's `promote_types`: a float beats an integer (whatever their
    /// widths), the wider of two floats or two integers wins, and float16
    /// with bfloat16, neither of which holds the other, gives float32.
    /// The one promotion rule: binary ops, comparisons and `where` use it.
    pub fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        match (a, b) {
            _ if a == b => a,
            (I32 | I64, I32 | I64) => I64,
            (I32 | I64, f) | (f, I32 | I64) => f,
            (F64, _) | (_, F64) => F64,
            // F32 with a half type, or F16 with BF16.
            _ => F32,
        }
    }

    /// torch's name for the dtype.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I32 => "int32",
            DType::I64 => "int64",
        }
    }

    /// The dtype's suffix in CUDA kernel names (`f32`, `bf16`, `i64`...).
    pub fn cuda_suffix(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that can be stored in a tensor.
pub trait Element: Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    /// The matching dtype.
    const DTYPE: DType;
    /// Converts to f64 (exact for every stored type except very large i64).
    fn to_f64(self) -> f64;
    /// Converts from f64 with rounding (ints truncate toward zero, saturating).
    fn from_f64(v: f64) -> Self;
}

macro_rules! element {
    ($t:ty, $d:ident, |$x:ident| $to:expr, |$v:ident| $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            #[inline]
            fn to_f64(self) -> f64 {
                let $x = self;
                $to
            }
            #[inline]
            fn from_f64($v: f64) -> Self {
                $from
            }
        }
    };
}
element!(f32, F32, |x| x as f64, |v| v as f32);
element!(f64, F64, |x| x, |v| v);
element!(f16, F16, |x| x.to_f64(), |v| f16::from_f64(v));
element!(bf16, BF16, |x| x.to_f64(), |v| bf16::from_f64(v));
element!(i32, I32, |x| x as f64, |v| v as i32);
element!(i64, I64, |x| x as f64, |v| v as i64);

/// The float types the CPU kernels compute in (f32 and f64).
pub trait Float:
    Element
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
    + std::ops::AddAssign
    + std::ops::MulAssign
    + std::iter::Sum
{
    /// Zero.
    const ZERO: Self;
    /// One.
    const ONE: Self;
    /// Negative infinity.
    const NEG_INF: Self;
    /// Positive infinity.
    const INF: Self;
    /// e^x.
    fn exp(self) -> Self;
    /// Natural log.
    fn ln(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// Sine.
    fn sin(self) -> Self;
    /// Cosine.
    fn cos(self) -> Self;
    /// Absolute value.
    fn abs(self) -> Self;
    /// self^p.
    fn powf(self, p: Self) -> Self;
    /// Larger of two (NaN-propagating like torch.maximum).
    fn max(self, o: Self) -> Self;
    /// Smaller of two (NaN-propagating like torch.minimum).
    fn min(self, o: Self) -> Self;
    /// True if NaN.
    fn is_nan(self) -> bool;
    /// Error function.
    fn erf(self) -> Self;
    /// ln(1 + x), accurate near zero.
    fn ln_1p(self) -> Self;
    /// e^x - 1, accurate near zero.
    fn exp_m1(self) -> Self;
}

macro_rules! float {
    ($t:ident) => {
        impl Float for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INF: Self = $t::NEG_INFINITY;
            const INF: Self = $t::INFINITY;
            #[inline]
            fn exp(self) -> Self {
                crate::cpu::math::Fast::fast_exp(self)
            }
            #[inline]
            fn ln(self) -> Self {
                $t::ln(self)
            }
            #[inline]
            fn sqrt(self) -> Self {
                $t::sqrt(self)
            }
            #[inline]
            fn tanh(self) -> Self {
                crate::cpu::math::Fast::fast_tanh(self)
            }
            #[inline]
            fn sin(self) -> Self {
                $t::sin(self)
            }
            #[inline]
            fn cos(self) -> Self {
                $t::cos(self)
            }
            #[inline]
            fn abs(self) -> Self {
                $t::abs(self)
            }
            #[inline]
            fn powf(self, p: Self) -> Self {
                $t::powf(self, p)
            }
            #[inline]
            fn max(self, o: Self) -> Self {
                if self.is_nan() || o.is_nan() {
                    $t::NAN
                } else if self >= o {
                    self
                } else {
                    o
                }
            }
            #[inline]
            fn min(self, o: Self) -> Self {
                if self.is_nan() || o.is_nan() {
                    $t::NAN
                } else if self <= o {
                    self
                } else {
                    o
                }
            }
            #[inline]
            fn is_nan(self) -> bool {
                $t::is_nan(self)
            }
            #[inline]
            fn erf(self) -> Self {
                crate::cpu::math::erf(self as f64) as $t
            }
            #[inline]
            fn ln_1p(self) -> Self {
                <$t>::ln_1p(self)
            }
            #[inline]
            fn exp_m1(self) -> Self {
                <$t>::exp_m1(self)
            }
        }
    };
}
float!(f32);
float!(f64);
