//! A Redis client that outlives the runtime it was built in (a client kept in a static across
//! `#[tokio::test]`s, each test its own runtime), used from the next runtime: the tasks it
//! started went with the first. The lanes' case is in `redis_lane_faults.rs` (and the attacks
//! on it in `redis_runtime_attacks.rs`); here, waiters and the client's shutdown.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::support::orphan::{waiter_hears_its_grant, waiter_outlives_its_hubs_runtime};
use crate::support::redis::{client, listening, orphaned_client, until_queued, unused_orphan};
use crate::support::release::{key_names, nothing_left};
use crate::support::server::redis::RedisServer;
use tokio::time::Instant;

/// Built in runtime A (then shut down), used from B, then from C: in each, a lock is held and a
/// second lock of the same key waits; the holder releases after 300 ms. The TTL is 10 s, so a
/// waiter that heard nothing would be granted only at the deadline it learned (about 10 s).
/// Checked: in each runtime the waiter is granted within 1 s of the release (about 0.2 ms here:
/// the pub/sub hub's task, gone with A, runs again), with a higher token; then, from a fourth runtime, the
/// client's shutdown ends within 5 s and nothing is left in the namespace. Before: the shutdown
/// waited forever for an answer from the renewal task, which had gone with the runtime it last
/// ran on.
#[test]
fn a_client_whose_runtime_is_gone_serves_its_waiters_and_shuts_down() {
    let ns = test_namespace!();
    let server = RedisServer::start();
    let url = server.url();
    let busy = orphaned_client(&url, &ns, Duration::from_secs(10));
    let mut late = Vec::new();
    for (round, key) in key_names(2).into_iter().enumerate() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let waited = runtime.block_on(async {
            let held = busy.mutex(key.clone()).lock().await.unwrap();
            let waiter = busy.mutex(key.clone());
            let waiting = tokio::spawn(async move {
                let g = waiter.lock_timeout(Duration::from_secs(20)).await;
                (g, Instant::now())
            });
            tokio::time::sleep(Duration::from_millis(300)).await;
            let token = held.fencing_token();
            held.release().await.unwrap();
            let released = Instant::now();
            let (granted, at) = waiting.await.unwrap();
            let granted = granted.unwrap();
            let next = granted.fencing_token();
            assert!(next > token, "round {round}: {next} after {token}");
            granted.release().await.unwrap();
            at.saturating_duration_since(released)
        });
        println!("round {round}: granted {waited:?} after the release");
        if waited > Duration::from_secs(1) {
            late.push(format!("round {round}: {waited:?}"));
        }
        drop(runtime);
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let shut = tokio::time::timeout(Duration::from_secs(5), busy.shutdown()).await;
        assert!(shut.is_ok(), "the client's shutdown did not end within 5 s");
        nothing_left(&url, &ns).await;
    });
    assert!(
        late.is_empty(),
        "waiters granted late after the release: {late:?}"
    );
}

/// `client`'s waiter hears its grant (see [`waiter_hears_its_grant`]).
async fn hears(url: &str, ns: &str, client: distlock::LockClient) {
    let key = "orphan-waits";
    waiter_hears_its_grant(
        client,
        key,
        || until_queued(url, ns, key, 1),
        Some(|| async { listening(url).await > 0 }),
    )
    .await;
}

/// The client's runtime ended before any call: its pub/sub connection may never have opened.
/// Before: the waiter waited 5 s for a connection nobody would open, then failed and tried
/// again after a pause, over and over.
#[test]
fn a_client_whose_runtime_ended_before_its_first_call_hears_its_grants() {
    let ns = test_namespace!();
    let server = RedisServer::start();
    let url = server.url();
    let client = unused_orphan(&url, &ns, Duration::from_secs(10));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(hears(&url, &ns, client));
}

/// The client's runtime ended after a lock: its pub/sub connection opened, then went with the
/// runtime. Before: the waiter's subscription failed on the dead connection, and it polled the
/// server after pauses growing to 2 s.
#[test]
fn a_client_whose_runtime_ended_after_a_lock_hears_its_grants() {
    let ns = test_namespace!();
    let server = RedisServer::start();
    let url = server.url();
    let client = orphaned_client(&url, &ns, Duration::from_secs(10));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(hears(&url, &ns, client));
}

/// The client is built in runtime A and kept there; a lock waits in B; then A shuts down,
/// taking the pub/sub task with it while the waiter waits. Before: nothing started the task
/// again, and the waiter heard nothing until the deadline it learned (about 10 s).
#[test]
fn a_waiter_outlives_the_runtime_of_its_pub_sub_task() {
    let ns = test_namespace!();
    let server = RedisServer::start();
    let url = server.url();
    let key = "orphan-waits";
    waiter_outlives_its_hubs_runtime(
        || {
            client(
                &url,
                &ns,
                Duration::from_secs(10),
                Duration::from_secs(2),
                true,
            )
        },
        key,
        || until_queued(&url, &ns, key, 1),
        Some(|| async { listening(&url).await > 0 }),
    );
}
