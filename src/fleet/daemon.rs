//! The fleet's part of `mesh-host run`, started by the face beside the controller, never by it:
//! the etcd source (which writes the cache directory the controller reads as its declaration),
//! the node's status writer (which follows what the controller applied), and the reporter of
//! the declarations etcd holds that mesh-host refuses.
//!
//! The controller hands out what these need (its cancellation token, its metrics, the watch
//! channel of what it applied) between `controller::Daemon::start` and `run`, and stops and
//! awaits the tasks returned here with its own (ARCHITECTURE.md, "Invariants").

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::source::Source;
use crate::controller::Applied;
use crate::system::etcd::Etcd;
use crate::telemetry::{events, Event as _, Metrics};

/// How long the first apply waits for the first read of the declaration from etcd.
const FIRST_READ: Duration = Duration::from_secs(10);

/// What the fleet's tasks are given by the daemon that runs them.
pub struct Beside {
    /// The agent's cancellation token: every task here stops on it.
    pub shutdown: CancellationToken,
    /// The daemon's metrics, which a refusal is counted in.
    pub metrics: Arc<Metrics>,
    /// What the node applied, as the controller publishes it.
    pub applied: watch::Receiver<Applied>,
}

/// Starts the fleet's tasks (the etcd source writing `cache`, the node's status writer, the
/// refusals' reporter), and waits, bounded, for the source's first read, so that the first
/// apply is of what etcd holds now rather than of a stale cache. Returns the tasks, for the
/// daemon to stop and await.
///
/// The controller reads `cache` as it reads a local directory, and applies what it held last
/// while etcd is out of reach.
///
/// With a confirmation window (`confirm.window` not zero), each new generation the controller
/// applies from etcd is confirmed by a round trip to etcd, or gone back from (`confirm`).
pub async fn start(
    source: Source,
    etcd: Etcd,
    cache: PathBuf,
    confirm: super::confirm::Confirm,
    beside: Beside,
) -> Vec<JoinHandle<()>> {
    let Beside { shutdown, metrics, applied } = beside;
    let mut tasks = Vec::new();
    let etcd = Arc::new(etcd);
    // Whether etcd answered the node's last call (the source's reads, the status writer's
    // writes).
    let contact = Arc::new(watch::Sender::new(super::confirm::Contact::default()));
    // Started with the window off too: it says which generation the node will not go back
    // from (every one, then), which the status carries for the rollout's gate.
    if confirm.window.is_zero() {
        tracing::info!("the confirmation window is off (--confirm-window 0): a new generation from etcd is not confirmed");
    }
    // The window an earlier run recorded, honoured before the controller's first pass.
    let (window, kept) = super::confirm::prepare(&confirm, &source.node, &metrics).await;
    let (confirmed_tx, confirmed_rx) = watch::channel(kept);
    let priming = (!confirm.window.is_zero()).then(|| {
        Arc::new(super::source::Priming {
            file: Arc::clone(&confirm.file),
            generations: confirm.generations.clone(),
        })
    });
    let channels = super::confirm::Channels {
        applied: applied.clone(),
        contact: contact.subscribe(),
        confirmed: confirmed_tx,
    };
    tasks.push(tokio::spawn(super::confirm::run(
        confirm,
        window,
        Arc::clone(&etcd),
        source.node.clone(),
        channels,
        Arc::clone(&metrics),
        shutdown.clone(),
    )));
    let confirming = super::status::Confirming { contact: Arc::clone(&contact), confirmed: confirmed_rx };
    // Why the latest declaration in etcd was refused: written by the source, read by the
    // status writer (into the node's status) and by the reporter (counted and logged, as a
    // local refusal is).
    let (refused_tx, refused_rx) = watch::channel(None::<super::source::Refused>);
    tasks.push(tokio::spawn(super::status::run(
        Arc::clone(&etcd),
        source.node.clone(),
        source.groups.clone(),
        source.presence_ttl,
        applied,
        refused_rx.clone(),
        confirming,
        Arc::clone(&metrics),
        shutdown.clone(),
    )));
    tasks.push(tokio::spawn(report_refusals(refused_rx, Arc::clone(&metrics), shutdown.clone())));
    tracing::info!(endpoints = %source.endpoints, node = %source.node, groups = ?source.groups, "declaration from etcd");
    let (first_tx, first_rx) = tokio::sync::oneshot::channel();
    tasks.push(tokio::spawn(super::source::run(
        source, etcd, cache, first_tx, refused_tx, contact, priming, metrics, shutdown,
    )));
    // The first apply waits for the first read of etcd (it fails fast when etcd refuses
    // connections), bounded: a node must start even when etcd hangs, on its cache.
    if tokio::time::timeout(FIRST_READ, first_rx).await.is_err() {
        tracing::warn!(
            "no answer from etcd in {}: starting on the last declaration known",
            crate::system::human(FIRST_READ)
        );
    }
    tasks
}

/// Counts and logs each declaration refused in etcd, as a local refusal is counted and logged
/// (`mesh_host_declaration_refusals_total`), until shutdown.
async fn report_refusals(
    mut refused: watch::Receiver<Option<super::source::Refused>>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = refused.changed() => {
                if changed.is_err() {
                    return;
                }
                let why = refused.borrow_and_update().clone();
                let kept = "the declaration last accepted from etcd stays in force";
                match why {
                    Some(r) if r.reason == "invalid" => {
                        events::DeclarationRefused { message: &r.message, kept }.emit(&metrics)
                    }
                    Some(r) => {
                        events::DeclarationUntrusted { reason: r.reason, message: &r.message, kept }.emit(&metrics)
                    }
                    None => {}
                }
            }
        }
    }
}
