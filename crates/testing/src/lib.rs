//! Test support shared by tapir's crates: [`test_device!`] turns one test
//! body taking a device into a test on the CPU and a test on CUDA device 0.
//!
//! The CUDA variant is named `<name>::cuda` (CI selects the CUDA tests by
//! `cuda` in their names) and the CPU one `<name>::cpu`.
//!
//! Which CUDA variants run is decided when the tests are built, so that a
//! test run's summary counts as passed only what ran:
//!
//! - built with no device asked for (neither `TAPIR_CUDA` nor
//!   `TAPIR_REQUIRE_CUDA=1` set, as in a plain `cargo test`), every CUDA
//!   variant is `#[ignore]`d, with the reason; the summary's "ignored"
//!   count says how many did not run, and `-- --include-ignored` runs them
//!   anyway;
//! - built with `TAPIR_CUDA` set (`emulated` selects the emulated device)
//!   or `TAPIR_REQUIRE_CUDA=1`, they run; one that finds no device then
//!   prints a line saying it skipped and why, and passes, except under
//!   `TAPIR_REQUIRE_CUDA=1`, where the skip is a failure, so a run that is
//!   meant to reach a device (CI on the emulated one, a machine with a GPU)
//!   cannot pass without it.
//!
//! Changing either variable rebuilds the tests that use the macro (the
//! build script of tapir-testing-macros watches both). A test written out
//! by hand that needs a device is marked [`macro@cuda_test`] instead of
//! `#[test]`, with the same effect.
//!
//! ```
//! use tapir_tensor::prelude::*;
//! use tapir_testing::test_device;
//!
//! test_device! {
//!     /// exp(0) is 1 wherever it runs.
//!     fn exp_of_zero_is_one(device: Device) -> Result<()> {
//!         let x = Tensor::zeros_on([3], DType::F32, device)?;
//!         assert_eq!(x.exp()?.to_vec::<f32>()?, vec![1.0; 3]);
//!         Ok(())
//!     }
//! }
//! # fn main() {
//! #     // A doctest compiles no #[test]: run the body itself.
//! #     exp_of_zero_is_one::body(Device::Cpu).unwrap();
//! # }
//! ```
//!
//! The body is an ordinary function, `<name>::body`, inside a module named
//! after the test, which sees everything of the file that uses the macro
//! (`use super::*`).
//! The expansion names `::tapir_tensor::Device`, so the crate using it must
//! depend on tapir-tensor (every tapir crate does); this crate itself
//! depends on nothing, so the tensor crate's tests use it without a cycle.
#![deny(missing_docs)]

use std::fmt::Display;

/// True when `TAPIR_REQUIRE_CUDA=1`: a CUDA test that cannot find a device
/// must fail rather than skip.
pub fn cuda_required() -> bool {
    std::env::var("TAPIR_REQUIRE_CUDA").is_ok_and(|v| v == "1")
}

/// The device of `opened` (the result of `Device::cuda(0)`), or `None`
/// after printing that `test` skips and why.
///
/// # Panics
///
/// When there is no device and [`cuda_required`] holds: the skip is then
/// the failure the run asked for.
pub fn cuda_or_skip<D, E: Display>(test: &str, opened: Result<D, E>) -> Option<D> {
    match opened {
        Ok(device) => Some(device),
        Err(e) if cuda_required() => panic!("{test}: TAPIR_REQUIRE_CUDA=1 but no CUDA device: {e}"),
        Err(e) => {
            println!("{test}: skipped, no CUDA device ({e}); TAPIR_REQUIRE_CUDA=1 makes this a failure");
            None
        }
    }
}

/// What a skipped test returns: `()` for a test without a result, `Ok(())`
/// for one returning `Result<(), E>`.
pub trait Skipped {
    /// The passing value of a test that did not run.
    fn skipped() -> Self;
}

impl Skipped for () {
    fn skipped() -> Self {}
}

impl<E> Skipped for Result<(), E> {
    fn skipped() -> Self {
        Ok(())
    }
}

/// Asserts that `got` equals `want` element by element within
/// `tol * (1 + |want|)`, naming `what` and the first position that differs.
///
/// # Panics
///
/// When the lengths differ or an element is out of tolerance (NaN never
/// matches).
#[track_caller]
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: {} values, expected {}", got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        // Written so that a NaN on either side fails.
        let ok = (g - w).abs() <= tol * (1.0 + w.abs());
        assert!(ok, "{what}: at {i}, {g} vs {w} (tolerance {tol})");
    }
}

/// Runs one test body on every device: defines a module named after the
/// test holding the body and two `#[test]`s, `cpu` on `Device::Cpu` and
/// `cuda` on CUDA device 0 (skipped with a printed line when there is no
/// device, a failure then under `TAPIR_REQUIRE_CUDA=1`).
///
/// Each test is written as a function of one device argument, optionally
/// returning a `Result<(), E>` (any `E: Debug`, as a `#[test]` may return);
/// attributes and doc comments before it apply to both tests. Several
/// functions may go in one invocation.
///
/// ```
/// use tapir_tensor::prelude::*;
///
/// tapir_testing::test_device! {
///     fn ones_are_ones(device: Device) -> Result<()> {
///         assert_eq!(Tensor::ones_on([2], DType::F64, device)?.to_vec::<f64>()?, vec![1.0; 2]);
///         Ok(())
///     }
///     /// No result: a failed assertion is the failure.
///     fn zeros_are_zeros(device: Device) {
///         let z = Tensor::zeros_on([3], DType::I64, device).expect("alloc");
///         assert_eq!((z.device(), z.to_vec::<i64>().expect("values")), (device, vec![0; 3]));
///     }
/// }
/// # fn main() {
/// #     ones_are_ones::body(Device::Cpu).unwrap();
/// #     zeros_are_zeros::body(Device::Cpu);
/// # }
/// ```
#[macro_export]
macro_rules! test_device {
    ($(
        $(#[$meta:meta])*
        fn $name:ident($device:ident : $ty:ty) $(-> $ret:ty)? $body:block
    )*) => {
        $(
            mod $name {
                #[allow(unused_imports)]
                use super::*;

                /// The test's body, which both tests run.
                #[allow(dead_code)]
                pub(super) fn body($device: $ty) $(-> $ret)? $body

                $(#[$meta])*
                #[test]
                fn cpu() $(-> $ret)? {
                    body(::tapir_tensor::Device::Cpu)
                }

                $(#[$meta])*
                #[$crate::cuda_test]
                fn cuda() $(-> $ret)? {
                    let test = concat!(module_path!(), "::cuda");
                    match $crate::cuda_or_skip(test, ::tapir_tensor::Device::cuda(0)) {
                        Some(device) => body(device),
                        None => $crate::Skipped::skipped(),
                    }
                }
            }
        )*
    };
}

/// `#[test]` for a test that needs a CUDA device: also `#[ignore]`d, with
/// the reason, when the tests were built without a device asked for (see
/// the crate docs). The body still finds its device itself, with
/// [`cuda_or_skip`]; the CUDA variant of [`test_device!`] is such a test.
///
/// ```
/// use tapir_tensor::Device;
///
/// #[tapir_testing::cuda_test]
/// fn cuda_device_zero_opens() {
///     let Some(d) = tapir_testing::cuda_or_skip("cuda_device_zero_opens", Device::cuda(0)) else { return };
///     assert!(!d.is_cpu());
/// }
/// # fn main() {}
/// ```
pub use tapir_testing_macros::cuda_test;

#[cfg(test)]
mod tests {
    use super::{assert_close, cuda_or_skip, Skipped};

    #[test]
    fn a_device_that_opened_is_handed_over() {
        assert_eq!(cuda_or_skip::<u8, String>("t", Ok(7)), Some(7));
    }

    #[test]
    fn a_skip_passes_unless_a_device_is_required() {
        let missing: Result<u8, String> = Err("no driver".into());
        if super::cuda_required() {
            let r = std::panic::catch_unwind(|| cuda_or_skip("t", missing));
            assert!(r.is_err(), "TAPIR_REQUIRE_CUDA=1 turns the skip into a failure");
        } else {
            assert_eq!(cuda_or_skip("t", missing), None);
        }
        assert_eq!(<Result<(), String>>::skipped(), Ok(()));
    }

    #[test]
    fn close_values_pass_and_far_or_nan_values_fail() {
        assert_close("same", &[1.0, -2.0], &[1.0 + 1e-13, -2.0], 1e-12);
        for bad in [[1.1, -2.0], [f64::NAN, -2.0]] {
            let r = std::panic::catch_unwind(|| assert_close("far", &bad, &[1.0, -2.0], 1e-12));
            assert!(r.is_err(), "{bad:?}");
        }
    }
}
