//! The binary family's seam: which two-operand function ([`Binary`]) or
//! comparison ([`Cmp`]), the plans its kernels take, and the kernels every
//! device implements ([`BinaryKernels`]): the elementwise functions, the
//! comparisons and `where`. The ops, their shape and dtype rules and their
//! derivatives are [`crate::ops::binary`]'s.

use super::Src;
use crate::storage::Storage;
use crate::{DType, Result, Shape};

/// Which two-operand function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a * b
    Mul,
    /// a / b
    Div,
    /// a ^ b
    Pow,
    /// max(a, b), NaN-propagating
    Maximum,
    /// min(a, b), NaN-propagating
    Minimum,
}

impl Binary {
    /// The CUDA kernel computing this function on `dtype` (an entry of
    /// `kernels/elementwise.cu`).
    pub fn cuda_kernel(self, dtype: DType) -> String {
        format!("{}_{}", self.name(), dtype.cuda_suffix())
    }

    /// The function's name, as errors and graph diagnostics show it.
    pub fn name(self) -> &'static str {
        match self {
            Binary::Add => "add",
            Binary::Sub => "sub",
            Binary::Mul => "mul",
            Binary::Div => "div",
            Binary::Pow => "pow",
            Binary::Maximum => "maximum",
            Binary::Minimum => "minimum",
        }
    }

    /// The functions with integer CUDA kernels (`add_i32`...): all but
    /// division, which runs in float32.
    pub const INT_KERNELS: &'static [Binary] =
        &[Binary::Add, Binary::Sub, Binary::Mul, Binary::Pow, Binary::Maximum, Binary::Minimum];

    /// The error of an integer raised to the negative power `q`, which no
    /// integer holds (torch's rule), the same from every device.
    pub(crate) fn negative_int_power(q: i64) -> crate::Error {
        crate::Error::invalid_arg(
            "pow",
            format!("integers to negative integer powers are not allowed (exponent {q}); cast to a float dtype first"),
        )
    }

    /// Every two-operand function, once.
    pub const ALL: &'static [Binary] =
        &[Binary::Add, Binary::Sub, Binary::Mul, Binary::Div, Binary::Pow, Binary::Maximum, Binary::Minimum];
}

/// A comparison, giving a mask of 1 and 0 in the operands' promoted dtype
/// (the tensor's own dtype against a scalar).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// ==
    Eq,
    /// !=
    Ne,
    /// <
    Lt,
    /// <=
    Le,
    /// >
    Gt,
    /// >=
    Ge,
}

impl Cmp {
    /// Whether `a` and `b` pass the test.
    #[inline]
    pub fn test<T: PartialOrd>(self, a: T, b: T) -> bool {
        match self {
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
            Cmp::Lt => a < b,
            Cmp::Le => a <= b,
            Cmp::Gt => a > b,
            Cmp::Ge => a >= b,
        }
    }
    /// The comparison's name, as errors show it.
    pub fn name(self) -> &'static str {
        match self {
            Cmp::Eq => "eq",
            Cmp::Ne => "ne",
            Cmp::Lt => "lt",
            Cmp::Le => "le",
            Cmp::Gt => "gt",
            Cmp::Ge => "ge",
        }
    }
}

impl Cmp {
    /// The CUDA kernel running every comparison on `dtype` (the test is an
    /// argument).
    pub fn cuda_kernel(dtype: DType) -> String {
        format!("compare_{}", dtype.cuda_suffix())
    }

    /// Every comparison, once.
    pub const ALL: &'static [Cmp] = &[Cmp::Eq, Cmp::Ne, Cmp::Lt, Cmp::Le, Cmp::Gt, Cmp::Ge];
}

/// What a comparison's first operand meets.
#[derive(Clone, Copy)]
pub enum Rhs<'a> {
    /// A second operand of the first's dtype, broadcast with it.
    Operand(Src<'a>),
    /// A scalar, compared as rounded to the first operand's dtype.
    Scalar(f64),
}

/// The binary family's kernels. The op has checked and broadcast the
/// shapes and promoted the operands to one dtype; every output is a new
/// contiguous buffer of `shape`.
pub trait BinaryKernels {
    /// `f(a, b)` broadcast to `shape`, in the operands' dtype. Integers
    /// never divide here (the op divides them in float32).
    fn binary(&self, f: Binary, a: Src<'_>, b: Src<'_>, shape: &Shape) -> Result<Storage>;
    /// 1 where `cmp(a, rhs)` holds, else 0, in `a`'s dtype. A scalar meets
    /// a float operand only (the op compares integers with scalars in f64).
    fn compare(&self, cmp: Cmp, a: Src<'_>, rhs: Rhs<'_>, shape: &Shape) -> Result<Storage>;
    /// `a` where `mask` is non-zero, else `b`, all three broadcast to
    /// `shape`; `a` and `b` share a dtype, the mask has any.
    fn select(&self, mask: Src<'_>, a: Src<'_>, b: Src<'_>, shape: &Shape) -> Result<Storage>;
}
