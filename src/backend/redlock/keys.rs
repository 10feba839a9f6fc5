//! One lock's key names on every node (the single-node layout, Redlock's queues under names of
//! their own) and the claim's owner token.

use crate::backend::redis::{claim_token, Counter, Keys as RedisKeys};
use crate::backend::Claim;

/// One lock's key names, the same on every node, and the claim's owner token: the single-node
/// names (queues under names of their own, `:rq` and `:rw`, since here they are zsets by
/// priority), and the node's `born` mark.
pub(super) struct Keys {
    names: RedisKeys,
    /// The node's `born` mark (see `quorum.lua`).
    pub(super) born: String,
}

impl std::ops::Deref for Keys {
    type Target = RedisKeys;

    fn deref(&self) -> &RedisKeys {
        &self.names
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
        Self {
            names: RedisKeys::layout(
                namespace,
                key,
                client_id,
                claim_owner,
                ("rq", "rw"),
                Counter::Lock,
            ),
            born: format!("{namespace}:born"),
        }
    }
}
