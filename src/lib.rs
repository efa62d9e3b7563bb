//! mesh-host makes one Linux machine match a declaration and keeps it there.
//!
//! The crate is laid out by stage: `declaration` turns bytes into a validated model, `apply`
//! decides what each resource needs and reports it, `system` is the only code that touches the
//! machine, `store` records what worked, `secrets` opens sealed values, `controller` is the
//! daemon (triggers, queue, worker, scheduler, health), `cron` the schedules it fires,
//! `telemetry` its logs, events and metrics, `fleet` brings declarations from etcd and takes
//! status back, `trust` verifies signed declarations (pure), and `cli` is the edge.
//! ARCHITECTURE.md draws the arrows between them, and `tests/tidy.rs` holds the code to them.

pub mod apply;
pub mod cli;
pub mod controller;
pub mod cron;
pub mod declaration;
pub mod fleet;
pub mod generations;
pub mod secrets;
pub mod store;
pub mod system;
pub mod telemetry;
pub mod trust;
