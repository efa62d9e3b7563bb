//! Declarations through etcd (issue 14), against real etcd on loopback: the testbed's member
//! (tests/testbed/50-etcd.sh) for `fleet put` and `fleet diff`, and a member of the test's own,
//! started from the same binary, where the test must stop etcd under a running node; the
//! testbed's TLS member (tests/testbed/51-etcd-tls.sh) and its certificates for TLS; and two
//! network namespaces of one test's own, joined by a veth pair it cuts, for a real partition.
//!
//! Every test uses names of its own (`fleet-it-...`), so tests running at once never read each
//! other's keys.
//!
//! One file per subject: `put` (`fleet put` and `fleet diff`), `node` (a node following etcd,
//! its cache, its status), `auth` (etcd's auth, one scenario over plain and TLS), `tls` (TLS
//! alone), `outage` (members killed, cut off, a network split), `generations` (a rollback on a
//! node fed by etcd) and `confirm` (a new generation confirmed, or gone back from). Here: what
//! they share.

mod access;
mod auth;
mod confirm;
mod generations;
mod hollow;
mod node;
mod outage;
mod policy;
mod put;
mod rollout;
mod signed;
mod tls;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::json;

use crate::support::*;

/// The testbed's member (50-etcd.sh).
const TESTBED_ETCD: &str = "http://127.0.0.1:23790";

fn need_etcd_binaries() {
    for tool in ["etcd", "etcdctl"] {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().unwrap();
        assert!(
            found.status.success(),
            "{tool} is missing: the fleet tests need Debian's etcd-server and etcd-client; run tests/testbed/up.sh (50-etcd.sh)"
        );
    }
}

fn need_testbed_etcd() -> &'static str {
    need_etcd_binaries();
    // A generous timeout: under a loaded machine etcd's fsync can take seconds, and the
    // check is for its presence, not its speed.
    let health = etcdctl(TESTBED_ETCD, &["endpoint", "health", "--command-timeout", "15s"]);
    assert!(
        health.status.success(),
        "no etcd answers on {TESTBED_ETCD}: run tests/testbed/up.sh (50-etcd.sh starts it): {}",
        String::from_utf8_lossy(&health.stderr)
    );
    TESTBED_ETCD
}

/// A password file `name` in the scratch directory holding `pw`; its path, for a flag.
fn password_file(s: &Scratch, name: &str, pw: &str) -> String {
    let p = s.path(name);
    std::fs::write(&p, format!("{pw}\n")).unwrap();
    p.display().to_string()
}

fn etcdctl(endpoints: &str, args: &[&str]) -> Output {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoints])
        .args(args)
        .output()
        .unwrap()
}

/// The version of `key` (how many times it was written since it was made); 0 when absent. A
/// barrier finer than a status's `written_at`, which counts in whole seconds.
fn version_of(url: &str, key: &str) -> i64 {
    let out = etcdctl(url, &["get", key, "-w", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["kvs"][0]["version"].as_i64().unwrap_or(0)
}

/// The newest revision etcd has: every change made so far is at or below it.
fn revision_now(url: &str) -> i64 {
    let out = etcdctl(url, &["get", "/", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["header"]["revision"].as_i64().unwrap()
}

/// The seconds left on the lease `key` is bound to, and the lease, as etcd says them.
fn lease_left(url: &str, key: &str) -> Option<(i64, i64)> {
    let out = etcdctl(url, &["get", key, "-w", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let lease = v["kvs"][0]["lease"].as_i64().filter(|l| *l != 0)?;
    let out = etcdctl(url, &["lease", "timetolive", &format!("{lease:x}"), "-w", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some((lease, v["ttl"].as_i64()?))
}

/// Waits until the lease that `key` (a node's presence) is bound to has been renewed: the
/// seconds etcd says it has left went up since the lowest seen, or the key moved to another
/// lease. The barrier for "past a lease renewal", instead of a sleep of its period.
fn lease_renewed(url: &str, key: &str, within: Duration) -> bool {
    let Some((first, mut lowest)) = lease_left(url, key) else { return false };
    wait_for(within, || match lease_left(url, key) {
        Some((lease, left)) if lease == first => {
            let renewed = left > lowest;
            lowest = lowest.min(left);
            renewed
        }
        Some(_) => true,
        None => false,
    })
}

/// The keys under a prefix, as etcdctl prints them (key and value lines).
fn keys_under(endpoints: &str, prefix: &str) -> Vec<String> {
    let out = etcdctl(endpoints, &["get", "--prefix", "--keys-only", prefix]);
    assert!(out.status.success(), "etcdctl get: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().filter(|l| !l.is_empty()).map(str::to_owned).collect()
}

/// A name no other test, nor an earlier run of this one, uses.
fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("fleet-it-{what}-{}-{nanos}", std::process::id())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// An etcd member of the test's own, on free loopback ports, its data in the scratch directory;
/// killed when dropped. Stopped and started again on the same data, it is the same cluster.
struct OwnEtcd {
    child: Option<std::process::Child>,
    client: u16,
    peer: u16,
    data: PathBuf,
    log: PathBuf,
    /// TLS only, every client asked for a certificate signed by the testbed's CA.
    tls: bool,
    /// More of etcd's flags (`--auth-token-ttl`).
    extra: Vec<String>,
}

impl OwnEtcd {
    fn start(s: &Scratch) -> OwnEtcd {
        OwnEtcd::start_with(s, false, &[])
    }

    /// A member speaking TLS or not, with more of etcd's flags.
    fn start_with(s: &Scratch, tls: bool, extra: &[&str]) -> OwnEtcd {
        need_etcd_binaries();
        let mut e = OwnEtcd {
            child: None,
            client: free_port(),
            peer: free_port(),
            data: s.path("etcd-data"),
            log: s.path("etcd.log"),
            tls,
            extra: extra.iter().map(|a| a.to_string()).collect(),
        };
        e.resume();
        e
    }

    fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", if self.tls { "https" } else { "http" }, self.client)
    }

    fn resume(&mut self) {
        let (client, peer) = (self.url(), format!("http://127.0.0.1:{}", self.peer));
        let mut cmd = Command::new("etcd");
        cmd.args(["--name", "fleet-it", "--data-dir"])
            .arg(&self.data)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("fleet-it={peer}")])
            .args(&self.extra);
        if self.tls {
            cmd.args(["--cert-file", &tls_file("server.pem"), "--key-file", &tls_file("server.key")]).args([
                "--trusted-ca-file",
                &tls_file("ca.pem"),
                "--client-cert-auth",
            ]);
        }
        let child = cmd
            .stdout(std::fs::File::options().create(true).append(true).open(&self.log).unwrap())
            .stderr(std::fs::File::options().create(true).append(true).open(&self.log).unwrap())
            .spawn()
            .expect("etcd starts");
        self.child = Some(child);
        let url = self.url();
        let tls = self.tls;
        let healthy = || {
            let out = if tls {
                etcdctl_tls(&url, "operator", &["endpoint", "health"])
            } else {
                etcdctl(&url, &["endpoint", "health"])
            };
            out.status.success()
        };
        assert!(
            wait_for(PATIENCE, healthy),
            "the test's etcd did not come up:\n{}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for OwnEtcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Writes a declaration file of these resources at `path`.
fn write_declaration(path: &Path, resources: serde_json::Value) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, serde_json::to_vec_pretty(&json!({"version": 1, "resources": resources})).unwrap())
        .unwrap();
}

fn fleet(s: &Scratch, args: &[&str]) -> Output {
    s.run(&[&["fleet"], args].concat())
}

/// `mesh-host run --etcd ... --node ...` on the scratch state, waiting until /healthz answers.
fn node(s: &Scratch, endpoints: &str, node: &str, groups: &[&str]) -> Daemon {
    node_with(s, endpoints, node, groups, &[])
}

/// `node`, with more arguments to `run` (TLS, a login).
fn node_with(s: &Scratch, endpoints: &str, node: &str, groups: &[&str], more: &[&str]) -> Daemon {
    node_with_env(s, endpoints, node, groups, more, &[])
}

/// `node_with`, with more environment (a failpoint).
fn node_with_env(
    s: &Scratch,
    endpoints: &str,
    node: &str,
    groups: &[&str],
    more: &[&str],
    env: &[(&str, &str)],
) -> Daemon {
    let port = free_port();
    let log = s.path(&format!("node-{port}.log"));
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("mesh-host"));
    cmd.arg("--state").arg(s.state()).args(["run", "--etcd", endpoints, "--node", node]);
    for g in groups {
        cmd.args(["--group", g]);
    }
    cmd.args(more);
    let child = cmd
        .args(["--metrics", &format!("127.0.0.1:{port}"), "--settle-ms", "20"])
        .env("MESH_HOST_LOG", "info")
        .envs(env.iter().copied())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::options().append(true).open(&log).unwrap())
        .spawn()
        .expect("mesh-host starts");
    let d = Daemon { child: Some(child), port, log };
    assert!(
        wait_for(PATIENCE, || d.answer("/healthz").is_some()),
        "the node never answered /healthz:\n{}",
        d.log()
    );
    d
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The testbed's TLS member and its certificates (tests/testbed/51-etcd-tls.sh).
const TLS_ETCD: &str = "https://127.0.0.1:23791";
const TLS_DIR: &str = "/var/lib/mesh-host-testbed/etcd-tls";

/// A file of the testbed's TLS set, there or the test fails saying how to make it.
fn tls_file(name: &str) -> String {
    let path = format!("{TLS_DIR}/{name}");
    assert!(
        Path::new(&path).exists(),
        "{path} is missing: the TLS tests need the testbed's certificates; run tests/testbed/up.sh (51-etcd-tls.sh)"
    );
    path
}

/// mesh-host's TLS options for one of the testbed's client certificates (`node-a`, `operator`,
/// `node-a-cn` whose CN is node-a...).
fn tls_args(who: &str) -> Vec<String> {
    ["--etcd-ca", &tls_file("ca.pem"), "--etcd-cert", &tls_file(&format!("{who}.pem"))]
        .into_iter()
        .map(str::to_owned)
        .chain(["--etcd-key".to_owned(), tls_file(&format!("{who}.key"))])
        .collect()
}

/// etcdctl over TLS with one of the testbed's client certificates.
fn etcdctl_tls(endpoints: &str, who: &str, args: &[&str]) -> Output {
    let (ca, cert, key) =
        (tls_file("ca.pem"), tls_file(&format!("{who}.pem")), tls_file(&format!("{who}.key")));
    etcdctl(endpoints, &[&["--cacert", &ca, "--cert", &cert, "--key", &key], args].concat())
}

fn need_tls_etcd() -> &'static str {
    need_etcd_binaries();
    let health = etcdctl_tls(TLS_ETCD, "operator", &["endpoint", "health", "--command-timeout", "15s"]);
    assert!(
        health.status.success(),
        "no etcd answers over TLS on {TLS_ETCD}: run tests/testbed/up.sh (51-etcd-tls.sh starts it): {}",
        String::from_utf8_lossy(&health.stderr)
    );
    TLS_ETCD
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

impl OwnEtcd {
    /// A member of the test's own that speaks only TLS and asks every client for a certificate
    /// signed by the testbed's CA: for etcd's auth, which the test turns on.
    fn start_tls(s: &Scratch) -> OwnEtcd {
        OwnEtcd::start_with(s, true, &[])
    }
}

/// The TCP connections process `pid` holds established to `port` on loopback, from the kernel's
/// own tables (/proc/PID/net/tcp and tcp6, the sockets matched to the process's descriptors by
/// inode): what `ss -tnp` shows, without parsing its columns.
fn connections_to(pid: u32, port: u16) -> usize {
    let mut inodes = std::collections::BTreeSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        let Ok(target) = std::fs::read_link(fd.path()) else { continue };
        let target = target.to_string_lossy().into_owned();
        if let Some(inode) = target.strip_prefix("socket:[").and_then(|t| t.strip_suffix(']')) {
            inodes.insert(inode.to_owned());
        }
    }
    let mut count = 0;
    for table in ["tcp", "tcp6"] {
        let text = read(Path::new(&format!("/proc/{pid}/net/{table}")));
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // local, remote (ADDR:PORT in hex), state (01: established), ..., inode (column 9).
            let remote_port =
                cols.get(2).and_then(|r| r.rsplit(':').next()).and_then(|p| u16::from_str_radix(p, 16).ok());
            if remote_port == Some(port)
                && cols.get(3) == Some(&"01")
                && cols.get(9).is_some_and(|i| inodes.contains(*i))
            {
                count += 1;
            }
        }
    }
    count
}

/// What `ss -tnp` says of `pid`'s connections, for a failure's message.
fn ss_of(pid: u32) -> String {
    let out =
        Command::new("ss").args(["-tnp"]).output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    out.unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&format!("pid={pid},")))
        .collect::<Vec<_>>()
        .join("\n")
}
