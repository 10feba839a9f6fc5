//! Building a [`PgBackend`]: the URL and its TLS, the connections for statements (its own or a
//! pool's), the schema, and the LISTEN connection, checked to hear what other connections send.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::Type;

use super::commands::{self, pg_error, route_of, Commands, OwnConnections, Params};
use super::listen::ListenHub;
use super::tls::{self, Endpoint};
use super::{schema, Inner, PgBackend, NOTIFY};
use crate::backend::handoff::{check_handoff_ttl, DEFAULT_HANDOFF_TTL};
use crate::backend::wire;
use crate::backend::{require_runtime, retry};
use crate::error::{Error, ErrorKind, Result};

/// How many connections of its own a backend opens for statements, by default.
const DEFAULT_CONNECTIONS: usize = 2;

enum Source {
    OwnConnections,
    #[cfg(feature = "postgres-deadpool")]
    Deadpool(deadpool_postgres::Pool),
}

/// Builds a [`PgBackend`]. Created by [`PgBackend::builder`].
#[must_use = "builder does nothing itself, use `.build()` to build it"]
pub struct PgBackendBuilder {
    url: String,
    listen_url: Option<String>,
    source: Source,
    connections: usize,
    handoff_ttl: Duration,
    create_schema: bool,
    root_certificate: Option<Vec<u8>>,
}

impl std::fmt::Debug for PgBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackendBuilder")
            .field("connections", &self.connections)
            .field("handoff_ttl", &self.handoff_ttl)
            .field("create_schema", &self.create_schema)
            .finish_non_exhaustive()
    }
}

impl PgBackendBuilder {
    pub(super) fn new(url: String) -> Self {
        Self {
            url,
            listen_url: None,
            source: Source::OwnConnections,
            connections: DEFAULT_CONNECTIONS,
            handoff_ttl: DEFAULT_HANDOFF_TTL,
            create_schema: true,
            root_certificate: None,
        }
    }

    /// Sends statements through a `deadpool-postgres` pool instead of connections of its own.
    /// The pool may sit behind a pooler in transaction mode; the LISTEN connection still
    /// needs the URL (or [`listen_url`](Self::listen_url)).
    #[cfg(feature = "postgres-deadpool")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres-deadpool")))]
    pub fn deadpool(mut self, pool: deadpool_postgres::Pool) -> Self {
        self.source = Source::Deadpool(pool);
        self
    }

    /// Trusts the CA certificate(s) `pem` (PEM) for TLS instead of the system roots, where
    /// the URL names no `sslrootcert` file: for `sslmode=verify-ca` or `verify-full` against a
    /// server with a private CA (`require` with a root certificate checks the chain too, as
    /// libpq does). Used by every connection the backend opens itself; a pool's connections
    /// are the pool's to configure.
    ///
    /// | `sslmode` | encrypted | server checked |
    /// |---|---|---|
    /// | `disable` | no | — |
    /// | `allow`, `prefer` (the default) | if the server offers TLS | no (as libpq) |
    /// | `require` | yes | no; with a root certificate given, as `verify-ca` |
    /// | `verify-ca` | yes | chain to a trusted root |
    /// | `verify-full` | yes | chain to a trusted root, and the certificate names the host |
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ca = std::fs::read("/etc/ssl/db-ca.pem")?;
    /// let backend =
    ///     distlock::backend::PgBackend::builder("postgres://app@db.internal/app?sslmode=verify-full")
    ///         .tls_root_certificate(ca)
    ///         .build()
    ///         .await?;
    /// # drop(backend);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "postgres-tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres-tls")))]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificate = Some(pem.into());
        self
    }

    /// The URL of the dedicated LISTEN connection, when statements go through a pooler in
    /// transaction mode (which cannot keep a LISTEN): the server itself, or a pooler in session
    /// mode. Defaults to the main URL. [`build`](Self::build) refuses a LISTEN connection that
    /// does not hear notifications (a main URL through PgBouncer in transaction mode, with no
    /// `listen_url`).
    pub fn listen_url(mut self, url: impl Into<String>) -> Self {
        self.listen_url = Some(url.into());
        self
    }

    /// How many connections of its own the backend opens for statements (each on first use).
    /// One claim's statements always use the same one. Defaults to 2.
    pub fn connections(mut self, connections: usize) -> Self {
        self.connections = connections;
        self
    }

    /// The lease a lock handed to a waiter gets until the waiter confirms it (at its first
    /// renewal, a third of the way in; an election's candidate confirms before its campaign
    /// returns, and leads only then). Bounds how long a lock handed to a waiter that died
    /// just before stays stuck. Defaults to 2 seconds.
    pub fn handoff_ttl(mut self, ttl: Duration) -> Self {
        self.handoff_ttl = ttl;
        self
    }

    /// Whether to create the `distlock` schema when it is missing (the default), or to fail,
    /// for databases whose schema only a migration tool changes (see
    /// [`PgBackend::schema_sql`]).
    pub fn create_schema(mut self, create: bool) -> Self {
        self.create_schema = create;
        self
    }

    /// Connects, checks the server version and the schema (creating it if allowed), starts
    /// listening, and checks that the LISTEN connection hears a `NOTIFY` sent on a statement
    /// connection (one round trip).
    ///
    /// # Errors
    ///
    /// - [`InvalidConfig`](crate::ErrorKind::InvalidConfig) for a malformed URL, zero
    ///   connections, a handoff TTL under 10 ms, or a LISTEN connection that does not hear a
    ///   notification sent from a statement connection (it goes through a pooler in
    ///   transaction mode: set [`listen_url`](Self::listen_url)),
    /// - [`Unsupported`](crate::ErrorKind::Unsupported) for a server older than PostgreSQL 12
    ///   or a schema of another version,
    /// - [`Backend`](crate::ErrorKind::Backend) if the server cannot be reached, refuses the
    ///   credentials, or the schema is missing and cannot (or may not) be created,
    /// - [`NoRuntime`](crate::ErrorKind::NoRuntime) outside a Tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. A schema install cut short is rolled back by the server.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let err = distlock::backend::PgBackend::builder("postgres://host:notaport/db")
    ///     .build()
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_invalid_config());
    /// # }
    /// ```
    pub async fn build(self) -> Result<PgBackend> {
        check_handoff_ttl(self.handoff_ttl)?;
        if self.connections == 0 {
            return Err(Error::invalid_config(
                "a postgres backend needs at least one connection",
            ));
        }
        let root = self.root_certificate.as_deref();
        let config = parse_url(&self.url, root)?;
        let mut listen = match &self.listen_url {
            Some(url) => parse_url(url, root)?,
            None => config.clone(),
        };
        // Tells the LISTEN connection apart in `pg_stat_activity`: `<name>-listen`.
        if let Some(name) = listen
            .config
            .get_application_name()
            .map(|n| format!("{n}-listen"))
        {
            listen.config.application_name(&name);
        }
        require_runtime()?;

        let commands = match self.source {
            Source::OwnConnections => {
                let checked = commands::connect(&config).await.map_err(|failure| {
                    failure.describe("postgres", "connect", config.connect_timeout(), pg_error)
                })?;
                ensure_schema(&checked, self.create_schema).await?;
                // The checked connection serves as the first of our own.
                Commands::OwnConnections(Box::new(OwnConnections::new(
                    config,
                    self.connections,
                    checked,
                )))
            }
            #[cfg(feature = "postgres-deadpool")]
            Source::Deadpool(pool) => {
                let client = tokio::time::timeout(commands::CALL_TIMEOUT, pool.get())
                    .await
                    .map_err(|_| retry::Failure::<tokio_postgres::Error>::Timeout)
                    .and_then(|got| got.map_err(|e| retry::Failure::pool("deadpool", e)))
                    .map_err(|failure| {
                        failure.describe("postgres", "connect", commands::CALL_TIMEOUT, pg_error)
                    })?;
                ensure_schema(&client, self.create_schema).await?;
                Commands::Deadpool(pool)
            }
        };
        let client_id = wire::client_id();
        let hub = ListenHub::start(listen, format!("distlock_{client_id}"));
        if !hub.ready(commands::CALL_TIMEOUT).await {
            hub.close();
            return Err(Error::new(
                ErrorKind::Backend,
                "postgres: the LISTEN connection could not be opened",
            ));
        }
        if let Err(e) = probe(&commands, &hub, &client_id).await {
            hub.close();
            return Err(e);
        }
        Ok(PgBackend {
            inner: Arc::new(Inner {
                commands,
                hub,
                handoff_ttl: self.handoff_ttl,
                client_id,
            }),
        })
    }
}

/// Checks the server and the schema (see [`schema::ensure`]) within a call's deadline: a
/// server that answered the startup may still go silent.
async fn ensure_schema(client: &tokio_postgres::Client, create: bool) -> Result<()> {
    tokio::time::timeout(commands::CALL_TIMEOUT, schema::ensure(client, create))
        .await
        .unwrap_or_else(|_| {
            Err(retry::Failure::<tokio_postgres::Error>::Timeout.describe(
                "postgres",
                "schema check",
                commands::CALL_TIMEOUT,
                pg_error,
            ))
        })
}

/// Checks that the LISTEN connection hears what is sent on another connection: a `NOTIFY` on
/// the hub's channel from the statement path must arrive. Through a pooler in transaction mode
/// (PgBouncer's `pool_mode = transaction`) the `LISTEN` succeeds but nothing ever arrives, so
/// every waiter would learn of its grant only at its own re-check, seconds later.
async fn probe(commands: &Commands, hub: &ListenHub, client_id: &str) -> Result<()> {
    let channel = format!("distlock_{client_id}");
    let token = wire::client_id();
    let payload = ListenHub::probe_payload(&token);
    let params: &Params<'_> = &[(&channel, Type::TEXT), (&payload, Type::TEXT)];
    commands
        .query("notify", route_of(&token), NOTIFY, params)
        .await?;
    if hub.hears(&token, commands::CALL_TIMEOUT).await {
        return Ok(());
    }
    Err(Error::invalid_config(
        "the postgres LISTEN connection does not hear notifications sent from other \
         connections (is it going through a pooler in transaction mode, like PgBouncer's \
         pool_mode = transaction?): give `listen_url` the server itself, or a pooler in \
         session mode",
    ))
}

/// The URL's settings and TLS (its `sslmode` and `sslrootcert`, else `root_pem`).
fn parse_url(url: &str, root_pem: Option<&[u8]>) -> Result<Endpoint> {
    let (rest, mode, root) = tls::split(url)?;
    let mut config: tokio_postgres::Config = rest
        .parse()
        .map_err(|e| Error::invalid_config("malformed postgres url").with_source(e))?;
    let tls_settings = tls::settings(mode, root, config.get_ssl_mode());
    config.ssl_mode(tls_settings.ssl_mode());
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(commands::CALL_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("distlock");
    }
    Ok(Endpoint {
        config,
        tls: tls::connector(&tls_settings, root_pem)?,
    })
}
