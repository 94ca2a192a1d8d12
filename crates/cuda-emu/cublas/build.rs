//! Gives the shared library the soname cudarc asks for first for cuBLAS
//! (`libcublas.so`), so that cudarc's open by name finds the object the
//! switch opened by path.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcublas.so");
    println!("cargo:rerun-if-changed=build.rs");
}
