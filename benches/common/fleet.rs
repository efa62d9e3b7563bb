//! What the fleet's benches share (`fleet`: real agents; `fleet_scale`: hollow nodes): processes
//! stopped when dropped, an etcd reached through etcdctl, the nodes' statuses as etcd holds
//! them, and the connections a process holds.

use std::io::BufRead as _;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine as _;

/// A child process stopped (SIGTERM, then SIGKILL after 10 s) and reaped when dropped.
pub struct Stopped(pub Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub struct Etcd {
    pub url: String,
}

impl Etcd {
    pub fn ctl(&self, args: &[&str]) -> Output {
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.url])
            .args(args)
            .output()
            .expect("etcdctl (Debian's etcd-client) runs")
    }

    pub fn revision(&self) -> i64 {
        let out = self.ctl(&["endpoint", "status", "-w", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v[0]["Status"]["header"]["revision"].as_i64().unwrap()
    }

    /// Every node's status, by node.
    pub fn statuses(&self) -> Vec<(String, serde_json::Value)> {
        let out = self.ctl(&["get", "--prefix", "/mesh-host/node/", "-w", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v["kvs"].as_array().map(Vec::as_slice).unwrap_or_default().iter().filter_map(status_of).collect()
    }

    /// Each node a rollout in progress admitted, with the revision of its admission.
    pub fn admissions(&self) -> Vec<(String, i64)> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let out =
            self.ctl(&["get", "--prefix", "/mesh-host/rollout/open/node/", "--keys-only", "-w", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let admission = |kv: &serde_json::Value| {
            let key = String::from_utf8(b64.decode(kv["key"].as_str()?).ok()?).ok()?;
            let node = key.strip_prefix("/mesh-host/rollout/open/node/")?.strip_suffix("/admitted")?;
            Some((node.to_owned(), kv["mod_revision"].as_i64()?))
        };
        v["kvs"].as_array().map(Vec::as_slice).unwrap_or_default().iter().filter_map(admission).collect()
    }

    /// etcd's write-ahead-log fsyncs so far: how many, and their seconds, from its /metrics.
    pub fn wal_fsyncs(&self) -> (f64, f64) {
        use std::io::{Read as _, Write as _};
        let addr = self.url.trim_start_matches("http://");
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0)
        };
        (
            value("etcd_disk_wal_fsync_duration_seconds_count"),
            value("etcd_disk_wal_fsync_duration_seconds_sum"),
        )
    }
}

/// A node's name and status from one of etcd's JSON key-values, when it is a status key.
pub fn status_of(kv: &serde_json::Value) -> Option<(String, serde_json::Value)> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = String::from_utf8(b64.decode(kv["key"].as_str()?).ok()?).ok()?;
    let node = key.strip_prefix("/mesh-host/node/")?.strip_suffix("/status")?.to_owned();
    let value = b64.decode(kv["value"].as_str()?).ok()?;
    Some((node, serde_json::from_slice(&value).ok()?))
}

/// Calls `done` until it says yes or `patience` runs out; whether it said yes.
pub fn wait_until(patience: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    done()
}

pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

/// The TCP connections process `pid` holds established with `port` on its side (`local`) or on
/// the other (`!local`), from the kernel's tables: the sockets of /proc/PID/net/tcp{,6} whose
/// inode is one of the process's descriptors (what `ss -tnp` shows).
pub fn connections(pid: u32, port: u16, local: bool) -> usize {
    let mut inodes = std::collections::BTreeSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).into_iter().flatten().flatten() {
        let target =
            std::fs::read_link(fd.path()).map(|t| t.to_string_lossy().into_owned()).unwrap_or_default();
        if let Some(inode) = target.strip_prefix("socket:[").and_then(|t| t.strip_suffix(']')) {
            inodes.insert(inode.to_owned());
        }
    }
    let mut count = 0;
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let side = if local { cols.get(1) } else { cols.get(2) };
            let at = side.and_then(|a| a.rsplit(':').next()).and_then(|p| u16::from_str_radix(p, 16).ok());
            if at == Some(port)
                && cols.get(3) == Some(&"01")
                && cols.get(9).is_some_and(|i| inodes.contains(*i))
            {
                count += 1;
            }
        }
    }
    count
}

/// `fleet rollout start --fleet --waves 1,10%,100% --soak 0` of `candidate`, its stderr in
/// `work/driver.log`, and its stdout's lines each stamped as it came (a wave's opening is timed
/// from its line).
pub fn start_rollout(
    binary: &Path,
    work: &Path,
    endpoints: &str,
    candidate: &Path,
    deadline: &str,
) -> (Child, mpsc::Receiver<(Instant, String)>) {
    let mut child = Command::new(binary)
        .arg("--state")
        .arg(work.join("cli/state.json"))
        .args(["fleet", "rollout", "start", "--etcd", endpoints, "--fleet"])
        .args(["--waves", "1,10%,100%", "--soak", "0", "--deadline", deadline])
        .arg(candidate)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(work.join("driver.log")).unwrap())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel::<(Instant, String)>();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if tx.send((Instant::now(), line)).is_err() {
                return;
            }
        }
    });
    (child, lines)
}

/// Each wave's opening as the driver said it ("wave K of N open at revision R: a, b, c"): when
/// the line came, and the revision of the state's write.
pub fn wave_opens(said: &[(std::time::Instant, String)]) -> Vec<(std::time::Instant, i64)> {
    said.iter()
        .filter_map(|(at, line)| {
            let (_, rest) = line.strip_prefix("wave ")?.split_once(" open at revision ")?;
            Some((*at, rest.split(':').next()?.parse().ok()?))
        })
        .collect()
}

/// The counters of etcd's `/metrics` (Prometheus text) at `url`, summed over their labels by
/// name, except `grpc_server_started_total`, kept by `grpc_method`. Empty when it does not answer.
pub fn etcd_metrics(url: &str) -> std::collections::BTreeMap<String, f64> {
    use std::io::{Read as _, Write as _};
    let mut out = std::collections::BTreeMap::new();
    let Some(host) = url.strip_prefix("http://") else { return out };
    let Ok(mut stream) = std::net::TcpStream::connect(host) else { return out };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(stream, "GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n");
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        let (metric, labels) = name.split_once('{').unwrap_or((name, ""));
        let key = match labels.split(',').find_map(|l| l.strip_prefix("grpc_method=\"")) {
            Some(method) if metric == "grpc_server_started_total" => {
                method.trim_end_matches(['"', '}']).to_owned()
            }
            _ => metric.to_owned(),
        };
        *out.entry(key).or_insert(0.0) += value;
    }
    out
}
