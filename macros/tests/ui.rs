//! Compile-time behaviour of `#[distributed_lock]`: what compiles, and the spanned errors for
//! what does not (checked against tests/ui/fail/*.stderr; refresh with `TRYBUILD=overwrite`).
//! Here, not beside the crate's other tests: trybuild builds its cases against this crate's
//! dev-dependencies (distlock with the memory backend and the macro), not against the whole
//! test suite's (every backend, axum, the test support), which took three minutes of CI.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
