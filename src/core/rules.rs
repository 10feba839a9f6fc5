//! The rules every input is checked against before any I/O: keys, namespaces, TTLs.

use std::time::Duration;

use crate::backend::LockKind;
use crate::error::{Error, Result};

/// The shortest TTL accepted. Shorter leases cannot be renewed reliably over a network.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The longest TTL accepted: 24 days. Every backend holds a lease this long as asked
/// (PostgreSQL counts a lease in 32-bit milliseconds, at most 24.8 days), so no guard believes
/// in a longer lease than its server granted, and no deadline overflows the clock.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 24 * 60 * 60);

pub(crate) fn validate_ttl(ttl: Duration) -> Result<()> {
    if ttl.is_zero() {
        return Err(Error::invalid_config("ttl is zero"));
    }
    if ttl < MIN_TTL {
        return Err(Error::invalid_config(format_args!(
            "ttl of {ttl:?} is below the minimum of {MIN_TTL:?}"
        )));
    }
    if ttl > MAX_TTL {
        return Err(Error::invalid_config(format_args!(
            "ttl of {ttl:?} is above the maximum of {MAX_TTL:?} (24 days)"
        )));
    }
    Ok(())
}

/// The moment `timeout` from now, or `None` (no deadline) for a timeout longer than the clock
/// can count: waiting that long is waiting for ever.
pub(crate) fn deadline_after(timeout: Duration) -> Option<tokio::time::Instant> {
    tokio::time::Instant::now().checked_add(timeout)
}

/// The longest key accepted, in bytes (UTF-8). Longer keys are rejected with
/// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey).
pub const MAX_KEY_LEN: usize = 512;

/// The longest namespace accepted, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 128;

/// Checks what a claim asks for: a semaphore has at least one permit, and a claim asks for at
/// least one and at most all of them (more could never be granted).
pub(crate) fn validate_kind(kind: LockKind) -> Result<()> {
    if let LockKind::Permits { count, max } = kind {
        if max == 0 {
            return Err(Error::invalid_config(
                "a semaphore needs at least one permit",
            ));
        }
        if count == 0 {
            return Err(Error::invalid_config("zero permits asked for"));
        }
        if count > max {
            return Err(Error::invalid_config(format_args!(
                "{count} permits asked of a semaphore of {max}: it could never be granted"
            )));
        }
    }
    Ok(())
}

/// Checks a user key against the rules every backend shares.
pub(crate) fn validate_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid_key("key is empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::invalid_key(format_args!(
            "key is {} bytes long, the limit is {MAX_KEY_LEN}",
            key.len()
        )));
    }
    if key.contains('\0') {
        return Err(Error::invalid_key("key contains a NUL byte"));
    }
    Ok(())
}

/// Checks a namespace: the prefix that keeps one application's keys apart from another's.
pub(crate) fn validate_namespace(ns: &str) -> Result<()> {
    if ns.is_empty() {
        return Err(Error::invalid_config("namespace is empty"));
    }
    if ns.len() > MAX_NAMESPACE_LEN {
        return Err(Error::invalid_config(format_args!(
            "namespace is {} bytes long, the limit is {MAX_NAMESPACE_LEN}",
            ns.len()
        )));
    }
    if let Some(c) = ns
        .chars()
        .find(|c| c.is_control() || matches!(c, '{' | '}' | '/' | ':' | '*' | '?' | '['))
    {
        return Err(Error::invalid_config(format_args!(
            "namespace contains {c:?}; use letters, digits, '-', '_' or '.'"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        assert!(validate_key("orders:42").is_ok());
        assert!(validate_key("ü/ß {x}").is_ok());
        assert!(validate_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
        for bad in ["", "a\0b"] {
            assert!(validate_key(bad).unwrap_err().is_invalid_key(), "{bad:?}");
        }
        let long = "k".repeat(MAX_KEY_LEN + 1);
        let err = validate_key(&long).unwrap_err();
        assert!(err.is_invalid_key());
        assert!(err.to_string().contains("513 bytes"), "{err}");
    }

    #[test]
    fn namespaces() {
        assert!(validate_namespace("app-1.prod_eu").is_ok());
        for bad in ["", "a{b", "a:b", "a/b", "a\nb", "a*"] {
            assert!(
                validate_namespace(bad).unwrap_err().is_invalid_config(),
                "{bad:?}"
            );
        }
        assert!(validate_namespace(&"n".repeat(MAX_NAMESPACE_LEN + 1)).is_err());
    }

    #[test]
    fn ttls() {
        for good in [MIN_TTL, Duration::from_secs(30), MAX_TTL] {
            assert!(validate_ttl(good).is_ok(), "{good:?}");
        }
        for bad in [
            Duration::ZERO,
            Duration::from_millis(9),
            MAX_TTL + Duration::from_millis(1),
            Duration::MAX,
        ] {
            assert!(
                validate_ttl(bad).unwrap_err().is_invalid_config(),
                "{bad:?}"
            );
        }
        assert!(deadline_after(Duration::from_secs(1)).is_some());
        assert!(deadline_after(Duration::MAX).is_none());
    }
}
