//! The `distlock` command line, run from a test against the test's own servers.

/// Runs `distlock --url <url> --namespace <ns> <args>` (blocking this runtime worker, not the
/// others), prints what it said, and returns its exit code.
pub fn distlock(url: &str, ns: &str, args: &[&str]) -> Option<i32> {
    let out = tokio::task::block_in_place(|| {
        // `option_env!`: the examples and benchmarks that include tests/support have no such
        // variable (there the binary is looked for on the PATH).
        let bin = option_env!("CARGO_BIN_EXE_distlock").unwrap_or("distlock");
        std::process::Command::new(bin)
            .args(["--url", url, "--namespace", ns])
            .args(args)
            .output()
            .unwrap()
    });
    println!(
        "$ distlock {} -> {}\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.status.code()
}
