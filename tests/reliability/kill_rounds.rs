//! Kill rounds: `mesh-host apply` killed with SIGKILL at random moments and aborted at
//! failpoints, over and over, on a tree of many small files; after each kill the machine and
//! the store are checked, then a converging apply must finish the job cleanly.
//!
//! Each round starts from a converged tree (every file holding content P, the store saying so)
//! and applies a declaration with content K, killed part way. Then:
//!
//! - no file is torn: each holds exactly P or K, with the mode that goes with it (content and
//!   mode are declared together, so a file holding K with P's mode is half of a change);
//! - no file is missing (the host never deletes a declared file);
//! - the store parses (`mesh-host status --json` answers);
//! - no record is ahead of the machine: a record may lag behind (it says P, the machine holds
//!   K: the write happened, the crash came before the store), never the reverse;
//! - a converging apply exits 0, leaves every file as declared, leaves no `.NAME.mesh-host-*`
//!   temporary file anywhere under the tree or beside the store, and reports no `corrected`
//!   outcome: what a crash interrupted is the host's own work, not drift. The converging apply
//!   declares K again (the same declaration, as after a restart) or a third content Q (a new
//!   declaration arrived meanwhile), alternately within each kind of round; the second is where
//!   the host's own unfinished writes are taken for hand-edits;
//! - the high-water mark (issue 44: every declaration is a signed directory, signed anew at a
//!   higher version each time it is brought, and applied with `--allowed-signers`): after the
//!   kill it is whole and names the manifest of P or of K, and K's whenever any file holds K
//!   (it is kept before the pass that writes them); after the converging apply, the manifest
//!   applied. `the_mark_check_fails_when_a_mark_write_is_lost` runs the same rounds with the
//!   mark's write broken (failpoint `trust-mark-lost`) and shows this check failing.
//!
//! The whole battery (issue 12, RELIABILITY.md) is 100 rounds over 10,000 files:
//! `tests/reliability/kill-rounds.sh`; by default, as CI runs it, this is a short version.
//! Settings, all optional, from the environment:
//!
//! - `MESH_HOST_KILL_ROUNDS` (default 12), `MESH_HOST_KILL_FILES` (default 1,000; ten per
//!   directory, 1 KiB each);
//! - `MESH_HOST_KILL_FAILPOINTS`: failpoint names, comma-separated (default
//!   `batch-staged,batch-renamed,store-write`); every `MESH_HOST_KILL_FAILPOINT_EVERY`-th round
//!   (default 4) aborts at the next one of them instead of a random kill. A name the binary does
//!   not know (it runs to the end with the failpoint set) is skipped, and the report says so;
//! - `MESH_HOST_KILL_SEED`: the seed of the kill times, to replay a run (printed at the start);
//! - `MESH_HOST_KILL_DIR`: `loop` (the default as root) makes a fresh ext4 image under /tmp,
//!   loop-mounted for this run and removed after; anything else is a directory in which a scratch
//!   directory is made (the default when not root: /var/tmp);
//! - `MESH_HOST_BIN`: the binary to kill (default: the one cargo built for this test). It is
//!   copied first, so a rebuild meanwhile does not change what is measured;
//! - `MESH_HOST_KILL_REPORT`: a path where the figures are written as JSON.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sha2::Digest as _;

const FILES_PER_DIR: usize = 10;
/// The three modes that go with the three contents.
const MODES: [u32; 3] = [0o644, 0o640, 0o600];

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

/// splitmix64: enough randomness for kill times, and replayable from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A duration in `[0, max)`.
    fn below(&mut self, max: Duration) -> Duration {
        let nanos = max.as_nanos().max(1) as u64;
        Duration::from_nanos(self.next() % nanos)
    }
}

/// A fresh ext4 filesystem in a sparse image, loop-mounted for one run.
struct LoopFs {
    image: PathBuf,
    mount: PathBuf,
}

impl LoopFs {
    fn new(base: &Path) -> Result<LoopFs, String> {
        let image = base.join("tree.img");
        let mount = base.join("mnt");
        std::fs::create_dir(&mount).map_err(|e| e.to_string())?;
        let sh = |cmd: &mut Command| -> Result<(), String> {
            let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr).trim()))
            }
        };
        sh(Command::new("truncate").args(["-s", "2G"]).arg(&image))?;
        // Inodes to spare: every killed round may leave a batch of temporary files behind.
        sh(Command::new("mkfs.ext4").args(["-q", "-F", "-N", "400000"]).arg(&image))?;
        sh(Command::new("mount").args(["-o", "loop"]).arg(&image).arg(&mount))?;
        Ok(LoopFs { image, mount })
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

struct Tree {
    root: PathBuf,
    state: PathBuf,
    dirs: usize,
    contents: [Vec<u8>; 3],
    digests: [String; 3],
    /// The three declarations, each a signed directory.
    decls: [PathBuf; 3],
    /// The signing key, and the allowed_signers file that trusts it.
    key: PathBuf,
    signers: PathBuf,
    /// More environment for every apply (a broken build's failpoint).
    apply_env: Vec<(String, String)>,
}

/// A manifest as the mark names it: its version and its SHA-256 in hex.
type Mark = (u64, String);

/// Signs declaration `i` anew at `version` (`mesh-host sign DIR --version N`); returns the mark
/// its manifest makes once accepted.
fn sign(bin: &Path, tree: &Tree, i: usize, version: u64) -> Mark {
    let out = Command::new(bin)
        .env("MESH_HOST_LOG", "warn")
        .arg("sign")
        .arg(&tree.decls[i])
        .arg("--sign")
        .arg(&tree.key)
        .args(["--version", &version.to_string()])
        .output()
        .expect("mesh-host sign runs");
    assert!(out.status.success(), "mesh-host sign: {}", String::from_utf8_lossy(&out.stderr));
    let manifest = std::fs::read(tree.decls[i].join(".mesh-host/manifest")).unwrap();
    (version, format!("{:x}", sha2::Sha256::digest(&manifest)))
}

/// The local high-water mark, `<state dir>/trust/local`, or why it cannot be read.
fn read_mark(tree: &Tree) -> Result<Mark, String> {
    let path = tree.state.parent().unwrap().join("trust/local");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lines = text.lines();
    let version = lines.next().and_then(|l| l.strip_prefix("version ")).and_then(|v| v.parse().ok());
    match (version, lines.next().and_then(|l| l.strip_prefix("manifest ")), lines.next()) {
        (Some(v), Some(d), None) if d.len() == 64 => Ok((v, d.to_owned())),
        _ => Err(format!("{} is damaged: {text:?}", path.display())),
    }
}

/// What is wrong with the mark after a kill, if anything: it must be whole and name the
/// manifest of the declaration before (`before`) or of the one killed (`killed`), and the
/// killed one's as soon as any file holds its content (`new_files`).
fn mark_after_kill(
    got: Result<Mark, String>,
    before: &Mark,
    killed: &Mark,
    new_files: usize,
) -> Option<String> {
    match got {
        Err(e) => Some(e),
        Ok(m) if m != *before && m != *killed => {
            Some(format!("names version {} ({}), neither {} nor {}", m.0, m.1, before.0, killed.0))
        }
        Ok(m) if new_files > 0 && m != *killed => Some(format!(
            "names version {} while {new_files} files hold version {}'s content: behind the machine",
            m.0, killed.0
        )),
        Ok(_) => None,
    }
}

impl Tree {
    fn file(&self, d: usize, f: usize) -> PathBuf {
        self.root.join(format!("d{d:04}/f{f}.conf"))
    }

    fn id(d: usize, f: usize) -> String {
        format!("kill.d{d}.f{f}")
    }
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", sha2::Sha256::digest(bytes))
}

/// Content `i` of three: 1 KiB, different in every byte position from the other two, so any
/// mix of two is not one of them.
fn content(i: usize) -> Vec<u8> {
    let mut body: Vec<u8> = (0..1023).map(|n| b"abc"[i] ^ ((n % 7) as u8)).collect();
    body.push(b'\n');
    body
}

/// One declaration, written into the directory that is signed.
fn declaration(root: &Path, dirs: usize, i: usize, content: &[u8]) -> Value {
    let text = String::from_utf8(content.to_vec()).unwrap();
    let mut resources = Vec::new();
    for d in 0..dirs {
        let dir = root.join(format!("d{d:04}"));
        resources.push(json!({"type": "directory", "id": format!("kill.d{d}"), "path": dir}));
        for f in 0..FILES_PER_DIR {
            resources.push(json!({
                "type": "file", "id": Tree::id(d, f), "path": dir.join(format!("f{f}.conf")),
                "content": text, "mode": format!("{:04o}", MODES[i]),
            }));
        }
    }
    json!({"version": 1, "resources": resources})
}

/// Waits for a child at most `limit`; kills it past that.
fn wait_at_most(child: &mut std::process::Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn apply_cmd(bin: &Path, tree: &Tree, decl: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.env("MESH_HOST_LOG", "warn").arg("--state").arg(&tree.state).arg("apply").arg("--json").arg(decl);
    cmd.arg("--allowed-signers").arg(&tree.signers);
    cmd.envs(tree.apply_env.iter().map(|(k, v)| (k, v)));
    cmd
}

/// Runs an apply to its end; returns the exit code, the report and the wall time.
fn apply_to_end(bin: &Path, tree: &Tree, decl: &Path) -> (i32, Value, Duration, String) {
    let start = Instant::now();
    let out = apply_cmd(bin, tree, decl).output().expect("mesh-host runs");
    let took = start.elapsed();
    let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), report, took, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Every `.NAME.mesh-host-*` file under `dir`.
fn temp_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let ft = e.file_type().unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if ft.is_dir() {
            temp_files(&e.path(), found);
        } else if name.starts_with('.') && name.contains(".mesh-host-") {
            found.push(e.path());
        }
    }
}

/// Whether the binary knows a failpoint: with it set, a small apply of a batch of files and the
/// store dies of SIGABRT instead of finishing.
fn knows_failpoint(bin: &Path, base: &Path, name: &str) -> bool {
    let dir = base.join(format!("probe-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let resources: Vec<Value> = (0..3)
        .map(|i| json!({"type": "file", "id": format!("probe.f{i}"), "path": dir.join(format!("f{i}")), "content": "x"}))
        .collect();
    let decl = dir.join("probe.json");
    std::fs::write(&decl, serde_json::to_vec(&json!({"version": 1, "resources": resources})).unwrap())
        .unwrap();
    let status = Command::new(bin)
        .env("MESH_HOST_FAILPOINT", name)
        .env("MESH_HOST_LOG", "off")
        .arg("--state")
        .arg(dir.join("state/state.json"))
        .arg("apply")
        .arg(&decl)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    status.signal() == Some(nix::libc::SIGABRT)
}

#[derive(Default, Debug)]
struct Figures {
    rounds: usize,
    killed_at_random: usize,
    finished_before_the_kill: usize,
    at_failpoint: BTreeMap<String, usize>,
    failpoint_not_reached: usize,
    files_checked: usize,
    torn: usize,
    missing: usize,
    unexpected: usize,
    held_new_after_kill: usize,
    store_invalid: usize,
    records_ahead: usize,
    records_lost: usize,
    converge_failed: usize,
    not_converged: usize,
    corrected_same: usize,
    corrected_new: usize,
    corrected_max_round: usize,
    temp_after_converge_max: usize,
    temp_at_end: usize,
    /// Rounds whose high-water mark was damaged, unknown or behind the machine, after the kill
    /// or after the converging apply.
    marks_wrong: usize,
    notes: Vec<String>,
}

/// What a run is given: from the environment (the module's doc), or a test's own.
struct Settings {
    rounds: usize,
    files: usize,
    every: usize,
    seed: u64,
    points: Vec<String>,
    dir: String,
    apply_env: Vec<(String, String)>,
}

impl Settings {
    fn from_env() -> Settings {
        let root_user = nix::unistd::geteuid().is_root();
        Settings {
            rounds: env_or("MESH_HOST_KILL_ROUNDS", 12),
            files: env_or("MESH_HOST_KILL_FILES", 1_000),
            every: env_or("MESH_HOST_KILL_FAILPOINT_EVERY", 4).max(1),
            seed: env_or(
                "MESH_HOST_KILL_SEED",
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
            ),
            points: env_or("MESH_HOST_KILL_FAILPOINTS", "batch-staged,batch-renamed,store-write".to_owned())
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect(),
            dir: env_or("MESH_HOST_KILL_DIR", if root_user { "loop".into() } else { "/var/tmp".into() }),
            apply_env: Vec::new(),
        }
    }
}

/// The faults the figures show, in words; none in a good run.
fn faults(f: &Figures) -> Vec<String> {
    let mut faults = Vec::new();
    for (what, n) in [
        ("torn files", f.torn),
        ("missing files", f.missing),
        ("files holding neither the old nor the new content", f.unexpected),
        ("rounds with an invalid store", f.store_invalid),
        ("records ahead of the machine", f.records_ahead),
        ("records lost", f.records_lost),
        ("converging applies that failed", f.converge_failed),
        ("files not as declared after a converging apply", f.not_converged),
        (
            "files corrected after a crash (fault 8: the host's own work counted as drift)",
            f.corrected_same + f.corrected_new,
        ),
        ("temporary files left after a converging apply (fault 7)", f.temp_after_converge_max),
        ("checks of the high-water mark that found it damaged, unknown or behind the machine", f.marks_wrong),
    ] {
        if n > 0 {
            faults.push(format!("{n} {what}"));
        }
    }
    faults
}

#[test]
fn kill_rounds() {
    let f = run(&Settings::from_env());
    let faults = faults(&f);
    assert!(faults.is_empty(), "after {} kill rounds: {}", f.rounds, faults.join("; "));
}

/// The mark's check can fail: the same rounds, on a build whose mark write is lost
/// (`trust-mark-lost`), find the mark missing or behind the machine.
#[test]
fn the_mark_check_fails_when_a_mark_write_is_lost() {
    let settings = Settings {
        rounds: 3,
        files: 50,
        every: 1,
        seed: 44,
        points: Vec::new(),
        apply_env: vec![("MESH_HOST_FAILPOINT".into(), "trust-mark-lost".into())],
        ..Settings::from_env()
    };
    let f = run(&settings);
    assert_eq!(f.marks_wrong, 2 * f.rounds, "every check after a kill and after a converging apply: {f:#?}");
    let faults = faults(&f);
    assert!(faults.iter().all(|f| f.contains("high-water mark")), "only the mark is broken: {faults:?}");
}

/// The rounds, as `settings` say; returns their figures.
fn run(settings: &Settings) -> Figures {
    let Settings { rounds, files, every, seed, .. } = *settings;
    let wanted_points = &settings.points;
    let dirs = (files / FILES_PER_DIR).max(1);
    let where_ = settings.dir.clone();

    // No core files from the aborts at failpoints: hundreds of them would fill a disk.
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0).unwrap();

    let work = tempfile::Builder::new().prefix("mesh-host-kill-").tempdir_in("/tmp").unwrap();
    let mut figures = Figures::default();
    // Both the loop filesystem and a scratch directory go when the run ends.
    let (_loop_fs, _scratch, base) = if where_ == "loop" {
        let fs = LoopFs::new(work.path()).unwrap_or_else(|e| panic!("cannot make the loop filesystem: {e}"));
        let base = fs.mount.clone();
        (Some(fs), None, base)
    } else {
        let dir = tempfile::Builder::new().prefix("mesh-host-kill-").tempdir_in(&where_).unwrap();
        let base = dir.path().to_owned();
        figures
            .notes
            .push(format!("tree in a scratch directory {} (not a fresh filesystem)", base.display()));
        (None, Some(dir), base)
    };

    let original_bin: PathBuf = std::env::var_os("MESH_HOST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_mesh-host")));
    let bin = work.path().join("mesh-host");
    std::fs::copy(&original_bin, &bin).unwrap();
    let bin_digest = sha256(&std::fs::read(&bin).unwrap());

    let contents = [content(0), content(1), content(2)];
    let digests = [sha256(&contents[0]), sha256(&contents[1]), sha256(&contents[2])];
    let root = base.join("tree");
    let decls = [0, 1, 2].map(|i| {
        let dir = work.path().join(format!("decl{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let text = serde_json::to_vec(&declaration(&root, dirs, i, &contents[i])).unwrap();
        std::fs::write(dir.join("decl.json"), text).unwrap();
        dir
    });
    let key = work.path().join("key");
    let made = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "kill-rounds", "-f"])
        .arg(&key)
        .output()
        .expect("ssh-keygen runs: install openssh-client");
    assert!(made.status.success(), "ssh-keygen: {}", String::from_utf8_lossy(&made.stderr));
    let signers = work.path().join("allowed_signers");
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    std::fs::write(&signers, format!("kill-rounds@example.com {public}")).unwrap();
    let tree = Tree {
        root,
        state: base.join("state/state.json"),
        dirs,
        contents,
        digests,
        decls,
        key,
        signers,
        apply_env: settings.apply_env.clone(),
    };

    let mut points = Vec::new();
    for p in wanted_points {
        if knows_failpoint(&bin, work.path(), p) {
            points.push(p.clone());
        } else {
            let note = format!(
                "failpoint {p:?} skipped: this binary does not know it (an apply with it set ran to the end)"
            );
            println!("note: {note}");
            figures.notes.push(note);
        }
    }

    println!(
        "kill rounds: {rounds} rounds over {} files of 1 KiB in {dirs} directories, on {}; seed {seed}; failpoints {points:?} every {every}th round; binary {} ({bin_digest})",
        dirs * FILES_PER_DIR,
        if where_ == "loop" { "a fresh loop-mounted ext4".to_owned() } else { base.display().to_string() },
        original_bin.display()
    );

    // Calibration: a cold apply, then a full changing apply, which also sets the kill window.
    // Each declaration is signed at a higher version each time it is brought.
    let mut signed: [Mark; 3] = Default::default();
    let mut version = 0;
    let mut next = |i: usize, signed: &mut [Mark; 3]| {
        version += 1;
        signed[i] = sign(&bin, &tree, i, version);
    };
    next(0, &mut signed);
    let (code, report, cold, err) = apply_to_end(&bin, &tree, &tree.decls[0]);
    assert_eq!(code, 0, "the cold apply failed: {report:#} {err}");
    next(1, &mut signed);
    let (code, report, full, err) = apply_to_end(&bin, &tree, &tree.decls[1]);
    assert_eq!(code, 0, "the changing apply failed: {report:#} {err}");
    println!("calibration: cold apply {cold:?}, a changing apply of every file {full:?} (the kill window)");
    let mut held = 1usize;

    let mut rng = Rng(seed);
    let started = Instant::now();
    let mut failpoint_turn = 0;
    let mut random_turn = 0;
    for round in 1..=rounds {
        let p = held;
        let k = (p + 1) % 3;
        let q = (p + 2) % 3;
        next(k, &mut signed);
        let mut cmd = apply_cmd(&bin, &tree, &tree.decls[k]);
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        // Which declaration the converging apply brings alternates within each kind of round (a
        // random kill, each failpoint), so that every kind meets both.
        let converge_same;
        let how = if !points.is_empty() && round % every == 0 {
            let point = points[failpoint_turn % points.len()].clone();
            converge_same = (failpoint_turn / points.len()) % 2 == 0;
            failpoint_turn += 1;
            cmd.env("MESH_HOST_FAILPOINT", &point);
            let mut child = cmd.spawn().unwrap();
            let status = wait_at_most(&mut child, full * 20 + Duration::from_secs(60))
                .unwrap_or_else(|| panic!("round {round}: the apply with failpoint {point} hung"));
            if status.signal() == Some(nix::libc::SIGABRT) {
                *figures.at_failpoint.entry(point.clone()).or_default() += 1;
            } else {
                figures.failpoint_not_reached += 1;
            }
            format!("failpoint {point} ({status})")
        } else {
            converge_same = random_turn % 2 == 0;
            random_turn += 1;
            let delay = rng.below(full);
            let mut child = cmd.spawn().unwrap();
            std::thread::sleep(delay);
            match child.try_wait().unwrap() {
                Some(status) => {
                    figures.finished_before_the_kill += 1;
                    format!("finished before the kill at {delay:?} ({status})")
                }
                None => {
                    child.kill().unwrap();
                    child.wait().unwrap();
                    figures.killed_at_random += 1;
                    format!("killed at {delay:?}")
                }
            }
        };

        // The machine: every file P or K, whole, with its mode.
        let mut machine = vec![None; tree.dirs * FILES_PER_DIR];
        let (mut torn, mut missing, mut unexpected, mut new) = (0, 0, 0, 0);
        for d in 0..tree.dirs {
            for f in 0..FILES_PER_DIR {
                let path = tree.file(d, f);
                figures.files_checked += 1;
                let Ok(meta) = std::fs::symlink_metadata(&path) else {
                    missing += 1;
                    continue;
                };
                let bytes = std::fs::read(&path).unwrap_or_default();
                match tree.contents.iter().position(|c| *c == bytes) {
                    Some(i)
                        if meta.file_type().is_file() && meta.permissions().mode() & 0o7777 == MODES[i] =>
                    {
                        if i != p && i != k {
                            unexpected += 1;
                        }
                        if i == k {
                            new += 1;
                        }
                        machine[d * FILES_PER_DIR + f] = Some(i);
                    }
                    _ => torn += 1,
                }
            }
        }

        // The store: it parses, and no record is ahead of the machine.
        let status =
            Command::new(&bin).arg("--state").arg(&tree.state).args(["status", "--json"]).output().unwrap();
        let store_ok = status.status.success() && serde_json::from_slice::<Value>(&status.stdout).is_ok();
        let (mut ahead, mut lost) = (0, 0);
        match std::fs::read(&tree.state).ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok()) {
            Some(store) if store_ok => {
                for d in 0..tree.dirs {
                    for f in 0..FILES_PER_DIR {
                        let Some(wrote) = store["records"][Tree::id(d, f)]["wrote"].as_str() else {
                            lost += 1;
                            continue;
                        };
                        let recorded = tree.digests.iter().position(|x| x == wrote);
                        let on_machine = machine[d * FILES_PER_DIR + f];
                        // Behind is allowed (the record says P, the machine holds K); anything
                        // else that differs is a record claiming what the machine does not hold.
                        if recorded != on_machine && !(recorded == Some(p) && on_machine == Some(k)) {
                            ahead += 1;
                        }
                    }
                }
            }
            _ => figures.store_invalid += 1,
        }

        // The high-water mark: whole, P's or K's, and K's once any file holds K.
        let mark = mark_after_kill(read_mark(&tree), &signed[p], &signed[k], new);
        if let Some(wrong) = &mark {
            figures.marks_wrong += 1;
            println!("round {round}: the high-water mark after the kill: {wrong}");
        }

        // The converging apply.
        let n = if converge_same { k } else { q };
        if n != k {
            next(n, &mut signed);
        }
        let (code, report, took, err) = apply_to_end(&bin, &tree, &tree.decls[n]);
        let mut corrected = 0;
        if code != 0 {
            figures.converge_failed += 1;
            println!("round {round}: the converging apply exited {code}: {} {err}", report["error"]);
        } else {
            corrected = report["outcomes"]
                .as_array()
                .map(|o| o.iter().filter(|o| o["action"] == "corrected").count())
                .unwrap_or(0);
        }
        if n == k {
            figures.corrected_same += corrected;
        } else {
            figures.corrected_new += corrected;
        }
        figures.corrected_max_round = figures.corrected_max_round.max(corrected);
        let mut wrong = 0;
        for d in 0..tree.dirs {
            for f in 0..FILES_PER_DIR {
                let path = tree.file(d, f);
                let ok = std::fs::read(&path).is_ok_and(|b| b == tree.contents[n])
                    && std::fs::metadata(&path).is_ok_and(|m| m.mode() & 0o7777 == MODES[n]);
                if !ok {
                    wrong += 1;
                }
            }
        }
        figures.not_converged += wrong;
        // The mark names exactly the manifest the converging apply put in force.
        match read_mark(&tree) {
            Ok(m) if code == 0 && m != signed[n] => {
                figures.marks_wrong += 1;
                println!(
                    "round {round}: after the converging apply the mark names version {}, not {}",
                    m.0, signed[n].0
                );
            }
            Err(e) if code == 0 => {
                figures.marks_wrong += 1;
                println!("round {round}: after the converging apply: {e}");
            }
            _ => {}
        }
        let mut temps = Vec::new();
        temp_files(&tree.root, &mut temps);
        temp_files(tree.state.parent().unwrap(), &mut temps);
        if !temps.is_empty() {
            println!("round {round}: temporary files after the converging apply: {temps:?}");
        }
        figures.temp_after_converge_max = figures.temp_after_converge_max.max(temps.len());
        figures.temp_at_end = temps.len();

        figures.torn += torn;
        figures.missing += missing;
        figures.unexpected += unexpected;
        figures.held_new_after_kill += new;
        figures.records_ahead += ahead;
        figures.records_lost += lost;
        figures.rounds += 1;
        println!(
            "round {round:>3}: {how}; {new} of {} files held the new content; torn {torn}, missing {missing}, unexpected {unexpected}; store {}; records ahead {ahead}, lost {lost}; converging apply ({}) exit {code} in {took:?}: {corrected} corrected, {wrong} not as declared; {} temporary files under the tree",
            tree.dirs * FILES_PER_DIR,
            if store_ok { "valid" } else { "INVALID" },
            if n == k { "same declaration" } else { "a new declaration" },
            temps.len()
        );
        held = n;
    }
    println!("{rounds} rounds in {:?}", started.elapsed());
    println!("{figures:#?}");
    if let Some(path) = std::env::var_os("MESH_HOST_KILL_REPORT") {
        let out = json!({
            "seed": seed, "files": tree.dirs * FILES_PER_DIR, "directories": tree.dirs,
            "binary": original_bin, "binary_sha256": bin_digest,
            "filesystem": if where_ == "loop" { "fresh loop-mounted ext4".to_owned() } else { base.display().to_string() },
            "calibration_ms": {"cold": cold.as_millis() as u64, "changing": full.as_millis() as u64},
            "rounds": figures.rounds, "killed_at_random": figures.killed_at_random,
            "finished_before_the_kill": figures.finished_before_the_kill,
            "at_failpoint": figures.at_failpoint, "failpoint_not_reached": figures.failpoint_not_reached,
            "files_checked": figures.files_checked, "torn": figures.torn, "missing": figures.missing,
            "unexpected": figures.unexpected, "held_new_after_kill": figures.held_new_after_kill,
            "store_invalid": figures.store_invalid, "records_ahead": figures.records_ahead,
            "records_lost": figures.records_lost, "converge_failed": figures.converge_failed,
            "not_converged": figures.not_converged, "corrected_same_declaration": figures.corrected_same,
            "corrected_new_declaration": figures.corrected_new, "corrected_max_round": figures.corrected_max_round,
            "temp_after_converge_max": figures.temp_after_converge_max, "temp_at_end": figures.temp_at_end,
            "marks_wrong": figures.marks_wrong,
            "notes": figures.notes,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&out).unwrap()).unwrap();
    }

    figures
}
