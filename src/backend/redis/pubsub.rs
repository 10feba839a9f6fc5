//! The pub/sub connection's parts: where it comes from ([`Source`]: one server, a Sentinel's
//! primary, a Cluster), what the hub sends on it ([`Sink`]) and what it hears ([`Event`]).
//! The hub that drives it is `notify.rs`.

use std::pin::Pin;
#[cfg(feature = "redis-sentinel")]
use std::sync::Arc;

use ::redis::aio::PubSubSink;
use futures::{Stream, StreamExt};
#[cfg(feature = "redis-cluster")]
use tokio::sync::mpsc;
use tokio::sync::watch;

#[cfg(feature = "redis-cluster")]
use crate::backend::hub::CONNECT_WAIT;

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
pub(crate) enum Sink {
    Single(PubSubSink),
    #[cfg(feature = "redis-cluster")]
    Cluster(::redis::cluster_async::ClusterConnection),
}

impl Sink {
    pub(crate) async fn subscribe(&mut self, channel: &str) -> ::redis::RedisResult<()> {
        match self {
            Self::Single(sink) => sink.subscribe(channel).await,
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(conn) => conn.ssubscribe(channel).await,
        }
    }

    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> ::redis::RedisResult<()> {
        match self {
            Self::Single(sink) => sink.unsubscribe(channel).await,
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(conn) => conn.sunsubscribe(channel).await,
        }
    }

    /// Whether the connection answers a PING.
    pub(crate) async fn ping(mut self) -> bool {
        match &mut self {
            Self::Single(sink) => sink.ping::<::redis::Value>().await.is_ok(),
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(conn) => ::redis::cmd("PING")
                .query_async::<::redis::Value>(conn)
                .await
                .is_ok(),
        }
    }
}

/// What the connection reports.
#[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
pub(crate) enum Event {
    /// A message on a channel.
    Message { channel: String, payload: String },
    /// One of a cluster connection's node connections dropped (it reconnects and resubscribes
    /// by itself): messages may have been missed.
    Dropped,
    /// The server ended our subscription to this channel (its slot moved to another shard).
    Unsubscribed(String),
}

pub(crate) type Events = Pin<Box<dyn Stream<Item = Event> + Send>>;

/// Connects, returning the sink and the events; the events end when the connection drops.
pub(crate) async fn connect(source: &Source) -> ::redis::RedisResult<(Sink, Events)> {
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

/// For a Sentinel source, a receiver that changes when the sentinels announce a new primary.
pub(crate) fn switches(source: &Source) -> Option<watch::Receiver<u64>> {
    match source {
        #[cfg(feature = "redis-sentinel")]
        Source::Sentinel(sentinel) => Some(sentinel.switches()),
        _ => None,
    }
}
