//! The LISTEN hub: one dedicated connection per backend, listening on the backend's own channel
//! (`distlock_<client id>`), shared by every waiter of every key.
//!
//! A releasing transaction NOTIFYs the client its grant names, so a message reaches one
//! connection and no other. Waiters register a mailbox under their owner token (no I/O: the
//! channel is always listened to); messages go to the mailbox of the owner they name.
//!
//! The connection also listens on [`ELECTIONS`], where the server says which election's leader
//! may have changed: each election someone observes has a counter here ([`ListenHub::watch`]) that
//! such a message moves.
//!
//! The skeleton is the shared hub's ([`hub`]): while anyone waits, the hub runs `SELECT 1`
//! every second, since a half-open TCP connection would otherwise swallow every grant
//! silently. When the connection drops or a ping goes unanswered for a second, the hub
//! reconnects, listens again and tells every mailbox to re-check, since notifications are not
//! replayed.

use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tokio_postgres::{AsyncMessage, Client};

use super::tls::Endpoint;

use crate::backend::hub::{
    self, keepalive, Alive, Common, Elections, HubState, Link, Mailboxes, Served, CONNECT_WAIT,
};
use crate::backend::retry;
use crate::sync::LockExt;

/// The state the hub's handles share with its task.
pub(crate) struct HubInner {
    mailboxes: StdMutex<Mailboxes>,
    /// The elections observed here, by `<ns>:<key>`: moved when the server says their leader
    /// may have changed, and all at once after a reconnect (messages are not replayed).
    elections: Elections,
    /// Whether the channel is listened to right now, and the reconnect counter.
    common: Common<()>,
    /// The last probe heard on the channel (see [`ListenHub::hears`]).
    probe: watch::Sender<Option<String>>,
}

impl HubState for HubInner {
    type Handle = ();
    /// The owner.
    type Key = Arc<str>;

    fn common(&self) -> &Common<()> {
        &self.common
    }

    fn unregister(&self, owner: &Arc<str>) {
        self.mailboxes.locked().close(owner);
    }

    fn recheck_all(&self) {
        self.mailboxes.locked().recheck();
        self.elections.moved_all();
    }

    fn anyone_waits(&self) -> bool {
        !self.mailboxes.locked().is_empty() || self.elections.observed()
    }
}

/// The channel on which the server names elections whose leader may have changed
/// (`distlock.announce` in the schema).
const ELECTIONS: &str = "distlock_elections";

/// What starts a probe's payload; a grant's payload starts with an owner token, never this.
const PROBE: &str = "probe:";

/// Handle to the hub; the task ends when the last handle is dropped or on
/// [`close`](ListenHub::close).
#[derive(Clone)]
pub(crate) struct ListenHub {
    inner: Arc<HubInner>,
}

/// A registered mailbox; dropping it unregisters.
pub(crate) type Registration = hub::Registration<HubInner>;

impl ListenHub {
    /// Starts the hub task on the current runtime, listening on `channel` (a plain identifier).
    /// The connection is made in the background; see [`ready`](Self::ready).
    pub(crate) fn start(endpoint: Endpoint, channel: String) -> Self {
        let inner = Arc::new(HubInner {
            mailboxes: StdMutex::new(Mailboxes::default()),
            elections: Elections::default(),
            common: Common::new(),
            probe: watch::Sender::new(None),
        });
        let link = Listen {
            endpoint,
            channel,
            hub: Arc::downgrade(&inner),
        };
        hub::start(link, &inner);
        Self { inner }
    }

    /// Waits until the channel is listened to, for at most `limit`.
    pub(crate) async fn ready(&self, limit: Duration) -> bool {
        self.inner.common.connected(limit).await.is_some()
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
        self.inner.common.reconnects()
    }

    /// Registers `owner`'s mailbox. No I/O: the channel is always listened to, and after a
    /// reconnect every registered mailbox is told to re-check.
    pub(crate) fn register(&self, owner: &str) -> Registration {
        let owner: Arc<str> = owner.into();
        let mailbox = self.inner.mailboxes.locked().open(owner.clone());
        Registration::new(&self.inner, owner, mailbox)
    }

    /// A counter that moves whenever the leader of the election `key` of `ns` may have
    /// changed (and after every reconnect).
    pub(crate) fn watch(&self, ns: &str, key: &str) -> watch::Receiver<u64> {
        self.inner.elections.watch(&format!("{ns}:{key}"))
    }

    /// Stops the task and closes the connection.
    pub(crate) fn close(&self) {
        self.inner.common.close();
    }
}

/// The hub's side of the LISTEN connection, driven by the shared hub task.
struct Listen {
    endpoint: Endpoint,
    channel: String,
    hub: Weak<HubInner>,
}

/// The messages of a connection; they end when it drops.
type Messages =
    std::pin::Pin<Box<dyn Stream<Item = Result<AsyncMessage, tokio_postgres::Error>> + Send>>;

/// An open connection, listening on the channel.
struct Open {
    client: Arc<Client>,
    messages: Messages,
}

/// Why a connection is not listening.
enum Failure {
    /// Connecting failed, or took longer than the connect timeout.
    Connect,
    /// The LISTEN failed, or took longer than [`CONNECT_WAIT`].
    Listen,
}

impl Link for Listen {
    type State = HubInner;
    type Conn = Open;
    type Failure = Failure;

    const NAME: &'static str = "postgres listen";

    fn hub(&self) -> &Weak<HubInner> {
        &self.hub
    }

    async fn open(&mut self) -> Result<Open, Failure> {
        let (client, mut connection) = match self.endpoint.connect().await {
            Ok(pair) => pair,
            Err(failed) => {
                if let retry::Failure::Call(e) = failed {
                    tracing::debug!(error = %e, "postgres listen connect failed; retrying");
                }
                return Err(Failure::Connect);
            }
        };
        let client = Arc::new(client);
        let mut messages: Messages = Box::pin(futures::stream::poll_fn(move |cx| {
            connection.poll_message(cx)
        }));

        // LISTEN, driving the connection meanwhile; first mark the connection as open with the
        // client's advisory lock (`distlock.listener` in the schema), which goes with the
        // session: a release that hands a lock on tells waiters down the queue until it reaches
        // one whose client holds it. Without the mark (a lock wait cut short) hints only reach
        // further than they need.
        let listen = {
            let client = client.clone();
            let channel = &self.channel;
            let sql = format!("LISTEN {channel}; LISTEN {ELECTIONS}");
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
        let listened = tokio::time::timeout(CONNECT_WAIT, async {
            tokio::pin!(listen);
            loop {
                tokio::select! {
                    r = &mut listen => return r.is_ok(),
                    m = messages.next() => if m.is_none_or(|m| m.is_err()) { return false },
                }
            }
        })
        .await;
        match listened {
            Ok(true) => Ok(Open { client, messages }),
            _ => Err(Failure::Listen),
        }
    }

    fn opened(&mut self, _: &HubInner, _: &Open) {}

    async fn serve(&mut self, conn: Open) -> Served {
        let Open {
            client,
            mut messages,
        } = conn;
        let alive = keepalive(&self.hub, || {
            let client = client.clone();
            async move { client.simple_query("SELECT 1").await.is_ok() }
        });
        tokio::pin!(alive);
        loop {
            tokio::select! {
                alive = &mut alive => match alive {
                    Alive::Dead => {
                        tracing::warn!("postgres listen connection did not answer a ping; reconnecting");
                        return Served::Lost;
                    }
                    Alive::HubGone => return Served::HubGone,
                },
                m = messages.next() => {
                    let notification = match m {
                        Some(Ok(AsyncMessage::Notification(n))) => n,
                        Some(Ok(_)) => continue,
                        Some(Err(_)) | None => return Served::Lost,
                    };
                    let Some(inner) = self.hub.upgrade() else { return Served::HubGone };
                    if notification.channel() == ELECTIONS {
                        inner.elections.moved(notification.payload());
                        continue;
                    }
                    if let Some(token) = notification.payload().strip_prefix(PROBE) {
                        inner.probe.send_replace(Some(token.to_owned()));
                        continue;
                    }
                    inner.mailboxes.locked().deliver(notification.payload());
                }
            }
        }
    }
}
