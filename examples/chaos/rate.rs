//! What the lock server served, for the command-rate bound of the calm: PostgreSQL's committed
//! transactions (`pg_stat_database`), ZooKeeper's packets received (`mntr`).

use std::io::{Read, Write};

use crate::support;

/// Transactions committed (PostgreSQL) or packets received (ZooKeeper) by the server at `port`.
pub(crate) fn served(backend: &str, port: u16) -> Option<u64> {
    match backend {
        "postgres" => pg_transactions(port),
        "zookeeper" => zk_packets(port),
        _ => None,
    }
}

fn pg_transactions(port: u16) -> Option<u64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    rt.block_on(async {
        let client =
            support::pg::connection(&format!("postgres://postgres@127.0.0.1:{port}/postgres"))
                .await;
        // Active backends flush their counts at least every second.
        let row = client
            .query_one(
                "SELECT sum(xact_commit + xact_rollback)::bigint FROM pg_stat_database",
                &[],
            )
            .await
            .ok()?;
        row.get::<_, Option<i64>>(0).map(|n| n as u64)
    })
}

fn zk_packets(port: u16) -> Option<u64> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(b"mntr").ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    reply
        .lines()
        .find_map(|l| l.strip_prefix("zk_packets_received"))
        .and_then(|v| v.trim().parse().ok())
}
