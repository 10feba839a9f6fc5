//! A PostgreSQL server on a free loopback port, in a fresh cluster, one shared by every test of
//! a binary, and the behaviour suite's fixture on it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::support::process::{launch, read_log, respawn, send, Supervised};
use crate::support::{require_binary, INSTALL_HINT};

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
pub fn as_server_user(program: &Path, args: Vec<String>, dir: &Path) -> (PathBuf, Vec<String>) {
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
    // Debugging: every statement, with its time and connection name, to files in this
    // directory (which the server's user must be able to write).
    if let Some(d) = std::env::var_os("DISTLOCK_TEST_PG_LOG_DIR") {
        for setting in [
            "logging_collector=on".to_owned(),
            format!("log_directory={}", d.to_string_lossy()),
            "log_filename=pg-%H%M%S.log".to_owned(),
            "log_statement=all".to_owned(),
            "log_line_prefix=%m [%p] %a ".to_owned(),
        ] {
            args.push("-c".into());
            args.push(setting);
        }
    }
    args
}

/// A PostgreSQL startup message for user and database `postgres`: a server that serves
/// answers with `R` (authentication), one still starting or stopping with `E`.
pub fn pg_ready(port: u16) -> bool {
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

/// The suite's fixture: the binary's shared server, reached directly or through the shared
/// PgBouncer (`super::pgbouncer`).
#[cfg(feature = "postgres")]
mod fixture {
    use std::time::Duration;

    use distlock::backend::PgBackend;
    use distlock::LockClient;
    use futures::future::BoxFuture;

    use super::shared_postgres;
    use crate::support::pg::{claims_in, until_queued};
    use crate::support::server::{Env, Server, Supports};
    use crate::support::until_none_left;

    /// A lock's lease unless a test says otherwise.
    pub const TTL: Duration = Duration::from_secs(10);

    /// Where statements go: the server itself (`None`), or a pooler before it (its URL), with
    /// waiters LISTENing on the server.
    pub struct Postgres(pub Option<fn() -> String>);

    impl Server for Postgres {
        fn client(&self, ns: String, ttl: Option<Duration>) -> BoxFuture<'static, LockClient> {
            let pooler = self.0.map(|url| url());
            Box::pin(async move {
                let server = shared_postgres().url();
                let builder = match pooler {
                    None => PgBackend::builder(server),
                    Some(pooler) => PgBackend::builder(pooler).listen_url(server),
                };
                let backend = builder
                    .handoff_ttl(Duration::from_secs(2))
                    .build()
                    .await
                    .unwrap();
                LockClient::builder(backend)
                    .namespace(ns)
                    .ttl(ttl.unwrap_or(TTL))
                    .build()
                    .unwrap()
            })
        }

        fn until_queued(&self, ns: String, key: String, n: usize) -> BoxFuture<'static, ()> {
            let n = i64::try_from(n).unwrap();
            Box::pin(async move { until_queued(&shared_postgres().url(), &ns, &key, n).await })
        }

        /// No claim row of the namespace, live or not, within 300 ms (a release dropped in a
        /// cancelled future lands in the background).
        fn assert_clean(&self, ns: String) -> BoxFuture<'static, ()> {
            Box::pin(async move {
                let url = shared_postgres().url();
                let claims = || async {
                    let n = claims_in(&url, &ns).await;
                    if n == 0 {
                        Vec::new()
                    } else {
                        vec![n]
                    }
                };
                until_none_left(Duration::from_millis(300), "claims", claims).await;
            })
        }
    }

    /// An `Env` whose statements go through the pooler at `pooler()`, or straight to the
    /// server.
    pub async fn env_via(name: &'static str, pooler: Option<fn() -> String>, ns: String) -> Env {
        let probe = PgBackend::connect(&shared_postgres().url()).await.unwrap();
        Env::new(name, ns, Supports::of(&probe), Postgres(pooler))
    }

    /// A test's namespace on the binary's shared PostgreSQL.
    pub async fn env(ns: String) -> Env {
        env_via("postgres", None, ns).await
    }
}

#[cfg(feature = "postgres")]
#[allow(unused_imports)] // each test binary uses what it needs
pub use fixture::{env, env_via, TTL};
