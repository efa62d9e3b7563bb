//! `mesh-host run`: the controller. A full apply, then watch: watchers push keys into the work
//! queue, one worker drains it, each key reconciled and read back, metrics and one log line per
//! change on the way.
//!
//! The stages, each small:
//! - `trigger`: what a watcher's change means: a managed path is its resource's key, the
//!   declaration settling is the declaration key, a gap in what a watcher saw is a full resync.
//! - `queue`: de-duplication, the never-twice-at-once rule, backoff, the rate limit.
//! - `worker` (here): one reconcile at a time. One worker is deliberate: reconciles take
//!   milliseconds, and serialising them means the store, the filesystem session and the
//!   declaration need no locks and two reconciles can never race on one path.
//!
//! Architecture Invariant: the controller knows nothing about how a resource is applied; it
//! calls `apply::apply` and `apply::reconcile` and reads their reports.

pub mod queue;
mod schedule;
mod trigger;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use mesh_host_watchers::{declaration as declaration_watcher, Change, FileWatcher};
use sha2::Digest as _;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::apply::{self, Action, Options, Report};
use crate::declaration::{Declaration, Id, Kind, Spec};
use crate::store::{Origin, Store};
use crate::telemetry::Metrics;
use queue::{Contest, Queue, Verdict};
use trigger::Index;
pub use trigger::Key;

/// How the daemon runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// A declaration file, or a directory of `*.json` files read as one declaration.
    pub declaration: PathBuf,
    pub state: PathBuf,
    pub origin: Origin,
    /// Where `/metrics` and `/healthz` listen; `None` for nowhere.
    pub metrics: Option<SocketAddr>,
    /// How often everything is reconciled even when no watcher said anything.
    pub resync: Duration,
    /// How long the declaration must be still before it is read.
    pub settle: Duration,
    pub queue: queue::Config,
    /// The D-Bus address of the systemd to manage; the system bus when `None`.
    pub bus: Option<String>,
    /// The container runtime's socket (`--container-socket`); `None` looks in the usual places.
    pub container_socket: Option<String>,
    /// How long an action or a step may run (`--step-timeout`); `None` for no limit.
    pub step_timeout: Option<Duration>,
    /// How much one archive may unpack (`--archive-max-bytes`, `--archive-max-entries`).
    pub archive_limits: crate::apply::ArchiveLimits,
}

impl Config {
    /// How long the worker may go without finishing a reconcile before it is taken for stuck
    /// (`/healthz` fails, the watchdog is no longer pinged): two resync periods, plus the step
    /// time limit, since one reconcile may legitimately run a step that long. With no step
    /// limit, a day: a long step cannot then be told from a stuck worker any sooner.
    pub fn stale_after(&self) -> Duration {
        2 * self.resync.max(Duration::from_secs(60))
            + self.step_timeout.unwrap_or(Duration::from_secs(86_400))
    }
}

/// Why no declaration is in force, for `/healthz`; `None` once one is.
type NotInForce = Arc<std::sync::Mutex<Option<String>>>;

/// What the worker owns: the declaration in force, the store, and the file watcher whose paths
/// follow the declaration.
struct Worker {
    config: Config,
    /// Shared with the scheduler, which runs steps of the declaration in force.
    declaration: Option<Arc<Declaration>>,
    store: Store,
    /// Connections to systemd and the container runtime, kept between reconciles.
    session: apply::Session,
    files: FileWatcher,
    index: Arc<RwLock<Index>>,
    /// A digest of what the last read of the declaration source found (its files' names and
    /// bytes, or the error), so that a full pass reads the source again cheaply and parses it
    /// only when it changed.
    source_seen: Option<[u8; 32]>,
    /// Why no declaration is in force, shared with `/healthz`.
    not_in_force: NotInForce,
    metrics: Arc<Metrics>,
    /// Seconds since the epoch of the worker's last finished reconcile, for `/healthz`.
    heartbeat: Arc<AtomicI64>,
    /// Keys whose changes and failures are logged at debug level only: contested ones (said
    /// once when the contest began) and ones already failing (said once when they began to).
    quiet: std::collections::HashSet<Key>,
    /// For starting watchers when the declaration first needs them.
    tx: mpsc::UnboundedSender<Change>,
    /// The units the systemd watcher follows, updated with the declaration.
    units: tokio::sync::watch::Sender<std::collections::BTreeSet<String>>,
    /// Started when a declaration first names a systemd unit: a node with no services has no
    /// reason to talk to systemd, nor to report a systemd watcher down.
    systemd_watcher: Option<tokio::task::JoinHandle<()>>,
    /// Started when a declaration first names a container, a network, or an action run in a
    /// container, for the same reason.
    docker_watcher: Option<tokio::task::JoinHandle<()>>,
    /// The declaration in force, for the scheduler of scheduled steps.
    in_force: tokio::sync::watch::Sender<Option<Arc<Declaration>>>,
}

/// Runs the daemon until SIGTERM or SIGINT, then stops intake, lets the reconcile in flight
/// finish, persists the store and returns.
pub async fn run(config: Config) -> anyhow::Result<()> {
    // Signals first: a SIGTERM during the first apply must stop the agent cleanly too.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let metrics = Arc::new(Metrics::new());
    let store = Store::open(&config.state)?;
    let (tx, mut rx) = mpsc::unbounded_channel::<Change>();
    let files = FileWatcher::new(tx.clone()).context("cannot start the file watcher (inotify)")?;
    metrics.watcher_up.get_or_create(&vec![("watcher", "file")]).set(1);
    let heartbeat = Arc::new(AtomicI64::new(now_secs()));

    let mut worker = Worker {
        config: config.clone(),
        declaration: None,
        store,
        session: apply::Session::default(),
        files,
        index: Arc::new(RwLock::new(Index::default())),
        source_seen: None,
        not_in_force: Arc::new(std::sync::Mutex::new(Some("no declaration has been read yet".into()))),
        metrics: Arc::clone(&metrics),
        heartbeat: Arc::clone(&heartbeat),
        quiet: std::collections::HashSet::new(),
        tx: tx.clone(),
        units: tokio::sync::watch::channel(std::collections::BTreeSet::new()).0,
        systemd_watcher: None,
        docker_watcher: None,
        in_force: tokio::sync::watch::channel(None).0,
    };
    let _scheduler = schedule::spawn(
        worker.in_force.subscribe(),
        config.container_socket.clone(),
        config.step_timeout,
        Arc::clone(&metrics),
    );

    if let Some(addr) = config.metrics {
        let beat = Arc::clone(&heartbeat);
        let stale = config.stale_after();
        let started = Arc::clone(&ready);
        let not_in_force = Arc::clone(&worker.not_in_force);
        let health: crate::telemetry::http::Health = Arc::new(move || {
            if !started.load(Ordering::Relaxed) {
                return Err("starting: the first apply has not finished".into());
            }
            // An agent enforcing nothing is not healthy, even though it runs: a declaration
            // refused at start-up, and none accepted since (issue 12, fault 9).
            if let Some(why) = not_in_force.lock().unwrap_or_else(|e| e.into_inner()).as_deref() {
                return Err(format!("no declaration in force: {why}"));
            }
            // Healthy while the worker has finished something recently enough (`stale_after`):
            // a worker stuck in one reconcile is the failure this is for.
            let age = now_secs() - beat.load(Ordering::Relaxed);
            if age as u64 <= stale.as_secs() {
                Ok(())
            } else {
                Err(format!("the worker has not finished a reconcile for {age} s"))
            }
        });
        let (bound, _task) = crate::telemetry::http::serve(addr, Arc::clone(&metrics), health)
            .await
            .with_context(|| format!("cannot listen for metrics on {addr}"))?;
        tracing::info!(address = %bound, "serving /metrics and /healthz");
    }

    // Watch before the first apply, so a change made during it is not missed; what the
    // watchers report meanwhile waits in the channel.
    let _declaration_task = declaration_watcher::spawn(config.declaration.clone(), config.settle, tx.clone())
        .with_context(|| format!("cannot watch the declaration {}", config.declaration.display()))?;
    drop(tx);
    // The first apply, before systemd hears we are ready. A declaration that cannot be read or
    // is refused leaves nothing in force: the agent runs, says so on /healthz, and applies the
    // first good declaration written to the source.
    tokio::task::block_in_place(|| worker.reconcile_guarded(&Key::Declaration, Instant::now()));
    ready.store(true, Ordering::Relaxed);

    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    tracing::info!(declaration = %config.declaration.display(), "mesh-host is running");
    if let Some(interval) = sd_notify::watchdog_enabled() {
        // Pinged from the worker's heartbeat, so a wedged worker stops the pings and systemd
        // restarts the agent.
        let beat = Arc::clone(&heartbeat);
        let limit = config.stale_after().as_secs() as i64;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval / 2);
            loop {
                tick.tick().await;
                if now_secs() - beat.load(Ordering::Relaxed) <= limit {
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                }
            }
        });
    }

    let queue = Arc::new(Queue::<Key>::new(config.queue.clone()));
    let index = Arc::clone(&worker.index);

    // The worker: one reconcile at a time, each on this runtime's blocking allowance.
    let worker_queue = Arc::clone(&queue);
    let worker_task = tokio::spawn(async move {
        while let Some((key, seen)) = worker_queue.next().await {
            let verdict = tokio::task::block_in_place(|| worker.reconcile_guarded(&key, seen));
            if verdict == Verdict::Failed {
                worker.metrics.queue_retries.inc();
            }
            match worker_queue.done(&key, verdict) {
                Some(Contest::Began { hold }) => {
                    worker.quiet.insert(key.clone());
                    tracing::warn!(key = %key, hold_ms = hold.as_millis() as u64, "contested: something keeps changing {key} back; its corrections now back off, and are logged at debug level until it settles")
                }
                Some(Contest::Ended) => {
                    worker.quiet.remove(&key);
                    tracing::info!(key = %key, "{key} is no longer contested");
                }
                None => {}
            }
            match verdict {
                Verdict::Failed => {
                    worker.quiet.insert(key.clone());
                }
                Verdict::Settled if worker.quiet.remove(&key) => {
                    tracing::info!(key = %key, "{key} reconciled again")
                }
                _ => {}
            }
            let stats = worker_queue.stats();
            worker.metrics.queue_depth.set(stats.depth as i64);
            worker.metrics.queue_backing_off.set(stats.backing_off as i64);
            worker.metrics.contested.set(stats.contested as i64);
        }
        // Intake has stopped and the last reconcile finished: persist what it recorded.
        if let Err(e) = worker.store.save() {
            tracing::error!(error = %e, "cannot write the state store on the way out");
        }
    });

    let mut resync = tokio::time::interval_at(Instant::now() + config.resync, config.resync);
    loop {
        tokio::select! {
            change = rx.recv() => {
                let Some(change) = change else { break };
                let added = {
                    let index = index.read().unwrap_or_else(|e| e.into_inner());
                    trigger::keys(&change, &index)
                };
                if let Change::Up { watcher, up } = change {
                    metrics.watcher_up.get_or_create(&vec![("watcher", watcher)]).set(i64::from(up));
                }
                for (key, source) in added {
                    metrics.queue_adds.get_or_create(&vec![("source", source)]).inc();
                    queue.add(key);
                }
                metrics.queue_depth.set(queue.stats().depth as i64);
            }
            _ = resync.tick() => {
                // A full pass reads the declaration source again too, so a new declaration the
                // watcher missed (its directory's parent replaced, say) is applied by the resync.
                metrics.queue_adds.get_or_create(&vec![("source", "resync")]).inc();
                queue.add(Key::Full);
            }
            _ = term.recv() => { tracing::info!("SIGTERM: finishing the reconcile in flight, then stopping"); break }
            _ = int.recv() => { tracing::info!("SIGINT: finishing the reconcile in flight, then stopping"); break }
        }
    }
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    queue.shut_down();
    worker_task.await.context("the worker stopped abnormally")?;
    tracing::info!("stopped");
    Ok(())
}

/// A digest of a read of the declaration source: each file's name, length and bytes, or the
/// error. Two reads that digest the same found the same thing.
fn fingerprint(read: &std::io::Result<Vec<(PathBuf, Vec<u8>)>>) -> [u8; 32] {
    let mut h = sha2::Sha256::new();
    match read {
        Ok(files) => {
            for (path, bytes) in files {
                h.update(b"file\0");
                h.update(path.as_os_str().as_encoded_bytes());
                h.update(b"\0");
                h.update((bytes.len() as u64).to_le_bytes());
                h.update(bytes);
            }
        }
        Err(e) => {
            h.update(b"error\0");
            h.update(e.to_string().as_bytes());
        }
    }
    h.finalize().into()
}

/// What a panic said: its message, when it has one (`panic!` with a literal or a format).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic that carries no message".to_owned()
    }
}

/// `MESH_HOST_FAILPOINT=panic-reconcile` makes the first single-resource reconcile of the process
/// panic, once: the fault a test needs in order to show that a panic fails that resource and the
/// daemon goes on. The others (`system::fs::failpoint`) abort around the writes.
fn failpoint_panic_reconcile(id: &Id) {
    static FIRED: AtomicBool = AtomicBool::new(false);
    if crate::system::fs::failpoint_named("panic-reconcile") && !FIRED.swap(true, Ordering::Relaxed)
    {
        panic!("failpoint panic-reconcile: a panic in the reconcile of {id}");
    }
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl Worker {
    fn options(&self) -> Options {
        let kept = self.config.state.parent().unwrap_or(std::path::Path::new("/")).join("kept");
        Options {
            origin: self.config.origin,
            dry_run: false,
            kept,
            bus: self.config.bus.clone(),
            container_socket: self.config.container_socket.clone(),
            step_timeout: self.config.step_timeout,
            archive_limits: self.config.archive_limits,
        }
    }

    /// Reconciles one key, as `reconcile` does, and survives a panic in it: the key is failed
    /// with the panic's message, the panic is counted (`mesh_host_panics_total`), and the daemon
    /// goes on (issue 12, fault 10). A bug in one applier must not stop the agent from putting
    /// back everything else, nor leave it running with a dead worker.
    fn reconcile_guarded(&mut self, key: &Key, seen: Instant) -> Verdict {
        // `AssertUnwindSafe`: what a panic can leave half-done is the reconcile's own work. The
        // store records a resource only after its read-back, so a record is never ahead of the
        // machine; the declaration in force and the index are replaced whole; the locks are
        // taken through poisoning everywhere. The one piece of state kept across reconciles
        // that a panic could leave mid-protocol, the connections to systemd and the container
        // runtime, is dropped below and made again by the next reconcile that needs them.
        let payload =
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.reconcile(key, seen))) {
                Ok(verdict) => return verdict,
                Err(payload) => payload,
            };
        let message = panic_message(payload.as_ref());
        self.metrics.panics.inc();
        self.session = apply::Session::default();
        match key {
            Key::Resource(id) => tracing::error!(
                id = %id,
                "failed {id}: its reconcile panicked: {message}; it is retried after a backoff, and the daemon goes on"
            ),
            Key::Declaration | Key::Full => tracing::error!(
                key = %key,
                "the full pass ({key}) panicked: {message}; it is retried after a backoff, and the daemon goes on"
            ),
        }
        // The worker is alive: it finished this key, if badly.
        self.heartbeat.store(now_secs(), Ordering::Relaxed);
        Verdict::Failed
    }

    /// Reconciles one key and says how it went.
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
        let scope = if matches!(key, Key::Resource(_)) { "resource" } else { "full" };
        self.metrics
            .reconcile_duration
            .get_or_create(&vec![("scope", scope)])
            .observe(started.elapsed().as_secs_f64());
        let saved =
            if matches!(key, Key::Resource(_)) { self.store.save_changes() } else { self.store.save() };
        if let Err(e) = saved {
            tracing::error!(error = %e, "cannot write the state store; what was applied is on the machine but not recorded");
        }
        self.heartbeat.store(now_secs(), Ordering::Relaxed);
        verdict
    }

    /// Moves the declared bytes of files out of the heap into an unlinked file in the state
    /// directory (`system::contents`): the daemon holds them for months only to put back what
    /// drifts. Where that cannot be done, they stay in memory, which works the same.
    fn keep_contents_on_disk(&self, d: &mut Declaration) {
        let dir = self.config.state.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let held = |d: &Declaration| -> i64 {
            d.resources
                .iter()
                .map(|r| match &r.spec {
                    Spec::File(f) => {
                        f.content.as_ref().map_or(0, String::len) + f.bytes.as_ref().map_or(0, String::len)
                    }
                    _ => 0,
                })
                .sum::<usize>() as i64
        };
        let result = apply::keep_contents_on_disk(d, dir);
        let in_file = d.contents().map_or(0, |f| f.len() as i64);
        self.metrics.declared_content.get_or_create(&vec![("where", "file")]).set(in_file);
        self.metrics.declared_content.get_or_create(&vec![("where", "memory")]).set(held(d));
        match result {
            Ok((files, bytes)) => tracing::info!(
                files,
                bytes,
                directory = %dir.display(),
                "declared content kept in an unlinked file in the state directory"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                directory = %dir.display(),
                "cannot keep declared content in a file in the state directory; it is held in memory instead"
            ),
        }
    }

    /// Reads the declaration source and puts what it holds in force when it parses. With
    /// `force` false, a source that reads exactly as last time (the same files and bytes, or the
    /// same error) is left at that: a full pass costs a read and a digest, not a parse, and an
    /// unchanged bad declaration is not refused again at every resync.
    ///
    /// The source is read through `system::read_source`, never by plain opens: a FIFO or a
    /// device planted at the path or in the directory is refused at once and named, where an
    /// ordinary open would block the only worker for good, and `/dev/zero` cannot eat memory
    /// (issue 12, fault 2).
    fn load_declaration(&mut self, force: bool) {
        let source = &self.config.declaration;
        let read = crate::system::read_source(source);
        let seen = fingerprint(&read);
        if !force && self.source_seen == Some(seen) {
            return;
        }
        self.source_seen = Some(seen);
        let kept = if self.declaration.is_some() {
            "the declaration in force is kept"
        } else {
            "no declaration is in force"
        };
        let files = match read {
            Ok(files) => files,
            Err(e) => {
                self.metrics.declaration_refusals.inc();
                tracing::error!(source = %source.display(), "cannot read the declaration {}: {e}; {kept}", source.display());
                self.refused(format!("cannot read the declaration {}: {e}", source.display()));
                return;
            }
        };
        let named: Vec<(String, Vec<u8>)> =
            files.into_iter().map(|(p, b)| (p.display().to_string(), b)).collect();
        match Declaration::parse_sources(&named) {
            Ok(mut d) => {
                drop(named);
                tracing::info!(resources = d.resources.len(), "declaration accepted");
                *self.not_in_force.lock().unwrap_or_else(|e| e.into_inner()) = None;
                self.keep_contents_on_disk(&mut d);
                let d = Arc::new(d);
                let index = Index::new(&d);
                let units = index.units();
                *self.index.write().unwrap_or_else(|e| e.into_inner()) = index;
                let uses_containers = d.resources.iter().any(|r| match &r.spec {
                    Spec::Container(_) | Spec::Network(_) => true,
                    Spec::Action(a) => a.in_container.is_some(),
                    _ => false,
                });
                self.declaration = Some(Arc::clone(&d));
                self.in_force.send_replace(Some(d));
                if uses_containers && self.docker_watcher.is_none() {
                    self.docker_watcher = Some(mesh_host_watchers::docker::spawn(
                        self.config.container_socket.clone(),
                        self.tx.clone(),
                    ));
                }
                if !units.is_empty() && self.systemd_watcher.is_none() {
                    let rx = self.units.subscribe();
                    self.systemd_watcher = Some(mesh_host_watchers::systemd::spawn(
                        self.config.bus.clone(),
                        rx,
                        self.tx.clone(),
                    ));
                }
                self.units.send_replace(units);
            }
            Err(refused) => {
                // Refused whole, and the declaration in force stays in force: a half-written
                // file, or a bad one, must not undo a working machine.
                self.metrics.declaration_refusals.inc();
                tracing::error!("{refused}; {kept}");
                self.refused(refused.to_string());
            }
        }
    }

    /// Notes, for `/healthz`, why the source was refused, while no declaration is in force: the
    /// first line of the message, cut, since a refusal can list many problems.
    fn refused(&self, message: String) {
        if self.declaration.is_some() {
            return;
        }
        let mut line = message.lines().next().unwrap_or_default().to_owned();
        if line.len() > 300 {
            let mut end = 300;
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            line.truncate(end);
            line.push_str("...");
        }
        let why = format!(
            "{line}; the log says more, and a valid declaration written to {} is applied",
            self.config.declaration.display()
        );
        *self.not_in_force.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
    }

    fn full(&mut self) -> Verdict {
        let options = self.options();
        let Some(declaration) = self.declaration.as_deref() else {
            return Verdict::Settled;
        };
        let t = std::time::Instant::now();
        let (report, _) = apply::apply_in(&mut self.session, declaration, &mut self.store, &options);
        let pass = t.elapsed();
        self.account(&report, None, false);
        self.metrics.last_apply_timestamp.set(now_secs() as f64);
        self.metrics.last_apply_success.set(i64::from(report.error.is_none()));
        self.count_resources(&report);
        let t = std::time::Instant::now();
        self.watch_paths();
        tracing::debug!(
            pass_ms = pass.as_secs_f64() * 1e3,
            watch_ms = t.elapsed().as_secs_f64() * 1e3,
            "full pass"
        );
        if report.error.is_some() {
            Verdict::Failed
        } else {
            Verdict::Settled
        }
    }

    fn one(&mut self, id: &Id, seen: Instant) -> Verdict {
        let options = self.options();
        let Some(declaration) = self.declaration.as_deref() else {
            return Verdict::Settled;
        };
        if declaration.get(id).is_none() {
            // Undeclared since the key was queued: the full apply that followed handled it.
            return Verdict::Settled;
        }
        failpoint_panic_reconcile(id);
        let report = apply::reconcile_in(
            &mut self.session,
            declaration,
            std::slice::from_ref(id),
            &mut self.store,
            &options,
        );
        let quiet = self.quiet.contains(&Key::Resource(id.clone()));
        self.account(&report, Some(seen), quiet);
        if report.outcomes.iter().any(|o| o.action.moved()) {
            // A directory made again (by itself, or as a file's parent) needs its watch made
            // again; this looks only at directories whose watch was lost.
            for (dir, e) in self.files.rewatch() {
                tracing::debug!(directory = %dir.display(), error = %e, "cannot watch yet; the periodic resync covers it");
            }
        }
        match &report.error {
            // Someone wrote the file again between the host's write and its read-back: that is
            // a contest, held briefly and retried, not a failure whose backoff grows to minutes.
            Some(e) if e.failures.iter().all(|f| f.raced) => Verdict::Corrected,
            Some(_) => Verdict::Failed,
            None if report.outcomes.iter().any(|o| o.action == Action::Corrected && o.id == id.as_str()) => {
                Verdict::Corrected
            }
            None => Verdict::Settled,
        }
    }

    /// Metrics and one log line per change.
    fn account(&self, report: &Report, seen: Option<Instant>, quiet: bool) {
        for o in &report.outcomes {
            self.metrics
                .outcomes
                .get_or_create(&vec![("type", o.kind.as_str()), ("action", o.action.as_str())])
                .inc();
            if o.action == Action::Corrected {
                self.metrics.drift_corrections.get_or_create(&vec![("type", o.kind.as_str())]).inc();
                if let Some(seen) = seen {
                    self.metrics.correction_latency.observe(seen.elapsed().as_secs_f64());
                }
            }
            if o.action != Action::Unchanged {
                let detail = o.detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default();
                if quiet {
                    tracing::debug!(id = %o.id, r#type = %o.kind, action = %o.action, "{} {} ({}){detail}", o.action, o.id, o.target);
                } else {
                    tracing::info!(id = %o.id, r#type = %o.kind, action = %o.action, "{} {} ({}){detail}", o.action, o.id, o.target);
                }
            }
        }
        if let Some(e) = &report.error {
            for f in &e.failures {
                // A raced read-back is a contest in progress, which has its own log line.
                if quiet || f.raced {
                    tracing::debug!(id = %f.id, r#type = %f.kind, "failed {} ({}): {}", f.id, f.target, f.message);
                } else {
                    tracing::warn!(id = %f.id, r#type = %f.kind, "failed {} ({}): {}", f.id, f.target, f.message);
                }
            }
        }
    }

    fn count_resources(&self, report: &Report) {
        let Some(declaration) = self.declaration.as_deref() else { return };
        let failed: std::collections::HashSet<&str> =
            report.error.iter().flat_map(|e| e.failures.iter().map(|f| f.id.as_str())).collect();
        let held: std::collections::HashSet<&str> =
            report.outcomes.iter().filter(|o| o.action == Action::Held).map(|o| o.id.as_str()).collect();
        for kind in Kind::ALL {
            let mut counts = [0i64; 3];
            for r in declaration.resources.iter().filter(|r| r.kind() == kind) {
                let i = if failed.contains(r.id.as_str()) {
                    1
                } else if held.contains(r.id.as_str()) {
                    2
                } else {
                    0
                };
                counts[i] += 1;
            }
            for (state, n) in ["applied", "failed", "held"].into_iter().zip(counts) {
                self.metrics.resources.get_or_create(&vec![("type", kind.as_str()), ("state", state)]).set(n);
            }
        }
    }

    /// Points the file watcher at the managed paths of the declaration in force.
    fn watch_paths(&mut self) {
        let index = self.index.read().unwrap_or_else(|e| e.into_inner());
        for (dir, e) in self.files.set_paths(index.paths()) {
            tracing::debug!(directory = %dir.display(), error = %e, "cannot watch yet; the periodic resync covers it");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(resync: u64, step: Option<u64>) -> Config {
        Config {
            declaration: PathBuf::from("/etc/mesh-host/declaration.d"),
            state: PathBuf::from("/var/lib/mesh-host/state.json"),
            origin: Origin::Declared,
            metrics: None,
            resync: Duration::from_secs(resync),
            settle: Duration::from_millis(50),
            queue: queue::Config::default(),
            bus: None,
            container_socket: None,
            step_timeout: step.map(Duration::from_secs),
            archive_limits: crate::apply::ArchiveLimits::default(),
        }
    }

    #[test]
    fn a_worker_running_a_step_is_not_taken_for_stuck_before_the_step_limit() {
        assert_eq!(config(600, Some(3600)).stale_after(), Duration::from_secs(1200 + 3600));
        assert_eq!(
            config(10, Some(30)).stale_after(),
            Duration::from_secs(120 + 30),
            "resync counts as 60 s at least"
        );
        assert_eq!(config(600, None).stale_after(), Duration::from_secs(1200 + 86_400));
    }
}
