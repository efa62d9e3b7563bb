//! The worker: the one owner of the store, the declaration in force and the file watcher, and
//! what one reconcile does (the declaration loaded, a full pass, one key); `runner` runs them,
//! several at once.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use mesh_host_watchers::{Change, FileWatcher};

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::claims;
use super::config::Config;
use super::health::{now_secs, Health};
use super::queue::{Claim, Contest, Verdict};
use super::report::{self, Applied};
use super::runner::{Reconcile, Told};
use super::source::Source;
use super::trigger::{Index, Key};
use super::watches::Watches;
use crate::apply::{self, Options, Report, Verb};
use crate::declaration::{Declaration, Id};
use crate::store::Writer as Store;
use crate::telemetry::{events, Event as _, Metrics};

#[cfg(feature = "robust-mutant")]
mod mutant;

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
    /// What the worker tells of its reconciles: events, holds, counts, `Applied`, and the
    /// attribution of each correction on a thread of its own (`report`).
    report: report::Report,
    /// Paths, units and names to keys. Written here when a declaration is accepted (replaced
    /// whole); read by the intake loop for every change. A read lock held only for a lookup.
    index: Arc<RwLock<Index>>,
    /// The declaration's source: what the last read found, the content file, the generations
    /// and the hold (`source`).
    source: Source,
    /// A new declaration was put in force and the file watcher does not follow its paths yet.
    paths_stale: bool,
    /// The declaration in force before the last one, and its content file (the `flap`
    /// mutant's, below).
    #[cfg(feature = "robust-mutant")]
    previous: Option<(Arc<Declaration>, Option<Arc<crate::system::ContentFile>>)>,
    /// Events are emitted by the worker, inline or when it takes a reconcile back, never from a
    /// reconcile apart; a correction's by the report's attribution thread (`report`).
    /// `/metrics` reads the same registry (prometheus-client's atomics and its own locks), so
    /// no reader waits on a reconcile.
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
    /// Why the last full pass refused the declaration in force whole on this machine (a
    /// firewall found on an adopted node that the host cannot manage), or `None`. While it is
    /// set, no reconcile of one key runs and no scheduled step fires: a declaration refused on
    /// this machine is refused everywhere, not applied piece by piece (issue 21).
    pub(super) refusal: Option<String>,
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
        let report = report::Report::new(
            &config.state,
            config.container_socket.clone(),
            Arc::clone(&metrics),
            watches.taker(),
        );
        let source = Source::new(&config, Arc::clone(&metrics), Arc::clone(&health));
        Worker {
            config,
            spare: Vec::new(),
            declaration: None,
            store,
            session: apply::Session::default(),
            watches,
            report,
            index: Arc::new(RwLock::new(Index::default())),
            source,
            paths_stale: false,
            #[cfg(feature = "robust-mutant")]
            previous: None,
            metrics,
            health,
            quiet: HashSet::new(),
            in_force: tokio::sync::watch::channel(None).0,
            installed: tokio::sync::watch::channel(Arc::default()).0,
            refusal: None,
        }
    }

    /// What the node has applied, as a follower (the fleet's status writer) sees it.
    pub fn applied(&self) -> tokio::sync::watch::Receiver<Applied> {
        self.report.applied()
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
            keep_max_bytes: self.config.keep_max_bytes,
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
        #[cfg(feature = "robust-mutant")]
        let contents = self.source.contents();
        let Some(loaded) = self.source.load(force, self.declaration.is_some()) else { return };
        // For the fleet's status, which carries them to etcd.
        self.report.publish_generation(loaded.generation, loaded.hold, loaded.reverted, loaded.signed);
        let d = Arc::new(loaded.declaration);
        let index = Index::new(&d);
        let units = index.units();
        *self.index.write().unwrap_or_else(|e| e.into_inner()) = index;
        self.watches.follow(&d, units);
        #[cfg(feature = "robust-mutant")]
        {
            self.previous = self.declaration.take().map(|d| (d, contents));
        }
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
            #[cfg(feature = "robust-mutant")]
            self.status_ahead();
            #[cfg(feature = "robust-mutant")]
            self.flap(&options);
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
        self.report.tally(&mut report, None, refused_before && self.refusal.is_some());
        if self.refusal.is_none() {
            self.report.note_holds(&report);
        }
        self.report.publish(&report, true, self.source.names());
        events::ApplyFinished { at: now_secs(), succeeded: report.error.is_none() }.emit(&self.metrics);
        if self.refusal.is_none() {
            // A refused pass attempted nothing: the counts of the last pass that did stand.
            if let Some(d) = self.declaration.as_deref() {
                self.report.count(d, &report);
            }
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
        self.report.tally(report, Some(seen), quiet);
        self.report.add_holds(report);
        self.report.publish(report, false, self.source.names());
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
        self.report.mute(path.to_path_buf(), until);
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
        // Every correction told and kept in the history before the agent exits.
        self.report.finish();
        self.watches.tasks()
    }
}
