//! The schedules: the seeded one (an operator's workload beside a nemesis), and the directed
//! one the mutants are caught with.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::check::Violation;
use crate::history::{Edge, Entry, Phase};
use crate::net::Slow;
use crate::run::{fault, up, Plan, Rng, Up};
use crate::system::{self, signal, wait_for};

/// The operator: every 1-4 s an operation, chosen by what etcd holds (a rollout open or not).
fn workload(up: &Up, rng: &mut Rng, until: Instant) {
    let n = up.fleet.lock().unwrap().agents.len() as u64;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(rng.range(1_000, 4_000)));
        let out = system::etcdctl(&up.ops.endpoints, &["get", "--print-value-only", crate::model::STATE]);
        let open = out.status.success() && !out.stdout.is_empty();
        let driving = !up.ops.drivers.lock().unwrap().is_empty();
        let roll = rng.range(0, 99);
        match (open, roll) {
            (false, 0..=44) => up.ops.put(),
            (false, 45..=89) if !driving => start(up, rng, n),
            // Two operators starting a rollout at once: one driver at most may win.
            (false, _) if !driving => race(up, &[start as Op; 2], rng),
            (false, _) => up.ops.fleet_status(),
            (true, 0..=9) => up.ops.put(),
            (true, 10..=19) => up.ops.rollout("pause"),
            (true, 20..=27) => up.ops.rollout("resume"),
            (true, 28..=39) => up.ops.rollout("abort"),
            (true, 40..=69) => up.ops.rollout("promote"),
            (true, 70..=79) => up.ops.rollout("status"),
            (true, 80..=84) => up.ops.fleet_status(),
            (true, 85..=89) => abort_as_a_wave_opens(up, rng),
            // Promote during an abort, and the reverse.
            (true, 90..=94) => race(up, &[ABORT, PROMOTE], rng),
            // Two operators' commands at once, any two.
            (true, _) => {
                const ANY: [Op; 5] = [
                    ABORT,
                    PROMOTE,
                    |up, _, _| up.ops.rollout("pause"),
                    |up, _, _| up.ops.rollout("resume"),
                    |up, _, _| up.ops.put(),
                ];
                let pair = [ANY[rng.range(0, 4) as usize], ANY[rng.range(0, 4) as usize]];
                race(up, &pair, rng);
            }
        }
    }
}

/// One operator's command, chosen with the generator, for `n` agents.
type Op = fn(&Up, &mut Rng, u64);
const ABORT: Op = |up, _, _| up.ops.rollout("abort");
const PROMOTE: Op = |up, _, _| up.ops.rollout("promote");

fn start(up: &Up, rng: &mut Rng, n: u64) {
    let canary = format!("ro-{}", rng.range(1, n));
    up.ops.start(&canary, rng.range(0, 3), 25, "1,25%,100%");
}

/// Commands by operators at once: each on a thread of its own, the second 0-200 ms after the
/// first (so either may reach etcd first).
fn race(up: &Up, ops: &[Op], rng: &mut Rng) {
    let n = up.fleet.lock().unwrap().agents.len() as u64;
    eprintln!("robust: race of {} operators", ops.len());
    std::thread::scope(|s| {
        for op in ops {
            let (mut own, gap) = (Rng::new(rng.next()), rng.range(0, 200));
            s.spawn(move || op(up, &mut own, n));
            std::thread::sleep(Duration::from_millis(gap));
        }
    });
}

/// An abort sent 0-300 ms after the driver next writes the rollout's state (a wave opening,
/// as the nodes of the wave read their admissions), within 15 s.
fn abort_as_a_wave_opens(up: &Up, rng: &mut Rng) {
    let state = &up.recorded.state;
    let before = state.load(Ordering::SeqCst);
    let moved = wait_for(Duration::from_secs(15), || state.load(Ordering::SeqCst) > before);
    std::thread::sleep(Duration::from_millis(rng.range(0, 300)));
    eprintln!("robust: race: abort as a wave opens (state written: {moved})");
    up.ops.rollout("abort");
}

/// The nemesis: one fault at a time, with gaps of 2-6 s, until `until`.
fn nemesis(up: &Up, rng: &mut Rng, until: Instant) {
    let h = &up.history;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(rng.range(2_000, 6_000)));
        let hold = Duration::from_millis(rng.range(2_000, 9_000));
        match rng.range(0, 8) {
            0 => {
                let i = rng.range(0, 2) as usize;
                let c = &up.cluster;
                fault(
                    h,
                    &format!("kill -9 etcd m{i}"),
                    || c.lock().unwrap().kill9(i),
                    hold,
                    || c.lock().unwrap().restart(i),
                );
            }
            1 => {
                let i = rng.range(0, 2) as usize;
                let Some(pid) = up.cluster.lock().unwrap().pid(i) else { continue };
                let what = format!("SIGSTOP etcd m{i}");
                fault(h, &what, || signal(pid, Signal::SIGSTOP), hold, || signal(pid, Signal::SIGCONT));
            }
            2 => {
                let i = rng.range(0, up.fleet.lock().unwrap().agents.len() as u64 - 1) as usize;
                kill_agent(up, i, &format!("kill -9 agent ro-{}", i + 1), hold);
            }
            3 => kill_in_window(up, rng),
            4 => pause_driver(up),
            5 => compaction(up, rng),
            6 => quota(up, hold),
            7 => cut_off(up, rng, hold),
            _ => slow_link(up, rng),
        }
    }
}

/// A compaction at etcd's current revision while the watches on one member cannot go on: the
/// member stopped, a key put through the others, the compaction 1 s later, the member
/// continued 12 s after it (past the agents' 15 s keepalive, counted from the stop, so the
/// agents connected to it watch again from a revision compacted away, and must read their
/// declaration again).
fn compaction(up: &Up, rng: &mut Rng) {
    let i = rng.range(0, 2) as usize;
    let Some(pid) = up.cluster.lock().unwrap().pid(i) else { return };
    let others = up.cluster.lock().unwrap().endpoints_but(i);
    let h = &up.history;
    let seen = &up.recorded.seen;
    let what = format!("SIGSTOP etcd m{i}, a write, compaction at the current revision");
    let all = up.cluster.lock().unwrap().endpoints();
    let on = || {
        signal(pid, Signal::SIGSTOP);
        // The recorder moved off the member at once: its watch would stall on it past the
        // checker's allowance for the recorder's lag.
        up.recorded.through(&others);
        // The revision moved past what the stopped member's watchers were sent: a key outside
        // the fleet's root, put through the others.
        system::etcdctl(&others, &["put", "/robust-mark", &h.now().to_string()]);
        std::thread::sleep(Duration::from_secs(1));
        let said = system::compact_now(&others, seen);
        h.log(&Entry::Nemesis { t: h.now(), phase: Edge::Note, fault: said });
    };
    let off = || {
        signal(pid, Signal::SIGCONT);
        *up.recorded.endpoints.lock().unwrap() = all;
    };
    fault(h, &what, on, Duration::from_secs(12), off);
}

/// The backend quota spent: etcd filled past `--quota-backend-bytes` (the NOSPACE alarm
/// raised), held, then the operator's way out (the filler deleted, a compaction, a defrag of
/// every member, the alarm disarmed).
fn quota(up: &Up, hold: Duration) {
    let endpoints = up.cluster.lock().unwrap().endpoints();
    let h = &up.history;
    let on = || {
        let (mib, said) = system::fill(&endpoints);
        let fault = format!("{mib} MiB put outside the fleet's root, then: {said}");
        h.log(&Entry::Nemesis { t: h.now(), phase: Edge::Note, fault });
    };
    let off = || {
        let said = system::unfill(&endpoints, &up.recorded.seen);
        h.log(&Entry::Nemesis { t: h.now(), phase: Edge::Note, fault: said });
    };
    fault(h, "etcd's backend quota spent (NOSPACE), then compact, defrag, disarm", on, hold, off);
}

/// One node cut off from etcd alone (nftables in its network namespace dropping what it sends
/// to etcd), for 6 s more than `hold` (so 8-15 s: past its 10 s presence lease, often), then
/// healed.
fn cut_off(up: &Up, rng: &mut Rng, hold: Duration) {
    let Some(net) = &up.net else { return };
    let i = rng.range(0, up.fleet.lock().unwrap().agents.len() as u64 - 1) as usize;
    let mut what = format!("agent ro-{} cut off from etcd (nftables in its namespace)", i + 1);
    // A cut that could not be made is said in the history (and the run goes on without it).
    if let Err(e) = net.cut(i) {
        eprintln!("robust: {what}: {e}");
        what = format!("{what}: NOT MADE: {e}");
    }
    fault(&up.history, &what, || {}, hold + Duration::from_secs(6), || net.heal(i));
}

/// One node's link to etcd made slow and lossy (`net::Net::slow`: this kernel has no netem), or
/// the operator's (its commands and drivers), 10-40 % of the packets dropped each way and a
/// token bucket of 32-256 kbit/s on both ends of its veth pair; probed from inside its
/// namespace once made (what the probe found is noted in the history: the fault is real), held
/// 5-12 s more, then healed.
fn slow_link(up: &Up, rng: &mut Rng) {
    let Some(net) = &up.net else { return };
    let all = net.all();
    let i = all[rng.range(0, all.len() as u64 - 1) as usize];
    let slow = Slow { loss: rng.range(10, 40), kbit: rng.range(32, 256) };
    let hold = Duration::from_millis(rng.range(5_000, 12_000));
    let who =
        if i == crate::net::OPERATOR { "the operator".to_owned() } else { format!("agent ro-{}", i + 1) };
    let what = format!(
        "{who} on a slow, lossy link ({} % lost each way, {} kbit/s both ends)",
        slow.loss, slow.kbit
    );
    let h = &up.history;
    let on = || {
        let probed = net.slow(i, slow).and_then(|()| net.probe(i, 10)).and_then(|p| Ok((p, net.dropped(i)?)));
        let said = match probed {
            // A healthy link answers every ping within a millisecond or so.
            Ok((probe, dropped)) if probe.loss() == 0.0 && probe.avg_ms < 5.0 => {
                format!("{what}: NO EFFECT: {probe}; {dropped} packets dropped")
            }
            Ok((probe, dropped)) => format!("{what}: {probe}; {dropped} packets dropped"),
            // Said in the history (and the run goes on without it).
            Err(e) => format!("{what}: NOT MADE: {e}"),
        };
        eprintln!("robust: {said}");
        h.log(&Entry::Nemesis { t: h.now(), phase: Edge::Note, fault: said });
    };
    fault(h, &what, on, hold, || net.heal(i));
}

fn kill_agent(up: &Up, i: usize, what: &str, hold: Duration) {
    let f = &up.fleet;
    fault(&up.history, what, || f.lock().unwrap().kill9(i), hold, || f.lock().unwrap().start(i, &up.history));
}

/// An agent killed inside an armed confirmation window: the next window to open within 10 s,
/// 0.3-1.5 s after it opened.
fn kill_in_window(up: &Up, rng: &mut Rng) {
    let since = up.history.now();
    let armed = up.fleet.lock().unwrap().armed.clone();
    let mut found = None;
    wait_for(Duration::from_secs(10), || {
        found = armed.lock().unwrap().iter().rev().find(|(_, t)| *t >= since).cloned();
        found.is_some()
    });
    let Some((node, _)) = found else { return };
    std::thread::sleep(Duration::from_millis(rng.range(300, 1_500)));
    let i: usize = node.trim_start_matches("ro-").parse::<usize>().unwrap() - 1;
    kill_agent(
        up,
        i,
        &format!("kill -9 agent {node} inside its confirmation window"),
        Duration::from_millis(rng.range(1_000, 3_000)),
    );
}

/// A driver stopped past its lease (10 s); a second driver (`resume`) takes over; the first
/// continued after.
fn pause_driver(up: &Up) {
    let Some(pid) = up.ops.drivers.lock().unwrap().first().copied() else { return };
    let ops = up.ops.clone();
    fault(
        &up.history,
        &format!("SIGSTOP driver (pid {pid}) past its lease"),
        || signal(pid, Signal::SIGSTOP),
        Duration::from_secs(12),
        || {
            ops.rollout("resume");
            std::thread::sleep(Duration::from_secs(2));
            signal(pid, Signal::SIGCONT);
        },
    );
}

/// A seeded run: the workload and the nemesis for `plan.secs`, the heal, the quiet period, the
/// final statuses; the history and what the checker says of it.
pub fn seeded(plan: &Plan) -> (Vec<Entry>, Vec<Violation>, tempfile::TempDir) {
    eprintln!(
        "robust: seed {} ({} agents, {} s, then {} s quiet)",
        plan.seed, plan.agents, plan.secs, plan.quiet
    );
    let up = Arc::new(up(plan));
    let until = Instant::now() + Duration::from_secs(plan.secs);
    let stop = Arc::new(AtomicBool::new(false));
    let chaos = {
        let (up, stop) = (up.clone(), stop.clone());
        let mut rng = Rng::new(plan.seed ^ 0x6e656d65);
        std::thread::spawn(move || {
            nemesis(&up, &mut rng, until);
            stop.store(true, Ordering::SeqCst);
        })
    };
    workload(&up, &mut Rng::new(plan.seed), until);
    chaos.join().expect("the nemesis ends");
    up.heal();
    std::thread::sleep(Duration::from_secs(plan.quiet));
    up.ops.fleet_status();
    up.ops.rollout("status");
    finished(up)
}

fn finished(up: Arc<Up>) -> (Vec<Entry>, Vec<Violation>, tempfile::TempDir) {
    // Drivers still running are ended (their rollouts stay as etcd holds them).
    for pid in up.ops.drivers.lock().unwrap().iter() {
        signal(*pid, Signal::SIGKILL);
    }
    up.ops.join();
    let up = Arc::try_unwrap(up).ok().expect("nothing else holds the run");
    let (entries, dir) = up.finish();
    let violations = crate::check::check(&entries);
    (entries, violations, dir)
}

/// The directed schedule: the canary stopped before a rollout starts (so it can never pass the
/// gate: the real driver fails it at its deadline, a driver that takes a pending node for a good
/// one opens the next wave over it), continued; then an abort, and time for every node to go
/// back.
pub fn directed(plan: &Plan) -> (Vec<Entry>, Vec<Violation>, tempfile::TempDir) {
    let up = Arc::new(up(plan));
    let pid = up.fleet.lock().unwrap().pid(0).expect("ro-1 runs");
    let h = up.history.clone();
    let ops = up.ops.clone();
    fault(
        &h,
        "SIGSTOP agent ro-1 through the first waves",
        || {
            signal(pid, Signal::SIGSTOP);
            ops.start("ro-1", 0, 8, "1,2,100%");
        },
        Duration::from_secs(20),
        || signal(pid, Signal::SIGCONT),
    );
    std::thread::sleep(Duration::from_secs(8));
    up.ops.rollout("abort");
    std::thread::sleep(Duration::from_secs(crate::check::GRACE_MS / 1000 + 6));
    finished(up)
}

/// The fence's schedule: a rollout soaking its first wave for 20 s, its driver stopped 4 s in,
/// past its lease (12 s), while a second driver (`resume`) takes the driver's key, then
/// continued. The real driver finds its lease gone and stops; one that ignores its lease opens
/// the next wave on its own soak, while the key names the second driver (I7).
pub fn fence(plan: &Plan) -> (Vec<Entry>, Vec<Violation>, tempfile::TempDir) {
    let up = Arc::new(up(plan));
    let started = revision(&up);
    up.ops.start("ro-1", 20, 90, "1,1,100%");
    // The barrier: the canary good in etcd, and a second for the driver's poll to see it, so
    // that its soak has begun before it is paused, and ends while the second driver, which
    // begins its own 12 s later, still soaks: the paused driver, let go, is the first to act.
    // Before, a fixed 4 s, which left the race to chance; it was won for the mutant only while
    // the canary's presence lapsed behind its status writes and held the second driver back.
    let good = wait_for(Duration::from_secs(20), || confirmed_admitted(&up, "ro-1", started));
    assert!(good, "ro-1 did not confirm the candidate within 20 s: see {}", up.history.path.display());
    std::thread::sleep(Duration::from_secs(1));
    pause_driver(&up);
    std::thread::sleep(Duration::from_secs(20));
    finished(up)
}

/// The window's schedule, after a rollout driven through and promoted (`promoted`, the promote
/// mutant's; folded into this run so that tests/run.sh's step stays under 5 minutes): the
/// canary on a candidate and confirmed (its status says so), the rollout aborted, and every etcd member stopped the
/// moment the canary takes the abort's declaration, for 9 s (past its 5 s window). The real
/// agent does not arm the generation an abort brings back; one that arms it, with the
/// candidate as the generation to go back to, goes back to the aborted candidate and holds it
/// (I4).
pub fn window(plan: &Plan) -> (Vec<Entry>, Vec<Violation>, tempfile::TempDir) {
    let up = Arc::new(up(plan));
    promoted(&up);
    let started = revision(&up);
    up.ops.start("ro-1", 120, 120, "1,100%");
    let confirmed = wait_for(Duration::from_secs(20), || confirmed_admitted(&up, "ro-1", started));
    assert!(confirmed, "ro-1 did not confirm the candidate within 20 s: see {}", up.history.path.display());
    let pids: Vec<u32> = {
        let c = up.cluster.lock().unwrap();
        (0..3).filter_map(|i| c.pid(i)).collect()
    };
    let from = revision(&up) + 1;
    let fault = "SIGSTOP every etcd member as ro-1 takes the abort".to_owned();
    let trap = up.fleet.lock().unwrap().trap.clone();
    *trap.lock().unwrap() =
        Some(system::Trap { node: "ro-1".into(), from, pids: pids.clone(), fault, sprung: None });
    // In the background: etcd may be stopped before the abort has its answer.
    let ops = up.ops.clone();
    let abort = std::thread::spawn(move || ops.rollout("abort"));
    let sprung = wait_for(Duration::from_secs(10), || {
        trap.lock().unwrap().as_ref().is_some_and(|t| t.sprung.is_some())
    });
    assert!(sprung, "ro-1 never took the abort's declaration: see {}", up.history.path.display());
    std::thread::sleep(Duration::from_secs(9));
    for pid in &pids {
        signal(*pid, Signal::SIGCONT);
    }
    let fault = trap.lock().unwrap().take().unwrap().fault;
    up.history.log(&Entry::Nemesis { t: up.history.now(), phase: crate::history::Edge::Stop, fault });
    abort.join().expect("the abort ends");
    std::thread::sleep(Duration::from_secs(crate::check::GRACE_MS / 1000 + 6));
    finished(up)
}

/// etcd's current revision.
fn revision(up: &Up) -> i64 {
    let out = system::etcdctl(&up.ops.endpoints, &["get", "/", "--limit", "1", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["header"]["revision"].as_i64().expect("etcd answers")
}

/// Whether `node` is admitted to a rollout after revision `after`, and its status in etcd says
/// it converged on a declaration read at or after its admission, and confirmed the generation
/// it runs.
fn confirmed_admitted(up: &Up, node: &str, after: i64) -> bool {
    let get = |key: String, args: &[&str]| {
        let out = system::etcdctl(&up.ops.endpoints, &[&["get", key.as_str()][..], args].concat());
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap_or_default()
    };
    let admission = get(crate::model::admission_key(node), &["-w", "json"]);
    let Some(admitted) = admission["kvs"][0]["mod_revision"].as_i64().filter(|r| *r > after) else {
        return false;
    };
    let v = get(crate::model::status_key(node), &["--print-value-only"]);
    v["revision"].as_i64().is_some_and(|r| r >= admitted)
        && v["converged"] == true
        && v["generation"].is_u64()
        && v["confirmed"] == v["generation"]
}

/// What a run did, in one line per kind: operations by outcome, faults, samples, revisions.
pub fn summary(entries: &[Entry]) -> String {
    use std::collections::BTreeMap;
    let mut ops: BTreeMap<String, usize> = BTreeMap::new();
    let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
    let (mut samples, mut revision, mut rereads) = (0, 0, 0);
    for e in entries {
        match e {
            Entry::Op { op, phase, .. } if *phase != Phase::Invoke => {
                *ops.entry(format!("{op}:{phase:?}").to_lowercase()).or_default() += 1
            }
            Entry::Nemesis { phase: Edge::Start, fault, .. } => *faults.entry(kind(fault)).or_default() += 1,
            Entry::Sample { .. } => samples += 1,
            Entry::Etcd { rev, .. } => revision = revision.max(*rev),
            Entry::Claim { what: crate::history::ClaimKind::Reread, .. } => rereads += 1,
            _ => {}
        }
    }
    let ops: Vec<String> = ops.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let total: usize = faults.values().sum();
    let kinds: Vec<String> = faults.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(
        "operations: {}; faults: {total} ({}); samples: {samples}; revisions: {revision}; rereads after a compaction: {rereads}",
        ops.join(" "),
        kinds.join(" ")
    )
}

/// A fault's kind, from its words (for the figures).
pub fn kind(fault: &str) -> &'static str {
    const KINDS: [(&str, &str); 11] = [
        ("compaction", "compaction"),
        ("backend quota", "quota"),
        ("cut off", "cut-off"),
        ("slow, lossy link", "slow-link"),
        ("inside its confirmation window", "agent-killed-in-window"),
        ("kill -9 agent", "agent-killed"),
        ("SIGSTOP agent", "agent-stopped"),
        ("kill -9 etcd", "member-killed"),
        ("SIGSTOP every etcd member", "etcd-stopped"),
        ("SIGSTOP etcd", "member-stopped"),
        ("SIGSTOP driver", "driver-stopped"),
    ];
    KINDS.iter().find(|(words, _)| fault.contains(words)).map_or("other", |(_, k)| k)
}

/// The promote's phase of the window's schedule: a rollout of two waves with no soak driven
/// through, then promoted. The real promote puts the candidate as the fleet's declaration; one
/// that closes the rollout without putting it sends every node back to the declaration before,
/// with no hold to say why (I5, checked once 20 s have passed with no fault: after the window's
/// fault, on the nodes the window's rollout does not admit).
fn promoted(up: &Up) {
    up.ops.start("ro-1", 0, 25, "1,100%");
    let drivers = up.ops.drivers.clone();
    wait_for(Duration::from_secs(60), || drivers.lock().unwrap().is_empty());
    up.ops.rollout("promote");
}

/// The faults of a history that were not made, or made and found to do nothing (a slow link
/// whose probe lost nothing and waited for nothing): a harness that injects nothing would
/// pass every check.
pub fn unreal_faults(entries: &[Entry]) -> Vec<String> {
    let said = entries.iter().filter_map(|e| match e {
        Entry::Nemesis { fault, .. } => Some(fault),
        _ => None,
    });
    let unreal = said.filter(|f| f.contains(": NOT MADE: ") || f.contains(": NO EFFECT: "));
    let mut out: Vec<String> = unreal.cloned().collect();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_counted_by_kind_and_unreal_ones_named() {
        let e = |phase, fault: &str| Entry::Nemesis { t: 1, phase, fault: fault.into() };
        let slow = "agent ro-2 on a slow, lossy link (20 % lost each way, 64 kbit/s both ends)";
        let entries = vec![
            e(Edge::Start, slow),
            e(
                Edge::Note,
                &format!(
                    "{slow}: 6 of 10 pings answered (40 % lost), round trip mean 310.2 ms, longest 600.0 ms"
                ),
            ),
            e(Edge::Stop, slow),
            e(Edge::Start, "SIGSTOP etcd m1, a write, compaction at the current revision"),
            e(Edge::Note, "compacted at revision 80"),
            e(Edge::Start, "kill -9 agent ro-3 inside its confirmation window"),
            e(Edge::Start, "kill -9 agent ro-3"),
            e(Edge::Start, "kill -9 etcd m0"),
            e(Edge::Start, "SIGSTOP etcd m2"),
        ];
        let line = summary(&entries);
        assert!(
            line.contains("faults: 6 (agent-killed=1 agent-killed-in-window=1 compaction=1 member-killed=1 member-stopped=1 slow-link=1)"),
            "{line}"
        );
        assert!(unreal_faults(&entries).is_empty());
        let nothing = format!(
            "{slow}: NO EFFECT: 10 of 10 pings answered (0 % lost), round trip mean 0.1 ms, longest 0.2 ms"
        );
        let unreal = unreal_faults(&[e(Edge::Start, slow), e(Edge::Note, &nothing), e(Edge::Stop, slow)]);
        assert_eq!(unreal, vec![nothing]);
    }
}
