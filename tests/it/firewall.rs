//! Openings against real nftables, with real packets.
//!
//! Safety: nothing here loads a rule into the machine's own network namespace (it carries other
//! work, Docker's networking and the tool channel). Each test makes its own namespaces: `node`,
//! where the agent runs (`ip netns exec`) and listeners wait, and two peers, `a` and `b`, each
//! joined to the node by a veth pair of its own, so a `from` network can admit one and not the
//! other. A guard removes the namespaces when the test ends, failed or not. Sockets are made
//! inside a namespace by a thread that entered it (`setns`); a socket stays in the namespace it
//! was made in.
//!
//! Addresses: the node is 10.77.1.1 / fd77:1::1 towards `a` (10.77.1.2 / fd77:1::2) and
//! 10.77.2.1 / fd77:2::1 towards `b` (10.77.2.2 / fd77:2::2).

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{action, detail, Scratch};

/// How long a connection attempt waits before it counts as dropped. The peers are one veth
/// away, so an admitted connection answers in well under a millisecond.
const DROPPED_AFTER: Duration = Duration::from_millis(600);

/// The namespaces of one test, removed when it ends.
pub struct Net {
    pub node: String,
    pub a: String,
    pub b: String,
}

fn sh(argv: &[&str]) -> Output {
    Command::new(argv[0]).args(&argv[1..]).output().unwrap_or_else(|e| panic!("cannot run {argv:?}: {e}"))
}

fn must(argv: &[&str]) -> String {
    let out = sh(argv);
    assert!(out.status.success(), "{argv:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Fails, saying how to get them, when nft or ip is missing: never a silent pass.
fn need_the_tools() {
    for (tool, arg) in [("nft", "--version"), ("ip", "-V"), ("ping", "-V")] {
        let found = Command::new(tool).arg(arg).output().is_ok_and(|o| o.status.success());
        assert!(
            found,
            "{tool} is not installed: tests/testbed/up.sh (50-firewall.sh) installs it, or run tests/run.sh"
        );
    }
}

impl Net {
    pub fn new() -> Net {
        need_the_tools();
        static N: AtomicUsize = AtomicUsize::new(0);
        let tag = format!("fw{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let net = Net { node: format!("{tag}-node"), a: format!("{tag}-a"), b: format!("{tag}-b") };
        for ns in [&net.node, &net.a, &net.b] {
            must(&["ip", "netns", "add", ns]);
            must(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        for (peer, n) in [(&net.a, 1), (&net.b, 2)] {
            let here = format!("to{n}");
            // Made inside the node's namespace, so the names never meet the machine's.
            must(&[
                "ip", "-n", &net.node, "link", "add", &here, "type", "veth", "peer", "name", "eth0", "netns",
                peer,
            ]);
            for (ns, dev, host) in [(&net.node, here.as_str(), 1), (peer, "eth0", 2)] {
                must(&["ip", "-n", ns, "addr", "add", &format!("10.77.{n}.{host}/24"), "dev", dev]);
                must(&["ip", "-n", ns, "addr", "add", &format!("fd77:{n}::{host}/64"), "dev", dev, "nodad"]);
                must(&["ip", "-n", ns, "link", "set", dev, "up"]);
            }
        }
        net
    }

    /// Runs `f` on a thread inside namespace `ns`.
    pub fn inside<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{ns}");
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).unwrap();
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            f()
        })
        .join()
        .unwrap()
    }

    /// nft, in the node's namespace.
    pub fn nft(&self, args: &[&str]) -> String {
        let mut argv = vec!["ip", "netns", "exec", &self.node, "nft"];
        argv.extend(args);
        must(&argv)
    }

    /// The host's table as nft prints it, or `None` when absent.
    pub fn table(&self) -> Option<String> {
        let out = sh(&["ip", "netns", "exec", &self.node, "nft", "list", "table", "inet", "mesh_host"]);
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// mesh-host, run in the node's namespace with the scratch directory's store.
    pub fn agent(&self, s: &Scratch, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.node])
            .arg(assert_cmd::cargo::cargo_bin("mesh-host"))
            .arg("--state")
            .arg(s.state())
            .args(args)
            .output()
            .expect("mesh-host runs")
    }

    /// `apply --json` in the node's namespace.
    pub fn apply(&self, s: &Scratch, declaration: &std::path::Path) -> (i32, Value) {
        let out = self.agent(s, &["apply", "--json", declaration.to_str().unwrap()]);
        let report = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("no JSON report ({e}): {}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code().unwrap_or(-1), report)
    }

    /// A TCP echo server on every address of the node, port `port`, for the rest of the test.
    pub fn serve_tcp(&self, port: u16) {
        let listener = Net::inside(&self.node, move || TcpListener::bind(("::", port)).unwrap());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || echo(stream));
            }
        });
    }

    /// A UDP echo server on every address of the node.
    pub fn serve_udp(&self, port: u16) {
        let socket = Net::inside(&self.node, move || UdpSocket::bind(("::", port)).unwrap());
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while let Ok((n, from)) = socket.recv_from(&mut buf) {
                let _ = socket.send_to(&buf[..n], from);
            }
        });
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in [&self.node, &self.a, &self.b] {
            let _ = sh(&["ip", "netns", "del", ns]);
        }
    }
}

fn echo(mut stream: TcpStream) {
    let mut buf = [0u8; 64];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 || stream.write_all(&buf[..n]).is_err() {
            break;
        }
    }
}

/// An open connection from a peer, which echoes.
pub struct Conn(TcpStream);

impl Conn {
    pub fn open(ns: &str, to: &str) -> Option<Conn> {
        let addr: SocketAddr = to.parse().unwrap();
        Net::inside(ns, move || {
            let stream = TcpStream::connect_timeout(&addr, DROPPED_AFTER).ok()?;
            stream.set_read_timeout(Some(DROPPED_AFTER)).unwrap();
            Some(Conn(stream))
        })
    }

    /// Whether a message still goes there and back.
    pub fn echoes(&mut self) -> bool {
        let mut back = [0u8; 4];
        self.0.write_all(b"ping").is_ok() && self.0.read_exact(&mut back).is_ok() && &back == b"ping"
    }
}

/// Whether a new TCP connection from `ns` to `to` is let in and answered.
pub fn connects(ns: &str, to: &str) -> bool {
    Conn::open(ns, to).is_some_and(|mut c| c.echoes())
}

/// Whether a datagram from `ns` to `to` is let in and answered.
pub fn answers_udp(ns: &str, to: &str) -> bool {
    let addr: SocketAddr = to.parse().unwrap();
    Net::inside(ns, move || {
        let socket = UdpSocket::bind(if addr.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }).unwrap();
        socket.set_read_timeout(Some(DROPPED_AFTER)).unwrap();
        let mut buf = [0u8; 8];
        socket.send_to(b"ping", addr).is_ok()
            && socket.recv_from(&mut buf).is_ok_and(|(n, _)| &buf[..n] == b"ping")
    })
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_declared_port_connects_an_undeclared_one_does_not_and_from_admits_only_its_sources() {
    let net = Net::new();
    let s = Scratch::new();
    for port in [8080, 8081, 8082] {
        net.serve_tcp(port);
    }
    net.serve_udp(5353);
    // Everything connects before there is a filter: a check below that fails to connect is the
    // filter's doing, not a broken network.
    for (peer, n) in [(&net.a, 1), (&net.b, 2)] {
        for port in [8080, 8081, 8082] {
            assert!(connects(peer, &format!("10.77.{n}.1:{port}")), "no filter yet: {port} from {peer}");
            assert!(connects(peer, &format!("[fd77:{n}::1]:{port}")), "no filter yet: {port} over IPv6");
        }
        assert!(answers_udp(peer, &format!("10.77.{n}.1:5353")));
    }

    let d = s.declare(json!([
        {"type": "opening", "id": "web.http", "port": 8080},
        {"type": "opening", "id": "web.admin", "port": 8081, "from": ["10.77.1.7/24", "fd77:1::/64"]},
        {"type": "opening", "id": "web.dns", "port": 5353, "protocol": "udp"},
    ]));
    let (code, report) = net.apply(&s, &d);
    assert_eq!(code, 0, "{report:#}");
    for id in ["web.http", "web.admin", "web.dns"] {
        assert_eq!(action(&report, id), "created");
    }
    assert!(
        detail(&report, "web.http").contains("new connections are dropped to 8082/tcp (listening on ::)"),
        "the detail names the listening port the filter closed: {report:#}"
    );

    // Declared from anywhere: both peers, both families.
    for (peer, n) in [(&net.a, 1), (&net.b, 2)] {
        assert!(connects(peer, &format!("10.77.{n}.1:8080")), "8080 from {peer}");
        assert!(connects(peer, &format!("[fd77:{n}::1]:8080")), "8080 over IPv6 from {peer}");
        assert!(answers_udp(peer, &format!("10.77.{n}.1:5353")), "5353/udp from {peer}");
        assert!(answers_udp(peer, &format!("[fd77:{n}::1]:5353")), "5353/udp over IPv6 from {peer}");
        // Not declared: dropped, over both families.
        assert!(!connects(peer, &format!("10.77.{n}.1:8082")), "8082 is not declared");
        assert!(!connects(peer, &format!("[fd77:{n}::1]:8082")), "8082 is not declared (IPv6)");
    }
    // From a's networks only (10.77.1.7/24 is the network 10.77.1.0/24).
    assert!(connects(&net.a, "10.77.1.1:8081"));
    assert!(connects(&net.a, "[fd77:1::1]:8081"));
    assert!(!connects(&net.b, "10.77.2.1:8081"), "b is not in `from`");
    assert!(!connects(&net.b, "[fd77:2::1]:8081"), "b is not in `from` (IPv6)");
    // Loopback always, declared or not.
    assert!(connects(&net.node, "127.0.0.1:8082"));
    assert!(connects(&net.node, "[::1]:8082"));
    // Ping, which the filter accepts whatever is declared.
    let ping = sh(&["ip", "netns", "exec", &net.a, "ping", "-c", "1", "-W", "1", "10.77.1.1"]);
    assert!(ping.status.success(), "echo is accepted: {}", String::from_utf8_lossy(&ping.stderr));
    let ping6 = sh(&["ip", "netns", "exec", &net.a, "ping", "-6", "-c", "1", "-W", "1", "fd77:1::1"]);
    assert!(ping6.status.success(), "echo is accepted (IPv6): {}", String::from_utf8_lossy(&ping6.stderr));
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn established_connections_survive_a_reload_that_closes_their_port() {
    let net = Net::new();
    let s = Scratch::new();
    net.serve_tcp(8080);
    net.serve_tcp(9090);
    let first = s.declare(json!([{"type": "opening", "id": "web.http", "port": 8080}]));
    assert_eq!(net.apply(&s, &first).0, 0);
    let mut v4 = Conn::open(&net.a, "10.77.1.1:8080").expect("8080 is declared");
    let mut v6 = Conn::open(&net.a, "[fd77:1::1]:8080").expect("8080 is declared (IPv6)");
    assert!(v4.echoes() && v6.echoes());

    // The table is replaced: 8080 leaves, 9090 arrives.
    let second = s.declare(json!([{"type": "opening", "id": "web.alt", "port": 9090}]));
    let (code, report) = net.apply(&s, &second);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "web.http"), "removed");
    assert_eq!(action(&report, "web.alt"), "created");
    assert!(v4.echoes() && v6.echoes(), "a connection made before the reload still works");
    assert!(!connects(&net.a, "10.77.1.1:8080"), "a new connection to 8080 is dropped now");
    assert!(connects(&net.a, "10.77.1.1:9090"));
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn the_table_is_read_back_put_back_when_changed_by_hand_and_nothing_else_is_touched() {
    let net = Net::new();
    let s = Scratch::new();
    net.serve_tcp(8080);
    // Another table, with a base chain on the input hook that accepts everything: it must be
    // exactly as it was at the end, handles included.
    net.nft(&["add", "table", "ip", "fwtest_other"]);
    net.nft(&[
        "add",
        "chain",
        "ip",
        "fwtest_other",
        "c",
        "{ type filter hook input priority 10; policy accept; }",
    ]);
    net.nft(&["add", "rule", "ip", "fwtest_other", "c", "tcp", "dport", "1", "counter", "accept"]);
    let other = || net.nft(&["-a", "-j", "list", "table", "ip", "fwtest_other"]);
    let before = other();

    let d = s.declare(json!([
        {"type": "opening", "id": "web.http", "port": 8080},
        {"type": "opening", "id": "web.https", "port": 8443},
    ]));
    assert_eq!(net.apply(&s, &d).0, 0);
    let loaded = net.table().expect("the table is there");
    assert!(
        loaded.contains("policy drop;") && loaded.contains("tcp dport 8080 accept comment \"web.http\""),
        "{loaded}"
    );

    // A steady pass changes nothing.
    let (code, report) = net.apply(&s, &d);
    assert_eq!(
        (code, action(&report, "web.http"), action(&report, "web.https")),
        (0, "unchanged".into(), "unchanged".into())
    );
    assert_eq!(net.table().unwrap(), loaded, "not even reloaded");

    // One rule deleted by hand: that opening is corrected, the other is not.
    let listing = net.nft(&["-a", "list", "table", "inet", "mesh_host"]);
    let handle =
        listing.lines().find(|l| l.contains("\"web.http\"")).unwrap().rsplit(' ').next().unwrap().to_owned();
    net.nft(&["delete", "rule", "inet", "mesh_host", "input", "handle", &handle]);
    assert!(!connects(&net.a, "10.77.1.1:8080"), "the rule deleted by hand no longer lets it in");
    let (code, report) = net.apply(&s, &d);
    assert_eq!(code, 0);
    assert_eq!(action(&report, "web.http"), "corrected");
    assert!(detail(&report, "web.http").contains("changed or deleted by hand"), "{report:#}");
    assert_eq!(action(&report, "web.https"), "unchanged");
    assert!(connects(&net.a, "10.77.1.1:8080"), "put back");

    // The policy set to accept by hand.
    net.nft(&["add", "chain", "inet", "mesh_host", "input", "{ policy accept; }"]);
    let (_, report) = net.apply(&s, &d);
    assert_eq!(action(&report, "web.http"), "corrected", "{report:#}");
    assert!(detail(&report, "web.http").contains("policy \"accept\""), "{report:#}");
    assert!(net.table().unwrap().contains("policy drop;"));

    // The whole table deleted by hand.
    net.nft(&["delete", "table", "inet", "mesh_host"]);
    let (_, report) = net.apply(&s, &d);
    assert_eq!(action(&report, "web.https"), "corrected");
    assert!(detail(&report, "web.https").contains("deleted by hand"));
    assert_eq!(net.table().unwrap(), loaded);

    // An opening leaves: its rule goes; the last one leaving takes the table with it.
    let one = s.declare(json!([{"type": "opening", "id": "web.https", "port": 8443}]));
    let (_, report) = net.apply(&s, &one);
    assert_eq!(action(&report, "web.http"), "removed");
    assert!(!net.table().unwrap().contains("\"web.http\""));
    let none = s.declare(json!([]));
    let (code, report) = net.apply(&s, &none);
    assert_eq!((code, action(&report, "web.https")), (0, "removed".into()));
    assert!(detail(&report, "web.https").contains("the last opening"));
    assert_eq!(net.table(), None, "the last opening leaving removes the table");
    assert!(connects(&net.a, "10.77.1.1:8080"), "no filter of the host's is left");

    assert_eq!(other(), before, "the other table is exactly as it was");
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn plan_names_the_listening_ports_the_filter_would_close_and_loads_nothing() {
    let net = Net::new();
    let s = Scratch::new();
    net.serve_tcp(2222);
    net.serve_udp(5353);
    // A socket on loopback only is not reachable from elsewhere, so the filter closes nothing.
    let _local = Net::inside(&net.node, || TcpListener::bind("127.0.0.1:7070").unwrap());
    let d = s.declare(json!([{"type": "opening", "id": "web.http", "port": 8080}]));
    let out = net.agent(&s, &["plan", d.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains(
            "new connections are dropped to 2222/tcp (listening on ::), 5353/udp (listening on ::)"
        ),
        "{said}"
    );
    assert!(!said.contains("7070"), "{said}");
    assert_eq!(net.table(), None, "plan loads nothing");
    assert!(!s.state().exists(), "plan writes no store");
    // Once the port is declared it is no longer named.
    let d = s.declare(json!([
        {"type": "opening", "id": "web.http", "port": 8080},
        {"type": "opening", "id": "web.ssh", "port": 2222},
        {"type": "opening", "id": "web.dns", "port": 5353, "protocol": "udp"},
    ]));
    let (_, report) = net.apply(&s, &d);
    assert_eq!(detail(&report, "web.http"), "", "{report:#}");
}

/// The test that used `opening` as the example of a type without an applier: every type has one
/// now. What stays of it: an opening that fails does not gate, and fails alone.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn an_opening_that_fails_fails_alone_without_gating() {
    let net = Net::new();
    let s = Scratch::new();
    net.serve_tcp(8080);
    let long = format!("web.{}", "x".repeat(130));
    let d = s.declare(json!([
        {"type": "opening", "id": long, "port": 9090},
        {"type": "opening", "id": "web.http", "port": 8080},
        {"type": "file", "id": "web.conf", "path": s.p("web.conf"), "content": "x"},
    ]));
    let (code, report) = net.apply(&s, &d);
    assert_eq!(code, 1);
    assert_eq!(report["error"]["gated"], false);
    assert_eq!(report["error"]["resource"], long.as_str());
    assert!(report["error"]["message"].as_str().unwrap().contains("longer than 128 bytes"), "{report:#}");
    assert_eq!(action(&report, "web.conf"), "created");
    assert_eq!(action(&report, "web.http"), "created");
    assert!(connects(&net.a, "10.77.1.1:8080"));
}

/// `mesh-host run` in the node's namespace, with /metrics on its loopback; killed when dropped.
struct Agent {
    child: std::process::Child,
    node: String,
    log: std::path::PathBuf,
}

impl Agent {
    fn start(net: &Net, s: &Scratch, declaration: &std::path::Path) -> Agent {
        let log = s.path("daemon.log");
        let child = Command::new("ip")
            .args(["netns", "exec", &net.node])
            .arg(assert_cmd::cargo::cargo_bin("mesh-host"))
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
            crate::support::wait_for(crate::support::PATIENCE, || agent
                .get("/healthz")
                .is_some_and(|b| b == "ok\n")),
            "the daemon never became healthy:\n{}",
            agent.log()
        );
        agent
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GETs a path of the daemon's HTTP server, from inside its namespace.
    fn get(&self, path: &str) -> Option<String> {
        let path = path.to_owned();
        Net::inside(&self.node, move || {
            let mut s = TcpStream::connect("127.0.0.1:9787").ok()?;
            write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
            let mut out = String::new();
            s.read_to_string(&mut out).ok()?;
            let (head, body) = out.split_once("\r\n\r\n")?;
            head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
        })
    }

    fn metric(&self, sample: &str) -> f64 {
        let body = self.get("/metrics").unwrap_or_default();
        body.lines()
            .find_map(|l| l.strip_prefix(sample).and_then(|rest| rest.strip_prefix(' ')))
            .map_or(0.0, |v| v.trim().parse().unwrap())
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
