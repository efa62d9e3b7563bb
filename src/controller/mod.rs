//! `mesh-host run`: the controller. A full apply, then watch: watchers push keys into the work
//! queue, the worker drains it (short reconciles itself, up to `workers - 1` slow ones beside
//! it), each key reconciled and read back, metrics and one log line per change on the way.
//!
//! The stages, each in its own file, wired together by `Daemon` here:
//! - `trigger`: what a watcher's change means: a managed path is its resource's key, the
//!   declaration settling is the declaration key, a gap in what a watcher saw is a full resync.
//! - `queue`: de-duplication, the never-twice-at-once rule and the claims, backoff, the rate
//!   limit.
//! - `runner`: the loop that drains the queue: each key run inline or apart (at most `workers - 1`
//!   apart), what ended apart taken back, the queue told how each key ended, panics caught. It
//!   knows its reconciler only through the `Reconcile` trait, and is tested with a fake one.
//! - `worker`: the reconciler (`impl Reconcile for Worker`): the store's one owner, and what
//!   one reconcile does: the declaration loaded and put in force, a full pass, one key, what it
//!   did told, the watchers it starts.
//! - `claims`: what a key's reconcile claims, and whether it runs apart (pure).
//! - `report`: events, holds said once, counts, and `Applied`; who made each drift found on
//!   a thread of its own, so the next key never waits for fanotify or a container runtime.
//! - `watches`: the file watcher, fanotify's writers and the systemd, container and firewall
//!   watchers started when a declaration first needs them; the out-of-watches state.
//! - `source`: the declaration's source: read, digested, verified, parsed, refused or
//!   accepted, recorded as a generation, and chosen against the rollback hold (`choose`, pure).
//! - `scheduler`: scheduled steps at their fires.
//! - `health`: `/healthz` and systemd's watchdog.
//! - `contents`: declared content kept out of the heap.
//! - `signed`: with `--allowed-signers`, a declaration directory verified before it is parsed
//!   (`trust::verify`), and the high-water mark persisted before it is put in force.
//!
//! The daemon starts in two steps, so that what runs beside the controller (the fleet's tasks,
//! started by the face) starts at the right moment: `Daemon::start` takes the store's lock,
//! serves `/metrics` and hands out the cancellation token, the metrics and what was applied;
//! `Daemon::run` watches the declaration, applies it, and drains the queue until shutdown.
//!
//! Shutdown: one cancellation token. SIGTERM or SIGINT cancels it; the intake loop stops, the
//! queue is shut down, the worker finishes every reconcile in flight and writes the store, and
//! every task (scheduler, watchdog, HTTP, watchers, and the tasks handed to `run`) stops and is
//! awaited before `run` returns.
//!
//! Architecture Invariant: the controller knows nothing about how a resource is applied; it
//! calls `apply::apply` and `apply::reconcile` and reads their reports, and asks the
//! declaration (never matches on `Spec`) what it needs.
//!
//! Architecture Invariant: the controller knows nothing of etcd. Its declaration is a file or a
//! directory, whoever writes it; what it applied goes out on a watch channel (`Applied`), to
//! whoever follows it. `tests/tidy.rs` holds it to naming neither `fleet` nor `system::etcd`.

mod claims;
mod config;
pub(crate) mod contents;
pub mod drift;
mod health;
pub mod queue;
pub mod report;
mod runner;
mod scheduler;
pub mod signed;
mod source;
mod trigger;
mod watches;
mod worker;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use mesh_host_watchers::{source as source_watcher, Change, FileWatcher};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::Store;
use crate::telemetry::{events, Event as _, Metrics};
pub use config::Config;
use health::Health;
use queue::Queue;
pub use report::Applied;
pub use trigger::Key;
use worker::Worker;

/// The daemon, started and not yet applying: the store is locked, the file watcher, the worker
/// and the scheduler made, `/metrics` served. What runs beside the controller is started
/// between `start` and `run`, with the token, the metrics and the channel handed out here.
pub struct Daemon {
    config: Config,
    shutdown: CancellationToken,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    worker: Worker,
    /// The watchers' side of the changes' channel; `run` hands a clone to the declaration
    /// watcher, then drops it, so the channel closes when every watcher has gone.
    tx: mpsc::UnboundedSender<Change>,
    rx: mpsc::UnboundedReceiver<Change>,
    /// Every task started so far, stopped and awaited by `stop`.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Daemon {
    /// Starts everything but the first apply and the intake: signals first (a SIGTERM from here
    /// on stops the agent cleanly, after the first apply, which is not interrupted half way),
    /// then the store's lock, so that a second agent on the same state stops here, before
    /// anything beside it writes its declaration source.
    pub async fn start(config: Config) -> anyhow::Result<Daemon> {
        let shutdown = CancellationToken::new();
        let mut tasks = vec![signals(shutdown.clone())?];
        let metrics = Arc::new(daemon_metrics(&config));
        let health = Arc::new(Health::new(config.stale_after()));
        // The trust policy is read once, at start: its expiry for the gauge and `/healthz`.
        if let Some((version, expires)) = config.trust_policy {
            health.set_policy(version, expires);
            metrics.trust_policy_expires.get_or_create(&Vec::new()).set(expires as i64);
        }
        let store = Store::open(&config.state)?;
        // Unbounded, unlike mini-redis's channels: a watcher must never block on the agent
        // (inotify would overflow its queue meanwhile), and the intake loop drains it at once
        // into the queue, which de-duplicates, so it holds at most the changes of one wake-up
        // (docs/concurrency.md, "The queue").
        let (tx, rx) = mpsc::unbounded_channel::<Change>();
        // Without an inotify instance the daemon still runs: its resync covers every path and
        // tries again (the worker says so once the paths are known).
        let files = FileWatcher::new(tx.clone());
        events::WatcherState { watcher: "file", up: files.no_instance().is_none() }.emit(&metrics);
        let worker =
            Worker::new(config.clone(), store, files, Arc::clone(&metrics), Arc::clone(&health), tx.clone());
        tasks.push(scheduler::spawn(
            worker.in_force(),
            worker.installed_steps(),
            config.container_socket.clone(),
            config.step_timeout,
            config.key.clone(),
            Arc::clone(&metrics),
            shutdown.clone(),
        ));
        if let Some(addr) = config.metrics {
            tasks.push(serve_metrics(addr, config.web.clone(), &metrics, &health, &shutdown).await?);
        }
        Ok(Daemon { config, shutdown, metrics, health, worker, tx, rx, tasks })
    }

    /// The agent's one cancellation token: a task started beside the controller stops on it.
    pub fn shutdown(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// The daemon's metrics, for what runs beside the controller to emit its events into.
    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.metrics)
    }

    /// What the node has applied, updated by the worker only when it moves.
    pub fn applied(&self) -> tokio::sync::watch::Receiver<Applied> {
        self.worker.applied()
    }

    /// Runs the daemon until SIGTERM or SIGINT, then stops intake, lets the reconciles in
    /// flight finish, persists the store, stops every task (`beside` too, after the worker, as
    /// the controller's own) and returns.
    pub async fn run(self, beside: Vec<tokio::task::JoinHandle<()>>) -> anyhow::Result<()> {
        let Daemon { config, shutdown, metrics, health, mut worker, tx, rx, mut tasks } = self;
        tasks.extend(beside);
        // Watch before the first apply, so a change made during it is not missed; what the
        // watchers report meanwhile waits in the channel.
        // The rollback hold is watched as the source is, by the same watcher (one inotify
        // instance for both): made or removed, it is a change of what the daemon applies, read
        // with the source at once (`held`).
        let hold = crate::generations::Generations::of(&config.state).hold_path().to_owned();
        // A signed directory's manifest and signatures are watched too: signing after an edit
        // changes only them.
        let mut sources = vec![config.declaration.clone(), hold.clone()];
        if config.trust.is_some() {
            sources.push(config.declaration.join(crate::system::input::SIGNED_DIR));
        }
        tasks.push(source_watcher::spawn(sources, config.quiet, tx.clone()).with_context(|| {
            format!(
                "cannot watch the declaration {} and the rollback hold {}",
                config.declaration.display(),
                hold.display()
            )
        })?);
        drop(tx);
        first_apply(&mut worker, &config, &health, &shutdown);
        tasks.extend(health::watchdog(Arc::clone(&health), shutdown.clone()));

        let queue = Arc::new(Queue::<Key>::new(config.queue.clone()));
        let index = worker.index();
        let runner = runner::Runner::new(worker, Arc::clone(&queue), config.workers.saturating_sub(1));
        let worker_task = tokio::spawn(runner.run());
        intake(rx, &index, &queue, &metrics, config.resync, &shutdown).await;
        stop(&queue, worker_task, &shutdown, tasks).await
    }
}

/// The daemon's metrics, with every resource type, outcome word and change source known up
/// front, so that each labelled counter is exported at zero from the start.
fn daemon_metrics(config: &Config) -> Metrics {
    let types: Vec<&'static str> = crate::declaration::Kind::ALL.iter().map(|k| k.as_str()).collect();
    // `undecided` is said only by `plan`, never by a pass of the daemon's.
    let actions: Vec<&'static str> = crate::apply::Verb::ALL
        .iter()
        .filter(|v| **v != crate::apply::Verb::Undecided)
        .map(|v| v.as_str())
        .collect();
    let sources = trigger::Source::ALL.map(trigger::Source::as_str);
    let known = crate::telemetry::metrics::Known { types: &types, actions: &actions, sources: &sources };
    Metrics::for_daemon(&known, config.resync)
}

/// Serves `/metrics` and `/healthz` on `addr` until shutdown; the address it could not listen
/// on is the error, since an operator who asked for metrics must not get a daemon without.
async fn serve_metrics(
    addr: SocketAddr,
    web: Option<crate::telemetry::web::WebConfigFile>,
    metrics: &Arc<Metrics>,
    health: &Arc<Health>,
    shutdown: &CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let checked = Arc::clone(health);
    let check: crate::telemetry::http::Health = Arc::new(move || checked.check().map(|()| checked.note()));
    let (bound, task) =
        crate::telemetry::http::serve(addr, web, Arc::clone(metrics), check, shutdown.clone())
            .await
            .with_context(|| format!("cannot listen for metrics on {addr}"))?;
    tracing::info!(address = %bound, "serving /metrics and /healthz");
    Ok(task)
}

/// The first apply, then readiness: told to `/healthz` and to systemd, whose start timeout is
/// extended meanwhile (`extend_start_timeout`), since a large first apply outlasts its default.
///
/// The first apply comes before systemd hears we are ready. A declaration that cannot be read
/// or is refused leaves nothing in force: the agent runs, says so on /healthz, and applies the
/// first good declaration written to the source.
fn first_apply(worker: &mut Worker, config: &Config, health: &Health, shutdown: &CancellationToken) {
    let extending = extend_start_timeout(shutdown.child_token());
    runner::inline(worker, &Key::Declaration, Instant::now());
    extending.cancel();
    health.ready();
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    tracing::info!(declaration = %config.declaration.display(), "mesh-host is running");
}

/// Intake: changes to keys, and the periodic resync, until shutdown (or until every sender of
/// changes is gone). Each change is turned into keys against the worker's index and added to
/// the queue, which de-duplicates them; the queue's depth is exported after each.
async fn intake(
    mut rx: mpsc::UnboundedReceiver<Change>,
    index: &std::sync::RwLock<trigger::Index>,
    queue: &Queue<Key>,
    metrics: &Metrics,
    every: Duration,
    shutdown: &CancellationToken,
) {
    let mut resync = tokio::time::interval_at(Instant::now() + every, every);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            change = rx.recv() => {
                let Some(change) = change else { break };
                let added = {
                    let index = index.read().unwrap_or_else(|e| e.into_inner());
                    trigger::keys(&change, &index)
                };
                if let Change::Up { watcher, up } = change {
                    events::WatcherState { watcher: watcher.as_str(), up }.emit(metrics);
                }
                for (key, source) in added {
                    events::KeyQueued { source: source.as_str() }.emit(metrics);
                    queue.add(key);
                }
                events::QueueDepth(queue.stats().depth).emit(metrics);
            }
            _ = resync.tick() => {
                // A full pass reads the declaration source again too, so a new declaration the
                // watcher missed (its directory's parent replaced, say) is applied by the resync.
                events::KeyQueued { source: trigger::Source::Resync.as_str() }.emit(metrics);
                queue.add(Key::Full);
            }
        }
    }
}

/// The orderly stop, once intake has ended: systemd told, the queue shut down, the worker
/// awaited, then every other task cancelled and awaited.
async fn stop(
    queue: &Queue<Key>,
    worker_task: tokio::task::JoinHandle<()>,
    shutdown: &CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<()> {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    queue.shut_down();
    // Every reconcile in flight finishes (an action in one runs to its end or its step limit), then
    // the store is written and the watchers the worker started are stopped.
    worker_task.await.context("the worker stopped abnormally")?;
    shutdown.cancel();
    for task in tasks {
        // The declaration watcher has no other way out; the rest have seen the token.
        task.abort();
        let _ = task.await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// How often systemd is asked for more start time during the first apply, and how much each
/// time: a margin of three periods, so one late tick does not fail the start.
const EXTEND_EVERY: Duration = Duration::from_secs(10);
const EXTEND_BY: Duration = Duration::from_secs(30);

/// Keeps extending systemd's start timeout (`EXTEND_TIMEOUT_USEC`) until the returned token is
/// cancelled: the first apply runs before READY, and 10,000 resources with image pulls take
/// longer than the default 90 s, after which systemd would kill the agent and start it again,
/// into the same long apply. Each extension is only `EXTEND_BY` from now, so an agent whose
/// runtime stalls still times out; a step that hangs inside the apply is bounded by its own
/// limit (`--step-timeout`), not by this. Nothing when not under systemd.
fn extend_start_timeout(token: CancellationToken) -> CancellationToken {
    let stop = token.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EXTEND_EVERY);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {
                    let usec = u32::try_from(EXTEND_BY.as_micros()).unwrap_or(u32::MAX);
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::ExtendTimeoutUsec(usec)]);
                }
            }
        }
    });
    token
}

/// Cancels `shutdown` on the first SIGTERM or SIGINT.
fn signals(shutdown: CancellationToken) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::spawn(async move {
        let name = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!("{name}: finishing the reconciles in flight, then stopping");
        shutdown.cancel();
    }))
}
