//! One independent Redis node of a Redlock set: a command connection made on first use (a node
//! that is down when the backend starts does not stop it), the node's pub/sub hub, and a
//! deadline on every call, so a node that is down, slow or silent costs at most that deadline.

use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{FromRedisValue, ScriptInvocation};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::backend::redis::commands::{redis_error, Commands, CALL_TIMEOUT};
use crate::backend::redis::notify::Hub;
use crate::error::{Error, ErrorKind, Result};

pub(super) struct Node {
    /// `host:port` as the URL gave it, for error messages (never the credentials).
    pub(super) name: String,
    client: ::redis::Client,
    commands: OnceCell<Commands>,
    pub(super) hub: Hub,
    timeout: Duration,
}

impl Node {
    /// A node for `url`; no I/O until the first call (the hub connects in the background).
    pub(super) fn new(url: &str, timeout: Duration) -> Result<Self> {
        let client = ::redis::Client::open(url)
            .map_err(|e| Error::invalid_config("malformed redis url in redlock").with_source(e))?;
        let info = client.get_connection_info();
        let name = match info.addr() {
            ::redis::ConnectionAddr::Tcp(host, port)
            | ::redis::ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port}"),
            other => other.to_string(),
        };
        Ok(Self {
            name,
            hub: Hub::start(client.clone()),
            client,
            commands: OnceCell::new(),
            timeout,
        })
    }

    /// Runs a script on this node within the node's deadline; returns the reply and when the
    /// answered attempt was sent.
    pub(super) async fn call<T: FromRedisValue>(
        &self,
        what: &str,
        inv: &ScriptInvocation<'_>,
    ) -> Result<(T, Instant)> {
        self.call_within(self.timeout, what, inv).await
    }

    /// As [`call`](Self::call), with a deadline of `limit` (renewing thousands of leases in one
    /// script may take longer than an acquisition should wait).
    pub(super) async fn call_within<T: FromRedisValue>(
        &self,
        limit: Duration,
        what: &str,
        inv: &ScriptInvocation<'_>,
    ) -> Result<(T, Instant)> {
        let call = async {
            let commands = self
                .commands
                .get_or_try_init(|| async {
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(self.timeout))
                        .set_response_timeout(Some(CALL_TIMEOUT))
                        .set_number_of_retries(1);
                    ConnectionManager::new_with_config(self.client.clone(), config)
                        .await
                        .map(Commands::Own)
                        .map_err(|e| redis_error("connect", e).transient())
                })
                .await?;
            commands.invoke_timed(what, inv).await
        };
        match tokio::time::timeout(limit, call).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => Err(Error::new(
                ErrorKind::Backend,
                format!("redlock node {}: {e}", self.name),
            )
            .with_source(e)
            .transient()),
            Err(_) => Err(Error::new(
                ErrorKind::Backend,
                format!(
                    "redlock node {}: no reply to {what} within {limit:?}",
                    self.name
                ),
            )
            .transient()),
        }
    }
}
