//! Lock nodes (the parents of claim nodes) are deleted once nobody here uses them.
//!
//! Parents are container nodes, which the server reaps once they empty, but only on its own
//! schedule (every minute by default): one per key ever locked would linger meanwhile, each
//! counting sequence numbers toward overflow. So a parent is deleted (with its empty ancestors
//! below the namespace) a short while after the last claim of this backend on it ends; the
//! pause keeps a hot key from paying a delete and a re-create per acquisition. A parent still
//! in use elsewhere refuses (`NotEmpty`), and an acquirer that finds its parent gone re-creates
//! it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use super::client::Session;
use super::session::SessionHub;
use crate::sync::LockExt;

/// How long an unused parent stays.
const LINGER: Duration = Duration::from_secs(1);

pub(super) struct Parents {
    hub: Arc<SessionHub>,
    in_use: StdMutex<HashMap<String, Use>>,
    closed: AtomicBool,
}

#[derive(Default)]
struct Use {
    claims: usize,
    generation: u64,
}

impl Parents {
    pub(super) fn new(hub: Arc<SessionHub>) -> Arc<Self> {
        Arc::new(Self {
            hub,
            in_use: StdMutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
        })
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Use>> {
        self.in_use.locked()
    }

    pub(super) fn enter(&self, path: &str) {
        let mut table = self.table();
        let entry = table.entry(path.to_owned()).or_default();
        entry.claims += 1;
        entry.generation += 1;
    }

    /// Ends one claim's use of `path`; the last one schedules the delete.
    pub(super) fn leave(self: &Arc<Self>, path: &str) {
        let generation = {
            let mut table = self.table();
            let Some(entry) = table.get_mut(path) else {
                return;
            };
            entry.claims = entry.claims.saturating_sub(1);
            if entry.claims > 0 {
                return;
            }
            entry.generation
        };
        let (this, path) = (self.clone(), path.to_owned());
        tokio::spawn(async move {
            tokio::time::sleep(LINGER).await;
            if this.closed.load(Ordering::Acquire) || !this.take_if_idle(&path, generation) {
                return;
            }
            this.delete_upward(&path).await;
        });
    }

    fn take_if_idle(&self, path: &str, generation: u64) -> bool {
        let mut table = self.table();
        let idle = table
            .get(path)
            .is_some_and(|e| e.claims == 0 && e.generation == generation);
        if idle {
            table.remove(path);
        }
        idle
    }

    /// Deletes every parent this backend used, now: called by `shutdown` after our own nodes
    /// were deleted and before the session closes. A claim still counted here (a waiter whose
    /// release had not run yet) has no node left either; a parent others still use refuses.
    pub(super) async fn flush(&self) {
        self.closed.store(true, Ordering::Release);
        let all: Vec<String> = self.table().drain().map(|(p, _)| p).collect();
        for path in all {
            self.delete_upward(&path).await;
        }
    }

    /// Deletes `path`, then each ancestor that became empty, stopping below the namespace node
    /// and at the first that is not empty (or not there). Skipped while disconnected: the
    /// server reaps empty containers on its own.
    async fn delete_upward(&self, path: &str) {
        let Some(up) = self.hub.current() else {
            return;
        };
        delete_upward(&up.zk, path).await;
    }
}

async fn delete_upward(zk: &Session, path: &str) {
    let mut at = path;
    while at.rfind('/').is_some_and(|i| i > 0) {
        if zk.delete(at).await.is_err() {
            return;
        }
        at = &at[..at.rfind('/').unwrap_or(0)];
    }
}
