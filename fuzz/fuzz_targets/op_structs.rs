//! Op structs with arbitrary fields and input counts through
//! `Diff::apply`; see `tests/support/fuzz_op_structs.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/support/fuzz_program.rs"]
mod fuzz_program;
#[path = "../../tests/support/fuzz_op_structs.rs"]
mod fuzz_op_structs;

fuzz_target!(|c: fuzz_op_structs::Case| {
    fuzz_op_structs::check(&c);
});
