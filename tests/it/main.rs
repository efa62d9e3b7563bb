//! The integration tests: one binary, which runs the real `mesh-host` against real systems
//! (scratch directories, and the Docker engine and systemd that `tests/testbed/up.sh` starts).
//!
//! Tests play the person at the machine, so they use std's filesystem calls freely.
#![allow(clippy::disallowed_methods)]

mod support;

mod actions;
mod daemon;
mod docker;
mod files;
mod malformed;
mod packages;
mod systemd;
mod users;
