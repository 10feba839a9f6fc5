//! The few ZooKeeper calls the lock recipe needs, on `zookeeper-client`.
//!
//! One [`Session`] value is one session. The crate gives what a lock must know and do: the session
//! timeout the server *granted* (a lease cannot be longer), watches re-registered after a
//! reconnect, `multi` for renewals that go through the quorum (a read could be served by a
//! follower cut off from the leader), and container parents. This module adds a deadline to
//! every call and reports the session's states on a channel, tagged with the session's
//! number, so that nothing runs on the crate's I/O task.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::mpsc;
use zookeeper_client as zkc;

use super::ZkAcl;
use crate::error::{Error, ErrorKind};

/// What the recipe needs to know about a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NodeStat {
    /// The zxid that created it: our fencing token.
    pub(super) czxid: i64,
    /// When it was created (server clock, ms since the epoch).
    pub(super) ctime: i64,
    /// The session it lives with.
    pub(super) owner: i64,
}

/// How a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failure {
    NoNode,
    NodeExists,
    NotEmpty,
    /// The connection dropped, the session ended, or the call ran past its deadline: the
    /// outcome is unknown.
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

/// A session state, as the session hub sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Link {
    /// Connected to a server, session established.
    Up,
    /// Trying to reconnect; the session may still be alive.
    Down,
    /// The session is over: expired, refused (auth), or closed. The client will not come back.
    Gone,
}

/// What a data watch saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fired {
    Deleted,
    /// The data changed (the node is still there).
    Changed,
    /// The session ended before anything happened to the node.
    SessionEnded,
}

/// A one-shot watch: resolves once, when the node changes or goes. Dropping it removes it.
pub(super) type Watch = BoxFuture<'static, Fired>;

/// How to reach the ensemble.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub(super) connect: String,
    pub(super) session_timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) call_timeout: Duration,
    /// The largest `tickTime` of the ensemble's servers (see [`super::proof`]).
    pub(super) server_tick: Duration,
    pub(super) digest: Option<String>,
    pub(super) acl: ZkAcl,
}

/// One session (`zookeeper-client`), with deadlines: the calls the recipe makes on it.
pub(super) struct Session {
    client: zkc::Client,
    call_timeout: Duration,
    acl: ZkAcl,
}

static CREATOR_ALL_WORLD_READ: [zkc::Acl; 2] = [
    zkc::Acl::new_const(zkc::Permission::ALL, "auth", ""),
    zkc::Acl::new_const(zkc::Permission::READ, "world", "anyone"),
];

fn acls(acl: ZkAcl) -> zkc::Acls<'static> {
    match acl {
        ZkAcl::Open => zkc::Acls::anyone_all(),
        ZkAcl::CreatorAll => zkc::Acls::creator_all(),
        ZkAcl::CreatorAllWorldRead => zkc::Acls::new(&CREATOR_ALL_WORLD_READ),
    }
}

/// Opens a session, and reports its states on `links` tagged with `epoch` until it ends (or
/// nobody listens). Gives up after the connect timeout.
pub(super) async fn connect(
    settings: &Settings,
    epoch: u64,
    links: mpsc::UnboundedSender<(u64, Link)>,
) -> crate::Result<Arc<Session>> {
    let mut connector = zkc::Client::connector()
        .with_session_timeout(settings.session_timeout)
        // We retry ourselves, with a pause, so fail an attempt once every host was tried.
        .with_fail_eagerly();
    if let Some(digest) = &settings.digest {
        // Sent with the session, and again after every reconnect.
        connector = connector.with_auth("digest", digest.as_bytes());
    }
    let client = match tokio::time::timeout(
        settings.connect_timeout,
        connector.connect(&settings.connect),
    )
    .await
    {
        Ok(Ok(client)) => client,
        Ok(Err(zkc::Error::BadArguments(why))) => {
            return Err(Error::invalid_config(format_args!(
                "zookeeper connect string `{}`: {why}",
                settings.connect
            )))
        }
        Ok(Err(zkc::Error::AuthFailed)) => {
            return Err(Error::new(
                ErrorKind::Backend,
                format!(
                    "zookeeper at `{}` refused the credentials",
                    settings.connect
                ),
            ))
        }
        Ok(Err(e)) => {
            return Err(Error::new(
                ErrorKind::Backend,
                format!("no zookeeper session at `{}`", settings.connect),
            )
            .with_source(e)
            .transient())
        }
        Err(_) => {
            return Err(Error::new(
                ErrorKind::Backend,
                format!(
                    "no zookeeper session at `{}` within {:?}",
                    settings.connect, settings.connect_timeout
                ),
            )
            .transient())
        }
    };
    ensure_chroot(&client, settings.acl, settings.call_timeout).await?;
    let granted = client.session_timeout();
    if granted != settings.session_timeout {
        tracing::info!(
            asked = ?settings.session_timeout,
            ?granted,
            "zookeeper granted another session timeout; leases use the granted one"
        );
    }
    let mut states = client.state_watcher();
    tokio::spawn(async move {
        loop {
            let state = tokio::select! {
                state = states.changed() => state,
                () = links.closed() => return,
            };
            let link = match state {
                zkc::SessionState::SyncConnected | zkc::SessionState::ConnectedReadOnly => Link::Up,
                zkc::SessionState::Disconnected => Link::Down,
                _ => Link::Gone,
            };
            if links.send((epoch, link)).is_err() || link == Link::Gone {
                return;
            }
        }
    });
    Ok(Arc::new(Session {
        client,
        call_timeout: settings.call_timeout,
        acl: settings.acl,
    }))
}

/// Creates the connect string's chroot (`host:2181/apps`) if it is missing, as a persistent
/// node with the backend's ACL, the way Curator creates its namespace: every lock path lives
/// under it, and on a fresh server nothing else would make it. Looked at first, so a chroot
/// that exists needs no create permission on its parent. Done for every new session, and again
/// when a lock path's first level finds it gone (deleted under running clients).
async fn ensure_chroot(
    client: &zkc::Client,
    acl: ZkAcl,
    call_timeout: Duration,
) -> crate::Result<()> {
    let chroot = client.path().to_owned();
    if chroot == "/" {
        return Ok(());
    }
    if chroot == "/zookeeper" || chroot.starts_with("/zookeeper/") {
        return Err(Error::invalid_config(format_args!(
            "the zookeeper chroot `{chroot}` is inside ZooKeeper's own reserved tree"
        )));
    }
    let root = client.clone().chroot("/").unwrap_or_else(|same| same);
    let failed = |e: zkc::Error| {
        match e {
        zkc::Error::NoAuth | zkc::Error::InvalidAcl => Error::invalid_config(format_args!(
            "the zookeeper chroot `{chroot}` does not exist and this client may not create it: create it, or grant create on its parent"
        )),
        // `/..`, a chroot under an ephemeral node: no retry makes it possible.
        zkc::Error::BadArguments(_) | zkc::Error::NoChildrenForEphemerals => {
            Error::invalid_config(format_args!("the zookeeper chroot `{chroot}` cannot be created"))
                .with_source(e)
        }
        other => Error::new(
            ErrorKind::Backend,
            format!("cannot create the zookeeper chroot `{chroot}`"),
        )
        .with_source(other)
        .transient(),
    }
    };
    let made = async {
        if root.check_stat(&chroot).await?.is_some() {
            return Ok(());
        }
        let options = zkc::CreateMode::Persistent.with_acls(acls(acl));
        root.mkdir(&chroot, &options).await
    };
    match tokio::time::timeout(call_timeout, made).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(failed(e)),
        Err(_) => Err(Error::new(
            ErrorKind::Backend,
            format!(
                "no reply within {call_timeout:?} while creating the zookeeper chroot `{chroot}`"
            ),
        )
        .transient()),
    }
}

impl Session {
    async fn call<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, zkc::Error>>,
    ) -> Outcome<T> {
        match tokio::time::timeout(self.call_timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(failure(e)),
            Err(_) => Err(Failure::Unknown(format!(
                "no reply within {:?}",
                self.call_timeout
            ))),
        }
    }
}

/// Only a definite answer from the server is a refusal; everything else (a lost or reset
/// connection, a timeout, a session that ended, anything the client could not read) leaves the
/// outcome unknown, and the recipe retries it.
fn failure(e: zkc::Error) -> Failure {
    match e {
        zkc::Error::NoNode => Failure::NoNode,
        zkc::Error::NodeExists => Failure::NodeExists,
        zkc::Error::NotEmpty => Failure::NotEmpty,
        zkc::Error::NoAuth => Failure::Refused("not authorized (NoAuth)".into()),
        zkc::Error::AuthFailed
        | zkc::Error::BadArguments(_)
        | zkc::Error::InvalidAcl
        | zkc::Error::BadVersion
        | zkc::Error::NoChildrenForEphemerals
        | zkc::Error::Unimplemented
        | zkc::Error::QuotaExceeded
        | zkc::Error::NotReadOnly
        | zkc::Error::ReconfigDisabled => Failure::Refused(e.to_string()),
        other => Failure::Unknown(other.to_string()),
    }
}

fn stat(s: &zkc::Stat) -> NodeStat {
    NodeStat {
        czxid: s.czxid,
        ctime: s.ctime,
        owner: s.ephemeral_owner,
    }
}

/// What a watch of `zookeeper-client` says once it fires. Its session's task going with its
/// runtime drops the watch's sender, and the crate (0.11) unwraps the cancelled receive: that
/// panic is caught here and taken for what it means, the session's end (a waiter of another
/// runtime hears it, and the client, gone with that runtime, refuses it).
async fn fired_at(watcher: zkc::OneshotWatcher) -> Fired {
    match AssertUnwindSafe(watcher.changed()).catch_unwind().await {
        Ok(event) => fired(&event),
        Err(_) => Fired::SessionEnded,
    }
}

fn fired(event: &zkc::WatchedEvent) -> Fired {
    match event.event_type {
        zkc::EventType::NodeDeleted => Fired::Deleted,
        zkc::EventType::Session => Fired::SessionEnded,
        _ => Fired::Changed,
    }
}

impl Session {
    /// The session timeout the server granted.
    pub(super) fn session_timeout(&self) -> Duration {
        self.client.session_timeout()
    }

    /// Creates the EPHEMERAL_SEQUENTIAL node `<prefix><seq>` holding `data` (a latch
    /// participant's id; empty for the locks).
    pub(super) async fn create_lock_node(
        &self,
        prefix: &str,
        data: &[u8],
    ) -> Outcome<(String, NodeStat)> {
        let options = zkc::CreateMode::EphemeralSequential.with_acls(acls(self.acl));
        let (made, seq) = self
            .call(self.client.create(prefix, data, &options))
            .await?;
        Ok((format!("{prefix}{seq}"), stat(&made)))
    }

    /// Creates `count` EPHEMERAL_SEQUENTIAL nodes `<prefix><seq>` in one `multi`: all of them
    /// or none. Their names and stats, in sequence order (one zxid, so one czxid).
    pub(super) async fn create_lease_nodes(
        &self,
        prefix: &str,
        count: u32,
    ) -> Outcome<Vec<(String, NodeStat)>> {
        let options = zkc::CreateMode::EphemeralSequential.with_acls(acls(self.acl));
        let mut multi = self.client.new_multi_writer();
        for _ in 0..count {
            multi.add_create(prefix, &[], &options).map_err(failure)?;
        }
        let results = match tokio::time::timeout(self.call_timeout, multi.commit()).await {
            Ok(Ok(results)) => results,
            Ok(Err(
                zkc::MultiWriteError::OperationFailed { source, .. }
                | zkc::MultiWriteError::RequestFailed { source },
            )) => return Err(failure(source)),
            Err(_) => {
                return Err(Failure::Unknown(format!(
                    "no reply within {:?}",
                    self.call_timeout
                )))
            }
        };
        let mut made = Vec::with_capacity(results.len());
        for result in results {
            let zkc::MultiWriteResult::Create { path, stat: s } = result else {
                return Err(Failure::Unknown("unexpected multi result".into()));
            };
            // Some servers leave the stat of a create inside a multi empty
            // (ZOOKEEPER-4026): read it.
            let s = if s.is_invalid() {
                match self.call(self.client.check_stat(&path)).await? {
                    Some(s) => s,
                    None => return Err(Failure::NoNode),
                }
            } else {
                s
            };
            made.push((path, stat(&s)));
        }
        made.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(made)
    }

    /// Creates the plain EPHEMERAL node `path` (a downgraded read node).
    pub(super) async fn create_ephemeral(&self, path: &str) -> Outcome<NodeStat> {
        let options = zkc::CreateMode::Ephemeral.with_acls(acls(self.acl));
        let (made, _) = self.call(self.client.create(path, &[], &options)).await?;
        if made.is_invalid() {
            return match self.call(self.client.check_stat(path)).await? {
                Some(s) => Ok(stat(&s)),
                None => Err(Failure::NoNode),
            };
        }
        Ok(stat(&made))
    }

    pub(super) async fn create_parent(&self, path: &str) -> Outcome<()> {
        // Containers, as Curator makes them: the server deletes one that has emptied,
        // should we die before deleting it ourselves.
        let options = zkc::CreateMode::Container.with_acls(acls(self.acl));
        let made = self.call(self.client.create(path, &[], &options)).await;
        // A first-level node with no parent: the chroot was deleted under us. Make it
        // again, once, as a new session would.
        if matches!(made, Err(Failure::NoNode)) && path.get(1..).is_some_and(|p| !p.contains('/')) {
            ensure_chroot(&self.client, self.acl, self.call_timeout)
                .await
                .map_err(|e| Failure::Refused(e.to_string()))?;
            return self
                .call(self.client.create(path, &[], &options))
                .await
                .map(drop);
        }
        made.map(drop)
    }

    pub(super) async fn delete(&self, path: &str) -> Outcome<()> {
        self.call(self.client.delete(path, None)).await
    }

    pub(super) async fn children(&self, path: &str) -> Outcome<Vec<String>> {
        self.call(self.client.list_children(path)).await
    }

    pub(super) async fn exists(&self, path: &str) -> Outcome<Option<NodeStat>> {
        let found = self.call(self.client.check_stat(path)).await?;
        Ok(found.as_ref().map(stat))
    }

    /// `path`'s data and stat.
    pub(super) async fn get_data(&self, path: &str) -> Outcome<(Vec<u8>, NodeStat)> {
        let (data, s) = self.call(self.client.get_data(path)).await?;
        Ok((data, stat(&s)))
    }

    /// Replaces `path`'s data, whatever its version.
    pub(super) async fn set_data(&self, path: &str, data: &[u8]) -> Outcome<()> {
        self.call(self.client.set_data(path, data, None))
            .await
            .map(drop)
    }

    /// Whether `path` exists, and a one-shot watch on its creation, deletion or data.
    pub(super) async fn watch_exists(&self, path: &str) -> Outcome<(bool, Watch)> {
        let (found, watcher) = self.call(self.client.check_and_watch_stat(path)).await?;
        let watch: Watch = Box::pin(fired_at(watcher));
        Ok((found.is_some(), watch))
    }

    /// Lists `path`'s children and watches them for a change (a child added or removed).
    pub(super) async fn watch_children(&self, path: &str) -> Outcome<(Vec<String>, Watch)> {
        let (children, watcher) = self.call(self.client.list_and_watch_children(path)).await?;
        let watch: Watch = Box::pin(fired_at(watcher));
        Ok((children, watch))
    }

    /// Sets a one-shot data watch on `path` (`NoNode` if it is already gone).
    pub(super) async fn watch(&self, path: &str) -> Outcome<Watch> {
        // `getData`, not `exists`: no watch is left on the server if the node is already
        // gone (CURATOR-107).
        let (_, _, watcher) = self.call(self.client.get_and_watch_data(path)).await?;
        let watch: Watch = Box::pin(fired_at(watcher));
        Ok(watch)
    }

    /// Checks in one quorum write (a `multi` of `check` operations) that every path exists: a
    /// follower cut off from the leader cannot acknowledge it (it could a read). Through a
    /// follower it proves the session alive at the leader only for earlier requests
    /// ([`super::proof`]). One outcome per path.
    pub(super) async fn check(&self, paths: &[String]) -> Vec<Outcome<()>> {
        let mut out: Vec<Outcome<()>> = Vec::with_capacity(paths.len());
        // A failed multi names its first failing operation; those before it passed, those
        // after it were not looked at: check them again.
        while out.len() < paths.len() {
            let rest = &paths[out.len()..];
            let mut multi = self.client.new_multi_writer();
            let mut added = 0;
            let mut refused = None;
            for path in rest {
                match multi.add_check_version(path, -1) {
                    Ok(()) => added += 1,
                    Err(e) => {
                        refused = Some(failure(e));
                        break;
                    }
                }
            }
            if added == 0 {
                out.push(Err(refused.unwrap_or_else(|| {
                    Failure::Refused("path cannot be checked".into())
                })));
                continue;
            }
            let batch = &rest[..added];
            match tokio::time::timeout(self.call_timeout, multi.commit()).await {
                Ok(Ok(_)) => out.extend(batch.iter().map(|_| Ok(()))),
                Ok(Err(zkc::MultiWriteError::OperationFailed { index, source })) => {
                    out.extend(batch.iter().take(index).map(|_| Ok(())));
                    out.push(Err(failure(source)));
                }
                Ok(Err(zkc::MultiWriteError::RequestFailed { source })) => {
                    let f = failure(source);
                    out.extend(batch.iter().map(|_| Err(f.clone())));
                }
                Err(_) => {
                    let f = Failure::Unknown(format!("no reply within {:?}", self.call_timeout));
                    out.extend(batch.iter().map(|_| Err(f.clone())));
                }
            }
        }
        out
    }

    /// Resolves once this session is closed (after the last handle to it is dropped).
    pub(super) fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut states = self.client.state_watcher();
        async move {
            while !states.peek_state().is_terminated() {
                states.changed().await;
            }
        }
    }
}
