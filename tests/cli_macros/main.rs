//! The `distlock` command and `#[distributed_lock]`, end to end.
//!
//! One binary, one server of each kind shared by its tests (a namespace each); the modules
//! are named for what they test.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod cli;
mod macro_default;
mod macros;
