//! Compile-time behaviour of `#[distributed_lock]`: what compiles, and the spanned errors for
//! what does not (checked against tests/ui/fail/*.stderr; refresh with `TRYBUILD=overwrite`).
#![cfg(all(feature = "macros", feature = "memory"))]

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
