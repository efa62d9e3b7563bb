//! What the benchmark harnesses share: the declaration of files in directories of ten, 10,000
//! files by default; `MESH_HOST_BENCH_FILES` chooses another size (1,000 or 100,000 for the
//! growth figures in BENCHMARKS.md), always ten files per directory.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

pub mod fleet;

pub const FILES_PER_DIR: usize = 10;

/// How many directories the declaration has: `MESH_HOST_BENCH_FILES` / 10 (1,000 by default).
pub fn dirs() -> usize {
    let files: usize =
        std::env::var("MESH_HOST_BENCH_FILES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    (files / FILES_PER_DIR).max(1)
}

/// `dirs()` directories of 10 files of 1 KiB each, under `root`.
pub fn declaration(root: &Path) -> serde_json::Value {
    let dirs = dirs();
    let mut resources = Vec::with_capacity(dirs * (FILES_PER_DIR + 1));
    let body: String = "x".repeat(1023) + "\n";
    for d in 0..dirs {
        let dir = root.join(format!("d{d:04}"));
        resources.push(serde_json::json!({"type": "directory", "id": format!("bench.d{d}"), "path": dir}));
        for f in 0..FILES_PER_DIR {
            resources.push(serde_json::json!({
                "type": "file", "id": format!("bench.d{d}.f{f}"),
                "path": dir.join(format!("f{f}.conf")), "content": body,
            }));
        }
    }
    serde_json::json!({"version": 1, "resources": resources})
}

/// The body every benchmark file holds.
pub fn body() -> Vec<u8> {
    ("x".repeat(1023) + "\n").into_bytes()
}

/// CPU seconds (user + system) a process has used, from /proc.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// CPU seconds so far of each thread of `pid`, by the thread's name (threads of one name
/// summed: tokio's workers, say), from /proc/PID/task/*/stat.
pub fn thread_cpu_seconds(pid: u32) -> std::collections::BTreeMap<String, f64> {
    let mut by_name = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return by_name };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let name = stat[open + 1..close].to_string();
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let ticks: f64 = fields[11].parse::<f64>().unwrap_or(0.0) + fields[12].parse::<f64>().unwrap_or(0.0);
        *by_name.entry(name).or_insert(0.0) += ticks / 100.0;
    }
    by_name
}

/// A field of /proc/PID/status in KiB (VmRSS, VmHWM).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Runs `mesh-host apply` once through the real binary; returns its wall time.
pub fn apply_cli(decl: &Path, state: &Path) -> Duration {
    apply_measured(decl, state).0
}

/// Runs `mesh-host apply` once through the real binary; its wall time and its own peak RSS.
pub fn apply_measured(decl: &Path, state: &Path) -> (Duration, Kib) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mesh-host"));
    cmd.env("MESH_HOST_LOG", "warn").arg("--state").arg(state).arg("apply").arg(decl);
    measured(&mut cmd, "mesh-host apply")
}

/// A peak resident size, in KiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Kib(pub u64);

impl Kib {
    pub fn mib(self) -> f64 {
        self.0 as f64 / 1024.0
    }
}

/// Runs a command to its end, its output kept in a temporary file for a failure's message:
/// its wall time and its own peak resident size. The peak is counted by GNU time around it
/// (`/usr/bin/time -f %M`), not by this process's `wait4`: a child spawned here starts from
/// this process's memory (vfork shares it, and the kernel keeps the peak across exec), so at
/// 100,000 files every tool measured that way showed the harness's own 394.5 MiB. time's
/// child is forked from time, a small process, and its peak is its own.
pub fn measured(cmd: &mut Command, what: &str) -> (Duration, Kib) {
    use std::io::{Read as _, Seek as _};
    let mut err = tempfile::tempfile().unwrap();
    let peak = tempfile::NamedTempFile::new().unwrap();
    let mut timed = Command::new("/usr/bin/time");
    timed
        .arg("-f")
        .arg("%M")
        .arg("-o")
        .arg(peak.path())
        .arg("--")
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => timed.env(k, v),
            None => timed.env_remove(k),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        timed.current_dir(dir);
    }
    let start = Instant::now();
    let status = timed
        .stdout(err.try_clone().unwrap())
        .stderr(err.try_clone().unwrap())
        .status()
        .unwrap_or_else(|e| panic!("{what} cannot run under /usr/bin/time (apt-get install time): {e}"));
    let took = start.elapsed();
    if !status.success() {
        let mut text = String::new();
        err.rewind().unwrap();
        err.read_to_string(&mut text).unwrap();
        panic!("{what} failed: {text}");
    }
    let kib = std::fs::read_to_string(peak.path())
        .ok()
        .and_then(|t| t.lines().last().and_then(|l| l.trim().parse().ok()))
        .unwrap_or_else(|| panic!("/usr/bin/time gave no peak for {what}"));
    (took, Kib(kib))
}

pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// An ext4 filesystem in a loop image made for one cold run, unmounted and deleted on drop: no
/// run pays for another's file churn (ext4 slows file creation after mass deletes).
pub struct Fresh {
    image: std::path::PathBuf,
    pub mount: std::path::PathBuf,
}

impl Fresh {
    /// Room for `files` inodes: 1 GiB at least, 12 KiB a file past that, and an inode for each
    /// (ext4's default of one inode per 16 KiB would run out at 100,000 files of 1 KiB).
    pub fn new(base: &Path, name: &str, files: usize) -> Fresh {
        let image = base.join(format!("mesh-host-bench-{name}.img"));
        let mount = base.join(format!("mesh-host-bench-{name}"));
        // What an interrupted earlier run left behind, if anything.
        let _ = Command::new("umount").arg(&mount).stderr(std::process::Stdio::null()).status();
        let _ = std::fs::remove_file(&image);
        std::fs::create_dir_all(&mount).unwrap();
        let size = format!("{}M", (files * 12 / 1024).max(1024));
        let inodes = (files + files / 4 + 1024).to_string();
        run("truncate", &["-s", &size, image.to_str().unwrap()]);
        run("mkfs.ext4", &["-q", "-F", "-N", &inodes, image.to_str().unwrap()]);
        run("mount", &["-o", "loop", image.to_str().unwrap(), mount.to_str().unwrap()]);
        Fresh { image, mount }
    }
}

impl Drop for Fresh {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = std::fs::remove_file(&self.image);
        let _ = std::fs::remove_dir(&self.mount);
    }
}

/// Runs a setup command to success, or panics naming it.
pub fn run(program: &str, args: &[&str]) {
    let status = Command::new(program).args(args).status().unwrap_or_else(|e| {
        panic!("cannot run {program}: {e}; the benchmark needs e2fsprogs and mount (loop images)")
    });
    assert!(status.success(), "{program} {args:?} failed: {status}");
}

/// Panics, saying how to get it, unless a Docker engine here holds `image`.
pub fn require_docker_image(image: &str) {
    let ok =
        Command::new("docker").args(["image", "inspect", image]).output().is_ok_and(|o| o.status.success());
    assert!(ok, "no Docker engine with {image}: run tests/testbed/up.sh (as root) first");
}

/// Panics, saying how to get it, unless the systemd testbed's bus is at `socket`.
pub fn require_systemd_testbed(socket: &str) {
    assert!(
        Path::new(socket).exists(),
        "no systemd testbed at {socket}: run tests/testbed/up.sh (as root) first"
    );
}
