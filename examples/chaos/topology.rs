//! The replicated topologies of a process run, and their own faults: Redis Sentinel (a primary,
//! a replica, three sentinels), Redis Cluster (three primaries, three replicas), a ZooKeeper
//! ensemble of three with holders on followers, and PostgreSQL behind PgBouncer.
//!
//! Sentinel and Cluster holders reach the servers directly: the sentinels name the primary's
//! real address, and a Cluster redirects with `MOVED` to real addresses, so a per-holder proxy
//! would be bypassed. Their holder faults are the process ones (SIGSTOP, SIGKILL, two SIGKILLs);
//! connection faults (blackhole, reset) are left to the topologies with proxies.
//!
//! A failover that SIGKILLs or SIGSTOPs a Redis primary may lose the last grant's write (the
//! replication is asynchronous), and README promises no more than increasing fencing tokens
//! then: the promoted replica may grant the lock again while the first holder still believes.
//! Each such failover is recorded as a window, from the fault until the later of the promotion
//! and a lease past the fault (no holder renews against a dead or frozen primary, so none can
//! believe longer); a rejected write checked inside one is counted apart (`failover_lost`),
//! like a SIGSTOP between the check and the write. `CLUSTER FAILOVER` loses no write and gets
//! no window; nor does anything after a window, where an old primary resumed from a SIGSTOP
//! must keep nobody believing.

use std::time::{Duration, Instant};

use crate::fleet::Fleet;
use crate::servers::{commands_processed, leftovers};
use crate::support::cluster::RedisCluster;
use crate::support::ensemble::ZkEnsemble;
use crate::support::sentinel::{SentinelSetup, MASTER};
use crate::support::{self, query_port, RedisServer};
use crate::{ttl, wall_ns};

/// Members of the ZooKeeper ensemble.
const MEMBERS: usize = 3;

/// The lock's hash tag: every key of lock `chaos` lives in the slot of `chaos`.
const KEY: &str = "chaos";

/// Records a failover window that may lose the last grant: from `from` until the later of the
/// promotion (now) and a lease past `from`.
fn failover_window(fleet: &Fleet, from: u128) {
    let to = wall_ns().max(from + ttl().as_nanos());
    fleet
        .log
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .failovers
        .push((from, to));
}

fn until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// Redis Sentinel.

pub(crate) struct Sentinel {
    setup: SentinelSetup,
    /// The old primary of the last failover may not be the new primary's replica yet: the
    /// next failover waits until it is (the sentinels take 5 to 15 s), holder faults do not.
    rejoining: bool,
}

impl Sentinel {
    pub(crate) fn start() -> Self {
        Self {
            setup: SentinelSetup::start(),
            rejoining: false,
        }
    }

    pub(crate) fn url(&self) -> String {
        self.setup.url()
    }

    /// The port of the primary the sentinels name now.
    pub(crate) fn primary_port(&self) -> u16 {
        self.setup.primary.port()
    }

    /// SIGSTOPs the primary until the sentinels have promoted the replica, then resumes it: it
    /// answers as a primary until the sentinels turn it into the new primary's replica.
    pub(crate) fn pause_primary(&mut self, fleet: &Fleet) {
        self.until_rejoined();
        let from = wall_ns();
        let pid = self.setup.pause_primary();
        failover_window(fleet, from);
        RedisServer::signal(pid, "CONT");
        self.swapped();
    }

    /// SIGKILLs the primary until the sentinels have promoted the replica, then starts it
    /// again, empty: the sentinels make it the new primary's replica.
    pub(crate) fn kill_primary(&mut self, fleet: &Fleet) {
        self.until_rejoined();
        let from = wall_ns();
        self.setup.kill_primary();
        failover_window(fleet, from);
        self.setup.primary.restart_after(|| ());
        self.swapped();
    }

    /// After a failover: the promoted replica is the primary, the old primary its replica (once
    /// the sentinels have turned it into one).
    fn swapped(&mut self) {
        std::mem::swap(&mut self.setup.primary, &mut self.setup.replica);
        self.rejoining = true;
    }

    /// Waits until the replica is in sync with the primary and every sentinel sees it as a
    /// replica.
    fn until_rejoined(&mut self) {
        if !std::mem::take(&mut self.rejoining) {
            return;
        }
        let (primary, replica) = (self.setup.primary.port(), self.setup.replica.port());
        let sentinels = self.sentinel_ports();
        until(
            "the old primary did not rejoin as a replica",
            Duration::from_secs(60),
            || {
                let repl: String =
                    query_port(replica, redis::cmd("INFO").arg("replication")).unwrap_or_default();
                let synced = repl.contains("role:slave")
                    && repl.contains(&format!("master_port:{primary}"))
                    && repl.contains("master_link_status:up");
                synced
                    && sentinels.iter().all(|port| {
                        let replicas: Vec<Vec<String>> =
                            query_port(*port, redis::cmd("SENTINEL").arg("REPLICAS").arg(MASTER))
                                .unwrap_or_default();
                        replicas.iter().any(|r| {
                            let field = |name: &str| {
                                r.chunks(2)
                                    .find(|kv| kv[0] == name)
                                    .and_then(|kv| kv.get(1))
                                    .cloned()
                                    .unwrap_or_default()
                            };
                            field("port") == replica.to_string() && field("flags") == "slave"
                        })
                    })
            },
        );
    }

    fn sentinel_ports(&self) -> Vec<u16> {
        let url = self.setup.url();
        url.trim_start_matches("redis+sentinel://")
            .split('/')
            .next()
            .unwrap_or_default()
            .split(',')
            .filter_map(|h| h.rsplit(':').next()?.parse().ok())
            .collect()
    }
}

// Redis Cluster.

pub(crate) struct Cluster {
    cluster: RedisCluster,
    /// The node killed for good, once it is.
    killed: Option<usize>,
    /// `CLUSTER FAILOVER`s of the lock's shard so far: the kill for good waits for two.
    key_failovers: u32,
}

impl Cluster {
    pub(crate) fn start() -> Self {
        Self {
            cluster: RedisCluster::start(),
            killed: None,
            key_failovers: 0,
        }
    }

    pub(crate) fn url(&self) -> String {
        self.cluster.url()
    }

    /// A node that is up, to ask.
    fn live(&self) -> usize {
        (0..self.cluster.nodes.len())
            .find(|i| Some(*i) != self.killed)
            .unwrap_or_default()
    }

    /// The node serving the lock's slot.
    fn key_primary(&self) -> usize {
        self.cluster.primary_for(KEY, self.live())
    }

    /// A live replica of the primary at index `primary`, if it has one.
    fn replica_of(&self, primary: usize) -> Option<usize> {
        let view = self.cluster.view(self.live());
        let id = &view
            .iter()
            .find(|n| n.port == self.cluster.nodes[primary].port())?
            .id;
        let port = view
            .iter()
            .find(|n| n.replicates.as_deref() == Some(id.as_str()) && !n.failed)?
            .port;
        self.cluster.nodes.iter().position(|n| n.port() == port)
    }

    /// Waits until every live node sees node `primary` serve the lock's slot and says the
    /// cluster is ok.
    fn until_serving(&self, primary: usize) {
        let port = self.cluster.nodes[primary].port();
        until(
            "the cluster did not agree on the lock's new primary",
            Duration::from_secs(60),
            || {
                (0..self.cluster.nodes.len())
                    .filter(|i| Some(*i) != self.killed)
                    .all(|i| {
                        let info: String = query_port(
                            self.cluster.nodes[i].port(),
                            redis::cmd("CLUSTER").arg("INFO"),
                        )
                        .unwrap_or_default();
                        info.contains("cluster_state:ok")
                            && self.cluster.primary_for(KEY, i) == primary
                            && self
                                .cluster
                                .view(i)
                                .iter()
                                .any(|n| n.port == port && n.primary)
                    })
            },
        );
    }

    /// `CLUSTER FAILOVER` on the replica of the lock's primary (no write is lost); once the
    /// lock's primary has no replica left (it was killed for good), on another shard's.
    pub(crate) fn failover(&mut self) {
        let key = self.key_primary();
        let candidates = std::iter::once(key).chain(self.primaries());
        let Some((primary, replica)) = candidates
            .filter_map(|p| Some((p, self.replica_of(p)?)))
            .next()
        else {
            return;
        };
        let port = self.cluster.nodes[replica].port();
        let old = self.cluster.nodes[primary].port();
        // The replica must be in sync first: a manual failover waits for its offset to match.
        until(
            "the replica did not sync before CLUSTER FAILOVER",
            Duration::from_secs(60),
            || {
                let repl: String =
                    query_port(port, redis::cmd("INFO").arg("replication")).unwrap_or_default();
                repl.contains(&format!("master_port:{old}"))
                    && repl.contains("master_link_status:up")
            },
        );
        // A manual failover that does not finish (its own timeout is 5 s) is asked again.
        let mut asked = Instant::now() - Duration::from_secs(60);
        until(
            "CLUSTER FAILOVER did not finish",
            Duration::from_secs(60),
            || {
                if asked.elapsed() > Duration::from_secs(6) {
                    let _: redis::RedisResult<()> =
                        query_port(port, redis::cmd("CLUSTER").arg("FAILOVER"));
                    asked = Instant::now();
                }
                let view = self.cluster.view(replica);
                view.iter().any(|n| n.port == port && n.primary)
                    && view.iter().any(|n| n.port == old && !n.primary)
            },
        );
        if primary == key {
            self.until_serving(replica);
            self.key_failovers += 1;
        }
    }

    /// SIGKILLs the lock's primary and leaves it down; returns once its replica serves the
    /// slot. Once a run, after two `CLUSTER FAILOVER`s of the lock's shard (returns false
    /// otherwise): afterwards the failovers run on the other shards.
    pub(crate) fn kill_primary_for_good(&mut self, fleet: &Fleet) -> bool {
        if self.killed.is_some() || self.key_failovers < 2 {
            return false;
        }
        let primary = self.key_primary();
        let Some(replica) = self.replica_of(primary) else {
            return false;
        };
        let from = wall_ns();
        self.cluster.kill_primary_for_good(primary, replica);
        self.killed = Some(primary);
        self.until_serving(replica);
        failover_window(fleet, from);
        true
    }

    pub(crate) fn leftovers(&self, ns: &str) -> Vec<String> {
        self.cluster.leftovers(ns)
    }

    /// The indices of the nodes serving slots now, as a live node sees it.
    fn primaries(&self) -> Vec<usize> {
        self.cluster
            .view(self.live())
            .iter()
            .filter(|n| n.primary && !n.failed && !n.slots.is_empty())
            .filter_map(|n| self.cluster.nodes.iter().position(|s| s.port() == n.port))
            .collect()
    }

    /// Commands processed by the primaries serving now.
    pub(crate) fn commands(&self) -> Option<u64> {
        let ports: Vec<u16> = self
            .primaries()
            .into_iter()
            .map(|i| self.cluster.nodes[i].port())
            .collect();
        commands_processed("redis", &ports)
    }
}

// ZooKeeper ensemble.

pub(crate) struct Ensemble {
    ensemble: ZkEnsemble,
}

impl Ensemble {
    pub(crate) fn start() -> Self {
        // syncLimit 4 ticks (2 s): a follower cut off from the leader serves its clients that
        // long before it notices.
        Self {
            ensemble: ZkEnsemble::start(4),
        }
    }

    /// Holder `i` reaches member `i % 3` only (through its own proxy): of four holders, at
    /// least two are on followers.
    pub(crate) fn member_of(i: usize) -> usize {
        i % MEMBERS
    }

    pub(crate) fn client_port(&self, member: usize) -> u16 {
        self.ensemble.client_port(member)
    }

    fn follower(&self, pick: usize) -> usize {
        let leader = self.ensemble.leader();
        let followers: Vec<usize> = (0..MEMBERS).filter(|m| *m != leader).collect();
        followers[pick % followers.len()]
    }

    /// Blackholes every holder's connection to a follower past the session timeout: their
    /// sessions expire while the ensemble goes on.
    pub(crate) fn partition_clients(&self, fleet: &Fleet, pick: usize) {
        let follower = self.follower(pick);
        let cut: Vec<usize> = (0..fleet.proxies.len())
            .filter(|h| Self::member_of(*h) == follower)
            .collect();
        cut.iter()
            .for_each(|h| fleet.proxies[*h].iter().for_each(|p| p.blackhole()));
        std::thread::sleep(ttl() * 2 + Duration::from_millis(500));
        cut.iter()
            .for_each(|h| fleet.proxies[*h].iter().for_each(|p| p.heal()));
    }

    /// Cuts a follower off from the two other members past the session timeout while its
    /// holders stay connected to it, then heals and waits until it follows again.
    pub(crate) fn isolate_follower(&self, pick: usize) {
        let follower = self.follower(pick);
        let others: Vec<usize> = (0..MEMBERS).filter(|m| *m != follower).collect();
        others
            .iter()
            .for_each(|o| self.ensemble.partition(follower, *o));
        std::thread::sleep(ttl() * 2 + Duration::from_millis(500));
        others.iter().for_each(|o| self.ensemble.heal(follower, *o));
        until(
            "the isolated follower did not rejoin",
            Duration::from_secs(60),
            || self.ensemble.mode(follower).is_some(),
        );
    }

    /// SIGKILLs the leader, and starts it again on its data once the others have elected one.
    pub(crate) fn kill_leader(&mut self) {
        let leader = self.ensemble.leader();
        self.ensemble.kill(leader);
        until(
            "the ensemble did not elect a new leader",
            Duration::from_secs(60),
            || {
                (0..MEMBERS)
                    .filter(|m| *m != leader)
                    .any(|m| self.ensemble.mode(m).as_deref() == Some("leader"))
            },
        );
        self.ensemble.restart(leader);
    }

    pub(crate) fn leftovers(&self, ns: &str) -> Vec<String> {
        leftovers(
            "zookeeper",
            self.ensemble.client_port(self.ensemble.leader()),
            ns,
        )
    }
}

// PostgreSQL through PgBouncer.

pub(crate) struct Bouncer {
    pg: support::PgServer,
    bouncer: support::PgBouncer,
}

impl Bouncer {
    pub(crate) fn start() -> Self {
        let pg = support::PgServer::start();
        // Fewer server connections than the holders' statement connections (two each). A
        // server login that fails (PostgreSQL restarting) makes PgBouncer refuse every client
        // for `server_login_retry`, 15 s by default: longer than the run's calm, and nothing a
        // lock client can shorten. 1 s here.
        let bouncer = support::PgBouncer::start_with(&pg, 4, "server_login_retry = 1\n");
        Self { pg, bouncer }
    }

    /// The pooler (statements) and the server itself (LISTEN), in that order.
    pub(crate) fn ports(&self) -> Vec<u16> {
        vec![self.bouncer.port(), self.pg.port()]
    }

    pub(crate) fn restart_bouncer(&mut self) {
        self.bouncer
            .restart_after(|| std::thread::sleep(Duration::from_millis(100)));
    }

    pub(crate) fn restart_postgres(&mut self) {
        self.pg
            .restart_after(|| std::thread::sleep(Duration::from_millis(100)));
    }

    pub(crate) fn leftovers(&self, ns: &str) -> Vec<String> {
        leftovers("postgres", self.pg.port(), ns)
    }
}

/// Commands processed by a Sentinel run's current primary.
pub(crate) fn sentinel_commands(s: &Sentinel) -> Option<u64> {
    commands_processed("redis", &[s.primary_port()])
}
