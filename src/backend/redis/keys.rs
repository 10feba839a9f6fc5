//! The names of one lock's keys and channels, and a claim's owner token: one layout for a single
//! server, a Cluster and every Redlock node, but for the fencing counter (`Counter`: one per
//! namespace on a single server, one per lock elsewhere) and Redlock's own queue names.

use std::time::Duration;

use crate::backend::wire;
use crate::backend::{Claim, LockKind};

/// The names of one lock's keys and channels, and a claim's owner token, as one client sees
/// them (on one server, a Cluster, and each Redlock node alike).
///
/// Every name is kept in one string, one after another (a claim names its keys once, and a
/// busy service names many: one allocation, not eight).
pub(crate) struct Keys {
    text: String,
    /// Where each name ends in `text`, in the order of [`Name`]; each starts where the one
    /// before ends.
    ends: [usize; NAMES],
}

/// The names a [`Keys`] holds, in the order they are laid out.
#[derive(Clone, Copy)]
enum Name {
    Lock,
    Holders,
    Queue,
    Waiters,
    Fence,
    Channels,
    Channel,
    Owner,
}

const NAMES: usize = Name::Owner as usize + 1;

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

/// Where a lock's fencing counter lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Counter {
    /// `<ns>:{<key>}:fence`, one per lock, in the lock's hash tag (a Cluster's slot): a
    /// Cluster, a Sentinel-managed primary, every Redlock node.
    Lock,
    /// `<ns>:fence`, one per namespace: a single server (see `scripts/plain.lua`).
    Namespace,
}

impl Keys {
    pub(super) fn new(claim: &Claim, client_id: &str, counter: Counter) -> Self {
        Self::named(
            claim.namespace(),
            claim.key(),
            client_id,
            &claim_token(claim),
            counter,
        )
    }

    pub(super) fn named(
        namespace: &str,
        key: &str,
        client_id: &str,
        claim_owner: &str,
        counter: Counter,
    ) -> Self {
        Self::layout(namespace, key, client_id, claim_owner, ("q", "w"), counter)
    }

    /// The names, with the queue and waiters keys ending in `queues`' two names (Redlock
    /// keeps its queues, zsets by priority, under names of their own) and the fencing counter
    /// where `counter` says.
    pub(crate) fn layout(
        namespace: &str,
        key: &str,
        client_id: &str,
        claim_owner: &str,
        (queue, waiters): (&str, &str),
        counter: Counter,
    ) -> Self {
        // Namespaces hold no braces or colons, so `<ns>:{` starts every lock's name, and every
        // name of one key shares its hash tag. Suffixes end in distinct letters, and lock names
        // end in `}`, so no two keys' names can coincide; a namespace's counter, `<ns>:fence`,
        // has no brace after its colon, so it is no lock's name either.
        // The lock's name seven times, the suffixes, the client id twice and the claim's.
        let size = (namespace.len() + key.len() + 3) * 7
            + queue.len()
            + waiters.len()
            + 2 * client_id.len()
            + claim_owner.len()
            + 20;
        let mut keys = Self {
            text: String::with_capacity(size),
            ends: [0; NAMES],
        };
        let named = |keys: &mut Self, name: Name, parts: &[&str]| {
            push_lock_name(&mut keys.text, namespace, key);
            for part in parts {
                keys.text.push_str(part);
            }
            keys.ends[name as usize] = keys.text.len();
        };
        named(&mut keys, Name::Lock, &[]);
        named(&mut keys, Name::Holders, &[":h"]);
        named(&mut keys, Name::Queue, &[":", queue]);
        named(&mut keys, Name::Waiters, &[":", waiters]);
        match counter {
            Counter::Lock => named(&mut keys, Name::Fence, &[":fence"]),
            Counter::Namespace => {
                keys.text.push_str(namespace);
                keys.text.push_str(":fence");
                keys.ends[Name::Fence as usize] = keys.text.len();
            }
        }
        named(&mut keys, Name::Channels, &[":c:"]);
        named(&mut keys, Name::Channel, &[":c:", client_id]);
        wire::push_owner_token(&mut keys.text, client_id, claim_owner);
        keys.ends[Name::Owner as usize] = keys.text.len();
        keys
    }

    fn name(&self, name: Name) -> &str {
        let i = name as usize;
        let start = i.checked_sub(1).map_or(0, |before| self.ends[before]);
        self.text.get(start..self.ends[i]).unwrap_or_default()
    }

    /// The lock's main key, `<ns>:{<key>}`: every other name but a namespace's counter starts
    /// with it.
    pub(crate) fn lock(&self) -> &str {
        self.name(Name::Lock)
    }

    /// Read-write locks and semaphores: holder -> lease deadline.
    pub(crate) fn holders(&self) -> &str {
        self.name(Name::Holders)
    }

    /// The waiters' queue.
    pub(crate) fn queue(&self) -> &str {
        self.name(Name::Queue)
    }

    /// The waiters' deadlines.
    pub(crate) fn waiters(&self) -> &str {
        self.name(Name::Waiters)
    }

    /// The fencing counter (see [`Counter`]).
    pub(crate) fn fence(&self) -> &str {
        self.name(Name::Fence)
    }

    /// Every client's channel for this lock starts with this; the client id follows.
    pub(crate) fn channels(&self) -> &str {
        self.name(Name::Channels)
    }

    /// This client's channel for this lock.
    pub(crate) fn channel(&self) -> &str {
        self.name(Name::Channel)
    }

    /// The claim's owner token: `<client id>.<claim owner>`, or `<client id>.l<claim owner>`
    /// for an election's candidate (see [`claim_token`]).
    pub(crate) fn owner(&self) -> &str {
        self.name(Name::Owner)
    }
}

/// The name of a lock's main key, `<ns>:{<key>}`: every other name of the lock starts with it.
pub(crate) fn lock_name(namespace: &str, key: &str) -> String {
    let mut name = String::with_capacity(namespace.len() + key.len() + 3);
    push_lock_name(&mut name, namespace, key);
    name
}

/// Writes the name of a lock's main key (see [`lock_name`]) at the end of `out`.
fn push_lock_name(out: &mut String, namespace: &str, key: &str) {
    for part in [namespace, ":{", key, "}"] {
        out.push_str(part);
    }
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

#[cfg(test)]
mod tests {
    use super::{Counter, Keys};

    /// The names as they were written before they shared one string: clients of either
    /// version on one server must name the same keys and channels.
    #[test]
    fn names_are_laid_out_as_every_client_version_names_them() {
        for (ns, key, client, claim, queue, waiters) in [
            ("app", "orders:42", "c1", "u-1", "q", "w"),
            ("n", "{a}:b}", "client-9", "l0-1", "rq", "rw"),
            ("ns", "ключ ☃", "x", "", "q", "w"),
            ("", "", "", "", "", ""),
        ] {
            let keys = Keys::layout(ns, key, client, claim, (queue, waiters), Counter::Lock);
            let lock = format!("{ns}:{{{key}}}");
            assert_eq!(keys.lock(), lock);
            assert_eq!(keys.holders(), format!("{lock}:h"));
            assert_eq!(keys.queue(), format!("{lock}:{queue}"));
            assert_eq!(keys.waiters(), format!("{lock}:{waiters}"));
            assert_eq!(keys.fence(), format!("{lock}:fence"));
            assert_eq!(keys.channels(), format!("{lock}:c:"));
            assert_eq!(keys.channel(), format!("{lock}:c:{client}"));
            assert_eq!(keys.owner(), format!("{client}.{claim}"));
            // A single server's: one counter per namespace, every other name the same.
            let plain = Keys::layout(ns, key, client, claim, (queue, waiters), Counter::Namespace);
            assert_eq!(plain.fence(), format!("{ns}:fence"));
            assert_eq!(plain.lock(), lock);
            assert_eq!(plain.waiters(), keys.waiters());
            assert_eq!(plain.channel(), keys.channel());
            assert_eq!(plain.owner(), keys.owner());
        }
    }
}
