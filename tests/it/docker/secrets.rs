//! A container that reads a file carrying a secret (issue 9; issue 11's point 5): recreated
//! when the opened value moves, never when the same value is sealed again, and labelled with
//! nothing a guess could be checked against.

use super::*;
use crate::secrets::{keygen, seal};

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_a_container_is_recreated_when_a_secret_it_reads_moves_and_not_when_it_is_sealed_again() {
    recreated_only_when_a_secret_moves(DOCKER);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn podman_a_container_is_recreated_when_a_secret_it_reads_moves_and_not_when_it_is_sealed_again() {
    recreated_only_when_a_secret_moves(PODMAN_CLI);
}

fn recreated_only_when_a_secret_moves(cli: Cli) {
    let n = Names::new(cli, "secret");
    let s = Scratch::new();
    let public = keygen(&s);
    let web = n.container("web");
    let declare = |password: &[u8], key: &[u8]| {
        s.declare(json!([
            {"type": "file", "id": "web.env", "path": s.p("web.env"), "content": "PASSWORD=${secret:pw}\n",
             "secrets": {"pw": seal(&public, password)}},
            {"type": "file", "id": "web.key", "path": s.p("web.key"), "sealed": seal(&public, key)},
            {"type": "container", "id": "web.app", "name": web, "image": IMAGE, "args": SERVE,
             "env-file": [s.p("web.env")], "restart-on": ["web.key"]},
        ]))
    };
    let report = cli.applied(&s, &declare(b"one", b"key one"));
    assert_eq!(action(&report, "web.app"), "created", "{report:#}");
    assert!(cli.ok(&["exec", &web, "env"]).contains("PASSWORD=one"));
    let label = cli.inspect(&web, "{{index .Config.Labels \"mesh-host.spec\"}}").unwrap();
    let reads = record(&s, "web.app")["reads"][s.p("web.env")].as_str().unwrap().to_owned();
    assert!(reads.starts_with("hmac-sha256:"), "what it read is recorded by a keyed digest: {reads}");
    let id = cli.id(&web);

    // Every value sealed again: new ciphertexts, the same values. Nothing moves.
    let report = cli.applied(&s, &declare(b"one", b"key one"));
    assert_eq!(action(&report, "web.env"), "unchanged", "{report:#}");
    assert_eq!(action(&report, "web.key"), "unchanged", "{report:#}");
    assert_eq!(action(&report, "web.app"), "unchanged", "{report:#}");
    assert_eq!(cli.id(&web), id, "not recreated");
    assert_eq!(cli.inspect(&web, "{{index .Config.Labels \"mesh-host.spec\"}}").unwrap(), label);

    // A new value: recreated, naming the file.
    let report = cli.applied(&s, &declare(b"two", b"key one"));
    assert_eq!(action(&report, "web.app"), "updated", "{report:#}");
    assert_eq!(detail(&report, "web.app"), format!("recreated: {} changed", s.p("web.env")));
    assert_ne!(cli.id(&web), id);
    // Podman may answer an exec by name a moment before the new container is the one named.
    assert!(wait_for(PATIENCE, || cli.run(&["exec", &web, "env"]).1.contains("PASSWORD=two")));

    // A new value of the file it restarts on: recreated too, and its label moves.
    let (id, label) =
        (cli.id(&web), cli.inspect(&web, "{{index .Config.Labels \"mesh-host.spec\"}}").unwrap());
    let report = cli.applied(&s, &declare(b"two", b"key two"));
    assert_eq!(action(&report, "web.key"), "updated", "{report:#}");
    assert_eq!(action(&report, "web.app"), "updated", "{report:#}");
    assert_ne!(cli.id(&web), id);
    assert_ne!(cli.inspect(&web, "{{index .Config.Labels \"mesh-host.spec\"}}").unwrap(), label);
    let labels = cli.inspect(&web, "{{json .Config.Labels}}").unwrap();
    assert!(!labels.contains("two") && !labels.contains("one"), "{labels}");
}

/// Steps that restart on a file carrying a secret: a run-once step runs again when the value
/// moves and not when it is sealed again; a scheduled one stays installed through a sealing
/// again, and the scheduler, which checks that with the node's key, runs it.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_steps_that_restart_on_a_secret_run_again_only_when_it_moves() {
    let n = Names::new(DOCKER, "secretsteps");
    let s = Scratch::new();
    let public = keygen(&s);
    std::fs::create_dir(s.path("out")).unwrap();
    let declare = |token: &[u8]| {
        s.declare(json!([
            {"type": "file", "id": "db.token", "path": s.p("token"), "sealed": seal(&public, token)},
            {"type": "container", "id": "db.migrate", "name": n.container("migrate"), "image": IMAGE,
             "run-once": true, "restart-on": ["db.token"],
             "volumes": [format!("{}:/out", s.p("out"))], "args": ["sh", "-c", "echo ran >> /out/migrate"]},
            {"type": "container", "id": "db.backup", "name": n.container("backup"), "image": IMAGE,
             "schedule": "*/5 * * * *", "restart-on": ["db.token"],
             "volumes": [format!("{}:/out", s.p("out"))], "args": ["sh", "-c", "echo ran >> /out/backup"]},
        ]))
    };
    let runs = |f: &str| std::fs::read_to_string(s.path(f)).unwrap_or_default().lines().count();
    let d = declare(b"one");
    applied(&s, &d);
    assert_eq!(runs("out/migrate"), 1);
    super::steps::fire(&s, &d, "db.backup").expect("installed, and run by the scheduler");
    assert_eq!(runs("out/backup"), 1);

    let d = declare(b"one");
    let report = applied(&s, &d);
    assert_eq!(action(&report, "db.migrate"), "unchanged", "sealed again, same value: {report:#}");
    assert_eq!(action(&report, "db.backup"), "unchanged", "{report:#}");
    assert_eq!(runs("out/migrate"), 1);
    super::steps::fire(&s, &d, "db.backup").expect("still installed");
    assert_eq!(runs("out/backup"), 2);

    let d = declare(b"two");
    let report = applied(&s, &d);
    assert_eq!(action(&report, "db.migrate"), "updated", "{report:#}");
    assert_eq!(action(&report, "db.backup"), "updated", "{report:#}");
    assert_eq!(runs("out/migrate"), 2);
    super::steps::fire(&s, &d, "db.backup").expect("installed at the new value");
}

/// A container that reads an `into` env file (someone else's file, an owned key filled from a
/// secret) and restarts on it: recreated when the value moves, not when it is sealed again
/// (issue 11, point 1's last sentence).
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_a_container_on_an_into_file_with_a_secret_is_recreated_only_when_the_value_moves() {
    let cli = DOCKER;
    let n = Names::new(cli, "intosec");
    let s = Scratch::new();
    let public = keygen(&s);
    let web = n.container("web");
    std::fs::write(s.path("web.env"), "# the package's\nOTHER=1\n").unwrap();
    let declare = |password: &[u8]| {
        s.declare(json!([
            {"type": "file", "id": "web.env", "path": s.p("web.env"), "into": "env",
             "content": "PASSWORD=${secret:pw}\n", "secrets": {"pw": seal(&public, password)}},
            {"type": "container", "id": "web.app", "name": web, "image": IMAGE, "args": SERVE,
             "env-file": [s.p("web.env")], "restart-on": ["web.env"]},
        ]))
    };
    let report = cli.applied(&s, &declare(b"into-one"));
    assert_eq!(action(&report, "web.app"), "created", "{report:#}");
    let env = cli.ok(&["exec", &web, "env"]);
    assert!(env.contains("PASSWORD=into-one") && env.contains("OTHER=1"), "{env}");
    let label = cli.inspect(&web, "{{index .Config.Labels \"mesh-host.spec\"}}").unwrap();
    let reads = record(&s, "web.app")["reads"][s.p("web.env")].as_str().unwrap().to_owned();
    assert!(reads.starts_with("hmac-sha256:"), "what it read is recorded by a keyed digest: {reads}");
    let id = cli.id(&web);

    let report = cli.applied(&s, &declare(b"into-one"));
    assert_eq!(action(&report, "web.env"), "unchanged", "{report:#}");
    assert_eq!(action(&report, "web.app"), "unchanged", "{report:#}");
    assert_eq!(cli.id(&web), id, "not recreated");
    assert_eq!(cli.inspect(&web, "{{index .Config.Labels \"mesh-host.spec\"}}").unwrap(), label);

    let report = cli.applied(&s, &declare(b"into-two"));
    assert_eq!(action(&report, "web.env"), "updated", "{report:#}");
    assert_eq!(action(&report, "web.app"), "updated", "{report:#}");
    assert_ne!(cli.id(&web), id);
    assert!(wait_for(PATIENCE, || cli.run(&["exec", &web, "env"]).1.contains("PASSWORD=into-two")));
    let labels = cli.inspect(&web, "{{json .Config.Labels}}").unwrap();
    assert!(!labels.contains("into-"), "{labels}");
}
