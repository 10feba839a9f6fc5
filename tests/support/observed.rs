//! An election's observer fed into a channel by a task (so it always waits when a change
//! comes), a wait for the item that passes a test, and a wait for a candidate to lead.

use std::time::Duration;

use distlock::{Leader, Leadership, LockClient};
use futures::StreamExt;
use tokio::task::JoinHandle;
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

/// A leader's value as text, if any leads and its value is text.
pub fn value_of(l: &Option<Leader>) -> Option<&str> {
    l.as_ref().and_then(Leader::value_str)
}

/// Reads items until one says `value` leads, within 3 s (see [`until`]).
pub async fn until_value(rx: &mut Items, value: &str) -> (Instant, Option<Leader>) {
    until(rx, Duration::from_secs(3), value, |l| {
        value_of(l) == Some(value)
    })
    .await
}

/// The lead of a candidate waiting in line (a spawned campaign), within `limit`; fails
/// saying `what` if it does not lead by then, or if its campaign fails.
pub async fn led_within(
    waiting: JoinHandle<distlock::Result<Leadership>>,
    limit: Duration,
    what: &str,
) -> Leadership {
    timeout(limit, waiting)
        .await
        .unwrap_or_else(|_| panic!("{what}"))
        .unwrap()
        .unwrap()
}
