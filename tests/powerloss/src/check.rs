//! What a crash state must hold, and the words for what it does not: torn, lost, ahead.
//!
//! The checker knows nothing of FUSE: it compares snapshots (path to content digest, mode and
//! owner) taken from the model's tree or from a real directory (the VM lane's mounted image).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::model::{Kind, Tree, ROOT};

/// What is at one path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// `file`, `dir` or `symlink`.
    pub kind: String,
    /// A file's SHA-256 (hex), a symlink's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum: Option<String>,
    /// Permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
}

/// Every path below a root (relative, `/`-separated), without the host's temporary files.
pub type Snapshot = BTreeMap<String, Entry>;

/// The SHA-256 of `bytes`, hex.
pub fn sum(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether a name is one of the host's temporary files (`.NAME.mesh-host-PID-N`), which a
/// crash may leave and the next pass removes.
pub fn temporary(name: &str) -> bool {
    name.starts_with('.') && name.contains(".mesh-host-")
}

/// A snapshot of the model's tree below the directory `under` (relative to its root).
pub fn snapshot_tree(tree: &Tree, under: &str) -> Snapshot {
    let mut out = Snapshot::new();
    let mut at = ROOT;
    for part in under.split('/').filter(|p| !p.is_empty()) {
        match tree.lookup(at, std::ffi::OsStr::new(part)) {
            Some(i) => at = i,
            None => return out,
        }
    }
    let mut todo = vec![(at, String::new())];
    while let Some((dir, prefix)) = todo.pop() {
        let Some(entries) = tree.dirs.get(&dir) else { continue };
        for (name, ino) in entries {
            let name = name.to_string_lossy();
            if temporary(&name) {
                continue;
            }
            let path = if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") };
            let i = &tree.inodes[ino];
            let (kind, s) = match i.kind {
                Kind::File => ("file", Some(sum(&i.data))),
                Kind::Dir => ("dir", None),
                Kind::Symlink => ("symlink", Some(String::from_utf8_lossy(&i.data).into_owned())),
            };
            if i.kind == Kind::Dir {
                todo.push((*ino, path.clone()));
            }
            out.insert(
                path,
                Entry { kind: kind.into(), sum: s, mode: i.mode & 0o7777, uid: i.uid, gid: i.gid },
            );
        }
    }
    out
}

/// A file's bytes in the model's tree, by path relative to its root.
pub fn read_tree(tree: &Tree, path: &str) -> Option<Vec<u8>> {
    let mut at = ROOT;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        at = tree.lookup(at, std::ffi::OsStr::new(part))?;
    }
    let i = &tree.inodes[&at];
    (i.kind == Kind::File).then(|| i.data.clone())
}

/// A snapshot of a real directory (symlinks listed, never followed).
pub fn snapshot_dir(root: &Path) -> std::io::Result<Snapshot> {
    use std::os::unix::fs::MetadataExt as _;
    let mut out = Snapshot::new();
    let mut todo = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = todo.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if temporary(&name) {
                continue;
            }
            let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
            let meta = std::fs::symlink_metadata(entry.path())?;
            let (kind, s) = if meta.is_dir() {
                todo.push((entry.path(), path.clone()));
                ("dir", None)
            } else if meta.file_type().is_symlink() {
                ("symlink", Some(std::fs::read_link(entry.path())?.to_string_lossy().into_owned()))
            } else {
                ("file", Some(sum(&std::fs::read(entry.path())?)))
            };
            out.insert(
                path,
                Entry {
                    kind: kind.into(),
                    sum: s,
                    mode: meta.mode() & 0o7777,
                    uid: meta.uid(),
                    gid: meta.gid(),
                },
            );
        }
    }
    Ok(out)
}

/// What one phase of a workload leaves, as the harness saw it when the agent reported it done.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Phase {
    /// Its name (`cold`, `change`, `daemon`...).
    pub name: String,
    /// The managed tree (below `m/`) then.
    pub managed: Snapshot,
    /// Digests of content the harness itself wrote (hand-edits): drift for the agent to count,
    /// never a record's.
    #[serde(default)]
    pub hand_edits: BTreeSet<String>,
}

/// What one crash state was found to hold.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Found {
    /// Paths neither as before nor as after, whole: an empty, short or mixed file, a wrong
    /// mode or owner that neither phase gave it.
    pub torn: Vec<String>,
    /// Paths as they were before a change the agent had reported done.
    pub lost: Vec<String>,
    /// Records in the store of what the machine does not hold.
    pub ahead: Vec<String>,
    /// Anything else wrong: a store or journal that does not parse, an apply that failed.
    pub other: Vec<String>,
}

impl Found {
    /// Whether nothing was found wrong.
    pub fn clean(&self) -> bool {
        self.torn.is_empty() && self.lost.is_empty() && self.ahead.is_empty() && self.other.is_empty()
    }
}

/// Checks the managed tree of a crash state taken after the agent reported `before` done and
/// while it worked towards `after`: each path's content (what it is and its bytes), its mode
/// and its owner must each be as one of them has it, whole. A value as an `older` phase had it
/// (one the agent had reported replaced) was lost; anything else is torn. Mode and owner are
/// judged apart: a change of both in place is a chown and a chmod, which no filesystem makes
/// one atomic step, so a crash between them is a state POSIX allows.
pub fn check_managed(crash: &Snapshot, older: &[Phase], before: &Phase, after: &Phase, found: &mut Found) {
    type Part = fn(&Entry) -> (String, Option<String>, u32, u32);
    let parts: [(&str, Part); 3] = [
        ("content", |e| (e.kind.clone(), e.sum.clone(), 0, 0)),
        ("mode", |e| (String::new(), None, e.mode, 0)),
        ("owner", |e| (String::new(), None, e.uid, e.gid)),
    ];
    let paths: BTreeSet<&String> =
        before.managed.keys().chain(after.managed.keys()).chain(crash.keys()).collect();
    for path in paths {
        let (was, will, is) = (before.managed.get(path), after.managed.get(path), crash.get(path));
        if is == will || is == was {
            continue;
        }
        for (what, part) in parts {
            let p = |e: Option<&Entry>| e.map(part);
            let (was, will, is) = (p(was), p(will), p(is));
            // An entry absent on either side is judged whole, by its content.
            if what != "content" && (was.is_none() || will.is_none() || is.is_none()) {
                continue;
            }
            if is == will || is == was {
                continue;
            }
            if older.iter().any(|o| p(o.managed.get(path)) == is) {
                found.lost.push(format!("{path}: {what} {is:?}, as before a change reported done ({was:?})"));
            } else {
                found.torn.push(format!("{path}: {what} {is:?} (before {was:?}, after {will:?})"));
            }
        }
    }
}

/// Checks the store (its bytes, if it exists) against the machine: it must parse, and each
/// file or directory it records must hold the content, mode and owner it says, unless the record is the one of the
/// phase reported done (the store not rewritten yet: behind, not ahead), the phase in flight
/// removes the file (a record not yet forgotten) or a hand-edit is there.
pub fn check_store(
    store: Option<&[u8]>,
    crash: &Snapshot,
    root: &str,
    before: &Phase,
    after: &Phase,
    found: &mut Found,
) {
    let Some(bytes) = store else { return };
    let value: serde_json::Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => return found.other.push(format!("the store does not parse: {e}")),
    };
    let Some(records) = value["records"].as_object() else {
        return found.other.push("the store has no records".into());
    };
    let prefix = format!("{}/m/", root.trim_end_matches('/'));
    for (id, r) in records {
        let Some(target) = r["target"].as_str() else { continue };
        let Some(rel) = target.strip_prefix(&prefix) else { continue };
        let is = crash.get(rel);
        let (was, will) = (before.managed.get(rel), after.managed.get(rel));
        // Absent, and removed by the phase in flight: a record not yet forgotten is behind.
        if is.is_none() && !after.managed.contains_key(rel) {
            continue;
        }
        // What the record says of the content, the mode and the owner, each beside the machine's.
        let wrote = r["wrote"].as_str().map(|w| w.trim_start_matches("sha256:").to_owned());
        let mode = r["mode"].as_u64().map(|m| m as u32);
        let owner = r["owner"]
            .as_array()
            .and_then(|o| Some((o.first()?.as_u64()? as u32, o.get(1)?.as_u64()? as u32)));
        type Recorded = (&'static str, Option<String>, fn(&Entry) -> String);
        let parts: [Recorded; 3] = [
            ("content", wrote, |e| e.sum.clone().unwrap_or_default()),
            ("mode", mode.map(|m| format!("{m:o}")), |e| format!("{:o}", e.mode)),
            ("owner", owner.map(|(u, g)| format!("{u}:{g}")), |e| format!("{}:{}", e.uid, e.gid)),
        ];
        for (what, recorded, of) in parts {
            let Some(recorded) = recorded else { continue };
            if is.map(of).as_ref() == Some(&recorded) {
                continue;
            }
            // The store of the phase reported done, not yet rewritten, over the machine as the
            // phase in flight leaves it: behind, not ahead.
            if was.map(of).as_ref() == Some(&recorded) && is.map(of) == will.map(of) {
                continue;
            }
            // A hand-edit is there: drift for the agent to count, not a record ahead.
            if is.and_then(|e| e.sum.as_ref()).is_some_and(|s| after.hand_edits.contains(s)) {
                continue;
            }
            found
                .ahead
                .push(format!("{id} ({rel}): the store says {what} {recorded}, the machine holds {is:?}"));
        }
    }
}

/// Checks the journal of intent (its bytes, if it exists): each complete line is a JSON object
/// naming a directory or an intent (the last line may be torn by the crash: the agent ignores
/// it, having never acted on it), and every intent is for a path below the root.
pub fn check_journal(journal: Option<&[u8]>, root: &str, found: &mut Found) {
    let Some(bytes) = journal else { return };
    let lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    let complete = lines.len().saturating_sub(1);
    for (n, line) in lines.iter().enumerate().take(complete) {
        let ok = serde_json::from_slice::<serde_json::Value>(line).ok().is_some_and(|v| {
            let path = v
                .get("intent")
                .and_then(|i| i["path"].as_str())
                .or_else(|| v.get("dir").and_then(|d| d.as_str()));
            path.is_some_and(|p| p.starts_with(root))
        });
        // Zeros are what a crash leaves of an append whose size was durable and some of its
        // bytes not (a line not yet synced): the agent skips such a line, as a torn one.
        if !ok && !line.contains(&0) {
            found.other.push(format!(
                "journal line {} is not an intent: {}",
                n + 1,
                String::from_utf8_lossy(line)
            ));
        }
    }
}
