//! Full disks, exhausted inodes and read-only filesystems (issue 12's battery): small tmpfs and
//! loop-mounted ext4 filesystems made for each test. An apply that does not fit must fail
//! naming the resource and the cause, exit 1, leave every old file whole, leave no temporary
//! file behind, and the store must not claim what failed. Needs root (mount), as the suite runs.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use sha2::Digest as _;

use crate::support::*;

/// A filesystem mounted for one test, unmounted (lazily, should anything still hold it) when
/// the test ends.
pub struct Mount {
    pub dir: PathBuf,
}

fn sh(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed (these tests need root and mount, as tests/run.sh runs them): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Mount {
    /// A tmpfs with these options (`size=`, `nr_inodes=`) at `dir`.
    fn tmpfs(dir: PathBuf, options: &str) -> Mount {
        std::fs::create_dir_all(&dir).unwrap();
        sh(Command::new("mount").args(["-t", "tmpfs", "-o", options, "tmpfs"]).arg(&dir));
        Mount { dir }
    }

    /// A fresh ext4 of `size` in a sparse image beside `dir`, loop-mounted at `dir`.
    fn ext4(dir: PathBuf, size: &str) -> Mount {
        Mount::ext4_with(dir, size, "")
    }

    /// `ext4`, mounted with these options as well (`noauto_da_alloc`), or none (`""`).
    pub fn ext4_with(dir: PathBuf, size: &str, options: &str) -> Mount {
        std::fs::create_dir_all(&dir).unwrap();
        let image = dir.with_extension("img");
        sh(Command::new("truncate").args(["-s", size]).arg(&image));
        sh(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image));
        let options = if options.is_empty() { "loop".to_owned() } else { format!("loop,{options}") };
        sh(Command::new("mount").args(["-o", &options]).arg(&image).arg(&dir));
        Mount { dir }
    }

    fn remount(&self, options: &str) {
        sh(Command::new("mount").args(["-o", &format!("remount,{options}")]).arg(&self.dir));
    }

    fn p(&self, rel: &str) -> String {
        self.dir.join(rel).display().to_string()
    }

    /// Fills what space is left with one file, `filler`.
    fn fill(&self) {
        let _ = Command::new("dd")
            .args(["if=/dev/zero", "bs=64k", "status=none"])
            .arg(format!("of={}", self.dir.join("filler").display()))
            .stderr(std::process::Stdio::null())
            .status();
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", sha2::Sha256::digest(bytes))
}

/// Every `.NAME.mesh-host-*` file under `dir`.
fn temporary_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if e.file_type().unwrap().is_dir() {
                todo.push(e.path());
            } else if name.starts_with('.') && name.contains(".mesh-host-") {
                found.push(e.path());
            }
        }
    }
    found
}

/// The store's records, by id.
fn records(s: &Scratch) -> BTreeMap<String, Value> {
    let store: Value = serde_json::from_slice(&std::fs::read(s.state()).unwrap()).unwrap();
    store["records"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Checks that no record of a file says the machine holds what it does not.
fn assert_no_record_ahead(s: &Scratch) {
    for (id, rec) in records(s) {
        if rec["type"] != "file" {
            continue;
        }
        let path = Path::new(rec["target"].as_str().unwrap());
        let held = std::fs::read(path).map(|b| sha256(&b)).unwrap_or_else(|_| "absent".into());
        assert_eq!(
            rec["wrote"].as_str(),
            Some(held.as_str()),
            "the record of {id} claims what {path:?} does not hold"
        );
        let mode = std::fs::metadata(path).unwrap().mode() & 0o7777;
        assert_eq!(
            rec["mode"].as_u64(),
            Some(u64::from(mode)),
            "the record of {id} claims a mode {path:?} does not have"
        );
    }
}

fn failed_ids(report: &Value) -> Vec<String> {
    report["error"]["failures"]
        .as_array()
        .map(|f| f.iter().map(|f| f["id"].as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

fn failure_message(report: &Value, id: &str) -> String {
    report["error"]["failures"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["id"] == id))
        .map(|f| f["message"].as_str().unwrap().to_owned())
        .unwrap_or_else(|| panic!("{id} did not fail: {report:#}"))
}

/// Three small files, then a declaration where they change and a big one is added that cannot
/// fit: what a full disk must leave. Returns the report of the apply that did not fit.
fn full_disk(m: &Mount, s: &Scratch) -> Value {
    let old = s.declare(json!([
        {"type": "directory", "id": "full.dir", "path": m.p("app")},
        {"type": "file", "id": "full.a", "path": m.p("app/a.conf"), "content": "old a\n"},
        {"type": "file", "id": "full.b", "path": m.p("app/b.conf"), "content": "old b\n"},
        {"type": "file", "id": "full.c", "path": m.p("app/c.conf"), "content": "old c\n"},
    ]));
    let (code, report) = s.apply(&old);
    assert_eq!(code, 0, "{report:#}");
    let big = "y".repeat(4 << 20);
    let new = s.declare(json!([
        {"type": "directory", "id": "full.dir", "path": m.p("app")},
        {"type": "file", "id": "full.a", "path": m.p("app/a.conf"), "content": "new a\n"},
        {"type": "file", "id": "full.big", "path": m.p("app/big.bin"), "content": big},
        {"type": "file", "id": "full.b", "path": m.p("app/b.conf"), "content": "new b\n"},
        {"type": "file", "id": "full.c", "path": m.p("app/c.conf"), "content": "new c\n", "mode": "0600"},
    ]));
    let (code, report) = s.apply(&new);
    assert_eq!(code, 1, "an apply that does not fit fails: {report:#}");
    report
}

fn assert_full_disk_failed_cleanly(m: &Mount, s: &Scratch, report: &Value) {
    let message = failure_message(report, "full.big");
    assert!(
        message.contains("big.bin") && message.contains("No space left on device"),
        "the failure names the file and the cause: {message}"
    );
    assert!(!m.dir.join("app/big.bin").exists(), "nothing at the path of what did not fit");
    // Each small file holds its old content or its new one, whole; one that failed, the old.
    for (name, id) in [("a", "full.a"), ("b", "full.b"), ("c", "full.c")] {
        let held = std::fs::read_to_string(m.dir.join(format!("app/{name}.conf"))).unwrap();
        assert!(
            held == format!("old {name}\n") || held == format!("new {name}\n"),
            "{name}.conf is torn: {held:?}"
        );
        if failed_ids(report).iter().any(|f| f == id) {
            assert_eq!(held, format!("old {name}\n"), "{id} failed and keeps its old content");
        }
    }
    assert!(!records(s).contains_key("full.big"), "the store does not claim the file that failed");
    assert_no_record_ahead(s);
}

#[test]
fn a_full_tmpfs_fails_the_resource_and_keeps_old_files_whole() {
    let s = Scratch::new();
    let m = Mount::tmpfs(s.path("mnt"), "size=1m");
    let report = full_disk(&m, &s);
    assert_full_disk_failed_cleanly(&m, &s, &report);
}

#[test]
fn a_full_ext4_fails_the_resource_and_keeps_old_files_whole() {
    let s = Scratch::new();
    let m = Mount::ext4(s.path("mnt"), "3M");
    m.fill();
    // Room for the small files again, not for the big one.
    let filler = m.dir.join("filler");
    let len = std::fs::metadata(&filler).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&filler)
        .unwrap()
        .set_len(len.saturating_sub(256 << 10))
        .unwrap();
    let report = full_disk(&m, &s);
    assert_full_disk_failed_cleanly(&m, &s, &report);
}

#[test]
fn a_full_disk_leaves_no_temporary_files_fault7() {
    let s = Scratch::new();
    let m = Mount::tmpfs(s.path("mnt"), "size=1m");
    let _ = full_disk(&m, &s);
    let left = temporary_files(&m.dir);
    assert!(left.is_empty(), "temporary files left on the full disk: {left:?}");
}

#[test]
fn a_full_disk_under_the_store_keeps_the_previous_store_and_no_temporary_file_fault7() {
    let s = Scratch::new();
    let m = Mount::tmpfs(s.path("state"), "size=256k");
    let resources = |content: &str| {
        let mut r =
            vec![json!({"type": "file", "id": "st.a", "path": s.p("tree/a.conf"), "content": content})];
        for i in 0..200 {
            r.push(
                json!({"type": "directory", "id": format!("st.d{i}"), "path": s.p(&format!("tree/d{i}"))}),
            );
        }
        serde_json::Value::Array(r)
    };
    assert_eq!(s.apply(&s.declare(resources("one\n"))).0, 0);
    let before = std::fs::read(s.state()).unwrap();
    m.fill();

    let (code, report) = s.apply(&s.declare(resources("two\n")));
    assert_eq!(code, 1, "a state directory that cannot be written fails the apply: {report:#}");
    // The journal of intent, beside the store, is written before any file: with no room for
    // it, the file is not written either (the host writes nothing it could not account for).
    let message = failure_message(&report, "st.a");
    assert!(
        message.contains("No space left on device") && message.contains("state.json.journal"),
        "{message}"
    );
    assert_eq!(
        std::fs::read(s.path("tree/a.conf")).unwrap(),
        b"one\n",
        "nothing it could not record was written"
    );
    assert_eq!(std::fs::read(s.state()).unwrap(), before, "the previous store is intact");
    assert!(s.run(&["status", "--json"]).status.success(), "and readable");
    let left = temporary_files(&m.dir);

    // With room again, the next apply does what the failed one could not.
    std::fs::remove_file(m.dir.join("filler")).unwrap();
    let (code, report) = s.apply(&s.declare(resources("two\n")));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "st.a"), "updated", "{report:#}");
    assert_no_record_ahead(&s);
    assert!(left.is_empty(), "temporary files left beside the store on a full disk: {left:?}");
}

#[test]
fn inode_exhaustion_fails_the_resource_keeps_old_files_whole_and_leaves_no_temporary_files() {
    let s = Scratch::new();
    // The root directory, `app` and its three files, and three to spare.
    let m = Mount::tmpfs(s.path("mnt"), "size=8m,nr_inodes=8");
    let mut resources = vec![json!({"type": "directory", "id": "ino.dir", "path": m.p("app")})];
    for name in ["a", "b", "c"] {
        resources.push(json!({"type": "file", "id": format!("ino.{name}"), "path": m.p(&format!("app/{name}.conf")), "content": format!("old {name}\n")}));
    }
    assert_eq!(s.apply(&s.declare(Value::Array(resources))).0, 0);

    let mut resources = vec![json!({"type": "directory", "id": "ino.dir", "path": m.p("app")})];
    for name in ["a", "b", "c"] {
        resources.push(json!({"type": "file", "id": format!("ino.{name}"), "path": m.p(&format!("app/{name}.conf")), "content": format!("new {name}\n")}));
    }
    for i in 0..10 {
        resources.push(json!({"type": "file", "id": format!("ino.n{i}"), "path": m.p(&format!("app/n{i}.conf")), "content": "n\n"}));
    }
    let (code, report) = s.apply(&s.declare(Value::Array(resources)));
    assert_eq!(code, 1, "{report:#}");
    let failed = failed_ids(&report);
    assert!(!failed.is_empty());
    for id in &failed {
        let message = failure_message(&report, id);
        let name = id.strip_prefix("ino.").unwrap();
        assert!(
            message.contains(&format!("{name}.conf")) && message.contains("No space left on device"),
            "{id}: {message}"
        );
    }
    for name in ["a", "b", "c"] {
        let held = std::fs::read_to_string(m.dir.join(format!("app/{name}.conf"))).unwrap();
        let id = format!("ino.{name}");
        if failed.contains(&id) {
            assert_eq!(held, format!("old {name}\n"), "{id} failed and keeps its old content");
        } else {
            assert_eq!(held, format!("new {name}\n"));
        }
    }
    for i in 0..10 {
        let path = m.dir.join(format!("app/n{i}.conf"));
        let id = format!("ino.n{i}");
        assert_eq!(path.exists(), !failed.contains(&id), "{id}");
        assert_eq!(
            records(&s).contains_key(&id),
            !failed.contains(&id),
            "the record of {id} follows the fact"
        );
    }
    assert_no_record_ahead(&s);
    let left = temporary_files(&m.dir);
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

#[test]
fn a_read_only_filesystem_fails_each_resource_naming_it_and_changes_nothing() {
    let s = Scratch::new();
    let m = Mount::tmpfs(s.path("mnt"), "size=4m");
    let old = s.declare(json!([
        {"type": "directory", "id": "ro.dir", "path": m.p("app"), "mode": "0755"},
        {"type": "file", "id": "ro.content", "path": m.p("app/content.conf"), "content": "old\n"},
        {"type": "file", "id": "ro.mode", "path": m.p("app/mode.conf"), "content": "same\n", "mode": "0644"},
    ]));
    assert_eq!(s.apply(&old).0, 0);
    let store_before = std::fs::read(s.state()).unwrap();
    m.remount("ro");
    let new = s.declare(json!([
        {"type": "directory", "id": "ro.dir", "path": m.p("app"), "mode": "0700"},
        {"type": "file", "id": "ro.content", "path": m.p("app/content.conf"), "content": "new\n"},
        {"type": "file", "id": "ro.mode", "path": m.p("app/mode.conf"), "content": "same\n", "mode": "0600"},
        {"type": "file", "id": "ro.new", "path": m.p("app/new.conf"), "content": "new\n"},
        {"type": "directory", "id": "ro.newdir", "path": m.p("app/sub")},
    ]));
    let (code, report) = s.apply(&new);
    assert_eq!(code, 1, "{report:#}");
    let mut failed = failed_ids(&report);
    failed.sort();
    assert_eq!(
        failed,
        ["ro.content", "ro.dir", "ro.mode", "ro.new", "ro.newdir"],
        "every resource fails: {report:#}"
    );
    for (id, path) in [
        ("ro.dir", "app"),
        ("ro.content", "content.conf"),
        ("ro.mode", "mode.conf"),
        ("ro.new", "new.conf"),
        ("ro.newdir", "sub"),
    ] {
        let message = failure_message(&report, id);
        assert!(message.contains(path) && message.contains("Read-only file system"), "{id}: {message}");
    }
    assert_eq!(std::fs::read_to_string(m.dir.join("app/content.conf")).unwrap(), "old\n");
    assert_eq!(mode_of(&m.dir.join("app/mode.conf")), 0o644);
    assert_eq!(mode_of(&m.dir.join("app")), 0o755);
    assert!(!m.dir.join("app/new.conf").exists() && !m.dir.join("app/sub").exists());
    let after: Value = serde_json::from_slice(&std::fs::read(s.state()).unwrap()).unwrap();
    let before: Value = serde_json::from_slice(&store_before).unwrap();
    for id in ["ro.dir", "ro.content", "ro.mode"] {
        let (b, a) = (&before["records"][id], &after["records"][id]);
        for field in ["wrote", "mode", "declared"] {
            assert_eq!(
                a[field], b[field],
                "the record of {id} keeps its {field}: the store claims nothing that failed"
            );
        }
    }
    assert!(after["records"].get("ro.new").is_none() && after["records"].get("ro.newdir").is_none());

    // Writable again: the same declaration converges as updates, not corrections.
    m.remount("rw");
    let (code, report) = s.apply(&new);
    assert_eq!(code, 0, "{report:#}");
    for id in ["ro.dir", "ro.content", "ro.mode"] {
        assert_eq!(action(&report, id), "updated", "{report:#}");
    }
    assert!(temporary_files(&m.dir).is_empty());
}

#[test]
fn a_read_only_store_directory_fails_before_anything_is_touched() {
    let s = Scratch::new();
    let d = |content: &str| {
        s.declare(json!([{"type": "file", "id": "rs.a", "path": s.p("tree/a.conf"), "content": content}]))
    };
    let m = Mount::tmpfs(s.path("state"), "size=1m");
    assert_eq!(s.apply(&d("one\n")).0, 0);
    let before = std::fs::read(s.state()).unwrap();
    m.remount("ro");
    let out = s.run(&["apply", d("two\n").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Read-only file system") && err.contains(&s.p("state")), "{err}");
    assert_eq!(std::fs::read_to_string(s.path("tree/a.conf")).unwrap(), "one\n", "nothing applied");
    assert_eq!(std::fs::read(s.state()).unwrap(), before);
}
