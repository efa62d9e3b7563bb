//! The integration tests: one binary, which runs the real `mesh-host` against real systems
//! (scratch directories, and the Docker engine and systemd that `tests/testbed/up.sh` starts).
//!
//! Tests play the person at the machine, so they use std's filesystem calls freely.
//!
//! Two tiers. A test that needs only root and a filesystem runs everywhere. A test that needs
//! the testbed (Docker, Podman, systemd, apt, useradd) carries
//! `#[ignore = "needs the testbed: tests/run.sh sets it up"]`: a bare `cargo test` reports it
//! ignored, with the count, and `tests/run.sh` runs it (`--run-ignored all`, or
//! `--include-ignored` under plain cargo test). Run alone where the testbed is missing, such a
//! test fails naming what is missing and how to start it; it never passes in silence.
#![allow(clippy::disallowed_methods)]

mod support;

mod actions;
mod adoption;
mod attacks;
mod daemon;
mod docker;
mod drift;
mod endpoints;
mod faults;
mod files;
mod firewall;
mod fleet;
mod generations;
mod into;
mod malformed;
mod operator;
mod packages;
mod powerloss;
mod refusal;
mod reliability;
mod sandbox;
mod schema;
mod secrets;
mod signed;
mod strict;
mod systemd;
mod users;
