//! The pub/sub hub: one dedicated connection per backend, shared by every waiter.
//!
//! Waiters register a mailbox under (channel, owner token). A channel is subscribed while at
//! least one mailbox uses it. Messages go to the mailbox of the owner they name: a handoff
//! (`"<owner> <fence> <server ms> <px>"`) or, for the waiter next in line behind it, when that
//! handoff's provisional lease ends (`"<owner> <server ms> <px>"`). A channel whose last waiter
//! left stays subscribed for [`LINGER`], so a hot lock costs no SUBSCRIBE/UNSUBSCRIBE per wait.
//!
//! While anyone waits, the hub PINGs the connection every [`PING_EVERY`]: a half-open TCP
//! connection would otherwise swallow every grant silently. When the connection drops or a PING
//! goes unanswered for [`PING_DEADLINE`], the hub reconnects, resubscribes and tells every
//! mailbox to re-check, since messages may have been missed meanwhile.
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

use std::pin::Pin;

use ::redis::aio::PubSubSink;
use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, watch};

use crate::backend::handoff::{parse, Mailbox, Wake};
use crate::backend::poll_some;
use crate::error::{Error, ErrorKind, Result};
use crate::sync::LockExt;

/// How long a subscriber waits for the pub/sub connection before giving up.
const CONNECT_WAIT: Duration = Duration::from_secs(5);
const RECONNECT_MIN: Duration = Duration::from_millis(20);
/// The longest pause between reconnects while nobody holds or waits. While anyone does, the
/// hub tries every [`RECONNECT_MIN`]: the pub/sub connection is the first to see a server come
/// back (perhaps without its data), and a holder must hear of it at once, whatever the outage.
const RECONNECT_MAX: Duration = Duration::from_secs(2);
/// The longest pause while anyone holds or waits and the connection was accepted, then closed
/// before any reply: a TCP proxy whose server is down, or a server refusing clients at
/// `maxclients`. The two cannot be told apart, so the hub neither hammers (the second) nor
/// waits the full back-off (the first: a holder would hear of a server that came back without
/// its data up to [`RECONNECT_MAX`] late).
const RECONNECT_DROPPED_MAX: Duration = Duration::from_millis(200);
/// How long a channel stays subscribed after its last waiter left.
const LINGER: Duration = Duration::from_secs(2);
/// How often the connection is checked while anyone waits on it.
const PING_EVERY: Duration = Duration::from_secs(1);
/// The least time between two replacements of a cluster pub/sub connection after one of its
/// node connections dropped.
const REBUILD_EVERY: Duration = Duration::from_secs(1);
/// How long a PING may go unanswered before the connection is taken as dead.
const PING_DEADLINE: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Channel {
    mailboxes: HashMap<Arc<str>, Arc<Mailbox>>,
    subscribed: bool,
    /// Set while no mailbox uses the channel.
    idle_since: Option<tokio::time::Instant>,
}

/// Where the hub's connection comes from.
pub(crate) enum Source {
    /// One server: a pub/sub connection the hub reconnects itself.
    Single(Box<::redis::Client>),
    /// A Redis Cluster, from these seed node URLs.
    #[cfg(feature = "redis-cluster")]
    Cluster(Vec<String>),
    /// The primary the sentinels name, asked again at every reconnect.
    #[cfg(feature = "redis-sentinel")]
    Sentinel(Arc<super::sentinel::Sentinel>),
}

/// Sends (un)subscriptions and PINGs.
#[derive(Clone)]
enum Sink {
    Single(PubSubSink),
    #[cfg(feature = "redis-cluster")]
    Cluster(::redis::cluster_async::ClusterConnection),
}

impl Sink {
    async fn subscribe(&mut self, channel: &str) -> ::redis::RedisResult<()> {
        match self {
            Self::Single(sink) => sink.subscribe(channel).await,
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(conn) => conn.ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> ::redis::RedisResult<()> {
        match self {
            Self::Single(sink) => sink.unsubscribe(channel).await,
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(conn) => conn.sunsubscribe(channel).await,
        }
    }

    /// Whether the connection answers a PING within [`PING_DEADLINE`].
    async fn ping(mut self) -> bool {
        let ping = async {
            match &mut self {
                Self::Single(sink) => sink.ping::<::redis::Value>().await.is_ok(),
                #[cfg(feature = "redis-cluster")]
                Self::Cluster(conn) => ::redis::cmd("PING")
                    .query_async::<::redis::Value>(conn)
                    .await
                    .is_ok(),
            }
        };
        matches!(tokio::time::timeout(PING_DEADLINE, ping).await, Ok(true))
    }
}

/// What the connection reports.
#[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
enum Event {
    /// A message on a channel.
    Message { channel: String, payload: String },
    /// One of a cluster connection's node connections dropped (it reconnects and resubscribes
    /// by itself): messages may have been missed.
    Dropped,
    /// The server ended our subscription to this channel (its slot moved to another shard).
    Unsubscribed(String),
}

type Events = Pin<Box<dyn Stream<Item = Event> + Send>>;

/// Connects, returning the sink and the events; the events end when the connection drops.
async fn connect(source: &Source) -> ::redis::RedisResult<(Sink, Events)> {
    match source {
        Source::Single(client) => {
            let (sink, stream) = client.get_async_pubsub().await?.split();
            Ok((Sink::Single(sink), Box::pin(single_events(stream))))
        }
        #[cfg(feature = "redis-sentinel")]
        Source::Sentinel(sentinel) => {
            let (sink, stream) = sentinel.pubsub().await?.split();
            Ok((Sink::Single(sink), Box::pin(single_events(stream))))
        }
        #[cfg(feature = "redis-cluster")]
        Source::Cluster(seeds) => {
            let (tx, rx) = mpsc::unbounded_channel::<::redis::PushInfo>();
            let conn = ::redis::cluster::ClusterClientBuilder::new(seeds.clone())
                .use_protocol(::redis::ProtocolVersion::RESP3)
                .push_sender(tx)
                .connection_timeout(CONNECT_WAIT)
                .response_timeout(CONNECT_WAIT)
                .build()?
                .get_async_connection()
                .await?;
            let pushes = futures::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|push| (push, rx))
            });
            let events = pushes.filter_map(|push| futures::future::ready(cluster_event(push)));
            Ok((Sink::Cluster(conn), Box::pin(events)))
        }
    }
}

/// The messages of a one-server pub/sub connection; they end when it drops.
fn single_events(
    stream: impl Stream<Item = ::redis::Msg> + Send + 'static,
) -> impl Stream<Item = Event> + Send + 'static {
    stream.filter_map(|msg| {
        let event = msg
            .get_payload::<String>()
            .ok()
            .map(|payload| Event::Message {
                channel: msg.get_channel_name().to_owned(),
                payload,
            });
        futures::future::ready(event)
    })
}

#[cfg(feature = "redis-cluster")]
fn cluster_event(push: ::redis::PushInfo) -> Option<Event> {
    let text =
        |i: usize| -> Option<String> { ::redis::from_redis_value_ref(push.data.get(i)?).ok() };
    match push.kind {
        ::redis::PushKind::SMessage => Some(Event::Message {
            channel: text(0)?,
            payload: text(1)?,
        }),
        ::redis::PushKind::Disconnection => Some(Event::Dropped),
        ::redis::PushKind::SUnsubscribe => Some(Event::Unsubscribed(text(0)?)),
        _ => None,
    }
}

struct HubInner {
    channels: StdMutex<HashMap<Arc<str>, Channel>>,
    sink: watch::Sender<Option<Sink>>,
    cmd: mpsc::UnboundedSender<Arc<str>>,
    /// Moves on every reconnect after the first connect. The pub/sub connection is always
    /// open, so it is the first to see a server go and come back.
    reconnects: watch::Sender<u64>,
    /// How many claims of this backend hold a lock now (see [`Holding`]).
    holding: AtomicUsize,
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
pub(crate) struct Hub {
    inner: Arc<HubInner>,
}

/// A registered mailbox; dropping it unregisters and, for the last one, unsubscribes.
pub(crate) struct Subscription {
    hub: Weak<HubInner>,
    channel: Arc<str>,
    owner: Arc<str>,
    pub(crate) mailbox: Arc<Mailbox>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let Some(hub) = self.hub.upgrade() else {
            return;
        };
        let mut channels = hub.channels.locked();
        if let Some(ch) = channels.get_mut(&self.channel) {
            ch.mailboxes.remove(&self.owner);
            if ch.mailboxes.is_empty() {
                // The hub task unsubscribes after `LINGER` unless it is used again meanwhile.
                ch.idle_since = Some(tokio::time::Instant::now());
                let _ = hub.cmd.send(self.channel.clone());
            }
        }
    }
}

impl Hub {
    /// Starts the hub task on the current runtime. The connection is made in the background.
    pub(crate) fn start(client: ::redis::Client) -> Self {
        Self::start_on(Source::Single(Box::new(client)))
    }

    /// Starts the hub task for `source` on the current runtime, connecting in the background.
    pub(crate) fn start_on(source: Source) -> Self {
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let inner = Arc::new(HubInner {
            channels: StdMutex::new(HashMap::new()),
            sink: watch::Sender::new(None),
            cmd: cmd_tx,
            reconnects: watch::Sender::new(0),
            holding: AtomicUsize::new(0),
        });
        tokio::spawn(run(source, Arc::downgrade(&inner), cmd_rx));
        Self { inner }
    }

    /// Counts a held claim until the returned mark is dropped.
    pub(crate) fn holding(&self) -> Holding {
        self.inner.holding.fetch_add(1, Ordering::Relaxed);
        Holding {
            hub: Arc::downgrade(&self.inner),
        }
    }

    /// A counter that moves every time the hub's connection comes back after a drop.
    pub(crate) fn reconnects(&self) -> watch::Receiver<u64> {
        self.inner.reconnects.subscribe()
    }

    /// Registers `owner`'s mailbox on `channel` if the channel is subscribed already (no I/O).
    pub(crate) fn subscribe_if_ready(&self, channel: &str, owner: &str) -> Option<Subscription> {
        let mut channels = self.inner.channels.locked();
        let ch = channels.get_mut(channel).filter(|c| c.subscribed)?;
        let owner: Arc<str> = owner.into();
        let mailbox = Arc::new(Mailbox::default());
        ch.mailboxes.insert(owner.clone(), mailbox.clone());
        ch.idle_since = None;
        Some(Subscription {
            hub: Arc::downgrade(&self.inner),
            channel: channel.into(),
            owner,
            mailbox,
        })
    }

    /// Registers `owner`'s mailbox on `channel` and makes sure the channel is subscribed before
    /// returning, so no message published after this call is missed.
    pub(crate) async fn subscribe(&self, channel: &str, owner: &str) -> Result<Subscription> {
        let channel: Arc<str> = channel.into();
        let owner: Arc<str> = owner.into();
        let mailbox = Arc::new(Mailbox::default());
        let subscribed = {
            let mut channels = self.inner.channels.locked();
            let ch = channels.entry(channel.clone()).or_default();
            ch.mailboxes.insert(owner.clone(), mailbox.clone());
            ch.idle_since = None;
            ch.subscribed
        };
        let sub = Subscription {
            hub: Arc::downgrade(&self.inner),
            channel: channel.clone(),
            owner,
            mailbox,
        };
        if !subscribed {
            let mut sink = self.sink().await?;
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

    async fn sink(&self) -> Result<Sink> {
        let mut rx = self.inner.sink.subscribe();
        let ready = tokio::time::timeout(CONNECT_WAIT, rx.wait_for(Option::is_some)).await;
        match ready {
            Ok(Ok(sink)) => sink.clone().ok_or_else(unreachable_err),
            _ => Err(unreachable_err()),
        }
    }
}

fn unreachable_err() -> Error {
    Error::new(
        ErrorKind::Backend,
        "redis pub/sub connection is not available",
    )
    .transient()
}

/// Tells every mailbox to re-check: messages may have been missed.
fn recheck_all(inner: &HubInner) {
    let channels = inner.channels.locked();
    for c in channels.values() {
        c.mailboxes.values().for_each(|m| m.put(Wake::Recheck));
    }
}

/// Whether a connection failed because no server answered at all (refused, or no answer in
/// time): only then is it tried again at once. A server that answers and refuses (too many
/// clients, credentials, TLS) waits the back-off.
fn out_of_reach(e: &::redis::RedisError) -> bool {
    e.is_connection_refusal() || e.is_timeout()
}

/// The pause before the next connection attempt after `err`: `backoff`, unless anyone holds
/// or waits: then the shortest if the server was out of reach, and at most
/// [`RECONNECT_DROPPED_MAX`] if the connection was accepted and closed.
fn pause(hub: &Weak<HubInner>, backoff: Duration, err: &::redis::RedisError) -> Duration {
    let dropped = err.is_connection_dropped();
    if !out_of_reach(err) && !dropped {
        return backoff;
    }
    match hub.upgrade() {
        Some(inner) if inner.holding.load(Ordering::Relaxed) > 0 || anyone_waits(&inner) => {
            if out_of_reach(err) {
                RECONNECT_MIN
            } else {
                backoff.min(RECONNECT_DROPPED_MAX)
            }
        }
        _ => backoff,
    }
}

/// Whether any waiter has a mailbox (only then is the connection worth checking).
fn anyone_waits(inner: &HubInner) -> bool {
    inner
        .channels
        .locked()
        .values()
        .any(|c| !c.mailboxes.is_empty())
}

/// For a Sentinel source, a receiver that changes when the sentinels announce a new primary.
fn switches(source: &Source) -> Option<watch::Receiver<u64>> {
    match source {
        #[cfg(feature = "redis-sentinel")]
        Source::Sentinel(sentinel) => Some(sentinel.switches()),
        _ => None,
    }
}

async fn run(source: Source, hub: Weak<HubInner>, mut cmd: mpsc::UnboundedReceiver<Arc<str>>) {
    let mut switched = switches(&source);
    let mut backoff = RECONNECT_MIN;
    let mut first = true;
    loop {
        let connected = tokio::select! {
            r = tokio::time::timeout(CONNECT_WAIT, connect(&source)) => r.unwrap_or_else(|_| {
                Err(::redis::RedisError::from((
                    ::redis::ErrorKind::Io,
                    "pub/sub connect timed out",
                )))
            }),
            c = cmd.recv() => {
                if c.is_none() { return; }
                continue;
            }
        };
        let (mut sink, mut events) = match connected {
            Ok(c) => c,
            Err(err) => {
                tracing::debug!(error = %err, "redis pub/sub connect failed; retrying");
                // Only a server out of reach is tried again at once; one that answers and
                // refuses (credentials, TLS) waits the back-off.
                tokio::time::sleep(pause(&hub, backoff, &err)).await;
                backoff = (backoff * 2).min(RECONNECT_MAX);
                if hub.strong_count() == 0 {
                    return;
                }
                continue;
            }
        };
        let Some(inner) = hub.upgrade() else { return };
        // Resubscribe what is in use, then let every waiter re-check what it may have missed.
        let wanted: Vec<Arc<str>> = {
            let mut channels = inner.channels.locked();
            channels.values_mut().for_each(|c| c.subscribed = false);
            channels.keys().cloned().collect()
        };
        let mut refused = None;
        for ch in &wanted {
            if let Err(e) = sink.subscribe(ch).await {
                refused = Some(e);
                break;
            }
        }
        if let Some(err) = refused {
            // Refused (a user who lost the channel permission): the next connection waits
            // its turn like a failed connect, or this loop would open a connection per round
            // trip. A shard out of reach (a Cluster primary gone, its replica not promoted
            // yet) is tried again at once while anyone holds or waits.
            drop(inner);
            tracing::debug!(error = %err, "redis pub/sub subscribe failed after connecting; retrying");
            tokio::time::sleep(pause(&hub, backoff, &err)).await;
            backoff = (backoff * 2).min(RECONNECT_MAX);
            continue;
        }
        backoff = RECONNECT_MIN;
        {
            let mut channels = inner.channels.locked();
            for ch in &wanted {
                if let Some(c) = channels.get_mut(ch) {
                    c.subscribed = true;
                }
            }
        }
        if !first {
            recheck_all(&inner);
        }
        if !first {
            // Holders: renew now, in case the server lost their locks while we were away.
            inner.reconnects.send_modify(|n| *n += 1);
        }
        first = false;
        inner.sink.send_replace(Some(sink.clone()));
        drop(inner);

        // Channels to look at once their linger time is up, in order.
        let mut idle: VecDeque<(tokio::time::Instant, Arc<str>)> = VecDeque::new();
        // When to replace a cluster connection one of whose node connections dropped.
        let connected_at = tokio::time::Instant::now();
        let mut rebuild_at: Option<tokio::time::Instant> = None;
        let mut ping_at = tokio::time::Instant::now() + PING_EVERY;
        let mut ping: Option<futures::future::BoxFuture<'static, bool>> = None;
        loop {
            let next_idle = idle.front().map(|(at, _)| *at);
            tokio::select! {
                () = tokio::time::sleep_until(ping_at), if ping.is_none() => {
                    ping_at = tokio::time::Instant::now() + PING_EVERY;
                    let Some(inner) = hub.upgrade() else { return };
                    if anyone_waits(&inner) {
                        ping = Some(Box::pin(sink.clone().ping()));
                    }
                }
                alive = poll_some(&mut ping), if ping.is_some() => {
                    ping = None;
                    if !alive {
                        tracing::warn!("redis pub/sub connection did not answer PING; reconnecting");
                        break;
                    }
                }
                moved = async {
                    match switched.as_mut() {
                        Some(rx) => rx.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                } => {
                    if !moved {
                        switched = None;
                        continue;
                    }
                    // The sentinels named a new primary: holders renew there now (the command
                    // connection was dropped), and this connection moves there too.
                    tracing::debug!("redis sentinel switched primaries; moving the pub/sub connection");
                    if let Some(inner) = hub.upgrade() {
                        inner.reconnects.send_modify(|n| *n += 1);
                    }
                    break;
                }
                () = tokio::time::sleep_until(rebuild_at.unwrap_or_else(tokio::time::Instant::now)), if rebuild_at.is_some() => {
                    tracing::debug!("replacing the redis cluster pub/sub connection after a node dropped");
                    break;
                }
                () = tokio::time::sleep_until(next_idle.unwrap_or_else(tokio::time::Instant::now)), if next_idle.is_some() => {
                    let Some((_, channel)) = idle.pop_front() else { continue };
                    let Some(inner) = hub.upgrade() else { return };
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
                    let Some(event) = event else { break };
                    let Some(inner) = hub.upgrade() else { return };
                    match event {
                        Event::Message { channel, payload } => {
                            let Some((owner, wake)) = parse(&payload) else { continue };
                            let channels = inner.channels.locked();
                            if let Some(mailbox) = channels.get(channel.as_str()).and_then(|c| c.mailboxes.get(owner)) {
                                mailbox.put(wake);
                            }
                        }
                        Event::Dropped => {
                            tracing::debug!("a redis cluster pub/sub connection dropped; waiters re-check");
                            recheck_all(&inner);
                            inner.reconnects.send_modify(|n| *n += 1);
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
                                    c.mailboxes.values().for_each(|m| m.put(Wake::Recheck));
                                }
                            }
                        }
                    }
                }
                c = cmd.recv() => {
                    let Some(channel) = c else { return };
                    idle.push_back((tokio::time::Instant::now() + LINGER, channel));
                }
            }
        }
        // The connection dropped.
        tracing::debug!("redis pub/sub connection lost; reconnecting");
        if let Some(inner) = hub.upgrade() {
            inner.sink.send_replace(None);
        }
    }
}
