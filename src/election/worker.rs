//! [`lead`]: the background-worker shape, run a piece of work only while leading.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep, Instant};

use super::Election;
use crate::error::Result;

/// The first and the longest pause before campaigning again after a term ended early (lost),
/// or after the service could not be reached.
const MIN_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// See [`Election::lead`].
pub(super) async fn lead<F, Fut, T>(election: &Election, value: Arc<[u8]>, mut work: F) -> Result<T>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = T>,
{
    let mut pause = MIN_PAUSE;
    loop {
        let leading = match election.campaign(&value).await {
            Ok(leading) => leading,
            Err(e) if e.is_transient() => {
                tracing::warn!(election = election.name(), error = %e, ?pause, "campaign failed, trying again");
                sleep(pause).await;
                pause = (pause * 2).min(MAX_PAUSE);
                continue;
            }
            Err(e) => return Err(e),
        };
        let (term, since) = (leading.term(), Instant::now());
        tracing::debug!(election = election.name(), term, "leading");
        // Biased, loss first: a leader that resumes past its lease (a paused process) must
        // not poll the work again, though its timers fired too.
        tokio::select! {
            biased;
            () = leading.lost() => {
                tracing::warn!(election = election.name(), term, "leadership lost: the work was stopped");
            }
            out = work(term) => {
                if let Err(e) = leading.resign().await {
                    tracing::warn!(election = election.name(), term, error = %e, "resigning after the work finished");
                }
                return Ok(out);
            }
        }
        drop(leading);
        // A term that lasted a lease or longer was no flapping: start the pauses afresh.
        if since.elapsed() >= election.target.ttl() {
            pause = MIN_PAUSE;
        }
        sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}
