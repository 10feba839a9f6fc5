//! Elections on PostgreSQL: the leader is the holder of the key (mode `l`) whose grant is
//! confirmed, its value in its claim row; changes are announced on the hub's elections
//! channel. A grant handed on to a candidate is `provisional` until the candidate's client
//! confirms it (`PgBackend::wait` makes it ask again), so a candidate whose host died in line
//! is never reported as leading.

use std::time::Duration;

use tokio_postgres::types::Type;

use super::commands::{route_of, Params};
use super::{column, malformed, Call, PgBackend};
use crate::backend::wire::{kind_mismatch, parse_family};
use crate::backend::{Claim, Family, Leader, LeaderWatch, LockKind};
use crate::error::{Error, Result};

const PROCLAIM: &str = "SELECT distlock.proclaim($1, $2, $3, $4)";
const LEADER: &str = "SELECT family, value, fence, left_ms FROM distlock.leader($1, $2)";

/// Publishes the claim's value as what its leader says.
pub(super) async fn proclaim(backend: &PgBackend, claim: &Claim) -> Result<()> {
    let call = Call::new(claim, &backend.inner.client_id);
    let value = claim.value();
    let value: &[u8] = &value;
    let params: &Params<'_> = &[
        (&call.ns, Type::TEXT),
        (&call.key, Type::TEXT),
        (&call.owner, Type::TEXT),
        (&value, Type::BYTEA),
    ];
    let reply = backend
        .inner
        .commands
        .query("proclaim", call.route, PROCLAIM, params)
        .await?;
    let row = reply.rows.first().ok_or_else(|| malformed("proclaim"))?;
    match column::<i32>(row, 0, "proclaim")? {
        1 => Ok(()),
        _ => Err(Error::lost(claim.key())),
    }
}

/// Who leads the election `key` of `namespace`.
pub(super) async fn leader(
    backend: &PgBackend,
    namespace: &str,
    key: &str,
) -> Result<Option<Leader>> {
    let params: &Params<'_> = &[(&namespace, Type::TEXT), (&key, Type::TEXT)];
    let rows = backend
        .inner
        .commands
        .query("leader", route_of(key), LEADER, params)
        .await?
        .rows;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let family: String = column(row, 0, "leader")?;
    let fence: Option<i64> = column(row, 2, "leader")?;
    if parse_family(&family) != Some(Family::Election) {
        // A key used as a lock: free now (it may become an election), or held.
        return match fence {
            None => Ok(None),
            Some(_) => Err(kind_mismatch(key, &family, LockKind::Leader)),
        };
    }
    let Some(fence) = fence else {
        return Ok(None);
    };
    let value: Option<Vec<u8>> = column(row, 1, "leader")?;
    let left: i64 = column(row, 3, "leader")?;
    let term = u64::try_from(fence).map_err(|_| malformed("leader"))?;
    let left = Duration::from_millis(u64::try_from(left).unwrap_or(0));
    Ok(Some(Leader::new(value.unwrap_or_default(), term, left)))
}

/// A signal the LISTEN hub moves when the server announces the election.
pub(super) fn watch(backend: &PgBackend, namespace: &str, key: &str) -> LeaderWatch {
    LeaderWatch::new(backend.inner.hub.watch(namespace, key))
}
