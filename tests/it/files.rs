//! Files, directories, access and archives against a real filesystem, through the real binary.

use std::os::unix::fs::MetadataExt as _;
use std::process::Command;

use base64::Engine as _;
use serde_json::json;

use crate::support::*;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn create_then_reapply_is_unchanged() {
    let s = Scratch::new();
    let d = s.declare(json!([
        {"type": "directory", "id": "web.root", "path": s.p("srv/web"), "mode": "0750"},
        {"type": "file", "id": "web.index", "path": s.p("srv/web/index.html"), "content": "hello\n"},
        {"type": "file", "id": "web.logo", "path": s.p("srv/web/logo.bin"), "bytes": b64(&[0, 1, 2, 255]), "mode": "0600"},
    ]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "web.root"), "created");
    assert_eq!(action(&report, "web.index"), "created");
    assert_eq!(action(&report, "web.logo"), "created");
    assert_eq!(std::fs::read_to_string(s.path("srv/web/index.html")).unwrap(), "hello\n");
    assert_eq!(std::fs::read(s.path("srv/web/logo.bin")).unwrap(), vec![0, 1, 2, 255]);
    assert_eq!(mode_of(&s.path("srv/web")), 0o750);
    assert_eq!(mode_of(&s.path("srv/web/index.html")), 0o644);
    assert_eq!(mode_of(&s.path("srv/web/logo.bin")), 0o600);
    assert_eq!(mode_of(&s.state()), 0o600, "the store is private");

    let (code, report) = s.apply(&d);
    assert_eq!(code, 0);
    for id in ["web.root", "web.index", "web.logo"] {
        assert_eq!(action(&report, id), "unchanged", "{report:#}");
    }
    let leftovers: Vec<_> = std::fs::read_dir(s.path("srv/web"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".mesh-host-"))
        .collect();
    assert!(leftovers.is_empty(), "no temporary files are left behind");
}

#[test]
fn hand_edit_chmod_and_delete_are_corrected() {
    let s = Scratch::new();
    let f = s.path("etc/app.conf");
    let d = s.declare(json!([
        {"type": "file", "id": "app.conf", "path": s.p("etc/app.conf"), "content": "port=80\n", "mode": "0640"},
        {"type": "directory", "id": "app.data", "path": s.p("var/app"), "mode": "0700"},
    ]));
    assert_eq!(s.apply(&d).0, 0);

    std::fs::write(&f, "port=8080\n").unwrap();
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0);
    assert_eq!(action(&report, "app.conf"), "corrected");
    assert!(detail(&report, "app.conf").contains("content"), "{report:#}");
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "port=80\n");

    Command::new("chmod").arg("0666").arg(&f).status().unwrap();
    Command::new("chmod").arg("0755").arg(s.path("var/app")).status().unwrap();
    let (_, report) = s.apply(&d);
    assert_eq!(action(&report, "app.conf"), "corrected");
    assert!(detail(&report, "app.conf").contains("mode"), "{report:#}");
    assert_eq!(action(&report, "app.data"), "corrected");
    assert_eq!(mode_of(&f), 0o640);
    assert_eq!(mode_of(&s.path("var/app")), 0o700);

    std::fs::remove_file(&f).unwrap();
    std::fs::remove_dir(s.path("var/app")).unwrap();
    let (_, report) = s.apply(&d);
    assert_eq!(action(&report, "app.conf"), "corrected");
    assert!(detail(&report, "app.conf").contains("deleted"), "{report:#}");
    assert_eq!(action(&report, "app.data"), "corrected");
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "port=80\n");
}

#[test]
fn a_changed_declaration_is_an_update_not_a_correction() {
    let s = Scratch::new();
    let file = |content: &str, mode: &str| {
        s.declare(json!([{"type": "file", "id": "app.conf", "path": s.p("app.conf"), "content": content, "mode": mode}]))
    };
    assert_eq!(s.apply(&file("a\n", "0644")).0, 0);
    let (_, report) = s.apply(&file("b\n", "0600"));
    assert_eq!(action(&report, "app.conf"), "updated");
    assert_eq!(detail(&report, "app.conf"), "content, mode 0644 to 0600");
    assert_eq!(std::fs::read_to_string(s.path("app.conf")).unwrap(), "b\n");
    assert_eq!(mode_of(&s.path("app.conf")), 0o600);
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
        assert!(
            out.status.success(),
            "useradd {name} failed (tests must run as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        TestUser(name.to_owned())
    }

    fn uid(&self) -> u32 {
        let out = Command::new("id").args(["-u", &self.0]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.0).output();
    }
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn owner_is_set_read_back_and_corrected() {
    let user = TestUser::new("mh-it-owner");
    let s = Scratch::new();
    let d = s.declare(json!([
        {"type": "directory", "id": "app.dir", "path": s.p("app"), "owner": "mh-it-owner"},
        {"type": "file", "id": "app.conf", "path": s.p("app/conf"), "content": "x\n", "owner": "mh-it-owner"},
    ]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(std::fs::metadata(s.path("app/conf")).unwrap().uid(), user.uid());
    assert_eq!(std::fs::metadata(s.path("app")).unwrap().uid(), user.uid());
    assert_eq!(action(&s.apply(&d).1, "app.conf"), "unchanged");

    Command::new("chown").arg("root:root").arg(s.path("app/conf")).status().unwrap();
    let (_, report) = s.apply(&d);
    assert_eq!(action(&report, "app.conf"), "corrected");
    assert!(detail(&report, "app.conf").contains("owner"), "{report:#}");
    assert_eq!(std::fs::metadata(s.path("app/conf")).unwrap().uid(), user.uid());
}

#[test]
fn an_owner_that_does_not_exist_fails_that_resource_only() {
    let s = Scratch::new();
    let d = s.declare(json!([
        {"type": "file", "id": "a.conf", "path": s.p("a.conf"), "content": "x", "owner": "mh-it-nobody-here"},
        {"type": "file", "id": "b.conf", "path": s.p("b.conf"), "content": "y"},
    ]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 1);
    assert_eq!(report["error"]["resource"], "a.conf");
    assert!(report["error"]["message"].as_str().unwrap().contains("mh-it-nobody-here"));
    assert_eq!(action(&report, "b.conf"), "created");
    assert!(!s.path("a.conf").exists());
}

#[test]
fn create_once_is_kept_as_the_program_grew_it() {
    let s = Scratch::new();
    let d = s.declare(json!([
        {"type": "file", "id": "db.seed", "path": s.p("seed.db"), "content": "initial\n", "create-once": true},
    ]));
    assert_eq!(action(&s.apply(&d).1, "db.seed"), "created");
    std::fs::write(s.path("seed.db"), "initial\ngrown by the program\n").unwrap();
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0);
    assert_eq!(action(&report, "db.seed"), "kept");
    assert_eq!(std::fs::read_to_string(s.path("seed.db")).unwrap(), "initial\ngrown by the program\n");
}

#[test]
fn a_rename_keeps_the_new_file() {
    let s = Scratch::new();
    let first = s.declare(json!([
        {"type": "file", "id": "old.conf", "path": s.p("app.conf"), "content": "v1\n"},
    ]));
    assert_eq!(s.apply(&first).0, 0);
    let second = s.declare(json!([
        {"type": "file", "id": "new.conf", "path": s.p("app.conf"), "content": "v2\n"},
    ]));
    let (code, report) = s.apply(&second);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "old.conf"), "removed");
    assert_eq!(action(&report, "new.conf"), "created");
    assert_eq!(std::fs::read_to_string(s.path("app.conf")).unwrap(), "v2\n");
}

#[test]
fn orphans_go_in_reverse_order_and_a_full_directory_is_kept() {
    let s = Scratch::new();
    let d = s.declare(json!([
        {"type": "directory", "id": "a.dir", "path": s.p("a")},
        {"type": "file", "id": "a.file", "path": s.p("a/f"), "content": "x"},
        {"type": "directory", "id": "b.dir", "path": s.p("b")},
    ]));
    assert_eq!(s.apply(&d).0, 0);
    std::fs::write(s.path("b/uploads.dat"), "someone's data").unwrap();

    let (code, report) = s.apply(&s.declare(json!([])));
    assert_eq!(code, 0, "{report:#}");
    let order: Vec<&str> =
        report["outcomes"].as_array().unwrap().iter().map(|o| o["id"].as_str().unwrap()).collect();
    assert_eq!(order, ["b.dir", "a.file", "a.dir"]);
    assert_eq!(action(&report, "a.file"), "removed");
    assert_eq!(action(&report, "a.dir"), "removed");
    assert_eq!(action(&report, "b.dir"), "kept");
    assert!(detail(&report, "b.dir").contains("1 item"), "{report:#}");
    assert!(!s.path("a").exists());
    assert_eq!(std::fs::read_to_string(s.path("b/uploads.dat")).unwrap(), "someone's data");

    // Orphans are the host's own footprint: a bundle's records are not a declared apply's.
    let status = s.run(&["status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["records"].as_array().unwrap().len(), 0, "kept and removed orphans are forgotten");
}

#[test]
fn orphans_are_looked_for_in_the_same_origin_only() {
    let s = Scratch::new();
    let bundle =
        s.declare(json!([{"type": "file", "id": "boot.conf", "path": s.p("boot.conf"), "content": "x"}]));
    let out = s.run(&["apply", "--origin", "bundle", bundle.to_str().unwrap()]);
    assert!(out.status.success());
    let declared =
        s.declare(json!([{"type": "file", "id": "mesh.conf", "path": s.p("mesh.conf"), "content": "y"}]));
    let (code, report) = s.apply(&declared);
    assert_eq!(code, 0);
    assert_eq!(report["outcomes"].as_array().unwrap().len(), 1, "{report:#}");
    assert!(s.path("boot.conf").exists());
}

#[test]
fn a_hand_edited_orphan_is_kept() {
    let s = Scratch::new();
    assert_eq!(
        s.apply(&s.declare(json!([{"type": "file", "id": "a.f", "path": s.p("f"), "content": "x"}]))).0,
        0
    );
    std::fs::write(s.path("f"), "edited by a person").unwrap();
    let (_, report) = s.apply(&s.declare(json!([])));
    assert_eq!(action(&report, "a.f"), "kept");
    assert_eq!(std::fs::read_to_string(s.path("f")).unwrap(), "edited by a person");
}

#[test]
fn a_symlink_at_the_path_is_refused_and_nothing_is_written_outside() {
    let s = Scratch::new();
    std::fs::write(s.path("victim"), "precious").unwrap();
    std::os::unix::fs::symlink(s.path("victim"), s.path("app.conf")).unwrap();
    let d =
        s.declare(json!([{"type": "file", "id": "app.conf", "path": s.p("app.conf"), "content": "pwned"}]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 1);
    assert!(report["error"]["message"].as_str().unwrap().contains("symlink"), "{report:#}");
    assert_eq!(std::fs::read_to_string(s.path("victim")).unwrap(), "precious");
    assert_eq!(mode_of(&s.path("victim")), 0o644);
}

#[test]
fn a_symlink_in_a_parent_is_refused_and_nothing_is_written_outside() {
    let s = Scratch::new();
    std::fs::create_dir(s.path("outside")).unwrap();
    std::os::unix::fs::symlink(s.path("outside"), s.path("conf.d")).unwrap();
    let d = s.declare(json!([
        {"type": "file", "id": "app.conf", "path": s.p("conf.d/app.conf"), "content": "pwned"},
        {"type": "directory", "id": "app.sub", "path": s.p("conf.d/sub")},
        {"type": "directory", "id": "app.link", "path": s.p("conf.d"), "mode": "0700"},
    ]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 1);
    assert_eq!(report["error"]["others"], 2, "{report:#}");
    let message = report["error"]["message"].as_str().unwrap();
    assert!(message.contains("symlink") && message.contains("conf.d"), "{message}");
    assert_eq!(std::fs::read_dir(s.path("outside")).unwrap().count(), 0, "nothing written through the link");
    assert_eq!(mode_of(&s.path("outside")), 0o755, "the link's target was not chmod-ed");
}

#[test]
fn a_file_where_a_directory_is_declared_is_left_alone() {
    let s = Scratch::new();
    std::fs::write(s.path("thing"), "a file").unwrap();
    let (code, report) =
        s.apply(&s.declare(json!([{"type": "directory", "id": "a.d", "path": s.p("thing")}])));
    assert_eq!(code, 1);
    assert!(report["error"]["message"].as_str().unwrap().contains("not a directory"));
    assert_eq!(std::fs::read_to_string(s.path("thing")).unwrap(), "a file");
}

#[test]
fn access_is_confirmed_never_created() {
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "access", "id": "media.lib", "path": s.p("media"), "mode": "write"}]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 1);
    assert!(report["error"]["message"].as_str().unwrap().contains("operator"), "{report:#}");
    assert!(!s.path("media").exists());
    std::fs::create_dir(s.path("media")).unwrap();
    Command::new("chmod").arg("0777").arg(s.path("media")).status().unwrap();
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0);
    assert_eq!(action(&report, "media.lib"), "unchanged");
    assert_eq!(mode_of(&s.path("media")), 0o777, "never chmod-ed");
    let (_, report) = s.apply(&s.declare(json!([])));
    assert_eq!(action(&report, "media.lib"), "forgotten");
    assert!(s.path("media").exists());
}

/// A directory declared without `mode` is 0755 (the reference's default), and kept so: one
/// found with another mode, with no record of the host's, is set to it, and a chmod by hand is
/// put back to it. Made first at 0700, so the 0755 seen is the default's, not `mkdir`'s under
/// the umask.
#[test]
fn a_directory_without_a_mode_is_0755() {
    let s = Scratch::new();
    std::fs::create_dir(s.path("found")).unwrap();
    Command::new("chmod").arg("0700").arg(s.path("found")).status().unwrap();
    let d = s.declare(json!([
        {"type": "directory", "id": "a.found", "path": s.p("found")},
        {"type": "directory", "id": "a.made", "path": s.p("made/below")},
    ]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "a.found"), "updated");
    assert_eq!(detail(&report, "a.found"), "mode 0700 to 0755");
    assert_eq!(mode_of(&s.path("found")), 0o755);
    assert_eq!(action(&report, "a.made"), "created");
    assert_eq!(mode_of(&s.path("made/below")), 0o755);

    Command::new("chmod").arg("0750").arg(s.path("made/below")).status().unwrap();
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "a.found"), "unchanged");
    assert_eq!(action(&report, "a.made"), "corrected");
    assert_eq!(mode_of(&s.path("made/below")), 0o755);
}

/// An access whose path is not a directory (a regular file, or a symlink, even to a
/// directory) fails that resource, naming the path, and leaves what is there as it was; the
/// rest of the declaration applies, and nothing is recorded for the access.
#[test]
fn an_access_path_that_is_not_a_directory_fails_and_is_left_alone() {
    use std::os::unix::fs::PermissionsExt as _;
    let s = Scratch::new();
    std::fs::write(s.path("media"), "a file").unwrap();
    std::fs::set_permissions(s.path("media"), std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::create_dir(s.path("real")).unwrap();
    std::os::unix::fs::symlink(s.path("real"), s.path("linked")).unwrap();
    let d = s.declare(json!([
        {"type": "access", "id": "media.lib", "path": s.p("media"), "mode": "read"},
        {"type": "access", "id": "media.linked", "path": s.p("linked"), "mode": "write"},
        {"type": "file", "id": "media.conf", "path": s.p("media.conf"), "content": "x"},
    ]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 1, "{report:#}");
    let failures = report["error"]["failures"].as_array().unwrap();
    let message = |id: &str| {
        failures.iter().find(|f| f["id"] == id).unwrap_or_else(|| panic!("{id}: {report:#}"))["message"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(failures.len(), 2, "{report:#}");
    for (id, path) in [("media.lib", "media"), ("media.linked", "linked")] {
        assert_eq!(
            message(id),
            format!("{} is not a directory; an access names a directory the operator provides", s.p(path))
        );
    }
    assert_eq!(action(&report, "media.conf"), "created", "the rest applies");
    assert_eq!(std::fs::read_to_string(s.path("media")).unwrap(), "a file");
    assert_eq!(mode_of(&s.path("media")), 0o640);
    assert_eq!(std::fs::read_link(s.path("linked")).unwrap(), s.path("real"), "the symlink is left");
    let store: serde_json::Value = serde_json::from_slice(&std::fs::read(s.state()).unwrap()).unwrap();
    assert!(
        store["records"]["media.lib"].is_null() && store["records"]["media.linked"].is_null(),
        "{store:#}"
    );
}

/// A tar archive from (name, content) pairs, names written raw so that hostile ones can be made.
fn tar_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_size(data.len() as u64);
        h.set_mode(0o640);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

#[test]
fn an_archive_is_unpacked_once_and_again_when_it_changes() {
    let s = Scratch::new();
    let v1 = gzip(&tar_of(&[("bin/tool", b"v1"), ("README", b"read me")]));
    let d = s
        .declare(json!([{"type": "archive", "id": "tool.dist", "path": s.p("opt/tool"), "bytes": b64(&v1)}]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "tool.dist"), "created");
    assert_eq!(std::fs::read(s.path("opt/tool/bin/tool")).unwrap(), b"v1");
    assert_eq!(mode_of(&s.path("opt/tool/README")), 0o640);
    // A file a program wrote beside what the archive holds stays.
    std::fs::write(s.path("opt/tool/cache"), "mine").unwrap();
    assert_eq!(action(&s.apply(&d).1, "tool.dist"), "unchanged");

    let v2 = tar_of(&[("bin/tool", b"v2")]);
    std::fs::write(s.path("v2.tar"), &v2).unwrap();
    // From a source on the machine, named by its digest (without one it is refused: below).
    let digest = {
        use sha2::Digest as _;
        let sum: String = sha2::Sha256::digest(&v2).iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{sum}")
    };
    let d = s.declare(json!([{
        "type": "archive", "id": "tool.dist", "path": s.p("opt/tool"), "source": s.p("v2.tar"), "digest": digest
    }]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "tool.dist"), "updated");
    assert_eq!(std::fs::read(s.path("opt/tool/bin/tool")).unwrap(), b"v2");
    assert_eq!(std::fs::read_to_string(s.path("opt/tool/cache")).unwrap(), "mine");
}

/// Regression (issue 11): an archive unpacked over files already there overwrote them with no
/// copy kept. Each is kept as a file's original is: once, before it is written over.
#[test]
fn an_archive_keeps_the_files_it_finds_before_unpacking_over_them() {
    let s = Scratch::new();
    std::fs::create_dir_all(s.path("opt/tool/bin")).unwrap();
    std::fs::write(s.path("opt/tool/bin/tool"), "the operator's tool\n").unwrap();
    std::fs::write(s.path("opt/tool/notes"), "not in the archive\n").unwrap();
    let v1 = tar_of(&[("bin/tool", b"v1"), ("README", b"read me")]);
    let d = s
        .declare(json!([{"type": "archive", "id": "tool.dist", "path": s.p("opt/tool"), "bytes": b64(&v1)}]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "tool.dist"), "created");
    assert_eq!(std::fs::read(s.path("opt/tool/bin/tool")).unwrap(), b"v1");
    let kept = s.path("state/kept").join(s.path("opt/tool/bin/tool").strip_prefix("/").unwrap());
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "the operator's tool\n", "{report:#}");
    assert!(detail(&report, "tool.dist").contains("kept under"), "{report:#}");
    // Only what the archive wrote over: a file it does not name is left in place, not copied.
    assert!(!s.path("state/kept").join(s.path("opt/tool/notes").strip_prefix("/").unwrap()).exists());
    assert!(!s.path("state/kept").join(s.path("opt/tool/README").strip_prefix("/").unwrap()).exists());

    // A later version unpacks over the host's own files: nothing more is kept, and the copy
    // of the original is never overwritten.
    let v2 = tar_of(&[("bin/tool", b"v2")]);
    let d = s
        .declare(json!([{"type": "archive", "id": "tool.dist", "path": s.p("opt/tool"), "bytes": b64(&v2)}]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "tool.dist"), "updated");
    assert!(!detail(&report, "tool.dist").contains("kept"), "{report:#}");
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "the operator's tool\n");
}

#[test]
fn an_archive_digest_that_does_not_match_is_refused() {
    let s = Scratch::new();
    let bytes = tar_of(&[("f", b"x")]);
    let d = s.declare(json!([{"type": "archive", "id": "a.a", "path": s.p("out"), "bytes": b64(&bytes), "digest": "0".repeat(64)}]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 1);
    assert!(report["error"]["message"].as_str().unwrap().contains("nothing was unpacked"));
    assert!(!s.path("out").exists());
}

#[test]
fn an_archive_entry_that_would_land_outside_is_refused() {
    for hostile in ["../escaped", "/tmp/mesh-host-it-absolute-escape", "a/../../escaped"] {
        let s = Scratch::new();
        let bytes = tar_of(&[("fine", b"ok"), (hostile, b"pwned")]);
        let d =
            s.declare(json!([{"type": "archive", "id": "a.a", "path": s.p("out/in"), "bytes": b64(&bytes)}]));
        let (code, report) = s.apply(&d);
        assert_eq!(code, 1, "{hostile}: {report:#}");
        assert!(report["error"]["message"].as_str().unwrap().contains("outside"), "{report:#}");
        assert!(!s.path("out/escaped").exists() && !s.path("escaped").exists());
        assert!(!std::path::Path::new("/tmp/mesh-host-it-absolute-escape").exists());
        assert!(!s.path("out/in/fine").exists(), "nothing is unpacked from a refused archive");
    }
}

#[test]
fn an_archive_symlink_cannot_carry_a_later_entry_outside() {
    let s = Scratch::new();
    std::fs::create_dir(s.path("outside")).unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    b.append_link(&mut h, "link", s.path("outside")).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_size(5);
    h.set_mode(0o644);
    b.append_data(&mut h, "link/evil", &b"pwned"[..]).unwrap();
    let bytes = b.into_inner().unwrap();
    let d = s.declare(json!([{"type": "archive", "id": "a.a", "path": s.p("out"), "bytes": b64(&bytes)}]));
    let _ = s.apply(&d);
    assert_eq!(std::fs::read_dir(s.path("outside")).unwrap().count(), 0, "nothing escaped through the link");
}

#[test]
fn plan_writes_nothing() {
    let s = Scratch::new();
    std::fs::write(s.path("existing.conf"), "old\n").unwrap();
    let d = s.declare(json!([
        {"type": "directory", "id": "a.dir", "path": s.p("new")},
        {"type": "file", "id": "a.conf", "path": s.p("existing.conf"), "content": "new\n"},
    ]));
    let out = s.run(&["plan", d.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("would create a.dir"), "{text}");
    assert!(text.contains("-old") && text.contains("+new"), "a unified diff: {text}");
    assert!(!s.path("new").exists());
    assert_eq!(std::fs::read_to_string(s.path("existing.conf")).unwrap(), "old\n");
    assert!(!s.state().exists(), "not even the store");
    assert!(!s.path("state").exists());
}

#[test]
fn a_file_found_with_no_record_is_kept_before_it_is_written_over() {
    let s = Scratch::new();
    std::fs::write(s.path("found.conf"), "the machine's own\n").unwrap();
    let d =
        s.declare(json!([{"type": "file", "id": "a.conf", "path": s.p("found.conf"), "content": "mesh\n"}]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0);
    assert_eq!(action(&report, "a.conf"), "updated");
    let kept = s.path("state/kept").join(s.path("found.conf").strip_prefix("/").unwrap());
    assert!(detail(&report, "a.conf").contains(&kept.display().to_string()), "{report:#}");
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "the machine's own\n");
    assert_eq!(std::fs::read_to_string(s.path("found.conf")).unwrap(), "mesh\n");
    // And status lists it, with where its copy is.
    let status: serde_json::Value = serde_json::from_slice(&s.run(&["status", "--json"]).stdout).unwrap();
    assert_eq!(
        status["kept"],
        json!([{"path": s.p("found.conf"), "copy": kept, "kept": true}]),
        "{status:#}"
    );
    let text = String::from_utf8(s.run(&["status"]).stdout).unwrap();
    assert!(text.contains("kept originals: 1 under"), "{text}");
}

#[test]
fn a_refused_declaration_touches_nothing_and_exits_2() {
    let s = Scratch::new();
    let d = s.declare(json!([
        {"type": "file", "id": "a.conf", "path": s.p("a.conf"), "content": "x"},
        {"type": "file", "id": "b.conf", "path": s.p("b.conf"), "content": "x", "mdoe": "0644"},
    ]));
    let out = s.run(&["apply", d.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("resources[1] (id \"b.conf\"), field `mdoe`"), "{err}");
    assert!(!s.path("a.conf").exists());
    assert!(!s.state().exists());
    assert_eq!(s.run(&["apply"]).status.code(), Some(2), "bad usage");
    assert_eq!(s.run(&["check", d.to_str().unwrap()]).status.code(), Some(2));
}

#[test]
fn a_corrupt_or_newer_store_is_refused_and_left_as_it_is() {
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "file", "id": "a.conf", "path": s.p("a.conf"), "content": "x"}]));
    std::fs::create_dir_all(s.path("state")).unwrap();
    for (bytes, says) in
        [(&b"{not json"[..], "not readable"), (&b"{\"schema\": 99, \"records\": {}}"[..], "newer")]
    {
        std::fs::write(s.state(), bytes).unwrap();
        let out = s.run(&["apply", d.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says) && err.contains(&s.state().display().to_string()), "{err}");
        assert_eq!(std::fs::read(s.state()).unwrap(), bytes, "never silently replaced");
        assert!(!s.path("a.conf").exists());
    }
}

#[test]
fn an_interrupted_store_write_leaves_the_previous_store_readable() {
    let s = Scratch::new();
    let one = s.declare(json!([{"type": "file", "id": "a.one", "path": s.p("one"), "content": "1"}]));
    assert_eq!(s.apply(&one).0, 0);
    let before = std::fs::read(s.state()).unwrap();

    let two = s.declare(json!([
        {"type": "file", "id": "a.one", "path": s.p("one"), "content": "1"},
        {"type": "file", "id": "a.two", "path": s.p("two"), "content": "2"},
    ]));
    let mut cmd = assert_cmd::Command::cargo_bin("mesh-host").unwrap();
    let out = cmd
        .env("MESH_HOST_FAILPOINT", "store-write")
        .arg("--state")
        .arg(s.state())
        .args(["apply", two.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the process died mid-write");
    assert_eq!(std::fs::read(s.state()).unwrap(), before, "the previous store is intact");
    let status = s.run(&["status", "--json"]);
    assert!(status.status.success());

    // The next apply recovers: the leftover temporary file is cleaned and the store written.
    let (code, report) = s.apply(&two);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "a.two"), "unchanged", "the file was written before the crash");
    let names: Vec<String> = std::fs::read_dir(s.path("state"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains(".mesh-host-")), "{names:?}");
    let status: serde_json::Value = serde_json::from_slice(&s.run(&["status", "--json"]).stdout).unwrap();
    assert_eq!(status["records"].as_array().unwrap().len(), 2);
}

/// A power cut can keep a crashed pass's temporary files and lose the journal lines that named
/// their directories: the lines are appended without a sync, while a file's fsync (a chmod in
/// place) or ext4's periodic commit makes the temporaries' entries durable. Found by the VM
/// power-loss lane (RELIABILITY.md). The state is planted as the power cut left it: a journal
/// that exists but is empty, and temporaries of a dead process beside a file this pass changes,
/// beside one it leaves unchanged, and inside a declared directory.
#[test]
fn temporaries_are_cleared_after_a_crash_whose_journal_lost_their_directories() {
    let s = Scratch::new();
    let before = s.declare(json!([
        {"type": "file", "id": "a.changing", "path": s.p("d0/f0"), "content": "old\n"},
        {"type": "file", "id": "a.steady", "path": s.p("d1/f1"), "content": "same\n"},
        {"type": "directory", "id": "a.dir", "path": s.p("d2")},
    ]));
    assert_eq!(s.apply(&before).0, 0);

    let journal = format!("{}.journal", s.state().display());
    std::fs::write(&journal, "").unwrap();
    let planted = ["d0/.f0.mesh-host-4000001-0", "d1/.f1.mesh-host-4000001-1", "d2/.x.mesh-host-4000001-2"];
    for rel in planted {
        std::fs::write(s.path(rel), "").unwrap();
    }
    let after = s.declare(json!([
        {"type": "file", "id": "a.changing", "path": s.p("d0/f0"), "content": "new\n"},
        {"type": "file", "id": "a.steady", "path": s.p("d1/f1"), "content": "same\n"},
        {"type": "directory", "id": "a.dir", "path": s.p("d2")},
    ]));
    let (code, report) = s.apply(&after);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "a.changing"), "updated", "{report:#}");
    assert_eq!(action(&report, "a.steady"), "unchanged", "{report:#}");
    for rel in planted {
        assert!(!s.path(rel).exists(), "{rel} was left by the crashed pass and is still there");
    }
    assert!(!std::path::Path::new(&journal).exists(), "the journal is removed once the store is written");
    assert_eq!(std::fs::read_to_string(s.path("d0/f0")).unwrap(), "new\n");
}

/// A power cut on a disk that acknowledged a flush it had not made can leave an archive's record
/// saying "unpacked" over files that are empty (the VM lane's mutant, which never syncs, shows
/// it: RELIABILITY.md). After a crash (a journal found), the first pass looks at the files an
/// unchanged archive unpacked and unpacks it again if any is missing or empty where the
/// archive's is not; without a crash, an emptied file is the operator's change and stays.
#[test]
fn after_a_crash_an_archive_whose_files_were_lost_is_unpacked_again() {
    let s = Scratch::new();
    let tar = tar_of(&[("bin/tool", b"#!/bin/sh\necho tool\n"), ("README", b"read me\n")]);
    let d = s.declare(
        json!([{"type": "archive", "id": "tool.dist", "path": s.p("opt/tool"), "bytes": b64(&tar)}]),
    );
    assert_eq!(s.apply(&d).0, 0);
    let tool = s.path("opt/tool/bin/tool");

    std::fs::write(&tool, "").unwrap();
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "tool.dist"), "unchanged", "no crash: the emptied file is left as found");
    assert_eq!(std::fs::read(&tool).unwrap(), b"");

    std::fs::write(format!("{}.journal", s.state().display()), "").unwrap();
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "tool.dist"), "updated", "{report:#}");
    assert!(
        detail(&report, "tool.dist").contains("1 of the files unpacked here were missing or empty"),
        "{report:#}"
    );
    assert_eq!(std::fs::read(&tool).unwrap(), b"#!/bin/sh\necho tool\n");
    let (_, report) = s.apply(&d);
    assert_eq!(
        action(&report, "tool.dist"),
        "unchanged",
        "once recovered, an ordinary pass again: {report:#}"
    );
}

#[test]
fn status_says_what_the_machine_still_holds() {
    let s = Scratch::new();
    let d = s.declare(json!([
        {"type": "file", "id": "a.keep", "path": s.p("keep"), "content": "k"},
        {"type": "file", "id": "a.edit", "path": s.p("edit"), "content": "e"},
        {"type": "file", "id": "a.gone", "path": s.p("gone"), "content": "g"},
    ]));
    assert_eq!(s.apply(&d).0, 0);
    std::fs::write(s.path("edit"), "changed").unwrap();
    std::fs::remove_file(s.path("gone")).unwrap();
    let out = s.run(&["status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let machine = |id: &str| {
        status["records"].as_array().unwrap().iter().find(|r| r["id"] == id).unwrap()["machine"].clone()
    };
    assert_eq!(machine("a.keep"), "holds");
    assert_eq!(machine("a.edit"), "changed");
    assert_eq!(machine("a.gone"), "missing");
    assert_eq!(std::fs::read_to_string(s.path("edit")).unwrap(), "changed", "status is read-only");
}

#[test]
fn the_store_has_one_writer() {
    let s = Scratch::new();
    let d = s.declare(json!([]));
    std::fs::create_dir_all(s.path("state")).unwrap();
    // util-linux's flock holds the lock while it runs a second mesh-host.
    let out = Command::new("flock")
        .args(["--exclusive", "--nonblock"])
        .arg(s.path("state/state.json.lock"))
        .arg(assert_cmd::cargo::cargo_bin("mesh-host"))
        .arg("--state")
        .arg(s.state())
        .args(["apply", d.to_str().unwrap()])
        .output()
        .expect("the `flock` program (util-linux) is needed for this test");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("another mesh-host"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_same_size_edit_is_seen_after_the_signature_is_recorded() {
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "file", "id": "a.f", "path": s.p("f"), "content": "aaaa"}]));
    assert_eq!(s.apply(&d).0, 0);
    // Old enough for its signature to be trusted, then recorded by a steady pass.
    std::thread::sleep(std::time::Duration::from_millis(120));
    assert_eq!(action(&s.apply(&d).1, "a.f"), "unchanged");
    let state = std::fs::read_to_string(s.state()).unwrap();
    assert!(state.contains("\"sig\""), "the signature is recorded: {state}");
    // Same size, same mode: only the content (and so the change time) differs.
    std::fs::write(s.path("f"), "bbbb").unwrap();
    let (_, report) = s.apply(&d);
    assert_eq!(action(&report, "a.f"), "corrected");
    assert_eq!(std::fs::read_to_string(s.path("f")).unwrap(), "aaaa");
}

/// The cold apply signs what it wrote, once the clock tick has passed (issue 15): the first
/// steady apply then finds every file untouched by its signature alone, reads none of them, and
/// does not rewrite the store.
#[test]
fn the_cold_apply_records_signatures_so_the_first_steady_apply_rewrites_nothing() {
    let s = Scratch::new();
    let files: Vec<serde_json::Value> = (0..20)
        .map(|i| json!({"type": "file", "id": format!("a.f{i}"), "path": s.p(&format!("f{i}")), "content": "aaaa"}))
        .collect();
    let d = s.declare(serde_json::Value::Array(files));
    assert_eq!(s.apply(&d).0, 0);
    let store: serde_json::Value = serde_json::from_slice(&std::fs::read(s.state()).unwrap()).unwrap();
    let records = store["records"].as_object().expect("the store has records");
    assert_eq!(records.len(), 20);
    for (id, rec) in records {
        assert!(rec["sig"].is_array(), "{id} was signed by the cold apply: {rec}");
    }
    let before = std::fs::metadata(s.state()).unwrap();
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0);
    for i in 0..20 {
        assert_eq!(action(&report, &format!("a.f{i}")), "unchanged");
    }
    let after = std::fs::metadata(s.state()).unwrap();
    assert_eq!(
        (before.ino(), before.mtime(), before.mtime_nsec()),
        (after.ino(), after.mtime(), after.mtime_nsec()),
        "the first steady apply rewrote the store"
    );
}

/// What the cold apply signed is still compared: a same-size edit right after it (within the
/// same second, as soon as the apply returns) is seen and put back by the next apply.
#[test]
fn an_edit_right_after_a_cold_apply_is_still_corrected() {
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "file", "id": "a.f", "path": s.p("f"), "content": "aaaa"}]));
    assert_eq!(s.apply(&d).0, 0);
    std::fs::write(s.path("f"), "bbbb").unwrap();
    let (_, report) = s.apply(&d);
    assert_eq!(action(&report, "a.f"), "corrected");
    assert_eq!(std::fs::read_to_string(s.path("f")).unwrap(), "aaaa");
}
