//! Checkpoint loading from corrupted and truncated files; see
//! `tests/support/fuzz_checkpoint.rs`.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/support/fuzz_checkpoint.rs"]
mod fuzz_checkpoint;

static BASE: OnceLock<(std::path::PathBuf, Vec<u8>, Vec<u8>)> = OnceLock::new();

fuzz_target!(|c: fuzz_checkpoint::Case| {
    let (dir, plain, with_optim) = BASE.get_or_init(|| {
        let dir = fuzz_checkpoint::scratch_dir();
        let plain = fuzz_checkpoint::valid_bytes(false, &dir);
        let with_optim = fuzz_checkpoint::valid_bytes(true, &dir);
        (dir, plain, with_optim)
    });
    fuzz_checkpoint::check(&c, if c.with_optim { with_optim } else { plain }, dir);
});
