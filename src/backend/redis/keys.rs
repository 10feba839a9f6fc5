//! The names of one lock's keys and channels, and a claim's owner token: one layout for a single
//! server, a Cluster and every Redlock node.

use std::time::Duration;

use crate::backend::wire;
use crate::backend::{Claim, LockKind};

/// The names of one lock's keys and channels, and a claim's owner token, as one client sees
/// them (on one server, a Cluster, and each Redlock node alike).
pub(crate) struct Keys {
    pub(crate) lock: String,
    /// Read-write locks and semaphores: holder -> lease deadline.
    pub(crate) holders: String,
    pub(crate) queue: String,
    pub(crate) waiters: String,
    pub(crate) fence: String,
    /// Every client's channel for this lock starts with this; the client id follows.
    pub(crate) channels: String,
    /// This client's channel for this lock.
    pub(crate) channel: String,
    /// The claim's owner token: `<client id>.<claim owner>`, or `<client id>.l<claim owner>`
    /// for an election's candidate (see [`claim_token`]).
    pub(crate) owner: String,
}

/// A claim's part of its owner token: its owner (a UUID), behind an `l` for an election's
/// candidate. Mutex waiters and candidates wait in one kind of queue; the server-side code
/// tells them apart by this (`is_candidate` in the scripts), so a free key with a queue is
/// its first entry's kind, and a mutex never takes a key a candidate waits for, nor the other
/// way round.
pub(crate) fn claim_token(claim: &Claim) -> std::borrow::Cow<'_, str> {
    if claim.kind() == LockKind::Leader {
        format!("l{}", claim.owner()).into()
    } else {
        claim.owner().into()
    }
}

impl Keys {
    pub(super) fn new(claim: &Claim, client_id: &str) -> Self {
        Self::named(
            claim.namespace(),
            claim.key(),
            client_id,
            &claim_token(claim),
        )
    }

    pub(super) fn named(namespace: &str, key: &str, client_id: &str, claim_owner: &str) -> Self {
        Self::layout(namespace, key, client_id, claim_owner, "q", "w")
    }

    /// The names, with the queue and waiters keys ending in `queue` and `waiters` (Redlock
    /// keeps its queues, zsets by priority, under names of their own).
    pub(crate) fn layout(
        namespace: &str,
        key: &str,
        client_id: &str,
        claim_owner: &str,
        queue: &str,
        waiters: &str,
    ) -> Self {
        // Namespaces hold no braces or colons, so `<ns>:{` starts every name, and every name
        // of one key shares its hash tag. Suffixes end in distinct letters, and lock names end
        // in `}`, so no two keys' names can coincide.
        let lock = lock_name(namespace, key);
        let channels = format!("{lock}:c:");
        Self {
            holders: format!("{lock}:h"),
            queue: format!("{lock}:{queue}"),
            waiters: format!("{lock}:{waiters}"),
            fence: format!("{lock}:fence"),
            channel: format!("{channels}{client_id}"),
            channels,
            owner: wire::owner_token(client_id, claim_owner),
            lock,
        }
    }
}

/// The name of a lock's main key, `<ns>:{<key>}`: every other name of the lock starts with it.
pub(crate) fn lock_name(namespace: &str, key: &str) -> String {
    format!("{namespace}:{{{key}}}")
}

/// A duration in whole milliseconds for a script argument, at least 1.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A claim's kind as the scripts write it in queue entries and holder lists: `r` and `w` for
/// a read-write lock's sides, the permit count for a semaphore; `None` for a mutex (its entries
/// carry the bare owner token, and the scripts report its holder as `x`).
pub(crate) fn kind_code(kind: LockKind) -> Option<String> {
    match kind {
        LockKind::Read => Some("r".to_owned()),
        LockKind::Write => Some("w".to_owned()),
        LockKind::Permits { count, .. } => Some(count.to_string()),
        _ => None,
    }
}

/// A kind as [`kind_code`] writes it (`x` for a mutex), with `max` the semaphore's permits.
pub(crate) fn kind_of_code(code: &str, max: u32) -> Option<LockKind> {
    Some(match code {
        "x" => LockKind::Exclusive,
        "l" => LockKind::Leader,
        "r" => LockKind::Read,
        "w" => LockKind::Write,
        n => LockKind::Permits {
            count: n.parse().ok()?,
            max,
        },
    })
}
