//! Shapes and strided layouts.

use smallvec::SmallVec;

use crate::{DType, Error, Result};

/// Dimensions of a tensor; rank up to 6 stays on the stack.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub SmallVec<[usize; 6]>);

impl Shape {
    /// The dims as a slice.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }
    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    /// Number of elements (1 for a scalar). Saturates at `usize::MAX` for a
    /// shape whose element count overflows (never a tensor's shape: see
    /// [`Shape::check`]).
    pub fn numel(&self) -> usize {
        self.0.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }
    /// Number of elements, or `None` when it, or the product of the dims
    /// with empty dims counted as 1 (what the strides are computed from),
    /// overflows `usize`.
    pub fn checked_numel(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |n, &d| n.checked_mul(d.max(1)))?;
        Some(self.numel())
    }
    /// Checks that a tensor of this shape and `dtype` can exist: its element
    /// count, strides and byte count fit the address space (`isize::MAX`
    /// bytes, Rust's limit for one allocation). Returns the element count;
    /// otherwise an [`Error::InvalidShape`] naming `op`.
    pub fn check(&self, op: &'static str, dtype: DType) -> Result<usize> {
        let bad = |reason: String| Error::InvalidShape { op, shape: Box::new(self.clone()), reason };
        let n = self.checked_numel().ok_or_else(|| bad("its element count overflows usize".into()))?;
        match n.checked_mul(dtype.size_in_bytes()) {
            Some(b) if b <= isize::MAX as usize => Ok(n),
            _ => Err(bad(format!("{n} elements of {dtype} exceed the address space"))),
        }
    }
    /// Row-major (C order) strides.
    pub fn contiguous_strides(&self) -> SmallVec<[usize; 6]> {
        let mut s: SmallVec<[usize; 6]> = SmallVec::from_elem(1, self.rank());
        for i in (0..self.rank().saturating_sub(1)).rev() {
            // Saturating: a shape that overflows fails `check` before it
            // can become a tensor, but its strides may still be asked for.
            s[i] = s[i + 1].saturating_mul(self.0[i + 1]);
        }
        s
    }
    /// Resolves a possibly negative axis against this rank.
    pub fn axis(&self, op: &'static str, axis: isize) -> Result<usize> {
        resolve_axis(op, axis, self.rank())
    }
    /// The numpy/torch broadcast of two shapes.
    pub fn broadcast(op: &'static str, a: &Shape, b: &Shape) -> Result<Shape> {
        let r = a.rank().max(b.rank());
        let mut out: SmallVec<[usize; 6]> = SmallVec::from_elem(1, r);
        for i in 0..r {
            let da = if i + a.rank() >= r { a.0[i + a.rank() - r] } else { 1 };
            let db = if i + b.rank() >= r { b.0[i + b.rank() - r] } else { 1 };
            out[i] = if da == db || db == 1 {
                da
            } else if da == 1 {
                db
            } else {
                return Err(Error::ShapeMismatch { op, lhs: Box::new(a.clone()), rhs: Box::new(b.clone()) });
            };
        }
        let out = Shape(out);
        if out.checked_numel().is_none() {
            return Err(Error::InvalidShape {
                op,
                reason: format!("broadcasting {a} with {b} overflows the element count"),
                shape: Box::new(out),
            });
        }
        Ok(out)
    }
}

/// Resolves `axis` (negative counts from the end) for a tensor of `rank`.
pub fn resolve_axis(op: &'static str, axis: isize, rank: usize) -> Result<usize> {
    let r = rank as isize;
    if axis >= -r && axis < r {
        Ok(if axis < 0 { (axis + r) as usize } else { axis as usize })
    } else {
        Err(Error::AxisOutOfRange { op, axis, rank })
    }
}

/// Checks an already resolved `axis` against `rank`: an op struct built by
/// hand and run through `Diff::apply` carries an axis nobody resolved.
pub(crate) fn check_axis(op: &'static str, axis: usize, rank: usize) -> Result<usize> {
    if axis < rank {
        Ok(axis)
    } else {
        Err(Error::AxisOutOfRange { op, axis: isize::try_from(axis).unwrap_or(isize::MAX), rank })
    }
}

impl std::fmt::Debug for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0.as_slice())
    }
}
impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0.as_slice())
    }
}
impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Shape(SmallVec::from_slice(d))
    }
}
impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Shape(SmallVec::from_slice(&d))
    }
}
impl<const N: usize> From<&[usize; N]> for Shape {
    fn from(d: &[usize; N]) -> Self {
        Shape(SmallVec::from_slice(d))
    }
}
impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Self {
        Shape(SmallVec::from_vec(d))
    }
}
impl From<&Vec<usize>> for Shape {
    fn from(d: &Vec<usize>) -> Self {
        Shape(SmallVec::from_slice(d))
    }
}
impl From<&Shape> for Shape {
    fn from(s: &Shape) -> Self {
        s.clone()
    }
}
impl From<()> for Shape {
    fn from(_: ()) -> Self {
        Shape(SmallVec::new())
    }
}

/// Where the elements of a tensor sit in its storage: a shape, element
/// strides (zero for broadcast dims) and an element offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The logical shape.
    pub shape: Shape,
    /// Element strides, one per dim.
    pub strides: SmallVec<[usize; 6]>,
    /// Offset of element [0, .., 0] in the storage.
    pub offset: usize,
}

impl Layout {
    /// A row-major layout of `shape` at offset 0.
    pub fn contiguous(shape: Shape) -> Self {
        let strides = shape.contiguous_strides();
        Layout { shape, strides, offset: 0 }
    }
    /// True when the elements are in row-major order with no gaps (dims of
    /// size 1 may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&d, &s) in self.shape.0.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected = expected.saturating_mul(d);
        }
        true
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }
    /// The strides this layout takes when broadcast to `target` (which must
    /// be a valid broadcast of its shape): zero on new or expanded dims.
    pub fn broadcast_strides(&self, target: &Shape) -> SmallVec<[usize; 6]> {
        let r = target.rank();
        let own = self.shape.rank();
        let mut s: SmallVec<[usize; 6]> = SmallVec::from_elem(0, r);
        for i in 0..own {
            let t = r - own + i;
            s[t] = if self.shape.0[i] == 1 && target.0[t] != 1 { 0 } else { self.strides[i] };
        }
        s
    }
    /// The strides under which the same elements, read in the same row-major
    /// order, have shape `target` (same numel), or `None` when no strides can
    /// (the reshape must copy). torch's `computeStride`: each run of dims that
    /// is contiguous among itself may be split or merged freely, so
    /// (un)squeezing always succeeds and transposed or narrowed views keep
    /// being views where possible.
    pub fn view_strides(&self, target: &Shape) -> Option<SmallVec<[usize; 6]>> {
        let (old, os, new) = (self.shape.dims(), &self.strides, target.dims());
        if self.numel() == 0 || old.is_empty() {
            return Some(target.contiguous_strides());
        }
        let mut out: SmallVec<[usize; 6]> = SmallVec::from_elem(0, new.len());
        let mut view_d = new.len();
        let mut base = os[old.len() - 1];
        let (mut tensor_numel, mut view_numel) = (1usize, 1usize);
        for d in (0..old.len()).rev() {
            tensor_numel = tensor_numel.checked_mul(old[d])?;
            // A chunk ends where the next-outer dim does not continue it.
            if d == 0 || (old[d - 1] != 1 && tensor_numel.checked_mul(base) != Some(os[d - 1])) {
                while view_d > 0 && (view_numel < tensor_numel || new[view_d - 1] == 1) {
                    out[view_d - 1] = view_numel.checked_mul(base)?;
                    view_numel = view_numel.checked_mul(new[view_d - 1])?;
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if d > 0 {
                    base = os[d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        (view_d == 0).then_some(out)
    }
}
