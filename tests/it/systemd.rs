//! Services, processes and the systemd watcher, against the real systemd that
//! `tests/testbed/systemd.sh` boots with systemd-nspawn. mesh-host runs on the host and reaches
//! that systemd over its bus; unit files are written into the booted tree. Every test uses unit
//! names of its own, so they run in parallel. A test named after an incident (`zbus_queue_`) is
//! its regression test: it fails on the code before that incident's fix.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::*;

pub const ROOT: &str = "/var/lib/machines/mesh-host-testbed";
pub const SOCKET: &str = "/run/mesh-host-testbed/bus/system_bus_socket";
const PIDFILE: &str = "/run/mesh-host-testbed/nspawn.pid";

/// The booted testbed. A test that cannot find it fails, saying how to start it: a test of
/// systemd that passes without a systemd would prove nothing.
pub struct Testbed {
    /// The pid of systemd inside, for nsenter.
    pid: u32,
}

pub fn testbed() -> Testbed {
    let how = "run `sudo tests/testbed/systemd.sh` to boot the systemd testbed";
    let nspawn: u32 = std::fs::read_to_string(PIDFILE)
        .unwrap_or_else(|e| panic!("no systemd testbed ({PIDFILE}: {e}); {how}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{PIDFILE} does not hold a pid ({e}); {how}"));
    let children = std::fs::read_dir(format!("/proc/{nspawn}/task"))
        .unwrap_or_else(|e| panic!("the testbed's systemd-nspawn ({nspawn}) is not running ({e}); {how}"))
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .collect::<String>();
    let pid =
        children.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or_else(|| {
            panic!("the testbed's systemd-nspawn ({nspawn}) has no systemd inside; {how}")
        });
    assert!(Path::new(SOCKET).exists(), "no bus socket at {SOCKET}; {how}");
    Testbed { pid }
}

impl Testbed {
    pub fn bus(&self) -> String {
        format!("unix:path={SOCKET}")
    }

    /// `systemctl` inside the testbed, as a person at its console would run it.
    pub fn systemctl(&self, args: &[&str]) -> String {
        let out = Command::new("nsenter")
            .args(["-t", &self.pid.to_string(), "-a", "systemctl"])
            .args(args)
            .output()
            .expect("nsenter runs");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// A program run inside the testbed, as a person at its console would run it.
    pub fn inside(&self, program: &str, args: &[&str]) -> std::process::Output {
        Command::new("nsenter")
            .args(["-t", &self.pid.to_string(), "-a", program])
            .args(args)
            .output()
            .expect("nsenter runs")
    }

    pub fn active(&self, unit: &str) -> String {
        self.systemctl(&["is-active", unit])
    }

    pub fn enabled(&self, unit: &str) -> String {
        self.systemctl(&["is-enabled", unit])
    }

    pub fn show(&self, unit: &str, property: &str) -> String {
        self.systemctl(&["show", "--value", "-p", property, unit])
    }

    /// A path inside the testbed, as seen from the host.
    pub fn path(&self, inside: &str) -> PathBuf {
        Path::new(ROOT).join(inside.trim_start_matches('/'))
    }

    /// Writes a unit file and has systemd read it.
    pub fn unit(&self, name: &str, body: &str) {
        std::fs::write(self.path(&format!("/etc/systemd/system/{name}")), body).unwrap();
        self.systemctl(&["daemon-reload"]);
    }

    /// Stops and removes a test's unit and whatever it left, even when the test failed.
    pub fn clean(&self, units: &[&str], paths: &[&str]) {
        for u in units {
            self.systemctl(&["disable", "--now", u]);
            self.systemctl(&["reset-failed", u]);
            let _ = std::fs::remove_file(self.path(&format!("/etc/systemd/system/{u}")));
            let _ = std::fs::remove_dir_all(self.path(&format!("/etc/systemd/system/{u}.d")));
        }
        for p in paths {
            let _ = std::fs::remove_file(self.path(p));
        }
        self.systemctl(&["daemon-reload"]);
    }
}

/// A name no other test, nor an earlier run, uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{prefix}{}x{}x{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed), nanos % 100_000)
}

/// `apply --json` against the testbed's bus.
pub fn apply_on(s: &Scratch, bus: &str, declaration: &Path) -> (i32, Value) {
    s.apply_with(&["--bus", bus], declaration)
}

fn sleeper(extra: &str) -> String {
    format!(
        "[Unit]\nDescription=mesh-host test\n[Service]\nExecStart=/bin/sleep infinity\n{extra}\n[Install]\nWantedBy=multi-user.target\n"
    )
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn service_start_stop_enable_disable_each_read_back() {
    let t = testbed();
    let unit = format!("{}.service", unique("mh-it-svc"));
    t.unit(&unit, &sleeper(""));
    let s = Scratch::new();
    let bus = t.bus();

    let d = s.declare(
        json!([{"type": "service", "id": "web.svc", "unit": unit, "state": "running", "boot": "enabled"}]),
    );
    let (code, report) = apply_on(&s, &bus, &d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "web.svc"), "updated");
    assert_eq!(detail(&report, "web.svc"), "boot disabled to enabled, started (was inactive)");
    assert_eq!(t.active(&unit), "active");
    assert_eq!(t.enabled(&unit), "enabled");

    let (code, report) = apply_on(&s, &bus, &d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "web.svc"), "unchanged");

    // Stopped by hand: put back, and said to be a correction.
    t.systemctl(&["stop", &unit]);
    let (code, report) = apply_on(&s, &bus, &d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "web.svc"), "corrected");
    assert_eq!(t.active(&unit), "active");

    let d = s.declare(
        json!([{"type": "service", "id": "web.svc", "unit": unit, "state": "stopped", "boot": "disabled"}]),
    );
    let (code, report) = apply_on(&s, &bus, &d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "web.svc"), "updated");
    assert_eq!(detail(&report, "web.svc"), "boot enabled to disabled, stopped (was active)");
    assert_eq!(t.active(&unit), "inactive");
    assert_eq!(t.enabled(&unit), "disabled");

    // No longer declared while running: stopped, and the unit file is left where it was.
    let d = s.declare(json!([{"type": "service", "id": "web.svc", "unit": unit, "state": "running"}]));
    assert_eq!(apply_on(&s, &bus, &d).0, 0);
    let (code, report) = apply_on(&s, &bus, &s.declare(json!([])));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "web.svc"), "removed");
    assert_eq!(t.active(&unit), "inactive");
    assert!(t.path(&format!("/etc/systemd/system/{unit}")).exists());
    t.clean(&[&unit], &[]);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_unit_that_dies_at_once_is_an_error() {
    let t = testbed();
    let unit = format!("{}.service", unique("mh-it-dies"));
    t.unit(&unit, "[Service]\nExecStart=/bin/sh -c 'echo bad config >&2; exit 3'\n");
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "service", "id": "web.svc", "unit": unit, "state": "running"}]));
    let (code, report) = apply_on(&s, &t.bus(), &d);
    assert_eq!(code, 1, "{report:#}");
    let message = report["error"]["message"].as_str().unwrap();
    assert!(message.contains("exited or died at once"), "{message}");
    assert!(message.contains(&unit), "{message}");
    // Nothing recorded: the record follows the fact.
    let state = std::fs::read_to_string(s.state()).unwrap_or_default();
    assert!(!state.contains("web.svc"), "{state}");
    t.clean(&[&unit], &[]);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn units_started_together_settle_together_and_one_that_dies_is_still_an_error() {
    let t = testbed();
    let dies = format!("{}.service", unique("mh-it-dies-"));
    let stays = format!("{}.service", unique("mh-it-stays-"));
    t.unit(&dies, "[Service]\nExecStart=/bin/sh -c 'sleep 0.1; exit 3'\n");
    t.unit(&stays, &sleeper(""));
    let s = Scratch::new();
    // The action is a gate: the units before it have their second look before it runs, and a
    // unit that died does not gate it.
    let d = s.declare(json!([
        {"type": "service", "id": "web.dies", "unit": dies, "state": "running"},
        {"type": "service", "id": "web.stays", "unit": stays, "state": "running"},
        {"type": "action", "id": "web.after", "command": ["touch", s.p("ran")], "verify": ["test", "-f", s.p("ran")]},
    ]));
    let (code, report) = apply_on(&s, &t.bus(), &d);
    assert_eq!(code, 1, "{report:#}");
    let failures = report["error"]["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{report:#}");
    assert_eq!(failures[0]["id"], "web.dies");
    let message = failures[0]["message"].as_str().unwrap();
    assert!(message.contains("exited or died at once") && message.contains(&dies), "{message}");
    assert_eq!(action(&report, "web.stays"), "updated", "{report:#}");
    assert_eq!(t.active(&stays), "active");
    assert!(s.path("ran").exists(), "the action after them ran: {report:#}");
    let state = std::fs::read_to_string(s.state()).unwrap_or_default();
    assert!(state.contains("web.stays") && !state.contains("web.dies"), "{state}");
    t.clean(&[&dies, &stays], &[]);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_missing_unit_is_an_error_and_removing_one_is_forgotten() {
    let t = testbed();
    let s = Scratch::new();
    let bus = t.bus();
    let missing = format!("{}.service", unique("mh-it-none"));
    let d = s.declare(json!([{"type": "service", "id": "web.svc", "unit": missing, "state": "running"}]));
    let (code, report) = apply_on(&s, &bus, &d);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(
        report["error"]["message"].as_str().unwrap(),
        format!("the unit {missing} does not exist on this machine")
    );

    // Applied once, then its unit uninstalled by hand: removal has nothing left to do.
    let unit = format!("{}.service", unique("mh-it-gone"));
    t.unit(&unit, &sleeper(""));
    let d = s.declare(json!([{"type": "service", "id": "web.gone", "unit": unit, "state": "running"}]));
    assert_eq!(apply_on(&s, &bus, &d).0, 0);
    t.clean(&[&unit], &[]);
    let (code, report) = apply_on(&s, &bus, &s.declare(json!([])));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "web.gone"), "forgotten");
    assert!(detail(&report, "web.gone").contains("no longer exists"), "{report:#}");
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_unit_file_changed_on_disk_is_read_again_before_a_start() {
    let t = testbed();
    let name = unique("mh-it-edit");
    let unit = format!("{name}.service");
    let seen = format!("/var/lib/{name}.seen");
    let body = |word: &str| {
        format!("[Service]\nExecStart=/bin/sh -c 'echo {word} > {seen}; exec sleep infinity'\n[Install]\nWantedBy=multi-user.target\n")
    };
    t.unit(&unit, &body("old"));
    // Enabled, so systemd keeps it loaded (the target wants it), then edited without telling
    // systemd: the unit it holds is the old one.
    t.systemctl(&["enable", &unit]);
    // Other tests reload the manager at any moment, which would read the edit for us: edit
    // until systemd is seen holding the old unit, so the apply has to be the one that reloads.
    // (systemd compares modification times, so each edit comes a moment after the last.)
    let mut edits = 0;
    while t.show(&unit, "NeedDaemonReload") != "yes" {
        edits += 1;
        assert!(edits <= 20, "systemd never saw the unit file as changed");
        std::thread::sleep(Duration::from_millis(100));
        std::fs::write(t.path(&format!("/etc/systemd/system/{unit}")), body("new")).unwrap();
    }
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "service", "id": "web.svc", "unit": unit, "state": "running"}]));
    let (code, report) = apply_on(&s, &t.bus(), &d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(std::fs::read_to_string(t.path(&seen)).unwrap(), "new\n");
    t.clean(&[&unit], &[&seen]);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_masked_unit_is_refused_only_when_it_must_start() {
    let t = testbed();
    let unit = format!("{}.service", unique("mh-it-mask"));
    // Where a package puts its units: masking writes a link in /etc, which a unit file there
    // would be in the way of.
    let vendor = t.path(&format!("/usr/lib/systemd/system/{unit}"));
    std::fs::write(&vendor, sleeper("")).unwrap();
    t.systemctl(&["daemon-reload"]);
    t.systemctl(&["mask", &unit]);
    assert_eq!(t.enabled(&unit), "masked");
    let s = Scratch::new();
    let bus = t.bus();
    let d = s.declare(
        json!([{"type": "service", "id": "web.svc", "unit": unit, "state": "stopped", "boot": "disabled"}]),
    );
    let (code, report) = apply_on(&s, &bus, &d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "web.svc"), "unchanged");
    let d = s.declare(json!([{"type": "service", "id": "web.svc", "unit": unit, "state": "running"}]));
    let (code, report) = apply_on(&s, &bus, &d);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(
        report["error"]["message"].as_str().unwrap(),
        format!("the unit {unit} is masked; mesh-host does not unmask a unit someone masked on purpose")
    );
    t.systemctl(&["unmask", &unit]);
    let _ = std::fs::remove_file(vendor);
    t.clean(&[&unit], &[]);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn restart_on_a_changed_drop_in_reloads_units_then_restarts() {
    let t = testbed();
    let name = unique("mh-it-rst");
    let unit = format!("{name}.service");
    let seen = format!("/var/lib/{name}.seen");
    t.unit(
        &unit,
        &format!("[Service]\nExecStart=/bin/sh -c 'echo \"$GREETING\" > {seen}; exec sleep infinity'\n"),
    );
    let dropin = t.path(&format!("/etc/systemd/system/{unit}.d/greeting.conf"));
    std::fs::create_dir_all(dropin.parent().unwrap()).unwrap();
    let s = Scratch::new();
    let bus = t.bus();
    let declare = |greeting: &str| {
        s.declare(json!([
            {"type": "file", "id": "web.greeting", "path": dropin.display().to_string(),
             "content": format!("[Service]\nEnvironment=GREETING={greeting}\n")},
            {"type": "service", "id": "web.svc", "unit": unit, "state": "running", "restart-on": ["web.greeting"]},
        ]))
    };
    let (code, report) = apply_on(&s, &bus, &declare("one"));
    assert_eq!(code, 0, "{report:#}");
    // Reloaded before the start, so the drop-in written in this pass is what runs.
    assert_eq!(std::fs::read_to_string(t.path(&seen)).unwrap(), "one\n");
    let pid = t.show(&unit, "MainPID");

    let (code, report) = apply_on(&s, &bus, &declare("one"));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "web.svc"), "unchanged");
    assert_eq!(t.show(&unit, "MainPID"), pid);

    let (code, report) = apply_on(&s, &bus, &declare("two"));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "web.greeting"), "updated");
    assert_eq!(action(&report, "web.svc"), "updated");
    assert_eq!(detail(&report, "web.svc"), "restarted for web.greeting");
    assert_ne!(t.show(&unit, "MainPID"), pid);
    assert_eq!(std::fs::read_to_string(t.path(&seen)).unwrap(), "two\n");
    assert_eq!(t.show(&unit, "NeedDaemonReload"), "no");
    t.clean(&[&unit], &[&seen]);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn reload_on_reloads_a_running_unit_without_restarting_it() {
    let t = testbed();
    let name = unique("mh-it-rld");
    let unit = format!("{name}.service");
    let reloads = format!("/var/lib/{name}.reloads");
    t.unit(&unit, &sleeper(&format!("ExecReload=/bin/sh -c 'echo reloaded >> {reloads}'")));
    let conf = t.path(&format!("/etc/{name}.conf"));
    let s = Scratch::new();
    let bus = t.bus();
    let declare = |content: &str| {
        s.declare(json!([
            {"type": "file", "id": "web.conf", "path": conf.display().to_string(), "content": content},
            {"type": "service", "id": "web.svc", "unit": unit, "state": "running", "reload-on": ["web.conf"]},
        ]))
    };
    let (code, report) = apply_on(&s, &bus, &declare("a\n"));
    assert_eq!(code, 0, "{report:#}");
    // Not running before: started, which reads the new file anyway; nothing to reload.
    assert_eq!(detail(&report, "web.svc"), "started (was inactive)");
    assert!(!t.path(&reloads).exists());
    let pid = t.show(&unit, "MainPID");

    let (code, report) = apply_on(&s, &bus, &declare("b\n"));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(detail(&report, "web.svc"), "reloaded for web.conf");
    assert_eq!(std::fs::read_to_string(t.path(&reloads)).unwrap(), "reloaded\n");
    assert_eq!(t.show(&unit, "MainPID"), pid, "reloaded, not restarted");
    assert_eq!(t.active(&unit), "active");
    t.clean(&[&unit], &[&reloads, &format!("/etc/{name}.conf")]);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_process_is_created_replaced_on_change_restarted_and_removed() {
    let t = testbed();
    let name = unique("mh-it-proc");
    let unit = format!("mesh-host-{name}.service");
    let conf = t.path(&format!("/etc/{name}.conf"));
    let s = Scratch::new();
    let bus = t.bus();
    let declare = |env: &str, conf_content: &str| {
        s.declare(json!([
            {"type": "file", "id": "job.conf", "path": conf.display().to_string(), "content": conf_content},
            {"type": "process", "id": "job.worker", "name": name, "command": ["/bin/sleep", "1000"],
             "env": {"MODE": env}, "user": "nobody", "restart-on": ["job.conf"]},
        ]))
    };
    let (code, report) = apply_on(&s, &bus, &declare("one", "x"));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "job.worker"), "created");
    assert_eq!(t.active(&unit), "active");
    assert_eq!(t.show(&unit, "Environment"), "MODE=one");
    assert_eq!(t.show(&unit, "User"), "nobody");
    let pid = t.show(&unit, "MainPID");

    let (code, report) = apply_on(&s, &bus, &declare("one", "x"));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "job.worker"), "unchanged");
    assert_eq!(t.show(&unit, "MainPID"), pid);

    // A changed environment is a different program: the unit is replaced.
    let (code, report) = apply_on(&s, &bus, &declare("two", "x"));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "job.worker"), "updated");
    assert!(detail(&report, "job.worker").contains("replaced"), "{report:#}");
    assert_eq!(t.show(&unit, "Environment"), "MODE=two");
    let replaced = t.show(&unit, "MainPID");
    assert_ne!(replaced, pid);

    let (code, report) = apply_on(&s, &bus, &declare("two", "y"));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(detail(&report, "job.worker"), format!("{unit} restarted for job.conf"));
    assert_ne!(t.show(&unit, "MainPID"), replaced);

    // Stopped by hand, a transient unit is gone: started again, as a correction.
    t.systemctl(&["stop", &unit]);
    let (code, report) = apply_on(&s, &bus, &declare("two", "y"));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "job.worker"), "corrected");
    assert_eq!(t.active(&unit), "active");

    let (code, report) = apply_on(&s, &bus, &s.declare(json!([])));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "job.worker"), "removed");
    assert_eq!(t.show(&unit, "LoadState"), "not-found");
    let _ = std::fs::remove_file(conf);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_process_that_cannot_stay_up_is_an_error() {
    let t = testbed();
    let name = unique("mh-it-bad");
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "process", "id": "job.bad", "name": name, "command": ["/bin/false"]}]));
    let (code, report) = apply_on(&s, &t.bus(), &d);
    assert_eq!(code, 1, "{report:#}");
    assert!(report["error"]["message"].as_str().unwrap().contains(&format!("mesh-host-{name}.service")));
    t.systemctl(&["stop", &format!("mesh-host-{name}.service")]);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn watcher_reports_a_unit_stopped_by_hand() {
    let t = testbed();
    let unit = format!("{}.service", unique("mh-it-watch"));
    // Barriers: a sentinel unit's kill is one state change, reported only after everything
    // systemd sent before it (watchers::systemd::next_signal). Each is killed once, so the
    // first change reported for it is its kill's.
    let sentinels: Vec<String> = (0..3).map(|_| format!("{}.service", unique("mh-it-sentinel"))).collect();
    t.unit(&unit, &sleeper(""));
    for s in &sentinels {
        t.unit(s, &sleeper(""));
        t.systemctl(&["start", s]);
    }
    t.systemctl(&["start", &unit]);
    let all = |with_unit: bool| {
        let mut set: BTreeSet<String> = sentinels.iter().cloned().collect();
        if with_unit {
            set.insert(unit.clone());
        }
        set
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        use mesh_host_watchers::Change;
        let (units_tx, units) = tokio::sync::watch::channel(all(true));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let task = mesh_host_watchers::systemd::spawn(Some(t.bus()), units, tx);
        up(&mut rx).await;
        let stopped = Instant::now();
        let out = Command::new("nsenter")
            .args(["-t", &t.pid.to_string(), "-a", "systemctl", "stop", &unit])
            .status()
            .unwrap();
        assert!(out.success());
        let change = next(&mut rx).await;
        assert_eq!(change, Some(Change::Unit { unit: unit.clone() }), "after {:?}", stopped.elapsed());
        // The stop sent several signals (ActiveState moving, the job ending): past the barrier,
        // all of them have been reported.
        barrier(&t, &sentinels[0], &mut rx).await;

        // A unit taken out of the set says nothing; put back, it is reported again.
        units_tx.send(all(false)).unwrap();
        t.systemctl(&["start", &unit]);
        let before = barrier(&t, &sentinels[1], &mut rx).await;
        let moved = Change::Unit { unit: unit.clone() };
        assert!(!before.contains(&moved), "a change of a unit no longer watched was reported: {before:?}");
        units_tx.send(all(true)).unwrap();
        t.systemctl(&["stop", &unit]);
        until_unit(&mut rx, unit.clone()).await;

        // Killed rather than stopped: no job ends, so only the unit's own PropertiesChanged can
        // say so. Past the barrier every signal of the start has been reported, so the change
        // that follows is the kill's.
        t.systemctl(&["start", &unit]);
        barrier(&t, &sentinels[2], &mut rx).await;
        t.systemctl(&["kill", "--signal=KILL", &unit]);
        let before = until_unit(&mut rx, unit.clone()).await;
        assert!(
            before.iter().all(|c| matches!(c, Change::Unit { unit } if sentinels.contains(unit))),
            "{before:?}"
        );
        task.abort();
    });
    let mut units: Vec<&str> = sentinels.iter().map(String::as_str).collect();
    units.push(&unit);
    t.clean(&units, &[]);
}

/// Kills a sentinel unit (once per test: it stays dead) and returns what the watcher reported
/// before its kill, which is everything systemd sent before it.
async fn barrier(
    t: &Testbed,
    sentinel: &str,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<mesh_host_watchers::Change>,
) -> Vec<mesh_host_watchers::Change> {
    t.systemctl(&["kill", "--signal=KILL", sentinel]);
    until_unit(rx, sentinel.to_owned()).await
}

/// Every change reported before the first one of `unit`, which must come within 10 s.
async fn until_unit(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<mesh_host_watchers::Change>,
    unit: String,
) -> Vec<mesh_host_watchers::Change> {
    let mut before = Vec::new();
    loop {
        match next(rx).await {
            Some(mesh_host_watchers::Change::Unit { unit: u }) if u == unit => return before,
            Some(c) => before.push(c),
            None => panic!("no change of {unit} within 10 s; before: {before:?}"),
        }
    }
}

async fn next(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<mesh_host_watchers::Change>,
) -> Option<mesh_host_watchers::Change> {
    tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.ok().flatten()
}

/// A stand-in for the bus socket that forwards to the testbed's, and can cut every connection
/// through it: the bus going away, as the watcher sees it, without stopping the testbed that
/// other tests are using.
struct Relay {
    path: PathBuf,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    listener: Option<tokio::task::JoinHandle<()>>,
}

impl Relay {
    fn new(path: PathBuf) -> Relay {
        Relay { path, conns: Default::default(), listener: None }
    }

    fn listen(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let listener = tokio::net::UnixListener::bind(&self.path).unwrap();
        let conns = self.conns.clone();
        self.listener = Some(tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::UnixStream::connect(SOCKET).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                conns.lock().unwrap().push(task);
            }
        }));
    }

    /// Closes every connection, and stops accepting new ones.
    fn cut(&mut self) {
        if let Some(l) = self.listener.take() {
            l.abort();
        }
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn watcher_reconnects_when_the_bus_goes_away_and_says_to_resync() {
    use mesh_host_watchers::{Change, Watcher};
    let t = testbed();
    let unit = format!("{}.service", unique("mh-it-recon"));
    t.unit(&unit, &sleeper(""));
    let s = Scratch::new();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut relay = Relay::new(s.path("bus"));
        let (_units_tx, units) = tokio::sync::watch::channel(BTreeSet::from([unit.clone()]));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let task = mesh_host_watchers::systemd::spawn(Some(format!("unix:path={}", s.p("bus"))), units, tx);

        // Nothing listening yet: down, then up once it is, with a resync since it missed time.
        assert_eq!(next(&mut rx).await, Some(Change::Up { watcher: Watcher::Systemd, up: false }));
        relay.listen();
        assert_eq!(next(&mut rx).await, Some(Change::Up { watcher: Watcher::Systemd, up: true }));
        assert_eq!(next(&mut rx).await, Some(Change::Resynced { watcher: Watcher::Systemd }));

        // The bus goes away while connected; what happens meanwhile is missed.
        relay.cut();
        assert_eq!(next(&mut rx).await, Some(Change::Up { watcher: Watcher::Systemd, up: false }));
        t.systemctl(&["start", &unit]);
        let back = Instant::now();
        relay.listen();
        assert_eq!(next(&mut rx).await, Some(Change::Up { watcher: Watcher::Systemd, up: true }));
        assert_eq!(next(&mut rx).await, Some(Change::Resynced { watcher: Watcher::Systemd }));
        assert!(back.elapsed() < Duration::from_secs(5), "reconnected after {:?}", back.elapsed());

        // And it follows the unit again on the new connection.
        t.systemctl(&["stop", &unit]);
        assert_eq!(next(&mut rx).await, Some(Change::Unit { unit: unit.clone() }));

        // Dropping the receiver ends the task.
        drop(rx);
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("the watcher ends").unwrap();
        relay.cut();
    });
    t.clean(&[&unit], &[]);
}

/// Sends `PropertiesChanged` signals for a unit nobody watches, as fast as one connection can,
/// until `stop` or `limit`, counting them in `sent`. Any client may send a signal on the bus, and the
/// watcher's match rules name no sender (they must hold across a systemd re-execution), so
/// these reach its stream exactly as a burst from systemd would.
async fn flood(
    bus: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sent: std::sync::Arc<std::sync::atomic::AtomicU64>,
    limit: Duration,
) {
    use std::collections::HashMap;
    use zbus::Variant as Value;
    let conn = zbus::conn::Builder::address(bus.as_str()).build().await.unwrap();
    let body: (&str, HashMap<&str, Value>, Vec<&str>) =
        ("org.freedesktop.systemd1.Unit", HashMap::from([("ActiveState", Value::from("active"))]), vec![]);
    let path = mesh_host_watchers::systemd::unit_path("mh-it-flood-nobody-watches.service");
    let started = Instant::now();
    while !stop.load(Ordering::Relaxed) && started.elapsed() < limit {
        conn.emit_signal(
            None::<&str>,
            path.as_str(),
            "org.freedesktop.DBus.Properties",
            "PropertiesChanged",
            &body,
        )
        .await
        .unwrap();
        sent.fetch_add(1, Ordering::Relaxed);
    }
}

/// The incident recorded at `QUEUE` in watchers/src/systemd.rs: the watcher's streams exist
/// before it subscribes, and nothing reads them while `Subscribe` is awaited. A burst of
/// signals meanwhile (then: other clients' manager reloads) filled a stream's 64-message queue,
/// zbus stopped reading the connection, the reply with it, and the watcher sat connected and
/// deaf. Here a flood runs while the watcher connects: its first attempt must succeed (a
/// timed-out one says `Up` false first), and it must then report a unit stopped.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn zbus_queue_a_burst_of_signals_while_subscribing_leaves_the_watcher_neither_stuck_nor_deaf() {
    use mesh_host_watchers::{Change, Watcher};
    let t = testbed();
    let unit = format!("{}.service", unique("mh-it-burst"));
    t.unit(&unit, &sleeper(""));
    t.systemctl(&["start", &unit]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sent = rt.block_on(async {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        // Past CONNECT_TIMEOUT (5 s), so a watcher stuck on its first attempt shows it.
        let floods: Vec<_> = (0..4)
            .map(|_| tokio::spawn(flood(t.bus(), stop.clone(), sent.clone(), Duration::from_secs(8))))
            .collect();
        // The flood is under way before the watcher makes its streams.
        let under_way = async {
            while sent.load(Ordering::Relaxed) < 1000 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), under_way).await.expect("the flood began");
        let (_units_tx, units) = tokio::sync::watch::channel(BTreeSet::from([unit.clone()]));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let task = mesh_host_watchers::systemd::spawn(Some(t.bus()), units, tx);
        let first = next(&mut rx).await;
        stop.store(true, Ordering::Relaxed);
        for f in floods {
            f.await.unwrap();
        }
        let sent = sent.load(Ordering::Relaxed);
        assert_eq!(
            first,
            Some(Change::Up { watcher: Watcher::Systemd, up: true }),
            "the first connection did not come up during a burst of {sent} signals"
        );
        t.systemctl(&["stop", &unit]);
        until_unit(&mut rx, unit.clone()).await;
        task.abort();
        sent
    });
    eprintln!("{sent} signals sent during the watcher's connection");
    t.clean(&[&unit], &[]);
}

/// Waits for the watcher to say it is connected. A first attempt that fails (it is bounded in
/// time, and retried) is allowed for: it is the watcher's contract, not a fault.
async fn up(rx: &mut tokio::sync::mpsc::UnboundedReceiver<mesh_host_watchers::Change>) {
    use mesh_host_watchers::Change;
    loop {
        match next(rx).await {
            Some(Change::Up { up: true, .. }) => return,
            Some(Change::Up { up: false, .. } | Change::Resynced { .. }) => continue,
            other => panic!("the watcher did not come up: {other:?}"),
        }
    }
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn on_an_adopted_node_units_packages_and_users_of_untaken_modules_are_held() {
    let t = testbed();
    let unit = format!("{}.service", unique("mh-it-held"));
    let taken = format!("{}.service", unique("mh-it-taken"));
    // A process of the same name as the host's transient unit for it, already running: found.
    let proc_name = unique("mh-it-heldproc");
    let proc_unit = format!("mesh-host-{proc_name}.service");
    t.unit(&unit, &sleeper(""));
    t.unit(&taken, &sleeper(""));
    t.unit(&proc_unit, &sleeper(""));
    t.systemctl(&["start", &proc_unit]);
    let proc_pid = t.show(&proc_unit, "MainPID");
    let s = Scratch::new();
    let d = s.path("adopted.json");
    std::fs::write(
        &d,
        serde_json::to_vec(&json!({"version": 1, "adoption": {"taken": ["mine"]}, "resources": [
            {"type": "service", "id": "theirs.svc", "unit": unit, "state": "running"},
            {"type": "package", "id": "theirs.pkg", "package": "dpkg"},
            {"type": "user", "id": "theirs.user", "name": "root"},
            {"type": "process", "id": "theirs.proc", "name": proc_name, "command": ["/bin/sleep", "1000"]},
            {"type": "service", "id": "mine.svc", "unit": taken, "state": "running"},
        ]}))
        .unwrap(),
    )
    .unwrap();
    let (code, report) = apply_on(&s, &t.bus(), &d);
    assert_eq!(code, 0, "{report:#}");
    for id in ["theirs.svc", "theirs.pkg", "theirs.user", "theirs.proc"] {
        assert_eq!(action(&report, id), "held", "{report:#}");
    }
    assert_eq!(t.show(&proc_unit, "MainPID"), proc_pid, "the process found is left running as it is");
    // Stopped by its owner, it stays held: not the host's to start.
    t.systemctl(&["stop", &proc_unit]);
    let (code, again) = apply_on(&s, &t.bus(), &d);
    assert_eq!(code, 0, "{again:#}");
    assert_eq!(action(&again, "theirs.proc"), "held", "{again:#}");
    assert_ne!(t.active(&proc_unit), "active");
    assert_eq!(action(&report, "mine.svc"), "updated");
    assert_eq!(t.active(&unit), "inactive", "held as found, not started");
    assert_eq!(t.active(&taken), "active");
    let state: serde_json::Value = serde_json::from_slice(&std::fs::read(s.state()).unwrap()).unwrap();
    let records = state["records"].as_object().unwrap();
    assert!(records.keys().all(|id| !id.starts_with("theirs.")), "held is never recorded: {state:#}");
    // It is remembered as held, until its module is taken.
    for id in ["theirs.svc", "theirs.pkg", "theirs.user"] {
        assert!(state["held"][id].is_object(), "{state:#}");
    }
    t.clean(&[&unit, &taken, &proc_unit], &[]);
}

/// A process or service of an untaken module that would run a program from a held directory,
/// be restarted by a held file, or whose unit file is held, is held and not started (issue 21,
/// item 2), against the systemd testbed.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn on_an_adopted_node_units_that_would_run_over_what_is_held_are_held() {
    let t = testbed();
    let proc_name = unique("mh-it-overproc");
    let proc_unit = format!("mesh-host-{proc_name}.service");
    let restarted = format!("{}.service", unique("mh-it-overrestart"));
    let with_file = format!("{}.service", unique("mh-it-overfile"));
    let s = Scratch::new();
    std::fs::create_dir_all(s.path("opt/bin")).unwrap();
    std::fs::write(s.path("opt/bin/tool"), "#!/bin/sh\n").unwrap();
    std::fs::write(s.path("app.conf"), "theirs\n").unwrap();
    let unit_file = t.path(&format!("/etc/systemd/system/{with_file}"));
    let d = s.path("adopted.json");
    let declaration = json!({"version": 1, "adoption": {"taken": []}, "resources": [
        {"type": "directory", "id": "app.opt", "path": s.p("opt")},
        {"type": "file", "id": "app.conf", "path": s.p("app.conf"), "content": "mesh\n"},
        {"type": "file", "id": "app.unit", "path": unit_file, "content": sleeper("")},
        {"type": "process", "id": "app.tool", "name": proc_name, "command": [s.p("opt/bin/tool")]},
        {"type": "service", "id": "app.svc", "unit": restarted, "state": "running", "restart-on": ["app.conf"]},
        {"type": "service", "id": "app.unitsvc", "unit": with_file, "state": "running"},
    ]});
    // The unit file found on the machine, the operator's.
    t.unit(&with_file, &sleeper(""));
    std::fs::write(&d, serde_json::to_vec(&declaration).unwrap()).unwrap();
    let (code, report) = apply_on(&s, &t.bus(), &d);
    assert_eq!(code, 0, "{report:#}");
    for id in ["app.opt", "app.conf", "app.unit", "app.tool", "app.svc", "app.unitsvc"] {
        assert_eq!(action(&report, id), "held", "{id}: {report:#}");
    }
    assert!(
        detail(&report, "app.tool").contains(&format!("run {} from {}", s.p("opt/bin/tool"), s.p("opt"))),
        "{report:#}"
    );
    assert!(detail(&report, "app.svc").contains("restarted by a change of app.conf"), "{report:#}");
    assert_ne!(t.active(&proc_unit), "active", "the process was not started");
    assert_ne!(t.active(&with_file), "active", "the service whose unit file is held was not started");
    t.clean(&[&proc_unit, &restarted, &with_file], &[]);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn the_daemon_starts_again_a_unit_stopped_by_hand() {
    let tb = testbed();
    let unit = format!("{}.service", unique("mh-daemon-"));
    tb.unit(&unit, &sleeper(""));
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "service", "id": "a.svc", "unit": unit, "state": "running"}]));
    let bus = tb.bus();
    let mut daemon = Daemon::start(&s, &d, &["--bus", &bus]);
    assert_eq!(tb.active(&unit), "active", "the first apply started it:\n{}", daemon.log());
    assert!(
        wait_for(PATIENCE, || daemon.metric("mesh_host_watcher_up{watcher=\"systemd\"}") == 1.0),
        "{}",
        daemon.log()
    );

    let stopped = Instant::now();
    tb.systemctl(&["stop", &unit]);
    assert!(wait_for(PATIENCE, || tb.active(&unit) == "active"), "started again:\n{}", daemon.log());
    let took = stopped.elapsed();
    assert!(
        wait_for(PATIENCE, || daemon.metric("mesh_host_drift_corrections_total{type=\"service\"}") >= 1.0),
        "counted as drift:\n{}",
        daemon.get("/metrics").unwrap_or_default()
    );
    assert!(took < Duration::from_secs(5), "within moments, not at the next resync: {took:?}");
    assert_eq!(daemon.terminate(), Some(0));
    tb.clean(&[&unit], &[]);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn the_daemon_connects_again_after_its_kept_bus_connection_is_cut() {
    let tb = testbed();
    let unit = format!("{}.service", unique("mh-daemon-cut-"));
    tb.unit(&unit, &sleeper(""));
    let s = Scratch::new();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _entered = rt.enter();
    let mut relay = Relay::new(s.path("bus"));
    relay.listen();
    let d = s.declare(json!([{"type": "service", "id": "a.svc", "unit": unit, "state": "running"}]));
    let bus = format!("unix:path={}", s.p("bus"));
    let mut daemon = Daemon::start(&s, &d, &["--bus", &bus]);
    assert_eq!(tb.active(&unit), "active", "the first apply started it:\n{}", daemon.log());
    let up = || daemon.metric("mesh_host_watcher_up{watcher=\"systemd\"}") == 1.0;
    assert!(wait_for(PATIENCE, up), "{}", daemon.log());
    let corrections = || daemon.metric("mesh_host_drift_corrections_total{type=\"service\"}");

    // Started again over the connection the daemon keeps between reconciles.
    tb.systemctl(&["stop", &unit]);
    assert!(wait_for(PATIENCE, || tb.active(&unit) == "active"), "started again:\n{}", daemon.log());
    assert!(wait_for(PATIENCE, || corrections() >= 1.0), "{}", daemon.log());

    // Every connection through the relay is cut, as when the bus restarts; then it listens again.
    relay.cut();
    relay.listen();
    tb.systemctl(&["stop", &unit]);
    assert!(
        wait_for(PATIENCE, || tb.active(&unit) == "active"),
        "started again on a new connection:\n{}",
        daemon.log()
    );
    assert!(wait_for(PATIENCE, || corrections() >= 2.0), "{}", daemon.log());
    assert_eq!(daemon.terminate(), Some(0));
    relay.cut();
    tb.clean(&[&unit], &[]);
}

/// The unit file in `deploy/`, as shipped, runs the agent under the testbed's systemd: it
/// starts without its environment file, reaches READY, puts back a hand-edit, answers on
/// `/healthz`, and stops cleanly on `systemctl stop`.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn the_deployed_unit_runs_the_agent_under_systemd() {
    let t = testbed();
    let unit = "mesh-host.service";
    let dir = "/srv/mh-it-deploy";
    let journal = |t: &Testbed| {
        let out = Command::new("nsenter")
            .args(["-t", &t.pid.to_string(), "-a", "journalctl", "-u", unit, "-n", "40", "--no-pager"])
            .output()
            .expect("nsenter runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/mesh-host.service")).unwrap();
    let installed = t.path("/usr/bin/mesh-host");
    let _ = std::fs::remove_file(&installed);
    let binary = assert_cmd::cargo::cargo_bin("mesh-host");
    if std::fs::hard_link(&binary, &installed).is_err() {
        std::fs::copy(&binary, &installed).unwrap();
    }
    std::fs::create_dir_all(t.path("/etc/mesh-host/declaration.d")).unwrap();
    let d = json!({"version": 1, "resources": [
        {"type": "directory", "id": "it.dir", "path": dir},
        {"type": "file", "id": "it.hello", "path": format!("{dir}/hello"), "content": "hello\n"},
    ]});
    std::fs::write(t.path("/etc/mesh-host/declaration.d/it.json"), d.to_string()).unwrap();
    t.unit(unit, &text);

    // Type=notify: the start returns once the agent said READY, after its first apply.
    t.systemctl(&["start", unit]);
    assert_eq!(t.active(unit), "active", "{}", journal(&t));
    let hello = t.path(&format!("{dir}/hello"));
    assert_eq!(std::fs::read_to_string(&hello).unwrap_or_default(), "hello\n", "{}", journal(&t));
    std::fs::write(&hello, "edited by hand\n").unwrap();
    assert!(
        wait_for(PATIENCE, || std::fs::read_to_string(&hello).is_ok_and(|c| c == "hello\n")),
        "put back:\n{}",
        journal(&t)
    );
    // The testbed shares the host's network: its loopback is this one.
    let health = {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect("127.0.0.1:9787").expect("the agent listens on 9787");
        write!(s, "GET /healthz HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    assert!(health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"), "{health}");
    let store = t.path("/var/lib/mesh-host/state.json");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(std::fs::metadata(&store).unwrap().permissions().mode() & 0o777, 0o600);

    t.systemctl(&["stop", unit]);
    assert_eq!(t.active(unit), "inactive", "{}", journal(&t));
    assert_eq!(t.show(unit, "ExecMainStatus"), "0", "SIGTERM is a clean exit:\n{}", journal(&t));

    t.clean(&[unit], &["/usr/bin/mesh-host", "/etc/mesh-host/declaration.d/it.json"]);
    let _ = std::fs::remove_dir_all(t.path(dir));
    let _ = std::fs::remove_dir_all(t.path("/var/lib/mesh-host"));
}

/// Runs the daemon with `workers`, has a file's hand-edit restart a unit whose start takes 4 s,
/// and while that restart is in flight hand-edits another file. Returns how long the second
/// file took to be put back, and whether the unit was still starting when it was.
fn a_second_edit_during_a_slow_restart(workers: &str) -> (Duration, bool) {
    let tb = testbed();
    let unit = format!("{}.service", unique("mh-conc-"));
    let slow = format!("/var/tmp/{}", unique("mh-conc-slow-"));
    // Slow only once the marker is there, so the first apply starts it at once.
    tb.unit(&unit, &sleeper(&format!("ExecStartPre=/bin/sh -c 'if test -e {slow}; then sleep 4; fi'")));
    let s = Scratch::new();
    let (conf, other) = (s.path("app.conf"), s.path("other.conf"));
    let d = s.declare(json!([
        {"type": "file", "id": "app.conf", "path": s.p("app.conf"), "content": "port=80\n"},
        {"type": "service", "id": "app.svc", "unit": unit, "state": "running", "restart-on": ["app.conf"]},
        {"type": "file", "id": "other.conf", "path": s.p("other.conf"), "content": "other\n"},
    ]));
    let bus = tb.bus();
    // A resync every second: a full pass is due again and again during the 4 s restart.
    let mut daemon = Daemon::start(&s, &d, &["--bus", &bus, "--workers", workers, "--resync", "1"]);
    assert_eq!(tb.active(&unit), "active", "the first apply started it:\n{}", daemon.log());
    std::fs::write(tb.path(&slow), "").unwrap();

    // app.conf's correction restarts the unit: that reconcile now takes 4 s and more.
    std::fs::write(&conf, "port=8080\n").unwrap();
    assert!(wait_for(PATIENCE, || tb.active(&unit) == "activating"), "the restart began:\n{}", daemon.log());
    let full = "mesh_host_reconcile_duration_seconds_count{scope=\"full\"}";
    let resync = "mesh_host_queue_adds_total{source=\"resync\"}";
    let (passes, resyncs) = (daemon.metric(full), daemon.metric(resync));
    let edited = Instant::now();
    std::fs::write(&other, "edited by hand\n").unwrap();
    assert!(
        wait_for(PATIENCE, || std::fs::read_to_string(&other).unwrap_or_default() == "other\n"),
        "the second edit is put back:\n{}",
        daemon.log()
    );
    let took = edited.elapsed();
    let still_starting = tb.active(&unit) == "activating";
    if still_starting {
        // A full pass queued by the resync during the restart waits for it: none runs while
        // the restart is in flight (the barrier: a resync queued after the restart began).
        assert!(
            wait_for(PATIENCE, || daemon.metric(resync) > resyncs),
            "a resync was queued:\n{}",
            daemon.log()
        );
        let passes_now = daemon.metric(full);
        assert_eq!(tb.active(&unit), "activating", "the restart was still in flight when looked at");
        assert_eq!(passes_now, passes, "no full pass ran beside the restart:\n{}", daemon.log());
        // SIGTERM with the restart still in flight apart: the daemon waits for it, takes it
        // back (its lines are logged then, never before), and only then stops.
        assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
        let log = daemon.log();
        let taken_back = log.find("corrected app.conf").expect("the restart's reconcile was taken back");
        let stopped = log.rfind("stopped").expect("the daemon said it stopped");
        assert!(taken_back < stopped, "taken back before the daemon stopped:\n{log}");
        assert_eq!(tb.active(&unit), "active", "{log}");
    } else {
        assert!(wait_for(PATIENCE, || tb.active(&unit) == "active"), "the restart ends:\n{}", daemon.log());
        assert!(
            wait_for(PATIENCE, || daemon.metric("mesh_host_drift_corrections_total{type=\"file\"}") >= 2.0),
            "both corrections counted:\n{}",
            daemon.log()
        );
        assert_eq!(daemon.terminate(), Some(0));
    }
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "port=80\n");
    tb.clean(&[&unit], &[&slow]);
    (took, still_starting)
}

/// Issue 15 point 4: a file's correction does not wait behind a slow reconcile. A hand-edit is
/// put back within half a second while a unit's 4 s restart (another file's correction, which
/// the unit restarts on) is in flight, and SIGTERM then waits for that restart before the
/// daemon exits 0; with one worker, the same edit waits for the restart, which shows the check
/// can fail.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_hand_edit_is_put_back_while_a_slow_restart_is_in_flight() {
    let (took, still_starting) = a_second_edit_during_a_slow_restart("4");
    eprintln!("4 workers: put back in {took:?}, the restart still in flight: {still_starting}");
    assert!(still_starting, "put back while the restart was still in flight (took {took:?})");
    assert!(took < Duration::from_millis(500), "put back within 500 ms, took {took:?}");

    let (took, still_starting) = a_second_edit_during_a_slow_restart("1");
    eprintln!("1 worker: put back in {took:?}, the restart still in flight: {still_starting}");
    assert!(
        !still_starting && took > Duration::from_secs(2),
        "with one worker the edit waits for the restart (took {took:?}); if it did not, the check above proves nothing"
    );
}
