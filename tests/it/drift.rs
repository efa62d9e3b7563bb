//! Who made the drift (issue 26): real writers change managed files under a running daemon
//! with real fanotify, and `mesh-host drift --json` and the log must name each; the agent's own
//! writes are named by no one, and a secret never reaches the history, the log or the metrics.
//! Root is needed (fanotify wants CAP_SYS_ADMIN): a test run without it fails, saying so.

use std::process::Command;

use serde_json::{json, Value};

use crate::support::*;

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The corrections `mesh-host drift --json` prints, oldest first.
fn history(s: &Scratch) -> Vec<Value> {
    let out = s.run(&["drift", "--json"]);
    assert!(out.status.success(), "drift --json: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Waits for the history to hold a correction of `id` that `test` accepts; that correction.
fn corrected_by(s: &Scratch, daemon: &Daemon, id: &str, test: impl Fn(&Value) -> bool) -> Value {
    let mut found = None;
    let ok = wait_for(PATIENCE, || {
        found = history(s).into_iter().rev().find(|c| c["id"] == id && test(c));
        found.is_some()
    });
    assert!(ok, "no such correction of {id} in drift --json: {:?}\n{}", history(s), daemon.log());
    found.unwrap()
}

fn must_be_root() {
    let uid = Command::new("id").arg("-u").output().expect("id runs");
    assert_eq!(
        String::from_utf8_lossy(&uid.stdout).trim(),
        "0",
        "these tests need root: fanotify needs CAP_SYS_ADMIN (run the suite as root, as tests/run.sh does)"
    );
}

/// A shell whose command name is known (a copy of dash named `hand-edit`) writes the file in
/// place; a `sed -i` then replaces it by a rename. Each is put back and named by its command,
/// uid 0 and user root, in the history and in the log line of its correction; the agent's own
/// writes (its first apply, each put back) are attributed to no one.
#[test]
fn a_shell_and_sed_are_named_and_the_agents_own_writes_are_not() {
    must_be_root();
    let s = Scratch::new();
    let conf = s.path("etc/app.conf");
    let d = s.declare(json!([
        {"type": "file", "id": "app.conf", "path": s.p("etc/app.conf"), "content": "port=80\n"},
    ]));
    let daemon = Daemon::start(&s, &d, &[]);
    assert!(!daemon.log().contains("fanotify cannot be used"), "{}", daemon.log());
    std::fs::create_dir_all(s.path("bin")).unwrap();
    let editor = s.path("bin/hand-edit");
    std::fs::copy("/bin/dash", &editor).expect("dash is installed (package dash)");

    // The shell stays a moment after its write, so that it is looked at alive.
    let script = format!("echo port=8080 > {}; sleep 0.3", conf.display());
    assert!(Command::new(&editor).args(["-c", &script]).status().unwrap().success());
    assert!(wait_for(PATIENCE, || read(&conf) == "port=80\n"), "put back:\n{}", daemon.log());
    let c = corrected_by(&s, &daemon, "app.conf", |c| c["who"]["comm"] == "hand-edit");
    let who = &c["who"];
    assert_eq!((who["uid"].as_u64(), who["user"].as_str()), (Some(0), Some("root")), "{c}");
    assert_eq!(who["exe"], editor.display().to_string(), "{c}");
    assert_eq!(who["moved"], "content", "{c}");
    assert!(who["pid"].as_i64().is_some_and(|p| p > 0), "{c}");
    assert!(c["put_back_ms"].as_f64().is_some(), "{c}");
    assert!(c["changed"].as_str().unwrap().contains("content"), "{c}");
    assert!(daemon.log().contains("; changed by hand-edit (pid"), "{}", daemon.log());

    // sed -i writes a temporary file and renames it over: a directory-entry change, by a
    // process that exits at once (named if it was looked at in time, else said to have exited).
    let before = history(&s).len();
    let sed = Command::new("sed").args(["-i", "s/80/8081/"]).arg(&conf).status().expect("sed is installed");
    assert!(sed.success());
    assert!(wait_for(PATIENCE, || read(&conf) == "port=80\n"), "put back:\n{}", daemon.log());
    let ok = wait_for(PATIENCE, || history(&s).len() > before);
    assert!(ok, "sed's edit is in the history: {:?}\n{}", history(&s), daemon.log());
    let c = history(&s).pop().unwrap();
    let who = &c["who"];
    assert!(who["pid"].as_i64().is_some(), "sed's pid is known: {c}");
    assert!(who["comm"] == "sed" || who["exited"] == true, "named sed, or said to have exited: {c}");
    assert!(who["comm"] == "sed" || who["comm"].is_null(), "{c}");

    // The agent's own writes: none of the corrections names the daemon, and there are no more
    // than the two edits made.
    let pid = daemon.child.as_ref().unwrap().id() as i64;
    let all = history(&s);
    assert_eq!(all.len(), 2, "one correction per edit, none for the agent's own writes: {all:?}");
    assert!(all.iter().all(|c| c["who"]["pid"].as_i64() != Some(pid)), "{all:?}");
    let metrics = daemon.get("/metrics").unwrap();
    assert!(
        metrics.contains("mesh_host_drift_corrections_total{type=\"file\",writer=\"unknown\"}"),
        "{metrics}"
    );
    assert_eq!(daemon.metric("mesh_host_drift_corrections_total{type=\"file\"}"), 2.0, "{metrics}");
}

/// A user made with the real useradd, removed when the test ends.
struct TestUser(String);

impl TestUser {
    fn new(name: &str) -> TestUser {
        let _ = Command::new("userdel").arg(name).output();
        let out = Command::new("useradd")
            .args(["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name])
            .output()
            .expect("useradd must be installed (package passwd) and the tests run as root");
        assert!(out.status.success(), "useradd {name}: {}", String::from_utf8_lossy(&out.stderr));
        TestUser(name.to_owned())
    }

    fn uid(&self) -> u64 {
        let out = Command::new("id").args(["-u", &self.0]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.0).output();
    }
}

/// A chmod by another user's process (the file's owner, through `setpriv`): put back, and
/// named by that user, their uid, and the program, as a change of attributes.
#[test]
fn a_chmod_by_another_users_process_is_named_by_that_user() {
    must_be_root();
    let user = TestUser::new("mh-it-drift");
    let s = Scratch::new();
    use std::os::unix::fs::PermissionsExt as _;
    // The scratch directory is root's alone: the user must reach the file.
    std::fs::set_permissions(s.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let conf = s.path("app.conf");
    let d = s.declare(json!([
        {"type": "file", "id": "app.conf", "path": s.p("app.conf"), "content": "x\n", "mode": "0640",
         "owner": "mh-it-drift"},
    ]));
    let daemon = Daemon::start(&s, &d, &[]);
    let uid = user.uid().to_string();
    // perl (essential on Debian) makes the chmod and stays a moment, so that the writer is still
    // there to be looked at: chmod(1) exits at once, and a writer gone is told as exited,
    // without the uid the kernel's event does not carry.
    let status = Command::new("setpriv")
        .args([
            "--reuid",
            &uid,
            "--regid",
            &uid,
            "--clear-groups",
            "perl",
            "-e",
            "chmod 0666, $ARGV[0]; sleep 1",
        ])
        .arg(&conf)
        .status()
        .expect("setpriv is installed (package util-linux)");
    assert!(status.success());
    assert!(wait_for(PATIENCE, || mode_of(&conf) == 0o640), "put back:\n{}", daemon.log());
    let c = corrected_by(&s, &daemon, "app.conf", |c| c["who"]["uid"].as_u64() == Some(user.uid()));
    let who = &c["who"];
    assert_eq!(who["user"], "mh-it-drift", "{c}");
    assert_eq!(who["moved"], "attributes", "{c}");
    assert_eq!(who["comm"], "perl", "{c}");
}

/// A secret-bearing file, hand-edited: the correction is named, and neither the planted value
/// nor the hand-edit's bytes reach `drift --json`, the history file, the daemon's log at trace
/// level, or its metrics.
#[test]
fn a_hand_edited_secret_never_reaches_the_history_the_log_or_the_metrics() {
    must_be_root();
    const PLANT: &str = "canary-drift-26-never-print-me";
    const EDIT: &str = "hand-typed-drift-26-secret";
    let s = Scratch::new();
    let public = crate::secrets::keygen(&s);
    let secret = s.path("etc/app/secret");
    let d = s.declare(json!([
        {"type": "file", "id": "app.secret", "path": s.p("etc/app/secret"),
         "sealed": crate::secrets::seal(&public, PLANT.as_bytes())},
    ]));
    let daemon = Daemon::launch(&s, &d, &[], &[("MESH_HOST_LOG", "trace")]);
    let healthy = wait_for(PATIENCE, || daemon.get("/healthz").is_some_and(|b| b == "ok\n"));
    assert!(healthy && read(&secret) == PLANT, "applied, and watching:\n{}", daemon.log());
    let script = format!("printf {EDIT} > {}; sleep 0.3", secret.display());
    assert!(Command::new("sh").args(["-c", &script]).status().unwrap().success());
    assert!(wait_for(PATIENCE, || read(&secret) == PLANT), "put back:\n{}", daemon.log());
    let c = corrected_by(&s, &daemon, "app.secret", |_| true);
    assert!(c["who"]["pid"].as_i64().is_some(), "the writer is named: {c}");
    let out = s.run(&["drift", "--json"]);
    let places = [
        ("drift --json", String::from_utf8_lossy(&out.stdout).into_owned()),
        ("drift.jsonl", read(&s.path("state/drift.jsonl"))),
        ("the log at trace", daemon.log()),
        ("/metrics", daemon.get("/metrics").unwrap_or_default()),
        ("status", String::from_utf8_lossy(&s.run(&["status"]).stdout).into_owned()),
    ];
    for (what, text) in &places {
        assert!(!text.is_empty() || *what == "status", "{what} is empty");
        for needle in [PLANT, EDIT] {
            assert!(!text.contains(needle), "{needle} leaked into {what}");
        }
    }
}

/// A process inside a Docker container writes a bind-mounted managed file: put back, and
/// named by the container's name (looked up from the id its cgroup carries), as a container.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_process_in_a_docker_container_is_named_by_its_container() {
    must_be_root();
    const SETUP: &str =
        "run tests/testbed/docker.sh (as root) to start Docker with the image local/busybox:1";
    let image = Command::new("docker").args(["image", "inspect", "local/busybox:1"]).output();
    assert!(image.is_ok_and(|o| o.status.success()), "Docker or its test image is missing: {SETUP}");
    let s = Scratch::new();
    let conf = s.path("etc/app.conf");
    let d = s.declare(json!([
        {"type": "file", "id": "app.conf", "path": s.p("etc/app.conf"), "content": "port=80\n"},
    ]));
    let daemon = Daemon::start(&s, &d, &[]);
    let name = format!("mh-drift-writer-{}", std::process::id());
    let _ = Command::new("docker").args(["rm", "-f", &name]).output();
    let out = Command::new("docker")
        .args(["run", "--rm", "--name", &name, "-v"])
        .arg(format!("{}:/x", s.path("etc").display()))
        .args(["local/busybox:1", "sh", "-c", "echo port=1 > /x/app.conf; sleep 1"])
        .output()
        .expect("docker runs");
    assert!(out.status.success(), "docker run: {}", String::from_utf8_lossy(&out.stderr));
    assert!(wait_for(PATIENCE, || read(&conf) == "port=80\n"), "put back:\n{}", daemon.log());
    let c = corrected_by(&s, &daemon, "app.conf", |c| c["who"]["by"] == "container");
    assert_eq!(c["who"]["container"], name.as_str(), "{c}");
    assert_eq!(daemon.metric("mesh_host_drift_corrections_total{type=\"file\",writer=\"container\"}"), 1.0);
}
