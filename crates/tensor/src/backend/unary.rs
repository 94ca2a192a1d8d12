//! The unary family's seam: which function ([`Unary`], the plan its
//! kernels take) and the kernels every device implements
//! ([`UnaryKernels`]). The op, its checks and its derivatives are
//! [`crate::ops::unary`]'s.

use super::Src;
use crate::storage::Storage;
use crate::{DType, Result, Shape};

/// Which elementwise function.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unary {
    /// -x
    Neg,
    /// |x|
    Abs,
    /// e^x
    Exp,
    /// ln x
    Log,
    /// sqrt x
    Sqrt,
    /// 1 / sqrt x
    Rsqrt,
    /// tanh x
    Tanh,
    /// 1 / (1 + e^-x)
    Sigmoid,
    /// max(x, 0)
    Relu,
    /// GELU, tanh approximation (torch's approximate="tanh")
    GeluTanh,
    /// GELU, exact erf form
    GeluErf,
    /// sin x
    Sin,
    /// cos x
    Cos,
    /// x^2
    Square,
    /// x^p
    Powf(f64),
    /// 1 / x
    Recip,
    /// x + c
    AddScalar(f64),
    /// x * c
    MulScalar(f64),
    /// min(max(x, lo), hi)
    Clamp(f64, f64),
    /// erf x
    Erf,
    /// sign x (no derivative)
    Sign,
    /// ln(1 + e^x), torch's softplus with beta 1: a smooth relu
    Softplus,
}

/// sqrt(2 / pi), GELU's tanh form.
pub const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// GELU's cubic coefficient.
pub const GELU_C: f64 = 0.044_715;
/// 1 / sqrt(2 pi), the normal density at 0.
pub const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

impl Unary {
    /// Every function, once (with a representative parameter where it takes
    /// one): the gradient-check table and the CUDA kernel-name test are
    /// checked against this list, so a variant added to the enum and not
    /// here, or here and not there, fails a test.
    pub const ALL: &'static [Unary] = &[
        Unary::Neg,
        Unary::Abs,
        Unary::Exp,
        Unary::Log,
        Unary::Sqrt,
        Unary::Rsqrt,
        Unary::Tanh,
        Unary::Sigmoid,
        Unary::Relu,
        Unary::GeluTanh,
        Unary::GeluErf,
        Unary::Sin,
        Unary::Cos,
        Unary::Square,
        Unary::Powf(1.5),
        Unary::Recip,
        Unary::AddScalar(0.5),
        Unary::MulScalar(-2.0),
        Unary::Clamp(-0.5, 0.5),
        Unary::Erf,
        Unary::Sign,
        Unary::Softplus,
    ];

    /// The CUDA kernel computing this function on `dtype` (an entry of
    /// `kernels/elementwise.cu`): the name, then the dtype.
    pub fn cuda_kernel(self, dtype: DType) -> String {
        format!("{}_{}", self.name(), dtype.cuda_suffix())
    }

    /// The functions defined on integers too, with integer CUDA kernels
    /// (`neg_i32`...): they wrap, as torch's do.
    pub const INT_KERNELS: &'static [Unary] = &[Unary::Neg, Unary::Abs];

    /// The op's name, as errors and graph diagnostics show it.
    pub fn name(self) -> &'static str {
        match self {
            Unary::Neg => "neg",
            Unary::Abs => "abs",
            Unary::Exp => "exp",
            Unary::Log => "log",
            Unary::Sqrt => "sqrt",
            Unary::Rsqrt => "rsqrt",
            Unary::Tanh => "tanh",
            Unary::Sigmoid => "sigmoid",
            Unary::Relu => "relu",
            Unary::GeluTanh => "gelu_tanh",
            Unary::GeluErf => "gelu",
            Unary::Sin => "sin",
            Unary::Cos => "cos",
            Unary::Square => "square",
            Unary::Powf(_) => "powf",
            Unary::Recip => "recip",
            Unary::AddScalar(_) => "add_scalar",
            Unary::MulScalar(_) => "mul_scalar",
            Unary::Clamp(..) => "clamp",
            Unary::Erf => "erf",
            Unary::Sign => "sign",
            Unary::Softplus => "softplus",
        }
    }
}

/// The unary family's kernels. Every operand is one of the op's checked
/// inputs; every output is a new contiguous buffer.
pub trait UnaryKernels {
    /// `f` of every element of `x`, in `x`'s dtype and shape. The op has
    /// checked the dtype: a float, or an integer for [`Unary::INT_KERNELS`].
    fn unary(&self, f: Unary, x: Src<'_>) -> Result<Storage>;
    /// `g * (1 - y^2)` over `y` and `g` broadcast to `shape`, in `y`'s dtype.
    fn tanh_backward(&self, y: Src<'_>, g: Src<'_>, shape: &Shape) -> Result<Storage>;
    /// `g * f'(x)` in one pass (`y = f(x)`) for the functions whose
    /// derivative line takes several, or `None` where this device has no
    /// such pass (the rule then composes it).
    fn unary_grad(&self, f: Unary, x: Src<'_>, y: Src<'_>, g: Src<'_>) -> Result<Option<Storage>>;
    /// `-2 y g s + tg (1 - y^2)` (the last term only with `tg`) in one
    /// pass, or `None` where this device has none for these operands.
    fn tanh_second(&self, y: Src<'_>, g: Src<'_>, s: Src<'_>, tg: Option<Src<'_>>) -> Result<Option<Storage>>;
}
