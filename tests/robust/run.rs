//! One run: the system up, an operator's workload and a nemesis on a seeded schedule, a heal
//! and a quiet period, then the history checked.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::json;

use crate::history::{Edge, Entry, Phase};
use crate::system::{self, signal, wait_for, Cluster, Fleet, History};

/// A small seeded generator (splitmix64): the same seed, the same schedule of choices.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// From `low` to `high`, both included.
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }
}

/// What every operation needs: the binary, the endpoints, a directory, the history.
pub struct Ops {
    pub bin: PathBuf,
    pub endpoints: String,
    pub dir: PathBuf,
    pub target: PathBuf,
    pub history: Arc<History>,
    /// `MESH_HOST_MUTANT` for every command, when the run is a mutant's.
    pub mutant: Option<&'static str>,
    /// The operator's network namespace and the endpoints it reaches etcd at from there (the
    /// bridge's), when it has one: every command and driver runs in it.
    pub via: Option<(String, String)>,
    next: AtomicU64,
    /// The drivers running (start, resume): their pids, for the nemesis.
    pub drivers: Arc<Mutex<Vec<u32>>>,
    /// Every operation's thread, joined at the end.
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

/// How an operation ended, in Jepsen's words: a refusal (exit 2) wrote nothing; an unknown
/// outcome (exit 3, an error, a kill) may have written; a start that printed its plan wrote.
pub fn outcome(op: &str, code: Option<i32>, out: &str) -> Phase {
    if op == "start" && out.contains(": a candidate of ") {
        return Phase::Ok;
    }
    match code {
        Some(0) => Phase::Ok,
        Some(1) if op.ends_with("status") => Phase::Ok,
        Some(2) if op != "resume" => Phase::Fail,
        _ => Phase::Info,
    }
}

impl Ops {
    pub fn new(bin: &Path, endpoints: &str, dir: &Path, target: &Path, history: &Arc<History>) -> Ops {
        Ops {
            bin: bin.to_owned(),
            endpoints: endpoints.to_owned(),
            dir: dir.to_owned(),
            target: target.to_owned(),
            history: history.clone(),
            mutant: None,
            via: None,
            next: AtomicU64::new(1),
            drivers: Arc::new(Mutex::new(Vec::new())),
            threads: Mutex::new(Vec::new()),
        }
    }

    /// A declaration file whose managed file holds `content`.
    pub fn declaration(&self, content: &str) -> PathBuf {
        let path = self.dir.join(format!("decl-{}.json", self.next.load(Ordering::SeqCst)));
        let file = json!({"type": "file", "id": "app.conf", "path": self.target.join("app.conf"), "content": content});
        std::fs::write(&path, json!({"version": 1, "resources": [file]}).to_string()).unwrap();
        path
    }

    /// Runs `mesh-host fleet ARGS` as operation `op`, in the background when `background`
    /// (a driver), killed past `within`; the invocation and the outcome go to the history.
    pub fn run(&self, op: &str, args: &[String], token: Option<String>, background: bool, within: Duration) {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        // In the operator's namespace, by nsenter, which execs the binary: the same process.
        let mut command = match &self.via {
            Some((ns, _)) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}")).arg(&self.bin);
                // Plain http to the bridge's address, a network of the harness's own.
                c.env("MESH_HOST_ETCD_ALLOW_PLAINTEXT", "true");
                c
            }
            None => Command::new(&self.bin),
        };
        if let Some(m) = self.mutant {
            command.env("MESH_HOST_MUTANT", m);
        }
        let endpoints = self.via.as_ref().map_or(&self.endpoints, |(_, e)| e);
        let child = command
            .arg("--state")
            .arg(self.dir.join("operator-state.json"))
            .arg("fleet")
            .args(args)
            .args(["--etcd", endpoints])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("mesh-host runs");
        let pid = child.id();
        let h = self.history.clone();
        h.log(&Entry::Op {
            t: h.now(),
            id,
            phase: Phase::Invoke,
            op: op.into(),
            token,
            pid: Some(pid),
            code: None,
            out: String::new(),
        });
        let drivers = self.drivers.clone();
        if background {
            drivers.lock().unwrap().push(pid);
        }
        let op = op.to_owned();
        let wait = move || {
            let killer = std::thread::spawn(move || {
                let start = Instant::now();
                while start.elapsed() < within && Path::new(&format!("/proc/{pid}")).exists() {
                    std::thread::sleep(Duration::from_millis(200));
                }
                signal(pid, Signal::SIGCONT);
                signal(pid, Signal::SIGKILL);
            });
            let done = child.wait_with_output().expect("the operation ends");
            let _ = killer;
            drivers.lock().unwrap().retain(|p| *p != pid);
            let out =
                format!("{}{}", String::from_utf8_lossy(&done.stdout), String::from_utf8_lossy(&done.stderr));
            let code = done.status.code();
            let phase = outcome(&op, code, &out);
            h.log(&Entry::Op { t: h.now(), id, phase, op, token: None, pid: None, code, out });
        };
        if background {
            self.threads.lock().unwrap().push(std::thread::spawn(wait));
        } else {
            wait();
        }
    }

    /// A `fleet put --fleet` of new, unique content.
    pub fn put(&self) {
        let token = format!("<tok-{}>", self.next.load(Ordering::SeqCst));
        let path = self.declaration(&format!("put {token}\n"));
        self.run(
            "put",
            &["put".into(), "--fleet".into(), path.display().to_string()],
            Some(token),
            false,
            Duration::from_secs(30),
        );
    }

    /// A rollout of new, unique content, driven in the background.
    pub fn start(&self, canary: &str, soak: u64, deadline: u64, waves: &str) {
        let token = format!("<tok-{}>", self.next.load(Ordering::SeqCst));
        let path = self.declaration(&format!("candidate {token}\n"));
        let args: Vec<String> = [
            "rollout",
            "start",
            "--fleet",
            "--waves",
            waves,
            "--soak",
            &soak.to_string(),
            "--deadline",
            &deadline.to_string(),
            "--max-failures",
            "1",
            "--canary",
            canary,
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([path.display().to_string()])
        .collect();
        self.run("start", &args, Some(token), true, Duration::from_secs(300));
    }

    /// `fleet rollout CMD` (pause, abort, promote, status; resume in the background).
    pub fn rollout(&self, cmd: &str) {
        let background = cmd == "resume";
        let within = Duration::from_secs(if background { 300 } else { 40 });
        self.run(cmd, &["rollout".into(), cmd.into()], None, background, within);
    }

    pub fn fleet_status(&self) {
        self.run("fleet-status", &["status".into()], None, false, Duration::from_secs(30));
    }

    /// Waits for every driver and operation in the background (each is killed past its time).
    pub fn join(&self) {
        let threads: Vec<_> = self.threads.lock().unwrap().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }
}

/// A fault: begun, then ended; both in the history.
pub fn fault(history: &History, what: &str, on: impl FnOnce(), hold: Duration, off: impl FnOnce()) {
    history.log(&Entry::Nemesis { t: history.now(), phase: Edge::Start, fault: what.into() });
    on();
    std::thread::sleep(hold);
    off();
    history.log(&Entry::Nemesis { t: history.now(), phase: Edge::Stop, fault: what.into() });
}

/// What a run is given.
pub struct Plan {
    pub seed: u64,
    pub agents: usize,
    /// How long the workload and the nemesis go on.
    pub secs: u64,
    /// The quiet period after the heal.
    pub quiet: u64,
    pub bin: PathBuf,
    /// The mutant every process of the run is told to be (`MESH_HOST_MUTANT`; a build with the
    /// feature `robust-mutant` only).
    pub mutant: Option<&'static str>,
    /// Each agent in a network namespace of its own (`net`), so that one can be cut off.
    pub netns: bool,
}

/// The system up, shared by the runs.
pub struct Up {
    pub dir: tempfile::TempDir,
    pub history: Arc<History>,
    pub cluster: Arc<Mutex<Cluster>>,
    pub fleet: Arc<Mutex<Fleet>>,
    pub ops: Arc<Ops>,
    stop: Arc<AtomicBool>,
    pub recorded: system::Recorded,
    sampler: Option<std::thread::JoinHandle<()>>,
    /// The agents' network namespaces, when the plan asks for them (dropped last: after the
    /// agents and the members).
    pub net: Option<crate::net::Net>,
}

/// Starts the cluster, the recorder, the agents (on a first declaration) and the sampler.
pub fn up(plan: &Plan) -> Up {
    let dir = tempfile::Builder::new().prefix("mesh-host-robust-").tempdir_in("/var/tmp").unwrap();
    let history = History::create(dir.path().join("history.jsonl"));
    // The seeded run's operator in a namespace of its own too, so that its link can be slowed
    // (its commands' and drivers' outcomes then often unknown); the directed runs' on the
    // host's side, as their schedules time its commands.
    let net = plan.netns.then(|| crate::net::Net::up(plan.agents, plan.secs > 0));
    let host = net.as_ref().map(|n| n.names.host());
    let cluster = Cluster::start(dir.path(), host.as_deref());
    let endpoints = cluster.endpoints();
    let stop = Arc::new(AtomicBool::new(false));
    let recorded = system::record(&endpoints, &history, &stop);
    let agents_at = cluster.endpoints_on(host.as_deref());
    let mut fleet = Fleet::new(&plan.bin, &agents_at, dir.path(), plan.agents, 5);
    fleet.mutant = plan.mutant;
    fleet.netns = net.as_ref().map(|n| n.names);
    let mut ops = Ops::new(&plan.bin, &endpoints, dir.path(), &fleet.target, &history);
    ops.mutant = plan.mutant;
    if let Some(net) = net.as_ref().filter(|n| n.all().contains(&crate::net::OPERATOR)) {
        ops.via = Some((net.names.netns(crate::net::OPERATOR), agents_at.clone()));
    }
    let ops = Arc::new(ops);
    ops.put();
    for i in 0..plan.agents {
        fleet.start(i, &history);
    }
    let names: Vec<String> = fleet.agents.iter().map(|a| a.name.clone()).collect();
    let everyone = || {
        let out = system::etcdctl(&endpoints, &["get", "--prefix", "/mesh-host/node/", "--keys-only"]);
        let keys = String::from_utf8_lossy(&out.stdout).into_owned();
        names
            .iter()
            .all(|n| ["status", "alive"].iter().all(|k| keys.contains(&format!("/mesh-host/node/{n}/{k}"))))
    };
    assert!(
        wait_for(Duration::from_secs(120), everyone),
        "not every agent wrote its status and presence: see {}",
        dir.path().display()
    );
    let fleet = Arc::new(Mutex::new(fleet));
    let sampler = Some(system::sample(&fleet, &history, &stop));
    let cluster = Arc::new(Mutex::new(cluster));
    Up { dir, history, cluster, fleet, ops, stop, recorded, sampler, net }
}

impl Up {
    /// Everything running again, and nothing paused.
    pub fn heal(&self) {
        if let Some(net) = &self.net {
            net.heal_all();
        }
        let mut c = self.cluster.lock().unwrap();
        for i in 0..3 {
            c.restart(i);
            if let Some(pid) = c.pid(i) {
                signal(pid, Signal::SIGCONT);
            }
        }
        drop(c);
        let mut f = self.fleet.lock().unwrap();
        for i in 0..f.agents.len() {
            f.start(i, &self.history);
            if let Some(pid) = f.pid(i) {
                signal(pid, Signal::SIGCONT);
            }
        }
        for pid in self.ops.drivers.lock().unwrap().iter() {
            signal(*pid, Signal::SIGCONT);
        }
    }

    /// Waits for the recorder to have seen etcd's latest revision, stops the threads, and
    /// returns the history.
    pub fn finish(mut self) -> (Vec<Entry>, tempfile::TempDir) {
        let endpoints = self.cluster.lock().unwrap().endpoints();
        let out =
            system::etcdctl(&endpoints, &["get", "/mesh-host/", "--prefix", "--limit", "1", "-w", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let latest = v["header"]["revision"].as_i64().unwrap_or(0);
        let recorded = self.recorded.seen.clone();
        assert!(
            wait_for(Duration::from_secs(30), || recorded.load(Ordering::SeqCst) >= latest),
            "the recorder did not reach revision {latest}"
        );
        let lost = self.recorded.lost.load(Ordering::SeqCst);
        assert!(lost == 0, "the history lacks revisions from {lost}: compacted before the recorder saw them");
        self.stop.store(true, Ordering::SeqCst);
        if let Some(pid) = *self.recorded.watcher.lock().unwrap() {
            signal(pid, Signal::SIGKILL);
        }
        if let Some(s) = self.sampler.take() {
            let _ = s.join();
        }
        self.fleet.lock().unwrap().agents.iter_mut().for_each(|_| {});
        self.history.flush();
        let text = std::fs::read_to_string(&self.history.path).unwrap();
        let entries = crate::history::parse(&text).unwrap();
        (entries, self.dir)
    }
}
