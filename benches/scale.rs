//! Scale in one process: many waiters and many held locks through one client.
//!
//! ```text
//! cargo bench -p distlock-bench --bench scale [-- --impl redis,redis-cluster,postgres --waiters 10000 --keys 100 --held 10000]
//! ```
//!
//! Two lines per service:
//!
//! - `<impl>-waiters`: `--waiters` tasks queue on `--keys` keys (in rounds, one per key each, so
//!   the arrival order per key is known) through one `LockClient`, while another client holds
//!   every key. Prints the message connections on the server (Redis: connections subscribed to
//!   anything, so the waiting client's one; PostgreSQL: LISTEN connections, one per client, so
//!   two here, the holders' client listening too), the memory the waiting took (RSS growth), the CPU the process spent in 3 s
//!   of waiting with nothing changing, then releases the holders and counts grants served out
//!   of arrival order per key (`fifo_violations`, 0 is the target) and the handoff rate.
//! - `<impl>-renewal`: `--held` locks on distinct keys held through one client with a 3 s TTL
//!   (renewed every second) for 6 s. Prints renewal calls per round (one per second; the
//!   engine batches every lease due together), the script calls per round on Redis (one; on a
//!   Cluster one per slot the keys fall in, sent together), the p99 duration of one renewal
//!   call, from the `distlock_renewal_seconds` histogram, and how many leases were lost (0).
//!
//! `redis-cluster` runs both on a 3-primary/3-replica Cluster (feature `redis-cluster`);
//! message connections are then summed over the primaries (one per shard the waiters' keys
//! fall in, all from the one client's pub/sub connection).

#[path = "../tests/support/mod.rs"]
#[allow(unused_macros)]
mod support;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use distlock::LockClient;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

struct Args {
    impls: Vec<String>,
    waiters: usize,
    keys: usize,
    held: usize,
}

fn parse_args() -> Args {
    let mut args = Args {
        impls: vec!["redis".into(), "postgres".into()],
        waiters: 10_000,
        keys: 100,
        held: 10_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().unwrap_or_default();
        match a.as_str() {
            "--impl" => args.impls = value().split(',').map(str::to_owned).collect(),
            "--waiters" => args.waiters = value().parse().unwrap_or(args.waiters),
            "--keys" => args.keys = value().parse().unwrap_or(args.keys),
            "--held" => args.held = value().parse().unwrap_or(args.held),
            // `cargo bench` passes `--bench`.
            _ => {}
        }
    }
    args
}

/// The process's resident memory, in MB.
fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// CPU time the process used so far (user + system), from /proc.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses): utime is the 14th field.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // `rest` starts at field 3 (state); utime is field 14, stime 15.
    let total = ticks(11) + ticks(12);
    Duration::from_millis(total * 10)
}

/// A lock service under test: how to make a client, and what to ask the server.
enum Service {
    Redis(String),
    Postgres(String),
    /// A 3-primary/3-replica Redis Cluster (feature `redis-cluster`).
    #[cfg(feature = "redis-cluster")]
    Cluster(&'static support::cluster::RedisCluster),
}

impl Service {
    fn of(name: &str) -> Option<Self> {
        match name {
            "redis" => Some(Service::Redis(support::shared_redis().url())),
            "postgres" => Some(Service::Postgres(support::shared_postgres().url())),
            #[cfg(feature = "redis-cluster")]
            "redis-cluster" => Some(Service::Cluster(support::cluster::shared_cluster())),
            _ => None,
        }
    }

    async fn client(&self, ns: &str, ttl: Duration) -> LockClient {
        let builder = match self {
            Service::Redis(url) => LockClient::builder(
                distlock::backend::RedisBackend::connect(url)
                    .await
                    .expect("redis backend"),
            ),
            Service::Postgres(url) => LockClient::builder(
                distlock::backend::PgBackend::connect(url)
                    .await
                    .expect("postgres backend"),
            ),
            #[cfg(feature = "redis-cluster")]
            Service::Cluster(cluster) => LockClient::builder_for(&cluster.url())
                .await
                .expect("redis cluster backend"),
        };
        builder.namespace(ns).ttl(ttl).build().expect("client")
    }

    /// The Redis servers that hold the locks (the primaries of a Cluster).
    fn redis_urls(&self) -> Vec<String> {
        match self {
            Service::Redis(url) => vec![url.clone()],
            Service::Postgres(_) => Vec::new(),
            #[cfg(feature = "redis-cluster")]
            Service::Cluster(cluster) => cluster
                .primaries()
                .into_iter()
                .map(|i| cluster.nodes[i].url())
                .collect(),
        }
    }

    /// Script calls (FCALL or EVALSHA) the Redis servers have run so far.
    async fn script_calls(&self) -> u64 {
        let mut calls = 0;
        for url in self.redis_urls() {
            let stats: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut support::redis::connection(&url).await)
                .await
                .expect("info");
            // Script calls: by FCALL (a server that keeps functions) or EVALSHA.
            calls += stats
                .lines()
                .filter_map(|l| {
                    l.strip_prefix("cmdstat_evalsha:calls=")
                        .or_else(|| l.strip_prefix("cmdstat_fcall:calls="))?
                        .split(',')
                        .next()?
                        .parse::<u64>()
                        .ok()
                })
                .sum::<u64>();
        }
        calls
    }

    /// Server connections that subscribe to messages (Redis: `sub` or `ssub` > 0 in CLIENT
    /// LIST, summed over a Cluster's primaries; PostgreSQL: LISTEN connections).
    async fn message_connections(&self) -> usize {
        match self {
            Service::Postgres(url) => {
                let c = support::pg::connection(url).await;
                let n: i64 = c
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'distlock-listen'",
                        &[],
                    )
                    .await
                    .expect("pg_stat_activity")
                    .get(0);
                usize::try_from(n).unwrap_or(0)
            }
            _ => {
                let mut n = 0;
                for url in self.redis_urls() {
                    let list: String = redis::cmd("CLIENT")
                        .arg("LIST")
                        .query_async(&mut support::redis::connection(&url).await)
                        .await
                        .expect("client list");
                    n += list
                        .lines()
                        .filter(|l| {
                            l.split(' ').any(|f| {
                                f.strip_prefix("sub=")
                                    .or_else(|| f.strip_prefix("ssub="))
                                    .is_some_and(|n| n != "0")
                            })
                        })
                        .count();
                }
                n
            }
        }
    }

    /// How many claims are queued on `key`.
    async fn queued(&self, ns: &str, keys: &[String]) -> Vec<usize> {
        match self {
            #[cfg(feature = "redis-cluster")]
            Service::Cluster(cluster) => {
                let mut out = Vec::new();
                for k in keys {
                    let url = cluster.nodes[cluster.primary_for(k, 0)].url();
                    let n: usize = redis::cmd("LLEN")
                        .arg(format!("{ns}:{{{k}}}:q"))
                        .query_async(&mut support::redis::connection(&url).await)
                        .await
                        .expect("llen");
                    out.push(n);
                }
                out
            }
            Service::Redis(url) => {
                let mut conn = support::redis::connection(url).await;
                let mut pipe = redis::pipe();
                for k in keys {
                    pipe.cmd("LLEN").arg(format!("{ns}:{{{k}}}:q"));
                }
                pipe.query_async(&mut conn).await.expect("llen")
            }
            Service::Postgres(url) => {
                let c = support::pg::connection(url).await;
                let rows = c
                    .query(
                        "SELECT key, count(*) FROM distlock.claims WHERE ns = $1 AND fence IS NULL GROUP BY key",
                        &[&ns],
                    )
                    .await
                    .expect("queued");
                keys.iter()
                    .map(|k| {
                        rows.iter()
                            .find(|r| r.get::<_, String>(0) == *k)
                            .map_or(0, |r| usize::try_from(r.get::<_, i64>(1)).unwrap_or(0))
                    })
                    .collect()
            }
        }
    }
}

async fn waiters_line(name: &str, service: &Service, waiters: usize, keys: usize) {
    let ns = format!("scale{}w", std::process::id());
    let holder = service.client(&ns, Duration::from_secs(30)).await;
    let client = service.client(&ns, Duration::from_secs(30)).await;
    let names: Vec<String> = (0..keys).map(|k| format!("k{k}")).collect();
    let mut held = Vec::new();
    for k in &names {
        held.push(holder.mutex(k).lock().await.expect("hold"));
    }
    let rss_before = rss_mb();
    let order: Arc<Vec<StdMutex<Vec<usize>>>> =
        Arc::new((0..keys).map(|_| StdMutex::new(Vec::new())).collect());
    let rounds = waiters.div_ceil(keys);
    let mut tasks = Vec::with_capacity(waiters);
    for r in 0..rounds {
        for (k, key) in names.iter().enumerate() {
            if r * keys + k >= waiters {
                break;
            }
            let (m, order) = (client.mutex(key), order.clone());
            tasks.push(tokio::spawn(async move {
                let g = m.lock().await.expect("lock");
                order[k].lock().unwrap_or_else(|p| p.into_inner()).push(r);
                g.release().await.expect("release");
            }));
        }
        // Every key has its round-r waiter queued before round r+1 starts.
        let want: Vec<usize> = (0..keys)
            .map(|k| (r + 1).min(waiters.saturating_sub(k).div_ceil(keys)))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        while service.queued(&ns, &names).await != want {
            assert!(Instant::now() < deadline, "waiters never queued");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let connections = service.message_connections().await;
    let rss = rss_mb() - rss_before;
    let cpu_before = cpu_time();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle_cpu = (cpu_time() - cpu_before).as_secs_f64() * 1e3 / 3.0;

    let started = Instant::now();
    drop(held);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(300), t)
            .await
            .expect("a waiter was never served")
            .expect("waiter task");
    }
    let served = waiters as f64 / started.elapsed().as_secs_f64();
    let violations: usize = order
        .iter()
        .map(|o| {
            let o = o.lock().unwrap_or_else(|p| p.into_inner());
            o.windows(2).filter(|w| w[0] > w[1]).count()
        })
        .sum();
    println!(
        "{name}-waiters waiters={waiters} keys={keys} message_connections={connections} rss_mb={rss:.1} idle_cpu_ms_per_s={idle_cpu:.1} served_per_s={served:.0} fifo_violations={violations}"
    );
    holder.shutdown().await;
    client.shutdown().await;
}

async fn renewal_line(name: &str, service: &Service, held: usize, snapshotter: &Snapshotter) {
    let ns = format!("scale{}r", std::process::id());
    let ttl = Duration::from_secs(3);
    let client = service.client(&ns, ttl).await;
    let mut guards = Vec::with_capacity(held);
    for chunk in (0..held).collect::<Vec<_>>().chunks(200) {
        let batch =
            futures::future::join_all(chunk.iter().map(|i| client.mutex(format!("h{i}")).lock()))
                .await;
        for g in batch {
            guards.push(g.expect("lock"));
        }
    }
    // Drain what taking the locks recorded, then watch two renewal periods... six seconds.
    drop(snapshotter.snapshot());
    let scripts_before = service.script_calls().await;
    let window = Duration::from_secs(6);
    tokio::time::sleep(window).await;
    let scripts = service.script_calls().await - scripts_before;
    let mut samples: Vec<f64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "distlock_renewal_seconds")
        .flat_map(|(.., v)| match v {
            DebugValue::Histogram(s) => s.into_iter().map(|x| x.into_inner()).collect(),
            _ => Vec::new(),
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    let rounds = window.as_secs_f64() / (ttl.as_secs_f64() / 3.0);
    let p99 = samples
        .get(((samples.len() as f64 - 1.0) * 0.99).round().max(0.0) as usize)
        .map_or(f64::NAN, |s| s * 1e3);
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    // Script calls per round on Redis (one per slot group on a Cluster); n/a elsewhere.
    let scripts_field = if service.redis_urls().is_empty() {
        "n/a".to_owned()
    } else {
        format!("{:.1}", scripts as f64 / rounds)
    };
    println!(
        "{name}-renewal held={held} ttl_ms={} renewal_calls_per_round={:.2} script_calls_per_round={scripts_field} renewal_p99_ms={p99:.1} lost={lost}",
        ttl.as_millis(),
        samples.len() as f64 / rounds,
    );
    drop(guards);
    client.shutdown().await;
}

fn main() {
    let args = parse_args();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("install the metrics recorder");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        for name in &args.impls {
            let Some(service) = Service::of(name) else {
                eprintln!("unknown --impl {name}; known: redis, redis-cluster, postgres");
                continue;
            };
            let label = format!("distlock-{name}");
            waiters_line(&label, &service, args.waiters, args.keys).await;
            renewal_line(&label, &service, args.held, &snapshotter).await;
        }
    });
}
