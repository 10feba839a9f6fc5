//! A three-server ZooKeeper ensemble on loopback (one JVM per server, its own data directory).
//! Every link from one server to another goes through its own proxy, so a test can cut any
//! pair apart: a follower partitioned from the leader while the other two keep a quorum. A
//! member can also be killed (SIGKILL) and started again on its data.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::zookeeper::{zk_command_with, ZK_LOGS};
use crate::support::free_port;
use crate::support::process::{ask_all, read_log, Supervised};
use crate::support::proxy::Proxy;

const MEMBERS: usize = 3;
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a link between members waits for its server to listen (a new leader opens its
/// quorum port only once elected).
const LINK_PATIENCE: Duration = Duration::from_secs(2);

struct Member {
    process: Option<Supervised>,
    client_port: u16,
    dir: tempfile::TempDir,
    command: (PathBuf, Vec<String>),
}

pub struct ZkEnsemble {
    members: Vec<Member>,
    /// `(i, j)`: the proxies server `i` reaches server `j`'s quorum and election ports by.
    links: HashMap<(usize, usize), (Proxy, Proxy)>,
}

impl ZkEnsemble {
    /// Starts three servers (tickTime 500 ms, sessions of 1 to 60 s) and waits until each
    /// serves as leader or follower. `sync_ticks` is `syncLimit`: how long a follower cut off
    /// from its leader goes on serving its clients before it notices.
    ///
    /// Ports are picked free and bound by the servers a moment later; an outgoing connection
    /// can take one in between (they come from the same range), so an ensemble that cannot bind
    /// is started again on fresh ports, up to three times.
    pub fn start(sync_ticks: u32) -> Self {
        let mut last = String::new();
        for _attempt in 0..3 {
            match Self::try_start(sync_ticks) {
                Ok(ensemble) => return ensemble,
                Err(logs) => last = logs,
            }
        }
        panic!("the ZooKeeper ensemble did not form; last logs:\n{last}");
    }

    fn try_start(sync_ticks: u32) -> Result<Self, String> {
        let client: Vec<u16> = (0..MEMBERS).map(|_| free_port()).collect();
        let quorum: Vec<u16> = (0..MEMBERS).map(|_| free_port()).collect();
        let election: Vec<u16> = (0..MEMBERS).map(|_| free_port()).collect();
        let mut links = HashMap::new();
        for i in 0..MEMBERS {
            for j in (0..MEMBERS).filter(|j| *j != i) {
                links.insert(
                    (i, j),
                    (
                        Proxy::start_with_patience(quorum[j], LINK_PATIENCE),
                        Proxy::start_with_patience(election[j], LINK_PATIENCE),
                    ),
                );
            }
        }
        let mut members = Vec::new();
        for (i, &client_port) in client.iter().enumerate() {
            let dir = tempfile::tempdir().expect("tempdir");
            std::fs::create_dir_all(dir.path().join("data")).expect("data dir");
            std::fs::write(dir.path().join("data").join("myid"), format!("{}\n", i + 1))
                .expect("write myid");
            let mut extra = vec![
                ("initLimit".to_string(), "20".to_string()),
                ("syncLimit".to_string(), sync_ticks.to_string()),
            ];
            for k in 0..MEMBERS {
                let (q, e) = match links.get(&(i, k)) {
                    Some((q, e)) => (q.port(), e.port()),
                    None => (quorum[k], election[k]),
                };
                extra.push((format!("server.{}", k + 1), format!("127.0.0.1:{q}:{e}")));
            }
            let (java, args) = zk_command_with(
                client_port,
                dir.path(),
                &extra,
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            );
            let process = Supervised::spawn(&java, &args, &dir.path().join(ZK_LOGS[0]));
            members.push(Member {
                process: Some(process),
                client_port,
                dir,
                command: (java, args),
            });
        }
        let ensemble = Self { members, links };
        let deadline = Instant::now() + READY_TIMEOUT;
        while !(0..MEMBERS).all(|i| ensemble.mode(i).is_some()) {
            let logs = ensemble.logs();
            if Instant::now() >= deadline || logs.contains("BindException") {
                return Err(logs);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(ensemble)
    }

    /// Waits until every member in `which` serves as leader or follower.
    fn until_serving(&self, which: impl Iterator<Item = usize> + Clone) {
        let deadline = Instant::now() + READY_TIMEOUT;
        while !which.clone().all(|i| self.mode(i).is_some()) {
            assert!(
                Instant::now() < deadline,
                "the ZooKeeper ensemble did not form within {READY_TIMEOUT:?}; logs:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills member `i` (SIGKILL): its clients' connections drop, and if it led, the others
    /// elect a new leader.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].process.take() {
            p.stop();
        }
    }

    /// Starts member `i` again on its data directory and waits until it serves.
    pub fn restart(&mut self, i: usize) {
        let m = &mut self.members[i];
        if m.process.is_none() {
            let (java, args) = &m.command;
            m.process = Some(Supervised::spawn(
                java,
                args,
                &m.dir.path().join(ZK_LOGS[0]),
            ));
        }
        self.until_serving(std::iter::once(i));
    }

    /// Every member, as a client's connect string.
    pub fn connect_string(&self) -> String {
        (0..MEMBERS)
            .map(|i| self.member(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `leader` or `follower` as `srvr` reports it, or `None` while the server does not serve.
    pub fn mode(&self, i: usize) -> Option<String> {
        let reply = ask_all(self.members[i].client_port, b"srvr").ok()?;
        reply
            .lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(|m| m.trim().to_string())
    }

    /// How many client connections member `i` has (`srvr`: our own probe counts as one).
    pub fn connections(&self, i: usize) -> Option<u64> {
        let reply = ask_all(self.members[i].client_port, b"srvr").ok()?;
        reply
            .lines()
            .find_map(|l| l.strip_prefix("Connections: "))
            .and_then(|n| n.trim().parse().ok())
    }

    /// `mntr` `zk_packets_received`, summed over the members that serve.
    pub fn packets_received(&self) -> u64 {
        (0..MEMBERS)
            .filter_map(|i| {
                let reply = ask_all(self.members[i].client_port, b"mntr").ok()?;
                reply
                    .lines()
                    .find_map(|l| l.strip_prefix("zk_packets_received"))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            })
            .sum()
    }

    /// The member that leads now.
    pub fn leader(&self) -> usize {
        (0..MEMBERS)
            .find(|i| self.mode(*i).as_deref() == Some("leader"))
            .expect("no leader in the ensemble")
    }

    /// `host:port` of member `i` only, for a client that must stay on that server.
    pub fn member(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.members[i].client_port)
    }

    /// Member `i`'s client port.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// Cuts every link between members `a` and `b`, both ways: bytes vanish, connections look
    /// alive.
    pub fn partition(&self, a: usize, b: usize) {
        for pair in [(a, b), (b, a)] {
            let (q, e) = &self.links[&pair];
            q.blackhole();
            e.blackhole();
        }
    }

    /// Ends a partition between `a` and `b`.
    pub fn heal(&self, a: usize, b: usize) {
        for pair in [(a, b), (b, a)] {
            let (q, e) = &self.links[&pair];
            q.heal();
            e.heal();
        }
    }

    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| read_log(m.dir.path(), ZK_LOGS))
            .collect()
    }
}

/// One ensemble for every test in a binary that only reads it (no kills, no partitions);
/// tests keep apart by namespace.
pub fn shared_ensemble() -> &'static ZkEnsemble {
    static ENSEMBLE: OnceLock<ZkEnsemble> = OnceLock::new();
    ENSEMBLE.get_or_init(|| ZkEnsemble::start(4))
}

/// A test's namespace on the binary's shared ensemble, its clients spread over the members.
#[cfg(feature = "zookeeper")]
pub async fn env(ns: String) -> super::Env {
    super::zookeeper::env_on(
        "zookeeper_ensemble",
        || shared_ensemble().connect_string(),
        ns,
    )
    .await
}
