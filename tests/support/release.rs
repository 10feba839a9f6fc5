//! What the attacks on the coalesced Redis release share (`tests/redis/release.rs`,
//! `tests/redis/release_faults.rs`): key names that stress a claim's one-string layout, many
//! locks taken and released at once by one client, waiters queued and served, and what a
//! namespace leaves behind.

use std::time::Duration;

use distlock::{LockClient, MutexGuard};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::proxy::Proxy;
use super::redis::{client, connection, keys_in, until_only_fences, until_queued};

pub fn via(proxy: &Proxy) -> String {
    format!("redis://127.0.0.1:{}/", proxy.port())
}

/// The attacks' client of `url`: leases of `ttl`, renewed, and a 300 ms handoff lease.
pub async fn renewing(url: &str, ns: &str, ttl: Duration) -> LockClient {
    client(url, ns, ttl, Duration::from_millis(300), true).await
}

/// A proxy in front of the server at `port` (`url` its own URL), a holder through the proxy
/// and a waiter straight to the server (both [`renewing`]).
pub async fn holder_behind_proxy(
    url: &str,
    port: u16,
    ns: &str,
    ttl: Duration,
) -> (Proxy, LockClient, LockClient) {
    let proxy = Proxy::start(port);
    let holder = renewing(&via(&proxy), ns, ttl).await;
    let waiter = renewing(url, ns, ttl).await;
    (proxy, holder, waiter)
}

/// Each guard's fencing token, in order.
pub fn tokens(guards: &[MutexGuard]) -> Vec<u64> {
    guards.iter().map(MutexGuard::fencing_token).collect()
}

/// Every `n`th of `keys`, from the first.
pub fn every(keys: &[String], n: usize) -> Vec<String> {
    keys.iter().step_by(n).cloned().collect()
}

/// Key names that stress the one-string layout of a claim's names: braces (the hash tag),
/// colons, unicode, the longest key allowed.
pub fn key_names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| match i % 6 {
            0 => format!("k{i}"),
            1 => format!("{{a}}:b}}{i}"),
            2 => format!("ключ ☃ {i}"),
            3 => format!("x:{i}:{{}}:c:q:w"),
            4 => {
                let tail = format!("-{i}");
                format!("{}{tail}", "L".repeat(distlock::MAX_KEY_LEN - tail.len()))
            }
            _ => format!("}}{{{i}"),
        })
        .collect()
}

/// Every key of `ns` with no expiry (PTTL -1).
pub async fn immortal(url: &str, ns: &str) -> Vec<String> {
    let mut con = connection(url).await;
    let mut out = Vec::new();
    for k in keys_in(url, ns).await {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&k)
            .query_async(&mut con)
            .await
            .unwrap();
        if pttl == -1 {
            out.push(k);
        }
    }
    out
}

/// The value of the lock key of `key` (its hold), if any.
pub async fn hold_of(url: &str, ns: &str, key: &str) -> Option<Vec<u8>> {
    let mut con = connection(url).await;
    redis::cmd("GET")
        .arg(format!("{ns}:{{{key}}}"))
        .query_async(&mut con)
        .await
        .unwrap()
}

pub async fn lock_all(client: &LockClient, keys: &[String]) -> Vec<MutexGuard> {
    futures::future::join_all(keys.iter().map(|k| {
        let mutex = client.mutex(k.clone());
        async move { mutex.lock().await.unwrap() }
    }))
    .await
}

/// A waiter of `client` on each of `keys`, each queued (server-side) before this returns.
pub async fn queue_on(
    client: &LockClient,
    url: &str,
    ns: &str,
    keys: &[String],
) -> Vec<JoinHandle<distlock::Result<MutexGuard>>> {
    queue_behind(client, url, ns, keys, 1).await
}

/// A waiter of `client` on each of `keys`, returned once `depth` waiters are queued
/// (server-side) on each key: the ones queued before and this one.
pub async fn queue_behind(
    client: &LockClient,
    url: &str,
    ns: &str,
    keys: &[String],
    depth: usize,
) -> Vec<JoinHandle<distlock::Result<MutexGuard>>> {
    let mut waits = Vec::new();
    for k in keys {
        let mutex = client.mutex(k.clone());
        waits.push(tokio::spawn(async move { mutex.lock().await }));
    }
    for k in keys {
        until_queued(url, ns, k, depth).await;
    }
    waits
}

/// Releases every guard at once (one client: they coalesce), each from its own task; the
/// results in order.
pub fn release_all(guards: Vec<MutexGuard>) -> Vec<JoinHandle<distlock::Result<()>>> {
    guards
        .into_iter()
        .map(|g| tokio::spawn(g.release()))
        .collect()
}

/// Releases every guard at once (see [`release_all`]) and waits for each: every one must
/// succeed.
pub async fn release_all_ok(guards: Vec<MutexGuard>) {
    for r in release_all(guards) {
        r.await.unwrap().unwrap();
    }
}

/// Releases each guard in turn (the served waiters letting go): every one must succeed.
pub async fn release_each<K>(guards: Vec<(K, MutexGuard)>) {
    for (_, g) in guards {
        g.release().await.unwrap();
    }
}

/// The holds (lock key values) of `keys`, in order (see [`hold_of`]).
pub async fn holds_of(url: &str, ns: &str, keys: &[String]) -> Vec<Option<Vec<u8>>> {
    let mut holds = Vec::new();
    for k in keys {
        holds.push(hold_of(url, ns, k).await);
    }
    holds
}

/// Each of `keys` whose hold is no longer the one it had (`before`, from [`holds_of`]), and
/// each guard of `taken` (the new owner's, in the order of `keys`) that turned lost.
pub async fn holds_changed(
    url: &str,
    ns: &str,
    keys: &[String],
    taken: &[MutexGuard],
    before: &[Option<Vec<u8>>],
) -> Vec<String> {
    let mut bad = Vec::new();
    for ((k, g), was) in keys.iter().zip(taken).zip(before) {
        let now = hold_of(url, ns, k).await;
        if now.is_none() || now.as_ref() != was.as_ref() {
            bad.push(format!("{}: hold {was:?} became {now:?}", short(k)));
        }
        if g.is_lost() {
            bad.push(format!("{}: the new owner's guard is lost", short(k)));
        }
    }
    bad
}

/// Waits for each waiter up to `within` from now: the guard, or why not.
pub async fn served(
    keys: &[String],
    waits: Vec<JoinHandle<distlock::Result<MutexGuard>>>,
    within: Duration,
) -> (Vec<(String, MutexGuard)>, Vec<String>) {
    let deadline = Instant::now() + within;
    let (mut ok, mut bad) = (Vec::new(), Vec::new());
    for (k, wait) in keys.iter().zip(waits) {
        match tokio::time::timeout_at(deadline, wait).await {
            Ok(Ok(Ok(g))) => ok.push((k.clone(), g)),
            Ok(Ok(Err(e))) => bad.push(format!("{}: {e}", short(k))),
            Ok(Err(e)) => bad.push(format!("{}: panicked {e}", short(k))),
            Err(_) => bad.push(format!("{}: not served within {within:?}", short(k))),
        }
    }
    (ok, bad)
}

pub fn short(k: &str) -> String {
    k.chars()
        .rev()
        .take(24)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect()
}

/// Each of `served` (key, guard) whose token is not above the token `keys`' holder had
/// (`tokens`, in the order of `keys`).
pub fn went_back(keys: &[String], tokens: &[u64], served: &[(String, MutexGuard)]) -> Vec<String> {
    let mut back = Vec::new();
    for (k, g) in served {
        let Some(i) = keys.iter().position(|x| x == k) else {
            continue;
        };
        if g.fencing_token() <= tokens[i] {
            back.push(format!(
                "{}: {} after {}",
                short(k),
                g.fencing_token(),
                tokens[i]
            ));
        }
    }
    back
}

/// Waits until only fence counters are left in `ns`, and checks every key has an expiry.
pub async fn nothing_left(url: &str, ns: &str) {
    until_only_fences(url, ns).await;
    assert_eq!(immortal(url, ns).await, Vec::<String>::new());
}

/// Waits for the waiters of `waited` (see [`served`]), then checks each one's token is above
/// the one `keys`' holder had (`tokens`, in the order of `keys`) and releases it; prints when
/// they were served after `since`. Returns what went wrong.
pub async fn serve_and_check(
    keys: &[String],
    tokens: &[u64],
    waited: &[String],
    waits: Vec<JoinHandle<distlock::Result<MutexGuard>>>,
    within: Duration,
    since: Instant,
) -> Vec<String> {
    let (ok, mut bad) = served(waited, waits, within).await;
    println!(
        "{} of {} waiters served {:?} after the releases",
        ok.len(),
        waited.len(),
        since.elapsed()
    );
    bad.extend(went_back(keys, tokens, &ok));
    for (k, g) in ok {
        if let Err(e) = g.release().await {
            bad.push(format!("{}: release {e}", short(&k)));
        }
    }
    bad
}

/// Locks of one client with another client's waiters queued behind some of them: what a
/// coalesced release must hand on.
pub struct Handoff {
    /// Every key locked.
    pub keys: Vec<String>,
    /// The holder's fencing token on each of `keys`, in order.
    pub tokens: Vec<u64>,
    /// The keys waited on, each with its waiter in `waits`.
    pub waited: Vec<String>,
    pub waits: Vec<JoinHandle<distlock::Result<MutexGuard>>>,
}

impl Handoff {
    /// `n` keys (see [`key_names`]) locked by `holder`, with a waiter of `waiter` queued on
    /// every `step`th (on the server at `url`, see [`queue_on`]); the holder's guards in the
    /// order of the keys.
    pub async fn set_up(
        holder: &LockClient,
        waiter: &LockClient,
        url: &str,
        ns: &str,
        n: usize,
        step: usize,
    ) -> (Self, Vec<MutexGuard>) {
        let keys = key_names(n);
        let guards = lock_all(holder, &keys).await;
        let tokens = tokens(&guards);
        let waited = every(&keys, step);
        let waits = queue_on(waiter, url, ns, &waited).await;
        let handoff = Self {
            keys,
            tokens,
            waited,
            waits,
        };
        (handoff, guards)
    }

    /// Each waiter served within `within` with a token above its holder's, then released (see
    /// [`serve_and_check`]; `since`: when the releases began). Returns what went wrong.
    pub async fn served_after(self, within: Duration, since: Instant) -> Vec<String> {
        serve_and_check(
            &self.keys,
            &self.tokens,
            &self.waited,
            self.waits,
            within,
            since,
        )
        .await
    }
}
