//! The holder process: one client looping on the form's keys, writing to the fenced resource with
//! each grant's token, and reporting on stdout for the driver: when it starts to wait, each
//! grant, each write, and each hold's believed interval.

use std::io::Write;
use std::time::Duration;

use distlock::LockClient;

use crate::{support, ttl, wall_ns, HolderArgs, Rng, HOLD};

/// The handoff lease the holders configure (Redis, Redlock, PostgreSQL): how long a lock handed
/// to a waiter that died stays stuck. Shorter than the 2 s default, so that a dead waiter's
/// cost stands apart from a TTL-long stall.
pub(crate) const HANDOFF: Duration = Duration::from_millis(300);
/// One round in [`LONG_EVERY`] holds this long instead of [`HOLD`], so that holds span faults
/// (a server restart, a waiter's death) and a late "lost" shows as an overlap.
pub(crate) const LONG_HOLD: Duration = Duration::from_millis(500);
pub(crate) const LONG_EVERY: u64 = 10;
/// How long a hold lasts once the driver asks (before a server restart): past the outage (3 s
/// for Redis) and the renewal that follows it, so a holder told late that its lock went with
/// the server's data shows as an overlap.
pub(crate) const EXTENDED_HOLD: Duration = Duration::from_millis(4000);
/// The lease such a hold asks for (`extend`, as a holder starting a long job does), so that it
/// outlives the outage: it must then learn from the server that its lock is gone.
pub(crate) const EXTENDED_TTL: Duration = Duration::from_millis(5000);
/// How often a holder checks `is_lost()` while it holds: a believed interval ends at the last
/// check that found the lock held.
const CHECK_EVERY: Duration = Duration::from_millis(5);
/// The semaphore of the `permits` form.
pub(crate) const PERMITS: u32 = 3;
/// The keys of the `multi` form; each round takes two of them.
pub(crate) const MULTI_KEYS: [&str; 3] = ["chaos:a", "chaos:b", "chaos:c"];

/// Every `--primitive` form.
pub(crate) const FORMS: [&str; 7] = [
    "mutex", "write", "permit", "rw", "permits", "multi", "election",
];

/// The backends with elections (the `election` form).
pub(crate) const ELECTIONS: &[&str] = &[
    "memory",
    "redis",
    "redis-sentinel",
    "redis-cluster",
    "redlock",
    "postgres",
    "postgres-pgbouncer",
    "zookeeper",
    "zookeeper-ensemble",
];

/// The keys a form's holders take.
pub(crate) fn keys_of(primitive: &str) -> Vec<&'static str> {
    if primitive == "multi" {
        MULTI_KEYS.to_vec()
    } else {
        vec!["chaos"]
    }
}

/// How many holds of one key may be believed at once (weights of `P` intervals).
pub(crate) fn capacity_of(primitive: &str) -> u32 {
    if primitive == "permits" {
        PERMITS
    } else {
        1
    }
}

/// Accepts a write only if its token passes the fence that the read-write lock's docs ask of
/// storage (the exclusive forms write only `w`): a write (`w`) needs a token at least the
/// highest write and read tokens seen, a read (`r`, or `d` after a downgrade) at least the
/// highest write token. Appends each accepted one (`mode token holder`) to the key's log.
pub(crate) const FENCED_WRITE: &str = r"
local mw = tonumber(redis.call('GET', KEYS[1]) or '0')
local mr = tonumber(redis.call('GET', KEYS[2]) or '0')
local token = tonumber(ARGV[1])
if token < mw then return 0 end
if ARGV[2] == 'w' then
  if token < mr then return 0 end
  redis.call('SET', KEYS[1], ARGV[1])
elseif token > mr then
  redis.call('SET', KEYS[2], ARGV[1])
end
redis.call('RPUSH', KEYS[3], ARGV[2] .. ' ' .. ARGV[1] .. ' ' .. ARGV[3])
return 1
";

/// The resource keys of lock key `key`: highest write token, highest read token, log.
pub(crate) fn resource_keys(key: &str) -> [String; 3] {
    [
        format!("{key}:maxw"),
        format!("{key}:maxr"),
        format!("{key}:log"),
    ]
}

/// A held lock of any primitive, as the holder loop uses it.
pub(crate) enum Held {
    Mutex(distlock::MutexGuard),
    Write(distlock::RwLockWriteGuard),
    Read(distlock::RwLockReadGuard),
    Permit(distlock::SemaphorePermit),
    Multi(distlock::MultiGuard),
    Leader(distlock::Leadership),
}

impl Held {
    pub(crate) async fn extend(&self, ttl: Duration) -> distlock::Result<()> {
        match self {
            Self::Mutex(g) => g.extend(ttl).await,
            Self::Write(g) => g.extend(ttl).await,
            Self::Read(g) => g.extend(ttl).await,
            Self::Permit(g) => g.extend(ttl).await,
            Self::Multi(g) => g.extend(ttl).await,
            Self::Leader(g) => g.extend(ttl).await,
        }
    }

    pub(crate) fn is_lost(&self) -> bool {
        match self {
            Self::Mutex(g) => g.is_lost(),
            Self::Write(g) => g.is_lost(),
            Self::Read(g) => g.is_lost(),
            Self::Permit(g) => g.is_lost(),
            Self::Multi(g) => g.is_lost(),
            Self::Leader(g) => g.is_lost(),
        }
    }

    /// Each key held, with its grant's token.
    pub(crate) fn parts(&self) -> Vec<(String, u64)> {
        let one = |t: u64| vec![("chaos".to_string(), t)];
        match self {
            Self::Mutex(g) => one(g.fencing_token()),
            Self::Write(g) => one(g.fencing_token()),
            Self::Read(g) => one(g.fencing_token()),
            Self::Permit(g) => one(g.fencing_token()),
            Self::Leader(g) => one(g.term()),
            Self::Multi(g) => g
                .fencing_tokens()
                .into_iter()
                .map(|(k, t)| (k.to_string(), t))
                .collect(),
        }
    }
}

/// What one round takes.
#[derive(Clone, Debug)]
pub(crate) enum Plan {
    Mutex,
    Write,
    Read,
    /// A write, downgraded to a read half-way through the hold.
    Downgrade,
    /// `n` permits of a semaphore of `of`.
    Permits(u32, u32),
    Multi(Vec<&'static str>),
    /// Leadership of the election `chaos` (the term is the token).
    Leader,
}

impl Plan {
    /// Picks a round of `primitive` (`rw`, `permits` and `multi` vary from round to round).
    pub(crate) fn pick(primitive: &str, rng: &mut Rng) -> Self {
        match primitive {
            "write" => Self::Write,
            "permit" => Self::Permits(1, 1),
            "election" => Self::Leader,
            "rw" => match rng.below(20) {
                0..=8 => Self::Read,
                9..=16 => Self::Write,
                _ => Self::Downgrade,
            },
            "permits" => Self::Permits(1 + rng.below(2) as u32, PERMITS),
            "multi" => {
                let skip = rng.below(3) as usize;
                Self::Multi(
                    MULTI_KEYS
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| *i != skip)
                        .map(|(_, k)| *k)
                        .collect(),
                )
            }
            _ => Self::Mutex,
        }
    }

    /// The interval mode of the hold (`X` exclusive, `R` shared with readers, `P` permits) and
    /// its weight; and the resource write mode (`None`: permits of n > 1 fence nothing).
    pub(crate) fn modes(&self) -> (char, u32, Option<char>) {
        match self {
            Self::Read => ('R', 1, Some('r')),
            Self::Permits(n, of) if *of > 1 => ('P', *n, None),
            _ => ('X', 1, Some('w')),
        }
    }
}

/// Takes what `plan` says, waiting at most `patience`.
pub(crate) async fn take(
    client: &LockClient,
    plan: &Plan,
    patience: Duration,
) -> distlock::Result<Held> {
    match plan {
        Plan::Write | Plan::Downgrade => client
            .rw_lock("chaos")
            .write_timeout(patience)
            .await
            .map(Held::Write),
        Plan::Read => client
            .rw_lock("chaos")
            .read_timeout(patience)
            .await
            .map(Held::Read),
        Plan::Permits(n, of) => client
            .semaphore("chaos", *of)
            .acquire_many_timeout(*n, patience)
            .await
            .map(Held::Permit),
        Plan::Multi(keys) => client
            .multi_lock(keys.iter().copied())
            .lock_timeout(patience)
            .await
            .map(Held::Multi),
        Plan::Mutex => client
            .mutex("chaos")
            .lock_timeout(patience)
            .await
            .map(Held::Mutex),
        Plan::Leader => client
            .election("chaos")
            .campaign_timeout(format!("pid {}", std::process::id()), patience)
            .await
            .map(Held::Leader),
    }
}

/// Writes `token` for `key` in `mode` to the fenced resource and reports it (`W`).
async fn fenced_write(
    resource: &redis::aio::MultiplexedConnection,
    id: usize,
    key: &str,
    token: u64,
    mode: char,
) {
    let check_ns = wall_ns();
    let [maxw, maxr, log] = resource_keys(key);
    let accepted: redis::RedisResult<i64> = redis::Script::new(FENCED_WRITE)
        .key(maxw)
        .key(maxr)
        .key(log)
        .arg(token)
        .arg(mode.to_string())
        .arg(id)
        .invoke_async(&mut resource.clone())
        .await;
    let write_ns = wall_ns();
    if let Ok(accepted) = accepted {
        say(&format!(
            "W {key} {mode} {token} {accepted} {check_ns} {write_ns}"
        ));
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Holds for `hold` (longer if the driver asks, see [`EXTENDED_HOLD`]), checking `is_lost()`
/// every few milliseconds, and reports the believed interval of each part (`I key mode weight
/// token call_ns start_ns end_ns believed`): from the check after the grant to the last check
/// that found it not lost. Says whether it was still believed at the end.
async fn hold_and_report(
    held: &Held,
    hold: Duration,
    extend: &tokio::sync::Notify,
    (mode, weight): (char, u32),
    call_ns: u128,
    start_ns: u128,
) -> bool {
    let mut until = tokio::time::Instant::now() + hold;
    let mut last_ok = start_ns;
    let believed = loop {
        let now = tokio::time::Instant::now();
        if now >= until {
            break true;
        }
        tokio::select! {
            () = tokio::time::sleep((until - now).min(CHECK_EVERY)) => {}
            () = extend.notified() => {
                until = tokio::time::Instant::now() + EXTENDED_HOLD;
                // ZooKeeper's lease is its session's: it keeps the session timeout.
                let _ = held.extend(EXTENDED_TTL).await;
            }
        }
        if held.is_lost() {
            break false;
        }
        last_ok = wall_ns();
    };
    for (key, token) in held.parts() {
        say(&format!(
            "I {key} {mode} {weight} {token} {call_ns} {start_ns} {last_ok} {}",
            u8::from(believed)
        ));
    }
    believed
}

/// One round: wait (`Q`), take, check, write, hold, check again, release.
async fn round(
    client: &LockClient,
    resource: &redis::aio::MultiplexedConnection,
    id: usize,
    (plan, hold): (Plan, Duration),
    extend: &tokio::sync::Notify,
) {
    say("Q");
    let call_ns = wall_ns();
    let held = match take(client, &plan, Duration::from_secs(10)).await {
        Ok(held) => held,
        Err(e) => {
            if std::env::var_os("CHAOS_DEBUG").is_some() {
                eprintln!(
                    "holder {id} pid {}: {plan:?} not taken: {e}",
                    std::process::id()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            return;
        }
    };
    if held.is_lost() {
        say("L");
        return;
    }
    let start_ns = wall_ns();
    say(&format!("G {call_ns} {start_ns}"));
    let (mode, weight, write) = plan.modes();
    if let Some(w) = write {
        for (key, token) in held.parts() {
            fenced_write(resource, id, &key, token, w).await;
        }
    }
    let believed = hold_and_report(&held, hold, extend, (mode, weight), call_ns, start_ns).await;
    if let (Plan::Downgrade, true, Held::Write(w)) = (&plan, believed, held) {
        let Ok(read) = w.downgrade().await else {
            return;
        };
        let read = Held::Read(read);
        if read.is_lost() {
            return;
        }
        let start_ns = wall_ns();
        for (key, token) in read.parts() {
            fenced_write(resource, id, &key, token, 'd').await;
        }
        // `D`: the read part of a downgraded write, with the write's token (not a new grant).
        hold_and_report(&read, HOLD, extend, ('D', 1), call_ns, start_ns).await;
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
            "redis" | "redis-sentinel" | "redis-cluster" => LockClient::builder(
                distlock::backend::RedisBackend::builder(&args.lock_url)
                    .handoff_ttl(HANDOFF)
                    .build()
                    .await
                    .expect("redis backend"),
            ),
            "postgres" => LockClient::builder(
                distlock::backend::PgBackend::builder(
                    &if std::env::var_os("CHAOS_DEBUG").is_some() {
                        format!(
                            "{}?application_name=h{}_{}",
                            args.lock_url,
                            args.id,
                            std::process::id()
                        )
                    } else {
                        args.lock_url.clone()
                    },
                )
                .handoff_ttl(HANDOFF)
                .build()
                .await
                .expect("postgres backend"),
            ),
            // Statements through the pooler, LISTEN straight to the server.
            "postgres-pgbouncer" => {
                let (pooled, direct) = args.lock_url.split_once(',').expect("two urls");
                LockClient::builder(
                    distlock::backend::PgBackend::builder(pooled)
                        .listen_url(direct)
                        .handoff_ttl(HANDOFF)
                        .build()
                        .await
                        .expect("postgres backend"),
                )
            }
            // A node that lost its data sits out a TTL, as it must to keep the lock exclusive.
            "redlock" => LockClient::builder(
                distlock::backend::RedlockBackend::builder(args.lock_url.split(','))
                    .rejoin_delay(ttl())
                    .handoff_ttl(HANDOFF)
                    .build()
                    .await
                    .expect("redlock backend"),
            ),
            _ => LockClient::builder(
                distlock::backend::ZkBackend::builder(&args.lock_url)
                    .session_timeout(ttl())
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
        .ttl(ttl())
        .build()
        .expect("client");
        let resource = redis::Client::open(args.resource_url.as_str())
            .expect("resource url")
            .get_multiplexed_async_connection()
            .await
            .expect("resource connection");
        // The driver closes our stdin to ask us to stop, and writes `H` to have the hold in
        // progress (or the next) last [`EXTENDED_HOLD`].
        let (stop_tx, mut stop) = tokio::sync::watch::channel(false);
        let extend = std::sync::Arc::new(tokio::sync::Notify::new());
        let asked = extend.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
                if line.trim() == "H" {
                    asked.notify_one();
                }
                line.clear();
            }
            let _ = stop_tx.send(true);
        });
        let mut rng = Rng(wall_ns() as u64 ^ (args.id as u64) << 48);
        while !*stop.borrow() {
            let plan = Plan::pick(primitive, &mut rng);
            let hold = if rng.below(LONG_EVERY) == 0 {
                LONG_HOLD
            } else {
                HOLD
            };
            tokio::select! {
                () = round(&client, &resource, args.id, (plan, hold), &extend) => {}
                _ = stop.changed() => break,
            }
        }
        client.shutdown().await;
    });
}
