//! The PostgreSQL backend: a lease table with FIFO handoff announced over LISTEN/NOTIFY.
//!
//! Tables in the `distlock` schema (see `schema.sql`): `keys` (one row per key in use: its
//! family and fencing counter) and `claims` (one row per holder or waiter: FIFO order, fencing
//! token once granted, and a deadline on the server's clock: the lease of a holder, the
//! liveness of a waiter). Every operation is one call of a PL/pgSQL function, one short
//! transaction that locks the key's row, so calls need no session state and work through a
//! pooler in transaction mode.
//!
//! A release hands the lock straight to the live head of the queue (fencing token, short
//! unconfirmed lease) and NOTIFYs the one client that owns it, on that client's own channel
//! (`distlock_<client id>`). The new owner learns of its grant from the message and confirms it
//! with its first renewal; an election's candidate confirms it by asking again before its
//! campaign returns, and only a confirmed grant makes it the leader (see `election.rs`). Notifications are sent only by transactions that hand a lock on, so an
//! uncontended acquire never takes the server-wide lock a notifying commit takes. A waiter that
//! misses a message re-checks at the holder's lease deadline, or when the LISTEN connection
//! comes back.

mod builder;
mod commands;
mod election;
mod listen;
mod schema;
mod tls;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::types::Type;
use tokio_postgres::Row;

pub use self::builder::PgBackendBuilder;
use self::commands::{route_of, Commands, Params};
use self::listen::{ListenHub, Registration};
use super::handoff::renewal::{fail_all, RenewAnswer};
use super::handoff::reply::{downgraded, granted, lease_left, queued, released};
use super::handoff::{self, wait_for_handoff, Asking, HandoffTicket, Listener};
use super::wire::{kind_mismatch, owner_token, parse_family};
use super::{Attempt, Backend, Claim, Family, Grant, Leader, LeaderWatch, LockKind, Renewal};
use crate::error::{Error, ErrorKind, Result};
use crate::inspect::{
    ForceReleased, Holder as InspectedHolder, Inspection, Waiter as InspectedWaiter,
};

/// Locks in a PostgreSQL database (12 or newer): leased, fenced and FIFO, woken by
/// LISTEN/NOTIFY.
///
/// Statements go over a few connections of its own, or through a `deadpool-postgres` pool the
/// application already has (feature `postgres-deadpool`); each is one function call in its own
/// short transaction, with no session state, so a pooler in transaction mode (PgBouncer) works.
/// Waiters share one dedicated LISTEN connection per backend, which must reach the server
/// directly or through a pooler in session mode ([`listen_url`](PgBackendBuilder::listen_url)).
/// In `pg_stat_activity` the statement connections carry the URL's `application_name`
/// (`distlock` if it names none) and the LISTEN connection the same name with `-listen` added.
///
/// The tables live in the schema `distlock`, created on first use (or by you, from
/// [`schema_sql`](Self::schema_sql)). A lease is a deadline on the server's clock: a holder that
/// dies keeps the lock until its lease runs out, not until TCP notices. Fencing tokens come from
/// a per-key counter in the same transaction as the grant, and never fall below the server's
/// time in microseconds, so they keep increasing even after a counter was lost.
///
/// Fencing tokens are durable as far as the grant's commit is: keep `synchronous_commit` on
/// (the default), and with a standby that may be promoted, make it synchronous
/// (`synchronous_standby_names`), or a failover can forget the last grants.
///
/// `PgBackend` is a cheap `Clone` handle.
///
/// # Examples
///
/// ```no_run
/// use distlock::{backend::PgBackend, LockClient};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let backend = PgBackend::connect("postgres://app:secret@127.0.0.1:5432/app").await?;
/// let client = LockClient::builder(backend).namespace("billing").build()?;
/// let guard = client.mutex("invoice:7").lock().await?;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PgBackend {
    inner: Arc<Inner>,
}

struct Inner {
    commands: Commands,
    hub: ListenHub,
    handoff_ttl: Duration,
    /// This backend's part of every owner token, and of its channel's name.
    client_id: String,
}

impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackend")
            .field("handoff_ttl", &self.inner.handoff_ttl)
            .finish_non_exhaustive()
    }
}

impl PgBackend {
    /// Starts building a backend for the database at `url`
    /// (`postgres://[user[:password]@]host[:port]/database[?options]`, or a `key=value`
    /// connection string). The URL is used for the LISTEN connection (unless
    /// [`listen_url`](PgBackendBuilder::listen_url) says otherwise), and for statements unless
    /// a pool is given. TLS follows libpq's `sslmode` and `sslrootcert` URL parameters
    /// (`require`, `verify-ca`, `verify-full` need the `postgres-tls` feature): see
    /// [`tls_root_certificate`](PgBackendBuilder::tls_root_certificate).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let backend = distlock::backend::PgBackend::builder("postgres://app@pgbouncer:6432/app")
    ///     .listen_url("postgres://app@db-primary:5432/app")
    ///     .build()
    ///     .await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(url: impl Into<String>) -> PgBackendBuilder {
        PgBackendBuilder::new(url.into())
    }

    /// Connects to the database at `url` with its own connections, creating the schema if it
    /// is missing.
    ///
    /// # Errors
    ///
    /// See [`PgBackendBuilder::build`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is left behind but a background LISTEN task that stops when the
    /// backend is dropped.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let backend = distlock::backend::PgBackend::connect("postgres://postgres@127.0.0.1/app").await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).build().await
    }

    /// The SQL that creates the `distlock` schema (tables, functions and a version row), for
    /// a migration tool or a DBA. Run it in one transaction by a role allowed to create the
    /// schema; the roles that take locks then need `USAGE` on the schema, `EXECUTE` on its
    /// functions and `SELECT, INSERT, UPDATE, DELETE` on its tables.
    ///
    /// # Examples
    ///
    /// ```
    /// let sql = distlock::backend::PgBackend::schema_sql();
    /// assert!(sql.contains("CREATE SCHEMA IF NOT EXISTS distlock"));
    /// ```
    pub fn schema_sql() -> &'static str {
        schema::SQL
    }
}

/// What one claim keeps between calls: its registration with the LISTEN hub while it waits,
/// and the pairing of local and server clocks from its last request, to place a handoff on the
/// local clock.
#[derive(Default)]
pub struct PgTicket(HandoffTicket<Registration>);

impl std::fmt::Debug for PgTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTicket").finish_non_exhaustive()
    }
}

/// A claim as the functions take it.
struct Call<'a> {
    ns: &'a str,
    key: &'a str,
    owner: String,
    route: usize,
}

/// A claim's owner token on the server: this backend's client id, then the claim's.
fn owner_of(client_id: &str, claim: &Claim) -> String {
    owner_token(client_id, claim.owner())
}

impl<'a> Call<'a> {
    fn new(claim: &'a Claim, client_id: &str) -> Self {
        let owner = owner_of(client_id, claim);
        Self {
            ns: claim.namespace(),
            key: claim.key(),
            route: route_of(&owner),
            owner,
        }
    }
}

/// How a claim's kind is written in the tables: mode, permits, the semaphore's size.
fn mode_of(kind: LockKind) -> (&'static str, i32, i32) {
    let int = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    match kind {
        LockKind::Read => ("r", 1, 0),
        LockKind::Write => ("w", 1, 0),
        LockKind::Permits { count, max } => ("p", int(count), int(max)),
        LockKind::Leader => ("l", 1, 0),
        _ => ("x", 1, 0),
    }
}

/// A claim's kind as the tables write it (`mode`, and `permits` of the key's `family`).
fn kind_of(mode: &str, permits: i32, family: Family, what: &str) -> Result<LockKind> {
    Ok(match (mode, family) {
        ("r", _) => LockKind::Read,
        ("w", _) => LockKind::Write,
        ("l", _) => LockKind::Leader,
        ("p", Family::Semaphore { max }) => LockKind::Permits {
            count: u32::try_from(permits).map_err(|_| malformed(what))?,
            max,
        },
        _ => LockKind::Exclusive,
    })
}

fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX).max(1)
}

fn malformed(what: &str) -> Error {
    Error::new(
        ErrorKind::Backend,
        format!("postgres {what} returned a malformed reply"),
    )
}

fn column<'r, T: tokio_postgres::types::FromSql<'r>>(
    row: &'r Row,
    i: usize,
    what: &str,
) -> Result<T> {
    row.try_get(i).map_err(|e| malformed(what).with_source(e))
}

const ACQUIRE: &str = "SELECT code, value, server_ms, family FROM distlock.acquire($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
const RELEASE: &str = "SELECT distlock.release($1, $2, $3, $4)";
const DOWNGRADE: &str = "SELECT code, fence FROM distlock.downgrade($1, $2, $3, $4, $5)";
const RENEW: &str = "SELECT i, held FROM distlock.renew($1, $2, $3, $4)";
const NOTIFY: &str = "SELECT pg_notify($1, $2)";
/// The operator's unlock, in one statement (one transaction): `distlock.release` for every
/// holder of the key, as its own release would run (handing on, notifying the new holders);
/// the rows of the holders it removed while their lease was live. No schema change: the key's
/// fence counter (`next_fence`) already stays above every token it handed out.
const FORCE_RELEASE: &str = "SELECT family, mode, permits, fence, left_ms FROM (\
    SELECT k.family || CASE WHEN k.family = 'sem' THEN ':' || k.max_permits ELSE '' END AS family, \
      c.mode, c.permits, c.fence, \
      distlock.ms(c.deadline) - distlock.ms(clock_timestamp()) AS left_ms, \
      distlock.release(c.ns, c.key, c.owner, $3) AS held \
    FROM distlock.claims c JOIN distlock.keys k ON k.ns = c.ns AND k.key = c.key \
    WHERE c.ns = $1 AND c.key = $2 AND c.fence IS NOT NULL \
    ORDER BY c.seq) r WHERE held = 1";
const INSPECT: &str = "SELECT family, mode, permits, fence, left_ms FROM distlock.inspect($1, $2)";

impl Listener for Asking<'_, PgBackend, PgTicket, Call<'_>> {
    async fn ask(&self, wait: bool) -> Result<Attempt> {
        let (backend, claim, call) = (self.backend, self.claim, self.names);
        let (mode, count, max) = mode_of(claim.kind());
        let (ttl, handoff) = (millis(claim.ttl()), millis(backend.inner.handoff_ttl));
        let proclaims = claim.value();
        let value: Option<&[u8]> = (claim.kind() == LockKind::Leader).then_some(&proclaims);
        let params: &Params<'_> = &[
            (&call.ns, Type::TEXT),
            (&call.key, Type::TEXT),
            (&call.owner, Type::TEXT),
            (&mode, Type::TEXT),
            (&count, Type::INT4),
            (&max, Type::INT4),
            (&ttl, Type::INT4),
            (&wait, Type::BOOL),
            (&handoff, Type::INT4),
            (&value, Type::BYTEA),
        ];
        let reply = backend
            .inner
            .commands
            .query("acquire", call.route, ACQUIRE, params)
            .await?;
        let sent = reply.sent;
        let row = reply.rows.first().ok_or_else(|| malformed("acquire"))?;
        let code: i32 = column(row, 0, "acquire")?;
        let value: i64 = column(row, 1, "acquire")?;
        let server_ms: i64 = column(row, 2, "acquire")?;
        match code {
            1 => Ok(Attempt::Granted(granted("postgres", claim, value, sent)?)),
            0 => {
                // How long the earliest holder's lease has left; -1: no holder to wait out.
                let wait = match value {
                    -1 => claim.ttl(),
                    ms => lease_left(ms),
                };
                Ok(Attempt::Queued {
                    recheck_at: Some(queued(&self.ticket.0.clock, sent, server_ms, wait)),
                })
            }
            _ => {
                let family: Option<String> = column(row, 3, "acquire")?;
                Err(kind_mismatch(
                    claim.key(),
                    &family.unwrap_or_default(),
                    claim.kind(),
                ))
            }
        }
    }

    /// Registered at once: it needs no I/O.
    fn listening(&self) -> bool {
        if !self.ticket.0.is_listening() {
            let registration = self.backend.inner.hub.register(&self.names.owner);
            self.ticket.0.set(Some(registration));
        }
        true
    }

    async fn listen(&self) -> Result<Option<Attempt>> {
        Ok(None)
    }

    fn stop_listening(&self) {
        self.ticket.0.set(None);
    }
}

impl Backend for PgBackend {
    type Ticket = PgTicket;
    const RENEWS_WAITERS: bool = true;

    fn supports(&self, _kind: LockKind) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn proclaim(&self, claim: &Claim, _ticket: &PgTicket) -> Result<()> {
        election::proclaim(self, claim).await
    }

    async fn leader(&self, namespace: &str, key: &str) -> Result<Option<Leader>> {
        election::leader(self, namespace, key).await
    }

    async fn watch_leader(&self, namespace: &str, key: &str) -> Result<LeaderWatch> {
        Ok(election::watch(self, namespace, key))
    }

    fn reconnects(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.inner.hub.reconnects())
    }

    async fn acquire(&self, claim: &Claim, ticket: &PgTicket, wait: bool) -> Result<Attempt> {
        let call = Call::new(claim, &self.inner.client_id);
        handoff::acquire(self, claim, ticket, &call, wait, false).await
    }

    async fn wait(
        &self,
        claim: &Claim,
        ticket: &PgTicket,
        recheck_at: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let grant = wait_for_handoff(&ticket.0, recheck_at).await?;
        // An election handed to this candidate is provisional on the server (not its leader,
        // not announced) until the candidate confirms it: it asks again (`None`), which
        // confirms it with a full lease and announces it, before the campaign returns.
        Ok(grant.filter(|_| claim.kind() != LockKind::Leader))
    }

    async fn release(&self, claim: &Claim, ticket: &PgTicket) -> Result<bool> {
        ticket.0.set(None);
        let call = Call::new(claim, &self.inner.client_id);
        let handoff = millis(self.inner.handoff_ttl);
        let params: &Params<'_> = &[
            (&call.ns, Type::TEXT),
            (&call.key, Type::TEXT),
            (&call.owner, Type::TEXT),
            (&handoff, Type::INT4),
        ];
        let reply = self
            .inner
            .commands
            .query("release", call.route, RELEASE, params)
            .await?;
        let row = reply.rows.first().ok_or_else(|| malformed("release"))?;
        let held: i32 = column(row, 0, "release")?;
        Ok(released(
            usize::from(held == 1),
            usize::from(reply.in_doubt),
            1,
        ))
    }

    async fn downgrade(&self, claim: &Claim, _ticket: &PgTicket) -> Result<Grant> {
        let call = Call::new(claim, &self.inner.client_id);
        let (ttl, handoff) = (millis(claim.ttl()), millis(self.inner.handoff_ttl));
        let params: &Params<'_> = &[
            (&call.ns, Type::TEXT),
            (&call.key, Type::TEXT),
            (&call.owner, Type::TEXT),
            (&ttl, Type::INT4),
            (&handoff, Type::INT4),
        ];
        let reply = self
            .inner
            .commands
            .query("downgrade", call.route, DOWNGRADE, params)
            .await?;
        let sent = reply.sent;
        let row = reply.rows.first().ok_or_else(|| malformed("downgrade"))?;
        let done: i32 = column(row, 0, "downgrade")?;
        downgraded("postgres", claim, done == 1, sent, || {
            column(row, 1, "downgrade")
        })
    }

    async fn renew(&self, claims: &[(&Claim, &PgTicket)]) -> Vec<Renewal> {
        let n = claims.len();
        let (mut nss, mut keys, mut owners, mut ttls) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for (claim, _) in claims {
            nss.push(claim.namespace());
            keys.push(claim.key());
            owners.push(owner_of(&self.inner.client_id, claim));
            ttls.push(millis(claim.ttl()));
        }
        let params: &Params<'_> = &[
            (&nss, Type::TEXT_ARRAY),
            (&keys, Type::TEXT_ARRAY),
            (&owners, Type::TEXT_ARRAY),
            (&ttls, Type::INT4_ARRAY),
        ];
        let route = owners.first().map_or(0, |o| route_of(o));
        let (rows, sent) = match self
            .inner
            .commands
            .query("renew", route, RENEW, params)
            .await
        {
            Ok(reply) => (reply.rows, reply.sent),
            Err(err) => return fail_all(n, &err),
        };
        // Positions (1-based) the server extended, and whether each holds the lock; the rest
        // are not owners any more.
        let mut alive: Vec<Option<bool>> = vec![None; n];
        for row in &rows {
            let (Ok(i), Ok(held)) = (row.try_get::<_, i64>(0), row.try_get::<_, bool>(1)) else {
                return fail_all(n, &malformed("renew"));
            };
            if let Some(slot) = usize::try_from(i - 1).ok().and_then(|i| alive.get_mut(i)) {
                *slot = Some(held);
            }
        }
        claims
            .iter()
            .zip(alive)
            .map(|((claim, _), alive)| {
                let answer = match alive {
                    Some(true) => RenewAnswer::Lease,
                    Some(false) => RenewAnswer::Place,
                    None => RenewAnswer::Neither,
                };
                answer.renewal(sent, claim.ttl())
            })
            .collect()
    }

    async fn inspect(&self, namespace: &str, key: &str) -> Result<Inspection> {
        let params: &Params<'_> = &[(&namespace, Type::TEXT), (&key, Type::TEXT)];
        let rows = self
            .inner
            .commands
            .query("inspect", route_of(key), INSPECT, params)
            .await?
            .rows;
        let mut seen = Inspection::free(key);
        for row in &rows {
            let family: String = column(row, 0, "inspect")?;
            let family = parse_family(&family).ok_or_else(|| malformed("inspect"))?;
            let Some(mode) = column::<Option<String>>(row, 1, "inspect")? else {
                continue;
            };
            seen.family = Some(family);
            let permits: i32 = column(row, 2, "inspect")?;
            let kind = kind_of(&mode, permits, family, "inspect")?;
            let fence: Option<i64> = column(row, 3, "inspect")?;
            let left: i64 = column(row, 4, "inspect")?;
            match fence {
                Some(fence) => seen.holders.push(InspectedHolder {
                    kind,
                    fencing_token: u64::try_from(fence).ok(),
                    lease_left: u64::try_from(left).ok().map(Duration::from_millis),
                }),
                None => seen.waiters.push(InspectedWaiter { kind, waited: None }),
            }
        }
        Ok(seen)
    }

    async fn force_release(&self, namespace: &str, key: &str) -> Result<ForceReleased> {
        let handoff = millis(self.inner.handoff_ttl);
        let params: &Params<'_> = &[
            (&namespace, Type::TEXT),
            (&key, Type::TEXT),
            (&handoff, Type::INT4),
        ];
        let rows = self
            .inner
            .commands
            .query("force_release", route_of(key), FORCE_RELEASE, params)
            .await?
            .rows;
        let mut removed = ForceReleased::nothing(key);
        for row in &rows {
            let family: String = column(row, 0, "force_release")?;
            let family = parse_family(&family).ok_or_else(|| malformed("force_release"))?;
            removed.family = Some(family);
            let mode: String = column(row, 1, "force_release")?;
            let permits: i32 = column(row, 2, "force_release")?;
            let kind = kind_of(&mode, permits, family, "force_release")?;
            let fence: Option<i64> = column(row, 3, "force_release")?;
            let left: i64 = column(row, 4, "force_release")?;
            removed.removed.push(InspectedHolder {
                kind,
                fencing_token: fence.and_then(|f| u64::try_from(f).ok()),
                lease_left: u64::try_from(left).ok().map(Duration::from_millis),
            });
        }
        Ok(removed)
    }

    async fn shutdown(&self) {
        self.inner.hub.close();
    }
}
