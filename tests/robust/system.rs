//! The system under test, on one machine: three etcd members on loopback, agents each in a mount
//! namespace of its own (its own directory bind-mounted over one shared target path, as
//! tests/it/fleet/rollout.rs does), the recorder, the sampler, and the history they write.

use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use crate::history::{digest, ClaimKind, Entry, KvOp};

/// The history being written, on the harness's monotonic clock.
pub struct History {
    start: Instant,
    file: Mutex<std::io::BufWriter<std::fs::File>>,
    pub path: PathBuf,
}

impl History {
    pub fn create(path: PathBuf) -> Arc<History> {
        let file = std::fs::File::create(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Arc::new(History { start: Instant::now(), file: Mutex::new(std::io::BufWriter::new(file)), path })
    }

    /// Milliseconds since the run began.
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn log(&self, e: &Entry) {
        let mut f = self.file.lock().unwrap();
        let _ = writeln!(f, "{}", serde_json::to_string(e).unwrap());
    }

    pub fn flush(&self) {
        let _ = self.file.lock().unwrap().flush();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub fn signal(pid: u32, sig: Signal) {
    let _ = kill(Pid::from_raw(pid as i32), sig);
}

pub fn wait_for(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

pub fn etcdctl(endpoints: &str, args: &[&str]) -> std::process::Output {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoints, "--command-timeout", "5s"])
        .args(args)
        .output()
        .expect("etcdctl runs: install Debian's etcd-client (tests/testbed/50-etcd.sh)")
}

/// Three etcd members on loopback, each restartable on its data directory.
pub struct Cluster {
    dir: PathBuf,
    ports: Vec<(u16, u16)>,
    token: String,
    /// An address the members listen on besides loopback (the agents' bridge), if any.
    also: Option<String>,
    pub members: Vec<Option<Child>>,
}

impl Cluster {
    /// The members up, listening on loopback and, when given, on `also` too.
    pub fn start(dir: &Path, also: Option<&str>) -> Cluster {
        let ports = (0..3).map(|_| (free_port(), free_port())).collect();
        let token = format!("robust-{}", std::process::id());
        let also = also.map(str::to_owned);
        let mut c = Cluster { dir: dir.to_owned(), ports, token, also, members: vec![None, None, None] };
        for i in 0..3 {
            c.restart(i);
        }
        let all = c.endpoints();
        assert!(
            wait_for(Duration::from_secs(30), || etcdctl(&all, &["endpoint", "health", "--cluster"])
                .status
                .success()),
            "the 3-member cluster did not come up: see {}",
            dir.join("etcd-m0.log").display()
        );
        c
    }

    pub fn endpoints(&self) -> String {
        self.ports.iter().map(|(c, _)| format!("http://127.0.0.1:{c}")).collect::<Vec<_>>().join(",")
    }

    /// The endpoints on the other address the members listen on (the agents'), or loopback's.
    pub fn endpoints_on(&self, address: Option<&str>) -> String {
        let address = address.unwrap_or("127.0.0.1");
        self.ports.iter().map(|(c, _)| format!("http://{address}:{c}")).collect::<Vec<_>>().join(",")
    }

    /// The endpoints of every member but `i`.
    pub fn endpoints_but(&self, i: usize) -> String {
        let others = self.ports.iter().enumerate().filter(|(j, _)| *j != i);
        others.map(|(_, (c, _))| format!("http://127.0.0.1:{c}")).collect::<Vec<_>>().join(",")
    }

    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].as_ref().map(Child::id)
    }

    pub fn kill9(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` (again) on its data directory; a no-op when it runs.
    pub fn restart(&mut self, i: usize) {
        if self.members[i].is_some() {
            return;
        }
        let initial: Vec<String> =
            self.ports.iter().enumerate().map(|(j, (_, p))| format!("m{j}=http://127.0.0.1:{p}")).collect();
        let (client, peer) = (
            format!("http://127.0.0.1:{}", self.ports[i].0),
            format!("http://127.0.0.1:{}", self.ports[i].1),
        );
        let listen = match &self.also {
            Some(a) => format!("{client},http://{a}:{}", self.ports[i].0),
            None => client.clone(),
        };
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("etcd-m{i}.log")))
            .unwrap();
        let child = Command::new("etcd")
            .args(["--name", &format!("m{i}"), "--data-dir"])
            .arg(self.dir.join(format!("etcd-m{i}")))
            .args(["--listen-client-urls", &listen, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial.join(","), "--initial-cluster-token", &self.token])
            .args(["--quota-backend-bytes", &QUOTA.to_string()])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("etcd starts: install Debian's etcd-server (tests/testbed/50-etcd.sh)");
        self.members[i] = Some(child);
    }
}

/// The members' backend quota (`--quota-backend-bytes`): small enough for the nemesis to fill
/// in a second or two, several times what a 4-minute run's own writes take.
pub const QUOTA: u64 = 24 << 20;

/// etcd's revision now (the header of a read).
pub fn revision_now(endpoints: &str) -> Option<i64> {
    let out = etcdctl(endpoints, &["get", "/", "--prefix", "--keys-only", "--limit", "1", "-w", "json"]);
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v["header"]["revision"].as_i64()
}

/// Compacts etcd at its current revision, once the recorder has every event up to it (it
/// watches every key, so every revision is an event it sees); what it says, for the history.
pub fn compact_now(endpoints: &str, recorded: &AtomicI64) -> String {
    let Some(now) = revision_now(endpoints) else { return "no revision read: not compacted".into() };
    if !wait_for(Duration::from_secs(15), || recorded.load(Ordering::SeqCst) >= now) {
        return format!("the recorder did not reach revision {now}: not compacted");
    }
    let out = etcdctl(endpoints, &["compact", &now.to_string()]);
    let said = String::from_utf8_lossy(if out.status.success() { &out.stdout } else { &out.stderr });
    format!("compact at revision {now}: {}", said.trim())
}

/// Fills etcd's backend with 1 MiB values outside the fleet's root until a put is refused for
/// the quota (the NOSPACE alarm raised): how many went in, and what the refusal said.
pub fn fill(endpoints: &str) -> (usize, String) {
    let value = "x".repeat(1 << 20);
    for i in 0..(QUOTA >> 20) as usize * 2 {
        let key = format!("/robust-fill/{i}");
        // The value on etcdctl's stdin: an argument is limited to 128 KiB.
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", endpoints, "--command-timeout", "5s", "put", &key])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("etcdctl runs");
        let _ = child.stdin.take().unwrap().write_all(value.as_bytes());
        let out = child.wait_with_output().expect("etcdctl ends");
        if !out.status.success() {
            // etcdctl's last line ("Error: etcdserver: mvcc: database space exceeded").
            let said = String::from_utf8_lossy(&out.stderr);
            return (i, said.trim().lines().last().unwrap_or_default().to_owned());
        }
    }
    ((QUOTA >> 20) as usize * 2, "never refused".into())
}

/// The operator's way out of NOSPACE: the filler's keys deleted, etcd compacted at its current
/// revision, every member defragmented, then the alarm disarmed; what each step said.
pub fn unfill(endpoints: &str, recorded: &AtomicI64) -> String {
    let run = |args: &[&str]| {
        let out = etcdctl(endpoints, args);
        let said = if out.status.success() { &out.stdout } else { &out.stderr };
        String::from_utf8_lossy(said).trim().replace('\n', "; ")
    };
    let deleted = run(&["del", "/robust-fill/", "--prefix"]);
    let compacted = compact_now(endpoints, recorded);
    let defrag = run(&["defrag", "--cluster"]);
    let disarmed = run(&["alarm", "disarm"]);
    format!("deleted {deleted}; {compacted}; {defrag}; disarm: {disarmed}")
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..3 {
            if let Some(pid) = self.pid(i) {
                signal(pid, Signal::SIGCONT);
            }
            self.kill9(i);
        }
    }
}

/// One agent: its name, its own directory (seen by it at the shared target), its state.
pub struct Agent {
    pub name: String,
    pub own: PathBuf,
    state: PathBuf,
    pub child: Option<Child>,
}

/// What the agents share: the binary, the endpoints, the target path, the window.
pub struct Fleet {
    pub bin: PathBuf,
    pub endpoints: String,
    pub target: PathBuf,
    pub window: u64,
    pub agents: Vec<Agent>,
    /// The nodes whose confirmation window opened, and when (for the nemesis).
    pub armed: Arc<Mutex<Vec<(String, u64)>>>,
    /// A fault sprung the moment a node says it accepted a revision (for a directed schedule).
    pub trap: Arc<Mutex<Option<Trap>>>,
    /// `MESH_HOST_MUTANT` for every agent, when the run is a mutant's.
    pub mutant: Option<&'static str>,
    /// Each agent in its own network namespace (`net::Names::netns`), when set.
    pub netns: Option<crate::net::Names>,
}

/// The nodes whose confirmation window opened, and when.
type Armed = Mutex<Vec<(String, u64)>>;

/// Processes stopped (SIGSTOP) from the agent's log reader itself, with no delay, as soon as
/// `node` says it accepted a declaration at `from` or later; `sprung` says when.
pub struct Trap {
    pub node: String,
    pub from: i64,
    pub pids: Vec<u32>,
    pub fault: String,
    pub sprung: Option<u64>,
}

impl Fleet {
    pub fn new(bin: &Path, endpoints: &str, dir: &Path, n: usize, window: u64) -> Fleet {
        let target = dir.join("target");
        std::fs::create_dir_all(&target).unwrap();
        let agents = (1..=n)
            .map(|i| {
                let own = dir.join(format!("ro-{i}/own"));
                std::fs::create_dir_all(&own).unwrap();
                Agent {
                    name: format!("ro-{i}"),
                    own,
                    state: dir.join(format!("ro-{i}/state.json")),
                    child: None,
                }
            })
            .collect();
        let armed = Arc::new(Mutex::new(Vec::new()));
        let trap = Arc::new(Mutex::new(None));
        Fleet {
            bin: bin.to_owned(),
            endpoints: endpoints.to_owned(),
            target,
            window,
            agents,
            armed,
            trap,
            mutant: None,
            netns: None,
        }
    }

    pub fn pid(&self, i: usize) -> Option<u32> {
        self.agents[i].child.as_ref().map(Child::id)
    }

    /// Starts agent `i` (again), its log read line by line into the history as claims.
    pub fn start(&mut self, i: usize, history: &Arc<History>) {
        if self.agents[i].child.is_some() {
            return;
        }
        let a = &self.agents[i];
        // In its network namespace, by nsenter, which execs unshare: the same process all the
        // way to the agent.
        let mut command = Command::new(if self.netns.is_some() { "nsenter" } else { "unshare" });
        if let Some(names) = self.netns {
            command.arg(format!("--net=/run/netns/{}", names.netns(i))).arg("unshare");
        }
        if let Some(m) = self.mutant {
            command.env("MESH_HOST_MUTANT", m);
        }
        let mut child = command
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(r#"mount --bind "$1" "$2" && shift 2 && exec "$@" 2>&1"#)
            .arg("sh")
            .arg(&a.own)
            .arg(&self.target)
            .arg(&self.bin)
            .arg("--state")
            .arg(&a.state)
            .args(["--log-json", "run", "--etcd", &self.endpoints, "--node", &a.name])
            .args(["--confirm-window", &self.window.to_string(), "--metrics", "off", "--settle-ms", "20"])
            // Plain http to the bridge's address, a network of the harness's own.
            .args(if self.netns.is_some() { &["--allow-plaintext"][..] } else { &[] })
            .env("MESH_HOST_LOG", "info")
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("unshare starts (util-linux)");
        let out = child.stdout.take().unwrap();
        let (name, history, armed, trap) =
            (a.name.clone(), history.clone(), self.armed.clone(), self.trap.clone());
        let log = a.state.with_file_name("agent.log");
        std::thread::spawn(move || claims(out, &name, &history, (&armed, &trap), &log));
        self.agents[i].child = Some(child);
    }

    pub fn kill9(&mut self, i: usize) {
        if let Some(mut c) = self.agents[i].child.take() {
            signal(c.id(), Signal::SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for i in 0..self.agents.len() {
            self.kill9(i);
        }
    }
}

/// Reads an agent's JSON log: each line kept in its log file, and what it claims in the history.
fn claims(
    out: impl std::io::Read,
    node: &str,
    history: &History,
    (armed, trap): (&Armed, &Mutex<Option<Trap>>),
    log: &Path,
) {
    let mut file = std::fs::File::options().create(true).append(true).open(log).ok();
    for line in BufReader::new(out).lines().map_while(Result::ok) {
        if let Some(f) = file.as_mut() {
            let _ = writeln!(f, "{line}");
        }
        let v: Value = serde_json::from_str(&line).unwrap_or_default();
        let fields = if v["fields"].is_object() { &v["fields"] } else { &v };
        let message = fields["message"].as_str().unwrap_or_default();
        let what = if message.contains("declaration from etcd accepted at revision") {
            ClaimKind::Accepted
        } else if message.contains("confirming it by a round trip")
            || message.contains("window recorded before the agent restarted is open")
        {
            ClaimKind::Armed
        } else if message.contains("confirmed: etcd answered a read") {
            ClaimKind::Confirmed
        } else if message.starts_with("going back to generation") {
            // Only the going back itself: an armed window's line says "or going back to ..." too.
            ClaimKind::Reverted
        } else if message.contains("compacted revision") && message.contains("away") {
            ClaimKind::Reread
        } else {
            continue;
        };
        let t = history.now();
        if what == ClaimKind::Armed {
            armed.lock().unwrap().push((node.to_owned(), t));
        }
        if what == ClaimKind::Accepted {
            spring(trap, node, fields["revision"].as_i64().unwrap_or(0), history);
        }
        history.log(&Entry::Claim {
            t,
            node: node.to_owned(),
            what,
            generation: fields["generation"].as_u64(),
            revision: fields["revision"].as_i64(),
        });
    }
}

/// Springs the trap when `node` accepted revision `revision`, at or past the trap's.
fn spring(trap: &Mutex<Option<Trap>>, node: &str, revision: i64, history: &History) {
    let mut trap = trap.lock().unwrap();
    let Some(t) = trap.as_mut().filter(|t| t.node == node && revision >= t.from && t.sprung.is_none()) else {
        return;
    };
    for pid in &t.pids {
        signal(*pid, Signal::SIGSTOP);
    }
    let now = history.now();
    t.sprung = Some(now);
    history.log(&Entry::Nemesis { t: now, phase: crate::history::Edge::Start, fault: t.fault.clone() });
}

/// What the recorder gives: the last revision seen, kept up to date, and the first revision it
/// could not have (compacted away before it watched from it; 0 when none was).
pub struct Recorded {
    pub seen: Arc<AtomicI64>,
    pub lost: Arc<AtomicI64>,
    /// The revision of the last write of the rollout's state (for the operator's races).
    pub state: Arc<AtomicI64>,
    /// The etcdctl watching, ended with the run (it would otherwise outlive the members,
    /// retrying them).
    pub watcher: Arc<Mutex<Option<u32>>>,
    /// The endpoints it watches through from its next start (all, unless a fault stops one for
    /// longer than the checker's `LAG_MS`: then the others).
    pub endpoints: Arc<Mutex<String>>,
}

impl Recorded {
    /// Watches through `endpoints` from now on: the running etcdctl is ended, and the watch
    /// started again from the revision after the last one seen.
    pub fn through(&self, endpoints: &str) {
        *self.endpoints.lock().unwrap() = endpoints.to_owned();
        if let Some(pid) = *self.watcher.lock().unwrap() {
            signal(pid, Signal::SIGKILL);
        }
    }
}

/// The recorder: etcd's watch on every key from revision 1, every event under the fleet's root
/// into the history (the others, the quota's filler, only move the revision seen); started
/// again from the revision after the last one seen when etcdctl ends (its member killed).
/// Compaction is only ever done up to a revision it has seen (`compact_now`); a watch that
/// etcd answers with a compaction all the same is recorded as `lost`, and the run fails.
pub fn record(endpoints: &str, history: &Arc<History>, stop: &Arc<AtomicBool>) -> Recorded {
    let last = Arc::new(AtomicI64::new(0));
    let lost = Arc::new(AtomicI64::new(0));
    let state = Arc::new(AtomicI64::new(0));
    let watcher = Arc::new(Mutex::new(None));
    let endpoints = Arc::new(Mutex::new(endpoints.to_owned()));
    let recorded = Recorded {
        seen: last.clone(),
        lost: lost.clone(),
        state: state.clone(),
        watcher: watcher.clone(),
        endpoints: endpoints.clone(),
    };
    let (history, stop, seen) = (history.clone(), stop.clone(), last.clone());
    std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            let from = (seen.load(Ordering::SeqCst) + 1).to_string();
            let endpoints = endpoints.lock().unwrap().clone();
            let child = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["--endpoints", &endpoints, "--keepalive-time", "2s", "--keepalive-timeout", "2s"])
                .args(["watch", "--prefix", "/", "--rev", &from])
                .args(["--prev-kv", "-w", "json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn();
            let Ok(mut child) = child else { return };
            *watcher.lock().unwrap() = Some(child.id());
            let out = child.stdout.take().unwrap();
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                watched(&line, &history, [&seen, &lost, &state]);
            }
            let _ = child.kill();
            let _ = child.wait();
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    recorded
}

fn watched(line: &str, history: &History, [seen, lost, state]: [&AtomicI64; 3]) {
    let v: Value = serde_json::from_str(line).unwrap_or_default();
    let compacted = v["CompactRevision"].as_i64().unwrap_or(0);
    if compacted > seen.load(Ordering::SeqCst) + 1 {
        let _ = lost.compare_exchange(0, seen.load(Ordering::SeqCst) + 1, Ordering::SeqCst, Ordering::SeqCst);
    }
    let b64 = |x: &Value| {
        x.as_str()
            .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    };
    for ev in v["Events"].as_array().into_iter().flatten() {
        let rev = ev["kv"]["mod_revision"].as_i64().unwrap_or(0);
        if rev < seen.load(Ordering::SeqCst) {
            continue;
        }
        let op = if ev["type"] == 1 || ev["type"] == "DELETE" { KvOp::Del } else { KvOp::Put };
        let key = b64(&ev["kv"]["key"]).unwrap_or_default();
        if !key.starts_with("/mesh-host/") {
            seen.fetch_max(rev, Ordering::SeqCst);
            continue;
        }
        if key == crate::model::STATE {
            state.fetch_max(rev, Ordering::SeqCst);
        }
        let value = if op == KvOp::Put { Some(b64(&ev["kv"]["value"]).unwrap_or_default()) } else { None };
        history.log(&Entry::Etcd { t: history.now(), rev, op, key, value });
        seen.fetch_max(rev, Ordering::SeqCst);
    }
}

/// The sampler: each agent's managed file, read through `/proc/PID/root` while the agent runs
/// (its own directory when it does not), every 75 ms; a sample is written when it changed,
/// and for every node once more when the run stops.
pub fn sample(
    fleet: &Arc<Mutex<Fleet>>,
    history: &Arc<History>,
    stop: &Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let (fleet, history, stop) = (fleet.clone(), history.clone(), stop.clone());
    std::thread::spawn(move || {
        let mut last: Vec<Option<String>> = Vec::new();
        let mut manifests: Vec<Option<String>> = Vec::new();
        loop {
            // The last round writes every node's sample: what each ran at the history's end.
            let ending = stop.load(Ordering::SeqCst);
            let paths: Vec<(String, PathBuf)> = {
                let f = fleet.lock().unwrap();
                (0..f.agents.len())
                    .map(|i| {
                        let a = &f.agents[i];
                        let path = match f.pid(i) {
                            Some(pid) => PathBuf::from(format!("/proc/{pid}/root"))
                                .join(f.target.strip_prefix("/").unwrap()),
                            None => a.own.clone(),
                        };
                        (a.name.clone(), path.join(crate::model::MANAGED))
                    })
                    .collect()
            };
            caches(&fleet, &history, &mut manifests);
            last.resize(paths.len(), None);
            for (i, (node, path)) in paths.iter().enumerate() {
                let content = std::fs::read_to_string(path).ok();
                let d = digest(content.as_deref());
                if ending || last[i].as_ref() != Some(&d) {
                    let content: String = content.unwrap_or_default().chars().take(80).collect();
                    history.log(&Entry::Sample {
                        t: history.now(),
                        node: node.clone(),
                        digest: d.clone(),
                        content,
                    });
                    last[i] = Some(d);
                }
            }
            if ending {
                return;
            }
            std::thread::sleep(Duration::from_millis(75));
        }
    })
}

/// Each node's cache of its declaration, read from its state directory: a `cache` entry when
/// its manifest changed. The files are read between two reads of the manifest, which must
/// agree (else the cache was being replaced: read again at the next round).
fn caches(fleet: &Mutex<Fleet>, history: &History, manifests: &mut Vec<Option<String>>) {
    let dirs: Vec<(String, PathBuf)> = {
        let f = fleet.lock().unwrap();
        f.agents.iter().map(|a| (a.name.clone(), a.state.with_file_name("fleet/declaration.d"))).collect()
    };
    manifests.resize(dirs.len(), None);
    for (i, (node, dir)) in dirs.iter().enumerate() {
        let Ok(manifest) = std::fs::read_to_string(dir.join(".fleet.json")) else { continue };
        if manifests[i].as_ref() == Some(&manifest) {
            continue;
        }
        let Ok(mut files) = std::fs::read_dir(dir).map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with('r') && n.ends_with(".json"))
                .collect::<Vec<_>>()
        }) else {
            continue;
        };
        files.sort();
        let values: Vec<String> =
            files.iter().filter_map(|n| std::fs::read_to_string(dir.join(n)).ok()).collect();
        if std::fs::read_to_string(dir.join(".fleet.json")).ok().as_ref() != Some(&manifest) {
            continue;
        }
        let m: Value = serde_json::from_str(&manifest).unwrap_or_default();
        let keys: Vec<String> = m["keys"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|k| k.as_str().map(str::to_owned))
            .collect();
        let Some(revision) = m["revision"].as_i64() else { continue };
        if keys.len() != values.len() {
            continue;
        }
        let kvs = keys.into_iter().zip(values).collect();
        history.log(&Entry::Cache { t: history.now(), node: node.clone(), revision, kvs });
        manifests[i] = Some(manifest);
    }
}
