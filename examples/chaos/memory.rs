//! The memory run: holders are threads of this process, each with its own runtime (where its
//! client renews); faults pause, abort or shut down a holder.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use distlock::LockClient;

use crate::checker::{judge, stalled, Counts, Log, Report};
use crate::faults::inject_faults;
use crate::{wall_ns, Args, HOLD, HOLDERS, TTL};

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

/// The in-process resource: the highest token seen, and the accepted ones in order.
pub(crate) type Resource = Arc<StdMutex<(u64, Vec<u64>)>>;

pub(crate) async fn memory_holder_loop(
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
