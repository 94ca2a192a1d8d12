//! Decides, when the tests are built, whether their CUDA variants run or
//! show as ignored: `tapir_cuda_selected` is set when the build asks for a
//! device (`TAPIR_CUDA` set, e.g. `emulated`, or `TAPIR_REQUIRE_CUDA=1`).
//! `#[ignore]` is an attribute, so the choice is made here, once, and the
//! crates whose tests use `test_device!` rebuild those tests when either
//! variable changes.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(tapir_cuda_selected)");
    println!("cargo::rerun-if-env-changed=TAPIR_CUDA");
    println!("cargo::rerun-if-env-changed=TAPIR_REQUIRE_CUDA");
    println!("cargo::rerun-if-changed=build.rs");
    let cuda = std::env::var("TAPIR_CUDA").is_ok_and(|v| !v.is_empty());
    let required = std::env::var("TAPIR_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    if cuda || required {
        println!("cargo::rustc-cfg=tapir_cuda_selected");
    }
}
