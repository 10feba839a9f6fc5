//! Redlock: one lock over N ≥ 3 independent Redis nodes, held while a majority of them hold it.
//! How it works, and why its fencing tokens increase, is on [`RedlockBackend`].

mod inspection;
mod node;
mod quorum;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex as StdMutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::redis::script::{Call, Script};
use futures::future::join_all;
use tokio::sync::watch;
use tokio::time::Instant;

use self::inspection::NodeView;
use self::node::Node;
pub use self::node::RedlockNode;
use self::quorum::{held_until, quorum};
use super::handoff::{
    before, check_handoff_ttl, client_id, earliest, fence_of, kind_mismatch, next_in_line, recheck,
    Mailbox, ServerClock, Wake, DEFAULT_HANDOFF_TTL,
};
use super::redis::notify::Subscription;
use super::redis::Keys as RedisKeys;
use super::redis::{millis, FENCE_TTL};
use super::{Attempt, Backend, Claim, Grant, LockKind, Renewal, MIN_RENEW_CALL};
use crate::error::{Error, ErrorKind, Result};
use crate::inspect::Inspection;

/// How long one node may take to answer before it counts as not granting.
const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(200);
/// How long a waiter that heard of grants from a minority of nodes waits for the rest before
/// it asks every node.
const SPLIT_GRACE: Duration = Duration::from_millis(10);
/// How long a node that lost its data sits out.
const DEFAULT_REJOIN_DELAY: Duration = crate::DEFAULT_TTL;

fn script(body: &str) -> Script {
    Script::new(&format!(
        "{}\n{}\n{}\n{}\n{}",
        include_str!("../redis/scripts/common.lua"),
        crate::backend::redis::SHARED_LUA,
        crate::backend::redis::RENEWAL_LUA,
        include_str!("scripts/quorum.lua"),
        body
    ))
}

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| script(include_str!("scripts/acquire.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| script(include_str!("scripts/release.lua")));
static SETTLE: LazyLock<Script> = LazyLock::new(|| script(include_str!("scripts/settle.lua")));
static YIELD: LazyLock<Script> = LazyLock::new(|| script(include_str!("scripts/yield.lua")));
static RENEW: LazyLock<Script> = LazyLock::new(|| script(include_str!("scripts/renew.lua")));
static INSPECT: LazyLock<Script> = LazyLock::new(|| script(include_str!("scripts/inspect.lua")));
static ACQUIRE_SHARED: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/acquire_shared.lua")));
static YIELD_SHARED: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/yield_shared.lua")));
// The single-node read-write lock scripts, gated by the node's rejoin delay.
static RELEASE_SHARED: LazyLock<Script> = LazyLock::new(|| {
    script(concat!(
        include_str!("scripts/gated.lua"),
        include_str!("../redis/scripts/release_shared.lua")
    ))
});
static DOWNGRADE: LazyLock<Script> = LazyLock::new(|| {
    script(concat!(
        include_str!("scripts/gated.lua"),
        include_str!("../redis/scripts/downgrade.lua")
    ))
});

/// Locks held by a majority of independent Redis nodes (Redlock), with fencing tokens that
/// strictly increase across the quorum and FIFO handoff announced over each node's pub/sub.
///
/// Each node keeps the single-node layout (lease hash, fencing counter) with a queue ordered by
/// *priority* instead of arrival: the waiter's own wall clock in µs when it first queued, sent
/// to every node. So every node that knows the same waiters hands a free lock to the same one,
/// and a release that reaches all nodes makes one waiter the holder of all of them.
///
/// **Acquire** runs the node script on every node at once, each call bounded by the node
/// timeout. A majority of grants within it is a grant, valid until the majority's leases end
/// (measured from when each request was sent; the layer above subtracts the clock-drift margin,
/// 1% of the TTL plus 2 ms). Fewer: a `try_lock` releases everywhere; a waiter keeps its queue
/// entries, cuts the grants it got to the short handoff lease and waits for grant messages.
///
/// **Fencing across the quorum.** Each node keeps its own counter. The granting client takes
/// `T` = the largest token its quorum returned and, before the guard is returned, raises the
/// counter of every node it holds to at least `T` *while still holding it* (one script checks
/// the owner and raises). So on every node the client held, any later grant there gets a token
/// above `T`. Two majorities share a node, and whoever held that node later was granted later:
/// its token is above the earlier holder's `T`. When the quorum's nodes all returned `T`
/// already (the usual case once counters are in step), no raise is needed: 1 round trip.
///
/// **A node that lost its data** (restarted without persistence) may have forgotten a grant,
/// so it sits out for [`rejoin_delay`](RedlockBackendBuilder::rejoin_delay) (the Redlock
/// paper's advice): each node records when it first served the namespace (`<ns>:born`, which
/// vanishes only with the data) and grants nothing until that long after. Its fencing counter
/// restarts at its clock in µs, above every token issued before as long as nodes' clocks
/// agree within the time it was down.
///
/// **Fairness when nodes disagree.** A node that missed a waiter's queue entry (it was down, or
/// the call timed out) may hand the lock to the next waiter instead. A waiter that hears of
/// grants from only a minority asks every node 10 ms later, queues again where it was missing,
/// and hands each minority grant on to a better-placed waiter queued on that node; what it keeps
/// it keeps under the short handoff lease only, never renewed, so at worst the nodes hand the
/// lock on in priority order when that lease runs out. Priority is the waiter's clock, so
/// clients whose clocks differ by `d` may be served up to `d` out of arrival order; nobody
/// starves.
///
/// **Read-write locks** keep the single-node layout on each node (holders with leases, readers
/// together, one writer alone), queued by priority like mutexes. They are sound under
/// majorities: a writer's majority and any other holder's majority share a node, where the two
/// exclude each other. Readers granted together each hold their own majority, each with its
/// own token; [`downgrade`](crate::RwLockWriteGuard::downgrade) turns the write hold into a
/// read hold on every node and counts while a majority did.
///
/// Semaphores are refused: permits counted per node do not add up under majorities (three
/// holders of a 2-permit semaphore can each hold a different majority of three nodes).
/// Multi-locks (mutexes in a fixed order) work.
///
/// [`inspect`](crate::LockClient::inspect) asks every node: the holder is the claim holding a
/// majority, waiters are the claims queued on any node, in priority order.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use distlock::{backend::RedlockBackend, LockClient};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let backend = RedlockBackend::builder([
///     "redis://10.0.0.1:6379/",
///     "redis://10.0.0.2:6379/",
///     "redis://10.0.0.3:6379/",
/// ])
/// .node_timeout(Duration::from_millis(100))
/// .build()
/// .await?;
/// let client = LockClient::builder(backend).namespace("billing").build()?;
/// let guard = client.mutex("invoice:7").lock().await?;
/// println!("token {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<Node>,
    quorum: usize,
    handoff_ttl: Duration,
    rejoin_delay: Duration,
    node_timeout: Duration,
    client_id: String,
    reconnects: Arc<watch::Sender<u64>>,
}

impl std::fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockBackend")
            .field(
                "nodes",
                &self.inner.nodes.iter().map(|n| &n.name).collect::<Vec<_>>(),
            )
            .field("quorum", &self.inner.quorum)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedlockBackend`]. Created by [`RedlockBackend::builder`].
#[must_use = "builder does nothing itself, use `.build()` to build it"]
#[derive(Debug)]
pub struct RedlockBackendBuilder {
    nodes: Vec<RedlockNode>,
    node_timeout: Duration,
    handoff_ttl: Duration,
    rejoin_delay: Duration,
}

impl RedlockBackend {
    /// Starts building a backend over independent nodes: URLs
    /// (`redis://[user:password@]host:port/db` each) or [`RedlockNode`]s, which may send
    /// their commands through a pool; at least three, an odd number is best.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let err = distlock::backend::RedlockBackend::builder(["redis://127.0.0.1:1/"])
    ///     .build()
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_invalid_config()); // one node is not a Redlock
    /// # }
    /// ```
    pub fn builder<I, N>(nodes: I) -> RedlockBackendBuilder
    where
        I: IntoIterator<Item = N>,
        N: Into<RedlockNode>,
    {
        RedlockBackendBuilder {
            nodes: nodes.into_iter().map(Into::into).collect(),
            node_timeout: DEFAULT_NODE_TIMEOUT,
            handoff_ttl: DEFAULT_HANDOFF_TTL,
            rejoin_delay: DEFAULT_REJOIN_DELAY,
        }
    }

    /// Connects to `nodes` (URLs or [`RedlockNode`]s) with the defaults.
    ///
    /// # Errors
    ///
    /// See [`RedlockBackendBuilder::build`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is left behind but background pub/sub tasks that stop when the
    /// backend is dropped.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let backend = distlock::backend::RedlockBackend::connect([
    ///     "redis://10.0.0.1:6379/",
    ///     "redis://10.0.0.2:6379/",
    ///     "redis://10.0.0.3:6379/",
    /// ])
    /// .await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect<I, N>(nodes: I) -> Result<Self>
    where
        I: IntoIterator<Item = N>,
        N: Into<RedlockNode>,
    {
        Self::builder(nodes).build().await
    }

    /// The nodes of a `redlock://[user:password@]host:port,host:port,host:port[/db]` URL, as
    /// `redis://` URLs.
    pub(crate) fn urls_of(url: &str) -> Result<Vec<String>> {
        super::redis::hosts_of(url, "redlock://")
    }
}

impl RedlockBackendBuilder {
    /// How long one node may take to answer a call (including connecting) before it counts as
    /// not granting. Keep it far below the TTL: an acquisition waits at most this long for the
    /// slowest node, and the time spent is taken off the lease. Defaults to 200 ms.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// The lease a node gives a lock it handed to a waiter, until the waiter has a quorum and
    /// confirms it. Bounds how long a lock handed to a waiter that just died, or to a waiter
    /// that cannot reach a quorum, stays stuck. Defaults to 2 seconds.
    pub fn handoff_ttl(mut self, ttl: Duration) -> Self {
        self.handoff_ttl = ttl;
        self
    }

    /// How long a node that lost its data (or serves a namespace for the first time) grants
    /// nothing: at least the longest TTL your locks use, so that every lease it may have
    /// forgotten has run out before it counts again. Defaults to
    /// [`DEFAULT_TTL`](crate::DEFAULT_TTL) (30 s). Zero is safe only if every node persists
    /// each write before answering (`appendfsync always`).
    pub fn rejoin_delay(mut self, delay: Duration) -> Self {
        self.rejoin_delay = delay;
        self
    }

    /// Checks the settings and that a quorum of the nodes answers. Nodes that do not answer
    /// are connected to in the background; they count again once they do.
    ///
    /// # Errors
    ///
    /// - [`InvalidConfig`](crate::ErrorKind::InvalidConfig) for fewer than three nodes, a
    ///   node named twice, a malformed URL, a zero node timeout or a handoff TTL under 10 ms,
    /// - [`Backend`](crate::ErrorKind::Backend) if fewer than a quorum of nodes answer,
    /// - [`NoRuntime`](crate::ErrorKind::NoRuntime) outside a Tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let same = "redis://127.0.0.1:1/";
    /// let err = distlock::backend::RedlockBackend::builder([same, same, same])
    ///     .build()
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_invalid_config()); // a node counted twice would fake a quorum
    /// # }
    /// ```
    pub async fn build(self) -> Result<RedlockBackend> {
        if self.nodes.len() < 3 {
            return Err(Error::invalid_config(format_args!(
                "redlock needs at least 3 independent nodes, got {}",
                self.nodes.len()
            )));
        }
        if self.node_timeout.is_zero() {
            return Err(Error::invalid_config(
                "redlock node timeout must not be zero",
            ));
        }
        check_handoff_ttl(self.handoff_ttl)?;
        tokio::runtime::Handle::try_current().map_err(|_| Error::no_runtime())?;
        let mut nodes: Vec<Node> = Vec::with_capacity(self.nodes.len());
        for node in self.nodes {
            let node = Node::new(node, self.node_timeout)?;
            if nodes.iter().any(|n| n.name == node.name) {
                return Err(Error::invalid_config(format_args!(
                    "redlock node {} is named twice",
                    node.name
                )));
            }
            nodes.push(node);
        }
        let q = quorum(nodes.len());
        let probe = Script::new("return 1");
        let probe = probe.prepare_invoke();
        let probes = join_all(nodes.iter().map(|n| n.call::<i64>("connect", &probe))).await;
        let answered = probes.iter().filter(|p| p.is_ok()).count();
        if answered < q {
            let mut err = Error::new(
                ErrorKind::Backend,
                format!(
                    "redlock: only {answered} of {} nodes answered, a quorum needs {q}",
                    nodes.len()
                ),
            );
            // Passing only if every node that failed was unreachable: a refusal (credentials,
            // permissions) stays.
            if probes
                .iter()
                .all(|p| p.as_ref().map_or_else(Error::is_transient, |_| true))
            {
                err = err.transient();
            }
            if let Some(Err(cause)) = probes.into_iter().find(Result::is_err) {
                err = err.with_source(cause);
            }
            return Err(err);
        }
        let reconnects = Arc::new(watch::Sender::new(0));
        for node in &nodes {
            let mut rx = node.hub.reconnects();
            let tx = Arc::downgrade(&reconnects);
            tokio::spawn(async move {
                while rx.changed().await.is_ok() {
                    let Some(tx) = tx.upgrade() else { return };
                    tx.send_modify(|n| *n += 1);
                }
            });
        }
        Ok(RedlockBackend {
            inner: Arc::new(Inner {
                nodes,
                quorum: q,
                handoff_ttl: self.handoff_ttl,
                rejoin_delay: self.rejoin_delay,
                node_timeout: self.node_timeout,
                client_id: client_id(),
                reconnects,
            }),
        })
    }
}

/// One lock's key names, the same on every node, and the claim's owner token: the single-node
/// names (queues under names of their own, `:rq` and `:rw`, since here they are zsets by
/// priority), and the node's `born` mark.
struct Keys {
    names: RedisKeys,
    born: String,
}

impl std::ops::Deref for Keys {
    type Target = RedisKeys;

    fn deref(&self) -> &RedisKeys {
        &self.names
    }
}

impl Keys {
    fn new(claim: &Claim, client_id: &str) -> Self {
        Self::named(claim.namespace(), claim.key(), client_id, claim.owner())
    }

    fn named(namespace: &str, key: &str, client_id: &str, claim_owner: &str) -> Self {
        Self {
            names: RedisKeys::layout(namespace, key, client_id, claim_owner, "rq", "rw"),
            born: format!("{namespace}:born"),
        }
    }

    /// A call of `script` with the single-node scripts' keys (see [`RedisKeys::add_keys`]), then
    /// the node's `born` mark.
    fn invoke<'a>(&self, script: &'a Script, shared: bool) -> Call<'a> {
        let mut inv = script.prepare_invoke();
        self.names.add_keys(&mut inv, shared);
        inv.key(&self.born);
        inv
    }

    /// The claim's queue entry: its owner for a mutex, `<r|w>:<owner>` for a read-write lock.
    fn entry(&self, kind: LockKind) -> String {
        match shared_kind(kind) {
            Some(k) => format!("{k}:{}", self.owner),
            None => self.owner.clone(),
        }
    }
}

/// `r` or `w` for a read-write lock claim, `None` for a mutex.
fn shared_kind(kind: LockKind) -> Option<&'static str> {
    match kind {
        LockKind::Read => Some("r"),
        LockKind::Write => Some("w"),
        _ => None,
    }
}

/// What one claim keeps between calls: its priority, whether it holds a quorum, and per node
/// its subscription while it waits and the pairing of local and server clocks.
#[derive(Default)]
pub struct RedlockTicket {
    priority: OnceLock<u64>,
    held: AtomicBool,
    nodes: OnceLock<Vec<NodeTicket>>,
}

#[derive(Default)]
struct NodeTicket {
    sub: StdMutex<Option<Subscription>>,
    clock: ServerClock,
}

impl std::fmt::Debug for RedlockTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockTicket")
            .field("held", &self.held.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl RedlockTicket {
    fn nodes(&self, n: usize) -> &[NodeTicket] {
        self.nodes
            .get_or_init(|| (0..n).map(|_| NodeTicket::default()).collect())
    }

    /// The waiter's place, the same on every node: this machine's clock in µs when it first
    /// asked.
    fn priority(&self) -> u64 {
        *self.priority.get_or_init(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        })
    }

    fn unsubscribe(&self) {
        for node in self.nodes.get().into_iter().flatten() {
            let old = node.sub.lock().unwrap_or_else(|p| p.into_inner()).take();
            drop(old);
        }
    }

    fn holds(&self, granted: Grant) -> Grant {
        self.held.store(true, Ordering::Release);
        self.unsubscribe();
        granted
    }
}

/// One node's answer to an acquisition.
enum Reply {
    /// The lock is ours there, with `lease` left of it from when the request was sent.
    Granted {
        fence: u64,
        lease: Duration,
        sent: Instant,
    },
    /// Not ours there: look again at `until` (the holder's lease end) at the latest.
    Queued { until: Instant },
    /// The key is in use as another kind of lock there (the family it is).
    Mismatch(String),
    /// No usable answer in time.
    Failed(Error),
}

/// A lock we hold on one node, as the quorum check sees it.
struct Held {
    node: usize,
    fence: u64,
    /// Granted in this very call with the full TTL.
    fresh: bool,
    until: Instant,
}

impl RedlockBackend {
    fn no_quorum(&self, answered: usize, what: &str) -> Error {
        Error::new(
            ErrorKind::Backend,
            format!(
                "redlock {what}: only {answered} of {} nodes answered, a quorum needs {}",
                self.inner.nodes.len(),
                self.inner.quorum
            ),
        )
        .transient()
    }

    /// Runs the acquire script on every node at once.
    async fn ask_all(
        &self,
        claim: &Claim,
        ticket: &RedlockTicket,
        keys: &Keys,
        wait: bool,
    ) -> Vec<Reply> {
        let shared = shared_kind(claim.kind());
        let mut inv = keys.invoke(
            if shared.is_some() {
                &ACQUIRE_SHARED
            } else {
                &ACQUIRE
            },
            shared.is_some(),
        );
        inv.arg(&keys.owner)
            .arg(millis(claim.ttl()))
            .arg(u8::from(wait))
            .arg(ticket.priority())
            .arg(millis(FENCE_TTL))
            .arg(millis(self.inner.handoff_ttl))
            .arg(&keys.channels)
            .arg(self.rejoin_ms());
        if let Some(kind) = shared {
            inv.arg(kind);
        }
        let tickets = ticket.nodes(self.inner.nodes.len());
        let calls = self.inner.nodes.iter().zip(tickets).map(|(node, nt)| {
            let inv = &inv;
            async move {
                match node
                    .call::<(i64, ::redis::Value, i64)>("acquire", inv)
                    .await
                {
                    Ok(((-1, family, _), _)) => {
                        Reply::Mismatch(::redis::from_redis_value_ref(&family).unwrap_or_default())
                    }
                    Ok(((1, fence, lease), sent)) => {
                        let fence = ::redis::from_redis_value_ref::<i64>(&fence)
                            .map_err(|e| {
                                Error::new(ErrorKind::Backend, "redlock: unexpected acquire reply")
                                    .with_source(e)
                            })
                            .and_then(|f| fence_of("redis", f));
                        match fence {
                            Ok(fence) => Reply::Granted {
                                fence,
                                lease: Duration::from_millis(u64::try_from(lease).unwrap_or(0)),
                                sent,
                            },
                            Err(e) => Reply::Failed(e),
                        }
                    }
                    Ok(((_, wait_ms, server_ms), sent)) => {
                        let wait_ms = ::redis::from_redis_value_ref::<i64>(&wait_ms).unwrap_or(-2);
                        nt.clock.pair(sent, server_ms);
                        // A lease without expiry (-1) cannot be ours to wait out: look again
                        // within a TTL; nobody holding it (-2): within the handoff lease.
                        let wait_for = match wait_ms {
                            -1 => claim.ttl(),
                            ms => u64::try_from(ms).map_or(self.inner.handoff_ttl, |ms| {
                                Duration::from_millis(ms.max(1))
                            }),
                        };
                        Reply::Queued {
                            until: Instant::now() + wait_for,
                        }
                    }
                    Err(e) => Reply::Failed(e),
                }
            }
        });
        join_all(calls).await
    }

    /// Makes the locks in `held` one grant: token `T` = the largest of theirs; every node's
    /// counter raised to `T` and its lease set to the full TTL while we still hold it there,
    /// unless a quorum of them was freshly granted at `T` already. `None` if fewer than a
    /// quorum could be settled.
    async fn settle(&self, claim: &Claim, keys: &Keys, held: &[Held]) -> Option<Grant> {
        let shared = shared_kind(claim.kind()).is_some();
        let q = self.inner.quorum;
        let token = held.iter().map(|h| h.fence).max()?;
        let ready: Vec<Instant> = held
            .iter()
            .filter(|h| h.fresh && h.fence == token)
            .map(|h| h.until)
            .collect();
        if let Some(valid_until) = held_until(ready, q) {
            return Some(Grant {
                fence: token,
                valid_until,
            });
        }
        let settled = self
            .settle_nodes(keys, held, claim.ttl(), token, shared)
            .await;
        let valid_until = held_until(
            settled.into_iter().map(|sent| sent + claim.ttl()).collect(),
            q,
        )?;
        Some(Grant {
            fence: token,
            valid_until,
        })
    }

    /// Sets the lease of our lock on each node of `held` to `px` and raises its counter to
    /// `token`; returns when each node that still held it was asked.
    async fn settle_nodes(
        &self,
        keys: &Keys,
        held: &[Held],
        px: Duration,
        token: u64,
        shared: bool,
    ) -> Vec<Instant> {
        let mut inv = SETTLE.prepare_invoke();
        inv.key(&keys.lock)
            .key(&keys.fence)
            .key(&keys.holders)
            .arg(&keys.owner)
            .arg(millis(px))
            .arg(token)
            .arg(millis(FENCE_TTL))
            .arg(u8::from(shared));
        let calls = held.iter().map(|h| {
            let inv = &inv;
            async move {
                match self
                    .inner
                    .nodes
                    .get(h.node)?
                    .call::<i64>("settle", inv)
                    .await
                {
                    Ok((1, sent)) => Some(sent),
                    _ => None,
                }
            }
        });
        join_all(calls).await.into_iter().flatten().collect()
    }

    /// Runs the yield script on the nodes of a minority hold.
    async fn yield_minority(
        &self,
        claim: &Claim,
        ticket: &RedlockTicket,
        keys: &Keys,
        held: &[Held],
    ) {
        let shared = shared_kind(claim.kind()).is_some();
        let mut inv = keys.invoke(if shared { &YIELD_SHARED } else { &YIELD }, shared);
        inv.arg(&keys.owner)
            .arg(ticket.priority())
            .arg(millis(claim.ttl()))
            .arg(millis(FENCE_TTL))
            .arg(millis(self.inner.handoff_ttl))
            .arg(&keys.channels);
        if shared {
            inv.arg(keys.entry(claim.kind()));
        }
        let calls = held.iter().filter_map(|h| {
            let node = self.inner.nodes.get(h.node)?;
            let inv = &inv;
            Some(async move { node.call::<i64>("yield", inv).await })
        });
        join_all(calls).await;
    }

    /// Releases the claim on every node; returns how many said it held the lock there, and how
    /// many could not be asked.
    async fn release_on(&self, claim: &Claim, keys: &Keys) -> (usize, usize) {
        let shared = shared_kind(claim.kind()).is_some();
        let mut inv = keys.invoke(if shared { &RELEASE_SHARED } else { &RELEASE }, shared);
        inv.arg(&keys.owner)
            .arg(millis(FENCE_TTL))
            .arg(millis(self.inner.handoff_ttl))
            .arg(&keys.channels);
        if shared {
            inv.arg(keys.entry(claim.kind()));
        }
        inv.arg(self.rejoin_ms());
        let calls = self.inner.nodes.iter().map(|node| {
            let inv = &inv;
            async move { node.call::<i64>("release", inv).await }
        });
        let replies = join_all(calls).await;
        let held = replies.iter().filter(|r| matches!(r, Ok((1, _)))).count();
        let failed = replies.iter().filter(|r| r.is_err()).count();
        (held, failed)
    }

    fn rejoin_ms(&self) -> u64 {
        u64::try_from(self.inner.rejoin_delay.as_millis()).unwrap_or(u64::MAX)
    }

    /// One round: ask every node; a quorum of grants is settled into one grant.
    async fn round(
        &self,
        claim: &Claim,
        ticket: &RedlockTicket,
        keys: &Keys,
        wait: bool,
    ) -> Result<Attempt> {
        let replies = self.ask_all(claim, ticket, keys, wait).await;
        let mut held = Vec::new();
        let mut failed = 0;
        let mut recheck_at: Option<Instant> = None;
        let mut first_error = None;
        let mut mismatch = None;
        for (node, reply) in replies.into_iter().enumerate() {
            match reply {
                Reply::Granted { fence, lease, sent } => {
                    let until = sent + lease;
                    held.push(Held {
                        node,
                        fence,
                        fresh: lease >= claim.ttl(),
                        until,
                    });
                }
                Reply::Queued { until } => earliest(&mut recheck_at, until),
                Reply::Mismatch(family) => {
                    mismatch.get_or_insert(family);
                }
                Reply::Failed(e) => {
                    failed += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(family) = mismatch {
            // Another kind of lock holds the key (the layer above releases whatever of ours a
            // node kept, as after any error).
            return Err(kind_mismatch(claim.key(), &family, claim.kind()));
        }
        let n = self.inner.nodes.len();
        if held.len() >= self.inner.quorum {
            if let Some(grant) = self.settle(claim, keys, &held).await {
                return Ok(Attempt::Granted(ticket.holds(grant)));
            }
        }
        let unreachable = failed > n - self.inner.quorum;
        if !wait {
            // A try leaves nothing behind: release wherever we got it or could not tell.
            if !held.is_empty() || failed > 0 {
                self.release_on(claim, keys).await;
            }
        } else if !held.is_empty() {
            // A minority: hand each on to a better-placed waiter queued there, or keep it only
            // under the handoff lease, never renewed, so that if nobody reaches a quorum the
            // nodes hand the lock on in priority order.
            self.yield_minority(claim, ticket, keys, &held).await;
            earliest(&mut recheck_at, Instant::now() + self.inner.handoff_ttl);
        }
        if unreachable {
            let err = self.no_quorum(n - failed, "acquire");
            return Err(match first_error {
                Some(cause) => err.with_source(cause),
                None => err,
            });
        }
        Ok(Attempt::Queued {
            recheck_at: recheck_at.or_else(|| Some(Instant::now() + self.inner.handoff_ttl)),
        })
    }

    /// Subscribes the claim to its channel on every node where it is not yet, each within the
    /// node timeout; a node whose pub/sub is down is skipped (its grants are found by the
    /// re-check at the holder's deadline instead).
    async fn subscribe_all(&self, ticket: &RedlockTicket, keys: &Keys) {
        let tickets = ticket.nodes(self.inner.nodes.len());
        let calls = self
            .inner
            .nodes
            .iter()
            .zip(tickets)
            .map(|(node, nt)| async move {
                if nt.sub.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                    return;
                }
                let sub = match node.hub.subscribe_if_ready(&keys.channel, &keys.owner) {
                    Some(sub) => Some(sub),
                    None => tokio::time::timeout(
                        self.inner.node_timeout,
                        node.hub.subscribe(&keys.channel, &keys.owner),
                    )
                    .await
                    .ok()
                    .and_then(Result::ok),
                };
                *nt.sub.lock().unwrap_or_else(|p| p.into_inner()) = sub;
            });
        join_all(calls).await;
    }

    /// Whether the claim is subscribed on every node, registering it where the channel is
    /// subscribed already (no I/O).
    fn subscribed_everywhere(&self, ticket: &RedlockTicket, keys: &Keys) -> bool {
        let tickets = ticket.nodes(self.inner.nodes.len());
        let mut all = true;
        for (node, nt) in self.inner.nodes.iter().zip(tickets) {
            let mut sub = nt.sub.lock().unwrap_or_else(|p| p.into_inner());
            if sub.is_none() {
                *sub = node.hub.subscribe_if_ready(&keys.channel, &keys.owner);
                all &= sub.is_some();
            }
        }
        all
    }
}

impl Backend for RedlockBackend {
    type Ticket = RedlockTicket;
    const RENEWS_WAITERS: bool = true;

    fn supports(&self, kind: LockKind) -> bool {
        matches!(kind, LockKind::Exclusive | LockKind::Read | LockKind::Write)
    }

    fn name(&self) -> &'static str {
        "redlock"
    }

    fn reconnects(&self) -> Option<watch::Receiver<u64>> {
        Some(self.inner.reconnects.subscribe())
    }

    async fn inspect(&self, namespace: &str, key: &str) -> Result<Inspection> {
        let keys = Keys::named(namespace, key, &self.inner.client_id, "");
        let mut inv = INSPECT.prepare_invoke();
        inv.key(&keys.lock)
            .key(&keys.holders)
            .key(&keys.queue)
            .key(&keys.waiters);
        let calls = self.inner.nodes.iter().map(|node| {
            let inv = &inv;
            async move { node.call::<inspection::Reply>("inspect", inv).await }
        });
        let mut views = Vec::new();
        let mut first_error = None;
        for reply in join_all(calls).await {
            match reply {
                Ok((reply, sent)) => views.push((NodeView::parse(reply), sent)),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if views.len() < self.inner.quorum {
            let err = self.no_quorum(views.len(), "inspect");
            return Err(match first_error {
                Some(cause) => err.with_source(cause),
                None => err,
            });
        }
        Ok(inspection::merge(key, self.inner.quorum, views))
    }

    async fn acquire(&self, claim: &Claim, ticket: &RedlockTicket, wait: bool) -> Result<Attempt> {
        let keys = Keys::new(claim, &self.inner.client_id);
        if wait && !self.subscribed_everywhere(ticket, &keys) {
            // Subscribe before queueing, so no handoff is published unheard; but look first
            // without queueing, so a free lock costs one round trip.
            let first = self.round(claim, ticket, &keys, false).await?;
            if matches!(first, Attempt::Granted(_)) {
                return Ok(first);
            }
            self.subscribe_all(ticket, &keys).await;
        }
        self.round(claim, ticket, &keys, wait).await
    }

    async fn wait(
        &self,
        claim: &Claim,
        ticket: &RedlockTicket,
        recheck_at: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let tickets = ticket.nodes(self.inner.nodes.len());
        let mailboxes: Vec<(usize, Arc<Mailbox>)> = tickets
            .iter()
            .enumerate()
            .filter_map(|(i, nt)| {
                let sub = nt.sub.lock().unwrap_or_else(|p| p.into_inner());
                sub.as_ref().map(|s| (i, s.mailbox.clone()))
            })
            .collect();
        if mailboxes.is_empty() {
            return recheck(recheck_at).await;
        }
        let mut deadline = recheck_at;
        // Grants announced to us so far, per node.
        let mut heard: Vec<Held> = Vec::new();
        loop {
            let next = futures::future::select_all(
                mailboxes
                    .iter()
                    .map(|(i, m)| Box::pin(async move { (*i, m.recv().await) })),
            );
            let Some(((node, wake), ..)) = before(next, deadline).await else {
                return Ok(None);
            };
            let clock = &tickets[node].clock;
            match wake {
                Wake::Recheck => return Ok(None),
                Wake::NextInLine(end) => {
                    if !next_in_line(clock, end, &mut deadline) {
                        return Ok(None);
                    }
                }
                Wake::Granted(handoff) => {
                    let Some(until) = clock.local_time(handoff.server_ms, handoff.px) else {
                        return Ok(None);
                    };
                    heard.retain(|h| h.node != node);
                    heard.push(Held {
                        node,
                        fence: handoff.fence,
                        fresh: false,
                        until,
                    });
                    // The other nodes' grants normally follow within a moment (the holder
                    // released everywhere at once); if they do not, ask every node soon: the
                    // lock may have split between waiters.
                    earliest(&mut deadline, (Instant::now() + SPLIT_GRACE).min(until));
                    if heard.len() >= self.inner.quorum {
                        let keys = Keys::new(claim, &self.inner.client_id);
                        return Ok(self
                            .settle(claim, &keys, &heard)
                            .await
                            .map(|g| ticket.holds(g)));
                    }
                }
            }
        }
    }

    async fn release(&self, claim: &Claim, ticket: &RedlockTicket) -> Result<bool> {
        ticket.unsubscribe();
        let keys = Keys::new(claim, &self.inner.client_id);
        let (held, failed) = self.release_on(claim, &keys).await;
        if failed == self.inner.nodes.len() {
            return Err(self.no_quorum(0, "release"));
        }
        // A node that could not be asked may have released already: the layer above knows
        // locally whether the lease was still valid.
        Ok(held + failed >= self.inner.quorum)
    }

    async fn downgrade(&self, claim: &Claim, _ticket: &RedlockTicket) -> Result<Grant> {
        let keys = Keys::new(claim, &self.inner.client_id);
        let mut inv = keys.invoke(&DOWNGRADE, true);
        inv.arg(&keys.owner)
            .arg(millis(claim.ttl()))
            .arg(millis(FENCE_TTL))
            .arg(millis(self.inner.handoff_ttl))
            .arg(&keys.channels)
            .arg(self.rejoin_ms());
        let replies = join_all(self.inner.nodes.iter().map(|node| {
            let inv = &inv;
            async move { node.call::<(i64, i64)>("downgrade", inv).await }
        }))
        .await;
        let (mut done, mut refused, mut fence) = (Vec::new(), 0, 0);
        for reply in &replies {
            match reply {
                Ok(((1, f), sent)) => {
                    done.push(*sent + claim.ttl());
                    fence = fence.max(*f);
                }
                Ok(_) => refused += 1,
                Err(_) => {}
            }
        }
        let (n, q) = (self.inner.nodes.len(), self.inner.quorum);
        match held_until(done, q) {
            // Each node keeps the token the grant settled there, the quorum's `T`.
            Some(valid_until) => Ok(Grant {
                fence: fence_of("redis", fence)?,
                valid_until,
            }),
            None if refused > n - q => Err(Error::lost(claim.key())),
            None => Err(self.no_quorum(n - refused, "downgrade")),
        }
    }

    async fn renew(&self, claims: &[(&Claim, &RedlockTicket)]) -> Vec<Renewal> {
        let n = self.inner.nodes.len();
        let q = self.inner.quorum;
        let mut inv = RENEW.prepare_invoke();
        for (claim, ticket) in claims {
            let keys = Keys::new(claim, &self.inner.client_id);
            let mode = match (
                ticket.held.load(Ordering::Acquire),
                shared_kind(claim.kind()),
            ) {
                (true, None) => "h",
                (true, Some(_)) => "H",
                (false, _) => "w",
            };
            keys.add_renewal(&mut inv, claim.ttl());
            inv.arg(mode);
        }
        // Bounded per node, within half the window the renewal engine gives the whole call (a
        // third of the shortest TTL, at least 50 ms), so one silent node cannot hold up the
        // others' answers until the engine gives up on all of them.
        let limit = claims
            .iter()
            .map(|(c, _)| c.ttl() / 3)
            .min()
            .unwrap_or_default()
            .max(MIN_RENEW_CALL)
            / 2;
        let per_node = join_all(self.inner.nodes.iter().map(|node| {
            let inv = &inv;
            async move {
                match node.call_within::<Vec<i64>>(limit, "renew", inv).await {
                    Ok((r, sent)) if r.len() == claims.len() => Some((r, sent)),
                    _ => None,
                }
            }
        }))
        .await;
        claims
            .iter()
            .enumerate()
            .map(|(i, (claim, _))| {
                let mut extended = Vec::new();
                let (mut kept, mut refused) = (None, 0);
                for (r, sent) in per_node.iter().flatten() {
                    match r.get(i) {
                        Some(1) => extended.push(*sent + claim.ttl()),
                        Some(2) => kept = Some(*sent + claim.ttl()),
                        Some(0) => refused += 1,
                        _ => {}
                    }
                }
                if let Some(until) = held_until(extended, q) {
                    Renewal::Extended(until)
                } else if let Some(until) = kept {
                    Renewal::Queued(until)
                } else if refused > n - q {
                    Renewal::NotOwner
                } else {
                    Renewal::Failed(self.no_quorum(n - refused, "renew"))
                }
            })
            .collect()
    }
}
