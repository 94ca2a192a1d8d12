//! The CUDA launch of softmax and log_softmax ([`crate::backend::softmax`]):
//! one warp or block per row of `kernels/softmax.cu`, or, for many rows of
//! at most 4 KiB, a warp per row held in registers (`softmax_warp_*`,
//! chosen by [`softmax_warp_rows`]); for fewer rows, or longer ones, of at
//! most 128 KiB, a block per row held in registers (`softmax_block<U>_*`,
//! [`block_reg_rows`]).

use super::buffer::{storage_of, CudaBuffer};
use super::launch::{
    block_reg_rows, device_of_src, launch_block_reg_rows, launch_rows, launch_warp_rows, softmax_warp_rows,
};
use super::CudaBackend;
use crate::backend::{SoftmaxKernels, Src};
use crate::storage::Storage;
use crate::{DType, Result};

const SOFTMAX: &str = "softmax.cu";

/// `stage` is "" for the block-per-row kernel, "warp_" for the warp-per-row
/// one, "block<U>_" for the block-per-row one in registers, U units a thread.
fn softmax_kernel(log: bool, stage: &str, dtype: DType) -> String {
    format!("{}_{stage}{}", if log { "log_softmax" } else { "softmax" }, dtype.cuda_suffix())
}

/// Every kernel this module launches, as `(file, entry)`.
pub(crate) fn kernels() -> Vec<(&'static str, String)> {
    let floats = [DType::F32, DType::F64, DType::F16, DType::BF16];
    floats
        .into_iter()
        .flat_map(|dt| {
            let stages = ["", "warp_", "block1_", "block2_", "block4_", "block8_"];
            stages.into_iter().flat_map(move |stage| [false, true].map(|log| (SOFTMAX, softmax_kernel(log, stage, dt))))
        })
        .collect()
}

impl SoftmaxKernels for CudaBackend {
    fn softmax_rows(&self, log: bool, x: Src<'_>, cols: usize) -> Result<Storage> {
        let name = if log { "log_softmax" } else { "softmax" };
        let rows = x.numel().checked_div(cols).unwrap_or(0);
        let (dev, p) = device_of_src(name, x)?;
        let (out, _) = CudaBuffer::alloc(&dev, x.dtype(), x.numel())?;
        let first = p + (x.layout.offset * x.dtype().size_in_bytes()) as u64;
        if softmax_warp_rows(x.dtype(), first, out.ptr(), (rows, cols)) {
            launch_warp_rows(SOFTMAX, &softmax_kernel(log, "warp_", x.dtype()), first, (rows, cols), &out)?;
        } else if let Some((threads, units)) = block_reg_rows(x.dtype(), first, out.ptr(), (rows, cols)) {
            let name = softmax_kernel(log, &format!("block{units}_"), x.dtype());
            launch_block_reg_rows(SOFTMAX, &name, first, (rows, cols), &out, threads)?;
        } else {
            launch_rows(SOFTMAX, &softmax_kernel(log, "", x.dtype()), first, (rows, cols), &out)?;
        }
        Ok(storage_of(out))
    }
}
