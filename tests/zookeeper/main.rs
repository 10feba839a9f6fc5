//! ZooKeeper's own tests against real servers: a standalone server (Curator interop
//! included), faults, ensembles, and elections beside Curator's `LeaderLatch`.
//!
//! One binary, one server of each kind shared by its tests (a namespace each); the modules
//! are named for what they test.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod ensemble;
mod faults;
mod latch;
mod standalone;
