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

use std::path::{Path, PathBuf};

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
        /// Which watcher.
        watcher: Watcher,
    },
    /// Whether a watcher is connected to what it watches, for the `watcher_up` gauge.
    Up {
        /// Which watcher.
        watcher: Watcher,
        /// Connected now.
        up: bool,
    },
}

/// Which watcher says something of itself (`Change::Resynced`, `Change::Up`). A closed set, so
/// that a new watcher is decided wherever they are told apart (the controller's change sources)
/// by the compiler, not counted as a resync by a fallback arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Watcher {
    /// The managed paths' inotify watcher (`file`).
    File,
    /// The container runtime's events (`docker`).
    Docker,
    /// systemd's signals (`systemd`).
    Systemd,
    /// `nft monitor` (`firewall`).
    Firewall,
}

impl Watcher {
    /// Every watcher.
    pub const ALL: [Watcher; 4] = [Watcher::File, Watcher::Docker, Watcher::Systemd, Watcher::Firewall];

    /// Its name, as labels and log lines give it.
    pub fn as_str(self) -> &'static str {
        match self {
            Watcher::File => "file",
            Watcher::Docker => "docker",
            Watcher::Systemd => "systemd",
            Watcher::Firewall => "firewall",
        }
    }
}

/// The paths a watcher reports on, by their hash: a sorted list of 8 bytes a path, made once by
/// the file watcher (`FileWatcher::interest`) and shared with the writers' watcher. Hashes rather
/// than the paths: a copy of each of 100,000 paths would be megabytes; a collision only lets
/// through an event the controller then ignores. A sorted list rather than a hash set: 0.9 MB
/// at 110,000 paths where a set was 1.2 MB in each of the two watchers (docs/memory.md).
#[derive(Debug, Default)]
pub struct PathSet(Box<[u64]>);

impl PathSet {
    /// The set of these paths; a path given twice is held once.
    pub fn of<P: AsRef<Path>>(paths: impl IntoIterator<Item = P>) -> PathSet {
        PathSet::of_hashes(paths.into_iter().map(|p| path_hash(p.as_ref())).collect())
    }

    /// The set of paths of these hashes (`path_hash`).
    pub(crate) fn of_hashes(mut hashes: Vec<u64>) -> PathSet {
        hashes.sort_unstable();
        hashes.dedup();
        PathSet(hashes.into_boxed_slice())
    }

    /// Whether `path` is one of them (or shares a hash with one).
    pub fn contains(&self, path: &Path) -> bool {
        self.holds(path_hash(path))
    }

    /// Whether a path of this hash is one of them.
    pub(crate) fn holds(&self, hash: u64) -> bool {
        self.0.binary_search(&hash).is_ok()
    }

    /// How many paths (distinct hashes).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The hash a path of interest is known by: std's SipHash with its fixed keys, the same for
/// every watcher and every run.
pub(crate) fn path_hash(path: &Path) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::hash::DefaultHasher::new();
    path.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_set_holds_each_path_given_once_and_nothing_else() {
        let set = PathSet::of(["/etc/a", "/etc/b", "/etc/a"]);
        assert_eq!(set.len(), 2);
        assert!(set.contains(Path::new("/etc/a")) && set.contains(Path::new("/etc/b")));
        assert!(!set.contains(Path::new("/etc/c")) && !set.contains(Path::new("/etc")));
        assert!(PathSet::default().is_empty() && !PathSet::default().contains(Path::new("/")));
    }
}
