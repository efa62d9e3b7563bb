//! `mesh-host run` with containers: what the watcher reports is put back, a resync after the
//! engine restarts, scheduled steps at their fire.

use super::*;

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn daemon_resyncs_after_the_engine_restarts() {
    let n = Names::new(PODMAN_CLI, "drestart");
    let s = Scratch::new();
    let web = n.container("web");
    let socket = format!("unix://{}", s.p("podman.sock"));
    let mut service = Service::new(&socket);
    let d = s.declare(json!([sleeper("web.app", &web)]));
    let daemon = Daemon::start(&s, &d, &["--container-socket", &socket]);
    let up = || daemon.metric("mesh_host_watcher_up{watcher=\"docker\"}");
    assert!(wait_for(PATIENCE, || up() == 1.0), "{}", daemon.log());
    assert!(PODMAN_CLI.running(&web));

    service.stop();
    assert!(wait_for(PATIENCE, || up() == 0.0), "the watcher says the engine is gone:\n{}", daemon.log());
    // While the engine's API is down, the container goes away behind its back.
    let (ok, text) = Cli { podman: true }.run_local(&["rm", "-f", &web]);
    assert!(ok, "{text}");
    service.start();
    assert!(wait_for(PATIENCE, || up() == 1.0), "reconnected:\n{}", daemon.log());
    assert!(wait_for(PATIENCE, || PODMAN_CLI.running(&web)), "the resync made it again:\n{}", daemon.log());
    assert!(daemon.metric("mesh_host_queue_adds_total{source=\"docker\"}") >= 1.0);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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

/// Regression (issue 11): the daemon's scheduler ran every scheduled step of the declaration in
/// force. A step behind a failed gate was never installed, and its fires are counted as
/// `not_installed`, never run.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn daemon_does_not_run_a_scheduled_step_that_was_not_installed() {
    let n = Names::new(DOCKER, "dnoinst");
    let s = Scratch::new();
    std::fs::create_dir(s.path("out")).unwrap();
    let d = s.declare(json!([
        {"type": "action", "id": "db.migrate", "command": ["false"], "verify": ["false"]},
        {"type": "container", "id": "db.backup", "name": n.container("backup"), "image": IMAGE,
         "schedule": "* * * * *", "volumes": [format!("{}:/out", s.p("out"))],
         "args": ["sh", "-c", "echo ran >> /out/log"]},
    ]));
    let daemon = Daemon::start(&s, &d, &[]);
    // Every minute, on the minute: at most a minute, then the count says the fire was seen.
    assert!(
        wait_for(std::time::Duration::from_secs(75), || {
            daemon.metric("mesh_host_scheduled_runs_total{result=\"not_installed\"}") >= 1.0
        }),
        "the fire was seen and not run:\n{}",
        daemon.log()
    );
    assert!(!s.path("out/log").exists(), "the step behind the failed gate never ran");
    assert_eq!(daemon.metric("mesh_host_scheduled_runs_total{result=\"succeeded\"}"), 0.0);
}
