//! A client that outlives the runtime it was built in (a client kept in a static across
//! `#[tokio::test]`s, each test its own runtime), and what its waiters must still hear from the
//! next runtime.

use std::future::Future;
use std::time::Duration;

use distlock::LockClient;
use tokio::time::Instant;

/// A client `build` makes in a runtime that is shut down before this returns: once the client
/// has locked and released a key there if `warm_up` (its connections and tasks started), or
/// before any call (its tasks perhaps not connected yet).
pub fn orphan<F>(build: impl FnOnce() -> F, warm_up: bool) -> LockClient
where
    F: Future<Output = LockClient>,
{
    let first = tokio::runtime::Runtime::new().unwrap();
    let c = first.block_on(async {
        let c = build().await;
        if warm_up {
            let g = c.mutex("orphaned-warm-up").lock().await.unwrap();
            g.release().await.unwrap();
        }
        c
    });
    drop(first);
    c
}

/// From a runtime other than the one `client` was built in: a lock of `key` is held and a
/// second one waits (`queued` resolves once it is queued); the holder releases after 1.5 s.
/// Checked: while the waiter waits, `listening` finds a connection of the client listening to
/// its channel, if the service can tell (the client's notification task, gone with its runtime,
/// runs again); the waiter is granted within 1 s of the release (a deaf one waits for the
/// client's TTL, or polls), with a higher token; the client shuts down.
pub async fn waiter_hears_its_grant<Q, L>(
    client: LockClient,
    key: &str,
    queued: impl FnOnce() -> Q,
    listening: Option<impl Fn() -> L>,
) where
    Q: Future<Output = ()>,
    L: Future<Output = bool>,
{
    let held = client.mutex(key).lock().await.unwrap();
    let waiter = client.mutex(key);
    let waiting = tokio::spawn(async move {
        let g = waiter.lock_timeout(Duration::from_secs(20)).await;
        (g, Instant::now())
    });
    queued().await;
    let began = Instant::now();
    let mut heard = false;
    if let Some(listening) = &listening {
        while !heard && began.elapsed() < Duration::from_secs(1) {
            heard = listening().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    tokio::time::sleep_until(began + Duration::from_millis(1500)).await;
    let token = held.fencing_token();
    held.release().await.unwrap();
    let released = Instant::now();
    let (granted, at) = waiting.await.unwrap();
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
