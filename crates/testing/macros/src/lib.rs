//! `#[cuda_test]`, re-exported by tapir-testing: `#[test]` for a test that
//! needs a CUDA device, also `#[ignore]`d (with the reason) when the tests
//! were built without a device asked for. See tapir-testing's docs.
//!
//! The decision is made when this crate is built: its build script sets
//! `tapir_cuda_selected` from `TAPIR_CUDA` and `TAPIR_REQUIRE_CUDA` and
//! watches both, so changing either rebuilds this crate and with it every
//! test that uses the attribute.
#![deny(missing_docs)]

use proc_macro::TokenStream;

/// What an ignored CUDA test shows as its reason.
const REASON: &str = "CUDA test: no device selected when built; set TAPIR_CUDA=emulated (the emulated device) or \
                      TAPIR_REQUIRE_CUDA=1 (a GPU), or pass --include-ignored";

/// Marks a test function as a CUDA test: `#[test]`, plus `#[ignore =
/// "..."]` when no device was asked for at build time. The body still
/// finds its device itself (`tapir_testing::cuda_or_skip`).
#[proc_macro_attribute]
pub fn cuda_test(args: TokenStream, item: TokenStream) -> TokenStream {
    if !args.is_empty() {
        return r##"compile_error!("#[cuda_test] takes no arguments");"##.parse().expect("internal: a compile_error");
    }
    let attrs =
        if cfg!(tapir_cuda_selected) { "#[test]".to_string() } else { format!("#[test] #[ignore = {REASON:?}]") };
    let mut out: TokenStream = attrs.parse().expect("internal: the attributes parse");
    out.extend(item);
    out
}
