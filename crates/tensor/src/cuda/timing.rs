//! Time measured by the device itself: CUDA events recorded on a device's
//! stream, in the order of the work queued there. What the host's clock
//! cannot see when a call only queues work (an NCCL all-reduce behind the
//! backward's kernels, say): `mark` before and after it, and the seconds
//! between the two marks are the device's time for it.

use std::sync::Arc;

use cudarc::driver::CudaEvent;

use super::context::{driver_error, CudaDevice};
use crate::{Device, Error, Result};

/// A point in a CUDA device's stream: everything queued before it.
pub struct StreamMark {
    event: CudaEvent,
    _device: Arc<CudaDevice>,
}

impl std::fmt::Debug for StreamMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StreamMark")
    }
}

/// Records a mark on `device`'s stream, after the work queued so far (the
/// call returns at once). An error on the CPU, which has no stream.
pub fn mark(device: Device) -> Result<StreamMark> {
    let Device::Cuda(i) = device else {
        return Err(Error::invalid_arg("cuda::timing::mark", "the CPU has no stream to mark"));
    };
    let dev = CudaDevice::get(i)?;
    // With timing: cudarc's default event has none (CU_EVENT_DISABLE_TIMING),
    // and reading such an event's time is an error on hardware, as on the
    // emulated device.
    let event = dev
        .stream
        .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| driver_error("cuEventRecord", e))?;
    Ok(StreamMark { event, _device: dev })
}

impl StreamMark {
    /// Seconds of device time from this mark to `end` (a later mark on the
    /// same device), once both are reached: waits for them.
    pub fn seconds_until(&self, end: &StreamMark) -> Result<f64> {
        let ms = self.event.elapsed_ms(&end.event).map_err(|e| driver_error("cuEventElapsedTime", e))?;
        Ok(f64::from(ms) / 1e3)
    }
}
