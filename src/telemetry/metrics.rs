//! Prometheus metrics: every name in this file, by Prometheus rules
//! (`mesh_host_<noun>_<unit>[_total]`). Labels are few and bounded: type, action, state,
//! source, watcher. A resource id is never a label; it is in the logs.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, &'static str)>;

/// Every metric the agent exports.
pub struct Metrics {
    registry: Registry,
    /// `mesh_host_drift_corrections_total`: corrections of what someone changed by hand, by type and
    /// kind of writer (`session`, `unit`, `container`, `unknown`: never a name or a pid).
    pub drift_corrections: Family<Labels, Counter>,
    /// `mesh_host_resource_outcomes_total`: every outcome of a pass, by type and word.
    pub outcomes: Family<Labels, Counter>,
    /// Resources that failed in a pass, by type.
    pub failures: Family<Labels, Counter>,
    /// `mesh_host_resources`: resources the last full pass left applied, failed and held, by type.
    pub resources: Family<Labels, Gauge>,
    /// `mesh_host_correction_latency_seconds`: from a change seen on the machine to its correction.
    pub correction_latency: Histogram,
    /// `mesh_host_reconcile_duration_seconds`: how long a reconcile took, by scope.
    pub reconcile_duration: Family<Labels, Histogram>,
    /// `mesh_host_queue_depth`: keys waiting in the work queue.
    pub queue_depth: Gauge,
    /// `mesh_host_queue_processing`: keys being reconciled now.
    pub queue_processing: Gauge,
    /// `mesh_host_queue_adds_total`: keys queued, by what queued them.
    pub queue_adds: Family<Labels, Counter>,
    /// `mesh_host_queue_retries_total`: failed reconciles whose key is retried.
    pub queue_retries: Counter,
    /// `mesh_host_queue_backing_off_keys`: keys waiting out a backoff.
    pub queue_backing_off: Gauge,
    /// `mesh_host_contested_resources`: keys something keeps changing back.
    pub contested: Gauge,
    /// `mesh_host_last_apply_timestamp_seconds`: when the last full apply ended.
    pub last_apply_timestamp: Gauge<f64, AtomicU64>,
    /// `mesh_host_last_apply_success`: 1 when the last full apply succeeded, else 0.
    pub last_apply_success: Gauge,
    /// `mesh_host_watcher_up`: 1 while a watcher is connected to its source, by watcher.
    pub watcher_up: Family<Labels, Gauge>,
    /// `mesh_host_watched_paths`: managed paths the file watcher watches and does not, by state.
    pub watched_paths: Family<Labels, Gauge>,
    /// `mesh_host_declaration_refusals_total`: declarations refused whole, by reason: `invalid`
    /// (unreadable or does not parse), `machine` (refused on this machine by a found firewall),
    /// and a signed declaration's `signature`, `scope`, `rollback`, `expired`, `contents`.
    pub declaration_refusals: Family<Labels, Counter>,
    /// `mesh_host_declaration_refused`: 1 while the declaration in force is refused whole on
    /// this machine (a firewall found in force that the host cannot manage), 0 otherwise.
    pub declaration_refused: Gauge,
    /// `mesh_host_generation`: the number of the generation in force (0 before any is recorded).
    pub generation: Gauge,
    /// `mesh_host_generation_held`: 1 while a rollback holds the node at a generation, 0 otherwise.
    pub generation_held: Gauge,
    /// `mesh_host_reverted`: 1 while the node holds a generation it went back to by itself
    /// (a new generation cut it off from etcd within the confirmation window), 0 otherwise.
    pub reverted: Gauge,
    /// `mesh_host_reverts_total`: the times the node went back by itself since it started.
    pub reverts: Counter,
    /// `mesh_host_declaration_expires_timestamp_seconds`: when the signed declaration in force
    /// expires, by kind of scope (`local`, `fleet`, `group`, `node`; the earliest of a kind's);
    /// absent while nothing signed is in force. Below `time()`, it is enforced past its expiry.
    pub declaration_expires: Family<Labels, Gauge>,
    /// `mesh_host_trust_policy_expires_timestamp_seconds`: when the trust policy in force
    /// expires; absent without `--trust-policy`. Below `time()`, it is in force past its expiry.
    pub trust_policy_expires: Family<Labels, Gauge>,
    /// `mesh_host_etcd_up`: 1 while the fleet's last read of etcd succeeded, 0 after a failed
    /// one; absent on a node whose declaration is a local directory.
    pub etcd_up: Family<Labels, Gauge>,
    /// `mesh_host_etcd_certificate_refused`: 1 while etcd refuses the node's client certificate
    /// (expired, revoked, or from a CA etcd does not trust), 0 once etcd takes one; absent where
    /// the declaration is a local directory.
    pub etcd_certificate_refused: Family<Labels, Gauge>,
    /// `mesh_host_etcd_watch_revision`: the etcd revision up to which the fleet's watch has
    /// delivered every change, from etcd's progress notices; absent until the first.
    pub etcd_watch_revision: Family<Labels, Gauge>,
    /// `mesh_host_etcd_members_left_total`: connections to an etcd member this process dropped
    /// for the next endpoint, by `why`: `silent` (neither a call nor a status request answered
    /// in the call timeout) or `refused` (an answer another member may not give: no leader,
    /// stopping, the connection itself broken). Read at each scrape from the client's own
    /// counts (`system::etcd_counts`); absent where the declaration is a local directory. Each
    /// leave costs the member a new connection, watch and lease stream: a fleet's members in a
    /// storm of these are overloaded (issue 43).
    pub etcd_members_left: Family<Labels, Counter>,
    /// `mesh_host_etcd_calls_busy_total`: calls to etcd not served in time by a member that
    /// still answered (busy, its apply behind): the connection kept. Read and absent as the
    /// one above.
    pub etcd_calls_busy: Family<Labels, Counter>,
    /// Reconciles that panicked: each failed its key, and the daemon went on.
    pub panics: Counter,
    /// State-store writes that failed: what was applied is on the machine but not recorded.
    pub store_write_failures: Counter,
    /// `mesh_host_scheduled_runs_total`: scheduled steps' fires, by result.
    pub scheduled_runs: Family<Labels, Counter>,
    /// `mesh_host_declared_content_bytes`: the declared content in force, by where it is held.
    pub declared_content: Family<Labels, Gauge>,
    /// The process's resident memory, read at each scrape: a daemon that runs for months is
    /// watched for growth.
    pub resident_memory: Gauge,
    /// `mesh_host_build_info`: 1, labelled with the running build's version.
    pub build_info: Family<Labels, Gauge>,
    /// The daemon's period of full resyncs, so an alert on a stale apply follows the node's
    /// own setting rather than a constant in the rules.
    pub resync_period: Gauge<f64, AtomicU64>,
}

/// Why a declaration is refused whole (`mesh_host_declaration_refusals_total{reason}`):
/// `invalid` and `machine` (events), and a signed declaration's five (`trust::Reason::label`;
/// telemetry names nothing but `system`, so they are listed here, and a test holds the two
/// lists together).
pub const REFUSAL_REASONS: [&str; 7] =
    ["invalid", "machine", "signature", "scope", "rollback", "expired", "contents"];

/// The label values known before anything happens, so that every labelled counter is exported
/// at 0 from the start. A series that first appears at 1 is invisible to `increase()` and
/// `rate()`, which need two samples: the first correction after a start would be lost to every
/// alert. Telemetry knows nothing of the engine, so the engine's words are handed in.
pub struct Known<'a> {
    /// Every resource type (`declaration::Kind::ALL`).
    pub types: &'a [&'static str],
    /// Every outcome word (`apply::Verb::ALL`).
    pub actions: &'a [&'static str],
    /// Every source a key is queued from (`controller::trigger::Source::ALL`).
    pub sources: &'a [&'static str],
}

/// What a scheduled step's run can end as: the `result` label of `mesh_host_scheduled_runs`.
pub const SCHEDULED_RESULTS: [&str; 4] = ["succeeded", "failed", "skipped", "not_installed"];

/// What a reconcile covers: the `scope` label of `mesh_host_reconcile_duration_seconds`.
pub const SCOPES: [&str; 2] = ["resource", "full"];

/// Whether a managed path's directory is watched: the `state` label of `mesh_host_watched_paths`.
pub const WATCH_STATES: [&str; 2] = ["watched", "unwatched"];

/// The classic text exposition's content type (Prometheus 0.0.4).
pub const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The OpenMetrics exposition's content type.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A latency histogram's buckets: 100 µs to about 13 s, doubling, so a hand-edit's correction
/// (milliseconds) and a full pass (seconds) each land in buckets fine enough to read.
fn latency_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

impl Metrics {
    /// Every metric, registered, its labelled series not yet seeded (see `Known`).
    pub fn new() -> Metrics {
        let m = Metrics::unregistered();
        let mut registry = Registry::default();
        // Counters are registered without `_total`: the library adds it. The exposition lists
        // them in the order they are registered here.
        m.register_passes(&mut registry);
        m.register_queue(&mut registry);
        m.register_daemon(&mut registry);
        m.register_etcd(&mut registry);
        m.register_process(&mut registry);
        m.build_info.get_or_create(&vec![("version", env!("CARGO_PKG_VERSION"))]).set(1);
        Metrics { registry, ..m }
    }

    /// Every metric at its start value, in no registry yet: `new` registers them, by subject.
    fn unregistered() -> Metrics {
        Metrics {
            drift_corrections: Family::default(),
            outcomes: Family::default(),
            failures: Family::default(),
            resources: Family::default(),
            correction_latency: latency_buckets(),
            reconcile_duration: Family::new_with_constructor(latency_buckets),
            queue_depth: Gauge::default(),
            queue_processing: Gauge::default(),
            queue_adds: Family::default(),
            queue_retries: Counter::default(),
            queue_backing_off: Gauge::default(),
            contested: Gauge::default(),
            last_apply_timestamp: Gauge::default(),
            last_apply_success: Gauge::default(),
            watcher_up: Family::default(),
            watched_paths: Family::default(),
            declaration_refusals: Family::default(),
            declaration_refused: Gauge::default(),
            generation: Gauge::default(),
            generation_held: Gauge::default(),
            reverted: Gauge::default(),
            reverts: Counter::default(),
            declaration_expires: Family::default(),
            trust_policy_expires: Family::default(),
            etcd_up: Family::default(),
            etcd_certificate_refused: Family::default(),
            etcd_watch_revision: Family::default(),
            etcd_members_left: Family::default(),
            etcd_calls_busy: Family::default(),
            panics: Counter::default(),
            store_write_failures: Counter::default(),
            scheduled_runs: Family::default(),
            declared_content: Family::default(),
            resident_memory: Gauge::default(),
            build_info: Family::default(),
            resync_period: Gauge::default(),
            registry: Registry::default(),
        }
    }

    /// What passes did: outcomes, failures and drift corrections by type, the resources each
    /// type is left in, and how long corrections and reconciles took.
    fn register_passes(&self, registry: &mut Registry) {
        registry.register(
            "mesh_host_drift_corrections",
            "Resources found changed on the machine since the host last wrote them, and put back",
            self.drift_corrections.clone(),
        );
        registry.register(
            "mesh_host_resource_outcomes",
            "Outcomes of resources, by type and action",
            self.outcomes.clone(),
        );
        registry.register(
            "mesh_host_resource_failures",
            "Resources that failed in a pass, by type; the log line beside each says why",
            self.failures.clone(),
        );
        registry.register(
            "mesh_host_resources",
            "Declared resources by type and state (applied, failed, held)",
            self.resources.clone(),
        );
        registry.register(
            "mesh_host_correction_latency_seconds",
            "From a change seen on the machine to the corrected value read back",
            self.correction_latency.clone(),
        );
        registry.register(
            "mesh_host_reconcile_duration_seconds",
            "Duration of reconciles, by scope (resource, full)",
            self.reconcile_duration.clone(),
        );
    }

    /// The work queue's state: its depth, what added to it, and the keys it holds back by a
    /// retry, a backoff or a contest, so that nobody has to guess when backoff applies.
    fn register_queue(&self, registry: &mut Registry) {
        registry.register(
            "mesh_host_queue_depth",
            "Keys waiting in the work queue",
            self.queue_depth.clone(),
        );
        registry.register(
            "mesh_host_queue_processing",
            "Keys being reconciled now, inline and apart (at most --workers)",
            self.queue_processing.clone(),
        );
        registry.register(
            "mesh_host_queue_adds",
            "Keys added to the work queue, by source",
            self.queue_adds.clone(),
        );
        registry.register(
            "mesh_host_queue_retries",
            "Reconciles retried after a failure",
            self.queue_retries.clone(),
        );
        registry.register(
            "mesh_host_queue_backing_off_keys",
            "Keys held back by a failure backoff or a contest",
            self.queue_backing_off.clone(),
        );
        registry.register(
            "mesh_host_contested_resources",
            "Resources something else keeps rewriting; their corrections back off",
            self.contested.clone(),
        );
    }

    /// The daemon's health: its last full apply, its watchers, the declarations it refused, the
    /// reconciles that panicked, and its scheduled steps' runs.
    fn register_daemon(&self, registry: &mut Registry) {
        registry.register(
            "mesh_host_last_apply_timestamp_seconds",
            "When the last full apply ended, in seconds since the epoch",
            self.last_apply_timestamp.clone(),
        );
        registry.register(
            "mesh_host_last_apply_success",
            "1 if the last full apply succeeded, else 0",
            self.last_apply_success.clone(),
        );
        registry.register(
            "mesh_host_watcher_up",
            "1 if the watcher is connected to what it watches",
            self.watcher_up.clone(),
        );
        registry.register(
            "mesh_host_watched_paths",
            "Managed paths whose directory holds an inotify watch (watched: a change is put back at once) and whose directory does not (unwatched: absent, or the user's fs.inotify.max_user_watches reached; put back by the next resync)",
            self.watched_paths.clone(),
        );
        registry.register(
            "mesh_host_declaration_refusals",
            "Declarations refused, by reason: invalid or half-written (invalid; the previous one stays in force), refused on this machine by a found firewall (machine; counted when the refusal begins), or a signed declaration refused (signature, scope, rollback, expired, contents)",
            self.declaration_refusals.clone(),
        );
        registry.register(
            "mesh_host_declaration_refused",
            "1 while the declaration is refused whole on this machine (a firewall found in force that the host cannot manage): nothing of it is applied",
            self.declaration_refused.clone(),
        );
        registry.register(
            "mesh_host_generation",
            "The number of the generation in force (mesh-host generations lists them); 0 before any is recorded",
            self.generation.clone(),
        );
        registry.register(
            "mesh_host_generation_held",
            "1 while a rollback holds the node at a generation instead of its source's declaration, 0 otherwise",
            self.generation_held.clone(),
        );
        registry.register(
            "mesh_host_reverted",
            "1 while the node holds a generation it went back to by itself: the generation after it cut the node off from etcd within the confirmation window; 0 otherwise",
            self.reverted.clone(),
        );
        registry.register(
            "mesh_host_reverts",
            "Times the node went back to its previous generation by itself because a new one from etcd was not confirmed (no etcd round trip) within the confirmation window",
            self.reverts.clone(),
        );
        registry.register(
            "mesh_host_declaration_expires_timestamp_seconds",
            "When the signed declaration in force expires (seconds since the epoch), by kind of scope, the earliest of each kind; absent while nothing signed is in force. Past it, the declaration is still enforced: nothing newer was signed or reached the node",
            self.declaration_expires.clone(),
        );
        registry.register(
            "mesh_host_trust_policy_expires_timestamp_seconds",
            "When the trust policy in force (--trust-policy) expires (seconds since the epoch); absent without one. Past it, the policy is still enforced: no rotation was installed",
            self.trust_policy_expires.clone(),
        );
        registry.register(
            "mesh_host_panics",
            "Reconciles that panicked; each failed its key, which is retried, and the daemon went on",
            self.panics.clone(),
        );
        registry.register(
            "mesh_host_store_write_failures",
            "State-store writes that failed; what was applied is on the machine but not recorded, and is read from the machine again",
            self.store_write_failures.clone(),
        );
        registry.register(
            "mesh_host_scheduled_runs",
            "Runs of scheduled steps, by result (succeeded, failed, skipped while still running, not_installed: a fire of a step no apply installed at its current declaration)",
            self.scheduled_runs.clone(),
        );
    }

    /// The fleet's etcd source and client: absent on a node whose declaration is a local
    /// directory.
    fn register_etcd(&self, registry: &mut Registry) {
        registry.register(
            "mesh_host_etcd_up",
            "1 while the fleet's last read of etcd succeeded, 0 after a failed one; absent where the declaration is a local directory",
            self.etcd_up.clone(),
        );
        registry.register(
            "mesh_host_etcd_certificate_refused",
            "1 while etcd refuses the node's client certificate (expired, revoked, or from a CA it does not trust), 0 once it takes one; the files are read again at every connection",
            self.etcd_certificate_refused.clone(),
        );
        registry.register(
            "mesh_host_etcd_watch_revision",
            "The etcd revision up to which the fleet's watch has delivered every change, from etcd's progress notices: an idle watch known alive, and where it stands",
            self.etcd_watch_revision.clone(),
        );
        registry.register(
            "mesh_host_etcd_members_left",
            "Connections to an etcd member dropped for the next endpoint, by why: silent (no answer to a call, nor to a status request, in the call timeout) or refused (an answer another member may not give: no leader, stopping, the connection broken); each costs the member a new connection, watch and lease stream",
            self.etcd_members_left.clone(),
        );
        registry.register(
            "mesh_host_etcd_calls_busy",
            "Calls to etcd not served within the call timeout by a member that still answered (busy: its apply or its leader behind); the connection to it was kept",
            self.etcd_calls_busy.clone(),
        );
    }

    /// The process itself: the declared content and the memory it holds, its build, and its
    /// resync period, for the alert rules to follow the node's own setting.
    fn register_process(&self, registry: &mut Registry) {
        registry.register(
            "mesh_host_declared_content_bytes",
            "Bytes of declared file content the daemon holds, by where: in its content file (page cache) or in memory",
            self.declared_content.clone(),
        );
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory of the agent's process, read at each scrape",
            self.resident_memory.clone(),
        );
        registry.register("mesh_host_build_info", "The running build", self.build_info.clone());
        registry.register(
            "mesh_host_resync_period_seconds",
            "Seconds between the daemon's full resyncs (--resync): a full apply older than a few of these is stale",
            self.resync_period.clone(),
        );
    }

    /// The metrics a daemon exports: every labelled counter created at 0 for each label value
    /// it can take (see `Known`), the resync period set.
    pub fn for_daemon(known: &Known<'_>, resync: std::time::Duration) -> Metrics {
        let m = Metrics::new();
        // Each child is made by looking it up; the guard the lookup returns is let go at once.
        for &kind in known.types {
            for writer in mesh_host_watchers::writers::WriterKind::ALL.map(|k| k.as_str()) {
                drop(m.drift_corrections.get_or_create(&vec![("type", kind), ("writer", writer)]));
            }
            drop(m.failures.get_or_create(&vec![("type", kind)]));
            for &action in known.actions {
                drop(m.outcomes.get_or_create(&vec![("type", kind), ("action", action)]));
            }
        }
        for &source in known.sources {
            drop(m.queue_adds.get_or_create(&vec![("source", source)]));
        }
        for result in SCHEDULED_RESULTS {
            drop(m.scheduled_runs.get_or_create(&vec![("result", result)]));
        }
        for scope in SCOPES {
            drop(m.reconcile_duration.get_or_create(&vec![("scope", scope)]));
        }
        for state in WATCH_STATES {
            drop(m.watched_paths.get_or_create(&vec![("state", state)]));
        }
        for reason in REFUSAL_REASONS {
            drop(m.declaration_refusals.get_or_create(&vec![("reason", reason)]));
        }
        m.resync_period.set(resync.as_secs_f64());
        m
    }

    /// The exposition a client asked for by its `Accept` header: OpenMetrics when it names
    /// OpenMetrics at least as high as the classic text (Prometheus does, since 2.5), the
    /// classic 0.0.4 text otherwise (curl, promtool, older scrapers), as the Go client does.
    /// Returns the content type and the body.
    pub fn exposition(&self, accept: Option<&str>) -> (&'static str, String) {
        if accept.is_some_and(prefers_openmetrics) {
            (OPENMETRICS, self.encode())
        } else {
            (CLASSIC, classic(&self.encode()))
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        if let Some(bytes) = crate::system::memory::resident_bytes() {
            self.resident_memory.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        // The etcd client's own counts, process-wide, once the fleet has tried etcd.
        if self.etcd_up.get(&Vec::new()).is_some() {
            let counts = crate::system::etcd_counts();
            let left = |why| self.etcd_members_left.get_or_create(&vec![("why", why)]).clone();
            left("silent").inner().store(counts.left_silent, Ordering::Relaxed);
            left("refused").inner().store(counts.left_refused, Ordering::Relaxed);
            let busy = self.etcd_calls_busy.get_or_create(&Vec::new()).clone();
            busy.inner().store(counts.kept_busy, Ordering::Relaxed);
        }
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String does not fail");
        out
    }
}

/// Whether an `Accept` header asks for OpenMetrics rather than the classic text: its quality
/// (`q`, 1 when not given) is above 0 and at least that of `text/plain` (or of `*/*` when the
/// header names no text/plain).
fn prefers_openmetrics(accept: &str) -> bool {
    let (mut openmetrics, mut text, mut any) = (0.0f64, None::<f64>, 0.0f64);
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")))
            .find_map(|q| q.trim().parse::<f64>().ok())
            .unwrap_or(1.0);
        match media.as_str() {
            "application/openmetrics-text" => openmetrics = openmetrics.max(q),
            "text/plain" => text = Some(text.unwrap_or(0.0).max(q)),
            "*/*" | "text/*" => any = any.max(q),
            _ => {}
        }
    }
    openmetrics > 0.0 && openmetrics >= text.unwrap_or(any)
}

/// The classic text format (0.0.4) of an OpenMetrics exposition written by prometheus-client:
/// the parts both formats share are kept as they are; what differs is rewritten. A counter's
/// family is named with its samples' `_total` in `# HELP` and `# TYPE` (in OpenMetrics the
/// family has no suffix, and a classic parser would take the samples for another, untyped,
/// family without help: what `promtool check metrics` complains of); `# UNIT` and `# EOF` are
/// OpenMetrics' own and left out; a type classic text has no word for is `untyped`.
fn classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut lines = openmetrics.lines().peekable();
    while let Some(line) = lines.next() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            // prometheus-client writes each family's HELP, then its TYPE.
            let kind = lines
                .peek()
                .and_then(|l| l.strip_prefix("# TYPE "))
                .and_then(|t| t.split_once(' '))
                .filter(|(n, _)| *n == name)
                .map(|(_, kind)| kind);
            let name = classic_name(name, kind);
            out.push_str(&format!("# HELP {name} {help}\n"));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let classic_kind = match kind {
                "counter" | "gauge" | "histogram" | "summary" => kind,
                _ => "untyped",
            };
            out.push_str(&format!("# TYPE {} {classic_kind}\n", classic_name(name, Some(kind))));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// A family's name in the classic text: a counter's with `_total`, as its samples are named.
fn classic_name(name: &str, kind: Option<&str>) -> String {
    match kind {
        Some("counter") if !name.ends_with("_total") => format!("{name}_total"),
        _ => name.to_owned(),
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The names the exposition carries, with the suffixes Prometheus derives from them.
    fn exported() -> std::collections::BTreeSet<String> {
        let m = Metrics::new();
        // Families with labels appear once they have a child. Each is given a label value
        // production emits (controller::report::Report::count: applied, failed, held), so the
        // fixture reads as the exposition does.
        m.resources.get_or_create(&vec![("type", "file"), ("state", "applied")]).set(1);
        m.drift_corrections.get_or_create(&vec![("type", "file"), ("writer", "session")]).inc();
        m.failures.get_or_create(&vec![("type", "file")]).inc();
        m.outcomes.get_or_create(&vec![("type", "file"), ("action", "created")]).inc();
        m.reconcile_duration.get_or_create(&vec![("scope", "full")]).observe(0.1);
        m.queue_adds.get_or_create(&vec![("source", "file")]).inc();
        m.watcher_up.get_or_create(&vec![("watcher", "file")]).set(1);
        m.watched_paths.get_or_create(&vec![("state", "watched")]).set(1);
        m.declaration_refusals.get_or_create(&vec![("reason", "invalid")]).inc();
        m.scheduled_runs.get_or_create(&vec![("result", "succeeded")]).inc();
        m.declared_content.get_or_create(&vec![("where", "file")]).set(1);
        m.etcd_up.get_or_create(&Vec::new()).set(1);
        m.etcd_certificate_refused.get_or_create(&Vec::new()).set(0);
        m.etcd_watch_revision.get_or_create(&Vec::new()).set(1);
        m.trust_policy_expires.get_or_create(&Vec::new()).set(1);
        m.declaration_expires.get_or_create(&vec![("scope", "fleet")]).set(1);
        m.encode()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn every_labelled_counter_is_at_zero_from_the_start() {
        let known =
            Known { types: &["file", "service"], actions: &["created", "corrected"], sources: &["file"] };
        let m = Metrics::for_daemon(&known, std::time::Duration::from_secs(600));
        let text = m.encode();
        for series in [
            r#"mesh_host_drift_corrections_total{type="file",writer="session"} 0"#,
            r#"mesh_host_drift_corrections_total{type="file",writer="unknown"} 0"#,
            r#"mesh_host_drift_corrections_total{type="service",writer="container"} 0"#,
            r#"mesh_host_resource_failures_total{type="service"} 0"#,
            r#"mesh_host_resource_outcomes_total{type="service",action="corrected"} 0"#,
            r#"mesh_host_queue_adds_total{source="file"} 0"#,
            r#"mesh_host_scheduled_runs_total{result="skipped"} 0"#,
            r#"mesh_host_scheduled_runs_total{result="not_installed"} 0"#,
            r#"mesh_host_reconcile_duration_seconds_count{scope="resource"} 0"#,
            "mesh_host_resync_period_seconds 600.0",
            r#"mesh_host_watched_paths{state="unwatched"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == series), "{series} missing from:\n{text}");
        }
    }

    #[test]
    fn the_classic_text_names_counters_with_their_samples_and_keeps_every_help() {
        let m = Metrics::for_daemon(
            &Known { types: &["file"], actions: &["created"], sources: &[] },
            Duration::ZERO,
        );
        let (kind, text) = m.exposition(None);
        assert_eq!(kind, CLASSIC);
        assert!(!text.contains("# EOF") && !text.contains("# UNIT"), "{text}");
        assert!(text.contains("# HELP mesh_host_drift_corrections_total Resources found changed"), "{text}");
        assert!(text.contains("# TYPE mesh_host_drift_corrections_total counter\n"), "{text}");
        assert!(text.contains("# TYPE mesh_host_queue_depth gauge\n"), "{text}");
        assert!(text.contains("# TYPE mesh_host_correction_latency_seconds histogram\n"), "{text}");
        // Every family a sample belongs to has its HELP and TYPE, under the sample's name.
        let helped: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# HELP "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        for sample in text.lines().filter(|l| !l.starts_with('#')) {
            let name = sample.split(['{', ' ']).next().unwrap();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| helped.contains(f)))
                .unwrap_or(name);
            assert!(helped.contains(&family), "{name} has no HELP in:\n{text}");
        }
    }

    #[test]
    fn openmetrics_is_served_to_a_client_that_asks_for_it_first() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(prefers_openmetrics(prometheus));
        assert!(prefers_openmetrics("application/openmetrics-text"));
        assert!(!prefers_openmetrics("*/*"), "curl");
        assert!(!prefers_openmetrics("text/plain;version=0.0.4"));
        assert!(!prefers_openmetrics("text/plain, application/openmetrics-text;q=0.5"));
        assert!(!prefers_openmetrics("application/openmetrics-text;q=0"));
        let m = Metrics::new();
        assert_eq!(m.exposition(Some(prometheus)).0, OPENMETRICS);
        assert!(m.exposition(Some(prometheus)).1.ends_with("# EOF\n"));
        assert_eq!(m.exposition(Some("*/*")).0, CLASSIC);
    }

    #[test]
    fn every_dashboard_panel_has_an_id_a_description_and_grafanas_rate_interval() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/mesh-host.json");
        let dashboard: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let panels = dashboard["panels"].as_array().unwrap();
        let mut ids = std::collections::BTreeSet::new();
        for panel in panels {
            let title = panel["title"].as_str().unwrap();
            let id = panel["id"].as_u64().unwrap_or_else(|| panic!("panel {title:?} has no id"));
            assert!(ids.insert(id), "panel id {id} is used twice");
            assert!(
                panel["description"].as_str().is_some_and(|d| d.len() > 20),
                "panel {title:?} has no description"
            );
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                // A fixed range is wrong at some scrape interval: too short for a slow scrape
                // (no two samples), smoothing away what a fast one shows.
                if expr.contains("rate(") {
                    assert!(expr.contains("[$__rate_interval]"), "panel {title:?}: {expr}");
                }
            }
        }
    }

    #[test]
    fn every_metric_the_alert_rules_and_the_dashboard_use_is_exported() {
        let exported = exported();
        for file in ["deploy/prometheus/mesh-host.rules.yml", "deploy/grafana/mesh-host.json"] {
            let text = std::fs::read_to_string(format!("{}/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
            let mut used: Vec<&str> = Vec::new();
            for (i, _) in text.match_indices("mesh_host_").chain(text.match_indices("process_resident")) {
                let name = &text[i..];
                let end = name.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(name.len());
                used.push(&name[..end]);
            }
            assert!(!used.is_empty(), "{file} names no metric");
            for name in used {
                assert!(
                    exported.contains(name),
                    "{file} uses {name}, which /metrics does not export: {exported:?}"
                );
            }
        }
    }
}
