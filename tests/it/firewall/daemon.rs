//! The table kept by a running agent: a rule deleted by hand is put back and counted.

use super::*;

/// `mesh-host run` in the node's namespace, with /metrics on its loopback; killed when dropped.
pub struct Agent {
    child: std::process::Child,
    node: String,
    log: std::path::PathBuf,
}

impl Agent {
    /// Starts the daemon and waits until `/healthz` answers "ok".
    pub fn start(net: &Net, s: &Scratch, declaration: &std::path::Path) -> Agent {
        let agent = Agent::launch(net, s, declaration);
        assert!(
            crate::support::wait_for(crate::support::PATIENCE, || agent
                .get("/healthz")
                .is_some_and(|b| b == "ok\n")),
            "the daemon never became healthy:\n{}",
            agent.log()
        );
        agent
    }

    /// Starts the daemon and waits until `/healthz` answers anything, healthy or not.
    pub fn launch(net: &Net, s: &Scratch, declaration: &std::path::Path) -> Agent {
        let log = s.path("daemon.log");
        // In the node, with its private /etc/ufw bound when it has one, as `Net::agent` runs.
        let child = net
            .in_node(assert_cmd::cargo::cargo_bin("mesh-host").as_os_str())
            .arg("--state")
            .arg(s.state())
            .args(["run", "--declaration"])
            .arg(declaration)
            .args(["--metrics", "127.0.0.1:9787"])
            .env("MESH_HOST_LOG", "info")
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::options().append(true).open(&log).unwrap())
            .spawn()
            .unwrap();
        let agent = Agent { child, node: net.node.clone(), log };
        assert!(
            crate::support::wait_for(crate::support::PATIENCE, || agent.answer("/healthz").is_some()),
            "the daemon never answered /healthz:\n{}",
            agent.log()
        );
        agent
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GETs a path of the daemon's HTTP server, from inside its namespace: the status code and
    /// the body of whatever answer came.
    pub fn answer(&self, path: &str) -> Option<(u16, String)> {
        let path = path.to_owned();
        Net::inside(&self.node, move || {
            let mut s = TcpStream::connect("127.0.0.1:9787").ok()?;
            write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
            let mut out = String::new();
            s.read_to_string(&mut out).ok()?;
            let (head, body) = out.split_once("\r\n\r\n")?;
            let status = head.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
            Some((status, body.to_owned()))
        })
    }

    /// The body of a 200 answer.
    pub fn get(&self, path: &str) -> Option<String> {
        self.answer(path).and_then(|(status, body)| (status == 200).then_some(body))
    }

    /// A sample's value (`support::metric_in`).
    pub fn metric(&self, sample: &str) -> f64 {
        crate::support::metric_in(&self.get("/metrics").unwrap_or_default(), sample)
    }

    /// The pids of the agent's children.
    fn children(&self) -> Vec<i32> {
        let pid = self.child.id();
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.flatten().collect::<Vec<_>>());
        tasks
            .unwrap_or_default()
            .iter()
            .flat_map(|t| {
                std::fs::read_to_string(t.path().join("children"))
                    .unwrap_or_default()
                    .split_whitespace()
                    .filter_map(|c| c.parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn the_daemon_puts_back_a_rule_deleted_by_hand_and_counts_it_as_drift() {
    let net = Net::new();
    let s = Scratch::new();
    net.serve_tcp(8443);
    let d = s.declare(json!([
        {"type": "opening", "id": "web.http", "port": 8080},
        {"type": "opening", "id": "web.https", "port": 8443},
    ]));
    let agent = Agent::start(&net, &s, &d);
    let drift = "mesh_host_drift_corrections_total{type=\"opening\"}";
    assert!(net.table().is_some_and(|t| t.contains("\"web.https\"")), "the first apply loaded the filter");
    assert!(
        crate::support::wait_for(crate::support::PATIENCE, || agent
            .metric("mesh_host_watcher_up{watcher=\"firewall\"}")
            == 1.0),
        "the firewall watcher is up:\n{}",
        agent.log()
    );
    // A barrier: nft monitor may still be subscribing when it is reported up. A rule added by
    // hand is drift too; once one is seen and taken out, the watcher is surely listening.
    let live = (0..20).any(|_| {
        net.nft(&[
            "add",
            "rule",
            "inet",
            "mesh_host",
            "input",
            "tcp",
            "dport",
            "1",
            "accept",
            "comment",
            "\"probe\"",
        ]);
        crate::support::wait_for(Duration::from_secs(1), || net.table().is_some_and(|t| !t.contains("probe")))
    });
    assert!(live, "a rule added by hand was never taken out:\n{}", agent.log());
    let before = agent.metric(drift);

    let listing = net.nft(&["-a", "list", "table", "inet", "mesh_host"]);
    let handle =
        listing.lines().find(|l| l.contains("\"web.https\"")).unwrap().rsplit(' ').next().unwrap().to_owned();
    net.nft(&["delete", "rule", "inet", "mesh_host", "input", "handle", &handle]);
    assert!(
        crate::support::wait_for(crate::support::PATIENCE, || net
            .table()
            .is_some_and(|t| t.contains("\"web.https\""))),
        "the rule deleted by hand was put back (well before the 10-minute resync):\n{}",
        agent.log()
    );
    assert!(
        crate::support::wait_for(crate::support::PATIENCE, || agent.metric(drift) > before),
        "counted as drift:\n{}",
        agent.log()
    );
    assert!(connects(&net.a, "10.77.1.1:8443"));
    assert!(
        crate::support::wait_for(crate::support::PATIENCE, || agent.log().contains("corrected web.https")),
        "{}",
        agent.log()
    );
}

/// The agent's `nft monitor` dies with it, however it dies: SIGKILLed, the agent once left its
/// child running for ever, reparented to init (one more at each restart), and holding alive
/// every mount its namespace had copied (a FUSE lane's unmount then waited on it for ever).
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn the_agents_nft_monitor_dies_with_the_agent_killed() {
    let net = Net::new();
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "opening", "id": "web.http", "port": 8080}]));
    let mut agent = Agent::start(&net, &s, &d);
    let comm = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let mut monitor = None;
    assert!(
        crate::support::wait_for(crate::support::PATIENCE, || {
            monitor = agent.children().into_iter().find(|&c| comm(c).trim() == "nft");
            monitor.is_some()
        }),
        "the agent runs nft monitor:\n{}",
        agent.log()
    );
    let monitor = monitor.unwrap();
    agent.child.kill().unwrap();
    agent.child.wait().unwrap();
    let gone = crate::support::wait_for(Duration::from_secs(5), || comm(monitor).trim() != "nft");
    if !gone {
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(monitor), nix::sys::signal::Signal::SIGKILL);
    }
    assert!(gone, "nft monitor ({monitor}) outlived the agent killed with SIGKILL");
}
