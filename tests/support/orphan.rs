//! A client that outlives the runtime it was built in (a client kept in a static across
//! `#[tokio::test]`s, each test its own runtime), and what its waiters must still hear from
//! another runtime.

use std::future::Future;
use std::time::Duration;

use distlock::{LockClient, MutexGuard};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A client `build` makes in a runtime that is shut down before this returns: once the client
/// has locked and released a key there if `warm_up` (its connections and tasks started), or
/// before any call (its tasks perhaps not connected yet).
pub fn orphan<F>(build: impl FnOnce() -> F, warm_up: bool) -> LockClient
where
    F: Future<Output = LockClient>,
{
    let first = tokio::runtime::Runtime::new().unwrap();
    let c = first.block_on(built(build, warm_up));
    drop(first);
    c
}

async fn built<F>(build: impl FnOnce() -> F, warm_up: bool) -> LockClient
where
    F: Future<Output = LockClient>,
{
    let c = build().await;
    if warm_up {
        let g = c
            .mutex("orphaned-warm-up")
            .lock_timeout(Duration::from_secs(10))
            .await
            .unwrap();
        g.release().await.unwrap();
    }
    c
}

/// A lock of a key held, and a task waiting for a second lock of it.
pub struct OneWaits {
    held: MutexGuard,
    waiting: JoinHandle<(distlock::Result<MutexGuard>, Instant)>,
}

impl OneWaits {
    /// The held lock, and the waiting task (it returns its outcome and when it ended).
    pub fn into_parts(
        self,
    ) -> (
        MutexGuard,
        JoinHandle<(distlock::Result<MutexGuard>, Instant)>,
    ) {
        (self.held, self.waiting)
    }
}

/// Holds a lock of `key` and starts a second one waiting for it; `queued` resolves once it is
/// queued.
pub async fn one_waits<Q>(client: &LockClient, key: &str, queued: impl FnOnce() -> Q) -> OneWaits
where
    Q: Future<Output = ()>,
{
    let held = client
        .mutex(key)
        .lock_timeout(Duration::from_secs(10))
        .await
        .unwrap();
    let waiter = client.mutex(key);
    let waiting = tokio::spawn(async move {
        let g = waiter.lock_timeout(Duration::from_secs(20)).await;
        (g, Instant::now())
    });
    queued().await;
    OneWaits { held, waiting }
}

/// The holder releases 1.5 s from now. Checked: meanwhile `listening` finds a connection of
/// `client` listening to its channel, if the service can tell (the client's notification
/// task, gone with its runtime, runs again); the waiter is granted within 1 s of the release
/// (a deaf one waits for the client's TTL, or polls), with a higher token; the client shuts
/// down.
pub async fn hears<L>(w: OneWaits, client: LockClient, listening: Option<impl Fn() -> L>)
where
    L: Future<Output = bool>,
{
    let began = Instant::now();
    let mut heard = false;
    if let Some(listening) = &listening {
        while !heard && began.elapsed() < Duration::from_secs(1) {
            heard = listening().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    tokio::time::sleep_until(began + Duration::from_millis(1500)).await;
    let token = w.held.fencing_token();
    w.held.release().await.unwrap();
    let released = Instant::now();
    let (granted, at) = w.waiting.await.unwrap();
    let granted = granted.unwrap();
    let waited = at.saturating_duration_since(released);
    assert!(granted.fencing_token() > token);
    granted.release().await.unwrap();
    assert!(
        heard || listening.is_none(),
        "no connection of the client listened while its waiter waited"
    );
    assert!(
        waited < Duration::from_secs(1),
        "the waiter was granted {waited:?} after the release"
    );
    tokio::time::timeout(Duration::from_secs(5), client.shutdown())
        .await
        .expect("the client's shutdown did not end within 5 s");
}

/// From a runtime other than the one `client` was built in, one lock of `key` waits for
/// another (see [`one_waits`]), and its waiter hears its grant (see [`hears`]).
pub async fn waiter_hears_its_grant<Q, L>(
    client: LockClient,
    key: &str,
    queued: impl FnOnce() -> Q,
    listening: Option<impl Fn() -> L>,
) where
    Q: Future<Output = ()>,
    L: Future<Output = bool>,
{
    let w = one_waits(&client, key, queued).await;
    hears(w, client, listening).await;
}

/// A client `build` makes (and warms up) in runtime A, which is kept; in runtime B, one lock
/// of `key` waits for another (see [`one_waits`]); then A shuts down, taking the client's
/// notification task with it while the waiter waits, and the waiter must still hear its grant
/// (see [`hears`]).
pub fn waiter_outlives_its_hubs_runtime<F, Q, L>(
    build: impl FnOnce() -> F,
    key: &str,
    queued: impl FnOnce() -> Q,
    listening: Option<impl Fn() -> L>,
) where
    F: Future<Output = LockClient>,
    Q: Future<Output = ()>,
    L: Future<Output = bool>,
{
    let first = tokio::runtime::Runtime::new().unwrap();
    let client = first.block_on(built(build, true));
    let second = tokio::runtime::Runtime::new().unwrap();
    let w = second.block_on(one_waits(&client, key, queued));
    drop(first);
    second.block_on(hears(w, client, listening));
}
