//! Strict sources (issue 45, point 4), against the real filesystem: what the agent takes its
//! orders and keys from is refused, naming the path, what is wrong and the fix, when anyone but
//! root or the agent can change it or a directory above it (docs/decisions.md, "Strict
//! sources"). The tests run as root; uid 65534 (nobody) plays the other user.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Output;

use serde_json::json;

use crate::support::{wait_for, Daemon, Scratch, PATIENCE};

const NOBODY: u32 = 65534;

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), None).unwrap();
}

/// Runs mesh-host as root typed it, not under sudo (so only root and the agent are trusted).
fn run(s: &Scratch, args: &[&str]) -> Output {
    let mut cmd = assert_cmd::Command::cargo_bin("mesh-host").unwrap();
    cmd.arg("--state").arg(s.state()).args(args).env_remove("SUDO_UID");
    cmd.output().unwrap()
}

/// A declaration writing one file, at `at`.
fn declaration(s: &Scratch, at: &Path) {
    let d = json!({"version": 1, "resources": [
        {"type": "file", "id": "a.one", "path": s.p("one"), "content": "1"},
    ]});
    std::fs::write(at, serde_json::to_vec(&d).unwrap()).unwrap();
}

/// `apply` of `d` is refused (exit 2, nothing written), naming `named` and saying each of `says`.
fn refused(s: &Scratch, d: &Path, named: &Path, says: &[&str]) {
    let out = run(s, &["apply", d.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("{} is ", named.display())), "the path named: {err}");
    for said in says {
        assert!(err.contains(said), "{said:?} in: {err}");
    }
    assert!(!s.path("one").exists(), "nothing applied");
    assert!(!s.state().exists(), "not even the store written");
}

#[test]
fn a_declaration_owned_by_another_user_is_refused_naming_it_and_the_fix() {
    let s = Scratch::new();
    let d = s.path("declaration.json");
    declaration(&s, &d);
    chown(&d, NOBODY);
    refused(&s, &d, &d, &["owned by uid 65534", &format!("`chown root {}`", d.display())]);
    // Given back to root, the same file is applied.
    chown(&d, 0);
    let out = run(&s, &["apply", d.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_group_writable_declaration_is_refused() {
    let s = Scratch::new();
    let d = s.path("declaration.json");
    declaration(&s, &d);
    chmod(&d, 0o664);
    refused(&s, &d, &d, &["writable by its group (mode 0664)", &format!("`chmod go-w {}`", d.display())]);
}

#[test]
fn a_world_writable_directory_above_it_is_refused_naming_the_directory() {
    let s = Scratch::new();
    let dir = s.path("deploy");
    std::fs::create_dir(&dir).unwrap();
    let d = dir.join("declaration.json");
    declaration(&s, &d);
    chmod(&dir, 0o777);
    refused(&s, &d, &dir, &["writable by group and others (mode 0777)", "chmod go-w"]);
}

#[test]
fn a_symlink_is_followed_and_its_bad_target_named() {
    let s = Scratch::new();
    let loose = s.path("checkout");
    std::fs::create_dir(&loose).unwrap();
    let target = loose.join("declaration.json");
    declaration(&s, &target);
    chown(&target, NOBODY);
    // The link itself is root's, in root's directory: what it points to is what is read.
    let link = s.path("declaration.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    refused(&s, &link, &target, &["owned by uid 65534"]);
}

#[test]
fn a_sticky_root_directory_above_it_is_fine_as_tmp_is() {
    let s = Scratch::new();
    let tmp = s.path("tmp");
    std::fs::create_dir(&tmp).unwrap();
    chmod(&tmp, 0o1777);
    let d = tmp.join("declaration.json");
    declaration(&s, &d);
    let out = run(&s, &["apply", d.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(s.path("one")).unwrap(), "1");
    // As the directory read, though, a sticky directory is not: anyone could add a file to it.
    let dir = tmp.join("declaration.d");
    std::fs::create_dir(&dir).unwrap();
    declaration(&s, &dir.join("10-one.json"));
    chmod(&dir, 0o1777);
    std::fs::remove_file(s.path("one")).unwrap();
    std::fs::remove_dir_all(s.path("state")).unwrap();
    refused(&s, &dir, &dir, &["writable by group and others (mode 1777)"]);
}

#[test]
fn a_file_of_a_declaration_directory_is_checked_too() {
    let s = Scratch::new();
    let dir = s.path("declaration.d");
    std::fs::create_dir(&dir).unwrap();
    let f = dir.join("10-one.json");
    declaration(&s, &f);
    chmod(&f, 0o646);
    refused(&s, &dir, &f, &["writable by others (mode 0646)"]);
}

/// `check`, and `plan` without `--run-verify`, only read: they take any file the operator names
/// (docs/decisions.md, "Strict sources"); `plan --run-verify` runs commands, and is strict.
#[test]
fn check_and_plan_read_a_loose_file_plan_run_verify_does_not() {
    let s = Scratch::new();
    let d = s.path("declaration.json");
    declaration(&s, &d);
    chmod(&d, 0o666);
    for args in [&["check"][..], &["plan"][..]] {
        let out = run(&s, &[args, &[d.to_str().unwrap()]].concat());
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let out = run(&s, &["plan", "--run-verify", d.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("writable by group and others"));
}

/// Under sudo, `apply` also trusts the operator who ran it: their own file in their own
/// directory, as sshd trusts a user's own `authorized_keys`.
#[test]
fn under_sudo_apply_trusts_the_operators_own_file() {
    let s = Scratch::new();
    let d = s.path("declaration.json");
    declaration(&s, &d);
    chown(&d, NOBODY);
    let mut cmd = assert_cmd::Command::cargo_bin("mesh-host").unwrap();
    let out = cmd
        .arg("--state")
        .arg(s.state())
        .args(["apply", d.to_str().unwrap()])
        .env("SUDO_UID", NOBODY.to_string())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn the_allowed_signers_file_is_checked_as_a_source() {
    let s = Scratch::new();
    let d = s.path("declaration.json");
    declaration(&s, &d);
    let signers = s.path("allowed_signers");
    std::fs::write(&signers, "").unwrap();
    chmod(&signers, 0o666);
    let out = run(&s, &["apply", "--allowed-signers", signers.to_str().unwrap(), d.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("{} is writable by group and others", signers.display())), "{err}");
}

#[test]
fn a_key_file_in_a_directory_others_can_write_is_refused() {
    let s = Scratch::new();
    let keys = s.path("keys");
    std::fs::create_dir(&keys).unwrap();
    let key = keys.join("sealing.key");
    let out = run(&s, &["--key", key.to_str().unwrap(), "keygen"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(&s, &["--key", key.to_str().unwrap(), "pubkey"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    chmod(&keys, 0o775);
    let out = run(&s, &["--key", key.to_str().unwrap(), "pubkey"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains(&format!("{} is writable by its group", keys.display())), "{err}");
}

/// The daemon: a source found loose at a re-read is refused as a bad declaration is (the one in
/// force kept and enforced, the path named in the log); put right, it is applied.
#[test]
fn the_daemon_refuses_a_loosened_source_and_keeps_the_declaration_in_force() {
    let s = Scratch::new();
    let dir = s.path("declaration.d");
    std::fs::create_dir(&dir).unwrap();
    let f = dir.join("10-one.json");
    declaration(&s, &f);
    let daemon = Daemon::start(&s, &dir, &[]);
    assert!(wait_for(PATIENCE, || s.path("one").exists()), "{}", daemon.log());
    // Loosened, and a second file declared in it.
    chmod(&f, 0o666);
    let two = json!({"version": 1, "resources": [
        {"type": "file", "id": "a.one", "path": s.p("one"), "content": "1"},
        {"type": "file", "id": "a.two", "path": s.p("two"), "content": "2"},
    ]});
    std::fs::write(&f, serde_json::to_vec(&two).unwrap()).unwrap();
    let named = format!("{} is writable by group and others (mode 0666)", f.display());
    assert!(wait_for(PATIENCE, || daemon.log().contains(&named)), "{}", daemon.log());
    assert!(daemon.log().contains("the declaration in force is kept"), "{}", daemon.log());
    assert!(!s.path("two").exists(), "nothing of the loose source applied");
    std::fs::write(s.path("one"), "changed").unwrap();
    assert!(wait_for(PATIENCE, || std::fs::read_to_string(s.path("one")).unwrap() == "1"), "still enforced");
    // Put right by the fix the message names, a chmod alone: the watcher sees the mode change
    // and the read is no longer refused, so it is applied at once, not at the next resync.
    chmod(&f, 0o644);
    assert!(wait_for(PATIENCE, || s.path("two").exists()), "{}", daemon.log());
}

/// Started on a loose source, the daemon puts nothing in force and says why.
#[test]
fn the_daemon_started_on_a_loose_source_touches_nothing() {
    let s = Scratch::new();
    let dir = s.path("declaration.d");
    std::fs::create_dir(&dir).unwrap();
    declaration(&s, &dir.join("10-one.json"));
    chown(&dir, NOBODY);
    let daemon = Daemon::launch(&s, &dir, &[], &[]);
    let named = format!("{} is owned by uid 65534", dir.display());
    assert!(wait_for(PATIENCE, || daemon.log().contains(&named)), "{}", daemon.log());
    assert!(daemon.log().contains("no declaration is in force"), "{}", daemon.log());
    assert_eq!(daemon.answer("/healthz").map(|(code, _)| code), Some(503));
    assert!(!s.path("one").exists());
}
