//! The shipped unit's sandbox, tried against the real agent under systemd (issue 45, point 6):
//! in a throw-away copy of the testbed, `deploy/mesh-host.service` as shipped runs a
//! declaration that does each kind of work the agent is for (files under /etc, /usr and /home,
//! a set-uid file, a user, a unit and its service, a process, an action, a package from apt
//! whose script makes a set-uid file), puts back a hand-edit, and its process carries the
//! bounding set, the system call filter and no core dumps. Then each directive the
//! unit leaves out for a reason that can be shown here is added, and the same work fails
//! (docs/decisions.md, "The unit's sandbox").

use std::process::Command;

use serde_json::{json, Value};

use crate::operator::{install_shipped_unit, Ephemeral};
use crate::support::{wait_for, PATIENCE};

const PACKAGE: &str = "mh-sbx-pkg";

/// A package of one file whose maintainer script makes it set-uid, as sudo's or ping's do, in
/// an apt repository under /srv/sbx inside the box, and an apt configuration that sees only it.
/// Returns the configuration's path inside the box.
fn repository(box_: &Ephemeral) -> &'static str {
    // Built on the host (apt-ftparchive cannot work in a directory of the box's mount
    // namespace), then copied in.
    let host = tempfile::tempdir().unwrap();
    let build = host.path().join("build");
    std::fs::create_dir_all(build.join("DEBIAN")).unwrap();
    std::fs::create_dir_all(build.join("usr/lib/mh-sbx")).unwrap();
    std::fs::write(build.join("usr/lib/mh-sbx/helper"), "#!/bin/sh\n").unwrap();
    std::fs::write(
        build.join("DEBIAN/control"),
        format!(
            "Package: {PACKAGE}\nVersion: 1.0\nArchitecture: all\nMaintainer: mesh-host tests <tests@invalid>\nDescription: a package the sandbox test installs\n"
        ),
    )
    .unwrap();
    let postinst = build.join("DEBIAN/postinst");
    std::fs::write(&postinst, "#!/bin/sh\nset -e\nchmod 4755 /usr/lib/mh-sbx/helper\n").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&postinst, std::fs::Permissions::from_mode(0o755)).unwrap();
    let deb = format!("{PACKAGE}_1.0_all.deb");
    let built = Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&build)
        .arg(host.path().join(&deb))
        .output()
        .expect("dpkg-deb runs (tests/testbed/systemd.sh installs it)");
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let packages =
        Command::new("apt-ftparchive").args(["packages", &deb]).current_dir(host.path()).output().unwrap();
    assert!(packages.status.success(), "{}", String::from_utf8_lossy(&packages.stderr));
    let repo = box_.path("/srv/sbx/repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::copy(host.path().join(&deb), repo.join(&deb)).unwrap();
    std::fs::write(repo.join("Packages"), packages.stdout).unwrap();
    let apt = box_.path("/srv/sbx/apt");
    for d in ["sources.list.d", "lists/partial", "cache/archives/partial", "preferences.d"] {
        std::fs::create_dir_all(apt.join(d)).unwrap();
    }
    std::fs::write(apt.join("sources.list"), "deb [trusted=yes] file:/srv/sbx/repo ./\n").unwrap();
    std::fs::write(
        apt.join("apt.conf"),
        "Dir::Etc::SourceList \"/srv/sbx/apt/sources.list\";\nDir::Etc::SourceParts \"/srv/sbx/apt/sources.list.d\";\nDir::Etc::Preferences \"/srv/sbx/apt/preferences\";\nDir::Etc::PreferencesParts \"/srv/sbx/apt/preferences.d\";\nDir::State::Lists \"/srv/sbx/apt/lists\";\nDir::Cache \"/srv/sbx/apt/cache\";\nAPT::Sandbox::User \"root\";\n",
    )
    .unwrap();
    "/srv/sbx/apt/apt.conf"
}

/// Every kind of work, as one declaration.
fn declaration() -> Value {
    json!({"version": 1, "resources": [
        {"type": "file", "id": "sbx.etc", "path": "/etc/mh-sbx.conf", "content": "etc\n"},
        {"type": "directory", "id": "sbx.usr", "path": "/usr/local/lib/mh-sbx"},
        {"type": "file", "id": "sbx.suid", "path": "/usr/local/lib/mh-sbx/tool", "content": "#!/bin/sh\n",
         "mode": "4755"},
        {"type": "user", "id": "sbx.user", "name": "mhsbx"},
        {"type": "directory", "id": "sbx.home", "path": "/home/mhsbx-data", "owner": "mhsbx"},
        {"type": "file", "id": "sbx.tmp", "path": "/tmp/mh-sbx-shared", "content": "for everyone\n"},
        {"type": "file", "id": "sbx.unit", "path": "/etc/systemd/system/mh-sbx.service",
         "content": "[Service]\nExecStart=/bin/sleep 1000\n"},
        {"type": "service", "id": "sbx.svc", "unit": "mh-sbx.service", "state": "running",
         "restart-on": ["sbx.unit"]},
        {"type": "process", "id": "sbx.proc", "name": "mh-sbx-proc", "command": ["/bin/sleep", "1000"]},
        {"type": "action", "id": "sbx.action", "command": ["sh", "-c", "echo ran > /var/lib/mh-sbx-action"],
         "verify": ["test", "-f", "/var/lib/mh-sbx-action"]},
        {"type": "package", "id": "sbx.pkg", "package": PACKAGE},
        // What actions and package scripts reach: the host's devices (here the console, the
        // one systemd-nspawn gives beyond the basic few; on a machine, disks, loop, fuse) and
        // /proc's system files (memory, CPUs, tunables).
        {"type": "action", "id": "sbx.device", "command": ["sh", "-c", "test -c /dev/console && touch /var/lib/mh-sbx-device"],
         "verify": ["test", "-f", "/var/lib/mh-sbx-device"]},
        {"type": "action", "id": "sbx.meminfo",
         "command": ["sh", "-c", "grep -q MemTotal /proc/meminfo && touch /var/lib/mh-sbx-meminfo"],
         "verify": ["test", "-f", "/var/lib/mh-sbx-meminfo"]},
    ]})
}

/// Starts the shipped unit with `extra` lines on the declaration and waits for its first pass
/// to end: `Ok` when every resource took, else the failures the journal names.
fn work(box_: &Ephemeral, extra: &str) -> Result<(), String> {
    // A drop-in, so that `extra` wins over what the unit itself sets (RestrictSUIDSGID=no).
    let drop_in = box_.path("/etc/systemd/system/mesh-host.service.d");
    let _ = std::fs::remove_dir_all(&drop_in);
    if !extra.is_empty() {
        std::fs::create_dir_all(&drop_in).unwrap();
        std::fs::write(drop_in.join("try.conf"), format!("[Service]\n{extra}\n")).unwrap();
    }
    let unit = install_shipped_unit(box_, "");
    let apt = repository(box_);
    std::fs::write(
        box_.path("/etc/mesh-host/mesh-host.env"),
        format!("MESH_HOST_METRICS=off\nAPT_CONFIG={apt}\n"),
    )
    .unwrap();
    std::fs::create_dir_all(box_.path("/etc/mesh-host/declaration.d")).unwrap();
    std::fs::write(box_.path("/etc/mesh-host/declaration.d/sbx.json"), declaration().to_string()).unwrap();
    box_.systemctl(&["start", unit]);
    // This run's lines only: the box's journal holds the runs tried before.
    let run = format!("_SYSTEMD_INVOCATION_ID={}", box_.show(unit, "InvocationID"));
    let journal = || box_.journalctl(&[&run, "-o", "cat"]);
    // READY comes after the first pass, so `start` returned once it ended; but journald reads
    // the agent's output on a stream of its own, and may not have taken the pass's last lines
    // when READY arrives (CI once read no failure where there was one). The agent logs "mesh-host
    // is running" after READY, on the same stream as the failures: once it is in the journal,
    // so is every line before it. An agent that did not come up logs no such line.
    let up = wait_for(PATIENCE, || {
        journal().contains("mesh-host is running") || box_.systemctl(&["is-active", unit]) != "active"
    });
    assert!(up, "the agent is active but its journal never said it was running:\n{}", journal());
    let failed: Vec<String> =
        journal().lines().filter(|l| l.contains("failed sbx.")).map(str::to_owned).collect();
    let state = box_.systemctl(&["is-active", unit]);
    if failed.is_empty() && state == "active" {
        Ok(())
    } else {
        Err(format!("{state}: {}\n{}", failed.join("\n"), journal()))
    }
}

/// Undoes what `work` made, for the next try in the same box.
fn undo(box_: &Ephemeral) {
    box_.systemctl(&["stop", "mesh-host.service", "mh-sbx.service", "mesh-host-mh-sbx-proc.service"]);
    box_.systemctl(&["reset-failed"]);
    let _ = box_.run("dpkg", &["--purge", PACKAGE]);
    let _ = box_.run("userdel", &["mhsbx"]);
    for p in [
        "/etc/mh-sbx.conf",
        "/usr/local/lib/mh-sbx",
        "/home/mhsbx-data",
        "/var/lib/mh-sbx-action",
        "/var/lib/mh-sbx-device",
        "/var/lib/mh-sbx-meminfo",
    ] {
        let _ = box_.run("rm", &["-rf", p]);
    }
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn the_shipped_sandbox_lets_the_agent_do_each_kind_of_work() {
    let box_ = Ephemeral::boot();
    if let Err(e) = work(&box_, "") {
        panic!("the shipped unit stops the agent's work: {e}");
    }
    let journal = box_.journalctl(&["-u", "mesh-host.service", "-o", "cat"]);
    assert!(journal.contains("enforcing") || journal.contains("declaration accepted"), "{journal}");
    let mode = |p: &str| {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(box_.path(p)).map(|m| m.permissions().mode() & 0o7777).ok()
    };
    assert_eq!(mode("/usr/local/lib/mh-sbx/tool"), Some(0o4755), "a declared set-uid file");
    assert_eq!(mode("/usr/lib/mh-sbx/helper"), Some(0o4755), "a package script's chmod u+s");
    assert!(box_.path("/home/mhsbx-data").is_dir() && box_.path("/var/lib/mh-sbx-action").is_file());
    for unit in ["mh-sbx.service", "mesh-host-mh-sbx-proc.service"] {
        assert_eq!(
            box_.systemctl(&["is-active", unit]),
            "active",
            "{unit}:\n{}\n{journal}",
            box_.journalctl(&["-u", unit, "-o", "cat"])
        );
    }

    // Its process carries the sandbox: no CAP_SYS_BOOT (22) in the bounding set, a seccomp
    // filter, no core dump.
    let pid = box_.show("mesh-host.service", "MainPID");
    let status = std::fs::read_to_string(box_.path(&format!("/proc/{pid}/status"))).unwrap();
    let field = |name: &str| {
        status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim).unwrap_or_default().to_owned()
    };
    let bounding = u64::from_str_radix(&field("CapBnd:"), 16).unwrap();
    assert_eq!(bounding & (1 << 22), 0, "CAP_SYS_BOOT is dropped: {bounding:x}");
    assert_ne!(bounding & (1 << 21), 0, "CAP_SYS_ADMIN stays (fanotify): {bounding:x}");
    assert_eq!(field("Seccomp:"), "2", "a system call filter");
    let limits = std::fs::read_to_string(box_.path(&format!("/proc/{pid}/limits"))).unwrap();
    assert!(limits.lines().any(|l| l.starts_with("Max core file size") && l.contains(" 0 ")), "{limits}");

    // A hand-edit is put back, and recorded. (Who made it is not asked here: fanotify cannot
    // be had inside systemd-nspawn, under the old unit as under this one; the system call
    // groups filtered hold no fanotify call, and CAP_SYS_ADMIN stays, asserted above.)
    let edit = box_.run("sh", &["-c", "echo hand 1<> /etc/mh-sbx.conf"]);
    assert!(edit.status.success());
    let conf = box_.path("/etc/mh-sbx.conf");
    assert!(wait_for(PATIENCE, || std::fs::read_to_string(&conf).is_ok_and(|c| c == "etc\n")), "{journal}");
    let recorded = || {
        // One correction per line.
        let out = box_.run("/usr/bin/mesh-host", &["drift", "--json"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let found =
            text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).any(|c| c["id"] == "sbx.etc");
        (found, text)
    };
    assert!(wait_for(PATIENCE, || recorded().0), "{}", recorded().1);
}

/// What the unit leaves out, each shown to stop work the agent is for: the same declaration
/// fails under it. The others (PrivateMounts, PrivateIPC, @swap, MemoryDenyWriteExecute, a
/// tight UMask) break what this declaration does not do, and are argued in docs/decisions.md.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn each_directive_the_unit_leaves_out_stops_some_of_the_agents_work() {
    let box_ = Ephemeral::boot();
    for (directive, stops) in [
        ("ProtectSystem=full", "sbx.usr"),
        ("ProtectHome=yes", "sbx.home"),
        // Not only set-uid files: it answers openat2 with ENOSYS (seccomp cannot look inside
        // openat2's flags), and the agent opens every path through openat2.
        ("RestrictSUIDSGID=yes", "any"),
        ("PrivateTmp=yes", "tmp"),
        ("SystemCallFilter=~@privileged", "any"),
        ("PrivateDevices=yes", "sbx.device"),
        ("ProcSubset=pid", "sbx.meminfo"),
    ] {
        let tried = work(&box_, directive);
        let shown = match (&tried, stops) {
            // PrivateTmp fails nothing: the file lands in a /tmp nobody else sees.
            (Ok(()), "tmp") => !box_.path("/tmp/mh-sbx-shared").exists(),
            // The agent cannot do its work at all.
            (Err(_), "any") => true,
            (Err(e), id) => e.contains(&format!("failed {id} ")),
            (Ok(()), _) => false,
        };
        assert!(shown, "{directive} did not stop {stops}: {tried:?}");
        undo(&box_);
        let _ = box_.run("rm", &["-f", "/tmp/mh-sbx-shared"]);
    }
}
