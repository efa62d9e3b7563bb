//! Typed events, in the way of vector's internal events: one struct for each thing the agent
//! says, whose `emit` writes the log line and moves its metrics together. A log line and the
//! counter beside it cannot disagree, and every metric the daemon moves is moved here.
//!
//! The events carry plain values (ids, words, durations), not the engine's types: telemetry
//! knows nothing of how a resource is applied.

use std::time::Duration;

use super::Metrics;

/// Something the agent says, and counts.
pub trait Event {
    /// Writes the event's log line, if it has one, and moves its metrics.
    fn emit(self, metrics: &Metrics);
}

/// One resource's outcome in a pass: counted by type and action; a correction also in the drift
/// counter and, when the change that caused it was seen, the correction latency. Anything but
/// `unchanged` is logged, at debug level while the resource is contested or failing.
pub struct ResourceChanged<'a> {
    /// The resource's id.
    pub id: &'a str,
    /// The resource's type, as the declaration spells it.
    pub kind: &'static str,
    /// What it names on the machine: a path, a unit, a name, a port.
    pub target: &'a str,
    /// The outcome word (`created`, `corrected`, ...).
    pub action: &'static str,
    /// What a person is told beside the word, if anything: for a correction, who made the
    /// change too (`...; by sed (pid 7, ...)`).
    pub detail: Option<&'a str>,
    /// From the change seen on the machine to now, for a correction the daemon was woken for.
    pub since_seen: Option<Duration>,
    /// Log at debug level: the resource is contested or was failing.
    pub quiet: bool,
    /// For a correction, who made the change it put back, when fanotify saw it.
    pub by: Option<By<'a>>,
}

/// Who made a change a correction put back: plain values, as fanotify and `/proc` gave them.
#[derive(Clone, Copy, Debug, Default)]
pub struct By<'a> {
    /// The kind of writer, the drift counter's `writer` label: `session`, `unit`,
    /// `container` or `unknown`.
    pub kind: &'static str,
    /// Its pid.
    pub pid: Option<i32>,
    /// Its command name.
    pub comm: Option<&'a str>,
    /// Its executable.
    pub exe: Option<&'a str>,
    /// Its effective uid.
    pub uid: Option<u32>,
    /// That uid's name.
    pub user: Option<&'a str>,
    /// The systemd unit it ran in.
    pub unit: Option<&'a str>,
    /// The container it ran in.
    pub container: Option<&'a str>,
    /// Its audit login uid.
    pub loginuid: Option<u32>,
    /// Its audit session id.
    pub session: Option<u32>,
    /// It had exited before it was looked at.
    pub exited: bool,
    /// What the event said it changed: `content`, `attributes`, `entry`.
    pub moved: Option<&'a str>,
}

impl Event for ResourceChanged<'_> {
    fn emit(self, m: &Metrics) {
        m.outcomes.get_or_create(&vec![("type", self.kind), ("action", self.action)]).inc();
        if self.action == "corrected" {
            let writer = self.by.map_or("unknown", |b| b.kind);
            m.drift_corrections.get_or_create(&vec![("type", self.kind), ("writer", writer)]).inc();
            if let Some(latency) = self.since_seen {
                m.correction_latency.observe(latency.as_secs_f64());
            }
        }
        if self.action == "unchanged" {
            return;
        }
        let (id, kind, target, action) = (self.id, self.kind, self.target, self.action);
        let detail = self.detail.map(|d| format!(": {d}")).unwrap_or_default();
        if let Some(b) = self.by.filter(|_| action == "corrected") {
            // The detail already names the writer in words; these are its fields, for
            // `--log-json`.
            let (pid, comm, exe, uid, user, unit) = (b.pid, b.comm, b.exe, b.uid, b.user, b.unit);
            let (container, loginuid, session, exited, moved) =
                (b.container, b.loginuid, b.session, b.exited, b.moved);
            if self.quiet {
                tracing::debug!(
                    id,
                    r#type = kind,
                    action,
                    by = b.kind,
                    pid,
                    comm,
                    exe,
                    uid,
                    user,
                    loginuid,
                    session,
                    unit,
                    container,
                    exited,
                    moved,
                    "{action} {id} ({target}){detail}"
                );
            } else {
                tracing::info!(
                    id,
                    r#type = kind,
                    action,
                    by = b.kind,
                    pid,
                    comm,
                    exe,
                    uid,
                    user,
                    loginuid,
                    session,
                    unit,
                    container,
                    exited,
                    moved,
                    "{action} {id} ({target}){detail}"
                );
            }
            return;
        }
        if self.quiet {
            tracing::debug!(id, r#type = kind, action, "{action} {id} ({target}){detail}");
        } else {
            tracing::info!(id, r#type = kind, action, "{action} {id} ({target}){detail}");
        }
    }
}

/// A resource that failed in a pass: counted by type, logged as a warning (at debug level while
/// it is contested or already failing, and when the read-back raced another writer, which is
/// a contest with a line of its own).
pub struct ResourceFailed<'a> {
    /// The resource's id.
    pub id: &'a str,
    /// The resource's type, as the declaration spells it.
    pub kind: &'static str,
    /// What it names on the machine.
    pub target: &'a str,
    /// Why it failed, as the report says it.
    pub message: &'a str,
    /// Log at debug level: contested, already failing, or a raced read-back.
    pub quiet: bool,
}

impl Event for ResourceFailed<'_> {
    fn emit(self, m: &Metrics) {
        m.failures.get_or_create(&vec![("type", self.kind)]).inc();
        let (id, kind, target, message) = (self.id, self.kind, self.target, self.message);
        if self.quiet {
            tracing::debug!(id, r#type = kind, "failed {id} ({target}): {message}");
        } else {
            tracing::warn!(id, r#type = kind, "failed {id} ({target}): {message}");
        }
    }
}

/// A key something keeps changing back: its corrections now back off.
pub struct ContestBegan<'a> {
    /// The queue key, which names the resource.
    pub key: &'a str,
    /// How long its next correction waits.
    pub wait: Duration,
}

impl Event for ContestBegan<'_> {
    fn emit(self, _: &Metrics) {
        let key = self.key;
        tracing::warn!(key, wait_ms = self.wait.as_millis() as u64, "contested: something keeps changing {key} back; its corrections now back off, and are logged at debug level until it settles");
    }
}

/// A contested key that settled.
pub struct ContestEnded<'a> {
    /// The queue key, which names the resource.
    pub key: &'a str,
}

impl Event for ContestEnded<'_> {
    fn emit(self, _: &Metrics) {
        let key = self.key;
        tracing::info!(key, "{key} is no longer contested");
    }
}

/// A key that had failed reconciled again.
pub struct Recovered<'a> {
    /// The queue key, which names the resource.
    pub key: &'a str,
}

impl Event for Recovered<'_> {
    fn emit(self, _: &Metrics) {
        let key = self.key;
        tracing::info!(key, "{key} reconciled again");
    }
}

/// The work queue as it stands after a reconcile.
pub struct QueueSampled {
    /// Keys waiting in the queue.
    pub depth: usize,
    /// Keys being reconciled now (inline and apart).
    pub processing: usize,
    /// Keys held back by a failure or a contest.
    pub backing_off: usize,
    /// Keys held off because something keeps changing them back.
    pub contested: usize,
    /// The reconcile just finished failed, and its key will be retried.
    pub retrying: bool,
}

impl Event for QueueSampled {
    fn emit(self, m: &Metrics) {
        if self.retrying {
            m.queue_retries.inc();
        }
        m.queue_depth.set(self.depth as i64);
        m.queue_processing.set(self.processing as i64);
        m.queue_backing_off.set(self.backing_off as i64);
        m.contested.set(self.contested as i64);
    }
}

/// Keys added to the queue by a watcher's change or the resync.
pub struct KeyQueued {
    /// What queued them: a watcher's name, or the resync.
    pub source: &'static str,
}

impl Event for KeyQueued {
    fn emit(self, m: &Metrics) {
        m.queue_adds.get_or_create(&vec![("source", self.source)]).inc();
    }
}

/// The queue's depth after keys were added.
pub struct QueueDepth(pub usize);

impl Event for QueueDepth {
    fn emit(self, m: &Metrics) {
        m.queue_depth.set(self.0 as i64);
    }
}

/// A watcher connected or lost its source (the runtime's events, systemd's signals).
pub struct WatcherState {
    /// The watcher's name.
    pub watcher: &'static str,
    /// Whether it is connected now.
    pub up: bool,
}

impl Event for WatcherState {
    fn emit(self, m: &Metrics) {
        let gauge = m.watcher_up.get_or_create(&vec![("watcher", self.watcher)]);
        let was = gauge.get();
        gauge.set(i64::from(self.up));
        let watcher = self.watcher;
        match (was == 1, self.up) {
            (false, true) => tracing::info!(watcher, "the {watcher} watcher is up"),
            (true, false) => tracing::warn!(
                watcher,
                "the {watcher} watcher is down; it reconnects, and resyncs when it is back"
            ),
            _ => {}
        }
    }
}

/// A declaration accepted and put in force.
pub struct DeclarationAccepted {
    /// How many resources it declares.
    pub resources: usize,
}

impl Event for DeclarationAccepted {
    fn emit(self, _: &Metrics) {
        tracing::info!(resources = self.resources, "declaration accepted");
    }
}

/// The declaration source does not exist (yet): waited for, and not counted as a refusal (a
/// fresh install is not an incident). Said once when it goes missing.
pub struct DeclarationAwaited<'a> {
    /// The declaration file or directory the daemon was pointed at.
    pub source: &'a str,
    /// "does not exist yet", or "holds no *.json file yet".
    pub what: &'a str,
    /// "the declaration in force is kept", or "no declaration is in force".
    pub kept: &'a str,
}

impl Event for DeclarationAwaited<'_> {
    fn emit(self, _: &Metrics) {
        let source = self.source;
        tracing::warn!(
            source,
            "waiting for the declaration: {source} {}; {}, and a declaration written there is applied",
            self.what,
            self.kept
        );
    }
}

/// A declaration refused whole (or that could not be read): the one in force, if any, stays.
pub struct DeclarationRefused<'a> {
    /// Why it was refused, as the parser says it.
    pub message: &'a str,
    /// "the declaration in force is kept", or "no declaration is in force".
    pub kept: &'a str,
}

impl Event for DeclarationRefused<'_> {
    fn emit(self, m: &Metrics) {
        m.declaration_refusals.get_or_create(&vec![("reason", "invalid")]).inc();
        tracing::error!("{}; {}", self.message, self.kept);
    }
}

/// A signed declaration refused before it was parsed (`trust::verify`): the one in force, if
/// any, stays, and nothing on the machine is touched.
pub struct DeclarationUntrusted<'a> {
    /// `signature`, `scope`, `rollback`, `expired` or `contents` (`trust::Reason::label`).
    pub reason: &'static str,
    /// Why, naming the scope and, where one is at fault, the file.
    pub message: &'a str,
    /// "the declaration in force is kept", or "no declaration is in force".
    pub kept: &'a str,
}

impl Event for DeclarationUntrusted<'_> {
    fn emit(self, m: &Metrics) {
        m.declaration_refusals.get_or_create(&vec![("reason", self.reason)]).inc();
        tracing::error!(reason = self.reason, "signed declaration refused: {}; {}", self.message, self.kept);
    }
}

/// The declaration in force refused whole on this machine, or no longer: a firewall found in
/// force on an adopted node that the host cannot manage. Said when the refusal begins and when
/// it ends, not at every pass that finds it still standing.
pub enum RefusedHere<'a> {
    /// A full pass refused the declaration: nothing of it is applied until one no longer does.
    Began {
        /// Why, as the pass says it (what was found).
        message: &'a str,
    },
    /// A full pass no longer refuses it: it was applied.
    Ended,
}

impl Event for RefusedHere<'_> {
    fn emit(self, m: &Metrics) {
        match self {
            RefusedHere::Began { message } => {
                m.declaration_refusals.get_or_create(&vec![("reason", "machine")]).inc();
                m.declaration_refused.set(1);
                tracing::error!(
                    "{message}; until that changes nothing of the declaration is applied, by a full pass or by a reconcile of one change, and it is looked at again at each resync and whenever the ruleset changes"
                );
            }
            RefusedHere::Ended => {
                m.declaration_refused.set(0);
                tracing::info!("the declaration is no longer refused on this machine: it was applied");
            }
        }
    }
}

/// A declaration the daemon accepted was recorded as a new generation.
pub struct GenerationRecorded<'a> {
    /// Its number.
    pub number: u64,
    /// Where it came from.
    pub source: &'a str,
}

impl Event for GenerationRecorded<'_> {
    fn emit(self, _: &Metrics) {
        tracing::info!(
            generation = self.number,
            source = self.source,
            "recorded as generation {}",
            self.number
        );
    }
}

/// The generation put in force: the gauges of the generation and of the hold.
pub struct GenerationInForce {
    /// Its number, when it could be recorded.
    pub number: Option<u64>,
    /// Whether a rollback holds it.
    pub held: bool,
    /// Whether the hold is one the node made itself (it went back from a generation that cut it
    /// off from its source).
    pub reverted: bool,
}

impl Event for GenerationInForce {
    fn emit(self, m: &Metrics) {
        m.generation.set(self.number.map_or(0, |n| i64::try_from(n).unwrap_or(i64::MAX)));
        m.generation_held.set(i64::from(self.held));
        m.reverted.set(i64::from(self.reverted));
    }
}

/// A rollback's hold put its generation in force instead of the source's declaration.
pub struct GenerationHeld<'a> {
    /// The generation held.
    pub generation: u64,
    /// How the hold is said (`/healthz`'s words).
    pub how: &'a str,
    /// The kept generation the source holds, when it is another one.
    pub source: Option<u64>,
}

impl Event for GenerationHeld<'_> {
    fn emit(self, _: &Metrics) {
        let generation = self.generation;
        match self.source {
            Some(s) => tracing::warn!(
                generation,
                source_generation = s,
                "{}; the source holds generation {s}, not applied while the hold stands",
                self.how
            ),
            None => tracing::warn!(generation, "{}", self.how),
        }
    }
}

/// A rollback's hold ended.
pub struct GenerationReleased<'a> {
    /// The generation that was held.
    pub generation: u64,
    /// What ended it.
    pub by: &'a str,
}

impl Event for GenerationReleased<'_> {
    fn emit(self, _: &Metrics) {
        tracing::info!(
            generation = self.generation,
            "the hold at generation {} is released by {}",
            self.generation,
            self.by
        );
    }
}

/// A resource the daemon had been reporting `held` is no longer held: its module was taken,
/// or it is no longer declared. Said once; the hold itself is said once, when it begins (the
/// outcome of the pass that first holds it), not at every pass.
pub struct HoldEnded<'a> {
    /// The resource's id.
    pub id: &'a str,
}

impl Event for HoldEnded<'_> {
    fn emit(self, _: &Metrics) {
        let id = self.id;
        tracing::info!(id, "no longer held: {id} (its module was taken, or it is no longer declared)");
    }
}

/// What the fleet's etcd source saw: etcd reached or not (the `mesh_host_etcd_up` gauge, and a
/// line once each way), a declaration accepted or not cached, the watch moving on. Plain values,
/// as every event's: telemetry knows nothing of etcd.
pub enum FleetSource<'a> {
    /// A read of the declaration failed: the node converges on the last one known. `first` is
    /// true for the first failure after a success (or at start): only that one is said.
    Unreachable {
        /// The node's name.
        node: &'a str,
        /// Why, as the etcd client says it.
        error: &'a dyn std::fmt::Display,
        /// The first failure since etcd last answered.
        first: bool,
        /// etcd refused the node's client certificate.
        certificate_refused: bool,
    },
    /// A read succeeded; `again` when the one before had failed (then it is said).
    Reached {
        /// The node's name.
        node: &'a str,
        /// The revision read at.
        revision: i64,
        /// etcd had not answered before this.
        again: bool,
    },
    /// A new declaration was read from etcd, parsed and written to the cache.
    Accepted {
        /// The node's name.
        node: &'a str,
        /// The revision read at.
        revision: i64,
        /// How many resources, from how many keys.
        resources: usize,
        /// How many keys it was read from.
        keys: usize,
    },
    /// A declaration read could not be written to the cache directory: the one in force stays.
    NotCached {
        /// The node's name.
        node: &'a str,
        /// The revision read at.
        revision: i64,
        /// The cache directory.
        cache: &'a std::path::Path,
        /// Why.
        error: &'a dyn std::fmt::Display,
    },
    /// A watched prefix changed at `revision`: read again.
    Changed {
        /// The node's name.
        node: &'a str,
        /// The revision of the change.
        revision: i64,
    },
    /// etcd's progress notice: the watch is alive and has delivered every change up to
    /// `revision`.
    Progress {
        /// The node's name.
        node: &'a str,
        /// The revision every change up to has been delivered.
        revision: i64,
    },
    /// The revision to watch from was compacted away: the whole declaration is read again.
    Compacted {
        /// The node's name.
        node: &'a str,
        /// The revision compacted.
        at: i64,
    },
    /// A watch ended with an error: the whole declaration is read again.
    WatchEnded {
        /// The node's name.
        node: &'a str,
        /// Why, as the etcd client says it.
        error: &'a dyn std::fmt::Display,
    },
}

impl Event for FleetSource<'_> {
    fn emit(self, m: &Metrics) {
        match self {
            FleetSource::Unreachable { node, error, first, certificate_refused } => {
                m.etcd_up.get_or_create(&Vec::new()).set(0);
                let refused = m.etcd_certificate_refused.get_or_create(&Vec::new());
                // Said once when it starts, whatever failed before it: the operator's action.
                if certificate_refused && refused.get() == 0 && !first {
                    tracing::error!(node = %node, "etcd refuses this node's client certificate: {error}; converging on the last declaration known, trying again with the files as they are then");
                } else if certificate_refused && first {
                    tracing::error!(node = %node, "cannot read the declaration from etcd, which refuses this node's client certificate: {error}; converging on the last one known, trying again with the files as they are then");
                }
                refused.set(i64::from(certificate_refused));
                if first && !certificate_refused {
                    tracing::warn!(node = %node, "cannot read the declaration from etcd: {error}; converging on the last one known, trying again");
                }
            }
            FleetSource::Reached { node, revision, again } => {
                m.etcd_up.get_or_create(&Vec::new()).set(1);
                m.etcd_certificate_refused.get_or_create(&Vec::new()).set(0);
                if again {
                    tracing::info!(node = %node, revision, "etcd answers again; read its declaration at revision {revision}");
                }
            }
            FleetSource::Accepted { node, revision, resources, keys } => tracing::info!(
                node = %node,
                revision,
                resources,
                keys,
                "declaration from etcd accepted at revision {revision}: {resources} resources from {keys} keys"
            ),
            FleetSource::NotCached { node, revision, cache, error } => tracing::error!(
                node = %node,
                revision,
                "cannot write the declaration from etcd to {}: {error}; the declaration in force stays",
                cache.display()
            ),
            FleetSource::Changed { node, revision } => {
                tracing::debug!(node = %node, revision, "etcd: the declaration changed")
            }
            FleetSource::Progress { node, revision } => {
                m.etcd_watch_revision.get_or_create(&Vec::new()).set(revision);
                tracing::debug!(node = %node, revision, "etcd: the watch is alive, every change up to revision {revision} delivered");
            }
            FleetSource::Compacted { node, at } => {
                tracing::info!(node = %node, "etcd compacted revision {at} away; reading the whole declaration again")
            }
            FleetSource::WatchEnded { node, error } => {
                tracing::warn!(node = %node, "the watch on etcd ended: {error}; reading the whole declaration again")
            }
        }
    }
}

/// What the fleet's status writer could not do: each is tried again (the status at the next
/// change or turn, the presence at the next keepalive), so only a status that cannot be encoded
/// is a warning. Plain values, as every event's: telemetry knows nothing of etcd.
pub enum FleetStatus<'a> {
    /// The presence lease could not be renewed: kept, and renewed at the next tick.
    LeaseNotRenewed {
        /// The node's name.
        node: &'a str,
        /// Why, as the etcd client says it.
        error: &'a dyn std::fmt::Display,
    },
    /// A presence lease was taken but the presence key could not be written under it.
    PresenceNotWritten {
        /// The node's name.
        node: &'a str,
        /// Why, as the etcd client says it.
        error: &'a dyn std::fmt::Display,
    },
    /// No presence lease could be taken.
    LeaseNotTaken {
        /// The node's name.
        node: &'a str,
        /// Why, as the etcd client says it.
        error: &'a dyn std::fmt::Display,
    },
    /// The status could not be encoded as JSON: not written.
    NotEncoded {
        /// The node's name.
        node: &'a str,
        /// Why, as the encoder says it.
        error: &'a dyn std::fmt::Display,
    },
    /// The status could not be written to etcd: written again at the next change.
    NotWritten {
        /// The node's name.
        node: &'a str,
        /// Why, as the etcd client says it.
        error: &'a dyn std::fmt::Display,
    },
}

impl Event for FleetStatus<'_> {
    fn emit(self, _: &Metrics) {
        match self {
            FleetStatus::LeaseNotRenewed { node, error } => {
                tracing::debug!(node = %node, "cannot renew the presence lease: {error}")
            }
            FleetStatus::PresenceNotWritten { node, error } => {
                tracing::debug!(node = %node, "cannot write the presence key: {error}")
            }
            FleetStatus::LeaseNotTaken { node, error } => {
                tracing::debug!(node = %node, "cannot take a presence lease: {error}")
            }
            FleetStatus::NotEncoded { node, error } => {
                tracing::warn!(node = %node, "cannot write the status: {error}")
            }
            FleetStatus::NotWritten { node, error } => tracing::debug!(
                node = %node,
                "cannot write the status to etcd: {error}; the next change tries again"
            ),
        }
    }
}

/// The fleet's confirmation window (`fleet::confirm`): a new generation from etcd confirmed by
/// an etcd round trip, or gone back from. Plain values: telemetry knows nothing of etcd.
pub enum FleetConfirm<'a> {
    /// A window opened for a new generation.
    Armed {
        /// The node's name.
        node: &'a str,
        /// The new generation.
        generation: u64,
        /// The one gone back to if it is not confirmed.
        previous: u64,
        /// The revision it was read at.
        revision: i64,
        /// The window, as said (`60 s`).
        within: &'a str,
    },
    /// A new generation applied with no window, and why.
    NotArmed {
        /// The node's name.
        node: &'a str,
        /// The generation.
        generation: u64,
        /// Why.
        why: &'a str,
    },
    /// The round trip came in time.
    Confirmed {
        /// The node's name.
        node: &'a str,
        /// The generation confirmed.
        generation: u64,
        /// Its revision.
        revision: i64,
    },
    /// A hold came while the window was open, or the rollout whose candidate it watched
    /// ended for the node: it closes.
    Cancelled {
        /// The node's name.
        node: &'a str,
        /// The generation whose window closed.
        generation: u64,
        /// Why (`a rollback's hold came: the hold decides`).
        why: &'a str,
    },
    /// The window closed unconfirmed: the node goes back by itself (counted).
    Reverted {
        /// The node's name.
        node: &'a str,
        /// The generation gone back from.
        from: u64,
        /// The generation gone back to.
        to: u64,
        /// The revision of `from`.
        revision: i64,
        /// Why, as the hold says it.
        reason: &'a str,
    },
    /// The window closed unconfirmed, and the hold could not be written.
    NotReverted {
        /// The node's name.
        node: &'a str,
        /// The generation that stays.
        generation: u64,
        /// Why.
        error: &'a dyn std::fmt::Display,
    },
}

impl Event for FleetConfirm<'_> {
    fn emit(self, m: &Metrics) {
        match self {
            FleetConfirm::Armed { node, generation, previous, revision, within } => tracing::info!(
                node = %node,
                generation,
                revision,
                "generation {generation} (revision {revision}) applied: confirming it by a round trip to etcd on a new connection within {within}, or going back to generation {previous}"
            ),
            FleetConfirm::NotArmed { node, generation, why } => {
                tracing::info!(node = %node, generation, "generation {generation} is not confirmed by etcd: {why}")
            }
            FleetConfirm::Confirmed { node, generation, revision } => tracing::info!(
                node = %node,
                generation,
                revision,
                "generation {generation} (revision {revision}) confirmed: etcd answered a read on a new connection"
            ),
            FleetConfirm::Cancelled { node, generation, why } => tracing::info!(
                node = %node,
                generation,
                "generation {generation} no longer waits for confirmation: {why}"
            ),
            FleetConfirm::Reverted { node, from, to, revision, reason } => {
                m.reverts.inc();
                tracing::error!(
                    node = %node,
                    generation = from,
                    revision,
                    reverted_to = to,
                    "going back to generation {to} by itself: {reason}; held there until a newer declaration or `mesh-host rollback --release`"
                )
            }
            FleetConfirm::NotReverted { node, generation, error } => tracing::error!(
                node = %node,
                generation,
                "generation {generation} was not confirmed by etcd in time, and the node cannot go back: {error}"
            ),
        }
    }
}

/// The state store could not be written after a reconcile or on the way out: what was applied
/// is on the machine, but the store does not say so; the next pass reads it from the machine.
pub struct StoreNotWritten<'a> {
    /// Why, as the store says it (the path and the system's error).
    pub error: &'a dyn std::fmt::Display,
    /// When: "after a reconcile", "on the way out".
    pub when: &'a str,
}

impl Event for StoreNotWritten<'_> {
    fn emit(self, m: &Metrics) {
        m.store_write_failures.inc();
        tracing::error!(
            error = %self.error,
            "cannot write the state store {}: {}; what was applied is on the machine but not recorded",
            self.when,
            self.error
        );
    }
}

/// A reconcile run apart from the worker whose thread was lost (the runtime going away): its
/// key fails, and its copy of the store with it; what it did is read from the machine next time.
pub struct ReconcileLost<'a> {
    /// The key it ran, when known.
    pub key: Option<&'a str>,
    /// The join error.
    pub error: &'a dyn std::fmt::Display,
}

impl Event for ReconcileLost<'_> {
    fn emit(self, m: &Metrics) {
        m.panics.inc();
        match self.key {
            Some(key) => tracing::error!(key, error = %self.error, "a reconcile run apart was lost"),
            None => tracing::error!(error = %self.error, "a reconcile run apart was lost"),
        }
    }
}

/// A reconcile that panicked: its key failed, and the daemon goes on.
pub struct ReconcilePanicked<'a> {
    /// The resource's id, or `None` for a full pass.
    pub id: Option<&'a str>,
    /// The queue key of the reconcile.
    pub key: &'a str,
    /// The panic's message.
    pub message: &'a str,
}

impl Event for ReconcilePanicked<'_> {
    fn emit(self, m: &Metrics) {
        m.panics.inc();
        let (key, message) = (self.key, self.message);
        match self.id {
            Some(id) => tracing::error!(
                id,
                "failed {id}: its reconcile panicked: {message}; it is retried after a backoff, and the daemon goes on"
            ),
            None => tracing::error!(
                key,
                "the full pass ({key}) panicked: {message}; it is retried after a backoff, and the daemon goes on"
            ),
        }
    }
}

/// A reconcile finished, by scope (`resource` or `full`).
pub struct ReconcileFinished {
    /// `resource` for one key, `full` for a full pass.
    pub scope: &'static str,
    /// How long it took.
    pub took: Duration,
}

impl Event for ReconcileFinished {
    fn emit(self, m: &Metrics) {
        m.reconcile_duration.get_or_create(&vec![("scope", self.scope)]).observe(self.took.as_secs_f64());
    }
}

/// A full apply ended.
pub struct ApplyFinished {
    /// Seconds since the epoch.
    pub at: i64,
    /// Whether every resource applied.
    pub succeeded: bool,
}

impl Event for ApplyFinished {
    fn emit(self, m: &Metrics) {
        m.last_apply_timestamp.set(self.at as f64);
        m.last_apply_success.set(i64::from(self.succeeded));
    }
}

/// Where the declared content of the declaration in force is held, in bytes.
pub struct ContentHeld {
    /// Bytes kept in the daemon's content file.
    pub in_file: u64,
    /// Bytes kept in memory, in the declaration itself.
    pub in_memory: u64,
}

impl Event for ContentHeld {
    fn emit(self, m: &Metrics) {
        m.declared_content.get_or_create(&vec![("where", "file")]).set(self.in_file as i64);
        m.declared_content.get_or_create(&vec![("where", "memory")]).set(self.in_memory as i64);
    }
}

/// How many managed paths the file watcher watches (their directory holds an inotify watch,
/// so a change is seen at once) and how many it does not (seen only by the next full pass).
pub struct PathsWatched {
    /// Paths watched.
    pub watched: usize,
    /// Paths not watched: their directory is absent, or no watch was left to add.
    pub unwatched: usize,
}

impl Event for PathsWatched {
    fn emit(self, m: &Metrics) {
        m.watched_paths.get_or_create(&vec![("state", "watched")]).set(self.watched as i64);
        m.watched_paths.get_or_create(&vec![("state", "unwatched")]).set(self.unwatched as i64);
    }
}

/// The file watcher could not add a watch for want of inotify watches (ENOSPC: the user's
/// limit, shared by every process of the user, is reached), or can again. Said once when it
/// begins and once when it ends, never per path nor at every pass; the gauges of
/// `PathsWatched` follow it between the two.
pub enum OutOfWatches {
    /// A watch was refused: the paths of the directories left over are not watched.
    Began {
        /// Managed paths not watched.
        unwatched: usize,
        /// Managed paths in all.
        paths: usize,
        /// Directories not watched.
        dirs: usize,
        /// The limit this process meets and the sysctl that sets it, when it could be read.
        limit: Option<(u64, &'static str)>,
        /// The daemon's period of full passes, which cover the unwatched paths.
        resync: Duration,
    },
    /// Every wanted directory that exists could be watched again.
    Ended {
        /// Managed paths still not watched (their directory absent).
        unwatched: usize,
    },
}

impl Event for OutOfWatches {
    fn emit(self, _: &Metrics) {
        match self {
            OutOfWatches::Began { unwatched, paths, dirs, limit, resync } => {
                let (limit, knob) = match limit {
                    Some((n, knob)) => (format!("the limit of {n} inotify watches per user ({knob})"), knob),
                    None => {
                        ("the limit of inotify watches per user".to_owned(), "fs.inotify.max_user_watches")
                    }
                };
                tracing::warn!(
                    unwatched,
                    paths,
                    directories = dirs,
                    "out of inotify watches: {unwatched} of {paths} managed paths (in {dirs} directories) are not watched, {limit} being reached by this and every other process of the user; a change to them is not seen as it happens but put back by the periodic resync (every {}); raise {knob} (sysctl, and in /etc/sysctl.d to keep it) to watch them all",
                    crate::system::human(resync)
                );
            }
            OutOfWatches::Ended { unwatched } => {
                tracing::info!(
                    unwatched,
                    "inotify watches are available again: every managed directory that exists is watched"
                );
            }
        }
    }
}

/// The file watcher could not make its inotify instance, or made it after all.
pub enum NoInstance<'a> {
    /// No instance: nothing is watched.
    Began {
        /// Why, with the limits that can cause it (`watchers::file::instance_said`).
        error: &'a str,
        /// Managed paths, none of them watched.
        paths: usize,
        /// The daemon's period of full passes, which cover them and try again.
        resync: Duration,
    },
    /// An instance was made: the paths that exist are watched again.
    Ended {
        /// Managed paths watched now.
        watched: usize,
    },
}

impl Event for NoInstance<'_> {
    fn emit(self, _: &Metrics) {
        match self {
            NoInstance::Began { error, paths, resync } => tracing::warn!(
                paths,
                "the file watcher has no inotify instance, so none of the {paths} managed paths is watched: {error}. A change to them is not seen as it happens but put back by the periodic resync (every {}), which also tries again to make one",
                crate::system::human(resync)
            ),
            NoInstance::Ended { watched } => tracing::info!(
                watched,
                "the file watcher has its inotify instance again: changes to the managed paths are seen as they happen"
            ),
        }
    }
}

/// How many resources of one type the last full pass left applied, failed and held.
pub struct ResourcesCounted {
    /// The resource type.
    pub kind: &'static str,
    /// Resources applied.
    pub applied: usize,
    /// Resources failed.
    pub failed: usize,
    /// Resources held as found, their module not taken yet.
    pub held: usize,
}

impl Event for ResourcesCounted {
    fn emit(self, m: &Metrics) {
        for (state, n) in [("applied", self.applied), ("failed", self.failed), ("held", self.held)] {
            m.resources.get_or_create(&vec![("type", self.kind), ("state", state)]).set(n as i64);
        }
    }
}

/// How a scheduled step's fire went.
pub enum ScheduledRun<'a> {
    /// The run exited 0.
    Succeeded {
        /// The step's id.
        id: &'a str,
        /// How long the run took.
        took: Duration,
    },
    /// The run failed.
    Failed {
        /// The step's id.
        id: &'a str,
        /// Why it failed.
        message: &'a str,
    },
    /// The run panicked (a bug): counted as failed and as a panic; the step runs at its next
    /// fire.
    Panicked {
        /// The step's id.
        id: &'a str,
        /// The panic's message.
        message: &'a str,
    },
    /// Still running from its last fire: this one is skipped.
    Skipped {
        /// The step's id.
        id: &'a str,
    },
    /// Not installed at its current declaration by any apply (its install failed, a gate before
    /// it failed, its module is not taken): not run.
    NotInstalled {
        /// The step's id.
        id: &'a str,
    },
}

impl Event for ScheduledRun<'_> {
    fn emit(self, m: &Metrics) {
        let result = match self {
            ScheduledRun::Succeeded { id, took } => {
                tracing::info!(id, took_ms = took.as_millis() as u64, "scheduled step {id} ran");
                "succeeded"
            }
            ScheduledRun::Failed { id, message } => {
                tracing::warn!(id, "scheduled step {id} failed: {message}");
                "failed"
            }
            ScheduledRun::Panicked { id, message } => {
                m.panics.inc();
                tracing::error!(
                    id,
                    "scheduled step {id} failed: its run panicked: {message}; it runs again at its next fire, and the daemon goes on"
                );
                "failed"
            }
            ScheduledRun::Skipped { id } => {
                tracing::warn!(
                    id,
                    "scheduled step {id} is still running from its last fire; this fire is skipped"
                );
                "skipped"
            }
            ScheduledRun::NotInstalled { id } => {
                tracing::warn!(
                    id,
                    "scheduled step {id} is not installed at its current declaration (its install failed, a gate before it failed, or its module is not taken yet); this fire is not run"
                );
                "not_installed"
            }
        };
        m.scheduled_runs.get_or_create(&vec![("result", result)]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(m: &Metrics, name: &str) -> f64 {
        let text = m.encode();
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    }

    #[test]
    fn a_correction_moves_its_outcome_drift_and_latency_together() {
        let m = Metrics::new();
        ResourceChanged {
            id: "web.conf",
            kind: "file",
            target: "/etc/web.conf",
            action: "corrected",
            detail: None,
            since_seen: Some(Duration::from_millis(2)),
            quiet: false,
            by: None,
        }
        .emit(&m);
        assert_eq!(sample(&m, "mesh_host_resource_outcomes_total{type=\"file\",action=\"corrected\"}"), 1.0);
        assert_eq!(sample(&m, "mesh_host_drift_corrections_total{type=\"file\",writer=\"unknown\"}"), 1.0);
        assert_eq!(sample(&m, "mesh_host_correction_latency_seconds_count"), 1.0);
        ResourceChanged {
            id: "web.conf",
            kind: "file",
            target: "/etc/web.conf",
            action: "updated",
            detail: None,
            since_seen: None,
            quiet: false,
            by: None,
        }
        .emit(&m);
        assert_eq!(
            sample(&m, "mesh_host_drift_corrections_total{type=\"file\",writer=\"unknown\"}"),
            1.0,
            "an update is not drift"
        );
    }

    #[test]
    fn a_failure_and_a_refusal_are_counted() {
        let m = Metrics::new();
        ResourceFailed { id: "a.a", kind: "service", target: "a.service", message: "it died", quiet: true }
            .emit(&m);
        DeclarationRefused { message: "refused", kept: "no declaration is in force" }.emit(&m);
        ScheduledRun::Skipped { id: "a.b" }.emit(&m);
        ScheduledRun::Panicked { id: "a.b", message: "boom" }.emit(&m);
        assert_eq!(sample(&m, "mesh_host_resource_failures_total{type=\"service\"}"), 1.0);
        assert_eq!(sample(&m, "mesh_host_declaration_refusals_total{reason=\"invalid\"}"), 1.0);
        DeclarationUntrusted { reason: "rollback", message: "older", kept: "no declaration is in force" }
            .emit(&m);
        assert_eq!(sample(&m, "mesh_host_declaration_refusals_total{reason=\"rollback\"}"), 1.0);
        assert_eq!(sample(&m, "mesh_host_scheduled_runs_total{result=\"skipped\"}"), 1.0);
        assert_eq!(
            sample(&m, "mesh_host_scheduled_runs_total{result=\"failed\"}"),
            1.0,
            "a panicked run failed"
        );
        assert_eq!(sample(&m, "mesh_host_panics_total"), 1.0, "and it is a panic");
    }
}
