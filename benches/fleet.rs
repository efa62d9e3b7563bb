//! The fleet (issue 14, item 6), on this machine: N agents (each with its own state directory
//! and a one-file declaration of its own, in a mount namespace of its own where its directory
//! is bind-mounted over the path the fleet declares) on one private etcd member, one fleet-wide
//! write, and the time until every agent's status reports a revision at or past that write's,
//! converged; etcd's write rate, its CPU and the TCP connections to it from the idle agents (from
//! the kernel's socket tables, as `ss -tnp`); each agent's resident size; the agents' CPU for the
//! change and etcd's WAL fsyncs meanwhile, which say where the time went.
//!
//! `cargo bench --bench fleet` (a release build), or, where no release build may be made,
//! `cargo test --bench fleet` (the debug build; `harness = false`, so this runs either way).
//! `MESH_HOST_BENCH_AGENTS` sets N (default 100). Runs as root, with Debian's etcd-server and
//! etcd-client (tests/testbed/50-etcd.sh installs them). Figures go in BENCHMARKS.md.
//!
//! Each agent holds two inotify instances, and Linux allows 128 per user by default, shared by
//! every root process on the machine: past about 60 agents the later ones would stop at
//! start-up. So when the limit is lower than the run needs, the bench raises
//! `fs.inotify.max_user_instances` (a machine-wide sysctl), says so, and puts the old value back
//! when it ends, however it ends. Everything else is under a temporary directory, and every
//! process it started is stopped by its id.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::BufRead as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::fleet::{connections, free_port, quantile, start_rollout, status_of, wait_until, Etcd, Stopped};

const INOTIFY: &str = "/proc/sys/fs/inotify/max_user_instances";

/// The inotify limit raised for the run, put back when dropped.
struct Raised(Option<u64>);

impl Raised {
    fn to_at_least(wanted: u64) -> Raised {
        let before: u64 = std::fs::read_to_string(INOTIFY).unwrap().trim().parse().unwrap();
        if before >= wanted {
            return Raised(None);
        }
        std::fs::write(INOTIFY, wanted.to_string()).expect("the bench runs as root");
        eprintln!(
            "fleet bench: raised fs.inotify.max_user_instances from {before} to {wanted} for this run (two inotify instances per agent); it is put back to {before} at the end"
        );
        Raised(Some(before))
    }
}

impl Drop for Raised {
    fn drop(&mut self) {
        if let Some(before) = self.0 {
            let _ = std::fs::write(INOTIFY, before.to_string());
            eprintln!("fleet bench: fs.inotify.max_user_instances put back to {before}");
        }
    }
}

/// `fleet put`; the revision it wrote at.
fn put(binary: &Path, work: &Path, url: &str, scope: &[&str], path: &Path) -> i64 {
    let out = Command::new(binary)
        .arg("--state")
        .arg(work.join("cli/state.json"))
        .args(["fleet", "put", "--etcd", url])
        .args(scope)
        .arg(path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "fleet put: {}", String::from_utf8_lossy(&out.stderr));
    stdout.split("at revision ").nth(1).and_then(|r| r.split(':').next()).unwrap().parse().unwrap()
}

/// The fleet's declaration: one file at `target/fleet.conf`, which each agent writes into its
/// own directory (bind-mounted over `target` in its own mount namespace, as machines of their
/// own would), its content `indent`'s, so that every agent reads, accepts and applies a new
/// declaration at a new revision, and the file's content says which.
fn fleet_declaration(dir: &Path, target: &Path, indent: usize) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let declaration = serde_json::json!({"version": 1, "resources": [{"type": "file", "id": "fleet.conf",
        "path": target.join("fleet.conf"), "content": format!("change {indent}\n")}]});
    std::fs::write(dir.join("base.json"), declaration.to_string()).unwrap();
    dir.to_owned()
}

/// Agent `i`: `mesh-host run` in a mount namespace of its own (util-linux's `unshare`, which
/// execs: the pid is the agent's), its directory `n{i}/own` bind-mounted over `target`.
fn agent(binary: &Path, work: &Path, target: &Path, url: &str, i: usize) -> Stopped {
    let dir = work.join(format!("n{i}"));
    std::fs::create_dir_all(dir.join("own")).unwrap();
    Stopped(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(r#"mount --bind "$1" "$2" && shift 2 && exec "$@""#)
            .arg("sh")
            .arg(dir.join("own"))
            .arg(target)
            .arg(binary)
            .env("MESH_HOST_LOG", "warn")
            .arg("--state")
            .arg(dir.join("state/state.json"))
            .args(["run", "--etcd", url, "--node", &format!("bench-{i}"), "--metrics", "off"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("log")).unwrap())
            .spawn()
            .expect("unshare (util-linux) starts mesh-host"),
    )
}

/// A staged rollout of a new fleet-wide declaration to every agent, and its promote: see
/// `main`. `statuses` carries etcd's watch of the node keys, each line stamped as it came.
fn staged(
    binary: &Path,
    work: &Path,
    url: &str,
    agents: usize,
    statuses: &mpsc::Receiver<(Instant, String)>,
) -> serde_json::Value {
    let candidate = fleet_declaration(&work.join("candidate"), &work.join("target"), 40);
    let start = Instant::now();
    let (child, lines) = start_rollout(binary, work, url, &candidate, "300");
    let driver = Stopped(child);
    // (when, node, revision, converged) for every status written meanwhile.
    let mut seen: Vec<(Instant, String, i64, bool)> = Vec::new();
    let take = |wait: Duration, seen: &mut Vec<(Instant, String, i64, bool)>| {
        while let Ok((at, line)) = statuses.recv_timeout(wait) {
            let response: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            for event in response["Events"].as_array().map(Vec::as_slice).unwrap_or_default() {
                if let Some((node, status)) = status_of(&event["kv"]) {
                    seen.push((
                        at,
                        node,
                        status["revision"].as_i64().unwrap_or(0),
                        status["converged"] == true,
                    ));
                }
            }
        }
    };
    let mut driver = driver;
    let exited = loop {
        take(Duration::from_millis(100), &mut seen);
        if let Some(status) = driver.0.try_wait().unwrap() {
            // Reaped: its pid is no longer its own to signal.
            std::mem::forget(driver);
            break status;
        }
        assert!(start.elapsed() < Duration::from_secs(600), "the rollout did not end in 10 min");
    };
    let driven = start.elapsed().as_secs_f64();
    take(Duration::from_millis(500), &mut seen);
    let said: Vec<(Instant, String)> = lines.try_iter().collect();
    assert!(exited.success(), "fleet rollout start: {said:?}");
    // "wave K of N open at revision R: a, b, c" (the names cut short past a few); a wave's
    // nodes are those admitted from its revision to the next wave's, read from etcd before
    // the promote deletes the rollout's keys.
    let opens = common::fleet::wave_opens(&said);
    let admitted = common::fleet::Etcd { url: url.to_owned() }.admissions();
    let mut waves = Vec::new();
    let mut last_converged = 0.0f64;
    for (k, (opened, revision)) in opens.iter().enumerate() {
        let (opened, revision) = (opened, *revision);
        let next = opens.get(k + 1).map_or(i64::MAX, |(_, r)| *r);
        let nodes: Vec<&str> = admitted
            .iter()
            .filter(|(_, at)| (revision..next).contains(at))
            .map(|(n, _)| n.as_str())
            .collect();
        let converged: Vec<f64> = nodes
            .iter()
            .filter_map(|n| {
                seen.iter()
                    .find(|(at, node, r, ok)| node == n && *r >= revision && *ok && at >= opened)
                    .map(|(at, ..)| (*at - start).as_secs_f64())
            })
            .collect();
        let all = converged.iter().copied().fold(0.0, f64::max);
        last_converged = last_converged.max(all);
        waves.push(serde_json::json!({
            "nodes": nodes.len(),
            "reported": converged.len(),
            "opened_s": (*opened - start).as_secs_f64(),
            "all_converged_s": all,
            "open_to_all_converged_s": all - (*opened - start).as_secs_f64(),
        }));
    }
    let promote_start = Instant::now();
    let out = Command::new(binary)
        .arg("--state")
        .arg(work.join("cli/state.json"))
        .args(["fleet", "rollout", "promote", "--etcd", url])
        .output()
        .unwrap();
    assert!(out.status.success(), "fleet rollout promote: {}", String::from_utf8_lossy(&out.stderr));
    let promote_s = promote_start.elapsed().as_secs_f64();
    serde_json::json!({
        "agents": agents,
        "waves_spec": "1,10%,100%",
        "soak_s": 0,
        "waves": waves,
        "start_to_every_node_converged_s": last_converged,
        "driver_exited_s": driven,
        "promote_command_s": promote_s,
    })
}

fn main() {
    let agents: usize =
        std::env::var("MESH_HOST_BENCH_AGENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let binary = Path::new(env!("CARGO_BIN_EXE_mesh-host"));
    assert!(nix::unistd::geteuid().is_root(), "the fleet bench runs as root: the agents are the real daemon");
    // Two per agent, and room for whatever else runs as root here.
    let _raised = Raised::to_at_least((agents as u64 * 2 + 256).max(1024));
    let work = tempfile::Builder::new().prefix("mesh-host-fleet-bench-").tempdir_in("/var/tmp").unwrap();
    let work = work.path();
    let (client, peer) = (free_port(), free_port());
    let etcd = Etcd { url: format!("http://127.0.0.1:{client}") };
    let peer = format!("http://127.0.0.1:{peer}");
    let etcd_process = Stopped(
        Command::new("etcd")
            .args(["--name", "bench", "--data-dir"])
            .arg(work.join("etcd"))
            .args(["--listen-client-urls", &etcd.url, "--advertise-client-urls", &etcd.url])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("bench={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd (Debian's etcd-server) starts; tests/testbed/50-etcd.sh installs it"),
    );
    assert!(
        wait_until(Duration::from_secs(20), || etcd.ctl(&["endpoint", "health"]).status.success()),
        "the bench's etcd did not come up"
    );

    // Each agent's own key: a file of its own, so agents do not fight over one path.
    for i in 0..agents {
        let dir = work.join(format!("n{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let own = serde_json::json!({"version": 1, "resources": [{"type": "file", "id": "own.conf",
            "path": dir.join("own.conf"), "content": format!("node {i}\n")}]});
        std::fs::write(dir.join("own.json"), own.to_string()).unwrap();
        put(binary, work, &etcd.url, &["--node", &format!("bench-{i}")], &dir.join("own.json"));
    }
    let target = work.join("target");
    std::fs::create_dir_all(&target).unwrap();
    put(binary, work, &etcd.url, &["--fleet"], &fleet_declaration(&work.join("fleet"), &target, 1));
    let nodes: Vec<Stopped> = (0..agents).map(|i| agent(binary, work, &target, &etcd.url, i)).collect();
    let converged = || etcd.statuses().iter().filter(|(_, s)| s["converged"] == true).count();
    wait_until(Duration::from_secs(300), || converged() == agents);
    let ready = converged();
    std::thread::sleep(Duration::from_secs(2));

    // Idle: etcd's revisions a second and its CPU with nothing declared changing, and the
    // connections the agents hold to it.
    let etcd_pid = etcd_process.0.id();
    let (r0, t0, etcd_cpu0) = (etcd.revision(), Instant::now(), common::cpu_seconds(etcd_pid));
    std::thread::sleep(Duration::from_secs(10));
    let idle_secs = t0.elapsed().as_secs_f64();
    let idle_rate = (etcd.revision() - r0) as f64 / idle_secs;
    let idle_etcd_cpu = 100.0 * (common::cpu_seconds(etcd_pid) - etcd_cpu0) / idle_secs;
    let per_agent: Vec<usize> = nodes.iter().map(|n| connections(n.0.id(), client, false)).collect();
    let etcd_side = connections(etcd_pid, client, true);

    // A watch on every node's keys, started before the write, stamps each status as etcd
    // delivers it (a poll would measure its own length: on a loaded machine one etcdctl start
    // takes a good part of a second).
    let mut watch = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &etcd.url, "watch", "--prefix", "/mesh-host/node/", "-w", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel::<(Instant, String)>();
    let lines = std::io::BufReader::new(watch.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in lines.lines().map_while(Result::ok) {
            if tx.send((Instant::now(), line)).is_err() {
                return;
            }
        }
    });
    let _watch = Stopped(watch);
    std::thread::sleep(Duration::from_secs(1));

    let pids: Vec<u32> = nodes.iter().map(|n| n.0.id()).collect();
    let cpu = || pids.iter().map(|&p| common::cpu_seconds(p)).sum::<f64>();
    let (fsyncs0, cpu0) = (etcd.wal_fsyncs(), cpu());
    // Timed from before `fleet put` starts, so the CLI's own time counts against the agents;
    // and from its return, when the write is known to be in etcd.
    let start = Instant::now();
    let written =
        put(binary, work, &etcd.url, &["--fleet"], &fleet_declaration(&work.join("fleet"), &target, 22));
    let put_took = start.elapsed().as_secs_f64();
    let mut seen = std::collections::BTreeMap::new();
    let deadline = start + Duration::from_secs(120);
    while seen.len() < agents {
        let Ok((at, line)) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) else {
            break;
        };
        let response: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        for event in response["Events"].as_array().map(Vec::as_slice).unwrap_or_default() {
            if let Some((node, status)) = status_of(&event["kv"]) {
                if status["revision"].as_i64().unwrap_or(0) >= written && status["converged"] == true {
                    seen.entry(node).or_insert((at - start).as_secs_f64());
                }
            }
        }
    }
    let (cpu_used, fsyncs1) = (cpu() - cpu0, etcd.wal_fsyncs());
    let (fsync_count, fsync_seconds) = (fsyncs1.0 - fsyncs0.0, fsyncs1.1 - fsyncs0.1);
    let mut times: Vec<f64> = seen.values().copied().collect();
    times.sort_by(f64::total_cmp);
    let mut rss: Vec<f64> = pids.iter().map(|&p| common::status_kib(p, "VmRSS") as f64 / 1024.0).collect();
    rss.sort_by(f64::total_cmp);

    // The same kind of change, staged: `fleet rollout start --waves 1,10%,100% --soak 0`,
    // each wave timed from the driver's line that opens it (stamped as it is printed) to the
    // last of its nodes' statuses at or past the wave's revision, converged, as etcd delivers
    // them; then the promote.
    let rollout = staged(binary, work, &etcd.url, agents, &rx);
    // What the rollout's candidate declares, on each agent's own disk.
    let holding = (0..agents)
        .filter(|i| {
            std::fs::read_to_string(work.join(format!("n{i}/own/fleet.conf"))).ok().as_deref()
                == Some("change 40\n")
        })
        .count();

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let report = serde_json::json!({
        "rollout": rollout,
        "agents_holding_the_candidates_file": holding,
        "binary": binary,
        "agents": agents,
        "converged_before_the_write": ready,
        "reported": times.len(),
        "written_at_revision": written,
        "convergence_s": (!times.is_empty()).then(|| serde_json::json!({
            "p50": quantile(&times, 0.50), "p99": quantile(&times, 0.99), "max": times[times.len() - 1],
        })),
        "fleet_put_s": put_took,
        "after_the_put_returned_s": (!times.is_empty()).then(|| serde_json::json!({
            "p50": quantile(&times, 0.50) - put_took, "p99": quantile(&times, 0.99) - put_took,
            "max": times[times.len() - 1] - put_took,
        })),
        "idle_etcd_revisions_per_s": idle_rate,
        "idle_etcd_cpu_percent": idle_etcd_cpu,
        "idle_connections": {
            "agents_total": per_agent.iter().sum::<usize>(),
            "per_agent_min": per_agent.iter().min(),
            "per_agent_max": per_agent.iter().max(),
            "etcd_client_port_total": etcd_side,
        },
        "agent_rss_mib": {"median": quantile(&rss, 0.5), "max": rss[rss.len() - 1]},
        // What one fleet-wide change cost the agents (read, cache, parse, apply, status).
        "agent_cpu_for_the_change_ms": {"total": cpu_used * 1000.0, "per_agent": cpu_used * 1000.0 / agents as f64},
        // etcd's group commit: the fsyncs that carried the write and the status writes.
        "etcd_wal_fsyncs_during_the_write": {
            "count": fsync_count,
            "mean_ms": (fsync_count > 0.0).then(|| 1000.0 * fsync_seconds / fsync_count),
        },
        "load_average": load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    let missing: Vec<String> =
        (0..agents).map(|i| format!("bench-{i}")).filter(|n| !seen.contains_key(n)).collect();
    if !missing.is_empty() {
        eprintln!(
            "fleet bench: {} agents never reported the write: {missing:?} (their logs: {}/nN/log)",
            missing.len(),
            work.display()
        );
    }
    drop(nodes);
}
