//! Looking at a lock's keys on a real `redis-server` from the tests.

use std::time::Duration;

use tokio::time::{sleep, timeout};

/// Every command the server ran so far, by name, with its count (INFO commandstats), less
/// the tests' own INFO and CONFIG calls.
pub async fn commandstats(con: &mut redis::aio::MultiplexedConnection) -> Vec<(String, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            (!name.starts_with("info") && !name.starts_with("config"))
                .then(|| (name.to_owned(), calls))
        })
        .collect()
}

/// Every command the server at `url` ran so far, by name (see [`commandstats`]).
pub async fn commands(url: &str) -> Vec<(String, u64)> {
    commandstats(&mut connection(url).await).await
}

/// Every command the server at `url` ran so far, summed (see [`commandstats`]).
pub async fn total_commands(url: &str) -> u64 {
    commands(url).await.iter().map(|(_, n)| n).sum()
}

/// Every command the servers at `urls` ran so far, summed over them all.
pub async fn total_commands_on(urls: &[String]) -> u64 {
    let mut n = 0;
    for u in urls {
        n += total_commands(u).await;
    }
    n
}

/// What ran between two readings of [`commands`]: each command that ran since `before`, by
/// name, with how often.
pub fn commands_since(before: &[(String, u64)], after: &[(String, u64)]) -> Vec<(String, u64)> {
    after
        .iter()
        .map(|(name, n)| {
            let was = before
                .iter()
                .find(|(b, _)| b == name)
                .map_or(0, |(_, n)| *n);
            (name.clone(), n - was)
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// A plain connection to `url`.
pub async fn connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Every key in the namespace.
pub async fn keys_in(url: &str, ns: &str) -> Vec<String> {
    let mut conn = connection(url).await;
    let mut cursor: u64 = 0;
    let mut out = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{ns}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .unwrap();
        out.extend(batch);
        if next == 0 {
            return out;
        }
        cursor = next;
    }
}

/// How many claims are queued on `key`.
pub async fn queue_len(url: &str, ns: &str, key: &str) -> usize {
    let mut conn = connection(url).await;
    redis::cmd("LLEN")
        .arg(format!("{ns}:{{{key}}}:q"))
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// Waits until `n` claims are queued on `key`.
pub async fn until_queued(url: &str, ns: &str, key: &str, n: usize) {
    timeout(Duration::from_secs(10), async {
        while queue_len(url, ns, key).await != n {
            sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("expected {n} queued waiters"));
}

/// Every key in the namespace but fence counters.
pub async fn non_fence_keys(url: &str, ns: &str) -> Vec<String> {
    let mut keys = keys_in(url, ns).await;
    keys.retain(|k| !k.ends_with(":fence"));
    keys
}

/// Waits (releases run in the background) until only fence counters are left in the namespace.
pub async fn until_only_fences(url: &str, ns: &str) {
    let what = format!("keys of {ns}");
    super::until_none_left(Duration::from_secs(5), &what, || non_fence_keys(url, ns)).await;
}

/// Nothing but fencing counters left in `ns` (within 5 s), each with a TTL.
pub async fn assert_only_expiring_fences(url: &str, ns: &str) {
    until_only_fences(url, ns).await;
    let mut conn = connection(url).await;
    for key in keys_in(url, ns).await {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(pttl > 0, "{key} has no TTL");
    }
}

/// A client with its own connections to `url`, renewing its leases or not.
pub async fn client(
    url: &str,
    ns: &str,
    ttl: Duration,
    handoff: Duration,
    renew: bool,
) -> distlock::LockClient {
    let backend = distlock::backend::RedisBackend::builder(url)
        .handoff_ttl(handoff)
        .build()
        .await
        .unwrap();
    distlock::LockClient::builder(backend)
        .namespace(ns)
        .ttl(ttl)
        .auto_renew(renew)
        .build()
        .unwrap()
}

/// How many connections to `url` listen to a pub/sub channel or shard channel.
pub async fn listening(url: &str) -> usize {
    let mut conn = connection(url).await;
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .unwrap();
    let count = |line: &str, field: &str| {
        line.split(' ')
            .find_map(|f| f.strip_prefix(field))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    list.lines()
        .filter(|l| count(l, "sub=") + count(l, "ssub=") > 0)
        .count()
}

/// The shared fault scenarios' view of the binary's shared `redis-server`.
pub fn service() -> super::faults::Service {
    super::faults::Service {
        more_ports: Vec::new(),
        port: super::server::redis::shared_redis().port(),
        url_for: |port| format!("redis://127.0.0.1:{port}/"),
        connect: |url, ns, ttl, handoff| {
            Box::pin(async move { client(&url, &ns, ttl, handoff, true).await })
        },
        until_queued: |ns, key, n| {
            Box::pin(async move {
                until_queued(&super::server::redis::shared_redis().url(), &ns, &key, n).await
            })
        },
        left_in: |ns| {
            Box::pin(async move {
                keys_in(&super::server::redis::shared_redis().url(), &ns)
                    .await
                    .iter()
                    .filter(|k| !k.ends_with(":fence"))
                    .count()
            })
        },
    }
}

/// The function libraries the server at `url` holds, by name.
pub async fn libraries(url: &str) -> Vec<String> {
    let listed: Vec<redis::Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .query_async(&mut connection(url).await)
        .await
        .unwrap();
    let mut names = Vec::new();
    for library in listed {
        let fields: Vec<redis::Value> = redis::from_redis_value(library).unwrap();
        for pair in fields.chunks(2) {
            let name: String = redis::from_redis_value_ref(&pair[0]).unwrap();
            if name == "library_name" {
                names.push(redis::from_redis_value_ref(&pair[1]).unwrap());
            }
        }
    }
    names
}

/// The function library a backend calls its scripts in, as its `Debug` shows it; `None` if
/// its scripts go by EVALSHA.
pub fn library_of(backend: &distlock::backend::RedisBackend) -> Option<String> {
    let shown = format!("{backend:?}");
    let rest = shown.split("library: Some(\"").nth(1)?;
    rest.split('"').next().map(str::to_owned)
}

/// Fills the server at `url` with about 10 MB and sets `maxmemory` below that, policy
/// `noeviction`: the server refuses every command that may grow memory, and still runs those
/// that do not (DEL, PEXPIRE, HDEL, ZREM).
pub async fn out_of_memory(url: &str) {
    let mut con = connection(url).await;
    // In ten calls: one call of 50,000 writes outlasted the connection's reply timeout on a
    // loaded machine.
    for from in (0..50_000).step_by(5_000) {
        let _: i64 = redis::cmd("EVAL")
            .arg("for i=ARGV[1],ARGV[1]+4999 do redis.call('SET','fill:'..i,string.rep('x',200)) end return 1")
            .arg(0)
            .arg(from)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    config_set(
        url,
        &[("maxmemory-policy", "noeviction"), ("maxmemory", "2mb")],
    )
    .await;
}

/// `CONFIG SET` of each pair on the server at `url`.
pub async fn config_set(url: &str, pairs: &[(&str, &str)]) {
    let mut con = connection(url).await;
    for (k, v) in pairs {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(k)
            .arg(v)
            .query_async(&mut con)
            .await
            .unwrap();
    }
}
