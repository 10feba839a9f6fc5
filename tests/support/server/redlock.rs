//! Independent `redis-server` nodes for Redlock tests, each reachable directly or through a
//! fault proxy; five shared by every test of a binary, and the behaviour suite's fixture on
//! them.

use std::sync::OnceLock;
use std::time::Duration;

use distlock::backend::RedlockBackend;
use distlock::{Leadership, LockClient};
use futures::future::BoxFuture;
use tokio::task::JoinHandle;

use super::redis::RedisServer;
use crate::support::proxy::Proxy;

/// `n` independent nodes, each behind its own proxy (faults are aimed at one node's proxy).
pub struct Nodes {
    pub servers: Vec<RedisServer>,
    pub proxies: Vec<Proxy>,
}

impl Nodes {
    pub fn start(n: usize) -> Self {
        let servers: Vec<RedisServer> = (0..n).map(|_| RedisServer::start()).collect();
        let proxies = servers.iter().map(|s| Proxy::start(s.port())).collect();
        Self { servers, proxies }
    }

    /// The nodes' URLs through their proxies.
    pub fn urls(&self) -> Vec<String> {
        urls_of(&self.proxies)
    }

    /// A second proxy in front of each node, with their URLs: one client's own network, which
    /// faults can cut without touching the others'.
    pub fn own_network(&self) -> (Vec<Proxy>, Vec<String>) {
        let proxies: Vec<Proxy> = self
            .servers
            .iter()
            .map(|s| Proxy::start(s.port()))
            .collect();
        let urls = urls_of(&proxies);
        (proxies, urls)
    }

    /// A campaign of `client` for `value` on election `key`, returned once `n` candidates wait
    /// in line on a majority of the nodes (this one the last).
    pub async fn in_line(
        &self,
        client: &LockClient,
        ns: &str,
        key: &str,
        value: impl AsRef<[u8]>,
        n: usize,
    ) -> JoinHandle<distlock::Result<Leadership>> {
        let waiting = tokio::spawn(client.election(key).campaign(value));
        self.until_queued(ns, key, n).await;
        waiting
    }

    /// A client over every node, with a short rejoin delay (the nodes are fresh).
    pub async fn client(&self, ns: &str) -> LockClient {
        self.client_with(ns, Duration::from_secs(2), Duration::ZERO)
            .await
    }

    pub async fn client_with(&self, ns: &str, ttl: Duration, rejoin: Duration) -> LockClient {
        client_on(self.urls(), ns, ttl, rejoin).await
    }

    /// `N` clients over every node (see [`Nodes::client_with`]), leases of `ttl`, no rejoin
    /// delay.
    pub async fn clients<const N: usize>(&self, ns: &str, ttl: Duration) -> [LockClient; N] {
        let mut clients = Vec::with_capacity(N);
        for _ in 0..N {
            clients.push(self.client_with(ns, ttl, Duration::ZERO).await);
        }
        clients
            .try_into()
            .unwrap_or_else(|_| unreachable!("N clients made"))
    }

    /// The nodes' own URLs, past the proxies (a client whose view no fault touches).
    pub fn direct_urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// The keys of the namespace left on every node, except fencing counters (which carry a
    /// TTL) and the nodes' `born` marks.
    pub async fn leftovers(&self, ns: &str) -> Vec<String> {
        let mut left = Vec::new();
        for s in &self.servers {
            for key in crate::support::redis::keys_in(&s.url(), ns).await {
                if !key.ends_with(":fence") && key != format!("{ns}:born") {
                    left.push(format!("{}: {key}", s.port()));
                }
            }
        }
        left
    }

    /// Waits until the namespace holds nothing but counters and marks on any node.
    pub async fn until_clean(&self, ns: &str) {
        crate::support::until_none_left(Duration::from_secs(10), "keys", || self.leftovers(ns))
            .await;
    }

    /// How many claims wait on `key` on node `i`.
    pub async fn queued(&self, i: usize, ns: &str, key: &str) -> usize {
        let mut conn = crate::support::redis::connection(&self.servers[i].url()).await;
        redis::cmd("ZCARD")
            .arg(format!("{ns}:{{{key}}}:rq"))
            .query_async(&mut conn)
            .await
            .unwrap()
    }

    /// Waits until `n` claims wait on `key` on a majority of the nodes (a waiter may hold the
    /// lock on a node the holder's majority left out, handed there while it waits).
    pub async fn until_queued(&self, ns: &str, key: &str, n: usize) {
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let mut agree = 0;
                for i in 0..self.servers.len() {
                    agree += usize::from(self.queued(i, ns, key).await == n);
                }
                if agree > self.servers.len() / 2 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
        if waited.is_err() {
            let mut seen = Vec::new();
            for i in 0..self.servers.len() {
                seen.push(self.queued(i, ns, key).await);
            }
            panic!("expected {n} queued waiters on a majority of nodes, found {seen:?}");
        }
    }
}

/// The URLs of `proxies`, in order.
pub fn urls_of(proxies: &[Proxy]) -> Vec<String> {
    proxies
        .iter()
        .map(|p| format!("redis://127.0.0.1:{}/", p.port()))
        .collect()
}

/// A Redlock client over `urls`, node timeout 300 ms, handoff lease 500 ms.
pub async fn client_on(urls: Vec<String>, ns: &str, ttl: Duration, rejoin: Duration) -> LockClient {
    client_tuned(urls, ns, ttl, rejoin, Duration::from_millis(500)).await
}

/// A Redlock client over `urls`, node timeout 300 ms.
pub async fn client_tuned(
    urls: Vec<String>,
    ns: &str,
    ttl: Duration,
    rejoin: Duration,
    handoff: Duration,
) -> LockClient {
    let backend = RedlockBackend::builder(urls)
        .node_timeout(Duration::from_millis(300))
        .handoff_ttl(handoff)
        .rejoin_delay(rejoin)
        .build()
        .await
        .unwrap();
    LockClient::builder(backend)
        .namespace(ns)
        .ttl(ttl)
        .build()
        .unwrap()
}

/// Five nodes shared by every test of a binary; tests keep apart by namespace.
pub fn shared_nodes() -> &'static Nodes {
    static NODES: OnceLock<Nodes> = OnceLock::new();
    NODES.get_or_init(|| Nodes::start(5))
}

/// The suite's fixture: the binary's shared nodes, through their proxies (no fault set).
struct Redlock;

impl super::Server for Redlock {
    /// A lease of 2 s unless a test says otherwise; no rejoin delay (the nodes are fresh).
    fn client(&self, ns: String, ttl: Option<Duration>) -> BoxFuture<'static, LockClient> {
        let ttl = ttl.unwrap_or(Duration::from_secs(2));
        Box::pin(async move { shared_nodes().client_with(&ns, ttl, Duration::ZERO).await })
    }

    /// On a majority of the nodes.
    fn until_queued(&self, ns: String, key: String, n: usize) -> BoxFuture<'static, ()> {
        Box::pin(async move { shared_nodes().until_queued(&ns, &key, n).await })
    }

    /// Nothing but counters and the nodes' marks on any node, within 10 s.
    fn assert_clean(&self, ns: String) -> BoxFuture<'static, ()> {
        Box::pin(async move { shared_nodes().until_clean(&ns).await })
    }
}

/// A test's namespace on the binary's shared five nodes.
pub async fn env(ns: String) -> super::Env {
    let probe = RedlockBackend::builder(shared_nodes().urls())
        .build()
        .await
        .unwrap();
    super::Env::new("redlock", ns, super::Supports::of(&probe), Redlock)
}

/// The shared fault scenarios' view of the binary's shared nodes, straight to their servers (a
/// scenario puts proxies of its own in front of every node): a client's URL lists every node's,
/// separated by ','.
pub fn service() -> crate::support::faults::Service {
    let ports: Vec<u16> = shared_nodes()
        .servers
        .iter()
        .map(RedisServer::port)
        .collect();
    crate::support::faults::Service {
        port: ports[0],
        more_ports: ports[1..].to_vec(),
        url_for: |port| format!("redis://127.0.0.1:{port}/"),
        connect: |urls, ns, ttl, handoff| {
            Box::pin(async move {
                let urls = urls.split(',').map(str::to_owned).collect();
                client_tuned(urls, &ns, ttl, Duration::ZERO, handoff).await
            })
        },
        until_queued: |ns, key, n| {
            Box::pin(async move { shared_nodes().until_queued(&ns, &key, n).await })
        },
        left_in: |ns| Box::pin(async move { shared_nodes().leftovers(&ns).await.len() }),
    }
}
