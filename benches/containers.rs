//! Containers against the real Docker engine (`tests/testbed/docker.sh` starts it):
//!
//! 1. a cold apply and a steady re-apply of 100 containers, each reading an env-file the
//!    declaration writes, through the real binary: wall time;
//! 2. a container killed by hand, and one removed by hand, to running again, the way the
//!    daemon does it (the watcher's event, then a reconcile of that one id), against the
//!    engine's own work for the same (start; create and start).
//!
//! Run with `cargo bench --bench containers`; figures go in BENCHMARKS.md, section Containers.
#![allow(clippy::disallowed_methods)]

mod common;
use common::{apply_cli, median};

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use mesh_host::apply::{self, Options};
use mesh_host::declaration::{Declaration, Id};
use mesh_host::store::{Origin, Store};
use mesh_host_watchers::Change;

const CONTAINERS: usize = 100;
const IMAGE: &str = "local/busybox:1";
const KILLS: usize = 10;

fn declaration(root: &Path, prefix: &str) -> serde_json::Value {
    let mut resources = Vec::new();
    for i in 0..CONTAINERS {
        let env = root.join(format!("c{i}.env"));
        resources.push(serde_json::json!({
            "type": "file", "id": format!("bench.env{i}"), "path": env, "content": format!("N={i}\n"),
        }));
        resources.push(serde_json::json!({
            "type": "container", "id": format!("bench.c{i}"), "name": format!("{prefix}-{i}"), "image": IMAGE,
            "env-file": [env], "args": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
        }));
    }
    serde_json::json!({"version": 1, "resources": resources})
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn docker(args: &[&str]) {
    let out = Command::new("docker").args(args).output().expect("docker runs");
    assert!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn main() {
    let ok =
        Command::new("docker").args(["image", "inspect", IMAGE]).output().is_ok_and(|o| o.status.success());
    assert!(ok, "no Docker engine with {IMAGE}: run tests/testbed/docker.sh (as root) first");
    let prefix = format!("mh-bench-{}", std::process::id());
    let scratch = tempfile::Builder::new().prefix("mesh-host-bench-").tempdir_in("/var/tmp").unwrap();
    let decl = scratch.path().join("decl.json");
    let state = scratch.path().join("state/state.json");
    let d = declaration(scratch.path(), &prefix);
    std::fs::write(&decl, serde_json::to_vec(&d).unwrap()).unwrap();

    let cleanup = || {
        for i in 0..CONTAINERS {
            let _ = Command::new("docker").args(["rm", "-f", &format!("{prefix}-{i}")]).output();
        }
        let _ = Command::new("docker").args(["rm", "-f", &format!("{prefix}-spare")]).output();
    };

    let cold = apply_cli(&decl, &state);
    let steady: Vec<Duration> = (0..5).map(|_| apply_cli(&decl, &state)).collect();
    println!("containers: {CONTAINERS} containers with an env-file each, through the binary");
    println!("  cold apply (create all):   {}", ms(cold));
    println!(
        "  steady re-apply (median of 5): {}  (runs: {})",
        ms(median(steady.clone())),
        steady.iter().map(|d| ms(*d)).collect::<Vec<_>>().join(", ")
    );

    // Killed to running again.
    let parsed = Declaration::parse(&std::fs::read(&decl).unwrap()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut store = Some(Store::open(&state).unwrap());
    let opts = Options {
        origin: Origin::Declared,
        dry_run: false,
        run_verify: false,
        originals: scratch.path().join("kept"),
        bus: None,
        container_socket: None,
        step_timeout: None,
        archive_limits: mesh_host::apply::ArchiveLimits::default(),
        keep_max_bytes: mesh_host::apply::KEEP_MAX_BYTES,
        contents: None,
        key: scratch.path().join("sealing.key"),
        progress: None,
    };
    // Each disturbance: what is done by hand, and the event the daemon reacts to.
    let disturbances: [(&str, &str, &str); 2] = [("killed", "kill", "die"), ("removed", "rm -f", "destroy")];
    let mut figures = Vec::new();
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let _watcher = mesh_host_watchers::docker::spawn(None, tx);
        while !matches!(rx.recv().await, Some(Change::Up { up: true, .. })) {}
        for (round, (what, command, event)) in disturbances.iter().enumerate() {
            let (mut lag, mut recovered) = (Vec::new(), Vec::new());
            for k in 0..KILLS {
                let k = round * KILLS + k;
                let name = format!("{prefix}-{k}");
                let id = Id::parse(&format!("bench.c{k}")).unwrap();
                let done = Instant::now();
                let mut args: Vec<&str> = command.split(' ').collect();
                args.push(&name);
                docker(&args);
                loop {
                    match rx.recv().await {
                        Some(Change::Container { name: n, action, .. }) if n == name && action == *event => {
                            break
                        }
                        Some(_) => {}
                        None => panic!("the watcher ended"),
                    }
                }
                let seen = Instant::now();
                lag.push(seen - done);
                let (d, s) = (parsed.clone(), store.take().expect("the store is back"));
                let o = opts.clone();
                let (report, s) = tokio::task::spawn_blocking(move || {
                    let mut s = s;
                    let r = apply::reconcile(&d, &[id], &mut s, &o);
                    (r, s)
                })
                .await
                .unwrap();
                recovered.push(seen.elapsed());
                store = Some(s);
                assert!(report.error.is_none(), "{:?}", report.error);
                let word = report.outcomes.iter().find(|o| o.target == name).map(|o| o.action.as_str());
                assert!(matches!(word, Some("corrected" | "unchanged")), "{:?}", report.outcomes);
                // Drain what the recovery itself caused.
                tokio::time::sleep(Duration::from_millis(50)).await;
                while rx.try_recv().is_ok() {}
            }
            figures.push((*what, *command, *event, median(lag), median(recovered)));
        }
    });

    // The engine's own work for the same recoveries, through the same client: starting a killed
    // container, and creating and starting a removed one.
    let (mut engine_start, mut engine_create) = (Vec::new(), Vec::new());
    let spare = format!("{prefix}-spare");
    rt.block_on(async {
        let client = mesh_host::system::docker::connect_async(None).await.unwrap();
        let name = format!("{prefix}-{}", 2 * KILLS);
        for _ in 0..KILLS {
            docker(&["kill", &name]);
            let (client, name) = (client.clone(), name.clone());
            engine_start.push(
                tokio::task::spawn_blocking(move || {
                    let t = Instant::now();
                    client.start(&name).unwrap();
                    assert!(client.container(&name).unwrap().unwrap().running);
                    t.elapsed()
                })
                .await
                .unwrap(),
            );
        }
        for _ in 0..KILLS {
            let (client, spare) = (client.clone(), spare.clone());
            engine_create.push(
                tokio::task::spawn_blocking(move || {
                    let new = mesh_host::system::docker::NewContainer {
                        name: spare.clone(),
                        image: IMAGE.into(),
                        args: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
                            .map(String::from)
                            .to_vec(),
                        keep_running: true,
                        ..Default::default()
                    };
                    let t = Instant::now();
                    client.create(&new).unwrap();
                    client.start(&spare).unwrap();
                    assert!(client.container(&spare).unwrap().unwrap().running);
                    let took = t.elapsed();
                    client.remove(&spare).unwrap();
                    took
                })
                .await
                .unwrap(),
            );
        }
    });
    let baselines = [median(engine_start), median(engine_create)];
    for ((what, command, event, lag, recover), engine) in figures.into_iter().zip(baselines) {
        println!("{what} by hand (`docker {command}`) to running again ({KILLS} times, medians):");
        println!("  `docker {command}` issued to the watcher's {event} event: {}", ms(lag));
        println!("  {event} event to running (reconcile of one id):     {}", ms(recover));
        println!("  the engine's own work (start, or create + start), + inspect: {}", ms(engine));
        // Signed: the reconcile's median can come out below the engine's own on a busy machine.
        let beyond = (recover.as_secs_f64() - engine.as_secs_f64()) * 1e3;
        println!("  beyond the engine's own work:                        {beyond:.1} ms");
    }
    cleanup();
}
