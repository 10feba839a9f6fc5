//! The `#[distributed_lock]` attribute for [distlock](https://docs.rs/distlock).
//!
//! This crate is a skeleton: the attribute lands with its own issue and is re-exported by
//! `distlock` under the `macros` feature.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
