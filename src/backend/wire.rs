//! What the backends over a network share, whichever of them is built: client ids and owner
//! tokens, fencing tokens and families as servers write them, the error for a key of another
//! family, and a `select!` helper for a future that may not be running.
//!
//! Compiled with every feature, so that no backend depends on another's feature to build; the
//! memory backend alone uses none of it, ZooKeeper alone some.

#![cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]

use std::fmt::Display;

use super::{Family, LockKind};
use crate::error::{Error, ErrorKind, Result};

/// A random id for one backend instance: its part of every owner token and channel name.
pub(crate) fn client_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..16].to_owned()
}

/// A claim's owner token on the server: the backend's client id, then the claim's own token.
/// The server-side code finds the client's channel from the part before the `.`.
#[cfg(feature = "postgres")]
pub(crate) fn owner_token(client_id: &str, claim_owner: &str) -> String {
    let mut token = String::with_capacity(client_id.len() + 1 + claim_owner.len());
    push_owner_token(&mut token, client_id, claim_owner);
    token
}

/// Writes a claim's owner token (`<client id>.<claim owner>`) at the end of `text`.
pub(crate) fn push_owner_token(text: &mut String, client_id: &str, claim_owner: &str) {
    text.push_str(client_id);
    text.push('.');
    text.push_str(claim_owner);
}

/// A fencing token as a server returned it; `service` names the server in the error.
pub(crate) fn fence_of(service: &str, raw: i64) -> Result<u64> {
    u64::try_from(raw).map_err(|_| {
        Error::new(
            ErrorKind::Backend,
            format!("{service} returned an invalid fencing token {raw}"),
        )
    })
}

/// A key's family as the server-side code writes it: `mutex`, `rw`, `sem:<permits>` or
/// `election`.
pub(crate) fn parse_family(family: &str) -> Option<Family> {
    match family {
        "mutex" => Some(Family::Mutex),
        "rw" => Some(Family::RwLock),
        "election" => Some(Family::Election),
        other => other
            .strip_prefix("sem:")
            .and_then(|m| m.parse().ok())
            .map(|max| Family::Semaphore { max }),
    }
}

/// The error for a claim refused because the key is another family on the server (`family`
/// as [`parse_family`] reads it).
pub(crate) fn kind_mismatch(key: &str, family: &str, asked: LockKind) -> Error {
    match parse_family(family) {
        Some(seen) => mismatch(key, seen, asked),
        None => mismatch(key, format_args!("`{family}`"), asked),
    }
}

/// The error for a claim refused because the server holds `key` as `seen`, another family.
pub(crate) fn mismatch(key: &str, seen: impl Display, asked: LockKind) -> Error {
    Error::kind_mismatch(format_args!(
        "`{key}` is {seen} on the server, asked for as {}",
        asked.family()
    ))
}

/// Refuses an election value of more than `max` bytes (what `service` can hold), before any
/// I/O.
#[cfg(any(feature = "redis", feature = "zookeeper"))]
pub(crate) fn check_value_len(service: &str, key: &str, value: &[u8], max: usize) -> Result<()> {
    if value.len() > max {
        return Err(Error::unsupported(format_args!(
            "`{key}`: a {service} election value holds at most {max} bytes, this one has {}",
            value.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_families_as_servers_write_them() {
        assert_eq!(parse_family("mutex"), Some(Family::Mutex));
        assert_eq!(parse_family("rw"), Some(Family::RwLock));
        assert_eq!(parse_family("sem:3"), Some(Family::Semaphore { max: 3 }));
        assert_eq!(parse_family("election"), Some(Family::Election));
        assert_eq!(parse_family("sem:x"), None);
        let err = kind_mismatch("k", "sem:3", LockKind::Exclusive);
        assert!(err
            .to_string()
            .contains("`k` is a semaphore of 3 permits on the server"));
        let err = kind_mismatch("k", "odd", LockKind::Exclusive);
        assert!(err.to_string().contains("`k` is `odd` on the server"));
    }
}
