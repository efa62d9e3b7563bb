//! A declaration refused whole on this machine is refused by the daemon too (issue 21, item 1):
//! on an adopted node behind a filter the host cannot manage, no reconcile of one key applies
//! any of it, `/healthz` says why, and taking the filter off lets the declaration in without a
//! restart. Run in a network namespace of its own (`firewall::Net`), as the firewall tests are.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;

use serde_json::json;

use crate::firewall::Net;
use crate::support::{wait_for, Scratch, PATIENCE};

/// `mesh-host run` in the node's namespace, its HTTP server on the node's loopback; killed when
/// dropped.
struct NodeAgent {
    child: std::process::Child,
    node: String,
    log: std::path::PathBuf,
}

const PORT: u16 = 9788;

impl NodeAgent {
    /// Starts the daemon and waits until `/healthz` answers anything.
    fn launch(net: &Net, s: &Scratch, declaration: &Path) -> NodeAgent {
        let logs = s.path("logs");
        std::fs::create_dir_all(&logs).unwrap();
        let log = logs.join("daemon.log");
        let child = Command::new("ip")
            .args(["netns", "exec", &net.node])
            .arg(assert_cmd::cargo::cargo_bin("mesh-host"))
            .arg("--state")
            .arg(s.state())
            .args(["run", "--declaration"])
            .arg(declaration)
            .args(["--metrics", &format!("127.0.0.1:{PORT}")])
            .env("MESH_HOST_LOG", "info")
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::options().append(true).open(&log).unwrap())
            .spawn()
            .unwrap();
        let agent = NodeAgent { child, node: net.node.clone(), log };
        assert!(
            wait_for(PATIENCE, || agent.answer("/healthz").is_some()),
            "the daemon never answered /healthz:\n{}",
            agent.log()
        );
        agent
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GETs a path from inside the node's namespace: the status code and the body.
    fn answer(&self, path: &str) -> Option<(u16, String)> {
        let path = path.to_owned();
        Net::inside(&self.node, move || {
            let mut s = TcpStream::connect(("127.0.0.1", PORT)).ok()?;
            write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
            let mut out = String::new();
            s.read_to_string(&mut out).ok()?;
            let (head, body) = out.split_once("\r\n\r\n")?;
            let status = head.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
            Some((status, body.to_owned()))
        })
    }

    fn metric(&self, sample: &str) -> f64 {
        let body = self.answer("/metrics").map(|(_, b)| b).unwrap_or_default();
        body.lines()
            .find_map(|l| l.strip_prefix(sample).and_then(|rest| rest.strip_prefix(' ')))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A filter of someone else's on the node's input hook: policy accept, one rule (so the host's
/// own loopback still reaches the agent's HTTP server).
fn foreign_filter(net: &Net) {
    net.nft(&["add", "table", "ip", "fwtest_guard"]);
    net.nft(&[
        "add",
        "chain",
        "ip",
        "fwtest_guard",
        "c",
        "{ type filter hook input priority 0; policy accept; }",
    ]);
    net.nft(&["add", "rule", "ip", "fwtest_guard", "c", "tcp", "dport", "8082", "drop"]);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn the_daemon_applies_nothing_of_a_declaration_refused_here_and_lets_it_in_once_the_filter_goes() {
    let net = Net::new();
    let s = Scratch::new();
    foreign_filter(&net);
    let conf = s.path("web.conf");
    let d = s.path("declaration.json");
    let declaration = json!({"version": 1, "adoption": {"taken": ["web"]}, "resources": [
        {"type": "file", "id": "web.conf", "path": s.p("web.conf"), "content": "the mesh's\n"},
        {"type": "opening", "id": "web.http", "port": 8080},
    ]});
    std::fs::write(&d, serde_json::to_vec_pretty(&declaration).unwrap()).unwrap();
    let agent = NodeAgent::launch(&net, &s, &d);

    // Refused, and said so: 503 naming what was found, counted once, a gauge at 1.
    let refused = |agent: &NodeAgent| {
        agent.answer("/healthz").is_some_and(|(status, body)| {
            status == 503
                && body.contains("declaration refused on this machine")
                && body.contains("fwtest_guard")
        })
    };
    assert!(
        wait_for(PATIENCE, || refused(&agent)),
        "/healthz does not say the declaration is refused: {:?}\n{}",
        agent.answer("/healthz"),
        agent.log()
    );
    assert!(!conf.exists(), "nothing of a refused declaration is applied");
    assert_eq!(agent.metric("mesh_host_declaration_refused"), 1.0);
    assert_eq!(agent.metric("mesh_host_declaration_refusals_total"), 1.0);

    // A managed file written by hand under the refusal is a change the daemon sees, and leaves.
    std::fs::write(&conf, "the operator's\n").unwrap();
    std::fs::write(&conf, "the operator's, again\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(
        std::fs::read_to_string(&conf).unwrap(),
        "the operator's, again\n",
        "a reconcile of one key applied part of a refused declaration:\n{}",
        agent.log()
    );
    assert!(refused(&agent), "still refused");
    assert_eq!(net.table(), None, "no filter of the host's was loaded");
    assert_eq!(agent.metric("mesh_host_declaration_refusals_total"), 1.0, "a refusal is counted once");

    // The foreign filter goes: the ruleset changed, the daemon looks again, and the declaration
    // is applied, with no restart.
    net.nft(&["delete", "table", "ip", "fwtest_guard"]);
    assert!(
        wait_for(PATIENCE, || std::fs::read_to_string(&conf).is_ok_and(|c| c == "the mesh's\n")),
        "the declaration was not applied once the filter went:\n{}",
        agent.log()
    );
    assert!(
        wait_for(PATIENCE, || agent.answer("/healthz").is_some_and(|(status, _)| status == 200)),
        "/healthz: {:?}",
        agent.answer("/healthz")
    );
    assert_eq!(agent.metric("mesh_host_declaration_refused"), 0.0);
    assert!(net.table().is_some_and(|t| t.contains("\"web.http\"")), "the host's filter is loaded");
    let log = agent.log();
    assert_eq!(log.matches("until that changes nothing of the declaration is applied").count(), 1, "{log}");
    assert!(log.contains("no longer refused on this machine"), "{log}");
}
