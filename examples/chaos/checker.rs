//! The checker: what holders report, and the judgement of it — believed-stale writes, tokens
//! out of the order the docs promise, believed holds that overlap where the primitive forbids
//! it, holders that stall, servers that are polled.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::holder::{HANDOFF, LONG_HOLD};
use crate::{ttl, HOLDERS};

/// One line a holder reports, with who sent it and when the driver read it.
#[derive(Debug, Clone)]
pub(crate) struct Line {
    pub(crate) holder: usize,
    pub(crate) at: Instant,
    pub(crate) report: Report,
}

/// What a holder reports.
#[derive(Debug, Clone)]
pub(crate) enum Report {
    /// `Q`: starts to wait.
    Queued,
    /// `G call_ns start_ns`: granted, and checked not lost at `start_ns`.
    Granted { start_ns: u128 },
    /// `L`: granted, but already lost at the check.
    SkippedLost,
    /// `W key mode token accepted check_ns write_ns`: wrote (or tried to) after checking it held.
    Wrote {
        key: String,
        mode: char,
        token: u64,
        accepted: bool,
        check_ns: u128,
        write_ns: u128,
    },
    /// `I key mode weight token call_ns start_ns end_ns believed`: a hold of `key`, believed
    /// (not lost) at `start_ns` and, if `believed`, still at `end_ns`.
    Held(Interval),
}

/// A hold of one key. Modes: `X` exclusive, `R` read, `D` the read half of a downgraded write
/// (no new grant: its token is the write's), `P` `weight` permits of a semaphore.
#[derive(Debug, Clone)]
pub(crate) struct Interval {
    pub(crate) holder: usize,
    pub(crate) key: String,
    pub(crate) mode: char,
    pub(crate) weight: u32,
    pub(crate) token: u64,
    /// When the holder asked for it: a grant that started before this is granted before.
    pub(crate) call_ns: u128,
    pub(crate) start_ns: u128,
    pub(crate) end_ns: u128,
    pub(crate) believed: bool,
}

pub(crate) fn parse_report(holder: usize, line: &str) -> Option<Line> {
    let report = match line.split_whitespace().next()? {
        "Q" => Report::Queued,
        "L" => Report::SkippedLost,
        "G" => Report::Granted {
            start_ns: line.split_whitespace().nth(2)?.parse().ok()?,
        },
        "W" => {
            let f: Vec<&str> = line.split_whitespace().collect();
            Report::Wrote {
                key: f.get(1)?.to_string(),
                mode: f.get(2)?.chars().next()?,
                token: f.get(3)?.parse().ok()?,
                accepted: *f.get(4)? == "1",
                check_ns: f.get(5)?.parse().ok()?,
                write_ns: f.get(6)?.parse().ok()?,
            }
        }
        "I" => {
            let f: Vec<&str> = line.split_whitespace().collect();
            Report::Held(Interval {
                holder,
                key: f.get(1)?.to_string(),
                mode: f.get(2)?.chars().next()?,
                weight: f.get(3)?.parse().ok()?,
                token: f.get(4)?.parse().ok()?,
                call_ns: f.get(5)?.parse().ok()?,
                start_ns: f.get(6)?.parse().ok()?,
                end_ns: f.get(7)?.parse().ok()?,
                believed: *f.get(8)? == "1",
            })
        }
        _ => return None,
    };
    Some(Line {
        holder,
        at: Instant::now(),
        report,
    })
}

// The driver.

#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) grants: u64,
    pub(crate) accepted: u64,
    pub(crate) skipped_lost: u64,
    /// Rejected although checked not lost, with a SIGSTOP between the check and the write.
    pub(crate) stopped_between: u64,
    /// Rejected although checked not lost, inside a failover window that README allows to
    /// lose the last grant (topology.rs).
    pub(crate) failover_lost: u64,
    /// Rejected although checked not lost, no SIGSTOP or failover window to explain it.
    pub(crate) stale_believed: u64,
    /// Accepted with a token out of the resource's order, or a grant whose token is not
    /// above every token granted before it (as the primitive's docs promise), or two grants
    /// with one token.
    pub(crate) token_regressions: u64,
    /// Holds reported, and those believed at both ends (the ones judged for overlaps).
    pub(crate) intervals: u64,
    pub(crate) believed: u64,
    /// Believed holds that overlap where the primitive forbids it (two writers, a reader
    /// beside a writer, more than n permits), with no SIGSTOP inside to explain it.
    pub(crate) overlaps: u64,
    /// Such overlaps explained by a SIGSTOP of one of the holders inside its hold.
    pub(crate) overlaps_stopped: u64,
    /// Such overlaps of a hold granted inside a failover window that may lose the last grant
    /// (README's Sentinel and Cluster promise) beside holds granted before it opened.
    pub(crate) overlaps_failover: u64,
    /// Such overlaps across a restart of a server that forgot its locks (Redis without its
    /// data): the earlier hold granted before the restart, the later after it to a holder
    /// process started since (a client that saw the restart grants nothing for a lease after
    /// it; one that first connects after it cannot know), ending at most [`RESTART_OVERLAP`]
    /// after the server was back (the old holder is told within about 50 ms of the server's
    /// return; the rest is a debug build's slack). And the longest such window, from the
    /// server's return to the overlap's end.
    pub(crate) overlaps_restart: u64,
    pub(crate) restart_window_max: Duration,
    pub(crate) faults: HashMap<&'static str, u64>,
    /// The liveness figures of the calm (see [`liveness`]).
    pub(crate) liveness: String,
}

/// Everything the holders reported, the SIGSTOP windows and the kills, for the checker.
#[derive(Default)]
pub(crate) struct Log {
    pub(crate) lines: Vec<Line>,
    /// (holder, stopped at, continued at) in wall ns.
    pub(crate) stops: Vec<(usize, u128, u128)>,
    /// Restarts of a server that forgot its locks: (went down, back up) in wall ns.
    pub(crate) restarts: Vec<(u128, u128)>,
    /// When each holder process started: (holder, wall ns).
    pub(crate) spawns: Vec<(usize, u128)>,
    /// When holders were killed (one entry a holder): their queue entries may still be in line.
    pub(crate) kills: Vec<Instant>,
    /// Holders killed by a holder fault (not a waiter fault, which judges its own victims):
    /// (holder, killed at in wall ns). One may have died holding the lock.
    pub(crate) killed: Vec<(usize, u128)>,
    /// Each judged handoff after a waiter kill: (release to next grant, bound).
    pub(crate) handoffs: Vec<(Duration, Duration)>,
    /// Problems found while the faults ran (a waiter fault's handoff judged on the spot).
    pub(crate) problems: Vec<String>,
    /// (from, to) in wall ns: failovers that may lose the last grant (any holder).
    pub(crate) failovers: Vec<(u128, u128)>,
    /// Until when a holder asked to hold past a restart may still hold
    /// ([`crate::holder::EXTENDED_HOLD`]).
    pub(crate) extended_until: Option<Instant>,
    /// That holder, and until when (wall ns) its hold runs under the longer lease it asked
    /// for ([`crate::holder::EXTENDED_TTL`]).
    pub(crate) extended: Option<(usize, u128)>,
}

impl Log {
    /// Notes that holder `i` was killed by a holder fault, now.
    pub(crate) fn killed(&mut self, i: usize) {
        self.kills.push(Instant::now());
        self.killed.push((i, crate::wall_ns()));
    }

    /// Whether holder `i`'s process at `at_ns` started after `since_ns`.
    fn started_since(&self, i: usize, since_ns: u128, at_ns: u128) -> bool {
        let started = (self.spawns.iter())
            .filter(|&&(h, t)| h == i && t <= at_ns)
            .map(|&(_, t)| t)
            .max();
        started.is_some_and(|t| t > since_ns)
    }

    /// The lease a holder killed by a holder fault at `killed_ns` held under: the TTL, or the
    /// longer one a hold asked to outlast a restart took.
    pub(crate) fn lease_of(&self, holder: usize, killed_ns: u128) -> Duration {
        match self.extended {
            Some((h, until)) if h == holder && killed_ns <= until => crate::holder::EXTENDED_TTL,
            _ => ttl(),
        }
    }

    /// The latest kill after `from_ns` and before `to_ns` of a holder that held the lock when
    /// it died (its last grant before then has no release): (that holder, killed at in wall
    /// ns). It kept the lock for up to a lease ([`Self::lease_of`]). Its grant may come before
    /// `from_ns`, beside a hold that outlasted a restart.
    pub(crate) fn killed_holding(&self, from_ns: u128, to_ns: u128) -> Option<(usize, u128)> {
        let held_at = |i: usize, k: u128| {
            let grant = (self.lines.iter())
                .filter(|l| l.holder == i)
                .filter_map(|l| match l.report {
                    Report::Granted { start_ns } if start_ns < k => Some(start_ns),
                    _ => None,
                })
                .max();
            grant.is_some_and(|g| !self.intervals().any(|h| h.holder == i && h.start_ns == g))
        };
        (self.killed.iter())
            .filter(|&&(i, k)| k > from_ns && k < to_ns && held_at(i, k))
            .max_by_key(|&&(_, k)| k)
            .copied()
    }

    fn stopped(&self, holder: usize, from_ns: u128, to_ns: u128) -> bool {
        self.stops
            .iter()
            .any(|(h, from, to)| *h == holder && *from <= to_ns && *to >= from_ns)
    }

    pub(crate) fn intervals(&self) -> impl Iterator<Item = &Interval> {
        self.lines.iter().filter_map(|l| match &l.report {
            Report::Held(i) => Some(i),
            _ => None,
        })
    }
}

/// The accepted writes the resource logged for each key, in its order: (mode, token).
pub(crate) type ResourceLog = Vec<(String, Vec<(char, u64)>)>;

/// The resource's logs of `keys`.
pub(crate) fn resource_log(url: &str, keys: &[&str]) -> ResourceLog {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut conn = redis::Client::open(url)
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("resource connection");
        let mut out = Vec::new();
        for key in keys {
            let [_, _, log] = crate::holder::resource_keys(key);
            let entries: Vec<String> = redis::cmd("LRANGE")
                .arg(log)
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            let parsed = entries
                .iter()
                .filter_map(|e| {
                    let mut f = e.split(' ');
                    let mode = f.next()?.chars().next()?;
                    Some((mode, f.next()?.parse().ok()?))
                })
                .collect();
            out.push((key.to_string(), parsed));
        }
        out
    })
}

/// What a grant may cost each lock server in commands, all told, while holders contend: an
/// acquire, a subscription's share, renewals of the holder and its waiters, a release, and
/// every command those scripts run inside (Redis counts them too): about 20 for a mutex and
/// 50 for a read-write lock or semaphore in these runs (Redlock: about 30 and 60 on each of
/// its nodes). A waiter re-checking every millisecond costs thousands. PostgreSQL counts
/// transactions, ZooKeeper packets received.
pub(crate) const MAX_COMMANDS_PER_GRANT: u64 = 200;

/// Grants reported since `calm`.
pub(crate) fn granted_since(log: &Log, calm: Instant) -> u64 {
    log.lines
        .iter()
        .filter(|l| matches!(l.report, Report::Granted { .. }) && l.at >= calm)
        .count() as u64
}

/// How long an old holder may still believe it holds beside a hold granted after a server
/// restarted without its data: the library tells it within about 50 ms of the server's return
/// (`redis_faults::after_a_restart_the_old_holder_is_told_whatever_the_outage`); a debug build
/// on a loaded machine gets the rest.
pub(crate) const RESTART_OVERLAP: Duration = Duration::from_millis(100);

/// Slack on top of every liveness bound: process start, connects, a loaded machine.
const SLACK: Duration = Duration::from_millis(1000);

/// What dead waiters in line cost before the next live one is served: a handoff lease each
/// where the lock is handed over (Redis, Redlock, PostgreSQL); on ZooKeeper their sessions
/// expire together, one session timeout after they died, rounded up to the server's next
/// expiry tick (500 ms), and the server's expiry and the watches take a while more (a run
/// measured 3.16 s with four dead in line, 2 s sessions).
pub(crate) fn dead_waiters_cost(backend: &str, dead: usize) -> Duration {
    if dead == 0 {
        Duration::ZERO
    } else if backend == "zookeeper-ensemble" {
        // The leader expires the sessions, and each ephemeral node's delete is a proposal the
        // quorum acknowledges before the watches fire: 3.70 s measured with three dead.
        ttl() + Duration::from_millis(1500)
    } else if backend.starts_with("zookeeper") {
        ttl() + Duration::from_millis(1000)
    } else {
        HANDOFF * dead as u32
    }
}

/// Liveness after the faults stop at `calm` (judged at `end`): every live holder is granted
/// within a lease (the TTL, or what is left of a longer one a killed holder took) + what the
/// holders killed lately cost as dead waiters + the holds of the others ahead of it + slack;
/// and once the calm's first grant happened, no gap between consecutive grants (or before
/// `end`) reaches a TTL. Returns the summary figures and the problems.
pub(crate) fn liveness(
    log: &Log,
    backend: &str,
    calm: Instant,
    end: Instant,
) -> (String, Vec<String>) {
    let mut problems = Vec::new();
    let dead = log
        .kills
        .iter()
        .filter(|k| calm.saturating_duration_since(**k) < ttl() * 2)
        .count();
    // ZooKeeper: whatever the last fault was (a holder cut off past its session, a server
    // restart, a kill), a holder that cannot renew keeps the lock until the server expires its
    // session, a session timeout after its last ping.
    let dead = if backend.starts_with("zookeeper") {
        dead.max(1)
    } else {
        dead
    };
    // A holder killed holding keeps the lock for what is left of its lease: at most a TTL, or
    // more if it took the longer lease a hold asks for to outlast a restart.
    let calm_ns = crate::wall_ns() - Instant::now().saturating_duration_since(calm).as_nanos();
    let extended_left = (log.killed.iter())
        .map(|&(i, k)| (k + log.lease_of(i, k).as_nanos()).saturating_sub(calm_ns))
        .max()
        .map_or(Duration::ZERO, |ns| {
            Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
        });
    let lease = ttl().max(extended_left);
    let bound = lease + dead_waiters_cost(backend, dead) + LONG_HOLD * (HOLDERS as u32 - 1) + SLACK;
    let grants: Vec<&Line> = log
        .lines
        .iter()
        .filter(|l| matches!(l.report, Report::Granted { .. }) && l.at >= calm)
        .collect();
    let mut first_max = Duration::ZERO;
    for i in 0..HOLDERS {
        match grants.iter().find(|l| l.holder == i) {
            Some(l) => {
                let d = l.at - calm;
                first_max = first_max.max(d);
                if d > bound {
                    problems.push(format!(
                        "holder {i} first granted {d:?} after the faults stopped (bound {bound:?}: {dead} dead waiters)"
                    ));
                }
            }
            None => problems.push(format!(
                "holder {i} not granted in the {:?} after the faults stopped",
                end - calm
            )),
        }
    }
    // On ZooKeeper (standalone or ensemble), waiters killed just before the calm hold their
    // place until their sessions expire, what one dead waiter costs there: gaps are judged from
    // then on.
    let last_kill = log.kills.iter().max().copied();
    let from = match last_kill {
        Some(k) if backend.starts_with("zookeeper") => {
            (k + dead_waiters_cost(backend, 1) + SLACK).max(calm)
        }
        _ => calm,
    };
    let mut gap_max = Duration::ZERO;
    let times: Vec<Instant> = grants.iter().map(|l| l.at).chain([end]).collect();
    for w in times.windows(2) {
        if w[0] >= from {
            gap_max = gap_max.max(w[1] - w[0]);
        }
    }
    if gap_max >= ttl() {
        problems.push(format!(
            "a {gap_max:?} stall between grants after the faults stopped (a TTL is {:?})",
            ttl()
        ));
    }
    (
        format!(
            "calm_first_grant_max_ms={} calm_bound_ms={} calm_gap_max_ms={}",
            first_max.as_millis(),
            bound.as_millis(),
            gap_max.as_millis()
        ),
        problems,
    )
}

/// The checker: counts grants and writes, and every violation.
///
/// `readers_share`: readers granted together may share a token (Redlock: each reader's token
/// is the largest of a quorum's counters, and two readers' quorums may each find their
/// largest on a different node with the same count; README says so).
///
/// `strict_restart`: judge a Redis restart without data as README promises (every hold up to
/// its last check that found it held, also one that later found itself lost; an overlap
/// excused only if it ends within [`RESTART_OVERLAP`] of the server's return). Otherwise
/// (CI, until the open defect behind a TCP proxy is fixed): holds believed at both ends, each
/// pair overlapping at most [`RESTART_OVERLAP`].
pub(crate) fn judge(
    log: &Log,
    resource: &ResourceLog,
    capacity: u32,
    readers_share: bool,
    strict_restart: bool,
    counts: &mut Counts,
) {
    // The resource's own order of accepted writes, per key: a write's token above every token
    // accepted before it, a read's above every write's (the read half of a downgraded write
    // carries the write's token). Each grant writes once, so an equal token is two grants
    // with one token.
    for (_, entries) in resource {
        let (mut max_all, mut max_write) = (0u64, 0u64);
        for &(mode, token) in entries {
            let ok = match mode {
                'w' => token > max_all,
                'd' => token >= max_write,
                _ => token > max_write,
            };
            if !ok {
                counts.token_regressions += 1;
                if counts.token_regressions <= 5 {
                    println!(
                        "chaos regression: the resource accepted {mode} {token} after writes up \
                         to {max_write} and anything up to {max_all}"
                    );
                }
            }
            max_all = max_all.max(token);
            if mode == 'w' {
                max_write = max_write.max(token);
            }
        }
    }
    for l in &log.lines {
        match &l.report {
            Report::Granted { .. } => counts.grants += 1,
            Report::SkippedLost => {
                counts.grants += 1;
                counts.skipped_lost += 1;
            }
            Report::Wrote {
                key,
                mode,
                token,
                accepted,
                check_ns,
                write_ns,
            } => {
                if *accepted {
                    counts.accepted += 1;
                } else if log.stopped(l.holder, *check_ns, *write_ns) {
                    counts.stopped_between += 1;
                } else {
                    let failover = log
                        .failovers
                        .iter()
                        .any(|(from, to)| *from <= *write_ns && *to >= *check_ns);
                    if failover {
                        counts.failover_lost += 1;
                    } else {
                        counts.stale_believed += 1;
                        if counts.stale_believed <= 5 {
                            println!(
                                "chaos stale: holder {} key {key} mode {mode} token {token} refused at {write_ns}",
                                l.holder
                            );
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let mut by_key: BTreeMap<&str, Vec<&Interval>> = BTreeMap::new();
    for i in log.intervals() {
        by_key.entry(i.key.as_str()).or_default().push(i);
    }
    for holds in by_key.values() {
        counts.intervals += holds.len() as u64;
        counts.token_regressions += grant_order(holds, readers_share);
        counts.believed += holds.iter().filter(|i| i.believed).count() as u64;
        // Strict: every hold up to its last check that found it held, also one that later
        // found itself lost (a holder told late that its lock is gone believed it meanwhile).
        let judged: Vec<&Interval> = if strict_restart {
            holds.clone()
        } else {
            holds.iter().copied().filter(|i| i.believed).collect()
        };
        let o = overlaps(log, judged, capacity, strict_restart);
        counts.overlaps += o.bad;
        counts.overlaps_stopped += o.stopped;
        counts.overlaps_failover += o.failover;
        counts.overlaps_restart += o.restart;
        counts.restart_window_max = counts.restart_window_max.max(o.restart_max);
    }
    if let Some((gap, bound)) = log.handoffs.iter().max_by_key(|(g, _)| *g) {
        counts.liveness += &format!(
            " waiter_kills_judged={} handoff_gap_max_ms={} (bound {} ms)",
            log.handoffs.len(),
            gap.as_millis(),
            bound.as_millis()
        );
    }
}

/// Tokens in grant order, as the docs promise: a grant `b` asked for after a grant `a` was
/// held (a's check before b's call) has a greater token than `a` — every pair for a mutex, a
/// write lock or a semaphore ("increasing in grant order"); for a read-write lock a write
/// above everything before it and a read above every write before it, readers among
/// themselves in no order. And no two grants of a key share a token. Returns the violations.
fn grant_order(holds: &[&Interval], readers_share: bool) -> u64 {
    let grants: Vec<&Interval> = holds.iter().copied().filter(|i| i.mode != 'D').collect();
    let mut bad = 0;
    let mut tokens: Vec<u64> = grants.iter().map(|i| i.token).collect();
    tokens.sort_unstable();
    tokens.dedup_by(|a, b| {
        // Two readers' shared token, where the backend allows it, is not a repeat.
        *a == *b
            && readers_share
            && grants
                .iter()
                .filter(|i| i.token == *a)
                .all(|i| i.mode == 'R')
    });
    for w in tokens.windows(2).filter(|w| w[0] == w[1]) {
        bad += 1;
        if bad <= 5 {
            let with: Vec<&&Interval> = grants.iter().filter(|i| i.token == w[0]).collect();
            println!("chaos regression: two grants with token {}: {with:?}", w[0]);
        }
    }
    let mut by_start = grants.clone();
    by_start.sort_by_key(|i| i.start_ns);
    let mut by_call = grants;
    by_call.sort_by_key(|i| i.call_ns);
    let (mut next, mut max_all, mut max_excl) = (0, 0u64, 0u64);
    for b in by_call {
        while next < by_start.len() && by_start[next].start_ns < b.call_ns {
            let a = by_start[next];
            max_all = max_all.max(a.token);
            if a.mode != 'R' {
                max_excl = max_excl.max(a.token);
            }
            next += 1;
        }
        let floor = if b.mode == 'R' { max_excl } else { max_all };
        if b.token <= floor && floor > 0 {
            bad += 1;
            if bad <= 5 {
                println!("chaos regression: {b:?} asked after grants up to {floor} were held");
            }
        }
    }
    bad
}

/// What [`overlaps`] found.
#[derive(Default)]
struct Overlaps {
    bad: u64,
    stopped: u64,
    failover: u64,
    restart: u64,
    restart_max: Duration,
}

/// Believed holds of one key that overlap where the primitive forbids: anything beside an
/// exclusive hold, or more than `capacity` permits at an instant. An overlap with a SIGSTOP of
/// one of its holders inside that holder's hold is explained (the holder could not check); so
/// is a grant inside a failover window that may lose the last grant, beside holds from before
/// it; and one of at most [`RESTART_OVERLAP`] between holds granted before and after a restart of a
/// server that forgot its locks.
fn overlaps(log: &Log, mut holds: Vec<&Interval>, capacity: u32, strict: bool) -> Overlaps {
    holds.sort_by_key(|i| i.start_ns);
    let stopped = |i: &Interval| log.stopped(i.holder, i.start_ns, i.end_ns);
    // The later hold `b` granted after a restart that the earlier ones were granted before,
    // to a process started since (the others' clients saw the restart and wait a lease): how
    // long they overlapped.
    // How long after the server was back: the old holders must be told within that window
    // whoever is granted meanwhile, however briefly each of them holds.
    // (Not strict: how long this pair overlapped.)
    let across_restart = |b: &Interval, involved: &[&Interval]| {
        let back = log.restarts.iter().find_map(|&(down, back)| {
            (b.start_ns >= down
                && involved.iter().all(|a| a.start_ns < down)
                && log.started_since(b.holder, down, b.start_ns))
            .then_some(back)
        })?;
        let end = involved.iter().map(|a| a.end_ns.min(b.end_ns)).max();
        let from = if strict { back } else { b.start_ns };
        Some(Duration::from_nanos(
            end.unwrap_or(0).saturating_sub(from) as u64
        ))
    };
    // The later hold `b` granted inside a failover window that README allows to lose the last
    // grant, beside holds granted before the window opened (on the old primary).
    let across_failover = |b: &Interval, involved: &[&Interval]| {
        log.failovers.iter().any(|&(from, to)| {
            (from..=to).contains(&b.start_ns) && involved.iter().all(|a| a.start_ns < from)
        })
    };
    let mut found = Overlaps::default();
    let mut active: Vec<&Interval> = Vec::new();
    for b in holds {
        active.retain(|a| a.end_ns > b.start_ns);
        let shared = |i: &Interval| matches!(i.mode, 'R' | 'D');
        let clash: Vec<&Interval> = active
            .iter()
            .copied()
            .filter(|a| (a.mode == 'X' || b.mode == 'X') || shared(a) != shared(b))
            .collect();
        let permits: u32 = active
            .iter()
            .filter(|a| a.mode == 'P')
            .map(|a| a.weight)
            .sum::<u32>()
            + if b.mode == 'P' { b.weight } else { 0 };
        let over = b.mode == 'P' && permits > capacity;
        if !clash.is_empty() || over {
            let involved: Vec<&Interval> = if over {
                active.iter().copied().filter(|a| a.mode == 'P').collect()
            } else {
                clash
            };
            let restart = across_restart(b, &involved);
            if stopped(b) || involved.iter().any(|a| stopped(a)) {
                found.stopped += 1;
            } else if across_failover(b, &involved) {
                found.failover += 1;
            } else if let Some(window) = restart.filter(|w| *w <= RESTART_OVERLAP) {
                found.restart += 1;
                found.restart_max = found.restart_max.max(window);
            } else {
                found.bad += 1;
                if found.bad <= 5 {
                    let why = restart.map_or(String::new(), |w| {
                        format!(" ({w:?} after a restart without data)")
                    });
                    println!("chaos overlap: {b:?} beside {involved:?}{why}");
                }
            }
        }
        active.push(b);
    }
    found
}
