//! Staged rollouts (issue 25, point 2): a candidate declaration given to the fleet's nodes wave
//! by wave, each wave opened only when every node of the waves before it reports the candidate
//! applied and converged.
//!
//! Everything is in etcd, under one prefix, so the command that drives a rollout holds nothing
//! of its own and can be killed and started again anywhere:
//!
//! ```text
//! /mesh-host/rollout/open/state             the rollout open (JSON `State`): its id, scope,
//!                                           wave plan, how many waves are open, paused or
//!                                           halted, its failures
//! /mesh-host/rollout/open/candidate/fleet/NAME     the candidate's files, NAME as `fleet put`
//! /mesh-host/rollout/open/candidate/group/G/NAME   names them, under its scope's own prefix
//! /mesh-host/rollout/open/node/N/admitted   node N may read the candidate (JSON `Admission`)
//! /mesh-host/rollout/driver                 the driver's presence, bound to its lease
//! /mesh-host/rollout/last                   the last rollout closed, as its state said, and how
//! ```
//!
//! A node admitted reads the candidate's keys in place of its scope's declaration keys, at the
//! same place in its declaration; a node not admitted reads what it reads without a rollout
//! (`source`). So a node takes the candidate exactly when the driver admits it, and goes back
//! to the declaration in force (its previous generation) when its admission is withdrawn:
//! `abort` deletes every admission, `promote` writes the candidate into the scope's prefix and
//! deletes them, each in one transaction. Why so: docs/decisions.md, "Rollouts".
//!
//! Here: the keys, the state, the plan, the gate (`judge`, `decide`) and the snapshot they are
//! judged on, all pure but the snapshot's read. `drive`: `start` and the driver's loop;
//! `command`: pause, resume, abort and promote; `print`: `fleet rollout status`.

mod command;
mod drive;
mod print;
mod reflector;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::status::Status;
use super::{Scope, ROOT};
use crate::system::etcd::{Etcd, Kv, Range};

pub use command::{abort, pause_rollout, promote, regate, resume};
pub use drive::{drive, limit, new_id, start, unadmitted, Start};
pub use print::{report, text, NodeRow, Report};

/// The prefix of the rollout open, if any: deleted whole when it closes.
pub fn open_prefix() -> String {
    format!("{ROOT}rollout/open/")
}

/// The key of the open rollout's state.
pub fn state_key() -> String {
    format!("{ROOT}rollout/open/state")
}

/// The prefix every candidate's files are under, whatever its scope.
pub fn candidate_root() -> String {
    format!("{ROOT}rollout/open/candidate/")
}

/// The prefix the candidate of a rollout for `scope` is under: one per scope, so that a node's
/// etcd role reads only the candidates of its own scopes (a node of group `db` cannot read a
/// rollout's for group `web`; docs/decisions.md, "A candidate under its scope's prefix").
pub fn candidate_prefix(scope: &Scope) -> String {
    match scope {
        Scope::Fleet => format!("{}fleet/", candidate_root()),
        Scope::Group(g) => format!("{}group/{g}/", candidate_root()),
        Scope::Node(n) => format!("{}node/{n}/", candidate_root()),
    }
}

/// The candidate's prefix for the scope whose declaration prefix is `replaces` (an admission's
/// `replaces`); `None` when it is no scope's.
pub fn candidate_for(replaces: &str) -> Option<String> {
    super::signed::from_prefix(replaces).map(|scope| candidate_prefix(&scope))
}

/// The prefix of node `node`'s admission, which the node watches (a prefix ending in `/`, so
/// that `web-1` does not watch `web-10`'s).
pub fn admission_prefix(node: &str) -> String {
    format!("{ROOT}rollout/open/node/{node}/")
}

/// The key that admits node `node` to the candidate.
pub fn admission_key(node: &str) -> String {
    format!("{}admitted", admission_prefix(node))
}

/// The driver's presence, bound to its lease.
pub fn driver_key() -> String {
    format!("{ROOT}rollout/driver")
}

/// The last rollout closed.
pub fn last_key() -> String {
    format!("{ROOT}rollout/last")
}

/// How long the driver's lease outlives its last renewal: a driver killed is replaceable
/// within this.
pub const DRIVER_TTL: i64 = 10;

/// The most writes the driver puts in one transaction: under etcd's `--max-txn-ops` (128 by
/// default, the lowest a member is likely to run with), and with admissions of about 170 bytes on
/// the wire, about 17 KiB, far under its 1.5 MiB request limit. A wave of any size is admitted in
/// transactions of this many, each conditional on the state and on the driver's lease.
pub const CHUNK: usize = 100;

/// What a node's admission says: which rollout, and which of its prefixes the candidate
/// stands in for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admission {
    /// The rollout's id.
    pub rollout: String,
    /// The scope's declaration prefix, which the node reads the candidate in place of.
    pub replaces: String,
    /// The wave the node is in, from 1.
    pub wave: usize,
    /// When it was admitted, seconds since the epoch (by the driver's clock).
    pub at: u64,
}

/// A node that spent one of the failure budget, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// The node.
    pub node: String,
    /// Why, as a person reads it.
    pub reason: String,
    /// When the driver saw it, seconds since the epoch.
    pub at: u64,
}

/// A rollout's state, as etcd holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// The rollout's id: `rollout-` and the time it started.
    pub id: String,
    /// The group it is for; `None` for the whole fleet.
    pub group: Option<String>,
    /// The scope's declaration prefix, which the candidate stands in for.
    pub replaces: String,
    /// The revision the scope's declaration was read at when the rollout started: promote
    /// refuses when it changed since (written around `fleet put`).
    pub base_revision: i64,
    /// The candidate's keys under the scope's prefix, as `promote` writes them.
    pub keys: Vec<String>,
    /// The nodes of each wave, in order.
    pub waves: Vec<Vec<String>>,
    /// How many waves are open (0 before the first).
    pub opened: usize,
    /// Seconds every node of the open waves must stay converged before the next opens.
    pub soak: u64,
    /// How many nodes may fail before the rollout halts.
    pub max_failures: usize,
    /// Seconds an admitted node has to report the candidate applied and converged.
    pub deadline: u64,
    /// Who paused it and when, while paused.
    pub paused: Option<String>,
    /// Why it halted: no further node is admitted.
    pub halted: Option<String>,
    /// Every wave passed its gate: waiting for promote (or abort).
    pub done: bool,
    /// The nodes that spent the budget.
    pub failures: Vec<Failure>,
    /// When it started, seconds since the epoch, and by whom.
    pub started_at: u64,
    /// Who started it (`SUDO_USER`, `LOGNAME` or `USER`).
    pub started_by: String,
    /// How it closed (`promoted by ... at ...`, `aborted ...`): in `rollout/last` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed: Option<String>,
    /// The signed candidate's version (`start --sign`): the next signed rollout goes above it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
}

impl State {
    /// The rollout's scope.
    pub fn scope(&self) -> Scope {
        match &self.group {
            Some(g) => Scope::Group(g.clone()),
            None => Scope::Fleet,
        }
    }

    /// One line: where it stands.
    pub fn phase(&self) -> String {
        let n = self.waves.len();
        if let Some(why) = &self.halted {
            format!("halted at wave {} of {n}: {why}", self.opened)
        } else if self.done {
            format!("every wave ({n}) passed its gate: waiting for promote or abort")
        } else if let Some(by) = &self.paused {
            format!("paused at wave {} of {n} ({by})", self.opened)
        } else {
            format!("wave {} of {n} open", self.opened)
        }
    }
}

/// One size of `--waves`: a count of nodes, or a share of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// This many nodes, all waves so far together.
    Count(usize),
    /// This percentage of the nodes, all waves so far together.
    Percent(u8),
}

/// Reads `--waves`: comma-separated counts and percentages (`1,10%,50%,100%`), each the
/// nodes reached once that wave is open, counting the waves before it.
pub fn parse_waves(spec: &str) -> Result<Vec<Size>, String> {
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim) {
        let size = if let Some(p) = part.strip_suffix('%') {
            match p.parse::<u8>() {
                Ok(p) if (1..=100).contains(&p) => Size::Percent(p),
                _ => return Err(format!("--waves: {part:?} is not a percentage from 1% to 100%")),
            }
        } else {
            match part.parse::<usize>() {
                Ok(n) if n > 0 => Size::Count(n),
                _ => {
                    return Err(format!(
                        "--waves: {part:?} is neither a count of nodes (1, 5) nor a percentage (10%)"
                    ))
                }
            }
        };
        out.push(size);
    }
    Ok(out)
}

/// Assigns `nodes` to waves: the canaries first, in the order given, then the others by name;
/// each wave reaches as many nodes as its size says, counting the waves before it (a share
/// rounded up, so 10% of 8 is 1). A wave that would add no node is left out. Refused when a
/// canary is not among the nodes, when the sizes go down, or when the last does not reach
/// every node.
pub fn plan(nodes: &[String], canaries: &[String], sizes: &[Size]) -> Result<Vec<Vec<String>>, String> {
    if nodes.is_empty() {
        return Err(
            "no live node in the scope (none holds its presence key in etcd): a rollout needs nodes to watch"
                .into(),
        );
    }
    for c in canaries {
        if !nodes.contains(c) {
            return Err(format!(
                "--canary {c}: no such node in the scope; its nodes are {}",
                nodes.join(", ")
            ));
        }
    }
    let mut order: Vec<String> = Vec::new();
    for c in canaries {
        if !order.contains(c) {
            order.push(c.clone());
        }
    }
    let mut rest: Vec<&String> = nodes.iter().filter(|n| !order.contains(n)).collect();
    rest.sort();
    order.extend(rest.into_iter().cloned());
    let n = order.len();
    let mut waves = Vec::new();
    let mut reached = 0;
    for (i, size) in sizes.iter().enumerate() {
        let upto = match *size {
            Size::Count(c) => c.min(n),
            Size::Percent(p) => (n * usize::from(p)).div_ceil(100),
        };
        if upto < reached {
            return Err(format!(
                "--waves: each size counts the waves before it, so they cannot go down; wave {} reaches {upto} of {n} nodes after {reached}",
                i + 1
            ));
        }
        if upto > reached {
            waves.push(order[reached..upto].to_vec());
            reached = upto;
        }
    }
    if reached < n {
        return Err(format!(
            "--waves: the last wave reaches {reached} of the {n} nodes; end it with 100% so that every node is reached"
        ));
    }
    Ok(waves)
}

/// What the driver makes of one admitted node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It reports the candidate applied and converged, no resource failed.
    Good,
    /// Not yet, and still within the deadline; why, for the status.
    Pending(String),
    /// It spends one of the failure budget.
    Failed(String),
}

/// What the driver knows of one node, from etcd.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// Its status, when it wrote one that parses.
    pub status: Option<Status>,
    /// Its `reverted` report (point 3: the node went back by itself), as a line.
    pub reverted: Option<String>,
    /// Whether its presence key is there.
    pub alive: bool,
    /// The etcd revision its status was last written at (0 without one): what the driver
    /// compares with an admission's revision, so that no node's clock is read against its own.
    pub status_revision: i64,
}

/// Judges one admitted node: admitted at `revision` (its admission's), at `admitted_at`
/// (seconds, on the same clock as `now`: the driver's monotonic one), with `deadline` seconds to
/// report. A node is good
/// only when it is alive, reports the candidate's revision (or a later one) applied and
/// converged with nothing failed, holds no rollback, and has confirmed the generation it runs
/// (its etcd round trip came: it will not go back by itself); docs/decisions.md, "Rollouts".
pub fn judge(revision: i64, admitted_at: u64, deadline: u64, seen: &Seen, now: u64) -> Verdict {
    if let Some(r) = &seen.reverted {
        return Verdict::Failed(format!("reverted by itself: {r}"));
    }
    let status = seen.status.as_ref();
    let applied = status.and_then(|s| s.revision);
    let mut waiting = None;
    if let (Some(s), Some(r)) = (status, applied) {
        if r >= revision {
            if let Some(why) = &s.refused {
                return Verdict::Failed(format!("refused a later read: {}", first_line(why)));
            }
            let failed = s.applied.counts.get("failed").copied().unwrap_or(0);
            if !(s.applied.converged && failed == 0 && s.applied.last_error.is_none()) {
                let why =
                    s.applied.last_error.as_deref().map(first_line).unwrap_or_else(|| "not converged".into());
                return Verdict::Failed(format!(
                    "applied the candidate (revision {r}) and did not converge: {why}"
                ));
            }
            match unsettled(s, seen.alive) {
                None => return Verdict::Good,
                Some(why) => waiting = Some(format!("applied revision {r}, {why}")),
            }
        }
    }
    // The status was written after the admission (by etcd's revisions, not by clocks).
    if let Some(why) = status.and_then(|s| s.refused.as_ref().filter(|_| seen.status_revision > revision)) {
        return Verdict::Failed(format!("refused the candidate: {}", first_line(why)));
    }
    let now_says = waiting.unwrap_or_else(|| match applied {
        Some(r) => format!("its status says revision {r}"),
        None => "no status from etcd yet".into(),
    });
    let alive = if seen.alive { "" } else { ", and it is not alive" };
    if now >= admitted_at + deadline {
        return Verdict::Failed(format!(
            "did not report the candidate (revision {revision}) applied and confirmed within --deadline {deadline} s: {now_says}{alive}"
        ));
    }
    Verdict::Pending(format!("waiting for revision {revision}: {now_says}{alive}"))
}

/// Why a node that reports the candidate converged is not good yet: its presence key is gone,
/// a rollback holds it, or its confirmation round trip has not come.
fn unsettled(s: &Status, alive: bool) -> Option<String> {
    if !alive {
        return Some("but its presence key is gone (not alive)".into());
    }
    if let Some(hold) = &s.applied.hold {
        return Some(format!("but a rollback holds it ({})", first_line(hold)));
    }
    match (s.applied.generation, s.applied.confirmed) {
        (Some(g), Some(c)) if c >= g => None,
        (Some(g), c) => Some(format!(
            "waiting for its confirmation of generation {g} (confirmed: {})",
            c.map_or("none".into(), |c| c.to_string())
        )),
        (None, _) => Some("but its status names no generation (an agent older than the gate)".into()),
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().chars().take(160).collect()
}

/// What the driver does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Write these new failures (and halt when `halt` says why).
    Fail {
        /// The nodes newly failed.
        failures: Vec<Failure>,
        /// Why it halts, when the budget is spent.
        halt: Option<String>,
    },
    /// Nothing to do yet: why.
    Wait(String),
    /// Open the next wave.
    Open,
    /// Every wave passed: mark it done.
    Done,
    /// The rollout is halted: stop driving.
    Halted,
    /// Done already: stop driving.
    Finished,
}

/// The gate: what the driver does, given the state, the verdict on every admitted node, and
/// since when every admitted node has been good (`None`: not all are).
pub fn decide(
    state: &State,
    verdicts: &BTreeMap<String, Verdict>,
    good_since: Option<u64>,
    now: u64,
) -> Step {
    if state.halted.is_some() {
        return Step::Halted;
    }
    if state.done {
        return Step::Finished;
    }
    let failures: Vec<Failure> = verdicts
        .iter()
        .filter(|(node, _)| !state.failures.iter().any(|f| &f.node == *node))
        .filter_map(|(node, v)| match v {
            Verdict::Failed(reason) => Some(Failure { node: node.clone(), reason: reason.clone(), at: now }),
            _ => None,
        })
        .collect();
    if !failures.is_empty() {
        let spent = state.failures.len() + failures.len();
        let halt = (spent > state.max_failures).then(|| {
            let f = &failures[0];
            format!(
                "{spent} node(s) failed, more than --max-failures {}; the last: {}: {}",
                state.max_failures, f.node, f.reason
            )
        });
        return Step::Fail { failures, halt };
    }
    if state.paused.is_some() {
        return Step::Wait("paused".into());
    }
    #[cfg(feature = "robust-mutant")] // tests/robust only (`gate`): a pending node taken for a good one.
    let verdicts: &BTreeMap<String, Verdict> = &verdicts
        .clone()
        .into_iter()
        .filter(|(_, v)| !(crate::fleet::mutant("gate") && matches!(v, Verdict::Pending(_))))
        .collect();
    let pending: Vec<&String> = verdicts
        .iter()
        .filter(|(node, v)| **v != Verdict::Good && !state.failures.iter().any(|f| &f.node == *node))
        .map(|(node, _)| node)
        .collect();
    if !pending.is_empty() {
        return Step::Wait(format!("waiting for {} node(s): {}", pending.len(), list(&pending)));
    }
    if state.opened > 0 {
        let since = good_since.unwrap_or(now);
        if now < since + state.soak {
            // The same words the whole soak long: the driver prints a wait once.
            return Step::Wait(format!("every admitted node good: soaking for {} s", state.soak));
        }
    }
    if state.opened >= state.waves.len() {
        Step::Done
    } else {
        Step::Open
    }
}

/// Since when every admitted node not already counted against the budget has been good, given
/// what it was before this look (`before`): `None` while one is not. A node counted as failed
/// stays failed (dead, reverted, refused) and spent its share of the budget: it no longer holds
/// the soak's clock (docs/decisions.md, "Rollouts").
pub fn soaking_since(
    state: &State,
    verdicts: &BTreeMap<String, Verdict>,
    before: Option<u64>,
    now: u64,
) -> Option<u64> {
    let counted = |node: &String| state.failures.iter().any(|f| &f.node == node);
    if !verdicts.iter().all(|(node, v)| *v == Verdict::Good || counted(node)) {
        return None;
    }
    before.or(Some(now))
}

fn list(nodes: &[&String]) -> String {
    let mut out: String = nodes.iter().take(8).map(|n| n.as_str()).collect::<Vec<_>>().join(", ");
    if nodes.len() > 8 {
        let _ = write!(out, " and {} more", nodes.len() - 8);
    }
    out
}

/// What etcd holds of rollouts and nodes, read at one revision.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The revision it was read at.
    pub revision: i64,
    /// The open rollout's state and the revision it was last written at.
    pub state: Option<(State, i64)>,
    /// Each admitted node's admission and the revision it was written at.
    pub admitted: BTreeMap<String, (Admission, i64)>,
    /// Every node known by a status or presence key.
    pub nodes: BTreeMap<String, Seen>,
    /// Who drives the open rollout, when someone does.
    pub driver: Option<String>,
    /// The last rollout closed.
    pub last: Option<State>,
    /// The keys under the open rollout's scope prefix (for promote), or none.
    pub scope_keys: Vec<String>,
}

impl Snapshot {
    fn of(all: Range) -> Snapshot {
        let mut s = Snapshot { revision: all.revision, ..Snapshot::default() };
        for kv in &all.kvs {
            s.put(kv);
        }
        if let Some((state, _)) = &s.state {
            s.scope_keys = all
                .kvs
                .iter()
                .filter(|kv| kv.key.starts_with(&state.replaces))
                .map(|kv| kv.key.clone())
                .collect();
        }
        s
    }

    /// Each node's groups taken from a trust policy (`bound`) rather than from its status: a
    /// node that names a group the policy does not bind it to is not in that group's waves.
    pub fn bind_groups(&mut self, bound: &crate::fleet::put::Bound) {
        for (node, seen) in &mut self.nodes {
            if let Some(status) = &mut seen.status {
                status.groups = bound.get(node).cloned().unwrap_or_default();
            }
        }
    }

    /// Takes one key as etcd holds it now (read, or put since): what `of` makes of each key.
    /// A value that does not parse is as no value (a state, an admission, a closed rollout), or
    /// as a status that says nothing (a node's).
    pub(crate) fn put(&mut self, kv: &Kv) {
        let (node_root, admitted_root) = (format!("{ROOT}node/"), format!("{ROOT}rollout/open/node/"));
        if kv.key == state_key() {
            self.state = serde_json::from_slice(&kv.value).ok().map(|st| (st, kv.mod_revision));
        } else if kv.key == driver_key() {
            self.driver = Some(String::from_utf8_lossy(&kv.value).into_owned());
        } else if kv.key == last_key() {
            self.last = serde_json::from_slice(&kv.value).ok();
        } else if let Some(node) =
            kv.key.strip_prefix(&admitted_root).and_then(|r| r.strip_suffix("/admitted"))
        {
            match serde_json::from_slice::<Admission>(&kv.value) {
                Ok(a) => self.admitted.insert(node.to_owned(), (a, kv.mod_revision)),
                Err(_) => self.admitted.remove(node),
            };
        } else if let Some((node, what)) = kv.key.strip_prefix(&node_root).and_then(|r| r.split_once('/')) {
            match what {
                "alive" => self.nodes.entry(node.to_owned()).or_default().alive = true,
                "status" => {
                    let seen = self.nodes.entry(node.to_owned()).or_default();
                    seen.status = serde_json::from_slice(&kv.value).ok();
                    seen.status_revision = kv.mod_revision;
                    // Point 3's report, read loosely so that this side needs nothing of its
                    // type: `"reverted": {"generation": N, "reason": "..."}`.
                    let raw: serde_json::Value = serde_json::from_slice(&kv.value).unwrap_or_default();
                    let r = &raw["reverted"];
                    seen.reverted = (!r.is_null()).then(|| {
                        format!(
                            "back to generation {}: {}",
                            r["generation"],
                            r["reason"].as_str().unwrap_or("no reason given")
                        )
                    });
                }
                _ => {}
            }
        }
    }

    /// Takes one key deleted (by a command, or with its lease: a node's presence): as if it had
    /// never been read. A node with neither a status nor a presence key is no longer known.
    pub(crate) fn delete(&mut self, key: &str) {
        let (node_root, admitted_root) = (format!("{ROOT}node/"), format!("{ROOT}rollout/open/node/"));
        if key == state_key() {
            self.state = None;
        } else if key == driver_key() {
            self.driver = None;
        } else if key == last_key() {
            self.last = None;
        } else if let Some(node) = key.strip_prefix(&admitted_root).and_then(|r| r.strip_suffix("/admitted"))
        {
            self.admitted.remove(node);
        } else if let Some((node, what)) = key.strip_prefix(&node_root).and_then(|r| r.split_once('/')) {
            let Some(seen) = self.nodes.get_mut(node) else { return };
            match what {
                "alive" => seen.alive = false,
                "status" => (seen.status, seen.reverted, seen.status_revision) = (None, None, 0),
                _ => return,
            }
            if !seen.alive && seen.status_revision == 0 {
                self.nodes.remove(node);
            }
        }
    }

    /// The nodes a rollout of `scope` is planned over, and those of the scope it leaves out: of
    /// every node known (for a group, those whose status names it), the live ones (their presence
    /// key is there), as a DaemonSet targets only the nodes that are there; a node that is gone
    /// would only spend the budget at its deadline. `fleet forget` removes one for good.
    pub fn nodes_of(&self, scope: &Scope) -> (Vec<String>, Vec<String>) {
        let (alive, dead): (Vec<_>, Vec<_>) = self
            .nodes
            .iter()
            .filter(|(_, seen)| match scope {
                Scope::Group(g) => seen.status.as_ref().is_some_and(|s| s.groups.contains(g)),
                _ => true,
            })
            .partition(|(_, seen)| seen.alive);
        let names = |v: Vec<(&String, &Seen)>| v.into_iter().map(|(n, _)| n.clone()).collect();
        (names(alive), names(dead))
    }

    /// The verdict on every admitted node, its deadline counted from its admission's `at` (the
    /// wall clock of the driver that admitted it) to `now` (this machine's wall clock): for
    /// `fleet rollout status` and `promote`, which keep no clock of their own. The driver
    /// counts on its own monotonic clock (`verdicts_by`).
    pub fn verdicts(&self, state: &State, now: u64) -> BTreeMap<String, Verdict> {
        self.verdicts_by(state, |_, a, _| a.at, now)
    }

    /// The verdict on every admitted node, its deadline counted from `since(node, admission,
    /// revision)` to `now`, both on one clock.
    pub fn verdicts_by(
        &self,
        state: &State,
        mut since: impl FnMut(&str, &Admission, i64) -> u64,
        now: u64,
    ) -> BTreeMap<String, Verdict> {
        self.admitted
            .iter()
            .map(|(node, (a, revision))| {
                let seen = self.nodes.get(node).cloned().unwrap_or_default();
                (node.clone(), judge(*revision, since(node, a, *revision), state.deadline, &seen, now))
            })
            .collect()
    }
}

/// Reads everything under mesh-host's root at one revision.
pub async fn snapshot(etcd: &Etcd) -> Result<Snapshot, crate::system::etcd::Error> {
    Ok(Snapshot::of(etcd.range_prefix(ROOT, None).await?))
}

/// Why a rollout command cannot go on, in words for the operator (exit 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

fn refused<T>(message: String) -> anyhow::Result<T> {
    Err(Refused(message).into())
}

fn no_rollout(s: &Snapshot) -> String {
    none_open(s.last.as_ref())
}

/// What is said when no rollout is open: the last one and how it closed, if there was one.
fn none_open(last: Option<&State>) -> String {
    match last {
        Some(last) => format!(
            "no rollout is open; the last, {}, was {}",
            last.id,
            last.closed.as_deref().unwrap_or("closed")
        ),
        None => "no rollout is open".into(),
    }
}

/// The message naming the open rollout, for a command it stands in the way of.
pub fn open_message(state: &State) -> String {
    format!(
        "rollout {} of {} is open ({}), started by {} at {}; see `mesh-host fleet rollout status`, then `fleet rollout promote` or `fleet rollout abort`",
        state.id,
        state.scope().describe(),
        state.phase(),
        state.started_by,
        when(state.started_at)
    )
}

fn when(secs: u64) -> String {
    crate::controller::drift::utc(secs * 1000)
}

/// Who runs this command, as the driver's key and the state say it.
fn who() -> String {
    let host = crate::system::read_input(std::path::Path::new("/proc/sys/kernel/hostname"), 256)
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let user = ["SUDO_USER", "LOGNAME", "USER"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "unknown".into());
    format!("{user} on {host} (pid {})", std::process::id())
}

/// An etcd error from a write whose answer was lost; any other error passes through.
fn lost(e: &crate::system::etcd::Error) -> bool {
    matches!(e, crate::system::etcd::Error::Unknown { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("n{i:02}")).collect()
    }

    #[test]
    fn waves_read_counts_and_percentages_and_refuse_the_rest() {
        assert_eq!(
            parse_waves("1,10%,50%,100%").unwrap(),
            [Size::Count(1), Size::Percent(10), Size::Percent(50), Size::Percent(100)]
        );
        for bad in ["", "0", "0%", "101%", "ten", "5,,", "-1"] {
            assert!(parse_waves(bad).is_err(), "{bad:?} was taken");
        }
    }

    #[test]
    fn waves_count_what_came_before_round_up_and_drop_empty_ones() {
        let sizes = parse_waves("1,10%,50%,100%").unwrap();
        let w = plan(&names(100), &[], &sizes).unwrap();
        assert_eq!(w.iter().map(Vec::len).collect::<Vec<_>>(), [1, 9, 40, 50]);
        assert_eq!(w[0], ["n00"]);
        // 10% of 8 is 1, reached by the first wave already: no empty wave.
        let w = plan(&names(8), &[], &sizes).unwrap();
        assert_eq!(w.iter().map(Vec::len).collect::<Vec<_>>(), [1, 3, 4]);
        let w = plan(&names(1), &[], &sizes).unwrap();
        assert_eq!(w, [vec!["n00".to_owned()]]);
    }

    #[test]
    fn canaries_come_first_in_their_order_then_the_rest_by_name() {
        let mut nodes = names(5);
        nodes.reverse();
        let w = plan(&nodes, &["n03".into(), "n01".into()], &parse_waves("2,100%").unwrap()).unwrap();
        assert_eq!(w, [vec!["n03", "n01"], vec!["n00", "n02", "n04"]]);
        assert!(plan(&nodes, &["nope".into()], &[Size::Percent(100)]).unwrap_err().contains("nope"));
    }

    #[test]
    fn a_plan_that_does_not_reach_every_node_or_goes_down_is_refused() {
        let err = plan(&names(10), &[], &parse_waves("1,50%").unwrap()).unwrap_err();
        assert!(err.contains("reaches 5 of the 10") && err.contains("100%"), "{err}");
        assert!(plan(&names(10), &[], &parse_waves("5,10%,100%").unwrap()).unwrap_err().contains("go down"));
        assert!(plan(&[], &[], &[Size::Percent(100)]).is_err());
    }

    fn status(revision: i64, converged: bool, error: Option<&str>) -> Status {
        Status {
            node: "n".into(),
            groups: Vec::new(),
            revision: Some(revision),
            applied: super::super::status::Summary {
                converged,
                last_error: error.map(str::to_owned),
                generation: Some(5),
                confirmed: Some(5),
                ..Default::default()
            },
            refused: None,
            refused_reason: None,
            written_at: 100,
        }
    }

    #[test]
    fn a_node_is_good_only_once_it_reports_the_candidates_revision_converged() {
        let seen = |s: Status| Seen { status: Some(s), reverted: None, alive: true, status_revision: 20 };
        assert_eq!(judge(10, 100, 60, &seen(status(10, true, None)), 101), Verdict::Good);
        assert_eq!(judge(10, 100, 60, &seen(status(12, true, None)), 101), Verdict::Good);
        assert!(matches!(judge(10, 100, 60, &seen(status(9, true, None)), 101), Verdict::Pending(_)));
        let late = judge(10, 100, 60, &seen(status(9, true, None)), 160);
        assert!(matches!(&late, Verdict::Failed(w) if w.contains("--deadline 60 s")), "{late:?}");
        let bad = judge(10, 100, 60, &seen(status(10, false, Some("file x: cannot make /a/b"))), 101);
        assert!(matches!(&bad, Verdict::Failed(w) if w.contains("cannot make /a/b")), "{bad:?}");
        let mut reverted = seen(status(10, true, None));
        reverted.reverted = Some("back to generation 3: etcd unreachable".into());
        assert!(matches!(judge(10, 100, 60, &reverted, 101), Verdict::Failed(w) if w.contains("reverted")));
        let mut refusing = status(9, true, None);
        refusing.refused = Some("two levels declare id x".into());
        assert!(
            matches!(judge(10, 100, 60, &seen(refusing), 101), Verdict::Failed(w) if w.contains("two levels"))
        );
        let none = Seen::default();
        assert!(matches!(judge(10, 100, 60, &none, 101), Verdict::Pending(w) if w.contains("not alive")));
    }

    /// Issue 42, hole 1: converged at the candidate's revision is not enough. A node that has not
    /// confirmed its generation by an etcd round trip may still go back by itself, and a node
    /// whose presence key is gone may be dead: neither passes the gate, and past the deadline
    /// each spends the budget.
    #[test]
    fn the_gate_passes_only_nodes_alive_that_confirmed_the_generation_they_run() {
        let seen =
            |s: Status, alive: bool| Seen { status: Some(s), reverted: None, alive, status_revision: 20 };
        let mut unconfirmed = status(10, true, None);
        unconfirmed.applied.generation = Some(6);
        let v = judge(10, 100, 60, &seen(unconfirmed.clone(), true), 101);
        assert!(
            matches!(&v, Verdict::Pending(w) if w.contains("confirmation of generation 6") && w.contains("confirmed: 5")),
            "{v:?}"
        );
        let late = judge(10, 100, 60, &seen(unconfirmed, true), 160);
        assert!(
            matches!(&late, Verdict::Failed(w) if w.contains("applied and confirmed within --deadline")),
            "{late:?}"
        );
        let dead = judge(10, 100, 60, &seen(status(10, true, None), false), 101);
        assert!(matches!(&dead, Verdict::Pending(w) if w.contains("not alive")), "{dead:?}");
        let mut held = status(10, true, None);
        held.applied.hold = Some("generation 4, by root".into());
        assert!(
            matches!(judge(10, 100, 60, &seen(held, true), 101), Verdict::Pending(w) if w.contains("rollback holds"))
        );
        let mut old_agent = status(10, true, None);
        (old_agent.applied.generation, old_agent.applied.confirmed) = (None, None);
        assert!(
            matches!(judge(10, 100, 60, &seen(old_agent, true), 101), Verdict::Pending(w) if w.contains("older than the gate"))
        );
        // A refusal counts when etcd wrote it after the admission, whatever the node's clock says.
        let mut refusing = status(9, true, None);
        refusing.refused = Some("bad".into());
        refusing.written_at = 0;
        let after = Seen { status: Some(refusing.clone()), reverted: None, alive: true, status_revision: 11 };
        assert!(
            matches!(judge(10, 100, 60, &after, 101), Verdict::Failed(w) if w.contains("refused the candidate"))
        );
        let before = Seen { status_revision: 9, ..after };
        assert!(matches!(judge(10, 100, 60, &before, 101), Verdict::Pending(_)));
    }

    fn kv(key: &str, value: serde_json::Value, mod_revision: i64) -> crate::system::etcd::Kv {
        crate::system::etcd::Kv { key: key.into(), value: value.to_string().into_bytes(), mod_revision }
    }

    #[test]
    fn a_snapshot_reads_admissions_statuses_groups_and_a_reverted_report() {
        let st = |node: &str, groups: &[&str], extra: serde_json::Value| {
            let mut v = serde_json::json!({"node": node, "groups": groups, "revision": 12, "converged": true,
                "counts": {}, "drift_corrections": 0, "contested": 0, "last_error": null, "written_at": 100});
            if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
                v.extend(extra.clone());
            }
            v
        };
        let mut state = state(2, 1, 0, 0);
        state.waves = vec![vec!["a".into()], vec!["b".into(), "web-10".into()]];
        let admission = serde_json::json!({"rollout": "r", "replaces": state.replaces, "wave": 1, "at": 100});
        let range = Range {
            revision: 20,
            kvs: vec![
                kv("/mesh-host/node/a/alive", serde_json::json!(1), 3),
                kv(
                    "/mesh-host/node/a/status",
                    st(
                        "a",
                        &[],
                        serde_json::json!({"reverted": {"generation": 4, "reason": "etcd unreachable"}}),
                    ),
                    13,
                ),
                kv("/mesh-host/node/b/status", st("b", &["web"], serde_json::json!({})), 14),
                kv("/mesh-host/node/web-10/status", st("web-10", &["web"], serde_json::json!({})), 15),
                kv("/mesh-host/rollout/open/node/a/admitted", admission, 11),
                kv("/mesh-host/rollout/open/state", serde_json::to_value(&state).unwrap(), 11),
            ],
        };
        let s = Snapshot::of(range);
        assert_eq!(s.state.as_ref().map(|(_, at)| *at), Some(11));
        assert_eq!(s.admitted.keys().collect::<Vec<_>>(), ["a"]);
        // Planned over the live nodes only; the others are named as left out.
        let (alive, dead) = s.nodes_of(&Scope::Fleet);
        assert_eq!((alive, dead), (vec!["a".to_owned()], vec!["b".to_owned(), "web-10".to_owned()]));
        let (alive, dead) = s.nodes_of(&Scope::Group("web".into()));
        assert!(alive.is_empty());
        assert_eq!(dead, ["b", "web-10"]);
        // A trust policy's groups, not the nodes' own: b is bound to db only.
        let mut s = s;
        s.bind_groups(&[("b".to_owned(), vec!["db".to_owned()])].into_iter().collect());
        assert_eq!(s.nodes_of(&Scope::Group("web".into())).1, Vec::<String>::new(), "web-10 is in no group");
        assert_eq!(s.nodes_of(&Scope::Group("db".into())).1, ["b"]);
        let verdicts = s.verdicts(&state, 101);
        assert!(
            matches!(&verdicts["a"], Verdict::Failed(w) if w.contains("generation 4") && w.contains("etcd unreachable")),
            "{verdicts:?}"
        );
        let r = Report { revision: 20, state: Some(state.clone()), driver: None, nodes: vec![], last: None };
        assert!(
            text(&r).contains("driver: none (`mesh-host fleet rollout resume` drives it)"),
            "{}",
            text(&r)
        );
    }

    fn state(waves: usize, opened: usize, max_failures: usize, soak: u64) -> State {
        State {
            id: "r".into(),
            group: None,
            replaces: Scope::Fleet.prefix(),
            base_revision: 1,
            keys: Vec::new(),
            waves: (0..waves).map(|i| vec![format!("n{i}")]).collect(),
            opened,
            soak,
            max_failures,
            deadline: 60,
            paused: None,
            halted: None,
            done: false,
            failures: Vec::new(),
            started_at: 0,
            started_by: "me".into(),
            closed: None,
            version: None,
        }
    }

    #[test]
    fn the_gate_opens_the_next_wave_only_when_all_are_good_and_soaked() {
        let v = |pairs: &[(&str, Verdict)]| -> BTreeMap<String, Verdict> {
            pairs.iter().map(|(n, v)| (n.to_string(), v.clone())).collect()
        };
        // Nothing open yet: the first wave opens at once.
        assert_eq!(decide(&state(3, 0, 0, 30), &v(&[]), None, 100), Step::Open);
        let good = v(&[("n0", Verdict::Good)]);
        assert!(
            matches!(decide(&state(3, 1, 0, 30), &good, Some(90), 100), Step::Wait(w) if w.contains("soaking"))
        );
        assert_eq!(decide(&state(3, 1, 0, 30), &good, Some(70), 100), Step::Open);
        assert_eq!(decide(&state(1, 1, 0, 0), &good, Some(100), 100), Step::Done);
        let pending = v(&[("n0", Verdict::Pending("x".into()))]);
        assert!(matches!(decide(&state(3, 1, 0, 0), &pending, None, 100), Step::Wait(_)));
        let mut paused = state(3, 1, 0, 0);
        paused.paused = Some("by me".into());
        assert!(matches!(decide(&paused, &good, Some(0), 100), Step::Wait(w) if w == "paused"));
    }

    #[test]
    fn a_failure_spends_the_budget_and_past_it_the_rollout_halts() {
        let failed: BTreeMap<String, Verdict> =
            [("n0".to_owned(), Verdict::Failed("boom".into())), ("n1".to_owned(), Verdict::Good)].into();
        match decide(&state(3, 2, 0, 0), &failed, None, 100) {
            Step::Fail { failures, halt: Some(why) } => {
                assert_eq!(failures.len(), 1);
                assert!(why.contains("n0: boom") && why.contains("--max-failures 0"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(decide(&state(3, 2, 1, 0), &failed, None, 100), Step::Fail { halt: None, .. }));
        // Counted once: a failed node no longer holds the gate.
        let mut spent = state(3, 2, 1, 0);
        spent.failures.push(Failure { node: "n0".into(), reason: "boom".into(), at: 1 });
        assert_eq!(decide(&spent, &failed, None, 100), Step::Open);
        let mut halted = state(3, 2, 0, 0);
        halted.halted = Some("x".into());
        assert_eq!(decide(&halted, &failed, None, 100), Step::Halted);
    }

    /// Issue 42, hole 3: a node counted against the budget that stays failed (dead, reverted,
    /// refused) must not hold the soak's clock at zero for ever.
    #[test]
    fn a_failure_within_the_budget_does_not_stall_a_soaking_rollout() {
        let mut st = state(3, 2, 1, 30);
        st.failures.push(Failure { node: "n0".into(), reason: "boom".into(), at: 1 });
        let verdicts: BTreeMap<String, Verdict> =
            [("n0".to_owned(), Verdict::Failed("boom".into())), ("n1".to_owned(), Verdict::Good)].into();
        let mut since = None;
        let mut step = Step::Wait(String::new());
        for now in 100..200 {
            since = soaking_since(&st, &verdicts, since, now);
            step = decide(&st, &verdicts, since, now);
            if step == Step::Open {
                assert!(now >= 130, "opened at {now}, before the soak of 30 s");
                break;
            }
        }
        assert_eq!(step, Step::Open, "still {step:?} after 100 s of a 30 s soak");
        // A node not yet counted still stops the clock (its failure is written first).
        let fresh = [("n2".to_owned(), Verdict::Pending("x".into()))].into();
        assert_eq!(soaking_since(&st, &fresh, Some(100), 150), None);
    }

    /// Issue 43: a wave's admissions are written after its state, in transactions of `CHUNK`;
    /// those not written yet are found, in wave order, and none once the rollout halts.
    #[test]
    fn a_waves_unwritten_admissions_are_found_and_none_after_a_halt() {
        let mut st = state(3, 2, 0, 0);
        st.waves = vec![vec!["a".into()], (0..250).map(|i| format!("b{i:03}")).collect(), vec!["c".into()]];
        let mut admitted: BTreeMap<String, ()> = [("a".to_owned(), ())].into();
        admitted.extend((0..100).map(|i| (format!("b{i:03}"), ())));
        let missing = unadmitted(&st, &admitted);
        assert_eq!(missing.len(), 150);
        assert_eq!(missing[0], "b100");
        assert!(!missing.contains(&"c".to_owned()), "wave 3 is not open");
        assert_eq!(missing.chunks(CHUNK).count(), 2);
        st.halted = Some("x".into());
        assert!(unadmitted(&st, &admitted).is_empty());
    }

    /// Promote judges every node once more: a node gone back since the last gate spends the
    /// budget, or refuses promote when the budget cannot take it.
    #[test]
    fn promote_checks_the_gate_again() {
        let good: BTreeMap<String, Verdict> = [("n0".to_owned(), Verdict::Good)].into();
        assert_eq!(regate(&state(1, 1, 0, 0), &good), Ok(String::new()));
        let back: BTreeMap<String, Verdict> = [
            ("n0".to_owned(), Verdict::Good),
            ("n1".to_owned(), Verdict::Failed("reverted by itself".into())),
        ]
        .into();
        let err = regate(&state(1, 1, 0, 0), &back).unwrap_err();
        assert!(err.contains("n1: reverted by itself") && err.contains("nothing was written"), "{err}");
        let ok = regate(&state(1, 1, 1, 0), &back).unwrap();
        assert!(ok.contains("within --max-failures 1") && ok.contains("n1"), "{ok}");
        let mut counted = state(1, 1, 1, 0);
        counted.failures.push(Failure { node: "n1".into(), reason: "x".into(), at: 1 });
        assert_eq!(regate(&counted, &back), Ok(String::new()));
    }

    /// etcd's limits are named, never taken for "out of reach".
    #[test]
    fn an_etcd_limit_is_named_and_anything_else_is_not_a_limit() {
        use crate::system::etcd::{Error, Refusal};
        let refusal = |code| {
            anyhow::Error::from(Error::Refused {
                endpoint: "e".into(),
                call: "a transaction",
                why: code,
                message: "etcdserver: too many operations in txn request".into(),
            })
        };
        assert!(limit(&refusal(Refusal::OverLimit))
            .is_some_and(|m| m.contains("--max-txn-ops") && m.contains("too many operations")));
        assert!(limit(&refusal(Refusal::NoSpace)).is_some_and(|m| m.contains("--quota-backend-bytes")));
        // A member behind on its apply ("too many requests", code 8 as a full backend is) is
        // no limit: it passes.
        assert_eq!(limit(&refusal(Refusal::Busy)), None);
        assert_eq!(limit(&refusal(Refusal::Other(Some(14)))), None);
        assert_eq!(limit(&anyhow::anyhow!("other")), None);
    }
}
