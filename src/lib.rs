//! mesh-host makes one Linux machine match a declaration and keeps it there.
//!
//! The crate is laid out by stage: `declaration` turns bytes into a validated model, `apply`
//! decides what each resource needs and reports it, `system` is the only code that touches the
//! machine, `store` records what worked, `secrets` opens sealed values, `fleet` brings
//! declarations from etcd, and `cli` is the edge.

pub mod apply;
pub mod cli;
pub mod controller;
pub mod cron;
pub mod declaration;
pub mod fleet;
pub mod secrets;
pub mod store;
pub mod system;
pub mod telemetry;
