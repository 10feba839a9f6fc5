//! The pub/sub hub: one dedicated connection per backend, shared by every waiter.
//!
//! Waiters register a mailbox under (channel, owner token). A channel is subscribed while at
//! least one mailbox uses it. Messages go to the mailbox of the owner they name: a handoff
//! (`"<owner> <fence> <server ms> <px>"`) or, for the waiter next in line behind it, when that
//! handoff's provisional lease ends (`"<owner> <server ms> <px>"`). A channel whose last waiter
//! left stays subscribed for [`LINGER`], so a hot lock costs no SUBSCRIBE/UNSUBSCRIBE per wait.
//!
//! The skeleton is the shared hub's ([`hub`]): while anyone waits, the hub PINGs the connection
//! every second, since a half-open TCP connection would otherwise swallow every grant
//! silently. When the connection drops or a PING goes unanswered for a second, the hub
//! reconnects, resubscribes and tells every mailbox to re-check, since messages may have been
//! missed meanwhile.
//!
//! On a Redis Cluster the channels are shard channels (`SSUBSCRIBE`), over one RESP3 cluster
//! connection that keeps a connection per shard, routes each channel to the shard serving its
//! slot, and resubscribes after its own reconnects and topology changes. The hub tells every
//! mailbox to re-check when one of those connections drops, and subscribes again (and tells
//! that channel's mailboxes to re-check) when a server ends a subscription itself, as it does
//! when the channel's slot moves to another shard.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{mpsc, watch};

use super::pubsub::{connect, switches, Event, Events, Sink, Source};
use super::restart::Restarts;
use crate::backend::hub::{
    self, keepalive, Alive, Common, Elections, HubState, Link, Mailboxes, Registration, Served,
    CONNECT_WAIT, RECONNECT_MIN,
};
use crate::error::{Error, ErrorKind, Result};
use crate::sync::LockExt;

/// The longest pause while anyone holds or waits and the connection was accepted, then closed
/// before any reply: a TCP proxy whose server is down, or a server refusing clients at
/// `maxclients`. The two cannot be told apart, so the hub neither hammers (the second) nor
/// waits the full back-off (the first: a holder would hear of a server that came back without
/// its data up to [`RECONNECT_MAX`](hub::RECONNECT_MAX) late).
const RECONNECT_DROPPED_MAX: Duration = Duration::from_millis(200);
/// How long a channel stays subscribed after its last waiter left.
const LINGER: Duration = Duration::from_secs(2);
/// The least time between two replacements of a cluster pub/sub connection after one of its
/// node connections dropped.
const REBUILD_EVERY: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Channel {
    mailboxes: Mailboxes,
    subscribed: bool,
    /// Set while no mailbox uses the channel.
    idle_since: Option<tokio::time::Instant>,
}

/// The state the hub's handles share with its task.
pub(crate) struct HubInner {
    channels: StdMutex<HashMap<Arc<str>, Channel>>,
    common: Common<Sink>,
    /// Channels whose last waiter left, for the task to unsubscribe after [`LINGER`].
    cmd: mpsc::UnboundedSender<Arc<str>>,
    /// How many claims of this backend hold a lock now (see [`Holding`]).
    holding: AtomicUsize,
    /// The elections observed here, by channel (`<lock>:e`): moved by every message there, and
    /// all at once whenever messages may have been missed (see [`PubSubHub::watch`]).
    elections: Elections,
    /// Numbers the observers' registrations (each is a mailbox of its own on the channel).
    observers: AtomicUsize,
    /// The server's restarts seen by this connection.
    restarts: Restarts,
}

impl HubState for HubInner {
    type Handle = Sink;
    /// The channel, then the owner.
    type Key = (Arc<str>, Arc<str>);

    fn common(&self) -> &Common<Sink> {
        &self.common
    }

    fn unregister(&self, (channel, owner): &Self::Key) {
        let mut channels = self.channels.locked();
        if let Some(ch) = channels.get_mut(channel) {
            ch.mailboxes.close(owner);
            if ch.mailboxes.is_empty() {
                // The hub task unsubscribes after `LINGER` unless it is used again meanwhile.
                ch.idle_since = Some(tokio::time::Instant::now());
                let _ = self.cmd.send(channel.clone());
            }
        }
    }

    fn recheck_all(&self) {
        let channels = self.channels.locked();
        channels.values().for_each(|c| c.mailboxes.recheck());
        drop(channels);
        self.elections.moved_all();
    }

    fn anyone_waits(&self) -> bool {
        self.channels
            .locked()
            .values()
            .any(|c| !c.mailboxes.is_empty())
    }
}

/// Counts one held claim while it lives (the hub reconnects without delay while any does).
pub(crate) struct Holding {
    hub: Weak<HubInner>,
}

impl Drop for Holding {
    fn drop(&mut self) {
        if let Some(hub) = self.hub.upgrade() {
            hub.holding.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Handle to the hub; the task ends when the last handle is dropped.
#[derive(Clone)]
pub(crate) struct PubSubHub {
    inner: Arc<HubInner>,
}

/// A registered mailbox; dropping it unregisters and, for the last one, unsubscribes.
pub(crate) type Subscription = Registration<HubInner>;

impl PubSubHub {
    /// Starts the hub task for a Redlock node on the current runtime, connecting in the
    /// background. Its restarts are not watched: a node keeps its own rejoin gate.
    #[cfg(feature = "redlock")]
    pub(crate) fn start(client: ::redis::Client) -> Self {
        Self::start_with(Source::Single(Box::new(client)), false)
    }

    /// Starts the hub task for `source` on the current runtime, connecting in the background,
    /// and watches the server's restarts (see [`PubSubHub::restart_gate`]).
    pub(crate) fn start_on(source: Source) -> Self {
        Self::start_with(source, true)
    }

    fn start_with(source: Source, identify: bool) -> Self {
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let inner = Arc::new(HubInner {
            channels: StdMutex::new(HashMap::new()),
            common: Common::new(),
            cmd: cmd_tx,
            holding: AtomicUsize::new(0),
            elections: Elections::default(),
            observers: AtomicUsize::new(0),
            restarts: Restarts::default(),
        });
        let link = PubSub {
            identify,
            switched: switches(&source),
            source,
            hub: Arc::downgrade(&inner),
            cmd: cmd_rx,
        };
        hub::start(link, &inner);
        Self { inner }
    }

    /// Counts a held claim until the returned mark is dropped.
    pub(crate) fn holding(&self) -> Holding {
        self.inner.holding.fetch_add(1, Ordering::Relaxed);
        Holding {
            hub: Arc::downgrade(&self.inner),
        }
    }

    /// Until when a claim of lease `ttl` must not be granted, if the server restarted (see
    /// `restart.rs`).
    pub(crate) fn restart_gate(&self, ttl: Duration) -> Option<tokio::time::Instant> {
        self.inner.restarts.gate(ttl)
    }

    /// A counter that moves every time the hub's connection comes back after a drop.
    pub(crate) fn reconnects(&self) -> watch::Receiver<u64> {
        self.inner.common.reconnects()
    }

    /// Registers `owner`'s mailbox on `channel` if the channel is subscribed already (no I/O).
    pub(crate) fn subscribe_if_ready(&self, channel: &str, owner: &str) -> Option<Subscription> {
        let mut channels = self.inner.channels.locked();
        let ch = channels.get_mut(channel).filter(|c| c.subscribed)?;
        let owner: Arc<str> = owner.into();
        let mailbox = ch.mailboxes.open(owner.clone());
        ch.idle_since = None;
        Some(Registration::new(
            &self.inner,
            (channel.into(), owner),
            mailbox,
        ))
    }

    /// Whether the hub is subscribed to `channel`: a claim of this client waits on it, or did
    /// a moment ago (an idle channel lingers before it is left).
    pub(crate) fn listens_to(&self, channel: &str) -> bool {
        self.inner
            .channels
            .locked()
            .get(channel)
            .is_some_and(|c| c.subscribed)
    }

    /// A counter that moves at every message on the election channel `channel` (and whenever
    /// messages may have been missed: a reconnect, a subscription the server ended), with the
    /// registration that keeps the channel subscribed while it lives. Subscribed before it
    /// returns, so no message published after this call is missed.
    pub(crate) async fn watch(
        &self,
        channel: &str,
    ) -> Result<(watch::Receiver<u64>, Subscription)> {
        let changes = self.inner.elections.watch(channel);
        // Owner tokens hold a '.', so no grant names this mailbox.
        let n = self.inner.observers.fetch_add(1, Ordering::Relaxed);
        let sub = self.subscribe(channel, &format!("observer-{n}")).await?;
        Ok((changes, sub))
    }

    /// Registers `owner`'s mailbox on `channel` and makes sure the channel is subscribed before
    /// returning, so no message published after this call is missed.
    pub(crate) async fn subscribe(&self, channel: &str, owner: &str) -> Result<Subscription> {
        let channel: Arc<str> = channel.into();
        let owner: Arc<str> = owner.into();
        let (mailbox, subscribed) = {
            let mut channels = self.inner.channels.locked();
            let ch = channels.entry(channel.clone()).or_default();
            let mailbox = ch.mailboxes.open(owner.clone());
            ch.idle_since = None;
            (mailbox, ch.subscribed)
        };
        let sub = Registration::new(&self.inner, (channel.clone(), owner), mailbox);
        if !subscribed {
            let mut sink = self
                .inner
                .common
                .connected(CONNECT_WAIT)
                .await
                .ok_or_else(unreachable_err)?;
            sink.subscribe(&channel)
                .await
                .map_err(|e| super::commands::redis_error("subscribe", e))?;
            let mut channels = self.inner.channels.locked();
            if let Some(ch) = channels.get_mut(&channel) {
                ch.subscribed = true;
            }
        }
        Ok(sub)
    }
}

fn unreachable_err() -> Error {
    Error::new(
        ErrorKind::Backend,
        "redis pub/sub connection is not available",
    )
    .transient()
}

/// Whether a connection failed because no server answered at all (refused, or no answer in
/// time): only then is it tried again at once. A server that answers and refuses (too many
/// clients, credentials, TLS) waits the back-off.
fn out_of_reach(e: &::redis::RedisError) -> bool {
    e.is_connection_refusal() || e.is_timeout()
}

/// The hub's side of the pub/sub connection, driven by the shared hub task.
struct PubSub {
    source: Source,
    hub: Weak<HubInner>,
    cmd: mpsc::UnboundedReceiver<Arc<str>>,
    /// Whether each connect asks who it reached, to see the server's restarts.
    identify: bool,
    /// For a Sentinel source, moves when the sentinels name a new primary; `None` once the
    /// sentinel listener is gone.
    switched: Option<watch::Receiver<u64>>,
}

/// An open pub/sub connection, subscribed to every channel in use.
struct Open {
    sink: Sink,
    events: Events,
    /// The channels subscribed when it opened.
    subscribed: Vec<Arc<str>>,
}

impl Link for PubSub {
    type State = HubInner;
    type Conn = Open;
    type Failure = ::redis::RedisError;

    const NAME: &'static str = "redis pub/sub";

    fn hub(&self) -> &Weak<HubInner> {
        &self.hub
    }

    async fn open(&mut self) -> ::redis::RedisResult<Open> {
        let connected = loop {
            tokio::select! {
                r = tokio::time::timeout(CONNECT_WAIT, connect(&self.source)) => break r.unwrap_or_else(|_| {
                    Err(::redis::RedisError::from((
                        ::redis::ErrorKind::Io,
                        "pub/sub connect timed out",
                    )))
                }),
                // A waiter left meanwhile: the attempt starts again.
                c = self.cmd.recv() => {
                    if c.is_none() {
                        return hub::gone().await;
                    }
                }
            }
        };
        let (mut sink, events) = connected.inspect_err(|err| {
            tracing::debug!(error = %err, "redis pub/sub connect failed; retrying");
        })?;
        let Some(inner) = self.hub.upgrade() else {
            return hub::gone().await;
        };
        // Resubscribe what is in use; the hub then lets every waiter re-check what it may have
        // missed. A channel nobody uses any more is left: the reminder to leave it after its
        // linger went with the last connection.
        let wanted: Vec<Arc<str>> = {
            let mut channels = inner.channels.locked();
            channels.retain(|_, c| !c.mailboxes.is_empty());
            channels.values_mut().for_each(|c| c.subscribed = false);
            channels.keys().cloned().collect()
        };
        tracing::trace!(
            channels = wanted.len(),
            "redis pub/sub connected; subscribing"
        );
        for ch in &wanted {
            // A reply that never comes must not hold the link up: it is a failed connect.
            let subscribed = tokio::time::timeout(CONNECT_WAIT, sink.subscribe(ch))
                .await
                .unwrap_or_else(|_| {
                    Err(::redis::RedisError::from((
                        ::redis::ErrorKind::Io,
                        "pub/sub subscribe timed out",
                    )))
                });
            if let Err(err) = subscribed {
                // Refused (a user who lost the channel permission): the next connection waits
                // its turn like a failed connect, or this loop would open a connection per
                // round trip. A shard out of reach (a Cluster primary gone, its replica not
                // promoted yet) is tried again at once while anyone holds or waits.
                tracing::debug!(error = %err, "redis pub/sub subscribe failed after connecting; retrying");
                return Err(err);
            }
        }
        // Before the hub lets waiters ask again: a restarted server must be known as such
        // first.
        if self.identify {
            inner.restarts.identify(&self.source, CONNECT_WAIT).await?;
        }
        Ok(Open {
            sink,
            events,
            subscribed: wanted,
        })
    }

    /// `backoff`, unless anyone holds or waits: the pub/sub connection is the first to see a
    /// server come back (perhaps without its data), and a holder must hear of it at once,
    /// whatever the outage. Then a server out of reach is tried again at once, and a
    /// connection accepted and closed after at most [`RECONNECT_DROPPED_MAX`]. A server that
    /// answers and refuses (credentials, TLS) waits the back-off.
    fn pause(&self, backoff: Duration, err: &::redis::RedisError) -> Duration {
        let dropped = err.is_connection_dropped();
        if !out_of_reach(err) && !dropped {
            return backoff;
        }
        match self.hub.upgrade() {
            Some(inner) if inner.holding.load(Ordering::Relaxed) > 0 || inner.anyone_waits() => {
                if out_of_reach(err) {
                    RECONNECT_MIN
                } else {
                    backoff.min(RECONNECT_DROPPED_MAX)
                }
            }
            _ => backoff,
        }
    }

    fn opened(&mut self, inner: &HubInner, conn: &Open) -> Sink {
        let mut channels = inner.channels.locked();
        for ch in &conn.subscribed {
            if let Some(c) = channels.get_mut(ch) {
                c.subscribed = true;
            }
        }
        conn.sink.clone()
    }

    async fn serve(&mut self, conn: Open) -> Served {
        // However the connection ends (lost, or gone with its runtime: this future dropped),
        // the server is unknown until a connect identifies it.
        let hub = self.hub.clone();
        let identify = self.identify;
        let _unknown = scopeguard::guard((), move |()| {
            if let Some(inner) = hub.upgrade().filter(|_| identify) {
                inner.restarts.dropped();
            }
        });
        self.serve_open(conn).await
    }
}

impl PubSub {
    /// Serves `conn` until it is lost or the hub is gone.
    async fn serve_open(&mut self, conn: Open) -> Served {
        let Open {
            mut sink,
            mut events,
            ..
        } = conn;
        let hub = self.hub.clone();
        let pinger = sink.clone();
        let alive = keepalive(&hub, || pinger.clone().ping());
        tokio::pin!(alive);
        // Channels to look at once their linger time is up, in order.
        let mut idle: VecDeque<(tokio::time::Instant, Arc<str>)> = VecDeque::new();
        // When to replace a cluster connection one of whose node connections dropped.
        let connected_at = tokio::time::Instant::now();
        let mut rebuild_at: Option<tokio::time::Instant> = None;
        loop {
            let next_idle = idle.front().map(|(at, _)| *at);
            tokio::select! {
                alive = &mut alive => match alive {
                    Alive::Dead => {
                        tracing::warn!("redis pub/sub connection did not answer PING; reconnecting");
                        return Served::Lost;
                    }
                    Alive::HubGone => return Served::HubGone,
                },
                moved = async {
                    match self.switched.as_mut() {
                        Some(rx) => rx.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                } => {
                    if !moved {
                        self.switched = None;
                        continue;
                    }
                    // The sentinels named a new primary: holders renew there now (the command
                    // connection was dropped), and this connection moves there too.
                    tracing::debug!("redis sentinel switched primaries; moving the pub/sub connection");
                    if let Some(inner) = hub.upgrade() {
                        inner.common.reconnected();
                    }
                    return Served::Lost;
                }
                () = tokio::time::sleep_until(rebuild_at.unwrap_or_else(tokio::time::Instant::now)), if rebuild_at.is_some() => {
                    tracing::debug!("replacing the redis cluster pub/sub connection after a node dropped");
                    return Served::Lost;
                }
                () = tokio::time::sleep_until(next_idle.unwrap_or_else(tokio::time::Instant::now)), if next_idle.is_some() => {
                    let Some((_, channel)) = idle.pop_front() else { continue };
                    let Some(inner) = hub.upgrade() else { return Served::HubGone };
                    let expired = |inner: &HubInner| {
                        let mut channels = inner.channels.locked();
                        let done = channels.get(&channel).is_some_and(|c| {
                            c.mailboxes.is_empty()
                                && c.idle_since.is_some_and(|t| t.elapsed() >= LINGER)
                        });
                        if done {
                            channels.remove(&channel);
                        }
                        done
                    };
                    let in_use = |inner: &HubInner| {
                        inner.channels.locked().contains_key(&channel)
                    };
                    if expired(&inner) {
                        let _ = sink.unsubscribe(&channel).await;
                        // A waiter may have subscribed while the UNSUBSCRIBE was in flight and
                        // been overtaken by it: subscribe again for it.
                        if in_use(&inner) {
                            let _ = sink.subscribe(&channel).await;
                        }
                    }
                }
                event = events.next() => {
                    let Some(event) = event else { return Served::Lost };
                    let Some(inner) = hub.upgrade() else { return Served::HubGone };
                    match event {
                        Event::Message { channel, payload } => {
                            let channels = inner.channels.locked();
                            if let Some(c) = channels.get(channel.as_str()) {
                                c.mailboxes.deliver(&payload);
                            }
                            drop(channels);
                            inner.elections.moved(&channel);
                        }
                        Event::Dropped => {
                            tracing::debug!("a redis cluster pub/sub connection dropped; waiters re-check");
                            inner.recheck_all();
                            inner.common.reconnected();
                            // The cluster connection reconnects a dropped node at the same
                            // address, and moves its subscriptions only then or on a slot
                            // refresh: a primary killed for good would keep them, unheard,
                            // after its replica took over. So the whole connection is replaced
                            // (a fresh slot map, every channel subscribed again where it is
                            // served now), at most once a second.
                            rebuild_at.get_or_insert((connected_at + REBUILD_EVERY).max(tokio::time::Instant::now()));
                        }
                        Event::Unsubscribed(channel) => {
                            // Ours to end only once nobody uses it (then it left the map first).
                            let in_use = inner.channels.locked().contains_key(channel.as_str());
                            if in_use {
                                tracing::debug!(channel, "redis ended a subscription; subscribing again");
                                let _ = sink.subscribe(&channel).await;
                                let channels = inner.channels.locked();
                                if let Some(c) = channels.get(channel.as_str()) {
                                    c.mailboxes.recheck();
                                }
                                drop(channels);
                                inner.elections.moved(&channel);
                            }
                        }
                    }
                }
                c = self.cmd.recv() => {
                    let Some(channel) = c else { return Served::HubGone };
                    idle.push_back((tokio::time::Instant::now() + LINGER, channel));
                }
            }
        }
    }
}
