//! The lock contract of every backend once more, under a subscriber that takes every event and
//! span at TRACE level and formats all of its fields, the way a service with
//! `RUST_LOG=distlock=trace` would: logging must change nothing (a field that locks again, a
//! panic in a `Debug` impl or a deadlock shows up here). A watchdog fails the binary if a test
//! hangs, since a deadlocked runtime would never reach its own timeouts.
#![cfg(all(
    feature = "memory",
    feature = "redis",
    feature = "redlock",
    feature = "zookeeper",
    feature = "postgres"
))]

mod support;

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use distlock::backend::MemoryBackend;
use distlock::LockClient;
use futures::future::BoxFuture;
use support::contract::{contend, take_multi, take_permit, take_write, torture_with};
use support::family::{downgrade_keeps_queued_writers_out, rw_exclusion, semaphore_bound};
use tracing_subscriber::fmt::MakeWriter;

/// Counts the bytes the subscriber wrote, so the test can tell that events were formatted.
#[derive(Clone, Default)]
struct Counted(Arc<AtomicU64>);

impl std::io::Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Counted {
    type Writer = Self;
    fn make_writer(&'a self) -> Self {
        self.clone()
    }
}

static WRITTEN: std::sync::OnceLock<Counted> = std::sync::OnceLock::new();

/// Installs the TRACE subscriber for the whole binary (every runtime thread sees it).
fn trace_everything() -> Counted {
    static ONCE: Once = Once::new();
    let written = WRITTEN.get_or_init(Counted::default).clone();
    ONCE.call_once(|| {
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::FULL)
            .with_writer(written.clone())
            .with_ansi(false)
            .init();
    });
    written
}

/// Aborts the process if the test it guards runs longer than `limit`: a deadlocked runtime
/// cannot fire its own timers.
struct Watchdog(Arc<AtomicBool>);

impl Watchdog {
    fn new(name: &'static str, limit: Duration) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let seen = done.clone();
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            while start.elapsed() < limit {
                if seen.load(Ordering::Acquire) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            // Straight to the process's stderr: the harness captures `eprintln!` of test threads.
            let _ = writeln!(
                std::io::stderr(),
                "{name}: still running after {limit:?} with TRACE logging on: hung"
            );
            std::process::exit(101);
        });
        Self(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

type Clients = Box<dyn Fn(usize) -> BoxFuture<'static, Vec<LockClient>> + Send + Sync>;

/// What one backend is run with: whether it has semaphores (Redlock has none), and the
/// cancellation torture's rounds per holder and per canceller (a fast backend needs more to
/// cancel enough futures mid-flight).
struct Shape {
    semaphores: bool,
    rounds: (u64, u64),
}

/// The contract: mutex contention with explicit and drop releases, cancellation torture of the
/// write lock, one-permit semaphore and multi-lock, read-write exclusion, semaphore bounds and a
/// downgrade with writers queued.
async fn contract(
    name: &'static str,
    shape: Shape,
    clients: Clients,
    queued: support::family::Queued<'_>,
) {
    let written = trace_everything();
    let _watchdog = Watchdog::new(name, Duration::from_secs(120));
    let before = written.0.load(Ordering::Relaxed);
    contend(clients(4).await, "hot", 10, Duration::from_micros(300)).await;
    let mut takes = vec![
        ("torture.write", take_write()),
        ("torture.multi", take_multi()),
    ];
    if shape.semaphores {
        takes.push(("torture.permit", take_permit()));
    }
    for (key, take) in takes {
        let (holders, cancellers) = (clients(2).await, clients(4).await);
        let (h, c) = shape.rounds;
        torture_with(
            take,
            holders,
            cancellers,
            key,
            h,
            c,
            Duration::from_micros(4),
        )
        .await;
    }
    rw_exclusion(clients(3).await, "rw", 10, 3).await;
    if shape.semaphores {
        semaphore_bound(clients(3).await, "sem", 3, 8).await;
    }
    let [a, b, c]: [LockClient; 3] = clients(3).await.try_into().unwrap();
    downgrade_keeps_queued_writers_out([a, b, c], "down", queued).await;
    assert!(
        written.0.load(Ordering::Relaxed) > before,
        "the subscriber saw no event: TRACE logging was not on"
    );
}

const SERVER: Shape = Shape {
    semaphores: true,
    rounds: (10, 50),
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_under_trace() {
    let backend = MemoryBackend::new();
    let probe = backend.clone();
    let queued = move |n| -> BoxFuture<'static, ()> {
        let probe = probe.clone();
        Box::pin(async move {
            while probe.stats().waiters != n {
                tokio::task::yield_now().await;
            }
        })
    };
    let clients: Clients = Box::new(move |n| {
        let backend = backend.clone();
        Box::pin(async move {
            (0..n)
                .map(|_| LockClient::builder(backend.clone()).build().unwrap())
                .collect()
        })
    });
    contract(
        "memory",
        Shape {
            semaphores: true,
            rounds: (60, 120),
        },
        clients,
        &queued,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_under_trace() {
    let ns = test_namespace!();
    let url = support::server::redis::shared_redis().url();
    let (probe_url, probe_ns) = (url.clone(), ns.clone());
    let queued = move |n| -> BoxFuture<'static, ()> {
        let (url, ns) = (probe_url.clone(), probe_ns.clone());
        Box::pin(async move { support::redis::until_queued(&url, &ns, "down", n).await })
    };
    let clients: Clients = Box::new(move |n| {
        let (url, ns) = (url.clone(), ns.clone());
        Box::pin(async move {
            let mut out = Vec::new();
            for _ in 0..n {
                out.push(
                    support::redis::client(
                        &url,
                        &ns,
                        Duration::from_secs(10),
                        Duration::from_secs(2),
                        true,
                    )
                    .await,
                );
            }
            out
        })
    });
    contract("redis", SERVER, clients, &queued).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_under_trace() {
    let ns = test_namespace!();
    let probe_ns = ns.clone();
    let queued = move |n| -> BoxFuture<'static, ()> {
        let ns = probe_ns.clone();
        Box::pin(async move {
            support::server::redlock::shared_nodes()
                .until_queued(&ns, "down", n)
                .await;
        })
    };
    let clients: Clients = Box::new(move |n| {
        let ns = ns.clone();
        Box::pin(async move {
            let mut out = Vec::new();
            for _ in 0..n {
                out.push(support::server::redlock::shared_nodes().client(&ns).await);
            }
            out
        })
    });
    contract(
        "redlock",
        Shape {
            semaphores: false,
            rounds: (10, 50),
        },
        clients,
        &queued,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_under_trace() {
    let ns = test_namespace!();
    let connect = support::server::zookeeper::shared_zookeeper().connect_string();
    let queued = support::zk::queued(&connect, &ns, "down");
    let clients: Clients = Box::new(move |n| {
        let (connect, ns) = (connect.clone(), ns.clone());
        Box::pin(
            async move { support::zk::clients_at(&connect, &ns, Duration::from_secs(10), n).await },
        )
    });
    contract("zookeeper", SERVER, clients, &queued).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_under_trace() {
    let ns = test_namespace!();
    let url = support::server::postgres::shared_postgres().url();
    let (probe_url, probe_ns) = (url.clone(), ns.clone());
    let queued = move |n: usize| -> BoxFuture<'static, ()> {
        let (url, ns) = (probe_url.clone(), probe_ns.clone());
        Box::pin(async move {
            support::pg::until_queued(&url, &ns, "down", i64::try_from(n).unwrap()).await;
        })
    };
    let clients: Clients = Box::new(move |n| {
        let (url, ns) = (url.clone(), ns.clone());
        Box::pin(async move {
            let mut out = Vec::new();
            for _ in 0..n {
                out.push(
                    support::pg::client(&url, &ns, Duration::from_secs(10), Duration::from_secs(2))
                        .await,
                );
            }
            out
        })
    });
    contract("postgres", SERVER, clients, &queued).await;
}
