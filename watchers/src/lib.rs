//! Watchers report what moved on the machine: a path, a container, a systemd unit. They know
//! nothing about declarations or resources; the controller decides what a change means.
//!
//! Architecture Invariant: this crate does not depend on `mesh-host`. Every watcher sends
//! [`Change`]s into a channel and, after any gap in what it saw (an inotify overflow, a
//! reconnect), sends [`Change::Resynced`] so that everything is reconciled again.
#![warn(missing_docs)]

pub mod docker;
pub mod firewall;
pub mod systemd;

use std::path::PathBuf;

pub mod file;
pub mod source;
pub mod writers;

pub use file::FileWatcher;

/// One thing that moved on the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Something happened at a path: created, written, removed, renamed, chmod or chown. Which
    /// of these is not said: the controller compares with the machine anyway.
    Path(PathBuf),
    /// A container event (die, stop, kill, oom, destroy...) of a container carrying a
    /// `mesh-host.id` label.
    Container {
        /// The `mesh-host.id` label's value: the id of the resource that declared the
        /// container (as the container says; the controller checks it names one).
        id_label: String,
        /// The container's name.
        name: String,
        /// The engine's word for what happened (`die`, `stop`, ...).
        action: String,
    },
    /// A systemd unit changed state or a job on it finished.
    Unit {
        /// The unit's name (`web.service`).
        unit: String,
    },
    /// The watched nftables table changed: a table, chain, set or rule in it was added or
    /// deleted, by anyone (the agent's own loads included).
    Firewall,
    /// Something else in the ruleset changed: a table, chain or rule outside the watched table
    /// (another firewall enabled or disabled, a foreign table removed, Docker's rules). Many
    /// come from one change; the controller decides whether any matters.
    Ruleset,
    /// A declaration source changed and has since been still for the quiet period: time to
    /// read it. The watcher does not read it; the controller does, through its own checks.
    SourceChanged {
        /// The file or directory watched.
        source: PathBuf,
    },
    /// The watcher may have missed changes (overflow, reconnect): reconcile everything.
    Resynced {
        /// Which watcher (`file`, `docker`, `systemd`).
        watcher: &'static str,
    },
    /// Whether a watcher is connected to what it watches, for the `watcher_up` gauge.
    Up {
        /// Which watcher.
        watcher: &'static str,
        /// Connected now.
        up: bool,
    },
}
