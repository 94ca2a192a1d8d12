//! Tensors created on a CUDA device already filled with one value (what
//! `Tensor::zeros_on`, `full_on` and the `*_like` constructors make there):
//! the value is converted to the dtype on the host, exactly as the CPU's
//! constructors convert it, and its bits are written on the device, so a
//! constant made for a device tensor never passes through host memory.

use cudarc::driver::result;
use half::{bf16, f16};

use super::buffer::{tensor_of, CudaBuffer};
use super::context::{driver_error, CudaDevice};
use super::launch::{launch, Arg};
use crate::{DType, Element, Result, Shape, Tensor};

/// The fill kernels of `kernels/elementwise.cu`, one per element width:
/// every dtype is filled with its bit pattern, so one kernel serves f32 and
/// i32, another f64 and i64, another f16 and bf16.
pub const KERNELS: &[&str] = &["fill_b16", "fill_b32", "fill_b64"];

/// The bits of `value` converted to `dtype` by the same conversion the
/// CPU's constructors use ([`Element::from_f64`]), widened to 64 bits.
fn bits_of(value: f64, dtype: DType) -> u64 {
    match dtype {
        DType::F32 => u64::from(<f32 as Element>::from_f64(value).to_bits()),
        DType::F64 => <f64 as Element>::from_f64(value).to_bits(),
        DType::F16 => u64::from(<f16 as Element>::from_f64(value).to_bits()),
        DType::BF16 => u64::from(<bf16 as Element>::from_f64(value).to_bits()),
        DType::I32 => u64::from(<i32 as Element>::from_f64(value) as u32),
        DType::I64 => <i64 as Element>::from_f64(value) as u64,
    }
}

/// A contiguous tensor of `shape` on CUDA device `ordinal`, every element
/// `value` converted to `dtype`. The caller has checked the shape (its
/// size fits `dtype`), so the byte count cannot overflow.
pub(crate) fn full(ordinal: usize, shape: Shape, value: f64, dtype: DType) -> Result<Tensor> {
    let dev = CudaDevice::get(ordinal)?;
    let n = shape.numel();
    let (out, _) = CudaBuffer::alloc(&dev, dtype, n)?;
    fill_buffer(&dev, &out, n, value, dtype)?;
    Ok(tensor_of(out, shape))
}

/// Sets the first `n` elements of `out` (of `dtype`) to `value` converted
/// to `dtype`, in stream order.
pub(crate) fn fill_buffer(dev: &CudaDevice, out: &CudaBuffer, n: usize, value: f64, dtype: DType) -> Result<()> {
    if n > 0 {
        let bits = bits_of(value, dtype);
        if bits == 0 {
            // All-zero bytes (zeros, +0.0, and ints that round to 0): one
            // memset on the stream the kernels run on, ordered with them.
            dev.bind()?;
            let bytes = n * dtype.size_in_bytes();
            // SAFETY: the block holds `bytes` bytes, and the stream belongs
            // to the bound context.
            unsafe { result::memset_d8_async(out.ptr(), 0, bytes, dev.stream.cu_stream()) }
                .map_err(|e| driver_error("memset", e))?;
        } else {
            let name = match dtype.size_in_bytes() {
                2 => "fill_b16",
                4 => "fill_b32",
                _ => "fill_b64",
            };
            // The kernel takes the pattern as a 64-bit integer and keeps its
            // low bits; `as i64` only reinterprets them.
            let args = [Arg::I64(n as i64), Arg::I64(bits as i64), Arg::Ptr(out.ptr())];
            launch(dev, "elementwise.cu", name, n, &args)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::bits_of;
    use crate::DType;

    #[test]
    fn bits_are_the_cpu_conversion_of_the_value() {
        assert_eq!(bits_of(1.0, DType::F32), 0x3f80_0000);
        assert_eq!(bits_of(-0.0, DType::F32), 0x8000_0000, "the sign of -0.0 is kept");
        assert_eq!(bits_of(-0.0, DType::F64), 1 << 63);
        assert_eq!(bits_of(1.0, DType::F16), 0x3c00);
        assert_eq!(bits_of(1.0, DType::BF16), 0x3f80);
        assert_eq!(bits_of(-1.0, DType::I32), 0xffff_ffff, "two's complement in 32 bits, not sign-extended");
        assert_eq!(bits_of(-1.0, DType::I64), u64::MAX);
        assert_eq!(bits_of(0.5, DType::I64), 0, "0.5 truncates to 0, as the CPU converts it");
        assert_eq!(bits_of(f64::NAN, DType::F32), f32::NAN.to_bits() as u64);
    }
}
