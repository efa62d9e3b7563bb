//! Cold and steady applies of 10,000 files of 1 KiB in 1,000 directories through the real
//! binary, side by side with CFEngine (`cf-agent`, Debian's `cfengine3`) on the same work in the
//! same run: a cold apply on a new ext4 filesystem (a loop image made anew for every cold run of
//! either tool, so no run pays for another's file churn), then the first steady apply and three
//! more. What to compare is the ratio within a run: these machines are noisy, and both tools
//! share the noise. Peak RSS of mesh-host's applies too.
//!
//! Run with `cargo bench --bench apply` as root; figures go in BENCHMARKS.md. Needs
//! `mkfs.ext4` and loop devices; CFEngine is installed with apt when absent, and where it cannot
//! be, its side is skipped with a message saying so. `MESH_HOST_BENCH_RUNS` sets how many rounds
//! (default 3); `MESH_HOST_BENCH_DIR` where the images are kept (default /var/tmp).
#![allow(clippy::disallowed_methods)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{apply_cli, declaration, dirs, median, FILES_PER_DIR};

/// An ext4 filesystem in a loop image made for one cold run, unmounted and deleted on drop.
struct Fresh {
    image: PathBuf,
    mount: PathBuf,
}

impl Fresh {
    fn new(base: &Path, name: &str) -> Fresh {
        let image = base.join(format!("mesh-host-bench-{name}.img"));
        let mount = base.join(format!("mesh-host-bench-{name}"));
        // What an interrupted earlier run left behind, if anything.
        let _ = Command::new("umount").arg(&mount).stderr(std::process::Stdio::null()).status();
        let _ = std::fs::remove_file(&image);
        std::fs::create_dir_all(&mount).unwrap();
        // 1 GiB is room for 10,000 files of 1 KiB, their directories, the store and the journal;
        // a larger node gets 12 KiB a file and an inode for each (ext4's default of one inode
        // per 16 KiB would run out at 100,000).
        let files = dirs() * (FILES_PER_DIR + 1);
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

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program).args(args).status().unwrap_or_else(|e| {
        panic!("cannot run {program}: {e}; the apply benchmark needs e2fsprogs and mount (loop images)")
    });
    assert!(status.success(), "{program} {args:?} failed: {status}");
}

/// The same tree as a CFEngine policy: each directory made with mode 0755, each file with its
/// whole content (the `content` attribute, CFEngine 3.16 and later) and mode 0644.
fn policy(root: &Path) -> String {
    let body = "x".repeat(1023);
    let mut p = String::with_capacity(12 << 20);
    p.push_str("body common control { bundlesequence => { \"main\" }; }\n");
    p.push_str("body perms m(mode) { mode => \"$(mode)\"; rxdirs => \"false\"; }\n");
    p.push_str("bundle agent main {\nfiles:\n");
    for d in 0..dirs() {
        let dir = root.join(format!("d{d:04}"));
        writeln!(p, "  \"{}/.\" create => \"true\", perms => m(\"0755\");", dir.display()).unwrap();
    }
    for d in 0..dirs() {
        let dir = root.join(format!("d{d:04}"));
        for f in 0..FILES_PER_DIR {
            writeln!(
                p,
                "  \"{}/f{f}.conf\" create => \"true\", content => \"{body}$(const.n)\", perms => m(\"0644\");",
                dir.display()
            )
            .unwrap();
        }
    }
    p.push_str("}\n");
    p
}

/// Runs `cf-agent` once on the policy, ignoring its locks (`-K`), as a cold or steady run.
fn cf_agent(policy: &Path) -> Duration {
    let start = Instant::now();
    let out = Command::new("cf-agent")
        .arg("-K")
        .arg("-f")
        .arg(policy)
        .output()
        .expect("cf-agent runs: apt-get install cfengine3");
    let took = start.elapsed();
    assert!(out.status.success(), "cf-agent failed: {}", String::from_utf8_lossy(&out.stderr));
    took
}

/// Checks that a tool made the whole tree: every file present with its 1 KiB.
fn check_tree(root: &Path) {
    for d in [0, dirs() / 2, dirs() - 1] {
        for f in 0..FILES_PER_DIR {
            let path = root.join(format!("d{d:04}/f{f}.conf"));
            let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            assert_eq!(len, 1024, "{} was not made", path.display());
        }
    }
}

/// One tool's times in one round: cold, first steady, and the steady ones after it.
struct Times {
    cold: Duration,
    first: Duration,
    steady: Vec<Duration>,
}

fn mesh_host(base: &Path, round: usize) -> Times {
    let fs = Fresh::new(base, &format!("mesh-{round}"));
    let root = fs.mount.join("tree");
    let decl = fs.mount.join("declaration.json");
    std::fs::write(&decl, serde_json::to_vec(&declaration(&root)).unwrap()).unwrap();
    let state = fs.mount.join("state/state.json");
    let cold = apply_cli(&decl, &state);
    check_tree(&root);
    let first = apply_cli(&decl, &state);
    let steady = (0..3).map(|_| apply_cli(&decl, &state)).collect();
    Times { cold, first, steady }
}

/// The largest peak RSS of any child so far, in MiB: mesh-host's applies (CFEngine's runs are
/// children too, so this is read before the first of them).
fn peak_rss_mib() -> f64 {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).unwrap();
    usage.max_rss() as f64 / 1024.0
}

/// Set when this run installed CFEngine: apt-get is a child too, and its peak RSS is then in
/// `peak_rss_mib`'s figure.
static INSTALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether `cf-agent` can run here, installing Debian's `cfengine3` first when it is absent.
fn cfengine_ready() -> bool {
    let present = || Command::new("cf-agent").arg("--version").output().is_ok_and(|o| o.status.success());
    if present() {
        return true;
    }
    INSTALLED.store(true, std::sync::atomic::Ordering::Relaxed);
    eprintln!("cf-agent is absent: installing Debian's cfengine3 for the comparison");
    let installed = Command::new("apt-get")
        .args(["install", "-y", "-qq", "cfengine3"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .is_ok_and(|s| s.success());
    // The package enables CFEngine's own daemons; the comparison runs `cf-agent -K` alone, so
    // they are stopped and masked where systemd runs them (best effort: nothing to do without
    // systemd as PID 1).
    let _ = Command::new("systemctl")
        .args([
            "mask",
            "--now",
            "cfengine3",
            "cf-execd",
            "cf-serverd",
            "cf-monitord",
            "cf-apache",
            "cf-hub",
            "cf-postgres",
            "cf-runalerts",
        ])
        .output();
    installed && present()
}

fn cfengine(base: &Path, round: usize) -> Times {
    let fs = Fresh::new(base, &format!("cfe-{round}"));
    let root = fs.mount.join("tree");
    let file = fs.mount.join("policy.cf");
    std::fs::write(&file, policy(&root)).unwrap();
    let cold = cf_agent(&file);
    check_tree(&root);
    let first = cf_agent(&file);
    let steady = (0..3).map(|_| cf_agent(&file)).collect();
    Times { cold, first, steady }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    assert!(nix::unistd::geteuid().is_root(), "the apply benchmark mounts loop images: run it as root");
    let base = PathBuf::from(std::env::var("MESH_HOST_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into()));
    let rounds: usize = std::env::var("MESH_HOST_BENCH_RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
    let peer = cfengine_ready();
    if !peer {
        println!(
            "CFEngine could not be installed (apt-get install cfengine3): its side is SKIPPED, no ratios"
        );
    }
    let (mut cold, mut first, mut steady) = (Vec::new(), Vec::new(), Vec::new());
    let mut rss = 0.0_f64;
    println!("apply of 10,000 files of 1 KiB in 1,000 directories, a new ext4 per cold run, mesh-host against CFEngine");
    for round in 0..rounds {
        // mesh-host first in even rounds, CFEngine first in odd ones, so neither always meets
        // the other's leftovers in the page cache or the disk's queue.
        let c_first = (peer && round % 2 == 1).then(|| cfengine(&base, round));
        let m = mesh_host(&base, round);
        if round == 0 || !peer {
            rss = rss.max(peak_rss_mib());
        }
        let c = c_first.or_else(|| peer.then(|| cfengine(&base, round)));
        let m_steady = median(m.steady.clone());
        print!(
            "round {round}: mesh-host cold {:.0} ms, first steady {:.0} ms, steady {:.0} ms",
            ms(m.cold),
            ms(m.first),
            ms(m_steady)
        );
        if let Some(c) = c {
            let c_steady = median(c.steady.clone());
            let ratio = |theirs: Duration, ours: Duration| theirs.as_secs_f64() / ours.as_secs_f64();
            println!(
                "; CFEngine {:.0}, {:.0}, {:.0} ms; ratios {:.2}x, {:.1}x, {:.1}x",
                ms(c.cold),
                ms(c.first),
                ms(c_steady),
                ratio(c.cold, m.cold),
                ratio(c.first, m.first),
                ratio(c_steady, m_steady)
            );
            cold.push(ratio(c.cold, m.cold));
            first.push(ratio(c.first, m.first));
            steady.push(ratio(c_steady, m_steady));
        } else {
            println!();
        }
    }
    if peer {
        let mid = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "median ratio (CFEngine's time / mesh-host's): cold {:.2}x, first steady {:.1}x, steady {:.1}x",
            mid(cold),
            mid(first),
            mid(steady)
        );
    }
    if INSTALLED.load(std::sync::atomic::Ordering::Relaxed) {
        println!("peak RSS of mesh-host's applies: {rss:.1} MiB, or of apt-get's install of CFEngine in this run (run again for mesh-host's alone)");
    } else {
        println!("peak RSS of mesh-host's applies: {rss:.1} MiB");
    }
}
