//! Declarations through etcd (issue 14), against real etcd on loopback: the testbed's member
//! (tests/testbed/50-etcd.sh) for `fleet put` and `fleet diff`, and a member of the test's own,
//! started from the same binary, where the test must stop etcd under a running node; the
//! testbed's TLS member (tests/testbed/51-etcd-tls.sh) and its certificates for TLS; and two
//! network namespaces of one test's own, joined by a veth pair it cuts, for a real partition.
//!
//! Every test uses names of its own (`fleet-it-...`), so tests running at once never read each
//! other's keys.

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
    let health = etcdctl(TESTBED_ETCD, &["endpoint", "health"]);
    assert!(
        health.status.success(),
        "no etcd answers on {TESTBED_ETCD}: run tests/testbed/up.sh (50-etcd.sh starts it): {}",
        String::from_utf8_lossy(&health.stderr)
    );
    TESTBED_ETCD
}

fn etcdctl(endpoints: &str, args: &[&str]) -> Output {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoints])
        .args(args)
        .output()
        .unwrap()
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
}

impl OwnEtcd {
    fn start(s: &Scratch) -> OwnEtcd {
        need_etcd_binaries();
        let mut e = OwnEtcd {
            child: None,
            client: free_port(),
            peer: free_port(),
            data: s.path("etcd-data"),
            log: s.path("etcd.log"),
        };
        e.resume();
        e
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client)
    }

    fn resume(&mut self) {
        let (client, peer) =
            (format!("http://127.0.0.1:{}", self.client), format!("http://127.0.0.1:{}", self.peer));
        let child = Command::new("etcd")
            .args(["--name", "fleet-it", "--data-dir"])
            .arg(&self.data)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("fleet-it={peer}")])
            .stdout(std::fs::File::options().create(true).append(true).open(&self.log).unwrap())
            .stderr(std::fs::File::options().create(true).append(true).open(&self.log).unwrap())
            .spawn()
            .expect("etcd starts");
        self.child = Some(child);
        let url = self.url();
        assert!(
            wait_for(PATIENCE, || etcdctl(&url, &["endpoint", "health"]).status.success()),
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

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn fleet_put_refuses_a_declaration_mesh_host_would_refuse_and_writes_nothing() {
    let etcd = need_testbed_etcd();
    let s = Scratch::new();
    let group = unique("refused");
    let bad = s.path("bad/web.json");
    write_declaration(
        &bad,
        json!([{"type": "file", "id": "web.conf", "path": "relative/path", "content": "x"}]),
    );
    let out = fleet(&s, &["put", "--etcd", etcd, "--group", &group, bad.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a refusal exits 2: {stderr}");
    // The problem is named under the key it would have had, with the resource and the field.
    assert!(stderr.contains(&format!("/mesh-host/group/{group}/declaration/web.json")), "{stderr}");
    assert!(stderr.contains("web.conf") && stderr.contains("path"), "{stderr}");
    assert_eq!(
        keys_under(etcd, &format!("/mesh-host/group/{group}/")),
        Vec::<String>::new(),
        "nothing reached etcd"
    );

    // A name that would reach other keys is refused before etcd is asked anything.
    let good = s.path("good/web.json");
    write_declaration(&good, json!([]));
    let out = fleet(&s, &["put", "--etcd", etcd, "--node", "a/../b", good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--node \"a/../b\""));
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn fleet_put_makes_a_scope_hold_exactly_a_directory_in_one_transaction_and_diff_says_what_would_change() {
    let etcd = need_testbed_etcd();
    let s = Scratch::new();
    let group = unique("put");
    let prefix = format!("/mesh-host/group/{group}/declaration/");
    let dir = s.path("decl");
    write_declaration(
        &dir.join("10-a.json"),
        json!([{"type": "file", "id": "a.one", "path": s.p("one"), "content": "1"}]),
    );
    write_declaration(
        &dir.join("20-b.json"),
        json!([{"type": "file", "id": "b.two", "path": s.p("two"), "content": "2"}]),
    );
    let dir_arg = dir.to_str().unwrap();
    let out = fleet(&s, &["put", "--etcd", etcd, "--group", &group, dir_arg]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 added, 0 changed, 0 removed"), "{out:?}");
    assert_eq!(keys_under(etcd, &prefix), [format!("{prefix}10-a.json"), format!("{prefix}20-b.json")]);
    // One transaction: both keys carry the same revision.
    let json_out = etcdctl(etcd, &["get", "--prefix", &prefix, "-w", "json"]);
    let got: serde_json::Value = serde_json::from_slice(&json_out.stdout).unwrap();
    let revisions: Vec<i64> =
        got["kvs"].as_array().unwrap().iter().map(|kv| kv["mod_revision"].as_i64().unwrap()).collect();
    assert_eq!(revisions.len(), 2);
    assert_eq!(revisions[0], revisions[1], "written in one transaction: {got}");

    // b changes, a goes: diff says so and writes nothing.
    std::fs::remove_file(dir.join("10-a.json")).unwrap();
    write_declaration(
        &dir.join("20-b.json"),
        json!([{"type": "file", "id": "b.two", "path": s.p("two"), "content": "two"}]),
    );
    let out = fleet(&s, &["diff", "--etcd", etcd, "--group", &group, dir_arg]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(shown.contains(&format!("remove {prefix}10-a.json")), "{shown}");
    assert!(shown.contains(&format!("change {prefix}20-b.json")), "{shown}");
    assert!(shown.contains("+") && shown.contains("\"two\""), "a diff of the changed key: {shown}");
    assert!(shown.contains("nothing was written"), "{shown}");
    assert_eq!(keys_under(etcd, &prefix).len(), 2, "diff wrote nothing");

    let out = fleet(&s, &["put", "--etcd", etcd, "--group", &group, dir_arg]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("0 added, 1 changed, 1 removed"), "{out:?}");
    assert_eq!(keys_under(etcd, &prefix), [format!("{prefix}20-b.json")]);
    let out = fleet(&s, &["put", "--etcd", etcd, "--group", &group, dir_arg]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing was written"), "{out:?}");
    etcdctl(etcd, &["del", "--prefix", &format!("/mesh-host/group/{group}/")]);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_node_applies_the_fleet_its_groups_and_its_own_keys_follows_changes_and_keeps_its_declaration_on_a_refusal(
) {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let put = |scope: &[&str], file: &Path| {
        let out = fleet(&s, &[&["put", "--etcd", &url], scope, &[file.to_str().unwrap()]].concat());
        assert!(out.status.success(), "fleet put: {}", String::from_utf8_lossy(&out.stderr));
    };
    write_declaration(
        &s.path("in/fleet.json"),
        json!([{"type": "directory", "id": "base.dir", "path": s.p("out"), "mode": "0755"}]),
    );
    write_declaration(
        &s.path("in/eu.json"),
        json!([{"type": "file", "id": "eu.motd", "path": s.p("out/motd"), "content": "eu\n"}]),
    );
    write_declaration(
        &s.path("in/node.json"),
        json!([{"type": "file", "id": "web.conf", "path": s.p("out/web.conf"), "content": "port=80\n"}]),
    );
    put(&["--fleet"], &s.path("in/fleet.json"));
    put(&["--group", "eu"], &s.path("in/eu.json"));
    put(&["--node", "web-1"], &s.path("in/node.json"));
    // A key of another node and of a group this node is not in: never read by it.
    write_declaration(
        &s.path("in/other.json"),
        json!([{"type": "file", "id": "other.x", "path": s.p("out/other"), "content": "no\n"}]),
    );
    put(&["--node", "web-2"], &s.path("in/other.json"));
    put(&["--group", "us"], &s.path("in/other.json"));

    let mut daemon = node(&s, &url, "web-1", &["eu"]);
    let conf = s.path("out/web.conf");
    assert!(
        wait_for(PATIENCE, || read(&conf) == "port=80\n"),
        "the node's own key applied:\n{}",
        daemon.log()
    );
    assert_eq!(read(&s.path("out/motd")), "eu\n", "its group's key applied");
    assert!(!s.path("out/other").exists(), "another node's and another group's keys are not read");
    assert!(
        !daemon.log().contains("no declaration is in force"),
        "a fresh node's first apply waits for its first read of etcd:\n{}",
        daemon.log()
    );

    // A put that would make the node's whole declaration refused (an id its fleet declares, or
    // a group declaring the id of the node's own file) is refused before it reaches etcd,
    // naming the node.
    write_declaration(
        &s.path("in/clash.json"),
        json!([{"type": "directory", "id": "base.dir", "path": s.p("elsewhere")}]),
    );
    let out = fleet(&s, &["put", "--etcd", &url, "--node", "web-1", s.p("in/clash.json").as_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("node web-1")
            && stderr.contains("base.dir")
            && stderr.contains("nothing was written"),
        "{stderr}"
    );
    assert!(
        wait_for(PATIENCE, || !etcdctl(&url, &["get", "/mesh-host/node/web-1/status"]).stdout.is_empty()),
        "web-1 reported its groups"
    );
    write_declaration(
        &s.path("in/clash.json"),
        json!([{"type": "file", "id": "web.conf", "path": s.p("out/other-conf"), "content": "x"}]),
    );
    let out = fleet(&s, &["put", "--etcd", &url, "--group", "eu", s.p("in/clash.json").as_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("node web-1") && stderr.contains("web.conf"), "{stderr}");
    assert_eq!(
        keys_under(&url, "/mesh-host/group/eu/"),
        ["/mesh-host/group/eu/declaration/eu.json"],
        "nothing written"
    );

    // A change under the node's prefix is seen through the watch.
    write_declaration(
        &s.path("in/node.json"),
        json!([{"type": "file", "id": "web.conf", "path": s.p("out/web.conf"), "content": "port=8080\n"}]),
    );
    put(&["--node", "web-1"], &s.path("in/node.json"));
    assert!(wait_for(PATIENCE, || read(&conf) == "port=8080\n"), "the change applied:\n{}", daemon.log());

    // An invalid declaration written straight into etcd (fleet put would refuse it) is refused by
    // the node: the one in force stays, and hand-edits are still put back from it.
    let bad = r#"{"version": 1, "resources": [{"type": "file", "id": "web.conf", "path": "relative"}]}"#;
    let out = etcdctl(&url, &["put", "/mesh-host/node/web-1/declaration/node.json", bad]);
    assert!(out.status.success());
    assert!(
        wait_for(PATIENCE, || daemon.log().contains("is refused: ")
            && daemon.log().contains("the declaration last accepted from etcd stays in force")),
        "the refusal is reported:\n{}",
        daemon.log()
    );
    // Counted as a local refusal is, and carried in the node's status in etcd, which `fleet
    // status` shows as the node's last error.
    assert_eq!(daemon.metric("mesh_host_declaration_refusals_total"), 1.0, "{}", daemon.log());
    let refused_in_status = || {
        let (_, status) = fleet_status(&s, &url);
        let said = row(&status, "web-1")["status"]["refused"].as_str().unwrap_or_default().to_owned();
        said.contains("is refused") && said.contains("web.conf")
    };
    assert!(wait_for(PATIENCE, refused_in_status), "{:#}", fleet_status(&s, &url).1);
    let table = String::from_utf8_lossy(&fleet(&s, &["status", "--etcd", &url]).stdout).into_owned();
    assert!(table.contains("is refused"), "the table's last error: {table}");
    std::fs::write(&conf, "hand-edit\n").unwrap();
    assert!(
        wait_for(PATIENCE, || read(&conf) == "port=8080\n"),
        "the declaration in force stays:\n{}",
        daemon.log()
    );
    // Fixed again: applied.
    write_declaration(
        &s.path("in/node.json"),
        json!([{"type": "file", "id": "web.conf", "path": s.p("out/web.conf"), "content": "port=9090\n"}]),
    );
    put(&["--node", "web-1"], &s.path("in/node.json"));
    assert!(
        wait_for(PATIENCE, || read(&conf) == "port=9090\n"),
        "a good declaration after a bad one:\n{}",
        daemon.log()
    );
    let status_of = || row(&fleet_status(&s, &url).1, "web-1")["status"].clone();
    assert!(
        wait_for(PATIENCE, || {
            let st = status_of();
            st["refused"].is_null() && st["converged"] == true && st["last_error"].is_null()
        }),
        "the refusal is gone from the status once a declaration is accepted: {:#}",
        status_of()
    );

    // A resource that fails: the node is not converged, and its status says what failed, until
    // it is fixed.
    write_declaration(
        &s.path("in/node.json"),
        json!([
            {"type": "file", "id": "web.conf", "path": s.p("out/web.conf"), "content": "port=9090\n"},
            {"type": "file", "id": "web.inner", "path": s.p("out/web.conf/inner"), "content": "x\n"},
        ]),
    );
    put(&["--node", "web-1"], &s.path("in/node.json"));
    assert!(
        wait_for(PATIENCE, || {
            let st = status_of();
            st["converged"] == false && st["last_error"].as_str().is_some_and(|e| e.contains("web.inner"))
        }),
        "a failure reaches the status: {:#}\n{}",
        status_of(),
        daemon.log()
    );
    write_declaration(
        &s.path("in/node.json"),
        json!([{"type": "file", "id": "web.conf", "path": s.p("out/web.conf"), "content": "port=9090\n"}]),
    );
    put(&["--node", "web-1"], &s.path("in/node.json"));
    assert!(
        wait_for(PATIENCE, || {
            let st = status_of();
            st["converged"] == true && st["last_error"].is_null()
        }),
        "converged again: {:#}",
        status_of()
    );
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_node_cut_off_from_etcd_keeps_its_last_declaration_across_a_restart_and_applies_what_changed_meanwhile() {
    let s = Scratch::new();
    let mut etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let put = |file: &Path| {
        let out = fleet(&s, &["put", "--etcd", &url, "--node", "db-1", file.to_str().unwrap()]);
        assert!(out.status.success(), "fleet put: {}", String::from_utf8_lossy(&out.stderr));
    };
    let conf = s.path("db.conf");
    let declare = |content: &str| {
        write_declaration(
            &s.path("in/db.json"),
            json!([{"type": "file", "id": "db.conf", "path": s.p("db.conf"), "content": content}]),
        );
        put(&s.path("in/db.json"));
    };
    declare("v1\n");
    let mut daemon = node(&s, &url, "db-1", &[]);
    assert!(wait_for(PATIENCE, || read(&conf) == "v1\n"), "{}", daemon.log());
    // Whether etcd answers is a gauge, as a watcher's connection is.
    let etcd_up = |daemon: &Daemon, up: &str| {
        daemon.get("/metrics").is_some_and(|m| m.lines().any(|l| l == format!("mesh_host_etcd_up {up}")))
    };
    assert!(etcd_up(&daemon, "1"), "{}", daemon.get("/metrics").unwrap_or_default());

    // etcd goes away: the node goes on converging on what it holds.
    etcd.stop();
    std::fs::write(&conf, "hand-edit\n").unwrap();
    assert!(
        wait_for(PATIENCE, || read(&conf) == "v1\n"),
        "still converging while cut off:\n{}",
        daemon.log()
    );
    assert!(wait_for(PATIENCE, || etcd_up(&daemon, "0")), "etcd is seen down:\n{}", daemon.log());

    // A restart while etcd is down applies the last declaration accepted, from the cache.
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
    std::fs::remove_file(&conf).unwrap();
    let mut daemon = node(&s, &url, "db-1", &[]);
    assert!(
        wait_for(PATIENCE, || read(&conf) == "v1\n"),
        "a node started while etcd is down applies its last known declaration:\n{}",
        daemon.log()
    );
    assert!(daemon.log().contains("cannot read the declaration from etcd"), "{}", daemon.log());

    // etcd returns and the declaration changes before the node, waiting out its backoff, has
    // read again: applied once it reconnects. (With one member, nothing can be written while
    // etcd is down: the frozen-member and cut-network tests change it while the node is away.)
    etcd.resume();
    declare("v2\n");
    assert!(
        wait_for(Duration::from_secs(45), || read(&conf) == "v2\n"),
        "a declaration changed while the node was cut off is applied when etcd returns:\n{}",
        daemon.log()
    );
    assert!(wait_for(PATIENCE, || etcd_up(&daemon, "1")), "etcd is seen up again:\n{}", daemon.log());
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
}

/// Every file under `dir`, read whole (etcd's data: its bolt database and write-ahead log).
fn bytes_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if let Ok(bytes) = std::fs::read(&p) {
                out.push((p, bytes));
            }
        }
    }
    out
}

fn holds(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_sealed_value_goes_through_etcd_and_neither_etcd_nor_the_cache_holds_it_in_the_clear() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let public = crate::secrets::keygen(&s);
    let plain = format!("fleet-pw-{}", std::process::id());
    let sealed = crate::secrets::seal(&public, plain.as_bytes());
    let env = s.path("db.env");
    write_declaration(
        &s.path("in/db.json"),
        json!([{"type": "file", "id": "db.env", "path": s.p("db.env"),
                "content": "PASSWORD=${secret:db_password}\n", "secrets": {"db_password": sealed}}]),
    );
    let out = fleet(&s, &["put", "--etcd", &url, "--node", "sealed-1", s.p("in/db.json").as_str()]);
    assert!(out.status.success(), "fleet put: {}", String::from_utf8_lossy(&out.stderr));
    let mut daemon = node(&s, &url, "sealed-1", &[]);
    assert!(
        wait_for(PATIENCE, || read(&env) == format!("PASSWORD={plain}\n")),
        "the node opened the value it got through etcd:\n{}",
        daemon.log()
    );
    assert_eq!(daemon.terminate(), Some(0));

    // What etcd serves, what it keeps on disk, what the node cached and logged: no plaintext.
    let served = etcdctl(&url, &["get", "--prefix", "/mesh-host/"]);
    assert!(served.status.success());
    assert!(holds(&served.stdout, b"BEGIN AGE ENCRYPTED FILE"), "etcd holds the sealed value");
    assert!(!holds(&served.stdout, plain.as_bytes()), "etcd serves the value in the clear");
    for (path, bytes) in
        bytes_under(&s.path("etcd-data")).into_iter().chain(bytes_under(&s.path("state/fleet")))
    {
        assert!(!holds(&bytes, plain.as_bytes()), "{} holds the value in the clear", path.display());
    }
    assert!(!daemon.log().contains(&plain), "the node's log holds the value");
}

/// `fleet status --json`: the exit code and the rows.
/// etcd compacts away the revision a node would watch from (the node is held 3 s between its
/// read and its watch by the failpoint `etcd-watch-late`; meanwhile two changes are written and
/// etcd compacted to its latest revision): the watch is refused as compacted, the node reads the
/// whole declaration again, and applies the latest. Nothing is missed.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_revision_compacted_away_before_the_watch_starts_leads_to_a_whole_read() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let conf = s.path("compact.conf");
    let declare = |content: &str| {
        write_declaration(
            &s.path("in/compact.json"),
            json!([{"type": "file", "id": "compact.conf", "path": s.p("compact.conf"), "content": content}]),
        );
        let out = fleet(&s, &["put", "--etcd", &url, "--node", "compact-1", s.p("in/compact.json").as_str()]);
        assert!(out.status.success(), "fleet put: {}", String::from_utf8_lossy(&out.stderr));
    };
    declare("v1\n");
    let mut daemon =
        node_with_env(&s, &url, "compact-1", &[], &[], &[("MESH_HOST_FAILPOINT", "etcd-watch-late")]);
    assert!(wait_for(PATIENCE, || read(&conf) == "v1\n"), "{}", daemon.log());
    // Within the node's 3 s between its read and its watch.
    declare("v2\n");
    declare("v3\n");
    let got = etcdctl(&url, &["get", "/mesh-host/", "--prefix", "--keys-only", "-w", "json"]);
    let latest = serde_json::from_slice::<serde_json::Value>(&got.stdout).unwrap()["header"]["revision"]
        .as_i64()
        .expect("etcd's revision");
    let out = etcdctl(&url, &["compaction", &latest.to_string()]);
    assert!(out.status.success(), "etcdctl compaction: {}", String::from_utf8_lossy(&out.stderr));
    assert!(
        wait_for(Duration::from_secs(20), || read(&conf) == "v3\n"),
        "the latest declaration applied after the compaction:\n{}",
        daemon.log()
    );
    assert!(
        daemon.log().contains("compacted revision")
            && daemon.log().contains("reading the whole declaration again"),
        "the watch found its revision compacted away and the node read again:\n{}",
        daemon.log()
    );
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
}

fn fleet_status(s: &Scratch, url: &str) -> (i32, serde_json::Value) {
    let out = fleet(s, &["status", "--etcd", url, "--json"]);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("fleet status printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stderr))
    });
    (out.status.code().unwrap_or(-1), v)
}

fn row<'a>(status: &'a serde_json::Value, node: &str) -> &'a serde_json::Value {
    status["nodes"].as_array().unwrap().iter().find(|r| r["node"] == node).unwrap_or(&serde_json::Value::Null)
}

/// The version of a key (how many times it was written since it was made), 0 when absent.
fn version_of(url: &str, key: &str) -> i64 {
    let out = etcdctl(url, &["get", key, "-w", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["kvs"][0]["version"].as_i64().unwrap_or(0)
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_node_reports_its_status_at_most_once_a_second_and_its_presence_goes_with_it() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let conf = s.path("st.conf");
    write_declaration(
        &s.path("in/st.json"),
        json!([{"type": "file", "id": "st.conf", "path": s.p("st.conf"), "content": "a\n"}]),
    );
    let out = fleet(&s, &["put", "--etcd", &url, "--node", "st-1", s.p("in/st.json").as_str()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let daemon = node(&s, &url, "st-1", &[]);
    assert!(wait_for(PATIENCE, || read(&conf) == "a\n"), "{}", daemon.log());

    // Converged at the revision put, alive: fleet status says so, and exits 0.
    assert!(
        wait_for(PATIENCE, || fleet_status(&s, &url).0 == 0),
        "the node never showed current: {:#}\n{}",
        fleet_status(&s, &url).1,
        daemon.log()
    );
    let (_, status) = fleet_status(&s, &url);
    let r = row(&status, "st-1");
    assert_eq!(r["alive"], true, "{r:#}");
    assert_eq!(r["status"]["converged"], true, "{r:#}");
    assert!(r["status"]["revision"].as_i64().unwrap() >= r["latest"].as_i64().unwrap(), "{r:#}");
    assert_eq!(r["status"]["counts"]["created"], 1, "{r:#}");
    let text = fleet(&s, &["status", "--etcd", &url]);
    let table = String::from_utf8_lossy(&text.stdout);
    assert!(table.contains("st-1") && table.contains("1 of 1 nodes alive, converged"), "{table}");

    // A storm of hand-edits: every one put back, the status written at most once a second.
    let key = "/mesh-host/node/st-1/status";
    let before = version_of(&url, key);
    let start = std::time::Instant::now();
    for i in 0..40 {
        std::fs::write(&conf, format!("edit {i}\n")).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(wait_for(PATIENCE, || read(&conf) == "a\n"), "{}", daemon.log());
    std::thread::sleep(Duration::from_millis(1500));
    let writes = version_of(&url, key) - before;
    let seconds = start.elapsed().as_secs_f64();
    assert!(writes >= 1, "the corrections were reported");
    assert!(
        (writes as f64) <= seconds.ceil() + 1.0,
        "{writes} status writes in {seconds:.1} s: more than one a second"
    );
    let (_, status) = fleet_status(&s, &url);
    assert!(row(&status, "st-1")["status"]["drift_corrections"].as_u64().unwrap() >= 1, "{status:#}");

    // Killed without a word: its presence goes within the lease's time to live, and fleet status
    // says so, exiting 1.
    let mut daemon = daemon;
    let mut child = daemon.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        wait_for(Duration::from_secs(16), || !row(&fleet_status(&s, &url).1, "st-1")["alive"]
            .as_bool()
            .unwrap_or(true)),
        "the presence key outlived the node"
    );
    let (code, _) = fleet_status(&s, &url);
    assert_eq!(code, 1, "a node gone is not a fleet converged");
}

/// A three-member etcd cluster of the test's own, on free loopback ports; killed when dropped.
struct Cluster {
    members: Vec<std::process::Child>,
    clients: Vec<String>,
}

impl Cluster {
    fn start(s: &Scratch) -> Cluster {
        need_etcd_binaries();
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let initial: Vec<String> =
            ports.iter().enumerate().map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}")).collect();
        let initial = initial.join(",");
        // One token for the three: it is what makes them one cluster.
        let token = unique("cluster");
        let mut members = Vec::new();
        let mut clients = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let (client, peer) = (format!("http://127.0.0.1:{client}"), format!("http://127.0.0.1:{peer}"));
            let log = s.path(&format!("etcd-m{i}.log"));
            members.push(
                Command::new("etcd")
                    .args(["--name", &format!("m{i}"), "--data-dir"])
                    .arg(s.path(&format!("etcd-m{i}")))
                    .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
                    .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
                    .args(["--initial-cluster", &initial, "--initial-cluster-token", &token])
                    .stdout(std::fs::File::create(&log).unwrap())
                    .stderr(std::fs::File::options().append(true).open(&log).unwrap())
                    .spawn()
                    .expect("etcd starts"),
            );
            clients.push(client);
        }
        let c = Cluster { members, clients };
        let all = c.endpoints();
        assert!(
            wait_for(Duration::from_secs(20), || etcdctl(&all, &["endpoint", "health", "--cluster"])
                .status
                .success()),
            "the test's 3-member cluster did not come up:\n{}",
            std::fs::read_to_string(s.path("etcd-m0.log")).unwrap_or_default()
        );
        c
    }

    fn endpoints(&self) -> String {
        self.clients.join(",")
    }

    /// The index of the member that leads now.
    fn leader(&self) -> usize {
        let out = etcdctl(&self.endpoints(), &["endpoint", "status", "-w", "json"]);
        let statuses: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        statuses
            .as_array()
            .unwrap()
            .iter()
            .position(|st| st["Status"]["leader"] == st["Status"]["header"]["member_id"])
            .expect("a leader")
    }

    /// Kills the member that leads now; returns its index.
    fn kill_leader(&mut self) -> usize {
        let leader = self.leader();
        self.members[leader].kill().unwrap();
        self.members[leader].wait().unwrap();
        leader
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            let _ = m.kill();
            let _ = m.wait();
        }
    }
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_node_goes_on_through_the_leader_of_a_three_member_cluster_killed_and_misses_nothing() {
    let s = Scratch::new();
    let mut cluster = Cluster::start(&s);
    let all = cluster.endpoints();
    let conf = s.path("ha.conf");
    let declare = |content: &str, endpoints: &str| {
        write_declaration(
            &s.path("in/ha.json"),
            json!([{"type": "file", "id": "ha.conf", "path": s.p("ha.conf"), "content": content}]),
        );
        let out = fleet(&s, &["put", "--etcd", endpoints, "--fleet", s.p("in/ha.json").as_str()]);
        assert!(out.status.success(), "fleet put: {}", String::from_utf8_lossy(&out.stderr));
    };
    declare("v1\n", &all);
    // The leader first among the node's endpoints: the one it talks to is the one killed, so
    // its watches break and it must go on through another member.
    let leader = cluster.leader();
    let mut ordered = vec![cluster.clients[leader].clone()];
    ordered.extend(cluster.clients.iter().enumerate().filter(|(i, _)| *i != leader).map(|(_, c)| c.clone()));
    let daemon = node(&s, &ordered.join(","), "ha-1", &[]);
    assert!(wait_for(PATIENCE, || read(&conf) == "v1\n"), "{}", daemon.log());

    assert_eq!(cluster.kill_leader(), leader, "the leader did not move before the kill");
    let survivors: Vec<String> =
        cluster.clients.iter().enumerate().filter(|(i, _)| *i != leader).map(|(_, c)| c.clone()).collect();
    let survivors = survivors.join(",");
    // Every change after the kill is applied, the last one last: nothing missed, nothing stale.
    assert!(
        wait_for(Duration::from_secs(20), || etcdctl(&survivors, &["endpoint", "health"]).status.success()),
        "the cluster did not elect a new leader"
    );
    for v in 2..=5 {
        declare(&format!("v{v}\n"), &survivors);
    }
    assert!(
        wait_for(Duration::from_secs(20), || read(&conf) == "v5\n"),
        "the node follows the cluster after its leader was killed:\n{}",
        daemon.log()
    );
    assert!(
        daemon.log().contains("the watch on etcd ended"),
        "the node's watch was on the member killed:\n{}",
        daemon.log()
    );
    std::fs::write(&conf, "hand-edit\n").unwrap();
    assert!(wait_for(PATIENCE, || read(&conf) == "v5\n"), "{}", daemon.log());
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn with_etcds_auth_on_a_node_reads_only_its_own_groups_and_the_fleets_keys_and_writes_only_its_own_status() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let secret = |name: &str, pw: &str| {
        let p = s.path(name);
        std::fs::write(&p, format!("{pw}\n")).unwrap();
        p.display().to_string()
    };
    let (root_pw, a_pw, b_pw) =
        (secret("root.pw", "root-pw-fleet"), secret("a.pw", "a-pw-fleet"), secret("b.pw", "b-pw-fleet"));
    assert!(etcdctl(&url, &["user", "add", "root:root-pw-fleet"]).status.success());
    assert!(etcdctl(&url, &["auth", "enable"]).status.success());
    let root: [&str; 4] = ["--etcd-user", "root", "--etcd-password-file", &root_pw];

    for (node, pw) in [("auth-a", &a_pw), ("auth-b", &b_pw)] {
        let out = fleet(
            &s,
            &[
                &["grant", "--etcd", &url],
                &root[..],
                &["--node", node, "--group", "g1", "--node-password-file", pw],
            ]
            .concat(),
        );
        assert!(out.status.success(), "fleet grant: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("mesh-host-node-"), "{out:?}");
    }
    let put = |scope: &[&str], name: &str, content: &str| {
        let file = s.path(&format!("in/{name}.json"));
        write_declaration(
            &file,
            json!([{"type": "file", "id": format!("{name}.f"), "path": s.p(name), "content": content}]),
        );
        let out =
            fleet(&s, &[&["put", "--etcd", &url], &root[..], scope, &[file.to_str().unwrap()]].concat());
        assert!(out.status.success(), "fleet put as root: {}", String::from_utf8_lossy(&out.stderr));
    };
    put(&["--fleet"], "all", "fleet\n");
    put(&["--group", "g1"], "g1", "group\n");
    put(&["--node", "auth-a"], "a", "a\n");
    put(&["--node", "auth-b"], "b", "b\n");
    // A group neither node is in.
    put(&["--group", "g2"], "g2", "other group\n");

    // Node A, logged in as itself: its declaration applies and its status is written.
    let port = free_port();
    let log = s.path("node-a.log");
    let child = Command::new(assert_cmd::cargo::cargo_bin("mesh-host"))
        .arg("--state")
        .arg(s.state())
        .args(["run", "--etcd", &url, "--node", "auth-a", "--group", "g1", "--etcd-user", "auth-a"])
        .args(["--etcd-password-file", &a_pw, "--metrics", &format!("127.0.0.1:{port}")])
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::options().append(true).open(&log).unwrap())
        .spawn()
        .unwrap();
    let mut daemon = Daemon { child: Some(child), port, log };
    for (name, content) in [("all", "fleet\n"), ("g1", "group\n"), ("a", "a\n")] {
        assert!(wait_for(PATIENCE, || read(&s.path(name)) == content), "{name} applied:\n{}", daemon.log());
    }
    assert!(!s.path("b").exists(), "B's declaration is not A's");
    assert!(!s.path("g2").exists(), "a group A is not in is not A's");
    let root_login = "root:root-pw-fleet";
    let as_root = |args: &[&str]| etcdctl(&url, &[&["--user", root_login], args].concat());
    assert!(
        wait_for(PATIENCE, || !as_root(&["get", "/mesh-host/node/auth-a/status"]).stdout.is_empty()),
        "node A wrote its status:\n{}",
        daemon.log()
    );
    assert!(!daemon.log().contains("a-pw-fleet"), "the password reached the log");
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());

    // A's login cannot read B's declaration nor write B's status: etcd refuses both.
    let as_a = |args: &[&str]| etcdctl(&url, &[&["--user", "auth-a:a-pw-fleet"], args].concat());
    let denied = |out: &Output| {
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("permission denied")
    };
    assert!(
        denied(&as_a(&["get", "--prefix", "/mesh-host/node/auth-b/declaration/"])),
        "A read B's declaration"
    );
    assert!(denied(&as_a(&["put", "/mesh-host/node/auth-b/status", "{}"])), "A wrote B's status");
    assert!(
        denied(&as_a(&["get", "--prefix", "/mesh-host/group/g2/declaration/"])),
        "A read a group it is not in"
    );
    assert!(
        as_a(&["get", "--prefix", "/mesh-host/group/g1/declaration/"]).status.success(),
        "A reads its own group"
    );
    assert!(
        denied(&as_a(&["put", "/mesh-host/node/auth-a/declaration/x.json", "{}"])),
        "A wrote its own declaration"
    );
    assert!(as_a(&["get", "/mesh-host/node/auth-a/status"]).status.success(), "A reads its own status");

    // mesh-host run as A but named B: it cannot read B's keys, says so, and applies nothing of B's.
    let s2 = Scratch::new();
    let port = free_port();
    let log = s2.path("node-a-as-b.log");
    let child = Command::new(assert_cmd::cargo::cargo_bin("mesh-host"))
        .arg("--state")
        .arg(s2.state())
        .args([
            "run",
            "--etcd",
            &url,
            "--node",
            "auth-b",
            "--etcd-user",
            "auth-a",
            "--etcd-password-file",
            &a_pw,
        ])
        .args(["--metrics", &format!("127.0.0.1:{port}")])
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::options().append(true).open(&log).unwrap())
        .spawn()
        .unwrap();
    let mut impostor = Daemon { child: Some(child), port, log };
    assert!(
        wait_for(PATIENCE, || impostor.log().contains("permission denied")),
        "etcd's refusal is reported:\n{}",
        impostor.log()
    );
    assert!(!s.path("b").exists(), "nothing of B's applied");
    assert_eq!(impostor.terminate(), Some(0), "{}", impostor.log());
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_node_cut_off_from_its_member_keeps_converging_and_applies_what_changed_meanwhile_when_it_returns() {
    let s = Scratch::new();
    let cluster = Cluster::start(&s);
    let conf = s.path("cut.conf");
    let declare = |content: &str, endpoints: &str| {
        write_declaration(
            &s.path("in/cut.json"),
            json!([{"type": "file", "id": "cut.conf", "path": s.p("cut.conf"), "content": content}]),
        );
        let out = fleet(&s, &["put", "--etcd", endpoints, "--node", "cut-1", s.p("in/cut.json").as_str()]);
        assert!(out.status.success(), "fleet put: {}", String::from_utf8_lossy(&out.stderr));
    };
    declare("v1\n", &cluster.endpoints());
    // The node knows only member 0: frozen (SIGSTOP), it is a partition as the node sees one:
    // connections that hang rather than fail.
    let daemon = node(&s, &cluster.clients[0], "cut-1", &[]);
    assert!(wait_for(PATIENCE, || read(&conf) == "v1\n"), "{}", daemon.log());
    let member0 = cluster.members[0].id().to_string();
    assert!(Command::new("kill").args(["-STOP", &member0]).status().unwrap().success());
    let others = cluster.clients[1..].join(",");
    assert!(
        wait_for(Duration::from_secs(20), || etcdctl(&others, &["endpoint", "health"]).status.success()),
        "the other two members went on"
    );
    // Changed while the node is cut off; meanwhile it goes on converging on what it has.
    declare("v2\n", &others);
    std::fs::write(&conf, "hand-edit\n").unwrap();
    assert!(
        wait_for(PATIENCE, || read(&conf) == "v1\n"),
        "still converging while cut off:\n{}",
        daemon.log()
    );
    // That put-back, made after v2 was written, is the barrier: the node ran a reconcile since,
    // and it was still of v1. (No pause-then-look: a node cut off has nothing to wait for.)

    assert!(Command::new("kill").args(["-CONT", &member0]).status().unwrap().success());
    assert!(
        wait_for(Duration::from_secs(30), || read(&conf) == "v2\n"),
        "the change made while the node was cut off is applied when it returns:\n{}",
        daemon.log()
    );
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

/// mesh-host's TLS options for one of the testbed's client certificates (`node-a`, `operator`...).
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
    let health = etcdctl_tls(TLS_ETCD, "operator", &["endpoint", "health"]);
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

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn over_tls_with_client_certificates_a_node_converges_from_etcd_and_reports_its_status() {
    let etcd = need_tls_etcd();
    let s = Scratch::new();
    let name = unique("tls");
    let operator = tls_args("operator");
    let conf = s.path("tls.conf");
    let declare = |content: &str| {
        write_declaration(
            &s.path("in/tls.json"),
            json!([{"type": "file", "id": "tls.conf", "path": s.p("tls.conf"), "content": content}]),
        );
        let out = fleet(
            &s,
            &[
                &["put", "--etcd", etcd],
                &strs(&operator)[..],
                &["--node", &name, s.p("in/tls.json").as_str()],
            ]
            .concat(),
        );
        assert!(out.status.success(), "fleet put over TLS: {}", String::from_utf8_lossy(&out.stderr));
    };
    declare("v1\n");
    let mut daemon = node_with(&s, etcd, &name, &[], &strs(&tls_args("node-a")));
    assert!(wait_for(PATIENCE, || read(&conf) == "v1\n"), "applied over TLS:\n{}", daemon.log());
    // The watch is over TLS too: a change is followed.
    declare("v2\n");
    assert!(wait_for(PATIENCE, || read(&conf) == "v2\n"), "followed over TLS:\n{}", daemon.log());
    let status_key = format!("/mesh-host/node/{name}/status");
    assert!(
        wait_for(PATIENCE, || {
            let out = etcdctl_tls(etcd, "operator", &["get", &status_key, "--print-value-only"]);
            String::from_utf8_lossy(&out.stdout).contains("\"converged\":true")
        }),
        "the status went back over TLS:\n{}",
        daemon.log()
    );
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
    etcdctl_tls(etcd, "operator", &["del", "--prefix", &format!("/mesh-host/node/{name}/")]);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
#[allow(clippy::disallowed_methods, reason = "the test makes a key file others can read")]
fn over_tls_a_wrong_ca_a_missing_client_certificate_and_an_exposed_key_are_refused_saying_why() {
    let etcd = need_tls_etcd();
    let s = Scratch::new();
    let name = unique("tls-refused");
    write_declaration(&s.path("in/x.json"), json!([]));
    let put = |tls: &[&str]| {
        fleet(&s, &[&["put", "--etcd", etcd], tls, &["--node", &name, s.p("in/x.json").as_str()]].concat())
    };
    let (ca, cert, key) = (tls_file("ca.pem"), tls_file("operator.pem"), tls_file("operator.key"));

    // etcd's certificate checked against a CA that did not sign it: refused, naming the endpoint.
    let out = put(&["--etcd-ca", &tls_file("other-ca.pem"), "--etcd-cert", &cert, "--etcd-key", &key]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(etcd) && stderr.contains("invalid peer certificate: UnknownIssuer"), "{stderr}");
    assert!(stderr.contains("--etcd-ca"), "the hint names the option: {stderr}");

    // No client certificate: etcd refuses the connection (under TLS 1.3 just after the
    // handshake, so its alert's words do not always reach the client), and the message says
    // that etcd asked for a certificate and what to give. Several times: it must not depend on
    // which of the two the client saw first.
    for _ in 0..5 {
        let out = put(&["--etcd-ca", &ca]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(etcd), "{stderr}");
        assert!(
            stderr.contains(
                "etcd asked for a client certificate and mesh-host has none: give --etcd-cert and --etcd-key"
            ),
            "{stderr}"
        );
    }

    // An https:// endpoint without a CA: refused before anything is sent (exit 2).
    let out = put(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("need --etcd-ca"), "{stderr}");

    // A key others can read is refused, as the sealing key is.
    let exposed = s.path("exposed.key");
    std::fs::copy(&key, &exposed).unwrap();
    std::fs::set_permissions(&exposed, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let out = put(&["--etcd-ca", &ca, "--etcd-cert", &cert, "--etcd-key", exposed.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("readable by others than its owner (mode 0644)"), "{stderr}");

    assert!(
        etcdctl_tls(etcd, "operator", &["get", "--prefix", &format!("/mesh-host/node/{name}/")])
            .stdout
            .is_empty(),
        "nothing was written"
    );

    // A node with the wrong CA never reads anything, and says why in its log.
    let wrong = ["--etcd-ca", &tls_file("other-ca.pem"), "--etcd-cert", &cert, "--etcd-key", &key];
    let mut daemon = node_with(&s, etcd, &name, &[], &wrong);
    assert!(
        wait_for(PATIENCE, || daemon.log().contains("UnknownIssuer")),
        "the node's log says what TLS said:\n{}",
        daemon.log()
    );
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
}

impl OwnEtcd {
    /// A member of the test's own that speaks only TLS and asks every client for a certificate
    /// signed by the testbed's CA: for etcd's auth, which the test turns on.
    fn start_tls(s: &Scratch) -> OwnEtcd {
        need_etcd_binaries();
        let mut e = OwnEtcd {
            child: None,
            client: free_port(),
            peer: free_port(),
            data: s.path("etcd-data"),
            log: s.path("etcd.log"),
        };
        let (client, peer) =
            (format!("https://127.0.0.1:{}", e.client), format!("http://127.0.0.1:{}", e.peer));
        let child = Command::new("etcd")
            .args(["--name", "fleet-it-tls", "--data-dir"])
            .arg(&e.data)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--cert-file", &tls_file("server.pem"), "--key-file", &tls_file("server.key")])
            .args(["--trusted-ca-file", &tls_file("ca.pem"), "--client-cert-auth"])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("fleet-it-tls={peer}")])
            .stdout(std::fs::File::create(&e.log).unwrap())
            .stderr(std::fs::File::options().append(true).open(&e.log).unwrap())
            .spawn()
            .expect("etcd starts");
        e.child = Some(child);
        assert!(
            wait_for(PATIENCE, || etcdctl_tls(&client, "operator", &["endpoint", "health"]).status.success()),
            "the test's TLS etcd did not come up:\n{}",
            std::fs::read_to_string(&e.log).unwrap_or_default()
        );
        e
    }

    fn tls_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.client)
    }
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn over_tls_with_etcds_auth_node_a_can_neither_read_bs_declaration_nor_write_bs_status() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start_tls(&s);
    let url = etcd.tls_url();
    let secret = |name: &str, pw: &str| {
        let p = s.path(name);
        std::fs::write(&p, format!("{pw}\n")).unwrap();
        p.display().to_string()
    };
    let (root_pw, a_pw, b_pw) =
        (secret("root.pw", "root-pw-tls"), secret("a.pw", "a-pw-tls"), secret("b.pw", "b-pw-tls"));
    let op = |args: &[&str]| etcdctl_tls(&url, "operator", args);
    assert!(op(&["user", "add", "root:root-pw-tls"]).status.success());
    assert!(op(&["auth", "enable"]).status.success());
    let operator = tls_args("operator");
    let root: Vec<&str> =
        [&strs(&operator)[..], &["--etcd-user", "root", "--etcd-password-file", &root_pw]].concat();
    for (node, pw) in [("tls-a", &a_pw), ("tls-b", &b_pw)] {
        let out = fleet(
            &s,
            &[&["grant", "--etcd", &url], &root[..], &["--node", node, "--node-password-file", pw]].concat(),
        );
        assert!(out.status.success(), "fleet grant over TLS: {}", String::from_utf8_lossy(&out.stderr));
    }
    for (node, content) in [("tls-a", "a\n"), ("tls-b", "b\n")] {
        let file = s.path(&format!("in/{node}.json"));
        write_declaration(
            &file,
            json!([{"type": "file", "id": "own", "path": s.p(node), "content": content}]),
        );
        let out = fleet(
            &s,
            &[&["put", "--etcd", &url], &root[..], &["--node", node, file.to_str().unwrap()]].concat(),
        );
        assert!(out.status.success(), "fleet put as root: {}", String::from_utf8_lossy(&out.stderr));
    }

    // Node A: its certificate for the connection, its login for etcd's user.
    let a_tls = tls_args("node-a");
    let a: Vec<&str> = [&strs(&a_tls)[..], &["--etcd-user", "tls-a", "--etcd-password-file", &a_pw]].concat();
    let mut daemon = node_with(&s, &url, "tls-a", &[], &a);
    assert!(wait_for(PATIENCE, || read(&s.path("tls-a")) == "a\n"), "A applied:\n{}", daemon.log());
    let as_root = |args: &[&str]| op(&[&["--user", "root:root-pw-tls"], args].concat());
    assert!(
        wait_for(PATIENCE, || !as_root(&["get", "/mesh-host/node/tls-a/status"]).stdout.is_empty()),
        "A wrote its status over TLS:\n{}",
        daemon.log()
    );
    assert!(!s.path("tls-b").exists(), "B's declaration is not A's");
    assert!(!daemon.log().contains("a-pw-tls"), "the password reached the log");
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());

    // With A's certificate and login, etcd refuses B's declaration and B's status.
    let as_a = |args: &[&str]| etcdctl_tls(&url, "node-a", &[&["--user", "tls-a:a-pw-tls"], args].concat());
    let denied = |out: &Output| {
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("permission denied")
    };
    assert!(
        denied(&as_a(&["get", "--prefix", "/mesh-host/node/tls-b/declaration/"])),
        "A read B's declaration"
    );
    assert!(denied(&as_a(&["put", "/mesh-host/node/tls-b/status", "{}"])), "A wrote B's status");

    // And mesh-host run with A's certificate and login but named B applies nothing of B's.
    let s2 = Scratch::new();
    let mut impostor = node_with(&s2, &url, "tls-b", &[], &a);
    assert!(
        wait_for(PATIENCE, || impostor.log().contains("permission denied")),
        "etcd's refusal is reported:\n{}",
        impostor.log()
    );
    assert!(!s.path("tls-b").exists(), "nothing of B's applied");
    assert_eq!(impostor.terminate(), Some(0), "{}", impostor.log());

    // A certificate that names a user (a CN) is refused by etcd's JSON gateway while auth is on:
    // the message says so and what to do.
    let named = tls_args("named");
    let out = fleet(
        &s,
        &[
            &["status", "--etcd", &url],
            &strs(&named)[..],
            &["--etcd-user", "tls-a", "--etcd-password-file", &a_pw],
        ]
        .concat(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains(&url) && stderr.contains("without a CN"), "{stderr}");
}

/// Two network namespaces of the test's own joined by one veth pair: etcd's (10.78.1.1 on `e0`,
/// and its own loopback) and the agent's (10.78.1.2 on `a0`). Cutting the pair is a network
/// partition as a node sees one: its packets go nowhere and its connections hang. Deleted, with
/// the pair, when dropped. (The firewall tests use 10.77.0.0/16 in namespaces of their own.)
struct Split {
    etcd_ns: String,
    agent_ns: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|e| {
        panic!(
            "ip is missing ({e}): the cut-off test needs iproute2; run tests/testbed/up.sh (50-firewall.sh)"
        )
    });
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

impl Split {
    fn new() -> Split {
        let id = std::process::id();
        let split = Split { etcd_ns: format!("fleetcut-e-{id}"), agent_ns: format!("fleetcut-a-{id}") };
        let (e, a) = (split.etcd_ns.as_str(), split.agent_ns.as_str());
        ip(&["netns", "add", e]);
        ip(&["netns", "add", a]);
        ip(&["-n", e, "link", "add", "e0", "type", "veth", "peer", "name", "a0", "netns", a]);
        ip(&["-n", e, "addr", "add", "10.78.1.1/24", "dev", "e0"]);
        ip(&["-n", a, "addr", "add", "10.78.1.2/24", "dev", "a0"]);
        for (ns, dev) in [(e, "e0"), (e, "lo"), (a, "a0"), (a, "lo")] {
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        split
    }

    /// A command run in one of the two namespaces.
    fn in_ns(ns: &str, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(program);
        cmd
    }

    fn cut(&self) {
        ip(&["-n", &self.etcd_ns, "link", "set", "e0", "down"]);
    }

    fn mend(&self) {
        ip(&["-n", &self.etcd_ns, "link", "set", "e0", "up"]);
    }
}

impl Drop for Split {
    fn drop(&mut self) {
        for ns in [&self.etcd_ns, &self.agent_ns] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// A child process killed (and reaped) when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_node_whose_network_is_cut_keeps_converging_drops_out_and_resyncs_what_changed_when_it_returns() {
    need_etcd_binaries();
    let s = Scratch::new();
    let split = Split::new();
    let etcd_bin = PathBuf::from("etcd");
    let etcd = Killed(
        Split::in_ns(&split.etcd_ns, &etcd_bin)
            .args(["--name", "fleetcut", "--data-dir"])
            .arg(s.path("etcd-data"))
            // Its own loopback too, so the test reaches it from its namespace while the pair is cut.
            .args(["--listen-client-urls", "http://10.78.1.1:2379,http://127.0.0.1:2379"])
            .args(["--advertise-client-urls", "http://10.78.1.1:2379"])
            .args(["--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls"])
            .args(["http://127.0.0.1:2380", "--initial-cluster", "fleetcut=http://127.0.0.1:2380"])
            .stdout(std::fs::File::create(s.path("etcd.log")).unwrap())
            .stderr(std::fs::File::options().append(true).open(s.path("etcd.log")).unwrap())
            .spawn()
            .expect("etcd starts in its namespace"),
    );
    let ctl = |args: &[&str]| {
        Split::in_ns(&split.etcd_ns, Path::new("etcdctl"))
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", "http://127.0.0.1:2379"])
            .args(args)
            .output()
            .unwrap()
    };
    assert!(
        wait_for(PATIENCE, || ctl(&["endpoint", "health"]).status.success()),
        "etcd did not come up in its namespace:\n{}",
        read(&s.path("etcd.log"))
    );
    let binary = assert_cmd::cargo::cargo_bin("mesh-host");
    let conf = s.path("cut.conf");
    // Returns the revision written.
    let declare = |content: &str| -> i64 {
        write_declaration(
            &s.path("in/cut.json"),
            json!([{"type": "file", "id": "cut.conf", "path": s.p("cut.conf"), "content": content}]),
        );
        let out = Split::in_ns(&split.etcd_ns, &binary)
            .arg("--state")
            .arg(s.path("cli/state.json"))
            .args(["fleet", "put", "--etcd", "http://127.0.0.1:2379", "--node", "cut-ns"])
            .arg(s.path("in/cut.json"))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "fleet put: {}", String::from_utf8_lossy(&out.stderr));
        stdout.split("at revision ").nth(1).and_then(|r| r.split(':').next()).unwrap().parse().unwrap()
    };
    declare("v1\n");

    let log = s.path("node.log");
    let _agent = Killed(
        Split::in_ns(&split.agent_ns, &binary)
            .arg("--state")
            .arg(s.state())
            .args(["run", "--etcd", "http://10.78.1.1:2379", "--node", "cut-ns", "--metrics", "off"])
            .args(["--settle-ms", "20"])
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::options().append(true).open(&log).unwrap())
            .spawn()
            .expect("mesh-host starts in its namespace"),
    );
    assert!(wait_for(PATIENCE, || read(&conf) == "v1\n"), "applied across the pair:\n{}", read(&log));
    let alive = || !ctl(&["get", "/mesh-host/node/cut-ns/alive", "--print-value-only"]).stdout.is_empty();
    assert!(wait_for(PATIENCE, alive), "the node's presence is there:\n{}", read(&log));

    // The pair is cut. A change is made meanwhile; the node goes on converging on what it has,
    // and its presence goes when its lease runs out (10 s).
    split.cut();
    let v2 = declare("v2\n");
    std::fs::write(&conf, "hand-edit\n").unwrap();
    assert!(wait_for(PATIENCE, || read(&conf) == "v1\n"), "still converging while cut off:\n{}", read(&log));
    assert!(
        wait_for(Duration::from_secs(20), || !alive()),
        "the presence of a node cut off outlived its lease:\n{}",
        read(&log)
    );
    assert_eq!(read(&conf), "v1\n", "nothing of the change reached a node cut off");

    // Mended: the node reconnects, reads again, applies the change made while it was away, says
    // so in its status, and is present again.
    split.mend();
    assert!(
        wait_for(Duration::from_secs(60), || read(&conf) == "v2\n"),
        "the change made while the node was cut off is applied when it returns:\n{}",
        read(&log)
    );
    assert!(
        wait_for(Duration::from_secs(20), || {
            let out = ctl(&["get", "/mesh-host/node/cut-ns/status", "--print-value-only"]);
            let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            status["revision"].as_i64().unwrap_or(0) >= v2 && status["converged"] == true
        }),
        "the status reports the revision written while cut off:\n{}",
        read(&log)
    );
    assert!(wait_for(Duration::from_secs(20), alive), "present again:\n{}", read(&log));
    drop(etcd);
}
