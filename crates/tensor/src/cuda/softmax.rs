//! The CUDA launch of softmax and log_softmax ([`crate::backend::softmax`]):
//! one warp or block per row of `kernels/softmax.cu`.

use super::buffer::{storage_of, CudaBuffer};
use super::launch::{device_of_src, launch_rows};
use super::CudaBackend;
use crate::backend::{SoftmaxKernels, Src};
use crate::storage::Storage;
use crate::{DType, Result};

const SOFTMAX: &str = "softmax.cu";

fn softmax_kernel(log: bool, dtype: DType) -> String {
    format!("{}_{}", if log { "log_softmax" } else { "softmax" }, dtype.cuda_suffix())
}

/// Every kernel this module launches, as `(file, entry)`.
pub(crate) fn kernels() -> Vec<(&'static str, String)> {
    let floats = [DType::F32, DType::F64, DType::F16, DType::BF16];
    floats.into_iter().flat_map(|dt| [false, true].map(|log| (SOFTMAX, softmax_kernel(log, dt)))).collect()
}

impl SoftmaxKernels for CudaBackend {
    fn softmax_rows(&self, log: bool, x: Src<'_>, cols: usize) -> Result<Storage> {
        let name = if log { "log_softmax" } else { "softmax" };
        let rows = x.numel().checked_div(cols).unwrap_or(0);
        let (dev, p) = device_of_src(name, x)?;
        let (out, _) = CudaBuffer::alloc(&dev, x.dtype(), x.numel())?;
        let first = p + (x.layout.offset * x.dtype().size_in_bytes()) as u64;
        launch_rows(SOFTMAX, &softmax_kernel(log, x.dtype()), first, (rows, cols), &out)?;
        Ok(storage_of(out))
    }
}
