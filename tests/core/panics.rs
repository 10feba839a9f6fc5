//! A backend whose acquire call panics after the service granted the lock (a defect in a
//! backend of the user's own, behind the public `Backend` trait): whether the task that awaited
//! it dies with the panic, or the acquisition was cancelled first and the panic comes while the
//! cleanup drives the call to its end, the claim it left on the service is released at once,
//! not held for its lease.
#![cfg(feature = "memory")]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use distlock::backend::{Attempt, Backend, Claim, Grant, MemoryBackend, Renewal};
use distlock::LockClient;
use tokio::time::Instant;

/// The memory backend, with an acquire that, while `armed`, waits for `gate` once granted
/// (as for a service's reply) and then panics.
#[derive(Clone)]
struct Panicky {
    inner: MemoryBackend,
    armed: Arc<AtomicBool>,
    gate: Arc<Notify>,
}

type Ticket = <MemoryBackend as Backend>::Ticket;

impl Backend for Panicky {
    type Ticket = Ticket;

    async fn acquire(
        &self,
        claim: &Claim,
        ticket: &Ticket,
        wait: bool,
    ) -> distlock::Result<Attempt> {
        let attempt = self.inner.acquire(claim, ticket, wait).await;
        if self.armed.swap(false, Ordering::SeqCst) {
            self.gate.notified().await;
            panic!("a defect in the backend's acquire");
        }
        attempt
    }

    async fn wait(
        &self,
        claim: &Claim,
        ticket: &Ticket,
        recheck_at: Option<Instant>,
    ) -> distlock::Result<Option<Grant>> {
        self.inner.wait(claim, ticket, recheck_at).await
    }

    async fn release(&self, claim: &Claim, ticket: &Ticket) -> distlock::Result<bool> {
        self.inner.release(claim, ticket).await
    }

    async fn renew(&self, claims: &[(&Claim, &Ticket)]) -> Vec<Renewal> {
        self.inner.renew(claims).await
    }
}

fn panicky() -> (Panicky, LockClient) {
    let backend = Panicky {
        inner: MemoryBackend::new(),
        armed: Arc::new(AtomicBool::new(true)),
        gate: Arc::new(Notify::new()),
    };
    let client = LockClient::builder(backend.clone())
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    (backend, client)
}

/// The next claim on `mutex` is granted well within the 30 s lease of the one the panic left.
async fn granted_soon(backend: &Panicky, mutex: &distlock::Mutex) {
    let started = std::time::Instant::now();
    let guard = tokio::time::timeout(Duration::from_secs(5), mutex.lock())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "still held {:?} after the panic: {:?}",
                started.elapsed(),
                backend.inner.stats()
            )
        })
        .unwrap();
    guard.release().await.unwrap();
    assert_eq!(backend.inner.stats().held, 0);
}

#[tokio::test]
async fn a_grant_whose_acquire_call_panicked_is_released_at_once() {
    let (backend, client) = panicky();
    backend.gate.notify_one();
    let mutex = client.mutex("orders:7");
    let err = tokio::spawn(mutex.lock())
        .await
        .expect_err("the acquire call panicked");
    assert!(err.is_panic());
    assert!(
        !backend.armed.load(Ordering::SeqCst),
        "the acquire call ran"
    );
    granted_soon(&backend, &mutex).await;
    client.shutdown().await;
}

#[tokio::test]
async fn a_cancelled_acquire_call_that_panics_later_is_still_released() {
    let (backend, client) = panicky();
    let mutex = client.mutex("orders:8");
    let task = tokio::spawn(mutex.lock());
    // Granted on the service, the call still out: cancel the acquisition there.
    tokio::time::timeout(Duration::from_secs(5), async {
        while backend.inner.stats().held == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("granted on the service");
    task.abort();
    assert!(task.await.expect_err("aborted").is_cancelled());
    // The cleanup drives the call to its end, which is a panic.
    backend.gate.notify_one();
    granted_soon(&backend, &mutex).await;
    client.shutdown().await;
}
