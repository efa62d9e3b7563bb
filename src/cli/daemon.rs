//! `run`: the daemon's arguments, and its start.

use super::*;

/// How `run` runs: its declaration, its pace, and etcd when the declaration comes from there.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// A declaration file, or a directory whose `*.json` files are read as one declaration.
    #[arg(long, value_name = "PATH", default_value = "/etc/mesh-host/declaration.d")]
    pub declaration: PathBuf,
    /// Where the declaration came from: `declared` (the mesh) or `bundle` (carried by
    /// hand for a first boot). Orphans are looked for among this origin's records only.
    #[arg(long, value_enum, default_value = "declared")]
    pub origin: Origin,
    /// Where /metrics and /healthz listen; "off" for nowhere.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9787")]
    pub metrics: String,
    /// A Prometheus exporter's web configuration file for /metrics and /healthz (TLS, client
    /// certificates, basic auth), as node_exporter's `--web.config.file` takes it.
    #[arg(long, env = "MESH_HOST_WEB_CONFIG", value_name = "FILE")]
    pub web_config: Option<PathBuf>,
    /// Seconds between full resyncs, beside what the watchers report.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub resync: u64,
    /// Milliseconds the declaration must be still before it is read.
    #[arg(long, value_name = "MS", default_value_t = 50)]
    pub settle_ms: u64,
    /// How many reconciles may run at once: one for files and full passes, the rest for
    /// slow work (a unit's start, a container, an action) so it never holds a file's
    /// correction behind it. 1 runs every reconcile in turn.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub workers: u16,
    /// Take the declaration from etcd instead of `--declaration`: comma-separated endpoints,
    /// such as `http://127.0.0.1:2379`. The last declaration accepted from etcd is kept
    /// beside the state store and applied while etcd cannot be reached.
    #[arg(long, env = "MESH_HOST_ETCD", value_name = "ENDPOINTS", requires = "node")]
    pub etcd: Option<String>,
    /// This node's name in the fleet (with `--etcd`).
    #[arg(long, env = "MESH_HOST_NODE", value_name = "NAME", requires = "etcd")]
    pub node: Option<String>,
    /// A group this node is in (with `--etcd`); repeat it, or separate with commas. Groups
    /// are read in the order given, after the fleet's keys and before the node's own.
    #[arg(
        long = "group",
        env = "MESH_HOST_GROUPS",
        value_name = "GROUP",
        value_delimiter = ',',
        requires = "etcd"
    )]
    pub groups: Vec<String>,
    /// Seconds a new generation from etcd has to be confirmed (with `--etcd`): once applied,
    /// the node dials etcd afresh and has its status at the new revision written. If etcd
    /// answered before the change and not within this window, the node goes back to the
    /// generation before by itself, held there as by `mesh-host rollback`, and its status
    /// says `reverted`. 0 turns it off.
    #[arg(
        long,
        env = "MESH_HOST_CONFIRM_WINDOW",
        value_name = "SECONDS",
        default_value_t = crate::fleet::confirm::DEFAULT_WINDOW.as_secs()
    )]
    pub confirm_window: u64,
    /// Seconds the node's presence key (`/mesh-host/node/NODE/alive`) outlives its last renewal
    /// (with `--etcd`): the lease is renewed every third of it, so a node that stops is seen gone
    /// (by `fleet status` and by a rollout's planning) within this. Longer asks less of etcd: the
    /// leader renews every node's lease, 3,333 renewals a second at 10,000 nodes with the default
    /// (README, "Fleet": what to set for a large fleet).
    #[arg(
        long,
        env = "MESH_HOST_PRESENCE_TTL",
        value_name = "SECONDS",
        default_value_t = crate::fleet::status::ALIVE_TTL.as_secs(),
        value_parser = clap::value_parser!(u64).range(3..=3600)
    )]
    pub presence_ttl: u64,
    /// TLS and the login to etcd's auth, when they are on.
    #[command(flatten)]
    pub login: EtcdLogin,
    /// Signed declarations: a local `--declaration` directory's, or each scope's read from etcd.
    #[command(flatten)]
    pub trust: TrustArgs,
}

/// Raises the daemon's soft limit on open files to the hard limit, and says so once: before
/// anything opens a descriptor or sizes itself by the limit (the HTTP server's connections), so a
/// daemon started from a shell (1,024) gets what the unit would give it.
pub(super) fn raise_descriptor_limit() {
    match crate::system::raise_descriptor_limit() {
        Ok((before, soft, hard)) if before < soft => {
            tracing::info!(
                before,
                soft,
                hard,
                "raised the limit on open files from {before} to {soft}, the hard limit"
            )
        }
        Ok((_, soft, hard)) => {
            tracing::info!(soft, hard, "the limit on open files is {soft} (the hard limit is {hard})")
        }
        Err(e) => tracing::warn!(error = %e, "cannot raise the limit on open files; it stays as started"),
    }
}

/// `mesh-host run`: the controller, and the fleet's tasks beside it when the declaration comes
/// from etcd. The face starts both; the controller is handed a directory to read and gives out
/// what it applied, and knows nothing of etcd (`controller`'s module doc).
/// The last declaration accepted from etcd, beside the state store: what the controller reads
/// as its source, and what a restart applies while etcd is out of reach (docs/decisions.md,
/// "The cache is the declaration source"). Its directory is made (private) when it is not there.
fn fleet_cache(state: &Path) -> anyhow::Result<std::path::PathBuf> {
    let dir = crate::store::state_dir(state).join("fleet");
    crate::system::fs::private_dir(&dir)
        .with_context(|| format!("cannot make the fleet cache directory {}", dir.display()))?;
    Ok(dir.join("declaration.d"))
}

pub(super) fn daemon(args: RunArgs, state: &Path, reach: Reach) -> anyhow::Result<Ended> {
    raise_descriptor_limit();
    let RunArgs {
        declaration,
        origin,
        metrics,
        web_config,
        resync,
        settle_ms,
        workers,
        etcd,
        node,
        groups,
        confirm_window,
        presence_ttl,
        login,
        trust,
    } = args;
    let mut trust = sign::daemon_trust(&trust, etcd.is_some(), &declaration, state)?;
    let trust_policy = trust.as_ref().and_then(|t| t.policy()).map(|p| (p.version, p.expires));
    let metrics = match metrics.as_str() {
        "off" | "none" => None,
        addr => Some(addr.parse().map_err(|e| Usage(format!("--metrics {addr:?}: {e}")))?),
    };
    // Read and checked now, so a mistake stops the agent before it touches anything.
    let web = match &web_config {
        Some(path) => Some(
            crate::telemetry::web::WebConfigFile::open(path).map_err(|e| Usage(format!("mesh-host: {e}")))?,
        ),
        None => None,
    };
    let mut declaration = std::path::absolute(&declaration)?;
    let fleet = match (etcd, node) {
        (Some(endpoints), Some(node)) => {
            crate::fleet::check_name("--node", &node).map_err(|e| Usage(format!("mesh-host: {e}")))?;
            let groups = sign::node_groups(trust.as_ref(), &node, groups)?;
            let client = login.node_client(&endpoints)?;
            declaration = fleet_cache(state)?;
            // Signed declarations from etcd are verified by the source, before the cache.
            let trust = trust.take().map(|t| (t, state.to_owned()));
            let presence_ttl = std::time::Duration::from_secs(presence_ttl);
            Some((crate::fleet::source::Source { endpoints, node, groups, trust, presence_ttl }, client))
        }
        _ => None,
    };
    let config = crate::controller::Config {
        declaration: declaration.clone(),
        state: state.to_owned(),
        origin,
        metrics,
        web,
        resync: std::time::Duration::from_secs(resync.max(1)), // 0 would loop: 1 s at least
        quiet: std::time::Duration::from_millis(settle_ms),
        queue: crate::controller::queue::Config::default(),
        bus: reach.bus,
        container_socket: reach.socket,
        workers: usize::from(workers),
        step_timeout: reach.step_timeout,
        archive_limits: reach.archive_limits,
        keep_max_bytes: reach.keep_max_bytes,
        key: reach.key,
        keep_generations: reach.keep,
        trust,
        signed_summary: fleet.as_ref().is_some_and(|(source, _)| source.trust.is_some()),
        trust_policy,
    };
    tokio::runtime::Handle::current().block_on(async move {
        // The controller first: it takes the store's lock, so a second agent on the same state
        // stops before its fleet tasks could write the cache or the node's status.
        let daemon = crate::controller::Daemon::start(config).await?;
        let beside = match fleet {
            Some((source, client)) => {
                let given = crate::fleet::daemon::Beside {
                    shutdown: daemon.shutdown(),
                    metrics: daemon.metrics(),
                    applied: daemon.applied(),
                };
                // Read before the first pass: the generation a new one would go back to.
                let generations = crate::generations::Generations::of(state);
                let fleet_dir = crate::store::state_dir(state).join("fleet");
                let signed = source.trust.is_some();
                let confirm = crate::fleet::confirm::Confirm {
                    window: std::time::Duration::from_secs(confirm_window),
                    in_force: generations.in_force(),
                    generations,
                    file: std::sync::Arc::new(crate::fleet::pending::WindowFile::in_dir(&fleet_dir)),
                    signed,
                };
                crate::fleet::daemon::start(source, client, declaration, confirm, given).await
            }
            None => Vec::new(),
        };
        daemon.run(beside).await
    })?;
    Ok(Ended::Converged)
}
