//! Gives the shared library the soname cudarc asks for first for NCCL
//! (`libnccl.so`), so that cudarc's open by name finds the object the
//! switch opened by path.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so");
    println!("cargo:rerun-if-changed=build.rs");
}
