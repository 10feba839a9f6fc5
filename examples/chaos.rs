//! A Jepsen-style fault run: several holders loop on one key and write to a fenced resource,
//! while a driver injects faults at random; a checker, not the library, judges the outcome.
//!
//! ```text
//! cargo run --release --all-features --example chaos -- --backend redis --secs 600
//! cargo run --release --all-features --example chaos -- --backend zookeeper --secs 600
//! cargo run --release --all-features --example chaos -- --backend postgres --secs 600
//! cargo run --release --all-features --example chaos -- --backend redlock --secs 600
//! cargo run --release --all-features --example chaos -- --backend memory --secs 600
//! cargo run --release --all-features --example chaos -- --backend redis --primitive write
//! cargo run --release --all-features --example chaos -- --backend redis --primitive permit
//! ```
//!
//! `--primitive` picks what the holders take, each in its exclusive form, so one checker judges
//! them all: `mutex` (the default), `write` (a read-write lock's write side) or `permit` (a
//! one-permit semaphore). Process backends only; memory runs the mutex. `--trace` makes every
//! holder log at TRACE (to nowhere), so every event's fields are evaluated under faults.
//!
//! After the faults stop, Redis and Redlock runs also count the lock servers' commands: more
//! than [`MAX_COMMANDS_PER_GRANT`] a grant means someone polls, and fails the run.
//!
//! Redis, ZooKeeper and PostgreSQL: real servers on loopback (tests/support), each holder a separate process
//! (this example re-run with `--holder`) reaching the lock server through its own fault proxy.
//! The fenced resource is a separate `redis-server` whose script accepts a write only if its
//! token is at least the highest it has seen. Each holder loops: lock, check `is_lost()`,
//! write with its token, hold a moment, release. Faults, one at a time, each kind in turn in
//! random order: SIGSTOP a holder past its lease (then SIGCONT); SIGKILL a holder (and start a
//! new one); SIGKILL two in a row (at least one of them a queued waiter); restart the lock server (Redis without its data, ZooKeeper and PostgreSQL on their
//! data, PostgreSQL after a crash); blackhole
//! a holder's connection past its lease; reset a holder's connection; on ZooKeeper, blackhole
//! past the session timeout (the session expires). Redlock: five `redis-server` nodes, each
//! holder with a proxy to each; a restart is one node's (without its data, in turn), a
//! blackhole or reset takes all of a holder's connections, and one more fault blackholes one
//! node for every holder past the lease. Memory: the holders are tasks of one
//! process; the faults pause a task past its lease between check and write (the analogue of
//! SIGSTOP), abort a task, or shut a client down under its holder.
//!
//! The checker fails the run on any of: a write the resource rejected although its holder had
//! just checked it was not lost (a SIGSTOP between the check and the write is the one allowed
//! exception, counted apart); an accepted write whose token is not above every earlier accepted
//! token (two grants with one token, or a stale grant); a holder without an accepted write in
//! the 3×TTL after faults stop; keys (beyond fence counters), znodes or live claim rows left
//! after the holders shut down. It prints one summary line and exits non-zero on a violation.

#[path = "../tests/support/mod.rs"]
#[allow(unused_macros)]
mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use distlock::LockClient;

const HOLDERS: usize = 4;
const TTL: Duration = Duration::from_secs(2);
/// How long a holder keeps the lock after writing.
const HOLD: Duration = Duration::from_millis(5);

/// Accepts a write only if its token is at least the highest seen; appends accepted ones.
const FENCED_WRITE: &str = r"
local max = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token < max then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2])
return 1
";

fn wall_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

struct Args {
    backend: String,
    /// Which primitive the holders take, each in its exclusive form: `mutex`, `write` (a
    /// read-write lock's write side) or `permit` (a one-permit semaphore).
    primitive: String,
    /// Holders log every event at TRACE (to nowhere): observability must change nothing.
    trace: bool,
    secs: u64,
    seed: u64,
    holder: Option<HolderArgs>,
}

struct HolderArgs {
    id: usize,
    lock_url: String,
    resource_url: String,
    ns: String,
}

fn parse_args() -> Args {
    let mut args = Args {
        backend: "redis".into(),
        primitive: "mutex".into(),
        trace: false,
        secs: 60,
        seed: wall_ns() as u64,
        holder: None,
    };
    let mut it = std::env::args().skip(1);
    let mut holder: HashMap<String, String> = HashMap::new();
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--backend" => args.backend = value(),
            "--primitive" => args.primitive = value(),
            "--trace" => args.trace = true,
            "--secs" => args.secs = value().parse().expect("--secs N"),
            "--seed" => args.seed = value().parse().expect("--seed N"),
            "--holder" => {
                holder.insert("id".into(), value());
            }
            "--lock-url" | "--resource-url" | "--ns" => {
                holder.insert(flag.trim_start_matches("--").into(), value());
            }
            other => panic!("unknown argument {other}"),
        }
    }
    if let Some(id) = holder.get("id") {
        args.holder = Some(HolderArgs {
            id: id.parse().expect("--holder N"),
            lock_url: holder.remove("lock-url").expect("--lock-url"),
            resource_url: holder.remove("resource-url").expect("--resource-url"),
            ns: holder.remove("ns").expect("--ns"),
        });
    }
    args
}

/// A small deterministic generator (the seed is printed, so a run can be replayed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One line a holder reports per grant.
#[derive(Debug, Clone)]
enum Report {
    /// `token accepted check_ns write_ns`: wrote (or tried to) after checking it held.
    Wrote {
        holder: usize,
        token: u64,
        accepted: bool,
        check_ns: u128,
        write_ns: u128,
        at: Instant,
    },
    /// Granted, but already lost at the check: did not write.
    SkippedLost,
}

fn parse_report(holder: usize, line: &str) -> Option<Report> {
    let mut f = line.split_whitespace();
    match f.next()? {
        "W" => Some(Report::Wrote {
            holder,
            token: f.next()?.parse().ok()?,
            accepted: f.next()? == "1",
            check_ns: f.next()?.parse().ok()?,
            write_ns: f.next()?.parse().ok()?,
            at: Instant::now(),
        }),
        "L" => Some(Report::SkippedLost),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// The holder process (Redis, ZooKeeper).

/// A held lock of any primitive, as the holder loop uses it.
enum Held {
    Mutex(distlock::MutexGuard),
    Write(distlock::RwLockWriteGuard),
    Permit(distlock::SemaphorePermit),
}

impl Held {
    fn is_lost(&self) -> bool {
        match self {
            Self::Mutex(g) => g.is_lost(),
            Self::Write(g) => g.is_lost(),
            Self::Permit(g) => g.is_lost(),
        }
    }

    fn fencing_token(&self) -> u64 {
        match self {
            Self::Mutex(g) => g.fencing_token(),
            Self::Write(g) => g.fencing_token(),
            Self::Permit(g) => g.fencing_token(),
        }
    }
}

/// Takes `primitive` on key `chaos`, waiting at most `patience`.
async fn take(client: &LockClient, primitive: &str, patience: Duration) -> distlock::Result<Held> {
    match primitive {
        "write" => client
            .rw_lock("chaos")
            .write_timeout(patience)
            .await
            .map(Held::Write),
        "permit" => client
            .semaphore("chaos", 1)
            .acquire_timeout(patience)
            .await
            .map(Held::Permit),
        _ => client
            .mutex("chaos")
            .lock_timeout(patience)
            .await
            .map(Held::Mutex),
    }
}

fn holder_main(args: HolderArgs, backend: &str, primitive: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let client = match backend {
            "redis" => LockClient::builder(
                distlock::backend::RedisBackend::connect(&args.lock_url)
                    .await
                    .expect("redis backend"),
            ),
            "postgres" => LockClient::builder(
                distlock::backend::PgBackend::connect(&args.lock_url)
                    .await
                    .expect("postgres backend"),
            ),
            // A node that lost its data sits out a TTL, as it must to keep the lock exclusive.
            "redlock" => LockClient::builder(
                distlock::backend::RedlockBackend::builder(args.lock_url.split(','))
                    .rejoin_delay(TTL)
                    .build()
                    .await
                    .expect("redlock backend"),
            ),
            _ => LockClient::builder(
                distlock::backend::ZkBackend::builder(&args.lock_url)
                    .session_timeout(TTL)
                    // The test servers' tickTime (tests/support): the lease proof waits a
                    // fraction of it, and the 2 s default would make most grants of a 2 s
                    // session wait.
                    .server_tick(support::zk::SERVER_TICK)
                    .call_timeout(Duration::from_millis(500))
                    .build()
                    .await
                    .expect("zookeeper backend"),
            ),
        }
        .namespace(&args.ns)
        .ttl(TTL)
        .build()
        .expect("client");
        let resource = redis::Client::open(args.resource_url.as_str())
            .expect("resource url")
            .get_multiplexed_async_connection()
            .await
            .expect("resource connection");
        let script = redis::Script::new(FENCED_WRITE);
        // The driver closes our stdin to ask us to stop.
        let (stop_tx, mut stop) = tokio::sync::watch::channel(false);
        std::thread::spawn(move || {
            let mut sink = String::new();
            while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
            let _ = stop_tx.send(true);
        });
        let mut out = std::io::stdout();
        while !*stop.borrow() {
            let got = tokio::select! {
                g = take(&client, primitive, Duration::from_secs(10)) => g,
                _ = stop.changed() => break,
            };
            let Ok(guard) = got else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            if guard.is_lost() {
                let _ = writeln!(out, "L");
                continue;
            }
            let check_ns = wall_ns();
            let mut conn = resource.clone();
            let accepted: redis::RedisResult<i64> = script
                .key("chaos:max")
                .key("chaos:log")
                .arg(guard.fencing_token())
                .arg(args.id)
                .invoke_async(&mut conn)
                .await;
            let write_ns = wall_ns();
            if let Ok(accepted) = accepted {
                let _ = writeln!(
                    out,
                    "W {} {} {check_ns} {write_ns}",
                    guard.fencing_token(),
                    accepted
                );
            }
            tokio::time::sleep(HOLD).await;
            drop(guard);
        }
        client.shutdown().await;
    });
}

// ---------------------------------------------------------------------------------------------
// The driver.

#[derive(Default)]
struct Counts {
    grants: u64,
    accepted: u64,
    skipped_lost: u64,
    /// Rejected although checked not lost, with a SIGSTOP between the check and the write.
    stopped_between: u64,
    /// Rejected although checked not lost, no SIGSTOP to explain it.
    stale_believed: u64,
    /// Accepted with a token not above the last accepted one.
    token_regressions: u64,
    faults: HashMap<&'static str, u64>,
}

/// Everything the holders reported, and the SIGSTOP windows, for the checker.
#[derive(Default)]
struct Log {
    reports: Vec<Report>,
    /// (holder, stopped at, continued at) in wall ns.
    stops: Vec<(usize, u128, u128)>,
}

struct Holder {
    child: Child,
    stdin: Option<ChildStdin>,
}

struct Fleet {
    backend: String,
    primitive: String,
    trace: bool,
    exe: std::path::PathBuf,
    resource_url: String,
    ns: String,
    holders: Vec<Option<Holder>>,
    /// Per holder, a proxy to each lock server node.
    proxies: Vec<Vec<support::proxy::Proxy>>,
    log: Arc<StdMutex<Log>>,
    spawned: u64,
}

impl Fleet {
    fn lock_url(&self, i: usize) -> String {
        let ports: Vec<u16> = self.proxies[i].iter().map(|p| p.port()).collect();
        let port = ports[0];
        match self.backend.as_str() {
            "redis" => format!("redis://127.0.0.1:{port}/"),
            "redlock" => ports
                .iter()
                .map(|p| format!("redis://127.0.0.1:{p}/"))
                .collect::<Vec<_>>()
                .join(","),
            "postgres" => format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            _ => format!("127.0.0.1:{port}"),
        }
    }

    fn spawn(&mut self, i: usize) {
        let mut child = Command::new(&self.exe)
            .args(["--backend", &self.backend, "--holder", &i.to_string()])
            .args(["--primitive", &self.primitive])
            .args(self.trace.then_some("--trace"))
            .args(["--lock-url", &self.lock_url(i)])
            .args(["--resource-url", &self.resource_url, "--ns", &self.ns])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn a holder");
        let stdout = child.stdout.take().expect("holder stdout");
        let stdin = child.stdin.take();
        let log = self.log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(r) = parse_report(i, &line) {
                    log.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .reports
                        .push(r);
                }
            }
        });
        self.spawned += 1;
        self.holders[i] = Some(Holder { child, stdin });
    }

    fn pid(&self, i: usize) -> Option<nix::unistd::Pid> {
        let h = self.holders[i].as_ref()?;
        Some(nix::unistd::Pid::from_raw(
            i32::try_from(h.child.id()).ok()?,
        ))
    }

    fn signal(&self, i: usize, sig: nix::sys::signal::Signal) {
        if let Some(pid) = self.pid(i) {
            let _ = nix::sys::signal::kill(pid, sig);
        }
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut h) = self.holders[i].take() {
            let _ = h.child.kill();
            let _ = h.child.wait();
        }
    }

    /// Asks every holder to stop (closing its stdin), and waits for them.
    fn stop_all(&mut self) {
        for h in self.holders.iter_mut().flatten() {
            h.stdin.take();
        }
        for slot in &mut self.holders {
            if let Some(mut h) = slot.take() {
                let deadline = Instant::now() + Duration::from_secs(15);
                while Instant::now() < deadline {
                    if let Ok(Some(_)) = h.child.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = h.child.kill();
                let _ = h.child.wait();
            }
        }
    }
}

/// The lock server a run uses.
enum Server {
    Redis(support::RedisServer),
    Zk(support::ZkServer),
    Pg(support::PgServer),
    /// Independent nodes, and the one restarted next.
    Redlock(Vec<support::RedisServer>, usize),
}

/// Nodes of a Redlock run.
const REDLOCK_NODES: usize = 5;

impl Server {
    fn ports(&self) -> Vec<u16> {
        match self {
            Server::Redis(s) => vec![s.port()],
            Server::Zk(s) => vec![s.port()],
            Server::Pg(s) => vec![s.port()],
            Server::Redlock(nodes, _) => nodes.iter().map(support::RedisServer::port).collect(),
        }
    }

    fn restart(&mut self) {
        let pause = || std::thread::sleep(Duration::from_millis(100));
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
        }
    }
}

fn run_processes(args: &Args) -> (Counts, Vec<String>) {
    let mut server = match args.backend.as_str() {
        "redis" => Server::Redis(support::RedisServer::start()),
        "postgres" => Server::Pg(support::PgServer::start()),
        "redlock" => Server::Redlock(
            (0..REDLOCK_NODES)
                .map(|_| support::RedisServer::start())
                .collect(),
            0,
        ),
        _ => Server::Zk(support::ZkServer::start()),
    };
    let resource = support::RedisServer::start();
    let ns = format!("chaos{}", std::process::id());
    let mut fleet = Fleet {
        backend: args.backend.clone(),
        primitive: args.primitive.clone(),
        trace: args.trace,
        exe: std::env::current_exe().expect("own path"),
        resource_url: resource.url(),
        ns: ns.clone(),
        holders: (0..HOLDERS).map(|_| None).collect(),
        proxies: (0..HOLDERS)
            .map(|_| {
                server
                    .ports()
                    .into_iter()
                    .map(support::proxy::Proxy::start)
                    .collect()
            })
            .collect(),
        log: Arc::default(),
        spawned: 0,
    };
    for i in 0..HOLDERS {
        fleet.spawn(i);
    }
    let mut counts = Counts::default();
    let mut kinds: Vec<&'static str> =
        vec!["stop", "kill", "kill2", "restart", "blackhole", "reset"];
    if args.backend == "zookeeper" {
        kinds.push("expire");
    }
    if args.backend == "redlock" {
        kinds.push("node");
    }
    counts.faults = inject_faults(args, &kinds, |kind, i| match kind {
        "stop" => {
            let from = wall_ns();
            fleet.signal(i, nix::sys::signal::Signal::SIGSTOP);
            std::thread::sleep(TTL + Duration::from_millis(500));
            fleet.signal(i, nix::sys::signal::Signal::SIGCONT);
            let to = wall_ns();
            fleet
                .log
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .stops
                .push((i, from, to));
        }
        "kill" => {
            fleet.kill(i);
            fleet.spawn(i);
        }
        "kill2" => {
            // Two in a row: with one holder at a time, at least one was a queued waiter, and
            // often both (two dead waiters in a row).
            let j = (i + 1) % HOLDERS;
            fleet.kill(i);
            fleet.kill(j);
            fleet.spawn(i);
            fleet.spawn(j);
        }
        "restart" => server.restart(),
        "blackhole" => {
            fleet.proxies[i].iter().for_each(|p| p.blackhole());
            std::thread::sleep(TTL + Duration::from_millis(500));
            fleet.proxies[i].iter().for_each(|p| p.heal());
        }
        "expire" => {
            fleet.proxies[i].iter().for_each(|p| p.blackhole());
            std::thread::sleep(TTL * 2 + Duration::from_millis(500));
            fleet.proxies[i].iter().for_each(|p| p.heal());
        }
        "node" => {
            // Node `i` silent for every holder past the lease: a majority still answers.
            fleet.proxies.iter().for_each(|p| p[i].blackhole());
            std::thread::sleep(TTL + Duration::from_millis(500));
            fleet.proxies.iter().for_each(|p| p[i].heal());
        }
        _ => {
            fleet.proxies[i].iter().for_each(|p| p.cut());
            std::thread::sleep(Duration::from_millis(50));
            fleet.proxies[i].iter().for_each(|p| p.pass());
        }
    });
    // Faults stop: every holder must get the lock (and write) within 3×TTL, and the lock
    // server's command rate must stay that of a lock, not of waiters polling.
    let calm = Instant::now();
    let commands_before = commands_processed(&args.backend, &server.ports());
    std::thread::sleep(TTL * 3);
    let commands = commands_processed(&args.backend, &server.ports())
        .zip(commands_before)
        .map(|(after, before)| after.saturating_sub(before));
    let mut problems = stalled(&fleet.log.lock().unwrap_or_else(|p| p.into_inner()), calm);
    if let Some(commands) = commands {
        let grants = granted_since(&fleet.log.lock().unwrap_or_else(|p| p.into_inner()), calm);
        let per_grant = commands / grants.max(1);
        println!("chaos calm: {grants} grants, {commands} server commands ({per_grant} a grant)");
        if per_grant > MAX_COMMANDS_PER_GRANT {
            problems.push(format!(
                "{commands} server commands for {grants} grants after the faults stopped: someone polls"
            ));
        }
    }
    fleet.stop_all();
    // Locks and queue entries of holders that stopped cleanly are gone; those of killed ones
    // go with their lease (Redis, PostgreSQL) or session (ZooKeeper).
    std::thread::sleep(TTL * 2 + Duration::from_millis(500));
    let left: Vec<String> = server
        .ports()
        .into_iter()
        .flat_map(|port| leftovers(&args.backend, port, &ns))
        .collect();
    if !left.is_empty() {
        problems.push(format!("left behind: {left:?}"));
    }
    let log = std::mem::take(&mut *fleet.log.lock().unwrap_or_else(|p| p.into_inner()));
    judge(&log, &resource_log(&resource.url()), &mut counts);
    counts.faults.insert("spawned", fleet.spawned);
    (counts, problems)
}

/// The tokens of the writes the resource accepted, in its order.
fn resource_log(url: &str) -> Vec<u64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut conn = redis::Client::open(url)
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("resource connection");
        let entries: Vec<String> = redis::cmd("LRANGE")
            .arg("chaos:log")
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        entries
            .iter()
            .filter_map(|e| e.split(' ').next()?.parse().ok())
            .collect()
    })
}

/// Keys (other than fence counters), znodes or live claim rows left in the namespace.
fn leftovers(backend: &str, port: u16, ns: &str) -> Vec<String> {
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

/// Injects faults for `args.secs`, one at a time, a random pause apart, every kind in turn in
/// a random order, each on a random holder (`apply(kind, holder)` does it, and returns when
/// it is over). Returns how many of each kind.
fn inject_faults(
    args: &Args,
    kinds: &[&'static str],
    mut apply: impl FnMut(&'static str, usize),
) -> HashMap<&'static str, u64> {
    let mut rng = Rng(args.seed);
    let mut done: HashMap<&'static str, u64> = HashMap::new();
    let mut deck: Vec<&'static str> = Vec::new();
    let end = Instant::now() + Duration::from_secs(args.secs);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(300 + rng.below(900)));
        if deck.is_empty() {
            deck = kinds.to_vec();
        }
        let kind = deck.swap_remove(rng.below(deck.len() as u64) as usize);
        let i = rng.below(HOLDERS as u64) as usize;
        *done.entry(kind).or_default() += 1;
        apply(kind, i);
    }
    done
}

/// What a grant may cost the lock server in commands, all told, while holders contend: an
/// acquire, a subscription's share, renewals of the holder and its waiters, a release, and
/// every command those scripts run inside (Redis counts them too): about 20 for a mutex and
/// 50 for a read-write lock or semaphore in these runs. A waiter re-checking every
/// millisecond costs thousands.
const MAX_COMMANDS_PER_GRANT: u64 = 200;

/// The commands the Redis servers at `ports` have processed (Redis and Redlock only).
fn commands_processed(backend: &str, ports: &[u16]) -> Option<u64> {
    if !matches!(backend, "redis" | "redlock") {
        return None;
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

/// Grants reported since `calm`.
fn granted_since(log: &Log, calm: Instant) -> u64 {
    log.reports
        .iter()
        .filter(|r| matches!(r, Report::Wrote { at, .. } if *at >= calm))
        .count() as u64
}

/// Holders without an accepted write since `calm` (the faults stopped 3×TTL before).
fn stalled(log: &Log, calm: Instant) -> Vec<String> {
    (0..HOLDERS)
        .filter(|&i| {
            !log.reports.iter().any(|r| {
                matches!(r, Report::Wrote { holder, accepted: true, at, .. } if *holder == i && *at >= calm)
            })
        })
        .map(|i| format!("holder {i} made no progress within 3xTTL of the faults stopping"))
        .collect()
}

/// The checker: counts grants and writes, and every violation.
fn judge(log: &Log, accepted_in_order: &[u64], counts: &mut Counts) {
    // The resource's own order of accepted writes: each grant writes once, so every token
    // must be above the one before (an equal one is two grants with one token).
    counts.token_regressions += accepted_in_order
        .windows(2)
        .filter(|w| w[1] <= w[0])
        .count() as u64;
    let mut writes: Vec<&Report> = log.reports.iter().collect();
    writes.sort_by_key(|r| match r {
        Report::Wrote { write_ns, .. } => *write_ns,
        Report::SkippedLost => 0,
    });
    for r in writes {
        counts.grants += 1;
        match r {
            Report::SkippedLost => counts.skipped_lost += 1,
            Report::Wrote {
                holder,
                token,
                accepted,
                check_ns,
                write_ns,
                ..
            } => {
                if *accepted {
                    counts.accepted += 1;
                    let _ = token;
                } else {
                    let stopped = log
                        .stops
                        .iter()
                        .any(|(h, from, to)| h == holder && *from <= *write_ns && *to >= *check_ns);
                    if stopped {
                        counts.stopped_between += 1;
                    } else {
                        counts.stale_believed += 1;
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Memory: holders are threads, each with its own runtime (where its client renews).

/// What the driver can do to a memory holder.
#[derive(Default)]
struct Knobs {
    /// Block the holder's thread (its runtime, renewals included) this many ms between its
    /// next check and write: the SIGSTOP analogue.
    pause_ms: AtomicU64,
    /// Drop the holder's loop wherever it is, and start over with a new client.
    kill: tokio::sync::Notify,
    quit: std::sync::atomic::AtomicBool,
}

/// The in-process resource: the highest token seen, and the accepted ones in order.
type Resource = Arc<StdMutex<(u64, Vec<u64>)>>;

async fn memory_holder_loop(
    i: usize,
    client: &LockClient,
    knobs: &Knobs,
    resource: &Resource,
    log: &StdMutex<Log>,
) {
    loop {
        let Ok(guard) = client
            .mutex("chaos")
            .lock_timeout(Duration::from_secs(10))
            .await
        else {
            continue;
        };
        if guard.is_lost() {
            log.lock()
                .unwrap_or_else(|p| p.into_inner())
                .reports
                .push(Report::SkippedLost);
            continue;
        }
        let check_ns = wall_ns();
        let pause = knobs.pause_ms.swap(0, Ordering::AcqRel);
        if pause > 0 {
            std::thread::sleep(Duration::from_millis(pause));
            let to = wall_ns();
            log.lock()
                .unwrap_or_else(|p| p.into_inner())
                .stops
                .push((i, check_ns, to));
        }
        let token = guard.fencing_token();
        let accepted = {
            let mut r = resource.lock().unwrap_or_else(|p| p.into_inner());
            let ok = token >= r.0;
            if ok {
                r.0 = token;
                r.1.push(token);
            }
            ok
        };
        let write_ns = wall_ns();
        log.lock()
            .unwrap_or_else(|p| p.into_inner())
            .reports
            .push(Report::Wrote {
                holder: i,
                token,
                accepted,
                check_ns,
                write_ns,
                at: Instant::now(),
            });
        tokio::time::sleep(HOLD).await;
        drop(guard);
    }
}

fn run_memory(args: &Args) -> (Counts, Vec<String>) {
    let backend = distlock::backend::MemoryBackend::new();
    let resource: Resource = Arc::default();
    let log: Arc<StdMutex<Log>> = Arc::default();
    let knobs: Arc<Vec<Knobs>> = Arc::new((0..HOLDERS).map(|_| Knobs::default()).collect());
    let threads: Vec<_> = (0..HOLDERS)
        .map(|i| {
            let (backend, resource, log, knobs) = (
                backend.clone(),
                resource.clone(),
                log.clone(),
                knobs.clone(),
            );
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async {
                    while !knobs[i].quit.load(Ordering::Acquire) {
                        let client = LockClient::builder(backend.clone())
                            .ttl(TTL)
                            .build()
                            .expect("client");
                        tokio::select! {
                            () = memory_holder_loop(i, &client, &knobs[i], &resource, &log) => {}
                            () = knobs[i].kill.notified() => {}
                        }
                        // The dropped loop's guard or claim is released in the background.
                        drop(client);
                        tokio::task::yield_now().await;
                    }
                });
            })
        })
        .collect();
    let faults = inject_faults(args, &["stop", "kill"], |kind, i| match kind {
        "stop" => {
            let pause = TTL + Duration::from_millis(500);
            knobs[i]
                .pause_ms
                .store(pause.as_millis() as u64, Ordering::Release);
            // One fault at a time, as with processes: wait the pause out.
            std::thread::sleep(pause);
        }
        _ => knobs[i].kill.notify_one(),
    });
    let mut counts = Counts {
        faults,
        ..Counts::default()
    };
    let calm = Instant::now();
    std::thread::sleep(TTL * 3 + Duration::from_millis(500));
    let mut problems = Vec::new();
    for k in knobs.iter() {
        k.quit.store(true, Ordering::Release);
        k.kill.notify_one();
    }
    for t in threads {
        let _ = t.join();
    }
    let log = std::mem::take(&mut *log.lock().unwrap_or_else(|p| p.into_inner()));
    problems.extend(stalled(&log, calm));
    // Every client is gone: released claims are gone, dropped ones expire with their lease.
    std::thread::sleep(TTL + Duration::from_millis(500));
    let stats = backend.stats();
    if stats.holders + stats.waiters > 0 {
        problems.push(format!("left behind: {stats:?}"));
    }
    let accepted = std::mem::take(&mut resource.lock().unwrap_or_else(|p| p.into_inner()).1);
    judge(&log, &accepted, &mut counts);
    (counts, problems)
}

fn main() {
    let args = parse_args();
    if let Some(holder) = args.holder {
        if args.trace {
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .with_writer(std::io::sink)
                .init();
        }
        holder_main(holder, &args.backend, &args.primitive);
        return;
    }
    assert!(
        !(args.backend == "redlock" && args.primitive == "permit"),
        "Redlock has no semaphores: --primitive permit runs on redis, zookeeper or postgres"
    );
    let started = Instant::now();
    let (counts, problems) = match args.backend.as_str() {
        "memory" => run_memory(&args),
        "redis" | "zookeeper" | "postgres" | "redlock" => run_processes(&args),
        other => panic!("unknown --backend {other}; memory, redis, redlock, zookeeper or postgres"),
    };
    let violations = counts.stale_believed + counts.token_regressions + problems.len() as u64;
    let mut faults: Vec<String> = counts
        .faults
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    faults.sort();
    println!(
        "chaos backend={} primitive={} trace={} secs={} seed={} grants={} writes_accepted={} skipped_lost={} \
         stale_while_believed={} stopped_between_check_and_write={} token_regressions={} \
         faults[{}] violations={}",
        args.backend,
        args.primitive,
        args.trace,
        started.elapsed().as_secs(),
        args.seed,
        counts.grants,
        counts.accepted,
        counts.skipped_lost,
        counts.stale_believed,
        counts.stopped_between,
        counts.token_regressions,
        faults.join(" "),
        violations
    );
    for p in &problems {
        println!("chaos problem: {p}");
    }
    let _ = std::io::stdout().flush();
    if violations > 0 {
        std::process::exit(1);
    }
}
