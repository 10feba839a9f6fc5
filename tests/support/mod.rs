//! Real test servers: `redis-server` and a standalone ZooKeeper on free loopback ports, in
//! temporary directories, stopped when dropped or when the test process exits.
//!
//! Each server runs under a small `sh` wrapper that holds a pipe from this process: when the
//! pipe closes (drop, panic, or the test binary exiting or being killed), the wrapper kills the
//! server. So a server shared by every test of a binary (`shared_redis()`) never outlives it.
#![allow(dead_code)]

#[cfg(feature = "redis")]
pub mod clock;
#[cfg(feature = "redis-cluster")]
pub mod cluster;
pub mod contract;
pub mod counting;
pub mod curator;
pub mod ensemble;
#[cfg(any(feature = "redis-cluster", feature = "redis-sentinel"))]
pub mod failover;
pub mod family;
pub mod faults;
pub mod holder;
#[cfg(feature = "postgres")]
pub mod pg;
pub mod proxy;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redlock")]
pub mod redlock;
#[cfg(feature = "redis-sentinel")]
pub mod sentinel;
pub mod tls;
#[cfg(feature = "zookeeper")]
pub mod zk;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const INSTALL_HINT: &str = "run `sudo scripts/install-test-deps.sh` (installs redis-server, zookeeper, curator, a JDK, postgresql and pgbouncer from Debian's packages)";

/// How long a server may take to answer after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A free TCP port on 127.0.0.1. There is a window between this and the server binding it;
/// `start` retries on another port if the server fails to come up.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port on loopback");
    listener.local_addr().expect("local addr").port()
}

/// Runs one command on the Redis server (or sentinel) at `port`, with a short timeout.
#[cfg(feature = "redis")]
pub fn query_port<T: ::redis::FromRedisValue>(
    port: u16,
    cmd: &mut ::redis::Cmd,
) -> ::redis::RedisResult<T> {
    let client = ::redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
    cmd.query(&mut conn)
}

/// Finds an executable on PATH, or fails the test naming the install script.
pub fn require_binary(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("`{name}` was not found on PATH: {INSTALL_HINT}"))
}

pub fn require_file(path: &str) -> PathBuf {
    let p = PathBuf::from(path);
    assert!(p.is_file(), "`{path}` is missing: {INSTALL_HINT}");
    p
}

/// A child process that dies with its wrapper's stdin.
struct Supervised {
    wrapper: Child,
    lifeline: Option<ChildStdin>,
}

impl Supervised {
    /// Runs `program args...` under `sh`, killing it when our end of the pipe closes.
    fn spawn(program: &Path, args: &[String], log: &Path) -> Self {
        Self::spawn_env(program, args, log, &[])
    }

    /// Like [`spawn`](Self::spawn), with extra environment variables (for the wrapper and the
    /// program alike).
    fn spawn_env(program: &Path, args: &[String], log: &Path, env: &[(String, String)]) -> Self {
        let mut cmd = Command::new("sh");
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        cmd.arg("-c")
            .arg(r#""$@" & pid=$!; cat >/dev/null; kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null"#)
            .arg("supervised")
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(std::fs::File::create(log).expect("create server log"))
            .stderr(std::fs::File::create(log.with_extension("err")).expect("create stderr log"));
        let mut wrapper = cmd.spawn().expect("spawn sh");
        let lifeline = wrapper.stdin.take();
        Self { wrapper, lifeline }
    }

    fn stop(&mut self) {
        // Closing the pipe makes the wrapper kill the server and exit.
        self.lifeline.take();
        let _ = self.wrapper.wait();
    }

    fn exited(&mut self) -> bool {
        matches!(self.wrapper.try_wait(), Ok(Some(_)))
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop();
    }
}

fn read_log(dir: &Path, names: &[&str]) -> String {
    let mut out = String::new();
    for name in names {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(dir.join(name)) {
            let _ = f.read_to_string(&mut text);
        }
        out.push_str(&format!("--- {name} ---\n{text}\n"));
    }
    out
}

/// Connects to 127.0.0.1:`port` and sends `request`.
fn send(port: u16, request: &[u8]) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect_timeout(
        &format!("127.0.0.1:{port}").parse().expect("loopback addr"),
        Duration::from_millis(500),
    )?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(request)?;
    Ok(stream)
}

/// Sends `request` and returns the first line of the reply.
fn ask(port: u16, request: &[u8]) -> std::io::Result<String> {
    let mut reply = String::new();
    BufReader::new(send(port, request)?).read_line(&mut reply)?;
    Ok(reply)
}

/// Sends `request` and reads until the server closes the connection.
fn ask_all(port: u16, request: &[u8]) -> std::io::Result<String> {
    let mut reply = String::new();
    send(port, request)?.read_to_string(&mut reply)?;
    Ok(reply)
}

/// Starts a server (up to three times, each on a fresh port and directory) until `ready`
/// accepts it. `command` gives the program and arguments for a port and directory.
fn launch(
    what: &str,
    log_files: &[&str],
    command: impl FnMut(u16, &Path) -> (PathBuf, Vec<String>),
    ready: impl Fn(u16) -> bool,
) -> (Supervised, u16, tempfile::TempDir) {
    launch_env(what, log_files, &[], command, ready)
}

/// Like [`launch`], with extra environment variables for the server.
fn launch_env(
    what: &str,
    log_files: &[&str],
    env: &[(String, String)],
    mut command: impl FnMut(u16, &Path) -> (PathBuf, Vec<String>),
    ready: impl Fn(u16) -> bool,
) -> (Supervised, u16, tempfile::TempDir) {
    let mut last_log = String::new();
    for _attempt in 0..3 {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let (program, args) = command(port, dir.path());
        let mut process =
            Supervised::spawn_env(&program, &args, &dir.path().join(log_files[0]), env);
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline && !process.exited() {
            if ready(port) {
                return (process, port, dir);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        last_log = read_log(dir.path(), log_files);
    }
    panic!("{what} did not start serving within {READY_TIMEOUT:?}; its log:\n{last_log}");
}

/// Starts `program` again on the same `port` and directory, retrying while the port is still
/// in TIME_WAIT, until `ready`.
fn respawn(
    what: &str,
    program: &Path,
    args: &[String],
    port: u16,
    dir: &Path,
    log_files: &[&str],
    ready: fn(u16) -> bool,
) -> Supervised {
    respawn_env(what, program, args, &[], port, dir, log_files, ready)
}

/// Like [`respawn`], with extra environment variables for the server.
#[allow(clippy::too_many_arguments)]
fn respawn_env(
    what: &str,
    program: &Path,
    args: &[String],
    env: &[(String, String)],
    port: u16,
    dir: &Path,
    log_files: &[&str],
    ready: fn(u16) -> bool,
) -> Supervised {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let mut process = Supervised::spawn_env(program, args, &dir.join(log_files[0]), env);
        let started = Instant::now();
        while !process.exited() && started.elapsed() < Duration::from_secs(20) {
            if ready(port) {
                return process;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not restart on port {port}; its log:\n{}",
            read_log(dir, log_files)
        );
        process.stop();
    }
}

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
        let bin = require_binary("redis-server");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let (process, port, dir) = launch_env(
            "redis-server",
            &["redis.log", "stdout.log", "stdout.err"],
            env,
            |port, dir| (bin.clone(), redis_args(port, dir, &extra)),
            redis_ready,
        );
        Self {
            process,
            port,
            dir,
            extra,
            env: env.to_vec(),
        }
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
            query_port(self.port, ::redis::cmd("INFO").arg("server")).expect("INFO server");
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
        let tls_port = free_port();
        let path = |p: &Path| p.display().to_string();
        let server = RedisServer::start_with(&[
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
        ]);
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

/// Where Debian's `zookeeper` package puts the server jar (its manifest lists the rest).
const ZK_JAR: &str = "/usr/share/java/zookeeper.jar";
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";

const ZK_LOGS: &[&str] = &["zookeeper.log", "zookeeper.err"];

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
fn zk_command_with(
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

/// Finds a PostgreSQL server program: on PATH, or in Debian's versioned directory
/// (`/usr/lib/postgresql/<version>/bin`, newest first), or fails the test naming the install
/// script.
pub fn require_pg_binary(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if let Some(found) = std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
    {
        return found;
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin").join(name)))
        })
        .filter(|(_, p)| p.is_file())
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("`{name}` (PostgreSQL) was not found: {INSTALL_HINT}"))
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// PostgreSQL refuses to run as root: as root, the server programs run as the `postgres`
/// system user (created by Debian's package), in directories it owns.
fn as_server_user(program: &Path, args: Vec<String>, dir: &Path) -> (PathBuf, Vec<String>) {
    if !running_as_root() {
        return (program.to_path_buf(), args);
    }
    let status = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(dir)
        .status()
        .expect("run chown");
    assert!(
        status.success(),
        "cannot give {} to the `postgres` user: {INSTALL_HINT}",
        dir.display()
    );
    let mut wrapped = vec![
        "--reuid=postgres".into(),
        "--regid=postgres".into(),
        "--init-groups".into(),
        "--reset-env".into(),
        program.display().to_string(),
    ];
    wrapped.extend(args);
    (require_binary("setpriv"), wrapped)
}

fn pg_args(port: u16, dir: &Path) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "-D".into(),
        dir.join("data").display().to_string(),
        "-p".into(),
        port.to_string(),
        "-k".into(),
        dir.display().to_string(),
    ];
    for setting in [
        "listen_addresses=127.0.0.1",
        // Test data: no fsync (commits still wait for their WAL write, so a killed server keeps
        // what it acknowledged; only an OS crash would lose it).
        "fsync=off",
        "full_page_writes=off",
        "max_connections=1000",
        "shared_buffers=64MB",
        "log_min_messages=warning",
    ] {
        args.push("-c".into());
        args.push(setting.into());
    }
    args
}

/// A PostgreSQL startup message for user and database `postgres`: a server that serves
/// answers with `R` (authentication), one still starting or stopping with `E`.
fn pg_ready(port: u16) -> bool {
    let mut body = Vec::new();
    body.extend_from_slice(&196_608u32.to_be_bytes());
    body.extend_from_slice(b"user\0postgres\0database\0postgres\0\0");
    let mut msg = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    msg.extend_from_slice(&body);
    let Ok(mut stream) = send(port, &msg) else {
        return false;
    };
    let mut first = [0u8; 1];
    stream.read_exact(&mut first).is_ok() && first[0] == b'R'
}

const PG_LOGS: &[&str] = &["postgres.log", "postgres.err"];

/// A PostgreSQL server on a free loopback port, in a fresh cluster (trust authentication,
/// user `postgres`).
pub struct PgServer {
    process: Supervised,
    port: u16,
    dir: tempfile::TempDir,
}

impl PgServer {
    /// Creates a cluster (`initdb`) and starts the server, waiting until it serves. Panics with
    /// its log if it does not, and with the install hint if PostgreSQL is missing.
    pub fn start() -> Self {
        Self::start_configured(|_| Vec::new())
    }

    /// A server with `ssl=on` and the certificate `cert`/`key`: a plain connection reaches only
    /// database `postgres` as `postgres` (the readiness probe); every other database takes TLS
    /// only (`hostssl`).
    pub fn start_tls(cert: &Path, key: &Path) -> Self {
        let (cert, key) = (cert.to_path_buf(), key.to_path_buf());
        Self::start_configured(move |dir| {
            for (from, to) in [(&cert, "server.crt"), (&key, "server.key")] {
                std::fs::copy(from, dir.join(to)).expect("copy the certificate");
            }
            // PostgreSQL refuses a key others may read.
            std::fs::set_permissions(
                dir.join("server.key"),
                std::os::unix::fs::PermissionsExt::from_mode(0o600),
            )
            .expect("chmod the key");
            std::fs::write(
                dir.join("data").join("pg_hba.conf"),
                "local all all trust\n\
                 hostnossl postgres postgres 127.0.0.1/32 trust\n\
                 hostnossl all all 127.0.0.1/32 reject\n\
                 hostssl all all 127.0.0.1/32 trust\n",
            )
            .expect("write pg_hba.conf");
            [
                "ssl=on".to_owned(),
                format!("ssl_cert_file={}", dir.join("server.crt").display()),
                format!("ssl_key_file={}", dir.join("server.key").display()),
            ]
            .into_iter()
            .flat_map(|setting| ["-c".to_owned(), setting])
            .collect()
        })
    }

    /// [`start`](Self::start) with `extra` arguments for the server, made once `initdb` has
    /// run in the directory it is given (before the directory is handed to the server's user).
    fn start_configured(extra: impl Fn(&Path) -> Vec<String>) -> Self {
        let postgres = require_pg_binary("postgres");
        let initdb = require_pg_binary("initdb");
        let (process, port, dir) = launch(
            "PostgreSQL",
            PG_LOGS,
            |port, dir| {
                let (program, args) = as_server_user(
                    &initdb,
                    vec![
                        "-D".into(),
                        dir.join("data").display().to_string(),
                        "-U".into(),
                        "postgres".into(),
                        "--auth=trust".into(),
                        "-E".into(),
                        "UTF8".into(),
                        "--no-locale".into(),
                        "--no-sync".into(),
                    ],
                    dir,
                );
                let out = Command::new(program)
                    .args(args)
                    .output()
                    .expect("run initdb");
                assert!(
                    out.status.success(),
                    "initdb failed:\n{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                let mut args = pg_args(port, dir);
                args.extend(extra(dir));
                as_server_user(&postgres, args, dir)
            },
            pg_ready,
        );
        Self { process, port, dir }
    }

    /// Kills the server (SIGKILL: a crash; committed data survives), runs `down`, and starts
    /// it again on the same port and data directory.
    pub fn restart_after(&mut self, down: impl FnOnce()) {
        self.process.stop();
        down();
        let postgres = require_pg_binary("postgres");
        let (program, args) = as_server_user(
            &postgres,
            pg_args(self.port, self.dir.path()),
            self.dir.path(),
        );
        self.process = respawn(
            "PostgreSQL",
            &program,
            &args,
            self.port,
            self.dir.path(),
            PG_LOGS,
            pg_ready,
        );
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server's log, for failure messages.
    pub fn log(&self) -> String {
        read_log(self.dir.path(), PG_LOGS)
    }
}

/// One PostgreSQL for every test in this binary; tests keep apart by namespace.
pub fn shared_postgres() -> &'static PgServer {
    static SERVER: OnceLock<PgServer> = OnceLock::new();
    SERVER.get_or_init(PgServer::start)
}

/// PgBouncer in transaction mode in front of a PostgreSQL server: every transaction may run on
/// another server connection, and only `pool_size` server connections are shared by every
/// client.
pub struct PgBouncer {
    process: Supervised,
    port: u16,
    dir: tempfile::TempDir,
}

impl PgBouncer {
    pub fn start(server: &PgServer, pool_size: u32) -> Self {
        Self::start_with(server, pool_size, "")
    }

    /// Like [`start`](Self::start), with `extra` lines for the `[pgbouncer]` section.
    pub fn start_with(server: &PgServer, pool_size: u32, extra: &str) -> Self {
        let bin = require_binary_in("pgbouncer", &["/usr/sbin"]);
        let upstream = server.port();
        let (process, port, dir) = launch(
            "PgBouncer",
            &["pgbouncer.log", "pgbouncer.err"],
            |port, dir| {
                std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").expect("users.txt");
                let ini = dir.join("pgbouncer.ini");
                std::fs::write(
                    &ini,
                    format!(
                        "[databases]\n\
                         postgres = host=127.0.0.1 port={upstream} dbname=postgres user=postgres\n\
                         [pgbouncer]\n\
                         listen_addr = 127.0.0.1\n\
                         listen_port = {port}\n\
                         unix_socket_dir =\n\
                         auth_type = trust\n\
                         auth_file = {users}\n\
                         pool_mode = transaction\n\
                         default_pool_size = {pool_size}\n\
                         max_client_conn = 1000\n\
                         server_reset_query =\n\
                         ignore_startup_parameters = extra_float_digits\n\
                         {extra}",
                        users = dir.join("users.txt").display(),
                    ),
                )
                .expect("write pgbouncer.ini");
                as_server_user(&bin, vec![ini.display().to_string()], dir)
            },
            pg_ready,
        );
        Self { process, port, dir }
    }

    /// Kills the pooler (SIGKILL: every client and server connection drops), runs `down`, and
    /// starts it again on the same port and configuration.
    pub fn restart_after(&mut self, down: impl FnOnce()) {
        self.process.stop();
        down();
        let bin = require_binary_in("pgbouncer", &["/usr/sbin"]);
        let ini = self.dir.path().join("pgbouncer.ini").display().to_string();
        let (program, args) = as_server_user(&bin, vec![ini], self.dir.path());
        self.process = respawn(
            "PgBouncer",
            &program,
            &args,
            self.port,
            self.dir.path(),
            &["pgbouncer.log", "pgbouncer.err"],
            pg_ready,
        );
    }

    /// The pooler's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `postgres` through the pooler.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

/// Finds an executable on PATH or in one of `dirs` (e.g. `/usr/sbin`, which is not on every
/// PATH), or fails the test naming the install script.
pub fn require_binary_in(name: &str, dirs: &[&str]) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(dirs.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("`{name}` was not found: {INSTALL_HINT}"))
}

/// A namespace unique to one test (and one run), so tests can share a server.
#[macro_export]
macro_rules! test_namespace {
    () => {{
        fn f() {}
        let name = std::any::type_name_of_val(&f);
        let name: String = name
            .trim_end_matches("::f")
            .split("::")
            .filter(|part| !part.starts_with('{'))
            .collect::<Vec<_>>()
            .join(".");
        format!("t.{}.{}", name, std::process::id())
    }};
}
