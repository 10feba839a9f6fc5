//! The few ZooKeeper calls the lock recipe needs, behind one small trait, and their
//! implementation on `zookeeper-async`.
//!
//! The wrapper owns what the crate lacks (research/zk-anchors.md §C): a deadline on every call
//! (R12), connection states mapped to our own and delivered without blocking its I/O task
//! (R13), watch closures that only complete a oneshot (R16), and an explicit close (R10).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};
use zookeeper_async::{
    Acl, CreateMode, Permission, WatchedEvent, WatchedEventType, ZkError, ZkState, ZooKeeper,
};

use super::ZkAcl;
use crate::error::{Error, ErrorKind};

/// What the recipe needs to know about a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NodeStat {
    /// The zxid that created it: our fencing token.
    pub(super) czxid: i64,
    /// The session that owns it, if ephemeral.
    pub(super) session: i64,
}

/// How a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failure {
    NoNode,
    NodeExists,
    NotEmpty,
    /// The connection dropped, or the call ran past its deadline: the outcome is unknown.
    Unknown(String),
    /// Anything else the server said (no auth, bad arguments, ...).
    Refused(String),
}

impl Failure {
    pub(super) fn into_error(self, what: &str) -> Error {
        match self {
            Failure::Unknown(why) => {
                Error::new(ErrorKind::Backend, format!("zookeeper {what}: {why}")).transient()
            }
            other => Error::new(ErrorKind::Backend, format!("zookeeper {what}: {other}")),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::NoNode => f.write_str("no such node"),
            Failure::NodeExists => f.write_str("node exists"),
            Failure::NotEmpty => f.write_str("node has children"),
            Failure::Unknown(why) | Failure::Refused(why) => f.write_str(why),
        }
    }
}

pub(super) type Outcome<T> = std::result::Result<T, Failure>;

/// A connection state, as the session hub sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Link {
    /// Connected to a server, session established.
    Up,
    /// Trying to (re)connect; the session may still be alive.
    Down,
    /// The server said the session expired; the client starts a new one.
    Expired,
    /// Closed by us.
    Closed,
}

/// What a data watch saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fired {
    Deleted,
    Other,
}

/// The calls the recipe makes. One implementation today (`zookeeper-async`); the seam keeps a
/// switch to another client cheap.
pub(super) trait Zk: Send + Sync + 'static {
    fn create_lock_node<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Outcome<(String, NodeStat)>>;
    fn create_parent<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Outcome<()>>;
    fn delete<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Outcome<()>>;
    fn children<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Outcome<Vec<String>>>;
    fn exists<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Outcome<Option<NodeStat>>>;
    /// Sets a one-shot data watch on `path`: the receiver completes when it changes or goes.
    fn watch<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Outcome<oneshot::Receiver<Fired>>>;
    fn authenticate(&self) -> BoxFuture<'_, Outcome<()>>;
    fn close(&self) -> BoxFuture<'_, ()>;
}

/// How to reach the ensemble.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub(super) connect: String,
    pub(super) session_timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) call_timeout: Duration,
    pub(super) digest: Option<String>,
    pub(super) acl: ZkAcl,
}

/// `zookeeper-async`, with deadlines.
pub(super) struct AsyncZk {
    zk: Arc<ZooKeeper>,
    settings: Settings,
    acl: Vec<Acl>,
}

/// The crate's connect-time watcher receives only events no closure claimed; we need none.
struct Ignore;

impl zookeeper_async::Watcher for Ignore {
    fn handle(&self, _: WatchedEvent) {}
}

impl AsyncZk {
    /// Opens the client and reports its connection states on `states`. Returns once the TCP
    /// connection is up; the session is confirmed by the hub's first successful call.
    pub(super) async fn connect(
        settings: Settings,
        states: mpsc::UnboundedSender<Link>,
    ) -> crate::Result<Self> {
        let connecting = ZooKeeper::connect_with_retry_time(
            &settings.connect,
            settings.session_timeout,
            Ignore,
            // Never hot-loop on refused connections (R11).
            Duration::from_millis(100),
        );
        let zk = match tokio::time::timeout(settings.connect_timeout, connecting).await {
            Ok(Ok(zk)) => zk,
            Ok(Err(e)) => {
                return Err(Error::new(
                    ErrorKind::InvalidConfig,
                    format!(
                        "invalid zookeeper connect string `{}`: {e:?}",
                        settings.connect
                    ),
                ))
            }
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Backend,
                    format!(
                        "could not reach zookeeper at `{}` within {:?}",
                        settings.connect, settings.connect_timeout
                    ),
                )
                .transient())
            }
        };
        // Runs on the crate's I/O task with a lock held: forward and return at once (R13).
        zk.add_listener(move |state| {
            #[allow(deprecated)]
            let link = match state {
                ZkState::Connected | ZkState::ConnectedReadOnly => Link::Up,
                ZkState::NotConnected => Link::Expired,
                ZkState::Closed => Link::Closed,
                _ => Link::Down,
            };
            let _ = states.send(link);
        });
        let acl = match settings.acl {
            ZkAcl::Open => Acl::open_unsafe().clone(),
            ZkAcl::CreatorAll => Acl::creator_all().clone(),
            ZkAcl::CreatorAllWorldRead => {
                let mut acl = Acl::creator_all().clone();
                acl.push(Acl::new(Permission::READ, "world", "anyone"));
                acl
            }
        };
        Ok(Self {
            zk: Arc::new(zk),
            settings,
            acl,
        })
    }

    async fn call<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, ZkError>>,
    ) -> Outcome<T> {
        match tokio::time::timeout(self.settings.call_timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(failure(e)),
            Err(_) => Err(Failure::Unknown(format!(
                "no reply within {:?}",
                self.settings.call_timeout
            ))),
        }
    }
}

fn failure(e: ZkError) -> Failure {
    match e {
        ZkError::NoNode => Failure::NoNode,
        ZkError::NodeExists => Failure::NodeExists,
        ZkError::NotEmpty => Failure::NotEmpty,
        ZkError::ConnectionLoss | ZkError::OperationTimeout | ZkError::SessionMoved => {
            Failure::Unknown(format!("{e:?}"))
        }
        ZkError::NoAuth => Failure::Refused("not authorized (NoAuth)".into()),
        ZkError::AuthFailed => Failure::Refused("authentication failed".into()),
        ZkError::SessionExpired => Failure::Refused("session expired".into()),
        other => Failure::Refused(format!("{other:?}")),
    }
}

fn stat(s: &zookeeper_async::Stat) -> NodeStat {
    NodeStat {
        czxid: s.czxid,
        session: s.ephemeral_owner,
    }
}

impl Zk for AsyncZk {
    fn create_lock_node<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Outcome<(String, NodeStat)>> {
        Box::pin(async move {
            let made = self
                .call(self.zk.create2(
                    path,
                    Vec::new(),
                    self.acl.clone(),
                    CreateMode::EphemeralSequential,
                ))
                .await?;
            Ok((made.0, stat(&made.1)))
        })
    }

    fn create_parent<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Outcome<()>> {
        Box::pin(async move {
            // `CreateMode::Container` goes out as a plain create in this crate (R5), so parents
            // are persistent and the recipe deletes them when they empty.
            self.call(
                self.zk
                    .create(path, Vec::new(), self.acl.clone(), CreateMode::Persistent),
            )
            .await
            .map(drop)
        })
    }

    fn delete<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Outcome<()>> {
        Box::pin(self.call(self.zk.delete(path, None)))
    }

    fn children<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Outcome<Vec<String>>> {
        Box::pin(self.call(self.zk.get_children(path, false)))
    }

    fn exists<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Outcome<Option<NodeStat>>> {
        Box::pin(async move {
            let found = self.call(self.zk.exists(path, false)).await?;
            Ok(found.as_ref().map(stat))
        })
    }

    fn watch<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Outcome<oneshot::Receiver<Fired>>> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            // `getData`, not `exists`: no watch is left on the server if the node is already
            // gone (CURATOR-107). The closure runs on the crate's watch task: it only sends.
            self.call(self.zk.get_data_w(path, move |event: WatchedEvent| {
                let fired = if event.event_type == WatchedEventType::NodeDeleted {
                    Fired::Deleted
                } else {
                    Fired::Other
                };
                let _ = tx.send(fired);
            }))
            .await?;
            Ok(rx)
        })
    }

    fn authenticate(&self) -> BoxFuture<'_, Outcome<()>> {
        Box::pin(async move {
            match &self.settings.digest {
                Some(digest) => {
                    self.call(self.zk.add_auth("digest", digest.clone().into_bytes()))
                        .await
                }
                None => Ok(()),
            }
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let _ = self.call(self.zk.close()).await;
        })
    }
}

impl Drop for AsyncZk {
    fn drop(&mut self) {
        // A dropped `ZooKeeper` keeps its session (and our ephemeral nodes) alive (R10).
        // `close` after an explicit close is a harmless no-op.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let zk = self.zk.clone();
            handle.spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(2), zk.close()).await;
            });
        }
    }
}
