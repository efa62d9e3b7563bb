//! The FUSE power-loss lane (tests/powerloss/README.md) and the findings it made, each a
//! regression test named after it. Root and `/dev/fuse` (the `fuse3` package's kernel side) are
//! needed; a machine without them fails here saying so.

use std::path::{Path, PathBuf};

use mesh_host_powerloss::check;
use mesh_host_powerloss::fuse::Mounted;
use mesh_host_powerloss::lane;
use mesh_host_powerloss::model::{crash_state, Crash, Tree};
use serde_json::json;

fn needs_fuse() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "the power-loss lane needs /dev/fuse: load the fuse module (modprobe fuse) and run as root"
    );
}

fn agent() -> PathBuf {
    assert_cmd::cargo::cargo_bin("mesh-host")
}

/// The mutant build (`--features powerloss-mutant`): the one tests/run.sh built
/// (`MESH_HOST_POWERLOSS_MUTANT`), or else built now in a target directory of its own.
fn mutant() -> PathBuf {
    if let Some(built) = std::env::var_os("MESH_HOST_POWERLOSS_MUTANT") {
        return PathBuf::from(built);
    }
    let real = agent();
    let target = real.parent().and_then(Path::parent).expect("the binary is in a target dir");
    let mutant_target = target.join("powerloss-mutant");
    let status = crate::support::cargo_command()
        .args(["build", "--quiet", "--features", "powerloss-mutant", "--bin", "mesh-host", "--target-dir"])
        .arg(&mutant_target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo runs");
    assert!(status.success(), "the mutant did not build");
    mutant_target.join("debug/mesh-host")
}

/// Mounts an empty `PowerFs` at `dir/mnt` with `m/` and `state/` made durable.
fn mount(dir: &Path) -> (PathBuf, Mounted) {
    needs_fuse();
    let at = dir.join("mnt");
    std::fs::create_dir_all(&at).unwrap();
    let m = Mounted::mount(&at, Tree::new()).expect("the FUSE filesystem mounts");
    for d in ["m", "state"] {
        std::fs::create_dir(at.join(d)).unwrap();
    }
    std::fs::File::open(&at).unwrap().sync_all().unwrap();
    (at, m)
}

fn apply(at: &Path, declaration: &Path) {
    let out = std::process::Command::new(agent())
        .arg("--state")
        .arg(at.join("state/state.json"))
        .args(["apply", "--json"])
        .arg(declaration)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// What a power cut right after the apply returned leaves of the managed tree, beside what the
/// apply left there.
fn after_a_crash(m: &Mounted) -> (check::Snapshot, check::Snapshot) {
    let s = m.lock();
    let crashed = crash_state(&s.base, &s.log, s.log.len(), Crash::DropAll);
    (check::snapshot_tree(&crashed, "m"), check::snapshot_tree(&s.tree, "m"))
}

fn declare(dir: &Path, resources: serde_json::Value) -> PathBuf {
    let path = dir.join(format!("declaration-{}.json", rand_name()));
    std::fs::write(&path, serde_json::to_vec(&json!({"version": 1, "resources": resources})).unwrap())
        .unwrap();
    path
}

fn rand_name() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// The finding: a batch's one syncfs per filesystem promised nothing on FUSE, where syncfs
/// never reaches the server; a power cut after the apply reported the files created lost them
/// all. Now each file and directory is fsynced there.
#[test]
fn syncfs_on_fuse_is_not_trusted() {
    let scratch = tempfile::tempdir().unwrap();
    let (at, m) = mount(scratch.path());
    let mut resources = Vec::new();
    for d in 0..2 {
        resources
            .push(json!({"type": "directory", "id": format!("d{d}"), "path": at.join(format!("m/d{d}"))}));
        for f in 0..10 {
            resources.push(json!({"type": "file", "id": format!("d{d}.f{f}"),
                "path": at.join(format!("m/d{d}/f{f}")), "content": format!("{d} {f}\n")}));
        }
    }
    apply(&at, &declare(scratch.path(), json!(resources)));
    let (crashed, live) = after_a_crash(&m);
    assert_eq!(live.len(), 22);
    assert_eq!(crashed, live, "a power cut after the apply lost what it reported created");
    m.unmount().unwrap();
}

/// The second finding: a mode or owner changed in place (no new content) was recorded without
/// being synced, so a power cut put the old mode back under a store that said the new one.
#[test]
fn a_change_in_place_is_durable_before_it_is_recorded() {
    let scratch = tempfile::tempdir().unwrap();
    let (at, m) = mount(scratch.path());
    let file = |f: usize, mode: &str| json!({"type": "file", "id": format!("f{f}"), "path": at.join(format!("m/f{f}")), "content": "x\n", "mode": mode});
    apply(&at, &declare(scratch.path(), json!([file(0, "0644"), file(1, "0644")])));
    apply(&at, &declare(scratch.path(), json!([file(0, "0600"), file(1, "0640")])));
    let (crashed, live) = after_a_crash(&m);
    assert_eq!(live["f0"].mode, 0o600);
    assert_eq!(crashed, live, "a power cut after the apply undid the modes it reported");
    m.unmount().unwrap();
}

/// The finding on btrfs (the VM lane's failpoint workload, RELIABILITY.md): a pass that died
/// between its renames and their sync left the new files in place but not durable; the next
/// pass found them holding the journal's intent, kept them as they were and recorded them
/// without a sync of its own, and a power cut then put the old files back under a store that
/// said the new ones. Here FUSE drops every rename not synced, as btrfs's per-inode log did.
#[test]
fn a_file_found_after_a_crash_as_the_crashed_pass_left_it_is_durable_before_it_is_recorded() {
    let scratch = tempfile::tempdir().unwrap();
    let (at, m) = mount(scratch.path());
    let files = |content: &str| {
        let list: Vec<_> = (0..6)
            .map(|f| json!({"type": "file", "id": format!("f{f}"), "path": at.join(format!("m/f{f}")), "content": format!("{content} {f}\n")}))
            .collect();
        declare(scratch.path(), json!(list))
    };
    apply(&at, &files("old"));
    let new = files("new");
    // The changing pass dies right after its renames, before it syncs them.
    let out = std::process::Command::new(agent())
        .env("MESH_HOST_FAILPOINT", "batch-renamed")
        .arg("--state")
        .arg(at.join("state/state.json"))
        .args(["apply", "--json"])
        .arg(&new)
        .output()
        .unwrap();
    assert!(!out.status.success(), "the failpoint did not stop the pass");
    assert!(at.join("state/state.json.journal").exists(), "the crashed pass left no journal");
    // The next pass finds the new files in place and records them.
    apply(&at, &new);
    let (crashed, live) = after_a_crash(&m);
    assert!(String::from_utf8_lossy(&std::fs::read(at.join("m/f0")).unwrap()).starts_with("new"));
    assert_eq!(crashed, live, "a power cut after the next pass put back files its store says are new");
    m.unmount().unwrap();
}

fn run_lane(agent: PathBuf) -> Vec<lane::Tally> {
    needs_fuse();
    let scratch = tempfile::tempdir().unwrap();
    let (mount, work) = (scratch.path().join("mnt"), scratch.path().join("work"));
    std::fs::create_dir_all(&mount).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let cfg = lane::Config { agent, mount, work, served: 2, boundaries: 16, seed: 7 };
    let tallies = lane::run(&cfg).expect("the lane runs");
    for t in &tallies {
        eprintln!("{} served={} other={}", t.line(), t.served, t.other);
        for e in &t.examples {
            eprintln!("  {e}");
        }
    }
    tallies
}

/// The lane on the real build: every crash state of the cold apply, the changing apply and the
/// daemon's corrections checked, none torn, lost or ahead, and the next apply converging.
#[test]
fn the_fuse_lane_finds_nothing_wrong_with_the_real_build() {
    let tallies = run_lane(agent());
    assert_eq!(tallies.len(), 3);
    for t in &tallies {
        assert!(t.states > 0 && t.served > 0, "{}", t.line());
        assert_eq!((t.torn, t.lost, t.ahead, t.other), (0, 0, 0, 0), "{}: {:?}", t.line(), t.examples);
    }
}

/// The lane can fail: the mutant build (`--features powerloss-mutant`, every sync a no-op) must
/// be caught losing or tearing files.
#[test]
fn the_fuse_lane_finds_losses_in_the_mutant_that_never_syncs() {
    let tallies = run_lane(mutant());
    let lost: usize = tallies.iter().map(|t| t.torn + t.lost).sum();
    assert!(lost > 0, "the lane saw no loss in a build that never syncs: {tallies:?}");
}

/// The rename-first shortcut (docs/durability.md, "Durability at scale"): one file put over an
/// existing one is renamed first and synced after only where the filesystem commits a replacing
/// rename after the new file's data, ext4 with its default options; mounted `noauto_da_alloc`
/// that guarantee is gone and the agent must sync the new file before the rename. Shown here by
/// the order of the calls themselves (strace, on the host: under the VM lane's TCG it stalled),
/// on two loop-mounted ext4 filesystems made for the test.
#[test]
fn the_rename_first_shortcut_is_taken_on_ext4_and_refused_with_noauto_da_alloc() {
    let strace = std::process::Command::new("sh").args(["-c", "command -v strace"]).output().unwrap();
    assert!(strace.status.success(), "strace is missing: apt-get install strace (tests/testbed/up.sh)");
    for (options, rename_first) in [("", true), ("noauto_da_alloc", false)] {
        let s = crate::support::Scratch::new();
        let m = crate::faults::Mount::ext4_with(s.path("mnt"), "16M", options);
        let target = m.dir.join("shortcut.conf");
        let declare = |content: &str| {
            s.declare(json!([{"type": "file", "id": "a.conf", "path": target.display().to_string(), "content": content}]))
        };
        assert_eq!(s.apply(&declare("one\n")).0, 0);
        let trace = s.path("strace.out");
        let out = std::process::Command::new("strace")
            .args(["-f", "-qq", "-y", "-e", "trace=fsync,fdatasync,rename,renameat,renameat2", "-o"])
            .arg(&trace)
            .arg(agent())
            .arg("--state")
            .arg(s.state())
            .arg("apply")
            .arg(declare("two\n"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "two\n");
        let calls = std::fs::read_to_string(&trace).unwrap();
        let ours: Vec<&str> = calls.lines().filter(|l| l.contains("shortcut.conf")).collect();
        let renamed =
            ours.iter().position(|l| l.contains("rename")).unwrap_or_else(|| panic!("no rename:\n{calls}"));
        let synced_before =
            ours[..renamed].iter().any(|l| l.contains("sync(") && l.contains(".shortcut.conf.mesh-host-"));
        let synced_after =
            ours[renamed..].iter().any(|l| l.contains("sync(") && l.contains("/shortcut.conf>"));
        let mount = if options.is_empty() { "ext4 (defaults)" } else { "ext4 noauto_da_alloc" };
        if rename_first {
            assert!(
                !synced_before && synced_after,
                "{mount}: the shortcut (rename, then fsync) is expected:\n{}",
                ours.join("\n")
            );
        } else {
            assert!(
                synced_before,
                "{mount}: the new file must be synced before its rename:\n{}",
                ours.join("\n")
            );
        }
    }
}
