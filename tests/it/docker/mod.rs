//! Containers, run-once and scheduled steps, networks and the event watcher, against the real
//! Docker engine and Podman service that `tests/testbed/docker.sh` starts, with its locally
//! imported image `local/busybox:1`; one file per subject, and here what they share: the
//! runtimes' CLIs, the names a test makes and removes, and engines a test can stop.
//!
//! Each test uses names of its own (tests run in parallel) and removes what it made, even when
//! it fails, through a guard.

mod containers;
mod daemon;
mod images;
mod networks;
mod secrets;
mod steps;
mod watcher;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::*;

const IMAGE: &str = "local/busybox:1";

const PODMAN: &str = "unix:///run/mesh-host-testbed/podman.sock";

const SETUP: &str = "run tests/testbed/docker.sh (as root) to start Docker and Podman with the test image";

/// A runtime's CLI, as the person at the machine would use it.
#[derive(Clone, Copy)]
struct Cli {
    podman: bool,
}

const DOCKER: Cli = Cli { podman: false };

const PODMAN_CLI: Cli = Cli { podman: true };

impl Cli {
    /// The runtime's name, in the names a test makes and in messages.
    fn name(&self) -> &'static str {
        if self.podman {
            "podman"
        } else {
            "docker"
        }
    }

    /// What mesh-host is given to reach this runtime: nothing for Docker, whose default
    /// socket it finds by itself, and Podman's service socket.
    fn socket(&self) -> Option<&'static str> {
        self.podman.then_some(PODMAN)
    }

    /// `apply --json` on this runtime, returning the exit code and the report.
    fn apply(&self, s: &Scratch, d: &Path) -> (i32, Value) {
        apply_on(s, d, self.socket())
    }

    /// `apply --json` on this runtime, which must succeed; the report.
    fn applied(&self, s: &Scratch, d: &Path) -> Value {
        let (code, report) = self.apply(s, d);
        assert_eq!(code, 0, "{report:#}");
        report
    }

    fn cmd(&self) -> Command {
        if self.podman {
            let mut c = Command::new("podman");
            c.arg("--url").arg(PODMAN);
            c
        } else {
            Command::new("docker")
        }
    }

    fn run(&self, args: &[&str]) -> (bool, String) {
        let out = self.cmd().args(args).output().expect("the runtime's CLI runs");
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text.trim().to_owned())
    }

    /// The CLI on the machine's own storage, not through an API service (Podman only).
    fn run_local(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(if self.podman { "podman" } else { "docker" })
            .args(args)
            .output()
            .expect("the CLI runs");
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text.trim().to_owned())
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, text) = self.run(args);
        assert!(ok, "{args:?} failed: {text}");
        text
    }

    /// A container's field through `inspect --format`, or `None` when there is no container.
    fn inspect(&self, name: &str, format: &str) -> Option<String> {
        let (ok, text) = self.run(&["container", "inspect", "--format", format, name]);
        ok.then_some(text)
    }

    fn running(&self, name: &str) -> bool {
        self.inspect(name, "{{.State.Running}}").as_deref() == Some("true")
    }

    fn id(&self, name: &str) -> String {
        self.inspect(name, "{{.Id}}").unwrap_or_else(|| panic!("no container {name}"))
    }

    fn exists_network(&self, name: &str) -> bool {
        self.run(&["network", "inspect", name]).0
    }
}

/// Fails, never skips, when the engine is not there.
fn require(cli: Cli) {
    let (ok, text) =
        if cli.podman { cli.run(&["info"]) } else { cli.run(&["info", "--format", "{{.ServerVersion}}"]) };
    assert!(ok, "no {} engine answers ({text}): {SETUP}", if cli.podman { "Podman" } else { "Docker" });
    let (ok, _) = cli.run(&["image", "inspect", IMAGE]);
    assert!(ok, "the image {IMAGE} is not there: {SETUP}");
}

/// Names unique to one test, and removed when it ends.
struct Names {
    cli: Cli,
    prefix: String,
    networks: Vec<String>,
}

impl Names {
    fn new(cli: Cli, test: &str) -> Names {
        require(cli);
        Names {
            cli,
            prefix: format!("mh-it-{}-{test}-{}", cli.name(), std::process::id()),
            networks: Vec::new(),
        }
    }

    fn container(&self, n: &str) -> String {
        format!("{}-{n}", self.prefix)
    }

    fn network(&mut self, n: &str) -> String {
        let name = format!("{}-net-{n}", self.prefix);
        self.networks.push(name.clone());
        name
    }
}

impl Drop for Names {
    fn drop(&mut self) {
        let (_, listed) = self.cli.run(&[
            "ps",
            "-a",
            "--filter",
            &format!("name={}", self.prefix),
            "--format",
            "{{.Names}}",
        ]);
        for name in listed.lines().filter(|l| !l.is_empty()) {
            let _ = self.cli.run(&["rm", "-f", name]);
        }
        for n in &self.networks {
            let _ = self.cli.run(&["network", "rm", n]);
        }
    }
}

/// `apply --json` with a container socket, returning the exit code and the report.
fn apply_on(s: &Scratch, d: &Path, socket: Option<&str>) -> (i32, Value) {
    match socket {
        Some(socket) => s.apply_with(&["--container-socket", socket], d),
        None => s.apply(d),
    }
}

fn applied(s: &Scratch, d: &Path) -> Value {
    let (code, report) = s.apply(d);
    assert_eq!(code, 0, "{report:#}");
    report
}

fn record(s: &Scratch, id: &str) -> Value {
    let Ok(bytes) = std::fs::read(s.state()) else { return Value::Null };
    let store: Value = serde_json::from_slice(&bytes).unwrap();
    store["records"][id].clone()
}

/// A program that runs until it is stopped, and stops on SIGTERM as a service does (a bare
/// `sleep` as PID 1 ignores it, and every stop would wait out the timeout).
const SERVE: [&str; 3] = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"];

fn sleeper(id: &str, name: &str) -> Value {
    json!({"type": "container", "id": id, "name": name, "image": IMAGE, "args": SERVE})
}

/// Writes a declaration to a file of its own name, for a test that goes back to an earlier one.
fn declare_as(s: &Scratch, file: &str, resources: Value) -> std::path::PathBuf {
    let path = s.path(file);
    let d = json!({"version": 1, "resources": resources});
    std::fs::write(&path, serde_json::to_vec_pretty(&d).unwrap()).unwrap();
    path
}

/// An engine of a test's own, which the test may stop and start again without disturbing the
/// machine's engines or any other test.
trait OwnEngine {
    /// Its API socket, `unix://...`.
    fn socket(&self) -> &str;

    /// Starts it, and waits until it answers.
    fn start(&mut self);

    /// Stops it as a service manager would, and waits for it to end.
    fn stop(&mut self);

    /// Runs its CLI, pointed at it; the command must succeed.
    fn ok(&self, args: &[&str]) -> String;
}

/// Runs a CLI; the command must succeed.
fn cli_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("the runtime's CLI runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed: {text}");
    text.trim().to_owned()
}

/// A Podman API service of this test's own, so stopping it disturbs no other test. It serves
/// the machine's Podman storage: what the shared service's CLI makes, it sees.
struct Service {
    socket: String,
    child: Option<std::process::Child>,
}

impl Service {
    fn new(socket: &str) -> Service {
        let mut service = Service { socket: socket.to_owned(), child: None };
        service.start();
        service
    }
}

impl OwnEngine for Service {
    fn socket(&self) -> &str {
        &self.socket
    }

    fn start(&mut self) {
        let path = self.socket.trim_start_matches("unix://");
        let _ = std::fs::remove_file(path);
        let child = Command::new("podman")
            .args(["system", "service", "--time=0", &self.socket])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("podman starts");
        self.child = Some(child);
        for _ in 0..100 {
            if Path::new(path).exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("a private podman service did not make {path} within 5 s");
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn ok(&self, args: &[&str]) -> String {
        cli_ok(Command::new("podman").arg("--url").arg(&self.socket).args(args))
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A Docker engine of this test's own: its own socket, data and state, and its own network
/// namespace, so restarting it disturbs neither the machine's engine nor any other test. (In
/// the machine's namespace, a second dockerd deletes the first one's `docker0` bridge.) It has
/// no bridge: its containers run with `--network none`.
struct PrivateDocker {
    dir: std::path::PathBuf,
    socket: String,
    child: Option<std::process::Child>,
}

impl PrivateDocker {
    fn new(dir: &Path) -> PrivateDocker {
        let socket = format!("unix://{}", dir.join("docker.sock").display());
        let mut d = PrivateDocker { dir: dir.to_owned(), socket, child: None };
        d.start();
        d
    }

    /// Copies the test image from the machine's engine, which its data root does not have.
    fn load_image(&self) {
        let script = format!("docker save {IMAGE} | docker -H {} load", self.socket);
        cli_ok(Command::new("sh").args(["-c", &script]));
    }
}

impl OwnEngine for PrivateDocker {
    fn socket(&self) -> &str {
        &self.socket
    }

    fn start(&mut self) {
        let arg = |name: &str| self.dir.join(name).display().to_string();
        let child = Command::new("unshare")
            .args(["--net", "dockerd"])
            .args(["--host", &self.socket, "--data-root", &arg("data"), "--exec-root", &arg("exec")])
            .args(["--pidfile", &arg("docker.pid"), "--iptables=false", "--ip6tables=false"])
            .args(["--bridge=none", "--ip-masq=false"])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("dockerd.log")).unwrap())
            .spawn()
            .expect("dockerd starts");
        self.child = Some(child);
        for _ in 0..100 {
            if Command::new("docker")
                .args(["-H", &self.socket, "info"])
                .output()
                .is_ok_and(|o| o.status.success())
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "a private dockerd did not answer within 10 s; see {}",
            self.dir.join("dockerd.log").display()
        );
    }

    /// SIGTERM, as a service manager would stop it.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let _ = child.wait();
        }
    }

    fn ok(&self, args: &[&str]) -> String {
        cli_ok(Command::new("docker").arg("-H").arg(&self.socket).args(args))
    }
}

impl Drop for PrivateDocker {
    fn drop(&mut self) {
        self.stop();
    }
}
