//! The differential test's world (`tests/contract/differential.rs`): four actors (a client
//! each, one namespace) playing abstract operations on four keys of one backend, and what a
//! user can observe of it, normalised so that two backends can be compared line by line:
//! outcomes as categories, holders by actor (never tokens, owner ids or times), waiters in
//! line. The same sequence of operations played on the memory backend and on another backend
//! must give the same observations.

use std::fmt;
use std::time::Duration;

use distlock::backend::{Family, LockKind};
use distlock::{
    Error, ErrorKind, Inspection, Leadership, LockClient, MultiGuard, MutexGuard, Result,
    RwLockReadGuard, RwLockWriteGuard, SemaphorePermit,
};
use futures::future::{join_all, BoxFuture};
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

use super::Op;

pub const ACTORS: usize = 4;
/// The semaphore key's permits.
pub const SEM_MAX: u32 = 2;

/// The keys: a mutex, a read-write lock, a semaphore of [`SEM_MAX`], an election.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    M,
    Rw,
    S,
    E,
}

impl Key {
    pub const ALL: [Key; 4] = [Key::M, Key::Rw, Key::S, Key::E];

    pub fn name(self) -> &'static str {
        match self {
            Key::M => "m",
            Key::Rw => "rw",
            Key::S => "sem",
            Key::E => "elect",
        }
    }
}

/// What an acquisition asks for. A key asked for as another family is part of the game.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    Mutex(Key),
    Read(Key),
    Write(Key),
    /// `count` permits of a semaphore of `max`.
    Permits(Key, u32, u32),
    /// The mutex `m` and the read-write lock `rw` (a write hold if `write`) together.
    Multi {
        write: bool,
    },
    Campaign(Key),
}

impl Ask {
    pub fn is_semaphore(self) -> bool {
        matches!(self, Ask::Permits(..))
    }
}

impl fmt::Display for Ask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Ask::Mutex(k) => write!(f, "mutex({})", k.name()),
            Ask::Read(k) => write!(f, "read({})", k.name()),
            Ask::Write(k) => write!(f, "write({})", k.name()),
            Ask::Permits(k, n, max) => write!(f, "permits({},{n}/{max})", k.name()),
            Ask::Multi { write } => {
                write!(f, "multi(m,{} rw)", if write { "write" } else { "read" })
            }
            Ask::Campaign(k) => write!(f, "campaign({})", k.name()),
        }
    }
}

/// How to read a backend's observations: what it records differs in documented ways.
#[derive(Clone, Copy, Debug)]
pub struct Lens {
    /// The server records a semaphore's size (`Family::Semaphore { max }`).
    pub records_max: bool,
    /// `inspect` reports a waiter's number of permits.
    pub waiter_permits: bool,
    /// `inspect` reports a downgraded reader under the token its guard keeps.
    pub downgraded_tokens: bool,
}

enum Guard {
    Mutex(MutexGuard),
    Read(RwLockReadGuard),
    Write(RwLockWriteGuard),
    Permit(SemaphorePermit),
    Multi(MultiGuard),
    /// A leadership, and the election's key.
    Lead(Leadership, String),
}

impl Guard {
    /// The fencing token of each key held.
    fn tokens(&self) -> Vec<(String, u64)> {
        let one = |k: &str, t: u64| vec![(k.to_owned(), t)];
        match self {
            Guard::Mutex(g) => one(g.key(), g.fencing_token()),
            Guard::Read(g) => one(g.key(), g.fencing_token()),
            Guard::Write(g) => one(g.key(), g.fencing_token()),
            Guard::Permit(g) => one(g.key(), g.fencing_token()),
            Guard::Multi(g) => g
                .fencing_tokens()
                .into_iter()
                .map(|(k, t)| (k.to_owned(), t))
                .collect(),
            Guard::Lead(l, key) => one(key, l.term()),
        }
    }

    async fn release(self) -> Result<()> {
        match self {
            Guard::Mutex(g) => g.release().await,
            Guard::Read(g) => g.release().await,
            Guard::Write(g) => g.release().await,
            Guard::Permit(g) => g.release().await,
            Guard::Multi(g) => g.release().await,
            Guard::Lead(l, _) => l.resign().await,
        }
    }
}

struct Held {
    /// When it was asked for (a queued ask's id, or the try's number): `release held #n` and
    /// downgrades pick by this order, the same on both sides whatever order grants landed in.
    asked: usize,
    actor: usize,
    label: String,
    guard: Guard,
    /// Keys a force-release took from this guard: it holds them no more.
    forced: Vec<String>,
}

struct Queued {
    id: usize,
    actor: usize,
    ask: Ask,
    task: JoinHandle<Result<Guard>>,
    /// Keys a force-release took from it while it waited for the rest (see `Held::forced`).
    forced: Vec<String>,
}

/// An outcome as a category: what a user can rely on, not the message.
pub fn category<T>(r: &Result<T>) -> String {
    match r {
        Ok(_) => "granted".into(),
        Err(e) => error_category(e),
    }
}

fn error_category(e: &Error) -> String {
    match e.kind() {
        ErrorKind::WouldBlock => "WouldBlock".into(),
        ErrorKind::KindMismatch => "KindMismatch".into(),
        other => format!("error {other:?}"),
    }
}

/// The waiting form (`$wait`) or the trying one of an acquisition on `$handle`, as a
/// guard (`$guard` makes it), in a future of its own.
macro_rules! take {
    ($wait:expr, $guard:expr, $handle:expr, $lock:ident, $try:ident $(, $arg:ident)?) => {{
        let handle = $handle;
        Box::pin(async move {
            Ok($guard(if $wait {
                handle.$lock($($arg)?).await?
            } else {
                handle.$try($($arg)?).await?
            }))
        })
    }};
}

/// One backend's side of the game: the actors' clients, what each holds and waits for.
pub struct World {
    clients: Vec<LockClient>,
    prefix: String,
    lens: Lens,
    held: Vec<Held>,
    queued: Vec<Queued>,
    /// Queued acquisitions that completed so far, by id: kept, so a completion that lands a
    /// step later on one side than on the other is still compared, not seen as a difference.
    completed: Vec<(usize, String)>,
    next_id: usize,
}

impl World {
    /// A world on `clients` (one per actor) whose keys start with `prefix`.
    pub fn new(clients: &[LockClient], prefix: String, lens: Lens) -> Self {
        assert_eq!(clients.len(), ACTORS);
        Self {
            clients: clients.to_vec(),
            prefix,
            lens,
            held: Vec::new(),
            queued: Vec::new(),
            completed: Vec::new(),
            next_id: 0,
        }
    }

    fn key(&self, k: Key) -> String {
        format!("{}:{}", self.prefix, k.name())
    }

    fn acquire(&self, a: usize, ask: Ask, wait: bool) -> BoxFuture<'static, Result<Guard>> {
        let (c, key) = (&self.clients[a], |k: Key| self.key(k));
        match ask {
            Ask::Mutex(k) => take!(wait, Guard::Mutex, c.mutex(key(k)), lock, try_lock),
            Ask::Read(k) => take!(wait, Guard::Read, c.rw_lock(key(k)), read, try_read),
            Ask::Write(k) => take!(wait, Guard::Write, c.rw_lock(key(k)), write, try_write),
            Ask::Permits(k, n, max) => {
                let s = c.semaphore(key(k), max);
                take!(wait, Guard::Permit, s, acquire_many, try_acquire_many, n)
            }
            Ask::Multi { write } => {
                let multi = c.multi_lock([key(Key::M)]);
                let rw = key(Key::Rw);
                let multi = if write {
                    multi.write(rw)
                } else {
                    multi.read(rw)
                };
                take!(wait, Guard::Multi, multi, lock, try_lock)
            }
            Ask::Campaign(k) => {
                let (value, name) = (format!("a{a}"), key(k));
                let lead = move |l| Guard::Lead(l, name);
                take!(
                    wait,
                    lead,
                    c.election(key(k)),
                    campaign,
                    try_campaign,
                    value
                )
            }
        }
    }

    /// Plays one step; returns its outcome.
    pub async fn apply(&mut self, op: Op) -> String {
        self.harvest().await;
        match op {
            Op::Try(a, ask) => {
                let r = self.acquire(a, ask, false).await;
                let out = category(&r);
                let asked = self.next_id;
                self.next_id += 1;
                if let Ok(guard) = r {
                    self.hold(Held {
                        asked,
                        actor: a,
                        label: ask.to_string(),
                        guard,
                        forced: vec![],
                    });
                }
                out
            }
            Op::Queue(a, ask) => {
                let task = tokio::spawn(self.acquire(a, ask, true));
                let id = self.next_id;
                self.next_id += 1;
                self.queued.push(Queued {
                    id,
                    actor: a,
                    ask,
                    task,
                    forced: vec![],
                });
                format!("queued as q{id}")
            }
            Op::Cancel(n) => {
                if self.queued.is_empty() {
                    return "nothing queued".into();
                }
                let q = self.queued.remove(n % self.queued.len());
                q.task.abort();
                match q.task.await {
                    Err(e) if e.is_cancelled() => format!("q{} cancelled", q.id),
                    Err(e) => format!("q{} panicked: {e}", q.id),
                    // Granted just before the abort: not a quiescent point.
                    Ok(r) => format!("q{} completed before the abort: {}", q.id, category(&r)),
                }
            }
            Op::Release(n) => {
                if self.held.is_empty() {
                    return "nothing held".into();
                }
                let h = self.held.remove(n % self.held.len());
                let r = h.guard.release().await;
                format!(
                    "a{} {}: {}",
                    h.actor,
                    h.label,
                    category(&r).replace("granted", "ok")
                )
            }
            Op::Downgrade(n) => {
                let writes: Vec<usize> = (0..self.held.len())
                    .filter(|&i| matches!(self.held[i].guard, Guard::Write(_)))
                    .collect();
                if writes.is_empty() {
                    return "no write guard".into();
                }
                let h = self.held.remove(writes[n % writes.len()]);
                let Guard::Write(w) = h.guard else {
                    unreachable!()
                };
                match w.downgrade().await {
                    Ok(r) => {
                        let label = format!("{} downgraded", h.label);
                        self.hold(Held {
                            asked: h.asked,
                            actor: h.actor,
                            label,
                            guard: Guard::Read(r),
                            forced: vec![],
                        });
                        format!("a{} downgraded", h.actor)
                    }
                    Err(e) => format!("a{} {}", h.actor, error_category(&e)),
                }
            }
            Op::ForceRelease(a, k) => {
                let key = self.key(k);
                let owners = self.owners();
                match self.clients[a].force_release(&key).await {
                    Ok(f) => {
                        // Every holder of the key is dropped.
                        for h in &mut self.held {
                            if h.guard.tokens().iter().any(|(k, _)| *k == key) {
                                h.forced.push(key.clone());
                            }
                        }
                        let holders = f.removed.iter().map(|h| (h.kind, h.fencing_token));
                        let removed = self.holders(&key, holders, owners);
                        // A holder no guard accounts for is a waiting multi-lock's part, `m`
                        // (taken first): the first multi-lock in line's, by FIFO.
                        if k == Key::M && removed.iter().any(|h| h.starts_with('?')) {
                            let multi = |q: &Queued| matches!(q.ask, Ask::Multi { .. });
                            let first = self.queued.iter().position(multi);
                            if let Some(i) = first {
                                self.queued[i].forced.push(key.clone());
                            }
                        }
                        let family = self.family(f.family);
                        format!("family {family} removed [{}]", removed.join(", "))
                    }
                    Err(e) => error_category(&e),
                }
            }
            Op::Inspect(a, k) => {
                let key = self.key(k);
                let r = self.clients[a].inspect(&key).await;
                self.show(&key, r, self.owners())
            }
            Op::Leader(a) => match self.clients[a].election(self.key(Key::E)).leader().await {
                Ok(Some(l)) => format!("leader {}", l.value_str().unwrap_or("<not text>")),
                Ok(None) => "no leader".into(),
                Err(e) => error_category(&e),
            },
        }
    }

    /// Keeps `h`, in the order of asking.
    fn hold(&mut self, h: Held) {
        self.held.push(h);
        self.held.sort_by_key(|h| h.asked);
    }

    /// Collects the queued acquisitions that completed, in the order they were queued.
    async fn harvest(&mut self) {
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.queued)
            .into_iter()
            .partition(|q| q.task.is_finished());
        self.queued = waiting;
        for q in done {
            let out = match q.task.await {
                Ok(Ok(guard)) => {
                    self.hold(Held {
                        asked: q.id,
                        actor: q.actor,
                        label: q.ask.to_string(),
                        guard,
                        forced: q.forced,
                    });
                    "granted".into()
                }
                Ok(Err(e)) => error_category(&e),
                Err(e) => format!("task failed: {e}"),
            };
            self.completed
                .push((q.id, format!("q{} a{} {}: {out}", q.id, q.actor, q.ask)));
        }
        self.completed.sort_by_key(|(id, _)| *id);
    }

    /// Which actors hold which fencing token of which key (Redlock readers may share one).
    fn owners(&self) -> Vec<((String, u64), usize)> {
        let mut out = Vec::new();
        for h in &self.held {
            for kt in h.guard.tokens() {
                if !h.forced.contains(&kt.0) {
                    out.push((kt, h.actor));
                }
            }
        }
        out
    }

    fn family(&self, f: Option<Family>) -> String {
        match f {
            None => "none".into(),
            Some(Family::Mutex) => "mutex".into(),
            Some(Family::RwLock) => "rw".into(),
            Some(Family::Semaphore { max }) if self.lens.records_max => format!("semaphore/{max}"),
            Some(Family::Semaphore { .. }) => "semaphore/?".into(),
            Some(Family::Election) => "election".into(),
            Some(other) => format!("{other:?}"),
        }
    }

    fn kind(&self, k: LockKind, waiter: bool) -> String {
        match k {
            LockKind::Exclusive => "exclusive".into(),
            LockKind::Read => "read".into(),
            LockKind::Write => "write".into(),
            LockKind::Permits { .. } if waiter && !self.lens.waiter_permits => "permits ?".into(),
            LockKind::Permits { count, .. } => format!("permits {count}"),
            LockKind::Leader => "leader".into(),
            other => format!("{other:?}"),
        }
    }

    /// Holders by actor and kind, sorted. A holder is matched to the actor whose guard has
    /// its fencing token; one without a token (Redis does not record the token of a mutex
    /// taken by a plain `SET`) to an actor holding the key that no token matched; what is
    /// left (a multi-lock's part taken while the rest is awaited) shows as `?`.
    fn holders(
        &self,
        key: &str,
        holders: impl Iterator<Item = (LockKind, Option<u64>)>,
        owners: Vec<((String, u64), usize)>,
    ) -> Vec<String> {
        let mut owners: Vec<(u64, usize)> = owners
            .into_iter()
            .filter(|((k, _), _)| k == key)
            .map(|((_, t), a)| (t, a))
            .collect();
        let holders: Vec<(LockKind, Option<u64>)> = holders.collect();
        let mut who: Vec<Option<usize>> = holders
            .iter()
            .map(|(_, token)| {
                let at = token.and_then(|t| owners.iter().position(|(o, _)| *o == t));
                at.map(|i| owners.remove(i).1)
            })
            .collect();
        for (w, (kind, token)) in who.iter_mut().zip(&holders) {
            let unseen =
                token.is_none() || (!self.lens.downgraded_tokens && *kind == LockKind::Read);
            if w.is_none() && unseen && !owners.is_empty() {
                *w = Some(owners.remove(0).1);
            }
        }
        let mut out: Vec<String> = holders
            .iter()
            .zip(who)
            .map(|((kind, _), w)| {
                let w = w.map_or("?".to_owned(), |a| format!("a{a}"));
                format!("{w} {}", self.kind(*kind, false))
            })
            .collect();
        out.sort();
        out
    }

    fn show(
        &self,
        key: &str,
        r: Result<Inspection>,
        owners: Vec<((String, u64), usize)>,
    ) -> String {
        match r {
            Ok(i) => {
                let holders = i.holders.iter().map(|h| (h.kind, h.fencing_token));
                let waiters: Vec<String> =
                    i.waiters.iter().map(|w| self.kind(w.kind, true)).collect();
                format!(
                    "family {}, holders [{}], waiters [{}]",
                    self.family(i.family),
                    self.holders(key, holders, owners).join(", "),
                    waiters.join(", ")
                )
            }
            Err(e) => error_category(&e),
        }
    }

    /// What a user can see now, one fact a line: completions so far, who holds
    /// which guard, who waits in which order, and each key as `inspect` shows it.
    pub async fn observe(&mut self) -> Vec<String> {
        self.harvest().await;
        let mut out: Vec<String> = self
            .completed
            .iter()
            .map(|(_, s)| format!("completed {s}"))
            .collect();
        for a in 0..ACTORS {
            let mut mine: Vec<&str> = self
                .held
                .iter()
                .filter(|h| h.actor == a)
                .map(|h| h.label.as_str())
                .collect();
            mine.sort();
            out.push(format!("a{a} holds [{}]", mine.join(", ")));
        }
        let line: Vec<String> = self
            .queued
            .iter()
            .map(|q| format!("q{} a{} {}", q.id, q.actor, q.ask))
            .collect();
        out.push(format!("queued [{}]", line.join(", ")));
        let keys: Vec<String> = Key::ALL.iter().map(|&k| self.key(k)).collect();
        let seen = join_all(keys.iter().map(|k| self.clients[0].inspect(k))).await;
        let owners = self.owners();
        for (k, r) in Key::ALL.iter().zip(keys.iter().zip(seen)) {
            out.push(format!(
                "{}: {}",
                k.name(),
                self.show(r.0, r.1, owners.clone())
            ));
        }
        out
    }

    /// Observes until two readings 2 ms apart agree (the in-process reference settles in
    /// microseconds); at most `limit`.
    pub async fn settle(&mut self, limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        let mut last = self.observe().await;
        loop {
            sleep(Duration::from_millis(2)).await;
            let now = self.observe().await;
            if now == last || Instant::now() > deadline {
                return now;
            }
            last = now;
        }
    }

    /// Observes until what it sees is `target` (the reference's settled observation), at
    /// most `limit`: grants, handoffs and background releases land asynchronously.
    pub async fn settle_to(&mut self, target: &[String], limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        loop {
            let now = self.observe().await;
            if now == target || Instant::now() > deadline {
                return now;
            }
            sleep(Duration::from_millis(5)).await;
        }
    }

    /// Ends the game: aborts what waits, releases what is held.
    pub async fn finish(mut self) {
        for q in std::mem::take(&mut self.queued) {
            q.task.abort();
            if let Ok(Ok(g)) = q.task.await {
                let _ = g.release().await;
            }
        }
        for h in std::mem::take(&mut self.held) {
            let _ = h.guard.release().await;
        }
    }
}
