//! The watches the worker keeps: the file watcher (inotify) and fanotify's writers on the
//! managed paths of the declaration in force, the systemd, container and firewall watchers
//! started when a declaration first needs them, and the out-of-watches state said once each
//! way. `Watches` owns all of it; the worker tells it what is in force and what moved.
//!
//! Only the worker's task calls it (`set_paths`, `rewatch`): a reconcile apart never does, and
//! the watches its changes need are made again when it is taken back. Each watcher's own thread
//! shares with it only what `mesh_host_watchers` says.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mesh_host_watchers::writers::{Taker, Writers};
use mesh_host_watchers::{Change, FileWatcher};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::config::Config;
use crate::declaration::Declaration;
use crate::store::Store;
use crate::telemetry::{events, Event as _, Metrics};

/// The daemon's watchers, and what it said about them.
pub(super) struct Watches {
    files: FileWatcher,
    /// Who wrote each managed path (fanotify); `None` where fanotify cannot be used, and then
    /// every correction's writer is `unknown`. Marked beside `files`, on the same directories.
    writers: Option<Writers>,
    /// The file watcher ran out of inotify watches and that was said: said once when it began,
    /// and again only after it cleared and came back, not at every pass that still meets it.
    out_of_watches: bool,
    /// The file watcher has no inotify instance and that was said (as `out_of_watches`).
    no_instance: bool,
    /// For the watchers started here, and the paths looked at once (`look_at_armed`).
    /// Unbounded: a watcher must never block on the agent (inotify would overflow); the intake
    /// loop drains it at once into the queue, which de-duplicates.
    tx: mpsc::UnboundedSender<Change>,
    /// The units the systemd watcher follows: sent here with each declaration, read by it.
    units: tokio::sync::watch::Sender<BTreeSet<String>>,
    /// Started when a declaration first names a systemd unit: a node with no services has no
    /// reason to talk to systemd, nor to report a systemd watcher down.
    systemd: Option<JoinHandle<()>>,
    /// Started when a declaration first names a container, a network, or an action run in a
    /// container, for the same reason.
    docker: Option<JoinHandle<()>>,
    /// `nft monitor` on the host's table, started when a declaration first opens a port, or
    /// with the first refusal on this machine.
    firewall: Option<JoinHandle<()>>,
    bus: Option<String>,
    container_socket: Option<String>,
    /// Said with a shortage: what covers the paths left unwatched.
    resync: Duration,
    metrics: Arc<Metrics>,
}

impl Watches {
    pub(super) fn new(
        files: FileWatcher,
        config: &Config,
        metrics: Arc<Metrics>,
        tx: mpsc::UnboundedSender<Change>,
    ) -> Watches {
        Watches {
            files,
            writers: start_writers(),
            out_of_watches: false,
            no_instance: false,
            tx,
            units: tokio::sync::watch::channel(BTreeSet::new()).0,
            systemd: None,
            docker: None,
            firewall: None,
            bus: config.bus.clone(),
            container_socket: config.container_socket.clone(),
            resync: config.resync,
            metrics,
        }
    }

    /// A declaration was put in force: the watchers it needs are started, the first time, and
    /// the systemd watcher follows its `units`.
    pub(super) fn follow(&mut self, d: &Declaration, units: BTreeSet<String>) {
        if d.needs_container_runtime() && self.docker.is_none() {
            self.docker =
                Some(mesh_host_watchers::docker::spawn(self.container_socket.clone(), self.tx.clone()));
        }
        if d.first_opening().is_some() {
            self.watch_firewall();
        }
        if !units.is_empty() && self.systemd.is_none() {
            let rx = self.units.subscribe();
            self.systemd = Some(mesh_host_watchers::systemd::spawn(self.bus.clone(), rx, self.tx.clone()));
        }
        self.units.send_replace(units);
    }

    /// The host's table watched, from now on.
    pub(super) fn watch_firewall(&mut self) {
        if self.firewall.is_none() {
            use crate::system::firewall::{FAMILY, TABLE};
            self.firewall = Some(mesh_host_watchers::firewall::spawn(FAMILY, TABLE, self.tx.clone()));
        }
    }

    /// Points the file watcher, and fanotify beside it, at `paths` (the managed paths of the
    /// declaration in force).
    pub(super) fn set_paths<'a>(&mut self, paths: impl Iterator<Item = &'a Path>) {
        for (dir, e) in self.files.set_paths(paths) {
            tracing::debug!(directory = %dir.display(), error = %e, "cannot watch yet; the periodic resync covers it");
        }
        if let Some(w) = &mut self.writers {
            for (dir, e) in w.set_paths(self.files.interest(), self.files.dirs()) {
                tracing::debug!(directory = %dir.display(), error = %e, "cannot mark for fanotify; its writers are unknown");
            }
        }
        self.note();
    }

    /// Forgets which directories were watched anew: the pass that follows looks at every path.
    pub(super) fn forget_armed(&mut self) {
        drop(self.files.take_armed());
    }

    /// Something moved on the machine: a directory made again (by itself, or as a file's
    /// parent) needs its watch made again; this looks only at directories whose watch was lost.
    pub(super) fn rewatch(&mut self) {
        for (dir, e) in self.files.rewatch() {
            tracing::debug!(directory = %dir.display(), error = %e, "cannot watch yet; the periodic resync covers it");
        }
        if let Some(w) = &mut self.writers {
            w.rewatch();
        }
        self.note();
    }

    /// The start race (issue 46; docs/decisions.md, "List, then watch"): a directory the last
    /// pass made (or made again, or could watch only now) was not watched while the pass wrote
    /// in it, so a hand-edit there before its watch was made was seen by no one. Once the
    /// watches are there, each managed path in such a directory is looked at once: a file whose
    /// change signature is the one recorded is untouched since the host looked; any other path
    /// is reported to the intake as moved, as inotify would have, and its key reconciled. A
    /// change from now on is the watch's to report.
    pub(super) fn look_at_armed(&mut self, declaration: Option<&Declaration>, store: &Store) {
        let armed: HashSet<Arc<Path>> = self.files.take_armed().into_iter().collect();
        let Some(declaration) = declaration.filter(|_| !armed.is_empty()) else { return };
        let in_armed = declaration.resources.iter().filter_map(|r| {
            r.spec.path().filter(|p| p.parent().is_some_and(|d| armed.contains(d))).map(|p| (&r.id, p))
        });
        let moved = crate::apply::maybe_moved(store, in_armed);
        for path in &moved {
            let _ = self.tx.send(Change::Path(path.to_path_buf()));
        }
        tracing::debug!(
            directories = armed.len(),
            paths = moved.len(),
            "looked at the paths of directories watched anew"
        );
    }

    /// A path held after repeated corrections (a contest) is muted in the file watcher until
    /// the hold ends, so that a writer fighting the agent over it does not wake its thread at
    /// each write (mesh_host_watchers::file, "mute"). Fanotify's mute is `Report::mute`, in
    /// order with the corrections it attributes.
    pub(super) fn mute(&self, path: &Path, until: std::time::Instant) {
        self.files.mute(path, until);
    }

    /// Who wrote the managed paths, for a thread of its own, when fanotify can tell.
    pub(super) fn taker(&self) -> Option<Taker> {
        self.writers.as_ref().map(Writers::taker)
    }

    /// The watcher tasks started here, for shutdown to stop.
    pub(super) fn tasks(&mut self) -> Vec<JoinHandle<()>> {
        self.systemd.take().into_iter().chain(self.docker.take()).chain(self.firewall.take()).collect()
    }

    /// After the file watcher's watches moved: the gauges of paths watched and not, and a
    /// shortage of inotify watches said when it begins and when it ends. The paths it leaves
    /// unwatched need nothing more: every full pass (each resync) reconciles every resource.
    fn note(&mut self) {
        let c = self.files.coverage();
        events::PathsWatched { watched: c.watched, unwatched: c.unwatched }.emit(&self.metrics);
        match (self.out_of_watches, c.out_of_watches) {
            (false, true) => events::OutOfWatches::Began {
                unwatched: c.unwatched,
                paths: c.watched + c.unwatched,
                dirs: c.unwatched_dirs,
                // Read only here, when it is said: the limit is the operator's to change.
                limit: crate::system::inotify_watch_limit(),
                resync: self.resync,
            }
            .emit(&self.metrics),
            (true, false) => events::OutOfWatches::Ended { unwatched: c.unwatched }.emit(&self.metrics),
            _ => {}
        }
        self.out_of_watches = c.out_of_watches;
        match (self.no_instance, c.no_instance) {
            (false, true) => {
                events::NoInstance::Began {
                    error: self.files.no_instance().unwrap_or("unknown"),
                    paths: c.watched + c.unwatched,
                    resync: self.resync,
                }
                .emit(&self.metrics);
                events::WatcherState { watcher: "file", up: false }.emit(&self.metrics);
            }
            (true, false) => {
                events::NoInstance::Ended { watched: c.watched }.emit(&self.metrics);
                events::WatcherState { watcher: "file", up: true }.emit(&self.metrics);
            }
            _ => {}
        }
        self.no_instance = c.no_instance;
    }
}
/// Starts the fanotify watcher, or says once why writers will be `unknown`.
/// `MESH_HOST_FANOTIFY=off` leaves it off (the benchmark's run without attribution).
fn start_writers() -> Option<Writers> {
    if std::env::var_os("MESH_HOST_FANOTIFY").is_some_and(|v| v == "off") {
        tracing::info!("fanotify is off (MESH_HOST_FANOTIFY=off): who made each drift will be unknown");
        return None;
    }
    match Writers::start() {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::info!(error = %e, "fanotify cannot be used (it needs root and Linux 5.9): who made each drift will be unknown; corrections go on as before");
            None
        }
    }
}
