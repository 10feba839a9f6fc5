//! Reading an election's leader: once ([`read`]) or as a stream of changes ([`stream`]), the
//! latter from the client's one follow of the election (see `core::follow`).

use futures::Stream;
use tokio::sync::watch;

use crate::backend::Leader;
use crate::core::acquire::Target;
use crate::core::follow::{Published, Reading};
use crate::core::rules::validate_key;
use crate::error::Result;

/// Who leads the election `target` names now.
pub(super) async fn read(target: &Target) -> Result<Option<Leader>> {
    let core = &target.core;
    core.check_open()?;
    validate_key(&target.key)?;
    core.backend.validate_key(&target.key)?;
    core.backend
        .leader(&core.config.namespace, &target.key)
        .await
}

/// The leader now, then at every change: see [`Election::observe`](super::Election::observe).
pub(super) fn stream(
    target: Target,
) -> impl Stream<Item = Result<Option<Leader>>> + Send + 'static {
    let observer = Observer {
        closed: target.core.closed(),
        target,
        readings: None,
        seen: 0,
    };
    futures::stream::unfold(Some(observer), |observer| async move {
        let mut observer = observer?;
        let (item, go_on) = observer.next().await?;
        Some((item, go_on.then_some(observer)))
    })
}

/// One observer's place in its client's follow of the election.
struct Observer {
    target: Target,
    closed: watch::Receiver<bool>,
    /// The follow's readings, subscribed at the first item.
    readings: Option<watch::Receiver<Published>>,
    /// The number of the last reading yielded.
    seen: u64,
}

impl Observer {
    /// The next reading not yielded yet; `None` once the client shut down. Cancel safe: it
    /// only waits on the follow's channel.
    async fn next(&mut self) -> Option<Reading> {
        loop {
            if *self.closed.borrow() {
                return None;
            }
            let readings = match &mut self.readings {
                Some(readings) => readings,
                None => match self.target.core.followed.subscribe(&self.target) {
                    Ok(readings) => self.readings.insert(readings),
                    Err(e) => return Some((Err(e), false)),
                },
            };
            {
                let published = readings.borrow_and_update();
                if published.seq > self.seen {
                    self.seen = published.seq;
                    if let Some(reading) = &published.reading {
                        return Some(reading.clone());
                    }
                }
            }
            tokio::select! {
                changed = readings.changed() => {
                    if changed.is_err() {
                        // The follow ends first only with the client's runtime.
                        return match self.target.core.check_open() {
                            Err(e) if !self.target.core.is_closed() => Some((Err(e), false)),
                            _ if self.target.core.is_closed() => None,
                            _ => Some((Err(crate::error::Error::runtime_gone()), false)),
                        };
                    }
                }
                _ = self.closed.wait_for(|closed| *closed) => return None,
            }
        }
    }
}
