//! A Redis Cluster on loopback: three primaries, each with one replica, every node a real
//! `redis-server --cluster-enabled yes`, joined by `redis-cli --cluster create`; one shared by
//! every test of a binary, and the behaviour suite's fixture on it.

use std::time::{Duration, Instant};

use distlock::LockClient;
use futures::future::BoxFuture;

use super::redis::RedisServer;
use crate::support::require_binary;

/// How long a node may wait for a silent peer before it counts as failing (kept short so a
/// killed primary's replica takes over within a couple of seconds).
const NODE_TIMEOUT_MS: &str = "1000";

pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

/// One line of `CLUSTER NODES`, as far as the tests need it.
#[derive(Debug, Clone)]
pub struct NodeLine {
    pub id: String,
    pub port: u16,
    pub primary: bool,
    pub failed: bool,
    /// The primary this node replicates, if it is a replica.
    pub replicates: Option<String>,
    /// Slot ranges served, for a primary.
    pub slots: Vec<(u16, u16)>,
}

use crate::support::query_port as query;

impl RedisCluster {
    /// Starts six nodes and joins them into a cluster; returns once every slot is served and
    /// every replica is in sync with its primary.
    pub fn start() -> Self {
        let cli = require_binary("redis-cli");
        let nodes: Vec<RedisServer> = (0..6)
            .map(|_| {
                RedisServer::start_cluster_node(&[
                    "--cluster-node-timeout",
                    NODE_TIMEOUT_MS,
                    // A replica may take over at once, however long ago it heard its primary.
                    "--cluster-replica-validity-factor",
                    "0",
                ])
                .0
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = std::process::Command::new(cli)
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Self { nodes };
        cluster.until_settled(Duration::from_secs(60));
        cluster
    }

    /// Seed URL for `LockClient::connect` (the three first nodes).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .take(3)
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// `CLUSTER NODES` as node `i` sees it.
    pub fn view(&self, i: usize) -> Vec<NodeLine> {
        let text: String =
            query(self.nodes[i].port(), redis::cmd("CLUSTER").arg("NODES")).unwrap_or_default();
        text.lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let port = f
                    .get(1)?
                    .split('@')
                    .next()?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()?;
                let flags = f.get(2)?;
                let slots = f
                    .iter()
                    .skip(8)
                    .filter(|s| !s.starts_with('['))
                    .filter_map(|s| {
                        let (a, b) = s.split_once('-').unwrap_or((s, s));
                        Some((a.parse().ok()?, b.parse().ok()?))
                    })
                    .collect();
                Some(NodeLine {
                    id: f.first()?.to_string(),
                    port,
                    primary: flags.contains("master"),
                    failed: flags.contains("fail"),
                    replicates: f.get(3).filter(|m| **m != "-").map(|m| m.to_string()),
                    slots,
                })
            })
            .collect()
    }

    /// The indices of the nodes serving slots now.
    pub fn primaries(&self) -> Vec<usize> {
        self.view(0)
            .iter()
            .filter(|n| n.primary && !n.failed && !n.slots.is_empty())
            .filter_map(|n| self.index_of_port(n.port))
            .collect()
    }

    fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port() == port)
    }

    /// The node serving `key`'s slot, as node `from` sees it.
    pub fn primary_for(&self, key: &str, from: usize) -> usize {
        let slot: u16 = query(
            self.nodes[from].port(),
            redis::cmd("CLUSTER").arg("KEYSLOT").arg(key),
        )
        .expect("CLUSTER KEYSLOT");
        let view = self.view(from);
        let line = view
            .iter()
            .find(|n| {
                n.primary && !n.failed && n.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
            })
            .unwrap_or_else(|| panic!("no primary serves slot {slot}: {view:?}"));
        self.index_of_port(line.port).expect("a node of ours")
    }

    /// A replica of the primary at index `primary`.
    pub fn replica_of(&self, primary: usize) -> usize {
        let view = self.view(primary);
        let id = &view
            .iter()
            .find(|n| n.port == self.nodes[primary].port())
            .expect("the node itself")
            .id;
        let replica = view
            .iter()
            .find(|n| n.replicates.as_deref() == Some(id) && !n.failed)
            .unwrap_or_else(|| panic!("no replica of node {primary}: {view:?}"));
        self.index_of_port(replica.port).expect("a node of ours")
    }

    /// Waits until every live node says the cluster is ok, every slot is served by a primary
    /// that is not failing, and every primary has a replica in sync.
    pub fn until_settled(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if self.settled() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not settle: {:?}",
                self.view(0)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn settled(&self) -> bool {
        for (i, node) in self.nodes.iter().enumerate() {
            let info: String = match query(node.port(), redis::cmd("CLUSTER").arg("INFO")) {
                Ok(info) => info,
                Err(_) => return false,
            };
            if !info.contains("cluster_state:ok") || !info.contains("cluster_slots_ok:16384") {
                return false;
            }
            let view = self.view(i);
            if view.iter().any(|n| n.failed) {
                return false;
            }
            let repl: String = match query(node.port(), redis::cmd("INFO").arg("replication")) {
                Ok(r) => r,
                Err(_) => return false,
            };
            if repl.contains("role:slave") && !repl.contains("master_link_status:up") {
                return false;
            }
        }
        true
    }

    /// `CLUSTER FAILOVER` on the replica at index `replica`: it and its primary swap roles
    /// without losing a write. Returns once the cluster agrees.
    pub fn failover(&self, replica: usize) {
        let _: () = query(
            self.nodes[replica].port(),
            redis::cmd("CLUSTER").arg("FAILOVER"),
        )
        .expect("CLUSTER FAILOVER");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let me = self.view(replica);
            let promoted = me
                .iter()
                .any(|n| n.port == self.nodes[replica].port() && n.primary);
            if promoted && self.settled() {
                return;
            }
            assert!(Instant::now() < deadline, "failover did not finish: {me:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILLs the primary at index `primary` (its unreplicated writes are lost with it),
    /// waits until its replica at index `replica` has taken over, then starts the killed node
    /// again on its old config (it rejoins as a replica) and waits until the cluster settles.
    pub fn kill_primary(&mut self, primary: usize, replica: usize) {
        let port = self.nodes[replica].port();
        self.nodes[primary].restart_after(|| until_primary(port));
        self.until_settled(Duration::from_secs(60));
    }

    /// SIGKILLs the primary at index `primary` and leaves it down; returns once its replica at
    /// index `replica` has taken over.
    pub fn kill_primary_for_good(&mut self, primary: usize, replica: usize) {
        let port = self.nodes[replica].port();
        self.nodes[primary].kill();
        until_primary(port);
    }

    /// Moves `key`'s slot from the primary serving it to another primary (the `redis-cli
    /// --cluster reshard` steps: IMPORTING, MIGRATING, MIGRATE of every key, then NODE).
    /// Returns the index of the new owner.
    pub fn migrate_slot_of(&self, key: &str) -> usize {
        let from = self.primary_for(key, 0);
        let view = self.view(0);
        let id_of = |i: usize| {
            view.iter()
                .find(|n| n.port == self.nodes[i].port())
                .expect("a node of ours")
                .id
                .clone()
        };
        let to = view
            .iter()
            .filter(|n| n.primary && !n.failed && n.port != self.nodes[from].port())
            .find_map(|n| self.index_of_port(n.port))
            .expect("another primary");
        let slot: u16 = query(
            self.nodes[from].port(),
            redis::cmd("CLUSTER").arg("KEYSLOT").arg(key),
        )
        .expect("CLUSTER KEYSLOT");
        let (from_id, to_id) = (id_of(from), id_of(to));
        let setslot = |node: usize, how: &str, id: &str| {
            let _: () = query(
                self.nodes[node].port(),
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg(how)
                    .arg(id),
            )
            .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {how} on node {node}: {e}"));
        };
        setslot(to, "IMPORTING", &from_id);
        setslot(from, "MIGRATING", &to_id);
        loop {
            let keys: Vec<String> = query(
                self.nodes[from].port(),
                redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(slot)
                    .arg(100),
            )
            .expect("CLUSTER GETKEYSINSLOT");
            if keys.is_empty() {
                break;
            }
            let _: redis::Value = query(
                self.nodes[from].port(),
                redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(self.nodes[to].port())
                    .arg("")
                    .arg(0)
                    .arg(5000)
                    .arg("REPLACE")
                    .arg("KEYS")
                    .arg(&keys),
            )
            .expect("MIGRATE");
        }
        for node in [to, from] {
            setslot(node, "NODE", &to_id);
        }
        for i in 0..self.nodes.len() {
            if i != to && i != from {
                let _: redis::RedisResult<()> = query(
                    self.nodes[i].port(),
                    redis::cmd("CLUSTER")
                        .arg("SETSLOT")
                        .arg(slot)
                        .arg("NODE")
                        .arg(&to_id),
                );
            }
        }
        self.until_settled(Duration::from_secs(60));
        to
    }

    /// Keys of namespace `ns` on every primary, except fencing counters.
    pub fn leftovers(&self, ns: &str) -> Vec<String> {
        let mut left = Vec::new();
        for node in &self.nodes {
            let keys: Vec<String> =
                query(node.port(), redis::cmd("KEYS").arg(format!("{ns}:*"))).unwrap_or_default();
            let role: String =
                query(node.port(), redis::cmd("INFO").arg("replication")).unwrap_or_default();
            if role.contains("role:master") {
                left.extend(keys.into_iter().filter(|k| !k.ends_with(":fence")));
            }
        }
        left
    }

    /// Waits until the namespace holds nothing but fencing counters on any primary.
    pub fn until_clean(&self, ns: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = self.leftovers(ns);
            if left.is_empty() {
                return;
            }
            assert!(Instant::now() < deadline, "keys left behind: {left:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Waits until the node at `port` says it is a primary.
fn until_primary(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text: String = query(port, redis::cmd("CLUSTER").arg("NODES")).unwrap_or_default();
        if text
            .lines()
            .any(|l| l.contains("myself") && l.contains("master"))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never took over:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One cluster shared by every test of a binary; tests keep apart by namespace.
pub fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: std::sync::OnceLock<RedisCluster> = std::sync::OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

/// How many claims wait on `key` of `ns`: the length of its queue on the primary serving it.
pub async fn queued_on(ns: &str, key: &str) -> usize {
    let cluster = shared_cluster();
    let port = cluster.nodes[cluster.primary_for(key, 0)].port();
    let mut conn = crate::support::redis::connection(&format!("redis://127.0.0.1:{port}/")).await;
    redis::cmd("LLEN")
        .arg(format!("{ns}:{{{key}}}:q"))
        .query_async(&mut conn)
        .await
        .unwrap_or(0)
}

/// Waits until `n` claims wait on `key` of `ns` on the shared cluster.
pub async fn until_queued(ns: &str, key: &str, n: usize) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while queued_on(ns, key).await != n {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("expected {n} queued on `{key}`"));
}

/// A client of the shared cluster, through `redis+cluster://`, with a lease of 3 s.
pub async fn client(ns: &str) -> LockClient {
    client_with(ns, Duration::from_secs(3)).await
}

/// A client of the shared cluster with a lease of `ttl`.
pub async fn client_with(ns: &str, ttl: Duration) -> LockClient {
    crate::support::failover::client_for(&shared_cluster().url(), ns, ttl).await
}

/// The suite's fixture: the binary's shared cluster.
struct Cluster;

impl super::Server for Cluster {
    fn client(&self, ns: String, ttl: Option<Duration>) -> BoxFuture<'static, LockClient> {
        Box::pin(async move { client_with(&ns, ttl.unwrap_or(Duration::from_secs(3))).await })
    }

    fn until_queued(&self, ns: String, key: String, n: usize) -> BoxFuture<'static, ()> {
        Box::pin(async move { until_queued(&ns, &key, n).await })
    }

    /// Only fencing counters, on every node, within 10 s.
    fn assert_clean(&self, ns: String) -> BoxFuture<'static, ()> {
        Box::pin(async move { tokio::task::block_in_place(|| shared_cluster().until_clean(&ns)) })
    }
}

/// A test's namespace on the binary's shared cluster.
pub async fn env(ns: String) -> super::Env {
    let probe = distlock::backend::RedisBackend::connect(&shared_cluster().url())
        .await
        .unwrap();
    super::Env::new("redis_cluster", ns, super::Supports::of(&probe), Cluster)
}
