//! [`LockClientBuilder`]: a client's namespace, TTL and renewal policy on any backend.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::LockClient;
use crate::backend::DynBackend;
use crate::core::lease::default_drift;
use crate::core::rules::{validate_namespace, validate_ttl};
use crate::core::Config;
use crate::error::Result;

/// Builds a [`LockClient`] on any [`Backend`](crate::backend::Backend).
///
/// Created by [`LockClient::builder`].
#[must_use = "builder does nothing itself, use `.build()` to build it"]
pub struct LockClientBuilder {
    pub(super) backend: Arc<dyn DynBackend>,
    pub(super) namespace: String,
    pub(super) ttl: Duration,
    pub(super) auto_renew: bool,
}

impl LockClientBuilder {
    /// Sets the namespace every key lives under: 1 to
    /// [`MAX_NAMESPACE_LEN`](crate::MAX_NAMESPACE_LEN) bytes of letters, digits, `-`, `_` or
    /// `.`. Defaults to [`DEFAULT_NAMESPACE`](crate::DEFAULT_NAMESPACE).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets the lease TTL: how long a lock outlives a holder that stopped renewing (crashed,
    /// partitioned). Leases are renewed every third of it. Defaults to [`DEFAULT_TTL`](crate::DEFAULT_TTL).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Whether held leases are renewed in the background. Defaults to `true`. With `false` a
    /// lock is held for one TTL and its guard reports lost when the TTL runs out, like a lease
    /// time in other libraries. (A lock handed over by a releasing holder arrives with a short
    /// provisional lease on some backends; it is confirmed once, so it too lasts one TTL.)
    /// Refused by [`build`](Self::build) on a backend whose lease is its session's
    /// (ZooKeeper), where a lock lives as long as the session.
    pub fn auto_renew(mut self, auto_renew: bool) -> Self {
        self.auto_renew = auto_renew;
        self
    }

    /// Builds the client. No I/O happens here.
    ///
    /// # Errors
    ///
    /// An [`InvalidConfig`](crate::ErrorKind::InvalidConfig) error if the namespace breaks its
    /// rules or the TTL is below [`MIN_TTL`](crate::MIN_TTL) (10 ms) or above
    /// [`MAX_TTL`](crate::MAX_TTL) (24 days); an
    /// [`Unsupported`](crate::ErrorKind::Unsupported) error for `auto_renew(false)` on a backend
    /// whose lease is its session's (ZooKeeper).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::{backend::MemoryBackend, LockClient};
    /// let err = LockClient::builder(MemoryBackend::new()).ttl(Duration::ZERO).build().unwrap_err();
    /// assert!(err.is_invalid_config());
    /// ```
    pub fn build(self) -> Result<LockClient> {
        validate_namespace(&self.namespace)?;
        validate_ttl(self.ttl)?;
        if !self.auto_renew {
            crate::core::held::session_lease(&*self.backend, "auto_renew(false)")?;
        }
        Ok(LockClient::from_parts(
            self.backend,
            Config {
                namespace: self.namespace.into(),
                ttl: self.ttl,
                auto_renew: self.auto_renew,
                drift: default_drift,
            },
        ))
    }
}

impl fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClientBuilder")
            .field("namespace", &self.namespace)
            .field("ttl", &self.ttl)
            .field("auto_renew", &self.auto_renew)
            .finish_non_exhaustive()
    }
}
