//! PgBouncer in transaction mode in front of the PostgreSQL server, one shared by every test of
//! a binary, and the behaviour suite's fixture through it.

use crate::support::process::{launch, respawn, Supervised};
use crate::support::require_binary_in;

use super::postgres::{as_server_user, pg_ready, PgServer};

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

/// One pooler, two server connections, before the binary's shared PostgreSQL, for every test
/// of a binary that only reads it (no restarts); tests keep apart by namespace.
pub fn shared_pgbouncer() -> &'static PgBouncer {
    static BOUNCER: std::sync::OnceLock<PgBouncer> = std::sync::OnceLock::new();
    BOUNCER.get_or_init(|| PgBouncer::start(super::postgres::shared_postgres(), 2))
}

/// A test's namespace through the shared pooler (statements through it, LISTEN straight to
/// the server, where a transaction pooler cannot carry it).
#[cfg(feature = "postgres")]
pub async fn env(ns: String) -> super::Env {
    super::postgres::env_via("pgbouncer", Some(|| shared_pgbouncer().url()), ns).await
}
