//! The checker: what holders report, and the judgement of it — believed-stale writes, tokens
//! that do not increase, holders that stall, servers that are polled.

use std::collections::HashMap;
use std::time::Instant;

use crate::HOLDERS;

/// One line a holder reports per grant.
#[derive(Debug, Clone)]
pub(crate) enum Report {
    /// `token accepted check_ns write_ns`: wrote (or tried to) after checking it held.
    Wrote {
        holder: usize,
        token: u64,
        accepted: bool,
        check_ns: u128,
        write_ns: u128,
        at: Instant,
    },
    /// Granted, but already lost at the check: did not write.
    SkippedLost,
}

pub(crate) fn parse_report(holder: usize, line: &str) -> Option<Report> {
    let mut f = line.split_whitespace();
    match f.next()? {
        "W" => Some(Report::Wrote {
            holder,
            token: f.next()?.parse().ok()?,
            accepted: f.next()? == "1",
            check_ns: f.next()?.parse().ok()?,
            write_ns: f.next()?.parse().ok()?,
            at: Instant::now(),
        }),
        "L" => Some(Report::SkippedLost),
        _ => None,
    }
}

// The driver.

#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) grants: u64,
    pub(crate) accepted: u64,
    pub(crate) skipped_lost: u64,
    /// Rejected although checked not lost, with a SIGSTOP between the check and the write.
    pub(crate) stopped_between: u64,
    /// Rejected although checked not lost, no SIGSTOP to explain it.
    pub(crate) stale_believed: u64,
    /// Accepted with a token not above the last accepted one.
    pub(crate) token_regressions: u64,
    pub(crate) faults: HashMap<&'static str, u64>,
}

/// Everything the holders reported, and the SIGSTOP windows, for the checker.
#[derive(Default)]
pub(crate) struct Log {
    pub(crate) reports: Vec<Report>,
    /// (holder, stopped at, continued at) in wall ns.
    pub(crate) stops: Vec<(usize, u128, u128)>,
}

/// The tokens of the writes the resource accepted, in its order.
pub(crate) fn resource_log(url: &str) -> Vec<u64> {
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
        let entries: Vec<String> = redis::cmd("LRANGE")
            .arg("chaos:log")
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        entries
            .iter()
            .filter_map(|e| e.split(' ').next()?.parse().ok())
            .collect()
    })
}

/// What a grant may cost each lock server in commands, all told, while holders contend: an
/// acquire, a subscription's share, renewals of the holder and its waiters, a release, and
/// every command those scripts run inside (Redis counts them too): about 20 for a mutex and
/// 50 for a read-write lock or semaphore in these runs (Redlock: about 30 and 60 on each of
/// its nodes). A waiter re-checking every millisecond costs thousands.
pub(crate) const MAX_COMMANDS_PER_GRANT: u64 = 200;

/// Grants reported since `calm`.
pub(crate) fn granted_since(log: &Log, calm: Instant) -> u64 {
    log.reports
        .iter()
        .filter(|r| matches!(r, Report::Wrote { at, .. } if *at >= calm))
        .count() as u64
}

/// Holders without an accepted write since `calm` (the faults stopped 3×TTL before).
pub(crate) fn stalled(log: &Log, calm: Instant) -> Vec<String> {
    (0..HOLDERS)
        .filter(|&i| {
            !log.reports.iter().any(|r| {
                matches!(r, Report::Wrote { holder, accepted: true, at, .. } if *holder == i && *at >= calm)
            })
        })
        .map(|i| format!("holder {i} made no progress within 3xTTL of the faults stopping"))
        .collect()
}

/// The checker: counts grants and writes, and every violation.
pub(crate) fn judge(log: &Log, accepted_in_order: &[u64], counts: &mut Counts) {
    // The resource's own order of accepted writes: each grant writes once, so every token
    // must be above the one before (an equal one is two grants with one token).
    counts.token_regressions += accepted_in_order
        .windows(2)
        .filter(|w| w[1] <= w[0])
        .count() as u64;
    let mut writes: Vec<&Report> = log.reports.iter().collect();
    writes.sort_by_key(|r| match r {
        Report::Wrote { write_ns, .. } => *write_ns,
        Report::SkippedLost => 0,
    });
    for r in writes {
        counts.grants += 1;
        match r {
            Report::SkippedLost => counts.skipped_lost += 1,
            Report::Wrote {
                holder,
                token,
                accepted,
                check_ns,
                write_ns,
                ..
            } => {
                if *accepted {
                    counts.accepted += 1;
                    let _ = token;
                } else {
                    let stopped = log
                        .stops
                        .iter()
                        .any(|(h, from, to)| h == holder && *from <= *write_ns && *to >= *check_ns);
                    if stopped {
                        counts.stopped_between += 1;
                    } else {
                        counts.stale_believed += 1;
                    }
                }
            }
        }
    }
}
