//! The worker: the one owner of the store, the declaration in force and the file watcher, and
//! what one reconcile does (the declaration loaded, a full pass, one key); `runner` runs them,
//! several at once.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use mesh_host_watchers::{Change, FileWatcher};

use super::drift;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::claims;
use super::config::Config;
use super::health::{now_secs, Health};
use super::queue::{Claim, Contest, Verdict};
use super::runner::{Reconcile, Told};
use super::source::Source;
use super::trigger::{Index, Key};
use super::watches::Watches;
use crate::apply::{self, Options, Report, Verb};
use crate::declaration::{Declaration, Id, Kind};
use crate::store::Writer as Store;
use crate::telemetry::{events, Event as _, Metrics};

/// What a node has applied, as the worker last saw it: published on a watch channel
/// (`Worker::applied`) only when it moves, for whoever reports it (the fleet's status writer).
/// Carries no secret: counts, and messages the report already logs (which never hold an opened
/// value).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// The names of the files of the declaration in force, as the source listed them.
    pub sources: Vec<String>,
    /// Whether the last full pass, and every reconcile since, succeeded.
    pub converged: bool,
    /// Each outcome word's count in the last full pass.
    pub counts: std::collections::BTreeMap<String, u64>,
    /// Drift put back since the node started.
    pub drift_corrections: u64,
    /// Read-backs that found someone else had written since the node started (contested keys).
    pub contested: u64,
    /// The last failure, until a full pass succeeds.
    pub last_error: Option<String>,
    /// The last correction since the node started, and who made the change it put back
    /// (`app.conf by vim (pid 7, ...)`): names, never content.
    pub last_correction: Option<String>,
    /// The generation in force (`mesh-host generations`), when it could be recorded.
    pub generation: Option<u64>,
    /// How a rollback holds the node (`held at generation N by rollback since T ...`), or
    /// `None` while it follows its source.
    pub hold: Option<String>,
    /// The hold, when the node made it itself (`Hold::reverted` is set): what it went back from
    /// and why. `None` under an operator's rollback and while it follows its source.
    pub reverted: Option<crate::generations::Hold>,
}

/// What the worker owns: the declaration in force, the store, and the file watcher whose paths
/// follow the declaration. Only the worker's task touches it; what others read is shared
/// explicitly (`index`, `health`, `in_force`, `units`), each said below. A reconcile run apart
/// is given its own copies (`Apart`): the declaration's `Arc` (never changed, only replaced),
/// a copy of the store, a session of its own, and the content file's `Arc` (read with `pread`,
/// which needs no lock); it shares nothing mutable with the worker while it runs.
pub struct Worker {
    pub(super) config: Config,
    /// Connections to systemd and the container runtime for reconciles run apart: one is moved
    /// into each, and moved back when it ends well, so at most `workers - 1` are kept.
    pub(super) spare: Vec<apply::Session>,
    /// Shared with the scheduler, which runs steps of the declaration in force.
    pub(super) declaration: Option<Arc<Declaration>>,
    pub(super) store: Store,
    /// Connections to systemd and the container runtime, kept between the reconciles run
    /// inline; never lent (reconciles apart take theirs from `spare`).
    pub(super) session: apply::Session,
    /// The file watcher, fanotify's writers and the watchers started for the declaration in
    /// force, with what was said of them (`watches`).
    watches: Watches,
    /// The corrections kept under the state directory (`mesh-host drift`).
    history: drift::History,
    /// Containers' names by id, as the runtime last gave them (`None`: it did not, asked at that
    /// time, and asked again 10 s later): a container rewriting a managed file as fast as it can
    /// costs one question to the runtime (for Podman, a program run), not one per correction.
    /// At most `NAMES` kept; emptied when full. A lock only because `tally` takes `&self`; only
    /// the worker's task takes it.
    container_names: std::sync::Mutex<std::collections::HashMap<String, (Option<String>, Instant)>>,
    /// Paths, units and names to keys. Written here when a declaration is accepted (replaced
    /// whole); read by the intake loop for every change. A read lock held only for a lookup.
    index: Arc<RwLock<Index>>,
    /// The declaration's source: what the last read found, the content file, the generations
    /// and the hold (`source`).
    source: Source,
    /// A new declaration was put in force and the file watcher does not follow its paths yet.
    paths_stale: bool,
    /// Events are emitted by the worker only, inline or when it takes a reconcile back, never
    /// from a thread apart; `/metrics` reads the same registry (prometheus-client's atomics and
    /// its own locks), so no reader waits on a reconcile.
    pub(super) metrics: Arc<Metrics>,
    /// Written here (heartbeat, declaration in force); read by `/healthz` and the watchdog.
    pub(super) health: Arc<Health>,
    /// Keys whose changes and failures are logged at debug level only: contested ones (said
    /// once when the contest began) and ones already failing (said once when they began to).
    pub(super) quiet: std::collections::HashSet<Key>,
    /// The declaration in force: sent here, read by the scheduler of scheduled steps (a watch
    /// channel: the scheduler sees the latest, never a queue of old ones).
    in_force: tokio::sync::watch::Sender<Option<Arc<Declaration>>>,
    /// The scheduled steps installed at their current declaration, with the spec each was
    /// recorded at: written here after every reconcile, read by the scheduler at each fire, which
    /// runs no other step.
    installed: tokio::sync::watch::Sender<Arc<std::collections::HashMap<Id, String>>>,
    /// What the node has applied (a watch channel: a follower takes the latest at its own
    /// pace, the fleet's status writer at most once a second). Updated only when it moves, so
    /// a quiet node wakes no one.
    applied: tokio::sync::watch::Sender<Applied>,
    /// Why the last full pass refused the declaration in force whole on this machine (a
    /// firewall found on an adopted node that the host cannot manage), or `None`. While it is
    /// set, no reconcile of one key runs and no scheduled step fires: a declaration refused on
    /// this machine is refused everywhere, not applied piece by piece (issue 21).
    pub(super) refusal: Option<String>,
    /// The ids the last full pass (and the reconciles since) reported `held`: a hold is logged
    /// when it begins and when it ends, not at every pass (10,000 held files must not write
    /// 10,000 lines at every resync).
    held: HashSet<String>,
}

/// `MESH_HOST_FAILPOINT=panic-reconcile` makes the first single-resource reconcile of the process
/// panic, once: the fault a test needs in order to show that a panic fails that resource and the
/// daemon goes on. The others (`system::fs::failpoint`) abort around the writes.
fn failpoint_panic_reconcile(id: &Id) {
    static FIRED: AtomicBool = AtomicBool::new(false);
    if crate::system::fs::failpoint_named("panic-reconcile") && !FIRED.swap(true, Ordering::Relaxed) {
        panic!("failpoint panic-reconcile: a panic in the reconcile of {id}");
    }
}

impl Worker {
    pub fn new(
        config: Config,
        store: Store,
        files: FileWatcher,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
        tx: mpsc::UnboundedSender<Change>,
    ) -> Worker {
        let watches = Watches::new(files, &config, Arc::clone(&metrics), tx);
        let history = drift::History::start(&config.state);
        let source = Source::new(&config, Arc::clone(&metrics), Arc::clone(&health));
        Worker {
            config,
            spare: Vec::new(),
            declaration: None,
            store,
            session: apply::Session::default(),
            watches,
            history,
            container_names: std::sync::Mutex::default(),
            index: Arc::new(RwLock::new(Index::default())),
            source,
            paths_stale: false,
            metrics,
            health,
            quiet: HashSet::new(),
            in_force: tokio::sync::watch::channel(None).0,
            installed: tokio::sync::watch::channel(Arc::default()).0,
            applied: tokio::sync::watch::channel(Default::default()).0,
            refusal: None,
            held: HashSet::new(),
        }
    }

    /// What the node has applied, as a follower (the fleet's status writer) sees it.
    pub fn applied(&self) -> tokio::sync::watch::Receiver<Applied> {
        self.applied.subscribe()
    }

    /// Folds a report into what the node has applied. `full` for a full pass, whose counts and
    /// success stand for the whole declaration; a reconcile of one key only adds to the
    /// corrections and can only fail the node.
    fn publish_applied(&self, report: &Report, full: bool, last_correction: Option<String>) {
        let corrected = report.outcomes.iter().filter(|o| o.action == Verb::Corrected).count() as u64;
        let failures = report.error.iter().flat_map(|e| &e.failures);
        let contested = failures.clone().filter(|f| f.raced).count() as u64;
        let failed = failures.clone().any(|f| !f.raced);
        let sources = self.source.names();
        self.applied.send_if_modified(|a| {
            let before = a.clone();
            a.drift_corrections += corrected;
            if last_correction.is_some() {
                a.last_correction.clone_from(&last_correction);
            }
            a.contested += contested;
            if full {
                a.counts =
                    report.counts().into_iter().map(|(v, n)| (v.as_str().to_owned(), n as u64)).collect();
                a.converged = report.error.is_none();
                a.last_error = report.error.as_ref().map(|e| e.to_string());
                a.sources = sources.to_vec();
            } else if failed {
                a.converged = false;
                a.last_error = report.error.as_ref().map(|e| e.to_string());
            }
            *a != before
        });
    }

    /// Tells followers of `applied` the generation in force and the hold, when they moved.
    fn publish_generation(
        &self,
        generation: Option<u64>,
        hold: Option<String>,
        reverted: Option<crate::generations::Hold>,
    ) {
        self.applied.send_if_modified(|a| {
            let moved = a.generation != generation || a.hold != hold || a.reverted != reverted;
            a.generation = generation;
            a.hold = hold;
            a.reverted = reverted;
            moved
        });
    }

    /// The index the intake loop maps changes with.
    pub fn index(&self) -> Arc<RwLock<Index>> {
        Arc::clone(&self.index)
    }

    /// The declaration in force, as the scheduler follows it.
    pub fn in_force(&self) -> tokio::sync::watch::Receiver<Option<Arc<Declaration>>> {
        self.in_force.subscribe()
    }

    /// The scheduled steps installed at their current declaration, as the scheduler follows them.
    pub fn installed_steps(
        &self,
    ) -> tokio::sync::watch::Receiver<Arc<std::collections::HashMap<Id, String>>> {
        self.installed.subscribe()
    }

    pub(super) fn options(&self) -> Options {
        let originals = crate::store::originals_dir(&self.config.state);
        Options {
            origin: self.config.origin,
            dry_run: false,
            run_verify: false,
            originals,
            bus: self.config.bus.clone(),
            container_socket: self.config.container_socket.clone(),
            step_timeout: self.config.step_timeout,
            archive_limits: self.config.archive_limits,
            contents: self.source.contents(),
            key: self.config.key.clone(),
            // The daemon's passes are in its log, not on a terminal.
            progress: None,
        }
    }

    /// After any reconcile, inline or apart: the scheduler told, the time measured, the store
    /// written, the heartbeat.
    pub(super) fn finished(&mut self, key: &Key, started: Instant) {
        self.publish_installed_steps();
        let scope = if matches!(key, Key::Resource(_)) { "resource" } else { "full" };
        events::ReconcileFinished { scope, took: started.elapsed() }.emit(&self.metrics);
        let saved =
            if matches!(key, Key::Resource(_)) { self.store.save_changes() } else { self.store.save() };
        if let Err(e) = saved {
            events::StoreNotWritten { error: &e, when: "after a reconcile" }.emit(&self.metrics);
        }
        self.health.beat();
    }

    /// Tells the scheduler which steps are installed now. Sent only when that moved, so the
    /// scheduler is not woken by every reconcile of a file.
    fn publish_installed_steps(&self) {
        let installed = match self.declaration.as_deref() {
            // A refused declaration has nothing installed: the scheduler fires none of it.
            Some(_) if self.refusal.is_some() => std::collections::HashMap::new(),
            Some(d) if d.scheduled_steps().next().is_some() => {
                apply::installed_steps(d, &self.store, &self.config.key)
            }
            _ => std::collections::HashMap::new(),
        };
        self.installed.send_if_modified(|was| {
            let moved = **was != installed;
            if moved {
                *was = Arc::new(installed);
            }
            moved
        });
    }

    /// Reads the declaration source (`Source::load`, `force` as it says) and puts what it
    /// holds in force when it is accepted: the index, the watchers it needs, the scheduler and
    /// the fleet told. What is refused leaves the declaration in force as it is.
    fn load_declaration(&mut self, force: bool) {
        let Some(loaded) = self.source.load(force, self.declaration.is_some()) else { return };
        // For the fleet's status, which carries them to etcd.
        self.publish_generation(loaded.generation, loaded.hold, loaded.reverted);
        let d = Arc::new(loaded.declaration);
        let index = Index::new(&d);
        let units = index.units();
        *self.index.write().unwrap_or_else(|e| e.into_inner()) = index;
        self.watches.follow(&d, units);
        self.declaration = Some(Arc::clone(&d));
        self.paths_stale = true;
        self.in_force.send_replace(Some(d));
    }

    fn full(&mut self) -> Verdict {
        let options = self.options();
        if self.declaration.is_none() {
            return Verdict::Clean;
        }
        if std::mem::take(&mut self.paths_stale) {
            // A new declaration: its paths are watched before the pass writes them, so a hand-edit
            // right after the host's write is seen. Watched again after the pass, for the
            // directories the pass made, and those looked at once then (`look_at_armed`). The
            // ones armed here need no look: the pass that follows looks at every path.
            self.watch_paths();
            self.watches.forget_armed();
        }
        let Some(declaration) = self.declaration.as_deref() else { return Verdict::Clean };
        let t = std::time::Instant::now();
        let (mut report, _) = apply::apply_in(&mut self.session, declaration, &mut self.store, &options);
        let pass = t.elapsed();
        let refused_before = self.refusal.is_some();
        self.note_refusal(&report);
        self.source.note_first_pass(&report);
        // A refusal that stands is said once, when it began, not at every resync.
        let last = self.tally(&mut report, None, refused_before && self.refusal.is_some());
        if self.refusal.is_none() {
            self.note_holds(&report);
        }
        self.publish_applied(&report, true, last);
        events::ApplyFinished { at: now_secs(), succeeded: report.error.is_none() }.emit(&self.metrics);
        if self.refusal.is_none() {
            // A refused pass attempted nothing: the counts of the last pass that did stand.
            self.count_resources(&report);
        }
        let failed = report.error.is_some();
        // The report goes first: what the watchers keep for as long as the daemon runs is then
        // not allocated among its texts, one or more for each resource (about 0.5 MiB less
        // resident after a first pass at 100,000 files; docs/memory.md).
        drop(report);
        let t = std::time::Instant::now();
        self.watch_paths();
        self.look_at_armed();
        tracing::debug!(
            pass_ms = pass.as_secs_f64() * 1e3,
            watch_ms = t.elapsed().as_secs_f64() * 1e3,
            "full pass"
        );
        if failed {
            Verdict::Failed
        } else {
            Verdict::Clean
        }
    }

    /// Follows a full pass's report: a declaration refused whole on this machine (`refused`)
    /// begins or ends its refusal here, said once each way, on `/healthz`, and in the index, so
    /// that any change in the ruleset brings a full pass to look again. The watcher of the
    /// ruleset is started with the first refusal if no opening started it.
    fn note_refusal(&mut self, report: &Report) {
        let now = report.error.as_ref().filter(|e| e.refused).map(|e| e.message.clone());
        match (&self.refusal, &now) {
            (None, Some(why)) => events::RefusedHere::Began { message: why }.emit(&self.metrics),
            (Some(_), None) => events::RefusedHere::Ended.emit(&self.metrics),
            _ => {}
        }
        self.health.set_refused(now.clone());
        self.index.write().unwrap_or_else(|e| e.into_inner()).refused = now.is_some();
        if now.is_some() {
            self.watches.watch_firewall();
        }
        self.refusal = now;
    }

    /// After a full pass: which holds ended (said once each), and what is held now.
    fn note_holds(&mut self, report: &Report) {
        let now: HashSet<String> =
            report.outcomes.iter().filter(|o| o.action == Verb::Held).map(|o| o.id.clone()).collect();
        for id in self.held.difference(&now) {
            events::HoldEnded { id }.emit(&self.metrics);
        }
        self.held = now;
    }

    fn one(&mut self, id: &Id, seen: Instant) -> Verdict {
        if let Some(why) = &self.refusal {
            // Nothing of a refused declaration is applied, one key at a time either: the full
            // pass that lifts the refusal applies everything.
            tracing::debug!(key = %id, refused = %why, "not reconciled: the declaration is refused on this machine");
            return Verdict::Clean;
        }
        let options = self.options();
        let Some(declaration) = self.declaration.as_deref() else {
            return Verdict::Clean;
        };
        if declaration.get(id).is_none() {
            // Undeclared since the key was queued: the full apply that followed handled it.
            return Verdict::Clean;
        }
        failpoint_panic_reconcile(id);
        let mut report = apply::reconcile_in(
            &mut self.session,
            declaration,
            std::slice::from_ref(id),
            &mut self.store,
            &options,
        );
        self.conclude_one(id, &mut report, seen)
    }

    /// What follows one resource's reconcile, inline or apart: metrics and log lines, the
    /// fleet's status, watches made again, and the verdict for the queue.
    pub(super) fn conclude_one(&mut self, id: &Id, report: &mut Report, seen: Instant) -> Verdict {
        let quiet = self.quiet.contains(&Key::Resource(id.clone()));
        let last = self.tally(report, Some(seen), quiet);
        self.held.extend(report.outcomes.iter().filter(|o| o.action == Verb::Held).map(|o| o.id.clone()));
        self.publish_applied(report, false, last);
        if report.outcomes.iter().any(|o| o.action.moved()) {
            self.watches.rewatch();
            self.look_at_armed();
        }
        match &report.error {
            // Someone wrote the file again between the host's write and its read-back: that is
            // a contest, held briefly and retried, not a failure whose backoff grows to minutes.
            Some(e) if e.failures.iter().all(|f| f.raced) => Verdict::Corrected,
            Some(_) => Verdict::Failed,
            None if report.outcomes.iter().any(|o| o.action == Verb::Corrected && o.id == id.as_str()) => {
                Verdict::Corrected
            }
            None => Verdict::Clean,
        }
    }

    /// Tells what a report did, once: each change and each failure is an event (its log line
    /// and its metrics move together), and the latency of a correction is measured from when
    /// the change was first seen. A correction's detail in the report gains who made the change
    /// it put back (`...: content; by sed (pid 4242, ...)`), and it is kept in the history with
    /// its hand-edit, which leaves the report then.
    /// Returns the last correction's id and who made it, for the fleet's status.
    fn tally(&self, report: &mut Report, seen: Option<Instant>, quiet: bool) -> Option<String> {
        let mut last = None;
        for o in &mut report.outcomes {
            // A hold already said is not said again (`held`).
            let quiet = quiet || (o.action == Verb::Held && self.held.contains(&o.id));
            let since_seen = seen.map(|s| s.elapsed());
            let who = (o.action == Verb::Corrected).then(|| self.who(&o.target, seen));
            let text = who.as_ref().map(drift::Who::describe);
            // The outcome's own words, for the history, before the writer is added to them.
            let changed = text.as_ref().map(|_| o.detail.clone().unwrap_or_default());
            if let Some(text) = &text {
                o.detail = Some(match o.detail.take() {
                    Some(d) => format!("{d}; by {text}"),
                    None => format!("by {text}"),
                });
            }
            events::ResourceChanged {
                id: &o.id,
                kind: o.kind.as_str(),
                target: &o.target,
                action: o.action.as_str(),
                detail: o.detail.as_deref(),
                since_seen,
                quiet,
                by: who.as_ref().map(by),
            }
            .emit(&self.metrics);
            if let (Some(who), Some(text)) = (who, text) {
                last = Some(format!("{} by {text}", o.id));
                let c = drift::Correction {
                    at_ms: crate::system::unix_millis(),
                    id: o.id.clone(),
                    kind: o.kind.as_str().to_owned(),
                    target: o.target.clone(),
                    changed: changed.unwrap_or_default(),
                    who,
                    put_back_ms: since_seen.map(|d| d.as_secs_f64() * 1000.0),
                    diff: None,
                    diff_omitted: None,
                };
                self.history.add(c.with_edit(o.hand_edit.take()));
            }
        }
        for f in report.error.iter().flat_map(|e| &e.failures) {
            // A raced read-back is a contest in progress, which has its own log line.
            events::ResourceFailed {
                id: &f.id,
                kind: f.kind.as_str(),
                target: &f.target,
                message: &f.message,
                quiet: quiet || f.raced,
            }
            .emit(&self.metrics);
        }
        last
    }

    /// Who made the change a correction of `target` put back: the latest writer fanotify saw
    /// at that path since the change was seen (waiting a little for it: its event and
    /// inotify's are read on two threads), or `unknown`.
    fn who(&self, target: &str, seen: Option<Instant>) -> drift::Who {
        let Some(writers) = self.watches.writers() else { return drift::Who::unknown() };
        let path = std::path::Path::new(target);
        if !path.is_absolute() {
            return drift::Who::unknown();
        }
        use std::time::Duration;
        let now = std::time::Instant::now();
        let (since, wait) = match seen.map(Instant::into_std) {
            Some(s) => (s.checked_sub(Duration::from_secs(1)).unwrap_or(s), Duration::from_millis(50)),
            None => (now.checked_sub(Duration::from_secs(60)).unwrap_or(now), Duration::ZERO),
        };
        let Some(w) = writers.take(path, since, wait) else { return drift::Who::unknown() };
        let name = w.container.as_deref().and_then(|id| self.container_name(id));
        drift::Who::from_writer(&w, name)
    }

    /// A container's name, from its id: asked of the runtime the agent already talks to (Docker,
    /// or Podman's Docker-compatible socket), then of the `podman` program, since a Podman
    /// container needs no socket to run. Asked after the put back, so it never delays that.
    fn container_name(&self, id: &str) -> Option<String> {
        const NAMES: usize = 256;
        const RETRY: std::time::Duration = std::time::Duration::from_secs(10);
        let mut names = self.container_names.lock().unwrap_or_else(|e| e.into_inner());
        match names.get(id) {
            Some((Some(name), _)) => return Some(name.clone()),
            Some((None, asked)) if asked.elapsed() < RETRY => return None,
            _ => {}
        }
        let docker = crate::system::docker::connect(self.config.container_socket.as_deref()).ok();
        let name = docker
            .and_then(|d| d.container(id).ok().flatten())
            .map(|c| c.name)
            .filter(|n| !n.is_empty())
            .or_else(|| crate::system::docker::podman_name(id));
        if names.len() >= NAMES {
            names.clear();
        }
        names.insert(id.to_owned(), (name.clone(), Instant::now()));
        name
    }

    fn count_resources(&self, report: &Report) {
        let Some(declaration) = self.declaration.as_deref() else { return };
        let failed: std::collections::HashSet<&str> =
            report.error.iter().flat_map(|e| e.failures.iter().map(|f| f.id.as_str())).collect();
        let held: std::collections::HashSet<&str> =
            report.outcomes.iter().filter(|o| o.action == Verb::Held).map(|o| o.id.as_str()).collect();
        for kind in Kind::ALL {
            let (mut applied, mut failed_n, mut held_n) = (0, 0, 0);
            for r in declaration.resources.iter().filter(|r| r.kind() == kind) {
                if failed.contains(r.id.as_str()) {
                    failed_n += 1;
                } else if held.contains(r.id.as_str()) {
                    held_n += 1;
                } else {
                    applied += 1;
                }
            }
            events::ResourcesCounted { kind: kind.as_str(), applied, failed: failed_n, held: held_n }
                .emit(&self.metrics);
        }
    }

    /// A key held after repeated corrections (a contest): its path is muted in both watchers
    /// until the hold ends, so that a writer fighting the agent over it wakes neither of their
    /// threads at each write (mesh_host_watchers::file, "mute"). Nothing is lost: the queue
    /// runs the key again when the hold ends, and the file watcher says once that it moved.
    fn mute(&mut self, key: &Key, until: std::time::Instant) {
        let Key::Resource(id) = key else { return };
        let Some(path) = self.declaration.as_ref().and_then(|d| d.get(id)).and_then(|r| r.spec.path()) else {
            return;
        };
        self.watches.mute(path, until);
    }

    /// The ids a reconcile of `id` claims, by the declaration in force and the store now.
    fn claimed(&self, id: &Id) -> Vec<Id> {
        match self.declaration.as_deref() {
            Some(d) => claims::claimed(d, &self.store, id),
            None => vec![id.clone()],
        }
    }

    /// Points the watches at the managed paths of the declaration in force.
    fn watch_paths(&mut self) {
        let index = self.index.read().unwrap_or_else(|e| e.into_inner());
        self.watches.set_paths(index.paths());
    }

    /// Looks once at the paths of directories watched anew (`Watches::look_at_armed`).
    fn look_at_armed(&mut self) {
        self.watches.look_at_armed(self.declaration.as_deref(), &self.store);
    }
}

/// A reconcile run apart from the worker, as it leaves: everything it needs, owned (the
/// declaration's `Arc`, a copy of the store, a session of its own); it shares nothing mutable
/// with the worker while it runs.
pub(super) struct Apart {
    id: Id,
    seen: Instant,
    /// The ids whose records and holds are taken back: the claim's.
    ids: Vec<Id>,
    declaration: Arc<Declaration>,
    store: crate::store::Store,
    session: apply::Session,
    options: Options,
}

/// A reconcile run apart, as it comes back.
pub(super) struct Back {
    seen: Instant,
    ids: Vec<Id>,
    store: crate::store::Store,
    report: Report,
    session: apply::Session,
}

impl Reconcile for Worker {
    type Job = Apart;
    type Back = Back;

    /// What the reconcile of `key` may touch (`claims`), by the declaration in force and the
    /// store now; a key with no declaration in force claims only itself.
    fn claim_of(&self, key: &Key) -> Claim {
        match key {
            Key::Full | Key::Declaration => Claim::Everything,
            Key::Resource(id) => {
                Claim::only(self.claimed(id).iter().map(|id| claims::claim_hash(id.as_str())).collect())
            }
        }
    }

    /// Whether `key` may be slow (`claims::slow`), when there is room apart at all.
    fn runs_apart(&self, key: &Key, limit: usize) -> bool {
        let (Key::Resource(id), Some(d)) = (key, self.declaration.as_deref()) else { return false };
        limit > 0 && claims::slow(d, id)
    }

    /// `None` when there is nothing to run apart (no declaration in force, the id no longer
    /// declared, or the declaration refused on this machine): the inline path settles it.
    fn apart(&mut self, key: &Key, seen: Instant) -> Option<Apart> {
        let Key::Resource(id) = key else { return None };
        if self.refusal.is_some() {
            return None;
        }
        let declaration = self.declaration.clone()?;
        declaration.get(id)?;
        let options = self.options();
        let ids = self.claimed(id);
        let (store, session) = (self.store.lend(), self.spare.pop().unwrap_or_default());
        Some(Apart { id: id.clone(), seen, ids, declaration, store, session, options })
    }

    fn run_apart(job: Apart) -> Back {
        let Apart { id, seen, ids, declaration, mut store, mut session, options } = job;
        failpoint_panic_reconcile(&id);
        let report =
            apply::reconcile_in(&mut session, &declaration, std::slice::from_ref(&id), &mut store, &options);
        Back { seen, ids, store, report, session }
    }

    /// The records it claimed and its session, or, after a panic, nothing of it (the machine
    /// is read again next time); then what follows any reconcile.
    fn take_back(&mut self, key: &Key, started: Instant, back: Result<Back, String>) -> Verdict {
        let Key::Resource(id) = key else { return Verdict::Failed };
        let verdict = match back {
            Ok(Back { seen, ids, store, mut report, session }) => {
                let claimed: Vec<&str> = ids.iter().map(Id::as_str).collect();
                self.store.take_back(store, Some(&claimed));
                self.spare.push(session);
                self.conclude_one(id, &mut report, seen)
            }
            Err(message) => {
                self.store.lost();
                events::ReconcilePanicked { id: Some(id.as_str()), key: &key.to_string(), message: &message }
                    .emit(&self.metrics);
                Verdict::Failed
            }
        };
        self.finished(key, started);
        verdict
    }

    /// The copy is lost: its work is read from the machine next time.
    fn lost(&mut self, key: Option<&Key>, error: &tokio::task::JoinError) {
        events::ReconcileLost { key: key.map(Key::to_string).as_deref(), error }.emit(&self.metrics);
        if key.is_some() {
            self.store.lost();
        }
    }

    /// The declaration read again first for a full pass or a new declaration.
    fn reconcile(&mut self, key: &Key, seen: Instant) -> Verdict {
        let started = Instant::now();
        let verdict = match key {
            // The declaration watcher saw the source change: read and parse it, even when its
            // bytes are the same (touching it makes a new content file; see decisions.md).
            Key::Declaration => {
                self.load_declaration(true);
                self.full()
            }
            // A resync, or a watcher that may have missed something: the source is read again
            // as well, and parsed only if it changed, since the watcher may have missed it too.
            Key::Full => {
                self.load_declaration(false);
                self.full()
            }
            Key::Resource(id) => self.one(id, seen),
        };
        self.finished(key, started);
        verdict
    }

    /// The connections to systemd and the container runtime, the one state kept across
    /// reconciles that a panic could leave mid-protocol, are dropped and made again by the next
    /// reconcile that needs them. The store records a resource only after its read-back, the
    /// declaration in force and the index are replaced whole, and every lock is taken through
    /// poisoning.
    fn panicked(&mut self, key: &Key, message: &str) -> Verdict {
        self.session = apply::Session::default();
        let id = match key {
            Key::Resource(id) => Some(id.as_str()),
            Key::Declaration | Key::Full => None,
        };
        events::ReconcilePanicked { id, key: &key.to_string(), message }.emit(&self.metrics);
        // The worker is alive: it finished this key, if badly.
        self.health.beat();
        Verdict::Failed
    }

    /// A contest or a failure said once, and a key held after repeated corrections muted.
    fn done(&mut self, key: &Key, verdict: Verdict, told: Told) {
        let name = key.to_string();
        match told.contest {
            Some(Contest::Began { wait }) => {
                self.quiet.insert(key.clone());
                events::ContestBegan { key: &name, wait }.emit(&self.metrics);
            }
            Some(Contest::Ended) => {
                self.quiet.remove(key);
                events::ContestEnded { key: &name }.emit(&self.metrics);
            }
            None => {}
        }
        if let Some(until) = told.held_until {
            self.mute(key, until.into_std());
        }
        match verdict {
            Verdict::Failed => {
                self.quiet.insert(key.clone());
            }
            Verdict::Clean if self.quiet.remove(key) => events::Recovered { key: &name }.emit(&self.metrics),
            Verdict::Clean | Verdict::Corrected => {}
        }
        let stats = told.stats;
        events::QueueSampled {
            depth: stats.depth,
            processing: stats.processing,
            backing_off: stats.backing_off,
            contested: stats.contested,
            retrying: verdict == Verdict::Failed,
        }
        .emit(&self.metrics);
    }

    fn oldest_apart(&mut self, started: Option<std::time::Instant>) {
        self.health.set_oldest_apart(started);
    }

    /// Intake has stopped and the last reconcile finished: what it recorded is persisted.
    fn finish(&mut self) -> Vec<tokio::task::JoinHandle<()>> {
        if let Err(e) = self.store.save() {
            events::StoreNotWritten { error: &e, when: "on the way out" }.emit(&self.metrics);
        }
        self.watches.tasks()
    }
}

/// The event's fields of who made a change.
fn by(w: &drift::Who) -> events::By<'_> {
    events::By {
        kind: w.by.as_str(),
        pid: w.pid,
        comm: w.comm.as_deref(),
        exe: w.exe.as_deref(),
        uid: w.uid,
        user: w.user.as_deref(),
        loginuid: w.loginuid,
        session: w.session,
        unit: w.unit.as_deref(),
        container: w.container.as_deref(),
        exited: w.exited,
        moved: w.moved.as_deref(),
    }
}
