//! What a client knows of its Redis server's restarts, and the rule it keeps after one.
//!
//! A server restarted without its data (no persistence, or a crash before its last writes were
//! saved) has forgotten its locks, while a holder from before goes on believing until it renews
//! and learns the lock is gone, or until its lease ends if it cannot reach the server. A
//! client that sees the restart (across a reconnect of its pub/sub connection, a server of
//! another run id, started since the last connect: not a replica promoted meanwhile, which ran
//! all along) therefore grants nothing there until one lease (the claim's TTL) after the
//! server started: by then every lease granted before the crash has ended, told or not. While
//! that connection is down and the server not identified again, the client grants nothing
//! either, so a waiter asking again the moment the server is back cannot overtake the check.
//!
//! A client that first connects after the restart cannot know of it; the README says so.

use std::sync::Mutex as StdMutex;
use std::time::Duration;

use ::redis::{RedisError, RedisResult};

use tokio::time::Instant;

use super::pubsub::Source;
use crate::sync::LockExt;

/// How soon a claim asks again while the server is not identified since the connection
/// dropped, if nothing wakes it first (the reconnect wakes every waiter with a mailbox).
const UNIDENTIFIED_RECHECK: Duration = Duration::from_millis(100);

/// Who answered a connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Server {
    /// The server's run id, new at every start; `None` where `INFO` is refused.
    run_id: Option<String>,
    /// When it started, at the latest.
    started: Instant,
}

impl Server {
    /// Reads `INFO server`, answered at `now`. Its uptime counts whole seconds and may be one
    /// ahead: one is taken off, so the start is never placed before the real one.
    pub(crate) fn from_info(info: &::redis::InfoDict, now: Instant) -> Self {
        let up = info.get::<u64>("uptime_in_seconds").unwrap_or(0);
        let up = Duration::from_secs(up.saturating_sub(1));
        Self {
            run_id: info.get("run_id"),
            started: now.checked_sub(up).unwrap_or(now),
        }
    }

    /// A server that refused `INFO` (an ACL without it): it may have restarted at any
    /// reconnect, and counts as started at `now`.
    pub(crate) fn unknown(now: Instant) -> Self {
        Self {
            run_id: None,
            started: now,
        }
    }
}

/// A client's knowledge of its server's restarts.
#[derive(Default)]
pub(crate) struct Restarts {
    state: StdMutex<State>,
}

#[derive(Default)]
struct State {
    /// Who answered the last connect, and when; `None` before the first.
    last: Option<(Server, Instant)>,
    /// The connection dropped and the server is not identified since.
    unidentified: bool,
    /// When the latest restart seen started.
    restarted: Option<Instant>,
}

impl Restarts {
    /// The pub/sub connection is down: until the next connect identifies the server, it may
    /// be a restarted one.
    pub(crate) fn dropped(&self) {
        let mut state = self.state.locked();
        state.unidentified = state.last.is_some();
    }

    /// A connect reached `server`. Another run id than the last connect's (or none to compare),
    /// started since, is a restart.
    pub(crate) fn identified(&self, server: Server) {
        let mut state = self.state.locked();
        if let Some((last, at)) = &state.last {
            let other = server.run_id.is_none() || server.run_id != last.run_id;
            if other && server.started > *at {
                tracing::warn!(
                    "redis server restarted: no lock is granted through this client until a lease after its start"
                );
                state.restarted = Some(server.started);
            }
        }
        state.last = Some((server, Instant::now()));
        state.unidentified = false;
    }

    /// Asks who a connect of `source` reached, within `limit`, and records it: one server, or
    /// a Sentinel's primary (a Cluster's primaries each restart on their own: not asked). An
    /// ask that fails or goes unanswered fails the connect.
    pub(crate) async fn identify(&self, source: &Source, limit: Duration) -> RedisResult<()> {
        let ask = async {
            let mut conn = match source {
                Source::Single(client) => client.get_multiplexed_async_connection().await?,
                #[cfg(feature = "redis-sentinel")]
                Source::Sentinel(sentinel) => sentinel.connection().await?,
                #[cfg(feature = "redis-cluster")]
                Source::Cluster(_) => return Ok(None),
            };
            // The whole ask has `limit`; redis-rs's own default (500 ms) would fail every
            // connect to a server slower than that to answer, and the pub/sub connection
            // would never open.
            conn.set_response_timeout(limit);
            let info = ::redis::cmd("INFO")
                .arg("server")
                .query_async::<::redis::InfoDict>(&mut conn)
                .await;
            match info {
                Ok(info) => Ok(Some(Server::from_info(&info, Instant::now()))),
                Err(e) if e.code().is_some() => Ok(Some(Server::unknown(Instant::now()))),
                Err(e) => Err(e),
            }
        };
        let asked = tokio::time::timeout(limit, ask)
            .await
            .map_err(|_| RedisError::from((::redis::ErrorKind::Io, "redis INFO timed out")))?;
        if let Some(server) = asked? {
            self.identified(server);
        }
        Ok(())
    }

    /// Until when a claim of lease `ttl` must not be granted, if it must wait: one lease after
    /// the latest restart seen, or a moment while the server is not identified again.
    pub(crate) fn gate(&self, ttl: Duration) -> Option<Instant> {
        let state = self.state.locked();
        let now = Instant::now();
        if state.unidentified {
            return Some(now + UNIDENTIFIED_RECHECK);
        }
        // A TTL is bounded (`validate_ttl`), and so is this sum.
        let until = state.restarted? + ttl;
        (until > now).then_some(until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(run_id: &str, uptime: u64) -> ::redis::InfoDict {
        ::redis::InfoDict::new(&format!(
            "# Server\r\nrun_id:{run_id}\r\nuptime_in_seconds:{uptime}\r\n"
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_connect_and_a_reconnect_to_the_same_server_gate_nothing() {
        let restarts = Restarts::default();
        let ttl = Duration::from_secs(2);
        restarts.identified(Server::from_info(&info("a", 0), Instant::now()));
        assert_eq!(restarts.gate(ttl), None);
        restarts.dropped();
        restarts.identified(Server::from_info(&info("a", 5), Instant::now()));
        assert_eq!(restarts.gate(ttl), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_restart_gates_grants_until_a_lease_after_the_start() {
        let restarts = Restarts::default();
        let ttl = Duration::from_secs(2);
        restarts.identified(Server::from_info(&info("a", 100), Instant::now()));
        restarts.dropped();
        // Dropped and not identified again: gated, asked again soon.
        assert_eq!(
            restarts.gate(ttl),
            Some(Instant::now() + UNIDENTIFIED_RECHECK)
        );
        tokio::time::advance(Duration::from_secs(4)).await;
        // Up 3 s by its count: started 2 s ago at the latest, so gated 0 s more.
        restarts.identified(Server::from_info(&info("b", 3), Instant::now()));
        assert_eq!(restarts.gate(ttl), None);
        assert!(restarts.gate(Duration::from_secs(5)).is_some());
        restarts.dropped();
        tokio::time::advance(Duration::from_millis(500)).await;
        restarts.identified(Server::from_info(&info("c", 1), Instant::now()));
        let until = restarts.gate(ttl);
        assert_eq!(until, Some(Instant::now() + ttl));
        tokio::time::advance(ttl).await;
        assert_eq!(restarts.gate(ttl), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_promoted_meanwhile_is_no_restart() {
        let restarts = Restarts::default();
        tokio::time::advance(Duration::from_secs(60)).await;
        restarts.identified(Server::from_info(&info("primary", 50), Instant::now()));
        restarts.dropped();
        tokio::time::advance(Duration::from_secs(5)).await;
        // Up since before the last connect: it ran all along, as the old primary's replica.
        restarts.identified(Server::from_info(&info("replica", 30), Instant::now()));
        assert_eq!(restarts.gate(Duration::from_secs(30)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_refusing_info_counts_as_restarted_at_every_reconnect() {
        let restarts = Restarts::default();
        let ttl = Duration::from_secs(2);
        restarts.identified(Server::unknown(Instant::now()));
        assert_eq!(restarts.gate(ttl), None);
        restarts.dropped();
        tokio::time::advance(Duration::from_millis(1)).await;
        restarts.identified(Server::unknown(Instant::now()));
        assert_eq!(restarts.gate(ttl), Some(Instant::now() + ttl));
    }
}
