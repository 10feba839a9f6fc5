//! The scripts each node runs, as one function library: the single-node helpers with
//! Redlock's queue by priority and the rejoin gate, then Redlock's own scripts. Each node
//! loads it once and calls it by `FCALL` (loaded again when the node lost it, e.g. restarted
//! without its data), or by `EVALSHA` where the node keeps no functions (see `redis::script`).

use std::sync::LazyLock;

use super::scripts::{ALL, QUORUM_LUA};
use crate::backend::redis::call::Call;
use crate::backend::redis::script::{Args, Library};
use crate::backend::redis::scripts::{COMMON_LUA, RENEWAL_LUA, SHARED_LUA, SHARED_OPS_LUA};

/// Redlock's library. Every helper is in the prelude, so each script sent by `EVALSHA` carries
/// them all.
pub(super) static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    Library::build(
        &format!("{COMMON_LUA}\n{SHARED_LUA}\n{RENEWAL_LUA}\n{QUORUM_LUA}\n{SHARED_OPS_LUA}"),
        &ALL,
    )
});

/// A call of the script `args` are for, to send to any node: each node calls it in its own
/// use of the library (see [`Node::call`](super::node::Node::call)).
pub(super) fn call(args: &impl Args) -> Call<'static> {
    LIBRARY.call(None, args)
}
