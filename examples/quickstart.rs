//! Several tasks contend for one lock on the in-process backend: FIFO order, fencing tokens,
//! and a lost-lock moment. Run with `cargo run --example quickstart`.

use std::time::Duration;

use distlock::backend::MemoryBackend;
use distlock::LockClient;

#[tokio::main]
async fn main() -> Result<(), distlock::Error> {
    let client = LockClient::memory();
    let mutex = client.mutex("orders:42");

    println!("1. five workers queue for `orders:42`; they get it in arrival order");
    let first = mutex.lock().await?;
    println!(
        "   main holds it first, fencing token {}",
        first.fencing_token()
    );
    let mut workers = Vec::new();
    for id in 1..=5 {
        let mutex = mutex.clone();
        workers.push(tokio::spawn(async move {
            let guard = mutex.lock().await?;
            println!(
                "   worker {id} got it, fencing token {}",
                guard.fencing_token()
            );
            tokio::time::sleep(Duration::from_millis(20)).await; // the critical section
            guard.release().await
        }));
        // Let worker `id` reach the queue before the next one starts.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first.release().await?;
    for worker in workers {
        worker.await.expect("worker panicked")?;
    }

    println!("2. try_lock and lock_timeout while someone holds it");
    let held = mutex.lock().await?;
    match mutex.try_lock().await {
        Err(e) if e.is_would_block() => println!("   try_lock: {e}"),
        other => println!("   try_lock: unexpected {other:?}"),
    }
    match mutex.lock_timeout(Duration::from_millis(50)).await {
        Err(e) if e.is_timeout() => println!("   lock_timeout: {e}"),
        other => println!("   lock_timeout: unexpected {other:?}"),
    }
    drop(held); // released in the background; the next waiter is handed the lock

    println!("3. a lease that is not renewed runs out, and its holder is told");
    let short = LockClient::builder(MemoryBackend::new())
        .ttl(Duration::from_millis(200))
        .auto_renew(false)
        .build()?;
    let guard = short.mutex("partition:7").lock().await?;
    let waiter = tokio::spawn({
        let mutex = short.mutex("partition:7");
        async move { mutex.lock().await }
    });
    tokio::select! {
        () = guard.lost() => println!("   holder: lost `partition:7` after its 200 ms TTL (is_lost = {})", guard.is_lost()),
        () = tokio::time::sleep(Duration::from_secs(5)) => println!("   holder: still not lost?"),
    }
    let next = waiter.await.expect("waiter panicked")?;
    println!(
        "   the waiter took over with fencing token {} > {}",
        next.fencing_token(),
        guard.fencing_token()
    );
    match guard.release().await {
        Err(e) if e.is_lost() => println!("   the old holder's release reports: {e}"),
        other => println!("   release: unexpected {other:?}"),
    }

    client.shutdown().await;
    short.shutdown().await;
    Ok(())
}
