//! Images made present at apply, against a real registry on loopback
//! (`tests/testbed/40-registry.sh`): pulled when absent, by tag and by digest, read back; a pull
//! that fails names the image and the registry's answer. On Docker and on Podman.

use super::*;

/// The testbed's registry (`tests/testbed/40-registry.sh`).
const REGISTRY: &str = "127.0.0.1:5055";

/// A loopback port where no registry listens: a registry that is down.
const DOWN: &str = "127.0.0.1:5056";

/// Fails, never skips, when the registry is not there.
fn require_registry() {
    let up = std::net::TcpStream::connect(REGISTRY).is_ok();
    assert!(up, "no registry answers on {REGISTRY}: run tests/testbed/40-registry.sh (as root)");
}

/// Images a test pushed or pulled, removed from both runtimes when it ends. Made before the
/// test's `Names`, so it drops after them: the containers go first, and the images are then
/// not in use.
#[derive(Default)]
struct Pushed {
    images: Vec<String>,
}

impl Drop for Pushed {
    fn drop(&mut self) {
        for image in &self.images {
            let _ = DOCKER.run(&["rmi", "-f", image]);
            let _ = PODMAN_CLI.run(&["rmi", "-f", image]);
        }
    }
}

/// Pushes the test image into the registry under a repository of this test's own, then removes
/// every local name of it from both runtimes, so the runtime under test must pull it. Returns
/// the tag reference and the digest reference.
fn pushed(p: &mut Pushed, repo: &str) -> (String, String) {
    require_registry();
    let tagged = format!("{REGISTRY}/{repo}:1");
    // An image of this repository's own (a label on the test image), so its digest is too: a
    // runtime answers for a digest whatever repository it came by, and another test's pull must
    // not make this one's present.
    let context = tempfile::tempdir().unwrap();
    std::fs::write(context.path().join("Dockerfile"), format!("FROM {IMAGE}\nLABEL mesh-host.test={repo}\n"))
        .unwrap();
    let (ok, text) = DOCKER.run(&["build", "-q", "-t", &tagged, context.path().to_str().unwrap()]);
    assert!(ok, "docker build {tagged}: {text}");
    let (ok, text) = DOCKER.run(&["push", &tagged]);
    assert!(ok, "docker push {tagged}: {text}");
    let digest = DOCKER
        .run(&["image", "inspect", "--format", "{{index .RepoDigests 0}}", &tagged])
        .1
        .trim()
        .to_owned();
    assert!(digest.contains("@sha256:"), "{digest}");
    p.images.extend([tagged.clone(), digest.clone()]);
    for rt in [DOCKER, PODMAN_CLI] {
        let _ = rt.run(&["rmi", &tagged]);
        assert!(!rt.run(&["image", "inspect", &tagged]).0, "{tagged} is still on {}", rt.name());
        assert!(!rt.run(&["image", "inspect", &digest]).0, "{digest} is still on {}", rt.name());
    }
    (tagged, digest)
}

fn images_are_pulled_when_absent_by_tag_and_by_digest(rt: Cli) {
    let mut p = Pushed::default();
    let names = Names::new(rt, "pull");
    let repo = format!("mh-parity-{}-{}", rt.name(), std::process::id());
    let (tagged, _) = pushed(&mut p, &format!("{repo}/web"));
    // Another repository, so the pull by digest is not answered by the one by tag.
    let (_, digest) = pushed(&mut p, &format!("{repo}/seed"));
    let s = Scratch::new();
    std::fs::create_dir(s.path("out")).unwrap();
    let web = names.container("web");
    let d = s.declare(json!([
        {"type": "container", "id": "web.app", "name": web, "image": tagged, "args": SERVE},
        {"type": "container", "id": "web.seed", "name": names.container("seed"), "image": digest,
         "run-once": true, "volumes": [format!("{}:/out", s.p("out"))], "args": ["sh", "-c", "echo seeded > /out/log"]},
    ]));
    let report = rt.applied(&s, &d);
    assert_eq!(action(&report, "web.app"), "created", "{report:#}");
    assert!(detail(&report, "web.app").contains(&format!("image {tagged} pulled")), "{report:#}");
    assert!(rt.running(&web));
    assert_eq!(action(&report, "web.seed"), "created", "{report:#}");
    assert!(detail(&report, "web.seed").contains("pulled"), "{report:#}");
    assert_eq!(std::fs::read_to_string(s.path("out/log")).unwrap(), "seeded\n");
    // Read back by the runtime itself: held at the digest asked for.
    let (ok, held) = rt.run(&["image", "inspect", "--format", "{{json .RepoDigests}}", &digest]);
    assert!(ok && held.contains(digest.split_once('@').unwrap().1), "{held}");

    // Present now: not pulled again.
    let report = rt.applied(&s, &d);
    assert_eq!(action(&report, "web.app"), "unchanged", "{report:#}");
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_images_are_pulled_when_absent_by_tag_and_by_digest() {
    images_are_pulled_when_absent_by_tag_and_by_digest(DOCKER);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn podman_images_are_pulled_when_absent_by_tag_and_by_digest() {
    images_are_pulled_when_absent_by_tag_and_by_digest(PODMAN_CLI);
}

fn a_failed_pull_names_the_image_and_the_registrys_answer(rt: Cli) {
    let names = Names::new(rt, "nopull");
    require_registry();
    let s = Scratch::new();
    let repo = format!("mh-parity-{}-{}/absent", rt.name(), std::process::id());
    let unknown_tag = format!("{REGISTRY}/{repo}:1");
    let unknown_digest = format!("{REGISTRY}/{repo}@sha256:{}", "0".repeat(64));
    let down = format!("{DOWN}/{repo}:1");
    let bare_id = format!("sha256:{}", "0".repeat(64));
    let d = s.declare(json!([
        {"type": "container", "id": "a.tag", "name": names.container("a"), "image": unknown_tag, "args": SERVE},
        {"type": "container", "id": "b.digest", "name": names.container("b"), "image": unknown_digest, "args": SERVE},
        {"type": "container", "id": "c.down", "name": names.container("c"), "image": down, "args": SERVE},
        {"type": "container", "id": "d.id", "name": names.container("d"), "image": bare_id, "args": SERVE},
        {"type": "file", "id": "e.after", "path": s.p("after"), "content": "x"},
    ]));
    let (code, report) = rt.apply(&s, &d);
    assert_eq!(code, 1, "{report:#}");
    let failures = report["error"]["failures"].as_array().unwrap();
    let message = |id: &str| {
        failures.iter().find(|f| f["id"] == id).unwrap_or_else(|| panic!("{id}: {report:#}"))["message"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (tag, digest, down_msg) = (message("a.tag"), message("b.digest"), message("c.down"));
    assert!(
        tag.contains(&format!("image {unknown_tag} is not on this machine and cannot be pulled: ")),
        "{tag}"
    );
    // The registry's own words: it does not know that manifest.
    assert!(tag.contains("manifest unknown") || tag.contains("not found"), "{tag}");
    assert!(digest.contains(&unknown_digest) && digest.contains("cannot be pulled"), "{digest}");
    assert!(down_msg.contains(&down) && down_msg.contains("connection refused"), "{down_msg}");
    assert!(message("d.id").contains("cannot be pulled: name it by repository and digest"), "{report:#}");
    for id in ["a", "b", "c", "d"] {
        assert!(rt.inspect(&names.container(id), "{{.Id}}").is_none(), "nothing was created");
    }
    // A failed pull fails its resource only.
    assert_eq!(action(&report, "e.after"), "created");
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_a_failed_pull_names_the_image_and_the_registrys_answer() {
    a_failed_pull_names_the_image_and_the_registrys_answer(DOCKER);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn podman_a_failed_pull_names_the_image_and_the_registrys_answer() {
    a_failed_pull_names_the_image_and_the_registrys_answer(PODMAN_CLI);
}

/// A scheduled step's image is made present when it is installed, so its first fire does not
/// find it missing.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_a_scheduled_steps_image_is_pulled_when_it_is_installed() {
    let mut p = Pushed::default();
    let names = Names::new(DOCKER, "schedpull");
    let repo = format!("mh-parity-sched-{}/busybox", std::process::id());
    let (tagged, _) = pushed(&mut p, &repo);
    let s = Scratch::new();
    let d = s.declare(json!([
        {"type": "container", "id": "db.backup", "name": names.container("backup"), "image": tagged,
         "schedule": "0 3 * * *", "args": ["true"]},
    ]));
    let report = applied(&s, &d);
    assert_eq!(action(&report, "db.backup"), "created", "{report:#}");
    assert!(detail(&report, "db.backup").contains("pulled"), "{report:#}");
    assert!(DOCKER.run(&["image", "inspect", &tagged]).0, "the image is on the machine");
}

/// The registry of the testbed that asks for a login (`tests/testbed/40-registry.sh`).
const LOGIN_REGISTRY: &str = "127.0.0.1:5057";

/// `apply --json` on `socket` (the default one when `None`) with the container client's
/// configuration in `config` (`DOCKER_CONFIG`).
fn apply_with_client_config(
    socket: Option<&str>,
    s: &Scratch,
    d: &std::path::Path,
    config: &std::path::Path,
) -> (i32, Value) {
    let mut cmd = assert_cmd::Command::cargo_bin("mesh-host").unwrap();
    cmd.env("DOCKER_CONFIG", config).arg("--state").arg(s.state());
    if let Some(socket) = socket {
        cmd.args(["--container-socket", socket]);
    }
    let out = cmd.args(["apply", "--json", d.to_str().unwrap()]).output().unwrap();
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), report)
}

/// Docker's engine keeps no registry credentials: its client sends what `docker login` stored
/// with each pull. mesh-host sends them the same way, from the client's configuration, and the
/// password never reaches the report.
fn a_registry_that_asks_for_a_login_gets_the_clients_credentials(rt: Cli) {
    let mut p = Pushed::default();
    let names = Names::new(rt, "login");
    assert!(
        std::net::TcpStream::connect(LOGIN_REGISTRY).is_ok(),
        "no registry answers on {LOGIN_REGISTRY}: run tests/testbed/40-registry.sh (as root)"
    );
    let s = Scratch::new();
    let config = s.path("docker-config");
    let empty = s.path("no-config");
    std::fs::create_dir_all(&empty).unwrap();
    let docker = |args: &[&str]| {
        let out =
            std::process::Command::new("docker").arg("--config").arg(&config).args(args).output().unwrap();
        assert!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let mut login = std::process::Command::new("docker")
        .arg("--config")
        .arg(&config)
        .args(["login", LOGIN_REGISTRY, "-u", "mh-parity", "--password-stdin"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    login.stdin.take().unwrap().write_all(b"registry-pw-parity").unwrap();
    assert!(login.wait().unwrap().success(), "docker login {LOGIN_REGISTRY}");
    let image = format!("{LOGIN_REGISTRY}/mh-parity-{}-{}/busybox:1", rt.name(), std::process::id());
    docker(&["tag", IMAGE, &image]);
    docker(&["push", &image]);
    p.images.push(image.clone());
    for cli in [DOCKER, PODMAN_CLI] {
        let _ = cli.run(&["rmi", &image]);
    }
    let d = s.declare(json!([
        {"type": "container", "id": "web.app", "name": names.container("web"), "image": image, "args": SERVE},
    ]));
    // Podman's service reads its registries.conf once: one of this test's own reads the
    // testbed's entry for this registry, whenever the shared one was started.
    let own = rt.podman.then(|| Service::new(&format!("unix://{}", s.p("podman.sock"))));
    let socket = own.as_ref().map(|o| o.socket().to_owned());
    let (code, report) = apply_with_client_config(socket.as_deref(), &s, &d, &empty);
    assert_eq!(code, 1, "without the login the registry refuses: {report:#}");
    let message = report["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("image {image} is not on this machine and cannot be pulled: ")),
        "{message}"
    );
    let (code, report) = apply_with_client_config(socket.as_deref(), &s, &d, &config);
    assert_eq!(code, 0, "{report:#}");
    assert!(detail(&report, "web.app").contains("pulled"), "{report:#}");
    assert!(!report.to_string().contains("registry-pw-parity"));
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_a_registry_that_asks_for_a_login_gets_the_clients_credentials() {
    a_registry_that_asks_for_a_login_gets_the_clients_credentials(DOCKER);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn podman_a_registry_that_asks_for_a_login_gets_the_clients_credentials() {
    a_registry_that_asks_for_a_login_gets_the_clients_credentials(PODMAN_CLI);
}

/// A credential helper for the test: `docker-credential-NAME get` reads the registry's name on
/// standard input and answers with the login for the registry that asks for one, or says it has
/// none (as the real helpers do, exit 1). Each call is logged to `calls`, so the test can tell
/// which helper the agent ran.
fn credential_helper(dir: &std::path::Path, name: &str, calls: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(format!("docker-credential-{name}"));
    let script = format!(
        r#"#!/bin/sh
read -r server
echo "{name} $1 $server" >> {calls}
if [ "$1" = get ] && [ "$server" = "{LOGIN_REGISTRY}" ]; then
  printf '{{"ServerURL":"%s","Username":"mh-parity","Secret":"registry-pw-parity"}}\n' "$server"
  exit 0
fi
echo "credentials not found in native keychain"
exit 1
"#,
        calls = calls.display()
    );
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Issue 45, point 7: a login kept by a credential helper (`credsStore` for every registry,
/// `credHelpers` for one, which wins) is fetched by running `docker-credential-NAME get`, as
/// the Docker CLI does, and sent with the pull; the secret reaches neither the report nor the
/// log. Before, only `auths` was read, and the pull went without a login and was refused.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn docker_a_login_kept_by_a_credential_helper_is_fetched_from_it() {
    let rt = DOCKER;
    let mut p = Pushed::default();
    let names = Names::new(rt, "helper");
    assert!(
        std::net::TcpStream::connect(LOGIN_REGISTRY).is_ok(),
        "no registry answers on {LOGIN_REGISTRY}: run tests/testbed/40-registry.sh (as root)"
    );
    let s = Scratch::new();
    let push_config = s.path("push-config");
    let docker = |args: &[&str]| {
        let out = std::process::Command::new("docker")
            .arg("--config")
            .arg(&push_config)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let mut login = std::process::Command::new("docker")
        .arg("--config")
        .arg(&push_config)
        .args(["login", LOGIN_REGISTRY, "-u", "mh-parity", "--password-stdin"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    login.stdin.take().unwrap().write_all(b"registry-pw-parity").unwrap();
    assert!(login.wait().unwrap().success(), "docker login {LOGIN_REGISTRY}");
    let image = format!("{LOGIN_REGISTRY}/mh-helper-{}/busybox:1", std::process::id());
    docker(&["tag", IMAGE, &image]);
    docker(&["push", &image]);
    p.images.push(image.clone());

    let helpers = s.path("helpers");
    std::fs::create_dir_all(&helpers).unwrap();
    let calls = s.path("calls");
    credential_helper(&helpers, "mhstore", &calls);
    credential_helper(&helpers, "mhone", &calls);
    let path = format!("{}:{}", helpers.display(), std::env::var("PATH").unwrap_or_default());
    let d = s.declare(json!([
        {"type": "container", "id": "web.app", "name": names.container("web"), "image": image, "args": SERVE},
    ]));
    let apply = |config: serde_json::Value| {
        let dir = s.path("client-config");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let _ = rt.run(&["rm", "-f", &names.container("web")]);
        let _ = rt.run(&["rmi", &image]);
        let _ = std::fs::remove_file(&calls);
        let out = assert_cmd::Command::cargo_bin("mesh-host")
            .unwrap()
            .env("DOCKER_CONFIG", &dir)
            .env("PATH", &path)
            .env("MESH_HOST_LOG", "debug")
            .arg("--state")
            .arg(s.state())
            .args(["apply", "--json", d.to_str().unwrap()])
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code().unwrap_or(-1), report, log, std::fs::read_to_string(&calls).unwrap_or_default())
    };

    // credsStore: the one helper for every registry.
    let (code, report, log, called) = apply(json!({"credsStore": "mhstore"}));
    assert_eq!(code, 0, "{report:#}\n{log}");
    assert!(detail(&report, "web.app").contains("pulled"), "{report:#}");
    assert_eq!(called, format!("mhstore get {LOGIN_REGISTRY}\n"));
    // credHelpers: that registry's own helper, before credsStore and before auths.
    let (code, report, log, called) = apply(json!({
        "credsStore": "absent-helper",
        "credHelpers": {LOGIN_REGISTRY: "mhone"},
        "auths": {LOGIN_REGISTRY: {"auth": "bWgtcGFyaXR5Ondyb25n"}},
    }));
    assert_eq!(code, 0, "{report:#}\n{log}");
    assert_eq!(called, format!("mhone get {LOGIN_REGISTRY}\n"));
    for said in [report.to_string(), log] {
        assert!(!said.contains("registry-pw-parity"), "the secret leaked: {said}");
    }
    // A helper that has no login for the registry: the pull goes without one and the
    // registry's refusal is the error, as before.
    let (code, report, _, called) = apply(json!({"credHelpers": {LOGIN_REGISTRY: "absent-helper"}}));
    assert_eq!(code, 1, "{report:#}");
    assert!(called.is_empty());
    let message = report["error"]["message"].as_str().unwrap();
    assert!(message.contains("docker-credential-absent-helper"), "the missing helper is named: {message}");
}
