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
//! /mesh-host/rollout/open/candidate/NAME    the candidate's files, NAME as `fleet put` names them
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

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::status::Status;
use super::{Scope, ROOT};
use crate::system::etcd::{Cond, Etcd, Range, Write};

/// The prefix of the rollout open, if any: deleted whole when it closes.
pub fn open_prefix() -> String {
    format!("{ROOT}rollout/open/")
}

/// The key of the open rollout's state.
pub fn state_key() -> String {
    format!("{ROOT}rollout/open/state")
}

/// The prefix the candidate's files are under.
pub fn candidate_prefix() -> String {
    format!("{ROOT}rollout/open/candidate/")
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

/// How often the driver looks at the fleet.
const POLL: Duration = Duration::from_millis(500);

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
        return Err("no node in the scope has reported to etcd (no status or presence key): a rollout needs nodes to watch".into());
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
/// (seconds, by the driver's clock, as `now`), with `deadline` seconds to report. A node is good
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
#[derive(Debug, Default)]
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
        let node_root = format!("{ROOT}node/");
        let admitted_root = format!("{ROOT}rollout/open/node/");
        let (state_key, driver_key, last_key) = (state_key(), driver_key(), last_key());
        for kv in &all.kvs {
            if kv.key == state_key {
                s.state = serde_json::from_slice(&kv.value).ok().map(|st| (st, kv.mod_revision));
            } else if kv.key == driver_key {
                s.driver = Some(String::from_utf8_lossy(&kv.value).into_owned());
            } else if kv.key == last_key {
                s.last = serde_json::from_slice(&kv.value).ok();
            } else if let Some(node) =
                kv.key.strip_prefix(&admitted_root).and_then(|r| r.strip_suffix("/admitted"))
            {
                if let Ok(a) = serde_json::from_slice::<Admission>(&kv.value) {
                    s.admitted.insert(node.to_owned(), (a, kv.mod_revision));
                }
            } else if let Some((node, what)) = kv.key.strip_prefix(&node_root).and_then(|r| r.split_once('/'))
            {
                match what {
                    "alive" => s.nodes.entry(node.to_owned()).or_default().alive = true,
                    "status" => {
                        let seen = s.nodes.entry(node.to_owned()).or_default();
                        seen.status = serde_json::from_slice(&kv.value).ok();
                        seen.status_revision = kv.mod_revision;
                        // Point 3's report, read loosely so that this side needs nothing of its
                        // type: `"reverted": {"generation": N, "reason": "..."}`.
                        let raw: serde_json::Value = serde_json::from_slice(&kv.value).unwrap_or_default();
                        let r = &raw["reverted"];
                        if !r.is_null() {
                            seen.reverted = Some(format!(
                                "back to generation {}: {}",
                                r["generation"],
                                r["reason"].as_str().unwrap_or("no reason given")
                            ));
                        }
                    }
                    _ => {}
                }
            }
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

    /// The nodes a rollout of `scope` is for: every node known, for the fleet; those whose
    /// status names the group, for a group.
    pub fn nodes_of(&self, scope: &Scope) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(_, seen)| match scope {
                Scope::Group(g) => seen.status.as_ref().is_some_and(|s| s.groups.contains(g)),
                _ => true,
            })
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The verdict on every admitted node.
    pub fn verdicts(&self, state: &State, now: u64) -> BTreeMap<String, Verdict> {
        self.admitted
            .iter()
            .map(|(node, (a, revision))| {
                let seen = self.nodes.get(node).cloned().unwrap_or_default();
                (node.clone(), judge(*revision, a.at, state.deadline, &seen, now))
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

/// What `start` is given.
pub struct Start {
    /// The rollout's scope: the fleet or a group.
    pub scope: Scope,
    /// The candidate, from `put::prepare` (keys under the scope's prefix), checked by
    /// `put::check_nodes`.
    pub wanted: Vec<(String, Vec<u8>)>,
    /// `--waves`.
    pub sizes: Vec<Size>,
    /// `--canary`.
    pub canaries: Vec<String>,
    /// `--soak`.
    pub soak: u64,
    /// `--max-failures`.
    pub max_failures: usize,
    /// `--deadline`.
    pub deadline: u64,
    /// The rollout's id (`new_id`): a signed candidate's manifest names it.
    pub id: String,
    /// `--sign`: the candidate's version, and its manifests' and signatures' keys under the
    /// candidate's prefix (`super::signed`).
    pub signed: Option<(u64, super::signed::Keys)>,
}

/// A new rollout's id: `rollout-` and the time it starts.
pub fn new_id(now: u64) -> String {
    format!("rollout-{}", crate::controller::drift::utc(now * 1000))
}

/// `fleet rollout start`: writes the candidate and the plan in one transaction (refused when a
/// rollout is open, or the scope changed since it was read), prints the wave order, and drives
/// it. Returns whether it ended well (every wave passed).
pub async fn start(etcd: &Etcd, start: Start) -> anyhow::Result<bool> {
    let s = snapshot(etcd).await?;
    if let Some((state, _)) = &s.state {
        return refused(format!("nothing was written: {}", open_message(state)));
    }
    let nodes = s.nodes_of(&start.scope);
    let waves = plan(&nodes, &start.canaries, &start.sizes).map_err(Refused)?;
    let prefix = start.scope.prefix();
    let now = crate::system::unix_secs();
    let state = State {
        id: start.id.clone(),
        group: match &start.scope {
            Scope::Group(g) => Some(g.clone()),
            _ => None,
        },
        replaces: prefix.clone(),
        base_revision: s.revision,
        keys: start.wanted.iter().map(|(k, _)| k.clone()).collect(),
        waves,
        opened: 0,
        soak: start.soak,
        max_failures: start.max_failures,
        deadline: start.deadline,
        paused: None,
        halted: None,
        done: false,
        failures: Vec::new(),
        started_at: now,
        started_by: who(),
        closed: None,
        version: start.signed.as_ref().map(|(v, _)| *v),
    };
    // Nothing is under the rollout's prefix when no state is (every close deletes it whole):
    // checked, with the state's absence, in the transaction.
    let mut writes = vec![Write::Put { key: state_key(), value: serde_json::to_vec(&state)?, lease: 0 }];
    for (key, bytes) in &start.wanted {
        let name = key.strip_prefix(&prefix).unwrap_or(key);
        writes.push(Write::Put {
            key: format!("{}{name}", candidate_prefix()),
            value: bytes.clone(),
            lease: 0,
        });
    }
    for (key, value) in start.signed.iter().flat_map(|(_, keys)| keys) {
        writes.push(Write::Put { key: key.clone(), value: value.clone(), lease: 0 });
    }
    // The driver's key is taken in the same transaction: a start that writes the rollout
    // drives it, and a driver left from a rollout before (its lease not yet ended) refuses it.
    let lease = etcd.lease_grant(DRIVER_TTL).await?;
    writes.push(Write::Put { key: driver_key(), value: driver_value().into_bytes(), lease });
    let conds = [
        Cond::Absent(state_key()),
        Cond::Absent(driver_key()),
        Cond::UnchangedSince { prefix: prefix.clone(), revision: s.revision },
        Cond::UnchangedSince { prefix: open_prefix(), revision: s.revision },
    ];
    let answer = match etcd.txn(&conds, &writes).await {
        // The answer was lost: read back. The rollout there with this id is this start's write;
        // anything else leaves the outcome unknown (exit 3), and the lease is left to end by
        // itself, since a driver key written with it may yet be there.
        Err(e) if lost(&e) => match snapshot(etcd).await {
            Ok(again) if again.state.as_ref().is_some_and(|(st, _)| st.id == state.id) => {
                println!("etcd's answer to the start was lost; read back: rollout {} was written", state.id);
                Some(again.revision)
            }
            _ => return Err(e.into()),
        },
        Err(e) => {
            let e = anyhow::Error::from(e);
            return Err(limit(&e).map_or(e, anyhow::Error::msg));
        }
        Ok(answer) => answer,
    };
    if answer.is_none() {
        let _ = etcd.lease_revoke(lease).await;
        let again = snapshot(etcd).await?;
        return refused(match (&again.state, &again.driver) {
            (Some((other, _)), _) => format!("nothing was written: {}", open_message(other)),
            (None, Some(driver)) => format!(
                "nothing was written: the driver of an earlier rollout, {driver}, still holds its key; its lease ends within {DRIVER_TTL} s: start again then"
            ),
            (None, None) => format!(
                "nothing was written: {} or the rollout's keys changed in etcd while this start was being prepared; start again",
                start.scope.describe()
            ),
        });
    }
    let mut driver = Driver { lease, renewed: tokio::time::Instant::now() };
    println!(
        "rollout {}: a candidate of {} key(s) for {}; nothing changes on any node until its wave opens",
        state.id,
        state.keys.len(),
        start.scope.describe()
    );
    print_plan(&state);
    let ended = drive_held(etcd, &mut driver).await;
    driver.release(etcd).await;
    ended
}

/// The plan, as `start` prints it: every wave and its nodes.
fn print_plan(state: &State) {
    println!(
        "waves (soak {} s, deadline {} s, max failures {}):",
        state.soak, state.deadline, state.max_failures
    );
    for (i, wave) in state.waves.iter().enumerate() {
        println!("  wave {}: {}", i + 1, wave.join(", "));
    }
}

/// What the driver's key says: who, and since when.
fn driver_value() -> String {
    format!("{} since {}", who(), when(crate::system::unix_secs()))
}

/// The driver's hold on the rollout: its lease, renewed as it goes.
struct Driver {
    lease: i64,
    renewed: tokio::time::Instant,
}

impl Driver {
    /// Takes the driver's key, bound to a new lease, when no one holds it.
    async fn take(etcd: &Etcd) -> anyhow::Result<Driver> {
        let lease = etcd.lease_grant(DRIVER_TTL).await?;
        let put = Write::Put { key: driver_key(), value: driver_value().into_bytes(), lease };
        if etcd.txn(&[Cond::Absent(driver_key())], &[put]).await?.is_none() {
            let _ = etcd.lease_revoke(lease).await;
            let s = snapshot(etcd).await?;
            return refused(format!(
                "the rollout is already driven by {}; a second driver is refused. If that driver is gone, its lease ends within {DRIVER_TTL} s: run `mesh-host fleet rollout resume` then",
                s.driver.as_deref().unwrap_or("another driver")
            ));
        }
        Ok(Driver { lease, renewed: tokio::time::Instant::now() })
    }

    /// Renews the lease every few seconds; refused when it was lost (ended by etcd while the
    /// driver could not renew it) and someone else took the key meanwhile.
    async fn keep(&mut self, etcd: &Etcd) -> anyhow::Result<()> {
        if self.renewed.elapsed() < Duration::from_secs((DRIVER_TTL / 3) as u64) {
            return Ok(());
        }
        match etcd.lease_keepalive(self.lease).await {
            Ok(true) => self.renewed = tokio::time::Instant::now(),
            Ok(false) => {
                println!(
                    "the driver's lease ended (etcd was out of reach for {DRIVER_TTL} s); taking it again"
                );
                *self = Driver::take(etcd).await?;
            }
            // etcd out of reach: the state's writes are refused meanwhile too; tried again.
            Err(e) => println!("cannot renew the driver's lease: {e}"),
        }
        Ok(())
    }

    async fn release(self, etcd: &Etcd) {
        let _ = etcd.lease_revoke(self.lease).await;
    }
}

/// Drives the open rollout until it is done, halted, or closed by someone else: the gate,
/// wave by wave, every decision written to etcd (each write conditional on the state being as
/// read, so a pause or an abort from another operator is never written over). Takes the
/// driver's key first. Returns whether every wave passed.
pub async fn drive(etcd: &Etcd) -> anyhow::Result<bool> {
    let mut driver = Driver::take(etcd).await?;
    let ended = drive_held(etcd, &mut driver).await;
    driver.release(etcd).await;
    ended
}

async fn drive_held(etcd: &Etcd, driver: &mut Driver) -> anyhow::Result<bool> {
    // Since when every admitted node has been good, by this driver's clock: a driver started
    // again soaks the open waves again from the start, the cautious way (docs/decisions.md,
    // "Rollouts").
    let mut good_since: Option<u64> = None;
    let mut said: BTreeMap<String, String> = BTreeMap::new();
    let mut last_wait = String::new();
    loop {
        match driver.keep(etcd).await {
            Err(e) if e.downcast_ref::<crate::system::etcd::Error>().is_some() => {
                println!("etcd: {e}; trying again");
                pause().await?;
                continue;
            }
            kept => kept?,
        }
        let s = match snapshot(etcd).await {
            Ok(s) => s,
            Err(e) => {
                println!("cannot read etcd: {e}; trying again");
                pause().await?;
                continue;
            }
        };
        let Some((state, at)) = s.state.clone() else {
            println!("{}: nothing left to drive", no_rollout(&s));
            return Ok(false);
        };
        let now = crate::system::unix_secs();
        let missing = unadmitted(&state, &s.admitted);
        if !missing.is_empty() {
            // A wave opened whose admissions are not all written (a driver stopped between its
            // transactions, or this one a poll ago): finished before anything is judged.
            match admit(etcd, &state, Written { at, lease: driver.lease, now }, &missing).await {
                Err(e) if limit(&e).is_none() && e.downcast_ref::<crate::system::etcd::Error>().is_some() => {
                    println!("etcd: {e}; trying again");
                }
                done => done?,
            }
            pause().await?;
            continue;
        }
        let verdicts = s.verdicts(&state, now);
        for (node, v) in &verdicts {
            let line = match v {
                Verdict::Good => "applied and converged".to_owned(),
                Verdict::Pending(_) => continue,
                Verdict::Failed(why) => format!("FAILED: {why}"),
            };
            if said.get(node) != Some(&line) {
                println!("  {node}: {line}");
                said.insert(node.clone(), line);
            }
        }
        good_since = soaking_since(&state, &verdicts, good_since, now);
        let step = decide(&state, &verdicts, good_since, now);
        let written = Written { at, lease: driver.lease, now };
        match act(etcd, step, &state, written, &mut good_since, &mut last_wait).await {
            Ok(Some(ended)) => return Ok(ended),
            Ok(None) => {}
            // etcd out of reach, a member gone mid-call, or an answer lost (the state is read
            // again, so a write that took is seen): looked at again. A refusal for one of etcd's
            // limits is not passing: it halts here, named. Only what this command decides, or
            // such a limit, stops it.
            Err(e) if limit(&e).is_none() && e.downcast_ref::<crate::system::etcd::Error>().is_some() => {
                println!("etcd: {e}; trying again");
            }
            Err(e) => return Err(limit(&e).map_or(e, anyhow::Error::msg)),
        }
        pause().await?;
    }
}

/// What the driver's writes are conditional on: the state as it read it (`at`, its revision),
/// and its own lease still holding the driver's key (the fence: a driver paused past its lease,
/// whose key another took, writes nothing); `now` by the driver's clock.
#[derive(Clone, Copy, Debug)]
struct Written {
    at: i64,
    lease: i64,
    now: u64,
}

impl Written {
    fn conds(&self) -> [Cond; 2] {
        [Cond::WrittenAt(state_key(), self.at), Cond::LeaseIs(driver_key(), self.lease)]
    }
}

/// The nodes of the open waves that hold no admission yet, in wave order: none once a wave's
/// admissions are all written.
pub fn unadmitted<T>(state: &State, admitted: &BTreeMap<String, T>) -> Vec<String> {
    if state.halted.is_some() {
        return Vec::new();
    }
    state.waves[..state.opened.min(state.waves.len())]
        .iter()
        .flatten()
        .filter(|n| !admitted.contains_key(*n))
        .cloned()
        .collect()
}

/// Writes the admissions of `nodes`, `CHUNK` to a transaction, each conditional on the state
/// being as read and on the driver's lease: an abort, a pause or another driver between two of
/// them stops the rest (the next look sees why).
async fn admit(etcd: &Etcd, state: &State, written: Written, nodes: &[String]) -> anyhow::Result<()> {
    let (conds, now) = (written.conds(), written.now);
    let wave =
        |node: &String| state.waves.iter().position(|w| w.contains(node)).map_or(state.opened, |i| i + 1);
    for chunk in nodes.chunks(CHUNK) {
        let mut writes = Vec::with_capacity(chunk.len());
        for node in chunk {
            let a = Admission {
                rollout: state.id.clone(),
                replaces: state.replaces.clone(),
                wave: wave(node),
                at: now,
            };
            writes.push(Write::Put { key: admission_key(node), value: serde_json::to_vec(&a)?, lease: 0 });
        }
        if etcd.txn(&conds, &writes).await?.is_none() {
            return Ok(());
        }
    }
    println!("admitted {} node(s) of wave {} of {}", nodes.len(), state.opened, state.waves.len());
    Ok(())
}

/// What an etcd refusal says of one of etcd's own limits, in words that name the limit and
/// what to do: never retried in silence. `None` for anything else.
pub fn limit(e: &anyhow::Error) -> Option<String> {
    use crate::system::etcd::{Error, Refusal};
    let Some(Error::Refused { why, message, .. }) = e.downcast_ref::<Error>() else {
        return None;
    };
    let what = match why {
        // InvalidArgument: too many operations, or a request too large.
        Refusal::OverLimit => "a request over one of etcd's limits: --max-txn-ops (128 operations a transaction by default) or --max-request-bytes (1.5 MiB by default); the rollout's plan names every node, so past tens of thousands of nodes raise --max-request-bytes on every member",
        // ResourceExhausted: the backend's quota (the NOSPACE alarm).
        Refusal::NoSpace => "etcd's backend is full (--quota-backend-bytes, 2 GiB by default; the NOSPACE alarm is raised): compact and defragment (`etcdctl compact`, `etcdctl defrag`), then `etcdctl alarm disarm`; docs/decisions.md, \"etcd kept in bounds\"",
        _ => return None,
    };
    Some(format!("etcd refused the rollout's write: {what} (etcd said: {message}); the rollout stays as etcd holds it: `mesh-host fleet rollout resume` drives it on once etcd takes it"))
}

/// Does what the gate decided: `Some(ended well)` when driving is over.
async fn act(
    etcd: &Etcd,
    step: Step,
    state: &State,
    written: Written,
    good_since: &mut Option<u64>,
    last_wait: &mut String,
) -> anyhow::Result<Option<bool>> {
    let Written { at, lease, .. } = written;
    match step {
        Step::Fail { failures, halt } => {
            let mut next = state.clone();
            next.failures.extend(failures);
            next.halted = halt;
            write_state(etcd, &next, at, Some(lease)).await?;
        }
        Step::Wait(why) => {
            if why != *last_wait {
                println!("{}: {why}", state.phase());
                *last_wait = why;
            }
        }
        Step::Open => {
            // One write whatever the wave's size: the state says the wave is open; its
            // admissions follow in transactions of `CHUNK`, each conditional on this state.
            let wave = state.opened + 1;
            let mut next = state.clone();
            next.opened = wave;
            let put = Write::Put { key: state_key(), value: serde_json::to_vec(&next)?, lease: 0 };
            if let Some(revision) = etcd.txn(&written.conds(), &[put]).await? {
                let nodes = &state.waves[state.opened];
                println!(
                    "wave {wave} of {} open at revision {revision}: {}",
                    state.waves.len(),
                    names(nodes)
                );
                *good_since = None;
                admit(etcd, &next, Written { at: revision, ..written }, nodes).await?;
            }
        }
        Step::Done => {
            let mut next = state.clone();
            next.done = true;
            write_state(etcd, &next, at, Some(lease)).await?;
        }
        Step::Halted => {
            println!(
                "rollout {} halted: {}\nno further node takes the candidate. Run `mesh-host fleet rollout abort` to send the nodes that took it back to the declaration in force",
                state.id,
                state.halted.as_deref().unwrap_or_default()
            );
            return Ok(Some(false));
        }
        Step::Finished => {
            let all = state.waves.iter().map(Vec::len).sum::<usize>();
            let failed: Vec<&String> = state.failures.iter().map(|f| &f.node).collect();
            let ran = if failed.is_empty() {
                format!("all {all} node(s) run the candidate")
            } else {
                format!(
                    "{} of {all} node(s) run the candidate, and {} failed, within --max-failures {} ({})",
                    all - failed.len(),
                    failed.len(),
                    state.max_failures,
                    list(&failed)
                )
            };
            println!(
                "rollout {}: every wave passed its gate; {ran}. Run `mesh-host fleet rollout promote` to make it the declaration in force for {} (or `fleet rollout abort` to send them all back)",
                state.id,
                state.scope().describe()
            );
            return Ok(Some(true));
        }
    }
    Ok(None)
}

/// The driver's pause between looks, cut short by Ctrl-C (which leaves the rollout as etcd
/// holds it, for `resume`).
async fn pause() -> anyhow::Result<()> {
    tokio::select! {
        _ = tokio::time::sleep(POLL) => Ok(()),
        _ = tokio::signal::ctrl_c() => refused(
            "interrupted: the rollout stays as etcd holds it; `mesh-host fleet rollout resume` drives it on".into()
        ),
    }
}

/// Writes `next` over the state last written at `at`, and, for the driver, only while its
/// `lease` holds the driver's key; says so when someone else wrote it meanwhile (the next look
/// reads theirs).
async fn write_state(etcd: &Etcd, next: &State, at: i64, lease: Option<i64>) -> anyhow::Result<bool> {
    let put = Write::Put { key: state_key(), value: serde_json::to_vec(next)?, lease: 0 };
    let mut conds = vec![Cond::WrittenAt(state_key(), at)];
    conds.extend(lease.map(|l| Cond::LeaseIs(driver_key(), l)));
    Ok(etcd.txn(&conds, &[put]).await?.is_some())
}

/// A wave's nodes in one line: the first few and how many more (a wave of thousands is not
/// printed whole; `fleet rollout status --json` lists every node).
fn names(nodes: &[String]) -> String {
    list(&nodes.iter().collect::<Vec<_>>())
}

/// Reads the open rollout's state, changes it with `change`, and writes it back in a
/// transaction conditional on it being as read; read again and tried again when someone wrote
/// it meanwhile. `change` refuses with the message to exit 2 with.
async fn change_state(
    etcd: &Etcd,
    change: impl Fn(&mut State) -> Result<(), String>,
) -> anyhow::Result<(State, Snapshot)> {
    // What this command last sent when etcd's answer was lost: found as written, it took.
    let mut sent: Option<(State, crate::system::etcd::Error)> = None;
    for _ in 0..10 {
        let s = snapshot(etcd).await?;
        let Some((mut state, at)) = s.state.clone() else {
            return Err(sent.map_or_else(|| Refused(no_rollout(&s)).into(), |(_, lost)| lost.into()));
        };
        if let Some((mine, _)) = sent.take_if(|(mine, _)| *mine == state) {
            return Ok((mine, s));
        }
        change(&mut state).map_err(Refused)?;
        match write_state(etcd, &state, at, None).await {
            Ok(true) => return Ok((state, s)),
            Ok(false) => {}
            Err(e) => match e.downcast::<crate::system::etcd::Error>() {
                Ok(lost @ crate::system::etcd::Error::Unknown { .. }) => sent = Some((state, lost)),
                Ok(e) => return Err(e.into()),
                Err(e) => return Err(e),
            },
        }
    }
    gave_up(sent.map(|(_, lost)| lost))
}

/// Whether `last` (the closed rollout etcd holds) is rollout `id` closed by this command's
/// lost write: `closed` starts with `how` ("aborted", "promoted").
fn closed_by(last: Option<&State>, id: &str, how: &str) -> bool {
    last.is_some_and(|l| l.id == id && l.closed.as_deref().is_some_and(|c| c.starts_with(how)))
}

/// What `abort` or `promote` says when it finds no rollout open: done, when the rollout it sent
/// a write for (whose answer was lost) is the one closed as `how`; unknown, when another closed
/// it; refused, when it sent nothing.
fn closed_after(
    sent: Option<(String, crate::system::etcd::Error)>,
    s: &Snapshot,
    how: &str,
    then: &str,
) -> anyhow::Result<String> {
    match sent {
        Some((id, _)) if closed_by(s.last.as_ref(), &id, how) => Ok(format!(
            "rollout {id} {how} (etcd's first answer was lost; read back at revision {}): {then}\n",
            s.revision
        )),
        Some((_, lost)) => Err(lost.into()),
        None => refused(no_rollout(s)),
    }
}

/// The end of a command's ten tries: unknown when its last write's answer was lost, else the
/// state kept changing under it.
fn gave_up<T>(lost: Option<crate::system::etcd::Error>) -> anyhow::Result<T> {
    match lost {
        Some(lost) => Err(lost.into()),
        None => anyhow::bail!("the rollout's state kept changing under this command; try again"),
    }
}

/// An etcd error from a write whose answer was lost; any other error passes through.
fn lost(e: &crate::system::etcd::Error) -> bool {
    matches!(e, crate::system::etcd::Error::Unknown { .. })
}

/// `fleet rollout pause`: no further wave opens until `resume`.
pub async fn pause_rollout(etcd: &Etcd) -> anyhow::Result<String> {
    let by = format!("by {} at {}", who(), when(crate::system::unix_secs()));
    let (state, _) = change_state(etcd, |st| {
        if st.paused.is_some() {
            return Err(format!(
                "rollout {} is paused already ({})",
                st.id,
                st.paused.as_deref().unwrap_or_default()
            ));
        }
        st.paused = Some(by.clone());
        Ok(())
    })
    .await?;
    Ok(format!(
        "rollout {} paused at wave {} of {}: no further wave opens; the nodes admitted keep the candidate. `mesh-host fleet rollout resume` goes on\n",
        state.id,
        state.opened,
        state.waves.len()
    ))
}

/// `fleet rollout resume`: ends a pause, and drives the rollout unless a driver already does
/// (a driver killed is replaced this way, once its lease has ended).
pub async fn resume(etcd: &Etcd) -> anyhow::Result<bool> {
    let before = snapshot(etcd).await?;
    if let (Some((st, _)), Some(driver)) = (&before.state, &before.driver) {
        if st.paused.is_none() {
            return refused(format!(
                "rollout {} is not paused and is already driven by {driver}; a second driver is refused. If that driver is gone, its lease ends within {DRIVER_TTL} s: run `mesh-host fleet rollout resume` then",
                st.id
            ));
        }
    }
    let (state, s) = change_state(etcd, |st| {
        if st.halted.is_some() {
            return Err(format!(
                "rollout {} is halted ({}); it cannot go on: `mesh-host fleet rollout abort` sends the nodes that took the candidate back",
                st.id,
                st.halted.as_deref().unwrap_or_default()
            ));
        }
        st.paused = None;
        Ok(())
    })
    .await?;
    if let Some(driver) = &s.driver {
        println!("rollout {}: not paused; its driver, {driver}, carries on", state.id);
        return Ok(true);
    }
    println!("rollout {}: {}; driving it from here", state.id, state.phase());
    drive(etcd).await
}

/// `fleet rollout abort`: every admission withdrawn and the rollout closed, in one
/// transaction: each node that took the candidate reads the declaration in force again, which
/// is the generation it had before (docs/decisions.md, "Rollouts").
pub async fn abort(etcd: &Etcd) -> anyhow::Result<String> {
    // The rollout this command sent an abort for, when etcd's answer was lost.
    let mut sent: Option<(String, crate::system::etcd::Error)> = None;
    for _ in 0..10 {
        let s = snapshot(etcd).await?;
        let Some((mut state, at)) = s.state.clone() else {
            return closed_after(
                sent,
                &s,
                "aborted",
                "the nodes that took the candidate go back to the declaration in force",
            );
        };
        state.closed = Some(format!("aborted by {} at {}", who(), when(crate::system::unix_secs())));
        let writes = [
            Write::DeletePrefix(open_prefix()),
            Write::Put { key: last_key(), value: serde_json::to_vec(&state)?, lease: 0 },
        ];
        let answer = match etcd.txn(&[Cond::WrittenAt(state_key(), at)], &writes).await {
            Err(e) if lost(&e) => {
                sent = Some((state.id.clone(), e));
                continue;
            }
            answer => answer?,
        };
        if let Some(revision) = answer {
            let took: Vec<&String> = s.admitted.keys().collect();
            return Ok(format!(
                "rollout {} aborted at revision {revision}: {} node(s) that took the candidate go back to the declaration in force{}{}\n",
                state.id,
                took.len(),
                if took.is_empty() { "" } else { ": " },
                list(&took)
            ));
        }
    }
    gave_up(sent.map(|(_, lost)| lost))
}

/// `fleet rollout promote`: once every wave passed, the candidate becomes the scope's
/// declaration (its keys exactly the candidate's), and the rollout closes, in one transaction.
pub async fn promote(etcd: &Etcd) -> anyhow::Result<String> {
    let mut sent: Option<(String, crate::system::etcd::Error)> = None;
    for _ in 0..10 {
        let s = snapshot(etcd).await?;
        let Some((mut state, at)) = s.state.clone() else {
            return closed_after(sent, &s, "promoted", "the rollout is closed");
        };
        if !state.done {
            return refused(format!(
                "rollout {} is not through its waves ({}); promote makes the candidate every node's declaration, so it waits for the last gate. `fleet rollout status` shows where it stands; `fleet rollout abort` ends it",
                state.id,
                state.phase()
            ));
        }
        let since = regate(&state, &s.verdicts(&state, crate::system::unix_secs())).map_err(Refused)?;
        state.closed = Some(format!("promoted by {} at {}", who(), when(crate::system::unix_secs())));
        let (writes, kept, removed) = promotion(etcd, &s, &state).await?;
        let conds = [
            Cond::WrittenAt(state_key(), at),
            Cond::UnchangedSince { prefix: state.replaces.clone(), revision: state.base_revision },
        ];
        let answer = match etcd.txn(&conds, &writes).await {
            Err(e) if lost(&e) => {
                sent = Some((state.id.clone(), e));
                continue;
            }
            answer => answer?,
        };
        if let Some(revision) = answer {
            return Ok(format!(
                "rollout {} promoted at revision {revision}: the candidate is the declaration of {} ({kept} key(s), {removed} removed); the rollout is closed{since}\n",
                state.id,
                state.scope().describe(),
            ));
        }
        let again = etcd.range_prefix(&state.replaces, None).await?;
        if again.kvs.iter().any(|kv| kv.mod_revision > state.base_revision) {
            return refused(format!(
                "{} was written in etcd after the rollout started (revision {}), around `fleet put`; promote would write over it, so nothing was written. Abort the rollout and start it again on what is there now",
                state.scope().describe(),
                state.base_revision
            ));
        }
    }
    gave_up(sent.map(|(_, lost)| lost))
}

/// The gate once more, at promote: every wave passed it when the driver marked the rollout done,
/// but a node may have gone back, died or refused since. Refused (with the nodes and why) when a
/// node not counted before is no longer good and the budget cannot take it; otherwise the words
/// promote adds about the failures it takes on (empty when none).
pub fn regate(state: &State, verdicts: &BTreeMap<String, Verdict>) -> Result<String, String> {
    let counted = |node: &String| state.failures.iter().any(|f| &f.node == node);
    let since: Vec<(&String, &str)> = verdicts
        .iter()
        .filter(|(node, _)| !counted(node))
        .filter_map(|(node, v)| match v {
            Verdict::Good => None,
            Verdict::Pending(why) | Verdict::Failed(why) => Some((node, why.as_str())),
        })
        .collect();
    if since.is_empty() {
        return Ok(String::new());
    }
    let spent = state.failures.len() + since.len();
    let named: Vec<String> = since.iter().take(8).map(|(n, why)| format!("{n}: {why}")).collect();
    if spent > state.max_failures {
        return Err(format!(
            "rollout {}: {} node(s) no longer pass the gate since the last wave passed, {spent} failure(s) in all, more than --max-failures {}; nothing was written. {}. `fleet rollout abort` sends the nodes back",
            state.id,
            since.len(),
            state.max_failures,
            named.join("; ")
        ));
    }
    Ok(format!(
        "; within --max-failures {}, {} node(s) that no longer pass the gate: {}",
        state.max_failures,
        since.len(),
        named.join("; ")
    ))
}

/// The writes of a promotion: the candidate's keys under the scope's prefix, the scope's other
/// keys deleted, the rollout closed into `rollout/last`; and how many were kept and removed.
async fn promotion(etcd: &Etcd, s: &Snapshot, state: &State) -> anyhow::Result<(Vec<Write>, usize, usize)> {
    let candidate = etcd.range_prefix(&candidate_prefix(), Some(s.revision)).await?;
    let mut writes = Vec::new();
    let cp = candidate_prefix();
    let mut kept = Vec::new();
    for kv in candidate.kvs {
        let name = kv.key.strip_prefix(&cp).unwrap_or(&kv.key);
        // A signed candidate's own manifest stays behind; the one signed for the scope goes in.
        let name = match name.strip_prefix(super::signed::PROMOTED) {
            Some(promoted) => format!("{}{promoted}", super::signed::META),
            None if name.starts_with(super::signed::META) => continue,
            None => name.to_owned(),
        };
        let key = format!("{}{name}", state.replaces);
        kept.push(key.clone());
        writes.push(Write::Put { key, value: kv.value, lease: 0 });
    }
    let removed: Vec<String> = s.scope_keys.iter().filter(|k| !kept.contains(k)).cloned().collect();
    let counts = (kept.len(), removed.len());
    writes.extend(removed.into_iter().map(Write::Delete));
    writes.push(Write::DeletePrefix(open_prefix()));
    writes.push(Write::Put { key: last_key(), value: serde_json::to_vec(state)?, lease: 0 });
    Ok((writes, counts.0, counts.1))
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
        assert_eq!(s.nodes_of(&Scope::Fleet), ["a", "b", "web-10"]);
        assert_eq!(s.nodes_of(&Scope::Group("web".into())), ["b", "web-10"]);
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
        assert_eq!(limit(&refusal(Refusal::Other(Some(14)))), None);
        assert_eq!(limit(&anyhow::anyhow!("other")), None);
    }
}
