//! The lock servers a process run starts, restarts and inspects afterwards (what was left
//! behind, how many commands they served).

use std::time::Duration;

use crate::support;
use crate::topology::{sentinel_commands, Bouncer, Cluster, Ensemble, Sentinel};
use crate::ttl;

/// The lock server a run uses.
pub(crate) enum Server {
    Redis(support::RedisServer),
    Zk(support::ZkServer),
    Pg(support::PgServer),
    /// Independent nodes, and the one restarted next.
    Redlock(Vec<support::RedisServer>, usize),
    Sentinel(Sentinel),
    Cluster(Cluster),
    Ensemble(Ensemble),
    Bouncer(Bouncer),
}

/// Nodes of a Redlock run.
pub(crate) const REDLOCK_NODES: usize = 5;

impl Server {
    pub(crate) fn start(backend: &str) -> Self {
        match backend {
            "redis" => Server::Redis(support::RedisServer::start()),
            "postgres" => Server::Pg(support::PgServer::start()),
            "redlock" => Server::Redlock(
                (0..REDLOCK_NODES)
                    .map(|_| support::RedisServer::start())
                    .collect(),
                0,
            ),
            "redis-sentinel" => Server::Sentinel(Sentinel::start()),
            "redis-cluster" => Server::Cluster(Cluster::start()),
            "zookeeper-ensemble" => Server::Ensemble(Ensemble::start()),
            "postgres-pgbouncer" => Server::Bouncer(Bouncer::start()),
            _ => Server::Zk(support::ZkServer::start()),
        }
    }

    /// The ports holder `i` reaches through its own proxies, one proxy each (none where the
    /// holders reach the servers directly: Sentinel and Cluster).
    pub(crate) fn holder_ports(&self, i: usize) -> Vec<u16> {
        match self {
            Server::Redis(s) => vec![s.port()],
            Server::Zk(s) => vec![s.port()],
            Server::Pg(s) => vec![s.port()],
            Server::Redlock(nodes, _) => nodes.iter().map(support::RedisServer::port).collect(),
            Server::Sentinel(_) | Server::Cluster(_) => Vec::new(),
            Server::Ensemble(e) => vec![e.client_port(Ensemble::member_of(i))],
            Server::Bouncer(b) => b.ports(),
        }
    }

    /// The URL holders use as it is, where they reach the servers directly (one Redis server
    /// only if `direct`).
    pub(crate) fn direct_url(&self, direct: bool) -> Option<String> {
        match self {
            Server::Redis(s) if direct => Some(s.url()),
            Server::Sentinel(s) => Some(s.url()),
            Server::Cluster(c) => Some(c.url()),
            _ => None,
        }
    }

    /// Restarts the server (a Redlock run: the next node) after `outage`.
    pub(crate) fn restart(&mut self, outage: Duration) {
        self.restart_with(|| std::thread::sleep(outage));
    }

    /// [`Server::restart`], with `pause` run while it is down.
    pub(crate) fn restart_with(&mut self, pause: impl FnOnce()) {
        match self {
            Server::Redis(s) => s.restart_after(pause),
            Server::Zk(s) => s.restart_after(pause),
            Server::Pg(s) => s.restart_after(pause),
            Server::Redlock(nodes, next) => {
                let n = nodes.len();
                if let Some(node) = nodes.get_mut(*next % n) {
                    node.restart_after(pause);
                }
                *next += 1;
            }
            Server::Bouncer(b) => b.restart_postgres(),
            // The topologies restart their own members in their own faults.
            Server::Sentinel(_) | Server::Cluster(_) | Server::Ensemble(_) => {}
        }
    }

    /// A single Redis server's next restart: from a snapshot taken now (`stale`: it comes back
    /// with older data than it had, its fencing counter behind the tokens handed out since), or
    /// without data.
    pub(crate) fn snapshot_before_restart(&self, stale: bool) {
        if let Server::Redis(s) = self {
            if stale {
                s.snapshot();
            } else {
                s.forget_snapshot();
            }
        }
    }

    /// Redlock: two nodes of five (a minority) down past the lease, then back, by turns
    /// SIGKILLed (they come back without their data) and SIGSTOPped (they come back with it,
    /// every lease in it run out).
    pub(crate) fn minority_down(&mut self, first: usize, killed: bool) {
        let Server::Redlock(nodes, _) = self else {
            return;
        };
        let n = nodes.len();
        let pair = [first % n, (first + 1) % n];
        let down = ttl() + Duration::from_millis(500);
        if killed {
            let [a, b] = pair;
            nodes[a].kill();
            nodes[b].restart_after(|| std::thread::sleep(down));
            nodes[a].restart_after(|| ());
        } else {
            let pids: Vec<u32> = pair.iter().map(|i| nodes[*i].pid()).collect();
            pids.iter()
                .for_each(|p| support::RedisServer::signal(*p, "STOP"));
            std::thread::sleep(down);
            pids.iter()
                .for_each(|p| support::RedisServer::signal(*p, "CONT"));
        }
    }

    /// Keys (beyond fence counters), znodes or live claim rows left in namespace `ns`.
    pub(crate) fn leftovers(&self, backend: &str, ns: &str) -> Vec<String> {
        match self {
            Server::Sentinel(s) => leftovers("redis", s.primary_port(), ns),
            Server::Cluster(c) => c.leftovers(ns),
            Server::Ensemble(e) => e.leftovers(ns),
            Server::Bouncer(b) => b.leftovers(ns),
            _ => self
                .holder_ports(0)
                .into_iter()
                .flat_map(|port| leftovers(backend, port, ns))
                .collect(),
        }
    }

    /// The commands the Redis servers serving the lock have processed (Redis, Redlock,
    /// Sentinel's current primary, Cluster's current primaries).
    pub(crate) fn commands(&self, backend: &str) -> Option<u64> {
        match self {
            Server::Sentinel(s) => sentinel_commands(s),
            Server::Cluster(c) => c.commands(),
            _ => commands_processed(backend, &self.holder_ports(0)),
        }
    }
}

/// Keys (other than fence counters), znodes or live claim rows left in the namespace.
pub(crate) fn leftovers(backend: &str, port: u16, ns: &str) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        if backend == "redis" || backend == "redlock" {
            let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                .expect("url")
                .get_multiplexed_async_connection()
                .await
                .expect("connection");
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{ns}:*"))
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            // Fencing counters carry a TTL; a Redlock node's `born` mark stays with its data.
            keys.into_iter()
                .filter(|k| !k.ends_with(":fence") && *k != format!("{ns}:born"))
                .collect()
        } else if backend == "postgres" {
            // Rows whose lease or liveness ran out are dead; they go when the key is next used
            // or collected.
            let client = support::pg::connection(&format!(
                "postgres://postgres@127.0.0.1:{port}/postgres"
            ))
            .await;
            client
                .query(
                    "SELECT owner FROM distlock.claims WHERE ns = $1 AND deadline > clock_timestamp()",
                    &[&ns],
                )
                .await
                .expect("claims")
                .iter()
                .map(|r| format!("claim {}", r.get::<_, String>(0)))
                .collect()
        } else {
            let zk = zookeeper_client::Client::connector()
                .with_session_timeout(Duration::from_secs(5))
                .connect(&format!("127.0.0.1:{port}"))
                .await
                .expect("zookeeper");
            let mut out = Vec::new();
            let mut todo = vec![format!("/{ns}")];
            while let Some(p) = todo.pop() {
                for k in zk.list_children(&p).await.unwrap_or_default() {
                    let child = format!("{p}/{k}");
                    out.push(child.clone());
                    todo.push(child);
                }
            }
            out
        }
    })
}

/// The commands the Redis servers at `ports` have processed (PostgreSQL: transactions,
/// ZooKeeper: packets received; see `rate.rs`).
pub(crate) fn commands_processed(backend: &str, ports: &[u16]) -> Option<u64> {
    if !matches!(backend, "redis" | "redlock") {
        return ports.iter().map(|p| crate::rate::served(backend, *p)).sum();
    }
    let mut total = 0;
    for port in ports {
        let url = format!("redis://127.0.0.1:{port}/");
        let info: String = redis::Client::open(url)
            .and_then(|c| c.get_connection())
            .and_then(|mut c| redis::cmd("INFO").arg("stats").query(&mut c))
            .ok()?;
        total += info
            .lines()
            .find_map(|l| l.strip_prefix("total_commands_processed:"))
            .and_then(|n| n.trim().parse::<u64>().ok())?;
    }
    Some(total)
}
