//! ZooKeeper test clients and probes: lock clients with their own sessions, a plain client for
//! looking at the tree, and waits on what the tree shows.

use std::time::Duration;

use distlock::backend::ZkBackend;
use distlock::LockClient;
use futures::future::BoxFuture;
use tokio::time::{sleep, timeout, Instant};
use zookeeper_client::Client as ZooKeeper;

/// The `tickTime` of every test server (`support::zk_command_with`).
pub const SERVER_TICK: Duration = Duration::from_millis(500);

/// A backend on `connect` asking for `session`, with calls bounded at 2 s, told the servers'
/// `tickTime`.
pub async fn backend(connect: &str, session: Duration) -> ZkBackend {
    ZkBackend::builder(connect)
        .session_timeout(session)
        .call_timeout(Duration::from_secs(2))
        .server_tick(SERVER_TICK)
        .build()
        .await
        .unwrap()
}

/// A lock client with its own session, as a separate process would have; its TTL is the
/// session the server granted.
pub async fn client_at(connect: &str, ns: &str, session: Duration) -> LockClient {
    let backend = backend(connect, session).await;
    let ttl = backend.session_timeout();
    LockClient::builder(backend)
        .namespace(ns)
        .ttl(ttl)
        .build()
        .unwrap()
}

/// `n` such clients.
pub async fn clients_at(connect: &str, ns: &str, session: Duration, n: usize) -> Vec<LockClient> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(client_at(connect, ns, session).await);
    }
    out
}

/// A plain client for looking at the tree.
pub async fn raw(connect: &str) -> ZooKeeper {
    raw_as(connect, None).await
}

/// A plain client, authenticated with digest `user:password` if given.
pub async fn raw_as(connect: &str, digest: Option<&str>) -> ZooKeeper {
    let mut connector = ZooKeeper::connector().with_session_timeout(Duration::from_secs(10));
    if let Some(digest) = digest {
        connector = connector.with_auth("digest", digest.as_bytes());
    }
    timeout(Duration::from_secs(10), connector.connect(connect))
        .await
        .unwrap()
        .unwrap()
}

/// Every znode under `root` (not `root` itself), depth first.
pub async fn znodes_under(zk: &ZooKeeper, root: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_owned()];
    while let Some(path) = todo.pop() {
        let Ok(kids) = zk.list_children(&path).await else {
            continue;
        };
        for k in kids {
            let child = format!("{path}/{k}");
            out.push(child.clone());
            todo.push(child);
        }
    }
    out
}

pub async fn children(zk: &ZooKeeper, path: &str) -> Vec<String> {
    zk.list_children(path).await.unwrap_or_default()
}

/// Waits until the lock node has `n` children (holder included).
pub async fn until_contenders(zk: &ZooKeeper, path: &str, n: usize) {
    timeout(Duration::from_secs(10), async {
        while children(zk, path).await.len() != n {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("expected {n} contenders under {path}"));
}

/// Waits out the lingering delete of idle lock nodes and checks nothing is left.
pub async fn assert_no_znodes(zk: &ZooKeeper, ns: &str) {
    let root = format!("/{ns}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = znodes_under(zk, &root).await;
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "znodes left under {root}: {left:?}"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// How many claims wait (hold nothing) on a read-write lock node, by Curator's rules: the
/// holders are the first node if it is a writer, else the readers ahead of the first writer.
/// A semaphore's waiters are its admission nodes (`<path>/locks`); a mutex's, all but one.
pub async fn waiting(zk: &ZooKeeper, path: &str) -> usize {
    let admission = children(zk, &format!("{path}/locks")).await;
    if !admission.is_empty() {
        return admission.len();
    }
    let mut kids = children(zk, path).await;
    kids.retain(|k| k != "locks" && k != "leases");
    let seq = |k: &String| k[k.len().saturating_sub(10)..].to_owned();
    kids.sort_by_key(seq);
    let holders = match kids.first() {
        None => 0,
        Some(k) if !k.contains("__READ__") => 1,
        Some(_) => kids.iter().take_while(|k| k.contains("__READ__")).count(),
    };
    kids.len() - holders
}

/// The family checks' probe: waits until `n` claims wait on `/<ns>/<key>`.
pub fn queued(
    connect: &str,
    ns: &str,
    key: &str,
) -> impl Fn(usize) -> BoxFuture<'static, ()> + Sync {
    let (connect, path) = (connect.to_owned(), format!("/{ns}/{key}"));
    move |n| {
        let (connect, path) = (connect.clone(), path.clone());
        Box::pin(async move {
            let zk = raw(&connect).await;
            timeout(Duration::from_secs(10), async {
                while waiting(&zk, &path).await != n {
                    sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("expected {n} waiting under {path}"));
        })
    }
}
