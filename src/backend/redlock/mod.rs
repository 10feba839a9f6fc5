//! Redlock: one lock over N ≥ 3 independent Redis nodes, held while a majority of them hold it.
//! How it works, and why its fencing tokens increase, is on [`RedlockBackend`].

mod builder;
mod election;
mod inspect;
mod keys;
mod library;
mod lock;
mod node;
mod quorum;
mod renewal;
mod round;
mod scripts;
mod ticket;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use self::node::Node;
use super::{Attempt, Backend, Claim, Grant, Leader, LeaderWatch, LockKind, Renewal};
use crate::error::Result;
use crate::inspect::Inspection;

pub use self::builder::RedlockBackendBuilder;
pub use self::node::RedlockNode;
pub use self::ticket::RedlockTicket;

/// Locks held by a majority of independent Redis nodes (Redlock), with fencing tokens that
/// strictly increase across the quorum and FIFO handoff announced over each node's pub/sub.
///
/// Each node keeps the single-node layout (a mutex hold as a string expiring with the lease, a
/// hash for read-write locks, a fencing counter per lock, `<ns>:{<key>}:fence`) with a queue
/// ordered by *priority* instead of arrival: the waiter's own wall clock in µs when it first
/// queued, sent to every node. So every node that knows the same waiters hands a free lock to the same one,
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
/// so it sits out until [`rejoin_delay`](RedlockBackendBuilder::rejoin_delay) after its server
/// started (the Redlock paper's advice): the first time a node serves a namespace its script
/// reads the server's uptime (`INFO server`) and records the start (`<ns>:born`, which vanishes
/// only with the data). A node up longer than the delay votes at once, for a new namespace
/// too. Its fencing counter restarts at its clock in µs, above every token issued before as
/// long as nodes' clocks agree within the time it was down.
///
/// **A node that is down** (a call could not reach it) is skipped: calls to it fail at once,
/// as a no vote, while one background task reconnects it with a growing pause (25 ms to 1 s,
/// or at once when its pub/sub connection is back). Two of five nodes down cost nothing.
/// While more nodes are down than a quorum leaves out, calls try them all again, so nodes that
/// are back count at once.
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
/// **Elections** are mutexes whose holds carry the leader's value on each node; a lead counts
/// once a majority of nodes hold it confirmed under one owner and term (see `election.rs`).
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

impl Backend for RedlockBackend {
    type Ticket = RedlockTicket;
    const RENEWS_WAITERS: bool = true;

    fn supports(&self, kind: LockKind) -> bool {
        matches!(
            kind,
            LockKind::Exclusive | LockKind::Read | LockKind::Write | LockKind::Leader
        )
    }

    fn name(&self) -> &'static str {
        "redlock"
    }

    fn reconnects(&self) -> Option<watch::Receiver<u64>> {
        Some(self.inner.reconnects.subscribe())
    }

    async fn inspect(&self, namespace: &str, key: &str) -> Result<Inspection> {
        self.inspect_key(namespace, key).await
    }

    async fn force_release(&self, namespace: &str, key: &str) -> Result<crate::ForceReleased> {
        self.force_release_key(namespace, key).await
    }

    async fn acquire(&self, claim: &Claim, ticket: &RedlockTicket, wait: bool) -> Result<Attempt> {
        self.acquire_claim(claim, ticket, wait).await
    }

    async fn wait(
        &self,
        claim: &Claim,
        ticket: &RedlockTicket,
        recheck_at: Option<Instant>,
    ) -> Result<Option<Grant>> {
        self.wait_claim(claim, ticket, recheck_at).await
    }

    async fn release(&self, claim: &Claim, ticket: &RedlockTicket) -> Result<bool> {
        self.release_claim(claim, ticket).await
    }

    async fn downgrade(&self, claim: &Claim, ticket: &RedlockTicket) -> Result<Grant> {
        self.downgrade_claim(claim, ticket).await
    }

    async fn renew(&self, claims: &[(&Claim, &RedlockTicket)]) -> Vec<Renewal> {
        self.renew_claims(claims).await
    }

    async fn proclaim(&self, claim: &Claim, ticket: &RedlockTicket) -> Result<()> {
        self.proclaim_claim(claim, ticket).await
    }

    async fn leader(&self, namespace: &str, key: &str) -> Result<Option<Leader>> {
        self.leader_of(namespace, key).await
    }

    async fn watch_leader(&self, namespace: &str, key: &str) -> Result<LeaderWatch> {
        self.watch_leader_of(namespace, key).await
    }
}
