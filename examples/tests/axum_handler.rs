//! The axum example end to end over HTTP: a busy lock is 409 with `wait = false`, and 503 after
//! a timeout; the default-client rule of `#[distributed_lock]`.

#[path = "../axum_handler.rs"]
#[allow(dead_code)]
mod example;

use std::time::Duration;

use distlock::LockClient;
use example::{app, listen_addr, AppState, DEFAULT_ADDR};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// POSTs to `path` and returns the status code.
async fn post(port: u16, path: &str) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    reply
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP reply: {reply:?}"))
}

async fn serve(locks: LockClient) -> u16 {
    let state = AppState {
        locks,
        work: Duration::from_millis(400),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app(state)).await });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_order_is_409_and_a_slow_one_503() {
    // Two replicas of the service sharing one lock backend.
    let locks = LockClient::memory();
    let a = serve(locks.clone()).await;
    let b = serve(locks.clone()).await;

    let first = tokio::spawn(async move { post(a, "/orders/42/settle").await });
    // Until the first settle holds order 42 (for its 400 ms of work).
    tokio::time::timeout(Duration::from_secs(5), async {
        while locks.inspect("orders:42").await.unwrap().holders.is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the first settle never took order 42");
    assert_eq!(
        post(b, "/orders/42/settle").await,
        409,
        "a second settle of order 42 ran"
    );
    assert_eq!(
        post(b, "/orders/42/refund").await,
        503,
        "a refund did not time out"
    );
    assert_eq!(
        post(b, "/orders/43/settle").await,
        200,
        "another order was blocked"
    );
    assert_eq!(first.await.unwrap(), 200);
    // Released when the handler returned.
    assert_eq!(post(b, "/orders/42/refund").await, 200);
}

/// Two copies on one host: each listens where its `ADDR` says, the default without one.
#[tokio::test]
async fn replicas_on_one_host_listen_where_addr_says() {
    assert_eq!(listen_addr(None), DEFAULT_ADDR);
    assert_eq!(listen_addr(Some(String::new())), DEFAULT_ADDR);
    let (a, b) = (
        listen_addr(Some("127.0.0.1:0".to_owned())),
        listen_addr(Some("127.0.0.2:0".to_owned())),
    );
    let a = tokio::net::TcpListener::bind(&a).await.unwrap();
    let b = tokio::net::TcpListener::bind(&b).await.unwrap();
    assert_ne!(a.local_addr().unwrap(), b.local_addr().unwrap());
}
