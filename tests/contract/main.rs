//! The behaviour every backend and topology shares, and the test servers themselves.
//!
//! One binary, one server of each kind shared by its tests (a namespace each); the modules
//! are named for what they test.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod differential;
mod matrix;
mod servers;
