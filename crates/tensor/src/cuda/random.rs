//! Random tensors generated on a CUDA device by `kernels/random.cu`: the
//! same Philox blocks as the CPU's `Rng` (whose module docs give the
//! layout), and the same arithmetic on their words for uniforms, randint
//! and f64 normals, so a seed gives the same numbers on every device; f32,
//! f16 and bf16 normals are computed in f32 here (in f64 on the CPU),
//! within 4 ulps of the CPU's for f32 and 1 for f16 and bf16.

use super::buffer::{storage_of, CudaBuffer};
use super::context::CudaDevice;
use super::launch::{launch_capped, Arg};
use super::shape::cast_src;
use super::CudaBackend;
use crate::backend::random::{Draw, RandomPlan};
use crate::backend::{RandomKernels, Src};
use crate::storage::Storage;
use crate::{DType, Device, Error, Layout, Result};

/// Blocks a draw launches at most: 132 SMs x 8 resident blocks of 256
/// threads on an H100 or H200, one full wave. Each thread computes the
/// ten round keys once and then grid-strides over its Philox blocks, so a
/// large draw gives each thread many blocks (15 or 16 at 4,096 x 4,096 f32)
/// rather than the 4 of the 4,096 blocks the elementwise launches take.
const DRAW_GRID: usize = 1056;

/// The kernel-name suffix of a float dtype.
fn suffix(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::F32 => Some("f32"),
        DType::F64 => Some("f64"),
        DType::F16 => Some("f16"),
        DType::BF16 => Some("bf16"),
        _ => None,
    }
}

/// The uniform or normal kernel of float `dtype`, `None` for another.
fn float_kernel(normal: bool, dtype: DType) -> Option<String> {
    suffix(dtype).map(|s| format!("{}_{s}", if normal { "normal" } else { "uniform" }))
}

/// Every kernel of random.cu, for the NVRTC test.
pub(crate) fn kernel_names() -> Vec<String> {
    let mut out: Vec<String> = [DType::F32, DType::F64, DType::F16, DType::BF16]
        .into_iter()
        .flat_map(|d| [false, true].map(|normal| float_kernel(normal, d).expect("internal: a float dtype")))
        .collect();
    out.push("randint_i64".into());
    out
}

impl RandomKernels for CudaBackend {
    fn random(&self, plan: &RandomPlan) -> Result<Storage> {
        let RandomPlan { op, dtype, draw, key, offset, device, .. } = *plan;
        let Device::Cuda(ordinal) = device else { return Err(Error::Unsupported { op, device }) };
        let dev = CudaDevice::get(ordinal)?;
        let n = plan.shape.numel();
        let blocks = n.div_ceil(draw.per_block(dtype));
        let head = [Arg::I64(n as i64), Arg::I32(key[0] as i32), Arg::I32(key[1] as i32), Arg::I64(offset as i64)];
        let (kernel, p0, p1, out_dtype) = match draw {
            Draw::Int { n: range } => ("randint_i64".to_string(), Arg::I64(range as i64), None, DType::I64),
            Draw::Uniform { lo, scale } | Draw::Normal { mean: lo, std: scale } => {
                let normal = matches!(draw, Draw::Normal { .. });
                let k = float_kernel(normal, dtype).ok_or(Error::UnsupportedDType {
                    op,
                    dtype,
                    expected: "a float dtype",
                })?;
                (k, Arg::F64(lo), Some(Arg::F64(scale)), dtype)
            }
        };
        let (out, _) = CudaBuffer::alloc(&dev, out_dtype, n)?;
        if n > 0 {
            let mut args = head.to_vec();
            args.push(p0);
            args.extend(p1);
            args.push(Arg::Ptr(out.ptr()));
            launch_capped(&dev, "random.cu", &kernel, blocks, DRAW_GRID, &args)?;
        }
        let out = storage_of(out);
        // Integers are drawn as i64 and converted as a cast converts, as the CPU does.
        if out_dtype != dtype {
            return cast_src(Src { storage: &out, layout: &Layout::contiguous(plan.shape.clone()) }, dtype);
        }
        Ok(out)
    }
}
