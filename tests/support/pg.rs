//! Looking at a lock's rows on a real PostgreSQL from the tests, and faults from the server's
//! side.

use std::time::Duration;

use tokio::time::{sleep, timeout};
use tokio_postgres::{Client, NoTls};

/// A plain connection to `url`.
pub async fn connection(url: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect to the test PostgreSQL");
    tokio::spawn(conn);
    client
}

/// Claims (holders and waiters, live or not) left in the namespace.
pub async fn claims_in(url: &str, ns: &str) -> i64 {
    let client = connection(url).await;
    client
        .query_one("SELECT count(*) FROM distlock.claims WHERE ns = $1", &[&ns])
        .await
        .expect("count claims")
        .get(0)
}

/// How many claims are queued (not granted) on `key`.
pub async fn queued(url: &str, ns: &str, key: &str) -> i64 {
    let client = connection(url).await;
    client
        .query_one(
            "SELECT count(*) FROM distlock.claims WHERE ns = $1 AND key = $2 AND fence IS NULL",
            &[&ns, &key],
        )
        .await
        .expect("count queued claims")
        .get(0)
}

/// Waits until `n` claims are queued on `key`.
pub async fn until_queued(url: &str, ns: &str, key: &str, n: i64) {
    timeout(Duration::from_secs(20), async {
        while queued(url, ns, key).await != n {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("expected {n} queued claims on `{key}`"));
}

/// Ends every server connection whose application name is `name` (`distlock` for statement
/// connections, `distlock-listen` for LISTEN connections); returns how many.
pub async fn terminate(url: &str, name: &str) -> i64 {
    let client = connection(url).await;
    client
        .query_one(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()",
            &[&name],
        )
        .await
        .expect("terminate backends")
        .get(0)
}

/// A client with its own connections to `url`.
pub async fn client(url: &str, ns: &str, ttl: Duration, handoff: Duration) -> distlock::LockClient {
    let backend = distlock::backend::PgBackend::builder(url)
        .handoff_ttl(handoff)
        .build()
        .await
        .unwrap();
    distlock::LockClient::builder(backend)
        .namespace(ns)
        .ttl(ttl)
        .build()
        .unwrap()
}

/// The shared fault scenarios' view of the binary's shared PostgreSQL.
pub fn service() -> super::faults::Service {
    super::faults::Service {
        more_ports: Vec::new(),
        port: super::server::postgres::shared_postgres().port(),
        url_for: |port| format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        connect: |url, ns, ttl, handoff| {
            Box::pin(async move { client(&url, &ns, ttl, handoff).await })
        },
        until_queued: |ns, key, n| {
            Box::pin(async move {
                let n = i64::try_from(n).unwrap();
                until_queued(
                    &super::server::postgres::shared_postgres().url(),
                    &ns,
                    &key,
                    n,
                )
                .await;
            })
        },
        left_in: |ns| {
            Box::pin(async move {
                usize::try_from(
                    claims_in(&super::server::postgres::shared_postgres().url(), &ns).await,
                )
                .unwrap()
            })
        },
    }
}
