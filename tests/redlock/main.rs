//! Redlock's own tests over real, independent `redis-server` nodes: locks, faults and elections.
//!
//! One binary, one server of each kind shared by its tests (a namespace each); the modules
//! are named for what they test.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod election_faults;
mod election_outages;
mod elections;
mod faults;
mod nodes;
