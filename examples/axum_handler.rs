//! An axum service whose handlers hold a distributed lock per order.
//!
//! ```sh
//! DISTLOCK_URL=memory: cargo run --example axum_handler --features axum   # in-process locks
//! DISTLOCK_URL=redis://127.0.0.1:6379 cargo run --example axum_handler --features axum,redis
//! DISTLOCK_URL=zk://127.0.0.1:2181 cargo run --example axum_handler --features axum,zookeeper
//! ADDR=127.0.0.1:3001 DISTLOCK_URL=redis://127.0.0.1:6379 cargo run --example axum_handler --features axum,redis
//! curl -X POST localhost:3000/orders/42/settle   # 200, or 409 while another replica settles 42
//! curl -X POST localhost:3000/orders/42/refund   # 200, or 503 after waiting 100 ms in vain
//! ```
//!
//! `ADDR` is the address it listens on (default `127.0.0.1:3000`): give each replica on one
//! host its own, as the second Redis line does.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use distlock::{distributed_lock, LockClient};

#[derive(Clone)]
pub struct AppState {
    pub locks: LockClient,
    /// How long the pretend work inside the lock takes.
    pub work: Duration,
}

/// What handlers fail with; lock errors map to HTTP statuses.
#[derive(Debug)]
pub enum AppError {
    Lock(distlock::Error),
}

impl From<distlock::Error> for AppError {
    fn from(e: distlock::Error) -> Self {
        AppError::Lock(e)
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let AppError::Lock(e) = self;
        let status = if e.is_would_block() {
            StatusCode::CONFLICT
        } else if e.is_timeout() {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        (status, e.to_string()).into_response()
    }
}

/// One settlement per order at a time, across every replica; a second one is refused at once.
#[distributed_lock("orders:{id}", client = &state.locks, wait = false)]
async fn settle(State(state): State<AppState>, Path(id): Path<u64>) -> Result<String, AppError> {
    tokio::time::sleep(state.work).await;
    Ok(format!("order {id} settled\n"))
}

/// Refunds wait their turn, but not for long.
#[distributed_lock("orders:{id}", client = &state.locks, timeout = "100ms")]
async fn refund(State(state): State<AppState>, Path(id): Path<u64>) -> Result<String, AppError> {
    tokio::time::sleep(state.work).await;
    Ok(format!("order {id} refunded\n"))
}

/// Where the service listens when `ADDR` is unset.
pub const DEFAULT_ADDR: &str = "127.0.0.1:3000";

/// The address to listen on: `ADDR` (the value of the variable, if set), or [`DEFAULT_ADDR`].
pub fn listen_addr(addr: Option<String>) -> String {
    addr.filter(|a| !a.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_ADDR.to_owned())
}

pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/orders/{id}/settle", post(settle))
        .route("/orders/{id}/refund", post(refund))
        .with_state(state)
}

#[allow(dead_code)] // the HTTP test reuses this file without its `main`
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // No default: a service that forgot the variable must not run with locks that exclude
    // nothing across its replicas. `memory:` asks for in-process locks by name.
    let url = std::env::var("DISTLOCK_URL").map_err(|_| {
        "set DISTLOCK_URL to the lock service (redis://…, zk://…, postgres://…), \
         or to `memory:` for locks inside this one process"
    })?;
    let locks = LockClient::connect(&url).await?;
    let state = AppState {
        locks: locks.clone(),
        work: Duration::from_millis(500),
    };
    let addr = listen_addr(std::env::var("ADDR").ok());
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("cannot listen on {addr} (set ADDR to another address): {e}"))?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app(state))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    locks.shutdown().await;
    Ok(())
}
