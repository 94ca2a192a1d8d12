//! Random op programs, eager against recorded, with every derivative mode;
//! see `tests/support/fuzz_program.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/support/fuzz_program.rs"]
mod fuzz_program;

fuzz_target!(|p: fuzz_program::Program| {
    fuzz_program::check(&p);
});
