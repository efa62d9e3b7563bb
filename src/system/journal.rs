//! The journal of intent: what the host is about to do to files, written before it does it.
//!
//! A crash (kill -9, a power cut) can stop the host between writing files and recording them in
//! the store. Without a journal the next pass would find the host's own unfinished work and
//! could not tell it from a person's: it would count it as drift, copy it away as an "original",
//! and leave its temporary files (`.NAME.mesh-host-PID-N`) beside the targets for ever.
//!
//! So before a pass stages anything in a directory, that directory is noted in the journal
//! (`<store>.journal`), and before a batch of files is renamed into place, each file's path and
//! the digest, mode and owner the host is giving it are appended and synced. When the store has
//! been written after the pass, the journal is removed. A journal found at start-up (with the
//! store's lock held, so no other writer is alive) means the last pass did not finish: the
//! temporary files in the directories it names are removed, and a file found holding what the
//! journal says the host was writing is the host's own work, not a hand-edit.
//!
//! One JSON object per line; a line torn by the crash is ignored (it was never acted on: the
//! sync of a batch's lines precedes its renames).

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A journal that could not be written, synced or removed: what the host was doing, the
/// journal's path, and the system's error. Its own type, so the journal needs nothing of
/// `system::fs`, which holds a journal (`fs::Error` takes it in as an `Io`).
#[derive(Debug, thiserror::Error)]
#[error("cannot {op} {path}: {source}")]
pub struct Error {
    /// What the host was doing, as words that follow "cannot".
    pub op: &'static str,
    /// The journal's path.
    pub path: PathBuf,
    /// The system's error.
    #[source]
    pub source: std::io::Error,
}

type Result<T> = std::result::Result<T, Error>;

/// What the host is about to leave at one path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    /// The path the file is renamed to.
    pub path: PathBuf,
    /// SHA-256 of the content, in hex.
    pub sum: String,
    /// The permission bits it is given.
    pub mode: u32,
    /// The uid and gid it is given, if the host sets them.
    pub owner: Option<(u32, u32)>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Line {
    /// Temporary files may be made in this directory.
    Dir(PathBuf),
    /// A file about to be renamed into place.
    Intent(Intent),
}

/// The journal of one pass, opened when it is first written.
pub struct Journal {
    path: PathBuf,
    file: Option<std::fs::File>,
    dirs: HashSet<PathBuf>,
}

impl Journal {
    /// The journal at `path`, not opened until something is written to it.
    pub fn new(path: PathBuf) -> Journal {
        Journal { path, file: None, dirs: HashSet::new() }
    }

    /// Whether anything was written to it in this pass.
    pub fn written(&self) -> bool {
        self.file.is_some()
    }

    fn append(&mut self, lines: &[Line], sync: bool) -> Result<()> {
        let io = |e: std::io::Error| Error { op: "write the journal", path: self.path.clone(), source: e };
        if self.file.is_none() {
            let file = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .custom_flags(
                    rustix::fs::OFlags::NOFOLLOW.bits() as i32 | rustix::fs::OFlags::CLOEXEC.bits() as i32,
                )
                .open(&self.path)
                .map_err(io)?;
            self.file = Some(file);
        }
        let mut text = Vec::new();
        for line in lines {
            serde_json::to_writer(&mut text, line).expect("a journal line serialises");
            text.push(b'\n');
        }
        let file = self.file.as_mut().expect("opened above");
        file.write_all(&text).map_err(io)?;
        if sync {
            super::durable::data(file).map_err(io)?;
        }
        Ok(())
    }

    /// Notes that temporary files may be made in `dir` (once per pass). Not synced: a kill -9
    /// cannot lose it (it is in the kernel's page cache), and after a power cut a temporary
    /// file that was never synced is gone or empty.
    pub fn note_dir(&mut self, dir: &Path) -> Result<()> {
        if self.dirs.contains(dir) {
            return Ok(());
        }
        self.append(&[Line::Dir(dir.to_owned())], false)?;
        self.dirs.insert(dir.to_owned());
        Ok(())
    }

    /// Appends what a batch is about to leave. The commit then makes it durable before any
    /// rename (`make_durable`): usually for free, since the batch's own `syncfs` covers the
    /// journal when both are on one filesystem. A batch of one file (the daemon putting back a
    /// hand-edit) is not synced: a kill cannot lose the line, and a sync would sit between the
    /// edit and its correction; after a power cut the worst it costs is one correction counted
    /// twice.
    pub fn intend(&mut self, intents: Vec<Intent>) -> Result<()> {
        let lines: Vec<Line> = intents.into_iter().map(Line::Intent).collect();
        self.append(&lines, false)
    }

    /// Makes what was appended durable, unless `synced` says the filesystem it is on (by device)
    /// was synced whole since.
    pub fn make_durable(&mut self, synced: impl Fn(u64) -> bool) -> Result<()> {
        let Some(file) = &self.file else { return Ok(()) };
        let io = |e: std::io::Error| Error { op: "sync the journal", path: self.path.clone(), source: e };
        let dev = std::os::unix::fs::MetadataExt::dev(&file.metadata().map_err(io)?);
        if !synced(dev) {
            super::durable::data(file).map_err(io)?;
        }
        Ok(())
    }
}

/// What an unfinished pass left in its journal.
#[derive(Debug, Default)]
pub struct Recovered {
    /// The directories temporary files may have been made in, to be looked through for leftovers.
    pub dirs: Vec<PathBuf>,
    /// What the host was writing, by path.
    pub intents: HashMap<PathBuf, Vec<Intent>>,
}

/// Reads the journal at `path`, if there is one. Torn or unreadable lines are skipped.
pub fn recover(path: &Path) -> std::io::Result<Option<Recovered>> {
    let bytes = match super::input::read_input(path, super::input::STORE_LIMIT) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut found = Recovered::default();
    for line in bytes.split(|b| *b == b'\n') {
        match serde_json::from_slice::<Line>(line) {
            Ok(Line::Dir(d)) => found.dirs.push(d),
            Ok(Line::Intent(i)) => found.intents.entry(i.path.clone()).or_default().push(i),
            Err(_) => {}
        }
    }
    found.dirs.sort();
    found.dirs.dedup();
    Ok(Some(found))
}

/// Removes the journal once the store holds what the pass did. Absent is success.
///
/// The removal is not made durable (no fsync of the state directory): after a power cut a
/// journal that comes back names temporary files that are gone and intents the store already
/// records, both harmless at the next start, while a sync here would sit before every next
/// correction the daemon makes.
pub fn remove(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error { op: "remove the journal", path: path.to_owned(), source: e })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "the tests plant what a crash leaves")]
mod tests {
    use super::*;

    #[test]
    fn a_journal_reads_back_what_was_written_and_skips_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json.journal");
        let mut j = Journal::new(path.clone());
        assert!(!j.written());
        j.note_dir(Path::new("/srv/a")).unwrap();
        j.note_dir(Path::new("/srv/a")).unwrap();
        let intent = Intent { path: "/srv/a/x".into(), sum: "ab".into(), mode: 0o644, owner: Some((0, 0)) };
        j.intend(vec![intent.clone()]).unwrap();
        assert!(j.written());
        drop(j);
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"intent\": {\"path\": \"/srv/b").unwrap();
        let found = recover(&path).unwrap().unwrap();
        assert_eq!(found.dirs, vec![PathBuf::from("/srv/a")]);
        assert_eq!(found.intents[Path::new("/srv/a/x")], vec![intent]);
        assert_eq!(found.intents.len(), 1);
        remove(&path).unwrap();
        assert!(recover(&path).unwrap().is_none());
    }
}
