//! Leader election for the "only one replica runs the scheduler" shape: every replica calls
//! `Election::lead`, which runs the scheduler only while that replica leads (cancelling it if
//! leadership is lost, and campaigning again), and anyone can follow who leads.
//!
//! ```sh
//! DISTLOCK_URL=memory: cargo run --example leader      # replicas as tasks of one process
//! DISTLOCK_URL=postgres://postgres@127.0.0.1/postgres cargo run --example leader --features postgres
//! ```
//!
//! Elections are on memory, Redis (single server, Cluster, Sentinel), PostgreSQL and ZooKeeper;
//! Redlock refuses them with an `Unsupported` error until it has them.

use std::time::Duration;

use distlock::LockClient;
use futures::StreamExt;

/// The work only the leader does: a few scheduling rounds, each write fenced with the term.
async fn schedule(replica: usize, term: u64) -> u64 {
    for round in 0..3 {
        println!("replica {replica} (term {term}): scheduling round {round}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    term
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DISTLOCK_URL").unwrap_or_else(|_| "memory:".into());
    let client = LockClient::connect(&url).await?;
    let election = client.election("scheduler");

    // Anyone can follow the election: here a task that prints every change.
    let mut changes = Box::pin(election.observe());
    let watcher = tokio::spawn(async move {
        while let Some(leader) = changes.next().await {
            match leader {
                Ok(Some(l)) => println!(
                    "observer: {} leads (term {})",
                    l.value_str().unwrap_or("?"),
                    l.term()
                ),
                Ok(None) => println!("observer: nobody leads"),
                Err(e) => eprintln!("observer: {e}"),
            }
        }
    });

    // Three replicas; each runs the scheduler once it leads, then steps down.
    let mut replicas = Vec::new();
    for replica in 0..3 {
        let election = election.clone();
        replicas.push(tokio::spawn(async move {
            let me = format!("replica {replica}");
            election.lead(&me, |term| schedule(replica, term)).await
        }));
    }
    for replica in replicas {
        let term = replica.await??;
        println!("a replica finished its term {term}");
    }
    client.shutdown().await;
    watcher.await?;
    Ok(())
}
