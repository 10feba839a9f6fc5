//! The scripts each Redlock node runs (`<name>.lua` beside this file) as the backend calls
//! them: one struct per script holding its `KEYS` and `ARGV`, which pushes them in the order the
//! script reads them, so a call site fills named fields and never a position. They run after
//! the single-node helpers and `quorum.lua` (Redlock's queue by priority and the rejoin gate),
//! as one function library per node (see `library.rs`).
//!
//! Where a script only gates a single-node operation by the node's rejoin delay (release and
//! downgrade of a read-write lock, the operator's unlock), it reads its own arguments, gates,
//! and calls the operation the single-node script calls (`shared_ops.lua`): no script reads a
//! slot another script fills differently.

use std::time::Duration;

use super::keys::Keys;
use crate::backend::redis::call::Call;
use crate::backend::redis::millis;
use crate::backend::redis::script::{Args, Part};
use crate::backend::redis::scripts::{
    self as redis, entry, push_mutex_keys, push_release_args, push_shared_keys, reading, LeaderOf,
    Ping, Proclaim,
};
use crate::backend::redis::FENCE_TTL;

/// Redlock's additions to the single-node helpers: its queue by priority and the rejoin gate.
pub(super) const QUORUM_LUA: &str = include_str!("quorum.lua");

/// The scripts of the library.
pub(super) const ALL: [Part; 14] = [
    Acquire::SCRIPT,
    Release::SCRIPT,
    Settle::SCRIPT,
    Yield::SCRIPT,
    Renew::SCRIPT,
    Inspect::SCRIPT,
    AcquireShared::SCRIPT,
    YieldShared::SCRIPT,
    ReleaseShared::SCRIPT,
    Downgrade::SCRIPT,
    ForceRelease::SCRIPT,
    // An election's leader on one node, and a proclaim there: the single-node scripts.
    LeaderOf::SCRIPT,
    Proclaim::SCRIPT,
    Ping::SCRIPT,
];

/// A script that writes and adds no state (it releases, renews, settles or gives back): it runs
/// on a node out of memory too. Each carries every helper (they are the library's prelude).
const fn writing(name: &'static str, body: &'static str) -> Part {
    Part {
        name,
        read_only: false,
        grows: false,
        helpers: &[],
        body,
        many: false,
        quick: "",
        shared: 0,
        widen: None,
    }
}

/// A script that may add state (a grant, a queue entry): refused as a whole on a node out of
/// memory.
const fn growing(name: &'static str, body: &'static str) -> Part {
    Part {
        grows: true,
        ..writing(name, body)
    }
}

/// The mutex scripts' keys, then the node's `born` mark.
fn push_gated_mutex_keys(call: &mut Call<'_>, keys: &Keys) {
    push_mutex_keys(call, keys);
    call.key(&keys.born);
}

/// The read-write lock scripts' keys, then the node's `born` mark.
fn push_gated_shared_keys(call: &mut Call<'_>, keys: &Keys) {
    push_shared_keys(call, keys);
    call.key(&keys.born);
}

/// `acquire.lua`: one node's part of a mutex acquisition.
pub(super) struct Acquire<'a> {
    /// The lock's keys and `born` mark, the claim's owner token and the channel prefix.
    pub(super) keys: &'a Keys,
    pub(super) ttl: Duration,
    /// Keep the claim's place in the queue if the lock is busy (else only look).
    pub(super) wait: bool,
    /// The claim's place in every node's queue (its clock in µs when it first queued).
    pub(super) priority: u64,
    pub(super) handoff_ttl: Duration,
    /// How long after its server started the node grants nothing, in ms.
    pub(super) rejoin_ms: u64,
    /// An election's candidate: the value it proclaims (`None` for every other kind).
    pub(super) leads: Option<&'a [u8]>,
}

impl Acquire<'_> {
    /// The arguments both acquire scripts start with: owner, ttl ms, wait (1|0), priority,
    /// fence ttl ms, handoff ttl ms, channel prefix, rejoin ms.
    fn push_args(&self, call: &mut Call<'_>) {
        call.arg(self.keys.owner())
            .arg(millis(self.ttl))
            .arg(u8::from(self.wait))
            .arg(self.priority)
            .arg(millis(FENCE_TTL))
            .arg(millis(self.handoff_ttl))
            .arg(self.keys.channels())
            .arg(self.rejoin_ms);
    }
}

impl Args for Acquire<'_> {
    const SCRIPT: Part = growing("acquire", include_str!("acquire.lua"));

    fn push(&self, call: &mut Call<'_>) {
        push_gated_mutex_keys(call, self.keys);
        self.push_args(call);
        if let Some(value) = self.leads {
            call.arg(value);
        }
    }
}

/// `acquire_shared.lua`: one node's part of a read-write lock acquisition. The mutex's
/// arguments, then the claim's side.
pub(super) struct AcquireShared<'a> {
    pub(super) acquire: Acquire<'a>,
    /// `r` or `w`.
    pub(super) kind: &'a str,
}

impl Args for AcquireShared<'_> {
    const SCRIPT: Part = growing("acquire_shared", include_str!("acquire_shared.lua"));

    fn push(&self, call: &mut Call<'_>) {
        push_gated_shared_keys(call, self.acquire.keys);
        self.acquire.push_args(call);
        call.arg(self.kind);
    }
}

/// `settle.lua`: set the lease of a lock held on the node to the full TTL and raise its
/// fencing counter to the quorum's token.
pub(super) struct Settle<'a> {
    pub(super) keys: &'a Keys,
    /// The lease to set.
    pub(super) lease: Duration,
    /// The quorum's token.
    pub(super) token: u64,
    /// A read-write lock (else a mutex).
    pub(super) shared: bool,
    /// An election's candidate: the value its hold carries once settled (it leads).
    pub(super) leads: Option<&'a [u8]>,
}

impl Args for Settle<'_> {
    const SCRIPT: Part = writing("settle", include_str!("settle.lua"));

    fn push(&self, call: &mut Call<'_>) {
        call.key(self.keys.lock())
            .key(self.keys.fence())
            .key(self.keys.holders())
            .arg(self.keys.owner())
            .arg(millis(self.lease))
            .arg(self.token)
            .arg(millis(FENCE_TTL))
            .arg(u8::from(self.shared));
        if let Some(value) = self.leads {
            call.arg(value);
        }
    }
}

/// `yield.lua`: hand a mutex held on the node without a quorum to a better-placed waiter
/// there, or keep it under the handoff lease only.
pub(super) struct Yield<'a> {
    pub(super) keys: &'a Keys,
    pub(super) priority: u64,
    pub(super) ttl: Duration,
    pub(super) handoff_ttl: Duration,
}

impl Yield<'_> {
    /// The arguments both yield scripts start with: owner, priority, ttl ms, fence ttl ms,
    /// handoff ttl ms, channel prefix.
    fn push_args(&self, call: &mut Call<'_>) {
        call.arg(self.keys.owner())
            .arg(self.priority)
            .arg(millis(self.ttl))
            .arg(millis(FENCE_TTL))
            .arg(millis(self.handoff_ttl))
            .arg(self.keys.channels());
    }
}

impl Args for Yield<'_> {
    const SCRIPT: Part = writing("yield", include_str!("yield.lua"));

    fn push(&self, call: &mut Call<'_>) {
        push_mutex_keys(call, self.keys);
        self.push_args(call);
    }
}

/// `yield_shared.lua`: as [`Yield`], for a read-write lock; then the claim's queue entry.
pub(super) struct YieldShared<'a> {
    pub(super) yielding: Yield<'a>,
    /// `r` or `w` (the queue entry is `<kind>:<owner>`).
    pub(super) kind: &'a str,
}

impl Args for YieldShared<'_> {
    const SCRIPT: Part = writing("yield_shared", include_str!("yield_shared.lua"));

    fn push(&self, call: &mut Call<'_>) {
        push_shared_keys(call, self.yielding.keys);
        self.yielding.push_args(call);
        call.arg(entry(self.yielding.keys, self.kind));
    }
}

/// `release.lua`: one node's part of a mutex release.
pub(super) struct Release<'a> {
    pub(super) keys: &'a Keys,
    pub(super) handoff_ttl: Duration,
    pub(super) rejoin_ms: u64,
    /// An election's candidate (a lead it hands on is provisional until settled).
    pub(super) election: bool,
}

impl Args for Release<'_> {
    const SCRIPT: Part = writing("release", include_str!("release.lua"));

    fn push(&self, call: &mut Call<'_>) {
        push_gated_mutex_keys(call, self.keys);
        push_release_args(call, self.keys, self.handoff_ttl);
        call.arg(self.rejoin_ms);
        if self.election {
            call.arg("l");
        }
    }
}

/// `release_shared.lua`: one node's part of a read-write lock release. The mutex's arguments,
/// with the claim's queue entry before the rejoin delay.
pub(super) struct ReleaseShared<'a> {
    pub(super) release: Release<'a>,
    /// `r` or `w` (the queue entry is `<kind>:<owner>`).
    pub(super) kind: &'a str,
}

impl Args for ReleaseShared<'_> {
    const SCRIPT: Part = writing("release_shared", include_str!("release_shared.lua"));

    fn push(&self, call: &mut Call<'_>) {
        let Release {
            keys,
            handoff_ttl,
            rejoin_ms,
            ..
        } = self.release;
        push_gated_shared_keys(call, keys);
        push_release_args(call, keys, handoff_ttl);
        call.arg(entry(keys, self.kind)).arg(rejoin_ms);
    }
}

/// `downgrade.lua`: one node's part of a downgrade.
pub(super) struct Downgrade<'a> {
    pub(super) keys: &'a Keys,
    pub(super) ttl: Duration,
    pub(super) handoff_ttl: Duration,
    pub(super) rejoin_ms: u64,
}

impl Args for Downgrade<'_> {
    const SCRIPT: Part = writing("downgrade", include_str!("downgrade.lua"));

    fn push(&self, call: &mut Call<'_>) {
        push_gated_shared_keys(call, self.keys);
        call.arg(self.keys.owner())
            .arg(millis(self.ttl))
            .arg(millis(FENCE_TTL))
            .arg(millis(self.handoff_ttl))
            .arg(self.keys.channels())
            .arg(self.rejoin_ms);
    }
}

/// `force_release.lua`: the operator's unlock on one node.
pub(super) struct ForceRelease<'a> {
    pub(super) keys: &'a Keys,
    pub(super) handoff_ttl: Duration,
    pub(super) rejoin_ms: u64,
}

impl Args for ForceRelease<'_> {
    const SCRIPT: Part = writing("force_release", include_str!("force_release.lua"));

    fn push(&self, call: &mut Call<'_>) {
        push_gated_shared_keys(call, self.keys);
        call.arg(millis(FENCE_TTL))
            .arg(millis(self.handoff_ttl))
            .arg(self.keys.channels())
            .arg(self.rejoin_ms);
    }
}

/// `inspect.lua`: one node's view of a lock, unchanged. It reads the keys the single-node
/// `inspect.lua` reads.
pub(super) struct Inspect<'a>(pub(super) redis::Inspect<'a>);

impl Args for Inspect<'_> {
    const SCRIPT: Part = reading("inspect", include_str!("inspect.lua"));

    fn push(&self, call: &mut Call<'_>) {
        self.0.push(call);
    }
}

/// `renew.lua`: one node's part of a renewal, for many claims in one call: each claim as the
/// single-node renewal takes it, then what to do with it.
#[derive(Default)]
pub(super) struct Renew<'a> {
    pub(super) claims: Vec<(redis::Renewed<'a>, RenewMode)>,
}

/// What a renewal does for one claim on a node.
#[derive(Clone, Copy)]
pub(super) enum RenewMode {
    /// A mutex held by a quorum: extend its lease.
    Mutex,
    /// A read-write lock held by a quorum: extend its lease.
    Shared,
    /// A waiter: keep its queue entry, never extend a lease it holds here without a quorum.
    Waiting,
}

impl Args for Renew<'_> {
    const SCRIPT: Part = writing("renew", include_str!("renew.lua"));

    fn push(&self, call: &mut Call<'_>) {
        for (claim, mode) in &self.claims {
            claim.push(call);
            call.arg(match mode {
                RenewMode::Mutex => "h",
                RenewMode::Shared => "H",
                RenewMode::Waiting => "w",
            });
        }
    }
}
