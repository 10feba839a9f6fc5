//! What `inspect` and `unlock` print: tables for people, JSON for scripts.

use std::time::Duration;

use distlock::backend::{Family, LockKind};
use distlock::{Holder, Inspection};

/// What `unlock` removed (or, not `done`, would remove).
pub(crate) fn removal_table(key: &str, holders: &[Holder], done: bool) -> String {
    let verb = if done { "removed" } else { "would remove" };
    if holders.is_empty() {
        return format!("`{key}` is not held: nothing to remove\n");
    }
    let mut out = format!("unlock {verb} {} holder(s) of `{key}`:\n", holders.len());
    for h in holders {
        out.push_str(&holder_line(h));
    }
    out
}

/// What dropped holders may still do, after `unlock --force` removed `holders`.
pub(crate) fn still_acting(holders: &[Holder]) -> String {
    if holders.is_empty() {
        return String::new();
    }
    let tokens: Vec<String> = holders
        .iter()
        .map(|h| {
            h.fencing_token
                .map_or_else(|| "unknown".to_owned(), |t| t.to_string())
        })
        .collect();
    let (them, their) = if holders.len() == 1 {
        ("holder", "its")
    } else {
        ("holders", "their")
    };
    format!(
        "The removed {them} (token {}) may still act until {their} next renewal, within about a third of {their} TTL (in-process and ZooKeeper holders are told at once): only fencing keeps {their} writes out, where the storage refuses tokens below the highest it has seen.\n",
        tokens.join(", ")
    )
}

/// `unlock --json`: the key, its family, whether the holders were dropped, and the holders
/// (with their fencing tokens).
pub(crate) fn unlock_json(
    key: &str,
    family: Option<Family>,
    holders: &[Holder],
    forced: bool,
) -> serde_json::Value {
    let (family, _) = family_name(family);
    serde_json::json!({
        "key": key,
        "family": family,
        "forced": forced,
        "removed": holders_json(holders),
    })
}

fn holder_line(h: &Holder) -> String {
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
    let (name, n) = kind_name(h.kind);
    let kind = n.map_or(name.to_owned(), |n| format!("{name}×{n}"));
    format!(
        "  {:<12} token {:<20} lease left {}\n",
        kind,
        or_dash(h.fencing_token.map(|t| t.to_string())),
        or_dash(h.lease_left.map(|d| format!("{:.1}s", d.as_secs_f64())))
    )
}

fn holders_json(holders: &[Holder]) -> Vec<serde_json::Value> {
    holders
        .iter()
        .map(|h| {
            let (kind, permits) = kind_name(h.kind);
            serde_json::json!({
                "kind": kind,
                "permits": permits,
                "fencing_token": h.fencing_token,
                "lease_left_ms": millis(h.lease_left),
            })
        })
        .collect()
}

fn family_name(family: Option<Family>) -> (&'static str, Option<u32>) {
    match family {
        None => ("free", None),
        Some(Family::Mutex) => ("mutex", None),
        Some(Family::RwLock) => ("rwlock", None),
        Some(Family::Semaphore { max }) => ("semaphore", (max > 0).then_some(max)),
        Some(Family::Election) => ("election", None),
        Some(_) => ("other", None),
    }
}

fn kind_name(kind: LockKind) -> (&'static str, Option<u32>) {
    match kind {
        LockKind::Exclusive => ("exclusive", None),
        LockKind::Read => ("read", None),
        LockKind::Write => ("write", None),
        LockKind::Permits { count, .. } => ("permits", (count > 0).then_some(count)),
        LockKind::Leader => ("leader", None),
        _ => ("other", None),
    }
}

fn millis(d: Option<Duration>) -> serde_json::Value {
    d.map_or(serde_json::Value::Null, |d| (d.as_millis() as u64).into())
}

pub(crate) fn to_json(seen: &Inspection) -> serde_json::Value {
    let (family, max) = family_name(seen.family);
    let holders = holders_json(&seen.holders);
    let waiters: Vec<_> = seen
        .waiters
        .iter()
        .map(|w| {
            let (kind, permits) = kind_name(w.kind);
            serde_json::json!({ "kind": kind, "permits": permits, "waited_ms": millis(w.waited) })
        })
        .collect();
    serde_json::json!({
        "key": seen.key,
        "family": family,
        "max_permits": max,
        "holders": holders,
        "waiters": waiters,
        // What `distlock unlock KEY --force` would drop: every holder above.
        "unlock_removes": seen.holders.len(),
    })
}

/// Said under a table with a `-` in it, where the operator reads it.
const NOT_RECORDED: &str = "-         not recorded by this service: on one Redis server a mutex taken uncontended records no token, Redis and PostgreSQL no time a waiter queued, ZooKeeper no lease (it is the holder's session)\n";

pub(crate) fn to_table(seen: &Inspection) -> String {
    let (family, max) = family_name(seen.family);
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
    let secs = |d: Option<Duration>| or_dash(d.map(|d| format!("{:.1}s", d.as_secs_f64())));
    let kind = |k: LockKind| {
        let (name, n) = kind_name(k);
        n.map_or(name.to_owned(), |n| format!("{name}×{n}"))
    };
    let mut out = format!(
        "key       {}\nfamily    {family}{}\n",
        seen.key,
        max.map_or(String::new(), |m| format!(" of {m}"))
    );
    out.push_str(&format!("holders   {}\n", seen.holders.len()));
    for h in &seen.holders {
        out.push_str(&holder_line(h));
    }
    out.push_str(&format!("waiters   {}\n", seen.waiters.len()));
    for (i, w) in seen.waiters.iter().enumerate() {
        out.push_str(&format!(
            "  {:<3} {:<12} waited {}\n",
            i + 1,
            kind(w.kind),
            secs(w.waited)
        ));
    }
    let unknown = seen
        .holders
        .iter()
        .any(|h| h.fencing_token.is_none() || h.lease_left.is_none())
        || seen.waiters.iter().any(|w| w.waited.is_none());
    if unknown {
        out.push_str(NOT_RECORDED);
    }
    if !seen.holders.is_empty() {
        out.push_str(&format!(
            "unlock    `distlock unlock {} --force` would remove the {} holder(s) above\n",
            seen.key,
            seen.holders.len()
        ));
    }
    out
}
