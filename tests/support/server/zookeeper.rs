//! A standalone ZooKeeper on a free loopback port, one shared by every test of a binary, and
//! the behaviour suite's fixture on it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::support::process::{ask_all, launch, read_log, respawn, Supervised};
use crate::support::{require_binary, require_file};

/// Where Debian's `zookeeper` package puts the server jar (its manifest lists the rest).
const ZK_JAR: &str = "/usr/share/java/zookeeper.jar";
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";

pub const ZK_LOGS: &[&str] = &["zookeeper.log", "zookeeper.err"];

/// `java ... ZooKeeperServerMain zoo.cfg` for a port and directory (writes the config, with
/// `extra` settings appended: later lines win).
fn zk_command(port: u16, dir: &Path, extra: &[(String, String)]) -> (PathBuf, Vec<String>) {
    zk_command_with(
        port,
        dir,
        extra,
        "org.apache.zookeeper.server.ZooKeeperServerMain",
    )
}

/// Like [`zk_command`], running `main` (`QuorumPeerMain` for an ensemble member).
pub fn zk_command_with(
    port: u16,
    dir: &Path,
    extra: &[(String, String)],
    main: &str,
) -> (PathBuf, Vec<String>) {
    let java = require_binary("java");
    let jar = require_file(ZK_JAR);
    let mut classpath = jar.display().to_string();
    if Path::new(SLF4J_SIMPLE_JAR).is_file() {
        classpath.push(':');
        classpath.push_str(SLF4J_SIMPLE_JAR);
    }
    let cfg = dir.join("zoo.cfg");
    std::fs::write(
        &cfg,
        format!(
            "tickTime=500\n\
             dataDir={data}\n\
             clientPort={port}\n\
             clientPortAddress=127.0.0.1\n\
             minSessionTimeout=1000\n\
             maxSessionTimeout=60000\n\
             maxClientCnxns=0\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=*\n\
             {extra}",
            data = dir.join("data").display(),
            extra = extra
                .iter()
                .map(|(k, v)| format!("{k}={v}\n"))
                .collect::<String>(),
        ),
    )
    .expect("write zoo.cfg");
    let args = vec![
        "-Xms64m".into(),
        "-Xmx256m".into(),
        "-XX:+UseSerialGC".into(),
        "-XX:TieredStopAtLevel=1".into(),
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn".into(),
        "-Dzookeeper.4lw.commands.whitelist=*".into(),
        "-Dzookeeper.admin.enableServer=false".into(),
        "-cp".into(),
        classpath,
        main.into(),
        cfg.display().to_string(),
    ];
    (java, args)
}

/// `ruok` answers while the server is still starting; `srvr` names the mode only once it
/// serves requests.
fn zk_ready(port: u16) -> bool {
    ask_all(port, b"srvr").is_ok_and(|reply| reply.contains("Mode: "))
}

/// A standalone ZooKeeper server on a free loopback port.
pub struct ZkServer {
    process: Supervised,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<(String, String)>,
}

impl ZkServer {
    /// Starts a server and waits until `srvr` says it serves requests. Panics with its log if it
    /// does not, and with the install hint if Java or the ZooKeeper jars are missing.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Like [`start`](Self::start), with extra `zoo.cfg` settings (e.g. `maxSessionTimeout`).
    pub fn start_with(extra: &[(&str, &str)]) -> Self {
        let extra: Vec<(String, String)> = extra
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (process, port, dir) = launch(
            "ZooKeeper",
            ZK_LOGS,
            |port, dir| zk_command(port, dir, &extra),
            zk_ready,
        );
        Self {
            process,
            port,
            dir,
            extra,
        }
    }

    /// Stops the server (SIGKILL), runs `down`, and starts it again on the same port and data
    /// directory: sessions and znodes survive, as after a real restart.
    pub fn restart_after(&mut self, down: impl FnOnce()) {
        self.process.stop();
        down();
        let (java, args) = zk_command(self.port, self.dir.path(), &self.extra);
        self.process = respawn(
            "ZooKeeper",
            &java,
            &args,
            self.port,
            self.dir.path(),
            ZK_LOGS,
            zk_ready,
        );
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `host:port` for a ZooKeeper connect string.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Sends a four-letter command (`srvr`, `mntr`, ...) and returns the whole reply.
    pub fn four_letter(&self, cmd: &str) -> String {
        ask_all(self.port, cmd.as_bytes()).expect("four-letter word round trip")
    }

    /// `mntr` `zk_packets_received`: every request the server got, pings included.
    pub fn packets_received(&self) -> u64 {
        self.four_letter("mntr")
            .lines()
            .find_map(|l| l.strip_prefix("zk_packets_received"))
            .and_then(|v| v.trim().parse().ok())
            .expect("mntr reports zk_packets_received")
    }

    /// The server's log, for failure messages.
    pub fn log(&self) -> String {
        read_log(self.dir.path(), ZK_LOGS)
    }
}

/// One ZooKeeper for every test in this binary; tests keep apart by namespace.
pub fn shared_zookeeper() -> &'static ZkServer {
    static SERVER: OnceLock<ZkServer> = OnceLock::new();
    SERVER.get_or_init(ZkServer::start)
}

/// The suite's fixture: clients with their own sessions on a connect string (the binary's
/// shared server, or the shared ensemble's members).
#[cfg(feature = "zookeeper")]
mod fixture {
    use std::sync::Arc;
    use std::time::Duration;

    use distlock::LockClient;
    use futures::future::BoxFuture;

    use super::shared_zookeeper;
    use crate::support::proxy::Proxy;
    use crate::support::server::{Env, Hang, Server, Supports};
    use crate::support::zk::{assert_no_znodes, backend, client_at, queued, raw};

    /// The session a client asks for unless a test says otherwise.
    pub const SESSION: Duration = Duration::from_secs(4);

    /// The connect string of a shared server or ensemble (started on first use).
    pub struct ZooKeeper(pub fn() -> String);

    impl Server for ZooKeeper {
        /// Its TTL is the session the server granted.
        fn client(&self, ns: String, ttl: Option<Duration>) -> BoxFuture<'static, LockClient> {
            let connect = (self.0)();
            Box::pin(async move { client_at(&connect, &ns, ttl.unwrap_or(SESSION)).await })
        }

        /// Through a proxy to the first server: the switch makes the proxy swallow every
        /// byte, so the server hears nothing more and expires the session.
        fn client_to_hang(
            &self,
            ns: String,
            ttl: Option<Duration>,
        ) -> BoxFuture<'static, (LockClient, Hang)> {
            let connect = (self.0)();
            Box::pin(async move {
                let first = connect.split(',').next().unwrap_or_default();
                let port = first
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .expect("a host:port connect string");
                let proxy = Arc::new(Proxy::start(port));
                let via = format!("127.0.0.1:{}", proxy.port());
                let client = client_at(&via, &ns, ttl.unwrap_or(SESSION)).await;
                (client, Hang::new(move || proxy.blackhole()))
            })
        }

        fn until_queued(&self, ns: String, key: String, n: usize) -> BoxFuture<'static, ()> {
            queued(&(self.0)(), &ns, &key)(n)
        }

        /// No znode under the namespace, once idle lock nodes' lingering deletes are done.
        fn assert_clean(&self, ns: String) -> BoxFuture<'static, ()> {
            let connect = (self.0)();
            Box::pin(async move { assert_no_znodes(&raw(&connect).await, &ns).await })
        }
    }

    /// An `Env` on the server or ensemble `connect` names.
    pub async fn env_on(name: &'static str, connect: fn() -> String, ns: String) -> Env {
        let probe = backend(&connect(), SESSION).await;
        let supports = Supports::of(&probe);
        // Its session closes with the client.
        LockClient::builder(probe).build().unwrap().shutdown().await;
        Env::new(name, ns, supports, ZooKeeper(connect)).without_recorded_max()
    }

    /// A test's namespace on the binary's shared ZooKeeper.
    pub async fn env(ns: String) -> Env {
        env_on("zookeeper", || shared_zookeeper().connect_string(), ns).await
    }
}

#[cfg(feature = "zookeeper")]
#[allow(unused_imports)] // each test binary uses what it needs
pub use fixture::{env, env_on, SESSION};
