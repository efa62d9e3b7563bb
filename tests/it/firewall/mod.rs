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
//!
//! One file per subject: `nft` (the host's own table), `daemon` (the table kept by a running
//! agent), `ufw` and `firewalld` (an adopted node's firewall, made and flipped from); here what
//! they share: the namespaces, the connections, and the prober that watches a port through a
//! change.

mod daemon;
mod firewalld;
mod nft;
mod ufw;

pub use daemon::Agent;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

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
    /// A private copy of /etc/ufw, bound over it for every command run in the node (ufw keeps
    /// its state there, and the machine's own must never change).
    pub ufw_etc: Option<tempfile::TempDir>,
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
        let net =
            Net { node: format!("{tag}-node"), a: format!("{tag}-a"), b: format!("{tag}-b"), ufw_etc: None };
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

    /// The same, with ufw enabled in the node (its state in a private copy of /etc/ufw).
    pub fn with_ufw() -> Net {
        let found = Command::new("ufw").arg("version").output().is_ok_and(|o| o.status.success());
        assert!(
            found,
            "ufw is not installed: tests/testbed/up.sh (50-firewall.sh) installs it, or run tests/run.sh"
        );
        let mut net = Net::new();
        let etc = tempfile::Builder::new().prefix("mesh-host-fw-ufw-").tempdir().unwrap();
        must(&["cp", "-a", "/etc/ufw/.", etc.path().to_str().unwrap()]);
        // The default policies are kept in /etc/default/ufw: a private copy of it too.
        must(&["cp", "-a", "/etc/default/ufw", etc.path().join("default-ufw").to_str().unwrap()]);
        net.ufw_etc = Some(etc);
        net.ufw(&["--force", "enable"]);
        net
    }

    /// The argv that runs a program in the node, with the private /etc/ufw bound when there is one.
    fn in_node(&self, program: &std::ffi::OsStr) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.node]);
        if let Some(etc) = &self.ufw_etc {
            // `ip netns exec` gives each command a mount namespace of its own, so the binding
            // lasts as long as the command.
            cmd.args(["sh", "-c", r#"mount --bind "$0" /etc/ufw && mount --bind "$0/default-ufw" /etc/default/ufw && exec "$@""#])
                .arg(etc.path());
        }
        cmd.arg(program);
        cmd
    }

    /// ufw in the node; its output.
    pub fn ufw(&self, args: &[&str]) -> String {
        let out = self.in_node("ufw".as_ref()).args(args).output().unwrap();
        assert!(out.status.success(), "ufw {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
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
        self.agent_with(s, args, &[])
    }

    /// mesh-host with more environment (a failpoint).
    pub fn agent_with(&self, s: &Scratch, args: &[&str], env: &[(&str, &str)]) -> Output {
        self.in_node(assert_cmd::cargo::cargo_bin("mesh-host").as_os_str())
            .envs(env.iter().copied())
            .arg("--state")
            .arg(s.state())
            .args(args)
            .output()
            .expect("mesh-host runs")
    }

    /// `apply --json` in the node's namespace.
    pub fn apply(&self, s: &Scratch, declaration: &std::path::Path) -> (i32, Value) {
        self.apply_with(s, declaration, &[])
    }

    /// `apply --json` with more environment.
    pub fn apply_with(
        &self,
        s: &Scratch,
        declaration: &std::path::Path,
        env: &[(&str, &str)],
    ) -> (i32, Value) {
        let out = self.agent_with(s, &["apply", "--json", declaration.to_str().unwrap()], env);
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

/// How often a prober opens a new connection.
const PROBE_EVERY: Duration = Duration::from_millis(10);

/// The fewest attempts a prober makes, and must have made for what it saw to mean anything.
pub const MIN_ATTEMPTS: usize = 5;

/// Opens new connections to `to` from `ns`, one every `PROBE_EVERY` from `start` to `stop`,
/// and notes when each was sent and whether it was answered: a port must stay open (or
/// closed) through a change. Each attempt runs on a thread of its own and does not wait for the
/// one before: a dropped one waits `DROPPED_AFTER`, and a prober that waited for it would see
/// only a few moments of a change, or none at all of a short one. A change shorter than
/// `MIN_ATTEMPTS` attempts is probed on after it ended until that many were made (the port must
/// then be as it was through the change anyway).
pub struct Prober {
    to: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<(Instant, bool)>>>,
}

/// One new connection from inside `ns`: when its SYN was sent (taken in the namespace, just
/// before `connect`, so attempts are ordered as the filter saw them), and whether it was
/// answered.
fn attempt(ns: &str, to: SocketAddr) -> std::thread::JoinHandle<(Instant, bool)> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap();
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let sent = Instant::now();
        let answered = TcpStream::connect_timeout(&to, DROPPED_AFTER).is_ok_and(|stream| {
            stream.set_read_timeout(Some(DROPPED_AFTER)).unwrap();
            Conn(stream).echoes()
        });
        (sent, answered)
    })
}

/// Stops four probers, a declared port over IPv4 and IPv6 then an undeclared one over both, and
/// checks what each saw `when`: the declared port open throughout, the other never.
pub fn probed([v4, v6, no4, no6]: [Prober; 4], when: &str) {
    v4.stop().always_open(when);
    v6.stop().always_open(when);
    no4.stop().never_open(when);
    no6.stop().never_open(when);
}

impl Prober {
    /// Starts probing; returns once the first attempt is under way, so the change that
    /// follows is covered from its beginning.
    pub fn start(ns: &str, to: &str) -> Prober {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let addr: SocketAddr = to.parse().unwrap();
        let (ns, flag) = (ns.to_owned(), std::sync::Arc::clone(&stop));
        let (began, first) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let mut running = Vec::new();
            while running.len() < MIN_ATTEMPTS || !flag.load(Ordering::Relaxed) {
                running.push(attempt(&ns, addr));
                let _ = began.send(());
                std::thread::sleep(PROBE_EVERY);
            }
            let mut seen: Vec<(Instant, bool)> = running.into_iter().map(|t| t.join().unwrap()).collect();
            seen.sort_by_key(|(sent, _)| *sent);
            seen
        });
        first.recv().unwrap();
        Prober { to: to.to_owned(), stop, thread: Some(thread) }
    }

    /// Stops (once `MIN_ATTEMPTS` were made), and waits for the attempts still waiting for an
    /// answer.
    pub fn stop(mut self) -> Probed {
        self.stop.store(true, Ordering::Relaxed);
        Probed { to: self.to.clone(), attempts: self.thread.take().unwrap().join().unwrap() }
    }
}

/// What a prober saw: each attempt, in the order sent, answered or not.
pub struct Probed {
    pub to: String,
    pub attempts: Vec<(Instant, bool)>,
}

impl Probed {
    fn count(&self, answered: bool) -> usize {
        self.attempts.iter().filter(|(_, a)| *a == answered).count()
    }

    fn enough(&self, when: &str) {
        assert!(
            self.attempts.len() >= MIN_ATTEMPTS,
            "{when}: only {} attempts to {} (at least {MIN_ATTEMPTS} are needed to mean anything)",
            self.attempts.len(),
            self.to
        );
    }

    /// Asserts every new connection was let in, over enough attempts.
    pub fn always_open(&self, when: &str) {
        self.enough(when);
        assert_eq!(
            self.count(false),
            0,
            "{when}: {} refused {} new connections of {}",
            self.to,
            self.count(false),
            self.attempts.len()
        );
    }

    /// Asserts no new connection was let in, over enough attempts.
    pub fn never_open(&self, when: &str) {
        self.enough(when);
        assert_eq!(
            self.count(true),
            0,
            "{when}: {} let {} new connections in of {}",
            self.to,
            self.count(true),
            self.attempts.len()
        );
    }

    /// Asserts the port was open, then closed, and never open again; the time the first
    /// refused attempt was sent.
    pub fn closes_once(&self, when: &str) -> Instant {
        self.enough(when);
        let first = self.attempts.iter().position(|(_, a)| !a);
        let first = first.unwrap_or_else(|| panic!("{when}: {} was never closed", self.to));
        assert!(first > 0, "{when}: {} was closed from the first attempt", self.to);
        let reopened = self.attempts[first..].iter().filter(|(_, a)| *a).count();
        assert_eq!(reopened, 0, "{when}: {} let {reopened} new connections in after it closed", self.to);
        self.attempts[first].0
    }

    /// Asserts the port was closed, then open, and never closed again; the time the last
    /// refused attempt was sent.
    pub fn opens_once(&self, when: &str) -> Instant {
        self.enough(when);
        let last = self.attempts.iter().rposition(|(_, a)| !a);
        let last = last.unwrap_or_else(|| panic!("{when}: {} was never closed", self.to));
        assert!(last + 1 < self.attempts.len(), "{when}: {} never opened", self.to);
        let early = self.attempts[..last].iter().filter(|(_, a)| *a).count();
        assert_eq!(early, 0, "{when}: {} let {early} new connections in before it last refused one", self.to);
        self.attempts[last].0
    }
}

/// An adopted node behind the firewall found on it, as a scenario run over both found
/// firewalls sees it: ufw in namespaces of the test's own (`Net::with_ufw`), firewalld in the
/// testbed's machine (`firewalld::Machine`).
pub trait Adopted {
    /// The agent running as a daemon, stopped when dropped.
    type Daemon;
    /// The found firewall's name, in messages.
    const NAME: &'static str;
    /// A port declared, and one never declared.
    const PORTS: (u16, u16);
    /// How long a daemon's full pass may take to be seen.
    const PATIENCE: Duration;
    /// Where the agent may write a declared file `name`: in a directory it sees.
    fn file(&self, s: &Scratch, name: &str) -> String;
    /// Listens on a TCP port on the node, echoing.
    fn serve_tcp(&self, port: u16);
    /// `apply --json` of the declaration at `d`: the exit code and the report.
    fn apply(&self, s: &Scratch, d: &std::path::Path) -> (i32, Value);
    /// The daemon, run on the declaration at `d` and up: its first full pass made.
    fn run(&self, s: &Scratch, d: &std::path::Path) -> Self::Daemon;
    /// Hands the daemon the declaration at `d` again, rewritten.
    fn redeclare(&self, d: &std::path::Path);
    /// The daemon's log.
    fn log(daemon: &Self::Daemon) -> String;
    /// nft, in the node's network.
    fn nft(&self, args: &[&str]);
    /// The host's table as nft prints it, or `None` when absent.
    fn table(&self) -> Option<String>;
    /// Whether the found firewall is in force as it was found.
    fn in_force(&self) -> bool;
    /// Whether the found firewall is retired as the flip leaves it, the host's openings gone
    /// from it.
    fn retired(&self) -> bool;
    /// Whether the opening `web.http` is made in the found firewall.
    fn holds_opening(&self) -> bool;
    /// Whether a new connection from an admitted peer to `port` is answered.
    fn connects(&self, port: u16) -> bool;
}

/// Issue 21, point 3, behind either found firewall: a reconcile of one opening (an `nft
/// monitor` event) runs while the flip waits for a full pass that fails nothing. It must leave
/// the found firewall and the openings made in it exactly as they are; before the fix it judged
/// the flip on its own failures (none) and retired it. The next full pass that fails nothing
/// flips.
pub fn one_opening_never_flips<N: Adopted>(node: &N) {
    let s = Scratch::new();
    let name = N::NAME;
    let (port, closed) = N::PORTS;
    for p in [port, closed] {
        node.serve_tcp(p);
    }
    let adopted = s.declare_adopted(json!([{"type": "opening", "id": "web.http", "port": port}]));
    let (code, report) = node.apply(&s, &adopted);
    assert_eq!((code, action(&report, "web.http")), (0, "created".into()), "{report:#}");
    assert!(node.holds_opening(), "the opening is made in {name}");

    // `adoption` goes, and a file of the declaration fails: the daemon's full pass leaves the
    // flip waiting.
    let failing = s.declare(json!([
        {"type": "file", "id": "web.conf", "path": "/proc/version/web.conf", "content": "x"},
        {"type": "opening", "id": "web.http", "port": port},
    ]));
    let daemon = node.run(&s, &failing);
    assert!(node.in_force(), "the full pass failed, so no flip from {name}");
    assert_eq!(node.table(), None);

    // A change to the host's table: `nft monitor` queues the opening alone. Made again until
    // its reconcile says why it waits (the watcher may still be subscribing when it is up), or
    // until the found firewall is gone, which is the fault.
    let waits = "waits for a full pass that fails nothing";
    let seen = (0..20).any(|n| {
        node.nft(&["add", "table", "inet", "mesh_host"]);
        node.nft(&["add", "chain", "inet", "mesh_host", &format!("probe{n}")]);
        crate::support::wait_for(Duration::from_secs(1), || {
            N::log(&daemon).contains(waits) || !node.in_force()
        })
    });
    assert!(seen, "the change to the table was never reconciled:\n{}", N::log(&daemon));
    assert!(
        node.in_force(),
        "a reconcile of one opening retired {name} while the full pass fails:\n{}",
        N::log(&daemon)
    );
    assert!(node.holds_opening(), "the opening stays in {name}");
    assert!(
        node.table().is_some_and(|t| !t.contains("web.http") && !t.contains("policy drop")),
        "the table is left as it was found, the hand-made one filtering nothing: {:?}",
        node.table()
    );
    assert!(N::log(&daemon).contains(waits), "{}", N::log(&daemon));
    assert!(node.connects(port), "{port} is open in {name}");
    assert!(!node.connects(closed), "{name} still closes what is not declared");

    // The file fixed: the next full pass fails nothing, and flips.
    let fixed = s.declare(json!([
        {"type": "file", "id": "web.conf", "path": node.file(&s, "web.conf"), "content": "x"},
        {"type": "opening", "id": "web.http", "port": port},
    ]));
    node.redeclare(&fixed);
    assert!(
        crate::support::wait_for(N::PATIENCE, || {
            node.retired()
                && node.table().is_some_and(|t| {
                    t.contains("\"web.http\"") && t.contains(&port.to_string()) && t.contains("policy drop")
                })
        }),
        "the clean full pass flipped from {name} to the host's table:\n{}",
        N::log(&daemon)
    );
    assert!(node.table().is_some_and(|t| !t.contains("probe")), "the hand-made chains went with the load");
    assert!(node.connects(port));
    assert!(!node.connects(closed));
}
