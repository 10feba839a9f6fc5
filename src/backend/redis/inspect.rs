//! Inspection: a key's family, holders and waiters, read in one script call.

use std::time::Duration;

use super::{kind_of_code, Keys, RedisBackend};
use crate::backend::{handoff, Family, LockKind};
use crate::error::{Error, ErrorKind, Result};
use crate::inspect::{Holder as InspectedHolder, Inspection, Waiter as InspectedWaiter};

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
}
