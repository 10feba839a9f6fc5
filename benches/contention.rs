//! The contention workload: W workers, each with its own client, take one key for `cs_ms`
//! milliseconds, over and over, for a fixed time. Prints the standard line (DESIGN.md,
//! Evidence) per run so runs compare side by side:
//!
//! `<impl> workers=W cs_ms=C acq_per_s=… p50_ms=… p99_ms=… max_ms=… fairness_min_over_max=… server_ops_per_acq=… overlaps=0`
//!
//! Run: `cargo bench --bench contention [-- --workers 8 --cs-ms 1 --secs 5 --impl memory]`.
//! `--workers` and `--cs-ms` take comma-separated lists.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::backend::MemoryBackend;
use distlock::LockClient;

struct Args {
    workers: Vec<usize>,
    cs_ms: Vec<f64>,
    secs: f64,
    impls: Vec<String>,
}

fn parse_args() -> Args {
    let mut args = Args {
        workers: vec![1, 8],
        cs_ms: vec![0.0, 1.0],
        secs: 3.0,
        impls: vec!["memory".into()],
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
            "--impl" => args.impls = value().split(',').map(str::to_owned).collect(),
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

/// Runs W workers, one client each, on one key for `secs`.
async fn contend(clients: Vec<LockClient>, cs: Duration, secs: f64) -> Outcome {
    let stop = Arc::new(AtomicBool::new(false));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for client in clients {
        let (stop, inside, overlaps) = (stop.clone(), inside.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            let mutex = client.mutex("bench:contention");
            let mut waits = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let asked = Instant::now();
                let guard = mutex.lock().await.expect("lock");
                waits.push(asked.elapsed());
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                if cs.is_zero() {
                    tokio::task::yield_now().await;
                } else {
                    busy_or_sleep(cs).await;
                }
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            }
            client.shutdown().await;
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
        overlaps: overlaps.load(Ordering::SeqCst),
        elapsed: start.elapsed(),
    }
}

/// Holds for `cs` precisely: the tokio timer rounds up to the next millisecond tick (a 1 ms
/// sleep takes about 2 ms), so sections of a millisecond or more sleep a blocking-pool thread,
/// and shorter ones spin.
async fn busy_or_sleep(cs: Duration) {
    if cs >= Duration::from_millis(1) {
        tokio::task::spawn_blocking(move || std::thread::sleep(cs))
            .await
            .expect("sleeper");
    } else {
        let until = Instant::now() + cs;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn report(name: &str, workers: usize, cs_ms: f64, mut o: Outcome, ops: Option<f64>) {
    o.waits.sort();
    let total = o.waits.len();
    let min = o.per_worker.iter().copied().min().unwrap_or(0) as f64;
    let max = o.per_worker.iter().copied().max().unwrap_or(0).max(1) as f64;
    let ops = ops.map_or_else(|| "n/a".to_string(), |v| format!("{v:.2}"));
    println!(
        "{name} workers={workers} cs_ms={cs_ms} acq_per_s={:.0} p50_ms={:.3} p99_ms={:.3} max_ms={:.3} fairness_min_over_max={:.2} server_ops_per_acq={ops} overlaps={}",
        total as f64 / o.elapsed.as_secs_f64(),
        percentile(&o.waits, 0.50),
        percentile(&o.waits, 0.99),
        o.waits.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
        min / max,
        o.overlaps,
    );
}

fn main() {
    let args = parse_args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        for name in &args.impls {
            for &workers in &args.workers {
                for &cs_ms in &args.cs_ms {
                    let cs = Duration::from_secs_f64(cs_ms / 1e3);
                    match name.as_str() {
                        "memory" => {
                            let backend = MemoryBackend::new();
                            let clients = (0..workers)
                                .map(|_| {
                                    LockClient::builder(backend.clone())
                                        .build()
                                        .expect("client")
                                })
                                .collect();
                            let outcome = contend(clients, cs, args.secs).await;
                            report("distlock-memory", workers, cs_ms, outcome, None);
                        }
                        other => eprintln!("unknown --impl {other}; known: memory"),
                    }
                }
            }
        }
    });
}
