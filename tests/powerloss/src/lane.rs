//! The FUSE lane: the workloads run by the real agent on a `PowerFs` mount, then the crash state
//! at sync boundaries computed, checked, and some of them served again at the same mount point
//! for the next apply to converge on.
//!
//! A crash state is served by a fresh mount of a new `PowerFs` holding it, at the same path:
//! the declarations name absolute paths, the agent's store names them too, and a fresh mount
//! leaves no page or dentry cache of the state before. One mount at a time, so the lane needs no
//! mount namespace of its own.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::check::{self, Found, Phase};
use crate::fuse::Mounted;
use crate::model::{crash_state, Crash, Op, Tree};
use crate::workload;

/// How the lane runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// The mesh-host binary (the real build or the mutant).
    pub agent: PathBuf,
    /// An empty directory to mount at.
    pub mount: PathBuf,
    /// A scratch directory off the mount, for the declarations.
    pub work: PathBuf,
    /// How many crash states per workload are served again and applied on (the others are
    /// checked on the model only).
    pub served: usize,
    /// How many sync boundaries per workload are checked at most (evenly spaced, marks always).
    pub boundaries: usize,
    /// The seed of the random crash states.
    pub seed: u64,
}

/// What one workload's crash states held.
#[derive(Debug, Default)]
pub struct Tally {
    /// The workload's name.
    pub workload: String,
    /// Crash states checked.
    pub states: usize,
    /// Of those, served again and applied on.
    pub served: usize,
    /// Paths torn, over all states.
    pub torn: usize,
    /// Paths lost.
    pub lost: usize,
    /// Records ahead of the machine.
    pub ahead: usize,
    /// Other failures (store or journal unreadable, the next apply failing or counting drift).
    pub other: usize,
    /// The first few findings, for a person to read.
    pub examples: Vec<String>,
}

impl Tally {
    /// The lane's line for this workload.
    pub fn line(&self) -> String {
        format!(
            "powerloss: lane=fuse fs=fuse workload={} states={} torn={} lost={} ahead={}",
            self.workload, self.states, self.torn, self.lost, self.ahead
        )
    }

    fn add(&mut self, at: &str, found: Found) {
        self.torn += found.torn.len();
        self.lost += found.lost.len();
        self.ahead += found.ahead.len();
        self.other += found.other.len();
        for f in found
            .torn
            .iter()
            .map(|t| format!("torn {t}"))
            .chain(found.lost.iter().map(|l| format!("lost {l}")))
            .chain(found.ahead.iter().map(|a| format!("ahead {a}")))
            .chain(found.other.iter().cloned())
        {
            if self.examples.len() < 8 {
                self.examples.push(format!("{at}: {f}"));
            }
        }
    }
}

/// Writes a file durably through the mount, as a person's careful edit would be.
fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::File::open(path.parent().unwrap_or(Path::new("/")))?.sync_all()
}

/// Replaces a file durably through the mount, as a careful person's edit is made: a new file
/// beside it, synced, renamed over it, the directory synced. A crash in between leaves the
/// old content or the new, so what the harness does is never taken for a tear the agent made.
/// The temporary name is one the checks pass over (`check::temporary`) and the agent's
/// clean-up does not take for its own (no PID in it).
pub fn replace_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.mesh-host-hand-edit"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    // The person keeps the file's mode and owner: only its content is the edit.
    if let Ok(was) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::MetadataExt as _;
        std::os::unix::fs::fchown(&f, Some(was.uid()), Some(was.gid()))?;
        f.set_permissions(was.permissions())?;
    }
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(path.parent().unwrap_or(Path::new("/")))?.sync_all()
}

fn apply(cfg: &Config, declaration: &Path) -> std::io::Result<(i32, serde_json::Value, String)> {
    let out = Command::new(&cfg.agent)
        .arg("--state")
        .arg(cfg.mount.join(workload::STORE))
        .args(["apply", "--json"])
        .arg(declaration)
        .env("MESH_HOST_LOG", "warn")
        .stdin(Stdio::null())
        .output()?;
    let report = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    Ok((out.status.code().unwrap_or(-1), report, String::from_utf8_lossy(&out.stderr).into_owned()))
}

fn must_apply(cfg: &Config, declaration: &Path) -> std::io::Result<()> {
    let (code, report, stderr) = apply(cfg, declaration)?;
    if code != 0 || !report["error"].is_null() {
        return Err(std::io::Error::other(format!(
            "the workload's apply of {} failed (exit {code}): {report} {stderr}",
            declaration.display()
        )));
    }
    Ok(())
}

struct Recorded {
    base: Tree,
    log: Vec<Op>,
    /// Each phase, and where its mark is in the log.
    phases: Vec<(Phase, usize)>,
    /// The declaration each phase applies, and the phase that holds what it converges to.
    declarations: Vec<(PathBuf, usize)>,
}

fn mark(m: &Mounted, name: &str, hand_edits: &std::collections::BTreeSet<String>) -> (Phase, usize) {
    let mut s = m.lock();
    s.mark(name);
    let phase = Phase {
        name: name.into(),
        managed: check::snapshot_tree(&s.tree, "m"),
        hand_edits: hand_edits.clone(),
    };
    (phase, s.log.len())
}

/// Runs the workloads on a fresh mount and returns what was recorded.
fn record(cfg: &Config) -> std::io::Result<Recorded> {
    let root = cfg.mount.to_string_lossy().into_owned();
    workload::write_declarations(&root, &cfg.work)?;
    let (cold, change) = (cfg.work.join("cold.json"), cfg.work.join("change.json"));
    let m = Mounted::mount(&cfg.mount, Tree::new())?;
    let none = std::collections::BTreeSet::new();
    let mut phases = Vec::new();
    let mut declarations = Vec::new();
    // Set up what a machine has before the agent: its directories and someone else's file.
    for d in ["m", "state"] {
        std::fs::create_dir(cfg.mount.join(d))?;
    }
    std::fs::File::open(&cfg.mount)?.sync_all()?;
    write_synced(&cfg.mount.join(workload::INTO_FILE), workload::INTO_BEFORE)?;
    phases.push(mark(&m, "setup", &none));
    declarations.push((cold.clone(), 1));
    for (name, decl, next) in [("cold", &cold, &change), ("change", &change, &change)] {
        let t = Instant::now();
        must_apply(cfg, decl)?;
        eprintln!("powerloss: fuse: the {name} apply took {:.1} s", t.elapsed().as_secs_f64());
        phases.push(mark(&m, name, &none));
        declarations.push((next.clone(), 2));
    }
    // The daemon: hand-edits made durably, then put back by `mesh-host run`.
    let edits = workload::hand_edits();
    let sums: std::collections::BTreeSet<String> = edits.iter().map(|(_, b)| check::sum(b)).collect();
    let log_path = cfg.work.join("daemon.log");
    let mut daemon = Command::new(&cfg.agent)
        .arg("--state")
        .arg(cfg.mount.join(workload::STORE))
        .args(["run", "--metrics", "off", "--declaration"])
        .arg(&change)
        .env("MESH_HOST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log_path)?)
        .stderr(std::fs::File::options().append(true).open(&log_path)?)
        .spawn()?;
    let started = Instant::now();
    // The daemon's first pass is a steady one: wait for it to say it is watching.
    let said = |what: &str| std::fs::read_to_string(&log_path).unwrap_or_default().matches(what).count();
    while said("mesh-host is running") == 0 && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    for (path, bytes) in &edits {
        replace_synced(&cfg.mount.join(path), bytes)?;
    }
    // What the hand-edits leave, built rather than looked at: the daemon may have put some
    // back already by the time the harness could look.
    let (mut edited, at) = mark(&m, "edited", &sums);
    edited.managed = phases[2].0.managed.clone();
    for (path, bytes) in &edits {
        if let Some(e) = edited.managed.get_mut(path.trim_start_matches("m/")) {
            e.sum = Some(check::sum(bytes));
        }
    }
    phases.push((edited, at));
    declarations.push((change.clone(), 2));
    let want = phases[2].0.managed.clone();
    let corrected = || {
        let s = m.lock();
        let now = check::snapshot_tree(&s.tree, "m");
        edits.iter().all(|(p, _)| {
            let rel = p.trim_start_matches("m/");
            now.get(rel) == want.get(rel)
        })
    };
    while !corrected() || said("corrected d") < edits.len() {
        if started.elapsed() > Duration::from_secs(120) {
            let _ = daemon.kill();
            return Err(std::io::Error::other(format!(
                "the daemon did not put back the hand-edits: {}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = Command::new("kill").args(["-TERM", &daemon.id().to_string()]).status();
    let status = daemon.wait()?;
    if !status.success() {
        return Err(std::io::Error::other(format!("the daemon stopped with {status}")));
    }
    eprintln!("powerloss: fuse: the daemon put back {} hand-edits", edits.len());
    phases.push(mark(&m, "daemon", &sums));
    declarations.push((change.clone(), 2));
    let (base, log) = {
        let s = m.lock();
        (s.base.clone(), s.log.clone())
    };
    m.unmount()?;
    Ok(Recorded { base, log, phases, declarations })
}

/// The boundaries to check between two log positions: at most `n`, evenly spaced, the last
/// (the mark) always among them.
fn pick(log: &[Op], from: usize, to: usize, n: usize) -> Vec<usize> {
    let all: Vec<usize> = (from..to).filter(|i| log[*i].is_boundary()).map(|i| i + 1).collect();
    if all.len() <= n {
        return all;
    }
    let mut picked: Vec<usize> = (0..n).map(|k| all[k * all.len() / n]).collect();
    picked.push(*all.last().expect("not empty"));
    picked.dedup();
    picked
}

/// Serves `tree` at the mount and applies `declaration` on it: it must converge to `want`, and
/// count as corrected only hand-edits.
fn serve_and_apply(
    cfg: &Config,
    tree: Tree,
    declaration: &Path,
    want: &Phase,
    found: &mut Found,
) -> std::io::Result<()> {
    let m = Mounted::mount(&cfg.mount, tree)?;
    let (code, report, stderr) = apply(cfg, declaration)?;
    if code != 0 || !report["error"].is_null() {
        found.other.push(format!("the next apply failed (exit {code}): {} {stderr}", report["error"]));
    }
    let root = format!("{}/", cfg.mount.display());
    for o in report["outcomes"].as_array().into_iter().flatten() {
        if o["action"] == "corrected" {
            let target = o["target"].as_str().unwrap_or_default();
            let rel = target.strip_prefix(&root).unwrap_or(target);
            if !workload::hand_edits().iter().any(|(p, _)| p == rel) {
                found.other.push(format!("the next apply counted the host's own work as drift: {o}"));
            }
        }
    }
    let now = check::snapshot_tree(&m.lock().tree, "m");
    if now != want.managed {
        let differ: Vec<&String> = now
            .keys()
            .chain(want.managed.keys())
            .filter(|k| now.get(*k) != want.managed.get(*k))
            .take(3)
            .collect();
        found.other.push(format!("the next apply did not converge: {differ:?}"));
    }
    m.unmount()
}

/// Runs the lane: the workloads recorded, then their crash states checked. One tally per workload.
pub fn run(cfg: &Config) -> std::io::Result<Vec<Tally>> {
    let rec = record(cfg)?;
    let store = workload::STORE;
    let journal = format!("{store}.journal");
    let root = cfg.mount.to_string_lossy().into_owned();
    let mut tallies = Vec::new();
    // The workloads: cold (setup to cold), change (cold to change), daemon (change to daemon,
    // through the hand-edits).
    for (name, from, to) in [("cold", 0, 1), ("change", 1, 2), ("daemon", 2, 4)] {
        let mut tally = Tally { workload: name.into(), ..Tally::default() };
        let start = rec.phases[from].1;
        let end = rec.phases[to].1;
        let boundaries = pick(&rec.log, start, end, cfg.boundaries);
        let every = (boundaries.len() / cfg.served.max(1)).max(1);
        for (n, b) in boundaries.iter().enumerate() {
            // The phase reported done last before this boundary, and the one in flight.
            let done = rec.phases.iter().rposition(|(_, at)| *at <= *b).expect("setup is first");
            let flight = (done + 1).min(rec.phases.len() - 1);
            let (before, after) = (&rec.phases[done].0, &rec.phases[flight].0);
            let older: Vec<Phase> = rec.phases[..done].iter().map(|(p, _)| p.clone()).collect();
            for crash in [Crash::DropAll, Crash::Random(cfg.seed ^ (*b as u64).wrapping_mul(0x1000_0001))] {
                let tree = crash_state(&rec.base, &rec.log, *b, crash);
                let mut found = Found::default();
                let snap = check::snapshot_tree(&tree, "m");
                check::check_managed(&snap, &older, before, after, &mut found);
                check::check_store(
                    check::read_tree(&tree, store).as_deref(),
                    &snap,
                    &root,
                    before,
                    after,
                    &mut found,
                );
                check::check_journal(check::read_tree(&tree, &journal).as_deref(), &root, &mut found);
                let serve = matches!(crash, Crash::Random(_)) == (n / every % 2 == 1)
                    && n % every == 0
                    && tally.served < cfg.served;
                if serve && found.clean() {
                    // The declaration in flight at this boundary, and what it converges to.
                    let (declaration, converged) = &rec.declarations[done];
                    let want = &rec.phases[*converged].0;
                    serve_and_apply(cfg, tree, declaration, want, &mut found)?;
                    tally.served += 1;
                }
                tally.states += 1;
                tally.add(&format!("{name} boundary {b} {crash:?}"), found);
            }
        }
        eprintln!("powerloss: fuse: the {} workload checked", tally.workload);
        tallies.push(tally);
    }
    Ok(tallies)
}
