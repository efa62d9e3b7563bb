//! A node of 10,000 resources of every type, through the real binary against the real systems:
//! files of each kind (content, bytes, `into` JSON and env, create-once), directories, access
//! grants, archives, actions, users, installed packages, container networks and containers
//! (Docker), services and processes (the systemd testbed over D-Bus), and firewall openings
//! (nftables, in a network namespace of the bench's own, so the host's firewall is never
//! touched). A cold apply on a new ext4 filesystem, the first steady one, three more, and one
//! after drift of every kind the daemon meets (files edited by hand, containers and services
//! stopped, a process stopped, the firewall table flushed): wall time and the process's own peak
//! RSS, and how many resources of each type.
//!
//! Run with `cargo bench --bench mix` as root after `tests/testbed/up.sh` (Docker with
//! `local/busybox:1`, the systemd testbed); figures go in BENCHMARKS.md, section "A mix of every
//! type". Everything it made outside its filesystem (users, containers, networks, units, the
//! namespace) is removed at the end, and at the start from an interrupted run.
#![allow(clippy::disallowed_methods, reason = "a benchmark plays the person at the machine")]

mod common;
use common::{measured, median, Fresh, Kib};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use mesh_host::system::Systemd;

const TOTAL: usize = 10_000;
const DIRS: usize = 1_000;
const USERS: usize = 20;
const PACKAGES: [&str; 10] =
    ["coreutils", "bash", "tar", "gzip", "dpkg", "findutils", "grep", "sed", "util-linux", "procps"];
const NETWORKS: usize = 2;
const CONTAINERS: usize = 20;
const SERVICES: usize = 20;
const PROCESSES: usize = 20;
const ACTIONS: usize = 200;
const OPENINGS: usize = 50;
const ARCHIVES: usize = 200;
const ACCESS: usize = 200;
/// Of the files, how many of each kind other than plain `content` (the rest).
const BYTES: usize = 1_000;
const INTO_JSON: usize = 300;
const INTO_ENV: usize = 300;
const CREATE_ONCE: usize = 300;

const IMAGE: &str = "local/busybox:1";
const NSPAWN: &str = "/var/lib/machines/mesh-host-testbed";
const SOCKET: &str = "/run/mesh-host-testbed/bus/system_bus_socket";
/// Every name the bench gives outside its filesystem starts with this, so that cleaning up
/// after an interrupted run finds them.
const PREFIX: &str = "mhmix";
const NETNS: &str = "mhmix";

fn files() -> usize {
    TOTAL
        - DIRS
        - USERS
        - PACKAGES.len()
        - NETWORKS
        - CONTAINERS
        - SERVICES
        - PROCESSES
        - ACTIONS
        - OPENINGS
        - ARCHIVES
        - ACCESS
}

/// The `i`-th file's kind, by its extension: `bytes`, `into` JSON, `into` env, create-once,
/// or plain `content`, in that order of ranges.
fn ext(i: usize) -> &'static str {
    if i < BYTES {
        "bin"
    } else if i < BYTES + INTO_JSON {
        "json"
    } else if i < BYTES + INTO_JSON + INTO_ENV {
        "env"
    } else if i < BYTES + INTO_JSON + INTO_ENV + CREATE_ONCE {
        "once"
    } else {
        "conf"
    }
}

/// The `i`-th file's path.
fn file(root: &Path, i: usize) -> PathBuf {
    dir(root, i).join(format!("f{i}.{}", ext(i)))
}

fn dir(root: &Path, i: usize) -> PathBuf {
    root.join(format!("d{:04}", i % DIRS))
}

/// A small tar.gz of five files, different for each archive.
fn archive(i: usize) -> String {
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    for f in 0..5 {
        let body = format!("archive {i} file {f}\n");
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, format!("f{f}.txt"), body.as_bytes()).unwrap();
    }
    base64::engine::general_purpose::STANDARD.encode(tar.into_inner().unwrap().finish().unwrap())
}

fn declaration(root: &Path) -> serde_json::Value {
    use serde_json::json;
    let mut r = Vec::with_capacity(TOTAL);
    for i in 0..USERS {
        r.push(json!({"type": "user", "id": format!("mix.user{i}"), "name": format!("{PREFIX}u{i}"), "system": true}));
    }
    for p in PACKAGES {
        r.push(json!({"type": "package", "id": format!("mix.pkg-{p}"), "package": p}));
    }
    for i in 0..DIRS {
        r.push(json!({"type": "directory", "id": format!("mix.d{i}"), "path": dir(root, i)}));
    }
    for i in 0..ACCESS {
        r.push(
            json!({"type": "access", "id": format!("mix.access{i}"), "path": root.join(format!("ops/o{i}"))}),
        );
    }
    let body = "x".repeat(1023) + "\n";
    let bytes = base64::engine::general_purpose::STANDARD.encode(body.as_bytes());
    for i in 0..files() {
        let (id, path) = (format!("mix.f{i}"), file(root, i));
        r.push(match ext(i) {
            "bin" => json!({"type": "file", "id": id, "path": path, "bytes": bytes}),
            "json" => json!({"type": "file", "id": id, "path": path, "into": "json", "content": format!("{{\"key\": {i}}}")}),
            "env" => json!({"type": "file", "id": id, "path": path, "into": "env", "content": format!("KEY={i}\n")}),
            "once" => json!({"type": "file", "id": id, "path": path, "create-once": true, "content": body}),
            _ => json!({"type": "file", "id": id, "path": path, "content": body}),
        });
    }
    for i in 0..ARCHIVES {
        r.push(json!({"type": "archive", "id": format!("mix.archive{i}"), "path": dir(root, i).join(format!("a{i}")), "bytes": archive(i)}));
    }
    for i in 0..ACTIONS {
        let done = dir(root, i).join(format!("action{i}.done"));
        r.push(json!({"type": "action", "id": format!("mix.action{i}"),
            "command": ["/usr/bin/touch", done], "verify": ["/usr/bin/test", "-e", done]}));
    }
    for i in 0..NETWORKS {
        r.push(json!({"type": "network", "id": format!("mix.net{i}"), "name": format!("{PREFIX}-n{i}")}));
    }
    for i in 0..CONTAINERS {
        r.push(json!({"type": "container", "id": format!("mix.c{i}"), "name": format!("{PREFIX}-c{i}"), "image": IMAGE,
            "network": format!("{PREFIX}-n{}", i % NETWORKS), "args": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]}));
    }
    for i in 0..SERVICES {
        r.push(json!({"type": "service", "id": format!("mix.s{i}"), "unit": format!("{PREFIX}-s{i}.service"), "state": "running"}));
    }
    for i in 0..PROCESSES {
        r.push(json!({"type": "process", "id": format!("mix.p{i}"), "name": format!("{PREFIX}-p{i}"), "command": ["/bin/sleep", "infinity"]}));
    }
    for i in 0..OPENINGS {
        r.push(json!({"type": "opening", "id": format!("mix.open{i}"), "port": 20_000 + i}));
    }
    assert_eq!(r.len(), TOTAL);
    json!({"version": 1, "resources": r})
}

/// Runs a command, ignoring how it ends (cleanup, where the thing may be absent already).
fn quiet(program: &str, args: &[&str]) {
    let _ = Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

fn must(program: &str, args: &[&str]) {
    let out =
        Command::new(program).args(args).output().unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The systemd testbed, through mesh-host's own D-Bus client (the host's systemctl cannot reach
/// a systemd that is not PID 1 here).
fn systemd() -> Systemd {
    Systemd::connect(Some(&format!("unix:path={SOCKET}"))).expect("the systemd testbed answers on its bus")
}

/// The units of the services and processes.
fn units() -> Vec<String> {
    let mut units: Vec<String> = (0..SERVICES).map(|i| format!("{PREFIX}-s{i}.service")).collect();
    units.extend((0..PROCESSES).map(|i| format!("mesh-host-{PREFIX}-p{i}.service")));
    units
}

/// What this bench made outside its filesystem, removed (best effort: some may not exist).
fn cleanup() {
    for i in 0..CONTAINERS {
        quiet("docker", &["rm", "-f", &format!("{PREFIX}-c{i}")]);
    }
    for i in 0..NETWORKS {
        quiet("docker", &["network", "rm", &format!("{PREFIX}-n{i}")]);
    }
    for i in 0..USERS {
        quiet("userdel", &[&format!("{PREFIX}u{i}")]);
    }
    let sd = systemd();
    for unit in units() {
        let _ = sd.stop(&unit);
    }
    for i in 0..SERVICES {
        let _ = std::fs::remove_file(format!("{NSPAWN}/etc/systemd/system/{PREFIX}-s{i}.service"));
    }
    let _ = sd.reload_manager();
    quiet("ip", &["netns", "del", NETNS]);
}

/// The bench's units in the systemd testbed, its namespace, and the operator's directories the
/// access grants name.
fn setup(root: &Path) {
    for i in 0..SERVICES {
        std::fs::write(
            format!("{NSPAWN}/etc/systemd/system/{PREFIX}-s{i}.service"),
            "[Service]\nExecStart=/bin/sleep infinity\n",
        )
        .expect("the unit file is written into the systemd testbed");
    }
    systemd().reload_manager().expect("the testbed's systemd reloads its units");
    must("ip", &["netns", "add", NETNS]);
    must("ip", &["-n", NETNS, "link", "set", "lo", "up"]);
    for i in 0..ACCESS {
        std::fs::create_dir_all(root.join(format!("ops/o{i}"))).unwrap();
    }
}

/// One `mesh-host apply` in the bench's namespace: wall time and peak RSS (`ip netns exec`
/// execs the agent in its own place, so the figures are the agent's).
fn apply(decl: &Path, state: &Path) -> (Duration, Kib) {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", NETNS])
        .arg(env!("CARGO_BIN_EXE_mesh-host"))
        .env("MESH_HOST_LOG", "warn")
        .arg("--state")
        .arg(state)
        .arg("--bus")
        .arg(format!("unix:path={SOCKET}"))
        .arg("apply")
        .arg(decl);
    measured(&mut cmd, "mesh-host apply of the mix")
}

/// Drift of every kind the daemon meets: one file in a hundred edited, two containers and two
/// services stopped, a process stopped, the host's firewall table deleted.
fn drift(root: &Path) {
    for i in (0..files()).step_by(100) {
        // An owned key's value changed by hand in the files that belong to someone else; a
        // create-once file is the program's own and is not drift.
        let edit: &[u8] = match ext(i) {
            "once" => continue,
            "json" => b"{\"key\": \"edited by hand\"}\n",
            "env" => b"KEY=edited-by-hand\n",
            _ => b"edited by hand\n",
        };
        std::fs::write(file(root, i), edit).unwrap();
    }
    for i in 0..2 {
        must("docker", &["stop", "-t", "1", &format!("{PREFIX}-c{i}")]);
    }
    let sd = systemd();
    for unit in [
        format!("{PREFIX}-s0.service"),
        format!("{PREFIX}-s1.service"),
        format!("mesh-host-{PREFIX}-p0.service"),
    ] {
        sd.stop(&unit).unwrap_or_else(|e| panic!("stopping {unit}: {e}"));
    }
    must("ip", &["netns", "exec", NETNS, "nft", "delete", "table", "inet", "mesh_host"]);
}

/// The drift was put back: a file, the containers, the services, the process, the table.
fn check(root: &Path) {
    let conf = file(root, files() - 100);
    assert_ne!(std::fs::read(&conf).unwrap(), b"edited by hand\n", "{} was not put back", conf.display());
    for i in 0..2 {
        let out = Command::new("docker")
            .args(["inspect", "-f", "{{.State.Running}}", &format!("{PREFIX}-c{i}")])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "true",
            "container {PREFIX}-c{i} is not running again"
        );
    }
    let sd = systemd();
    for unit in [format!("{PREFIX}-s0.service"), format!("mesh-host-{PREFIX}-p0.service")] {
        assert!(sd.state(&unit).unwrap().running(), "{unit} is not running again");
    }
    must("ip", &["netns", "exec", NETNS, "nft", "list", "table", "inet", "mesh_host"]);
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the mix benchmark adds users and mounts a loop image: run it as root"
    );
    common::require_docker_image(IMAGE);
    common::require_systemd_testbed(SOCKET);
    // mesh-host's D-Bus client blocks on a runtime's handle; the bench's thread is in one.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let _runtime = rt.enter();
    cleanup();

    let base = PathBuf::from(std::env::var("MESH_HOST_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into()));
    let fs = Fresh::new(&base, "mix", TOTAL);
    let root = fs.mount.join("tree");
    setup(&root);
    let decl = fs.mount.join("declaration.json");
    std::fs::write(&decl, serde_json::to_vec(&declaration(&root)).unwrap()).unwrap();
    let state = fs.mount.join("state/state.json");

    let (cold, cold_rss) = apply(&decl, &state);
    let (first, mut rss) = apply(&decl, &state);
    let steady: Vec<Duration> = (0..3)
        .map(|_| {
            let (t, r) = apply(&decl, &state);
            rss = rss.max(r);
            t
        })
        .collect();
    drift(&root);
    let (drifted, r) = apply(&decl, &state);
    rss = rss.max(r);
    check(&root);
    cleanup();

    println!(
        "mix of {TOTAL} resources: {} files ({BYTES} bytes, {INTO_JSON} into json, {INTO_ENV} into env, {CREATE_ONCE} create-once, the rest content), \
         {DIRS} directories, {ACCESS} access, {ARCHIVES} archives, {ACTIONS} actions, {USERS} users, {} packages, {NETWORKS} networks, \
         {CONTAINERS} containers, {SERVICES} services, {PROCESSES} processes, {OPENINGS} openings",
        files(),
        PACKAGES.len()
    );
    println!(
        "  cold {:.0} ms, first steady {:.0} ms, steady {:.0} ms (runs {}), drift {:.0} ms",
        ms(cold),
        ms(first),
        ms(median(steady.clone())),
        steady.iter().map(|d| format!("{:.0}", ms(*d))).collect::<Vec<_>>().join(", "),
        ms(drifted)
    );
    println!(
        "  peak RSS, the agent's own: cold {:.1} MiB, steady and drift {:.1} MiB",
        cold_rss.mib(),
        rss.mib()
    );
}
