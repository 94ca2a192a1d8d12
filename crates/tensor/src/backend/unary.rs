//! The unary family's seam: which function ([`Unary`], the plan its
//! kernels take) and the kernels every device implements
//! ([`UnaryKernels`]). The op, its checks and its derivatives are
//! [`crate::ops::unary`]'s.

use super::Src;
use crate::storage::Storage;
use crate::{DType, Result, Shape};

/// Declares the family: one entry a function, `Variant = "name"` (a
/// function with parameters gives each a type and the value
/// [`Unary::ALL`] lists it with, `Powf(f64: 1.5)`), which makes the
/// variant, its place in `ALL` and its name. Everything else an op is (its
/// derivative, what its rule reads, its CPU closure) is a `match` without
/// a wildcard, so the compiler asks for each; its CUDA kernel is one line
/// of `kernels/elementwise.cu`.
macro_rules! unary_functions {
    ($( $(#[$doc:meta])* $variant:ident $( ( $($p:ty : $v:expr),+ ) )? = $name:literal, )*) => {
        /// Which elementwise function.
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub enum Unary {
            $( $(#[$doc])* $variant $( ( $($p),+ ) )?, )*
        }

        impl Unary {
            /// Every function, once, in the order declared (with a
            /// representative parameter where it takes one): the op
            /// registry, the gradient-check table, the fuzz generators and
            /// the CUDA kernel-name test are made from or checked against
            /// this list.
            pub const ALL: &'static [Unary] = &[ $( Unary::$variant $( ( $($v),+ ) )?, )* ];

            /// The op's name, as errors and graph diagnostics show it, and
            /// its CUDA kernel's (see [`Unary::cuda_kernel`]).
            pub fn name(self) -> &'static str {
                match self {
                    $( Unary::$variant { .. } => $name, )*
                }
            }
        }
    };
}

unary_functions! {
    /// -x
    Neg = "neg",
    /// |x|
    Abs = "abs",
    /// e^x
    Exp = "exp",
    /// ln x
    Log = "log",
    /// sqrt x
    Sqrt = "sqrt",
    /// 1 / sqrt x
    Rsqrt = "rsqrt",
    /// tanh x
    Tanh = "tanh",
    /// 1 / (1 + e^-x)
    Sigmoid = "sigmoid",
    /// max(x, 0)
    Relu = "relu",
    /// GELU, tanh approximation (torch's approximate="tanh")
    GeluTanh = "gelu_tanh",
    /// GELU, exact erf form
    GeluErf = "gelu",
    /// sin x
    Sin = "sin",
    /// cos x
    Cos = "cos",
    /// x^2
    Square = "square",
    /// x^p
    Powf(f64: 1.5) = "powf",
    /// 1 / x
    Recip = "recip",
    /// x + c
    AddScalar(f64: 0.5) = "add_scalar",
    /// x * c
    MulScalar(f64: -2.0) = "mul_scalar",
    /// min(max(x, lo), hi)
    Clamp(f64: -0.5, f64: 0.5) = "clamp",
    /// erf x
    Erf = "erf",
    /// sign x (no derivative)
    Sign = "sign",
    /// ln(1 + e^x), torch's softplus with beta 1: a smooth relu
    Softplus = "softplus",
    /// ln(1 + x), accurate for small x
    Log1p = "log1p",
    /// e^x - 1, accurate for small x
    Expm1 = "expm1",
}

/// sqrt(2 / pi), GELU's tanh form.
pub const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// GELU's cubic coefficient.
pub const GELU_C: f64 = 0.044_715;
/// 1 / sqrt(2 pi), the normal density at 0.
pub const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

impl Unary {
    /// The CUDA kernel computing this function on `dtype` (an entry of
    /// `kernels/elementwise.cu`): the name, then the dtype.
    pub fn cuda_kernel(self, dtype: DType) -> String {
        format!("{}_{}", self.name(), dtype.cuda_suffix())
    }

    /// The functions defined on integers too, with integer CUDA kernels
    /// (`neg_i32`...): they wrap, as torch's do.
    pub const INT_KERNELS: &'static [Unary] = &[Unary::Neg, Unary::Abs];
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
