//! The lifetime brand at work: each file under compile_fail/ tries to let a
//! graph value escape or mix graphs, and must be rejected by the compiler
//! with the error recorded beside it.

#[test]
fn graph_values_cannot_escape() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile_fail/*.rs");
}
