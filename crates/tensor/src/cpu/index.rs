//! The CPU kernels of the indexing ops ([`crate::backend::index`]). The
//! indices are read here, once, and checked for range as they are turned
//! into offsets, so the loops then index without bounds errors to report.

use super::{host, CpuBackend};
use crate::backend::index::{AxisPlan, SplitPlan};
use crate::backend::{IndexKernels, Src};
use crate::storage::{try_filled, try_vec, CpuElement, Storage};
use crate::{with_dtype, DType, Element, Error, Result};

impl IndexKernels for CpuBackend {
    fn check_indices(&self, op: &'static str, idx: Src<'_>, size: usize) -> Result<()> {
        checked_indices(op, idx, size).map(drop)
    }

    fn index_select(&self, plan: &SplitPlan, x: Src<'_>, idx: Src<'_>) -> Result<Storage> {
        let ids = checked_indices(plan.op, idx, plan.size)?;
        let (outer, size, inner) = (plan.outer, plan.size, plan.inner);
        Ok(Storage::cpu(with_dtype!(x.dtype(), T => {
            let src = dense::<T>(x);
            let mut out = try_vec(plan.shape.numel())?;
            for o in 0..outer {
                for &i in &ids {
                    let at = (o * size + i) * inner;
                    out.extend_from_slice(&src[at..at + inner]);
                }
            }
            T::wrap(out)
        })))
    }

    fn index_add(&self, plan: &SplitPlan, g: Src<'_>, idx: Src<'_>) -> Result<Storage> {
        let ids = checked_indices(plan.op, idx, plan.size)?;
        let (outer, size, inner, n) = (plan.outer, plan.size, plan.inner, plan.n);
        Ok(Storage::cpu(with_dtype!(g.dtype(), T => {
            let src = dense::<T>(g);
            let mut out = try_filled(plan.shape.numel(), T::from_f64(0.0))?;
            for o in 0..outer {
                for (j, &i) in ids.iter().enumerate() {
                    let (d, s) = ((o * size + i) * inner, (o * n + j) * inner);
                    for k in 0..inner {
                        out[d + k] = T::from_f64(out[d + k].to_f64() + src[s + k].to_f64());
                    }
                }
            }
            T::wrap(out)
        })))
    }

    fn gather(&self, plan: &AxisPlan, x: Src<'_>, idx: Src<'_>) -> Result<Storage> {
        let offs = axis_offsets(plan, idx, x.shape().dims(), &x.layout.strides)?;
        Ok(Storage::cpu(with_dtype!(x.dtype(), T => {
            let (src, at) = (host::<T>(x), x.layout.offset);
            T::wrap(offs.iter().map(|&o| src[at + o]).collect())
        })))
    }

    fn scatter_add(&self, plan: &AxisPlan, base: Src<'_>, src: Src<'_>, idx: Src<'_>) -> Result<Storage> {
        let strides = base.shape().contiguous_strides();
        let offs = axis_offsets(plan, idx, base.shape().dims(), &strides)?;
        let mut out = super::shape::copy(base)?;
        with_dtype!(base.dtype(), T => {
            let out = T::slice_mut(&mut out).expect("internal: dtype matches");
            for (&o, &v) in offs.iter().zip(dense::<T>(src)) {
                out[o] = T::from_f64(out[o].to_f64() + v.to_f64());
            }
        });
        Ok(Storage::cpu(out))
    }
}

/// The elements of the contiguous `x`.
fn dense<'a, T: CpuElement>(x: Src<'a>) -> &'a [T] {
    &host::<T>(x)[x.layout.offset..x.layout.offset + x.numel()]
}

/// The contiguous indices `idx` (i32 or i64) as usize, each checked against
/// `size`.
fn checked_indices(op: &'static str, idx: Src<'_>, size: usize) -> Result<Vec<usize>> {
    let raw: Vec<i64> = match idx.dtype() {
        DType::I32 => dense::<i32>(idx).iter().map(|&i| i64::from(i)).collect(),
        _ => dense::<i64>(idx).to_vec(),
    };
    raw.iter()
        .enumerate()
        .map(|(position, &i)| {
            if i >= 0 && (i as usize) < size {
                Ok(i as usize)
            } else {
                Err(Error::IndexOutOfRange { op, index: i, position, size })
            }
        })
        .collect()
}

/// For gather and scatter_add: for each index (in the row-major order of
/// `idx`'s shape), the element offset in a tensor of `dims` and `strides`
/// of the index's own position with its axis coordinate replaced by the
/// index, checked against `dims[axis]`.
fn axis_offsets(plan: &AxisPlan, idx: Src<'_>, dims: &[usize], strides: &[usize]) -> Result<Vec<usize>> {
    let ids = checked_indices(plan.op, idx, dims[plan.axis])?;
    let id = idx.shape().dims();
    let mut out = Vec::with_capacity(ids.len());
    let mut pos: Vec<usize> = vec![0; id.len()];
    for &i in &ids {
        let mut off = 0;
        for a in 0..id.len() {
            off += if a == plan.axis { i } else { pos[a] } * strides[a];
        }
        out.push(off);
        for a in (0..id.len()).rev() {
            pos[a] += 1;
            if pos[a] < id[a] {
                break;
            }
            pos[a] = 0;
        }
    }
    Ok(out)
}
