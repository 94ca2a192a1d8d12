//! Every kernel of kernels/, as NVRTC compiles it, decodes without an
//! instruction the interpreter lacks.

mod common;

use tapir_cuda_emu::ptx;
use tapir_tensor::cuda::{cached_ptx, DEFAULT_ARCH, KERNELS};

#[test]
fn every_kernel_decodes_with_no_unsupported_opcode() {
    if !common::nvrtc_or_skip("every_kernel_decodes_with_no_unsupported_opcode") {
        return;
    }
    let mut missing = Vec::new();
    let mut entries = 0;
    for (name, _) in KERNELS {
        for arch in [DEFAULT_ARCH, "compute_90"] {
            let src = cached_ptx(name, arch).expect("kernels compile (tests/nvrtc_kernels.rs checks this too)");
            let m = ptx::load(&src, &|g| (0..g.len() as u64).map(|k| 0x7f00_0000_0000 + k * 4096).collect())
                .unwrap_or_else(|e| panic!("{name} ({arch}): {e}"));
            entries += m.funcs.iter().filter(|f| f.entry).count();
            for op in m.unsupported {
                missing.push(format!("{name} ({arch}): {op}"));
            }
        }
    }
    println!("{entries} entries decoded");
    assert!(entries >= 2 * 265, "only {entries} entries");
    assert!(missing.is_empty(), "opcodes the interpreter lacks:\n{}", missing.join("\n"));
}
