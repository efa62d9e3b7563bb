//! `fleet rollout start` and the driver: its lease (the fence on every write it makes), its
//! loop (its cache brought to etcd's revision, the gate, the step written), and what it prints
//! as it goes.

use std::collections::BTreeMap;
use std::time::Duration;

use super::print::print_plan;
use super::*;
use crate::system::etcd::{Cond, Write};

/// How often the driver looks at the fleet.
const POLL: Duration = Duration::from_millis(500);

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
    /// candidate's prefix (`crate::fleet::signed`).
    pub signed: Option<(u64, crate::fleet::signed::Keys)>,
    /// `--trust-policy`: each node's groups as the policy binds them, for the waves.
    pub bound: Option<crate::fleet::put::Bound>,
}

/// A new rollout's id: `rollout-` and the time it starts.
pub fn new_id(now: u64) -> String {
    format!("rollout-{}", crate::controller::drift::utc(now * 1000))
}

/// `fleet rollout start`: writes the candidate and the plan in one transaction (refused when a
/// rollout is open, or the scope changed since it was read), prints the wave order, and drives
/// it. Returns whether it ended well (every wave passed).
pub async fn start(etcd: &Etcd, start: Start) -> anyhow::Result<bool> {
    let mut s = snapshot(etcd).await?;
    let (waves, gone) = planned(&mut s, &start)?;
    let prefix = start.scope.prefix();
    let now = crate::system::unix_secs();
    let state = State {
        id: start.id.clone(),
        group: if let Scope::Group(g) = &start.scope { Some(g.clone()) } else { None },
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
    let put = |(key, value): (String, &Vec<u8>)| Write::Put { key, value: value.clone(), lease: 0 };
    let cp = candidate_prefix(&start.scope);
    let name = |key: &String| format!("{cp}{}", key.strip_prefix(&prefix).unwrap_or(key));
    writes.extend(start.wanted.iter().map(|(key, bytes)| (name(key), bytes)).map(put));
    writes.extend(start.signed.iter().flat_map(|(_, keys)| keys).map(|(k, v)| (k.clone(), v)).map(put));
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
    if !gone.is_empty() {
        println!(
            "left out, not alive: {} (a node that comes back reads the declaration in force until the promote; `mesh-host fleet forget NODE` removes one gone for good)",
            names(&gone)
        );
    }
    let ended = drive_held(etcd, &mut driver).await;
    driver.release(etcd).await;
    ended
}

/// The waves of `start`, over the scope's live nodes (their groups the trust policy's, when
/// given), and the nodes of the scope left out (not alive); refused while a rollout is open.
fn planned(s: &mut Snapshot, start: &Start) -> anyhow::Result<(Vec<Vec<String>>, Vec<String>)> {
    if let Some((state, _)) = &s.state {
        return refused(format!("nothing was written: {}", open_message(state)));
    }
    if let Some(bound) = &start.bound {
        s.bind_groups(bound);
    }
    let (nodes, gone) = s.nodes_of(&start.scope);
    if let Some(c) = start.canaries.iter().find(|c| gone.contains(c)) {
        return refused(format!(
            "--canary {c}: the node is not alive (no presence key in etcd); a rollout is planned over live nodes only"
        ));
    }
    Ok((plan(&nodes, &start.canaries, &start.sizes).map_err(Refused)?, gone))
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
        let asked = tokio::time::Instant::now();
        let patience = crate::system::lease_patience(self.renewed, Duration::from_secs(DRIVER_TTL as u64));
        match etcd.lease_keepalive(self.lease, patience).await {
            Ok(true) => self.renewed = asked,
            #[cfg(feature = "robust-mutant")] // tests/robust only (`fence`): a lost lease ignored.
            Ok(false) if crate::fleet::mutant("fence") => self.renewed = tokio::time::Instant::now(),
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
    let mut clock = Clock::new();
    let mut said: BTreeMap<String, String> = BTreeMap::new();
    let mut last_wait = String::new();
    if let Some(warning) = crate::fleet::status::uncompacted(etcd).await {
        println!("{warning}");
    }
    // What etcd holds of the nodes and the rollout: listed once, then kept by a watch
    // (`reflector`), brought to etcd's revision before each look.
    let mut cache = super::reflector::Reflector::new();
    loop {
        match driver.keep(etcd).await {
            Err(e) if e.downcast_ref::<crate::system::etcd::Error>().is_some() => {
                println!("etcd: {e}; trying again");
                pause().await?;
                continue;
            }
            kept => kept?,
        }
        let s = match cache.fresh(etcd).await {
            Ok(s) => s,
            Err(e) => {
                println!("cannot read etcd: {e}; trying again");
                pause().await?;
                continue;
            }
        };
        let Some((state, at)) = s.state.clone() else {
            println!("{}: nothing left to drive", no_rollout(s));
            return Ok(false);
        };
        // Two clocks, never compared: the wall clock for what is recorded (an admission's `at`, a
        // failure's), this driver's monotonic one for what is judged (deadlines, the soak).
        let (now, wall) = (clock.now(), crate::system::unix_secs());
        let missing = unadmitted(&state, &s.admitted);
        if !missing.is_empty() {
            // A wave opened whose admissions are not all written (a driver stopped between its
            // transactions, or this one a poll ago): finished before anything is judged.
            match admit(etcd, &state, Written { at, lease: driver.lease, now: wall }, &missing).await {
                Err(e) if limit(&e).is_none() && e.downcast_ref::<crate::system::etcd::Error>().is_some() => {
                    println!("etcd: {e}; trying again");
                }
                done => done?,
            }
            pause().await?;
            continue;
        }
        let verdicts = s.verdicts_by(&state, |node, _, revision| clock.since(node, revision), now);
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
        let step = stamped(decide(&state, &verdicts, good_since, now), wall);
        let written = Written { at, lease: driver.lease, now: wall };
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

/// The driver's clock for what it judges: seconds since it started, monotonic, so a step of the
/// wall clock (NTP, a suspended laptop, a driver replaced on a machine whose clock is off)
/// neither opens a wave early nor ends a deadline. A node's deadline is counted from when this
/// driver first saw its admission, never from the admission's `at` (another driver's wall clock,
/// maybe): a driver started again gives the nodes of the open waves their whole deadline again,
/// as it soaks them again, the cautious way (docs/decisions.md, "Rollouts"). No node's clock is
/// read at all: what a node did after its admission is told by etcd's revisions.
struct Clock {
    start: tokio::time::Instant,
    /// Each admission (node, the revision it was written at) and when this driver first saw it.
    seen: BTreeMap<(String, i64), u64>,
}

impl Clock {
    fn new() -> Clock {
        Clock { start: tokio::time::Instant::now(), seen: BTreeMap::new() }
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_secs()
    }

    /// When this driver first saw `node`'s admission written at `revision`: now, the first time.
    fn since(&mut self, node: &str, revision: i64) -> u64 {
        let now = self.now();
        *self.seen.entry((node.to_owned(), revision)).or_insert(now)
    }
}

/// `step`, its failures stamped with the wall clock (`decide` sees only the driver's own).
fn stamped(step: Step, wall: u64) -> Step {
    match step {
        Step::Fail { mut failures, halt } => {
            failures.iter_mut().for_each(|f| f.at = wall);
            Step::Fail { failures, halt }
        }
        other => other,
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
        #[cfg(feature = "robust-mutant")] // tests/robust only (`fence`): the writes not fenced.
        if crate::fleet::mutant("fence") {
            return [Cond::WrittenAt(state_key(), self.at), Cond::WrittenAt(state_key(), self.at)];
        }
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

/// The driver's pause between looks (spread a little, as every wait to try again), cut short
/// by Ctrl-C (which leaves the rollout as etcd holds it, for `resume`).
async fn pause() -> anyhow::Result<()> {
    tokio::select! {
        _ = tokio::time::sleep(crate::system::jittered(POLL)) => Ok(()),
        _ = tokio::signal::ctrl_c() => refused(
            "interrupted: the rollout stays as etcd holds it; `mesh-host fleet rollout resume` drives it on".into()
        ),
    }
}

/// Writes `next` over the state last written at `at`, and, for the driver, only while its
/// `lease` holds the driver's key; says so when someone else wrote it meanwhile (the next look
/// reads theirs).
pub(super) async fn write_state(
    etcd: &Etcd,
    next: &State,
    at: i64,
    lease: Option<i64>,
) -> anyhow::Result<bool> {
    let put = Write::Put { key: state_key(), value: serde_json::to_vec(next)?, lease: 0 };
    let mut conds = vec![Cond::WrittenAt(state_key(), at)];
    conds.extend(lease.map(|l| Cond::LeaseIs(driver_key(), l)));
    #[cfg(feature = "robust-mutant")] // tests/robust only (`fence`): the writes not fenced.
    conds.retain(|c| !(crate::fleet::mutant("fence") && matches!(c, Cond::LeaseIs(..))));
    Ok(etcd.txn(&conds, &[put]).await?.is_some())
}

/// A wave's nodes in one line: the first few and how many more (a wave of thousands is not
/// printed whole; `fleet rollout status --json` lists every node).
fn names(nodes: &[String]) -> String {
    list(&nodes.iter().collect::<Vec<_>>())
}
