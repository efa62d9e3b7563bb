//! What every integration test needs: a scratch directory, a declaration writer, and the real
//! binary.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch {
            dir: tempfile::Builder::new().prefix("mesh-host-it-").tempdir().expect("a scratch directory"),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A path inside the scratch directory, as a string for a declaration.
    pub fn p(&self, rel: &str) -> String {
        self.path(rel).display().to_string()
    }

    pub fn state(&self) -> PathBuf {
        self.path("state/state.json")
    }

    /// Writes a declaration with these resources and returns its path.
    pub fn declare(&self, resources: Value) -> PathBuf {
        let path = self.path("declaration.json");
        let d = serde_json::json!({"version": 1, "resources": resources});
        std::fs::write(&path, serde_json::to_vec_pretty(&d).unwrap()).unwrap();
        path
    }

    /// Writes a declaration of an adopted node (no module taken) and returns its path.
    pub fn declare_adopted(&self, resources: Value) -> PathBuf {
        let path = self.path("declaration.json");
        let d = serde_json::json!({"version": 1, "adoption": {"taken": []}, "resources": resources});
        std::fs::write(&path, serde_json::to_vec_pretty(&d).unwrap()).unwrap();
        path
    }

    /// Runs mesh-host with `--state` pointing into the scratch directory.
    pub fn run(&self, args: &[&str]) -> Output {
        let mut cmd = assert_cmd::Command::cargo_bin("mesh-host").expect("the mesh-host binary");
        cmd.arg("--state").arg(self.state()).args(args);
        cmd.output().expect("mesh-host runs")
    }

    /// `apply --json`, returning the exit code and the report.
    pub fn apply(&self, declaration: &Path) -> (i32, Value) {
        self.apply_with(&[], declaration)
    }

    /// `apply --json` with more options (a bus, a container socket).
    pub fn apply_with(&self, options: &[&str], declaration: &Path) -> (i32, Value) {
        let mut args = options.to_vec();
        args.extend(["apply", "--json", declaration.to_str().unwrap()]);
        let out = self.run(&args);
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "apply printed no JSON report ({e}); stdout: {}; stderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code().unwrap_or(-1), report)
    }
}

/// The action reported for `id`.
pub fn action(report: &Value, id: &str) -> String {
    report["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["id"] == id)
        .map(|o| o["action"].as_str().unwrap().to_owned())
        .unwrap_or_else(|| panic!("no outcome for {id} in {report:#}"))
}

/// The detail reported for `id`.
pub fn detail(report: &Value, id: &str) -> String {
    report["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["id"] == id)
        .and_then(|o| o["detail"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

pub fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

/// A running `mesh-host run`, stopped (SIGKILL) when dropped if the test did not stop it.
pub struct Daemon {
    pub child: Option<std::process::Child>,
    pub port: u16,
    pub log: PathBuf,
}

/// A command for a test to build with (cargo, or a script that runs it), without what cargo
/// set in this test's own environment for the test (`CARGO_PKG_NAME`, `CARGO_MANIFEST_DIR`,
/// `OUT_DIR`, ...). Some dependencies' build scripts ask cargo to build again when those change
/// (ring's does), so a build run with them rebuilds ring, rustls and the agent, and the next
/// build from a shell rebuilds them again: about 100 s in CI, in the test and in the phase after.
pub fn build_command(program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
    let mut cmd = std::process::Command::new(program);
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let set_for_the_test =
            ["CARGO_PKG_", "CARGO_BIN_", "CARGO_MANIFEST_"].iter().any(|p| name.starts_with(p))
                || matches!(
                    name,
                    "CARGO_CRATE_NAME" | "CARGO_PRIMARY_PACKAGE" | "CARGO_TARGET_TMPDIR" | "OUT_DIR"
                );
        if set_for_the_test {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// `cargo` (the one running the tests where cargo says so), through [`build_command`].
pub fn cargo_command() -> std::process::Command {
    build_command(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Polls `cond` every 5 ms until it holds or `timeout` passes.
pub fn wait_for(timeout: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    cond()
}

pub const PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// A loopback port for a declaration to publish: one nothing listens on now, below the
/// kernel's range of ephemeral ports, so that no outgoing connection takes it before the
/// container binds it (a port derived from the pid alone once landed on one, and the container
/// could not start). Tried from a point set by the pid, and moved on at each call, so that
/// tests at once (in processes of their own, or threads of one) start apart.
pub fn unused_port() -> u16 {
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    const FROM: u32 = 20_000;
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next().and_then(|n| n.parse::<u32>().ok()))
        .unwrap_or(32_768);
    let span = ephemeral.saturating_sub(FROM).max(1);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let start = std::process::id().wrapping_mul(7).wrapping_add(call.wrapping_mul(101)) % span;
    (0..span)
        .map(|i| (FROM + (start + i) % span) as u16)
        .find(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
        .expect("a free loopback port below the ephemeral range")
}

impl Daemon {
    /// Starts the daemon on a declaration and waits until /healthz answers "ok".
    pub fn start(s: &Scratch, declaration: &Path, extra: &[&str]) -> Daemon {
        let d = Daemon::launch(s, declaration, extra, &[]);
        assert!(
            wait_for(PATIENCE, || d.get("/healthz").is_some_and(|b| b == "ok\n")),
            "the daemon never answered /healthz with ok:\n{}",
            d.log()
        );
        d
    }

    /// Starts the daemon with more environment (a failpoint) and waits until /healthz answers
    /// anything, healthy or not.
    pub fn launch(s: &Scratch, declaration: &Path, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        Daemon::launch_under(&[], s, declaration, extra, env)
    }

    /// `launch`, the daemon run by `wrapper` (a program and its arguments, given the daemon's
    /// command line after them, which it must exec: `unshare`, say), so that its pid is the
    /// daemon's.
    pub fn launch_under(
        wrapper: &[&str],
        s: &Scratch,
        declaration: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // Beside the scratch tree's files, not among them: the declaration watcher watches the
        // directory the declaration is in, and at trace level the inotify layer logs each event
        // it sees, so a log written into a watched directory feeds itself (each line an event,
        // each event a line) and starves the daemon on a loaded machine.
        let logs = s.path("logs");
        std::fs::create_dir_all(&logs).unwrap();
        let log = logs.join(format!("daemon-{port}.log"));
        let binary = assert_cmd::cargo::cargo_bin("mesh-host");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = std::process::Command::new(program);
                c.args(args).arg(&binary);
                c
            }
            None => std::process::Command::new(&binary),
        };
        let child = command
            .arg("--state")
            .arg(s.state())
            .args(["run", "--declaration"])
            .arg(declaration)
            .args(["--metrics", &format!("127.0.0.1:{port}")])
            .args(extra)
            .env("MESH_HOST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::options().append(true).open(&log).unwrap())
            .spawn()
            .expect("mesh-host starts");
        let d = Daemon { child: Some(child), port, log };
        assert!(
            wait_for(PATIENCE, || d.answer("/healthz").is_some()),
            "the daemon never answered /healthz:\n{}",
            d.log()
        );
        d
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GETs a path, returning the body of a 200 answer.
    pub fn get(&self, path: &str) -> Option<String> {
        self.answer(path).and_then(|(status, body)| (status == 200).then_some(body))
    }

    /// GETs a path, returning the status code and the body of whatever answer came.
    pub fn answer(&self, path: &str) -> Option<(u16, String)> {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let (head, body) = out.split_once("\r\n\r\n")?;
        let status = head.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
        Some((status, body.to_owned()))
    }

    /// The value of one sample, by its full name with labels, or 0 when absent. A sample named
    /// with fewer labels than the series carry is their sum: `drift{type="file"}` adds up
    /// `drift{type="file",writer="..."}` over every writer.
    pub fn metric(&self, sample: &str) -> f64 {
        metric_in(&self.get("/metrics").unwrap_or_default(), sample)
    }

    /// Sends SIGTERM and returns the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let start = std::time::Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.code();
            }
            if start.elapsed() > PATIENCE {
                let _ = child.kill();
                panic!("the daemon did not stop on SIGTERM:\n{}", self.log());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A sample's value in a scrape `body`: the series named exactly, or for `name{labels}` the sum
/// over every series with those labels and more (the correction counter's `writer`); 0 when
/// none is there.
pub fn metric_in(body: &str, sample: &str) -> f64 {
    let exact = body.lines().find_map(|l| l.strip_prefix(sample).and_then(|rest| rest.strip_prefix(' ')));
    if let Some(v) = exact {
        return v.trim().parse().unwrap();
    }
    // A bare name sums every labelled series of it (a counter that gained a label, such as
    // the refusals' reason, still reads as its total).
    let wider = match sample.strip_suffix('}') {
        Some(open) => format!("{open},"),
        None => format!("{sample}{{"),
    };
    body.lines()
        .filter_map(|l| l.strip_prefix(&wider))
        .filter_map(|rest| rest.rsplit_once("} "))
        .map(|(_, v)| v.trim().parse::<f64>().unwrap())
        .sum()
}
