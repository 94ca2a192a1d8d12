//! `Display` for tensors, in the shape of torch's printout: nested brackets
//! of values in one common format, then the shape and dtype.
//!
//! A tensor of more than [`SUMMARY_THRESHOLD`] elements is summarised: every
//! dimension longer than `2 * EDGE_ITEMS` shows its first and last
//! [`EDGE_ITEMS`] entries around `...`, so printing a [4096, 32000] logits
//! tensor reads 36 values, not 131 million.
//!
//! Values are read through the public view ops (`narrow`, `concat`) and
//! [`Tensor::to_vec_f64`], so this file needs nothing of the storage.

use std::fmt::{self, Write as _};

use crate::ops::ShapeOps;
use crate::{DType, Tensor};

/// Tensors with more elements than this are printed summarised (torch's
/// default threshold).
pub const SUMMARY_THRESHOLD: usize = 1000;

/// Entries shown at each end of a summarised dimension (torch's default).
pub const EDGE_ITEMS: usize = 3;

/// Decimals of a fixed or scientific float when the formatter gives no
/// precision (torch's default).
const DEFAULT_DECIMALS: usize = 4;

impl fmt::Display for Tensor {
    /// ```
    /// use tapir::prelude::*;
    ///
    /// let x = Tensor::from_vec(vec![1.0f32, 2.5, -3.0, 4.0], [2, 2])?;
    /// assert_eq!(
    ///     x.to_string(),
    ///     "tensor([[ 1.0000,  2.5000],\n        [-3.0000,  4.0000]], shape=[2, 2], dtype=float32)"
    /// );
    /// // A precision sets the decimals.
    /// assert_eq!(format!("{:.1}", x.narrow(0, 0, 1)?), "tensor([[1.0, 2.5]], shape=[1, 2], dtype=float32)");
    /// // Whole numbers print as torch prints them; integers as integers.
    /// assert_eq!(Tensor::arange(0.0, 3.0, 1.0, DType::I64)?.to_string(), "tensor([0, 1, 2], shape=[3], dtype=int64)");
    /// // Long tensors are elided.
    /// let long = Tensor::arange(0.0, 5000.0, 1.0, DType::F32)?;
    /// assert_eq!(long.to_string(), "tensor([   0.,    1.,    2., ..., 4997., 4998., 4999.], shape=[5000], dtype=float32)");
    /// # Ok::<(), Error>(())
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let summarise = self.numel() > SUMMARY_THRESHOLD;
        let shown = match shown_part(self, summarise) {
            Ok(t) => t,
            Err(e) => return write!(f, "tensor(<unprintable: {e}>, shape={}, dtype={})", self.shape(), self.dtype()),
        };
        let values = shown.to_vec_f64();
        let style = Style::of(&values, self.dtype(), f.precision().unwrap_or(DEFAULT_DECIMALS));
        let cells: Vec<String> = values.iter().map(|&v| style.format(v)).collect();
        let width = cells.iter().map(|c| c.len()).max().unwrap_or(0);
        let mut out = String::from("tensor(");
        let prefix = out.len();
        if self.rank() == 0 {
            out.push_str(cells.first().map_or("", |c| c.as_str()));
        } else {
            let layout = Nest { dims: shown.dims(), elided: &elided_dims(self, summarise), width, prefix };
            layout.write(&mut out, &cells, 0, 0);
        }
        write!(out, ", shape={}, dtype={}", self.shape(), self.dtype())?;
        if !self.device().is_cpu() {
            write!(out, ", device={}", self.device())?;
        }
        out.push(')');
        f.write_str(&out)
    }
}

/// For each dimension, whether it is summarised (its middle left out).
fn elided_dims(t: &Tensor, summarise: bool) -> Vec<bool> {
    t.dims().iter().map(|&n| summarise && n > 2 * EDGE_ITEMS).collect()
}

/// The part of `t` that is printed: all of it, or, summarised, the first
/// and last [`EDGE_ITEMS`] entries of every long dimension, joined.
fn shown_part(t: &Tensor, summarise: bool) -> crate::Result<Tensor> {
    let mut part = t.clone();
    for (axis, elide) in elided_dims(t, summarise).into_iter().enumerate() {
        if elide {
            let n = part.dims()[axis];
            let head = part.narrow(axis as isize, 0, EDGE_ITEMS)?;
            let tail = part.narrow(axis as isize, n - EDGE_ITEMS, EDGE_ITEMS)?;
            part = Tensor::concat(&[&head, &tail], axis as isize)?;
        }
    }
    Ok(part)
}

/// How every value of one printout is written, chosen from all of them
/// so the columns line up, as torch chooses.
enum Style {
    /// Integer dtypes.
    Int,
    /// Floats that are all whole numbers: `3.`.
    Whole,
    /// Fixed point with this many decimals.
    Fixed(usize),
    /// Scientific with this many decimals, for values spanning more than
    /// three orders of magnitude or very large or small ones.
    Sci(usize),
}

impl Style {
    fn of(values: &[f64], dtype: DType, decimals: usize) -> Style {
        if dtype.is_int() {
            return Style::Int;
        }
        let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        if finite.iter().all(|v| v.fract() == 0.0) && finite.iter().all(|v| v.abs() < 1e8) {
            return Style::Whole;
        }
        let nonzero = finite.iter().map(|v| v.abs()).filter(|&a| a > 0.0);
        let (lo, hi) = nonzero.fold((f64::INFINITY, 0.0f64), |(lo, hi), a| (lo.min(a), hi.max(a)));
        if hi > 0.0 && (hi / lo > 1e3 || hi >= 1e8 || lo < 1e-4) {
            Style::Sci(decimals)
        } else {
            Style::Fixed(decimals)
        }
    }

    fn format(&self, v: f64) -> String {
        if !v.is_finite() {
            return if v.is_nan() {
                "nan".into()
            } else if v > 0.0 {
                "inf".into()
            } else {
                "-inf".into()
            };
        }
        match *self {
            Style::Int => format!("{v:.0}"),
            Style::Whole => format!("{v:.0}."),
            Style::Fixed(d) => format!("{v:.d$}"),
            Style::Sci(d) => sci(v, d),
        }
    }
}

/// `v` in scientific notation the way C and torch write it: a signed,
/// two-digit exponent (`1.2500e-05`).
fn sci(v: f64, decimals: usize) -> String {
    let s = format!("{v:.decimals$e}");
    let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    format!("{mantissa}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
}

/// The bracket structure of a printout.
struct Nest<'a> {
    dims: &'a [usize],
    elided: &'a [bool],
    width: usize,
    /// Columns before the outer bracket (`tensor(`), so continuation lines
    /// line up under it.
    prefix: usize,
}

impl Nest<'_> {
    /// Writes the sub-tensor at `depth` whose first cell is `start`.
    fn write(&self, out: &mut String, cells: &[String], depth: usize, start: usize) {
        out.push('[');
        let n = self.dims[depth];
        let inner: usize = self.dims[depth + 1..].iter().product();
        let last = depth + 1 == self.dims.len();
        for i in 0..n {
            if i > 0 {
                if last {
                    out.push_str(", ");
                } else {
                    // Rows of a matrix end in one newline, matrices of a
                    // batch in two, as torch prints them.
                    out.push(',');
                    let breaks = self.dims.len() - depth - 1;
                    for _ in 0..breaks {
                        out.push('\n');
                    }
                    out.extend(std::iter::repeat_n(' ', self.prefix + depth + 1));
                }
            }
            if self.elided[depth] && i == EDGE_ITEMS {
                out.push_str("...");
                if last {
                    out.push_str(", ");
                } else {
                    out.push(',');
                    out.push('\n');
                    out.extend(std::iter::repeat_n(' ', self.prefix + depth + 1));
                }
            }
            if last {
                let _ = write!(out, "{:>w$}", cells[start + i], w = self.width);
            } else {
                self.write(out, cells, depth + 1, start + i * inner);
            }
        }
        out.push(']');
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Tensor};

    #[test]
    fn prints_matrices_batches_and_scalars() {
        let x = Tensor::arange(0.0, 8.0, 1.0, DType::I32).unwrap().reshape_raw([2, 2, 2].into()).unwrap();
        assert_eq!(
            x.to_string(),
            "tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]], shape=[2, 2, 2], dtype=int32)"
        );
        assert_eq!(Tensor::scalar(0.5).to_string(), "tensor(0.5000, shape=[], dtype=float32)");
    }

    #[test]
    fn wide_ranges_print_scientific_and_non_finite_values_by_name() {
        let x = Tensor::from_vec(vec![1e-5f64, 1.0, f64::NAN, f64::NEG_INFINITY], [4]).unwrap();
        assert_eq!(x.to_string(), "tensor([1.0000e-05, 1.0000e+00,        nan,       -inf], shape=[4], dtype=float64)");
    }

    #[test]
    fn long_matrices_elide_rows_and_columns() {
        let x = Tensor::arange(0.0, 2000.0, 1.0, DType::I64).unwrap().reshape_raw([40, 50].into()).unwrap();
        let s = x.to_string();
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines.len(), 7, "{s}");
        assert_eq!(lines[0], "tensor([[   0,    1,    2, ...,   47,   48,   49],");
        assert_eq!(lines[3].trim(), "...,");
        assert_eq!(lines[6], "        [1950, 1951, 1952, ..., 1997, 1998, 1999]], shape=[40, 50], dtype=int64)");
    }
}
