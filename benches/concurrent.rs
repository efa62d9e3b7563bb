//! Hand-edit to put back while slow work goes on beside it (issue 15 point 4): the daemon
//! enforces 10,000 files, a container and a unit; every second the container is killed by hand
//! (`docker kill`) and the unit stopped by hand (another client's StopUnit on the testbed's
//! systemd), and meanwhile files are hand-edited one at a time and timed until they read back
//! as declared. Run three times in one go: the default workers with nothing disturbed (the
//! machine's own noise), the default workers disturbed, and `--workers 1` disturbed (every
//! reconcile in turn, as before), so the figure has both baselines in the same run.
//!
//! Needs Docker with `local/busybox:1` (`tests/testbed/docker.sh`) and the systemd testbed
//! (`tests/testbed/systemd.sh`). `cargo bench --bench concurrent` (a release build), or
//! `cargo bench --bench concurrent --profile dev` for a debug build on a busy machine.
//! MESH_HOST_BENCH_EDITS: edits per run (default 300, 100 ms apart).
#![allow(clippy::disallowed_methods, reason = "a benchmark plays the person at the machine")]

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use notify::{RecursiveMode, Watcher as _};

const ROOT: &str = "/var/lib/machines/mesh-host-testbed";
const SOCKET: &str = "/run/mesh-host-testbed/bus/system_bus_socket";
const PIDFILE: &str = "/run/mesh-host-testbed/nspawn.pid";
const IMAGE: &str = "local/busybox:1";

fn get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

fn metric(port: u16, sample: &str) -> f64 {
    let body = get(port, "/metrics").unwrap_or_default();
    if let Some(v) = body.lines().find_map(|l| l.strip_prefix(sample).and_then(|rest| rest.strip_prefix(' ')))
    {
        return v.trim().parse().unwrap_or(0.0);
    }
    // A sample named with fewer labels than the series carry (the drift counter's `writer`)
    // is their sum.
    let Some(open) = sample.strip_suffix('}') else { return 0.0 };
    let wider = format!("{open},");
    body.lines()
        .filter_map(|l| l.strip_prefix(&wider))
        .filter_map(|rest| rest.rsplit_once("} "))
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .sum()
}

/// `systemctl` inside the testbed, as a person at its console would run it; whether it
/// succeeded.
fn systemctl(args: &[&str]) -> bool {
    let nspawn = std::fs::read_to_string(PIDFILE).expect("the systemd testbed's pid file");
    let children =
        std::fs::read_to_string(format!("/proc/{}/task/{}/children", nspawn.trim(), nspawn.trim()))
            .expect("the testbed's systemd-nspawn runs");
    let pid = children.split_whitespace().next().expect("systemd inside the testbed");
    Command::new("nsenter")
        .args(["-t", pid, "-a", "systemctl"])
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// The daemon on `decl`, ready (its first apply done).
fn start(state: &Path, decl: &Path, port: u16, workers: &str) -> Child {
    // MESH_HOST_BENCH_DAEMON_LOG=FILE: the daemon's log at debug level there, to find what a
    // slow edit waited for (the harness then prints the wall-clock time of each edit over 50 ms).
    let log = std::env::var_os("MESH_HOST_BENCH_DAEMON_LOG");
    let mut command = Command::new(env!("CARGO_BIN_EXE_mesh-host"));
    if let Some(path) = &log {
        command.env("MESH_HOST_LOG", "debug").stderr(std::fs::File::create(path).unwrap());
    } else {
        command.env("MESH_HOST_LOG", "warn");
    }
    let mut child = command
        .arg("--state")
        .arg(state)
        .args(["run", "--declaration"])
        .arg(decl)
        .args(["--metrics", &format!("127.0.0.1:{port}")])
        .args(["--bus", &format!("unix:path={SOCKET}"), "--workers", workers])
        .stdout(Stdio::null())
        .spawn()
        .expect("mesh-host starts");
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        if get(port, "/healthz").is_some_and(|b| b.starts_with("ok")) {
            return child;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the daemon did not become ready");
}

/// Waits until `path` holds `want`, woken by inotify on its directory.
fn put_back(rx: &mpsc::Receiver<notify::Result<notify::Event>>, path: &Path, want: &[u8]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if std::fs::read(path).is_ok_and(|b| b == want) {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let _ = rx.recv_timeout(left.min(Duration::from_millis(5)));
    }
}

struct Run {
    latencies: Vec<Duration>,
    kills: usize,
    stops: usize,
    containers_put_back: f64,
    units_put_back: f64,
    /// Full passes that ran while the edits were timed (an edit waits for one).
    full_passes: f64,
}

fn run(workers: &str, edits: usize, disturb: bool) -> Run {
    let id = format!("mh-conc-bench-{}-{workers}", std::process::id());
    let unit = format!("{id}.service");
    let unit_file = format!("{ROOT}/etc/systemd/system/{unit}");
    std::fs::write(&unit_file, "[Service]\nExecStart=/bin/sleep infinity\n").unwrap();
    assert!(systemctl(&["daemon-reload"]), "the testbed's systemd reads the unit");
    let scratch = tempfile::Builder::new().prefix("mesh-host-bench-").tempdir_in("/var/tmp").unwrap();
    let root = scratch.path().join("tree");
    let mut d = common::declaration(&root);
    let resources = d["resources"].as_array_mut().unwrap();
    resources.push(serde_json::json!({
        "type": "container", "id": "slow.box", "name": id, "image": IMAGE,
        "args": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
    }));
    resources
        .push(serde_json::json!({"type": "service", "id": "slow.unit", "unit": unit, "state": "running"}));
    let decl = scratch.path().join("declaration.json");
    std::fs::write(&decl, serde_json::to_vec(&d).unwrap()).unwrap();
    let state = scratch.path().join("state/state.json");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut daemon = start(&state, &decl, port, workers);
    // Measured once the start-up's full passes are over: the first apply, and the resync each
    // watcher asks for when it first connects (a full pass runs alone, so an edit during one
    // waits for it: ~0.3 s over 10,000 files in a debug build). A periodic resync (600 s by
    // default) does not fall in a run this short.
    let full = "mesh_host_reconcile_duration_seconds_count{scope=\"full\"}";
    let (mut passes, mut still) = (metric(port, full), Instant::now());
    while still.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(100));
        let now = metric(port, full);
        if now != passes {
            (passes, still) = (now, Instant::now());
        }
    }

    // The disturbances, each once a second until told to stop.
    let stop = Arc::new(AtomicBool::new(!disturb));
    let (kills, stops) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let killer = {
        let (stop, kills, name) = (Arc::clone(&stop), Arc::clone(&kills), id.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let killed =
                    Command::new("docker").args(["kill", &name]).output().is_ok_and(|o| o.status.success());
                if killed {
                    kills.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    let stopper = {
        let (stop, stops, unit) = (Arc::clone(&stop), Arc::clone(&stops), unit.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if systemctl(&["stop", &unit]) {
                    stops.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };

    let passes_before = metric(port, full);
    let body = common::body();
    let (tx, rx) = mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |e| {
        let _ = tx.send(e);
    })
    .unwrap();
    let mut latencies = Vec::with_capacity(edits);
    for i in 0..edits {
        let dir = root.join(format!("d{:04}", (i * 7) % common::dirs()));
        let file = dir.join(format!("f{}.conf", i % common::FILES_PER_DIR));
        watcher.watch(&dir, RecursiveMode::NonRecursive).unwrap();
        while rx.try_recv().is_ok() {}
        let t = Instant::now();
        std::fs::write(&file, b"edited by hand\n").unwrap();
        assert!(put_back(&rx, &file, &body), "edit {i} was not put back");
        latencies.push(t.elapsed());
        if std::env::var_os("MESH_HOST_BENCH_DAEMON_LOG").is_some() && t.elapsed() > Duration::from_millis(50)
        {
            let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
            eprintln!(
                "slow edit of {} at {:.3} (epoch s): {:?}",
                file.display(),
                at.as_secs_f64(),
                t.elapsed()
            );
        }
        watcher.unwatch(&dir).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    killer.join().unwrap();
    stopper.join().unwrap();
    let full_passes = metric(port, full) - passes_before;
    let containers_put_back = metric(port, "mesh_host_drift_corrections_total{type=\"container\"}");
    let units_put_back = metric(port, "mesh_host_drift_corrections_total{type=\"service\"}");
    let _ = Command::new("kill").args(["-TERM", &daemon.id().to_string()]).status();
    let _ = daemon.wait();
    let _ = Command::new("docker").args(["rm", "-f", &id]).output();
    systemctl(&["stop", &unit]);
    let _ = std::fs::remove_file(&unit_file);
    latencies.sort();
    Run {
        latencies,
        kills: kills.load(Ordering::Relaxed),
        stops: stops.load(Ordering::Relaxed),
        containers_put_back,
        units_put_back,
        full_passes,
    }
}

fn main() {
    common::require_docker_image(IMAGE);
    common::require_systemd_testbed(SOCKET);
    let edits = std::env::var("MESH_HOST_BENCH_EDITS").ok().and_then(|v| v.parse().ok()).unwrap_or(300);
    let build = if cfg!(debug_assertions) { "debug" } else { "release" };
    println!(
        "hand-edit to put back, {edits} edits 100 ms apart, 10,000 files, a container killed and a unit stopped by hand every second ({build} build)"
    );
    println!("| workers | disturbances | p50 | p99 | max | containers killed / put back | units stopped / put back | full passes meanwhile |");
    println!("|---|---|---|---|---|---|---|---|");
    // The same edits with nothing disturbed first: the machine's own noise, in the same run.
    // MESH_HOST_BENCH_ONLY=4 runs only the default workers, disturbed.
    let runs: &[(&str, bool)] = if std::env::var_os("MESH_HOST_BENCH_ONLY").is_some() {
        &[("4", true)]
    } else {
        &[("4", false), ("4", true), ("1", true)]
    };
    for &(workers, disturb) in runs {
        let r = run(workers, edits, disturb);
        let disturbed = if disturb { "every second" } else { "none" };
        println!(
            "| {workers} | {disturbed} | {} | {} | {} | {} / {} | {} / {} | {} |",
            ms(percentile(&r.latencies, 0.5)),
            ms(percentile(&r.latencies, 0.99)),
            ms(*r.latencies.last().unwrap()),
            r.kills,
            r.containers_put_back,
            r.stops,
            r.units_put_back,
            r.full_passes
        );
    }
}
