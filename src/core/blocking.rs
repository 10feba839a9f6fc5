//! Blocking calls for synchronous code (`blocking_lock()` and the like), as tokio's own
//! primitives have them.
//!
//! A lock here needs a runtime even while the caller blocks: its lease is renewed by a task,
//! and a network backend's connections are driven by tasks. A blocking call runs the async
//! call on the multi-thread runtime the client was built in (whose tasks drive the backend's
//! connections; a client built in a current-thread runtime, or one whose runtime has shut
//! down, gets a [`NoRuntime`](crate::ErrorKind::NoRuntime) error),
//! or, for a client built outside any runtime, on a small runtime of the client's own, started
//! at the first blocking call and kept as long as the client or a guard of it lives. On a
//! multi-thread runtime's thread it blocks in place (tokio moves the worker's other tasks
//! away first); on a current-thread runtime it is refused with an error, since blocking its
//! one thread would stall every task, renewals included.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::{Handle, Runtime, RuntimeFlavor};

use crate::error::{Error, ErrorKind, Result};

/// Where blocking calls of one client run.
pub(crate) struct Blocking {
    /// The runtime the client was built in, if any.
    built_in: Option<Handle>,
    /// The client's own runtime, for a client built outside any.
    own: OnceLock<Own>,
}

/// A runtime the client owns. It is shut down in the background when dropped, which is allowed
/// wherever the last guard or client handle happens to be dropped (an async task included).
struct Own(Option<Runtime>);

impl Drop for Own {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl Blocking {
    /// Notes the runtime the client is being built in.
    pub(crate) fn capture() -> Self {
        Self {
            built_in: Handle::try_current().ok(),
            own: OnceLock::new(),
        }
    }

    /// The runtime the client was built in, if any.
    pub(crate) fn built_in(&self) -> Option<&Handle> {
        self.built_in.as_ref()
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
        handle.block_on(call)
    }

    fn own(&self) -> Result<&Runtime> {
        if let Some(Own(Some(rt))) = self.own.get() {
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
        let _ = self.own.set(Own(Some(rt)));
        match self.own.get() {
            Some(Own(Some(rt))) => Ok(rt),
            _ => Err(Error::new(
                ErrorKind::NoRuntime,
                "could not start a runtime for blocking calls",
            )),
        }
    }
}
