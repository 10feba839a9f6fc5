//! The backend's scripts, as one function library per topology (a single server, a Cluster, a
//! Sentinel-managed primary), and how a call of one is made.

use std::sync::LazyLock;

use super::script::{Call, Library, Part, Script};
use super::{Keys, RedisBackend};

/// The scripts the backend runs, as one server runs them or (with `sharded.lua` after the
/// shared helpers) as a Cluster does, and the function library that holds them all.
pub(super) struct Scripts {
    pub(super) library: Library,
    pub(super) acquire: Script,
    pub(super) release: Script,
    pub(super) renew: Script,
    pub(super) inspect: Script,
    pub(super) acquire_shared: Script,
    pub(super) release_shared: Script,
    pub(super) downgrade: Script,
    pub(super) force_release: Script,
    /// Answers 1: proves the server answers (and, as a function, holds the library).
    pub(super) ping: Script,
}

/// The helpers of the read-write lock and semaphore scripts, and of the renewal script. Run by
/// `EVALSHA`, a script carries only the helpers it uses: Redis runs the whole text at every
/// call, so each helper defined is paid for by every call.
pub(crate) const SHARED_LUA: &str = include_str!("scripts/shared.lua");
pub(crate) const RENEWAL_LUA: &str = include_str!("scripts/renewal.lua");

impl Scripts {
    fn with(variant: &str) -> Self {
        let writing = |name, helpers, body| Part {
            name,
            read_only: false,
            helpers,
            body,
        };
        let reading = |name, body| Part {
            name,
            read_only: true,
            helpers: &[],
            body,
        };
        let (library, scripts) = Library::build(
            &format!("{}\n{variant}", include_str!("scripts/common.lua")),
            [
                writing("acquire", &[], include_str!("scripts/acquire.lua")),
                writing("release", &[], include_str!("scripts/release.lua")),
                writing("renew", &[RENEWAL_LUA], include_str!("scripts/renew.lua")),
                reading("inspect", include_str!("scripts/inspect.lua")),
                writing(
                    "acquire_shared",
                    &[SHARED_LUA],
                    include_str!("scripts/acquire_shared.lua"),
                ),
                writing(
                    "release_shared",
                    &[SHARED_LUA],
                    include_str!("scripts/release_shared.lua"),
                ),
                writing(
                    "downgrade",
                    &[SHARED_LUA],
                    include_str!("scripts/downgrade.lua"),
                ),
                writing(
                    "force_release",
                    &[SHARED_LUA],
                    include_str!("scripts/force_release.lua"),
                ),
                reading("ping", "return 1"),
            ],
        );
        let [acquire, release, renew, inspect, acquire_shared, release_shared, downgrade, force_release, ping] =
            scripts;
        Self {
            library,
            acquire,
            release,
            renew,
            inspect,
            acquire_shared,
            release_shared,
            downgrade,
            force_release,
            ping,
        }
    }
}

pub(super) static PLAIN: LazyLock<Scripts> = LazyLock::new(|| Scripts::with(""));
#[cfg(feature = "redis-cluster")]
pub(super) static SHARDED: LazyLock<Scripts> = LazyLock::new(|| {
    Scripts::with(concat!(
        include_str!("scripts/failover.lua"),
        include_str!("scripts/sharded.lua")
    ))
});
#[cfg(feature = "redis-sentinel")]
pub(super) static FAILOVER: LazyLock<Scripts> =
    LazyLock::new(|| Scripts::with(include_str!("scripts/failover.lua")));

impl RedisBackend {
    /// A call of one of the backend's scripts: a function of the library, if the server keeps
    /// it, else by `EVALSHA`.
    pub(super) fn call(&self, script: &'static Script) -> Call<'_> {
        script.call(self.inner.functions.as_ref())
    }

    /// A call of one of the lock scripts with the lock's keys (see [`Keys::add_keys`]).
    pub(super) fn call_on(&self, script: &'static Script, keys: &Keys, shared: bool) -> Call<'_> {
        let mut inv = self.call(script);
        keys.add_keys(&mut inv, shared);
        inv
    }
}
