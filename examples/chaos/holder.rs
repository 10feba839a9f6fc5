//! The holder process: one client looping on the key, writing to the fenced resource with each
//! grant's token, and reporting each grant on stdout for the driver.

use std::io::Write;
use std::time::Duration;

use distlock::LockClient;

use crate::{support, wall_ns, HolderArgs, HOLD, TTL};

/// Accepts a write only if its token is at least the highest seen; appends accepted ones.
pub(crate) const FENCED_WRITE: &str = r"
local max = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token < max then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2])
return 1
";

// The holder process (Redis, ZooKeeper).

/// A held lock of any primitive, as the holder loop uses it.
pub(crate) enum Held {
    Mutex(distlock::MutexGuard),
    Write(distlock::RwLockWriteGuard),
    Permit(distlock::SemaphorePermit),
}

impl Held {
    pub(crate) fn is_lost(&self) -> bool {
        match self {
            Self::Mutex(g) => g.is_lost(),
            Self::Write(g) => g.is_lost(),
            Self::Permit(g) => g.is_lost(),
        }
    }

    pub(crate) fn fencing_token(&self) -> u64 {
        match self {
            Self::Mutex(g) => g.fencing_token(),
            Self::Write(g) => g.fencing_token(),
            Self::Permit(g) => g.fencing_token(),
        }
    }
}

/// Takes `primitive` on key `chaos`, waiting at most `patience`.
pub(crate) async fn take(
    client: &LockClient,
    primitive: &str,
    patience: Duration,
) -> distlock::Result<Held> {
    match primitive {
        "write" => client
            .rw_lock("chaos")
            .write_timeout(patience)
            .await
            .map(Held::Write),
        "permit" => client
            .semaphore("chaos", 1)
            .acquire_timeout(patience)
            .await
            .map(Held::Permit),
        _ => client
            .mutex("chaos")
            .lock_timeout(patience)
            .await
            .map(Held::Mutex),
    }
}

pub(crate) fn holder_main(args: HolderArgs, backend: &str, primitive: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let client = match backend {
            "redis" => LockClient::builder(
                distlock::backend::RedisBackend::connect(&args.lock_url)
                    .await
                    .expect("redis backend"),
            ),
            "postgres" => LockClient::builder(
                distlock::backend::PgBackend::connect(&args.lock_url)
                    .await
                    .expect("postgres backend"),
            ),
            // A node that lost its data sits out a TTL, as it must to keep the lock exclusive.
            "redlock" => LockClient::builder(
                distlock::backend::RedlockBackend::builder(args.lock_url.split(','))
                    .rejoin_delay(TTL)
                    .build()
                    .await
                    .expect("redlock backend"),
            ),
            _ => LockClient::builder(
                distlock::backend::ZkBackend::builder(&args.lock_url)
                    .session_timeout(TTL)
                    // The test servers' tickTime (tests/support): the lease proof waits a
                    // fraction of it, and the 2 s default would make most grants of a 2 s
                    // session wait.
                    .server_tick(support::zk::SERVER_TICK)
                    .call_timeout(Duration::from_millis(500))
                    .build()
                    .await
                    .expect("zookeeper backend"),
            ),
        }
        .namespace(&args.ns)
        .ttl(TTL)
        .build()
        .expect("client");
        let resource = redis::Client::open(args.resource_url.as_str())
            .expect("resource url")
            .get_multiplexed_async_connection()
            .await
            .expect("resource connection");
        let script = redis::Script::new(FENCED_WRITE);
        // The driver closes our stdin to ask us to stop.
        let (stop_tx, mut stop) = tokio::sync::watch::channel(false);
        std::thread::spawn(move || {
            let mut sink = String::new();
            while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
            let _ = stop_tx.send(true);
        });
        let mut out = std::io::stdout();
        while !*stop.borrow() {
            let got = tokio::select! {
                g = take(&client, primitive, Duration::from_secs(10)) => g,
                _ = stop.changed() => break,
            };
            let Ok(guard) = got else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            if guard.is_lost() {
                let _ = writeln!(out, "L");
                continue;
            }
            let check_ns = wall_ns();
            let mut conn = resource.clone();
            let accepted: redis::RedisResult<i64> = script
                .key("chaos:max")
                .key("chaos:log")
                .arg(guard.fencing_token())
                .arg(args.id)
                .invoke_async(&mut conn)
                .await;
            let write_ns = wall_ns();
            if let Ok(accepted) = accepted {
                let _ = writeln!(
                    out,
                    "W {} {} {check_ns} {write_ns}",
                    guard.fencing_token(),
                    accepted
                );
            }
            tokio::time::sleep(HOLD).await;
            drop(guard);
        }
        client.shutdown().await;
    });
}
