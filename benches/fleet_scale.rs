//! The fleet at 1,000 to 10,000 nodes (issue 43, item 4), as kubemark measures Kubernetes: hollow
//! nodes. Each hollow node runs the agent's real fleet code in this one process (the etcd
//! source writing its cache directory, the status writer with its presence lease, the
//! confirmation task), each with its own etcd connection, over a faked machine: a small
//! stand-in for the controller takes every declaration the source caches as applied and
//! converged, and publishes it as the controller would. Only the machine is faked: what etcd
//! sees from a hollow node is what it sees from a real one.
//!
//! Against a 3-member etcd on this machine (Debian's etcd-server and etcd-client; data on disk,
//! under /var/tmp), for each size it measures:
//! - the time for all nodes to start and report;
//! - idle: etcd's CPU, resident size and revisions a second, and the connections each member
//!   holds;
//! - a fleet-wide `fleet put` until every node's status reports it converged (p50, p99, max,
//!   from an etcdctl watch started before the write, so the time is what etcd saw);
//! - a rollout `1,10%,100%` with soak 0, from `start` to every node converged, per wave;
//! - `fleet status`: its time and output size;
//! - `MESH_HOST_BENCH_CHANGES` more fleet-wide changes (default 10), then etcd's database size,
//!   its CPU and resident size at rest again, and the database after a compaction and
//!   defragmentation;
//! - the machine's load average (it is shared) at rest, after the put and after the rollout.
//!
//! `cargo bench --bench fleet_scale` (a release build); `MESH_HOST_BENCH_HOLLOW=1000,5000,10000`
//! chooses the sizes (default 1000); `MESH_HOST_BENCH_IN_ORDER=1` has every node dial the first
//! member first, as `--etcd-in-order` does; `MESH_HOST_BENCH_ELECTION_MS` sets etcd's election
//! timeout (`timing`); `MESH_HOST_BENCH_PRESENCE_TTL` the nodes' `--presence-ttl`; `MESH_HOST_BENCH_RAMP` starts
//! the nodes at that many a second rather than all at once (`ramp`). Runs as root (it raises its descriptor limit). Hollow
//! nodes keep their state on /dev/shm. Figures go in BENCHMARKS.md, "The fleet at scale".
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::fleet::{connections, free_port, quantile, start_rollout, status_of, wait_until, Etcd, Stopped};
use mesh_host::controller::Applied;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

/// etcd's raft timing: its defaults (100 ms heartbeats, a 1 s election timeout), or with
/// `MESH_HOST_BENCH_ELECTION_MS=T` an election timeout of T and heartbeats of T/10, as etcd's
/// tuning guide advises where members are starved of CPU: on two cores shared by the three
/// members, thousands of hollow nodes and other builds, the default timing lost its leader
/// every few seconds at 5,000 nodes. No limit changes (transactions, request size, quota).
fn timing() -> Vec<String> {
    match std::env::var("MESH_HOST_BENCH_ELECTION_MS").ok().and_then(|v| v.parse::<u64>().ok()) {
        Some(t) => vec![
            "--election-timeout".into(),
            t.to_string(),
            "--heartbeat-interval".into(),
            (t / 10).to_string(),
        ],
        None => Vec::new(),
    }
}

/// The hollow nodes' `--presence-ttl`: `MESH_HOST_BENCH_PRESENCE_TTL` seconds, or the agent's default.
fn presence_ttl() -> Duration {
    std::env::var("MESH_HOST_BENCH_PRESENCE_TTL")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(mesh_host::fleet::status::ALIVE_TTL, Duration::from_secs)
}

/// How fast the hollow nodes start: `MESH_HOST_BENCH_RAMP` nodes a second, or all at once (the
/// default, as every agent of a fleet restarts together after an outage). A ramp is a fleet
/// coming up over a minute or so, as nodes boot or a deployment tool reaches them. At 10,000
/// nodes on this machine's two cores the leases churned either way (BENCHMARKS.md, "The fleet
/// at 10,000 started over 50 s").
fn ramp() -> Option<f64> {
    std::env::var("MESH_HOST_BENCH_RAMP").ok().and_then(|v| v.parse().ok()).filter(|r: &f64| *r > 0.0)
}

/// A 3-member etcd cluster, each member on its own ports and data directory.
struct Cluster {
    members: Vec<(Stopped, u16)>,
    endpoints: String,
}

impl Cluster {
    fn start(work: &Path) -> Cluster {
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let initial: Vec<String> =
            ports.iter().enumerate().map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}")).collect();
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, &(client, peer))| {
                let url = format!("http://127.0.0.1:{client}");
                let peer = format!("http://127.0.0.1:{peer}");
                let child = Command::new("etcd")
                    .args(["--name", &format!("m{i}"), "--data-dir"])
                    .arg(work.join(format!("etcd-m{i}")))
                    .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
                    .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
                    .args(["--initial-cluster", &initial.join(","), "--initial-cluster-state", "new"])
                    .args(timing())
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(work.join(format!("etcd-m{i}.log"))).unwrap())
                    .spawn()
                    .expect("etcd (Debian's etcd-server) starts; tests/testbed/50-etcd.sh installs it");
                (Stopped(child), client)
            })
            .collect::<Vec<_>>();
        let endpoints =
            ports.iter().map(|(c, _)| format!("http://127.0.0.1:{c}")).collect::<Vec<_>>().join(",");
        let cluster = Cluster { members, endpoints };
        assert!(
            wait_until(Duration::from_secs(60), || cluster
                .etcd()
                .ctl(&["endpoint", "health", "--cluster"])
                .status
                .success()),
            "the bench's etcd cluster did not come up (logs under {})",
            work.display()
        );
        cluster
    }

    /// etcdctl against every member.
    fn etcd(&self) -> Etcd {
        Etcd { url: self.endpoints.clone() }
    }

    /// Each member's (CPU seconds, resident KiB).
    fn usage(&self) -> Vec<(f64, u64)> {
        self.members
            .iter()
            .map(|(m, _)| (common::cpu_seconds(m.0.id()), common::status_kib(m.0.id(), "VmRSS")))
            .collect()
    }

    /// Each member's database size, in MiB.
    fn db_mib(&self) -> Vec<f64> {
        let out = self.etcd().ctl(&["endpoint", "status", "-w", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v.as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|m| m["Status"]["dbSize"].as_f64().unwrap_or(0.0) / 1048576.0)
            .collect()
    }

    /// The established connections each member holds on its client port.
    fn connections(&self) -> Vec<usize> {
        self.members.iter().map(|(m, port)| connections(m.0.id(), *port, true)).collect()
    }
}

/// Every 5 s until dropped, one line on stderr of what the three members did meanwhile: each
/// one's CPU, the proposals committed but not yet applied and pending, leader changes, slow
/// and failed read indexes (a linearizable read waits on one), and the calls started a second
/// by method, over the three. What held a member up, read off etcd's own counters.
struct Pulse {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Pulse {
    fn start(cluster: &Cluster) -> Pulse {
        let urls: Vec<String> = cluster.endpoints.split(',').map(str::to_owned).collect();
        let pids: Vec<u32> = cluster.members.iter().map(|(m, _)| m.0.id()).collect();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let scrape = || -> Vec<std::collections::BTreeMap<String, f64>> {
                urls.iter().map(|u| common::fleet::etcd_metrics(u)).collect()
            };
            let start = Instant::now();
            let (mut before, mut cpu, mut at) =
                (scrape(), pids.iter().map(|p| common::cpu_seconds(*p)).collect::<Vec<_>>(), Instant::now());
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(5));
                let (now, cpu_now) =
                    (scrape(), pids.iter().map(|p| common::cpu_seconds(*p)).collect::<Vec<_>>());
                let secs = at.elapsed().as_secs_f64();
                let delta = |name: &str| -> f64 {
                    now.iter()
                        .zip(&before)
                        .map(|(n, b)| n.get(name).unwrap_or(&0.0) - b.get(name).unwrap_or(&0.0))
                        .sum()
                };
                let gauge =
                    |name: &str| -> f64 { now.iter().map(|n| n.get(name).copied().unwrap_or(0.0)).sum() };
                let lag = now
                    .iter()
                    .map(|n| {
                        n.get("etcd_server_proposals_committed_total").unwrap_or(&0.0)
                            - n.get("etcd_server_proposals_applied_total").unwrap_or(&0.0)
                    })
                    .fold(0.0, f64::max);
                let cpus: Vec<String> =
                    cpu_now.iter().zip(&cpu).map(|(n, b)| format!("{:.0}", 100.0 * (n - b) / secs)).collect();
                let calls: Vec<String> =
                    ["Range", "Txn", "Put", "LeaseGrant", "LeaseKeepAlive", "LeaseRevoke", "Watch"]
                        .iter()
                        .map(|m| format!("{m} {:.0}", delta(m) / secs))
                        .collect();
                let moves = mesh_host::system::etcd_counts();
                eprintln!(
                    "fleet_scale: pulse clients: members left silent {}, left on a refusal {}, kept busy {} (the client late {}; renewals answered past the call timeout {}); last refusal: {}",
                    moves.left_silent, moves.left_refused, moves.kept_busy, moves.kept_late, moves.answered_late, moves.last_refusal
                );
                eprintln!(
                    "fleet_scale: pulse +{:.0}s load {:.1}: cpu {} %; apply lag {lag:.0}, pending {:.0}; leader changes {:.0}; read index slow {:.0} failed {:.0}; started/s {}",
                    start.elapsed().as_secs_f64(),
                    load(),
                    cpus.join("/"),
                    gauge("etcd_server_proposals_pending"),
                    delta("etcd_server_leader_changes_seen_total"),
                    delta("etcd_server_slow_read_indexes_total"),
                    delta("etcd_server_read_indexes_failed_total"),
                    calls.join(", "),
                );
                (before, cpu, at) = (now, cpu_now, Instant::now());
            }
        });
        Pulse { stop, thread: Some(thread) }
    }
}

impl Drop for Pulse {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The stand-in for the controller: each time the source swaps the node's cache directory
/// (`nudge`), the files it holds are taken as applied and converged, under a new generation,
/// and published as the controller publishes what it applied.
async fn hollow_controller(
    cache: PathBuf,
    nudge: Arc<Notify>,
    applied: watch::Sender<Applied>,
    shutdown: CancellationToken,
) {
    let mut generation = 0u64;
    let mut last: Vec<String> = Vec::new();
    loop {
        let mut names: Vec<String> = std::fs::read_dir(&cache)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| !n.starts_with('.') && n.ends_with(".json"))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        if !names.is_empty() && names != last {
            generation += 1;
            applied.send_replace(Applied {
                sources: names.clone(),
                converged: true,
                generation: Some(generation),
                ..Applied::default()
            });
            last = names;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = nudge.notified() => {}
            // A nudge is never lost (`Notify` keeps one), but the look is cheap.
            _ = tokio::time::sleep(Duration::from_secs(30)) => {}
        }
    }
}

/// Starts hollow node `i`: its fleet tasks and its stand-in controller.
async fn hollow_node(
    i: usize,
    root: PathBuf,
    endpoints: String,
    nudge: Arc<Notify>,
    metrics: Arc<mesh_host::telemetry::Metrics>,
    shutdown: CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let state = root.join(format!("n{i}"));
    let fleet_dir = state.join("fleet");
    let cache = fleet_dir.join("declaration.d");
    let (tx, rx) = watch::channel(Applied::default());
    let controller = tokio::spawn(hollow_controller(cache.clone(), nudge, tx, shutdown.clone()));
    let mut etcd = mesh_host::system::Etcd::new(&endpoints, &Default::default()).expect("endpoints parse");
    // `MESH_HOST_BENCH_IN_ORDER=1`: every node dials the first member first (`--etcd-in-order`),
    // as before issue 43, to weigh the spread against it.
    if std::env::var_os("MESH_HOST_BENCH_IN_ORDER").is_some_and(|v| v == "1") {
        etcd = etcd.in_order();
    }
    let source = mesh_host::fleet::source::Source {
        endpoints,
        node: format!("hollow-{i:05}"),
        groups: Vec::new(),
        trust: None,
        presence_ttl: presence_ttl(),
    };
    let generations = mesh_host::generations::Generations::of(&state.join("state.json"));
    let confirm = mesh_host::fleet::confirm::Confirm {
        window: Duration::ZERO,
        in_force: None,
        generations,
        file: Arc::new(mesh_host::fleet::pending::WindowFile::in_dir(&fleet_dir)),
        signed: false,
    };
    let beside = mesh_host::fleet::daemon::Beside { shutdown, metrics, applied: rx };
    let mut tasks = mesh_host::fleet::daemon::start(source, etcd, cache, confirm, beside).await;
    tasks.push(controller);
    tasks
}

/// One inotify instance for every hollow node: a change in node `i`'s fleet directory (the
/// cache swapped in) nudges node `i`'s stand-in controller.
fn watch_caches(root: &Path, nudges: Arc<Vec<Arc<Notify>>>) -> notify::INotifyWatcher {
    use notify::Watcher as _;
    let nudges_len = nudges.len();
    let mut watcher = notify::INotifyWatcher::new(
        move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            for path in &event.paths {
                let node = path
                    .components()
                    .filter_map(|c| c.as_os_str().to_str()?.strip_prefix('n')?.parse::<usize>().ok())
                    .next_back();
                if let Some(n) = node.and_then(|n| nudges.get(n)) {
                    n.notify_one();
                }
            }
        },
        notify::Config::default(),
    )
    .expect("an inotify instance");
    for i in 0..nudges_len {
        let dir = root.join(format!("n{i}/fleet"));
        watcher
            .watch(&dir, notify::RecursiveMode::NonRecursive)
            .expect("inotify watches (fs.inotify.max_user_watches)");
    }
    watcher
}

/// `fleet put --fleet` of an empty declaration indented by `indent` (so its bytes, and the
/// revision every node reports, change); the revision written.
fn put(binary: &Path, work: &Path, endpoints: &str, indent: usize) -> i64 {
    let dir = work.join(format!("fleet-{indent}"));
    std::fs::create_dir_all(&dir).unwrap();
    let pad = " ".repeat(indent);
    std::fs::write(dir.join("base.json"), format!("{{\n{pad}\"version\": 1,\n{pad}\"resources\": []\n}}\n"))
        .unwrap();
    let out = Command::new(binary)
        .arg("--state")
        .arg(work.join("cli/state.json"))
        .args(["fleet", "put", "--etcd", endpoints, "--fleet"])
        .arg(&dir)
        .output()
        .unwrap();
    if out.status.code() == Some(3) {
        // Sent, its answer lost (etcd busy past the operator's timeout): read back, as the
        // command says to, and go on when the declaration landed.
        eprintln!("fleet put: outcome unknown, read back: {}", String::from_utf8_lossy(&out.stderr).trim());
        let text = std::fs::read(dir.join("base.json")).unwrap();
        return landed(endpoints, "/mesh-host/fleet/declaration/base.json", &text)
            .unwrap_or_else(|| panic!("fleet put: outcome unknown, and etcd does not hold it 60 s later"));
    }
    assert!(out.status.success(), "fleet put: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout.split("at revision ").nth(1).and_then(|r| r.split(':').next()).unwrap().parse().unwrap()
}

/// The revision `key` was last written at, once etcd holds `value` there (up to 60 s).
fn landed(endpoints: &str, key: &str, value: &[u8]) -> Option<i64> {
    use base64::Engine as _;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", endpoints, "--command-timeout", "30s", "get", key, "-w", "json"])
            .output()
            .unwrap();
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let kv = &got["kvs"][0];
        let held =
            kv["value"].as_str().and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok());
        if held.as_deref() == Some(value) {
            return kv["mod_revision"].as_i64();
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    None
}

/// Every status etcd delivers on the node keys, stamped as it came.
struct Statuses {
    rx: mpsc::Receiver<(Instant, String)>,
    /// (when, node, revision, converged), each status taken so far.
    seen: Vec<(Instant, String, i64, bool)>,
    /// Each node's admission to a rollout, by the revision it was written at.
    admitted: std::collections::BTreeMap<String, i64>,
    _watch: Stopped,
}

impl Statuses {
    /// Watches `prefix` (the node keys, or every key for a rollout's admissions too).
    fn watch(endpoints: &str, prefix: &str) -> Statuses {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", endpoints, "watch", "--prefix", prefix, "-w", "json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let lines = std::io::BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in lines.lines().map_while(Result::ok) {
                if tx.send((Instant::now(), line)).is_err() {
                    return;
                }
            }
        });
        std::thread::sleep(Duration::from_secs(1));
        Statuses { rx, seen: Vec::new(), admitted: Default::default(), _watch: Stopped(child) }
    }

    /// Takes what etcd delivered, waiting up to `wait` for the next.
    fn take(&mut self, wait: Duration) -> bool {
        let Ok((at, line)) = self.rx.recv_timeout(wait) else { return false };
        let response: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        for event in response["Events"].as_array().map(Vec::as_slice).unwrap_or_default() {
            if let Some((node, status)) = status_of(&event["kv"]) {
                let revision = status["revision"].as_i64().unwrap_or(0);
                self.seen.push((at, node, revision, status["converged"] == true));
            } else if let Some(node) = admission_of(&event["kv"]).filter(|_| event["type"].is_null()) {
                let revision = event["kv"]["mod_revision"].as_i64().unwrap_or(0);
                self.admitted.insert(node, revision);
            }
        }
        true
    }

    /// When each node in `nodes` (every node, for `None`) first reported `revision` or later,
    /// converged, at or after `after`.
    fn reached(
        &self,
        revision: i64,
        after: Instant,
        nodes: Option<&[&str]>,
    ) -> std::collections::BTreeMap<String, Instant> {
        let mut done = std::collections::BTreeMap::new();
        for (at, node, r, ok) in &self.seen {
            if *r >= revision && *ok && *at >= after && nodes.is_none_or(|n| n.contains(&node.as_str())) {
                done.entry(node.clone()).or_insert(*at);
            }
        }
        done
    }

    /// Waits until `nodes` distinct nodes reported `revision` (or later) converged, or
    /// `patience` ran out; the seconds from `start` at which each did, sorted.
    fn until(&mut self, start: Instant, revision: i64, nodes: usize, patience: Duration) -> Vec<f64> {
        let deadline = Instant::now() + patience;
        let mut said = Instant::now();
        loop {
            // What came in the next 200 ms, then one count (a count per line is quadratic in
            // the fleet, and this process's CPU is the hollow nodes').
            let batch = Instant::now() + Duration::from_millis(200);
            while Instant::now() < batch && self.take(Duration::from_millis(50)) {}
            let done = self.reached(revision, start, None).len();
            if done >= nodes || Instant::now() >= deadline {
                break;
            }
            if said.elapsed() >= Duration::from_secs(10) {
                eprintln!(
                    "fleet_scale: {done} of {nodes} at revision {revision} after {:.0} s",
                    start.elapsed().as_secs_f64()
                );
                said = Instant::now();
            }
        }
        let mut v: Vec<f64> =
            self.reached(revision, start, None).values().map(|at| (*at - start).as_secs_f64()).collect();
        v.sort_by(f64::total_cmp);
        v
    }
}

/// The node a key-value admits to a rollout, when it is an admission.
fn admission_of(kv: &serde_json::Value) -> Option<String> {
    use base64::Engine as _;
    let key = base64::engine::general_purpose::STANDARD.decode(kv["key"].as_str()?).ok()?;
    let key = String::from_utf8(key).ok()?;
    Some(key.strip_prefix("/mesh-host/rollout/open/node/")?.strip_suffix("/admitted")?.to_owned())
}

fn spread(v: &[f64]) -> serde_json::Value {
    if v.is_empty() {
        return serde_json::json!({"n": 0});
    }
    serde_json::json!({"n": v.len(), "p50_s": quantile(v, 0.5), "p99_s": quantile(v, 0.99), "max_s": v[v.len() - 1]})
}

/// A rollout `1,10%,100%` with soak 0 of a new fleet-wide declaration: from `start` to the
/// driver's end; each wave's opening (the driver's line "wave K of N open at revision R:
/// nodes", stamped as it came) and the time until its last node reported converged.
fn rollout(binary: &Path, work: &Path, endpoints: &str) -> serde_json::Value {
    let mut statuses = Statuses::watch(endpoints, "/mesh-host/");
    let dir = work.join("candidate");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("base.json"), "{\"version\": 1, \"resources\": []}\n").unwrap();
    let start = Instant::now();
    let (mut child, lines) = start_rollout(binary, work, endpoints, &dir, "600");
    let exited = loop {
        statuses.take(Duration::from_millis(50));
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(start.elapsed() < Duration::from_secs(900), "the rollout did not end in 15 min");
    };
    let driver_s = start.elapsed().as_secs_f64();
    while statuses.take(Duration::from_millis(500)) {}
    let said: Vec<(Instant, String)> = lines.try_iter().collect();
    // Each wave's opening: when the driver said so, and the revision of its state's write.
    let opens = common::fleet::wave_opens(&said);
    let mut waves = Vec::new();
    for (k, (opened, revision)) in opens.iter().enumerate() {
        let (opened, revision) = (opened, *revision);
        // Its nodes: those admitted at or after its opening and before the next's.
        let next = opens.get(k + 1).map_or(i64::MAX, |(_, r)| *r);
        let nodes: Vec<&str> = statuses
            .admitted
            .iter()
            .filter(|(_, at)| (revision..next).contains(*at))
            .map(|(n, _)| n.as_str())
            .collect();
        let reached = statuses.reached(revision, *opened, Some(&nodes));
        let last = reached.values().max().map(|at| (*at - *opened).as_secs_f64());
        waves.push(serde_json::json!({
            "nodes": nodes.len(),
            "reported": reached.len(),
            "opened_s": (*opened - start).as_secs_f64(),
            "open_to_last_converged_s": last,
        }));
    }
    let promote = Instant::now();
    let rollout_command = |verb: &str| {
        Command::new(binary)
            .arg("--state")
            .arg(work.join("cli/state.json"))
            .args(["fleet", "rollout", verb, "--etcd", endpoints])
            .output()
            .unwrap()
    };
    let promoted = rollout_command("promote");
    let promote_s = promote.elapsed().as_secs_f64();
    // A rollout that halted (a canary past its deadline, as at 10,000 nodes on this machine) is
    // not promoted and stays open, and an open rollout refuses every `fleet put`: aborted, so
    // that the changes after it are still measured, and said.
    let aborted = (!promoted.status.success()).then(|| {
        let out = rollout_command("abort");
        eprintln!(
            "fleet_scale: the rollout was not promoted ({}); aborted: exit {:?} {}",
            String::from_utf8_lossy(&promoted.stderr).trim(),
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        out.status.code()
    });
    serde_json::json!({
        "driver_exit": exited.code(),
        "driver_s": driver_s,
        "waves": waves,
        "promote_exit": promoted.status.code(),
        "promote_s": promote_s,
        "abort_exit": aborted,
    })
}

/// Raises this process's descriptor limit to its hard limit (its children, etcd among them,
/// inherit it): each hollow node holds a connection, and a member may hold every node's. Says
/// which limit stops the run when the hard one is too low for `wanted`.
fn raise_descriptors(wanted: u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("setrlimit to the hard limit");
    assert!(
        hard >= wanted,
        "the hard limit on open files ({hard}) is below the {wanted} this run needs: raise it (ulimit -Hn, or LimitNOFILE=) or run fewer hollow nodes"
    );
}

/// `changes` fleet-wide puts, each waited for until every node applied it; the seconds each
/// took, sorted.
fn more_changes(binary: &Path, work: &Path, endpoints: &str, nodes: usize, changes: usize) -> Vec<f64> {
    let mut each = Vec::new();
    for c in 0..changes {
        let mut statuses = Statuses::watch(endpoints, "/mesh-host/node/");
        let start = Instant::now();
        let written = put(binary, work, endpoints, 3 + c);
        let all = statuses.until(start, written, nodes, Duration::from_secs(300));
        // The last node's time when every node applied it; not a number when some never did
        // within the patience (at 10,000 on this machine), said with how many did.
        each.push(if all.len() == nodes { all.last().copied().unwrap_or(f64::NAN) } else { f64::NAN });
        // Each said as it ends: a run stopped part way still has the changes it made.
        eprintln!(
            "fleet_scale: change {} of {changes}: {} of {nodes} applied, the last after {:.1} s",
            c + 1,
            all.len(),
            all.last().copied().unwrap_or(f64::NAN)
        );
    }
    each.sort_by(f64::total_cmp);
    each
}

/// This machine's load average over the last minute (it is shared: figures say how loaded).
fn load() -> f64 {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().next().and_then(|l| l.parse().ok()).unwrap_or(f64::NAN)
}

/// etcd at rest for 20 s: each member's CPU, resident size and connections, the revisions
/// written a second, the hollow process's size and the machine's load average.
fn at_rest(cluster: &Cluster) -> serde_json::Value {
    let (u0, t0, r0) = (cluster.usage(), Instant::now(), cluster.etcd().revision());
    std::thread::sleep(Duration::from_secs(20));
    let secs = t0.elapsed().as_secs_f64();
    let u1 = cluster.usage();
    let cpu: Vec<f64> = u0.iter().zip(&u1).map(|(a, b)| 100.0 * (b.0 - a.0) / secs).collect();
    serde_json::json!({
        "etcd_cpu_percent_per_member": cpu,
        "etcd_rss_mib_per_member": u1.iter().map(|u| u.1 / 1024).collect::<Vec<_>>(),
        "revisions_per_s": (cluster.etcd().revision() - r0) as f64 / secs,
        "connections_per_member": cluster.connections(),
        "hollow_process_rss_mib": common::status_kib(std::process::id(), "VmRSS") / 1024,
        "load_average": load(),
    })
}

fn one_size(binary: &Path, nodes: usize, changes: usize) -> serde_json::Value {
    let work = tempfile::Builder::new().prefix("mesh-host-fleet-scale-").tempdir_in("/var/tmp").unwrap();
    let shm = tempfile::Builder::new().prefix("mesh-host-hollow-").tempdir_in("/dev/shm").unwrap();
    let (work, root) = (work.path(), shm.path().to_owned());
    let cluster = Cluster::start(work);
    let endpoints = cluster.endpoints.clone();
    let first = put(binary, work, &endpoints, 1);

    // The hollow nodes, on a runtime of their own (two workers: this machine's cores).
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let shutdown = CancellationToken::new();
    let metrics = Arc::new(mesh_host::telemetry::Metrics::new());
    let nudges: Arc<Vec<Arc<Notify>>> = Arc::new((0..nodes).map(|_| Arc::new(Notify::new())).collect());
    for i in 0..nodes {
        std::fs::create_dir_all(root.join(format!("n{i}/fleet"))).unwrap();
    }
    let _watcher = watch_caches(&root, Arc::clone(&nudges));
    let mut statuses = Statuses::watch(&endpoints, "/mesh-host/node/");
    let started = Instant::now();
    let ramp = ramp();
    let tasks: Vec<_> = (0..nodes)
        .map(|i| {
            if let Some(per_s) = ramp {
                let at = started + Duration::from_secs_f64(i as f64 / per_s);
                std::thread::sleep(at.saturating_duration_since(Instant::now()));
            }
            let (root, endpoints, nudge) = (root.clone(), endpoints.clone(), Arc::clone(&nudges[i]));
            runtime.spawn(hollow_node(i, root, endpoints, nudge, Arc::clone(&metrics), shutdown.clone()))
        })
        .collect();
    let up = statuses.until(started, first, nodes, Duration::from_secs(600));
    drop(statuses);
    std::thread::sleep(Duration::from_secs(5));

    let idle = at_rest(&cluster);
    eprintln!("fleet_scale: up {}, at rest {idle}", spread(&up));

    // A fleet-wide put, to every node's status.
    let mut statuses = Statuses::watch(&endpoints, "/mesh-host/node/");
    let start = Instant::now();
    let written = put(binary, work, &endpoints, 2);
    let put_s = start.elapsed().as_secs_f64();
    let applied = statuses.until(start, written, nodes, Duration::from_secs(300));
    drop(statuses);
    let load_put = load();
    eprintln!("fleet_scale: put to applied {} (load {load_put})", spread(&applied));

    // `fleet status`, every node current.
    let status_start = Instant::now();
    let out = Command::new(binary).args(["fleet", "status", "--etcd", &endpoints]).output().unwrap();
    let fleet_status = serde_json::json!({
        "exit": out.status.code(),
        "s": status_start.elapsed().as_secs_f64(),
        "bytes": out.stdout.len(),
    });
    // Each figure said as it is had: a run that ends early keeps those it got.
    eprintln!("fleet_scale: fleet status {fleet_status}");

    let pulse = Pulse::start(&cluster);
    let staged = rollout(binary, work, &endpoints);
    let load_rollout = load();
    eprintln!("fleet_scale: rollout {staged} (load {load_rollout})");

    // More fleet-wide changes, each waited for, then the database before and after compaction;
    // first the promote's own burst (every node reads the promoted scope again) is let pass:
    // at 5,000 nodes on this machine a `fleet put` inside it found no member answering a page
    // of its read within 5 s.
    std::thread::sleep(Duration::from_secs(30));
    let db_before = cluster.db_mib();
    let each = more_changes(binary, work, &endpoints, nodes, changes);
    let db_after = cluster.db_mib();
    drop(pulse);
    let idle_after = at_rest(&cluster);
    let now = cluster.etcd().revision().to_string();
    let compacted = cluster.etcd().ctl(&["compaction", "--physical", &now]).status.success();
    let defragged = cluster.etcd().ctl(&["defrag", "--cluster"]).status.success();
    let db_compacted = cluster.db_mib();

    shutdown.cancel();
    runtime.block_on(async {
        for t in tasks {
            if let Ok(inner) = t.await {
                for t in inner {
                    let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
                }
            }
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(5));
    serde_json::json!({
        "hollow_nodes": nodes,
        "ramp_nodes_per_s": ramp,
        "all_up_s": up.last().copied(),
        "up": spread(&up),
        "idle": idle,
        "put_command_s": put_s,
        "put_to_status_applied": spread(&applied),
        "load_average_after_put": load_put,
        "load_average_after_rollout": load_rollout,
        "rollout": staged,
        "fleet_status": fleet_status,
        "changes": changes,
        "change_to_all_applied_s": spread(&each),
        "db_mib_before_changes": db_before,
        "db_mib_after_changes": db_after,
        "idle_after_changes": idle_after,
        "compacted": compacted && defragged,
        "db_mib_after_compaction": db_compacted,
    })
}

fn main() {
    assert!(nix::unistd::geteuid().is_root(), "the hollow-node bench runs as root (descriptor limits)");
    let sizes: Vec<usize> = std::env::var("MESH_HOST_BENCH_HOLLOW")
        .unwrap_or_else(|_| "1000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("MESH_HOST_BENCH_HOLLOW: sizes, comma-separated"))
        .collect();
    let changes: usize =
        std::env::var("MESH_HOST_BENCH_CHANGES").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let binary = Path::new(env!("CARGO_BIN_EXE_mesh-host"));
    let largest = sizes.iter().copied().max().unwrap_or(0) as u64;
    raise_descriptors(largest + largest / 4 + 1024);
    for nodes in sizes {
        let figures = one_size(binary, nodes, changes);
        println!("{}", serde_json::to_string(&figures).unwrap());
    }
}
