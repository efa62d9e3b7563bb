//! Link, traversal, archive and race attacks (issue 12's battery). Each plants something hostile
//! where the host will look, applies through the real binary, and checks that nothing outside
//! the declared paths changed: a sentinel tree beside the scratch's managed paths is snapshotted
//! byte for byte, with mode, owner and inode of every entry, before and after.
//!
//! Tests named after a fault (`fault1`, `fault2`, `fault3`) are the regression tests of issue 12
//! and fail until that fault is fixed.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use crate::support::*;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// What one entry of the sentinel tree is: kind, bytes or link target, mode, owner, inode.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    kind: &'static str,
    bytes: Option<Vec<u8>>,
    link: Option<PathBuf>,
    mode: u32,
    uid: u32,
    gid: u32,
    ino: u64,
}

fn snapshot(root: &Path) -> BTreeMap<PathBuf, Entry> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_owned()];
    while let Some(path) = todo.pop() {
        let m = std::fs::symlink_metadata(&path).unwrap();
        let ft = m.file_type();
        let kind = if ft.is_dir() {
            "directory"
        } else if ft.is_file() {
            "file"
        } else if ft.is_symlink() {
            "symlink"
        } else {
            "other"
        };
        if ft.is_dir() {
            for e in std::fs::read_dir(&path).unwrap() {
                todo.push(e.unwrap().path());
            }
        }
        out.insert(
            path.clone(),
            Entry {
                kind,
                bytes: ft.is_file().then(|| std::fs::read(&path).unwrap()),
                link: ft.is_symlink().then(|| std::fs::read_link(&path).unwrap()),
                mode: m.permissions().mode() & 0o7777,
                uid: m.uid(),
                gid: m.gid(),
                ino: m.ino(),
            },
        );
    }
    out
}

/// A tree outside every declared path, the thing each attack tries to reach: a shadow-like
/// file, an etc directory with files, an empty directory.
struct Sentinel {
    root: PathBuf,
    before: BTreeMap<PathBuf, Entry>,
}

impl Sentinel {
    fn new(s: &Scratch) -> Sentinel {
        let root = s.path("outside");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::create_dir_all(root.join("empty")).unwrap();
        std::fs::write(root.join("shadow"), "root:$6$secret:19000::::::\n").unwrap();
        std::fs::set_permissions(root.join("shadow"), std::fs::Permissions::from_mode(0o640)).unwrap();
        std::fs::write(root.join("etc/passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
        std::fs::write(root.join("etc/x.conf"), "the operator's x.conf\n").unwrap();
        std::fs::set_permissions(root.join("empty"), std::fs::Permissions::from_mode(0o700)).unwrap();
        let before = snapshot(&root);
        Sentinel { root, before }
    }

    fn p(&self, rel: &str) -> String {
        self.root.join(rel).display().to_string()
    }

    fn assert_unchanged(&self) {
        let after = snapshot(&self.root);
        for (path, was) in &self.before {
            match after.get(path) {
                None => panic!("{} was removed", path.display()),
                Some(now) => {
                    let meta =
                        |e: &Entry| (e.kind, e.link.clone(), format!("{:04o}", e.mode), e.uid, e.gid, e.ino);
                    assert_eq!(
                        meta(now),
                        meta(was),
                        "{} changed: (kind, link, mode, uid, gid, inode)",
                        path.display()
                    );
                    assert!(now.bytes == was.bytes, "the bytes of {} changed", path.display());
                }
            }
        }
        let added: Vec<_> = after.keys().filter(|p| !self.before.contains_key(*p)).collect();
        assert!(added.is_empty(), "made outside the declared paths: {added:?}");
    }
}

/// `apply --json`, killed and failed if it has not ended within `limit` (some attacks are hangs).
/// Returns the exit status and the report (`Null` when none was printed).
fn apply_within(s: &Scratch, declaration: &Path, limit: Duration) -> (ExitStatus, Value) {
    let out = s.path(&format!("apply-{}.out", std::process::id()));
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("mesh-host"))
        .arg("--state")
        .arg(s.state())
        .args(["apply", "--json"])
        .arg(declaration)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("apply did not end within {limit:?}: it hangs");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let report = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap_or(Value::Null);
    (status, report)
}

const LIMIT: Duration = Duration::from_secs(20);

/// Applies and expects the apply to fail (exit 1, with a report) with a message about `id`
/// containing every one of `says`.
fn apply_fails(s: &Scratch, declaration: &Path, id: &str, says: &[&str]) -> Value {
    let (status, report) = apply_within(s, declaration, LIMIT);
    assert_eq!(status.code(), Some(1), "the apply fails that resource, and only fails: {status}; {report:#}");
    let failures = report["error"]["failures"].as_array().expect("a report with failures");
    let message = failures
        .iter()
        .find(|f| f["id"] == id)
        .and_then(|f| f["message"].as_str())
        .unwrap_or_else(|| panic!("{id} did not fail: {report:#}"));
    for word in says {
        assert!(message.contains(word), "the failure of {id} says {word:?}: {message}");
    }
    report
}

fn symlink(target: impl AsRef<Path>, at: impl AsRef<Path>) {
    std::os::unix::fs::symlink(target, at).unwrap();
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

fn mknod(path: &Path, args: &[&str]) {
    let status = Command::new("mknod").arg(path).args(args).status().unwrap();
    assert!(status.success(), "mknod {} {args:?} (needs root)", path.display());
}

// ---- Links at and above managed paths -------------------------------------------------------

#[test]
fn symlink_at_a_managed_file_is_refused() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    symlink(out.root.join("shadow"), s.path("app.conf"));
    let d = s.declare(json!([{"type": "file", "id": "a.conf", "path": s.p("app.conf"), "content": "pwned", "mode": "0666"}]));
    apply_fails(&s, &d, "a.conf", &["symlink"]);
    out.assert_unchanged();
}

#[test]
fn relative_symlink_at_a_managed_file_is_refused() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    std::fs::create_dir(s.path("app")).unwrap();
    symlink("../outside/shadow", s.path("app/app.conf"));
    let d =
        s.declare(json!([{"type": "file", "id": "a.conf", "path": s.p("app/app.conf"), "content": "pwned"}]));
    apply_fails(&s, &d, "a.conf", &["symlink"]);
    out.assert_unchanged();
}

#[test]
fn symlink_at_a_managed_directory_is_refused() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    symlink(out.root.join("empty"), s.path("data"));
    let d = s.declare(json!([
        {"type": "directory", "id": "a.data", "path": s.p("data"), "mode": "0777"},
        {"type": "file", "id": "a.inside", "path": s.p("data/inside"), "content": "pwned"},
    ]));
    apply_fails(&s, &d, "a.data", &["symlink"]);
    out.assert_unchanged();
}

#[test]
fn symlink_in_a_parent_is_refused() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    symlink(out.root.join("etc"), s.path("conf.d"));
    let d = s.declare(json!([
        {"type": "file", "id": "a.passwd", "path": s.p("conf.d/passwd"), "content": "pwned"},
        {"type": "file", "id": "a.new", "path": s.p("conf.d/new.conf"), "content": "pwned"},
        {"type": "directory", "id": "a.sub", "path": s.p("conf.d/sub")},
    ]));
    apply_fails(&s, &d, "a.passwd", &["symlink", "conf.d"]);
    out.assert_unchanged();
}

#[test]
fn symlink_in_a_grandparent_is_refused() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    std::fs::create_dir(s.path("srv")).unwrap();
    symlink("../outside", s.path("srv/app"));
    let d = s.declare(json!([
        {"type": "directory", "id": "a.etc", "path": s.p("srv/app/etc"), "mode": "0700"},
        {"type": "file", "id": "a.x", "path": s.p("srv/app/etc/x.conf"), "content": "pwned", "mode": "0600"},
        {"type": "file", "id": "a.deep", "path": s.p("srv/app/etc/new/deep.conf"), "content": "pwned"},
    ]));
    apply_fails(&s, &d, "a.x", &["symlink"]);
    out.assert_unchanged();
}

// ---- Hard links: a managed path that is another name of a file outside ----------------------

/// The managed path is a hard link to the sentinel's shadow file, holding the same bytes.
fn hard_link_to_shadow(s: &Scratch, out: &Sentinel) -> PathBuf {
    let managed = s.path("app.conf");
    std::fs::hard_link(out.root.join("shadow"), &managed).unwrap();
    managed
}

#[test]
fn hard_link_mode_does_not_reach_the_outside_file_fault3() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let managed = hard_link_to_shadow(&s, &out);
    let content = std::fs::read_to_string(&managed).unwrap();
    let d = s.declare(json!([{"type": "file", "id": "a.conf", "path": s.p("app.conf"), "content": content, "mode": "0644"}]));
    let (status, report) = apply_within(&s, &d, LIMIT);
    assert_eq!(status.code(), Some(0), "{report:#}");
    assert_eq!(mode_of(&managed), 0o644);
    out.assert_unchanged();
}

#[test]
fn hard_link_owner_does_not_reach_the_outside_file_fault3() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let managed = hard_link_to_shadow(&s, &out);
    let content = std::fs::read_to_string(&managed).unwrap();
    let d = s.declare(json!([{"type": "file", "id": "a.conf", "path": s.p("app.conf"), "content": content, "mode": "0640", "owner": "nobody:nogroup"}]));
    let (status, report) = apply_within(&s, &d, LIMIT);
    assert_eq!(status.code(), Some(0), "{report:#}");
    assert_eq!(std::fs::metadata(&managed).unwrap().uid(), 65534);
    out.assert_unchanged();
}

#[test]
fn hard_link_with_new_content_is_replaced_not_written_through() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let managed = hard_link_to_shadow(&s, &out);
    let d = s.declare(json!([{"type": "file", "id": "a.conf", "path": s.p("app.conf"), "content": "mesh\n", "mode": "0600"}]));
    let (status, report) = apply_within(&s, &d, LIMIT);
    assert_eq!(status.code(), Some(0), "{report:#}");
    assert_eq!(std::fs::read_to_string(&managed).unwrap(), "mesh\n");
    assert_ne!(
        std::fs::metadata(&managed).unwrap().ino(),
        std::fs::metadata(out.root.join("shadow")).unwrap().ino()
    );
    out.assert_unchanged();
}

// ---- Special files at managed paths ------------------------------------------------------------

/// Something that is not a regular file or directory sits at a managed path: the apply fails
/// that resource at once, naming it, and leaves the thing exactly as it was (same inode, mode,
/// owner).
fn special_is_left_alone(s: &Scratch, out: &Sentinel, at: &Path, decl: &Path, id: &str) {
    let before = std::fs::symlink_metadata(at).unwrap();
    apply_fails(s, decl, id, &[&at.file_name().unwrap().to_string_lossy()]);
    let after = std::fs::symlink_metadata(at).unwrap();
    assert_eq!(
        (after.ino(), after.mode(), after.uid(), after.gid(), after.rdev()),
        (before.ino(), before.mode(), before.uid(), before.gid(), before.rdev()),
        "{} was left as it was",
        at.display()
    );
    out.assert_unchanged();
}

#[test]
fn fifo_at_a_managed_file_is_refused_without_hanging() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let at = s.path("app.conf");
    mkfifo(&at);
    let d = s.declare(
        json!([{"type": "file", "id": "a.conf", "path": s.p("app.conf"), "content": "x", "mode": "0644"}]),
    );
    special_is_left_alone(&s, &out, &at, &d, "a.conf");
}

#[test]
fn fifo_at_a_managed_directory_is_refused() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let at = s.path("data");
    mkfifo(&at);
    let d = s.declare(json!([{"type": "directory", "id": "a.data", "path": s.p("data"), "mode": "0755"}]));
    special_is_left_alone(&s, &out, &at, &d, "a.data");
}

#[test]
fn character_device_at_a_managed_file_is_left_alone() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    // The node of /dev/zero: reading it would never end.
    let at = s.path("app.conf");
    mknod(&at, &["c", "1", "5"]);
    let d = s.declare(
        json!([{"type": "file", "id": "a.conf", "path": s.p("app.conf"), "content": "x", "mode": "0666"}]),
    );
    special_is_left_alone(&s, &out, &at, &d, "a.conf");
}

#[test]
fn block_device_at_a_managed_file_is_left_alone() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let at = s.path("disk.img");
    mknod(&at, &["b", "7", "250"]);
    let d = s.declare(
        json!([{"type": "file", "id": "a.disk", "path": s.p("disk.img"), "content": "x", "mode": "0666"}]),
    );
    special_is_left_alone(&s, &out, &at, &d, "a.disk");
}

#[test]
fn socket_at_a_managed_file_is_left_alone() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let at = s.path("app.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&at).unwrap();
    let d = s.declare(
        json!([{"type": "file", "id": "a.sock", "path": s.p("app.sock"), "content": "x", "mode": "0600"}]),
    );
    special_is_left_alone(&s, &out, &at, &d, "a.sock");
}

// ---- Archives ----------------------------------------------------------------------------------

/// One tar entry, its name and link name written raw, so that hostile ones can be made.
enum T<'a> {
    File(&'a str, &'a [u8]),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    HardLink(&'a str, &'a str),
    Fifo(&'a str),
    CharDevice(&'a str),
}

fn tar_of(entries: &[T<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let (name, kind, link, data): (&str, tar::EntryType, &str, &[u8]) = match e {
            T::File(n, d) => (n, tar::EntryType::Regular, "", d),
            T::Dir(n) => (n, tar::EntryType::Directory, "", b""),
            T::Symlink(n, l) => (n, tar::EntryType::Symlink, l, b""),
            T::HardLink(n, l) => (n, tar::EntryType::Link, l, b""),
            T::Fifo(n) => (n, tar::EntryType::Fifo, "", b""),
            T::CharDevice(n) => (n, tar::EntryType::Char, "", b""),
        };
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_size(data.len() as u64);
        h.set_mode(if matches!(e, T::Dir(_)) { 0o755 } else { 0o644 });
        h.set_entry_type(kind);
        if let T::CharDevice(_) = e {
            h.set_device_major(1).unwrap();
            h.set_device_minor(5).unwrap();
        }
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

fn archive(s: &Scratch, path: &str, bytes: &[u8]) -> PathBuf {
    s.declare(json!([{"type": "archive", "id": "a.dist", "path": s.p(path), "bytes": b64(bytes)}]))
}

/// The archive is refused whole: the apply fails it, nothing is unpacked, nothing outside moved.
fn archive_refused(s: &Scratch, out: &Sentinel, bytes: &[u8], says: &[&str]) {
    apply_fails(s, &archive(s, "dist", bytes), "a.dist", says);
    let unpacked: Vec<_> = std::fs::read_dir(s.path("dist"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(unpacked.is_empty(), "nothing is unpacked from a refused archive: {unpacked:?}");
    out.assert_unchanged();
}

#[test]
fn archive_entry_with_dotdot_is_refused() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let bytes = tar_of(&[T::File("fine", b"ok"), T::File("../outside/etc/passwd", b"pwned")]);
    archive_refused(&s, &out, &bytes, &["outside"]);
}

#[test]
fn archive_entry_with_dotdot_inside_its_name_is_refused() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let bytes = tar_of(&[T::Dir("a/"), T::File("a/b/../../../outside/new", b"pwned")]);
    archive_refused(&s, &out, &bytes, &["outside"]);
}

#[test]
fn archive_absolute_entry_is_refused() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let name = out.p("etc/passwd");
    let bytes = tar_of(&[T::File("fine", b"ok"), T::File(&name, b"pwned")]);
    archive_refused(&s, &out, &bytes, &["outside"]);
}

#[test]
fn archive_symlink_then_an_entry_through_it_stays_inside() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let etc = out.p("etc");
    let bytes =
        tar_of(&[T::Symlink("link", &etc), T::File("link/passwd", b"pwned"), T::File("link/new", b"pwned")]);
    let _ = apply_within(&s, &archive(&s, "dist", &bytes), LIMIT);
    out.assert_unchanged();
}

#[test]
fn archive_relative_symlink_up_then_an_entry_through_it_stays_inside() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let bytes =
        tar_of(&[T::Symlink("up", "../outside"), T::Dir("up/etc/"), T::File("up/etc/passwd", b"pwned")]);
    let _ = apply_within(&s, &archive(&s, "dist", &bytes), LIMIT);
    out.assert_unchanged();
}

#[test]
fn archive_symlink_and_file_of_the_same_name_never_write_through() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let shadow = out.p("shadow");
    for entries in [
        vec![T::Symlink("conf", &shadow), T::File("conf", b"pwned")],
        vec![T::File("conf", b"pwned"), T::Symlink("conf", &shadow)],
    ] {
        let _ = apply_within(&s, &archive(&s, "dist", &tar_of(&entries)), LIMIT);
        out.assert_unchanged();
        // And once more: a second apply finds the link the first may have left.
        let _ = apply_within(&s, &archive(&s, "dist", &tar_of(&[T::File("conf", b"pwned again")])), LIMIT);
        out.assert_unchanged();
    }
}

#[test]
fn archive_hard_link_to_an_absolute_path_outside_is_refused() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let shadow = out.p("shadow");
    let bytes = tar_of(&[T::File("fine", b"ok"), T::HardLink("h", &shadow)]);
    archive_refused(&s, &out, &bytes, &["outside"]);
}

#[test]
fn archive_hard_link_with_dotdot_is_refused() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let bytes = tar_of(&[T::HardLink("h", "../outside/shadow")]);
    archive_refused(&s, &out, &bytes, &["outside"]);
}

#[test]
fn archive_hard_link_to_its_own_symlink_does_not_reach_outside() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let shadow = out.p("shadow");
    let bytes = tar_of(&[T::Symlink("s", &shadow), T::HardLink("h", "s"), T::File("f", b"ok")]);
    let _ = apply_within(&s, &archive(&s, "dist", &bytes), LIMIT);
    out.assert_unchanged();
}

#[test]
fn archive_device_and_fifo_entries_are_refused() {
    for entry in [T::CharDevice("zero"), T::Fifo("pipe")] {
        let s = Scratch::new();
        let out = Sentinel::new(&s);
        archive_refused(&s, &out, &tar_of(&[T::File("fine", b"ok"), entry]), &["does not unpack"]);
    }
}

#[test]
fn archive_into_a_symlinked_directory_is_refused() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    symlink(out.root.join("etc"), s.path("dist"));
    let bytes = tar_of(&[T::File("passwd", b"pwned"), T::File("new", b"pwned")]);
    apply_fails(&s, &archive(&s, "dist", &bytes), "a.dist", &["dist"]);
    out.assert_unchanged();
}

#[test]
fn archive_entry_through_a_symlink_planted_in_the_target_is_refused() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    std::fs::create_dir(s.path("dist")).unwrap();
    symlink(out.root.join("etc"), s.path("dist/sub"));
    let bytes = tar_of(&[T::File("sub/passwd", b"pwned"), T::File("sub/new", b"pwned")]);
    apply_fails(&s, &archive(&s, "dist", &bytes), "a.dist", &["symlink"]);
    out.assert_unchanged();
}

/// A tar whose one entry's header claims `2^62` bytes, in base-256 as GNU tar writes sizes too
/// large for octal, followed by a few bytes and the end of the archive.
fn forged_tar() -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..4].copy_from_slice(b"huge");
    h[100..108].copy_from_slice(b"0000644\0");
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    // The size field, 12 bytes: a leading 0x80 says base-256, big-endian in the rest.
    h[124] = 0x80;
    h[128..136].copy_from_slice(&(1u64 << 62).to_be_bytes());
    h[136..148].copy_from_slice(b"00000000000\0");
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut bytes = h.to_vec();
    bytes.extend_from_slice(&[b'x'; 512]);
    bytes.extend_from_slice(&[0; 1024]);
    bytes
}

#[test]
fn forged_archive_size_does_not_abort_fault1() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let d = s.declare(json!([
        {"type": "archive", "id": "a.dist", "path": s.p("dist"), "bytes": b64(&forged_tar())},
        {"type": "file", "id": "a.after", "path": s.p("after.conf"), "content": "x"},
    ]));
    assert!(s.run(&["check", d.to_str().unwrap()]).status.success(), "the declaration itself is fine");
    let (status, report) = apply_within(&s, &d, LIMIT);
    assert_eq!(
        status.code(),
        Some(1),
        "the forged archive fails its resource, it does not abort the agent: {status}"
    );
    assert_eq!(report["error"]["resource"], "a.dist", "{report:#}");
    assert_eq!(action(&report, "a.after"), "created", "and the rest is applied");
    out.assert_unchanged();
}

#[test]
fn fifo_as_archive_source_does_not_hang_fault2() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let fifo = s.path("dist.tar");
    mkfifo(&fifo);
    let d = s.declare(json!([
        {"type": "archive", "id": "a.dist", "path": s.p("dist"), "source": s.p("dist.tar"), "unverified": true},
        {"type": "file", "id": "a.after", "path": s.p("after.conf"), "content": "x"},
    ]));
    let report = apply_fails(&s, &d, "a.dist", &["dist.tar", "FIFO"]);
    assert_eq!(action(&report, "a.after"), "created");
    out.assert_unchanged();
}

#[test]
fn device_as_archive_source_is_refused_without_reading_it() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let d =
        s.declare(json!([{"type": "archive", "id": "a.dist", "path": s.p("dist"), "source": "/dev/zero", "unverified": true}]));
    apply_fails(&s, &d, "a.dist", &["/dev/zero", "device"]);
    out.assert_unchanged();
}

// ---- Orphans: removal never follows a link planted since ---------------------------------------

#[test]
fn orphan_removal_does_not_follow_a_symlinked_parent() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let d = s.declare(json!([{"type": "file", "id": "a.x", "path": s.p("app/x.conf"), "content": "mesh\n"}]));
    assert_eq!(apply_within(&s, &d, LIMIT).0.code(), Some(0));
    std::fs::rename(s.path("app"), s.path("app.real")).unwrap();
    symlink(out.root.join("etc"), s.path("app"));
    let _ = apply_within(&s, &s.declare(json!([])), LIMIT);
    out.assert_unchanged();
}

#[test]
fn orphan_directory_swapped_for_a_symlink_is_not_removed_through_it() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let d = s.declare(json!([
        {"type": "directory", "id": "a.data", "path": s.p("data")},
        {"type": "file", "id": "a.f", "path": s.p("data/f"), "content": "mesh\n"},
    ]));
    assert_eq!(apply_within(&s, &d, LIMIT).0.code(), Some(0));
    std::fs::remove_file(s.path("data/f")).unwrap();
    std::fs::remove_dir(s.path("data")).unwrap();
    symlink(out.root.join("empty"), s.path("data"));
    let _ = apply_within(&s, &s.declare(json!([])), LIMIT);
    out.assert_unchanged();
}

// ---- Races: a swapper turns paths into links while applies run ----------------------------------

/// Runs `swap` in a loop on its own thread while `applies` applies alternate between the two
/// declarations; then checks the sentinel.
fn race(s: &Scratch, out: &Sentinel, decls: [PathBuf; 2], applies: usize, swap: impl Fn() + Send + 'static) {
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                swap();
                swaps += 1;
            }
            swaps
        })
    };
    let mut outcomes = BTreeMap::new();
    for i in 0..applies {
        let (status, _) = apply_within(s, &decls[i % 2], LIMIT);
        *outcomes.entry(status.code()).or_insert(0) += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 100, "the swapper raced ({swaps} swaps)");
    // Exit codes 0 and 1 only: refused when the link was seen, never a crash.
    assert!(outcomes.keys().all(|c| matches!(c, Some(0) | Some(1))), "{outcomes:?}");
    out.assert_unchanged();
}

fn many_files(s: &Scratch, dir: &str, content: &str, mode: &str) -> PathBuf {
    let mut r = vec![json!({"type": "directory", "id": "race.dir", "path": s.p(dir), "mode": mode})];
    for i in 0..40 {
        r.push(json!({"type": "file", "id": format!("race.f{i}"), "path": s.p(&format!("{dir}/f{i}.conf")), "content": content, "mode": mode}));
    }
    s.declare(Value::Array(r))
}

#[test]
fn swapping_a_parent_for_a_symlink_while_applies_run_writes_nothing_outside() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let a = many_files(&s, "app", "one\n", "0750");
    let a = {
        let p = s.path("a.json");
        std::fs::rename(a, &p).unwrap();
        p
    };
    let b = many_files(&s, "app", "two\n", "0700");
    assert_eq!(apply_within(&s, &a, LIMIT).0.code(), Some(0));
    let (app, away, tmp, etc) = (s.path("app"), s.path("app.away"), s.path("app.tmp"), out.root.join("etc"));
    race(&s, &out, [a, b], 30, move || {
        // The real directory leaves, a link to the outside takes its place, then it comes back.
        if std::fs::rename(&app, &away).is_ok() {
            let _ = std::os::unix::fs::symlink(&etc, &tmp);
            let _ = std::fs::rename(&tmp, &app);
            std::thread::yield_now();
            let _ = std::fs::remove_file(&app);
            let _ = std::fs::rename(&away, &app);
        }
    });
}

#[test]
fn swapping_a_managed_file_for_a_symlink_while_applies_run_writes_nothing_outside() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let decl = |content: &str, mode: &str| {
        s.declare(json!([{"type": "file", "id": "race.f", "path": s.p("f.conf"), "content": content, "mode": mode}]))
    };
    let a = decl("one\n", "0600");
    let a = {
        let p = s.path("a.json");
        std::fs::rename(a, &p).unwrap();
        p
    };
    let b = decl("one\n", "0666");
    assert_eq!(apply_within(&s, &a, LIMIT).0.code(), Some(0));
    let (f, tmp, shadow) = (s.path("f.conf"), s.path("f.tmp"), out.root.join("shadow"));
    race(&s, &out, [a, b], 30, move || {
        let _ = std::os::unix::fs::symlink(&shadow, &tmp);
        let _ = std::fs::rename(&tmp, &f);
        std::thread::yield_now();
        // A regular file again, made without following whatever is at the temporary name.
        let _ = std::fs::remove_file(&tmp);
        if let Ok(mut file) = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp) {
            use std::io::Write as _;
            let _ = file.write_all(b"one\n");
            let _ = std::fs::rename(&tmp, &f);
        }
    });
}

// ---- In place: a chmod or chown lands on the file that was checked, or nowhere ------------------

/// `apply --json` with the failpoint `in-place-pause`, which holds the agent for 300 ms just
/// before it changes a mode or owner in place: the window a racing swapper needs, made wide so
/// that the race is won on every run rather than once in thousands.
fn apply_paused(s: &Scratch, declaration: &Path) -> ExitStatus {
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("mesh-host"))
        .arg("--state")
        .arg(s.state())
        .args(["apply", "--json"])
        .arg(declaration)
        .env("MESH_HOST_FAILPOINT", "in-place-pause")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(start.elapsed() < LIMIT, "apply did not end within {LIMIT:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Issue 45, point 5 (security review F7). The managed file is found with its declared content
/// and another mode and owner, so the host changes them in place. Meanwhile a swapper puts at
/// its name, in turn, the file itself, a hard link to the sentinel's shadow file, and a symlink
/// to it: whatever the name holds when the chmod and chown come, they must reach the file that
/// was checked or nothing. The swapper runs as root, which links any file whatever
/// `fs.protected_hardlinks` says: the attacker that setting does not stop (a container's root
/// in a bind mount; any user where it is 0). Another file renamed in (one name, another inode)
/// is `system::fs`'s own test, `a_file_renamed_in_after_the_check_is_not_changed`.
#[test]
fn an_in_place_chmod_or_chown_never_reaches_a_file_raced_in_by_a_hard_link_or_symlink() {
    let s = Scratch::new();
    let out = Sentinel::new(&s);
    let content = "one\n";
    let d = s.declare(json!([
        {"type": "file", "id": "a.conf", "path": s.p("app.conf"), "content": content, "mode": "0644", "owner": "nobody:nogroup"},
    ]));
    let (managed, tmp, shadow) = (s.path("app.conf"), s.path("swap.tmp"), out.root.join("shadow"));
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, managed, tmp, shadow) = (stop.clone(), managed.clone(), tmp.clone(), shadow.clone());
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            let put = |make: &dyn Fn(&Path) -> std::io::Result<()>| {
                let _ = std::fs::remove_file(&tmp);
                if make(&tmp).is_ok() {
                    let _ = std::fs::rename(&tmp, &managed);
                }
                std::thread::sleep(Duration::from_millis(3));
            };
            // The file as declared but for its mode and owner: what the host changes in place.
            let own = |at: &Path| {
                std::fs::write(at, content)?;
                std::fs::set_permissions(at, std::fs::Permissions::from_mode(0o600))
            };
            while !stop.load(Ordering::Relaxed) {
                put(&own);
                put(&|at| std::fs::hard_link(&shadow, at));
                put(&own);
                put(&|at| std::os::unix::fs::symlink(&shadow, at));
                swaps += 1;
            }
            swaps
        })
    };
    let mut codes = BTreeMap::new();
    for _ in 0..12 {
        *codes.entry(apply_paused(&s, &d).code()).or_insert(0) += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 50, "the swapper raced ({swaps} rounds)");
    assert!(codes.keys().all(|c| matches!(c, Some(0) | Some(1))), "{codes:?}");
    out.assert_unchanged();
}

// ---- Bounded copies and hashes: a huge file planted where the host will write ---------------------

/// Issue 45, point 3 (security review F8). A sparse 100 GiB file, 0640 and owned by nobody, is
/// planted at a managed file's path and at a path an archive unpacks over, before the host
/// first writes either. The apply must neither copy it into `kept/` (which would turn its holes
/// into 100 GiB of real blocks under the state directory) nor hash it (minutes of reading), but
/// record its size, mode and owner beside where the copy would be, say so, and go on: within
/// 20 s, under a limit on the size of any file it writes (`prlimit --fsize`, 64 MiB), so that a
/// build that copies gets SIGXFSZ rather than the machine's disk.
#[test]
fn a_sparse_100_gib_file_at_a_managed_path_is_neither_copied_nor_hashed() {
    const BIG: u64 = 100 << 30;
    let s = Scratch::new();
    let plant = |at: &Path| {
        std::fs::File::create(at).unwrap().set_len(BIG).unwrap();
        std::fs::set_permissions(at, std::fs::Permissions::from_mode(0o640)).unwrap();
        std::os::unix::fs::chown(at, Some(65534), Some(65534)).unwrap();
    };
    std::fs::create_dir(s.path("unpacked")).unwrap();
    plant(&s.path("app.conf"));
    plant(&s.path("unpacked/big.bin"));
    let tar = tar_of(&[T::File("big.bin", b"the archive's\n")]);
    let d = s.declare(json!([
        {"type": "file", "id": "a.conf", "path": s.p("app.conf"), "content": "mesh\n", "mode": "0644"},
        {"type": "archive", "id": "a.tar", "path": s.p("unpacked"), "bytes": b64(&tar)},
    ]));
    let out = s.path("apply.out");
    let mut child = Command::new("prlimit")
        .arg(format!("--fsize={}", 64 << 20))
        .arg("--")
        .arg(assert_cmd::cargo::cargo_bin("mesh-host"))
        .arg("--state")
        .arg(s.state())
        .args(["apply", "--json"])
        .arg(&d)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("apply did not end within 20 s: it reads (hashes or copies) the 100 GiB file");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let report: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap_or(Value::Null);
    assert_eq!(status.code(), Some(0), "{status}: {report:#}");
    assert_eq!(std::fs::read_to_string(s.path("app.conf")).unwrap(), "mesh\n");
    assert_eq!(std::fs::read_to_string(s.path("unpacked/big.bin")).unwrap(), "the archive's\n");

    // Nothing of the bytes under the state directory: its blocks, all of them, under a MiB.
    let kept = s.path("state/kept");
    let mut blocks = 0;
    let mut notes = Vec::new();
    let mut todo = vec![s.path("state")];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            blocks += m.blocks() * 512;
            if m.is_dir() {
                todo.push(e.path());
            } else if e.path().starts_with(&kept) {
                notes.push(e.path());
            }
        }
    }
    assert!(blocks < 1 << 20, "{blocks} bytes of blocks under the state directory");
    notes.sort();
    let app = kept.join(s.path("app.conf").strip_prefix("/").unwrap());
    let big = kept.join(s.path("unpacked/big.bin").strip_prefix("/").unwrap());
    let note_of = |p: &Path| PathBuf::from(format!("{}.not-kept.json", p.display()));
    assert_eq!(notes, [note_of(&app), note_of(&big)], "only a note of each, no copy");
    for at in [&app, &big] {
        let note: Value = serde_json::from_slice(&std::fs::read(note_of(at)).unwrap()).unwrap();
        assert_eq!(note["size"], BIG, "{note:#}");
        assert_eq!(note["mode"], "0640", "{note:#}");
        assert_eq!((note["uid"].as_u64(), note["gid"].as_u64()), (Some(65534), Some(65534)), "{note:#}");
        assert_eq!(note["kept"], false, "{note:#}");
        assert_eq!(note["sha256"], Value::Null, "not hashed either: {note:#}");
        assert!(note["why"].as_str().unwrap().contains("--keep-max-bytes"), "{note:#}");
    }
    let said = |id: &str| {
        report["outcomes"].as_array().unwrap().iter().find(|o| o["id"] == id).unwrap()["detail"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let a = said("a.conf");
    assert!(a.contains("107374182400 bytes") && a.contains("not kept"), "{a}");
    assert!(a.contains(&note_of(&app).display().to_string()), "{a}");
    let t = said("a.tar");
    assert!(t.contains("not kept"), "{t}");

    // `status` lists what was not kept, and where its note is.
    let status = s.run(&["status", "--json"]);
    let listed: Value = serde_json::from_slice(&status.stdout).unwrap();
    let found = listed["kept"].as_array().unwrap();
    assert!(
        found.iter().any(|k| k["path"] == s.p("app.conf")
            && k["kept"] == false
            && k["note"] == note_of(&app).display().to_string()),
        "{listed:#}"
    );
}
