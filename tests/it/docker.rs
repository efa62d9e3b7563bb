//! Containers, run-once and scheduled steps, networks and the event watcher, against the real
//! Docker engine and Podman service that `tests/testbed/docker.sh` starts, with its locally
//! imported image `local/busybox:1`.
//!
//! Each test uses names of its own (tests run in parallel) and removes what it made, even when
//! it fails, through a guard.

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
        Names { cli, prefix: format!("mh-it-{test}-{}", std::process::id()), networks: Vec::new() }
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

#[test]
fn docker_create_then_unchanged() {
    let n = Names::new(DOCKER, "create");
    let s = Scratch::new();
    let web = n.container("web");
    let d = s.declare(json!([
        {"type": "file", "id": "web.env", "path": s.p("web.env"), "content": "PORT=8080\n"},
        {"type": "container", "id": "web.app", "name": web, "image": IMAGE, "args": SERVE,
         "env": {"MODE": "test"}, "env-file": [s.p("web.env")], "ports": ["127.0.0.1::80"],
         "hosts": ["db.internal:10.1.2.3"]},
    ]));
    let report = applied(&s, &d);
    assert_eq!(action(&report, "web.app"), "created", "{report:#}");
    assert!(DOCKER.running(&web));
    assert_eq!(DOCKER.inspect(&web, "{{index .Config.Labels \"mesh-host.id\"}}").unwrap(), "web.app");
    let label = DOCKER.inspect(&web, "{{index .Config.Labels \"mesh-host.spec\"}}").unwrap();
    assert_eq!(record(&s, "web.app")["spec"], label);
    assert!(record(&s, "web.app")["reads"][s.p("web.env")].as_str().unwrap().starts_with("sha256:"));
    let env = DOCKER.ok(&["exec", &web, "env"]);
    assert!(env.contains("PORT=8080") && env.contains("MODE=test"), "{env}");
    assert!(DOCKER.ok(&["port", &web, "80/tcp"]).starts_with("127.0.0.1:"));
    assert!(DOCKER.ok(&["exec", &web, "cat", "/etc/hosts"]).contains("10.1.2.3\tdb.internal"));

    let id = DOCKER.id(&web);
    let report = applied(&s, &d);
    assert_eq!(action(&report, "web.app"), "unchanged", "{report:#}");
    assert_eq!(DOCKER.id(&web), id, "an unchanged container is the same container");
}

#[test]
fn docker_env_file_change_recreates_and_names_the_file() {
    let n = Names::new(DOCKER, "envfile");
    let s = Scratch::new();
    let web = n.container("web");
    let declare = |port: &str| {
        s.declare(json!([
            {"type": "file", "id": "web.env", "path": s.p("web.env"), "content": format!("PORT={port}\n")},
            {"type": "container", "id": "web.app", "name": web, "image": IMAGE, "args": SERVE,
             "env-file": [s.p("web.env")]},
        ]))
    };
    applied(&s, &declare("8080"));
    let before = DOCKER.id(&web);

    let report = applied(&s, &declare("9090"));
    assert_eq!(action(&report, "web.env"), "updated");
    assert_eq!(action(&report, "web.app"), "updated");
    assert_eq!(detail(&report, "web.app"), format!("recreated: {} changed", s.p("web.env")));
    assert_ne!(DOCKER.id(&web), before);
    assert!(DOCKER.ok(&["exec", &web, "env"]).contains("PORT=9090"));
}

#[test]
fn docker_directly_mounted_file_change_recreates() {
    let n = Names::new(DOCKER, "mountfile");
    let s = Scratch::new();
    let web = n.container("web");
    let declare = |secret: &str| {
        s.declare(json!([
            {"type": "file", "id": "web.key", "path": s.p("key"), "content": secret, "mode": "0600"},
            {"type": "container", "id": "web.app", "name": web, "image": IMAGE, "args": SERVE,
             "volumes": [format!("{}:/run/key:ro", s.p("key"))]},
        ]))
    };
    applied(&s, &declare("one"));
    let report = applied(&s, &declare("two"));
    assert_eq!(action(&report, "web.app"), "updated");
    assert_eq!(detail(&report, "web.app"), format!("recreated: {} changed", s.p("key")));
    assert_eq!(DOCKER.ok(&["exec", &web, "cat", "/run/key"]), "two");
}

#[test]
fn docker_change_inside_a_mounted_directory_does_not_recreate() {
    let n = Names::new(DOCKER, "mountdir");
    let s = Scratch::new();
    let web = n.container("web");
    let declare = |routes: &str| {
        s.declare(json!([
            {"type": "directory", "id": "proxy.dir", "path": s.p("routes")},
            {"type": "file", "id": "proxy.routes", "path": s.p("routes/routes.conf"), "content": routes},
            {"type": "container", "id": "proxy.app", "name": web, "image": IMAGE, "args": SERVE,
             "volumes": [format!("{}:/etc/routes", s.p("routes"))]},
        ]))
    };
    applied(&s, &declare("a\n"));
    let before = DOCKER.id(&web);
    let report = applied(&s, &declare("b\n"));
    assert_eq!(action(&report, "proxy.routes"), "updated");
    assert_eq!(action(&report, "proxy.app"), "unchanged", "{report:#}");
    assert_eq!(DOCKER.id(&web), before);
    // It sees the new file live, which is why it is not recreated.
    assert_eq!(DOCKER.ok(&["exec", &web, "cat", "/etc/routes/routes.conf"]), "b");
}

#[test]
fn docker_legacy_label_is_accepted_and_its_reads_recorded() {
    let n = Names::new(DOCKER, "legacy");
    let s = Scratch::new();
    let web = n.container("web");
    std::fs::write(s.path("web.env"), "PORT=8080\n").unwrap();
    let resources = json!([
        {"type": "container", "id": "web.app", "name": web, "image": IMAGE, "args": SERVE,
         "env-file": [s.p("web.env")]},
    ]);
    let d = s.declare(resources.clone());
    // The label as it was computed before the files a container reads were folded in.
    let parsed = mesh_host::declaration::Declaration::parse(&std::fs::read(&d).unwrap()).unwrap();
    let mesh_host::declaration::Spec::Container(c) = &parsed.resources[0].spec else { unreachable!() };
    let legacy = mesh_host::apply::spec_digest(&parsed, c, None);
    DOCKER.ok(&[
        "run",
        "-d",
        "--name",
        &web,
        "--label",
        &format!("mesh-host.spec={legacy}"),
        "--label",
        "mesh-host.id=web.app",
        "--env-file",
        &s.p("web.env"),
        IMAGE,
        "sleep",
        "3600",
    ]);
    let before = DOCKER.id(&web);

    let report = applied(&s, &d);
    assert_eq!(action(&report, "web.app"), "unchanged", "{report:#}");
    assert!(detail(&report, "web.app").starts_with("accepted as labelled before"), "{report:#}");
    assert_eq!(DOCKER.id(&web), before, "a legacy label is not a reason to recreate");
    assert!(record(&s, "web.app")["reads"][s.p("web.env")].is_string(), "its reads are recorded");

    // From then on a change of what it reads is caught, and named.
    std::fs::write(s.path("web.env"), "PORT=9090\n").unwrap();
    let report = applied(&s, &d);
    assert_eq!(action(&report, "web.app"), "updated", "{report:#}");
    assert_eq!(detail(&report, "web.app"), format!("recreated: {} changed", s.p("web.env")));
    assert!(DOCKER.ok(&["exec", &web, "env"]).contains("PORT=9090"));
}

#[test]
fn docker_reads_are_found_by_name_when_a_new_id_takes_the_container_over() {
    let n = Names::new(DOCKER, "byname");
    let s = Scratch::new();
    let db = n.container("db");
    let declare = |file: &str, id: &str, secret: &str| {
        declare_as(
            &s,
            file,
            json!([
                {"type": "file", "id": format!("{id}-secret"), "path": s.p("db.env"), "content": secret},
                {"type": "container", "id": id, "name": db, "image": IMAGE, "args": SERVE,
                 "env-file": [s.p("db.env")]},
            ]),
        )
    };
    // The bundle brings the store up at first boot, under its own id.
    let bundle = declare("bundle.json", "store", "PASSWORD=a\n");
    let out = s.run(&["apply", "--json", "--origin", "bundle", bundle.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let before = DOCKER.id(&db);

    // The mesh's module takes the same container over under a new id, with a new secret in
    // the file it reads: the new id has no record yet, so the bundle's, found by the
    // container's name, says what it was created reading, and the file is named.
    let module = declare("module.json", "postgres.server", "PASSWORD=b\n");
    let report = applied(&s, &module);
    assert_eq!(action(&report, "postgres.server"), "updated", "{report:#}");
    assert_eq!(detail(&report, "postgres.server"), format!("recreated: {} changed", s.p("db.env")));
    assert_ne!(DOCKER.id(&db), before);
}

#[test]
fn docker_restart_on_recreates_when_the_named_resource_changed() {
    let n = Names::new(DOCKER, "restarton");
    let s = Scratch::new();
    let web = n.container("web");
    let declare = |conf: &str| {
        s.declare(json!([
            {"type": "file", "id": "web.conf", "path": s.p("conf/web.conf"), "content": conf},
            {"type": "container", "id": "web.app", "name": web, "image": IMAGE, "args": SERVE,
             "volumes": [format!("{}:/etc/web", s.p("conf"))], "restart-on": ["web.conf"]},
        ]))
    };
    applied(&s, &declare("a\n"));
    let before = DOCKER.id(&web);
    let report = applied(&s, &declare("b\n"));
    assert_eq!(action(&report, "web.app"), "updated", "{report:#}");
    assert!(detail(&report, "web.app").contains("web.conf"), "{report:#}");
    assert_ne!(DOCKER.id(&web), before);
    let report = applied(&s, &declare("b\n"));
    assert_eq!(action(&report, "web.app"), "unchanged", "{report:#}");
}

#[test]
fn docker_killed_or_removed_by_hand_is_corrected() {
    let n = Names::new(DOCKER, "drift");
    let s = Scratch::new();
    let web = n.container("web");
    let d = s.declare(json!([sleeper("web.app", &web)]));
    applied(&s, &d);
    DOCKER.ok(&["kill", &web]);
    // The runtime's own restart policy may bring it back first; either way it must run after.
    let report = applied(&s, &d);
    let word = action(&report, "web.app");
    assert!(word == "corrected" || word == "unchanged", "{report:#}");
    assert!(DOCKER.running(&web));

    DOCKER.ok(&["rm", "-f", &web]);
    let report = applied(&s, &d);
    assert_eq!(action(&report, "web.app"), "corrected", "{report:#}");
    assert!(detail(&report, "web.app").contains("removed"), "{report:#}");
    assert!(DOCKER.running(&web));
}

#[test]
fn docker_stopped_by_hand_is_started_again() {
    let n = Names::new(DOCKER, "stopped");
    let s = Scratch::new();
    let web = n.container("web");
    let d = s.declare(json!([sleeper("web.app", &web)]));
    applied(&s, &d);
    let before = DOCKER.id(&web);
    DOCKER.ok(&["stop", "-t", "0", &web]);
    let report = applied(&s, &d);
    assert_eq!(action(&report, "web.app"), "corrected", "{report:#}");
    let said = detail(&report, "web.app");
    assert!(said.starts_with("it exited with code ") && said.ends_with("; started again"), "{report:#}");
    assert!(DOCKER.running(&web));
    assert_eq!(DOCKER.id(&web), before, "started again, not recreated");
}

#[test]
fn docker_a_container_that_exits_at_once_is_an_error_pointing_at_its_logs() {
    let n = Names::new(DOCKER, "exits");
    let s = Scratch::new();
    let web = n.container("web");
    let d = s.declare(json!([
        {"type": "container", "id": "web.app", "name": web, "image": IMAGE, "args": ["sh", "-c", "exit 3"]},
        {"type": "file", "id": "web.after", "path": s.p("after"), "content": "x"},
    ]));
    let (code, report) = s.apply(&d);
    assert_ne!(code, 0);
    let message = report["error"]["message"].as_str().unwrap();
    assert!(message.contains("not running") && message.contains("logs"), "{message}");
    assert_eq!(report["error"]["gated"], false, "an ordinary container does not gate");
    assert!(s.path("after").exists(), "what follows was still applied");
    assert!(record(&s, "web.app").is_null(), "nothing is recorded for what did not work");
}

#[test]
fn docker_run_once_runs_once_and_is_recorded_by_its_spec() {
    let n = Names::new(DOCKER, "runonce");
    let s = Scratch::new();
    let step = n.container("seed");
    std::fs::create_dir(s.path("out")).unwrap();
    let declare = |word: &str| {
        s.declare(json!([
            {"type": "container", "id": "db.seed", "name": step, "image": IMAGE, "run-once": true,
             "volumes": [format!("{}:/out", s.p("out"))],
             "args": ["sh", "-c", format!("echo {word} >> /out/log")]},
            {"type": "file", "id": "db.after", "path": s.p("after"), "content": "x"},
        ]))
    };
    let report = applied(&s, &declare("one"));
    assert_eq!(action(&report, "db.seed"), "created", "{report:#}");
    assert_eq!(std::fs::read_to_string(s.path("out/log")).unwrap(), "one\n");
    assert!(DOCKER.inspect(&step, "{{.Id}}").is_none(), "a completed step leaves no container");

    let report = applied(&s, &declare("one"));
    assert_eq!(action(&report, "db.seed"), "unchanged");
    assert_eq!(std::fs::read_to_string(s.path("out/log")).unwrap(), "one\n", "not run again");

    let report = applied(&s, &declare("two"));
    assert_eq!(action(&report, "db.seed"), "updated");
    assert_eq!(std::fs::read_to_string(s.path("out/log")).unwrap(), "one\ntwo\n");
}

#[test]
fn docker_run_once_failure_gates_what_follows() {
    let n = Names::new(DOCKER, "gate");
    let s = Scratch::new();
    let step = n.container("migrate");
    let web = n.container("web");
    let d = s.declare(json!([
        {"type": "file", "id": "db.before", "path": s.p("before"), "content": "x"},
        {"type": "container", "id": "db.migrate", "name": step, "image": IMAGE, "run-once": true,
         "args": ["sh", "-c", "exit 3"]},
        {"type": "file", "id": "db.after", "path": s.p("after"), "content": "x"},
        sleeper("web.app", &web),
    ]));
    let (code, report) = s.apply(&d);
    assert_ne!(code, 0);
    assert_eq!(report["error"]["resource"], "db.migrate", "{report:#}");
    assert_eq!(report["error"]["gated"], true);
    assert!(report["error"]["message"].as_str().unwrap().contains("exited with code 3"), "{report:#}");
    assert!(s.path("before").exists());
    assert!(!s.path("after").exists(), "nothing after a failed step is attempted");
    assert!(DOCKER.inspect(&web, "{{.Id}}").is_none());
    assert!(record(&s, "db.migrate").is_null(), "a failed step is not recorded");
    assert!(DOCKER.inspect(&step, "{{.Id}}").is_some(), "the failed step's container is left for its logs");
    // Marked as a step, so the event watcher does not take its exit for drift.
    assert_eq!(DOCKER.inspect(&step, "{{index .Config.Labels \"mesh-host.step\"}}").unwrap(), "run-once");
}

#[test]
fn docker_run_once_step_that_hangs_is_stopped_at_the_step_timeout_and_gates() {
    let n = Names::new(DOCKER, "hang");
    let s = Scratch::new();
    let step = n.container("migrate");
    let d = s.declare(json!([
        {"type": "container", "id": "db.migrate", "name": step, "image": IMAGE, "run-once": true,
         "args": ["sh", "-c", "trap 'exit 143' TERM; sleep 300 & wait"]},
        {"type": "file", "id": "db.after", "path": s.p("after"), "content": "x"},
    ]));
    let (code, report) = s.apply_with(&["--step-timeout", "2"], &d);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["error"]["resource"], "db.migrate", "{report:#}");
    assert_eq!(report["error"]["gated"], true);
    let message = report["error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("container {step} did not finish within 2 s")), "{message}");
    assert!(message.contains("stopped, and is left for its logs"), "{message}");
    assert!(!s.path("after").exists(), "nothing after the step is attempted");
    assert!(!DOCKER.running(&step), "the hung step was stopped");
    assert!(DOCKER.inspect(&step, "{{.Id}}").is_some(), "and left for its logs");
    assert!(record(&s, "db.migrate").is_null(), "a step that did not finish is not recorded");
}

#[test]
fn docker_scheduled_step_is_installed_not_run_then_run_by_the_scheduler() {
    let n = Names::new(DOCKER, "sched");
    let s = Scratch::new();
    let step = n.container("backup");
    std::fs::create_dir(s.path("out")).unwrap();
    let d = s.declare(json!([
        {"type": "container", "id": "db.backup", "name": step, "image": IMAGE, "schedule": "*/5 * * * *",
         "volumes": [format!("{}:/out", s.p("out"))], "args": ["sh", "-c", "echo ran >> /out/log"]},
        {"type": "container", "id": "db.broken", "name": n.container("broken"), "image": IMAGE,
         "schedule": "0 3 * * *", "args": ["sh", "-c", "exit 4"]},
    ]));
    let report = applied(&s, &d);
    assert_eq!(action(&report, "db.backup"), "created", "{report:#}");
    assert!(!s.path("out/log").exists(), "installing a scheduled step does not run it");
    assert!(DOCKER.inspect(&step, "{{.Id}}").is_none());
    assert_eq!(record(&s, "db.backup")["schedule"], "*/5 * * * *");

    // What the daemon's scheduler does at a fire.
    let parsed = mesh_host::declaration::Declaration::parse(&std::fs::read(&d).unwrap()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let run = |id: &str| {
        let parsed = parsed.clone();
        let id = mesh_host::declaration::Id::parse(id).unwrap();
        rt.block_on(rt.spawn_blocking(move || mesh_host::apply::run_scheduled(&parsed, &id, None, None)))
            .unwrap()
    };
    run("db.backup").expect("the scheduled step runs");
    assert_eq!(std::fs::read_to_string(s.path("out/log")).unwrap(), "ran\n");
    let failed = run("db.broken").expect_err("a failing step is an error for the scheduler");
    assert!(failed.to_string().contains("exited with code 4"), "{failed}");

    // A run, failed or not, changes nothing an apply reports.
    let report = applied(&s, &d);
    assert_eq!(action(&report, "db.backup"), "unchanged");
    assert_eq!(action(&report, "db.broken"), "unchanged");
}

#[test]
fn docker_network_lifecycle() {
    let mut n = Names::new(DOCKER, "network");
    let s = Scratch::new();
    let net = n.network("app");
    let web = n.container("web");
    let d = s.declare(json!([
        {"type": "network", "id": "app.net", "name": net},
        {"type": "container", "id": "app.web", "name": web, "image": IMAGE, "args": SERVE, "network": net},
    ]));
    let report = applied(&s, &d);
    assert_eq!(action(&report, "app.net"), "created");
    assert_eq!(action(&report, "app.web"), "created");
    assert!(DOCKER.inspect(&web, "{{json .NetworkSettings.Networks}}").unwrap().contains(&net));
    let report = applied(&s, &d);
    assert_eq!(action(&report, "app.net"), "unchanged");

    // Undeclared: the container goes first, then the network it used.
    let empty = s.declare(json!([]));
    let report = applied(&s, &empty);
    assert_eq!(action(&report, "app.web"), "removed", "{report:#}");
    assert_eq!(action(&report, "app.net"), "removed", "{report:#}");
    let order: Vec<&str> =
        report["outcomes"].as_array().unwrap().iter().map(|o| o["id"].as_str().unwrap()).collect();
    assert_eq!(order, ["app.web", "app.net"]);
    assert!(DOCKER.inspect(&web, "{{.Id}}").is_none());
    assert!(!DOCKER.exists_network(&net));
}

#[test]
fn docker_network_in_use_by_something_undeclared_is_kept_not_forced() {
    let mut n = Names::new(DOCKER, "netinuse");
    let s = Scratch::new();
    let net = n.network("shared");
    let d = s.declare(json!([{"type": "network", "id": "app.net", "name": net}]));
    applied(&s, &d);
    let other = n.container("theirs");
    DOCKER.ok(&["run", "-d", "--name", &other, "--network", &net, IMAGE, SERVE[0], SERVE[1], SERVE[2]]);

    let empty = s.declare(json!([]));
    let report = applied(&s, &empty);
    assert_eq!(action(&report, "app.net"), "kept", "{report:#}");
    assert!(detail(&report, "app.net").contains(&other), "{report:#}");
    assert!(DOCKER.exists_network(&net));
    assert!(DOCKER.running(&other), "what uses it is left alone");

    // Still recorded, so it goes once nothing uses it.
    DOCKER.ok(&["rm", "-f", &other]);
    let report = applied(&s, &empty);
    assert_eq!(action(&report, "app.net"), "removed", "{report:#}");
    assert!(!DOCKER.exists_network(&net));
}

#[test]
fn docker_orphan_container_is_removed_and_one_made_by_hand_is_left() {
    let n = Names::new(DOCKER, "orphan");
    let s = Scratch::new();
    let web = n.container("web");
    let d = declare_as(&s, "web.json", json!([sleeper("web.app", &web)]));
    applied(&s, &d);
    let report = applied(&s, &s.declare(json!([])));
    assert_eq!(action(&report, "web.app"), "removed", "{report:#}");
    assert!(DOCKER.inspect(&web, "{{.Id}}").is_none());

    // The same name, now someone else's: not the host's to remove.
    applied(&s, &d);
    DOCKER.ok(&["rm", "-f", &web]);
    DOCKER.ok(&["run", "-d", "--name", &web, IMAGE, SERVE[0], SERVE[1], SERVE[2]]);
    let report = applied(&s, &s.declare(json!([])));
    assert_eq!(action(&report, "web.app"), "kept", "{report:#}");
    assert!(DOCKER.running(&web));
}

#[test]
fn docker_absent_images_are_errors_saying_why() {
    let n = Names::new(DOCKER, "noimage");
    let s = Scratch::new();
    let digest = format!("sha256:{}", "0".repeat(64));
    let d = s.declare(json!([
        {"type": "container", "id": "a.digest", "name": n.container("a"), "image": digest, "args": ["true"]},
        {"type": "container", "id": "b.tag", "name": n.container("b"), "image": "local/absent:1", "args": ["true"]},
    ]));
    let (code, report) = s.apply(&d);
    assert_ne!(code, 0);
    let failures = report["error"]["failures"].as_array().unwrap();
    let message = |id: &str| {
        failures.iter().find(|f| f["id"] == id).unwrap_or_else(|| panic!("{report:#}"))["message"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(message("a.digest").contains("cannot be fetched"), "{report:#}");
    assert!(message("b.tag").contains("does not pull"), "{report:#}");
}

#[test]
fn docker_no_runtime_fails_container_resources_only() {
    let s = Scratch::new();
    let d = s.declare(json!([
        {"type": "file", "id": "web.env", "path": s.p("web.env"), "content": "PORT=1\n"},
        {"type": "container", "id": "web.app", "name": "mh-it-nowhere", "image": IMAGE},
        {"type": "file", "id": "web.after", "path": s.p("after"), "content": "x"},
    ]));
    let (code, report) = apply_on(&s, &d, Some("unix:///nonexistent/docker.sock"));
    assert_ne!(code, 0);
    assert_eq!(report["error"]["resource"], "web.app", "{report:#}");
    assert!(report["error"]["message"].as_str().unwrap().contains("does not answer"), "{report:#}");
    assert_eq!(action(&report, "web.env"), "created");
    assert_eq!(action(&report, "web.after"), "created");
}

/// With no socket configured and none of the usual ones answering, every container resource
/// fails naming each socket tried, and the rest of the declaration is applied. The machine's own
/// sockets are hidden by running the apply in a private mount namespace with an empty /run.
#[test]
fn docker_no_runtime_anywhere_names_every_socket_tried() {
    let s = Scratch::new();
    let d = s.declare(json!([
        {"type": "network", "id": "web.net", "name": "mh-it-nowhere-net"},
        {"type": "container", "id": "web.app", "name": "mh-it-nowhere", "image": IMAGE},
        {"type": "file", "id": "web.after", "path": s.p("after"), "content": "x"},
    ]));
    let out = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -t tmpfs none /run && exec \"$@\"",
            "sh",
        ])
        .arg(assert_cmd::cargo::cargo_bin("mesh-host"))
        .arg("--state")
        .arg(s.state())
        .args(["apply", "--json"])
        .arg(&d)
        .env_remove("DOCKER_HOST")
        .env("MESH_HOST_LOG", "warn")
        .output()
        .expect("unshare runs (util-linux)");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    let failures = report["error"]["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 2, "the network and the container: {report:#}");
    for f in failures {
        let message = f["message"].as_str().unwrap();
        assert!(message.contains("no container runtime answers on this machine"), "{message}");
        assert!(
            message.contains("/var/run/docker.sock") || message.contains("/run/docker.sock"),
            "{message}"
        );
        assert!(message.contains("podman"), "{message}");
    }
    assert_eq!(action(&report, "web.after"), "created", "{report:#}");
}

#[test]
fn docker_exec_runs_a_command_inside_a_running_container() {
    let n = Names::new(DOCKER, "exec");
    let web = n.container("web");
    DOCKER.ok(&["run", "-d", "--name", &web, IMAGE, SERVE[0], SERVE[1], SERVE[2]]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let name = web.clone();
    let (ok, failed, stopped) = rt
        .block_on(rt.spawn_blocking(move || {
            let docker = mesh_host::system::docker::connect(None).unwrap();
            let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
            let ok = docker.exec(&name, &argv(&["sh", "-c", "echo out; echo err >&2"]), None).unwrap();
            let failed = docker.exec(&name, &argv(&["sh", "-c", "exit 7"]), None).unwrap();
            let stopped = docker.exec("mh-it-no-such-container", &argv(&["true"]), None);
            let limit = Some(Duration::from_millis(500));
            let hung = docker.exec(&name, &argv(&["sleep", "30"]), limit).unwrap_err().to_string();
            assert!(
                hung.contains("sleep in container") && hung.contains("did not finish within 500 ms"),
                "{hung}"
            );
            assert!(hung.contains("may still be running"), "{hung}");
            (ok, failed, stopped)
        }))
        .unwrap();
    assert_eq!(ok.code, 0);
    assert!(ok.output.contains("out") && ok.output.contains("err"), "{ok:?}");
    assert_eq!(failed.code, 7);
    assert!(stopped.unwrap_err().to_string().contains("mh-it-no-such-container"));
}

#[test]
fn podman_create_unchanged_and_recreate_on_an_env_file_change() {
    let n = Names::new(PODMAN_CLI, "podman");
    let s = Scratch::new();
    let web = n.container("web");
    let declare = |port: &str| {
        s.declare(json!([
            {"type": "file", "id": "web.env", "path": s.p("web.env"), "content": format!("PORT={port}\n")},
            {"type": "container", "id": "web.app", "name": web, "image": IMAGE, "args": SERVE,
             "env-file": [s.p("web.env")]},
        ]))
    };
    let (code, report) = apply_on(&s, &declare("8080"), Some(PODMAN));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "web.app"), "created");
    assert!(PODMAN_CLI.running(&web));
    let before = PODMAN_CLI.id(&web);

    let (code, report) = apply_on(&s, &declare("8080"), Some(PODMAN));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "web.app"), "unchanged", "{report:#}");

    let (code, report) = apply_on(&s, &declare("9090"), Some(PODMAN));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(detail(&report, "web.app"), format!("recreated: {} changed", s.p("web.env")));
    assert_ne!(PODMAN_CLI.id(&web), before);
    assert!(PODMAN_CLI.ok(&["exec", &web, "env"]).contains("PORT=9090"));

    let (code, report) = apply_on(&s, &s.declare(json!([])), Some(PODMAN));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "web.app"), "removed");
}

/// Waits for a change matching `want`, failing after a few seconds.
async fn expect_change(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<mesh_host_watchers::Change>,
    what: &str,
    want: impl Fn(&mesh_host_watchers::Change) -> bool,
) -> Vec<mesh_host_watchers::Change> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(c)) => {
                let done = want(&c);
                seen.push(c);
                if done {
                    return seen;
                }
            }
            Ok(None) => panic!("the watcher ended while waiting for {what}; saw {seen:?}"),
            Err(_) => panic!("no {what} within 20 s; saw {seen:?}"),
        }
    }
}

#[test]
fn docker_watcher_reports_a_labelled_container_killed_by_hand() {
    use mesh_host_watchers::Change;
    let n = Names::new(DOCKER, "watch");
    let web = n.container("web");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let task = mesh_host_watchers::docker::spawn(None, tx);
        expect_change(&mut rx, "the watcher up", |c| matches!(c, Change::Up { up: true, .. })).await;
        // An unlabelled container is not the host's: its events are not reported.
        let theirs = n.container("theirs");
        DOCKER.ok(&["run", "-d", "--name", &theirs, IMAGE, SERVE[0], SERVE[1], SERVE[2]]);
        DOCKER.ok(&["rm", "-f", &theirs]);
        DOCKER.ok(&[
            "run",
            "-d",
            "--name",
            &web,
            "--label",
            "mesh-host.id=web.app",
            IMAGE,
            SERVE[0],
            SERVE[1],
            SERVE[2],
        ]);
        DOCKER.ok(&["kill", &web]);
        let seen = expect_change(
            &mut rx,
            "the kill",
            |c| matches!(c, Change::Container { action, name, .. } if action == "die" && *name == web),
        )
        .await;
        assert!(
            seen.iter().all(|c| !matches!(c, Change::Container { name, .. } if *name == theirs)),
            "{seen:?}"
        );
        assert!(
            seen.contains(&Change::Container {
                label: "web.app".into(),
                name: web.clone(),
                action: "kill".into()
            }),
            "{seen:?}"
        );
        DOCKER.ok(&["rm", "-f", &web]);
        expect_change(
            &mut rx,
            "the removal",
            |c| matches!(c, Change::Container { action, name, .. } if action == "destroy" && *name == web),
        )
        .await;
        // Dropping the receiver ends the watcher.
        drop(rx);
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("the watcher ends").unwrap();
    });
}

/// A Podman API service of this test's own, so stopping it disturbs no other test.
struct Service {
    child: std::process::Child,
}

impl Service {
    fn start(socket: &str) -> Service {
        let path = socket.trim_start_matches("unix://");
        let _ = std::fs::remove_file(path);
        let child = Command::new("podman")
            .args(["system", "service", "--time=0", socket])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("podman starts");
        for _ in 0..100 {
            if Path::new(path).exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Service { child }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
    }
}

#[test]
fn podman_watcher_reconnects_and_resyncs_after_the_engine_restarts() {
    use mesh_host_watchers::Change;
    let n = Names::new(PODMAN_CLI, "rewatch");
    let web = n.container("web");
    let s = Scratch::new();
    let socket = format!("unix://{}", s.p("podman.sock"));
    let mut service = Service::start(&socket);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let _task = mesh_host_watchers::docker::spawn(Some(socket.clone()), tx);
        expect_change(&mut rx, "the watcher up", |c| matches!(c, Change::Up { up: true, .. })).await;

        service.kill();
        expect_change(&mut rx, "the watcher down", |c| matches!(c, Change::Up { up: false, .. })).await;
        let _again = Service::start(&socket);
        let seen =
            expect_change(&mut rx, "a resync", |c| matches!(c, Change::Resynced { watcher: "docker" })).await;
        assert!(seen.contains(&Change::Up { watcher: "docker", up: true }), "{seen:?}");

        // And it still reports what it watches.
        PODMAN_CLI.ok(&[
            "run",
            "-d",
            "--name",
            &web,
            "--label",
            "mesh-host.id=web.app",
            IMAGE,
            "sleep",
            "3600",
        ]);
        PODMAN_CLI.ok(&["kill", &web]);
        expect_change(&mut rx, "the kill", |c| matches!(c, Change::Container { name, .. } if *name == web))
            .await;
    });
}

#[test]
fn docker_adopted_node_holds_a_container_and_network_it_did_not_make_until_taken() {
    let mut n = Names::new(DOCKER, "adopt");
    let s = Scratch::new();
    let web = n.container("web");
    let net = n.network("legacy");
    DOCKER.ok(&["network", "create", &net]);
    DOCKER.ok(&["run", "-d", "--name", &web, "--network", &net, IMAGE, SERVE[0], SERVE[1], SERVE[2]]);
    let before = DOCKER.id(&web);
    let declare = |taken: &[&str]| {
        let path = s.path("adopted.json");
        let d = json!({"version": 1, "adoption": {"taken": taken}, "resources": [
            {"type": "network", "id": "legacy.net", "name": net},
            {"type": "container", "id": "legacy.web", "name": web, "image": IMAGE, "args": SERVE, "network": net},
        ]});
        std::fs::write(&path, serde_json::to_vec_pretty(&d).unwrap()).unwrap();
        path
    };
    let report = applied(&s, &declare(&[]));
    assert_eq!(action(&report, "legacy.net"), "held", "{report:#}");
    assert_eq!(action(&report, "legacy.web"), "held", "{report:#}");
    assert_eq!(DOCKER.id(&web), before, "held as found");
    assert!(record(&s, "legacy.web").is_null(), "a hold is never recorded");

    let report = applied(&s, &declare(&["legacy"]));
    assert_eq!(action(&report, "legacy.net"), "unchanged", "{report:#}");
    assert_eq!(action(&report, "legacy.web"), "updated", "{report:#}");
    assert!(detail(&report, "legacy.web").contains("had not created"), "{report:#}");
    assert_ne!(DOCKER.id(&web), before);
}

#[test]
fn docker_plan_changes_nothing() {
    let mut n = Names::new(DOCKER, "plan");
    let s = Scratch::new();
    let web = n.container("web");
    let net = n.network("plan");
    let d = s.declare(json!([
        {"type": "network", "id": "app.net", "name": net},
        {"type": "container", "id": "app.web", "name": web, "image": IMAGE, "args": SERVE, "network": net},
        {"type": "container", "id": "app.seed", "name": n.container("seed"), "image": IMAGE, "run-once": true,
         "args": ["true"]},
    ]));
    let out = s.run(&["plan", d.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("would create app.web") && text.contains("would create app.net"), "{text}");
    assert!(DOCKER.inspect(&web, "{{.Id}}").is_none());
    assert!(!DOCKER.exists_network(&net));
}

#[test]
fn podman_run_once_step_and_network() {
    let mut n = Names::new(PODMAN_CLI, "podstep");
    let s = Scratch::new();
    let net = n.network("app");
    let web = n.container("web");
    std::fs::create_dir(s.path("out")).unwrap();
    let d = s.declare(json!([
        {"type": "network", "id": "app.net", "name": net},
        {"type": "container", "id": "app.seed", "name": n.container("seed"), "image": IMAGE, "run-once": true,
         "volumes": [format!("{}:/out", s.p("out"))], "args": ["sh", "-c", "echo seeded > /out/log"]},
        {"type": "container", "id": "app.web", "name": web, "image": IMAGE, "args": SERVE, "network": net},
    ]));
    let (code, report) = apply_on(&s, &d, Some(PODMAN));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "app.seed"), "created");
    assert_eq!(std::fs::read_to_string(s.path("out/log")).unwrap(), "seeded\n");
    assert!(PODMAN_CLI.running(&web));
    assert!(PODMAN_CLI.exists_network(&net));

    let (code, report) = apply_on(&s, &s.declare(json!([])), Some(PODMAN));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "app.web"), "removed");
    assert_eq!(action(&report, "app.net"), "removed", "{report:#}");
    assert!(!PODMAN_CLI.exists_network(&net));
}

/// A Docker engine of this test's own: its own socket, data and state, and its own network
/// namespace, so restarting it disturbs neither the machine's engine nor any other test. (In
/// the machine's namespace, a second dockerd deletes the first one's `docker0` bridge.)
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

    /// Stops it as a service manager would (SIGTERM) and waits for it to end.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateDocker {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn docker_watcher_reconnects_and_resyncs_after_the_engine_restarts() {
    use mesh_host_watchers::Change;
    require(DOCKER);
    let s = Scratch::new();
    let mut engine = PrivateDocker::new(s.dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let _task = mesh_host_watchers::docker::spawn(Some(engine.socket.clone()), tx);
        expect_change(&mut rx, "the watcher up", |c| matches!(c, Change::Up { up: true, .. })).await;

        tokio::task::block_in_place(|| engine.stop());
        expect_change(&mut rx, "the watcher down", |c| matches!(c, Change::Up { up: false, .. })).await;
        tokio::task::block_in_place(|| engine.start());
        let seen =
            expect_change(&mut rx, "a resync", |c| matches!(c, Change::Resynced { watcher: "docker" })).await;
        assert!(seen.contains(&Change::Up { watcher: "docker", up: true }), "{seen:?}");
    });
}

#[test]
fn docker_an_env_file_secret_never_reaches_the_log() {
    let n = Names::new(DOCKER, "secret");
    let s = Scratch::new();
    let secret = format!("s3cret-{}", std::process::id());
    let d = s.declare(json!([
        {"type": "file", "id": "db.env", "path": s.p("db.env"), "content": format!("PASSWORD={secret}\n"), "mode": "0600"},
        {"type": "container", "id": "db.app", "name": n.container("db"), "image": IMAGE, "args": SERVE,
         "env-file": [s.p("db.env")]},
    ]));
    for filter in ["trace", "bollard=trace"] {
        let out = assert_cmd::Command::cargo_bin("mesh-host")
            .unwrap()
            .env("MESH_HOST_LOG", filter)
            .arg("--state")
            .arg(s.state())
            .args(["apply", "--json", d.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
        let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!all.contains(&secret), "the secret is in the output with MESH_HOST_LOG={filter}");
        DOCKER.ok(&["rm", "-f", &n.container("db")]);
    }
}

#[test]
fn podman_is_found_through_docker_host_when_no_socket_is_configured() {
    let n = Names::new(PODMAN_CLI, "dockerhost");
    let s = Scratch::new();
    let web = n.container("web");
    let d = s.declare(json!([sleeper("web.app", &web)]));
    let out = assert_cmd::Command::cargo_bin("mesh-host")
        .unwrap()
        .env("DOCKER_HOST", PODMAN)
        .arg("--state")
        .arg(s.state())
        .args(["apply", "--json", d.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(PODMAN_CLI.running(&web), "created on the runtime DOCKER_HOST names");
    assert!(DOCKER.inspect(&web, "{{.Id}}").is_none(), "and not on Docker's default socket");
}

#[test]
fn docker_action_in_a_container_verifies_runs_and_gates() {
    let n = Names::new(DOCKER, "action");
    let s = Scratch::new();
    let db = n.container("db");
    let d = declare_as(
        &s,
        "action.json",
        json!([
            sleeper("db.app", &db),
            {"type": "action", "id": "db.schema", "in": db,
             "verify": ["test", "-f", "/tmp/schema"], "command": ["sh", "-c", "echo done > /tmp/schema"]},
            {"type": "file", "id": "db.after", "path": s.p("after"), "content": "x"},
        ]),
    );
    let report = applied(&s, &d);
    assert_eq!(action(&report, "db.schema"), "created", "{report:#}");
    assert!(
        DOCKER.run(&["exec", &db, "test", "-f", "/tmp/schema"]).0,
        "the command ran inside the container"
    );
    let report = applied(&s, &d);
    assert_eq!(action(&report, "db.schema"), "unchanged", "{report:#}");

    // A command inside that does not make verify pass is a gate.
    let failing = declare_as(
        &s,
        "failing.json",
        json!([
            sleeper("db.app", &db),
            {"type": "action", "id": "db.migrate", "in": db,
             "verify": ["test", "-f", "/tmp/never"], "command": ["sh", "-c", "echo no luck; exit 2"]},
            {"type": "file", "id": "db.later", "path": s.p("later"), "content": "x"},
        ]),
    );
    let (code, report) = s.apply(&failing);
    assert_ne!(code, 0);
    assert_eq!(report["error"]["resource"], "db.migrate", "{report:#}");
    assert_eq!(report["error"]["gated"], true);
    assert!(report["error"]["message"].as_str().unwrap().contains("exited 2: no luck"), "{report:#}");
    assert!(!s.path("later").exists());
}

#[test]
fn daemon_starts_again_a_container_killed_or_removed_by_hand() {
    let n = Names::new(DOCKER, "dkill");
    let s = Scratch::new();
    let web = n.container("web");
    let d = s.declare(json!([sleeper("web.app", &web)]));
    let daemon = Daemon::start(&s, &d, &[]);
    assert!(DOCKER.running(&web), "the first apply made it:\n{}", daemon.log());
    assert!(
        wait_for(PATIENCE, || daemon.metric("mesh_host_watcher_up{watcher=\"docker\"}") == 1.0),
        "{}",
        daemon.log()
    );
    let started = DOCKER.inspect(&web, "{{.State.StartedAt}}").unwrap();
    DOCKER.ok(&["kill", &web]);
    assert!(
        wait_for(PATIENCE, || DOCKER.running(&web)
            && DOCKER.inspect(&web, "{{.State.StartedAt}}").is_some_and(|t| t != started)),
        "running again:\n{}",
        daemon.log()
    );
    assert!(
        wait_for(PATIENCE, || daemon.metric("mesh_host_drift_corrections_total{type=\"container\"}") >= 1.0)
    );
    DOCKER.ok(&["rm", "-f", &web]);
    assert!(wait_for(PATIENCE, || DOCKER.running(&web)), "made again after a removal:\n{}", daemon.log());
}

#[test]
fn daemon_resyncs_after_the_engine_restarts() {
    let n = Names::new(PODMAN_CLI, "drestart");
    let s = Scratch::new();
    let web = n.container("web");
    let socket = format!("unix://{}", s.p("podman.sock"));
    let mut service = Service::start(&socket);
    let d = s.declare(json!([sleeper("web.app", &web)]));
    let daemon = Daemon::start(&s, &d, &["--container-socket", &socket]);
    let up = || daemon.metric("mesh_host_watcher_up{watcher=\"docker\"}");
    assert!(wait_for(PATIENCE, || up() == 1.0), "{}", daemon.log());
    assert!(PODMAN_CLI.running(&web));

    service.kill();
    assert!(wait_for(PATIENCE, || up() == 0.0), "the watcher says the engine is gone:\n{}", daemon.log());
    // While the engine's API is down, the container goes away behind its back.
    let (ok, text) = Cli { podman: true }.run_local(&["rm", "-f", &web]);
    assert!(ok, "{text}");
    let _again = Service::start(&socket);
    assert!(wait_for(PATIENCE, || up() == 1.0), "reconnected:\n{}", daemon.log());
    assert!(wait_for(PATIENCE, || PODMAN_CLI.running(&web)), "the resync made it again:\n{}", daemon.log());
    assert!(daemon.metric("mesh_host_queue_adds_total{source=\"docker\"}") >= 1.0);
}

#[test]
fn daemon_runs_a_scheduled_step_at_its_fire() {
    let n = Names::new(DOCKER, "dsched");
    let s = Scratch::new();
    std::fs::create_dir(s.path("out")).unwrap();
    let d = s.declare(json!([
        {"type": "container", "id": "db.backup", "name": n.container("backup"), "image": IMAGE,
         "schedule": "* * * * *", "volumes": [format!("{}:/out", s.p("out"))],
         "args": ["sh", "-c", "echo ran >> /out/log"]},
    ]));
    let daemon = Daemon::start(&s, &d, &[]);
    assert!(!s.path("out/log").exists(), "installing does not run it");
    // Every minute, on the minute: at most a minute and the run's own time.
    assert!(
        wait_for(std::time::Duration::from_secs(75), || s.path("out/log").exists()),
        "the scheduler ran the step:\n{}",
        daemon.log()
    );
    assert!(
        wait_for(PATIENCE, || daemon.metric("mesh_host_scheduled_runs_total{result=\"succeeded\"}") >= 1.0)
    );
}
