//! An election's observer fed into a channel by a task (so it always waits when a change
//! comes), and a wait for the item that passes a test.

use std::time::Duration;

use distlock::{Leader, LockClient};
use futures::StreamExt;
use tokio::time::{timeout, Instant};

/// What an observer yielded, with when.
pub type Items = tokio::sync::mpsc::UnboundedReceiver<(Instant, distlock::Result<Option<Leader>>)>;

/// Items of an observer, fed by a task (so it always waits when a change comes).
pub fn observer(client: &LockClient, name: &str) -> (Items, tokio::task::JoinHandle<()>) {
    let changes = client.election(name).observe();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut changes = Box::pin(changes);
        while let Some(item) = changes.next().await {
            if tx.send((Instant::now(), item)).is_err() {
                return;
            }
        }
    });
    (rx, task)
}

/// Reads items until one (not an error) passes `want`, within `limit`.
pub async fn until(
    rx: &mut Items,
    limit: Duration,
    what: &str,
    want: impl Fn(&Option<Leader>) -> bool,
) -> (Instant, Option<Leader>) {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (at, item) = timeout(left, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("the observer never saw {what} within {limit:?}"))
            .expect("the stream ended");
        match item {
            Ok(now) if want(&now) => return (at, now),
            Ok(_) => {}
            Err(e) => println!("observer error (going on): {e}"),
        }
    }
}
