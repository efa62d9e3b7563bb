#![allow(
    clippy::disallowed_methods,
    reason = "a test tool: it makes and reads the trees the agent is checked on"
)]
//! The power-loss lanes' tools (tests/powerloss/README.md): a FUSE filesystem that keeps what
//! was written apart from what was synced and serves the crash states between (`model`,
//! `fuse`), the workloads the agent is run through (`workload`), the checks of a crash state
//! (`check`), and the FUSE lane that puts them together (`lane`). The VM lane reuses the
//! workloads and the checks through the `powerloss-workload` and `powerloss-check` binaries.

pub mod check;
pub mod fuse;
pub mod lane;
pub mod model;
pub mod workload;
