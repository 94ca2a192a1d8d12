//! Constructors that make a tensor on a given device (`zeros_on`, `ones_on`,
//! `full_on`, and the `*_like` ones, which keep their tensor's device): the
//! same bits, the same errors and the same counted bytes on every device.
//! The counters are process-wide, so every test of this binary takes one
//! lock and they run one at a time.

use std::sync::{Mutex, MutexGuard};

use half::{bf16, f16};
use tapir_tensor::prelude::*;
use tapir_testing::test_device;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const DTYPES: [DType; 6] = [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64];

/// Values whose conversion to each dtype exercises a corner: signed zero,
/// rounding, int truncation and saturation, NaN and infinities, f16
/// overflow.
const VALUES: [f64; 10] = [0.0, -0.0, 1.0, 2.5, -3.75, 1e10, -1e19, f64::NAN, f64::INFINITY, 65520.0];

/// Every element's bits, widened: equal bits mean equal tensors, NaN and
/// -0.0 included.
fn bits(t: &Tensor) -> Result<Vec<u64>> {
    Ok(match t.dtype() {
        DType::F32 => t.to_vec::<f32>()?.iter().map(|v| u64::from(v.to_bits())).collect(),
        DType::F64 => t.to_vec::<f64>()?.iter().map(|v| v.to_bits()).collect(),
        DType::F16 => t.to_vec::<f16>()?.iter().map(|v| u64::from(v.to_bits())).collect(),
        DType::BF16 => t.to_vec::<bf16>()?.iter().map(|v| u64::from(v.to_bits())).collect(),
        DType::I32 => t.to_vec::<i32>()?.iter().map(|&v| u64::from(v as u32)).collect(),
        DType::I64 => t.to_vec::<i64>()?.iter().map(|&v| v as u64).collect(),
    })
}

test_device! {
    /// zeros_on, ones_on and full_on make their tensor on the device asked
    /// for, with exactly the bits the CPU's constructors give, in every
    /// dtype, for shapes from a scalar to several blocks of threads.
    fn constructors_give_the_cpus_bits_on_the_device(device: Device) -> Result<()> {
        let _s = serial();
        let shapes: [&[usize]; 5] = [&[], &[1], &[3, 0], &[2, 3], &[300, 7]];
        for dtype in DTYPES {
            for dims in shapes {
                let check = |t: Tensor, want: Tensor, what: &str| -> Result<()> {
                    let at = format!("{what} {dims:?} {dtype}");
                    assert_eq!((t.device(), t.dtype(), t.dims()), (device, dtype, dims), "{at}");
                    assert!(t.is_contiguous(), "{at}");
                    assert_eq!(bits(&t)?, bits(&want)?, "{at}");
                    Ok(())
                };
                check(Tensor::zeros_on(dims, dtype, device)?, Tensor::zeros(dims, dtype)?, "zeros")?;
                check(Tensor::ones_on(dims, dtype, device)?, Tensor::ones(dims, dtype)?, "ones")?;
                for v in VALUES {
                    check(Tensor::full_on(dims, v, dtype, device)?, Tensor::full(dims, v, dtype)?, &format!("full {v}"))?;
                }
            }
        }
        Ok(())
    }

    /// The `*_like` constructors keep shape, dtype and device, as does the
    /// scalar constant a graph-generic op makes (`maximum_scalar`).
    fn like_constructors_keep_the_device(device: Device) -> Result<()> {
        let _s = serial();
        let x = Tensor::from_vec(vec![-1.5f64, 0.25, 2.0, 3.5], [2, 2])?.to_device(device)?;
        for (t, want) in [(x.zeros_like()?, 0.0), (x.ones_like()?, 1.0), (x.full_like(-7.25)?, -7.25)] {
            assert_eq!((t.device(), t.dtype(), t.dims()), (device, DType::F64, &[2usize, 2][..]));
            assert_eq!(t.to_vec::<f64>()?, vec![want; 4]);
        }
        // The trait's constructors, which rules call on tensors and graph
        // values alike.
        let z = Diff::full_like_shape(&x, [3], 0.5)?;
        assert_eq!((z.device(), z.to_vec::<f64>()?), (device, vec![0.5; 3]));
        assert_eq!(x.maximum_scalar(1.0)?.to_vec::<f64>()?, vec![1.0, 1.0, 2.0, 3.5]);
        assert_eq!(x.minimum_scalar(1.0)?.device(), device);
        Ok(())
    }

    /// A size that overflows is the same InvalidShape on every device, and
    /// a size no memory can hold is an OutOfMemory; neither counts a byte.
    fn constructor_errors_are_the_cpus(device: Device) -> Result<()> {
        let _s = serial();
        let before = memory_stats(device).allocated;
        for dims in [vec![usize::MAX, 2], vec![1 << 62, 4]] {
            let want = Tensor::zeros(dims.clone(), DType::F32).unwrap_err();
            assert!(matches!(want, Error::InvalidShape { op: "zeros", .. }), "{want}");
            assert_eq!(Tensor::zeros_on(dims.clone(), DType::F32, device).unwrap_err(), want);
            let ones = Tensor::ones_on(dims.clone(), DType::F64, device).unwrap_err();
            assert!(matches!(ones, Error::InvalidShape { op: "ones", .. }), "{ones}");
            let full = Tensor::full_on(dims, 2.0, DType::I32, device).unwrap_err();
            assert!(matches!(full, Error::InvalidShape { op: "full", .. }), "{full}");
        }
        // 16 TiB: a valid shape, but more than any device here holds.
        let huge = Tensor::full_on([1usize << 42], 1.0, DType::F32, device).unwrap_err();
        assert!(matches!(huge, Error::OutOfMemory { .. }), "{huge}");
        assert_eq!(memory_stats(device).allocated, before, "a failed constructor counts nothing");
        // The next allocation that fits succeeds.
        assert_eq!(Tensor::ones_on([4], DType::F32, device)?.to_vec::<f32>()?, vec![1.0; 4]);
        Ok(())
    }

    /// Each constructed tensor is counted on its device, exactly its bytes,
    /// from creation to drop; nothing is counted on the other device.
    fn constructed_bytes_are_counted_exactly_on_the_device(device: Device) -> Result<()> {
        let _s = serial();
        let base = memory_stats(device).allocated;
        let host = memory_stats(Device::Cpu).allocated;
        let a = Tensor::zeros_on([100, 3], DType::F64, device)?;
        let b = Tensor::full_on([7], 3.0, DType::F16, device)?;
        let c = a.ones_like()?;
        assert_eq!(memory_stats(device).allocated, base + 2400 + 14 + 2400);
        if device != Device::Cpu {
            assert_eq!(memory_stats(Device::Cpu).allocated, host, "nothing was made on the host");
        }
        drop((a, b));
        assert_eq!(memory_stats(device).allocated, base + 2400);
        drop(c);
        assert_eq!(memory_stats(device).allocated, base);
        Ok(())
    }
}

/// A device this machine lacks is an error naming it, never a panic and
/// never a silent tensor on the host.
#[test]
fn a_device_this_machine_lacks_is_an_error() {
    let _s = serial();
    let missing = Device::Cuda(15);
    for r in [
        Tensor::zeros_on([2], DType::F32, missing),
        Tensor::ones_on([2], DType::F32, missing),
        Tensor::full_on([], 1.0, DType::I64, missing),
    ] {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::DeviceUnavailable { device, .. } if device == missing), "{e}");
    }
}
