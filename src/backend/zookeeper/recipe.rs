//! Curator's `InterProcessMutex` layout: node names, their order, and key-to-path rules.
//!
//! A lock on `<root>/<key>` is a set of EPHEMERAL_SEQUENTIAL children named
//! `_c_<uuid>-lock-<10-digit sequence>` (Curator's protected mode). Every child of the lock
//! node counts, foreign names included, ordered by what follows the last `lock-` (or the whole
//! name) compared byte-wise, exactly as Curator's `standardFixForSorting` and Java's
//! `String.compareTo` do for ASCII. The first child holds the lock; every other waits on the
//! one just before it.

use crate::error::{Error, Result};

/// Curator's `LockInternals` lock name.
const LOCK_NAME: &str = "lock-";

/// The prefix ZooKeeper appends the sequence to: `_c_<uuid>-lock-`.
pub(super) fn node_prefix(uuid: &str) -> String {
    format!("{}{LOCK_NAME}", protection_prefix(uuid))
}

/// The part of a node name that finds it again after a lost `create` reply: `_c_<uuid>-`.
pub(super) fn protection_prefix(uuid: &str) -> String {
    format!("_c_{uuid}-")
}

/// What Curator sorts a child by.
fn sort_key(name: &str) -> &str {
    name.rfind(LOCK_NAME)
        .map_or(name, |at| &name[at + LOCK_NAME.len()..])
}

/// Sorts children into lock order (stable, like Curator's sort over the server's list).
pub(super) fn sort(children: &mut [String]) {
    children.sort_by(|a, b| sort_key(a).cmp(sort_key(b)));
}

/// Where `ours` stands among sorted `children`, and the child it must wait for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Place<'a> {
    /// First in line: the lock is ours.
    Head,
    /// Behind `predecessor`; `predecessor_is_head` when it is the holder itself.
    Behind {
        predecessor: &'a str,
        predecessor_is_head: bool,
    },
    /// Our node is not among the children (its session ended, or someone deleted it).
    Missing,
}

pub(super) fn place<'a>(sorted: &'a [String], ours: &str) -> Place<'a> {
    match sorted.iter().position(|c| c == ours) {
        None => Place::Missing,
        Some(0) => Place::Head,
        Some(i) => Place::Behind {
            predecessor: &sorted[i - 1],
            predecessor_is_head: i == 1,
        },
    }
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
        sort(&mut c);
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
        assert_eq!(place(&c, "a-lock-0000000001"), Place::Head);
        assert_eq!(
            place(&c, "b-lock-0000000002"),
            Place::Behind {
                predecessor: "a-lock-0000000001",
                predecessor_is_head: true
            }
        );
        assert_eq!(
            place(&c, "c-lock-0000000003"),
            Place::Behind {
                predecessor: "b-lock-0000000002",
                predecessor_is_head: false
            }
        );
        assert_eq!(place(&c, "d-lock-0000000004"), Place::Missing);
    }

    #[test]
    fn protected_names_match_curator() {
        let uuid = "53345f98-9423-4e0c-a7b5-9f819e3ec2e1";
        assert_eq!(
            node_prefix(uuid),
            "_c_53345f98-9423-4e0c-a7b5-9f819e3ec2e1-lock-"
        );
        // Curator's isProtectedZNode: char 39 is '-' and 3..39 parse as a UUID.
        let name = format!("{}0000000007", node_prefix(uuid));
        assert_eq!(name.as_bytes()[39], b'-');
        assert_eq!(&name[3..39], uuid);
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
