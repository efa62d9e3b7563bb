//! Cold and steady applies of 10,000 files of 1 KiB in 1,000 directories (`MESH_HOST_BENCH_FILES`
//! for another size) through the real binary, side by side with CFEngine (`cf-agent`, Debian's
//! `cfengine3`) on the same work in the same run: a cold apply on a new ext4 filesystem (a loop
//! image made anew for every cold run of either tool, so no run pays for another's file churn),
//! then the first steady apply, three more, and one after a file in a hundred was edited by
//! hand. What to compare is the ratio within a run: these machines are noisy, and both tools
//! share the noise. Each process's own peak RSS too, of either tool.
//!
//! Run with `cargo bench --bench apply` as root; figures go in BENCHMARKS.md. Needs
//! `mkfs.ext4` and loop devices; CFEngine is installed with apt when absent, and where it cannot
//! be, its side is skipped with a message saying so. `MESH_HOST_BENCH_RUNS` sets how many rounds
//! (default 3); `MESH_HOST_BENCH_DIR` where the images are kept (default /var/tmp).
#![allow(clippy::disallowed_methods)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use common::{apply_measured, declaration, dirs, measured, median, Fresh, Kib, FILES_PER_DIR};

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
fn cf_agent(policy: &Path) -> (Duration, Kib) {
    measured(Command::new("cf-agent").arg("-K").arg("-f").arg(policy), "cf-agent (apt-get install cfengine3)")
}

/// Hand-edits one file in a hundred (the same ones for either tool): the drift the apply after
/// it puts back.
fn drift(root: &Path) {
    for d in (0..dirs()).step_by(10) {
        std::fs::write(root.join(format!("d{d:04}/f0.conf")), b"edited by hand\n").unwrap();
    }
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

/// One tool's times in one round: cold, first steady, the steady ones after it, and the apply
/// after one file in a hundred was edited by hand; the peak RSS of a cold run and of any steady
/// one.
struct Times {
    cold: Duration,
    first: Duration,
    steady: Vec<Duration>,
    drift: Duration,
    cold_rss: Kib,
    steady_rss: Kib,
}

/// A cold apply, the first steady one, three more, then one after a drift, each measured by
/// `run`; the tree is checked after the cold one and after the drift.
fn rounds(root: &Path, mut run: impl FnMut() -> (Duration, Kib)) -> Times {
    let (cold, cold_rss) = run();
    check_tree(root);
    let (first, mut steady_rss) = run();
    let mut steady = Vec::new();
    for _ in 0..3 {
        let (t, rss) = run();
        steady.push(t);
        steady_rss = steady_rss.max(rss);
    }
    drift(root);
    let (drift, rss) = run();
    check_tree(root);
    let edited = root.join("d0000/f0.conf");
    assert_eq!(std::fs::read(&edited).unwrap(), common::body(), "{} was not put back", edited.display());
    Times { cold, first, steady, drift, cold_rss, steady_rss: steady_rss.max(rss) }
}

fn mesh_host(base: &Path, round: usize) -> Times {
    let fs = Fresh::new(base, &format!("mesh-{round}"), dirs() * (FILES_PER_DIR + 1));
    let root = fs.mount.join("tree");
    let decl = fs.mount.join("declaration.json");
    std::fs::write(&decl, serde_json::to_vec(&declaration(&root)).unwrap()).unwrap();
    let state = fs.mount.join("state/state.json");
    rounds(&root, || apply_measured(&decl, &state))
}

/// Whether `cf-agent` can run here, installing Debian's `cfengine3` first when it is absent.
fn cfengine_ready() -> bool {
    let present = || Command::new("cf-agent").arg("--version").output().is_ok_and(|o| o.status.success());
    if present() {
        return true;
    }
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
    let fs = Fresh::new(base, &format!("cfe-{round}"), dirs() * (FILES_PER_DIR + 1));
    let root = fs.mount.join("tree");
    let file = fs.mount.join("policy.cf");
    std::fs::write(&file, policy(&root)).unwrap();
    rounds(&root, || cf_agent(&file))
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
    let mut ratios: [Vec<f64>; 4] = Default::default();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    println!(
        "apply of {} files of 1 KiB in {} directories, a new ext4 per cold run, mesh-host against CFEngine; drift: one file in a hundred edited by hand",
        dirs() * FILES_PER_DIR,
        dirs()
    );
    for round in 0..rounds {
        // mesh-host first in even rounds, CFEngine first in odd ones, so neither always meets
        // the other's leftovers in the page cache or the disk's queue.
        let c_first = (peer && round % 2 == 1).then(|| cfengine(&base, round));
        let m = mesh_host(&base, round);
        let c = c_first.or_else(|| peer.then(|| cfengine(&base, round)));
        let m_steady = median(m.steady.clone());
        print!(
            "round {round}: mesh-host cold {:.0} ms, first steady {:.0} ms, steady {:.0} ms, drift {:.0} ms",
            ms(m.cold),
            ms(m.first),
            ms(m_steady),
            ms(m.drift)
        );
        if let Some(c) = &c {
            let c_steady = median(c.steady.clone());
            let ratio = |theirs: Duration, ours: Duration| theirs.as_secs_f64() / ours.as_secs_f64();
            let r = [
                ratio(c.cold, m.cold),
                ratio(c.first, m.first),
                ratio(c_steady, m_steady),
                ratio(c.drift, m.drift),
            ];
            println!(
                "; CFEngine {:.0}, {:.0}, {:.0}, {:.0} ms; ratios {:.2}x, {:.1}x, {:.1}x, {:.1}x",
                ms(c.cold),
                ms(c.first),
                ms(c_steady),
                ms(c.drift),
                r[0],
                r[1],
                r[2],
                r[3]
            );
            for (all, r) in ratios.iter_mut().zip(r) {
                all.push(r);
            }
        } else {
            println!();
        }
        ours.push(m);
        theirs.extend(c);
    }
    if peer {
        let mid = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let [cold, first, steady, drift] = &mut ratios;
        println!(
            "median ratio (CFEngine's time / mesh-host's): cold {:.2}x, first steady {:.1}x, steady {:.1}x, drift {:.1}x",
            mid(cold),
            mid(first),
            mid(steady),
            mid(drift)
        );
    }
    let peaks = |t: &[Times]| {
        (
            t.iter().map(|t| t.cold_rss).max().unwrap_or_default().mib(),
            t.iter().map(|t| t.steady_rss).max().unwrap_or_default().mib(),
        )
    };
    let (cold, steady) = peaks(&ours);
    print!("peak RSS, each process's own: mesh-host cold {cold:.1} MiB, steady {steady:.1} MiB");
    if peer {
        let (cold, steady) = peaks(&theirs);
        println!("; CFEngine cold {cold:.1} MiB, steady {steady:.1} MiB");
    } else {
        println!();
    }
}
