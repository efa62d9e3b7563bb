//! The fleet's robustness harness (issue 42; RELIABILITY.md, "The fleet under faults"): etcd
//! members, agents, a driver and an operator under a seeded nemesis, everything they do recorded
//! as one history, and an offline checker of the rollout's invariants that is shown to fail.
//!
//! - `history`: the JSONL format;
//! - `model`: the checker's own model of what etcd holds and what each node should run;
//! - `check`: the invariants, checked over a whole history;
//! - `check_tests`: small histories that break each invariant, and the verdicts.

mod check;
mod history;
mod model;

#[cfg(test)]
mod check_tests;
