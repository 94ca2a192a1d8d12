//! Gives the shared library the soname cudarc asks for first (`libcuda.so`),
//! so that once the switch has opened it by path, cudarc's later open by
//! name returns the same object instead of searching the disk.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so");
    println!("cargo:rerun-if-changed=build.rs");
}
