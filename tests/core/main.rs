//! The client's core, whatever the backend: the in-process backend's own tests, cleanup of
//! cancelled or panicking acquisitions, clients used from other runtimes than their own,
//! errors, and elections under faults.
//!
//! One binary, one server of each kind shared by its tests (a namespace each); the modules
//! are named for what they test.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod cleanup;
mod elections;
mod errors;
mod memory;
mod panics;
mod runtimes;
