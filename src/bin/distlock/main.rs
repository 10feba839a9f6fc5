//! `distlock`: hold a distributed lock while a command runs, or look at who holds one.
//!
//! ```text
//! distlock run KEY [-w|--timeout 30s] [--ttl 15s] [-n|--no-wait] -- CMD ARGS...
//! distlock inspect KEY [--json]
//! distlock unlock KEY [--force] [--json]   # the operator's unlock of a stuck holder
//! distlock schema            # the PostgreSQL schema's SQL, for a migration tool
//! ```
//!
//! The service comes from `--url` or `DISTLOCK_URL` (`redis://…`, `rediss://…`,
//! `redis+cluster://…`, `redis+sentinel://…`, `redlock://…`, `zk://…`, `postgres://…`).
//! Exit status of `run`: the command's own (128 + N if a signal N ended it), or one of
//! [`exit`]'s codes.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use distlock::{Inspection, LockClient};
use tokio::process::Command;
use tokio::signal::unix::{signal, SignalKind};

mod show;

/// Exit codes, in the spirit of `flock(1)` and `timeout(1)`.
mod exit {
    /// Bad arguments (clap's own code).
    pub const USAGE: u8 = 2;
    /// The lock service cannot be reached or failed, and may do better later
    /// (`EX_UNAVAILABLE`).
    pub const BACKEND: u8 = 69;
    /// The lock service refused, and will refuse again until someone changes something: the
    /// credentials, a permission, a certificate, a missing database or schema (`EX_NOPERM`).
    /// Not worth retrying as it is.
    pub const REFUSED: u8 = 77;
    /// `--no-wait` and the lock is held elsewhere (`EX_TEMPFAIL`).
    pub const BUSY: u8 = 75;
    /// `--timeout` passed before the lock was granted (as `timeout(1)`).
    pub const TIMEOUT: u8 = 124;
    /// The lock was lost while the command ran: it was terminated.
    pub const LOST: u8 = 125;
    /// The command could not be started (as a shell's).
    pub const NO_COMMAND: u8 = 127;
    /// Interrupted (SIGINT or SIGTERM): the command was terminated and the lock released.
    pub const INTERRUPTED: u8 = 130;
}

#[derive(Parser)]
#[command(
    name = "distlock",
    version,
    about = "Hold a distributed lock while a command runs, or inspect one",
    after_help = "Exit status of `run`: the command's (128+N if signal N ended it); 2 bad \
                  arguments, 69 lock service unavailable, 75 busy (--no-wait), 77 refused by \
                  the lock service (credentials, permissions, certificate), 124 timed out, \
                  125 lock lost (command terminated), 127 command not started, 130 interrupted."
)]
struct Cli {
    /// The lock service's URL: redis://host:port, zk://host:port, postgres://user@host/db, …
    /// (every form: `distlock run --help`)
    #[arg(long, env = "DISTLOCK_URL", global = true)]
    url: Option<String>,
    /// The namespace keys live under (shared by every client of a key).
    #[arg(long, env = "DISTLOCK_NAMESPACE", default_value = distlock::DEFAULT_NAMESPACE, global = true)]
    namespace: String,
    #[command(subcommand)]
    command: Cmd,
}

/// Every form of `--url`, in the long help of the commands that need it.
const URL_FORMS: &str = "Lock service URLs (--url or DISTLOCK_URL):
  redis://[user:password@]host:port[/db]          one Redis server (rediss:// for TLS)
  redis+cluster://[user:password@]host:port,host:port    a Redis Cluster, by seed nodes
  redis+sentinel://[user:password@]host:port,host:port/<master>[/db]
  redlock://[user:password@]host:port,host:port,host:port[/db]   independent Redis nodes
  zk://host:port[,host:port][/chroot]             a ZooKeeper ensemble
  postgres://user[:password]@host:port/database   PostgreSQL";

#[derive(Subcommand)]
enum Cmd {
    /// Run a command while holding a lock
    ///
    /// Runs CMD while holding KEY, renewing the lease while it runs; the command gets the
    /// fencing token in DISTLOCK_FENCING_TOKEN. If the lock is lost, the command gets SIGTERM
    /// (SIGKILL after --grace) and `run` exits 125.
    #[command(after_long_help = URL_FORMS)]
    Run {
        /// The lock's name, e.g. `migrations` or `orders:42`: every process that runs with the
        /// same KEY, namespace and service excludes the others (1 to 512 bytes, no NUL).
        key: String,
        /// Give up after this long (e.g. 30s, 2m), with status 124; waits for ever without it
        /// (flock's -w).
        #[arg(short = 'w', long, value_parser = humantime::parse_duration)]
        timeout: Option<Duration>,
        /// The lease, renewed in the background while the command runs.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "15s")]
        ttl: Duration,
        /// Fail at once (status 75) if the lock is held elsewhere (flock's -n).
        #[arg(short = 'n', long, visible_alias = "nonblock")]
        no_wait: bool,
        /// How long a terminated command gets between SIGTERM and SIGKILL.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
        grace: Duration,
        /// No progress line while waiting.
        #[arg(long, short)]
        quiet: bool,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Show who holds a lock and who waits
    Inspect {
        /// The lock's name, as given to `run` (or to the library).
        key: String,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Print the SQL of distlock's PostgreSQL schema
    ///
    /// Prints the SQL that creates distlock's PostgreSQL schema, for a migration tool or a DBA
    /// (no service needed).
    Schema,
    /// Drop a stuck lock's holders (with --force)
    ///
    /// The operator's unlock: drops whoever holds KEY (every reader or permit holder too), so
    /// the first waiter is granted at once. Without --force it only shows what would be
    /// removed (and exits 75 if anyone holds KEY).
    ///
    /// A dropped holder learns it lost the lock at its next renewal (a third of its TTL; memory
    /// and ZooKeeper holders at once), and may act until then. Every later grant's fencing
    /// token is above the dropped holders', so storage that checks the token refuses their
    /// late writes: fencing, not the unlock, keeps them out.
    Unlock {
        /// The lock's name, as given to `run` (or to the library).
        key: String,
        /// Drop the holders. Without it nothing changes.
        #[arg(long)]
        force: bool,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("distlock: cannot start the runtime: {e}");
            return ExitCode::from(exit::BACKEND);
        }
    };
    ExitCode::from(runtime.block_on(run_cli(cli)))
}

async fn run_cli(cli: Cli) -> u8 {
    if matches!(cli.command, Cmd::Schema) {
        print!("{}", distlock::backend::PgBackend::schema_sql());
        return 0;
    }
    let Some(url) = cli.url.filter(|u| !u.is_empty()) else {
        eprintln!(
            "distlock: no lock service: pass --url or set DISTLOCK_URL (redis://..., redis+cluster://..., redis+sentinel://..., redlock://..., zk://..., postgres://...)"
        );
        return exit::USAGE;
    };
    // `--timeout` bounds the whole wait, connecting included: a silent server costs no more.
    let started = tokio::time::Instant::now();
    let within = match &cli.command {
        Cmd::Run {
            timeout: Some(t),
            no_wait: false,
            ..
        } => Some(*t),
        _ => None,
    };
    let connecting = connect(&url, &cli.namespace);
    let connected = match within {
        Some(t) => match tokio::time::timeout(t, connecting).await {
            Ok(connected) => connected,
            Err(_) => {
                eprintln!("distlock: the lock service did not answer within {t:?}");
                return exit::TIMEOUT;
            }
        },
        None => connecting.await,
    };
    let client = match connected {
        Ok(client) => client,
        Err(e) => {
            eprintln!("distlock: {}", report(&e));
            return failed(&e);
        }
    };
    let code = match cli.command {
        Cmd::Run {
            key,
            timeout,
            ttl,
            no_wait,
            grace,
            quiet,
            cmd,
        } => {
            let opts = RunOptions {
                timeout: timeout.map(|t| t.saturating_sub(started.elapsed())),
                ttl,
                no_wait,
                grace,
                quiet,
            };
            run(&client, &key, &opts, &cmd).await
        }
        Cmd::Inspect { key, json } => inspect(&client, &key, json).await,
        Cmd::Unlock { key, force, json } => unlock(&client, &key, force, json).await,
        Cmd::Schema => 0,
    };
    client.shutdown().await;
    code
}

/// A client for `url` in `namespace`. The in-process backend is refused: a lock nobody else
/// can see protects nothing across processes.
async fn connect(url: &str, namespace: &str) -> distlock::Result<LockClient> {
    let scheme = url.split_once("://").map_or(url, |(s, _)| s);
    if matches!(scheme.trim_end_matches(':'), "" | "memory") {
        return Err(distlock::Error::new(
            distlock::ErrorKind::InvalidConfig,
            "an in-process lock protects nothing across processes: use redis://, rediss://, redis+cluster://, redis+sentinel://, redlock://, zk:// or postgres://",
        ));
    }
    LockClient::builder_for(url)
        .await?
        .namespace(namespace)
        .build()
}

/// The exit code for a failure before the command ran: bad input, an outage that may pass,
/// or a refusal that will not.
fn failed(e: &distlock::Error) -> u8 {
    if e.is_invalid_config() || e.is_invalid_key() {
        exit::USAGE
    } else if e.is_transient() {
        exit::BACKEND
    } else {
        exit::REFUSED
    }
}

/// An error and its causes on one line, each said once: `redis connect failed: the server
/// refused the connection: Connection refused (os error 111)`. A cause that spans lines (a
/// client library's dump) is folded onto this one; one whose text is already there is left
/// out (client libraries often wrap an error and print it again).
fn report(e: &distlock::Error) -> String {
    let mut line = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let text = c.to_string();
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if !text.is_empty() && !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

struct RunOptions {
    timeout: Option<Duration>,
    ttl: Duration,
    no_wait: bool,
    grace: Duration,
    quiet: bool,
}

async fn run(client: &LockClient, key: &str, opts: &RunOptions, cmd: &[String]) -> u8 {
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        eprintln!("distlock: cannot listen for signals");
        return exit::BACKEND;
    };
    let mutex = client.mutex(key).with_ttl(opts.ttl);
    let acquire = async {
        if opts.no_wait {
            mutex.try_lock().await
        } else if let Some(t) = opts.timeout {
            mutex.lock_timeout(t).await
        } else {
            mutex.lock().await
        }
    };
    let progress = async {
        if opts.quiet || opts.no_wait {
            return std::future::pending().await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut every = tokio::time::interval(Duration::from_secs(1));
        let mut shown = String::new();
        loop {
            every.tick().await;
            if let Ok(seen) = client.inspect(key).await {
                let line = waiting_line(key, &seen);
                if line != shown {
                    show_progress(&line);
                    shown = line;
                }
            }
        }
    };
    let guard = tokio::select! {
        got = acquire => got,
        // The progress loop never ends.
        () = progress => return exit::BACKEND,
        _ = interrupt.recv() => return exit::INTERRUPTED,
        _ = terminate.recv() => return exit::INTERRUPTED,
    };
    finish_progress(opts.quiet);
    let guard = match guard {
        Ok(guard) => guard,
        Err(e) if e.is_would_block() => {
            eprintln!("distlock: `{key}` is held elsewhere");
            return exit::BUSY;
        }
        Err(e) if e.is_timeout() => {
            eprintln!(
                "distlock: `{key}` was not granted within {:?}",
                opts.timeout.unwrap_or_default()
            );
            return exit::TIMEOUT;
        }
        Err(e) => {
            eprintln!("distlock: {}", report(&e));
            return failed(&e);
        }
    };

    let mut child = match Command::new(&cmd[0])
        .args(&cmd[1..])
        .env("DISTLOCK_FENCING_TOKEN", guard.fencing_token().to_string())
        .env("DISTLOCK_KEY", key)
        .kill_on_drop(true)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("distlock: cannot run `{}`: {e}", cmd[0]);
            let _ = guard.release().await;
            return exit::NO_COMMAND;
        }
    };
    let code = tokio::select! {
        status = child.wait() => match status {
            Ok(status) => status_code(status),
            Err(e) => {
                eprintln!("distlock: lost track of the command: {e}");
                exit::BACKEND
            }
        },
        () = guard.lost() => {
            eprintln!("distlock: the lock on `{key}` was lost; terminating the command");
            stop(&mut child, opts.grace).await;
            exit::LOST
        }
        _ = interrupt.recv() => {
            stop(&mut child, opts.grace).await;
            exit::INTERRUPTED
        }
        _ = terminate.recv() => {
            stop(&mut child, opts.grace).await;
            exit::INTERRUPTED
        }
    };
    if let Err(e) = guard.release().await {
        if code != exit::LOST && !e.is_lost() {
            eprintln!(
                "distlock: release failed (the lease will expire): {}",
                report(&e)
            );
        }
    }
    code
}

/// SIGTERM, then SIGKILL after `grace`; waits for the command to end.
async fn stop(child: &mut tokio::process::Child, grace: Duration) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

fn status_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + (sig & 0x7f)).unwrap_or(1),
        (None, None) => 1,
    }
}

fn waiting_line(key: &str, seen: &Inspection) -> String {
    let holder = match seen.holders.first() {
        Some(h) => match h.fencing_token {
            Some(t) => format!("held by token {t}"),
            None => "held".to_owned(),
        },
        None => "being handed over".to_owned(),
    };
    let queued = seen.waiters.len();
    format!("distlock: waiting for `{key}`: {holder}, {queued} in the queue")
}

fn show_progress(line: &str) {
    let mut err = std::io::stderr();
    if err.is_terminal() {
        let _ = write!(err, "\r\x1b[2K{line}");
    } else {
        let _ = writeln!(err, "{line}");
    }
    let _ = err.flush();
}

fn finish_progress(quiet: bool) {
    let mut err = std::io::stderr();
    if !quiet && err.is_terminal() {
        let _ = write!(err, "\r\x1b[2K");
        let _ = err.flush();
    }
}

async fn inspect(client: &LockClient, key: &str, json: bool) -> u8 {
    let seen = match client.inspect(key).await {
        Ok(seen) => seen,
        Err(e) => {
            eprintln!("distlock: {}", report(&e));
            return failed(&e);
        }
    };
    if json {
        println!("{}", show::to_json(&seen));
    } else {
        print!("{}", show::to_table(&seen));
    }
    0
}

/// `unlock`: without `force`, what would be removed (status 75 if anyone holds the key);
/// with it, the holders dropped, their tokens, and what they may still do.
async fn unlock(client: &LockClient, key: &str, force: bool, json: bool) -> u8 {
    let failed = |e: distlock::Error| {
        eprintln!("distlock: {}", report(&e));
        failed(&e)
    };
    if !force {
        let seen = match client.inspect(key).await {
            Ok(seen) => seen,
            Err(e) => return failed(e),
        };
        if json {
            println!(
                "{}",
                show::unlock_json(&seen.key, seen.family, &seen.holders, false)
            );
        } else {
            print!("{}", show::removal_table(key, &seen.holders, false));
        }
        if seen.holders.is_empty() {
            return 0;
        }
        eprintln!(
            "distlock: `{key}` is held; nothing was changed. `distlock unlock {key} --force` drops the holders above (their fenced writes are refused from then on)"
        );
        return exit::BUSY;
    }
    let removed = match client.force_release(key).await {
        Ok(removed) => removed,
        Err(e) => return failed(e),
    };
    if json {
        let (key, holders) = (&removed.key, &removed.removed);
        println!("{}", show::unlock_json(key, removed.family, holders, true));
    } else {
        print!("{}", show::removal_table(key, &removed.removed, true));
        print!("{}", show::still_acting(&removed.removed));
    }
    0
}
