//! The fleet's robustness harness (issue 42; RELIABILITY.md, "The fleet under faults"): etcd
//! members, agents, a driver and an operator under a seeded nemesis, everything they do recorded
//! as one history, and an offline checker of the rollout's invariants that is shown to fail.
//!
//! - `history`: the JSONL format;
//! - `model`: the checker's own model of what etcd holds and what each node should run;
//! - `check`: the invariants, checked over a whole history;
//! - `check_tests`: small histories that break each invariant, and the verdicts;
//! - `system`: etcd members, agents, the recorder and the sampler; `run`: operations and a run's
//!   life; `schedule`: the seeded schedule, the directed one, a run's figures.
//!
//! The harness plays the operator and the machines, so it uses std's files and processes freely.

#![allow(clippy::disallowed_methods)]

mod check;
mod history;
mod model;

#[cfg(test)]
mod check_tests;
mod run;
mod schedule;
mod system;

use std::path::PathBuf;

/// A number from the environment, or `default`.
fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn need_tools() {
    for tool in ["etcd", "etcdctl", "unshare"] {
        let found =
            std::process::Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().unwrap();
        assert!(
            found.status.success(),
            "{tool} is missing: run tests/testbed/up.sh (etcd-server, etcd-client, util-linux)"
        );
    }
    assert!(nix::unistd::geteuid().is_root(), "the harness mounts in namespaces of its own: run it as root");
}

fn plan(bin: PathBuf, agents: u64, secs: u64) -> run::Plan {
    let seed = env_u64(
        "MESH_HOST_ROBUST_SEED",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
    );
    run::Plan { seed, agents: agents as usize, secs, quiet: 30, bin }
}

/// The history kept, its path said, and the verdicts listed.
fn verdict(
    what: &str,
    entries: &[history::Entry],
    violations: &[check::Violation],
    dir: tempfile::TempDir,
) -> String {
    let kept = dir.keep();
    let list: Vec<String> = violations.iter().map(|v| format!("  {v}")).collect();
    let text = format!(
        "{what}: {}\n{} violation(s); history: {}\n{}",
        schedule::summary(entries),
        violations.len(),
        kept.join("history.jsonl").display(),
        list.join("\n")
    );
    eprintln!("{text}");
    text
}

/// The seeded schedule: about 2 min of operations and faults with 8 agents, then a heal and a
/// quiet period; `MESH_HOST_ROBUST_SECS`, `MESH_HOST_ROBUST_SEED` and `MESH_HOST_ROBUST_AGENTS`
/// make a longer run, or repeat one (docs/testing.md).
#[test]
#[ignore = "needs the testbed: etcd binaries, root for mount namespaces; tests/run.sh sets it up"]
fn the_fleet_keeps_its_invariants_under_a_seeded_nemesis() {
    need_tools();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_mesh-host"));
    let plan = plan(bin, env_u64("MESH_HOST_ROBUST_AGENTS", 8), env_u64("MESH_HOST_ROBUST_SECS", 120));
    let (entries, violations, dir) = schedule::seeded(&plan);
    let text = verdict(&format!("seed {}", plan.seed), &entries, &violations, dir);
    assert!(violations.is_empty(), "{text}\nrepeat with MESH_HOST_ROBUST_SEED={}", plan.seed);
}

/// The directed schedule against the real build (nothing found) and against the mutant build
/// (`--features robust-mutant`, its path in `MESH_HOST_ROBUST_MUTANT`, built by tests/run.sh):
/// the checker must find the gate's violation (I2) and the abort's (I4).
#[test]
#[ignore = "needs the testbed and the mutant build (MESH_HOST_ROBUST_MUTANT): tests/run.sh makes both"]
fn the_checker_passes_the_real_build_and_catches_the_mutant() {
    need_tools();
    let mutant = std::env::var("MESH_HOST_ROBUST_MUTANT").expect(
        "MESH_HOST_ROBUST_MUTANT: the path of a mesh-host built with --features robust-mutant (tests/run.sh builds it; docs/testing.md)",
    );
    let real = PathBuf::from(env!("CARGO_BIN_EXE_mesh-host"));
    let (entries, violations, dir) = schedule::directed(&plan(real, 4, 0));
    let text = verdict("directed, real build", &entries, &violations, dir);
    assert!(violations.is_empty(), "{text}");

    let (entries, violations, dir) = schedule::directed(&plan(PathBuf::from(mutant), 4, 0));
    let text = verdict("directed, mutant build", &entries, &violations, dir);
    for (invariant, node) in [("I2", "ro-1"), ("I4", "ro-2")] {
        assert!(
            violations.iter().any(|v| v.invariant == invariant && v.node.as_deref() == Some(node)),
            "the checker did not find {invariant} on {node} in the mutant build:\n{text}"
        );
    }
}
