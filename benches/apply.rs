//! Cold and steady applies of 10,000 files of 1 KiB in 1,000 directories, through the real
//! binary: wall time and peak RSS. Run with `cargo bench --bench apply`; figures go in
//! BENCHMARKS.md. Set MESH_HOST_BENCH_DIR to choose the filesystem (default /var/tmp).
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;
use common::{apply_cli, declaration, median, DIRS, FILES_PER_DIR};

/// Runs one apply; returns its wall time and the peak RSS of the largest child so far (KiB).
fn apply(decl: &Path, state: &Path) -> (Duration, i64) {
    let took = apply_cli(decl, state);
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).unwrap();
    (took, usage.max_rss())
}

fn main() {
    let base = PathBuf::from(std::env::var("MESH_HOST_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into()));
    let scratch = tempfile::Builder::new().prefix("mesh-host-bench-").tempdir_in(&base).unwrap();
    let runs = 3;
    let mut cold = Vec::new();
    let mut first_steady = Vec::new();
    let mut steady = Vec::new();
    let mut rss = 0;
    for run in 0..runs {
        let root = scratch.path().join(format!("run{run}"));
        let decl = scratch.path().join(format!("decl{run}.json"));
        std::fs::write(&decl, serde_json::to_vec(&declaration(&root.join("tree"))).unwrap()).unwrap();
        let state = root.join("state.json");
        let (t, r) = apply(&decl, &state);
        cold.push(t);
        rss = rss.max(r);
        // The first steady apply after a cold one reads every file (their change times are too
        // fresh to trust) and records their signatures; the ones after it only stat them.
        std::thread::sleep(Duration::from_millis(100));
        let (t, r) = apply(&decl, &state);
        first_steady.push(t);
        rss = rss.max(r);
        for _ in 0..3 {
            let (t, r) = apply(&decl, &state);
            steady.push(t);
            rss = rss.max(r);
        }
    }
    let files = DIRS * FILES_PER_DIR;
    println!(
        "apply of {files} files of 1 KiB in {DIRS} directories ({} resources), on {}",
        files + DIRS,
        base.display()
    );
    println!("  cold apply   median {:>8.1} ms  (runs: {cold:?})", median(cold.clone()).as_secs_f64() * 1e3);
    println!(
        "  first steady apply (reads every file, records signatures) median {:>8.1} ms  (runs: {first_steady:?})",
        median(first_steady.clone()).as_secs_f64() * 1e3
    );
    println!(
        "  steady apply median {:>8.1} ms  (runs: {steady:?})",
        median(steady.clone()).as_secs_f64() * 1e3
    );
    println!("  peak RSS of any apply: {:.1} MiB", rss as f64 / 1024.0);
}
