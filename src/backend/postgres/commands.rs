//! Where statements go: a few connections of our own (reconnected when they drop), or a
//! `deadpool-postgres` pool the application already has. Every statement is one call of a
//! `distlock.*` function as an unnamed statement with typed parameters (`query_typed`): one
//! round trip, no prepared statement and no session state, so a pooler in transaction mode
//! (PgBouncer) can put each call on another server connection.
//!
//! Every call has a deadline. A call that failed on the connection is sent again on a fresh
//! connection (every function is idempotent) after a short, growing pause, until the deadline;
//! a longer outage is reported as a transient error to the layer above.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use super::tls::Endpoint;

use crate::backend::retry::{self, until_answered, Backoff, Retry};
use crate::error::{Error, ErrorKind, Result};

/// The deadline of one call, including getting a connection.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The first and the longest pause before a call that failed on the connection is sent again.
const RETRY_MIN: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_millis(500);

/// What a call returned.
pub(crate) struct Reply {
    pub(crate) rows: Vec<Row>,
    /// When the answered attempt was sent.
    pub(crate) sent: tokio::time::Instant,
    /// Whether an earlier attempt may have run on the server.
    pub(crate) in_doubt: bool,
}

/// The typed parameters of one call.
pub(crate) type Params<'a> = [(&'a (dyn ToSql + Sync), Type)];

pub(crate) enum Commands {
    OwnConnections(Box<OwnConnections>),
    #[cfg(feature = "postgres-deadpool")]
    Deadpool(deadpool_postgres::Pool),
}

/// Our own connections, opened on first use. A claim's calls all go to the same one (chosen by
/// its owner token), so a release queued behind a cancelled acquire runs after it.
pub(crate) struct OwnConnections {
    endpoint: Endpoint,
    slots: Vec<tokio::sync::Mutex<Option<Arc<Client>>>>,
}

impl OwnConnections {
    /// `connections` slots, the first holding `first` (already open).
    pub(crate) fn new(endpoint: Endpoint, connections: usize, first: Client) -> Self {
        let mut first = Some(Arc::new(first));
        Self {
            endpoint,
            slots: (0..connections.max(1))
                .map(|_| tokio::sync::Mutex::new(first.take()))
                .collect(),
        }
    }

    async fn client(&self, route: usize) -> std::result::Result<Arc<Client>, Failure> {
        let slot = &self.slots[route % self.slots.len()];
        let mut slot = slot.lock().await;
        if let Some(client) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(client.clone());
        }
        *slot = None;
        let client = Arc::new(connect(&self.endpoint).await?);
        *slot = Some(client.clone());
        Ok(client)
    }
}

/// Opens a connection (within the endpoint's connect timeout) and drives it in a task of its
/// own until it closes.
pub(crate) async fn connect(endpoint: &Endpoint) -> std::result::Result<Client, Failure> {
    let (client, connection) = endpoint.connect().await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "postgres connection closed");
        }
    });
    Ok(client)
}

type Failure = retry::Failure<tokio_postgres::Error>;

/// Which connection a call should use: the same for every call of one claim.
pub(crate) fn route_of(owner: &str) -> usize {
    owner.bytes().fold(0usize, |h, b| {
        h.wrapping_mul(31).wrapping_add(usize::from(b))
    })
}

impl Commands {
    /// Runs a statement, retrying connection failures. The reply says when the attempt that
    /// was answered was sent (leases run from then), and whether an earlier attempt may have
    /// run on the server (it failed after the request could have been sent), so the rows may
    /// describe the state that attempt left.
    pub(crate) async fn query(
        &self,
        what: &str,
        route: usize,
        sql: &str,
        params: &Params<'_>,
    ) -> Result<Reply> {
        let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
        let attempt = || async {
            tokio::time::timeout_at(deadline, self.query_once(route, sql, params))
                .await
                .unwrap_or(Err(Failure::Timeout))
        };
        // Made only once an attempt failed (see `until_answered`).
        let policy = || {
            let mut pause = Backoff::new(RETRY_MIN, RETRY_MAX);
            move |failure: Failure| {
                let (retry, in_doubt) = match &failure {
                    // The deadline passed: the call fails, and the connection it may still be
                    // waiting on is forgotten.
                    Failure::Timeout => {
                        self.reset(route);
                        return Retry::Fail(describe(what, failure).transient());
                    }
                    // Refused before anything ran: a fresh connection may do better.
                    Failure::Call(e) if is_retryable_state(e) => (true, false),
                    Failure::Call(e) if e.code().is_some() => (false, false),
                    Failure::Call(_) => (true, true),
                    Failure::Pool(_) => (true, false),
                };
                if !retry {
                    return Retry::Fail(describe(what, failure));
                }
                // Sent again on a fresh connection after a short pause, while the deadline allows.
                let wait = pause.current();
                if tokio::time::Instant::now() + wait >= deadline {
                    return Retry::Fail(describe(what, failure).transient());
                }
                pause.grow();
                Retry::Again {
                    pause: Some(wait),
                    in_doubt,
                }
            }
        };
        let answered = until_answered(attempt, policy).await?;
        Ok(Reply {
            rows: answered.value,
            sent: answered.sent,
            in_doubt: answered.in_doubt,
        })
    }

    /// Forgets the connection a call timed out on (its reply may never come), so the next call
    /// opens a fresh one.
    fn reset(&self, route: usize) {
        match self {
            Self::OwnConnections(own) => {
                let slot = &own.slots[route % own.slots.len()];
                if let Ok(mut slot) = slot.try_lock() {
                    *slot = None;
                }
            }
            #[cfg(feature = "postgres-deadpool")]
            Self::Deadpool(_) => {}
        }
    }

    async fn query_once(
        &self,
        route: usize,
        sql: &str,
        params: &Params<'_>,
    ) -> std::result::Result<Vec<Row>, Failure> {
        match self {
            Self::OwnConnections(own) => {
                let client = own.client(route).await?;
                client.query_typed(sql, params).await.map_err(Failure::Call)
            }
            #[cfg(feature = "postgres-deadpool")]
            Self::Deadpool(pool) => {
                let client = pool.get().await.map_err(|e| Failure::pool("deadpool", e))?;
                client.query_typed(sql, params).await.map_err(Failure::Call)
            }
        }
    }
}

/// Server errors that say the statement did not run and may on another try: lock waits cut
/// short, deadlocks broken, a server shutting down or starting up.
fn is_retryable_state(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code().map(|c| c.code()),
        Some("55P03" | "40P01" | "40001" | "57P01" | "57P02" | "57P03" | "53300")
    ) || e.code().is_some_and(|c| c.code().starts_with("08"))
}

fn describe(what: &str, failure: Failure) -> Error {
    failure.describe("postgres", what, CALL_TIMEOUT, pg_error)
}

/// Names the failures users must tell apart, and keeps the cause as the source.
pub(crate) fn pg_error(what: &str, e: tokio_postgres::Error) -> Error {
    let message = match e.code().map(|c| c.code()) {
        Some("42501") => format!(
            "postgres {what} failed: permission denied (grant the role USAGE on schema distlock and EXECUTE on its functions, or CREATE to install it)"
        ),
        Some("3F000" | "42883" | "42P01") => format!(
            "postgres {what} failed: the distlock schema is missing or incomplete (apply `PgBackend::schema_sql()`)"
        ),
        Some("28000" | "28P01") => {
            format!("postgres {what} failed: authentication refused")
        }
        Some("3D000") => format!("postgres {what} failed: the database does not exist"),
        Some(code) => format!("postgres {what} failed ({code})"),
        None if tls_failed(&e) => format!(
            "postgres {what} failed: the TLS handshake failed (the server's certificate, or the sslmode and sslrootcert settings)"
        ),
        None => format!("postgres {what} failed"),
    };
    let err = Error::new(ErrorKind::Backend, message);
    // The crate's one rule (`Error::is_transient`): not reached, or "not now".
    let err = if passing_pg(&e) { err.transient() } else { err };
    err.with_source(e)
}

/// Whether the TLS handshake failed (tokio-postgres has no other way to say so).
fn tls_failed(e: &tokio_postgres::Error) -> bool {
    e.to_string().starts_with("error performing TLS handshake")
}

/// Whether `e` may pass with nothing changed: the server was not reached or dropped the
/// connection, or its SQLSTATE says "not now" (connection exceptions, shutdown or startup,
/// too many connections or other resources, serialization failure, deadlock).
fn passing_pg(e: &tokio_postgres::Error) -> bool {
    match e.code().map(|c| c.code()) {
        Some(code) => {
            // Connection exceptions that say the link failed, not that the server refused
            // (PgBouncer reports every refusal as 08P01, protocol violation).
            matches!(code, "08000" | "08001" | "08003" | "08006")
                || code.starts_with("53")
                || matches!(code, "57P01" | "57P02" | "57P03" | "40001" | "40P01")
        }
        // A certificate refused stays refused.
        None if tls_failed(e) => false,
        None => {
            e.is_closed()
                || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
                || e.to_string().starts_with("timeout")
        }
    }
}
