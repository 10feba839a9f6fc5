//! Key and namespace rules shared by every backend, checked before any I/O.

use crate::error::{Error, Result};

/// The longest key accepted, in bytes (UTF-8). Longer keys are rejected with
/// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey).
pub const MAX_KEY_LEN: usize = 512;

/// The longest namespace accepted, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 128;

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
}
