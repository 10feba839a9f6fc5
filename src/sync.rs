//! Std mutexes that shrug off poisoning. Every critical section here leaves its data consistent
//! at each step (no invariant spans a panic point), so a lock whose holder panicked is still
//! good to use, and a panic in user code must not turn every later lock call into a second one.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// [`Mutex::lock`] that takes a poisoned lock as it is.
pub(crate) trait LockExt<T: ?Sized> {
    /// Locks, ignoring poisoning.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockExt<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
