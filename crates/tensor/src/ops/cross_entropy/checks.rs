//! What both losses check and keep: the labels (i32 or i64, each a class
//! or the ignored index), the options, the dtype the kernels compute in, and
//! the values a forward saves for the backward, behind a lock.

use std::sync::Mutex;

use crate::backend::cross_entropy::{label_row, CrossEntropyOptions};
use crate::storage::Storage;
use crate::{DType, Error, Result, Shape, Tensor};

/// A value an op saves for its backward, behind a lock (ops are shared).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The saved tensor, if the forward made it and no spent backward freed it.
pub(crate) fn saved(m: &Mutex<Option<Tensor>>) -> Option<Tensor> {
    lock(m).clone()
}

/// Labels as row indices (`None` for ignored rows), checked against
/// `classes` by the label rule of [`label_row`], for the derivative rules
/// (which read them on the host; the kernels check them where they live).
pub(crate) fn check_labels(
    op: &'static str,
    labels: &Tensor,
    ignore: i64,
    classes: usize,
) -> Result<Vec<Option<usize>>> {
    label_dtype(op, labels)?;
    let raw: Vec<i64> = match labels.dtype() {
        DType::I64 => labels.to_vec::<i64>()?,
        _ => labels.to_vec::<i32>()?.into_iter().map(i64::from).collect(),
    };
    raw.iter().enumerate().map(|(row, &l)| label_row(op, row, l, ignore, classes)).collect()
}

/// The labels' dtype, i32 or i64, checked once for every device.
pub(crate) fn label_dtype(op: &'static str, labels: &Tensor) -> Result<DType> {
    match labels.dtype() {
        d @ (DType::I32 | DType::I64) => Ok(d),
        dtype => Err(Error::UnsupportedDType { op, dtype, expected: "int32 or int64 labels" }),
    }
}

/// The gradients a head's forward precomputed, or the gradient a backward
/// made, as tensors of their inputs' shapes.
pub(crate) fn tensors(storages: Vec<Storage>, shapes: &[Shape]) -> Vec<Tensor> {
    storages.into_iter().zip(shapes).map(|(s, shape)| Tensor::from_storage(s, shape.clone())).collect()
}

pub(crate) fn check_options(op: &'static str, o: &CrossEntropyOptions) -> Result<()> {
    if !(0.0..=1.0).contains(&o.label_smoothing) {
        return Err(Error::invalid_arg(op, format!("label_smoothing {} is outside [0, 1]", o.label_smoothing)));
    }
    Ok(())
}

/// The dtype the kernels compute in: f64 for f64, f32 for the other floats.
pub(crate) fn compute_dtype(op: &'static str, x: &Tensor) -> Result<DType> {
    match x.dtype() {
        DType::F64 => Ok(DType::F64),
        DType::F32 | DType::F16 | DType::BF16 => Ok(DType::F32),
        dtype => Err(Error::UnsupportedDType { op, dtype, expected: "float logits" }),
    }
}
