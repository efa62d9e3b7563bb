//! Generations: each declaration the node accepts, kept as it came, numbered, under
//! `<state dir>/generations/<N>/` (`declaration/` holding its files, sealed values still sealed,
//! and `meta.json`: where it came from, its digest, when, and how its first pass ended), and the
//! rollback hold, `<state dir>/hold.json`, which makes the daemon apply a kept generation
//! instead of its source's until a declaration never seen before arrives or the operator
//! releases it (docs/decisions.md, "Generations and rollback").
//!
//! Written by whoever accepts a declaration and holds the store's lock: the daemon's worker
//! (its local directory, or the fleet's cache directory, are both the directory it reads) and
//! `apply`; the hold is written by `rollback`. Everything is 0600 in 0700 directories, written
//! atomically and durably through `system::fs`. A generation whose `meta.json` is missing (a
//! crash between its files and its meta) does not exist: it is written over by the next one.
//!
//! Architecture Invariant: this module never opens a sealed value. It stores and hands back the
//! bytes of the declaration as they were accepted.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::system::fs;

/// How many generations are kept when not told otherwise (`--keep-generations`).
pub const DEFAULT_KEEP: u16 = 20;

/// Where generations, the hold and the marker of the one in force live, for one state store.
#[derive(Clone, Debug)]
pub struct Generations {
    dir: PathBuf,
    hold: PathBuf,
}

/// One generation's `meta.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Meta {
    /// Its number: 1 for the first declaration the node accepted, one more for each new one.
    pub number: u64,
    /// Where it came from: the directory or file the daemon reads (the fleet's cache, for a
    /// node fed by etcd), `apply PATH`, or `apply standard input`.
    pub source: String,
    /// The sha256 of its files' names and bytes, as accepted (sealed values sealed).
    pub digest: String,
    /// When it was first accepted, in seconds since the epoch.
    pub accepted_at: u64,
    /// Its files' names, in the order they are read.
    pub files: Vec<String>,
    /// How its first pass ended; `None` until that pass has ended.
    pub first_pass: Option<FirstPass>,
}

/// How a generation's first pass ended. Written in its record as the words `converged`,
/// `N failed` and `refused`, as before it was a type, so a record written by an older agent
/// reads the same; any other word is refused when the record is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstPass {
    /// Every resource applied.
    Converged,
    /// This many resources failed.
    Failed(usize),
    /// Refused whole on this machine (a firewall found in force that the host cannot manage).
    Refused,
}

impl FirstPass {
    /// How a pass ended, from how many resources failed (`None`: none) and whether the
    /// declaration was refused whole.
    pub fn of(failed: Option<usize>, refused: bool) -> FirstPass {
        match failed {
            None => FirstPass::Converged,
            Some(_) if refused => FirstPass::Refused,
            Some(n) => FirstPass::Failed(n),
        }
    }

    /// The word (or words) the record holds.
    fn parse(word: &str) -> Option<FirstPass> {
        match word {
            "converged" => Some(FirstPass::Converged),
            "refused" => Some(FirstPass::Refused),
            _ => word.strip_suffix(" failed")?.parse().ok().map(FirstPass::Failed),
        }
    }
}

impl std::fmt::Display for FirstPass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FirstPass::Converged => f.write_str("converged"),
            FirstPass::Failed(n) => write!(f, "{n} failed"),
            FirstPass::Refused => f.write_str("refused"),
        }
    }
}

impl Serialize for FirstPass {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FirstPass {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let word = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        FirstPass::parse(&word).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "a first pass ends `converged`, `N failed` or `refused`, not `{word}`"
            ))
        })
    }
}

/// The rollback hold (`hold.json`): the generation the node applies instead of its source's.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Hold {
    /// The generation held.
    pub generation: u64,
    /// When the hold was made, in seconds since the epoch.
    pub since: u64,
    /// Who made it: the user who ran `rollback` (as `SUDO_USER`, `LOGNAME` or `USER` said).
    pub by: String,
    /// Why, as `rollback --reason` said; `None` when not said.
    pub reason: Option<String>,
    /// Set when the node made the hold itself, going back from a generation that cut it off
    /// from its source (the fleet's confirmation window); `None` for an operator's rollback, and
    /// in a hold written by an older version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverted: Option<Reverted>,
}

/// What a node went back from by itself: the generation it had applied, and the revision of its
/// source that generation was read at, when the source says one (docs/decisions.md, "Confirm or
/// go back").
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Reverted {
    /// The generation gone back from.
    pub from: u64,
    /// The source's revision of that generation (the etcd revision, for a node fed by etcd).
    pub revision: Option<i64>,
}

/// What accepting a declaration did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// The generation it is.
    pub number: u64,
    /// Whether it is a new one (its digest was never seen among those kept).
    pub new: bool,
}

/// What can go wrong with generations and the hold.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A generation asked for is not kept.
    #[error("generation {generation} is not kept under {dir} ({kept})")]
    Unknown {
        /// The generation asked for.
        generation: u64,
        /// Where generations are kept.
        dir: String,
        /// What is kept (`kept: 3, 4, 5`).
        kept: String,
    },
    /// No generation is there to roll back to.
    #[error("{0}")]
    Nothing(String),
    /// A file or directory of the generations could not be read or written.
    #[error("cannot {what} {path}: {source}")]
    Io {
        /// What was being done: `read`, `write`, `list`, `make`, `remove`.
        what: &'static str,
        /// The file or directory.
        path: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// A `meta.json` or `hold.json` is not what this version writes.
    #[error("{path} is not a generation's record: {source}")]
    Json {
        /// The file.
        path: String,
        /// What is wrong with it.
        source: serde_json::Error,
    },
}

/// The most bytes a `meta.json` or `hold.json` may have: they are a few hundred.
const RECORD_LIMIT: u64 = 1 << 20;

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.display().to_string();
    move |source| Error::Io { what, path, source }
}

/// The digest of a declaration's files, named as their source named them: each one's file name
/// (not its directory, so the same files read from elsewhere are the same declaration), length
/// and bytes.
///
/// A name from the fleet's cache starts with the etcd revision it was read at
/// (`r000000000042-`, `fleet::cache_name`), which is not part of the declaration: left out, so
/// the same keys and bytes read at a later revision (a declaration back after a rollout's
/// abort, a candidate promoted) are the same generation.
pub fn digest(files: &[(String, Vec<u8>)]) -> String {
    let mut h = sha2::Sha256::new();
    for (name, bytes) in files {
        let name = file_name(name);
        let unrevisioned = name
            .strip_prefix('r')
            .filter(|rest| rest.len() > 13 && rest.as_bytes()[..12].iter().all(u8::is_ascii_digit))
            .and_then(|rest| rest[12..].strip_prefix('-'))
            .unwrap_or(&name);
        h.update(unrevisioned.as_bytes());
        h.update(b"\0");
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// A file's name as a generation keeps it: the last part of the name its source gave it, ending
/// in `.json` so that reading the generation back finds it.
pub fn file_name(name: &str) -> String {
    let last = Path::new(name)
        .file_name()
        .map_or_else(|| "declaration".into(), |n| n.to_string_lossy().into_owned());
    if last.ends_with(".json") {
        last
    } else {
        format!("{last}.json")
    }
}

/// The user who runs this command, as the environment says.
pub fn operator() -> String {
    ["SUDO_USER", "LOGNAME", "USER"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "unknown".into())
}

impl Generations {
    /// The generations of the state store at `state`.
    pub fn of(state: &Path) -> Generations {
        let dir = crate::store::state_dir(state);
        Generations { dir: dir.join("generations"), hold: dir.join("hold.json") }
    }

    /// Where the generations are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the hold is (the daemon watches it).
    pub fn hold_path(&self) -> &Path {
        &self.hold
    }

    fn meta_path(&self, n: u64) -> PathBuf {
        self.dir.join(n.to_string()).join("meta.json")
    }

    fn in_force_path(&self) -> PathBuf {
        self.dir.join("in-force")
    }

    /// Every generation kept, oldest first. A directory without a readable `meta.json` is not
    /// one (a crash left it half written).
    pub fn list(&self) -> Result<Vec<Meta>, Error> {
        let names = fs::dir_names(&self.dir).map_err(io("list", &self.dir))?;
        let mut all: Vec<Meta> =
            names.iter().filter_map(|n| n.parse::<u64>().ok()).filter_map(|n| self.meta(n).ok()).collect();
        all.sort_by_key(|m| m.number);
        Ok(all)
    }

    /// One generation's record.
    pub fn meta(&self, n: u64) -> Result<Meta, Error> {
        let path = self.meta_path(n);
        let bytes = crate::system::read_input(&path, RECORD_LIMIT).map_err(io("read", &path))?;
        serde_json::from_slice(&bytes)
            .map_err(|source| Error::Json { path: path.display().to_string(), source })
    }

    /// A kept generation's record, or an error naming it and what is kept.
    pub fn kept(&self, n: u64) -> Result<Meta, Error> {
        let all = self.list()?;
        all.iter().find(|m| m.number == n).cloned().ok_or_else(|| Error::Unknown {
            generation: n,
            dir: self.dir.display().to_string(),
            kept: describe(&all),
        })
    }

    /// A generation's files, as accepted, named by their paths under the generation.
    pub fn files(&self, n: u64) -> Result<Vec<(PathBuf, Vec<u8>)>, Error> {
        self.kept(n)?;
        let dir = self.dir.join(n.to_string()).join("declaration");
        crate::system::read_source(&dir).map_err(io("read", &dir))
    }

    /// The kept generation whose digest is `digest`, the newest if several.
    pub fn with_digest(&self, digest: &str) -> Result<Option<u64>, Error> {
        Ok(self.list()?.iter().rev().find(|m| m.digest == digest).map(|m| m.number))
    }

    /// Records a declaration the node accepted from `source` (its files named as the source
    /// named them): a new generation when its digest
    /// is not among those kept (then only the newest `keep` are kept, never the one held),
    /// else the generation it already is. Either way it is marked in force.
    pub fn accept(&self, source: &str, files: &[(String, Vec<u8>)], keep: usize) -> Result<Accepted, Error> {
        let digest = digest(files);
        let all = self.list()?;
        self.remove_temporaries(&all);
        if let Some(m) = all.iter().rev().find(|m| m.digest == digest) {
            self.set_in_force(m.number)?;
            return Ok(Accepted { number: m.number, new: false });
        }
        let number = all.last().map_or(1, |m| m.number + 1);
        let gen = self.dir.join(number.to_string());
        fs::private_dir(&gen).map_err(io("make", &gen))?;
        let declaration = gen.join("declaration");
        // Borrowed, not copied: at 100,000 resources the declaration is 113 MB, and a copy of it
        // here was the peak of a cold `apply`.
        let kept: Vec<(String, &[u8])> = files.iter().map(|(n, b)| (file_name(n), b.as_slice())).collect();
        fs::replace_dir(&declaration, &kept).map_err(io("write", &declaration))?;
        let meta = Meta {
            number,
            source: source.to_owned(),
            digest,
            accepted_at: crate::system::unix_secs(),
            files: kept.into_iter().map(|(n, _)| n).collect(),
            first_pass: None,
        };
        self.write_meta(&meta)?;
        self.set_in_force(number)?;
        self.prune(keep)?;
        Ok(Accepted { number, new: true })
    }

    /// Removes the temporary files an agent killed in the middle of writing a record left here
    /// (`.in-force.mesh-host-PID-N`, a generation's `.meta.json.mesh-host-PID-N`): the caller
    /// holds the store's lock, so whoever made them is gone (`fs::remove_temporaries`). Best
    /// effort: one that cannot be removed is said, and is tried again at the next accept.
    /// Found by the kill rounds (`tests/reliability/kill_rounds.rs`, fault 7).
    fn remove_temporaries(&self, all: &[Meta]) {
        let dirs =
            std::iter::once(self.dir.clone()).chain(all.iter().map(|m| self.dir.join(m.number.to_string())));
        for dir in dirs {
            if let Err(e) = fs::remove_temporaries(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a temporary file left in the generations");
            }
        }
    }

    fn write_meta(&self, meta: &Meta) -> Result<(), Error> {
        let path = self.meta_path(meta.number);
        let bytes = serde_json::to_vec_pretty(meta)
            .map_err(|source| Error::Json { path: path.display().to_string(), source })?;
        fs::write_own(&path, &bytes).map_err(|e| Error::Io {
            what: "write",
            path: path.display().to_string(),
            source: std::io::Error::other(e.to_string()),
        })
    }

    /// Notes how a generation's first pass ended, once: a later pass does not change it.
    pub fn first_pass(&self, n: u64, outcome: FirstPass) -> Result<(), Error> {
        let mut meta = self.meta(n)?;
        if meta.first_pass.is_some() {
            return Ok(());
        }
        meta.first_pass = Some(outcome);
        self.write_meta(&meta)
    }

    /// Keeps the newest `keep` generations (at least one), and the held one whatever its age.
    fn prune(&self, keep: usize) -> Result<(), Error> {
        let names = fs::dir_names(&self.dir).map_err(io("list", &self.dir))?;
        let mut numbers: Vec<u64> = names.iter().filter_map(|n| n.parse().ok()).collect();
        numbers.sort_unstable();
        let held = self.hold().ok().flatten().map(|h| h.generation);
        let cut = numbers.len().saturating_sub(keep.max(1));
        for n in numbers.into_iter().take(cut).filter(|n| Some(*n) != held) {
            let dir = self.dir.join(n.to_string());
            fs::remove_private_dir(&dir).map_err(io("remove", &dir))?;
        }
        Ok(())
    }

    /// Marks generation `n` as the one in force.
    pub fn set_in_force(&self, n: u64) -> Result<(), Error> {
        let path = self.in_force_path();
        fs::write_own(&path, format!("{n}\n").as_bytes()).map_err(|e| Error::Io {
            what: "write",
            path: path.display().to_string(),
            source: std::io::Error::other(e.to_string()),
        })
    }

    /// The generation last put in force, if any.
    pub fn in_force(&self) -> Option<u64> {
        let bytes = crate::system::read_input(&self.in_force_path(), 64).ok()?;
        String::from_utf8_lossy(&bytes).trim().parse().ok()
    }

    /// The hold, if there is one.
    pub fn hold(&self) -> Result<Option<Hold>, Error> {
        let bytes = match crate::system::read_input(&self.hold, RECORD_LIMIT) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("read", &self.hold)(e)),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| Error::Json { path: self.hold.display().to_string(), source })
    }

    /// Holds the node at a kept generation.
    pub fn set_hold(&self, hold: &Hold) -> Result<(), Error> {
        self.kept(hold.generation)?;
        let bytes = serde_json::to_vec_pretty(hold)
            .map_err(|source| Error::Json { path: self.hold.display().to_string(), source })?;
        fs::write_own(&self.hold, &bytes).map_err(|e| Error::Io {
            what: "write",
            path: self.hold.display().to_string(),
            source: std::io::Error::other(e.to_string()),
        })
    }

    /// Releases the hold; `Ok(false)` when there was none.
    pub fn release(&self) -> Result<bool, Error> {
        fs::remove_private_file(&self.hold).map_err(io("remove", &self.hold))
    }

    /// The generation `rollback` goes back to when none is named: the newest kept before the
    /// one in force (or before the newest, when none is marked in force).
    pub fn previous(&self) -> Result<u64, Error> {
        let all = self.list()?;
        let current = self.in_force().or_else(|| all.last().map(|m| m.number));
        let Some(current) = current else {
            return Err(Error::Nothing(format!(
                "no generation is kept under {}: this node has accepted no declaration yet",
                self.dir.display()
            )));
        };
        all.iter().rev().map(|m| m.number).find(|n| *n < current).ok_or_else(|| {
            Error::Nothing(format!(
                "no generation before {current} is kept under {} ({}): name one to roll back to",
                self.dir.display(),
                describe(&all)
            ))
        })
    }
}

impl Hold {
    /// The hold as `/healthz`, `status` and the log say it; `since` is its time, as text.
    pub fn describe(&self, since: &str) -> String {
        let reason = self.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
        if let Some(r) = &self.reverted {
            let at = r.revision.map(|r| format!(" (revision {r})")).unwrap_or_default();
            return format!(
                "held at generation {} by the node itself since {since}, reverted from generation {}{at}{reason}; a newer declaration from the source, or `mesh-host rollback --release`, ends it",
                self.generation, r.from
            );
        }
        format!(
            "held at generation {} by rollback since {since} (by {}{reason}); a newer declaration from the source, or `mesh-host rollback --release`, ends it",
            self.generation, self.by
        )
    }
}

/// What is kept, for an error: `kept: 3, 4, 5` or `none is kept`.
fn describe(all: &[Meta]) -> String {
    if all.is_empty() {
        return "none is kept".into();
    }
    let numbers: Vec<String> = all.iter().map(|m| m.number.to_string()).collect();
    format!("kept: {}", numbers.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_leaves_out_the_revision_a_fleet_cache_file_was_read_at() {
        // As `fleet::cache_name` names them.
        let at = |r: i64| vec![(format!("/c/r{r:012}-00000-fleet_declaration_a.json"), b"{}".to_vec())];
        assert_eq!(digest(&at(7)), digest(&at(4242)));
        assert_ne!(digest(&at(7)), digest(&[("/c/a.json".to_owned(), b"{}".to_vec())]));
    }

    #[test]
    fn a_first_pass_is_written_as_the_words_records_have_always_held() {
        let cases = [
            (FirstPass::of(None, false), "\"converged\""),
            (FirstPass::of(Some(3), false), "\"3 failed\""),
            (FirstPass::of(Some(1), true), "\"refused\""),
        ];
        for (pass, json) in cases {
            assert_eq!(serde_json::to_string(&pass).unwrap(), json);
            assert_eq!(serde_json::from_str::<FirstPass>(json).unwrap(), pass);
        }
        assert_eq!(FirstPass::of(None, true), FirstPass::Converged, "nothing failed: not refused");
        for bad in ["\"Converged\"", "\"failed\"", "\"-1 failed\"", "\"3 failed \"", "3"] {
            let e = serde_json::from_str::<FirstPass>(bad).unwrap_err().to_string();
            assert!(bad == "3" || e.contains("converged`, `N failed` or `refused`"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_digest_names_files_not_their_directory() {
        let a = vec![("/a/x.json".to_owned(), b"{}".to_vec())];
        let b = vec![("/b/x.json".to_owned(), b"{}".to_vec())];
        assert_eq!(digest(&a), digest(&b));
        assert_eq!(file_name("/b/y"), "y.json", "a file read back by name must end in .json");
        assert_ne!(digest(&a), digest(&[("/b/y".to_owned(), b"{}".to_vec())]));
    }

    #[test]
    #[allow(clippy::disallowed_methods, reason = "the test plants what a killed agent left")]
    fn a_temporary_a_killed_record_write_left_is_removed_at_the_next_accept() {
        let scratch = tempfile::tempdir().unwrap();
        let gens = Generations::of(&scratch.path().join("state.json"));
        let files = vec![("/d/a.json".to_owned(), b"{}".to_vec())];
        gens.accept("test", &files, 5).unwrap();
        // What a kill between the temporary's write and its rename leaves (another PID's).
        let left =
            [gens.dir().join(".in-force.mesh-host-1-0"), gens.dir().join("1/.meta.json.mesh-host-1-3")];
        for l in &left {
            std::fs::write(l, b"2\n").unwrap();
        }
        let again = gens.accept("test", &files, 5).unwrap();
        assert!(!again.new, "the same declaration is the same generation");
        for l in &left {
            assert!(!l.exists(), "{} is still there", l.display());
        }
    }
}
