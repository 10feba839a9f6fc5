//! A three-server ZooKeeper ensemble on loopback. Every link from one server to another goes
//! through its own proxy, so a test can cut any pair apart: a follower partitioned from the
//! leader while the other two keep a quorum.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::proxy::Proxy;
use super::{ask_all, free_port, read_log, zk_command_with, Supervised, ZK_LOGS};

const MEMBERS: usize = 3;
const READY_TIMEOUT: Duration = Duration::from_secs(60);

struct Member {
    _process: Supervised,
    client_port: u16,
    dir: tempfile::TempDir,
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
    pub fn start(sync_ticks: u32) -> Self {
        let client: Vec<u16> = (0..MEMBERS).map(|_| free_port()).collect();
        let quorum: Vec<u16> = (0..MEMBERS).map(|_| free_port()).collect();
        let election: Vec<u16> = (0..MEMBERS).map(|_| free_port()).collect();
        let mut links = HashMap::new();
        for i in 0..MEMBERS {
            for j in (0..MEMBERS).filter(|j| *j != i) {
                links.insert((i, j), (Proxy::start(quorum[j]), Proxy::start(election[j])));
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
                _process: process,
                client_port,
                dir,
            });
        }
        let ensemble = Self { members, links };
        let deadline = Instant::now() + READY_TIMEOUT;
        while !(0..MEMBERS).all(|i| ensemble.mode(i).is_some()) {
            assert!(
                Instant::now() < deadline,
                "the ZooKeeper ensemble did not form within {READY_TIMEOUT:?}; logs:\n{}",
                ensemble.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        ensemble
    }

    /// `leader` or `follower` as `srvr` reports it, or `None` while the server does not serve.
    pub fn mode(&self, i: usize) -> Option<String> {
        let reply = ask_all(self.members[i].client_port, b"srvr").ok()?;
        reply
            .lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(|m| m.trim().to_string())
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

    fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| read_log(m.dir.path(), ZK_LOGS))
            .collect()
    }
}
