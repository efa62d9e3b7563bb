//! `mesh-host run` end to end: the real daemon, real inotify, real files.
//!
//! A test named `faultN_` is the regression test of fault N of issue 12 (as in reliability.rs):
//! it failed before that fault was fixed.

use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::support::*;

/// Full passes the daemon finished (its first apply, each declaration change, each resync):
/// counted when a pass ends, so a pass counted has done all it will.
const FULL_PASSES: &str = "mesh_host_reconcile_duration_seconds_count{scope=\"full\"}";

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn hand_edits_are_put_back_and_counted_as_drift() {
    let s = Scratch::new();
    let conf = s.path("etc/app.conf");
    let d = s.declare(json!([
        {"type": "directory", "id": "app.etc", "path": s.p("etc"), "mode": "0750"},
        {"type": "file", "id": "app.conf", "path": s.p("etc/app.conf"), "content": "port=80\n", "mode": "0640"},
    ]));
    let mut daemon = Daemon::start(&s, &d, &[]);
    assert_eq!(read(&conf), "port=80\n", "the first apply ran before READY");
    let drift = |t: &str| daemon.metric(&format!("mesh_host_drift_corrections_total{{type=\"{t}\"}}"));
    // Each step waits for the daemon to have counted the last one: the file holds the right
    // bytes as soon as the rename lands, a moment before the daemon's read-back, and a next
    // edit inside that moment would make the read-back see it (a race, reported as such).
    let counted = |n: f64| {
        assert!(wait_for(PATIENCE, || drift("file") >= n), "{n} file corrections:\n{}", daemon.log())
    };

    std::fs::write(&conf, "port=8080\n").unwrap();
    assert!(wait_for(PATIENCE, || read(&conf) == "port=80\n"), "a hand-edit is put back:\n{}", daemon.log());
    counted(1.0);

    Command::new("chmod").arg("0666").arg(&conf).status().unwrap();
    assert!(wait_for(PATIENCE, || mode_of(&conf) == 0o640), "a chmod is put back:\n{}", daemon.log());
    counted(2.0);
    Command::new("chmod").arg("0777").arg(s.path("etc")).status().unwrap();
    assert!(wait_for(PATIENCE, || mode_of(&s.path("etc")) == 0o750), "a directory's chmod is put back");
    assert!(wait_for(PATIENCE, || drift("directory") >= 1.0));

    std::fs::remove_file(&conf).unwrap();
    assert!(
        wait_for(PATIENCE, || read(&conf) == "port=80\n"),
        "a deleted file is made again:\n{}",
        daemon.log()
    );
    counted(3.0);

    // An editor's save: a new file written beside, then renamed over the managed one.
    let tmp = s.path("etc/.app.conf.swp");
    std::fs::write(&tmp, "port=9090\n").unwrap();
    std::fs::rename(&tmp, &conf).unwrap();
    assert!(
        wait_for(PATIENCE, || read(&conf) == "port=80\n"),
        "a rename-over save is put back:\n{}",
        daemon.log()
    );

    assert!(
        wait_for(PATIENCE, || drift("file") >= 4.0),
        "four file corrections counted:\n{}\n{}",
        daemon.get("/metrics").unwrap(),
        daemon.log()
    );
    assert!(daemon.metric("mesh_host_correction_latency_seconds_count") >= 4.0);
    assert_eq!(daemon.metric("mesh_host_last_apply_success"), 1.0);
    assert_eq!(daemon.terminate(), Some(0));
    let log = daemon.log();
    assert!(log.contains("corrected app.conf"), "{log}");
}

#[test]
fn the_hosts_own_writes_are_not_drift() {
    let s = Scratch::new();
    // A directory beside the file is the sentinel: its drift is counted under its own type, so
    // the file's counters say only what happened to the file.
    let d = s.declare(json!([
        {"type": "file", "id": "a.f", "path": s.p("f"), "content": "x"},
        {"type": "directory", "id": "a.sentinel", "path": s.p("sentinel"), "mode": "0750"},
    ]));
    let daemon = Daemon::start(&s, &d, &[]);
    let drift = |t: &str| daemon.metric(&format!("mesh_host_drift_corrections_total{{type=\"{t}\"}}"));
    let unchanged = || daemon.metric("mesh_host_resource_outcomes_total{type=\"file\",action=\"unchanged\"}");

    // The first apply wrote the file. Whatever that caused is handled before a change made
    // after it (one worker, keys in the order they came): a chmod of the sentinel, corrected.
    Command::new("chmod").arg("0777").arg(s.path("sentinel")).status().unwrap();
    assert!(wait_for(PATIENCE, || drift("directory") == 1.0), "the sentinel corrected:\n{}", daemon.log());
    assert_eq!(drift("file"), 0.0, "the first apply's write counted as drift:\n{}", daemon.log());

    // An editor's save (one event), put back. The correction writes the file again, and the
    // event that write causes comes while the correction runs, so the next reconcile of the
    // file is the one it caused: it must find the file unchanged, and count nothing.
    let before = unchanged();
    std::fs::write(s.path(".f.swp"), "y").unwrap();
    std::fs::rename(s.path(".f.swp"), s.path("f")).unwrap();
    assert!(wait_for(PATIENCE, || read(&s.path("f")) == "x"), "{}", daemon.log());
    assert!(
        wait_for(PATIENCE, || unchanged() > before),
        "no reconcile found the file unchanged after its correction:\n{}\n{}",
        daemon.get("/metrics").unwrap_or_default(),
        daemon.log()
    );
    // Corrections are told (counted, logged) by the attribution thread, in the order the worker
    // made them, and later than an unchanged file is counted: on a loaded machine CI counted 0
    // here. A second chmod of the sentinel is the barrier: once its correction is told, so is
    // every correction made before it.
    Command::new("chmod").arg("0777").arg(s.path("sentinel")).status().unwrap();
    assert!(
        wait_for(PATIENCE, || drift("directory") == 2.0),
        "the sentinel corrected again:\n{}",
        daemon.log()
    );
    assert_eq!(drift("file"), 1.0, "the correction's own write counted as drift:\n{}", daemon.log());
}

#[test]
fn an_edit_of_the_declaration_is_applied() {
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "file", "id": "a.one", "path": s.p("one"), "content": "1"}]));
    let daemon = Daemon::start(&s, &d, &[]);
    s.declare(json!([
        {"type": "file", "id": "a.one", "path": s.p("one"), "content": "1"},
        {"type": "file", "id": "a.two", "path": s.p("two"), "content": "2"},
    ]));
    assert!(wait_for(PATIENCE, || read(&s.path("two")) == "2"), "{}", daemon.log());
    // And the new file is watched too.
    std::fs::write(s.path("two"), "changed").unwrap();
    assert!(wait_for(PATIENCE, || read(&s.path("two")) == "2"), "{}", daemon.log());
    // A resource leaving the declaration is removed.
    s.declare(json!([{"type": "file", "id": "a.two", "path": s.p("two"), "content": "2"}]));
    assert!(wait_for(PATIENCE, || !s.path("one").exists()), "{}", daemon.log());
}

/// The daemon's unlinked content files, from its open descriptors: an `O_TMPFILE` shows as
/// `<directory>/#<inode> (deleted)`.
fn content_files(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
        .map(|target| target.display().to_string())
        .filter(|t| t.contains("/#") && t.ends_with(" (deleted)"))
        .collect()
}

#[test]
fn declared_content_is_kept_on_disk_and_put_back_from_there() {
    use base64::Engine as _;
    let s = Scratch::new();
    let binary: Vec<u8> = (0..=255u8).chain([0, 0, 10]).collect();
    let declare = |text: &str| {
        s.declare(json!([
            {"type": "file", "id": "a.text", "path": s.p("text"), "content": text},
            {"type": "file", "id": "a.bin", "path": s.p("bin"),
             "bytes": base64::engine::general_purpose::STANDARD.encode(&binary)},
        ]))
    };
    let d = declare("port=80\n");
    let daemon = Daemon::start(&s, &d, &[]);
    let pid = daemon.child.as_ref().unwrap().id();
    assert_eq!(std::fs::read(s.path("bin")).unwrap(), binary);
    let files = content_files(pid);
    assert_eq!(files.len(), 1, "one content file, in the state directory: {files:?}\n{}", daemon.log());
    assert!(files[0].starts_with(&s.p("state/#")), "{files:?}");
    // The generations kept beside the store (tests/it/generations.rs) are there by name too.
    let named: Vec<String> = std::fs::read_dir(s.path("state"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "generations")
        .collect();
    assert_eq!(named.len(), 2, "by name only the store and its lock: {named:?}");
    assert!(daemon.log().contains("declared content kept in an unlinked file"), "{}", daemon.log());
    let bytes = |at: &str| daemon.metric(&format!("mesh_host_declared_content_bytes{{where=\"{at}\"}}"));
    assert_eq!(bytes("file"), (8 + binary.len()) as f64, "{}", daemon.get("/metrics").unwrap_or_default());
    assert_eq!(bytes("memory"), 0.0);
    assert!(daemon.metric("process_resident_memory_bytes") > 1_000_000.0, "the agent's own RSS is exported");

    // Put back from the content file, byte for byte.
    std::fs::write(s.path("bin"), b"edited").unwrap();
    std::fs::write(s.path("text"), b"edited").unwrap();
    assert!(
        wait_for(PATIENCE, || std::fs::read(s.path("bin")).is_ok_and(|b| b == binary)),
        "{}",
        daemon.log()
    );
    assert!(wait_for(PATIENCE, || read(&s.path("text")) == "port=80\n"), "{}", daemon.log());

    // A new declaration gets a new content file, and the old one is closed.
    declare("port=81\n");
    assert!(wait_for(PATIENCE, || read(&s.path("text")) == "port=81\n"), "{}", daemon.log());
    assert!(wait_for(PATIENCE, || content_files(pid).len() == 1), "{:?}", content_files(pid));
    assert_ne!(content_files(pid), files, "not the first one");
}

#[test]
fn a_half_written_declaration_is_not_applied() {
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "file", "id": "a.one", "path": s.p("one"), "content": "1"}]));
    let daemon = Daemon::start(&s, &d, &[]);
    let full = serde_json::to_vec_pretty(&json!({"version": 1, "resources": [
        {"type": "file", "id": "a.two", "path": s.p("two"), "content": "2"},
    ]}))
    .unwrap();
    // Written in place and left half-way, as a slow writer or a crash would.
    let passes = || daemon.metric(FULL_PASSES);
    let before = passes();
    std::fs::write(&d, &full[..full.len() / 2]).unwrap();
    // The refusal is counted inside the pass that read the torn file, and that pass is counted
    // when it ends: once both moved, whatever it did is on the machine.
    assert!(
        wait_for(PATIENCE, || daemon.metric("mesh_host_declaration_refusals_total") >= 1.0
            && passes() > before),
        "{}",
        daemon.log()
    );
    assert!(s.path("one").exists(), "the declaration in force was kept: nothing removed");
    assert!(!s.path("two").exists(), "and nothing of the torn one applied");
    // The one in force is still enforced.
    std::fs::write(s.path("one"), "changed").unwrap();
    assert!(wait_for(PATIENCE, || read(&s.path("one")) == "1"), "{}", daemon.log());

    std::fs::write(&d, &full).unwrap();
    assert!(wait_for(PATIENCE, || read(&s.path("two")) == "2"), "{}", daemon.log());
    assert!(wait_for(PATIENCE, || !s.path("one").exists()));
}

#[test]
fn a_directory_of_declarations_is_one_declaration() {
    let s = Scratch::new();
    let dir = s.path("declaration.d");
    std::fs::create_dir(&dir).unwrap();
    let doc = |resources: serde_json::Value| {
        serde_json::to_vec(&json!({"version": 1, "resources": resources})).unwrap()
    };
    std::fs::write(
        dir.join("10-base.json"),
        doc(json!([{"type": "directory", "id": "base.dir", "path": s.p("srv")}])),
    )
    .unwrap();
    std::fs::write(
        dir.join("20-web.json"),
        doc(json!([{"type": "file", "id": "web.conf", "path": s.p("srv/web.conf"), "content": "w"}])),
    )
    .unwrap();
    // A settle long enough that removing three files is seen as one change, even on a busy
    // machine.
    let daemon = Daemon::start(&s, &dir, &["--settle-ms", "300"]);
    assert_eq!(read(&s.path("srv/web.conf")), "w", "{}", daemon.log());
    std::fs::write(
        dir.join("30-more.json"),
        doc(json!([{"type": "file", "id": "more.conf", "path": s.p("srv/more.conf"), "content": "m"}])),
    )
    .unwrap();
    assert!(wait_for(PATIENCE, || read(&s.path("srv/more.conf")) == "m"), "{}", daemon.log());

    // Emptied, the directory is no declaration: refused, and what is in force stays in force.
    for f in ["10-base.json", "20-web.json", "30-more.json"] {
        std::fs::remove_file(dir.join(f)).unwrap();
    }
    assert!(
        wait_for(PATIENCE, || daemon.log().contains("no declaration: the source holds no *.json file")),
        "{}",
        daemon.log()
    );
    assert!(daemon.metric("mesh_host_declaration_refusals_total") >= 1.0);
    assert_eq!(read(&s.path("srv/web.conf")), "w", "nothing removed:\n{}", daemon.log());
    // Declaring nothing, said explicitly, removes what the host made.
    std::fs::write(dir.join("00-nothing.json"), doc(json!([]))).unwrap();
    assert!(wait_for(PATIENCE, || !s.path("srv/web.conf").exists()), "{}", daemon.log());
}

#[test]
fn sigterm_exits_0_and_persists_the_store() {
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "file", "id": "a.f", "path": s.p("f"), "content": "x"}]));
    let mut daemon = Daemon::start(&s, &d, &[]);
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
    let status: serde_json::Value = serde_json::from_slice(&s.run(&["status", "--json"]).stdout).unwrap();
    assert_eq!(status["records"][0]["id"], "a.f");
    assert!(daemon.log().contains("stopped"));
}

/// inotify instances are counted per user across every process of the user (for root:
/// systemd, udev, every container's processes; 128 by default), and a daemon that cannot make
/// one does not start. The agent makes two: the managed files' watcher, and one for the
/// declaration and the rollback hold together (it made one for each of those two before, and a
/// run of the fleet's tests with eight agents each ran the machine out).
#[test]
fn a_daemon_holds_two_inotify_instances() {
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "file", "id": "a.f", "path": s.p("f"), "content": "x"}]));
    let mut daemon = Daemon::start(&s, &d, &[]);
    let pid = daemon.child.as_ref().unwrap().id();
    let instances = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .filter(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy() == "anon_inode:inotify")
            })
            .count()
    };
    assert_eq!(instances(), 2, "{}", daemon.log());
    // Both sources are still followed on the one they share.
    s.declare(json!([{"type": "file", "id": "a.f", "path": s.p("f"), "content": "y"}]));
    assert!(wait_for(PATIENCE, || read(&s.path("f")) == "y"), "{}", daemon.log());
    assert_eq!(instances(), 2, "{}", daemon.log());
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
}

/// Without an inotify instance the daemon still starts and applies, says why nothing is
/// watched (naming the limits), and its resync puts a hand-edit back; once an instance can be
/// made, the next resync makes one and the declaration's watcher makes its own, and hand-edits
/// and new declarations are seen as they happen again. The daemon runs in a user namespace
/// whose limit of instances is 0 (`/proc/sys/user/max_inotify_instances` is per namespace), so
/// nothing outside it is touched; the limit is raised from here with nsenter.
#[test]
fn without_an_inotify_instance_the_daemon_runs_on_its_resync_and_watches_once_it_can() {
    let s = Scratch::new();
    let conf = s.path("app.conf");
    let d = s.declare(
        json!([{"type": "file", "id": "app.conf", "path": s.p("app.conf"), "content": "port=80\n"}]),
    );
    let no_instances = [
        "unshare",
        "--user",
        "--map-root-user",
        "sh",
        "-c",
        "echo 0 > /proc/sys/user/max_inotify_instances && exec \"$0\" \"$@\"",
    ];
    let mut daemon = Daemon::launch_under(&no_instances, &s, &d, &["--resync", "2"], &[]);
    assert!(wait_for(PATIENCE, || daemon.get("/healthz").is_some_and(|b| b == "ok\n")), "{}", daemon.log());
    assert_eq!(read(&conf), "port=80\n", "{}", daemon.log());
    let log = daemon.log();
    assert!(
        log.contains("the file watcher has no inotify instance, so none of the 1 managed paths is watched")
            && log.contains("raise fs.inotify.max_user_instances with sysctl")
            && log.contains("cannot watch the declaration: tried again every 10 s"),
        "{log}"
    );
    let file_watcher_up = || daemon.metric("mesh_host_watcher_up{watcher=\"file\"}");
    assert_eq!(file_watcher_up(), 0.0, "{}", daemon.log());
    // Keys the file watcher queued: none while it has no instance, one for a hand-edit after.
    let from_files = || daemon.metric("mesh_host_queue_adds_total{source=\"file\"}");
    std::fs::write(&conf, "port=1\n").unwrap();
    assert!(wait_for(PATIENCE, || read(&conf) == "port=80\n"), "the resync puts it back: {}", daemon.log());
    assert_eq!(from_files(), 0.0, "{}", daemon.log());

    let pid = daemon.child.as_ref().unwrap().id().to_string();
    let raised = Command::new("nsenter")
        .args(["--user", "--target", &pid, "sh", "-c", "echo 128 > /proc/sys/user/max_inotify_instances"])
        .status()
        .expect("nsenter runs (Debian's util-linux; tests/testbed/up.sh needs nothing more)");
    assert!(raised.success());
    assert!(
        wait_for(PATIENCE, || daemon.log().contains("the file watcher has its inotify instance again")),
        "{}",
        daemon.log()
    );
    assert_eq!(file_watcher_up(), 1.0, "{}", daemon.log());
    std::fs::write(&conf, "port=2\n").unwrap();
    assert!(wait_for(PATIENCE, || read(&conf) == "port=80\n"), "{}", daemon.log());
    assert!(wait_for(PATIENCE, || from_files() >= 1.0), "the watcher saw the hand-edit: {}", daemon.log());
    assert!(
        wait_for(Duration::from_secs(20), || daemon.log().contains("the declaration is watched again")),
        "{}",
        daemon.log()
    );
    s.declare(json!([{"type": "file", "id": "app.conf", "path": s.p("app.conf"), "content": "port=81\n"}]));
    assert!(wait_for(PATIENCE, || read(&conf) == "port=81\n"), "{}", daemon.log());
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
}

#[test]
fn ready_is_notified_after_the_first_apply() {
    use std::os::unix::net::UnixDatagram;
    let s = Scratch::new();
    let sock_path = s.path("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(PATIENCE)).unwrap();
    let d = s.declare(json!([{"type": "file", "id": "a.f", "path": s.p("f"), "content": "x"}]));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("mesh-host"))
        .arg("--state")
        .arg(s.state())
        .args(["run", "--declaration"])
        .arg(&d)
        .args(["--metrics", &format!("127.0.0.1:{port}")])
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "200000")
        .spawn()
        .unwrap();
    // Before READY the agent may say what it does (STATUS=) and ask for more start time
    // (EXTEND_TIMEOUT_USEC=); READY itself comes after the first apply.
    let mut buf = [0u8; 256];
    let mut next = |what: &str| loop {
        let n = sock.recv(&mut buf).unwrap_or_else(|e| panic!("no {what}: {e}"));
        let message = String::from_utf8_lossy(&buf[..n]).into_owned();
        if message.contains(what) {
            return message;
        }
        assert!(
            message.starts_with("STATUS=") || message.starts_with("EXTEND_TIMEOUT_USEC="),
            "an unexpected notification before {what}: {message}"
        );
    };
    next("READY=1");
    assert_eq!(read(&s.path("f")), "x", "READY comes after the first apply");
    next("WATCHDOG=1");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_file_something_keeps_rewriting_is_contested_and_settles_after() {
    let s = Scratch::new();
    let f = s.path("fought.conf");
    let d = s.declare(
        json!([{"type": "file", "id": "a.fought", "path": s.p("fought.conf"), "content": "mine\n"}]),
    );
    let daemon = Daemon::start(&s, &d, &[]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, f) = (stop.clone(), f.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::fs::write(&f, format!("theirs {n}\n")).unwrap();
                n += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        })
    };
    let seen = wait_for(PATIENCE, || daemon.metric("mesh_host_contested_resources") >= 1.0);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert!(seen, "the fight was reported as a contest:\n{}", daemon.log());
    let stopped = std::time::Instant::now();
    assert!(wait_for(PATIENCE, || read(&f) == "mine\n"), "put back after the fight");
    // The target is 1 s; CI machines are noisy, so the test allows more and the benchmark measures.
    assert!(stopped.elapsed() < std::time::Duration::from_secs(3), "settled in {:?}", stopped.elapsed());
    assert!(
        wait_for(PATIENCE, || daemon.metric("mesh_host_contested_resources") == 0.0),
        "and no longer contested"
    );
    let log = daemon.log();
    assert_eq!(
        log.matches("contested: something keeps changing").count(),
        1,
        "one line for the contest:\n{log}"
    );
}

/// Writes a declaration document with these resources at `path`.
fn write_doc(path: &std::path::Path, resources: serde_json::Value) {
    let d = json!({"version": 1, "resources": resources});
    std::fs::write(path, serde_json::to_vec_pretty(&d).unwrap()).unwrap();
}

/// A file resource `a.<name>` at `<scratch>/<name>` holding `content`.
fn file(s: &Scratch, name: &str, content: &str) -> serde_json::Value {
    json!({"type": "file", "id": format!("a.{name}"), "path": s.p(name), "content": content})
}

/// Issue 12, fault 5: inotify watched the directory's inode, so a directory removed and made
/// again was never looked at again.
#[test]
fn fault5_a_declaration_directory_removed_and_made_again_is_applied() {
    let s = Scratch::new();
    let dir = s.path("declaration.d");
    std::fs::create_dir(&dir).unwrap();
    write_doc(&dir.join("10-a.json"), json!([file(&s, "one", "1")]));
    let daemon = Daemon::start(&s, &dir, &[]);
    assert_eq!(read(&s.path("one")), "1", "{}", daemon.log());

    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::create_dir(&dir).unwrap();
    write_doc(&dir.join("10-a.json"), json!([file(&s, "two", "2")]));
    assert!(
        wait_for(PATIENCE, || read(&s.path("two")) == "2"),
        "the new declaration is applied:\n{}",
        daemon.log()
    );
    assert!(wait_for(PATIENCE, || !s.path("one").exists()), "{}", daemon.log());

    // The directory made again is watched: a file added to it later is applied too.
    write_doc(&dir.join("20-b.json"), json!([file(&s, "three", "3")]));
    assert!(wait_for(PATIENCE, || read(&s.path("three")) == "3"), "{}", daemon.log());
}

/// Issue 12, fault 5: a directory swapped in by a rename, the way deployment tools replace a
/// tree whole, was never applied either.
#[test]
fn fault5_a_declaration_directory_swapped_in_by_a_rename_is_applied() {
    let s = Scratch::new();
    let dir = s.path("declaration.d");
    std::fs::create_dir(&dir).unwrap();
    write_doc(&dir.join("10-a.json"), json!([file(&s, "one", "1")]));
    let daemon = Daemon::start(&s, &dir, &[]);

    // Two renames: the old directory moves aside, the new one takes its name.
    let new = s.path("declaration.d.new");
    std::fs::create_dir(&new).unwrap();
    write_doc(&new.join("10-a.json"), json!([file(&s, "two", "2")]));
    std::fs::rename(&dir, s.path("declaration.d.old")).unwrap();
    std::fs::rename(&new, &dir).unwrap();
    assert!(
        wait_for(PATIENCE, || read(&s.path("two")) == "2"),
        "the directory renamed into place:\n{}",
        daemon.log()
    );
    assert!(wait_for(PATIENCE, || !s.path("one").exists()), "{}", daemon.log());

    // One atomic exchange (renameat2 RENAME_EXCHANGE): the name never goes missing.
    let next = s.path("declaration.d.next");
    std::fs::create_dir(&next).unwrap();
    write_doc(&next.join("10-a.json"), json!([file(&s, "three", "3")]));
    rustix::fs::renameat_with(
        rustix::fs::CWD,
        &next,
        rustix::fs::CWD,
        &dir,
        rustix::fs::RenameFlags::EXCHANGE,
    )
    .unwrap();
    assert!(
        wait_for(PATIENCE, || read(&s.path("three")) == "3"),
        "the directory exchanged:\n{}",
        daemon.log()
    );
    assert!(wait_for(PATIENCE, || !s.path("two").exists()), "{}", daemon.log());

    // What is at the name now is watched, and what was moved aside is not the declaration.
    write_doc(&next.join("20-b.json"), json!([file(&s, "aside", "x")]));
    write_doc(&dir.join("20-b.json"), json!([file(&s, "four", "4")]));
    assert!(wait_for(PATIENCE, || read(&s.path("four")) == "4"), "{}", daemon.log());
    assert!(!s.path("aside").exists(), "{}", daemon.log());
}

/// Issue 12, fault 5: the periodic resync did not read the declaration source, so what the
/// watcher missed stayed missed. Here its parent directory is replaced, which no watch on the
/// old one can see; only the resync finds the new declaration.
#[test]
fn fault5_the_periodic_resync_reads_the_declaration_source_again() {
    let s = Scratch::new();
    let conf = s.path("conf");
    let dir = conf.join("declaration.d");
    std::fs::create_dir_all(&dir).unwrap();
    write_doc(&dir.join("10-a.json"), json!([file(&s, "one", "1")]));
    let daemon = Daemon::start(&s, &dir, &["--resync", "1"]);

    std::fs::rename(&conf, s.path("conf.old")).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    write_doc(&dir.join("10-a.json"), json!([file(&s, "two", "2")]));
    assert!(wait_for(PATIENCE, || read(&s.path("two")) == "2"), "the resync applied it:\n{}", daemon.log());
    assert!(wait_for(PATIENCE, || !s.path("one").exists()), "{}", daemon.log());
    // An unchanged source is not parsed again at each resync: one acceptance at start, one for
    // the new declaration. Two more passes counted means at least one whole resync after the
    // one that accepted it.
    let after = daemon.metric(FULL_PASSES);
    assert!(wait_for(PATIENCE, || daemon.metric(FULL_PASSES) >= after + 2.0), "{}", daemon.log());
    assert_eq!(daemon.log().matches("declaration accepted").count(), 2, "{}", daemon.log());
}

fn mkfifo(path: &std::path::Path) {
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success(), "mkfifo {}", path.display());
}

/// Issue 12, fault 2: a FIFO named `*.json` in the declaration directory must not block the
/// daemon's read of its declaration; it is refused, naming it, and everything else goes on.
#[test]
fn fault2_a_fifo_in_the_declaration_directory_does_not_hang_the_daemon() {
    let s = Scratch::new();
    let dir = s.path("declaration.d");
    std::fs::create_dir(&dir).unwrap();
    write_doc(&dir.join("10-a.json"), json!([file(&s, "one", "1")]));
    let mut daemon = Daemon::start(&s, &dir, &[]);

    mkfifo(&dir.join("x.json"));
    let named = format!("{}: it is a FIFO, not a regular file", dir.join("x.json").display());
    assert!(
        wait_for(PATIENCE, || daemon.log().contains(&named)),
        "refused, naming the FIFO:\n{}",
        daemon.log()
    );
    assert!(daemon.metric("mesh_host_declaration_refusals_total") >= 1.0);
    assert!(daemon.log().contains("the declaration in force is kept"), "{}", daemon.log());

    // The declaration in force is still enforced, and the agent is healthy.
    std::fs::write(s.path("one"), "changed").unwrap();
    assert!(wait_for(PATIENCE, || read(&s.path("one")) == "1"), "drift still corrected:\n{}", daemon.log());
    assert_eq!(daemon.get("/healthz").as_deref(), Some("ok\n"));
    let asked = std::time::Instant::now();
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
    assert!(asked.elapsed() < std::time::Duration::from_secs(3), "stopped in {:?}", asked.elapsed());
}

/// Issue 12, fault 2: the same for a FIFO, or a device, at the declaration's own path. A FIFO
/// blocked the read there forever; `/dev/zero` would have been read until memory ran out.
#[test]
fn fault2_a_fifo_or_a_device_at_the_declaration_path_does_not_hang_the_daemon() {
    let s = Scratch::new();
    let d = s.declare(json!([file(&s, "one", "1")]));
    let mut daemon = Daemon::start(&s, &d, &[]);

    std::fs::remove_file(&d).unwrap();
    mkfifo(&d);
    assert!(
        wait_for(PATIENCE, || daemon.log().contains("it is a FIFO, not a regular file")),
        "{}",
        daemon.log()
    );
    std::fs::write(s.path("one"), "changed").unwrap();
    assert!(wait_for(PATIENCE, || read(&s.path("one")) == "1"), "drift still corrected:\n{}", daemon.log());

    std::fs::remove_file(&d).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &d).unwrap();
    assert!(
        wait_for(PATIENCE, || daemon.log().contains("it is a character device, not a regular file")),
        "{}",
        daemon.log()
    );
    std::fs::write(s.path("one"), "changed again").unwrap();
    assert!(wait_for(PATIENCE, || read(&s.path("one")) == "1"), "{}", daemon.log());
    let asked = std::time::Instant::now();
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
    assert!(asked.elapsed() < std::time::Duration::from_secs(3), "stopped in {:?}", asked.elapsed());
}

/// Issue 12, fault 9: a daemon started with a refused declaration enforces nothing, and
/// `/healthz` said "ok".
#[test]
fn fault9_a_daemon_started_with_a_refused_declaration_is_not_healthy() {
    let s = Scratch::new();
    let d = s.path("declaration.json");
    // A file without its path: refused.
    std::fs::write(&d, r#"{"version": 1, "resources": [{"type": "file", "id": "a.one", "content": "1"}]}"#)
        .unwrap();
    let daemon = Daemon::launch(&s, &d, &[], &[]);
    let unhealthy = || daemon.answer("/healthz").filter(|(_, body)| body.contains("no declaration in force"));
    assert!(
        wait_for(PATIENCE, || unhealthy().is_some()),
        "{:?}\n{}",
        daemon.answer("/healthz"),
        daemon.log()
    );
    let (status, body) = unhealthy().unwrap();
    assert_eq!(status, 503, "{body}");
    // The verdict only on /healthz (issue 45, point 6); why in the log (and on /healthz to a
    // caller who logged in: tests/it/endpoints.rs).
    assert_eq!(body, "no declaration in force\n");
    let log = daemon.log();
    assert!(
        log.contains("the declaration was refused") && log.contains("no declaration is in force"),
        "{log}"
    );

    s.declare(json!([file(&s, "one", "1")]));
    assert!(wait_for(PATIENCE, || daemon.get("/healthz").as_deref() == Some("ok\n")), "{}", daemon.log());
    assert!(wait_for(PATIENCE, || read(&s.path("one")) == "1"), "{}", daemon.log());
}

/// The daemon's open sockets, from its descriptors.
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// How many connections wait in the accept queue of the listening socket on `port` (IPv4
/// loopback): for a listening socket, `/proc/net/tcp` gives the queue's length as `rx_queue`.
fn accept_queue(port: u16) -> Option<usize> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!("0100007F:{port:04X}");
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // sl, local address, remote address, state (0A: listening), tx_queue:rx_queue.
        (fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"0A"))
            .then(|| usize::from_str_radix(fields.get(4)?.split(':').nth(1)?, 16).ok())
            .flatten()
    })
}

/// Whether the daemon's end of `s` is still open: nothing to read yet, and no end of file.
fn open(s: &std::net::TcpStream) -> bool {
    use std::io::Read as _;
    s.set_nonblocking(true).unwrap();
    let open = matches!((&*s).read(&mut [0u8; 16]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    s.set_nonblocking(false).unwrap();
    open
}

/// How many connections the daemon `pid` holds at once, from its descriptor limit.
fn connections_of(pid: u32) -> usize {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let soft = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|l| l.split_whitespace().next())
        .map(|soft| soft.parse().unwrap_or(u64::MAX))
        .unwrap();
    mesh_host::telemetry::http::connections_for(soft)
}

/// Issue 12, fault 9: `/metrics` had no limit on concurrent connections, so a flood of them
/// took a descriptor each for as long as the clients liked. (Since issue 22, point 6, the
/// limit is kept by dropping the oldest, not by leaving the newest in the listen queue.)
#[test]
fn fault9_metrics_connections_are_limited_and_a_slow_client_is_cut_off() {
    use std::io::{Read as _, Write as _};
    let s = Scratch::new();
    let d = s.declare(json!([file(&s, "one", "1")]));
    let daemon = Daemon::start(&s, &d, &[]);
    let pid = daemon.child.as_ref().unwrap().id();
    let before = sockets(pid);

    // More clients that connect and send nothing than the daemon holds at once: it takes them
    // all in (none is left in the listen queue, where a probe would wait behind them), and
    // drops the oldest, so it never holds more than its limit. They are checked before the
    // request limit (5 s) would cut them off anyway.
    let most = connections_of(pid);
    let idle: Vec<std::net::TcpStream> =
        (0..most + 50).map(|_| std::net::TcpStream::connect(("127.0.0.1", daemon.port)).unwrap()).collect();
    let dropped = || idle.iter().map(|s| !open(s)).collect::<Vec<_>>();
    let oldest_dropped: Vec<bool> = (0..most + 50).map(|i| i < 50).collect();
    assert!(
        wait_for(std::time::Duration::from_secs(3), || dropped() == oldest_dropped),
        "{} of {} idle clients dropped, not the oldest 50; {:?} waiting to be accepted; the daemon holds \
         {} sockets ({before} before)",
        dropped().iter().filter(|d| **d).count(),
        most + 50,
        accept_queue(daemon.port),
        sockets(pid)
    );
    assert_eq!(accept_queue(daemon.port), Some(0));
    let during = sockets(pid);
    assert!(
        during <= before + most,
        "{during} sockets held for {} idle clients ({before} before)",
        most + 50
    );
    // And a probe is answered among them.
    assert_eq!(daemon.get("/healthz").as_deref(), Some("ok\n"));
    drop(idle);
    assert!(wait_for(PATIENCE, || sockets(pid) <= before), "{} sockets after", sockets(pid));

    // A client that trickles its request is cut off after the request limit (5 s).
    let mut slow = std::net::TcpStream::connect(("127.0.0.1", daemon.port)).unwrap();
    slow.set_read_timeout(Some(std::time::Duration::from_millis(200))).unwrap();
    let started = std::time::Instant::now();
    slow.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
    let cut = loop {
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "the slow client was never cut off");
        if slow.write_all(b"X-Slow: 1\r\n").is_err() {
            break started.elapsed();
        }
        match slow.read(&mut [0u8; 64]) {
            Ok(0) => break started.elapsed(),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
            }
            Err(_) => break started.elapsed(),
            Ok(_) => panic!("an answer to a request that never ended"),
        }
    };
    assert!(cut < std::time::Duration::from_secs(8), "cut off after {cut:?}");
    assert_eq!(daemon.get("/healthz").as_deref(), Some("ok\n"));
}

/// Every descriptor the process `pid` has open.
fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// The resident size of the process `pid`, in KiB (`VmRSS` in `/proc/PID/status`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// One probe as a monitoring system makes it, given one second in all: connect, ask, read the
/// whole answer. `Err` says what went wrong and after how long.
fn probe(port: u16, path: &str) -> Result<std::time::Duration, String> {
    use std::io::{Read as _, Write as _};
    let limit = std::time::Duration::from_secs(1);
    let started = std::time::Instant::now();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let left = || limit.saturating_sub(started.elapsed()).max(std::time::Duration::from_millis(1));
    let fail = |what: String| format!("{path}: {what} after {:?}", started.elapsed());
    let mut s =
        std::net::TcpStream::connect_timeout(&addr, limit).map_err(|e| fail(format!("connect: {e}")))?;
    s.set_write_timeout(Some(left())).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").map_err(|e| fail(format!("write: {e}")))?;
    s.set_read_timeout(Some(left())).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| fail(format!("read: {e}")))?;
    let took = started.elapsed();
    if !out.starts_with("HTTP/1.1 200 ") {
        return Err(fail(format!("answered {:?}", out.lines().next())));
    }
    if took > limit {
        return Err(fail("answered".to_owned()));
    }
    Ok(took)
}

/// One connection of a flood, held until the flood's runtime is dropped: an idle one connects
/// and sends nothing; a slow one (slowloris) sends a request line and then a byte a second. As
/// an attacker would, each opens its connection again when it finds it closed (the slow one on
/// a failed write, the idle one on end of file), at most once a second, so the daemon sees the
/// whole flood for as long as it lasts, not only until its first time limit.
async fn hold(port: u16, slow: bool, counts: std::sync::Arc<[std::sync::atomic::AtomicUsize; 2]>) {
    use std::sync::atomic::Ordering::Relaxed;
    use tokio::io::AsyncWriteExt as _;
    loop {
        if let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            let [held, opened] = &*counts;
            held.fetch_add(1, Relaxed);
            opened.fetch_add(1, Relaxed);
            let mut alive = !slow || stream.write_all(b"GET /metrics HTTP/1.1\r\n").await.is_ok();
            while alive {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                alive = if slow {
                    stream.write_all(b"x").await.is_ok()
                } else {
                    matches!(stream.try_read(&mut [0u8; 64]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
                };
            }
            held.fetch_sub(1, Relaxed);
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Issue 22, point 6: with 200 slow or idle connections held from one local client, `/healthz`
/// probes failed and connections could not even be made (64 served, 128 in the listen queue,
/// the rest dropped by the kernel), so any local user could blind the agent's health and
/// metrics. Now 1,000 such connections held (and opened again as the daemon closes them) leave
/// every probe answered within a second, while the daemon's descriptors and memory stay bounded
/// and come back once the flood ends.
#[test]
fn issue22_a_flood_of_idle_and_slow_connections_does_not_blind_healthz_or_metrics() {
    use std::sync::atomic::Ordering::Relaxed;
    const IDLE: usize = 500;
    const SLOW: usize = 500;
    // The flood and the probes need a descriptor each: raise this process's soft limit.
    let (soft, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    if soft < 4096 {
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard.min(8192), hard)
            .unwrap();
    }
    let s = Scratch::new();
    let d = s.declare(json!([file(&s, "one", "1")]));
    let daemon = Daemon::start(&s, &d, &[]);
    let pid = daemon.child.as_ref().unwrap().id();
    for _ in 0..20 {
        probe(daemon.port, "/metrics").unwrap();
        probe(daemon.port, "/healthz").unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (fds_before, rss_before) = (descriptors(pid), rss_kib(pid));

    // How many of the flood's connections are open now, and how many were ever opened.
    let counts =
        std::sync::Arc::new([std::sync::atomic::AtomicUsize::new(0), std::sync::atomic::AtomicUsize::new(0)]);
    let [held, opened] = &*counts;
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let flood = {
        let (port, counts) = (daemon.port, std::sync::Arc::clone(&counts));
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            for i in 0..IDLE + SLOW {
                rt.spawn(hold(port, i >= IDLE, std::sync::Arc::clone(&counts)));
            }
            // Dropping the runtime drops every connection at once.
            rt.block_on(async {
                while matches!(stopped.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty)) {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            });
        })
    };
    // The flood's connections are all made (or, before the fix, the kernel holds the rest back).
    wait_for(std::time::Duration::from_secs(5), || opened.load(Relaxed) >= IDLE + SLOW);
    let all_opened = opened.load(Relaxed);

    // Probes for 12 s, past the daemon's 5 s request limit, so slow clients cut off and back
    // again are part of it.
    let (mut failures, mut answered, mut slowest) = (Vec::new(), 0, std::time::Duration::ZERO);
    let (mut fds_most, mut rss_most, mut held_least, mut held_most) = (0, 0, usize::MAX, 0);
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(12) {
        for path in ["/healthz", "/metrics"] {
            match probe(daemon.port, path) {
                Ok(took) => {
                    answered += 1;
                    slowest = slowest.max(took);
                }
                Err(e) => failures.push(e),
            }
        }
        fds_most = fds_most.max(descriptors(pid));
        rss_most = rss_most.max(rss_kib(pid));
        held_least = held_least.min(held.load(Relaxed));
        held_most = held_most.max(held.load(Relaxed));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    stop.send(()).unwrap();
    flood.join().unwrap();

    let figures = format!(
        "{answered} probes answered (slowest {slowest:?}), {} failed; the flood opened {all_opened} in its first 5 s, \
         then held {held_least} to {held_most} at once ({} opened in all); descriptors {fds_before} before, {fds_most} at most; \
         VmRSS {rss_before} KiB before, {rss_most} KiB at most",
        failures.len(),
        opened.load(Relaxed)
    );
    eprintln!("{figures}");
    assert!(failures.is_empty(), "{figures}\nfirst failures: {:#?}", &failures[..failures.len().min(10)]);
    assert!(all_opened >= IDLE + SLOW, "{figures}");
    // Bounded: the connections the daemon holds at once, plus the one being accepted while the
    // oldest is dropped, and a little room for a file the daemon reads meanwhile (a resync).
    // Measured: 256 and 257 more at most.
    let most = connections_of(pid);
    assert!(fds_most <= fds_before + most + 4, "{figures} (at most {most} connections held)");
    // Measured: 1.5 MiB more at most (a task, a request buffer and a stream per connection).
    assert!(rss_most <= rss_before + 8 * 1024, "{figures}");

    // And back once the flood ends.
    let back = wait_for(PATIENCE, || descriptors(pid) <= fds_before);
    let (fds_after, rss_after) = (descriptors(pid), rss_kib(pid));
    assert!(back, "{figures}; {fds_after} descriptors after");
    assert!(rss_after <= rss_before + 4 * 1024, "{figures}; VmRSS {rss_after} KiB after");
    probe(daemon.port, "/healthz").unwrap();
    probe(daemon.port, "/metrics").unwrap();
    eprintln!("after: descriptors {fds_after}, VmRSS {rss_after} KiB");
}

/// Issue 12, fault 10: a panic in a reconcile killed the only worker, and nothing was put back
/// after it. The failpoint panics in the first single-resource reconcile of the process.
#[test]
fn fault10_a_panic_in_one_reconcile_does_not_take_the_daemon_down() {
    let s = Scratch::new();
    let conf = s.path("app.conf");
    let d = s.declare(
        json!([{"type": "file", "id": "app.conf", "path": s.p("app.conf"), "content": "port=80\n"}]),
    );
    let mut daemon = Daemon::launch(&s, &d, &[], &[("MESH_HOST_FAILPOINT", "panic-reconcile")]);
    assert!(wait_for(PATIENCE, || daemon.get("/healthz").as_deref() == Some("ok\n")), "{}", daemon.log());

    std::fs::write(&conf, "port=8080\n").unwrap();
    assert!(
        wait_for(PATIENCE, || daemon.metric("mesh_host_panics_total") == 1.0),
        "the panic is counted:\n{}",
        daemon.log()
    );
    assert!(
        daemon.log().contains(
            "failed app.conf: its reconcile panicked: failpoint panic-reconcile: a panic in the reconcile of app.conf"
        ),
        "{}",
        daemon.log()
    );
    // The failed key is retried, and put back.
    assert!(wait_for(PATIENCE, || read(&conf) == "port=80\n"), "put back after the panic:\n{}", daemon.log());
    assert_eq!(daemon.get("/healthz").as_deref(), Some("ok\n"));

    // And the daemon goes on correcting.
    assert!(wait_for(PATIENCE, || daemon.metric("mesh_host_drift_corrections_total{type=\"file\"}") >= 1.0));
    std::fs::write(&conf, "port=9090\n").unwrap();
    assert!(wait_for(PATIENCE, || read(&conf) == "port=80\n"), "a later edit is put back:\n{}", daemon.log());
    assert!(wait_for(PATIENCE, || daemon.metric("mesh_host_drift_corrections_total{type=\"file\"}") >= 2.0));
    assert_eq!(daemon.metric("mesh_host_panics_total"), 1.0);
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
}

/// The inodes a process holds inotify watches on, from its descriptors' `fdinfo` (each watch a
/// line `inotify wd:N ino:HEX sdev:...`).
fn watched_inodes(pid: u32) -> std::collections::HashSet<u64> {
    let mut inodes = std::collections::HashSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fdinfo")).unwrap().flatten() {
        for line in read(&fd.path()).lines().filter(|l| l.starts_with("inotify ")) {
            if let Some(ino) = line.split(' ').find_map(|w| w.strip_prefix("ino:")) {
                inodes.insert(u64::from_str_radix(ino, 16).unwrap());
            }
        }
    }
    inodes
}

/// Issue 27, point 2: running out of inotify watches is said once, counted, and what is left
/// unwatched is still put back, by the periodic resync.
///
/// How the limit is lowered, and why so: inotify's limit is not per process but per user, and
/// per user namespace (the kernel's ucounts, since 4.9): a watch is charged to its user in its
/// namespace and in every namespace above it, each against that namespace's own
/// `user.max_inotify_watches`. Lowering the machine's `fs.inotify.max_user_watches` instead
/// would starve every other root process while it is low (this suite's other daemons and
/// watchers, running in parallel, and the machine's own), and would leave a limit that depends
/// on how many watches they hold at that moment. So the daemon is started in a user namespace
/// of its own (`unshare --user --map-root-user`: root mapped to root, so it still owns and may
/// change the scratch tree), whose limit is set to 12 before the daemon is exec'd: the kernel's
/// real ENOSPC, for this daemon only, at a count that holds only its own watches, with nothing
/// to restore afterwards (the namespace ends with the daemon). Raising the namespace's limit
/// from outside (`nsenter`) then shows the shortage clear, and lowering it below what is in use
/// before three more directories are declared shows it come back, said once more.
#[test]
fn issue27_running_out_of_watches_is_said_once_and_the_resync_covers_what_is_unwatched() {
    let s = Scratch::new();
    let dirs = 30;
    let mut resources = Vec::new();
    for i in 0..dirs {
        resources
            .push(json!({"type": "directory", "id": format!("t.d{i}"), "path": s.p(&format!("tree/d{i}"))}));
        resources.push(json!({"type": "file", "id": format!("t.f{i}"), "path": s.p(&format!("tree/d{i}/f")), "content": format!("ours {i}\n")}));
    }
    std::fs::create_dir_all(s.path("tree")).unwrap();
    let d = s.declare(serde_json::Value::Array(resources.clone()));
    let limit = 12;
    let set_limit = format!("echo {limit} > /proc/sys/user/max_inotify_watches && exec \"$@\"");
    let wrapper = ["unshare", "--user", "--map-root-user", "--", "sh", "-c", &set_limit, "sh"];
    let mut daemon = Daemon::launch_under(&wrapper, &s, &d, &["--resync", "1"], &[]);
    assert!(wait_for(PATIENCE, || daemon.get("/healthz").as_deref() == Some("ok\n")), "{}", daemon.log());
    let pid = daemon.child.as_ref().unwrap().id();

    let watched = || daemon.metric(r#"mesh_host_watched_paths{state="watched"}"#);
    let unwatched = || daemon.metric(r#"mesh_host_watched_paths{state="unwatched"}"#);
    // 60 paths: the 30 directories (all in `tree`) and a file in each.
    assert!(
        wait_for(PATIENCE, || watched() + unwatched() == 60.0 && unwatched() > 0.0),
        "watched {} and unwatched {}:\n{}",
        watched(),
        unwatched(),
        daemon.log()
    );
    assert!(watched() > 0.0, "some watches were made before the limit:\n{}", daemon.log());
    assert!(watched_inodes(pid).len() <= limit, "the namespace's limit holds");

    // A file whose directory holds no watch: an edit of it is not seen, and the resync puts it
    // back (a second at most, at `--resync 1`).
    use std::os::unix::fs::MetadataExt as _;
    let inodes = watched_inodes(pid);
    let i = (0..dirs)
        .find(|i| !inodes.contains(&std::fs::metadata(s.path(&format!("tree/d{i}"))).unwrap().ino()))
        .expect("a directory left unwatched");
    let f = s.path(&format!("tree/d{i}/f"));
    assert_eq!(read(&f), format!("ours {i}\n"));
    let passes = daemon.metric(FULL_PASSES);
    std::fs::write(&f, "by hand\n").unwrap();
    assert!(
        wait_for(PATIENCE, || read(&f) == format!("ours {i}\n")),
        "an edit in an unwatched directory is put back by the resync:\n{}",
        daemon.log()
    );
    // The file is put back inside the pass, a moment before the pass is counted.
    assert!(
        wait_for(PATIENCE, || daemon.metric(FULL_PASSES) > passes),
        "by a full pass, not a watch:\n{}",
        daemon.log()
    );
    // Its line reaches the log a moment after the metric: waited for (a CI run read the log
    // first and failed).
    let corrected = format!("corrected t.f{i} ");
    assert!(wait_for(PATIENCE, || daemon.log().contains(&corrected)), "{corrected:?} in:\n{}", daemon.log());

    // Said once, with the count, the limit and what to do, however many passes meet it again.
    let passes = daemon.metric(FULL_PASSES);
    assert!(wait_for(PATIENCE, || daemon.metric(FULL_PASSES) >= passes + 3.0), "{}", daemon.log());
    let log = daemon.log();
    let said: Vec<&str> = log.lines().filter(|l| l.contains("out of inotify watches")).collect();
    assert_eq!(said.len(), 1, "said once:\n{log}");
    for part in [
        "of 60 managed paths",
        &format!("the limit of {limit} inotify watches per user (user.max_inotify_watches)"),
        "put back by the periodic resync (every 1 s)",
        "raise user.max_inotify_watches",
    ] {
        assert!(said[0].contains(part), "{part:?} in {}", said[0]);
    }

    // The limit raised: the next pass watches everything, and says so once.
    let set_limit = |n: usize| {
        let set = format!("echo {n} > /proc/sys/user/max_inotify_watches");
        let done = Command::new("nsenter")
            .args(["--user", "--target", &pid.to_string(), "sh", "-c", &set])
            .status()
            .unwrap();
        assert!(done.success());
    };
    set_limit(1000);
    assert!(
        wait_for(PATIENCE, || unwatched() == 0.0 && watched() == 60.0),
        "watched {} and unwatched {} after the limit was raised:\n{}",
        watched(),
        unwatched(),
        daemon.log()
    );
    assert!(
        wait_for(PATIENCE, || daemon.log().contains("inotify watches are available again")),
        "{}",
        daemon.log()
    );
    assert_eq!(daemon.log().matches("out of inotify watches").count(), 1, "{}", daemon.log());

    // And back: a limit below what is in use refuses the watches that three more directories
    // need, which is said again, once.
    set_limit(1);
    let mut resources = resources.clone();
    for i in dirs..dirs + 3 {
        resources
            .push(json!({"type": "directory", "id": format!("t.d{i}"), "path": s.p(&format!("tree/d{i}"))}));
        resources.push(json!({"type": "file", "id": format!("t.f{i}"), "path": s.p(&format!("tree/d{i}/f")), "content": format!("ours {i}\n")}));
    }
    s.declare(serde_json::Value::Array(resources));
    assert!(
        wait_for(PATIENCE, || watched() == 63.0 && unwatched() == 3.0),
        "watched {} and unwatched {} with three more directories:\n{}",
        watched(),
        unwatched(),
        daemon.log()
    );
    assert!(
        wait_for(PATIENCE, || daemon.log().matches("out of inotify watches").count() == 2),
        "{}",
        daemon.log()
    );
    assert!(
        daemon.log().contains("out of inotify watches: 3 of 66 managed paths (in 3 directories)"),
        "{}",
        daemon.log()
    );
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
}

/// The soft and hard limits on open files of a process, as `/proc/PID/limits` says them.
fn open_files_limits(pid: &str) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).expect("a line for open files");
    let mut words = line["Max open files".len()..].split_whitespace();
    (words.next().unwrap().to_owned(), words.next().unwrap().to_owned())
}

/// Issue 45, point 8: the daemon raises its own soft limit on open files to the hard limit,
/// so one started from a shell (or by prlimit(1), as here, at 256) is not starved of
/// descriptors, and says the values once in its log.
#[test]
fn the_daemon_raises_its_soft_open_files_limit_to_the_hard_limit() {
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "file", "id": "a.conf", "path": s.p("a.conf"), "content": "x\n"}]));
    let (_, hard) = open_files_limits("self");
    assert_ne!(hard, "256", "the test needs a hard limit above the soft one it sets");
    let daemon = Daemon::launch_under(&["prlimit", "--nofile=256:"], &s, &d, &[], &[]);
    let pid = daemon.child.as_ref().unwrap().id().to_string();
    // /healthz answered, so the daemon is past its start, where the limit is raised.
    assert_eq!(open_files_limits(&pid), (hard.clone(), hard.clone()), "{}", daemon.log());
    let log = daemon.log();
    assert!(
        log.contains(&format!("raised the limit on open files from 256 to {hard}, the hard limit")),
        "{log}"
    );
    assert_eq!(log.matches("limit on open files").count(), 1, "said once: {log}");
}

/// How long a hand-edit may take to be put back and counted in the start-race tests: far
/// above the usual milliseconds on a loaded machine, far below their resync (an hour).
const PROMPTLY: Duration = Duration::from_secs(5);

/// A file in a directory the pass makes, then 1,100 more in another, so that the pass goes on
/// writing after the first is in place: the file, the marker (a file of the pass's second
/// batch of writes, 512 files each, which the pass commits only after it has read back and
/// recorded the first), and the resources. The rest of the pass after the marker (the rest of
/// that batch and a third) is a bound on how soon the edit can be put back: a full pass is not
/// interrupted.
fn race_declaration(s: &Scratch) -> (std::path::PathBuf, std::path::PathBuf, Vec<serde_json::Value>) {
    let mut resources =
        vec![json!({"type": "file", "id": "race.app", "path": s.p("made/app.conf"), "content": "port=80\n"})];
    for i in 0..1100 {
        resources.push(json!({"type": "file", "id": format!("race.f{i}"), "path": s.p(&format!("fill/f{i}")), "content": "x"}));
    }
    (s.path("made/app.conf"), s.path("fill/f600"), resources)
}

/// Edits `conf` by hand the moment `marker` exists (polled in a tight loop, for up to a
/// minute); whether it did, and whether `conf` held the declared bytes just before.
fn edit_when(marker: std::path::PathBuf, conf: std::path::PathBuf) -> std::thread::JoinHandle<(bool, bool)> {
    std::thread::spawn(move || {
        let start = std::time::Instant::now();
        while !marker.exists() {
            if start.elapsed() > Duration::from_secs(60) {
                return (false, false);
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        let was = read(&conf) == "port=80\n";
        std::fs::write(&conf, "port=6666\n").unwrap();
        (true, was)
    })
}

/// Waits for the edit of `edit_when` to be put back and counted as drift, promptly.
fn put_back_promptly(daemon: &Daemon, conf: &std::path::Path, edit: std::thread::JoinHandle<(bool, bool)>) {
    // The log without its 1,100 lines of files made.
    let log =
        || daemon.log().lines().filter(|l| !l.contains("INFO created race.f")).collect::<Vec<_>>().join("\n");
    let (edited, was) = edit.join().unwrap();
    assert!(edited, "the pass never wrote the marker:\n{}", log());
    assert!(was, "the file was not in place with its declared bytes when the marker was:\n{}", log());
    assert!(
        wait_for(PROMPTLY, || read(conf) == "port=80\n"),
        "a hand-edit made while the pass that made the file was still running was not put back \
         within {PROMPTLY:?} (it holds {:?}): it waits for the resync\n{}",
        read(conf),
        log()
    );
    let drift = || daemon.metric("mesh_host_drift_corrections_total{type=\"file\"}");
    assert!(wait_for(PROMPTLY, || drift() == 1.0), "the correction is counted once: {}\n{}", drift(), log());
    // The look after the watches were made queued the file edited, not the 1,100 untouched
    // beside it, whose signatures the pass recorded (and the put-back's own events).
    let adds = daemon.metric("mesh_host_queue_adds_total{source=\"file\"}");
    assert!(adds < 50.0, "{adds} keys queued for files: the untouched ones were queued too\n{}", log());
}

/// Issue 46, point 4: a managed file is edited by hand the moment the first pass has written
/// it (in a directory that pass made, so no watch could be there before), while the pass goes
/// on writing others. The daemon watches a path only once its directory exists, after the
/// pass; the edit, made before, must still be put back and counted, promptly, and not left
/// to the resync (an hour here).
#[test]
fn issue46_a_hand_edit_right_after_the_first_pass_wrote_the_file_is_put_back() {
    let s = Scratch::new();
    let (conf, marker, resources) = race_declaration(&s);
    let d = s.declare(serde_json::Value::Array(resources));
    let edit = edit_when(marker, conf.clone());
    let daemon = Daemon::start(&s, &d, &["--resync", "3600"]);
    put_back_promptly(&daemon, &conf, edit);
}

/// Issue 46, point 4, the same after a declaration change adds the path: the pass of the new
/// declaration makes the file's directory, and the edit comes while it goes on.
#[test]
fn issue46_a_hand_edit_right_after_a_new_declaration_wrote_the_file_is_put_back() {
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "file", "id": "race.one", "path": s.p("one"), "content": "1"}]));
    let daemon = Daemon::start(&s, &d, &["--resync", "3600"]);
    let (conf, marker, mut resources) = race_declaration(&s);
    resources.push(json!({"type": "file", "id": "race.one", "path": s.p("one"), "content": "1"}));
    let edit = edit_when(marker, conf.clone());
    s.declare(serde_json::Value::Array(resources));
    put_back_promptly(&daemon, &conf, edit);
}
