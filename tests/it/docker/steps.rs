//! Run-once and scheduled steps, and actions run inside a container: each runs when it must,
//! is recorded by its spec, and gates what follows when it fails or hangs.

use super::*;

/// Run once, recorded by its spec: not run again while the spec is the same, run again when it
/// changes; a completed step leaves no container. On each runtime.
fn run_once_runs_once_and_is_recorded_by_its_spec(rt: Cli) {
    let n = Names::new(rt, "runonce");
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
    let report = rt.applied(&s, &declare("one"));
    assert_eq!(action(&report, "db.seed"), "created", "{report:#}");
    assert_eq!(std::fs::read_to_string(s.path("out/log")).unwrap(), "one\n");
    assert!(rt.inspect(&step, "{{.Id}}").is_none(), "a completed step leaves no container");

    let report = rt.applied(&s, &declare("one"));
    assert_eq!(action(&report, "db.seed"), "unchanged");
    assert_eq!(std::fs::read_to_string(s.path("out/log")).unwrap(), "one\n", "not run again");

    let report = rt.applied(&s, &declare("two"));
    assert_eq!(action(&report, "db.seed"), "updated");
    assert_eq!(std::fs::read_to_string(s.path("out/log")).unwrap(), "one\ntwo\n");
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_run_once_runs_once_and_is_recorded_by_its_spec() {
    run_once_runs_once_and_is_recorded_by_its_spec(DOCKER);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn podman_run_once_runs_once_and_is_recorded_by_its_spec() {
    run_once_runs_once_and_is_recorded_by_its_spec(PODMAN_CLI);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
    let run = |id: &str| fire(&s, &d, id);
    run("db.backup").expect("the scheduled step runs");
    assert_eq!(std::fs::read_to_string(s.path("out/log")).unwrap(), "ran\n");
    let failed = run("db.broken").expect_err("a failing step is an error for the scheduler");
    assert!(failed.to_string().contains("exited with code 4"), "{failed}");

    // A run, failed or not, changes nothing an apply reports.
    let report = applied(&s, &d);
    assert_eq!(action(&report, "db.backup"), "unchanged");
    assert_eq!(action(&report, "db.broken"), "unchanged");
}

/// A scheduled step whose schedule changes is re-installed (`updated`), not run: its record
/// takes the new schedule, the scheduler runs it at the new declaration, and no longer at the
/// old one, which it was installed at no more.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_a_changed_schedule_re_installs_a_scheduled_step() {
    let n = Names::new(DOCKER, "resched");
    let s = Scratch::new();
    std::fs::create_dir(s.path("out")).unwrap();
    let step = |schedule: &str| {
        json!([{"type": "container", "id": "db.backup", "name": n.container("backup"), "image": IMAGE,
                "schedule": schedule, "volumes": [format!("{}:/out", s.p("out"))],
                "args": ["sh", "-c", "echo ran >> /out/log"]}])
    };
    let every_five = declare_as(&s, "every-five.json", step("*/5 * * * *"));
    let nightly = declare_as(&s, "nightly.json", step("0 3 * * *"));
    let report = applied(&s, &every_five);
    assert_eq!(action(&report, "db.backup"), "created", "{report:#}");
    let installed = record(&s, "db.backup")["spec"].clone();

    let report = applied(&s, &nightly);
    assert_eq!(action(&report, "db.backup"), "updated", "{report:#}");
    assert!(
        detail(&report, "db.backup")
            .starts_with("scheduled step re-installed: its image, settings or cadence changed"),
        "{report:#}"
    );
    assert_eq!(record(&s, "db.backup")["schedule"], "0 3 * * *");
    assert_ne!(record(&s, "db.backup")["spec"], installed, "the schedule is part of the spec");
    assert!(!s.path("out/log").exists(), "re-installing does not run it");
    assert_eq!(action(&applied(&s, &nightly), "db.backup"), "unchanged");

    let refused = fire(&s, &every_five, "db.backup").expect_err("installed at the old schedule no more");
    assert!(refused.to_string().contains("is not installed at its current declaration"), "{refused}");
    fire(&s, &nightly, "db.backup").expect("installed at the new schedule");
    assert_eq!(std::fs::read_to_string(s.path("out/log")).unwrap(), "ran\n");
}

/// Regression (issue 11): a run-once step published its declared ports, so a step declared
/// from its service's template (the same ports) clashed with the service already holding them
/// and failed its gate. A step publishes no ports, and says so.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_a_run_once_step_does_not_publish_its_ports() {
    let n = Names::new(DOCKER, "stepports");
    let s = Scratch::new();
    let port = unused_port();
    let ports = json!([format!("127.0.0.1:{port}:80")]);
    let mut web = sleeper("web.app", &n.container("web"));
    web["ports"] = ports.clone();
    let d = s.declare(json!([
        web,
        {"type": "container", "id": "web.migrate", "name": n.container("migrate"), "image": IMAGE,
         "run-once": true, "ports": ports, "args": ["true"]},
    ]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "the step ran beside the service holding the port:\n{report:#}");
    assert_eq!(action(&report, "web.migrate"), "created");
    assert!(detail(&report, "web.migrate").contains("not published"), "{report:#}");
    assert!(DOCKER.running(&n.container("web")));
}

/// What the daemon's scheduler does at a fire of `id`: run the step if the store says an apply
/// installed it at the declaration in `d`.
pub(super) fn fire(
    s: &Scratch,
    d: &std::path::Path,
    id: &str,
) -> Result<mesh_host::apply::ScheduledRun, mesh_host::apply::Error> {
    let parsed = mesh_host::declaration::Declaration::parse(&std::fs::read(d).unwrap()).unwrap();
    let store = mesh_host::store::Store::read_only(&s.state()).unwrap();
    let key = s.path("state/sealing.key");
    let installed = mesh_host::apply::installed_steps(&parsed, &store, &key);
    let id = mesh_host::declaration::Id::parse(id).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(rt.spawn_blocking(move || {
        mesh_host::apply::run_scheduled(
            &parsed,
            &id,
            installed.get(&id).map(String::as_str),
            None,
            None,
            &key,
        )
    }))
    .unwrap()
}

/// Regression (issue 11): the scheduler ran every scheduled step of the declaration in force,
/// even one behind a failed gate, one whose install failed, or one of a module not taken yet.
/// Only a step installed at its current declaration runs.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_a_scheduled_step_that_was_not_installed_is_not_run() {
    let n = Names::new(DOCKER, "noinst");
    let s = Scratch::new();
    std::fs::create_dir(s.path("out")).unwrap();
    let out = format!("{}:/out", s.p("out"));
    let d = s.declare(json!([
        // Its image is not on the machine: its install fails.
        {"type": "container", "id": "db.broken", "name": n.container("broken"), "image": "local/parity-absent:1",
         "schedule": "* * * * *", "volumes": [out], "args": ["sh", "-c", "echo broken >> /out/log"]},
        {"type": "action", "id": "db.migrate", "command": ["false"], "verify": ["false"]},
        // Behind the failed gate: never installed.
        {"type": "container", "id": "db.backup", "name": n.container("backup"), "image": IMAGE,
         "schedule": "* * * * *", "volumes": [out], "args": ["sh", "-c", "echo gated >> /out/log"]},
    ]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["error"]["resource"], "db.migrate", "{report:#}");
    for id in ["db.broken", "db.backup"] {
        let refused = fire(&s, &d, id).expect_err("a step that was not installed is not run");
        assert!(refused.to_string().contains("is not installed at its current declaration"), "{refused}");
    }
    assert!(!s.path("out/log").exists(), "neither step ran");

    // Once the gate passes, the step behind it is installed, and runs.
    let d = s.declare(json!([
        {"type": "container", "id": "db.backup", "name": n.container("backup"), "image": IMAGE,
         "schedule": "* * * * *", "volumes": [out], "args": ["sh", "-c", "echo gated >> /out/log"]},
    ]));
    applied(&s, &d);
    fire(&s, &d, "db.backup").expect("installed now");
    assert_eq!(std::fs::read_to_string(s.path("out/log")).unwrap(), "gated\n");
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
