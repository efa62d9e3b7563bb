//! The scheduler of scheduled steps: containers with a `schedule` (5-field cron, UTC).
//!
//! An apply installs a step (records its schedule, makes sure its image is here) without
//! running it; this runs it at each fire. A failed run is a log line and a count in
//! `mesh_host_scheduled_runs_total{result="failed"}`, never a change to what an apply reported.
//! A step still running at its next fire is not started twice; that fire is skipped and said.
//! Only a step an apply installed at its current declaration is run: one whose install failed,
//! that sat behind a failed gate or that is held on an adopted node is not (a fire of it is said
//! and counted as `not_installed`).
//!
//! At shutdown the scheduler stops at once: no fire is started after it. A step already running
//! is a container under the runtime, not a child of the agent: it runs to its end, and its result
//! is neither logged nor counted (the agent is gone; docs/concurrency.md, "Shutdown").
//!
//! Why a fire is skipped, and why only an installed step runs (a backup must not run against a
//! store whose migration never passed): docs/decisions.md, "The daemon".

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::declaration::{Declaration, Id};
use crate::telemetry::events::ScheduledRun;
use crate::telemetry::{Event as _, Metrics};

/// Runs the scheduler until shutdown (or until the declaration channel closes).
pub fn spawn(
    in_force: watch::Receiver<Option<Arc<Declaration>>>,
    installed: watch::Receiver<Arc<HashMap<Id, String>>>,
    socket: Option<String>,
    limit: Option<Duration>,
    key: PathBuf,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = schedule(in_force, installed, socket, limit, key, metrics) => {}
        }
    })
}

async fn schedule(
    mut in_force: watch::Receiver<Option<Arc<Declaration>>>,
    installed: watch::Receiver<Arc<HashMap<Id, String>>>,
    socket: Option<String>,
    limit: Option<Duration>,
    // The node's key file: a step restarting on a file that carries a secret folds in its keyed
    // digest, so checking the step is installed at the declaration in force opens that value
    // (docs/decisions.md, "A step that restarts on a file carrying a secret").
    key: PathBuf,
    metrics: Arc<Metrics>,
) {
    // Steps running now: inserted here when a fire starts one, removed by its blocking task when
    // it ends; the lock is held only to insert or remove.
    let running: Arc<Mutex<HashSet<Id>>> = Arc::default();
    {
        loop {
            let declaration = in_force.borrow_and_update().clone();
            let now = SystemTime::now();
            // The next fire of every step, and the earliest of them.
            let next: Vec<(SystemTime, Id)> = declaration
                .iter()
                .flat_map(|d| d.scheduled_steps())
                .filter_map(|(id, cron)| crate::cron::next_fire(cron, now).map(|t| (t, id.clone())))
                .collect();
            let Some(&(earliest, _)) = next.iter().min_by_key(|(t, _)| *t) else {
                // Nothing scheduled: wait for another declaration.
                if in_force.changed().await.is_err() {
                    return;
                }
                continue;
            };
            let wait = earliest.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO);
            tokio::select! {
                changed = in_force.changed() => {
                    if changed.is_err() { return; }
                    continue;
                }
                _ = tokio::time::sleep(wait) => {}
            }
            let Some(declaration) = declaration else { continue };
            // Read at the fire, not when the wait began: the apply that installs a step may
            // have finished meanwhile.
            let installed_now = Arc::clone(&installed.borrow());
            for (_, id) in next.into_iter().filter(|(t, _)| *t == earliest) {
                let Some(spec) = installed_now.get(&id).cloned() else {
                    ScheduledRun::NotInstalled { id: id.as_str() }.emit(&metrics);
                    continue;
                };
                if !running.lock().unwrap_or_else(|e| e.into_inner()).insert(id.clone()) {
                    ScheduledRun::Skipped { id: id.as_str() }.emit(&metrics);
                    continue;
                }
                let (declaration, socket, metrics, running, key) = (
                    Arc::clone(&declaration),
                    socket.clone(),
                    Arc::clone(&metrics),
                    Arc::clone(&running),
                    key.clone(),
                );
                tokio::task::spawn_blocking(move || {
                    run_one(&declaration, &id, &spec, socket.as_deref(), limit, &key, &metrics, &running);
                });
            }
            // Sleep one second past the fire just taken: fires fall on whole minutes, so the
            // next look computes the following fire rather than this one again.
            let past = earliest + Duration::from_secs(1);
            if let Ok(d) = past.duration_since(SystemTime::now()) {
                tokio::time::sleep(d).await;
            }
        }
    }
}

/// Runs one scheduled step to its end, on a blocking thread, takes it out of `running`, and
/// says how it went. A panic in the run is caught here, as a reconcile's is in the worker: it
/// fails this run and is counted, and the step is no longer "running", so its next fire runs
/// (uncaught, it would be skipped as still running for ever).
#[allow(clippy::too_many_arguments, reason = "what one run needs, each from the scheduler's own state")]
fn run_one(
    declaration: &Declaration,
    id: &Id,
    spec: &str,
    socket: Option<&str>,
    limit: Option<Duration>,
    key: &std::path::Path,
    metrics: &Metrics,
    running: &Mutex<HashSet<Id>>,
) {
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        crate::apply::run_scheduled(declaration, id, Some(spec), socket, limit, key)
    }));
    running.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    let result = match ran {
        Ok(result) => result,
        Err(payload) => {
            let message = super::runner::panic_message(payload.as_ref());
            ScheduledRun::Panicked { id: id.as_str(), message: &message }.emit(metrics);
            return;
        }
    };
    match result {
        Ok(run) => ScheduledRun::Succeeded { id: id.as_str(), took: run.took }.emit(metrics),
        // Installed at an older declaration, and the new one not applied yet.
        Err(crate::apply::Error::StepNotInstalled { .. }) => {
            ScheduledRun::NotInstalled { id: id.as_str() }.emit(metrics)
        }
        Err(e) => ScheduledRun::Failed { id: id.as_str(), message: &e.to_string() }.emit(metrics),
    }
}
