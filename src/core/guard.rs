//! The methods every guard shares, written once: each guard type wraps a
//! [`Held`](super::held::Held) in a field named `held` and gets its key, fencing token, lost
//! signal, explicit release and `Debug` from [`guard_methods!`].

/// Implements the shared guard methods for `$guard`. `$setup` is a doc-test line that binds
/// `guard` (with `client` a memory client in scope); `$fence` documents what the fencing token
/// means for this guard.
macro_rules! guard_methods {
    ($guard:ident, $setup:literal, $fence:literal) => {
        impl $guard {
            /// The key that is held, without the namespace.
            pub fn key(&self) -> &str {
                self.held.key()
            }

            #[doc = $fence]
            pub fn fencing_token(&self) -> u64 {
                self.held.fencing_token()
            }

            /// Whether ownership is known to be lost: the service refused a renewal, the session
            /// ended, or the lease deadline (less a clock-drift margin) passed without a
            /// successful renewal. Once true, it stays true.
            pub fn is_lost(&self) -> bool {
                self.held.is_lost()
            }

            /// Resolves once ownership is known to be lost; never resolves while it is held.
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: it only watches a flag and the lease deadline.
            ///
            /// # Examples
            ///
            /// ```
            /// use std::time::Duration;
            /// # #[tokio::main(flavor = "current_thread")]
            /// # async fn main() -> Result<(), distlock::Error> {
            /// // Without renewal the lease ends after one TTL.
            /// let client = distlock::LockClient::builder(distlock::backend::MemoryBackend::new())
            ///     .ttl(Duration::from_millis(50))
            ///     .auto_renew(false)
            ///     .build()?;
            #[doc = $setup]
            /// guard.lost().await;
            /// assert!(guard.is_lost());
            /// # Ok(())
            /// # }
            /// ```
            pub async fn lost(&self) {
                self.held.lost().await;
            }

            /// How long the lease certainly lasts from now: the time left until
            /// [`is_lost`](Self::is_lost) turns true unless a renewal lands first (the server's
            /// lease, measured from when the request that set it was sent, less a clock-drift
            /// margin). Zero once lost.
            ///
            /// # Examples
            ///
            /// ```
            /// use std::time::Duration;
            /// # #[tokio::main(flavor = "current_thread")]
            /// # async fn main() -> Result<(), distlock::Error> {
            /// let client = distlock::LockClient::memory();
            #[doc = $setup]
            /// assert!(guard.lease_left() > Duration::ZERO);
            /// assert!(guard.lease_left() <= Duration::from_secs(30)); // the default TTL
            /// # Ok(())
            /// # }
            /// ```
            pub fn lease_left(&self) -> ::std::time::Duration {
                self.held.lease_left()
            }

            /// The instant [`is_lost`](Self::is_lost) is judged against: the lease's end on
            /// this machine's clock, drift margin included. Renewals move it later; it stays
            /// in the past once the lease ran out.
            ///
            /// # Examples
            ///
            /// ```
            /// # #[tokio::main(flavor = "current_thread")]
            /// # async fn main() -> Result<(), distlock::Error> {
            /// let client = distlock::LockClient::memory();
            #[doc = $setup]
            /// assert!(guard.valid_until() > std::time::Instant::now());
            /// # Ok(())
            /// # }
            /// ```
            pub fn valid_until(&self) -> ::std::time::Instant {
                self.held
                    .valid_until()
                    .unwrap_or_else(::std::time::Instant::now)
            }

            /// Renews the lease once, now, asking the server for `ttl` from this moment; later
            /// renewals ask for `ttl` too. With renewal off
            /// ([`set_auto_renew(false)`](Self::set_auto_renew)) this is how a fixed lease is
            /// made longer when the work needs it. A shorter `ttl` shortens what this guard
            /// believes at once (the lease is taken to end no later than `ttl` from the call),
            /// but a server never shortens a lease it granted: renewals of one lock may reach
            /// it out of order (through a pool), and an older one must not cut short a lease a
            /// later one promised. So others get the key when the longer lease already granted
            /// runs out.
            ///
            /// # Errors
            ///
            /// - [`InvalidConfig`](crate::ErrorKind::InvalidConfig) for a zero or too short
            ///   `ttl`,
            /// - [`Unsupported`](crate::ErrorKind::Unsupported) on a backend whose lease is its
            ///   session's (ZooKeeper) for any `ttl` but the session timeout,
            /// - [`Lost`](crate::ErrorKind::Lost) if the lock is no longer held,
            /// - [`Backend`](crate::ErrorKind::Backend) if the service could not be asked; the
            ///   lease then ends no later than before the call, and background renewal (if on)
            ///   goes on trying.
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: dropped before the reply, the renewal may or may not reach the
            /// server, and the lease is taken to end at the earlier of its old end and `ttl`
            /// from the call until a renewal says otherwise.
            ///
            /// # Examples
            ///
            /// ```
            /// use std::time::Duration;
            /// # #[tokio::main(flavor = "current_thread")]
            /// # async fn main() -> Result<(), distlock::Error> {
            /// let client = distlock::LockClient::memory();
            #[doc = $setup]
            /// guard.set_auto_renew(false)?;
            /// guard.extend(Duration::from_secs(120)).await?;
            /// assert!(guard.lease_left() > Duration::from_secs(60));
            /// # Ok(())
            /// # }
            /// ```
            pub async fn extend(&self, ttl: ::std::time::Duration) -> $crate::Result<()> {
                self.held.extend(ttl).await
            }

            /// Turns background renewal of this lease off (a fixed lease, which ends one TTL
            /// after the grant or the last [`extend`](Self::extend), like Redisson's
            /// `lock(leaseTime)`), or on again, whatever the client's
            /// [`auto_renew`](crate::LockClientBuilder::auto_renew) says. A provisional grant
            /// (a handoff some backends confirm with one renewal) is still confirmed.
            ///
            /// # Errors
            ///
            /// [`Unsupported`](crate::ErrorKind::Unsupported) for `false` on a backend whose
            /// lease is its session's (ZooKeeper): the lock lives with the session, so a guard
            /// that stopped renewing would report lost while the server still held it. Turning
            /// renewal on always succeeds.
            ///
            /// # Examples
            ///
            /// ```
            /// use std::time::Duration;
            /// # #[tokio::main(flavor = "current_thread")]
            /// # async fn main() -> Result<(), distlock::Error> {
            /// let client = distlock::LockClient::builder(distlock::backend::MemoryBackend::new())
            ///     .ttl(Duration::from_millis(50))
            ///     .build()?;
            #[doc = $setup]
            /// guard.set_auto_renew(false)?;
            /// guard.lost().await; // one TTL after the grant
            /// # Ok(())
            /// # }
            /// ```
            pub fn set_auto_renew(&self, on: bool) -> $crate::Result<()> {
                self.held.set_auto_renew(on)
            }

            /// Releases it now and reports the outcome, handing the lock on to the waiters next
            /// in line. Dropping the guard does the same in a spawned task.
            ///
            /// # Errors
            ///
            /// - [`Lost`](crate::ErrorKind::Lost) if it had already been lost, so the critical
            ///   section may not have been exclusive to the end,
            /// - [`Backend`](crate::ErrorKind::Backend) if the service could not be told; the
            ///   lease then runs out after its TTL.
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: the release completes in a spawned task even if this future is
            /// dropped; only its result is lost.
            ///
            /// # Examples
            ///
            /// ```
            /// # #[tokio::main(flavor = "current_thread")]
            /// # async fn main() -> Result<(), distlock::Error> {
            /// let client = distlock::LockClient::memory();
            #[doc = $setup]
            /// guard.release().await?;
            /// # Ok(())
            /// # }
            /// ```
            pub async fn release(self) -> $crate::Result<()> {
                self.held.release().await
            }
        }

        impl ::std::fmt::Debug for $guard {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                ::std::fmt::Debug::fmt(&self.held, f)
            }
        }
    };
}

pub(crate) use guard_methods;
