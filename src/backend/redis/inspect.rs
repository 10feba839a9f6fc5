//! Inspection: a key's family, holders and waiters, read in one script call.

use std::time::Duration;

use super::scripts::{ForceRelease, Inspect};
use super::{kind_of_code, RedisBackend};
use crate::backend::{wire, Family};
use crate::error::{Error, ErrorKind, Result};
use crate::inspect::{
    ForceReleased, Holder as InspectedHolder, Inspection, Waiter as InspectedWaiter,
};

impl RedisBackend {
    pub(super) async fn inspect_key(&self, namespace: &str, key: &str) -> Result<Inspection> {
        let keys = self.names(namespace, key);
        let inv = self.call(&Inspect { keys: &keys });
        let (family, held, waiting): (String, Vec<String>, Vec<String>) =
            self.inner.commands.invoke("inspect", &inv).await?;
        let bad = || unexpected("inspect", key);
        let (family, max) = family_of(&family, bad)?;
        let mut seen = Inspection::free(key);
        seen.family = family;
        for h in held.chunks(3) {
            let [k, f, left] = h else { return Err(bad()) };
            seen.holders.push(holder_of(k, f, left, max, bad)?);
        }
        for k in &waiting {
            seen.waiters.push(InspectedWaiter {
                kind: kind_of_code(k, max).ok_or_else(bad)?,
                waited: None,
            });
        }
        Ok(seen)
    }

    /// The operator's unlock: one script drops every holder, lifts the fencing counter to
    /// their tokens at least and hands the lock on (see `force_release.lua`).
    pub(super) async fn force_release_key(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<ForceReleased> {
        let keys = self.names(namespace, key);
        let inv = self.call(&ForceRelease {
            keys: &keys,
            handoff_ttl: self.inner.handoff_ttl,
        });
        let (family, removed): (String, Vec<String>) =
            self.inner.commands.invoke("force_release", &inv).await?;
        let bad = || unexpected("force_release", key);
        let (family, max) = family_of(&family, bad)?;
        let mut out = ForceReleased::nothing(key);
        out.family = family;
        for h in removed.chunks(4) {
            let [_owner, k, f, left] = h else {
                return Err(bad());
            };
            out.removed.push(holder_of(k, f, left, max, bad)?);
        }
        Ok(out)
    }
}

/// The error for a reply of `what` for `key` that is not what the script returns.
fn unexpected(what: &str, key: &str) -> Error {
    Error::new(
        ErrorKind::Backend,
        format!("redis: unexpected {what} reply for `{key}`"),
    )
}

/// A reply's family code (empty: the key is free), and a semaphore's size (else 0).
fn family_of(code: &str, bad: impl Fn() -> Error) -> Result<(Option<Family>, u32)> {
    let family = match code {
        "" => None,
        other => Some(wire::parse_family(other).ok_or_else(&bad)?),
    };
    let max = match family {
        Some(Family::Semaphore { max }) => max,
        _ => 0,
    };
    Ok((family, max))
}

/// One holder as the scripts report it: kind code, fencing token, lease left in ms.
fn holder_of(
    kind: &str,
    fence: &str,
    left: &str,
    max: u32,
    bad: impl Fn() -> Error,
) -> Result<InspectedHolder> {
    Ok(InspectedHolder {
        kind: kind_of_code(kind, max).ok_or_else(bad)?,
        fencing_token: fence.parse().ok(),
        lease_left: left.parse().ok().map(Duration::from_millis),
    })
}
