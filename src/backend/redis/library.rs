//! The backend's scripts as one function library per topology (a single server, a Cluster, a
//! Sentinel-managed primary), and how a call of one is made.

use std::sync::LazyLock;

use super::script::{Args, Call, Library};
use super::scripts::{ALL, COMMON_LUA};
use super::RedisBackend;

/// The library of a single server.
pub(super) static PLAIN: LazyLock<Library> = LazyLock::new(|| Library::build(COMMON_LUA, &ALL));
/// The library of a Cluster: tokens above the server's clock, grants on shard channels.
#[cfg(feature = "redis-cluster")]
pub(super) static SHARDED: LazyLock<Library> = LazyLock::new(|| {
    use super::scripts::{FAILOVER_LUA, SHARDED_LUA};
    Library::build(&format!("{COMMON_LUA}\n{FAILOVER_LUA}{SHARDED_LUA}"), &ALL)
});
/// The library of a Sentinel-managed primary: tokens above the server's clock.
#[cfg(feature = "redis-sentinel")]
pub(super) static FAILOVER: LazyLock<Library> = LazyLock::new(|| {
    use super::scripts::FAILOVER_LUA;
    Library::build(&format!("{COMMON_LUA}\n{FAILOVER_LUA}"), &ALL)
});

impl RedisBackend {
    /// A call of the script `args` are for: a function of the library, if the server keeps
    /// it, else by `EVALSHA`.
    pub(super) fn call(&self, args: &impl Args) -> Call<'_> {
        self.inner.scripts.call(self.inner.functions.as_ref(), args)
    }
}
