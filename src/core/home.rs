//! The runtime a client belongs to ([`Home`]), and the blocking calls (`blocking_lock()` and
//! the like) as tokio's own primitives have them.
//!
//! A client belongs to the runtime it was built in, as a redis-rs connection or a reqwest
//! client does: its renewal task, its releases and its election followers run there, calls
//! from other runtimes are served through them, and once that runtime has shut down every call
//! fails with [`Closed`](crate::ErrorKind::Closed) (guards held elsewhere see their leases
//! lapse). A client built outside any runtime (synchronous code) has a small runtime of its
//! own, started at its first need and kept as long as the client or a guard of it lives.
//!
//! A blocking call runs the async call on that runtime. On a multi-thread runtime's thread it
//! blocks in place (tokio moves the worker's other tasks away first); on a current-thread
//! runtime it is refused with an error, since blocking its one thread would stall every task,
//! renewals included; a client built in a current-thread runtime, or one whose runtime has shut
//! down, gets a [`NoRuntime`](crate::ErrorKind::NoRuntime) error.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::{Handle, Runtime, RuntimeFlavor};

use crate::error::{Error, ErrorKind, Result};

/// The runtime a client's tasks run on.
pub(crate) struct Home {
    /// The runtime the client was built in, if any.
    built_in: Option<Handle>,
    /// The client's own runtime, for a client built outside any.
    own: OnceLock<OwnRuntime>,
}

/// A runtime the client owns. It is shut down in the background when dropped, which is allowed
/// wherever the last guard or client handle happens to be dropped (an async task included).
struct OwnRuntime(Option<Runtime>);

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl Home {
    /// Notes the runtime the client is being built in.
    pub(crate) fn capture() -> Self {
        Self {
            built_in: Handle::try_current().ok(),
            own: OnceLock::new(),
        }
    }

    /// Whether the client was built in a runtime (else it has one of its own).
    pub(crate) fn is_built_in(&self) -> bool {
        self.built_in.is_some()
    }

    /// Where the client's tasks run: the runtime it was built in, or its own (started here if
    /// it was not yet).
    pub(crate) fn handle(&self) -> Result<Handle> {
        match &self.built_in {
            Some(handle) => Ok(handle.clone()),
            None => Ok(self.own()?.handle().clone()),
        }
    }

    /// Runs `call` to completion on this thread, blocking it.
    ///
    /// Outside a runtime it blocks on the client's runtime. On a thread of a multi-thread
    /// runtime (a worker, a `spawn_blocking` job, or the thread in its `block_on`) it blocks
    /// through [`tokio::task::block_in_place`], which first hands the worker's other tasks to
    /// another thread, so renewals and connections go on. A current-thread runtime has no
    /// other thread to hand them to, and tokio offers no way to tell its `spawn_blocking`
    /// jobs from its one async thread, so there the call is refused.
    pub(crate) fn block_on<T, F>(&self, what: &str, call: F) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        match Handle::try_current() {
            Err(_) => self.block_here(call),
            Ok(current) if current.runtime_flavor() == RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| self.block_here(call))
            }
            Ok(_) => Err(Error::new(
                ErrorKind::InAsyncContext,
                format!(
                    "{what} is refused on every thread of a current-thread tokio runtime, its \
                     `spawn_blocking` threads included: tokio cannot tell them from the one \
                     thread that runs its async tasks, which blocking would stall. Use the async \
                     form with `.await`, or call it from a thread of your own \
                     (`std::thread::spawn`) or on a multi-thread runtime"
                ),
            )),
        }
    }

    /// Blocks this thread (outside any runtime's context) until `call` is done.
    fn block_here<T, F>(&self, call: F) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        let Some(handle) = &self.built_in else {
            return self.own()?.block_on(call);
        };
        // A current-thread runtime runs its tasks (the backend's connections, the renewals)
        // only while its own thread is inside `Runtime::block_on`: from here nothing may be
        // driving it, and the call would hang.
        if handle.runtime_flavor() != RuntimeFlavor::MultiThread {
            return Err(Error::new(
                ErrorKind::NoRuntime,
                "blocking calls need a client built in a multi-thread tokio runtime (or outside \
                 any runtime): this one was built in a current-thread runtime, whose tasks run \
                 only inside its own `block_on`",
            ));
        }
        // A runtime that has shut down cancels every task it is given (and `block_on` would
        // panic at the first timer).
        if handle.block_on(handle.spawn(async {})).is_err() {
            return Err(Error::new(
                ErrorKind::NoRuntime,
                "the tokio runtime this client was built in has shut down",
            ));
        }
        // The runtime may shut down while this thread blocks on it, and tokio then panics at
        // the call's next timer ("… it is being shutdown"): that is the runtime's end, told as
        // such. Any other panic goes on.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handle.block_on(call)))
            .unwrap_or_else(|panic| {
                let message = panic
                    .downcast_ref::<&str>()
                    .copied()
                    .or_else(|| panic.downcast_ref::<String>().map(String::as_str));
                match message {
                    Some(m) if m.contains("being shutdown") => Err(Error::runtime_gone()),
                    _ => std::panic::resume_unwind(panic),
                }
            })
    }

    fn own(&self) -> Result<&Runtime> {
        if let Some(OwnRuntime(Some(rt))) = self.own.get() {
            return Ok(rt);
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("distlock-blocking")
            .enable_all()
            .build()
            .map_err(|e| {
                Error::new(
                    ErrorKind::NoRuntime,
                    "could not start a runtime for blocking calls",
                )
                .with_source(e)
            })?;
        // Another thread may have started one meanwhile: keep the first, drop ours.
        let _ = self.own.set(OwnRuntime(Some(rt)));
        match self.own.get() {
            Some(OwnRuntime(Some(rt))) => Ok(rt),
            _ => Err(Error::new(
                ErrorKind::NoRuntime,
                "could not start a runtime for blocking calls",
            )),
        }
    }
}
