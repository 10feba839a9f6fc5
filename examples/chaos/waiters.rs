//! Faults on queued waiters (holders report `Q` when they start to wait): SIGSTOP one past its
//! lease, or SIGKILL two or three in a row and judge, on the spot, how long the lock then takes
//! to reach a live holder.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::checker::{dead_waiters_cost, Log, Report};
use crate::fleet::Fleet;
use crate::holder::{EXTENDED_HOLD, LONG_HOLD};
use crate::{ttl, wall_ns, HOLDERS};

/// On top of what dead waiters cost: the next live waiter's round trips on a loaded machine.
const HANDOFF_SLACK: Duration = Duration::from_millis(500);

fn log(fleet: &Fleet) -> std::sync::MutexGuard<'_, Log> {
    fleet.log.lock().unwrap_or_else(|p| p.into_inner())
}

/// Holders whose last report is `Q` (waiting), at least `min_age` old, in the order they
/// started to wait (a FIFO lock's queue order, near enough).
pub(crate) fn queued(log: &Log, min_age: Duration) -> Vec<usize> {
    let now = Instant::now();
    let mut last: Vec<Option<(bool, Instant)>> = vec![None; HOLDERS];
    for l in log.lines.iter().rev() {
        if last[l.holder].is_none() {
            last[l.holder] = Some((matches!(l.report, Report::Queued), l.at));
        }
        if last.iter().all(Option::is_some) {
            break;
        }
    }
    let mut waiting: Vec<(Instant, usize)> = (0..HOLDERS)
        .filter_map(|i| match last[i] {
            Some((true, at)) if now - at >= min_age => Some((at, i)),
            _ => None,
        })
        .collect();
    waiting.sort_unstable();
    waiting.into_iter().map(|(_, i)| i).collect()
}

/// Asks a holder that holds now (its last report `G`) to keep holding past a restart
/// ([`crate::holder::EXTENDED_HOLD`]); waits up to a second for one. Returns it.
pub(crate) fn extend_hold(fleet: &mut Fleet) -> Option<usize> {
    use std::io::Write;
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let holding = {
            let log = log(fleet);
            (0..HOLDERS).find(|&i| {
                matches!(
                    log.lines
                        .iter()
                        .rev()
                        .find(|l| l.holder == i)
                        .map(|l| &l.report),
                    Some(Report::Granted { .. })
                )
            })
        };
        if let Some(i) = holding {
            let mut log = log(fleet);
            log.extended_until = Some(Instant::now() + EXTENDED_HOLD + Duration::from_millis(200));
            log.extended = Some((
                i,
                wall_ns() + (EXTENDED_HOLD + Duration::from_millis(200)).as_nanos(),
            ));
            drop(log);
            let stdin = fleet.holders[i].as_mut()?.stdin.as_mut()?;
            stdin.write_all(b"H\n").ok()?;
            stdin.flush().ok()?;
            std::thread::sleep(Duration::from_millis(20));
            return Some(i);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// SIGKILLs one queued waiter other than `but` (the first that waits, if any does within a
/// second), recording the kill; the caller starts it again. Returns it.
pub(crate) fn kill_queued_but(fleet: &mut Fleet, but: Option<usize>) -> Option<usize> {
    let deadline = Instant::now() + Duration::from_secs(1);
    let i = loop {
        let q = queued(&log(fleet), Duration::from_millis(30));
        if let Some(&i) = q.iter().find(|&&i| Some(i) != but) {
            break i;
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    fleet.kill(i);
    log(fleet).kills.push(Instant::now());
    Some(i)
}

/// Waits (up to a second) until `want` holders are queued; returns those that are.
fn wait_for_queued(fleet: &Fleet, want: usize) -> Vec<usize> {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let q = queued(&log(fleet), Duration::from_millis(30));
        if q.len() >= want || Instant::now() >= deadline {
            return q;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGSTOPs a queued waiter past its lease, then SIGCONTs it.
pub(crate) fn stop_waiter(fleet: &Fleet, pick: usize) {
    let q = wait_for_queued(fleet, 1);
    let Some(&i) = q.get(pick % q.len().max(1)) else {
        return;
    };
    let from = wall_ns();
    fleet.signal(i, Signal::SIGSTOP);
    std::thread::sleep(ttl() + Duration::from_millis(500));
    fleet.signal(i, Signal::SIGCONT);
    let to = wall_ns();
    log(fleet).stops.push((i, from, to));
}

/// SIGKILLs the first `n` queued waiters (fewer if fewer wait, so that one that waits stays
/// alive behind them): dead waiters in a row at the head of the queue, a live waiter that
/// queued before the next release behind them, and the respawned ones after it. Respawns them, and judges the
/// next handoff: from the first hold to end after the kill (and the last before it, unless a
/// victim was granted since), the next grant must come within
/// what the dead waiters in line cost (a handoff lease each; on ZooKeeper their sessions'
/// expiry) plus slack. A waiter granted while it was being frozen is no waiter: it holds for a
/// TTL, and the first hold to end after the kill is then the one after it.
pub(crate) fn kill_waiters(fleet: &mut Fleet, n: usize, backend: &str, primitive: &str) {
    // A hold kept past a restart (a read-write lock's or semaphore's, beside which others
    // still come and go) would stand between the dead waiters and the live one: judge the
    // handoff once it is over.
    let extended = log(fleet).extended_until;
    if let Some(left) = extended.and_then(|until| until.checked_duration_since(Instant::now())) {
        std::thread::sleep(left);
    }
    // One more than the victims queued, if it comes to that: a live waiter that queued before
    // the next release (told when the hold it queued behind ends) behind the dead ones.
    let q = wait_for_queued(fleet, n + 1);
    let queued = q.clone();
    let take = if q.len() > n {
        n
    } else {
        q.len().saturating_sub(1).max(1)
    };
    let victims: Vec<usize> = q.into_iter().take(take).collect();
    if victims.is_empty() {
        return;
    }
    // Their hosts crash: the servers hear nothing more from them, not even their connections
    // closing (a dead waiter whose connection is seen to close is the easy case), until TCP
    // keepalive gives up on them, after the handoff has been judged.
    let judged = ttl() * 2 + LONG_HOLD + Duration::from_secs(4);
    for &i in &victims {
        fleet.proxies[i].iter().for_each(|p| p.crash(judged));
        fleet.signal(i, Signal::SIGSTOP);
    }
    let t0 = wall_ns();
    let killed_at = Instant::now();
    let earlier = log(fleet)
        .kills
        .iter()
        .filter(|k| killed_at.saturating_duration_since(**k) < ttl() + Duration::from_millis(200))
        .count();
    for &i in &victims {
        fleet.kill(i);
        log(fleet).kills.push(killed_at);
    }
    for &i in &victims {
        fleet.spawn(i);
    }
    let dead = victims.len() + earlier;
    let mut extra = HANDOFF_SLACK;
    // Shared holds: the next in line may need a second holder's release too.
    if matches!(primitive, "rw" | "permits") {
        extra += LONG_HOLD;
    }
    // A multi-lock waiter may die holding its first key (for a TTL).
    if primitive == "multi" {
        extra += ttl();
    }
    let mut bound = dead_waiters_cost(backend, dead) + extra;
    std::thread::sleep(ttl() + LONG_HOLD + bound + Duration::from_secs(1));
    let mut log = log(fleet);
    // The releases judged: the first hold to end after the kill, and the last to end before
    // it, unless a victim reported a grant since (it died holding: a lease, not a handoff): the
    // lock may have been handed to a victim a moment before it froze.
    let next_grant = |r: u128| {
        log.lines
            .iter()
            .filter_map(|l| match l.report {
                Report::Granted { start_ns } if start_ns > r => Some(start_ns),
                _ => None,
            })
            .min()
    };
    let before = log
        .intervals()
        .map(|i| i.end_ns)
        .filter(|e| *e < t0)
        .max()
        .filter(|&r| {
            !log.lines.iter().any(|l| {
                victims.contains(&l.holder)
                    && matches!(l.report, Report::Granted { start_ns } if start_ns > r && start_ns < t0)
            })
        });
    let after = log.intervals().map(|i| i.end_ns).filter(|e| *e >= t0).min();
    // ZooKeeper: the dead waiters' sessions expire a session timeout after they died, however
    // early the hold before them ended; a release before the kill (say, a holder killed a
    // moment earlier, whose own session expires meanwhile) is judged from the kill.
    let judged_from = |r: u128| {
        if backend.starts_with("zookeeper") {
            r.max(t0)
        } else {
            r
        }
    };
    let (release, next) = [before, after]
        .into_iter()
        .flatten()
        .map(|r| (Some(r), next_grant(r)))
        .max_by_key(|&(r, g)| g.map_or(u128::MAX, |g| g.saturating_sub(r.map_or(g, judged_from))))
        .unwrap_or((after, None));
    if std::env::var_os("CHAOS_DEBUG").is_some() {
        let who = |t: Option<u128>, end: bool| {
            let t = t?;
            log.intervals()
                .find(|i| if end { i.end_ns == t } else { i.start_ns == t })
                .map(|i| i.holder)
        };
        eprintln!(
            "killq: victims {victims:?} of queued {queued:?}; release by {:?}, next grant to {:?}",
            who(release, true),
            who(next, false)
        );
        let ms = |t: u128| (t as i128 - t0 as i128) as f64 / 1e6;
        for &(i, k) in &log.killed {
            eprintln!("killq:   killed {i} at {:+.0} ms", ms(k));
        }
        for l in &log.lines {
            match &l.report {
                Report::Granted { start_ns } if ms(*start_ns).abs() < 5000.0 => {
                    eprintln!("killq:   {} granted at {:+.0} ms", l.holder, ms(*start_ns))
                }
                Report::Held(i) if ms(i.end_ns).abs() < 5000.0 => eprintln!(
                    "killq:   {} held {:+.0}..{:+.0} ms token {}",
                    i.holder,
                    ms(i.start_ns),
                    ms(i.end_ns),
                    i.token
                ),
                Report::Queued
                    if l.at
                        .max(killed_at)
                        .duration_since(l.at.min(killed_at))
                        .as_millis()
                        < 5000 =>
                {
                    let at = l.at.checked_duration_since(killed_at).map_or_else(
                        || -(killed_at.duration_since(l.at).as_secs_f64() * 1e3),
                        |d| d.as_secs_f64() * 1e3,
                    );
                    eprintln!("killq:   {} queued at {at:+.0} ms", l.holder)
                }
                _ => {}
            }
        }
    }
    // A holder killed a moment before by a holder fault, holding when it died, kept the lock
    // for up to a lease from its death (its last renewal was at most a lease before: the TTL,
    // or the longer one of a hold asked to outlast a restart); the dead waiters in line after
    // it cost their handoffs then (itself among them only if it died lately enough to be
    // counted with them).
    if let Some((r, (h, k))) = release.and_then(|r| Some((r, log.killed_holding(r, t0)?))) {
        let held =
            Duration::from_nanos(k.saturating_sub(judged_from(r)) as u64) + log.lease_of(h, k);
        let counted = t0.saturating_sub(k) < (ttl() + Duration::from_millis(200)).as_nanos();
        let behind = dead - usize::from(counted);
        bound = bound.max(held + dead_waiters_cost(backend, behind) + extra);
        if std::env::var_os("CHAOS_DEBUG").is_some() {
            eprintln!(
                "killq: holder {h} died holding under a lease of {:?}; bound {bound:?}",
                log.lease_of(h, k)
            );
        }
    }
    let problem = match (release, next) {
        (Some(r), Some(g)) => {
            let gap = Duration::from_nanos(g.saturating_sub(judged_from(r)) as u64);
            log.handoffs.push((gap, bound));
            (gap > bound).then(|| {
                format!(
                    "after killing waiters {victims:?} ({dead} dead in line) the next grant came \
                     {gap:?} after a release (bound {bound:?})"
                )
            })
        }
        (None, _) => Some(format!(
            "after killing waiters {victims:?} no hold ended in {:?}",
            killed_at.elapsed()
        )),
        (Some(_), None) => Some(format!(
            "after killing waiters {victims:?} nobody was granted after the next release"
        )),
    };
    log.problems.extend(problem);
}
