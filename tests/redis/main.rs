//! Redis' own tests against real `redis-server`s: a single server (its scripts, fast path,
//! coalesced calls, releases, fencing, replicas, faults, costs and elections), Cluster and
//! Sentinel.
//!
//! One binary, one server of each kind shared by its tests (a namespace each); the modules
//! are named for what they test.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod cluster;
mod cluster_faults;
mod coalescing;
mod coalescing_faults;
mod cost;
mod elections;
mod fast_path;
mod faults;
mod fencing;
mod lean_faults;
mod release;
mod release_faults;
mod release_widened;
mod replicas;
mod script_draws;
mod sentinel;
mod single_server;
