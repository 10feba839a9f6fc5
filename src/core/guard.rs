//! The methods every guard shares, written once: each guard type wraps a
//! [`Held`](super::lease::Held) in a field named `held` and gets its key, fencing token, lost
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
