//! One lock's key names on every node (the single-node layout, Redlock's queues under names of
//! their own) and the claim's owner token.

use crate::backend::redis::script::{Call, Script};
use crate::backend::redis::{kind_code, Keys as RedisKeys};
use crate::backend::{Claim, LockKind};

/// One lock's key names, the same on every node, and the claim's owner token: the single-node
/// names (queues under names of their own, `:rq` and `:rw`, since here they are zsets by
/// priority), and the node's `born` mark.
pub(super) struct Keys {
    names: RedisKeys,
    born: String,
}

impl std::ops::Deref for Keys {
    type Target = RedisKeys;

    fn deref(&self) -> &RedisKeys {
        &self.names
    }
}

impl Keys {
    pub(super) fn new(claim: &Claim, client_id: &str) -> Self {
        Self::named(claim.namespace(), claim.key(), client_id, claim.owner())
    }

    pub(super) fn named(namespace: &str, key: &str, client_id: &str, claim_owner: &str) -> Self {
        Self {
            names: RedisKeys::layout(namespace, key, client_id, claim_owner, "rq", "rw"),
            born: format!("{namespace}:born"),
        }
    }

    /// A call of `script` with the single-node scripts' keys (see [`RedisKeys::add_keys`]), then
    /// the node's `born` mark.
    pub(super) fn invoke<'a>(&self, script: &'a Script, shared: bool) -> Call<'a> {
        let mut inv = script.prepare_invoke();
        self.names.add_keys(&mut inv, shared);
        inv.key(&self.born);
        inv
    }

    /// The claim's queue entry: its owner for a mutex, `<r|w>:<owner>` for a read-write lock.
    pub(super) fn entry(&self, kind: LockKind) -> String {
        match shared_kind(kind) {
            Some(k) => format!("{k}:{}", self.owner),
            None => self.owner.clone(),
        }
    }
}

/// `r` or `w` for a read-write lock claim, `None` for a mutex (the single-node code).
pub(super) fn shared_kind(kind: LockKind) -> Option<String> {
    kind_code(kind)
}
