//! Inspection: a key's family, holders and waiters, read in one script call.

use std::time::Duration;

use super::lock::FENCE_TTL;
use super::{kind_of_code, millis, Keys, RedisBackend};
use crate::backend::{handoff, Family, LockKind};
use crate::error::{Error, ErrorKind, Result};
use crate::inspect::{
    ForceReleased, Holder as InspectedHolder, Inspection, Waiter as InspectedWaiter,
};

impl RedisBackend {
    pub(super) async fn inspect_key(&self, namespace: &str, key: &str) -> Result<Inspection> {
        let keys = Keys::named(namespace, key, &self.inner.client_id, "");
        let mut inv = self.call(&self.inner.scripts.inspect);
        inv.key(&keys.lock)
            .key(&keys.holders)
            .key(&keys.queue)
            .key(&keys.waiters);
        let (family, held, waiting): (String, Vec<String>, Vec<String>) =
            self.inner.commands.invoke("inspect", &inv).await?;
        let bad = || {
            Error::new(
                ErrorKind::Backend,
                format!("redis: unexpected inspect reply for `{key}`"),
            )
        };
        let family = match family.as_str() {
            "" => None,
            other => Some(handoff::parse_family(other).ok_or_else(bad)?),
        };
        let max = match family {
            Some(Family::Semaphore { max }) => max,
            _ => 0,
        };
        let kind = |k: &str| -> Result<LockKind> { kind_of_code(k, max).ok_or_else(bad) };
        let mut seen = Inspection::free(key);
        seen.family = family;
        for h in held.chunks(3) {
            let [k, f, left] = h else { return Err(bad()) };
            seen.holders.push(InspectedHolder {
                kind: kind(k)?,
                fencing_token: f.parse().ok(),
                lease_left: left.parse().ok().map(Duration::from_millis),
            });
        }
        for k in &waiting {
            seen.waiters.push(InspectedWaiter {
                kind: kind(k)?,
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
        let keys = Keys::named(namespace, key, &self.inner.client_id, "");
        let mut inv = self.call_on(&self.inner.scripts.force_release, &keys, true);
        inv.arg(millis(FENCE_TTL))
            .arg(millis(self.inner.handoff_ttl))
            .arg(&keys.channels)
            .arg_clock();
        let (family, removed): (String, Vec<String>) =
            self.inner.commands.invoke("force_release", &inv).await?;
        let bad = || {
            Error::new(
                ErrorKind::Backend,
                format!("redis: unexpected force_release reply for `{key}`"),
            )
        };
        let family = match family.as_str() {
            "" => None,
            other => Some(handoff::parse_family(other).ok_or_else(bad)?),
        };
        let max = match family {
            Some(Family::Semaphore { max }) => max,
            _ => 0,
        };
        let mut out = ForceReleased::nothing(key);
        out.family = family;
        for h in removed.chunks(4) {
            let [_owner, k, f, left] = h else {
                return Err(bad());
            };
            out.removed.push(InspectedHolder {
                kind: kind_of_code(k, max).ok_or_else(bad)?,
                fencing_token: f.parse().ok(),
                lease_left: left.parse().ok().map(Duration::from_millis),
            });
        }
        Ok(out)
    }
}
