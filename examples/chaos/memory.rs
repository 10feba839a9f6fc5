//! The memory run: holders are threads of this process, each with its own runtime (where its
//! client renews); faults pause, abort or shut down a holder.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use distlock::LockClient;

use crate::checker::{judge, liveness, Counts, Interval, Line, Log, Report};
use crate::faults::inject_faults;
use crate::holder::{capacity_of, keys_of, take, Plan, LONG_EVERY, LONG_HOLD};
use crate::{ttl, wall_ns, Args, Rng, HOLD, HOLDERS};

/// What the driver can do to a memory holder.
#[derive(Default)]
pub(crate) struct Knobs {
    /// Block the holder's thread (its runtime, renewals included) this many ms between its
    /// next check and write: the SIGSTOP analogue.
    pub(crate) pause_ms: AtomicU64,
    /// Drop the holder's loop wherever it is, and start over with a new client.
    pub(crate) kill: tokio::sync::Notify,
    pub(crate) quit: std::sync::atomic::AtomicBool,
}

/// The in-process resource, per key: the highest write and read tokens seen, and the accepted
/// writes in order (the fence of [`crate::holder::FENCED_WRITE`]).
pub(crate) type Resource = Arc<StdMutex<HashMap<String, (u64, u64, Vec<(char, u64)>)>>>;

fn fenced_write(resource: &Resource, key: &str, token: u64, mode: char) -> bool {
    let mut r = resource.lock().unwrap_or_else(|p| p.into_inner());
    let (mw, mr, log) = r.entry(key.to_string()).or_default();
    if token < *mw || (mode == 'w' && token < *mr) {
        return false;
    }
    if mode == 'w' {
        *mw = token;
    } else {
        *mr = (*mr).max(token);
    }
    log.push((mode, token));
    true
}

pub(crate) async fn memory_holder_loop(
    i: usize,
    client: &LockClient,
    knobs: &Knobs,
    resource: &Resource,
    log: &StdMutex<Log>,
    primitive: &str,
) {
    let report = |report: Report| {
        log.lock()
            .unwrap_or_else(|p| p.into_inner())
            .lines
            .push(Line {
                holder: i,
                at: Instant::now(),
                report,
            });
    };
    let mut rng = Rng(wall_ns() as u64 ^ (i as u64) << 48);
    loop {
        // A downgrade runs as a plain write here.
        let plan = Plan::pick(primitive, &mut rng);
        let hold = if rng.below(LONG_EVERY) == 0 {
            LONG_HOLD
        } else {
            HOLD
        };
        report(Report::Queued);
        let call_ns = wall_ns();
        let Ok(guard) = take(client, &plan, Duration::from_secs(10)).await else {
            continue;
        };
        if guard.is_lost() {
            report(Report::SkippedLost);
            continue;
        }
        let check_ns = wall_ns();
        report(Report::Granted { start_ns: check_ns });
        let pause = knobs.pause_ms.swap(0, Ordering::AcqRel);
        if pause > 0 {
            std::thread::sleep(Duration::from_millis(pause));
            let to = wall_ns();
            log.lock()
                .unwrap_or_else(|p| p.into_inner())
                .stops
                .push((i, check_ns, to));
        }
        let (mode, weight, write) = plan.modes();
        if let Some(w) = write {
            for (key, token) in guard.parts() {
                let accepted = fenced_write(resource, &key, token, w);
                report(Report::Wrote {
                    key,
                    mode: w,
                    token,
                    accepted,
                    check_ns,
                    write_ns: wall_ns(),
                });
            }
        }
        // As a process holder does: the believed interval ends at the last check that found
        // the lock held.
        let until = tokio::time::Instant::now() + hold;
        let mut end_ns = check_ns;
        let believed = loop {
            let now = tokio::time::Instant::now();
            if now >= until {
                break true;
            }
            tokio::time::sleep((until - now).min(Duration::from_millis(5))).await;
            if guard.is_lost() {
                break false;
            }
            end_ns = wall_ns();
        };
        for (key, token) in guard.parts() {
            report(Report::Held(Interval {
                holder: i,
                key,
                mode,
                weight,
                token,
                call_ns,
                start_ns: check_ns,
                end_ns,
                believed,
            }));
        }
        drop(guard);
    }
}

pub(crate) fn run_memory(args: &Args) -> (Counts, Vec<String>) {
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
            let primitive = args.primitive.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async {
                    while !knobs[i].quit.load(Ordering::Acquire) {
                        let client = LockClient::builder(backend.clone())
                            .ttl(ttl())
                            .build()
                            .expect("client");
                        tokio::select! {
                            () = memory_holder_loop(i, &client, &knobs[i], &resource, &log, &primitive) => {}
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
            let pause = ttl() + Duration::from_millis(500);
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
    std::thread::sleep(ttl() * 3 + Duration::from_millis(500));
    let end = Instant::now();
    let mut problems = Vec::new();
    for k in knobs.iter() {
        k.quit.store(true, Ordering::Release);
        k.kill.notify_one();
    }
    for t in threads {
        let _ = t.join();
    }
    let log = std::mem::take(&mut *log.lock().unwrap_or_else(|p| p.into_inner()));
    let (figures, live) = liveness(&log, "memory", calm, end);
    counts.liveness = figures;
    problems.extend(live);
    // Every client is gone: released claims are gone, dropped ones expire with their lease.
    std::thread::sleep(ttl() + Duration::from_millis(500));
    let stats = backend.stats();
    if stats.holders + stats.waiters > 0 {
        problems.push(format!("left behind: {stats:?}"));
    }
    let written = std::mem::take(&mut *resource.lock().unwrap_or_else(|p| p.into_inner()));
    let written = keys_of(&args.primitive)
        .into_iter()
        .map(|k| {
            let log = written.get(k).map(|w| w.2.clone()).unwrap_or_default();
            (k.to_string(), log)
        })
        .collect();
    judge(
        &log,
        &written,
        capacity_of(&args.primitive),
        false,
        false,
        &mut counts,
    );
    (counts, problems)
}
