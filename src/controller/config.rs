//! How the daemon runs: `mesh-host run`'s options, as the controller's parts read them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::{queue, signed};
use crate::store::Origin;

/// How the daemon runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// A declaration file, or a directory of `*.json` files read as one declaration.
    pub declaration: PathBuf,
    /// The state directory: the store, the content file, the journal.
    pub state: PathBuf,
    /// Where the declaration comes from, as its records are written.
    pub origin: Origin,
    /// Where `/metrics` and `/healthz` listen; `None` for nowhere.
    pub metrics: Option<SocketAddr>,
    /// The web configuration file of `/metrics` and `/healthz` (`--web-config`): TLS, client
    /// certificates, basic auth; `None` serves plain HTTP to any caller.
    pub web: Option<crate::telemetry::web::WebConfigFile>,
    /// How often everything is reconciled even when no watcher said anything.
    pub resync: Duration,
    /// How long the declaration must be still before it is read.
    pub quiet: Duration,
    /// How the work queue backs off and holds keys off.
    pub queue: queue::Config,
    /// The D-Bus address of the systemd to manage; the system bus when `None`.
    pub bus: Option<String>,
    /// The container runtime's socket (`--container-socket`); `None` looks in the usual places.
    pub container_socket: Option<String>,
    /// How many reconciles may run at once (`--workers`, at least 1): the worker's own, and
    /// up to `workers - 1` long ones apart from it (`runner`'s module doc). 1 is the single
    /// worker of before, every reconcile in turn.
    pub workers: usize,
    /// How long an action or a step may run (`--step-timeout`); `None` for no limit.
    pub step_timeout: Option<Duration>,
    /// How much one archive may unpack (`--archive-max-bytes`, `--archive-max-entries`).
    pub archive_limits: crate::apply::ArchiveLimits,
    /// The largest original kept whole, and found file hashed (`--keep-max-bytes`).
    pub keep_max_bytes: u64,
    /// The node's sealing key (`--key`), read in each pass that opens a sealed value.
    pub key: PathBuf,
    /// How many generations are kept under the state directory (`--keep-generations`).
    pub keep_generations: usize,
    /// With `--allowed-signers`: the declaration directory is put in force only when its
    /// signed manifest verifies (`signed`); `None` applies what parses, as before.
    pub trust: Option<signed::Trust>,
    /// The declaration directory is written by a verifier of its own (the fleet's source with
    /// `--allowed-signers`), whose summary (`signed::SUMMARY`) says who signed what it holds.
    pub signed_summary: bool,
    /// The trust policy the node runs with (`--trust-policy`), its version and expiry (seconds
    /// since the epoch), for `/healthz` and the gauge; `None` without one.
    pub trust_policy: Option<(u64, u64)>,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(resync: u64, step: Option<u64>) -> Config {
        Config {
            declaration: PathBuf::from("/etc/mesh-host/declaration.d"),
            state: PathBuf::from("/var/lib/mesh-host/state.json"),
            origin: Origin::Declared,
            metrics: None,
            web: None,
            resync: Duration::from_secs(resync),
            quiet: Duration::from_millis(50),
            queue: queue::Config::default(),
            bus: None,
            container_socket: None,
            workers: 4,
            step_timeout: step.map(Duration::from_secs),
            archive_limits: crate::apply::ArchiveLimits::default(),
            keep_max_bytes: crate::apply::KEEP_MAX_BYTES,
            key: PathBuf::from("/var/lib/mesh-host/sealing.key"),
            keep_generations: usize::from(crate::generations::DEFAULT_KEEP),
            trust: None,
            signed_summary: false,
            trust_policy: None,
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
