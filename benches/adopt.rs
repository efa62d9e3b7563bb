//! Adoption at scale (issue 11, item 2): `mesh-host apply` on a node adopted with N files found,
//! none of them the host's, so each is held. Before, the found-present check scanned every
//! record of the store for each file (quadratic); now it asks a map. Shown by scaling: the time
//! for 10,000 and 20,000 found files against 1,000's, in one run, with a steady apply of the
//! same tree (nothing adopted, everything already as declared) as the yardstick.
//!
//! Run: `cargo bench --bench adopt` (release). `MESH_HOST_BENCH_DIR` picks where the trees are
//! made (default /var/tmp); `MESH_HOST_BENCH_RUNS` the rounds (default 5).

#![allow(clippy::disallowed_methods, reason = "a benchmark plays the operator who made the files")]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// `count` files in `count / 10` directories, under `root`, each holding `body(i)`.
fn tree(root: &Path, count: usize, body: impl Fn(usize) -> String) -> serde_json::Value {
    let mut resources = Vec::with_capacity(count);
    for i in 0..count {
        let dir = root.join(format!("d{:04}", i / 10));
        if i % 10 == 0 {
            std::fs::create_dir_all(&dir).unwrap();
        }
        let path = dir.join(format!("f{i}.conf"));
        std::fs::write(&path, body(i)).unwrap();
        resources.push(serde_json::json!({
            "type": "file", "id": format!("app.f{i}"), "path": path, "content": format!("ours {i}\n"),
        }));
    }
    serde_json::Value::Array(resources)
}

/// One `mesh-host apply` with a fresh or kept state store; its wall time.
fn apply(state: &Path, declaration: &Path) -> Duration {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_mesh-host"))
        .arg("--state")
        .arg(state)
        .args(["apply", "--json"])
        .arg(declaration)
        .env("MESH_HOST_LOG", "warn")
        .output()
        .expect("mesh-host runs");
    let took = t.elapsed();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    took
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let base = std::env::var("MESH_HOST_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into());
    let runs: usize = std::env::var("MESH_HOST_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let build = if cfg!(debug_assertions) { "debug" } else { "release" };
    println!("adoption at scale: `mesh-host apply` holding N found files, median of {runs} ({build} build)");
    println!("| found files | adopting (all held) | per file | against 1,000 | steady apply of the same files, not adopted |");
    println!("|---|---|---|---|---|");
    let mut first = None;
    for count in [1_000, 10_000, 20_000] {
        let scratch = tempfile::Builder::new().prefix("mesh-host-adopt-").tempdir_in(&base).unwrap();
        let root = scratch.path().join("found");
        let resources = tree(&root, count, |i| format!("theirs {i}\n"));
        let adopted = scratch.path().join("adopted.json");
        let d = serde_json::json!({"version": 1, "adoption": {"taken": []}, "resources": resources});
        std::fs::write(&adopted, serde_json::to_vec(&d).unwrap()).unwrap();
        let holding: Vec<Duration> = (0..runs)
            .map(|r| apply(&scratch.path().join(format!("state-{r}/state.json")), &adopted))
            .collect();
        let holding = median(holding);

        // The yardstick: the same files as declared, applied once, then steady.
        let plain = scratch.path().join("plain.json");
        let d = serde_json::json!({"version": 1, "resources": d["resources"]});
        std::fs::write(&plain, serde_json::to_vec(&d).unwrap()).unwrap();
        let state = scratch.path().join("plain/state.json");
        apply(&state, &plain);
        let steady = median((0..runs).map(|_| apply(&state, &plain)).collect());

        let per_file = holding.as_secs_f64() / count as f64;
        let against = first.map_or("1.0×".to_owned(), |(n, t): (usize, Duration)| {
            format!(
                "{:.1}× for {:.0}× the files",
                holding.as_secs_f64() / t.as_secs_f64(),
                count as f64 / n as f64
            )
        });
        first.get_or_insert((count, holding));
        println!(
            "| {count} | {:.1} ms | {:.1} µs | {against} | {:.1} ms |",
            holding.as_secs_f64() * 1e3,
            per_file * 1e6,
            steady.as_secs_f64() * 1e3
        );
    }
}
