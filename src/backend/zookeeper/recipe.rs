//! Curator's lock layouts: node names, their order, who holds, whom a waiter watches, and
//! key-to-path rules.
//!
//! | distlock | Curator 5 | children of `<root>/<key>` |
//! |---|---|---|
//! | `Mutex` | `InterProcessMutex` | `_c_<uuid>-lock-<seq>` |
//! | `RwLock` | `InterProcessReadWriteLock` | `_c_<uuid>-__READ__<seq>`, `_c_<uuid>-__WRIT__<seq>` |
//! | `Semaphore` | `InterProcessSemaphoreV2` | `locks/_c_<uuid>-lock-<seq>` (admission), `leases/_c_<uuid>-lease-<seq>` |
//! | `Election` | `LeaderLatch` | `_c_<uuid>-latch-<seq>`, data = the participant's id (the value) |
//!
//! All lock nodes are EPHEMERAL_SEQUENTIAL (a downgraded read node excepted, see
//! [`downgraded_name`]). Every child of a queue node counts, foreign names included, ordered by
//! what follows the last lock name (or the whole name) compared byte-wise, exactly as Curator's
//! drivers and Java's `String.compareTo` do for ASCII.

use crate::backend::LockKind;
use crate::error::{Error, Result};

/// Curator's `InterProcessMutex` lock name (also the semaphore's admission queue).
const LOCK_NAME: &str = "lock-";
/// `LeaderLatch.LOCK_NAME`: a latch participant (a leadership claim).
const LATCH_NAME: &str = "latch-";
/// `InterProcessReadWriteLock.READ_LOCK_NAME`.
const READ_NAME: &str = "__READ__";
/// `InterProcessReadWriteLock.WRITE_LOCK_NAME`.
const WRITE_NAME: &str = "__WRIT__";
/// `InterProcessSemaphoreV2.LEASE_BASE_NAME`.
const LEASE_NAME: &str = "lease-";
/// `InterProcessSemaphoreV2`'s admission queue and lease children, under the semaphore's node.
pub(super) const ADMISSION: &str = "locks";
pub(super) const LEASES: &str = "leases";

/// The lock name a claim of `kind` queues under.
fn lock_name(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Read => READ_NAME,
        LockKind::Write => WRITE_NAME,
        LockKind::Leader => LATCH_NAME,
        _ => LOCK_NAME,
    }
}

/// The prefix ZooKeeper appends the sequence to: `_c_<uuid>-lock-` (or `__READ__`, `__WRIT__`).
pub(super) fn node_prefix(uuid: &str, kind: LockKind) -> String {
    format!("{}{}", protection_prefix(uuid), lock_name(kind))
}

/// The prefix of a semaphore's lease nodes: `_c_<uuid>-lease-`.
pub(super) fn lease_prefix(uuid: &str) -> String {
    format!("{}{LEASE_NAME}", protection_prefix(uuid))
}

/// The part of a node name that finds it again after a lost `create` reply: `_c_<uuid>-`.
pub(super) fn protection_prefix(uuid: &str) -> String {
    format!("_c_{uuid}-")
}

/// The end of the name of the read node a write node turns into, whatever its protection
/// prefix: `__READ__<the write node's sequence>` (see [`downgraded_name`]). `None` if
/// `write_node` is not a write node.
pub(super) fn downgraded_suffix(write_node: &str) -> Option<String> {
    let at = write_node.rfind(WRITE_NAME)?;
    Some(format!(
        "{READ_NAME}{}",
        &write_node[at + WRITE_NAME.len()..]
    ))
}

/// The name of the read node a write node turns into (Curator >= 5.5, CURATOR-621): a plain
/// EPHEMERAL node `_c_<uuid>-__READ__<the write node's sequence>`, so it sorts exactly where
/// the write node was and no writer queued behind can overtake it when the write node goes.
/// `None` if `write_node` is not a write node.
pub(super) fn downgraded_name(write_node: &str, uuid: &str) -> Option<String> {
    let at = write_node.rfind(WRITE_NAME)?;
    let seq = &write_node[at + WRITE_NAME.len()..];
    Some(format!("{}{READ_NAME}{seq}", protection_prefix(uuid)))
}

/// Curator's `standardFixForSorting`: what follows the last `lock_name`, or the whole name.
fn fix<'a>(name: &'a str, lock_name: &str) -> &'a str {
    name.rfind(lock_name)
        .map_or(name, |at| &name[at + lock_name.len()..])
}

/// What Curator sorts a child by, for a queue of `kind` claims.
fn sort_key(kind: LockKind, name: &str) -> &str {
    match kind {
        // `SortingLockInternalsDriver`: readers and writers share one order by sequence.
        LockKind::Read | LockKind::Write => fix(fix(name, READ_NAME), WRITE_NAME),
        // `LeaderLatch.checkLeadership`: `getSortedChildren("latch-", ...)`.
        LockKind::Leader => fix(name, LATCH_NAME),
        _ => fix(name, LOCK_NAME),
    }
}

/// Sorts children into lock order (stable, like Curator's sort over the server's list).
pub(super) fn sort(kind: LockKind, children: &mut [String]) {
    sort_by_name(kind, children, String::as_str);
}

/// [`sort`] for items that carry a child's name.
pub(super) fn sort_by_name<T>(kind: LockKind, items: &mut [T], name: impl Fn(&T) -> &str) {
    items.sort_by(|a, b| sort_key(kind, name(a)).cmp(sort_key(kind, name(b))));
}

/// Where `ours` stands among sorted `children`, and the child it must wait for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Place<'a> {
    /// Nothing ahead of us excludes us: the lock is ours (for a semaphore claim: the admission
    /// queue is).
    Head,
    /// Behind `predecessor`; `granted_when_gone` when its deletion alone makes us the holder,
    /// with no need to list again.
    Behind {
        predecessor: &'a str,
        granted_when_gone: bool,
    },
    /// Our node is not among the children (its session ended, or someone deleted it).
    Missing,
}

/// Curator's predicates. A writer (or a mutex, a latch participant, or a semaphore's
/// admission claim) holds when it is first and watches the child just before it. A reader holds when no writer is ahead of
/// it and otherwise watches the *first* writer ahead (`ReadLock`'s driver), so every reader
/// behind one writer wakes together.
///
/// Only a mutex (or admission) waiter right behind the head, or a reader behind exactly one
/// writer, is granted by a deletion alone: a read-write lock's head may be a writer that
/// downgrades, leaving a read node in its place that still excludes the next writer.
pub(super) fn place<'a>(kind: LockKind, sorted: &'a [String], ours: &str) -> Place<'a> {
    let Some(at) = sorted.iter().position(|c| c == ours) else {
        return Place::Missing;
    };
    if kind == LockKind::Read {
        let mut writers = sorted[..at].iter().filter(|c| c.contains(WRITE_NAME));
        return match (writers.next(), writers.next()) {
            (None, _) => Place::Head,
            (Some(first), second) => Place::Behind {
                predecessor: first,
                granted_when_gone: second.is_none(),
            },
        };
    }
    match at {
        0 => Place::Head,
        i => Place::Behind {
            predecessor: &sorted[i - 1],
            granted_when_gone: i == 1 && kind != LockKind::Write,
        },
    }
}

/// The node just ahead of `predecessor`, for a mutex waiter that is not yet second in line: it
/// watches that node too, and once it goes, a fresh listing (made while the predecessor may
/// still hold the lock) can show the predecessor at the head; then the predecessor's deletion
/// alone makes us the holder, with no listing between a release and the next grant. A node is
/// so watched by at most two waiters: still no herd. `None` for a predecessor at the head, and
/// for the other kinds (a read-write lock's head may downgrade and stay; a semaphore's
/// admission head waits on the leases). A latch participant queues as a mutex waiter does.
pub(super) fn ahead_of<'a>(
    kind: LockKind,
    sorted: &'a [String],
    predecessor: &str,
) -> Option<&'a str> {
    if !matches!(kind, LockKind::Exclusive | LockKind::Leader) {
        return None;
    }
    let at = sorted.iter().position(|c| c == predecessor)?;
    at.checked_sub(1).map(|i| sorted[i].as_str())
}

/// Another family of lock seen among the children of a lock node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Other {
    /// `InterProcessMutex` nodes.
    Mutex,
    /// `InterProcessReadWriteLock` nodes.
    RwLock,
    /// `InterProcessSemaphoreV2`'s `locks` / `leases` nodes (in use only if they have
    /// children, which the caller checks).
    Semaphore,
    /// `LeaderLatch` participants.
    Election,
}

impl std::fmt::Display for Other {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Other::Mutex => "a mutex (Curator `InterProcessMutex` nodes)",
            Other::RwLock => "a read-write lock (Curator `InterProcessReadWriteLock` nodes)",
            Other::Semaphore => "a semaphore (Curator `InterProcessSemaphoreV2` nodes)",
            Other::Election => "an election (Curator `LeaderLatch` nodes)",
        })
    }
}

/// The first child of a lock node that belongs to another family than `kind`'s. Curator would
/// let them coexist without excluding each other (their sorters disagree); distlock refuses.
/// Names of no family at all are left alone, as Curator does. Another family's queue nodes
/// come first; then a semaphore's containers (`locks`, `leases`), which say the key is a
/// semaphore only while they hold anything: a semaphore ask refused on a mutex or a read-write
/// lock leaves them behind, empty, until they are cleaned up (callers look inside).
pub(super) fn other_family(kind: LockKind, children: &[String]) -> Option<Other> {
    let container = |c: &String| c == ADMISSION || c == LEASES;
    let node = children.iter().filter(|c| !container(c)).find_map(|c| {
        let other = if c.contains(READ_NAME) || c.contains(WRITE_NAME) {
            Other::RwLock
        } else if c.contains(LOCK_NAME) {
            Other::Mutex
        } else if c.contains(LATCH_NAME) {
            Other::Election
        } else {
            return None;
        };
        let same = matches!(
            (kind, other),
            (LockKind::Exclusive, Other::Mutex)
                | (LockKind::Read | LockKind::Write, Other::RwLock)
                | (LockKind::Leader, Other::Election)
        );
        (!same).then_some(other)
    });
    let semaphore = !matches!(kind, LockKind::Permits { .. }) && children.iter().any(container);
    node.or(semaphore.then_some(Other::Semaphore))
}

/// The sequence ZooKeeper appended to a sequential node's name (ten digits), if any.
fn sequence(name: &str) -> Option<u64> {
    let digits = name.get(name.len().checked_sub(10)?..)?;
    digits
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| digits.parse().ok())
        .flatten()
}

/// The children of a lock node made before `ours` (by the sequence the key's sequential
/// children share), and those of no sequence (a semaphore's containers, foreign names). An
/// ask of another family made after ours sees our node and is refused: only the earlier ones
/// may turn ours away, so of two asks racing the first one wins, as on the other backends.
pub(super) fn made_before(children: &[String], ours: &str) -> Vec<String> {
    let Some(mine) = sequence(ours) else {
        return children.to_vec();
    };
    children
        .iter()
        .filter(|c| sequence(c).is_none_or(|s| s < mine))
        .cloned()
        .collect()
}

/// The children of a lock node that are queue nodes of its family, without a semaphore's
/// containers.
pub(super) fn family_nodes(children: Vec<String>) -> Vec<String> {
    children
        .into_iter()
        .filter(|c| c != ADMISSION && c != LEASES)
        .collect()
}

/// The most bytes a latch node may hold (a campaign's or a proclaim's value): a server drops
/// the connection of a request larger than its `jute.maxbuffer` (1 MiB by default), path and
/// ACLs included, which would cost the whole session's locks a reconnect, again at every retry.
pub(super) const MAX_VALUE_LEN: usize = (1 << 20) - (16 << 10);

/// Refuses a value a latch node cannot hold ([`MAX_VALUE_LEN`]), before any I/O.
pub(super) fn validate_value(key: &str, value: &[u8]) -> Result<()> {
    crate::backend::wire::check_value_len("zookeeper", key, value, MAX_VALUE_LEN)
}

/// Rejects keys that are not a clean relative ZooKeeper path: empty segments, `.` and `..`,
/// and characters ZooKeeper refuses in paths.
pub(super) fn validate_key(key: &str) -> Result<()> {
    for segment in key.split('/') {
        match segment {
            "" => {
                return Err(Error::invalid_key(format!(
                    "`{key}` has an empty path segment (a leading, trailing or doubled `/`)"
                )))
            }
            "." | ".." => {
                return Err(Error::invalid_key(format!(
                    "`{key}` has a `{segment}` path segment"
                )))
            }
            _ => {}
        }
    }
    if let Some(c) = key.chars().find(|&c| forbidden_in_path(c)) {
        return Err(Error::invalid_key(format!(
            "`{}` contains {:?}, which ZooKeeper does not allow in a path",
            key.escape_debug(),
            c
        )));
    }
    Ok(())
}

/// ZooKeeper's `PathUtils.validatePath` character rules.
fn forbidden_in_path(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..='\u{ffff}')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn sorts_by_sequence_like_curator() {
        let mut c = names(&[
            "_c_ffffffff-ffff-4fff-bfff-ffffffffffff-lock-0000000003",
            "_c_00000000-0000-4000-8000-000000000000-lock-0000000010",
            "foreign",
            "_c_88888888-8888-4888-8888-888888888888-lock-0000000001",
        ]);
        sort(LockKind::Exclusive, &mut c);
        assert_eq!(
            c,
            names(&[
                "_c_88888888-8888-4888-8888-888888888888-lock-0000000001",
                "_c_ffffffff-ffff-4fff-bfff-ffffffffffff-lock-0000000003",
                "_c_00000000-0000-4000-8000-000000000000-lock-0000000010",
                "foreign",
            ])
        );
    }

    #[test]
    fn places_against_the_immediate_predecessor() {
        let c = names(&[
            "a-lock-0000000001",
            "b-lock-0000000002",
            "c-lock-0000000003",
        ]);
        let m = LockKind::Exclusive;
        assert_eq!(place(m, &c, "a-lock-0000000001"), Place::Head);
        assert_eq!(
            place(m, &c, "b-lock-0000000002"),
            Place::Behind {
                predecessor: "a-lock-0000000001",
                granted_when_gone: true
            }
        );
        assert_eq!(
            place(m, &c, "c-lock-0000000003"),
            Place::Behind {
                predecessor: "b-lock-0000000002",
                granted_when_gone: false
            }
        );
        assert_eq!(place(m, &c, "d-lock-0000000004"), Place::Missing);
        // Third in line also watches the head, so it is second in line before its turn.
        assert_eq!(
            ahead_of(m, &c, "b-lock-0000000002"),
            Some("a-lock-0000000001")
        );
        assert_eq!(ahead_of(m, &c, "a-lock-0000000001"), None);
        assert_eq!(ahead_of(LockKind::Write, &c, "b-lock-0000000002"), None);
    }

    #[test]
    fn protected_names_match_curator() {
        let uuid = "53345f98-9423-4e0c-a7b5-9f819e3ec2e1";
        assert_eq!(
            node_prefix(uuid, LockKind::Exclusive),
            "_c_53345f98-9423-4e0c-a7b5-9f819e3ec2e1-lock-"
        );
        assert_eq!(
            node_prefix(uuid, LockKind::Write),
            "_c_53345f98-9423-4e0c-a7b5-9f819e3ec2e1-__WRIT__"
        );
        assert_eq!(
            lease_prefix(uuid),
            "_c_53345f98-9423-4e0c-a7b5-9f819e3ec2e1-lease-"
        );
        // Curator's isProtectedZNode: char 39 is '-' and 3..39 parse as a UUID.
        let name = format!("{}0000000007", node_prefix(uuid, LockKind::Read));
        assert_eq!(name.as_bytes()[39], b'-');
        assert_eq!(&name[3..39], uuid);
    }

    #[test]
    fn readers_and_writers_share_one_order_and_follow_curators_predicates() {
        let mut c = names(&[
            "_c_3-__WRIT__0000000004",
            "_c_1-__READ__0000000001",
            "_c_5-__READ__0000000005",
            "_c_2-__READ__0000000002",
            "_c_6-__WRIT__0000000006",
            "_c_7-__READ__0000000007",
        ]);
        sort(LockKind::Read, &mut c);
        assert_eq!(c[0], "_c_1-__READ__0000000001");
        assert_eq!(c[2], "_c_3-__WRIT__0000000004");
        // Readers ahead of every writer hold together.
        assert_eq!(
            place(LockKind::Read, &c, "_c_2-__READ__0000000002"),
            Place::Head
        );
        // A writer waits for the node just before it, reader or writer, and even right behind
        // the head it lists again when that goes (the head may have downgraded).
        assert_eq!(
            place(LockKind::Write, &c, "_c_3-__WRIT__0000000004"),
            Place::Behind {
                predecessor: "_c_2-__READ__0000000002",
                granted_when_gone: false
            }
        );
        // A reader watches the first writer ahead of it, not the nearest one.
        assert_eq!(
            place(LockKind::Read, &c, "_c_5-__READ__0000000005"),
            Place::Behind {
                predecessor: "_c_3-__WRIT__0000000004",
                granted_when_gone: true
            }
        );
        assert_eq!(
            place(LockKind::Read, &c, "_c_7-__READ__0000000007"),
            Place::Behind {
                predecessor: "_c_3-__WRIT__0000000004",
                granted_when_gone: false
            }
        );
    }

    #[test]
    fn a_downgraded_read_node_takes_the_write_nodes_place() {
        let read = downgraded_name("_c_a-__WRIT__0000000004", "b").unwrap();
        assert_eq!(read, "_c_b-__READ__0000000004");
        let mut c = names(&["_c_c-__WRIT__0000000005", &read, "_c_a-__WRIT__0000000004"]);
        sort(LockKind::Write, &mut c);
        assert_eq!(
            place(LockKind::Write, &c, "_c_c-__WRIT__0000000005"),
            Place::Behind {
                predecessor: "_c_a-__WRIT__0000000004",
                granted_when_gone: false
            }
        );
        assert_eq!(downgraded_name("_c_a-lock-0000000004", "b"), None);
    }

    #[test]
    fn latch_participants_follow_curators_leader_latch() {
        let uuid = "53345f98-9423-4e0c-a7b5-9f819e3ec2e1";
        assert_eq!(
            node_prefix(uuid, LockKind::Leader),
            "_c_53345f98-9423-4e0c-a7b5-9f819e3ec2e1-latch-"
        );
        let mut c = names(&[
            "_c_ffffffff-ffff-4fff-bfff-ffffffffffff-latch-0000000003",
            "_c_00000000-0000-4000-8000-000000000000-latch-0000000010",
            "_c_88888888-8888-4888-8888-888888888888-latch-0000000001",
        ]);
        sort(LockKind::Leader, &mut c);
        assert!(c[0].ends_with("latch-0000000001"), "{c:?}");
        assert!(c[2].ends_with("latch-0000000010"), "{c:?}");
        let l = LockKind::Leader;
        assert_eq!(place(l, &c, &c[0]), Place::Head);
        assert_eq!(
            place(l, &c, &c[1]),
            Place::Behind {
                predecessor: &c[0],
                granted_when_gone: true
            }
        );
        assert_eq!(ahead_of(l, &c, &c[1]), Some(c[0].as_str()));
        // A latch is its own family: neither a mutex nor anything else.
        assert_eq!(other_family(l, &c), None);
        assert_eq!(other_family(LockKind::Exclusive, &c), Some(Other::Election));
        let mutex = names(&["_c_1-lock-0000000001"]);
        assert_eq!(other_family(l, &mutex), Some(Other::Mutex));
    }

    #[test]
    fn other_families_are_named() {
        let rw = names(&["_c_1-__READ__0000000001"]);
        assert_eq!(other_family(LockKind::Exclusive, &rw), Some(Other::RwLock));
        assert_eq!(other_family(LockKind::Write, &rw), None);
        let sem = names(&["leases", "locks"]);
        assert_eq!(other_family(LockKind::Read, &sem), Some(Other::Semaphore));
        let permits = LockKind::Permits { count: 1, max: 2 };
        assert_eq!(other_family(permits, &sem), None);
        let mutex = names(&["foreign", "_c_1-lock-0000000001"]);
        assert_eq!(other_family(permits, &mutex), Some(Other::Mutex));
        assert_eq!(other_family(LockKind::Exclusive, &mutex), None);
        // A semaphore's containers beside a family's nodes: another family's nodes first,
        // then the containers (a semaphore if they are not empty: the caller looks).
        let rw = names(&["leases", "locks", "_c_1-__WRIT__0000000001"]);
        assert_eq!(other_family(LockKind::Exclusive, &rw), Some(Other::RwLock));
        assert_eq!(other_family(LockKind::Write, &rw), Some(Other::Semaphore));
        assert_eq!(other_family(permits, &rw), Some(Other::RwLock));
        assert_eq!(family_nodes(rw), names(&["_c_1-__WRIT__0000000001"]));
        // Of two asks racing, only the one made first counts for the other.
        let race = names(&["locks", "_c_1-lock-0000000007", "_c_2-latch-0000000008"]);
        assert_eq!(
            made_before(&race, "_c_2-latch-0000000008"),
            names(&["locks", "_c_1-lock-0000000007"])
        );
        assert_eq!(
            made_before(&race, "_c_1-lock-0000000007"),
            names(&["locks"])
        );
    }

    #[test]
    fn path_rules() {
        for ok in ["orders", "orders/42", "a:b", "ünïcode/ok"] {
            validate_key(ok).unwrap();
        }
        for bad in [
            "/abs",
            "trail/",
            "a//b",
            "..",
            "a/../b",
            "./a",
            "tab\there",
            "\u{7f}",
        ] {
            assert!(validate_key(bad).unwrap_err().is_invalid_key(), "{bad}");
        }
    }
}
