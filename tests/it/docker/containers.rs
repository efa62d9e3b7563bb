//! Containers: made, left unchanged, recreated for what they read, put back after a hand-made
//! change, held, planned, and failing with the reason; and finding the runtime.

use super::*;

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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

/// Genesis bytes reconcile: a file written before any declaration named it (at first boot, by
/// hand) is read from the disk by the container that mounts it; declared later with the same
/// bytes, it is `unchanged`, and its record says what the container was created reading, so the
/// container is not recreated. The bytes are binary, declared as `bytes`.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_a_file_written_before_it_was_declared_and_declared_with_the_same_bytes_recreates_nothing() {
    let n = Names::new(DOCKER, "genesis");
    let s = Scratch::new();
    let web = n.container("web");
    let genesis: &[u8] = &[0, 1, 2, 0xfe, 0xff, b'\n'];
    std::fs::write(s.path("seed.bin"), genesis).unwrap();
    let container = json!({"type": "container", "id": "web.app", "name": web, "image": IMAGE, "args": SERVE,
                           "volumes": [format!("{}:/run/seed.bin:ro", s.p("seed.bin"))]});
    let report = applied(&s, &declare_as(&s, "before.json", json!([container])));
    assert_eq!(action(&report, "web.app"), "created", "{report:#}");
    let read = record(&s, "web.app")["reads"][s.p("seed.bin")].clone();
    assert!(read.as_str().is_some_and(|d| d.starts_with("sha256:")), "read from the disk: {read}");
    let before = DOCKER.id(&web);

    let declared = declare_as(
        &s,
        "after.json",
        json!([
            {"type": "file", "id": "web.seed", "path": s.p("seed.bin"), "bytes": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, genesis)},
            container,
        ]),
    );
    let report = applied(&s, &declared);
    assert_eq!(action(&report, "web.seed"), "unchanged", "{report:#}");
    assert_eq!(action(&report, "web.app"), "unchanged", "{report:#}");
    assert_eq!(DOCKER.id(&web), before, "the container was recreated");
    assert_eq!(record(&s, "web.seed")["wrote"], read, "the file's record is of the bytes the container read");
    assert_eq!(record(&s, "web.app")["reads"][s.p("seed.bin")], read);
    assert_eq!(std::fs::read(s.path("seed.bin")).unwrap(), genesis);

    // And the next apply, now reading the digest from the file's record, agrees.
    let report = applied(&s, &declared);
    assert_eq!(action(&report, "web.app"), "unchanged", "{report:#}");
    assert_eq!(DOCKER.id(&web), before);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
    // An image id alone names no repository to pull from.
    assert!(message("a.digest").contains("cannot be pulled: name it by repository and digest"), "{report:#}");
    // A tag is pulled from the runtime's default registry, which this machine cannot reach:
    // the message is the runtime's answer.
    assert!(
        message("b.tag").contains("image local/absent:1 is not on this machine and cannot be pulled: "),
        "{report:#}"
    );
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
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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

/// Made, left unchanged, recreated when the env file it reads changes (naming the file), and
/// removed once undeclared: on each runtime.
fn an_env_file_change_recreates_and_names_the_file(rt: Cli) {
    let n = Names::new(rt, "envfile");
    let s = Scratch::new();
    let web = n.container("web");
    let declare = |port: &str| {
        s.declare(json!([
            {"type": "file", "id": "web.env", "path": s.p("web.env"), "content": format!("PORT={port}\n")},
            {"type": "container", "id": "web.app", "name": web, "image": IMAGE, "args": SERVE,
             "env-file": [s.p("web.env")]},
        ]))
    };
    let report = rt.applied(&s, &declare("8080"));
    assert_eq!(action(&report, "web.app"), "created", "{report:#}");
    assert!(rt.running(&web));
    let before = rt.id(&web);

    let report = rt.applied(&s, &declare("8080"));
    assert_eq!(action(&report, "web.app"), "unchanged", "{report:#}");
    assert_eq!(rt.id(&web), before, "an unchanged container is the same container");

    let report = rt.applied(&s, &declare("9090"));
    assert_eq!(action(&report, "web.env"), "updated", "{report:#}");
    assert_eq!(action(&report, "web.app"), "updated", "{report:#}");
    assert_eq!(detail(&report, "web.app"), format!("recreated: {} changed", s.p("web.env")));
    assert_ne!(rt.id(&web), before);
    assert!(rt.ok(&["exec", &web, "env"]).contains("PORT=9090"));

    let report = rt.applied(&s, &s.declare(json!([])));
    assert_eq!(action(&report, "web.app"), "removed", "{report:#}");
    assert!(rt.inspect(&web, "{{.Id}}").is_none());
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_an_env_file_change_recreates_and_names_the_file() {
    an_env_file_change_recreates_and_names_the_file(DOCKER);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn podman_an_env_file_change_recreates_and_names_the_file() {
    an_env_file_change_recreates_and_names_the_file(PODMAN_CLI);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_adopted_node_holds_a_container_and_network_it_did_not_make_until_taken() {
    adopted_node_holds_a_container_and_network_it_did_not_make_until_taken(DOCKER);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn podman_adopted_node_holds_a_container_and_network_it_did_not_make_until_taken() {
    adopted_node_holds_a_container_and_network_it_did_not_make_until_taken(PODMAN_CLI);
}

fn adopted_node_holds_a_container_and_network_it_did_not_make_until_taken(rt: Cli) {
    let mut n = Names::new(rt, "adopt");
    let s = Scratch::new();
    let web = n.container("web");
    let net = n.network("legacy");
    rt.ok(&["network", "create", &net]);
    rt.ok(&["run", "-d", "--name", &web, "--network", &net, IMAGE, SERVE[0], SERVE[1], SERVE[2]]);
    let before = rt.id(&web);
    let declare = |taken: &[&str]| {
        let path = s.path("adopted.json");
        let d = json!({"version": 1, "adoption": {"taken": taken}, "resources": [
            {"type": "network", "id": "legacy.net", "name": net},
            {"type": "container", "id": "legacy.web", "name": web, "image": IMAGE, "args": SERVE, "network": net},
        ]});
        std::fs::write(&path, serde_json::to_vec_pretty(&d).unwrap()).unwrap();
        path
    };
    let report = rt.applied(&s, &declare(&[]));
    assert_eq!(action(&report, "legacy.net"), "held", "{report:#}");
    assert_eq!(action(&report, "legacy.web"), "held", "{report:#}");
    assert_eq!(rt.id(&web), before, "held as found");
    assert!(record(&s, "legacy.web").is_null(), "a hold is never recorded");

    let report = rt.applied(&s, &declare(&["legacy"]));
    assert_eq!(action(&report, "legacy.net"), "unchanged", "{report:#}");
    assert_eq!(action(&report, "legacy.web"), "updated", "{report:#}");
    assert!(detail(&report, "legacy.web").contains("had not created"), "{report:#}");
    assert_ne!(rt.id(&web), before);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_adopted_node_makes_no_container_over_what_it_holds() {
    adopted_node_makes_no_container_over_what_it_holds(DOCKER);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn podman_adopted_node_makes_no_container_over_what_it_holds() {
    adopted_node_makes_no_container_over_what_it_holds(PODMAN_CLI);
}

/// A container of an untaken module that would mount a held data directory, read a held
/// env-file or be restarted by a held file is held, and not created (issue 21, item 2): on a
/// real node that is a second database started on the operator's live data. Once the module is
/// taken, all of it is made.
fn adopted_node_makes_no_container_over_what_it_holds(rt: Cli) {
    let n = Names::new(rt, "adoptover");
    let s = Scratch::new();
    std::fs::create_dir(s.path("pgdata")).unwrap();
    std::fs::write(s.path("pgdata/PG_VERSION"), "15\n").unwrap();
    std::fs::write(s.path("pg.env"), "MODE=theirs\n").unwrap();
    let (server, worker, cache) = (n.container("server"), n.container("worker"), n.container("cache"));
    // A port of the machine the server binds by declaration, recorded as the container's holds.
    let port = unused_port();
    let declare = |taken: &[&str]| {
        let path = s.path("adopted.json");
        let d = json!({"version": 1, "adoption": {"taken": taken}, "resources": [
            {"type": "directory", "id": "pg.data", "path": s.p("pgdata")},
            {"type": "file", "id": "pg.env", "path": s.p("pg.env"), "content": "MODE=mesh\n"},
            {"type": "container", "id": "pg.server", "name": server, "image": IMAGE, "args": SERVE,
             "volumes": [format!("{}:/data", s.p("pgdata"))], "ports": [format!("127.0.0.1:{port}:80")]},
            {"type": "container", "id": "pg.worker", "name": worker, "image": IMAGE, "args": SERVE,
             "env-file": [s.p("pg.env")]},
            {"type": "container", "id": "pg.cache", "name": cache, "image": IMAGE, "args": SERVE,
             "restart-on": ["pg.env"]},
        ]});
        std::fs::write(&path, serde_json::to_vec_pretty(&d).unwrap()).unwrap();
        path
    };
    let report = rt.applied(&s, &declare(&[]));
    for (id, says) in [
        ("pg.server", format!("mount or read {} over {}", s.p("pgdata"), s.p("pgdata"))),
        ("pg.worker", format!("mount or read {} over {}", s.p("pg.env"), s.p("pg.env"))),
        ("pg.cache", "restarted by a change of pg.env".to_owned()),
    ] {
        assert_eq!(action(&report, id), "held", "{id}: {report:#}");
        assert!(detail(&report, id).contains(&says), "{id}: {says:?} in {report:#}");
    }
    for name in [&server, &worker, &cache] {
        assert!(rt.inspect(name, "{{.Id}}").is_none(), "{name} was created over what is held");
    }
    assert_eq!(std::fs::read_to_string(s.path("pg.env")).unwrap(), "MODE=theirs\n");

    let report = rt.applied(&s, &declare(&["pg"]));
    for id in ["pg.server", "pg.worker", "pg.cache"] {
        assert_eq!(action(&report, id), "created", "{id}: {report:#}");
    }
    assert!(detail(&report, "pg.env").starts_with("taken over"), "{report:#}");
    for name in [&server, &worker, &cache] {
        assert!(rt.inspect(name, "{{.Id}}").is_some(), "{name} is made once its module is taken");
    }
    assert_eq!(record(&s, "pg.server")["holds"], json!([port]), "the declared host port is recorded");
    assert!(record(&s, "pg.worker")["holds"].is_null(), "none declared, none recorded");
}

/// On an adopted node nothing runs inside what the host holds: an action `in` a held container
/// (of any module), and the run-once and scheduled steps of the module that holds it.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_adopted_node_runs_nothing_inside_what_it_holds() {
    let n = Names::new(DOCKER, "adoptrun");
    let s = Scratch::new();
    let db = n.container("db");
    DOCKER.ok(&["run", "-d", "--name", &db, IMAGE, SERVE[0], SERVE[1], SERVE[2]]);
    std::fs::create_dir(s.path("out")).unwrap();
    let path = s.path("adopted.json");
    let d = json!({"version": 1, "adoption": {"taken": ["ops"]}, "resources": [
        {"type": "container", "id": "db.server", "name": db, "image": IMAGE, "args": SERVE},
        {"type": "container", "id": "db.migrate", "name": n.container("migrate"), "image": IMAGE, "run-once": true,
         "volumes": [format!("{}:/out", s.p("out"))], "args": ["sh", "-c", "echo ran > /out/migrate"]},
        {"type": "container", "id": "db.backup", "name": n.container("backup"), "image": IMAGE,
         "schedule": "0 3 * * *", "args": ["true"]},
        {"type": "action", "id": "ops.vacuum", "in": db, "verify": ["test", "-f", "/tmp/vacuumed"],
         "command": ["touch", "/tmp/vacuumed"]},
    ]});
    std::fs::write(&path, serde_json::to_vec_pretty(&d).unwrap()).unwrap();
    let report = applied(&s, &path);
    for id in ["db.server", "db.migrate", "db.backup", "ops.vacuum"] {
        assert_eq!(action(&report, id), "held", "{id}: {report:#}");
    }
    assert!(!s.path("out/migrate").exists(), "the step did not run");
    assert!(
        !DOCKER.run(&["exec", &db, "test", "-f", "/tmp/vacuumed"]).0,
        "nothing ran inside the held container"
    );
    assert!(
        record(&s, "db.backup").is_null(),
        "a held step is not installed, so the scheduler never runs it"
    );
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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

/// Issue 13: ports published as a range, port for port, and `host-gateway` in hosts, as
/// `docker run -p 127.0.0.1::8000-8001 --add-host gw:host-gateway` does.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_port_ranges_and_host_gateway_are_given_to_the_runtime_as_docker_takes_them() {
    let n = Names::new(DOCKER, "oprange");
    let s = Scratch::new();
    let web = n.container("web");
    let d = s.declare(json!([
        {"type": "container", "id": "web.app", "name": web, "image": IMAGE, "args": SERVE,
         "ports": ["127.0.0.1::8000-8002/tcp"], "hosts": ["gw.internal:host-gateway"]},
    ]));
    let report = applied(&s, &d);
    assert_eq!(action(&report, "web.app"), "created", "{report:#}");
    for port in ["8000/tcp", "8001/tcp", "8002/tcp"] {
        assert!(DOCKER.ok(&["port", &web, port]).starts_with("127.0.0.1:"), "{port} is not published");
    }
    let hosts = DOCKER.ok(&["exec", &web, "cat", "/etc/hosts"]);
    let gateway = hosts.lines().find(|l| l.ends_with("gw.internal")).unwrap_or_else(|| panic!("{hosts}"));
    let ip = gateway.split_whitespace().next().unwrap();
    assert!(ip.parse::<std::net::IpAddr>().is_ok(), "host-gateway was not resolved to an address: {gateway}");
    assert_eq!(action(&applied(&s, &d), "web.app"), "unchanged");
}

/// The `mesh-host.spec` label as the Go agent computed it (issue 45, point 7; parity gap 1),
/// written out here from its rules rather than with anything of this agent's: bare hex of the
/// SHA-256 of the image, the name, then `env K=V` (sorted), `port`, `volume` and `arg` lines as
/// declared, a `reads ID=D` line per restart-on resource (sorted; D the hex digest of a file's
/// declared content), and a `file PATH=D` line per file the container reads at creation
/// (sorted; D the hex digest of what it holds).
fn go_label(image: &str, name: &str, lines: &[String]) -> String {
    use sha2::Digest as _;
    let mut text = format!("{image}\n{name}\n");
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    sha2::Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn hex_sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A node switched in place from the Go agent: its containers carry the Go's label, the files
/// they read hold what the Go wrote, and this agent's store is new. Each container whose Go
/// label matches the declaration is taken as it is, not recreated; one whose label does not
/// (its env moved while no agent ran) is recreated, which shows the match is a match.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_a_container_labelled_by_the_go_agent_is_adopted_without_recreating_it() {
    let n = Names::new(DOCKER, "goagent");
    let s = Scratch::new();
    let (web, other) = (n.container("web"), n.container("other"));
    let (env_text, conf_text) = ("PORT=8080\n", "listen 8080\n");
    std::fs::write(s.path("web.env"), env_text).unwrap();
    std::fs::write(s.path("app.conf"), conf_text).unwrap();
    let volume = format!("{}:/etc/app.conf:ro", s.p("app.conf"));
    let declare = |env_text: &str| {
        s.declare(json!([
            {"type": "file", "id": "web.env", "path": s.p("web.env"), "content": env_text},
            {"type": "file", "id": "web.conf", "path": s.p("app.conf"), "content": conf_text},
            {"type": "container", "id": "web.app", "name": web, "image": IMAGE, "args": SERVE,
             "env": {"MODE": "live", "LANG": "C"}, "env-file": [s.p("web.env")],
             "ports": ["127.0.0.1::80"], "volumes": [volume], "restart-on": ["web.conf"]},
            {"type": "container", "id": "web.other", "name": other, "image": IMAGE, "args": SERVE,
             "env": {"MODE": "live"}},
        ]))
    };
    let d = declare(env_text);
    let mut lines =
        vec!["env LANG=C".to_owned(), "env MODE=live".to_owned(), "port 127.0.0.1::80".to_owned()];
    lines.push(format!("volume {volume}"));
    lines.extend(SERVE.iter().map(|a| format!("arg {a}")));
    lines.push(format!("reads web.conf={}", hex_sha256(conf_text.as_bytes())));
    let mut files = [
        format!("file {}={}", s.p("app.conf"), hex_sha256(conf_text.as_bytes())),
        format!("file {}={}", s.p("web.env"), hex_sha256(env_text.as_bytes())),
    ];
    files.sort();
    lines.extend(files);
    let label = go_label(IMAGE, &web, &lines);
    let go_run = |name: &str, label: &str, id: &str, extra: &[&str]| {
        let mut args = vec!["run", "-d", "--name", name, "--restart", "unless-stopped"];
        let (spec, id) = (format!("mesh-host.spec={label}"), format!("mesh-host.id={id}"));
        args.extend(["--label", &spec, "--label", &id]);
        args.extend(extra);
        args.push(IMAGE);
        args.extend(SERVE);
        DOCKER.ok(&args);
    };
    let env_file = s.p("web.env");
    go_run(
        &web,
        &label,
        "web.app",
        &["--env-file", &env_file, "-e", "LANG=C", "-e", "MODE=live", "-p", "127.0.0.1::80", "-v", &volume],
    );
    // Made by the Go while its env said MODE=test; the declaration has moved on since.
    let stale = go_label(
        IMAGE,
        &other,
        &["env MODE=test".to_owned()]
            .iter()
            .cloned()
            .chain(SERVE.iter().map(|a| format!("arg {a}")))
            .collect::<Vec<_>>(),
    );
    go_run(&other, &stale, "web.other", &["-e", "MODE=test"]);
    let (web_before, other_before) = (DOCKER.id(&web), DOCKER.id(&other));

    let report = applied(&s, &d);
    assert_eq!(action(&report, "web.app"), "unchanged", "{report:#}");
    assert!(detail(&report, "web.app").contains("the Go agent"), "{report:#}");
    assert_eq!(DOCKER.id(&web), web_before, "a container the Go agent labelled is not recreated");
    assert_eq!(action(&report, "web.other"), "updated", "{report:#}");
    assert_ne!(DOCKER.id(&other), other_before, "a Go label that does not match is no pass");

    // Steady afterwards, and a genuine change recreates it with this agent's own label.
    let report = applied(&s, &d);
    assert_eq!(action(&report, "web.app"), "unchanged", "{report:#}");
    assert_eq!(DOCKER.id(&web), web_before);
    let report = applied(&s, &declare("PORT=9090\n"));
    assert_eq!(action(&report, "web.app"), "updated", "{report:#}");
    let relabelled = DOCKER.inspect(&web, "{{index .Config.Labels \"mesh-host.spec\"}}").unwrap();
    assert!(relabelled.starts_with("sha256:"), "{relabelled}");
}
