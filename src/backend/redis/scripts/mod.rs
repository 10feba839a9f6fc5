//! The single-node scripts (`<name>.lua` beside this file) as the backend calls them: one
//! struct per script holding its `KEYS` and `ARGV`, which pushes them in the order the script
//! reads them, so a call site fills named fields and never a position. Every topology runs the
//! same scripts, after its own prelude (see `library.rs`); Redlock runs its own (see
//! `redlock/scripts`), on the same helpers.
//!
//! Every name but a single server's namespace counter (`<ns>:fence`) is under the lock's hash
//! tag (see [`Keys`]), so on a Cluster each script's keys share one slot; owner tokens, TTLs and
//! channel names reach the scripts as arguments only.

use std::time::Duration;

use super::call::Call;
use super::keys::{millis, Keys};
use super::lock::FENCE_TTL;
use super::script::{Args, Part, Widen};

/// What every script of the library starts with: the key layout, the queue policy `Q`, and the
/// helpers every kind of lock uses.
pub(crate) const COMMON_LUA: &str = include_str!("common.lua");
/// The prelude's addition for a single server: one fencing counter per namespace.
pub(crate) const PLAIN_LUA: &str = include_str!("plain.lua");
/// The helpers of the read-write lock and semaphore scripts. Run by `EVALSHA`, a script
/// carries only the helpers it uses (see [`Part`]): Redis runs the whole text at every call,
/// so each helper defined is paid for by every call.
pub(crate) const SHARED_LUA: &str = include_str!("shared.lua");
/// The helpers of the renewal scripts.
pub(crate) const RENEWAL_LUA: &str = include_str!("renewal.lua");
/// The read-write lock and semaphore operations that the single-node scripts and Redlock's
/// share (after `SHARED_LUA`).
pub(crate) const SHARED_OPS_LUA: &str = include_str!("shared_ops.lua");
/// The prelude's addition for a Cluster.
#[cfg(feature = "redis-cluster")]
pub(super) const SHARDED_LUA: &str = include_str!("sharded.lua");

/// The scripts of the library, every topology alike.
pub(super) const ALL: [Part; 11] = [
    Acquire::SCRIPT,
    Release::SCRIPT,
    Renew::SCRIPT,
    Inspect::SCRIPT,
    AcquireShared::SCRIPT,
    ReleaseShared::SCRIPT,
    Downgrade::SCRIPT,
    ForceRelease::SCRIPT,
    LeaderOf::SCRIPT,
    Proclaim::SCRIPT,
    Ping::SCRIPT,
];

/// A script that writes, with the helpers it needs beyond the prelude, and adds no state
/// (it releases, renews or hands on): it runs on a server out of memory too.
const fn writing(name: &'static str, helpers: &'static [&'static str], body: &'static str) -> Part {
    Part {
        name,
        read_only: false,
        grows: false,
        helpers,
        body,
        many: false,
        quick: "",
        shared: 0,
        widen: None,
    }
}

/// A script that may add state (a grant, a queue entry): refused as a whole on a server out
/// of memory.
const fn growing(name: &'static str, helpers: &'static [&'static str], body: &'static str) -> Part {
    Part {
        grows: true,
        ..writing(name, helpers, body)
    }
}

/// `part`, with a coalesced form: the calls one client has in flight at once go as one (see
/// `coalesce.rs`).
const fn coalesced(part: Part) -> Part {
    Part { many: true, ..part }
}

/// A script that writes nothing (its function may run on a replica too).
pub(crate) const fn reading(name: &'static str, body: &'static str) -> Part {
    Part {
        name,
        read_only: true,
        grows: false,
        helpers: &[],
        body,
        many: false,
        quick: "",
        shared: 0,
        widen: None,
    }
}

/// The mutex scripts' keys: lock, queue, waiters, fence.
pub(crate) fn push_mutex_keys(call: &mut Call<'_>, keys: &Keys) {
    call.key(keys.lock())
        .key(keys.queue())
        .key(keys.waiters())
        .key(keys.fence());
}

/// The read-write lock and semaphore scripts' keys: base, holders, queue, waiters, fence.
pub(crate) fn push_shared_keys(call: &mut Call<'_>, keys: &Keys) {
    call.key(keys.lock())
        .key(keys.holders())
        .key(keys.queue())
        .key(keys.waiters())
        .key(keys.fence());
}

/// `acquire.lua`: take a mutex, or join (or keep the claim's place in) its queue.
pub(crate) struct Acquire<'a> {
    /// The lock's keys, the claim's owner token and the lock's channel prefix.
    pub(crate) keys: &'a Keys,
    pub(crate) ttl: Duration,
    /// Queue if the lock is busy (else only look).
    pub(crate) wait: bool,
    pub(crate) handoff_ttl: Duration,
    /// An election's candidate: the value it proclaims (`None` for every other kind). Such a
    /// call is never coalesced: its arguments are one more than a mutex's.
    pub(crate) leads: Option<&'a [u8]>,
}

impl Acquire<'_> {
    /// The arguments both acquire scripts start with: owner, ttl ms, wait (1|0), fence ttl ms,
    /// handoff ttl ms, channel prefix.
    fn push_args(&self, call: &mut Call<'_>) {
        call.arg(self.keys.owner())
            .arg(millis(self.ttl))
            .arg(u8::from(self.wait))
            .arg(millis(FENCE_TTL))
            .arg(millis(self.handoff_ttl))
            .arg(self.keys.channels());
    }
}

impl Args for Acquire<'_> {
    const SCRIPT: Part = coalesced(growing("acquire", &[], include_str!("acquire.lua")));

    fn push(&self, call: &mut Call<'_>) {
        push_mutex_keys(call, self.keys);
        self.push_args(call);
        // A second floor for the fencing token, besides the server's clock (`next_fence`).
        call.arg_clock();
        if let Some(value) = self.leads {
            call.arg(value);
        }
    }
}

/// `acquire_shared.lua`: take a read-write lock or semaphore claim, or join (or keep its place
/// in) the queue. The mutex's arguments, then the claim's kind and the semaphore's size.
pub(crate) struct AcquireShared<'a> {
    pub(crate) acquire: Acquire<'a>,
    /// The claim's kind as the scripts write it: `r`, `w`, or the permit count.
    pub(crate) kind: &'a str,
    /// The semaphore's permits (0 for a read-write lock).
    pub(crate) permits: u32,
}

impl Args for AcquireShared<'_> {
    const SCRIPT: Part = growing(
        "acquire_shared",
        &[SHARED_LUA],
        include_str!("acquire_shared.lua"),
    );

    fn push(&self, call: &mut Call<'_>) {
        push_shared_keys(call, self.acquire.keys);
        self.acquire.push_args(call);
        call.arg(self.kind).arg(self.permits).arg_clock();
    }
}

/// `release.lua`: drop a mutex claim's hold (handing the lock on) or its queue entry.
pub(crate) struct Release<'a> {
    pub(crate) keys: &'a Keys,
    pub(crate) handoff_ttl: Duration,
    /// An election's candidate (a lead it hands on is provisional). Such a call is never
    /// coalesced: its arguments are one more than a mutex's.
    pub(crate) election: bool,
}

impl Args for Release<'_> {
    const SCRIPT: Part = Part {
        // The coalesced form deletes a plain hold without starting the script's body, and
        // sends the settings and the clock once for every claim.
        quick: "release_plain",
        shared: 3,
        // Each claim sends its lock's name and its owner; `release_widen` names the rest.
        widen: Some(Widen {
            name: "release_widen",
            keys: 1,
            args: 1,
        }),
        ..coalesced(writing("release", &[], include_str!("release.lua")))
    };

    fn push(&self, call: &mut Call<'_>) {
        push_mutex_keys(call, self.keys);
        // The claim's own arguments first, then those every claim of this client shares
        // (`shared`): the fencing counter's and the handoff's TTLs, and the clock, which
        // floors the tokens of the grants it hands on too.
        call.arg(self.keys.owner())
            .arg(self.keys.channels())
            .arg(millis(FENCE_TTL))
            .arg(millis(self.handoff_ttl))
            .arg_clock();
        if self.election {
            call.arg("l");
        }
    }
}

/// The arguments every release script (Redlock's too) starts with: owner, fence ttl ms,
/// handoff ttl ms, channel prefix.
pub(crate) fn push_release_args(call: &mut Call<'_>, keys: &Keys, handoff_ttl: Duration) {
    call.arg(keys.owner())
        .arg(millis(FENCE_TTL))
        .arg(millis(handoff_ttl))
        .arg(keys.channels());
}

/// `release_shared.lua`: drop a read-write lock or semaphore claim's hold or queue entry. The
/// mutex's arguments, then the claim's queue entry.
pub(crate) struct ReleaseShared<'a> {
    pub(crate) release: Release<'a>,
    /// The claim's kind as the scripts write it (its queue entry is `<kind>:<owner>`).
    pub(crate) kind: &'a str,
}

impl Args for ReleaseShared<'_> {
    const SCRIPT: Part = writing(
        "release_shared",
        &[SHARED_LUA, SHARED_OPS_LUA],
        include_str!("release_shared.lua"),
    );

    fn push(&self, call: &mut Call<'_>) {
        let Release {
            keys, handoff_ttl, ..
        } = self.release;
        push_shared_keys(call, keys);
        push_release_args(call, keys, handoff_ttl);
        call.arg(entry(keys, self.kind)).arg_clock();
    }
}

/// A read-write lock or semaphore claim's queue entry, `<kind>:<owner>`.
pub(crate) fn entry(keys: &Keys, kind: &str) -> String {
    format!("{kind}:{}", keys.owner())
}

/// `downgrade.lua`: turn a write hold into a read hold, renewing its lease.
pub(crate) struct Downgrade<'a> {
    pub(crate) keys: &'a Keys,
    pub(crate) ttl: Duration,
    pub(crate) handoff_ttl: Duration,
}

impl Args for Downgrade<'_> {
    const SCRIPT: Part = writing(
        "downgrade",
        &[SHARED_LUA, SHARED_OPS_LUA],
        include_str!("downgrade.lua"),
    );

    fn push(&self, call: &mut Call<'_>) {
        push_shared_keys(call, self.keys);
        call.arg(self.keys.owner())
            .arg(millis(self.ttl))
            .arg(millis(FENCE_TTL))
            .arg(millis(self.handoff_ttl))
            .arg(self.keys.channels())
            .arg_clock();
    }
}

/// `force_release.lua`: the operator's unlock, dropping every holder and handing on.
pub(crate) struct ForceRelease<'a> {
    pub(crate) keys: &'a Keys,
    pub(crate) handoff_ttl: Duration,
}

impl Args for ForceRelease<'_> {
    const SCRIPT: Part = writing(
        "force_release",
        &[SHARED_LUA, SHARED_OPS_LUA],
        include_str!("force_release.lua"),
    );

    fn push(&self, call: &mut Call<'_>) {
        push_shared_keys(call, self.keys);
        call.arg(millis(FENCE_TTL))
            .arg(millis(self.handoff_ttl))
            .arg(self.keys.channels())
            .arg_clock();
    }
}

/// `leader.lua`: who leads an election (its confirmed leader's term, lease left, value and
/// owner).
pub(crate) struct LeaderOf<'a> {
    pub(crate) keys: &'a Keys,
}

impl Args for LeaderOf<'_> {
    const SCRIPT: Part = reading("leader", include_str!("leader.lua"));

    /// Lock, queue.
    fn push(&self, call: &mut Call<'_>) {
        call.key(self.keys.lock()).key(self.keys.queue());
    }
}

/// `proclaim.lua`: replace what an election's leader proclaims, if the claim still leads.
pub(crate) struct Proclaim<'a> {
    pub(crate) keys: &'a Keys,
    pub(crate) value: &'a [u8],
}

impl Args for Proclaim<'_> {
    const SCRIPT: Part = growing("proclaim", &[], include_str!("proclaim.lua"));

    fn push(&self, call: &mut Call<'_>) {
        call.key(self.keys.lock())
            .arg(self.keys.owner())
            .arg(self.value);
    }
}

/// `inspect.lua`: read a lock's family, holders and waiters without changing it.
pub(crate) struct Inspect<'a> {
    pub(crate) keys: &'a Keys,
}

impl Args for Inspect<'_> {
    const SCRIPT: Part = reading("inspect", include_str!("inspect.lua"));

    /// Base, holders, queue, waiters (the fence is not read).
    fn push(&self, call: &mut Call<'_>) {
        call.key(self.keys.lock())
            .key(self.keys.holders())
            .key(self.keys.queue())
            .key(self.keys.waiters());
    }
}

/// `renew.lua`: extend many leases and queue entries in one call.
#[derive(Default)]
pub(crate) struct Renew<'a> {
    pub(crate) claims: Vec<Renewed<'a>>,
}

/// One claim of a [`Renew`] call.
pub(crate) struct Renewed<'a> {
    pub(crate) keys: &'a Keys,
    pub(crate) ttl: Duration,
}

impl Renewed<'_> {
    /// The claim's keys (base, holders, waiters, queue), then its owner and TTL, as every
    /// renewal script (Redlock's too) takes each claim's.
    pub(crate) fn push(&self, call: &mut Call<'_>) {
        call.key(self.keys.lock())
            .key(self.keys.holders())
            .key(self.keys.waiters())
            .key(self.keys.queue())
            .arg(self.keys.owner())
            .arg(millis(self.ttl));
    }
}

impl Args for Renew<'_> {
    const SCRIPT: Part = writing("renew", &[RENEWAL_LUA], include_str!("renew.lua"));

    fn push(&self, call: &mut Call<'_>) {
        for claim in &self.claims {
            claim.push(call);
        }
    }
}

/// Answers 1: proves the server answers (and, as a function, holds the library). No keys, no
/// arguments.
pub(crate) struct Ping;

impl Args for Ping {
    const SCRIPT: Part = reading("ping", "return 1");

    fn push(&self, _call: &mut Call<'_>) {}
}
