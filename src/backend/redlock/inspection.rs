//! What a lock looks like across the nodes: the claim holding a majority of them (if one does)
//! and the claims queued on any of them, by priority.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::quorum::held_until;
use crate::backend::{Family, LockKind};
use crate::inspect::{Holder, Inspection, Waiter};

/// One node's answer to the inspect script.
pub(super) struct NodeView {
    /// Owner, fencing token and lease left, if somebody holds the lock there.
    holder: Option<(String, u64, Duration)>,
    /// Live waiters there: owner and priority (the waiter's clock in µs when it first asked).
    waiting: Vec<(String, u64)>,
}

/// The inspect script's reply: holder fields, then waiters as owner, priority pairs.
pub(super) type Reply = (Vec<String>, Vec<String>);

impl NodeView {
    pub(super) fn parse((holder, waiting): Reply) -> Self {
        let holder = match holder.as_slice() {
            [owner, fence, left] => Some((
                owner.clone(),
                fence.parse().unwrap_or(0),
                Duration::from_millis(left.parse().unwrap_or(0)),
            )),
            _ => None,
        };
        let waiting = waiting
            .chunks(2)
            .filter_map(|pair| match pair {
                // Scores come back as decimal numbers; priorities are integers below 2^53.
                [owner, score] => score.parse::<f64>().ok().map(|p| (owner.clone(), p as u64)),
                _ => None,
            })
            .collect();
        Self { holder, waiting }
    }
}

/// Merges the views of the nodes that answered (each with when it was asked): the holder is
/// the claim that holds at least `quorum` of them, with the largest token among them and the
/// lease its majority keeps; waiters are every live claim queued on any node, by priority.
pub(super) fn merge(key: &str, quorum: usize, views: Vec<(NodeView, Instant)>) -> Inspection {
    let mut holds: BTreeMap<String, (u64, Vec<Instant>)> = BTreeMap::new();
    let mut waiting: BTreeMap<String, u64> = BTreeMap::new();
    for (view, sent) in views {
        if let Some((owner, fence, left)) = view.holder {
            let entry = holds.entry(owner).or_default();
            entry.0 = entry.0.max(fence);
            entry.1.push(sent + left);
        }
        for (owner, priority) in view.waiting {
            let p = waiting.entry(owner).or_insert(priority);
            *p = (*p).min(priority);
        }
    }
    let mut seen = Inspection::free(key);
    let now = Instant::now();
    for (owner, (fence, deadlines)) in holds {
        let Some(until) = held_until(deadlines, quorum) else {
            continue;
        };
        waiting.remove(&owner);
        seen.holders.push(Holder {
            kind: LockKind::Exclusive,
            fencing_token: Some(fence),
            lease_left: Some(until.saturating_duration_since(now)),
        });
    }
    let wall_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let mut queued: Vec<(u64, String)> = waiting.into_iter().map(|(o, p)| (p, o)).collect();
    queued.sort();
    for (priority, _) in queued {
        seen.waiters.push(Waiter {
            kind: LockKind::Exclusive,
            waited: Some(Duration::from_micros(wall_us.saturating_sub(priority))),
        });
    }
    if !seen.is_free() {
        seen.family = Some(Family::Mutex);
    }
    seen
}
