//! The contention workload: W workers, each with its own client, take one key for `cs_ms`
//! milliseconds, over and over, for a fixed time. Prints the standard line (DESIGN.md,
//! Evidence) per run so runs compare side by side:
//!
//! `<impl> workers=W cs_ms=C acq_per_s=… p50_ms=… p99_ms=… max_ms=… fairness_min_over_max=… server_ops_per_acq=… overlaps=0`
//!
//! Run: `cargo bench -p distlock-bench --bench contention [-- --workers 8 --cs-ms 1 --secs 5 --impl memory,redis,rslock --lock mutex,rwlock,semaphore --rounds 5]`.
//! `--rounds R` runs everything R times, the impls taking turns, and ends with the median round
//! of each impl and configuration (this machine's speed drifts between runs).
//! `--shape web` runs the web-service shape instead (issue 29; see `mod web` below): one client
//! shared by `--tasks T` tasks (list, default 1,16,64,256), each locking a random key out of
//! `--keys K` (default 100000) and releasing it at once, distlock beside one shared rslock
//! `LockManager`, with the server's CPU and commands per acquisition; it draws
//! `benches/web-service.svg` (`--svg PATH`, `--svg -` for none). `--threads N` sets the
//! runtime's worker threads (default: one per core).
//! `--workers`, `--cs-ms`, `--impl` and `--lock` take comma-separated lists. `--lock` picks the
//! primitive on memory and Redis: `mutex` (default), `rwlock` (one write in ten, the rest
//! reads; label `-rwlock90`), `semaphore` (4 permits, one each; label `-semaphore4`) or
//! `election` (campaign, read the leader, resign: the turnover of leaders; label
//! `-election`; memory, Redis, Redlock, PostgreSQL and ZooKeeper). Redis runs start their own
//! `redis-server` on a free loopback port (tests/support), shared by `redis` and `rslock`
//! (`redis-evalsha`: the same server, as a user not allowed functions, so our scripts go by
//! EVALSHA as before Redis 7);
//! ZooKeeper runs start a standalone ZooKeeper, shared by `zookeeper` and `curator` (Apache
//! Curator 5's `InterProcessMutex` in a JVM, `tests/java/CuratorBench.java`, same workload);
//! `zookeeper-ensemble` and `curator-ensemble` run the same on a three-server ensemble on
//! loopback (clients spread over its members), started once and shared by both. `postgres`
//! starts a PostgreSQL (fsync off, as in the tests; commits still wait for their WAL write).
//!
//! `server_ops_per_acq` is the INFO `total_commands_processed` delta per acquisition, which
//! counts the calls a Lua script makes inside the server too; a second line, starting with `#`,
//! gives the round trips (top-level commands), the server's CPU time (INFO `used_cpu_*`) and
//! the bytes it wrote to clients (INFO `total_net_output_bytes`) per acquisition. For ZooKeeper
//! it is the `mntr` `zk_packets_received` delta per acquisition; for PostgreSQL, transactions
//! per acquisition (`pg_stat_database`): every distlock call is one transaction in one round
//! trip, renewals included.

#[path = "../tests/support/mod.rs"]
#[allow(unused_macros)]
mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::backend::MemoryBackend;
use distlock::LockClient;

struct Args {
    workers: Vec<usize>,
    cs_ms: Vec<f64>,
    secs: f64,
    /// Every impl runs every configuration this many times, the impls taking turns; with more
    /// than one, a summary gives the median round of each.
    rounds: usize,
    impls: Vec<String>,
    /// `--web-only distlock|rslock`: the web shape for one impl alone (to profile it), no
    /// summary.
    web_only: Option<String>,
    locks: Vec<Prim>,
    /// `--shape web`: the web-service shape (one client shared by `tasks`, random keys).
    web: bool,
    /// Web shape: how many tasks share the one client (`--tasks 1,16,64,256`).
    tasks: Vec<usize>,
    /// Web shape: how many keys the tasks pick from at random (`--keys 100000`).
    keys: usize,
    /// Runtime worker threads (`--threads`); the runtime's default (one per core) if absent.
    threads: Option<usize>,
    /// Web shape: where the chart goes (`--svg PATH`, `--svg -` for none).
    svg: Option<std::path::PathBuf>,
    /// Web shape: lock every key once before the rounds (`--cold` to skip), so each run finds
    /// the same server state (see `web::warm`).
    warm: bool,
}

/// The primitive a run exercises (`--lock mutex,rwlock,semaphore`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Prim {
    Mutex,
    /// A read-write lock, one write in ten.
    RwLock,
    /// A semaphore of this many permits, one permit per acquisition.
    Semaphore(u32),
    /// An election: campaign, read the leader, resign.
    Election,
}

impl Prim {
    fn label(self) -> String {
        match self {
            Prim::Mutex => String::new(),
            Prim::RwLock => "-rwlock90".into(),
            Prim::Semaphore(n) => format!("-semaphore{n}"),
            Prim::Election => "-election".into(),
        }
    }
}

fn parse_args() -> Args {
    let mut args = Args {
        workers: vec![1, 8],
        cs_ms: vec![0.0, 1.0],
        secs: 3.0,
        rounds: 1,
        impls: vec!["memory".into()],
        web_only: None,
        locks: vec![Prim::Mutex],
        web: false,
        tasks: vec![1, 16, 64, 256],
        keys: 100_000,
        threads: None,
        svg: Some(concat!(env!("CARGO_MANIFEST_DIR"), "/web-service.svg").into()),
        warm: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_default();
        match flag.as_str() {
            "--workers" => {
                args.workers = value().split(',').filter_map(|s| s.parse().ok()).collect()
            }
            "--cs-ms" => args.cs_ms = value().split(',').filter_map(|s| s.parse().ok()).collect(),
            "--secs" => args.secs = value().parse().unwrap_or(args.secs),
            "--rounds" => args.rounds = value().parse().unwrap_or(args.rounds).max(1),
            "--impl" => args.impls = value().split(',').map(str::to_owned).collect(),
            "--shape" => match value().as_str() {
                "web" => args.web = true,
                "contention" => args.web = false,
                other => eprintln!("unknown --shape {other}; known: contention, web"),
            },
            "--web-only" => args.web_only = Some(value()),
            "--tasks" => args.tasks = value().split(',').filter_map(|s| s.parse().ok()).collect(),
            "--keys" => args.keys = value().parse().unwrap_or(args.keys).max(1),
            "--cold" => args.warm = false,
            "--threads" => args.threads = value().parse().ok().filter(|&n: &usize| n > 0),
            "--svg" => {
                let path = value();
                args.svg = (path != "-").then(|| path.into());
            }
            "--lock" => {
                args.locks = value()
                    .split(',')
                    .filter_map(|s| match s {
                        "mutex" => Some(Prim::Mutex),
                        "rwlock" => Some(Prim::RwLock),
                        "semaphore" => Some(Prim::Semaphore(4)),
                        "election" => Some(Prim::Election),
                        other => {
                            eprintln!(
                                "unknown --lock {other}; known: mutex, rwlock, semaphore, election"
                            );
                            None
                        }
                    })
                    .collect()
            }
            // `cargo bench` passes `--bench`; ignore what we do not know.
            _ => {}
        }
    }
    args
}

/// What one run measured.
struct Outcome {
    waits: Vec<Duration>,
    per_worker: Vec<usize>,
    overlaps: usize,
    elapsed: Duration,
}

/// One worker's lock: distlock on any backend (as some primitive), or rslock.
enum Locker {
    Distlock(LockClient, Prim),
    #[cfg(feature = "redis")]
    Rslock(rslock::LockManager),
}

/// How one acquisition holds the key.
#[derive(Clone, Copy)]
enum Hold {
    Exclusive,
    Read,
    Permit(u32),
}

/// Who is inside the critical section; an entry that breaks the primitive's rule counts.
#[derive(Default)]
struct Inside {
    exclusive: AtomicUsize,
    shared: AtomicUsize,
    overlaps: AtomicUsize,
}

impl Inside {
    fn enter(&self, hold: Hold) {
        let broken = match hold {
            Hold::Exclusive => {
                self.exclusive.fetch_add(1, Ordering::SeqCst) != 0
                    || self.shared.load(Ordering::SeqCst) != 0
            }
            Hold::Read => {
                self.shared.fetch_add(1, Ordering::SeqCst);
                self.exclusive.load(Ordering::SeqCst) != 0
            }
            Hold::Permit(max) => self.shared.fetch_add(1, Ordering::SeqCst) >= max as usize,
        };
        if broken {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn exit(&self, hold: Hold) {
        match hold {
            Hold::Exclusive => self.exclusive.fetch_sub(1, Ordering::SeqCst),
            Hold::Read | Hold::Permit(_) => self.shared.fetch_sub(1, Ordering::SeqCst),
        };
    }
}

impl Locker {
    /// How acquisition number `i` of worker `w` holds the key.
    fn hold(&self, w: usize, i: usize) -> Hold {
        match self {
            Self::Distlock(_, Prim::RwLock) if !(w + i).is_multiple_of(10) => Hold::Read,
            Self::Distlock(_, Prim::Semaphore(n)) => Hold::Permit(*n),
            _ => Hold::Exclusive,
        }
    }

    /// Takes the lock, runs `section`, releases it; returns how long the lock took.
    async fn cycle(
        &self,
        key: &str,
        hold: Hold,
        section: impl std::future::Future<Output = ()> + Send,
    ) -> Duration {
        let asked = Instant::now();
        match self {
            Self::Distlock(client, prim) => {
                // Take, hold for the section, release: the same steps for every primitive.
                macro_rules! cycle {
                    ($take:expr) => {{
                        let guard = $take.await.expect("acquire");
                        let waited = asked.elapsed();
                        section.await;
                        guard.release().await.expect("release");
                        waited
                    }};
                }
                match (prim, hold) {
                    (Prim::RwLock, Hold::Read) => cycle!(client.rw_lock(key).read()),
                    (Prim::RwLock, _) => cycle!(client.rw_lock(key).write()),
                    (Prim::Semaphore(n), _) => cycle!(client.semaphore(key, *n).acquire()),
                    (Prim::Mutex, _) => cycle!(client.mutex(key).lock()),
                    (Prim::Election, _) => {
                        let election = client.election(key);
                        let leading = election.campaign("bench").await.expect("campaign");
                        let waited = asked.elapsed();
                        let leader = election.leader().await.expect("leader");
                        assert_eq!(leader.map(|l| l.term()), Some(leading.term()));
                        section.await;
                        leading.resign().await.expect("resign");
                        waited
                    }
                }
            }
            #[cfg(feature = "redis")]
            Self::Rslock(manager) => {
                let lock = manager
                    .acquire_no_guard(key, Duration::from_secs(30))
                    .await
                    .expect("rslock");
                let waited = asked.elapsed();
                section.await;
                manager.unlock(&lock).await;
                waited
            }
        }
    }

    async fn close(self) {
        if let Self::Distlock(client, _) = self {
            client.shutdown().await;
        }
    }
}

/// The key of a one-key run.
const KEY: &str = "bench:contention";

/// Runs the workers, one client each, on one key for `secs`.
async fn contend(lockers: Vec<Locker>, cs: Duration, secs: f64) -> Outcome {
    contend_on(lockers, &[KEY.to_owned()], cs, secs).await
}

/// Runs the workers, one client each, for `secs`; worker `w` takes `keys[w % keys.len()]`.
async fn contend_on(lockers: Vec<Locker>, keys: &[String], cs: Duration, secs: f64) -> Outcome {
    let stop = Arc::new(AtomicBool::new(false));
    let insides: Arc<Vec<Inside>> = Arc::new(keys.iter().map(|_| Inside::default()).collect());
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (w, locker) in lockers.into_iter().enumerate() {
        let (stop, insides) = (stop.clone(), insides.clone());
        let key = keys[w % keys.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut waits = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let hold = locker.hold(w, i);
                i += 1;
                let inside = &insides[w % insides.len()];
                let waited = locker
                    .cycle(&key, hold, async move {
                        inside.enter(hold);
                        if cs.is_zero() {
                            tokio::task::yield_now().await;
                        } else {
                            busy_or_sleep(cs).await;
                        }
                        inside.exit(hold);
                    })
                    .await;
                waits.push(waited);
            }
            locker.close().await;
            waits
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut waits = Vec::new();
    let mut per_worker = Vec::new();
    for t in tasks {
        let w = t.await.expect("worker");
        per_worker.push(w.len());
        waits.extend(w);
    }
    Outcome {
        waits,
        per_worker,
        overlaps: insides
            .iter()
            .map(|i| i.overlaps.load(Ordering::SeqCst))
            .sum(),
        elapsed: start.elapsed(),
    }
}

/// Holds for `cs` precisely on a blocking-pool thread: the tokio timer rounds a 1 ms sleep up to
/// about 2 ms and `thread::sleep` overshoots by the kernel's timer slack, so sleep until shortly
/// before the end and spin the rest.
async fn busy_or_sleep(cs: Duration) {
    const SPIN: Duration = Duration::from_micros(150);
    tokio::task::spawn_blocking(move || {
        let until = Instant::now() + cs;
        if let Some(nap) = cs.checked_sub(SPIN) {
            std::thread::sleep(nap);
        }
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    })
    .await
    .expect("section");
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn report(name: &str, workers: usize, cs_ms: f64, mut o: Outcome, ops: Option<Ops>) {
    o.waits.sort();
    let total = o.waits.len();
    let min = o.per_worker.iter().copied().min().unwrap_or(0) as f64;
    let max = o.per_worker.iter().copied().max().unwrap_or(0).max(1) as f64;
    let per_acq = |n: u64| n as f64 / total.max(1) as f64;
    let ops_field = ops.map_or_else(|| "n/a".to_string(), |o| format!("{:.2}", per_acq(o.total)));
    let line = format!(
        "{name} workers={workers} cs_ms={cs_ms} acq_per_s={:.0} p50_ms={:.3} p99_ms={:.3} max_ms={:.3} fairness_min_over_max={:.2} server_ops_per_acq={ops_field} overlaps={}",
        total as f64 / o.elapsed.as_secs_f64(),
        percentile(&o.waits, 0.50),
        percentile(&o.waits, 0.99),
        o.waits.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
        min / max,
        o.overlaps,
    );
    print_line(line);
    if let Some(o) = ops.filter(|o| o.top_level.is_some()) {
        // rslock's lock is a top-level SET; ours happen inside scripts.
        let sets = if name.starts_with("rslock") {
            o.sets
        } else {
            0
        };
        println!(
            "# {name} workers={workers} cs_ms={cs_ms} round_trips_per_acq={:.2} server_cpu_us_per_acq={:.1} out_bytes_per_acq={:.0} (round trips: top-level commands; server_ops counts script-internal calls too)",
            per_acq(o.top_level.unwrap_or(0) + sets),
            o.cpu_us / total.max(1) as f64,
            per_acq(o.out_bytes),
        );
    }
}

/// Every standard line printed so far, for the summary of several rounds.
static LINES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn print_line(line: String) {
    println!("{line}");
    LINES.lock().unwrap_or_else(|p| p.into_inner()).push(line);
}

/// With several rounds: for each impl and configuration (in the order first run), the line of
/// its median round by `acq_per_s`, and the spread over the rounds.
fn summarize(rounds: usize) {
    if rounds < 2 {
        return;
    }
    let lines = LINES.lock().unwrap_or_else(|p| p.into_inner());
    let field = |line: &str, name: &str| -> Option<String> {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{name}=")).map(str::to_owned))
    };
    let config = |line: &str| {
        let impl_name = line
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned();
        (impl_name, field(line, "workers"), field(line, "cs_ms"))
    };
    let mut order = Vec::new();
    for line in lines.iter() {
        let c = config(line);
        if !order.contains(&c) {
            order.push(c);
        }
    }
    println!("# median of {rounds} rounds (impls taking turns), with min..max acq_per_s:");
    for c in order {
        let mut runs: Vec<(f64, &String)> = lines
            .iter()
            .filter(|l| config(l) == c)
            .map(|l| {
                let rate = field(l, "acq_per_s")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0);
                (rate, l)
            })
            .collect();
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (lo, hi) = (runs[0].0, runs[runs.len() - 1].0);
        println!("{} (rounds {lo:.0}..{hi:.0})", runs[runs.len() / 2].1);
    }
}

/// Server-side request counts over a run.
#[derive(Clone, Copy, Default)]
struct Ops {
    /// Redis: INFO `total_commands_processed`, script-internal calls included. ZooKeeper:
    /// `mntr` `zk_packets_received` (pings included). PostgreSQL: transactions (one per call,
    /// renewals included).
    total: u64,
    /// Redis only: commands only a client sends: scripts and (un)subscribes.
    top_level: Option<u64>,
    /// Redis only: SET calls, top-level for rslock (its lock is a SET NX), inside our scripts
    /// for distlock (a fence counter restarting, or kept at the clock on Cluster/Sentinel).
    sets: u64,
    /// Redis only: CPU time the server used (INFO `used_cpu_sys` + `used_cpu_user`), in µs.
    cpu_us: f64,
    /// Redis only: bytes the server wrote to clients (INFO `total_net_output_bytes`), replies
    /// and pub/sub messages alike.
    out_bytes: u64,
}

impl Ops {
    fn since(self, before: Ops) -> Ops {
        Ops {
            total: self.total - before.total,
            top_level: self.top_level.zip(before.top_level).map(|(a, b)| a - b),
            sets: self.sets - before.sets,
            cpu_us: self.cpu_us - before.cpu_us,
            out_bytes: self.out_bytes - before.out_bytes,
        }
    }
}

#[cfg(feature = "redis")]
async fn server_ops(url: &str) -> Ops {
    let mut conn = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let stats: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await
        .expect("info");
    let commands: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("info");
    let cpu: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(&mut conn)
        .await
        .expect("info");
    let field = |text: &str, name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let total = field(&stats, "total_commands_processed") as u64;
    let out_bytes = field(&stats, "total_net_output_bytes") as u64;
    let cpu_us = (field(&cpu, "used_cpu_sys") + field(&cpu, "used_cpu_user")) * 1e6;
    let top_level = commands
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            let calls: u64 = rest.split(',').next()?.parse().ok()?;
            matches!(
                name,
                "evalsha"
                    | "eval"
                    | "fcall"
                    | "function|load"
                    | "subscribe"
                    | "unsubscribe"
                    | "ssubscribe"
                    | "sunsubscribe"
                    | "script|load"
            )
            .then_some(calls)
        })
        .sum();
    let sets = commands
        .lines()
        .find_map(|l| {
            l.strip_prefix("cmdstat_set:calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0);
    Ops {
        total,
        top_level: Some(top_level),
        sets,
        cpu_us,
        out_bytes,
    }
}

/// PostgreSQL: transactions committed or rolled back in the database (each distlock call is
/// one), read after every connection of the run closed (a backend reports its counts when it
/// exits).
#[cfg(feature = "postgres")]
async fn pg_transactions(url: &str) -> u64 {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .expect("pg_stat_database");
    // Our own probe is one transaction more; leave it out.
    u64::try_from(row.get::<_, i64>(0))
        .unwrap_or(0)
        .saturating_sub(1)
}

/// Five independent `redis-server`s for the Redlock runs of this process (`redlock3` and
/// `rslock-redlock3` use the first three).
#[cfg(feature = "redis")]
fn redlock_urls(n: usize) -> Vec<String> {
    static NODES: std::sync::OnceLock<Vec<support::RedisServer>> = std::sync::OnceLock::new();
    NODES
        .get_or_init(|| (0..5).map(|_| support::RedisServer::start()).collect())
        .iter()
        .take(n)
        .map(support::RedisServer::url)
        .collect()
}

/// Server work summed over several nodes.
#[cfg(feature = "redis")]
async fn server_ops_all(urls: &[String]) -> Ops {
    let mut sum = Ops {
        top_level: Some(0),
        ..Ops::default()
    };
    for url in urls {
        let ops = server_ops(url).await;
        sum.total += ops.total;
        sum.top_level = sum.top_level.zip(ops.top_level).map(|(a, b)| a + b);
        sum.sets += ops.sets;
        sum.cpu_us += ops.cpu_us;
        sum.out_bytes += ops.out_bytes;
    }
    sum
}

/// The Cluster of this process's `redis-cluster` runs (started once): its URL, `n` keys over
/// its shards (every shard before any twice), and its primaries' URLs.
#[cfg(feature = "redis-cluster")]
fn cluster_setup(n: usize) -> (String, Vec<String>, Vec<String>) {
    let cluster = support::cluster::shared_cluster();
    let mut keys: Vec<(usize, String)> = Vec::new();
    for i in 0.. {
        if keys.len() == n {
            break;
        }
        let key = format!("bench:contention:{i}");
        let shard = cluster.primary_for(&key, 0);
        let fresh = !keys.iter().any(|(s, _)| *s == shard);
        let shards = keys
            .iter()
            .map(|(s, _)| *s)
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        if fresh || shards == 3 {
            keys.push((shard, key));
        }
    }
    (
        cluster.url(),
        keys.into_iter().map(|(_, k)| k).collect(),
        cluster
            .primaries()
            .into_iter()
            .map(|i| cluster.nodes[i].url())
            .collect(),
    )
}

/// The same server for a user that may not call or load functions: our scripts go by EVALSHA
/// (`redis-evalsha`), as on a server before Redis 7.
#[cfg(feature = "redis")]
async fn evalsha_url() -> String {
    let server = support::shared_redis();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("evalsha")
        .arg("on")
        .arg(">bench")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-fcall")
        .arg("-fcall_ro")
        .arg("-function")
        .query_async(&mut support::redis::connection(&server.url()).await)
        .await
        .expect("acl setuser");
    format!("redis://evalsha:bench@127.0.0.1:{}/", server.port())
}

/// One `redis-server` for every Redis run of this process.
#[cfg(feature = "redis")]
fn redis_url() -> String {
    support::shared_redis().url()
}

/// The ZooKeeper a `zookeeper*` or `curator*` run uses: the standalone server, or the
/// ensemble for the `-ensemble` names.
#[cfg(feature = "zookeeper")]
enum Zk {
    Standalone(&'static support::ZkServer),
    Ensemble(&'static support::ensemble::ZkEnsemble),
}

#[cfg(feature = "zookeeper")]
impl Zk {
    fn named(name: &str) -> Self {
        if name.ends_with("-ensemble") {
            Zk::Ensemble(support::ensemble::shared_ensemble())
        } else {
            Zk::Standalone(support::shared_zookeeper())
        }
    }

    fn connect_string(&self) -> String {
        match self {
            Zk::Standalone(s) => s.connect_string(),
            Zk::Ensemble(e) => e.connect_string(),
        }
    }

    /// Requests received, pings included, over every server.
    fn packets(&self) -> u64 {
        match self {
            Zk::Standalone(s) => s.packets_received(),
            Zk::Ensemble(e) => e.packets_received(),
        }
    }
}

fn main() {
    let args = parse_args();
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.threads {
        rt.worker_threads(n);
    }
    let rt = rt.enable_all().build().expect("runtime");
    if args.web {
        #[cfg(feature = "redis")]
        rt.block_on(web::run(&args));
        #[cfg(not(feature = "redis"))]
        eprintln!("--shape web needs the `redis` feature");
        return;
    }
    rt.block_on(async {
        for name in std::iter::repeat_n(&args.impls, args.rounds).flatten() {
            // rslock and the Curator workload are mutexes only; Redlock has mutexes and
            // elections here.
            let prims: Vec<Prim> = match name.as_str() {
                "rslock" | "rslock-redlock3" | "rslock-redlock5" | "curator" | "curator-ensemble" => {
                    vec![Prim::Mutex]
                }
                "redlock3" | "redlock5" => args
                    .locks
                    .iter()
                    .copied()
                    .filter(|p| matches!(p, Prim::Mutex | Prim::Election))
                    .collect(),
                _ => args.locks.clone(),
            };
            for &prim in &prims {
            for &workers in &args.workers {
                for &cs_ms in &args.cs_ms {
                    let cs = Duration::from_secs_f64(cs_ms / 1e3);
                    match name.as_str() {
                        "memory" => {
                            let backend = MemoryBackend::new();
                            let lockers = (0..workers)
                                .map(|_| {
                                    Locker::Distlock(
                                        LockClient::builder(backend.clone())
                                            .build()
                                            .expect("client"),
                                        prim,
                                    )
                                })
                                .collect();
                            let outcome = contend(lockers, cs, args.secs).await;
                            let label = format!("distlock-memory{}", prim.label());
                            report(&label, workers, cs_ms, outcome, None);
                        }
                        #[cfg(feature = "redis")]
                        "redis" | "redis-evalsha" | "rslock" => {
                            let url = redis_url();
                            let ours = if name == "redis-evalsha" {
                                evalsha_url().await
                            } else {
                                url.clone()
                            };
                            let mut lockers = Vec::new();
                            for _ in 0..workers {
                                lockers.push(if name != "rslock" {
                                    let backend = distlock::backend::RedisBackend::connect(&ours)
                                        .await
                                        .expect("redis backend");
                                    Locker::Distlock(
                                        LockClient::builder(backend).build().expect("client"),
                                        prim,
                                    )
                                } else {
                                    Locker::Rslock(rslock::LockManager::new(vec![url.clone()]))
                                });
                            }
                            let before = server_ops(&url).await;
                            let outcome = contend(lockers, cs, args.secs).await;
                            let ops = server_ops(&url).await.since(before);
                            let label = if name != "rslock" {
                                format!("distlock-{name}{}", prim.label())
                            } else {
                                "rslock".to_owned()
                            };
                            report(&label, workers, cs_ms, outcome, Some(ops));
                        }
                        #[cfg(feature = "redlock")]
                        "redlock3" | "redlock5" | "rslock-redlock3" | "rslock-redlock5" => {
                            let n = if name.ends_with('3') { 3 } else { 5 };
                            let urls = redlock_urls(n);
                            let ours = name.starts_with("redlock");
                            let mut lockers = Vec::new();
                            for _ in 0..workers {
                                lockers.push(if ours {
                                    let backend =
                                        distlock::backend::RedlockBackend::builder(urls.clone())
                                            .rejoin_delay(Duration::ZERO)
                                            .build()
                                            .await
                                            .expect("redlock backend");
                                    Locker::Distlock(
                                        LockClient::builder(backend).build().expect("client"),
                                        prim,
                                    )
                                } else {
                                    Locker::Rslock(rslock::LockManager::new(urls.clone()))
                                });
                            }
                            let before = server_ops_all(&urls).await;
                            let outcome = contend(lockers, cs, args.secs).await;
                            let ops = server_ops_all(&urls).await.since(before);
                            let label = if ours {
                                format!("distlock-{name}{}", prim.label())
                            } else {
                                name.clone()
                            };
                            report(&label, workers, cs_ms, outcome, Some(ops));
                        }
                        #[cfg(feature = "redis-cluster")]
                        "redis-cluster" => {
                            // Four keys over the three shards, `workers` workers on each.
                            let (url, keys, primaries) = cluster_setup(4);
                            let mut lockers = Vec::new();
                            for _ in 0..workers * keys.len() {
                                let client = LockClient::connect(&url).await.expect("cluster");
                                lockers.push(Locker::Distlock(client, prim));
                            }
                            let before = server_ops_all(&primaries).await;
                            let outcome = contend_on(lockers, &keys, cs, args.secs).await;
                            let ops = server_ops_all(&primaries).await.since(before);
                            let label = format!("distlock-redis-cluster-{}keys{}", keys.len(), prim.label());
                            report(&label, workers, cs_ms, outcome, Some(ops));
                        }
                        #[cfg(feature = "postgres")]
                        "postgres" => {
                            let url = support::shared_postgres().url();
                            let mut lockers = Vec::new();
                            for _ in 0..workers {
                                let backend = distlock::backend::PgBackend::connect(&url)
                                    .await
                                    .expect("postgres backend");
                                lockers.push(Locker::Distlock(
                                    LockClient::builder(backend).build().expect("client"),
                                    prim,
                                ));
                            }
                            tokio::time::sleep(Duration::from_millis(1500)).await;
                            let before = pg_transactions(&url).await;
                            let outcome = contend(lockers, cs, args.secs).await;
                            // Every connection closed: their backends report as they exit.
                            tokio::time::sleep(Duration::from_millis(1500)).await;
                            let ops = Ops {
                                total: pg_transactions(&url).await - before,
                                ..Ops::default()
                            };
                            let label = format!("distlock-postgres{}", prim.label());
                            report(&label, workers, cs_ms, outcome, Some(ops));
                        }
                        #[cfg(feature = "zookeeper")]
                        "zookeeper" | "zookeeper-ensemble" => {
                            let zk = Zk::named(name);
                            let mut lockers = Vec::new();
                            for _ in 0..workers {
                                let backend =
                                    distlock::backend::ZkBackend::connect(&zk.connect_string())
                                        .await
                                        .expect("zookeeper backend");
                                let ttl = backend.session_timeout();
                                lockers.push(Locker::Distlock(
                                    LockClient::builder(backend).ttl(ttl).build().expect("client"),
                                    prim,
                                ));
                            }
                            let before = zk.packets();
                            let outcome = contend(lockers, cs, args.secs).await;
                            let ops = Ops {
                                total: zk.packets() - before,
                                ..Ops::default()
                            };
                            let label = format!("distlock-{name}{}", prim.label());
                            report(&label, workers, cs_ms, outcome, Some(ops));
                        }
                        #[cfg(feature = "zookeeper")]
                        "curator" | "curator-ensemble" => {
                            let zk = Zk::named(name);
                            let before = zk.packets();
                            let line = support::curator::bench(&zk.connect_string(), workers, cs_ms, args.secs);
                            let packets = zk.packets() - before;
                            // The Java side counts acquisitions; add the server's figure.
                            let acquisitions: f64 = line
                                .split_whitespace()
                                .find_map(|f| f.strip_prefix("acquisitions="))
                                .and_then(|v| v.parse().ok())
                                .unwrap_or(f64::NAN);
                            let line = line.split(" acquisitions=").next().unwrap_or_default();
                            let line = if name == "curator-ensemble" {
                                line.replacen("curator", "curator-ensemble", 1)
                            } else {
                                line.to_owned()
                            };
                            print_line(line.replace(
                                "server_ops_per_acq=n/a",
                                &format!("server_ops_per_acq={:.2}", packets as f64 / acquisitions),
                            ));
                        }
                        other => eprintln!(
                            "unknown --impl {other}; known: memory, redis, redis-evalsha, rslock, redis-cluster, redlock3, redlock5, rslock-redlock3, rslock-redlock5, zookeeper, curator, zookeeper-ensemble, curator-ensemble, postgres"
                        ),
                    }
                }
            }
            }
        }
        summarize(args.rounds);
    });
}

/// The web-service shape (issue 29): many handlers in one process share one client, each
/// locking its own key with little contention. ONE client (distlock: one `LockClient` on its
/// own Redis connection; rslock: one `LockManager`) is shared by T tasks; each task loops: pick
/// a random key out of K, lock it, release it at once. Both run against the same
/// `redis-server`, taking turns (the order flips every round and every T), and each line carries
/// the server's side of the cost: its CPU time (INFO `used_cpu_sys` + `used_cpu_user`) and the
/// commands it ran (INFO commandstats, which counts the calls a script or function makes too)
/// per acquisition. With `--rounds R`, the summary gives the median of each figure over the
/// rounds, distlock's ratio to rslock (the median of the per-round ratios: both ran back to
/// back on the same machine), the commands per acquisition by name, and draws the chart
/// (`--svg`, default `benches/web-service.svg`).
#[cfg(feature = "redis")]
mod web {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use distlock::LockClient;

    use super::{percentile, support, Args};

    /// The two locks measured, in the order of the summary.
    const IMPLS: [&str; 2] = ["distlock-redis-web", "rslock-web"];

    /// One lock shared by every task.
    #[derive(Clone)]
    enum Shared {
        Distlock(LockClient),
        Rslock(Arc<rslock::LockManager>),
    }

    impl Shared {
        /// Takes `key` and releases it at once; returns how long the lock took.
        async fn cycle(&self, key: &str) -> Duration {
            let asked = Instant::now();
            match self {
                Shared::Distlock(client) => {
                    let guard = client.mutex(key).lock().await.expect("lock");
                    let waited = asked.elapsed();
                    guard.release().await.expect("release");
                    waited
                }
                Shared::Rslock(manager) => {
                    let lock = manager
                        .acquire_no_guard(key, Duration::from_secs(30))
                        .await
                        .expect("rslock");
                    let waited = asked.elapsed();
                    manager.unlock(&lock).await;
                    waited
                }
            }
        }
    }

    /// What the server reports at one moment.
    struct Probe {
        /// `used_cpu_sys` + `used_cpu_user`, µs.
        cpu_us: f64,
        /// commandstats: calls per command (script-internal calls included), our INFO left out.
        calls: BTreeMap<String, u64>,
    }

    async fn probe(conn: &mut redis::aio::MultiplexedConnection) -> Probe {
        let cpu: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(conn)
            .await
            .expect("info cpu");
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await
            .expect("info commandstats");
        let field = |name: &str| -> f64 {
            cpu.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0)
        };
        let calls = stats
            .lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(":calls=")?;
                let calls: u64 = rest.split(',').next()?.parse().ok()?;
                (name != "info").then(|| (name.to_owned(), calls))
            })
            .collect();
        Probe {
            cpu_us: (field("used_cpu_sys") + field("used_cpu_user")) * 1e6,
            calls,
        }
    }

    /// One impl at one T in one round.
    struct Run {
        acq_per_s: f64,
        p50_ms: f64,
        p99_ms: f64,
        cpu_us_per_acq: f64,
        cmds_per_acq: f64,
        /// This process's CPU (user + system, every thread) per acquisition, µs: the client
        /// side's cost, harness included (the same harness for both impls).
        client_cpu_us_per_acq: f64,
        /// The client's write system calls per acquisition.
        client_writes_per_acq: f64,
        acquisitions: u64,
        /// Commands by name over the run.
        calls: BTreeMap<String, u64>,
    }

    /// CPU time this process used so far (user + system, every thread), µs, from /proc.
    fn process_cpu_us() -> f64 {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // After the command name (in parentheses) come the fields from the 3rd (state) on:
        // utime is the 14th, stime the 15th, in clock ticks (100 a second on Linux).
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        (ticks(11) + ticks(12)) * 1e4
    }

    /// This process's write system calls so far (`syscw` in `/proc/self/io`: `write`, `writev`
    /// and the like; each request or batch of requests the client sends is one).
    fn process_writes() -> f64 {
        let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
        io.lines()
            .find_map(|l| l.strip_prefix("syscw:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// A small, fast generator for the keys (splitmix64); no need for a crate.
    fn splitmix(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    async fn measure(name: &str, url: &str, tasks: usize, keys: usize, secs: f64) -> Run {
        let shared = if name.starts_with("rslock") {
            Shared::Rslock(Arc::new(rslock::LockManager::new(vec![url.to_owned()])))
        } else {
            let backend = distlock::backend::RedisBackend::connect(url)
                .await
                .expect("redis backend");
            Shared::Distlock(LockClient::builder(backend).build().expect("client"))
        };
        // Connect, load scripts: none of that is the cost of a lock.
        shared.cycle("web:warm-up").await;
        let mut conn = support::redis::connection(url).await;
        let before = probe(&mut conn).await;
        let client_before = process_cpu_us();
        let writes_before = process_writes();
        let stop = Arc::new(AtomicBool::new(false));
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let start = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|t| {
                let (shared, stop) = (shared.clone(), stop.clone());
                let mut state = seed ^ (t as u64).wrapping_mul(0xA24B_AED4_963E_E407);
                tokio::spawn(async move {
                    let mut waits = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let key = format!("web:{}", splitmix(&mut state) % keys as u64);
                        waits.push(shared.cycle(&key).await);
                    }
                    waits
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        stop.store(true, Ordering::Relaxed);
        let mut waits = Vec::new();
        for h in handles {
            waits.extend(h.await.expect("task"));
        }
        let elapsed = start.elapsed();
        let client_cpu = process_cpu_us() - client_before;
        let client_writes = process_writes() - writes_before;
        let after = probe(&mut conn).await;
        if let Shared::Distlock(client) = shared {
            client.shutdown().await;
        }
        waits.sort();
        let n = waits.len() as u64;
        let calls: BTreeMap<String, u64> = after
            .calls
            .iter()
            .map(|(k, v)| (k.clone(), v - before.calls.get(k).copied().unwrap_or(0)))
            .filter(|(_, v)| *v > 0)
            .collect();
        let per = |x: f64| x / n.max(1) as f64;
        Run {
            acq_per_s: n as f64 / elapsed.as_secs_f64(),
            p50_ms: percentile(&waits, 0.50),
            p99_ms: percentile(&waits, 0.99),
            cpu_us_per_acq: per(after.cpu_us - before.cpu_us),
            cmds_per_acq: per(calls.values().sum::<u64>() as f64),
            client_cpu_us_per_acq: per(client_cpu),
            client_writes_per_acq: per(client_writes),
            acquisitions: n,
            calls,
        }
    }

    /// `set=1.00 evalsha=1.00 …`: commands per acquisition by name, most first.
    fn by_name(calls: &BTreeMap<String, u64>, acquisitions: u64) -> String {
        let mut v: Vec<_> = calls.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        v.iter()
            .map(|(k, c)| format!("{k}={:.2}", **c as f64 / acquisitions.max(1) as f64))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    }

    /// Locks every key once through distlock. A distlock key's fencing counter lives an hour
    /// after its first grant (FENCE_TTL), and a grant on a key without one costs two commands
    /// more (TIME, SET): without this, the first runs of a process would find new keys and the
    /// later ones old keys, and the figures would depend on the order of the runs. With it,
    /// every run sees what a service that locks each of its keys at least once an hour sees.
    /// `--cold` skips it (new keys: what locks on ever-new ids, such as new orders, cost).
    async fn warm(url: &str, keys: usize) {
        let backend = distlock::backend::RedisBackend::connect(url)
            .await
            .expect("redis backend");
        let client = LockClient::builder(backend).build().expect("client");
        let started = Instant::now();
        let lanes = 256.min(keys);
        let handles: Vec<_> = (0..lanes)
            .map(|lane| {
                let client = client.clone();
                tokio::spawn(async move {
                    for k in (lane..keys).step_by(lanes) {
                        let guard = client.mutex(format!("web:{k}")).lock().await.expect("lock");
                        guard.release().await.expect("release");
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.expect("warm-up");
        }
        client.shutdown().await;
        println!(
            "# warm-up: each of the {keys} keys locked once through distlock in {:.1} s (`--cold` skips this)",
            started.elapsed().as_secs_f64()
        );
    }

    pub async fn run(args: &Args) {
        let url = support::shared_redis().url();
        let keys = args.keys;
        if args.warm {
            warm(&url, keys).await;
        }
        // runs[t][impl]: one Run per round.
        let mut runs: Vec<[Vec<Run>; 2]> = args.tasks.iter().map(|_| [vec![], vec![]]).collect();
        for round in 0..args.rounds {
            for (ti, &tasks) in args.tasks.iter().enumerate() {
                let order = if (round + ti) % 2 == 0 {
                    [0, 1]
                } else {
                    [1, 0]
                };
                for i in order {
                    let name = IMPLS[i];
                    if args
                        .web_only
                        .as_ref()
                        .is_some_and(|only| !name.starts_with(only.as_str()))
                    {
                        continue;
                    }
                    let r = measure(name, &url, tasks, keys, args.secs).await;
                    println!(
                        "{name} tasks={tasks} keys={keys} acq_per_s={:.0} p50_ms={:.3} p99_ms={:.3} server_cpu_us_per_acq={:.1} server_cmds_per_acq={:.2} client_cpu_us_per_acq={:.1} client_writes_per_acq={:.2}",
                        r.acq_per_s,
                        r.p50_ms,
                        r.p99_ms,
                        r.cpu_us_per_acq,
                        r.cmds_per_acq,
                        r.client_cpu_us_per_acq,
                        r.client_writes_per_acq
                    );
                    println!(
                        "# {name} tasks={tasks} commands_per_acq: {}",
                        by_name(&r.calls, r.acquisitions)
                    );
                    runs[ti][i].push(r);
                }
            }
        }
        if args.web_only.is_none() {
            summarize(args, &runs);
        }
    }

    /// The median figures of one impl at one T.
    struct Medians {
        acq_per_s: f64,
        p50_ms: f64,
        p99_ms: f64,
        cpu_us_per_acq: f64,
        cmds_per_acq: f64,
        client_cpu_us_per_acq: f64,
    }

    fn medians(runs: &[Run]) -> Medians {
        let m = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
        Medians {
            acq_per_s: m(|r| r.acq_per_s),
            p50_ms: m(|r| r.p50_ms),
            p99_ms: m(|r| r.p99_ms),
            cpu_us_per_acq: m(|r| r.cpu_us_per_acq),
            cmds_per_acq: m(|r| r.cmds_per_acq),
            client_cpu_us_per_acq: m(|r| r.client_cpu_us_per_acq),
        }
    }

    fn summarize(args: &Args, runs: &[[Vec<Run>; 2]]) {
        let keys = args.keys;
        println!(
            "# web shape, median of {} round(s) of {} s (impls taking turns); ratio = distlock / rslock, the median of the per-round ratios:",
            args.rounds, args.secs
        );
        println!("| tasks | impl | acq/s | p50 ms | p99 ms | server CPU µs/acq | commands/acq | client CPU µs/acq |");
        println!("|---:|---|---:|---:|---:|---:|---:|---:|");
        let mut chart = Vec::new();
        for (ti, &tasks) in args.tasks.iter().enumerate() {
            let [ours, theirs] = &runs[ti];
            let (a, b) = (medians(ours), medians(theirs));
            let ratio = |f: fn(&Run) -> f64| {
                median(ours.iter().zip(theirs).map(|(x, y)| f(x) / f(y)).collect())
            };
            for (name, m) in [("distlock", &a), ("rslock", &b)] {
                println!(
                    "| {tasks} | {name} | {:.0} | {:.3} | {:.3} | {:.1} | {:.2} | {:.1} |",
                    m.acq_per_s,
                    m.p50_ms,
                    m.p99_ms,
                    m.cpu_us_per_acq,
                    m.cmds_per_acq,
                    m.client_cpu_us_per_acq
                );
            }
            println!(
                "| {tasks} | **ratio** | **{:.2}×** | {:.2}× | {:.2}× | **{:.2}×** | {:.2}× | {:.2}× |",
                ratio(|r| r.acq_per_s),
                ratio(|r| r.p50_ms),
                ratio(|r| r.p99_ms),
                ratio(|r| r.cpu_us_per_acq),
                ratio(|r| r.cmds_per_acq),
                ratio(|r| r.client_cpu_us_per_acq),
            );
            chart.push((tasks, a, b));
        }
        println!("# commands per acquisition by name, over every round (keys={keys}):");
        for (ti, &tasks) in args.tasks.iter().enumerate() {
            for (i, name) in IMPLS.iter().enumerate() {
                let mut calls = BTreeMap::new();
                let mut n = 0;
                for r in &runs[ti][i] {
                    n += r.acquisitions;
                    for (k, v) in &r.calls {
                        *calls.entry(k.clone()).or_insert(0) += v;
                    }
                }
                println!("# {name} tasks={tasks}: {}", by_name(&calls, n));
            }
        }
        if let Some(path) = &args.svg {
            match draw(path, &chart, args) {
                Ok(()) => println!("# chart: {}", path.display()),
                Err(e) => eprintln!("chart {}: {e}", path.display()),
            }
        }
    }

    /// Two panels side by side, tasks on a log axis: acquisitions per second, and the
    /// server's CPU per acquisition; distlock and rslock on each.
    fn draw(
        path: &std::path::Path,
        chart: &[(usize, Medians, Medians)],
        args: &Args,
    ) -> Result<(), Box<dyn std::error::Error>> {
        use plotters::prelude::*;

        if chart.is_empty() {
            return Ok(());
        }
        let root = SVGBackend::new(path, (1000, 440)).into_drawing_area();
        root.fill(&WHITE)?;
        let cores = std::thread::available_parallelism().map_or(0, usize::from);
        let threads = args.threads.unwrap_or(cores);
        let root = root.titled(
            &format!(
                "One client shared by T tasks, each: lock a random key of {}, release (median of {} rounds; {cores} cores, {threads} runtime threads)",
                args.keys, args.rounds
            ),
            ("sans-serif", 17),
        )?;
        let panels = root.split_evenly((1, 2));
        let t_max = chart.iter().map(|c| c.0).max().unwrap_or(1) as f64;
        let x = 0.8f64..t_max * 1.25;
        let ticks: Vec<f64> = chart.iter().map(|c| c.0 as f64).collect();
        let ours = RGBColor(31, 119, 180);
        let theirs = RGBColor(214, 39, 40);
        type Get = fn(&Medians) -> f64;
        // The legend where the lines are not: throughput rises with T, CPU per lock falls.
        let figures: [(&str, &str, Get, SeriesLabelPosition); 2] = [
            (
                "acquisitions per second (higher is better)",
                "acq/s",
                |m| m.acq_per_s,
                SeriesLabelPosition::LowerRight,
            ),
            (
                "server CPU per acquisition, µs (lower is better)",
                "µs/acq",
                |m| m.cpu_us_per_acq,
                SeriesLabelPosition::UpperRight,
            ),
        ];
        for (panel, (title, y_desc, get, legend)) in panels.iter().zip(figures) {
            let y_max = chart
                .iter()
                .flat_map(|(_, a, b)| [get(a), get(b)])
                .fold(0.0, f64::max)
                * 1.15;
            let mut c = ChartBuilder::on(panel)
                .caption(title, ("sans-serif", 15))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d(
                    x.clone().log_scale().with_key_points(ticks.clone()),
                    0f64..y_max.max(1.0),
                )?;
            c.configure_mesh()
                .x_desc("tasks sharing the client (T)")
                .y_desc(y_desc)
                .x_label_formatter(&|v| format!("{v:.0}"))
                .y_label_formatter(&|v| format!("{v:.0}"))
                .draw()?;
            for (label, color, pick) in [
                ("distlock", ours, 0usize),
                ("rslock (one LockManager)", theirs, 1),
            ] {
                let points: Vec<(f64, f64)> = chart
                    .iter()
                    .map(|(t, a, b)| (*t as f64, get(if pick == 0 { a } else { b })))
                    .collect();
                c.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                    .label(label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                // Each point with its value beside it: the figures, not only the shape.
                c.draw_series(points.iter().map(|&(x, y)| {
                    let text = if y >= 100.0 {
                        format!("{y:.0}")
                    } else {
                        format!("{y:.1}")
                    };
                    let dy = if pick == 0 { -18 } else { 6 };
                    EmptyElement::at((x, y))
                        + Circle::new((0, 0), 4, color.filled())
                        + Text::new(text, (6, dy), ("sans-serif", 12).into_font().color(&color))
                }))?;
            }
            c.configure_series_labels()
                .position(legend)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
        }
        root.present()?;
        Ok(())
    }
}
