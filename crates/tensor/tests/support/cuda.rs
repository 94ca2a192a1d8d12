//! The CUDA device for the CUDA tests of this crate, or `None` after the
//! test says why it skips; `TAPIR_REQUIRE_CUDA=1` makes the skip a failure.

use tapir_tensor::Device;

/// The CUDA device, or `None` after saying why the test skips.
pub fn cuda(test: &str) -> Option<Device> {
    match Device::cuda(0) {
        Ok(d) => Some(d),
        Err(e) if std::env::var("TAPIR_REQUIRE_CUDA").is_ok_and(|v| v == "1") => {
            panic!("{test}: TAPIR_REQUIRE_CUDA=1 but no CUDA device: {e}")
        }
        Err(e) => {
            println!("{test}: skipped, no CUDA device ({e})");
            None
        }
    }
}
