//! A `redis-server` on a free loopback port (plain or also serving TLS), one shared by every
//! test of a binary, and the behaviour suite's fixture on it.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use crate::support::process::{ask, launch_env, read_log, respawn_env, Supervised};
use crate::support::{free_port, require_binary, tls};

/// A `redis-server` on a free loopback port.
pub struct RedisServer {
    process: Supervised,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    /// Extra environment variables the server runs with (and runs with again on a restart).
    env: Vec<(String, String)>,
}

fn redis_args(port: u16, dir: &Path, extra: &[String]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "--port".into(),
        port.to_string(),
        "--bind".into(),
        "127.0.0.1".into(),
        "--save".into(),
        String::new(),
        "--appendonly".into(),
        "no".into(),
        "--daemonize".into(),
        "no".into(),
        "--dir".into(),
        dir.display().to_string(),
        "--logfile".into(),
        dir.join("redis.log").display().to_string(),
    ];
    args.extend(extra.iter().cloned());
    args
}

fn redis_ready(port: u16) -> bool {
    ask(port, b"PING\r\n").is_ok_and(|reply| reply.starts_with("+PONG"))
}

impl RedisServer {
    /// Starts a server and waits until it answers PING. Panics with the server's log if it does
    /// not, and with the install hint if `redis-server` is missing.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_with_env(extra, &[])
    }

    /// Like [`start_with`](Self::start_with), with extra environment variables for the server
    /// (an `LD_PRELOAD`, say: see [`clock::ClockShim`]).
    pub fn start_with_env(extra: &[&str], env: &[(String, String)]) -> Self {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        Self::launch(|_| extra.clone(), env).0
    }

    /// Starts a server that also listens on a second port (a TLS port, a cluster bus):
    /// `extra` gives the arguments for that port, which is drawn afresh with each start
    /// attempt, as the first is. Returns the server and its second port.
    pub fn start_with_second_port(extra: impl Fn(u16) -> Vec<String>) -> (Self, u16) {
        Self::launch(extra, &[])
    }

    /// Starts a Redis Cluster node (not yet joined) with `extra` arguments; its bus port, a
    /// free one rather than the data port + 10000, is returned beside it.
    pub fn start_cluster_node(extra: &[&str]) -> (Self, u16) {
        Self::start_with_second_port(|bus| {
            let mut args: Vec<String> = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-port",
                &bus.to_string(),
            ]
            .map(String::from)
            .to_vec();
            args.extend(extra.iter().map(|s| s.to_string()));
            args
        })
    }

    fn launch(extra: impl Fn(u16) -> Vec<String>, env: &[(String, String)]) -> (Self, u16) {
        let bin = require_binary("redis-server");
        let mut used = (Vec::new(), 0);
        let (process, port, dir) = launch_env(
            "redis-server",
            &["redis.log", "stdout.log", "stdout.err"],
            env,
            |port, dir| {
                let second = free_port();
                used = (extra(second), second);
                (bin.clone(), redis_args(port, dir, &used.0))
            },
            redis_ready,
        );
        let (extra, second) = used;
        let server = Self {
            process,
            port,
            dir,
            extra,
            env: env.to_vec(),
        };
        (server, second)
    }

    /// Kills the server (SIGKILL: no persistence, every key is gone) and starts a new one on
    /// the same port once `down` has run.
    pub fn restart_after(&mut self, down: impl FnOnce()) {
        self.process.stop();
        down();
        let bin = require_binary("redis-server");
        let args = redis_args(self.port, self.dir.path(), &self.extra);
        self.process = respawn_env(
            "redis-server",
            &bin,
            &args,
            &self.env,
            self.port,
            self.dir.path(),
            &["redis.log", "stdout.log", "stdout.err"],
            redis_ready,
        );
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id, from `INFO server`.
    #[cfg(feature = "redis")]
    pub fn pid(&self) -> u32 {
        let info: String =
            crate::support::query_port(self.port, ::redis::cmd("INFO").arg("server"))
                .expect("INFO server");
        info.lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|p| p.trim().parse().ok())
            .expect("a process_id in INFO server")
    }

    /// Sends `signal` (`STOP`, `CONT`) to the server process `pid`.
    pub fn signal(pid: u32, signal: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} {pid} failed");
    }

    /// Writes a snapshot (`SAVE`): a restart from now on comes back with the data of this
    /// moment, older than what was written since (see [`forget_snapshot`](Self::forget_snapshot)).
    #[cfg(feature = "redis")]
    pub fn snapshot(&self) {
        let _: () = crate::support::query_port(self.port, &mut ::redis::cmd("SAVE")).expect("SAVE");
    }

    /// Deletes the snapshot, if any: the next restart comes back without data.
    pub fn forget_snapshot(&self) {
        match std::fs::remove_file(self.dir.path().join("dump.rdb")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => panic!("dump.rdb: {e}"),
            _ => {}
        }
    }

    /// SIGKILLs the server (every key it held is gone with it); it stays down.
    pub fn kill(&mut self) {
        self.process.stop();
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's log, for failure messages.
    pub fn log(&self) -> String {
        read_log(self.dir.path(), &["redis.log", "stdout.log", "stdout.err"])
    }
}

/// A `redis-server` that also serves TLS, with certificates from a throwaway CA.
pub struct TlsRedis {
    pub server: RedisServer,
    pub tls_port: u16,
    /// The CA certificate (PEM) that signed the server's certificate for 127.0.0.1.
    pub ca: Vec<u8>,
    _certs: tls::TestCa,
}

impl TlsRedis {
    pub fn start() -> Self {
        let ca = tls::TestCa::new();
        let (cert, key) = ca.issue("server", "IP:127.0.0.1");
        let path = |p: &Path| p.display().to_string();
        let (server, tls_port) = RedisServer::start_with_second_port(|tls_port| {
            [
                "--tls-port",
                &tls_port.to_string(),
                "--tls-cert-file",
                &path(&cert),
                "--tls-key-file",
                &path(&key),
                "--tls-ca-cert-file",
                &path(&ca.pem_path()),
                "--tls-auth-clients",
                "no",
            ]
            .map(String::from)
            .to_vec()
        });
        Self {
            server,
            tls_port,
            ca: ca.pem(),
            _certs: ca,
        }
    }

    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.tls_port)
    }
}

/// One `redis-server` for every test in this binary; tests keep apart by namespace.
pub fn shared_redis() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

/// The suite's fixture: the binary's shared server.
#[cfg(feature = "redis")]
mod fixture {
    use std::time::Duration;

    use distlock::backend::RedisBackend;
    use distlock::LockClient;
    use futures::future::BoxFuture;

    use super::shared_redis;
    use crate::support::redis::{assert_only_expiring_fences, until_queued};
    use crate::support::server::{Env, Server, Supports};

    struct Redis;

    impl Server for Redis {
        fn client(&self, ns: String, ttl: Option<Duration>) -> BoxFuture<'static, LockClient> {
            Box::pin(async move {
                let backend = RedisBackend::connect(&shared_redis().url()).await.unwrap();
                let builder = LockClient::builder(backend).namespace(ns);
                match ttl {
                    Some(ttl) => builder.ttl(ttl),
                    None => builder,
                }
                .build()
                .unwrap()
            })
        }

        fn until_queued(&self, ns: String, key: String, n: usize) -> BoxFuture<'static, ()> {
            Box::pin(async move { until_queued(&shared_redis().url(), &ns, &key, n).await })
        }

        /// Only fencing counters, each with a TTL.
        fn assert_clean(&self, ns: String) -> BoxFuture<'static, ()> {
            Box::pin(async move {
                assert_only_expiring_fences(&shared_redis().url(), &ns).await;
            })
        }
    }

    /// A test's namespace on the binary's shared `redis-server`.
    pub async fn env(ns: String) -> Env {
        let backend = RedisBackend::connect(&shared_redis().url()).await.unwrap();
        Env::new("redis", ns, Supports::of(&backend), Redis)
    }
}

#[cfg(feature = "redis")]
#[allow(unused_imports)] // each test binary uses what it needs
pub use fixture::env;
