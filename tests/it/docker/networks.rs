//! Networks: made, removed after what uses them, kept while something undeclared does.

use super::*;

/// A network made with the container on it, and removed after the container once both are
/// undeclared. On each runtime.
fn network_lifecycle(rt: Cli) {
    let mut n = Names::new(rt, "network");
    let s = Scratch::new();
    let net = n.network("app");
    let web = n.container("web");
    let d = s.declare(json!([
        {"type": "network", "id": "app.net", "name": net},
        {"type": "container", "id": "app.web", "name": web, "image": IMAGE, "args": SERVE, "network": net},
    ]));
    let report = rt.applied(&s, &d);
    assert_eq!(action(&report, "app.net"), "created");
    assert_eq!(action(&report, "app.web"), "created");
    assert!(rt.inspect(&web, "{{json .NetworkSettings.Networks}}").unwrap().contains(&net));
    let report = rt.applied(&s, &d);
    assert_eq!(action(&report, "app.net"), "unchanged");

    // Undeclared: the container goes first, then the network it used.
    let empty = s.declare(json!([]));
    let report = rt.applied(&s, &empty);
    assert_eq!(action(&report, "app.web"), "removed", "{report:#}");
    assert_eq!(action(&report, "app.net"), "removed", "{report:#}");
    let order: Vec<&str> =
        report["outcomes"].as_array().unwrap().iter().map(|o| o["id"].as_str().unwrap()).collect();
    assert_eq!(order, ["app.web", "app.net"]);
    assert!(rt.inspect(&web, "{{.Id}}").is_none());
    assert!(!rt.exists_network(&net));
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_network_lifecycle() {
    network_lifecycle(DOCKER);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn podman_network_lifecycle() {
    network_lifecycle(PODMAN_CLI);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
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
