//! Prometheus metrics: every name in this file, by Prometheus rules
//! (`mesh_host_<noun>_<unit>[_total]`). Labels are few and bounded: type, action, state,
//! source, watcher. A resource id is never a label; it is in the logs.

use std::sync::atomic::AtomicU64;

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
    pub drift_corrections: Family<Labels, Counter>,
    pub outcomes: Family<Labels, Counter>,
    /// Resources that failed in a pass, by type.
    pub failures: Family<Labels, Counter>,
    pub resources: Family<Labels, Gauge>,
    pub correction_latency: Histogram,
    pub reconcile_duration: Family<Labels, Histogram>,
    pub queue_depth: Gauge,
    pub queue_adds: Family<Labels, Counter>,
    pub queue_retries: Counter,
    pub queue_backing_off: Gauge,
    pub contested: Gauge,
    pub last_apply_timestamp: Gauge<f64, AtomicU64>,
    pub last_apply_success: Gauge,
    pub watcher_up: Family<Labels, Gauge>,
    pub declaration_refusals: Counter,
    /// Reconciles that panicked: each failed its key, and the daemon went on.
    pub panics: Counter,
    pub scheduled_runs: Family<Labels, Counter>,
    pub declared_content: Family<Labels, Gauge>,
    /// The process's resident memory, read at each scrape: a daemon that runs for months is
    /// watched for growth.
    pub resident_memory: Gauge,
    pub build_info: Family<Labels, Gauge>,
}

fn latency_buckets() -> Histogram {
    // 100 µs to about 13 s: hand-edit corrections are milliseconds, a full pass can be seconds.
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            drift_corrections: Family::default(),
            outcomes: Family::default(),
            failures: Family::default(),
            resources: Family::default(),
            correction_latency: latency_buckets(),
            reconcile_duration: Family::new_with_constructor(latency_buckets),
            queue_depth: Gauge::default(),
            queue_adds: Family::default(),
            queue_retries: Counter::default(),
            queue_backing_off: Gauge::default(),
            contested: Gauge::default(),
            last_apply_timestamp: Gauge::default(),
            last_apply_success: Gauge::default(),
            watcher_up: Family::default(),
            declaration_refusals: Counter::default(),
            panics: Counter::default(),
            scheduled_runs: Family::default(),
            declared_content: Family::default(),
            resident_memory: Gauge::default(),
            build_info: Family::default(),
            registry: Registry::default(),
        };
        // Counters are registered without `_total`: the library adds it.
        registry.register(
            "mesh_host_drift_corrections",
            "Resources found changed on the machine since the host last wrote them, and put back",
            m.drift_corrections.clone(),
        );
        registry.register(
            "mesh_host_resource_outcomes",
            "Outcomes of resources, by type and action",
            m.outcomes.clone(),
        );
        registry.register(
            "mesh_host_resource_failures",
            "Resources that failed in a pass, by type; the log line beside each says why",
            m.failures.clone(),
        );
        registry.register(
            "mesh_host_resources",
            "Declared resources by type and state (applied, failed, held)",
            m.resources.clone(),
        );
        registry.register(
            "mesh_host_correction_latency_seconds",
            "From a change seen on the machine to the corrected value read back",
            m.correction_latency.clone(),
        );
        registry.register(
            "mesh_host_reconcile_duration_seconds",
            "Duration of reconciles, by scope (resource, full)",
            m.reconcile_duration.clone(),
        );
        registry.register("mesh_host_queue_depth", "Keys waiting in the work queue", m.queue_depth.clone());
        registry.register(
            "mesh_host_queue_adds",
            "Keys added to the work queue, by source",
            m.queue_adds.clone(),
        );
        registry.register(
            "mesh_host_queue_retries",
            "Reconciles retried after a failure",
            m.queue_retries.clone(),
        );
        registry.register(
            "mesh_host_queue_backing_off_keys",
            "Keys held back by a failure backoff or a contest",
            m.queue_backing_off.clone(),
        );
        registry.register(
            "mesh_host_contested_resources",
            "Resources something else keeps rewriting; their corrections back off",
            m.contested.clone(),
        );
        registry.register(
            "mesh_host_last_apply_timestamp_seconds",
            "When the last full apply ended, in seconds since the epoch",
            m.last_apply_timestamp.clone(),
        );
        registry.register(
            "mesh_host_last_apply_success",
            "1 if the last full apply succeeded, else 0",
            m.last_apply_success.clone(),
        );
        registry.register(
            "mesh_host_watcher_up",
            "1 if the watcher is connected to what it watches",
            m.watcher_up.clone(),
        );
        registry.register(
            "mesh_host_declaration_refusals",
            "Declarations refused (invalid, or half-written); the previous one stays in force",
            m.declaration_refusals.clone(),
        );
        registry.register(
            "mesh_host_panics",
            "Reconciles that panicked; each failed its key, which is retried, and the daemon went on",
            m.panics.clone(),
        );
        registry.register(
            "mesh_host_scheduled_runs",
            "Runs of scheduled steps, by result (succeeded, failed, skipped while still running)",
            m.scheduled_runs.clone(),
        );
        registry.register(
            "mesh_host_declared_content_bytes",
            "Bytes of declared file content the daemon holds, by where: in its content file (page cache) or in memory",
            m.declared_content.clone(),
        );
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory of the agent's process, read at each scrape",
            m.resident_memory.clone(),
        );
        registry.register("mesh_host_build_info", "The running build", m.build_info.clone());
        m.build_info.get_or_create(&vec![("version", env!("CARGO_PKG_VERSION"))]).set(1);
        Metrics { registry, ..m }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        if let Some(bytes) = crate::system::memory::resident_bytes() {
            self.resident_memory.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String does not fail");
        out
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

    /// The names the exposition carries, with the suffixes Prometheus derives from them.
    fn exported() -> std::collections::BTreeSet<String> {
        let m = Metrics::new();
        // Families with labels appear once they have a child. Each is given a label value
        // production emits (controller::worker::count_resources: applied, failed, held), so the
        // fixture reads as the exposition does.
        m.resources.get_or_create(&vec![("type", "file"), ("state", "applied")]).set(1);
        m.drift_corrections.get_or_create(&vec![("type", "file")]).inc();
        m.failures.get_or_create(&vec![("type", "file")]).inc();
        m.outcomes.get_or_create(&vec![("type", "file"), ("action", "created")]).inc();
        m.reconcile_duration.get_or_create(&vec![("scope", "full")]).observe(0.1);
        m.queue_adds.get_or_create(&vec![("source", "file")]).inc();
        m.watcher_up.get_or_create(&vec![("watcher", "file")]).set(1);
        m.scheduled_runs.get_or_create(&vec![("result", "succeeded")]).inc();
        m.declared_content.get_or_create(&vec![("where", "file")]).set(1);
        m.encode()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .map(str::to_owned)
            .collect()
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
