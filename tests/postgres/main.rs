//! PostgreSQL's own tests against a real server (direct and through PgBouncer), and faults.
//!
//! One binary, one server of each kind shared by its tests (a namespace each); the modules
//! are named for what they test.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod faults;
mod server;
