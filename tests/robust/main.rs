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
mod net;

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

/// The real build: `MESH_HOST_ROBUST_BIN` when set (a copy kept apart for a long run, which a
/// build in the same target directory would otherwise replace under it), or cargo's.
fn real_bin() -> PathBuf {
    std::env::var_os("MESH_HOST_ROBUST_BIN")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_mesh-host")), PathBuf::from)
}

fn plan(bin: PathBuf, agents: u64, secs: u64, mutant: Option<&'static str>) -> run::Plan {
    let seed = env_u64(
        "MESH_HOST_ROBUST_SEED",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
    );
    // Every run's agents in network namespaces of their own (the directed runs too: each run's
    // names are its own, `net.rs`), so that any schedule can cut a node off or slow its link.
    run::Plan { seed, agents: agents as usize, secs, quiet: 30, bin, mutant, netns: true }
}

/// What one run gives: the history, the violations found, its directory.
type Run = (Vec<history::Entry>, Vec<check::Violation>, tempfile::TempDir);

/// The history kept, its path said, and the verdicts listed.
fn verdict(what: &str, (entries, violations, dir): Run) -> (String, Vec<check::Violation>) {
    let kept = dir.keep();
    // The history, the agents' and members' logs are kept; the members' data (each WAL
    // preallocated, 64 MiB) is not.
    for i in 0..3 {
        let _ = std::fs::remove_dir_all(kept.join(format!("etcd-m{i}")));
    }
    let list: Vec<String> = violations.iter().map(|v| format!("  {v}")).collect();
    let text = format!(
        "{what}: {}\n{} violation(s); history: {}\n{}",
        schedule::summary(&entries),
        violations.len(),
        kept.join("history.jsonl").display(),
        list.join("\n")
    );
    eprintln!("{text}");
    (text, violations)
}

/// The seeded schedule: about 75 s of operations and faults with 8 agents, then a heal and a
/// quiet period; `MESH_HOST_ROBUST_SECS`, `MESH_HOST_ROBUST_SEED` and `MESH_HOST_ROBUST_AGENTS`
/// make a longer run, or repeat one (docs/testing.md).
#[test]
#[ignore = "needs the testbed: etcd binaries, root for mount namespaces; tests/run.sh sets it up"]
fn the_fleet_keeps_its_invariants_under_a_seeded_nemesis() {
    need_tools();
    let plan =
        plan(real_bin(), env_u64("MESH_HOST_ROBUST_AGENTS", 8), env_u64("MESH_HOST_ROBUST_SECS", 75), None);
    let run = schedule::seeded(&plan);
    let unreal = schedule::unreal_faults(&run.0);
    let (text, violations) = verdict(&format!("seed {}", plan.seed), run);
    assert!(violations.is_empty(), "{text}\nrepeat with MESH_HOST_ROBUST_SEED={}", plan.seed);
    assert!(unreal.is_empty(), "faults not made, or that did nothing:\n{}\n{text}", unreal.join("\n"));
}

/// A directed schedule run side by side against the real build, which must show nothing, and
/// against the mutant build (`--features robust-mutant`, its path in `MESH_HOST_ROBUST_MUTANT`,
/// built by tests/run.sh) told to be `mutant`, in which the checker must find each invariant
/// of `want` (on its node, when one is named).
fn caught(schedule: fn(&run::Plan) -> Run, mutant: &'static str, want: &[(&str, Option<&str>)]) {
    need_tools();
    let path = std::env::var("MESH_HOST_ROBUST_MUTANT").expect(
        "MESH_HOST_ROBUST_MUTANT: the path of a mesh-host built with --features robust-mutant (tests/run.sh builds it; docs/testing.md)",
    );
    let real = std::thread::spawn(move || verdict("real build", schedule(&plan(real_bin(), 4, 0, None))));
    let broken = schedule(&plan(PathBuf::from(path), 4, 0, Some(mutant)));
    let (text, violations) = verdict(&format!("mutant {mutant}"), broken);
    let (real_text, real_violations) = real.join().expect("the real build's run ends");
    assert!(real_violations.is_empty(), "{real_text}");
    for (invariant, node) in want {
        assert!(
            violations
                .iter()
                .any(|v| v.invariant == *invariant && (node.is_none() || v.node.as_deref() == *node)),
            "the checker did not find {invariant} (node {node:?}) in mutant {mutant}:\n{text}"
        );
    }
}

/// The gate (`gate`: a pending node taken for a good one) and abort (`abort`: the admissions
/// left) mutants, on the canary stopped through a rollout's first waves, then an abort: I2 on
/// the canary, I4 on the nodes left on the candidate. In the same run, the cache mutant
/// (`cache`: a node's cache labelled with the revision of the read before): I9 on a node of
/// the second wave, whose cache of the candidate says a revision before its admission.
#[test]
#[ignore = "needs the testbed and the mutant build (MESH_HOST_ROBUST_MUTANT): tests/run.sh makes both"]
fn a_gate_that_passes_pending_nodes_an_abort_that_keeps_admissions_and_a_stale_cache_are_caught() {
    caught(
        schedule::directed,
        "gate,abort,cache",
        &[("I2", Some("ro-1")), ("I4", Some("ro-2")), ("I9", Some("ro-2"))],
    );
}

/// The fence mutant (`fence`: a driver that ignores its lease) on a driver stopped past its
/// lease while a second takes over: I7, two drivers acting. In the same run, on the agents,
/// the status mutant (`status`: a new declaration said converged 3 s before it is applied) and
/// the flap mutant (`flap`: a new declaration applied, then the one before, then the new one
/// again): I8 and I10 on the canary, the first node to take the candidate. One run for three,
/// so that tests/run.sh's step stays under 5 minutes.
#[test]
#[ignore = "needs the testbed and the mutant build (MESH_HOST_ROBUST_MUTANT): tests/run.sh makes both"]
fn a_driver_that_ignores_its_lease_a_status_ahead_and_a_flapping_node_are_caught() {
    caught(
        schedule::fence,
        "fence,status,flap",
        &[("I7", None), ("I8", Some("ro-1")), ("I10", Some("ro-1"))],
    );
}

/// The window mutant (`window`: the generation an abort brings back armed, the candidate its
/// fallback) on etcd stopped as the canary takes the abort: I4, the canary back on the aborted
/// candidate. In the same run, before it, the promote mutant (`promote`: the rollout closed as
/// promoted without the candidate put as the fleet's declaration) on a rollout driven through
/// and promoted: I5 on the nodes the window's rollout leaves alone, back on the declaration
/// before with no hold said. One run for both, so that tests/run.sh's step stays under 5
/// minutes.
#[test]
#[ignore = "needs the testbed and the mutant build (MESH_HOST_ROBUST_MUTANT): tests/run.sh makes both"]
fn an_abort_that_arms_the_candidate_as_a_fallback_and_a_promote_that_loses_the_candidate_are_caught() {
    caught(schedule::window, "window,promote", &[("I4", Some("ro-1")), ("I5", Some("ro-2"))]);
}

/// A kept history checked again, by today's checker: `MESH_HOST_ROBUST_HISTORY=PATH` (a run's
/// `history.jsonl`). For a checker changed after the run, or a violation looked into.
#[test]
#[ignore = "checks a kept history: MESH_HOST_ROBUST_HISTORY=PATH"]
fn a_kept_history_is_checked_again() {
    // Nothing to do without one: tests/run.sh runs every ignored test of the binary.
    let Ok(path) = std::env::var("MESH_HOST_ROBUST_HISTORY") else {
        eprintln!("MESH_HOST_ROBUST_HISTORY is not set: no kept history to check");
        return;
    };
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let entries = history::parse(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    let violations = check::check(&entries);
    let list: Vec<String> = violations.iter().map(|v| format!("  {v}")).collect();
    eprintln!(
        "{path}: {}\n{} violation(s)\n{}",
        schedule::summary(&entries),
        violations.len(),
        list.join("\n")
    );
    assert!(violations.is_empty(), "{path}: {} violation(s)", violations.len());
}
