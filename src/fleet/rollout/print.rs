//! What a rollout prints: the plan as `start` prints it, and `fleet rollout status`.

use std::fmt::Write as _;

use serde::Serialize;

use super::*;

/// The plan, as `start` prints it: every wave and its nodes.
pub(super) fn print_plan(state: &State) {
    println!(
        "waves (soak {} s, deadline {} s, max failures {}):",
        state.soak, state.deadline, state.max_failures
    );
    for (i, wave) in state.waves.iter().enumerate() {
        println!("  wave {}: {}", i + 1, wave.join(", "));
    }
}

/// One node's row in `fleet rollout status`.
#[derive(Clone, Debug, Serialize)]
pub struct NodeRow {
    /// The node.
    pub node: String,
    /// Its wave, from 1.
    pub wave: usize,
    /// Whether it is admitted (took the candidate, or is taking it).
    pub admitted: bool,
    /// The revision its admission was written at: what it must report.
    pub admitted_at_revision: Option<i64>,
    /// The revision its status says it applied.
    pub revision: Option<i64>,
    /// Whether its status says converged.
    pub converged: Option<bool>,
    /// Whether it is alive.
    pub alive: bool,
    /// Whether it spent the budget, and why.
    pub failed: Option<String>,
    /// Its `reverted` report, when it made one.
    pub reverted: Option<String>,
    /// The driver's verdict, in words.
    pub verdict: String,
}

/// What `fleet rollout status` shows.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The revision read at.
    pub revision: i64,
    /// The open rollout's state, when one is open.
    pub state: Option<State>,
    /// Who drives it.
    pub driver: Option<String>,
    /// One row per node of its waves.
    pub nodes: Vec<NodeRow>,
    /// The last rollout closed.
    pub last: Option<State>,
}

/// `fleet rollout status`: the rollout's waves, and each node.
pub async fn report(etcd: &Etcd) -> anyhow::Result<Report> {
    let s = snapshot(etcd).await?;
    let now = crate::system::unix_secs();
    let mut nodes = Vec::new();
    if let Some((state, _)) = &s.state {
        let verdicts = s.verdicts(state, now);
        for (i, wave) in state.waves.iter().enumerate() {
            for node in wave {
                let seen = s.nodes.get(node).cloned().unwrap_or_default();
                let admission = s.admitted.get(node);
                let failed = state.failures.iter().find(|f| &f.node == node).map(|f| f.reason.clone());
                let verdict = match (verdicts.get(node), &failed) {
                    (_, Some(why)) => format!("failed: {why}"),
                    (Some(Verdict::Good), _) => "good".into(),
                    (Some(Verdict::Pending(why)), _) => why.clone(),
                    (Some(Verdict::Failed(why)), _) => format!("failing: {why}"),
                    (None, _) => "not admitted".into(),
                };
                nodes.push(NodeRow {
                    node: node.clone(),
                    wave: i + 1,
                    admitted: admission.is_some(),
                    admitted_at_revision: admission.map(|(_, r)| *r),
                    revision: seen.status.as_ref().and_then(|st| st.revision),
                    converged: seen.status.as_ref().map(|st| st.applied.converged),
                    alive: seen.alive,
                    failed,
                    reverted: seen.reverted.clone(),
                    verdict,
                });
            }
        }
    }
    Ok(Report {
        revision: s.revision,
        state: s.state.map(|(st, _)| st),
        driver: s.driver,
        nodes,
        last: s.last,
    })
}

/// The text of `fleet rollout status`.
pub fn text(r: &Report) -> String {
    let mut out = String::new();
    let Some(state) = &r.state else {
        let _ = writeln!(out, "{}", none_open(r.last.as_ref()));
        return out;
    };
    let _ = writeln!(
        out,
        "rollout {} of {}, started by {} at {}: {}",
        state.id,
        state.scope().describe(),
        state.started_by,
        when(state.started_at),
        state.phase()
    );
    let _ = writeln!(
        out,
        "failures {} of {} allowed; soak {} s; deadline {} s; driver: {}",
        state.failures.len(),
        state.max_failures,
        state.soak,
        state.deadline,
        r.driver.as_deref().unwrap_or("none (`mesh-host fleet rollout resume` drives it)")
    );
    let _ = writeln!(
        out,
        "{:<4} {:<24} {:<8} {:>8} {:>8} {:<9} {:<5}  VERDICT",
        "WAVE", "NODE", "ADMITTED", "AT REV", "APPLIED", "CONVERGED", "ALIVE"
    );
    let opt = |r: Option<i64>| r.map(|r| r.to_string()).unwrap_or_else(|| "-".into());
    for n in &r.nodes {
        let verdict = match &n.reverted {
            Some(rev) if n.admitted => format!("{} (reverted {rev})", n.verdict),
            _ => n.verdict.clone(),
        };
        // A verdict quotes the node's own status (a gate's reason): shown, never sent.
        let verdict = crate::telemetry::text::escape(&verdict);
        let _ = writeln!(
            out,
            "{:<4} {:<24} {:<8} {:>8} {:>8} {:<9} {:<5}  {}",
            n.wave,
            crate::telemetry::text::escape(&n.node),
            if n.admitted { "yes" } else { "no" },
            opt(n.admitted_at_revision),
            opt(n.revision),
            match n.converged {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            },
            if n.alive { "yes" } else { "no" },
            verdict
        );
    }
    out
}
