//! Differential test: seeded random sequences of operations (tries, queued acquisitions that
//! complete or are cancelled, releases, downgrades, force-releases, inspections, asks for a
//! key as the wrong family, elections) by four actors over a mutex, a read-write lock, a
//! semaphore of 2, a multi-lock over the first two and an election, played side by side on
//! the memory backend (the reference) and on one other backend. After each step, at a
//! quiescent point, everything a user observes must agree (`support/differential.rs`); the
//! first disagreement is shrunk (steps dropped one at a time while it still disagrees) and
//! the test fails printing the seed and the minimal sequence.
//!
//! The seed changes every run (from the clock) and is printed; `DISTLOCK_DIFF_SEED=N` replays
//! from it, `DISTLOCK_DIFF_CASES=N` plays N sequences (without the time budget).
#![cfg(feature = "memory")]
// With no server backend enabled, nothing calls the game.
#![allow(dead_code)]

#[path = "../support/differential.rs"]
mod world;

use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use distlock::LockClient;

use crate::support::server::Env;
use world::{Ask, Key, Lens, World, ACTORS, SEM_MAX};

/// One step. Indices pick among what exists when the step runs (all actors' held guards,
/// the queued acquisitions in line, ...), modulo their number; with none, the step does
/// nothing. So any subsequence of a sequence is a sequence (the shrinker drops steps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// `try_lock` / `try_read` / `try_write` / `try_acquire_many` / `try_campaign`.
    Try(usize, Ask),
    /// The waiting form, spawned: it completes later, or is cancelled.
    Queue(usize, Ask),
    /// Aborts the n-th queued acquisition still waiting.
    Cancel(usize),
    /// Releases the n-th held guard (`release().await`, `resign()` for a leadership).
    Release(usize),
    /// Downgrades the n-th held write guard.
    Downgrade(usize),
    ForceRelease(usize, Key),
    Inspect(usize, Key),
    /// `leader()` of the election key.
    Leader(usize),
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Op::Try(a, ask) => write!(f, "a{a} try {ask}"),
            Op::Queue(a, ask) => write!(f, "a{a} queue {ask}"),
            Op::Cancel(n) => write!(f, "cancel queued #{n}"),
            Op::Release(n) => write!(f, "release held #{n}"),
            Op::Downgrade(n) => write!(f, "downgrade write guard #{n}"),
            Op::ForceRelease(a, k) => write!(f, "a{a} force_release({})", k.name()),
            Op::Inspect(a, k) => write!(f, "a{a} inspect({})", k.name()),
            Op::Leader(a) => write!(f, "a{a} leader(elect)"),
        }
    }
}

/// A small seeded generator (xorshift64*, seeded through splitmix64): no dependency, the
/// same sequence for a seed everywhere.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())]
    }
}

/// A documented way a backend differs from the reference, which the comparison leaves out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Deviation {
    /// The size of a semaphore is not recorded, so a claim with another number of permits is
    /// not refused (Curator's `InterProcessSemaphoreV2` records none either; see
    /// `Env::records_max`). The game asks for no other size there.
    NoSizeCheck,
    /// `inspect` reports a waiting claim's permits as 0: a waiting lease node carries no
    /// count until it is granted. Waiters' permits are compared without the count.
    WaiterPermitsUnknown,
    /// `inspect` reports a downgraded reader's token as its read node's (a new node, made
    /// when the write node turns into it), not the write token its guard keeps. Such a
    /// reader is matched to the actor holding the key whose token no holder showed.
    DowngradedTokenUnseen,
}

/// The deviations of each backend (by `Env::name`); every other difference is a bug.
const DEVIATIONS: &[(&str, &[Deviation])] = &[
    (
        "zookeeper",
        &[
            Deviation::NoSizeCheck,
            Deviation::WaiterPermitsUnknown,
            Deviation::DowngradedTokenUnseen,
        ],
    ),
    (
        "zookeeper_ensemble",
        &[
            Deviation::NoSizeCheck,
            Deviation::WaiterPermitsUnknown,
            Deviation::DowngradedTokenUnseen,
        ],
    ),
];

/// How long a step of a sequence may take to settle on the backend under test. Long: on a
/// loaded machine a queued ask not settled when the next step starts races it, and the race
/// may end otherwise than the reference's sequence (seen past 3 s with eight tests at a time).
const SETTLE: Duration = Duration::from_secs(10);
/// How long the reference may take (it settles in microseconds).
const SETTLE_REFERENCE: Duration = Duration::from_secs(2);
/// How long the shrinker may replay a failing sequence.
const SHRINK_BUDGET: Duration = Duration::from_secs(90);

struct Profile {
    name: &'static str,
    /// Redlock has no semaphores: the game asks for none there.
    semaphores: bool,
    size_check: bool,
    lens: Lens,
}

impl Profile {
    fn of(env: &Env) -> Self {
        let deviations = DEVIATIONS
            .iter()
            .find(|(name, _)| *name == env.name)
            .map_or(&[][..], |(_, d)| d);
        Self {
            name: env.name,
            semaphores: env.supports.semaphore,
            size_check: !deviations.contains(&Deviation::NoSizeCheck),
            lens: Lens {
                records_max: env.records_max,
                waiter_permits: !deviations.contains(&Deviation::WaiterPermitsUnknown),
                downgraded_tokens: !deviations.contains(&Deviation::DowngradedTokenUnseen),
            },
        }
    }

    fn allows(&self, op: &Op) -> bool {
        match op {
            Op::Try(_, ask) | Op::Queue(_, ask) => match *ask {
                Ask::Permits(_, _, max) => self.semaphores && (self.size_check || max == SEM_MAX),
                _ => true,
            },
            _ => true,
        }
    }
}

use Ask::*;
use Key::*;

/// Asks for each key as its own family (the multi-lock and the permits doubled).
const RIGHT: &[Ask] = &[
    Mutex(M),
    Mutex(M),
    Read(Rw),
    Read(Rw),
    Write(Rw),
    Permits(S, 1, SEM_MAX),
    Permits(S, 1, SEM_MAX),
    Permits(S, 2, SEM_MAX),
    Multi { write: false },
    Multi { write: true },
];

/// Asks for a key as another family (or a semaphore of another size): refused while the key
/// is in use, granted (turning the key into that family) while it is free.
const WRONG: &[Ask] = &[
    Permits(M, 1, SEM_MAX),
    Permits(Rw, 2, SEM_MAX),
    Mutex(Rw),
    Read(M),
    Write(S),
    Mutex(S),
    Permits(S, 1, SEM_MAX + 1),
    Mutex(E),
    Read(E),
    Campaign(M),
];

fn random_op(rng: &mut Rng) -> Op {
    let a = rng.below(ACTORS);
    let ask = |rng: &mut Rng, wrong_percent: usize| {
        if rng.below(100) < wrong_percent {
            rng.pick(WRONG)
        } else {
            rng.pick(RIGHT)
        }
    };
    match rng.below(100) {
        0..=27 => Op::Try(a, ask(rng, 20)),
        28..=45 => Op::Queue(a, ask(rng, 10)),
        46..=51 => Op::Cancel(rng.below(4)),
        52..=70 => Op::Release(rng.below(8)),
        71..=75 => Op::Downgrade(rng.below(2)),
        76..=80 => Op::ForceRelease(a, rng.pick(&Key::ALL)),
        81..=84 => Op::Inspect(a, rng.pick(&Key::ALL)),
        85..=91 => Op::Try(a, Campaign(E)),
        92..=94 => Op::Queue(a, Campaign(E)),
        _ => Op::Leader(a),
    }
}

/// The sequence of `seed`: 20 to 30 steps the backend can play.
fn generate(seed: u64, profile: &Profile) -> Vec<Op> {
    let mut rng = Rng::new(seed);
    let len = 20 + rng.below(11);
    let mut ops = Vec::with_capacity(len);
    while ops.len() < len {
        let op = random_op(&mut rng);
        if profile.allows(&op) {
            ops.push(op);
        }
    }
    ops
}

/// The first step at which the backend disagreed, and how.
struct Disagreement {
    step: usize,
    report: String,
}

/// The lines of `ours` that `theirs` lacks, marked.
fn diff(mark: &str, ours: &[String], theirs: &[String]) -> String {
    ours.iter()
        .filter(|l| !theirs.contains(l))
        .map(|l| format!("    {mark} {l}\n"))
        .collect()
}

/// The two sides of a game: the reference's clients and the backend's, and a counter that
/// gives every play keys of its own.
struct Game {
    reference: Vec<LockClient>,
    subject: Vec<LockClient>,
    profile: Profile,
    plays: usize,
}

impl Game {
    /// Plays `ops` on both sides, on fresh keys; the first disagreement, if any.
    async fn play(&mut self, ops: &[Op]) -> Option<Disagreement> {
        let prefix = format!("d{}", self.plays);
        self.plays += 1;
        let mut m = World::new(&self.reference, prefix.clone(), self.profile.lens);
        let mut b = World::new(&self.subject, prefix, self.profile.lens);
        let mut found = None;
        for (step, op) in ops.iter().enumerate() {
            let (om, ob) = (m.apply(*op).await, b.apply(*op).await);
            let mut sm = m.settle(SETTLE_REFERENCE).await;
            if om != ob {
                // Already apart: no use waiting for the backend to come round.
                let sb = b.settle(SETTLE_REFERENCE).await;
                found = Some(self.report(step, op, (&om, &ob), (&sm, &sb)));
                break;
            }
            let mut sb = b.settle_to(&sm, SETTLE).await;
            // On a loaded machine the reference's tasks may pause past its settling window:
            // if it has moved on since, it was not quiescent, so aim again.
            for _ in 0..3 {
                let again = m.settle(SETTLE_REFERENCE).await;
                if sm == sb || again == sm {
                    break;
                }
                sm = again;
                sb = b.settle_to(&sm, SETTLE).await;
            }
            if sm != sb {
                found = Some(self.report(step, op, (&om, &ob), (&sm, &sb)));
                break;
            }
        }
        if found.is_none() {
            // The last step had no next one to show a late change: look once more.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let (sm, sb) = (m.observe().await, b.observe().await);
            if sm != sb {
                let op = ops.last().expect("a sequence has steps");
                let outcome = "(after the last step)".to_owned();
                found = Some(self.report(ops.len() - 1, op, (&outcome, &outcome), (&sm, &sb)));
            }
        }
        m.finish().await;
        b.finish().await;
        found
    }

    fn report(
        &self,
        step: usize,
        op: &Op,
        outcome: (&String, &String),
        seen: (&[String], &[String]),
    ) -> Disagreement {
        let name = self.profile.name;
        let mut report = format!(
            "  step {step}: {op}\n    outcome on memory: {}\n    outcome on {name}: {}\n",
            outcome.0, outcome.1
        );
        if seen.0 != seen.1 {
            report += "  observations that differ:\n";
            report += &diff("memory:", seen.0, seen.1);
            report += &diff(&format!("{name}:"), seen.1, seen.0);
            report += "  memory's full observation:\n";
            for l in seen.0 {
                report += &format!("    {l}\n");
            }
        }
        Disagreement { step, report }
    }

    /// Drops steps while the sequence still disagrees, within the budget.
    async fn shrink(&mut self, ops: &[Op], first: Disagreement) -> (Vec<Op>, Disagreement) {
        let deadline = Instant::now() + SHRINK_BUDGET;
        let mut best = ops[..=first.step].to_vec();
        let mut last = first;
        // Runs of steps first (half the sequence, a quarter, ...), then single steps.
        let mut run = best.len().div_ceil(2);
        while run > 0 && Instant::now() < deadline {
            let mut i = 0;
            while i + run <= best.len() && Instant::now() < deadline {
                let mut candidate = best.clone();
                candidate.drain(i..i + run);
                match self.play(&candidate).await {
                    Some(d) if !candidate.is_empty() => {
                        candidate.truncate(d.step + 1);
                        best = candidate;
                        last = d;
                    }
                    _ => i += run,
                }
            }
            run /= 2;
        }
        (best, last)
    }
}

/// Plays `cases` sequences (or as many as fit in `budget`) on `reference` and `subject`.
async fn run(reference: Env, subject: Env, cases: usize, budget: Duration) {
    let number = |var: &str| {
        std::env::var(var).ok().map(|v| {
            v.trim()
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{var}={v:?} is not a number"))
        })
    };
    let seed = number("DISTLOCK_DIFF_SEED").unwrap_or_else(|| {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        now.as_secs() * 1000 + u64::from(now.subsec_millis())
    });
    let asked = number("DISTLOCK_DIFF_CASES");
    let cases = asked.map_or(cases, |n| n as usize);
    let profile = Profile::of(&subject);
    let name = profile.name;
    println!("differential {name}: DISTLOCK_DIFF_SEED={seed}, up to {cases} sequences");
    let mut game = Game {
        reference: reference.clients(ACTORS).await,
        subject: subject.clients(ACTORS).await,
        profile,
        plays: 0,
    };
    let start = Instant::now();
    let (mut played, mut steps) = (0, 0);
    for case in 0..cases as u64 {
        if asked.is_none() && start.elapsed() > budget {
            break;
        }
        let case_seed = seed.wrapping_add(case);
        let ops = generate(case_seed, &game.profile);
        if let Some(first) = game.play(&ops).await {
            let (minimal, d) = game.shrink(&ops, first).await;
            let lines: String = minimal.iter().map(|op| format!("  {op}\n")).collect();
            panic!(
                "{name} disagrees with memory on sequence {case} (replay it alone: \
                 DISTLOCK_DIFF_SEED={case_seed} DISTLOCK_DIFF_CASES=1; the run's seed was {seed}); \
                 minimal sequence ({} of {} steps):\n{lines}{}",
                minimal.len(),
                ops.len(),
                d.report
            );
        }
        played += 1;
        steps += ops.len();
    }
    println!(
        "differential {name}: {played} sequences, {steps} steps in {:.1?}",
        start.elapsed()
    );
    crate::support::shut_down(game.reference).await;
    crate::support::shut_down(game.subject).await;
}

/// One test per backend: memory against it, `$cases` sequences within `$budget` seconds.
macro_rules! differential {
    ($($(#[$attr:meta])* $name:ident: $env:path, $cases:expr, $budget:expr;)+) => {$(
        $(#[$attr])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            use crate::support::server;
            let ns = test_namespace!();
            let reference = server::memory::env(format!("{ns}.reference")).await;
            let subject = $env(ns).await;
            run(reference, subject, $cases, Duration::from_secs($budget)).await;
        }
    )+};
}

differential! {
    #[cfg(feature = "redis")]
    redis: server::redis::env, 100, 20;
    #[cfg(feature = "redis-cluster")]
    redis_cluster: server::cluster::env, 80, 20;
    #[cfg(feature = "redis-sentinel")]
    redis_sentinel: server::sentinel::env, 80, 20;
    #[cfg(feature = "redlock")]
    redlock: server::redlock::env, 60, 20;
    #[cfg(feature = "zookeeper")]
    zookeeper: server::zookeeper::env, 60, 20;
    #[cfg(feature = "zookeeper")]
    zookeeper_ensemble: server::ensemble::env, 40, 20;
    #[cfg(feature = "postgres")]
    postgres: server::postgres::env, 100, 20;
    #[cfg(feature = "postgres")]
    pgbouncer: server::pgbouncer::env, 60, 20;
}
