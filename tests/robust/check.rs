//! The offline checker: replays the recorder into etcd's keys at every revision, derives with
//! `model` what each node should run and what the gate allowed, and checks the history against
//! the invariants of issue 42 (fleet review, section 4.4). Each violation names the invariant,
//! the node, the revision and the harness time.
//!
//! Checked: I1 (admission safety), I2 (the gate), I3 (no wave over an unconfirmed node), I4
//! (abort), I6 (no acknowledged write lost, nothing written by a refusal), I7 (one effective
//! driver: every wave a driver says it opened, it opened holding the driver's key), I11
//! (convergence after the heal), I8 (a status never ahead of the node's files), I9 (a node's
//! cache is etcd at its revision), I10 (no flapping), I5 (after promote, every node on the
//! candidate or visibly held).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::rc::Rc;

use serde_json::Value;

use crate::history::{ClaimKind, Edge, Entry, KvOp, Phase};
use crate::model::{self, Kv};

/// How long after an abort (and after the last fault near it) a node may still run the
/// candidate: it reads the deletion by its watch, then applies.
pub const GRACE_MS: u64 = 20_000;
/// How late the recorder may see a write a node already applied (its member paused, say).
pub const LAG_MS: u64 = 10_000;
/// How late the sampler may see a file the agent wrote (its period is 75 ms; the margin is the
/// machine's load).
pub const SAMPLE_MS: u64 = 1_000;

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub node: Option<String>,
    pub revision: Option<i64>,
    pub t: u64,
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.invariant)?;
        if let Some(n) = &self.node {
            write!(f, " node {n}")?;
        }
        if let Some(r) = self.revision {
            write!(f, " revision {r}")?;
        }
        write!(f, " at {}.{:03} s: {}", self.t / 1000, self.t % 1000, self.what)
    }
}

/// What the replay derives, for the checks that come after it.
#[derive(Default)]
struct Replay {
    /// Per node: each change of what it should run, (revision, recorder time, digest).
    expected: BTreeMap<String, Vec<(i64, u64, String)>>,
    /// Each abort: rollout, revision, time, and the candidate's digest per node admitted.
    aborts: Vec<(String, i64, u64, BTreeMap<String, String>)>,
    /// etcd's keys at the last revision.
    last: Kv,
    last_revision: i64,
    /// Every put: (revision, key, value).
    puts: Vec<(i64, String, Rc<str>)>,
    /// The driver's key at each revision it changed at: who held it (`None`: no one).
    drivers: Vec<(i64, Option<Rc<str>>)>,
}

/// One key event of a revision: put or delete, the key, the value put.
type Event<'a> = (KvOp, &'a str, Option<&'a str>);

/// The gate as it stands since the last state write.
struct Gate {
    id: String,
    opened: u64,
    required: Vec<String>,
    passed: bool,
    why: Option<(String, String)>,
}

/// Checks a whole history.
pub fn check(entries: &[Entry]) -> Vec<Violation> {
    let nodes = nodes_of(entries);
    let mut out = Vec::new();
    let reverts = reverts(entries);
    let replay = replay(entries, &nodes, &reverts, &mut out);
    samples_explained(entries, &replay, &mut out);
    aborts_undone(entries, &replay, &mut out);
    writes_kept(entries, &replay, &mut out);
    one_driver(entries, &replay, &mut out);
    converged(entries, &nodes, &replay, &mut out);
    status_behind_files(entries, &replay, &mut out);
    no_flapping(entries, &mut out);
    cache_as_etcd(entries, &mut out);
    promotes_land(entries, &replay, &mut out);
    out.sort_by_key(|v| v.t);
    out
}

fn nodes_of(entries: &[Entry]) -> BTreeSet<String> {
    entries
        .iter()
        .filter_map(|e| match e {
            Entry::Sample { node, .. } | Entry::Claim { node, .. } => Some(node.clone()),
            _ => None,
        })
        .collect()
}

/// Per node, the revisions of the generations it went back from by itself (its claims).
fn reverts(entries: &[Entry]) -> BTreeMap<String, Vec<(i64, u64)>> {
    let mut out: BTreeMap<String, Vec<(i64, u64)>> = BTreeMap::new();
    for e in entries {
        if let Entry::Claim { t, node, what: ClaimKind::Reverted, revision: Some(r), .. } = e {
            out.entry(node.clone()).or_default().push((*r, *t));
        }
    }
    out
}

/// The recorder's events grouped by revision, in revision order (a restarted recorder's
/// repeats dropped).
fn revisions(entries: &[Entry]) -> Vec<(i64, u64, Vec<Event<'_>>)> {
    let mut by: BTreeMap<i64, (u64, Vec<Event<'_>>)> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for e in entries {
        if let Entry::Etcd { t, rev, op, key, value } = e {
            if !seen.insert((*rev, key.as_str())) {
                continue;
            }
            let slot = by.entry(*rev).or_insert((*t, Vec::new()));
            slot.1.push((*op, key.as_str(), value.as_deref()));
        }
    }
    by.into_iter().map(|(r, (t, evs))| (r, t, evs)).collect()
}

fn replay(
    entries: &[Entry],
    nodes: &BTreeSet<String>,
    reverts: &BTreeMap<String, Vec<(i64, u64)>>,
    out: &mut Vec<Violation>,
) -> Replay {
    let mut r = Replay::default();
    let mut kv = Kv::new();
    let mut gate: Option<Gate> = None;
    for (rev, t, events) in revisions(entries) {
        let closing = events.iter().any(|(op, k, _)| *op == KvOp::Del && *k == model::STATE);
        let before: BTreeMap<String, String> = if closing {
            let admitted = nodes.iter().filter(|n| kv.contains_key(&model::admission_key(n)));
            admitted.filter_map(|n| model::expected_digest(&kv, n).map(|d| (n.clone(), d))).collect()
        } else {
            BTreeMap::new()
        };
        for (op, key, value) in &events {
            match (op, value) {
                (KvOp::Put, Some(v)) => {
                    let v: Rc<str> = Rc::from(*v);
                    r.puts.push((rev, key.to_string(), v.clone()));
                    kv.insert(key.to_string(), (v, rev));
                }
                _ => {
                    kv.remove(*key);
                }
            }
            if *key == model::DRIVER {
                r.drivers.push((rev, kv.get(model::DRIVER).map(|(v, _)| v.clone())));
            }
        }
        if closing
            && model::json(&kv, model::LAST)["closed"].as_str().is_some_and(|c| c.starts_with("aborted"))
        {
            let id = model::json(&kv, model::LAST)["id"].as_str().unwrap_or_default().to_owned();
            r.aborts.push((id, rev, t, before));
        }
        admissions_in_open_waves(&kv, rev, t, &events, out);
        gate_step(&kv, rev, t, &events, &mut gate, reverts, out);
        for n in nodes {
            if let Some(d) = model::expected_digest(&kv, n) {
                let list = r.expected.entry(n.clone()).or_default();
                if list.last().map(|(_, _, last)| last) != Some(&d) {
                    list.push((rev, t, d));
                }
            }
        }
        r.last_revision = rev;
    }
    r.last = kv;
    r
}

/// I1, its etcd half: an admission is written only for a node of a wave the state has open.
fn admissions_in_open_waves(kv: &Kv, rev: i64, t: u64, events: &[Event<'_>], out: &mut Vec<Violation>) {
    let state = model::json(kv, model::STATE);
    for (op, key, value) in events {
        let Some(node) =
            key.strip_prefix("/mesh-host/rollout/open/node/").and_then(|k| k.strip_suffix("/admitted"))
        else {
            continue;
        };
        if *op != KvOp::Put {
            continue;
        }
        let a: Value = value.and_then(|v| serde_json::from_str(v).ok()).unwrap_or(Value::Null);
        if state["id"] != a["rollout"] || !model::in_open_wave(&state, node) {
            out.push(Violation {
                invariant: "I1",
                node: Some(node.to_owned()),
                revision: Some(rev),
                t,
                what: format!(
                    "admitted to {} while the state ({}) has no wave open that holds it",
                    a["rollout"], state["id"]
                ),
            });
        }
    }
}

/// I2 and I3: at each state write, the gate as it stands from then; at each Open (or Done),
/// whether the gate held at some revision since the state write before it (the driver read a
/// snapshot at one of those), and whether a node it held had a generation since its admission
/// that it later went back from (so it was never confirmed).
fn gate_step(
    kv: &Kv,
    rev: i64,
    t: u64,
    events: &[Event<'_>],
    gate: &mut Option<Gate>,
    reverts: &BTreeMap<String, Vec<(i64, u64)>>,
    out: &mut Vec<Violation>,
) {
    if events.iter().any(|(_, k, _)| *k == model::STATE) {
        let state = model::json(kv, model::STATE);
        let opened = state["opened"].as_u64().unwrap_or(0);
        let done = state["done"] == true;
        if let Some(g) = gate.as_ref().filter(|g| state["id"] == g.id.as_str() && g.opened > 0) {
            if opened > g.opened || (done && g.opened == opened) {
                opened_over(g, kv, rev, t, done && opened == g.opened, reverts, out);
            }
        }
        *gate = state["id"].as_str().map(|id| Gate {
            id: id.to_owned(),
            opened: if done { u64::MAX } else { opened },
            required: model::required(&state),
            passed: false,
            why: None,
        });
    }
    let Some(g) = gate.as_mut().filter(|g| g.opened > 0 && g.opened != u64::MAX && !g.passed) else {
        return;
    };
    let mut why = None;
    for n in &g.required {
        let admission = model::json(kv, &model::admission_key(n));
        let admitted = kv
            .get(&model::admission_key(n))
            .map(|(_, r)| *r)
            .filter(|_| admission["rollout"] == g.id.as_str());
        let verdict = match admitted {
            None => Err("not admitted yet".to_owned()),
            Some(a) => model::good(kv, n, a),
        };
        if let Err(w) = verdict {
            why = Some((n.clone(), w));
            break;
        }
    }
    match why {
        None => g.passed = true,
        Some(w) => g.why = Some(w),
    }
}

fn opened_over(
    g: &Gate,
    kv: &Kv,
    rev: i64,
    t: u64,
    done: bool,
    reverts: &BTreeMap<String, Vec<(i64, u64)>>,
    out: &mut Vec<Violation>,
) {
    let what = if done { "marked done".to_owned() } else { format!("opened wave {}", g.opened + 1) };
    if !g.passed {
        let (node, why) = g.why.clone().unwrap_or_default();
        out.push(Violation {
            invariant: "I2",
            node: Some(node),
            revision: Some(rev),
            t,
            what: format!(
                "rollout {} {what} though at no revision since its state was last written did every node of the open waves pass the gate: {why}",
                g.id
            ),
        });
    }
    for n in &g.required {
        let Some((_, admitted)) = kv.get(&model::admission_key(n)) else { continue };
        for (r, _) in reverts.get(n).into_iter().flatten().filter(|(r, _)| r >= admitted && *r < rev) {
            out.push(Violation {
                invariant: "I3",
                node: Some(n.clone()),
                revision: Some(rev),
                t,
                what: format!(
                    "rollout {} {what} over a node that went back by itself from the generation it read at revision {r} (admitted at {admitted}): never confirmed, yet not counted as failed",
                    g.id
                ),
            });
        }
    }
}

/// The node's samples as intervals: (from, until, digest); the last until the history's end.
fn intervals(entries: &[Entry]) -> BTreeMap<String, Vec<(u64, u64, String)>> {
    let end = entries.iter().map(Entry::t).max().unwrap_or(0);
    let mut out: BTreeMap<String, Vec<(u64, u64, String)>> = BTreeMap::new();
    for e in entries {
        if let Entry::Sample { t, node, digest, .. } = e {
            let list = out.entry(node.clone()).or_default();
            if let Some(last) = list.last_mut() {
                last.1 = *t;
            }
            list.push((*t, end, digest.clone()));
        }
    }
    out
}

/// The faults as intervals (one not ended lasts to the history's end).
fn faults(entries: &[Entry]) -> Vec<(u64, u64)> {
    let end = entries.iter().map(Entry::t).max().unwrap_or(0);
    let mut open: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut out = Vec::new();
    for e in entries {
        if let Entry::Nemesis { t, phase, fault } = e {
            match phase {
                Edge::Start => open.entry(fault).or_default().push(*t),
                Edge::Stop => {
                    if let Some(s) = open.get_mut(fault.as_str()).and_then(Vec::pop) {
                        out.push((s, *t));
                    }
                }
                Edge::Note => {}
            }
        }
    }
    out.extend(open.values().flatten().map(|s| (*s, end)));
    out
}

/// No fault was on in the `GRACE_MS` up to `t`.
fn healthy(faults: &[(u64, u64)], t: u64) -> bool {
    faults.iter().all(|(s, e)| *s > t || e + GRACE_MS <= t)
}

/// I1, the node's half: everything a node was seen running is what its declaration was at some
/// revision the recorder saw (within `LAG_MS`): never a candidate it was not admitted to.
fn samples_explained(entries: &[Entry], replay: &Replay, out: &mut Vec<Violation>) {
    let mut said = BTreeSet::new();
    for e in entries {
        let Entry::Sample { t, node, digest, content } = e else { continue };
        if digest == "absent" || said.contains(node) {
            continue;
        }
        let list = replay.expected.get(node).map(Vec::as_slice).unwrap_or_default();
        if list.iter().any(|(_, tr, d)| d == digest && *tr <= t + LAG_MS) {
            continue;
        }
        let written = replay.puts.iter().find(|(_, _, v)| {
            model::managed_content(v)
                .ok()
                .flatten()
                .is_some_and(|c| crate::history::digest(Some(&c)) == *digest)
        });
        said.insert(node.clone());
        out.push(Violation {
            invariant: "I1",
            node: Some(node.clone()),
            revision: written.map(|(r, _, _)| *r),
            t: *t,
            what: format!(
                "runs {content:?}, which its declaration never was by then (written to etcd under {}), so it took what it was not admitted to",
                written.map_or("no key".to_owned(), |(_, k, _)| k.clone())
            ),
        });
    }
}

/// I4: after an abort, every node admitted leaves the candidate within `GRACE_MS` once no
/// fault is on, and does not take it again.
fn aborts_undone(entries: &[Entry], replay: &Replay, out: &mut Vec<Violation>) {
    let (samples, faults) = (intervals(entries), faults(entries));
    for (id, rev, ta, candidate) in &replay.aborts {
        for (node, c) in candidate {
            let runs = samples.get(node).into_iter().flatten().filter(|(_, _, d)| d == c);
            let stuck = runs.into_iter().find_map(|(from, until, _)| {
                let low = (*from).max(ta + GRACE_MS);
                let mut times = vec![low];
                times.extend(faults.iter().map(|(_, e)| e + GRACE_MS).filter(|t| *t > low));
                times.into_iter().filter(|t| t < until).find(|t| healthy(&faults, *t))
            });
            if let Some(t) = stuck {
                out.push(Violation {
                    invariant: "I4",
                    node: Some(node.clone()),
                    revision: Some(*rev),
                    t,
                    what: format!(
                        "still runs the candidate of {id}, aborted at revision {rev} ({} s before), with no fault in the {} s before",
                        (t - ta) / 1000,
                        GRACE_MS / 1000
                    ),
                });
            }
        }
    }
}

/// The markers a value carries: the harness's tokens (`<tok-N>`) and the rollout's authors
/// (`(pid N)`).
fn markers(value: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for (open, close) in [("<tok-", '>'), ("(pid ", ')')] {
        let mut rest = value;
        while let Some(i) = rest.find(open) {
            let Some(j) = rest[i..].find(close) else { break };
            out.push(&rest[i..=i + j]);
            rest = &rest[i + j + 1..];
        }
    }
    out
}

/// I6: every operation acknowledged is in etcd's history; every refusal ("nothing was
/// written") wrote nothing; an unknown outcome may be either.
fn writes_kept(entries: &[Entry], replay: &Replay, out: &mut Vec<Violation>) {
    let mut index: BTreeMap<&str, Vec<(i64, &str, &str)>> = BTreeMap::new();
    for (rev, key, value) in &replay.puts {
        for m in markers(value) {
            index.entry(m).or_default().push((*rev, key.as_str(), &**value));
        }
    }
    let mut invoked: BTreeMap<u64, (&Option<String>, &Option<u32>)> = BTreeMap::new();
    for e in entries {
        let Entry::Op { t, id, phase, op, token, pid, out: said, .. } = e else { continue };
        if *phase == Phase::Invoke {
            invoked.insert(*id, (token, pid));
            continue;
        }
        let (token, pid) = invoked.get(id).copied().unwrap_or((token, pid));
        let pid = pid.map(|p| format!("(pid {p})"));
        let with = |m: &Option<String>| m.as_deref().and_then(|m| index.get(m)).cloned().unwrap_or_default();
        let (by_token, by_pid) = (with(token), with(&pid));
        let at =
            said.split("at revision ").nth(1).and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next());
        let at: Option<i64> = at.and_then(|r| r.parse().ok());
        let lost = match (op.as_str(), phase) {
            ("put", Phase::Ok) => {
                !by_token.iter().any(|(r, k, _)| k.starts_with(model::FLEET) && at.is_none_or(|a| a == *r))
            }
            ("start", Phase::Ok) => {
                !by_pid.iter().any(|(_, k, _)| *k == model::STATE)
                    || !by_token.iter().any(|(_, k, _)| k.starts_with(model::CANDIDATE))
            }
            ("abort", Phase::Ok) => {
                !by_pid.iter().any(|(_, k, v)| *k == model::LAST && v.contains("\"aborted by"))
            }
            ("promote", Phase::Ok) => !by_pid.iter().any(|(r, k, v)| {
                *k == model::LAST
                    && v.contains("\"promoted by")
                    && replay.puts.iter().any(|(pr, pk, _)| pr == r && pk.starts_with(model::FLEET))
            }),
            ("pause", Phase::Ok) => !by_pid.iter().any(|(_, k, _)| *k == model::STATE),
            (_, Phase::Fail) => {
                if let Some((r, k, _)) = by_token.first().or(by_pid.first()) {
                    out.push(Violation {
                        invariant: "I6",
                        node: None,
                        revision: Some(*r),
                        t: *t,
                        what: format!("{op} #{id} was refused (\"nothing was written\"), yet wrote {k}"),
                    });
                }
                false
            }
            _ => false,
        };
        if lost {
            out.push(Violation {
                invariant: "I6",
                node: None,
                revision: at,
                t: *t,
                what: format!(
                    "{op} #{id} was acknowledged, but what it says it wrote is not in etcd's history: {}",
                    said.lines().next().unwrap_or_default()
                ),
            });
        }
    }
}

/// I7: one effective driver. Every wave a driver (`start`, `resume`) says it opened ("wave K of
/// M open at revision R"), it opened while the driver's key named it (`(pid N)`) at R: a
/// driver paused past its lease, whose key another driver took, opens nothing.
fn one_driver(entries: &[Entry], replay: &Replay, out: &mut Vec<Violation>) {
    let mut pids: BTreeMap<u64, u32> = BTreeMap::new();
    for e in entries {
        let Entry::Op { t, id, phase, op, pid, out: said, .. } = e else { continue };
        if *phase == Phase::Invoke {
            pids.extend(pid.map(|p| (*id, p)));
            continue;
        }
        let Some(pid) = pids.get(id).filter(|_| op == "start" || op == "resume") else { continue };
        let me = format!("(pid {pid})");
        for line in said.lines().filter(|l| l.starts_with("wave ") && l.contains(" open at revision ")) {
            let Some(r) = line.split(" open at revision ").nth(1).and_then(|r| r.split(':').next()) else {
                continue;
            };
            let Ok(r) = r.trim().parse::<i64>() else { continue };
            let holder =
                replay.drivers.iter().take_while(|(at, _)| *at <= r).last().and_then(|(_, h)| h.clone());
            if holder.as_deref().is_some_and(|h| h.contains(&me)) {
                continue;
            }
            out.push(Violation {
                invariant: "I7",
                node: None,
                revision: Some(r),
                t: *t,
                what: format!(
                    "{op} #{id} {me} says \"{line}\", but at revision {r} the driver's key was {}: two drivers acted",
                    holder.map_or("held by no one".to_owned(), |h| format!("held by {h:?}"))
                ),
            });
        }
    }
}

/// I11: once every fault is healed and the quiet period is over (the history's end), every node
/// runs what its declaration at the last revision says, or a hold it reports stands.
fn converged(entries: &[Entry], nodes: &BTreeSet<String>, replay: &Replay, out: &mut Vec<Violation>) {
    let end = entries.iter().map(Entry::t).max().unwrap_or(0);
    let samples = intervals(entries);
    for n in nodes {
        let Ok(wanted) = model::composed(&replay.last, n) else { continue };
        let runs = samples.get(n).and_then(|l| l.last()).map_or("absent", |(_, _, d)| d.as_str());
        if crate::history::digest(wanted.as_deref()) == runs {
            continue;
        }
        if !model::json(&replay.last, &model::status_key(n))["hold"].is_null() {
            continue;
        }
        let content = entries.iter().rev().find_map(|e| match e {
            Entry::Sample { node, content, .. } if node == n => Some(content.clone()),
            _ => None,
        });
        out.push(Violation {
            invariant: "I11",
            node: Some(n.clone()),
            revision: Some(replay.last_revision),
            t: end,
            what: format!(
                "runs {:?} at the end, though its declaration at the last revision says {wanted:?} and no hold stands",
                content.unwrap_or_default()
            ),
        });
    }
}

/// I8: a status never runs ahead of the node's files. A status that says the node converged on
/// the declaration read at revision R (no hold, not gone back, nothing refused) is written when
/// the node's file holds what the model says the node runs at R: the sampler saw that content
/// begin at most `SAMPLE_MS` after the status was recorded, and not end more than `LAG_MS`
/// before (the recorder's own lag). Statuses from before the sampler's first look at the node
/// are not checked.
fn status_behind_files(entries: &[Entry], replay: &Replay, out: &mut Vec<Violation>) {
    let samples = intervals(entries);
    let mut seen = BTreeSet::new();
    for e in entries {
        let Entry::Etcd { t, rev, op: KvOp::Put, key, value: Some(value) } = e else { continue };
        let Some(node) = key.strip_prefix("/mesh-host/node/").and_then(|k| k.strip_suffix("/status")) else {
            continue;
        };
        if !seen.insert(*rev) {
            continue;
        }
        let status: Value = serde_json::from_str(value).unwrap_or_default();
        let settled = ["hold", "reverted", "refused"].iter().all(|f| status[f].is_null());
        let (Some(at), true, true) = (status["revision"].as_i64(), status["converged"] == true, settled)
        else {
            continue;
        };
        let list = replay.expected.get(node).map(Vec::as_slice).unwrap_or_default();
        let Some((_, _, want)) = list.iter().rev().find(|(r, _, _)| *r <= at) else { continue };
        let ran = samples.get(node).map(Vec::as_slice).unwrap_or_default();
        // Before the sampler's first look at the node (it starts once every agent is up),
        // nothing is known of its file.
        if ran.first().is_none_or(|(start, _, _)| start > t) {
            continue;
        }
        let last = ran.iter().rev().find(|(start, _, d)| d == want && *start <= t + SAMPLE_MS);
        if last.is_some_and(|(_, end, _)| end + LAG_MS >= *t) {
            continue;
        }
        out.push(Violation {
            invariant: "I8",
            node: Some(node.to_owned()),
            revision: Some(*rev),
            t: *t,
            what: format!(
                "its status says it converged on the declaration of revision {at}, but its file did not hold that content ({want}) then: {}",
                last.map_or("not yet".to_owned(), |(_, end, _)| format!("it had left it at {}.{:03} s", end / 1000, end % 1000))
            ),
        });
    }
}

/// I10: no node flaps more than in and back per change. A node whose file goes A, B, A, B
/// (four samples in a row) took B a second time with nothing in etcd to explain it: no write
/// to what it reads (the fleet's declarations, its own, the candidate's, its admission)
/// after it first took B, up to `LAG_MS` after it took B again.
fn no_flapping(entries: &[Entry], out: &mut Vec<Violation>) {
    let mut runs: BTreeMap<&str, Vec<(u64, &str)>> = BTreeMap::new();
    for e in entries {
        if let Entry::Sample { t, node, digest, .. } = e {
            let list = runs.entry(node).or_default();
            if list.last().is_none_or(|(_, d)| d != digest) {
                list.push((*t, digest));
            }
        }
    }
    for (node, list) in runs {
        let reads = [model::FLEET.to_owned(), model::own_prefix(node), model::CANDIDATE.to_owned()];
        let admission = model::admission_key(node);
        let read_by = |key: &str| key == admission || reads.iter().any(|p| key.starts_with(p.as_str()));
        for w in list.windows(4) {
            let [(_, a), (t_in, b), (_, a2), (t_again, b2)] = w else { continue };
            if a != a2 || b != b2 {
                continue;
            }
            let explained = entries.iter().any(|e| {
                matches!(e, Entry::Etcd { t, key, .. } if t > t_in && *t <= t_again + LAG_MS && read_by(key))
            });
            if !explained {
                out.push(Violation {
                    invariant: "I10",
                    node: Some(node.to_owned()),
                    revision: None,
                    t: *t_again,
                    what: format!(
                        "its file went {a}, {b}, back to {a} and to {b} again ({}.{:03} s to {}.{:03} s) with no write to what it reads in between",
                        t_in / 1000, t_in % 1000, t_again / 1000, t_again % 1000
                    ),
                });
            }
        }
    }
}

/// A node's cache as the sampler read it: revision, time, node, keys and values.
type Cached<'a> = (i64, u64, &'a str, &'a [(String, String)]);

/// I9: a node's cache of its declaration is what etcd held at the revision its manifest names:
/// the same keys (those it reads at that revision: the fleet's, or the candidate's while its
/// admission replaces them, and its own) with the same bytes.
fn cache_as_etcd(entries: &[Entry], out: &mut Vec<Violation>) {
    let mut cached: Vec<Cached<'_>> = entries
        .iter()
        .filter_map(|e| match e {
            Entry::Cache { t, node, revision, kvs } => Some((*revision, *t, node.as_str(), kvs.as_slice())),
            _ => None,
        })
        .collect();
    cached.sort_by_key(|c| c.0);
    let mut kv = Kv::new();
    let mut events = revisions(entries).into_iter().peekable();
    for (at, t, node, kvs) in cached {
        while let Some((_, _, evs)) = events.next_if(|(r, _, _)| *r <= at) {
            for (op, key, value) in evs {
                match (op, value) {
                    (KvOp::Put, Some(v)) => kv.insert(key.to_owned(), (Rc::from(v), 0)),
                    _ => kv.remove(key),
                };
            }
        }
        let replaces = model::json(&kv, &model::admission_key(node))["replaces"].as_str().map(str::to_owned);
        let reads: Vec<String> = [model::FLEET.to_owned(), model::own_prefix(node)]
            .into_iter()
            .map(|p| if replaces.as_deref() == Some(p.as_str()) { model::CANDIDATE.to_owned() } else { p })
            .collect();
        let mut want: Vec<(&str, &str)> = kv
            .iter()
            .filter(|(k, _)| reads.iter().any(|p| k.starts_with(p.as_str())))
            .map(|(k, (v, _))| (k.as_str(), &**v))
            .collect();
        let mut got: Vec<(&str, &str)> = kvs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        want.sort();
        got.sort();
        if want != got {
            let keys = |l: &[(&str, &str)]| l.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ");
            out.push(Violation {
                invariant: "I9",
                node: Some(node.to_owned()),
                revision: Some(at),
                t,
                what: format!(
                    "its cache says revision {at} and holds [{}], but etcd held [{}] for it then{}",
                    keys(&got),
                    keys(&want),
                    if keys(&got) == keys(&want) { " (the same keys, other values)" } else { "" }
                ),
            });
        }
    }
}

/// I5: after a promote, every node runs the promoted declaration (the candidate's, as it stood
/// before the promote; not what etcd's keys compose to after it, which a promote that lost the
/// candidate would leave self-consistent), or its status says it is held (a rollback's hold, or gone back by itself), once `GRACE_MS` have passed with no fault:
/// unless what it should run changed again before then.
fn promotes_land(entries: &[Entry], replay: &Replay, out: &mut Vec<Violation>) {
    let (samples, faults) = (intervals(entries), faults(entries));
    let end = entries.iter().map(Entry::t).max().unwrap_or(0);
    let promotes = replay.puts.iter().filter(|(_, k, v)| k == model::LAST && v.contains("\"promoted by"));
    for (rev, _, _) in promotes {
        let Some(tp) = entries.iter().find_map(|e| match e {
            Entry::Etcd { t, rev: r, key, .. } if r == rev && key == model::LAST => Some(*t),
            _ => None,
        }) else {
            continue;
        };
        let low = tp + GRACE_MS;
        let mut times = vec![low];
        times.extend(faults.iter().map(|(_, e)| e + GRACE_MS).filter(|t| *t > low));
        let Some(at) = times.into_iter().filter(|t| *t <= end).find(|t| healthy(&faults, *t)) else {
            continue;
        };
        // What was promoted: the candidate's file as it stood before the promote.
        let candidate = replay.puts.iter().rev().find(|(r, k, _)| r < rev && k.starts_with(model::CANDIDATE));
        let Some(Ok(Some(content))) = candidate.map(|(_, _, v)| model::managed_content(v)) else { continue };
        let want = &crate::history::digest(Some(&content));
        for (node, list) in &replay.expected {
            if list.iter().any(|(r, t, _)| r > rev && *t <= at) {
                continue;
            }
            let ran =
                samples.get(node).into_iter().flatten().find(|(from, until, _)| *from <= at && at < *until);
            if ran.is_none_or(|(_, _, d)| d == want) {
                continue;
            }
            let status = entries.iter().rev().find_map(|e| match e {
                Entry::Etcd { t, key, value: Some(v), .. } if *t <= at && *key == model::status_key(node) => {
                    Some(v)
                }
                _ => None,
            });
            let status: Value = status.and_then(|v| serde_json::from_str(v).ok()).unwrap_or_default();
            if !status["hold"].is_null() || !status["reverted"].is_null() {
                continue;
            }
            out.push(Violation {
                invariant: "I5",
                node: Some(node.clone()),
                revision: Some(*rev),
                t: at,
                what: format!(
                    "promoted at revision {rev} ({} s before, no fault in the {} s before), yet it runs neither the promoted declaration ({want}) nor says it is held",
                    (at - tp) / 1000,
                    GRACE_MS / 1000
                ),
            });
        }
    }
}
