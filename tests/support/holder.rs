//! A lock holder in a separate process (this same test binary, re-run for one test), so a test
//! can kill it with SIGKILL the way a crashed replica dies.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The child's side: tell the parent the lock is held (with its fencing token), then hold it
/// until killed.
pub async fn report_and_hold(fence: u64) -> ! {
    println!("HOLDING {fence}");
    std::future::pending::<()>().await;
    unreachable!()
}

/// Re-runs test `test` of this binary (its path there: `module::name`) with `env=spec` (the child branch of the test), waits
/// until it holds the lock, and returns it with its fencing token.
pub async fn spawn(test: &str, env: &str, spec: String) -> (Child, u64) {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", test, "--nocapture"])
        .env(env, spec)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the holder process");
    let stdout = child.stdout.take().expect("holder stdout");
    let fence = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("HOLDING ").and_then(|f| f.parse().ok()))
    })
    .await
    .expect("reader task")
    .expect("the holder process never reported holding the lock");
    (child, fence)
}

/// SIGKILLs the holder and returns what `waiter` got, with how long after the kill it got it.
/// Panics if the waiter is not granted within `limit`.
pub async fn kill_and_await<G>(
    mut child: Child,
    waiter: tokio::task::JoinHandle<distlock::Result<G>>,
    limit: Duration,
) -> (G, Duration) {
    child.kill().expect("SIGKILL the holder");
    let killed = Instant::now();
    child.wait().expect("reap the holder");
    let guard = tokio::time::timeout(limit, waiter)
        .await
        .expect("the lock of a killed holder was never freed")
        .expect("waiter task")
        .expect("waiter lock()");
    (guard, killed.elapsed())
}
