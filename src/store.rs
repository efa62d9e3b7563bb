//! The state store: what the host applied, recorded only after it worked.
//!
//! One JSON file, mode 0600, with a schema version inside, replaced atomically. It is the
//! host's memory of its own footprint: orphans are found in it, and drift is told from a change
//! of mind by comparing the machine with what it says the host last wrote. So it is never
//! silently replaced: a corrupt store, or one written by a newer mesh-host, is refused, because
//! starting afresh would forget what the host owns and stop it cleaning up after itself.
//!
//! Architecture Invariant: one writer. `apply` and `run` hold an exclusive lock on
//! `<store>.lock` for as long as they may write; `plan` and `status` only read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::declaration::{Declaration, Kind};
use crate::system::fs;

/// The store format this build writes, and the newest it reads.
pub const SCHEMA: u32 = 1;

/// Where a declaration came from. Orphans are looked for among one origin's records only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// From the mesh's control plane.
    Declared,
    /// Carried by hand, for a first boot.
    Bundle,
}

/// What the host applied for one resource, and what it left on the machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Record {
    pub origin: Origin,
    #[serde(rename = "type")]
    pub kind: Kind,
    pub target: String,
    /// Position in the declaration that last applied it: orphans go in reverse of this order.
    pub position: usize,
    /// The digest of the resource's declaration when it was applied.
    pub declared: String,
    /// Seconds since the epoch when the record last changed.
    pub applied_at: u64,
    /// For a file: the digest of the content the host wrote (never the content).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrote: Option<String>,
    /// For a file or directory: the mode the host left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// For a file or directory: the uid and gid the host left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<(u32, u32)>,
    /// For a file: its change signature when the host last looked (inode, ctime, size). While
    /// it is the same, the file has not been touched and need not be read again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sig: Option<crate::system::Sig>,
    /// For an archive: the digest of the archive last unpacked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<String>,
    /// For a container: the digest of the spec it was created from (the `mesh-host.spec`
    /// label); for a run-once step, the spec it last completed at; for a scheduled step, the
    /// spec it was installed at. For a process: the digest of the command, environment and user
    /// its transient unit was started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<String>,
    /// For a container: each file it read at creation (env-files, files mounted directly), by
    /// path, with the digest of what the file held then. What names the file in "recreated:
    /// /etc/web/web.env changed".
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reads: BTreeMap<String, String>,
    /// For a scheduled step: its 5-field cron expression (UTC), as installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
}

impl Record {
    /// Whether two records say the same thing, ignoring when they were written. Compared field
    /// by field, without cloning: a steady pass compares ten thousand of these.
    fn same_as(&self, other: &Record) -> bool {
        let Record {
            origin,
            kind,
            target,
            position,
            declared,
            applied_at: _,
            wrote,
            mode,
            owner,
            sig,
            archive,
            spec,
            reads,
            schedule,
        } = self;
        *origin == other.origin
            && *kind == other.kind
            && *target == other.target
            && *position == other.position
            && *declared == other.declared
            && *wrote == other.wrote
            && *mode == other.mode
            && *owner == other.owner
            && *sig == other.sig
            && *archive == other.archive
            && *spec == other.spec
            && *reads == other.reads
            && *schedule == other.schedule
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    schema: u32,
    records: BTreeMap<String, Record>,
}

/// Why the store could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the state store at {path} is not readable as a store ({reason}); it was left exactly as it is. Move it aside to start afresh, knowing that a fresh store forgets what this host created, so orphans from before will not be removed")]
    Corrupt { path: PathBuf, reason: String },
    #[error("the state store at {path} has schema {found}, newer than this mesh-host understands ({SCHEMA}); run the newer mesh-host that wrote it")]
    Newer { path: PathBuf, found: u32 },
    #[error("cannot read the state store at {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "another mesh-host is writing the state store {path} (it holds {path}.lock); one writer at a time"
    )]
    Locked { path: PathBuf },
    #[error("cannot write the state store: {0}")]
    Write(fs::FsError),
}

/// The store, loaded.
pub struct Store {
    path: PathBuf,
    file: File,
    dirty: bool,
    _lock: Option<fs::Lock>,
}

impl Store {
    /// Opens the store to read and write, holding its lock. An absent store is an empty one.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let mut lock_path = path.as_os_str().to_owned();
        lock_path.push(".lock");
        let lock = fs::try_lock(Path::new(&lock_path))?
            .ok_or_else(|| StoreError::Locked { path: path.to_owned() })?;
        // A crash between writing and renaming leaves a temporary file; with the lock held, no
        // one else can be writing it.
        fs::remove_leftovers(path)?;
        let mut store = Store::read_only(path)?;
        store._lock = Some(lock);
        Ok(store)
    }

    /// Opens the store to read only. It takes no lock and can never write.
    pub fn read_only(path: &Path) -> Result<Store, StoreError> {
        let file = match crate::system::read_input(path) {
            Ok(bytes) => parse(path, &bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                File { schema: SCHEMA, records: BTreeMap::new() }
            }
            Err(source) => return Err(StoreError::Read { path: path.to_owned(), source }),
        };
        Ok(Store { path: path.to_owned(), file, dirty: false, _lock: None })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, id: &str) -> Option<&Record> {
        self.file.records.get(id)
    }

    /// Every record, by id.
    pub fn records(&self) -> impl Iterator<Item = (&String, &Record)> {
        self.file.records.iter()
    }

    /// Whether any record of this kind, under any id, holds this target.
    pub fn holds_target(&self, kind: Kind, target: &str) -> bool {
        self.file.records.values().any(|r| r.kind == kind && r.target == target)
    }

    /// The most recently applied record of this kind holding this target, under any id and
    /// origin: how a container's record is found by its name when its id has none (the bundle's
    /// `store` becoming the module's `postgres.server`), and how the digest the host recorded
    /// for a file is found by its path.
    pub fn latest_at(&self, kind: Kind, target: &str) -> Option<(&String, &Record)> {
        self.file
            .records
            .iter()
            .filter(|(_, r)| r.kind == kind && r.target == target)
            .max_by_key(|(_, r)| r.applied_at)
    }

    /// Records what worked. A record that says the same as before keeps its time, so a steady
    /// machine does not rewrite its store.
    pub fn record(&mut self, id: &str, mut record: Record) {
        match self.file.records.get(id) {
            Some(old) if old.same_as(&record) => {}
            _ => {
                record.applied_at = now();
                self.file.records.insert(id.to_owned(), record);
                self.dirty = true;
            }
        }
    }

    pub fn forget(&mut self, id: &str) {
        if self.file.records.remove(id).is_some() {
            self.dirty = true;
        }
    }

    /// Records of `origin` that the declaration no longer names, in reverse of the order they
    /// were declared in: what was declared last is removed first.
    pub fn orphans(&self, declaration: &Declaration, origin: Origin) -> Vec<(String, Record)> {
        let mut orphans: Vec<(String, Record)> = self
            .file
            .records
            .iter()
            .filter(|(id, r)| r.origin == origin && declaration.find(id).is_none())
            .map(|(id, r)| (id.clone(), r.clone()))
            .collect();
        orphans.sort_by(|a, b| b.1.position.cmp(&a.1.position).then(b.0.cmp(&a.0)));
        orphans
    }

    /// Writes the store if anything changed since it was read.
    pub fn save(&mut self) -> Result<(), StoreError> {
        if !self.dirty {
            return Ok(());
        }
        assert!(self._lock.is_some(), "a read-only store is never saved");
        self.file.schema = SCHEMA;
        let bytes = serde_json::to_vec_pretty(&self.file).expect("the store serialises");
        fs::write_private(&self.path, &bytes)?;
        self.dirty = false;
        Ok(())
    }
}

impl From<fs::FsError> for StoreError {
    fn from(e: fs::FsError) -> StoreError {
        StoreError::Write(e)
    }
}

fn parse(path: &Path, bytes: &[u8]) -> Result<File, StoreError> {
    #[derive(Deserialize)]
    struct Version {
        schema: u32,
    }
    let corrupt = |reason: String| StoreError::Corrupt { path: path.to_owned(), reason };
    let version: Version = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    if version.schema > SCHEMA {
        return Err(StoreError::Newer { path: path.to_owned(), found: version.schema });
    }
    serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
