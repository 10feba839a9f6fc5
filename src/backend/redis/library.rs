//! The backend's scripts as one function library per topology (a single server, a Cluster, a
//! Sentinel-managed primary), and how a call of one is made.

use std::sync::LazyLock;

use super::call::Call;
use super::keys::{Counter, Keys};
use super::script::{Args, Library};
use super::scripts::{ALL, COMMON_LUA, PLAIN_LUA};
use super::{RedisBackend, RedisTicket};
use crate::backend::Claim;

/// The library of a single server: one fencing counter per namespace.
pub(super) static PLAIN: LazyLock<Library> =
    LazyLock::new(|| Library::build(&format!("{COMMON_LUA}\n{PLAIN_LUA}"), &ALL));
/// The library of a Cluster: grants on shard channels.
#[cfg(feature = "redis-cluster")]
pub(super) static SHARDED: LazyLock<Library> = LazyLock::new(|| {
    use super::scripts::SHARDED_LUA;
    Library::build(&format!("{COMMON_LUA}\n{SHARDED_LUA}"), &ALL)
});
/// The library of a Sentinel-managed primary: a fencing counter per lock.
#[cfg(feature = "redis-sentinel")]
pub(super) static FAILOVER: LazyLock<Library> = LazyLock::new(|| Library::build(COMMON_LUA, &ALL));

impl RedisBackend {
    /// A call of the script `args` are for: a function of the library, if the server keeps
    /// it, else by `EVALSHA`.
    pub(super) fn call(&self, args: &impl Args) -> Call<'_> {
        self.inner.scripts.call(self.inner.functions.as_ref(), args)
    }

    /// Where this backend's library keeps fencing counters: one per namespace on a single
    /// server (`scripts/plain.lua`), one per lock elsewhere.
    pub(super) fn counter(&self) -> Counter {
        if std::ptr::eq(self.inner.scripts, &*PLAIN) {
            Counter::Namespace
        } else {
            Counter::Lock
        }
    }

    /// The names of `claim`'s keys, as its ticket keeps them.
    pub(super) fn keys_of<'t>(&self, ticket: &'t RedisTicket, claim: &Claim) -> &'t Keys {
        ticket.keys(claim, &self.inner.client_id, self.counter())
    }

    /// The names of a lock's keys, for a call made for no claim (inspection, an election's
    /// observers).
    pub(super) fn names(&self, namespace: &str, key: &str) -> Keys {
        Keys::named(namespace, key, &self.inner.client_id, "", self.counter())
    }
}
