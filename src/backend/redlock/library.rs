//! The scripts each node runs: the single-node helpers with Redlock's queue by priority and
//! the rejoin gate.

use std::sync::LazyLock;

use crate::backend::redis::script::Script;

pub(super) fn script(body: &str) -> Script {
    Script::new(&format!(
        "{}\n{}\n{}\n{}\n{}",
        include_str!("../redis/scripts/common.lua"),
        crate::backend::redis::SHARED_LUA,
        crate::backend::redis::RENEWAL_LUA,
        include_str!("scripts/quorum.lua"),
        body
    ))
}

pub(super) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/acquire.lua")));
pub(super) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/release.lua")));
pub(super) static SETTLE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/settle.lua")));
pub(super) static YIELD: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/yield.lua")));
pub(super) static RENEW: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/renew.lua")));
pub(super) static INSPECT: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/inspect.lua")));
pub(super) static ACQUIRE_SHARED: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/acquire_shared.lua")));
pub(super) static YIELD_SHARED: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/yield_shared.lua")));
// The single-node read-write lock scripts, gated by the node's rejoin delay.
pub(super) static RELEASE_SHARED: LazyLock<Script> = LazyLock::new(|| {
    script(concat!(
        include_str!("scripts/gated.lua"),
        include_str!("../redis/scripts/release_shared.lua")
    ))
});
pub(super) static DOWNGRADE: LazyLock<Script> = LazyLock::new(|| {
    script(concat!(
        include_str!("scripts/gated.lua"),
        include_str!("../redis/scripts/downgrade.lua")
    ))
});
pub(super) static FORCE_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    script(concat!(
        include_str!("scripts/force_release.lua"),
        include_str!("../redis/scripts/force_release.lua")
    ))
});
