//! Regression tests for the faults an independent reliability battery found (issue 12), each
//! named after its fault. Each failed before its fix.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::json;

use crate::support::*;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Runs mesh-host with `--state` in the scratch directory, killing it and failing the test if
/// it has not ended within `limit`: the faults here are hangs.
fn run_within(s: &Scratch, args: &[&str], limit: Duration) -> Output {
    let child = Command::new(assert_cmd::cargo::cargo_bin("mesh-host"))
        .arg("--state")
        .arg(s.state())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mesh-host starts");
    let pid = child.id();
    let start = Instant::now();
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    while !waiter.is_finished() {
        if start.elapsed() > limit {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            let out = waiter.join().unwrap();
            panic!(
                "mesh-host {args:?} hung for more than {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    waiter.join().unwrap()
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("mkfifo runs");
    assert!(status.success());
}

/// The largest resident set of any child this test process has waited for, in KiB.
fn children_max_rss_kib() -> i64 {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).unwrap().max_rss()
}

/// Whether the calling test is alone in its process, so that `children_max_rss_kib` counts only
/// its own children. Under plain `cargo test` the tests share one process, and another test's
/// agent (a daemon holding 10,000 files) would count: there the test runs itself again in a
/// process of its own (the test binary with `--exact`), checks that it passed, and this returns
/// false, for the caller to return. Under nextest, each test already has a process; it runs
/// itself again all the same, which costs a process and keeps one path for both.
fn alone_in_process(test: &str) -> bool {
    const ALONE: &str = "MESH_HOST_TEST_ALONE";
    if std::env::var_os(ALONE).is_some_and(|name| name == test) {
        return true;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([&format!("reliability::{test}"), "--exact", "--include-ignored", "--test-threads", "1"])
        .env(ALONE, test)
        .output()
        .expect("the test binary runs again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{test}, run alone, did not pass: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    false
}

/// A tar archive whose one entry's header claims `size` bytes, followed by only a few.
fn forged_tar(size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.set_path("huge").unwrap();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    let mut bytes = h.as_bytes().to_vec();
    bytes.extend_from_slice(&[b'x'; 512]);
    bytes
}

#[test]
fn fault1_a_forged_archive_size_fails_its_resource_and_does_not_abort() {
    if !alone_in_process("fault1_a_forged_archive_size_fails_its_resource_and_does_not_abort") {
        return;
    }
    let s = Scratch::new();
    let d = s.declare(json!([
        {"type": "archive", "id": "tool.dist", "path": s.p("opt/tool"), "bytes": b64(&forged_tar(1 << 62))},
        {"type": "file", "id": "app.conf", "path": s.p("etc/app.conf"), "content": "port=80\n"}
    ]));
    let out = run_within(&s, &["apply", "--json", d.to_str().unwrap()], Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let failure = &report["error"]["failures"][0];
    assert_eq!(failure["id"], "tool.dist");
    let message = failure["message"].as_str().unwrap();
    assert!(message.contains("--archive-max-bytes") && message.contains("nothing was unpacked"), "{message}");
    assert_eq!(action(&report, "app.conf"), "created", "the rest is applied");
    assert!(s.state().exists(), "the store is written");
    assert!(!s.path("opt/tool/huge").exists());
    assert!(children_max_rss_kib() < 200 * 1024, "the claimed size sized no allocation");
}

#[test]
fn fault1_the_archive_limits_are_configurable() {
    let s = Scratch::new();
    let mut b = tar::Builder::new(Vec::new());
    for name in ["a", "b", "c"] {
        let mut h = tar::Header::new_gnu();
        h.set_size(4);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, &b"data"[..]).unwrap();
    }
    let bytes = b.into_inner().unwrap();
    let d = s.declare(json!([{"type": "archive", "id": "a.a", "path": s.p("out"), "bytes": b64(&bytes)}]));
    let (code, report) = s.apply_with(&["--archive-max-entries", "2"], &d);
    assert_eq!(code, 1);
    let message = report["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("more than 2 entries") && message.contains("--archive-max-entries"),
        "{message}"
    );
    let (code, report) = s.apply_with(&["--archive-max-bytes", "11"], &d);
    assert_eq!(code, 1);
    let message = report["error"]["message"].as_str().unwrap();
    assert!(message.contains("more than 11 bytes"), "{message}");
    assert!(!s.path("out/a").exists());
    let (code, report) = s.apply_with(&["--archive-max-bytes", "12", "--archive-max-entries", "3"], &d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(std::fs::read(s.path("out/c")).unwrap(), b"data");
}

#[test]
fn fault2_a_fifo_as_archive_source_fails_at_once() {
    let s = Scratch::new();
    mkfifo(&s.path("dist.tar"));
    let d = s.declare(json!([
        {"type": "archive", "id": "tool.dist", "path": s.p("opt/tool"), "source": s.p("dist.tar"), "unverified": true},
        {"type": "file", "id": "app.conf", "path": s.p("etc/app.conf"), "content": "port=80\n"}
    ]));
    let out = run_within(&s, &["apply", "--json", d.to_str().unwrap()], Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let message = report["error"]["message"].as_str().unwrap();
    assert!(message.contains("dist.tar") && message.contains("a FIFO"), "{message}");
    assert_eq!(action(&report, "app.conf"), "created");
}

#[test]
fn fault2_a_fifo_or_device_as_the_declaration_is_refused_at_once() {
    let s = Scratch::new();
    mkfifo(&s.path("declaration.json"));
    for (declaration, what) in
        [(s.p("declaration.json"), "a FIFO"), ("/dev/zero".to_owned(), "a character device")]
    {
        for command in ["check", "plan", "apply"] {
            let out = run_within(&s, &[command, &declaration], Duration::from_secs(20));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{command} {declaration}: {stderr}");
            assert!(stderr.contains(&declaration) && stderr.contains(what), "{stderr}");
        }
    }
    assert!(!s.path("state").exists(), "nothing was touched");
}

#[test]
fn fault2_a_fifo_at_the_store_path_is_refused_at_once() {
    let s = Scratch::new();
    std::fs::create_dir_all(s.path("state")).unwrap();
    mkfifo(&s.state());
    let d = s.declare(json!([{"type": "file", "id": "a.a", "path": s.p("a"), "content": "a"}]));
    for args in [vec!["apply", d.to_str().unwrap()], vec!["status"]] {
        let out = run_within(&s, &args, Duration::from_secs(20));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("a FIFO"), "{stderr}");
    }
    assert!(!s.path("a").exists());
}

#[test]
fn fault2_a_fifo_or_device_at_a_managed_path_is_refused_and_left_alone() {
    let s = Scratch::new();
    mkfifo(&s.path("pipe"));
    let d = s.declare(json!([
        {"type": "file", "id": "a.pipe", "path": s.p("pipe"), "content": "a", "mode": "0600"},
        {"type": "file", "id": "a.null", "path": "/dev/null", "content": "a", "mode": "0600"},
    ]));
    let before = std::fs::symlink_metadata("/dev/null").unwrap();
    let out = run_within(&s, &["apply", "--json", d.to_str().unwrap()], Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let failures = report["error"]["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 2, "{report:#}");
    for f in failures {
        assert!(f["message"].as_str().unwrap().contains("is not a regular file"), "{f}");
    }
    let after = std::fs::symlink_metadata("/dev/null").unwrap();
    assert_eq!((before.mode(), before.ino()), (after.mode(), after.ino()));
    assert!(std::fs::symlink_metadata(s.path("pipe")).unwrap().file_type().is_fifo_like());
}

trait FifoLike {
    fn is_fifo_like(&self) -> bool;
}

impl FifoLike for std::fs::FileType {
    fn is_fifo_like(&self) -> bool {
        use std::os::unix::fs::FileTypeExt as _;
        self.is_fifo()
    }
}

#[test]
fn fault3_a_hard_linked_file_is_replaced_never_chmodded_or_chowned_in_place() {
    let s = Scratch::new();
    // A credential-like file elsewhere, and a hard link to it at the managed path.
    let outside = s.path("secret/shadow");
    std::fs::create_dir_all(outside.parent().unwrap()).unwrap();
    std::fs::write(&outside, "root:x:1:\n").unwrap();
    std::fs::set_permissions(&outside, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
    std::os::unix::fs::chown(&outside, Some(65534), Some(65534)).unwrap();
    std::fs::create_dir_all(s.path("etc")).unwrap();
    std::fs::hard_link(&outside, s.path("etc/app.conf")).unwrap();
    let d = s.declare(json!([{"type": "file", "id": "app.conf", "path": s.p("etc/app.conf"),
        "content": "root:x:1:\n", "mode": "0644", "owner": "root:root"}]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report:#}");
    let detail = detail(&report, "app.conf");
    assert!(detail.contains("hard links") && detail.contains("file of its own"), "{detail}");
    let o = std::fs::metadata(&outside).unwrap();
    assert_eq!(
        (o.mode() & 0o7777, o.uid(), o.gid(), o.nlink()),
        (0o640, 65534, 65534, 1),
        "the other name is untouched"
    );
    let m = std::fs::metadata(s.path("etc/app.conf")).unwrap();
    assert_eq!((m.mode() & 0o7777, m.uid(), m.nlink()), (0o644, 0, 1));
    assert_ne!(m.ino(), o.ino());
    assert_eq!(std::fs::read(s.path("etc/app.conf")).unwrap(), b"root:x:1:\n");
}

/// A sparse file of `size` bytes: costs no disk.
fn sparse(path: &Path, size: u64) {
    std::fs::File::create(path).unwrap().set_len(size).unwrap();
}

#[test]
fn fault4_a_huge_file_at_a_managed_path_is_hashed_as_a_stream_not_held() {
    if !alone_in_process("fault4_a_huge_file_at_a_managed_path_is_hashed_as_a_stream_not_held") {
        return;
    }
    let s = Scratch::new();
    let d = s.declare(
        json!([{"type": "file", "id": "app.conf", "path": s.p("app.conf"), "content": "port=80\n"}]),
    );
    sparse(&s.path("app.conf"), 512 << 20);
    // plan reads it to show a diff, and must not hold it.
    let out = s.run(&["plan", d.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("536870912 bytes on the machine (too large to show)"), "{stdout}");
    assert!(children_max_rss_kib() < 200 * 1024, "plan held the file: {} KiB", children_max_rss_kib());
    // Recorded, then put back after someone writes 512 MiB there: corrected, not held either.
    std::fs::remove_file(s.path("app.conf")).unwrap();
    assert_eq!(s.apply(&d).0, 0);
    sparse(&s.path("app.conf"), 512 << 20);
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "app.conf"), "corrected");
    assert_eq!(std::fs::read(s.path("app.conf")).unwrap(), b"port=80\n");
    assert!(children_max_rss_kib() < 200 * 1024, "apply held the file: {} KiB", children_max_rss_kib());
}

/// Writes a store file by hand, as a corrupted or forged one would be.
fn plant_store(s: &Scratch, records: serde_json::Value) {
    std::fs::create_dir_all(s.path("state")).unwrap();
    let text = format!("{{\"schema\": 1, \"records\": {records}}}");
    std::fs::write(s.state(), text).unwrap();
    std::fs::set_permissions(s.state(), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
}

fn record(target: &str) -> serde_json::Value {
    json!({"origin": "declared", "type": "file", "target": target, "position": 0,
        "declared": format!("sha256:{}", "0".repeat(64)), "applied-at": 1})
}

#[test]
fn fault6_a_store_record_with_a_relative_or_unnormalised_target_refuses_the_store() {
    let s = Scratch::new();
    // What a relative target would name if it were taken: a file in the working directory.
    std::fs::write(s.path("victim"), "keep me").unwrap();
    let d = s.declare(json!([{"type": "file", "id": "a.a", "path": s.p("a"), "content": "a"}]));
    for target in ["victim".to_owned(), format!("{}/../victim", s.p("x")), format!("{}//victim", s.p("x"))] {
        plant_store(&s, json!({"old.file": record(&target)}));
        let out = Command::new(assert_cmd::cargo::cargo_bin("mesh-host"))
            .current_dir(s.dir.path())
            .arg("--state")
            .arg(s.state())
            .args(["apply", d.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{target}: {stderr}");
        assert!(stderr.contains("record \"old.file\"") && stderr.contains("its target"), "{stderr}");
        assert_eq!(std::fs::read_to_string(s.path("victim")).unwrap(), "keep me");
        assert!(!s.path("a").exists(), "nothing applied from a refused store");
    }
}

#[test]
fn fault6_a_store_with_an_id_given_twice_is_refused_naming_it() {
    let s = Scratch::new();
    std::fs::create_dir_all(s.path("state")).unwrap();
    let r = record(&s.p("one"));
    std::fs::write(
        s.state(),
        format!("{{\"schema\": 1, \"records\": {{\"old.file\": {r}, \"old.file\": {r}}}}}"),
    )
    .unwrap();
    let d = s.declare(json!([{"type": "file", "id": "a.a", "path": s.p("a"), "content": "a"}]));
    let out = s.run(&["apply", d.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("record \"old.file\" is given twice"), "{stderr}");
    assert!(!s.path("a").exists());
}

#[test]
fn fault9_a_refused_declaration_does_not_create_the_state_directory() {
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "file", "id": "a.a", "path": "relative", "content": "a"}]));
    for command in ["apply", "plan", "check"] {
        let out = s.run(&[command, d.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{command}");
        assert!(!s.path("state").exists(), "{command} made the state directory");
    }
}

#[test]
fn fault9_a_missing_declaration_is_a_usage_error() {
    let s = Scratch::new();
    for command in ["apply", "plan", "check"] {
        let out = s.run(&[command, s.p("nothing-here.json").as_str()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        assert!(stderr.contains("nothing-here.json"), "{stderr}");
    }
    let out = s.run(&["apply", s.dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "a directory is not a declaration file for apply");
}

#[test]
fn fault9_a_store_readable_by_others_is_tightened_and_said() {
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "file", "id": "a.a", "path": s.p("a"), "content": "a"}]));
    assert_eq!(s.apply(&d).0, 0);
    std::fs::set_permissions(s.state(), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let out = s.run(&["apply", d.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("readable by others") && stderr.contains("0644"), "{stderr}");
    assert_eq!(mode_of(&s.state()), 0o600);
}

/// `count` files in `dirs` directories, each holding `content` and its own name.
fn many_files(s: &Scratch, count: usize, dirs: usize, content: &str) -> serde_json::Value {
    let files: Vec<serde_json::Value> = (0..count)
        .map(|i| {
            json!({"type": "file", "id": format!("f.n{i}"), "path": s.p(&format!("tree/d{}/f{i}", i % dirs)),
                "content": format!("{content} {i}\n")})
        })
        .collect();
    serde_json::Value::Array(files)
}

/// Every temporary file of the host's under `dir`.
fn temporaries(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().unwrap().is_dir() {
                todo.push(e.path());
            } else if e.file_name().to_string_lossy().contains(".mesh-host-") {
                found.push(e.path().display().to_string());
            }
        }
    }
    found
}

/// `apply` (with `--json` when asked) under the failpoint `point`.
fn apply_with_failpoint(s: &Scratch, d: &Path, point: &str, json: bool) -> Output {
    let mut command = Command::new(assert_cmd::cargo::cargo_bin("mesh-host"));
    command.arg("--state").arg(s.state()).arg("apply");
    if json {
        command.arg("--json");
    }
    command.arg(d).env("MESH_HOST_FAILPOINT", point).output().unwrap()
}

/// `apply --json` with a failpoint: the process aborts there, as a crash would.
fn apply_crashing_at(s: &Scratch, d: &Path, point: &str) {
    let out = apply_with_failpoint(s, d, point, true);
    assert_eq!(
        out.status.code(),
        None,
        "{point}: the apply was to crash there, and ended with {:?}",
        out.status
    );
}

fn count_of(report: &serde_json::Value, word: &str) -> usize {
    report["outcomes"].as_array().unwrap().iter().filter(|o| o["action"] == word).count()
}

#[test]
fn fault7_temporary_files_a_crash_left_are_removed_by_the_next_pass() {
    let s = Scratch::new();
    let d = s.declare(many_files(&s, 1200, 40, "v1"));
    apply_crashing_at(&s, &d, "batch-staged");
    assert!(!temporaries(&s.path("tree")).is_empty(), "the crash left temporary files, as a kill would");
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{}", report["error"]);
    assert_eq!(temporaries(&s.path("tree")), Vec::<String>::new());
    assert!(!s.path("state/state.json.journal").exists(), "the journal is gone once the store is written");
}

#[test]
fn fault8_the_host_s_own_interrupted_writes_are_not_counted_as_drift() {
    let s = Scratch::new();
    let v1 = many_files(&s, 1200, 40, "v1");
    let d = s.declare(v1.clone());
    assert_eq!(s.apply(&d).0, 0);
    for point in ["batch-renamed", "batch-staged"] {
        // Half-way through writing v2, the host crashes: some files hold v2, the store says v1.
        let d = s.declare(many_files(&s, 1200, 40, "v2"));
        apply_crashing_at(&s, &d, point);
        // The control plane goes back to v1: what the host wrote of v2 is an update, not drift.
        let d = s.declare(v1.clone());
        let (code, report) = s.apply(&d);
        assert_eq!(code, 0, "{}", report["error"]);
        assert_eq!(count_of(&report, "corrected"), 0, "{point}: the host's own work was counted as drift");
        if point == "batch-renamed" {
            assert!(
                count_of(&report, "updated") >= 512,
                "{point}: the files written before the crash are put back"
            );
        }
        assert!(!s.path("state/state.json.journal").exists());
        assert_eq!(temporaries(&s.path("tree")), Vec::<String>::new());
    }
    // A hand-edit is still drift.
    std::fs::write(s.path("tree/d0/f0"), "by hand\n").unwrap();
    let (_, report) = s.apply(&d);
    assert_eq!(action(&report, "f.n0"), "corrected");
}

#[test]
fn sigterm_during_a_large_first_apply_finishes_it_writes_the_store_and_exits_0() {
    let s = Scratch::new();
    let d = s.declare(many_files(&s, 3000, 100, "v1"));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("mesh-host"))
        .arg("--state")
        .arg(s.state())
        .args(["run", "--declaration"])
        .arg(&d)
        .args(["--metrics", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        // A file, not a pipe: 3,000 lines of "created" would fill a pipe nobody reads yet.
        .stderr(std::fs::File::create(s.path("daemon.log")).unwrap())
        .spawn()
        .unwrap();
    // Mid-apply: some files are there, not all.
    assert!(wait_for(PATIENCE, || s.path("tree/d0/f0").exists()), "the first apply never started writing");
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the daemon did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    };
    let log = read(&s.path("daemon.log"));
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("SIGTERM") && log.contains("stopped"), "{log}");
    // The apply in flight finished and was recorded: every file, whole, and a record of each.
    for i in (0..3000).step_by(97) {
        assert_eq!(read(&s.path(&format!("tree/d{}/f{i}", i % 100))), format!("v1 {i}\n"));
    }
    let status: serde_json::Value = serde_json::from_slice(&s.run(&["status", "--json"]).stdout).unwrap();
    let records = status["records"].as_array().unwrap();
    assert_eq!(records.len(), 3000, "every file written was recorded before the agent stopped");
    assert!(records.iter().all(|r| r["machine"] == "holds"), "no record ahead of the machine");
    assert_eq!(temporaries(&s.path("tree")), Vec::<String>::new());
    assert!(!s.path("state/state.json.journal").exists());
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The allocator's policy is the binary's own (issue 15): arenas committed as used, set before
/// `main`, whatever the environment says, so the resident size does not depend on how the
/// agent was started.
#[test]
fn the_allocator_commits_arenas_lazily_however_the_agent_is_started() {
    let s = Scratch::new();
    let d = s.declare(serde_json::json!([]));
    for env in [None, Some("1")] {
        let mut cmd = assert_cmd::Command::cargo_bin("mesh-host").expect("the mesh-host binary");
        cmd.env("MESH_HOST_LOG", "debug").env_remove("MIMALLOC_ARENA_EAGER_COMMIT");
        if let Some(value) = env {
            cmd.env("MIMALLOC_ARENA_EAGER_COMMIT", value);
        }
        let out = cmd.arg("--state").arg(s.state()).arg("check").arg(&d).output().unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{log}");
        assert!(
            log.contains("allocator policy") && log.contains("arena_eager_commit=0"),
            "with {env:?}: {log}"
        );
    }
}

/// A sync after the renames that fails fails every file it was to make durable: each is in place
/// but not known to survive a crash, so the report says so and the store records none of them;
/// the next apply, with the sync working, finds them as declared and records them.
#[test]
fn a_failed_sync_after_the_renames_fails_its_files_and_records_none() {
    let s = Scratch::new();
    let files: Vec<serde_json::Value> = (0..3)
        .map(|i| json!({"type": "file", "id": format!("a.f{i}"), "path": s.p(&format!("f{i}")), "content": "x"}))
        .collect();
    let d = s.declare(serde_json::Value::Array(files));
    let out = apply_with_failpoint(&s, &d, "sync-eio", true);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let error = &report["error"];
    assert!(error["message"].as_str().unwrap().contains("durable"), "{report}");
    assert_eq!(error["others"], 2, "every file of the batch fails: {report}");
    let store = std::fs::read_to_string(s.state()).unwrap_or_default();
    assert!(!store.contains("a.f0"), "a file not known to be durable is recorded: {store}");
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report}");
    assert!(std::fs::read_to_string(s.state()).unwrap().contains("a.f0"));
}

/// A directory made in no batch (a directory resource alone) is made durable at the end of the
/// pass, after it was reported done and recorded; that sync failing fails it, and its record
/// must go with it: the store claims nothing not known to survive a crash.
#[test]
fn a_directory_that_cannot_be_made_durable_fails_and_is_not_recorded() {
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "directory", "id": "a.d", "path": s.p("made")}]));
    let out = apply_with_failpoint(&s, &d, "dir-sync-eio", true);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["error"]["message"].as_str().unwrap().contains("durable"), "{report}");
    let store = std::fs::read_to_string(s.state()).unwrap_or_default();
    assert!(!store.contains("a.d"), "a directory not known to be durable is recorded: {store}");
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report}");
    assert!(std::fs::read_to_string(s.state()).unwrap().contains("a.d"));
}

/// A single file put over an existing one on ext4 is renamed first and synced after (issue 15:
/// the daemon's correction does not wait on the disk). Killed between the two, the file holds
/// the host's new content whole, and the next pass takes it as the host's own work, not drift;
/// nothing was recorded for it.
#[test]
fn a_single_file_killed_between_its_rename_and_its_sync_is_the_host_s_own_work() {
    let s = Scratch::new();
    let file =
        |content: &str| json!([{"type": "file", "id": "a.conf", "path": s.p("a.conf"), "content": content}]);
    let d = s.declare(file("v1\n"));
    assert_eq!(s.apply(&d).0, 0);
    let d = s.declare(file("v2\n"));
    apply_crashing_at(&s, &d, "batch-renamed");
    assert_eq!(read(&s.path("a.conf")), "v2\n", "renamed before the crash, whole");
    assert!(s.path("state/state.json.journal").exists(), "the intent was written before the rename");
    let store = read(&s.state());
    assert!(store.contains(&hex_sha256(b"v1\n")), "the record of what was there before stays: {store}");
    assert!(!store.contains(&hex_sha256(b"v2\n")), "nothing recorded for the unsynced file: {store}");
    let d = s.declare(file("v1\n"));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{}", report["error"]);
    assert_eq!(action(&report, "a.conf"), "updated", "the host's own interrupted write is not drift");
    assert_eq!(temporaries(&s.path("")), Vec::<String>::new());
    assert!(!s.path("state/state.json.journal").exists());
}

/// The sync after a single file's rename failing fails that file: it is in place, but not known
/// to survive a crash, so it is not recorded. Needs the scratch directory on ext4 (the order is
/// chosen only there).
#[test]
fn a_failed_sync_after_a_single_file_s_rename_fails_it_and_records_nothing() {
    let s = Scratch::new();
    std::fs::write(s.path("a.conf"), "there before\n").unwrap();
    let d =
        s.declare(json!([{"type": "file", "id": "a.conf", "path": s.p("a.conf"), "content": "declared\n"}]));
    let out = apply_with_failpoint(&s, &d, "sync-eio", true);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let message = report["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("fsync after its rename"),
        "the rename did not go first: is {} on ext4 (data=ordered, auto_da_alloc)? {report}",
        s.path("").display()
    );
    assert_eq!(read(&s.path("a.conf")), "declared\n", "in place, not claimed");
    assert!(!read(&s.state()).contains("a.conf"), "a file not known to be durable is recorded");
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report}");
    assert!(read(&s.state()).contains("a.conf"));
}

fn hex_sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A state store that cannot be written after the pass is reported as that, in a field of its
/// own (`store-error`), not as a resource that failed: every resource's outcome stands, `error`
/// stays null, and the apply exits 1. The daemon counts it
/// (`mesh_host_store_write_failures_total`).
#[test]
fn a_store_that_cannot_be_written_is_reported_apart_from_the_resources() {
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "file", "id": "a.f", "path": s.p("f"), "content": "x\n"}]));
    let out = apply_with_failpoint(&s, &d, "store-write-eio", true);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["error"].is_null(), "no resource failed: {report:#}");
    assert_eq!(action(&report, "a.f"), "created", "{report:#}");
    let why = report["store-error"].as_str().unwrap_or_default();
    assert!(why.contains("not recorded") && why.contains(&s.state().display().to_string()), "{report:#}");
    assert!(!report.to_string().contains("state-store"), "no made-up resource: {report:#}");
    // For a person too.
    let out = apply_with_failpoint(&s, &d, "store-write-eio", false);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("apply failed to record") && !said.contains("converged"), "{said}");

    // The daemon counts it, and goes on.
    let daemon = Daemon::launch(&s, &d, &[], &[("MESH_HOST_FAILPOINT", "store-write-eio")]);
    assert!(
        wait_for(PATIENCE, || daemon.metric("mesh_host_store_write_failures_total") >= 1.0),
        "{}",
        daemon.log()
    );
    assert!(daemon.log().contains("cannot write the state store"), "{}", daemon.log());
}
