//! The LISTEN hub: one dedicated connection per backend, listening on the backend's own channel
//! (`distlock_<client id>`), shared by every waiter of every key.
//!
//! A releasing transaction NOTIFYs the client its grant names, so a message reaches one
//! connection and no other. Waiters register a mailbox under their owner token (no I/O: the
//! channel is always listened to); messages go to the mailbox of the owner they name.
//!
//! While anyone waits, the hub runs `SELECT 1` every [`PING_EVERY`]: a half-open TCP connection
//! would otherwise swallow every grant silently. When the connection drops or a ping goes
//! unanswered for [`PING_DEADLINE`], the hub reconnects, listens again and tells every mailbox
//! to re-check, since notifications are not replayed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;
use tokio::sync::watch;
use tokio_postgres::AsyncMessage;

use super::tls::Endpoint;

use crate::backend::handoff::{parse, Mailbox, Wake};
use crate::backend::poll_some;
use crate::sync::LockExt;

const RECONNECT_MIN: Duration = Duration::from_millis(20);
const RECONNECT_MAX: Duration = Duration::from_secs(2);
/// How often the connection is checked while anyone waits on it.
const PING_EVERY: Duration = Duration::from_secs(1);
/// How long a ping may go unanswered before the connection is taken as dead.
const PING_DEADLINE: Duration = Duration::from_secs(1);
/// How long connecting and listening may take before it counts as a failure.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

struct HubInner {
    mailboxes: StdMutex<HashMap<Arc<str>, Arc<Mailbox>>>,
    /// Moves on every reconnect after the first connect: the LISTEN connection is always open,
    /// so it is the first to see a server go and come back.
    reconnects: watch::Sender<u64>,
    /// Whether the channel is listened to right now.
    listening: watch::Sender<bool>,
    /// Dropped with the hub, or sent on shutdown: the task stops.
    stop: watch::Sender<bool>,
    /// The last probe heard on the channel (see [`Hub::hears`]).
    probe: watch::Sender<Option<String>>,
}

/// What starts a probe's payload; a grant's payload starts with an owner token, never this.
const PROBE: &str = "probe:";

/// Handle to the hub; the task ends when the last handle is dropped or on
/// [`close`](Hub::close).
#[derive(Clone)]
pub(crate) struct Hub {
    inner: Arc<HubInner>,
}

/// A registered mailbox; dropping it unregisters.
pub(crate) struct Registration {
    hub: Weak<HubInner>,
    owner: Arc<str>,
    pub(crate) mailbox: Arc<Mailbox>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(hub) = self.hub.upgrade() {
            hub.mailboxes.locked().remove(&self.owner);
        }
    }
}

impl Hub {
    /// Starts the hub task on the current runtime, listening on `channel` (a plain identifier).
    /// The connection is made in the background; see [`ready`](Self::ready).
    pub(crate) fn start(endpoint: Endpoint, channel: String) -> Self {
        let inner = Arc::new(HubInner {
            mailboxes: StdMutex::new(HashMap::new()),
            reconnects: watch::Sender::new(0),
            listening: watch::Sender::new(false),
            stop: watch::Sender::new(false),
            probe: watch::Sender::new(None),
        });
        let stop = inner.stop.subscribe();
        tokio::spawn(run(endpoint, channel, Arc::downgrade(&inner), stop));
        Self { inner }
    }

    /// Waits until the channel is listened to, for at most `limit`.
    pub(crate) async fn ready(&self, limit: Duration) -> bool {
        let mut rx = self.inner.listening.subscribe();
        let ready = tokio::time::timeout(limit, rx.wait_for(|listening| *listening))
            .await
            .is_ok_and(|r| r.is_ok());
        ready
    }

    /// A probe's payload for the hub's channel: `NOTIFY`ed from another connection, the hub
    /// must hear it (see [`hears`](Self::hears)).
    pub(crate) fn probe_payload(token: &str) -> String {
        format!("{PROBE}{token}")
    }

    /// Waits, for at most `limit`, until the probe `token` was heard on the channel. A LISTEN
    /// through a pooler in transaction mode succeeds, yet hears nothing sent from another
    /// connection: the server connection that listens goes back to the pool after the
    /// statement, and what it is told later reaches whichever client holds it then, or no one.
    pub(crate) async fn hears(&self, token: &str, limit: Duration) -> bool {
        let mut rx = self.inner.probe.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|p| p.as_deref() == Some(token)))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// A counter that moves every time the hub's connection comes back after a drop.
    pub(crate) fn reconnects(&self) -> watch::Receiver<u64> {
        self.inner.reconnects.subscribe()
    }

    /// Registers `owner`'s mailbox. No I/O: the channel is always listened to, and after a
    /// reconnect every registered mailbox is told to re-check.
    pub(crate) fn register(&self, owner: &str) -> Registration {
        let owner: Arc<str> = owner.into();
        let mailbox = Arc::new(Mailbox::default());
        self.inner
            .mailboxes
            .locked()
            .insert(owner.clone(), mailbox.clone());
        Registration {
            hub: Arc::downgrade(&self.inner),
            owner,
            mailbox,
        }
    }

    /// Stops the task and closes the connection.
    pub(crate) fn close(&self) {
        self.inner.stop.send_replace(true);
    }
}

fn anyone_waits(inner: &HubInner) -> bool {
    !inner.mailboxes.locked().is_empty()
}

/// Resolves when the hub is dropped or closed.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Waits out a reconnect back-off and doubles it; false if the hub stopped meanwhile.
async fn pause(backoff: &mut Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(*backoff) => {}
        () = stopped(stop) => return false,
    }
    *backoff = (*backoff * 2).min(RECONNECT_MAX);
    true
}

async fn run(
    endpoint: Endpoint,
    channel: String,
    hub: Weak<HubInner>,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = RECONNECT_MIN;
    let mut first = true;
    loop {
        let connected = tokio::select! {
            c = tokio::time::timeout(CONNECT_TIMEOUT, endpoint.connect()) => c,
            () = stopped(&mut stop) => return,
        };
        let (client, mut connection) = match connected {
            Ok(Ok(pair)) => pair,
            failed => {
                if let Ok(Err(e)) = failed {
                    tracing::debug!(error = %e, "postgres listen connect failed; retrying");
                }
                if !pause(&mut backoff, &mut stop).await {
                    return;
                }
                continue;
            }
        };
        let client = Arc::new(client);
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));

        // LISTEN, driving the connection meanwhile; first mark the connection as open with the
        // client's advisory lock (`distlock.listener` in the schema), which goes with the
        // session: a release that hands a lock on tells waiters down the queue until it reaches
        // one whose client holds it. Without the mark (a lock wait cut short) hints only reach
        // further than they need.
        let listen = {
            let client = client.clone();
            let sql = format!("LISTEN {channel}");
            let mark = format!(
                "SET lock_timeout = '2s'; \
                 SELECT pg_advisory_lock(hashtextextended('{channel}', 0)); \
                 SET lock_timeout = 0"
            );
            async move {
                if let Err(e) = client.batch_execute(&mark).await {
                    tracing::debug!(error = %e, "postgres listen connection not marked as open");
                }
                client.batch_execute(&sql).await
            }
        };
        let listened = tokio::time::timeout(CONNECT_TIMEOUT, async {
            tokio::pin!(listen);
            loop {
                tokio::select! {
                    r = &mut listen => return r.is_ok(),
                    m = messages.next() => if m.is_none_or(|m| m.is_err()) { return false },
                }
            }
        });
        let ok = tokio::select! {
            ok = listened => matches!(ok, Ok(true)),
            () = stopped(&mut stop) => return,
        };
        if !ok {
            if !pause(&mut backoff, &mut stop).await {
                return;
            }
            continue;
        }
        backoff = RECONNECT_MIN;
        let Some(inner) = hub.upgrade() else { return };
        inner.listening.send_replace(true);
        if !first {
            // Notifications sent while we were away are gone: every waiter asks the server,
            // and holders renew now, in case the server lost their locks meanwhile.
            for mailbox in inner.mailboxes.locked().values() {
                mailbox.put(Wake::Recheck);
            }
            inner.reconnects.send_modify(|n| *n += 1);
        }
        first = false;
        drop(inner);

        let mut ping_at = tokio::time::Instant::now() + PING_EVERY;
        let mut ping: Option<BoxFuture<'static, bool>> = None;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(ping_at), if ping.is_none() => {
                    ping_at = tokio::time::Instant::now() + PING_EVERY;
                    let Some(inner) = hub.upgrade() else { return };
                    if anyone_waits(&inner) {
                        let client = client.clone();
                        ping = Some(Box::pin(async move {
                            matches!(
                                tokio::time::timeout(PING_DEADLINE, client.simple_query("SELECT 1")).await,
                                Ok(Ok(_))
                            )
                        }));
                    }
                }
                alive = poll_some(&mut ping), if ping.is_some() => {
                    ping = None;
                    if !alive {
                        tracing::warn!("postgres listen connection did not answer a ping; reconnecting");
                        break;
                    }
                }
                m = messages.next() => {
                    let notification = match m {
                        Some(Ok(AsyncMessage::Notification(n))) => n,
                        Some(Ok(_)) => continue,
                        Some(Err(_)) | None => break,
                    };
                    let Some(inner) = hub.upgrade() else { return };
                    if let Some(token) = notification.payload().strip_prefix(PROBE) {
                        inner.probe.send_replace(Some(token.to_owned()));
                        continue;
                    }
                    let Some((owner, wake)) = parse(notification.payload()) else { continue };
                    let mailboxes = inner.mailboxes.locked();
                    if let Some(mailbox) = mailboxes.get(owner) {
                        mailbox.put(wake);
                    }
                }
                () = stopped(&mut stop) => return,
            }
        }
        tracing::debug!("postgres listen connection lost; reconnecting");
        if let Some(inner) = hub.upgrade() {
            inner.listening.send_replace(false);
        }
    }
}
