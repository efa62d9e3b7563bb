//! How long systemd takes, through mesh-host's own D-Bus client, to bring a trivial unit to
//! running and read it back, and how soon the systemd watcher reports a unit stopped by hand.
//!
//! Runs against the testbed that `tests/testbed/systemd.sh` boots:
//! `cargo bench --bench systemd`. Prints a table for BENCHMARKS.md.
#![allow(clippy::disallowed_methods, reason = "a benchmark plays the person at the machine")]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use mesh_host::system::Systemd;
use mesh_host_watchers::Change;

const ROOT: &str = "/var/lib/machines/mesh-host-testbed";
const SOCKET: &str = "/run/mesh-host-testbed/bus/system_bus_socket";
const UNIT: &str = "mh-bench.service";
const ROUNDS: usize = 30;

fn main() {
    if !std::path::Path::new(SOCKET).exists() {
        eprintln!("no systemd testbed at {SOCKET}: run `sudo tests/testbed/systemd.sh` first");
        std::process::exit(1);
    }
    std::fs::write(format!("{ROOT}/etc/systemd/system/{UNIT}"), "[Service]\nExecStart=/bin/sleep infinity\n")
        .expect("the unit file is written into the testbed");
    let bus = format!("unix:path={SOCKET}");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();

    let (units_tx, units) = tokio::sync::watch::channel(BTreeSet::from([UNIT.to_owned()]));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watcher = {
        let _runtime = rt.enter();
        mesh_host_watchers::systemd::spawn(Some(bus.clone()), units, tx)
    };

    let (start, seen, again) = rt
        .block_on(rt.spawn_blocking(move || {
            let sd = Systemd::connect(Some(&bus)).expect("the testbed's systemd answers");
            sd.reload_manager().unwrap();
            assert_eq!(
                rx.blocking_recv(),
                Some(Change::Up { watcher: mesh_host_watchers::Watcher::Systemd, up: true })
            );

            // StartUnit of a stopped unit until it reads back running.
            let mut start = Vec::new();
            for _ in 0..ROUNDS {
                sd.stop(UNIT).unwrap();
                let t0 = Instant::now();
                sd.start(UNIT).unwrap();
                while !sd.state(UNIT).unwrap().running() {}
                start.push(t0.elapsed());
            }

            // Stopped by hand (another client's StopUnit): how soon the watcher says so, and
            // from then how long until the unit reads back running again.
            let (mut seen, mut again) = (Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                std::thread::sleep(Duration::from_millis(50));
                while rx.try_recv().is_ok() {}
                let t0 = Instant::now();
                sd.stop(UNIT).unwrap();
                assert!(matches!(rx.blocking_recv(), Some(Change::Unit { .. })));
                let t1 = Instant::now();
                sd.start(UNIT).unwrap();
                while !sd.state(UNIT).unwrap().running() {}
                seen.push(t1 - t0);
                again.push(t1.elapsed());
            }
            sd.stop(UNIT).unwrap();
            (start, seen, again)
        }))
        .unwrap();
    drop(units_tx);
    watcher.abort();

    // End to end through the daemon: a unit stopped by hand until it reads back running again.
    let daemon_again = rt.block_on(rt.spawn_blocking(through_the_daemon)).expect("the end-to-end rounds ran");
    let _ = std::fs::remove_file(format!("{ROOT}/etc/systemd/system/{UNIT}"));
    let together = rt.block_on(rt.spawn_blocking(ten_starts)).expect("the applies ran");

    println!("| measure ({ROUNDS} rounds) | median | p90 | max |");
    println!("|---|---|---|---|");
    row("StartUnit of a stopped trivial unit to ActiveState active, read back", start);
    row("stop by another client to the watcher's Change::Unit", seen);
    row("from that Change to running again (StartUnit, job done, read back)", again);
    row(
        "stopped by hand to running again, through `mesh-host run` (watcher, queue, reconcile)",
        daemon_again,
    );
    println!();
    println!("| measure ({TOGETHER_ROUNDS} rounds) | median | p90 | max |");
    println!("|---|---|---|---|");
    row(&format!("`mesh-host apply` starting {TOGETHER} stopped units, each read back twice"), together);
}

const TOGETHER: usize = 10;
const TOGETHER_ROUNDS: usize = 5;

/// `mesh-host apply` of a declaration of `TOGETHER` services, all stopped before each round:
/// what a cold apply of a service-heavy node pays for the second look at each started unit.
fn ten_starts() -> Vec<Duration> {
    let scratch = tempfile::tempdir().unwrap();
    let units: Vec<String> = (0..TOGETHER).map(|i| format!("mh-bench-{i}.service")).collect();
    for u in &units {
        std::fs::write(
            format!("{ROOT}/etc/systemd/system/{u}"),
            "[Service]\nExecStart=/bin/sleep infinity\n",
        )
        .unwrap();
    }
    let bus = format!("unix:path={SOCKET}");
    let sd = Systemd::connect(Some(&bus)).expect("the testbed's systemd answers");
    sd.reload_manager().unwrap();
    let resources: Vec<serde_json::Value> = units
        .iter()
        .enumerate()
        .map(|(i, u)| serde_json::json!({"type": "service", "id": format!("bench.u{i}"), "unit": u, "state": "running"}))
        .collect();
    let decl = scratch.path().join("declaration.json");
    std::fs::write(
        &decl,
        serde_json::to_vec(&serde_json::json!({"version": 1, "resources": resources})).unwrap(),
    )
    .unwrap();
    let mut took = Vec::new();
    for _ in 0..TOGETHER_ROUNDS {
        for u in &units {
            sd.stop(u).unwrap();
        }
        let t0 = Instant::now();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mesh-host"))
            .env("MESH_HOST_LOG", "warn")
            .arg("--state")
            .arg(scratch.path().join("state.json"))
            .args(["--bus", &bus, "apply"])
            .arg(&decl)
            .output()
            .expect("mesh-host runs");
        took.push(t0.elapsed());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    }
    for u in &units {
        sd.stop(u).unwrap();
        let _ = std::fs::remove_file(format!("{ROOT}/etc/systemd/system/{u}"));
    }
    took
}

/// Runs the real daemon on a declaration of the unit, stops the unit from another client
/// `ROUNDS` times, and measures each time until the unit reads back running again.
fn through_the_daemon() -> Vec<Duration> {
    let scratch = tempfile::tempdir().unwrap();
    let decl = scratch.path().join("declaration.json");
    let d = serde_json::json!({"version": 1, "resources": [
        {"type": "service", "id": "bench.unit", "unit": UNIT, "state": "running"}
    ]});
    std::fs::write(&decl, serde_json::to_vec(&d).unwrap()).unwrap();
    let bus = format!("unix:path={SOCKET}");
    /// Stops the daemon however the rounds end, so a failed run leaves nothing behind.
    struct Running(std::process::Child);
    impl Drop for Running {
        fn drop(&mut self) {
            let _ = std::process::Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
            let _ = self.0.wait();
        }
    }
    let _daemon = Running(
        std::process::Command::new(env!("CARGO_BIN_EXE_mesh-host"))
            .env("MESH_HOST_LOG", "warn")
            .arg("--state")
            .arg(scratch.path().join("state.json"))
            .args(["--bus", &bus, "run", "--metrics", "off", "--declaration"])
            .arg(&decl)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("mesh-host starts"),
    );
    let sd = Systemd::connect(Some(&bus)).expect("the testbed's systemd answers");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sd.state(UNIT).unwrap().running() {
        assert!(Instant::now() < deadline, "the daemon never started the unit");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The watcher subscribes after the first apply; give it a moment.
    std::thread::sleep(Duration::from_millis(500));
    let mut again = Vec::new();
    for _ in 0..ROUNDS {
        std::thread::sleep(Duration::from_millis(400));
        let t0 = Instant::now();
        sd.stop(UNIT).unwrap();
        while !sd.state(UNIT).unwrap().running() {
            assert!(t0.elapsed() < Duration::from_secs(30), "the daemon did not start the unit again");
            std::thread::sleep(Duration::from_micros(500));
        }
        again.push(t0.elapsed());
    }
    sd.stop(UNIT).unwrap();
    again
}

fn row(what: &str, mut d: Vec<Duration>) {
    d.sort();
    let ms = |x: Duration| format!("{:.1} ms", x.as_secs_f64() * 1000.0);
    let p = |q: f64| d[((d.len() as f64 * q) as usize).min(d.len() - 1)];
    println!("| {what} | {} | {} | {} |", ms(p(0.5)), ms(p(0.9)), ms(*d.last().unwrap()));
}
