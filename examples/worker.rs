//! Background workers pulling jobs, each job under its own lock, with a graceful shutdown
//! that releases everything.
//!
//! ```sh
//! DISTLOCK_URL=memory: cargo run --example worker --features macros   # in-process locks
//! DISTLOCK_URL=redis://127.0.0.1:6379 cargo run --example worker --features macros,redis
//! DISTLOCK_URL=zk://127.0.0.1:2181 cargo run --example worker --features macros,zookeeper
//! ```
//!
//! Run it twice against the same server: the two processes never work on one account at the
//! same time.

use std::time::Duration;

use distlock::{distributed_lock, LockClient};
use tokio::sync::{mpsc, Mutex};

struct Job {
    account: u32,
    amount: i64,
}

#[derive(Debug)]
enum WorkError {
    Lock(distlock::Error),
}

impl From<distlock::Error> for WorkError {
    fn from(e: distlock::Error) -> Self {
        WorkError::Lock(e)
    }
}

/// The guard covers exactly one job; a lost lock cancels the job instead of finishing it blind.
#[distributed_lock("accounts:{account}", timeout = "10s", on_lost = "abort")]
async fn apply(worker: usize, account: u32, amount: i64) -> Result<(), WorkError> {
    tokio::time::sleep(Duration::from_millis(20)).await; // read, compute, write
    println!("worker {worker}: account {account} {amount:+}");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // No default: a service that forgot the variable must not run with locks that exclude
    // nothing across its replicas. `memory:` asks for in-process locks by name.
    let url = std::env::var("DISTLOCK_URL").map_err(|_| {
        "set DISTLOCK_URL to the lock service (redis://…, zk://…, postgres://…), \
         or to `memory:` for locks inside this one process"
    })?;
    let client = LockClient::connect(&url).await?;
    distlock::set_default(client.clone());

    let (jobs, queue) = mpsc::channel::<Job>(64);
    let queue = std::sync::Arc::new(Mutex::new(queue));
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut workers = Vec::new();
    for worker in 0..4 {
        let (queue, mut stop) = (queue.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let job = tokio::select! {
                    job = async { queue.lock().await.recv().await } => job,
                    _ = stop.wait_for(|s| *s) => None,
                };
                let Some(job) = job else { break };
                if let Err(WorkError::Lock(e)) = apply(worker, job.account, job.amount).await {
                    eprintln!("worker {worker}: account {} skipped: {e}", job.account);
                }
            }
        }));
    }
    drop(stop);

    for i in 0..20 {
        jobs.send(Job {
            account: i % 3,
            amount: i64::from(i) * 10 - 50,
        })
        .await?;
    }
    drop(jobs); // no more work: workers drain the queue and stop

    tokio::select! {
        _ = futures::future::join_all(&mut workers) => {}
        _ = tokio::signal::ctrl_c() => {
            let _ = stop_tx.send(true);
            futures::future::join_all(workers).await;
        }
    }
    client.shutdown().await; // releases whatever is still held
    println!("all jobs done, locks released");
    Ok(())
}
