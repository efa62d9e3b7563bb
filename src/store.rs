//! The state store: what the host applied, recorded only after it worked.
//!
//! One JSON file, mode 0600, with a schema version inside, replaced atomically. It is the
//! host's memory of its own footprint: orphans are found in it, and drift is told from a change
//! of mind by comparing the machine with what it says the host last wrote. So it is never
//! silently replaced: a corrupt store, or one written by a newer mesh-host, is refused, because
//! starting afresh would forget what the host owns and stop it cleaning up after itself
//! (docs/decisions.md, "Inputs and what is found at managed paths": moving it aside is the
//! operator's call).
//!
//! Architecture Invariant: one writer. `apply` and `run` hold an exclusive lock on
//! `<store>.lock` for as long as they may write; `plan` and `status` only read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use crate::declaration::{Declaration, Digest, Kind};
use crate::system::fs;
use crate::system::journal;

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
///
/// Held compact, since a node holds one for each of its ten thousand resources for months:
/// digests as bytes, the target as a boxed string, and what only containers, processes,
/// archives and scheduled steps have in a box of its own (`More`). On disk it is one flat JSON
/// object, the same as when every field was a string (`Wire`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(from = "Wire<String>")]
pub struct Record {
    /// Where the declaration that applied it came from: orphans are looked for among one origin's
    /// records only.
    pub origin: Origin,
    /// The resource's type.
    pub kind: Kind,
    /// What it names on the machine: a path, a unit, a name, a port. The text of the declared
    /// resource's path itself where it is one (`Spec::target_shared`), not a copy of it.
    pub target: Arc<str>,
    /// Position in the declaration that last applied it: orphans go in reverse of this order.
    pub position: u32,
    /// The digest of the resource's declaration when it was applied.
    pub declared: Digest,
    /// Seconds since the epoch when the record last changed.
    pub applied_at: u64,
    /// For a file: the digest of the content the host wrote (never the content).
    pub wrote: Option<Digest>,
    /// For a file or directory: the mode the host left, its permission bits (`mode_bits` makes
    /// them, `u32::from` reads them).
    pub mode: Option<ModeBits>,
    /// For a file or directory: the uid and gid the host left.
    pub owner: Option<Owned>,
    /// For a file: its change signature when the host last looked (inode, ctime, size). While
    /// it is the same, the file has not been touched and need not be read again.
    pub sig: Option<crate::system::Sig>,
    /// What fewer resources have; `None` when it would be empty.
    pub more: Option<Box<More>>,
}

/// A mode as a record holds it: its permission bits (`0o7777` at most), as one more than they
/// are, so that the value is never zero: `Option<ModeBits>` is 2 bytes where `Option<u32>` was
/// 8, and with `Nanos` a record is 144 bytes and 11 of them fit a node of the store's map in
/// the allocator's 1,792-byte size rather than its 2,048 (docs/memory.md). Written as the
/// number of the bits, as always.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ModeBits(std::num::NonZeroU16);

/// The uid and gid a record holds, the uid as one more than it is so that the value is never
/// zero: `Option<Owned>` is 8 bytes where `Option<(u32, u32)>` was 12 (see `ModeBits`). A uid
/// of 4294967295 is `(uid_t) -1`, which `chown` reads as "leave it", never an owner: it is
/// held as 4294967294. Written as the pair `[uid, gid]`, as always.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(u32, u32)", into = "(u32, u32)")]
pub struct Owned(std::num::NonZeroU32, u32);

/// The record's form of an owner.
pub fn owned((uid, gid): (u32, u32)) -> Owned {
    Owned(std::num::NonZeroU32::MIN.saturating_add(uid), gid)
}

impl From<(u32, u32)> for Owned {
    fn from(ids: (u32, u32)) -> Owned {
        owned(ids)
    }
}

impl From<Owned> for (u32, u32) {
    fn from(o: Owned) -> (u32, u32) {
        (o.0.get() - 1, o.1)
    }
}

impl std::fmt::Debug for Owned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (uid, gid) = <(u32, u32)>::from(*self);
        write!(f, "({uid}, {gid})")
    }
}

/// The record's form of a mode's permission bits; bits above `0o7777` are dropped.
pub fn mode_bits(mode: u32) -> ModeBits {
    // At most 0o7777 + 1: never zero, never past u16.
    ModeBits(std::num::NonZeroU16::MIN.saturating_add((mode & 0o7777) as u16))
}

impl From<ModeBits> for u32 {
    fn from(m: ModeBits) -> u32 {
        u32::from(m.0.get() - 1)
    }
}

impl std::fmt::Debug for ModeBits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04o}", u32::from(*self))
    }
}

impl Serialize for ModeBits {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(u32::from(*self))
    }
}

impl<'de> Deserialize<'de> for ModeBits {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bits = u32::deserialize(d)?;
        if bits > 0o7777 {
            return Err(serde::de::Error::custom(format!("mode {bits:o} has bits above 7777")));
        }
        Ok(mode_bits(bits))
    }
}

/// The parts of a record only some types have.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct More {
    /// For an archive: the digest of the archive last unpacked.
    pub archive: Option<String>,
    /// For a container: the digest of the spec it was created from (the `mesh-host.spec`
    /// label); for a run-once step, the spec it last completed at; for a scheduled step, the
    /// spec it was installed at. For a process: the digest of the command, environment and user
    /// its transient unit was started with. For an opening, where the filter it is in lives
    /// (`apply::opening::Home`): `ufw` or `firewalld` when it was made in the firewall found on
    /// an adopted node, `ufw-retired` or `firewalld-retired` once the host flipped from it into
    /// its own table (absent: in the host's own table, never behind a found firewall).
    pub spec: Option<String>,
    /// For a container: each file it read at creation (env-files, files mounted directly), by
    /// path, with the digest of what the file held then. What names the file in "recreated:
    /// /etc/web/web.env changed".
    pub reads: BTreeMap<String, String>,
    /// For a scheduled step: its 5-field cron expression (UTC), as installed.
    pub schedule: Option<String>,
    /// For a file that sets keys `into` someone else's: what to put back when it leaves.
    pub into: Option<Merged>,
    /// For a container: the machine's ports its declared mappings bind (`holds`), for whatever
    /// assigns ports above the node to go around. What the declaration binds, not what is open:
    /// a port open now may be gone when it is asked for, a declared one is the host's to keep.
    pub holds: Vec<u16>,
}

/// What a file with `into` found before the host first set each of its keys, so the keys can
/// be put back when the resource leaves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Merged {
    /// Whether the file is JSON or env lines.
    pub format: crate::declaration::MergeInto,
    /// Each owned key, with the value it had (as written in the file) before the host first
    /// set it, or `None` when it was absent.
    pub was: BTreeMap<String, Option<Was>>,
    /// The host created the file: once its keys are taken out and nothing else is in it, it is
    /// removed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub made: bool,
}

/// What an owned key held before the host first set it.
///
/// Spelled in the store as the value itself (a string), or `{"sealed": "-----BEGIN AGE..."}`:
/// the value of a key the declaration fills from a secret is sealed to the node's own public
/// key before it is recorded, so the store never holds in the clear what may be a credential
/// (the one the secret replaced), and the node can still open it to put it back. `age -d -i`
/// with the node's key file opens it too, by hand.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Was {
    /// The value, as written in the file.
    Plain(String),
    /// The value, sealed to the node's public key (armored age).
    Sealed {
        /// The armored age value.
        sealed: String,
    },
}

impl More {
    /// Boxed, or `None` when there is nothing in it.
    pub fn boxed(self) -> Option<Box<More>> {
        (self != More::default()).then(|| Box::new(self))
    }
}

impl Record {
    /// Whether two records say the same thing, ignoring when they were written and the change
    /// signature (a cache of "not touched since", not part of what the host did). Compared
    /// field by field, without cloning: a steady pass compares ten thousand of these.
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
            sig: _,
            more,
        } = self;
        *origin == other.origin
            && *kind == other.kind
            && *target == other.target
            && *position == other.position
            && *declared == other.declared
            && *wrote == other.wrote
            && *mode == other.mode
            && *owner == other.owner
            && *more == other.more
    }

    /// For an archive: the digest of the archive last unpacked.
    pub fn archive(&self) -> Option<&str> {
        self.more.as_ref().and_then(|m| m.archive.as_deref())
    }

    /// The spec digest a container, step, process or opening was applied at (see `More::spec`).
    pub fn spec(&self) -> Option<&str> {
        self.more.as_ref().and_then(|m| m.spec.as_deref())
    }

    /// What a container read at creation; empty for anything else.
    pub fn reads(&self) -> Option<&BTreeMap<String, String>> {
        self.more.as_ref().map(|m| &m.reads)
    }

    /// For a scheduled step: its cron expression, as installed.
    pub fn schedule(&self) -> Option<&str> {
        self.more.as_ref().and_then(|m| m.schedule.as_deref())
    }

    /// For a container: the machine's ports its declared mappings bind; empty for anything else.
    pub fn holds(&self) -> &[u16] {
        self.more.as_ref().map_or(&[], |m| &m.holds)
    }

    /// For a file with `into`: what its keys held before the host set them. Not `into`, which
    /// would shadow `Into::into` on every record.
    pub fn merged(&self) -> Option<&Merged> {
        self.more.as_ref().and_then(|m| m.into.as_ref())
    }
}

/// A record as the store file spells it: one flat object.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Wire<T> {
    origin: Origin,
    #[serde(rename = "type")]
    kind: Kind,
    target: T,
    position: u32,
    declared: Digest,
    applied_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wrote: Option<Digest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mode: Option<ModeBits>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<Owned>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sig: Option<crate::system::Sig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    archive: Option<T>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spec: Option<T>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    reads: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    schedule: Option<T>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    into: Option<Merged>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    holds: Vec<u16>,
}

impl From<Wire<String>> for Record {
    fn from(w: Wire<String>) -> Record {
        Record {
            origin: w.origin,
            kind: w.kind,
            target: w.target.into(),
            position: w.position,
            declared: w.declared,
            applied_at: w.applied_at,
            wrote: w.wrote,
            mode: w.mode,
            owner: w.owner,
            sig: w.sig,
            more: More {
                archive: w.archive,
                spec: w.spec,
                reads: w.reads,
                schedule: w.schedule,
                into: w.into,
                holds: w.holds,
            }
            .boxed(),
        }
    }
}

impl Serialize for Record {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // The reads are few and only containers have them; the rest is borrowed.
        Wire::<&str> {
            origin: self.origin,
            kind: self.kind,
            target: &self.target,
            position: self.position,
            declared: self.declared,
            applied_at: self.applied_at,
            wrote: self.wrote,
            mode: self.mode,
            owner: self.owner,
            sig: self.sig,
            archive: self.archive(),
            spec: self.spec(),
            reads: self.reads().cloned().unwrap_or_default(),
            schedule: self.schedule(),
            into: self.merged().cloned(),
            holds: self.holds().to_vec(),
        }
        .serialize(s)
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct File {
    schema: u32,
    #[serde(deserialize_with = "unique_records")]
    records: BTreeMap<Box<str>, Record>,
    /// On an adopted node, what resources of modules not yet taken were found present and are
    /// held as found, by id. Not records: nothing here was applied, and nothing here is ever
    /// removed as an orphan. A hold lasts until its module is taken (or the resource is no
    /// longer declared), so a held thing that disappears is not the host's to create.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    held: BTreeMap<Box<str>, Held>,
}

/// A resource held as found on an adopted node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// The resource's type.
    #[serde(rename = "type")]
    pub kind: Kind,
    /// What it names on the machine.
    pub target: Box<str>,
    /// The origin of the declaration that found it: only that origin's declarations release it
    /// when they no longer name it.
    pub origin: Origin,
}

/// How many records are moved into the store's map at a time as it is loaded: each chunk is a
/// list of its own (about 3 MB), and each move rebuilds the map whole (7 times at 100,000).
const RECORDS_CHUNK: usize = 16 * 1024;

/// The records, refusing an id given twice: JSON readers otherwise keep the last one silently,
/// and the host would forget what the other one made (docs/decisions.md, "The store").
///
/// Read into a list, sorted (the host writes them sorted, so this is one look) and built into
/// the map from it a chunk at a time, whose nodes are then full: inserted one at a time, the
/// map's nodes were left half full (39 MB instead of 20.5 at 100,000 records) and were rebuilt
/// after loading while the first map was still held (docs/memory.md).
fn unique_records<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<Box<str>, Record>, D::Error> {
    struct Records;
    impl<'de> serde::de::Visitor<'de> for Records {
        type Value = BTreeMap<Box<str>, Record>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object of records by id")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            // Each record boxed while the list is read, then moved into the map a chunk at a
            // time: a list of the records themselves (21 MB at 100,000, and more while it grew
            // by doubling) was held whole beside the map built from it, since the map collects
            // what it is built from into one list first. Boxed, each record's memory goes as its
            // chunk is moved, while the map grows (docs/memory.md, "Memory at scale").
            let mut out: Vec<(Box<str>, Box<Record>)> = Vec::new();
            while let Some(id) = map.next_key::<Box<str>>()? {
                out.push((id, Box::new(map.next_value()?)));
            }
            out.sort_by(|a, b| a.0.cmp(&b.0));
            if let Some(twice) = out.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(serde::de::Error::custom(format!(
                    "record {:?} is given twice",
                    cut(&twice[0].0)
                )));
            }
            let mut records = BTreeMap::new();
            let mut list = out.into_iter();
            loop {
                let mut chunk: BTreeMap<Box<str>, Record> =
                    list.by_ref().take(RECORDS_CHUNK).map(|(id, r)| (id, *r)).collect();
                if chunk.is_empty() {
                    break;
                }
                // The keys come sorted and unique, so the map is rebuilt full from both.
                records.append(&mut chunk);
            }
            Ok(records)
        }
    }
    d.deserialize_map(Records)
}

/// A value from the store as a message quotes it: at most 80 characters.
fn cut(s: &str) -> String {
    match s.char_indices().nth(80) {
        Some((at, _)) => format!("{}… ({} bytes)", &s[..at], s.len()),
        None => s.to_owned(),
    }
}

impl File {
    /// Checks every record as a declaration's resource is checked: an id the declaration would
    /// accept, and a target that is an absolute, normalised path for the types that name a path.
    /// The store decides what the host removes as an orphan, so a record it cannot trust (a
    /// relative target would be resolved against the working directory) refuses the store
    /// (docs/decisions.md, "The store").
    fn validate(&self) -> Result<(), String> {
        for (id, r) in &self.records {
            let bad = |why: String| format!("record {:?}: {why}", cut(id));
            crate::declaration::Id::parse(id)
                .map_err(|e| bad(format!("its id is not one a declaration accepts: {}", cut(&e))))?;
            match r.kind {
                Kind::File | Kind::Directory | Kind::Archive | Kind::Access => {
                    match crate::declaration::AbsPath::parse(&r.target) {
                        Ok(p) if p.as_str() == &*r.target => {}
                        Ok(_) => {
                            return Err(bad(format!(
                                "its target {:?} is not written as a declaration writes it (a trailing '/')",
                                cut(&r.target)
                            )))
                        }
                        Err(e) => return Err(bad(format!("its target: {}", cut(&e)))),
                    }
                }
                // A name: a unit, a container, a package, an account, a port.
                Kind::Package
                | Kind::Service
                | Kind::Container
                | Kind::Network
                | Kind::User
                | Kind::Process
                | Kind::Action
                | Kind::Opening => {
                    if r.target.is_empty() || r.target.contains(['\0', '\n']) {
                        return Err(bad(format!(
                            "its target {:?} is empty or holds a NUL or a newline",
                            cut(&r.target)
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Why the store could not be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file is there and is not a store: the host stops rather than forget what it created.
    #[error("the state store at {path} is not readable as a store ({reason}); it was left exactly as it is. Move it aside to start afresh, knowing that a fresh store forgets what this host created, so orphans from before will not be removed")]
    Corrupt {
        /// The store's file.
        path: PathBuf,
        /// Why it cannot be read as a store.
        reason: String,
    },
    /// The store was written by a newer mesh-host, in a schema this one does not know.
    #[error("the state store at {path} has schema {found}, newer than this mesh-host understands ({SCHEMA}); run the newer mesh-host that wrote it")]
    Newer {
        /// The store's file.
        path: PathBuf,
        /// The schema it has.
        found: u32,
    },
    /// The file could not be read.
    #[error("cannot read the state store at {path}: {source}")]
    Read {
        /// The store's file.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// Another mesh-host holds the store's lock.
    #[error(
        "another mesh-host is writing the state store {path} (it holds {path}.lock); one writer at a time"
    )]
    Locked {
        /// The store's file; its lock is beside it.
        path: PathBuf,
    },
    /// Writing the store failed; what was applied is not recorded.
    #[error("cannot write the state store: {0}")]
    Write(fs::Error),
    /// Taking the lock, or tidying what a crash left, failed: nothing was read or applied.
    #[error("cannot open the state store for writing: {0}")]
    Open(fs::Error),
}

/// The store, loaded.
pub struct Store {
    path: PathBuf,
    file: File,
    /// A record changed in what it says since the store was last written.
    dirty: bool,
    /// Only change signatures changed since then: worth writing, but not at once (see `save`).
    stale: bool,
    /// Records added under new ids since the map was last compacted.
    grown: usize,
    /// The store file as it was when read: inode, change time and size.
    stamp: Option<fs::Sig>,
    /// What an unfinished pass left in the journal of intent, until a pass has used it and the
    /// store is written.
    recovered: Option<journal::Recovered>,
    /// A pass wrote to the journal since the store was last written.
    journaled: bool,
    /// How many records hold each type and target, so `holds_target` is a lookup: adopting a
    /// node asks it of every found file, and a scan of every record for each would be
    /// quadratic in the size of the node. Built the first time it is asked, then kept up to
    /// date: a node that is not being adopted asks it only of a file found where it has no
    /// record, often never, and the index is an entry for every target (it shares their texts
    /// with the records; about 70 bytes a record, 7.8 MB at 100,000, when it copied them) that
    /// a daemon would otherwise hold for months unused (docs/memory.md). Do not build it on
    /// load again.
    targets: OnceLock<Targets>,
    /// Copies lent to reconciles running apart (`lend`) and not yet taken back: while any is
    /// out, the journal of intent is kept, since the reconcile holding it may have written
    /// intents its records do not yet cover.
    lent: usize,
}

/// How many records hold each type and target.
type Targets = std::collections::HashMap<(Kind, Arc<str>), u32>;

fn count_in(targets: &mut Targets, r: &Record) {
    *targets.entry((r.kind, r.target.clone())).or_default() += 1;
}

fn count_out(targets: &mut Targets, r: &Record) {
    let key = (r.kind, r.target.clone());
    if let Some(n) = targets.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            targets.remove(&key);
        }
    }
}

/// The change signature of the store file, or `None` when there is none.
fn stamp(path: &Path) -> Option<fs::Sig> {
    fs::Fs::new().meta(path).ok().flatten().map(|m| m.sig)
}

/// The store held with its lock: the only one that can be written. A store opened without the
/// lock (`Store::read_only`, a copy `lend`s to a reconcile apart) is a plain `Store`, which has
/// no `save`: that it is never written is a matter of its type, not of a check at run time.
/// Everything else of the store is reached through it as through a `Store`.
pub struct Writer {
    store: Store,
    /// Held for as long as the writer lives; released when it is dropped.
    _lock: fs::Lock,
}

impl std::ops::Deref for Writer {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.store
    }
}

impl std::ops::DerefMut for Writer {
    fn deref_mut(&mut self) -> &mut Store {
        &mut self.store
    }
}

impl Store {
    /// Opens the store to read and write, holding its lock. An absent store is an empty one.
    pub fn open(path: &Path) -> Result<Writer, Error> {
        Store::read_only(path)?.lock()
    }

    /// Takes the store's lock, to write it. What was read before the lock is read again if the
    /// file changed meanwhile. Only here is anything made on the machine (the state directory,
    /// the lock file), so a command refused before it gets here has touched nothing
    /// (docs/decisions.md, "The store").
    pub fn lock(self) -> Result<Writer, Error> {
        let mut lock_path = self.path.as_os_str().to_owned();
        lock_path.push(".lock");
        let lock = fs::try_lock(Path::new(&lock_path))
            .map_err(Error::Open)?
            .ok_or_else(|| Error::Locked { path: self.path.clone() })?;
        // A crash between writing and renaming leaves a temporary file; with the lock held, no
        // one else can be writing it. The same sweep as for a pass's leftovers
        // (docs/decisions.md, "The store").
        let dir = state_dir(&self.path);
        fs::remove_temporaries(dir).map_err(Error::Open)?;
        // And in the state directory's own subdirectories, written the same way (`write_own`):
        // a kill between a high-water mark's write and its rename left one in `trust/` for good
        // (found by the kill rounds).
        for sub in OWN_SUBDIRS {
            fs::remove_temporaries(&dir.join(sub)).map_err(Error::Open)?;
        }
        let store = if stamp(&self.path) == self.stamp { self } else { Store::read_only(&self.path)? };
        // Only root should read what the host owns; a store others can read is tightened, with
        // a warning (docs/decisions.md, "The store"). The key file is refused instead: see
        // docs/decisions.md, "A key file anyone but its owner can read or write is refused".
        let mut fsys = fs::Fs::new();
        if let Some(meta) = fsys.meta(&store.path).map_err(Error::Open)? {
            if meta.mode & 0o077 != 0 {
                fsys.change_in_place(&store.path, fs::Expect::Checked(&meta), None, Some(0o600))
                    .map_err(Error::Open)?;
                tracing::warn!(store = %store.path.display(), mode = format!("{:04o}", meta.mode), "the state store was readable by others; its mode is now 0600");
            }
        }
        // The last pass did not finish: its temporary files go; its intents stay until this
        // pass has used them (docs/durability.md, "Crashes").
        if let Some(recovered) = &store.recovered {
            let mut removed = 0;
            for dir in &recovered.dirs {
                removed += fs::remove_temporaries(dir).map_err(Error::Open)?;
            }
            tracing::info!(
                directories = recovered.dirs.len(),
                temporary_files_removed = removed,
                files_in_flight = recovered.intents.len(),
                "the last pass did not finish; its temporary files were removed, and the files it was writing will not be counted as drift"
            );
        }
        Ok(Writer { store, _lock: lock })
    }

    /// Where the journal of intent is kept: beside the store.
    pub fn journal_path(&self) -> PathBuf {
        let mut p = self.path.as_os_str().to_owned();
        p.push(".journal");
        PathBuf::from(p)
    }

    /// Notes that a pass wrote to the journal: it is removed once the store is written.
    pub fn journaled(&mut self) {
        self.journaled = true;
    }

    /// Whether a journal of intent was found at start-up: the last pass did not finish, and the
    /// next one looks for what it left (`system::fs::Fs::after_a_crash`).
    pub fn after_a_crash(&self) -> bool {
        self.recovered.is_some()
    }

    /// What an unfinished pass was writing at `path`, by the journal found at start-up.
    pub fn intended(&self, path: &Path) -> &[journal::Intent] {
        self.recovered.as_ref().and_then(|r| r.intents.get(path)).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Opens the store to read only. It takes no lock and can never write.
    pub fn read_only(path: &Path) -> Result<Store, Error> {
        let file = match crate::system::input::open_input(path, crate::system::input::STORE_LIMIT) {
            Ok(reader) => parse(path, reader)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                File { schema: SCHEMA, records: BTreeMap::new(), held: BTreeMap::new() }
            }
            Err(source) => return Err(Error::Read { path: path.to_owned(), source }),
        };
        let mut store = Store {
            path: path.to_owned(),
            file,
            dirty: false,
            stale: false,
            grown: 0,
            stamp: stamp(path),
            recovered: None,
            journaled: false,
            targets: OnceLock::new(),
            lent: 0,
        };
        // What the host was doing when it stopped, read even for a plan, so that a plan does not
        // call the host's own unfinished work drift either.
        store.recovered = journal::recover(&store.journal_path())
            .map_err(|source| Error::Read { path: store.journal_path(), source })?;
        // Not compacted: the records were built into a full map (`unique_records`).
        Ok(store)
    }

    /// Where the store's file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The record of one resource, by its id.
    pub fn get(&self, id: &str) -> Option<&Record> {
        self.file.records.get(id)
    }

    /// Every record, by id.
    pub fn records(&self) -> impl Iterator<Item = (&str, &Record)> {
        self.file.records.iter().map(|(id, r)| (&**id, r))
    }

    /// Whether any record of this kind, under any id, holds this target.
    pub fn holds_target(&self, kind: Kind, target: &str) -> bool {
        // The key is borrowed as a pair of owned parts; one small allocation per lookup beats a
        // second map keyed by borrowed strings.
        let targets = self.targets.get_or_init(|| {
            let mut targets = Targets::new();
            for r in self.file.records.values() {
                count_in(&mut targets, r);
            }
            targets
        });
        targets.contains_key(&(kind, Arc::from(target)))
    }

    /// The hold of a resource found present on an adopted node, if it is held.
    pub fn held(&self, id: &str) -> Option<&Held> {
        self.file.held.get(id)
    }

    /// Every hold, by id.
    pub fn holds(&self) -> impl Iterator<Item = (&str, &Held)> {
        self.file.held.iter().map(|(id, h)| (&**id, h))
    }

    /// Remembers that a resource is held as found, until its module is taken.
    pub fn hold(&mut self, id: &str, held: Held) {
        if self.file.held.get(id) != Some(&held) {
            self.file.held.insert(id.into(), held);
            self.dirty = true;
        }
    }

    /// Lets go of a hold: its module was taken, or it is no longer declared.
    pub fn release(&mut self, id: &str) {
        if self.file.held.remove(id).is_some() {
            self.dirty = true;
        }
    }

    /// The most recently applied record of this kind holding this target, under any id and
    /// origin: how a container's record is found by its name when its id has none (the bundle's
    /// `store` becoming the module's `postgres.server`), and how the digest the host recorded
    /// for a file is found by its path.
    pub fn latest_at(&self, kind: Kind, target: &str) -> Option<(&str, &Record)> {
        self.records()
            .filter(|(_, r)| r.kind == kind && &*r.target == target)
            .max_by_key(|(_, r)| r.applied_at)
    }

    /// Records what worked. A record that says the same as before keeps its time, so a steady
    /// machine does not rewrite its store; one whose change signature alone moved (a file put
    /// back after a hand-edit is a new inode) takes the new signature and leaves the store
    /// stale rather than dirty.
    pub fn record(&mut self, id: &str, mut record: Record) {
        match self.file.records.get_mut(id) {
            Some(old) if old.same_as(&record) => {
                // The same text, now shared with the declaration (a record read from the file
                // had its own copy).
                old.target = record.target;
                if old.sig != record.sig {
                    old.sig = record.sig;
                    self.stale = true;
                }
            }
            _ => {
                record.applied_at = now();
                if let Some(targets) = self.targets.get_mut() {
                    count_in(targets, &record);
                }
                match self.file.records.insert(id.into(), record) {
                    Some(old) => {
                        if let Some(targets) = self.targets.get_mut() {
                            count_out(targets, &old);
                        }
                    }
                    None => self.grown += 1,
                }
                self.dirty = true;
            }
        }
    }

    /// Records the signature of a file found, once its change time is old enough to trust,
    /// that a record was just made for. The store is then stale, not dirty: see `record`.
    pub fn sign(&mut self, id: &str, sig: fs::Sig) {
        if let Some(rec) = self.file.records.get_mut(id) {
            if rec.sig != Some(sig) {
                rec.sig = Some(sig);
                self.stale = true;
            }
        }
    }

    /// Drops the record of a resource removed or forgotten; written at the next save.
    pub fn forget(&mut self, id: &str) {
        if let Some(old) = self.file.records.remove(id) {
            if let Some(targets) = self.targets.get_mut() {
                count_out(targets, &old);
            }
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
            .map(|(id, r)| (id.to_string(), r.clone()))
            .collect();
        orphans.sort_by(|a, b| b.1.position.cmp(&a.1.position).then(b.0.cmp(&a.0)));
        orphans
    }
}

impl Writer {
    /// Writes the store if anything changed since it was last written, signatures included:
    /// after a whole pass, and on the way out.
    pub fn save(&mut self) -> Result<(), Error> {
        if self.dirty || self.stale {
            self.write()?;
        }
        self.forget_journal()
    }

    /// Writes the store only if a record changed in what it says. After a single resource's
    /// reconcile: putting back a hand-edited file changes nothing but its signature, and
    /// rewriting a store of ten thousand records for that would cost more than the correction.
    /// A signature lost to a crash costs one extra read of that file in the next pass
    /// (docs/decisions.md, "The store"; ARCHITECTURE.md, "Invariants").
    pub fn save_changes(&mut self) -> Result<(), Error> {
        if self.dirty {
            self.write()?;
        }
        self.forget_journal()
    }

    fn write(&mut self) -> Result<(), Error> {
        self.file.schema = SCHEMA;
        if self.grown > self.file.records.len() / 8 {
            self.compact();
        }
        // Serialised straight into the new file, buffered: never the whole text in memory, which
        // at 100,000 records was a buffer grown by doubling to 64 MB (and 32 more while it grew),
        // the peak of any apply that changed something.
        let file = &self.file;
        fs::write_private_with(&self.path, &mut |out| {
            let mut out = std::io::BufWriter::with_capacity(64 * 1024, out);
            let mut json = serde_json::Serializer::with_formatter(&mut out, RecordPerLine::default());
            file.serialize(&mut json)?;
            std::io::Write::flush(&mut out)
        })?;
        self.dirty = false;
        self.stale = false;
        Ok(())
    }

    /// Once the store holds what the passes did, the journal has nothing left to say; not while
    /// a copy is lent, whose reconcile may have written intents its records do not yet cover.
    fn forget_journal(&mut self) -> Result<(), Error> {
        let store = &mut self.store;
        if store.lent == 0 && (store.journaled || store.recovered.is_some()) {
            journal::remove(&store.journal_path()).map_err(fs::Error::from)?;
            store.journaled = false;
            store.recovered = None;
        }
        Ok(())
    }
}

/// A reconcile running beside others works on a copy of the store and gives back only what it
/// claimed (`controller::queue::Claim`): claims in flight are disjoint, so what one gives back
/// is never what another is changing. Only the writer lends: what it takes back, it writes.
impl Writer {
    /// A copy of the records and holds for a reconcile that runs apart from the store's owner.
    /// It holds no lock and cannot be saved; what it records comes back through `take_back`.
    /// What a crash's journal recovered is not lent: the first pass after a start, a full one,
    /// runs before anything is lent, and uses it.
    pub fn lend(&mut self) -> Store {
        self.lent += 1;
        Store {
            path: self.path.clone(),
            file: self.file.clone(),
            dirty: false,
            stale: false,
            grown: 0,
            stamp: self.stamp,
            recovered: None,
            journaled: false,
            targets: self.targets.clone(),
            lent: 0,
        }
    }

    /// A copy from `lend` that will not come back (its thread was lost): nothing of it is taken.
    pub fn lost(&mut self) {
        self.lent = self.lent.saturating_sub(1);
    }

    /// Takes back a copy from `lend`: for each of `ids`, its record and its hold as the copy
    /// has them now (recorded, changed, forgotten, held or released), marked dirty or stale as
    /// if recorded here. Nothing else of the copy is looked at. `None` for a copy given up (its
    /// reconcile panicked): nothing of it is taken, and the machine is read again next time.
    pub fn take_back(&mut self, lent: Store, ids: Option<&[&str]>) {
        self.lent = self.lent.saturating_sub(1);
        let Some(ids) = ids else { return };
        if lent.journaled {
            self.journaled = true;
        }
        for &id in ids {
            match lent.file.records.get(id) {
                Some(r) => {
                    let applied_at = r.applied_at;
                    self.record(id, r.clone());
                    // The time the reconcile recorded it, not the time it came back.
                    if let Some(mine) = self.file.records.get_mut(id) {
                        mine.applied_at = applied_at;
                    }
                }
                None => self.forget(id),
            }
            match lent.file.held.get(id) {
                Some(h) => self.hold(id, h.clone()),
                None => self.release(id),
            }
        }
    }
}

impl Store {
    /// Rebuilds the map from its sorted entries. A B-tree filled one insert at a time (as a
    /// first apply fills it) leaves its nodes about half full; built from sorted entries, they
    /// are full: about 2 MiB less at 10,000 records, for a millisecond. Loading builds it full
    /// from the start (`unique_records`).
    ///
    /// Each id and target is allocated anew as it moves. They were allocated one by one during
    /// the pass that made the records, between the pass's own short-lived texts of the same
    /// sizes (reports, paths, details), and kept the allocator's pages those left nearly empty
    /// resident for as long as the daemon runs: 6.7 MiB of a daemon's 77 MiB anonymous memory
    /// after a first apply of 100,000 files (docs/memory.md).
    fn compact(&mut self) {
        self.file.records =
            std::mem::take(&mut self.file.records).into_iter().map(|(id, r)| (Box::from(&*id), r)).collect();
        self.grown = 0;
    }
}

impl From<fs::Error> for Error {
    fn from(e: fs::Error) -> Error {
        Error::Write(e)
    }
}

/// How the store is written: its two outer levels indented, each record (and each hold) whole on
/// a line of its own, in the compact form inside. `grep` of an id shows all its record, and
/// the file is 29 % smaller than fully indented (3.97 MB against 5.60 at 10,000 files), that
/// much less to write after a change and to parse at every start. Any JSON reads: stores
/// written indented before are read as ever (docs/decisions.md, "The store").
#[derive(Default)]
struct RecordPerLine {
    /// How many objects the value being written is in.
    depth: usize,
    /// Whether the innermost indented object has a member yet: an empty one is `{}`.
    has_member: bool,
}

impl RecordPerLine {
    /// Objects this deep or less have their members on lines of their own.
    const INDENTED: usize = 2;

    fn line<W: ?Sized + std::io::Write>(out: &mut W, depth: usize) -> std::io::Result<()> {
        out.write_all(b"\n")?;
        for _ in 0..depth {
            out.write_all(b"  ")?;
        }
        Ok(())
    }
}

impl serde_json::ser::Formatter for RecordPerLine {
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, out: &mut W) -> std::io::Result<()> {
        self.depth += 1;
        self.has_member = false;
        out.write_all(b"{")
    }

    fn end_object<W: ?Sized + std::io::Write>(&mut self, out: &mut W) -> std::io::Result<()> {
        self.depth -= 1;
        if self.depth < Self::INDENTED && self.has_member {
            Self::line(out, self.depth)?;
        }
        // The object that holds this one has a member: this one.
        self.has_member = true;
        out.write_all(b"}")
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        out: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if !first {
            out.write_all(b",")?;
        }
        if self.depth <= Self::INDENTED {
            Self::line(out, self.depth)?;
        }
        Ok(())
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, out: &mut W) -> std::io::Result<()> {
        self.has_member = true;
        out.write_all(if self.depth <= Self::INDENTED { b": " } else { b":" })
    }
}

fn parse(path: &Path, reader: impl std::io::Read) -> Result<File, Error> {
    #[derive(Deserialize)]
    struct Version {
        schema: u32,
    }
    let corrupt = |reason: String| Error::Corrupt { path: path.to_owned(), reason };
    let newer = |found: u32| Error::Newer { path: path.to_owned(), found };
    // Read as a store first, parsed as it is read: the text is never held whole (56 MB at
    // 100,000 records, beside the declaration's text at the peak of an `apply`). Only a file
    // that does not read as a store is read again, whole, for its schema alone, to say whether
    // it is newer (whose records may not read here) or corrupt, exactly as when the schema was
    // always read first.
    let file: File = match serde_json::from_reader(reader) {
        Ok(file) => file,
        Err(e) if e.is_io() => {
            return Err(Error::Read { path: path.to_owned(), source: e.into() });
        }
        Err(e) => {
            let bytes = crate::system::read_input(path, crate::system::input::STORE_LIMIT)
                .map_err(|source| Error::Read { path: path.to_owned(), source })?;
            let version: Version = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
            if version.schema > SCHEMA {
                return Err(newer(version.schema));
            }
            return Err(corrupt(e.to_string()));
        }
    };
    if file.schema > SCHEMA {
        return Err(newer(file.schema));
    }
    file.validate().map_err(corrupt)?;
    Ok(file)
}

/// The subdirectories of the state directory whose files are written whole through a temporary
/// name (`system::fs::write_own`) and swept of what a killed process left when the store is
/// locked: the high-water marks and the pinned trust policy, and the fleet's confirmation
/// window. `generations/` sweeps its own.
const OWN_SUBDIRS: [&str; 2] = ["trust", "fleet"];

/// The directory the state store is in, where the agent keeps what belongs beside it (the
/// journal, the kept originals, the sealing key, the fleet's cache, the content file): `.` for
/// a store named without a directory.
pub fn state_dir(state: &Path) -> &Path {
    state.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Where the originals a first write replaced are kept: `kept/` beside the store
/// (docs/decisions.md, "A file found with no record").
pub fn originals_dir(state: &Path) -> PathBuf {
    state_dir(state).join("kept")
}

fn now() -> u64 {
    crate::system::unix_secs()
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "a test writes the store file it then opens")]
mod tests {
    use super::*;

    /// A store as mesh-host wrote it when every digest was a string: a file's record and a
    /// container's, with the fields only containers have.
    const WRITTEN_BEFORE: &str = r#"{
  "schema": 1,
  "records": {
    "web.app": {
      "origin": "declared",
      "type": "container",
      "target": "web",
      "position": 1,
      "declared": "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
      "applied-at": 1764480000,
      "spec": "sha256:60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752",
      "reads": {
        "/etc/web/web.env": "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
      },
      "schedule": "0 3 * * *"
    },
    "web.conf": {
      "origin": "declared",
      "type": "file",
      "target": "/etc/web/web.conf",
      "position": 0,
      "declared": "sha256:fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9",
      "applied-at": 1764480000,
      "wrote": "sha256:b5bb9d8014a0f9b1d61e21e796d78dccdf1352f23cd32812f4850b878ae4944c",
      "mode": 420,
      "owner": [
        0,
        0
      ]
    }
  }
}"#;

    /// A temporary file a killed write left beside a high-water mark, or the confirmation
    /// window, is removed when the store is next locked; a file of another name stays.
    #[test]
    fn locking_the_store_sweeps_the_temporaries_of_its_own_subdirectories() {
        let dir = tempfile::tempdir().unwrap();
        let left = [
            dir.path().join("trust/.local.mesh-host-1-7"),
            dir.path().join("fleet/.window.json.mesh-host-1-3"),
        ];
        for path in &left {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "half").unwrap();
        }
        std::fs::write(dir.path().join("trust/local"), "mark").unwrap();
        let _store = Store::open(&dir.path().join("state.json")).unwrap();
        for path in &left {
            assert!(!path.exists(), "{} left", path.display());
        }
        assert!(dir.path().join("trust/local").exists(), "the mark itself stays");
    }

    fn store_at(dir: &tempfile::TempDir, text: &str) -> Writer {
        let path = dir.path().join("state.json");
        std::fs::write(&path, text).unwrap();
        Store::open(&path).unwrap()
    }

    /// The store's shape: the two outer levels indented, each record whole on one line, compact
    /// inside; an empty map is `{}`.
    #[test]
    fn the_store_is_written_a_record_to_a_line() {
        #[derive(Serialize)]
        struct Shape {
            schema: u32,
            records: BTreeMap<&'static str, serde_json::Value>,
            held: BTreeMap<&'static str, u32>,
        }
        let shape = Shape {
            schema: 1,
            records: BTreeMap::from([
                (
                    "a.one",
                    serde_json::json!({"owner": [0, 0], "reads": {"/etc/x": "sha256:ab"}, "type": "file"}),
                ),
                ("a.two", serde_json::json!({})),
            ]),
            held: BTreeMap::new(),
        };
        let mut out = Vec::new();
        shape
            .serialize(&mut serde_json::Serializer::with_formatter(&mut out, RecordPerLine::default()))
            .unwrap();
        let expected = r#"{
  "schema": 1,
  "records": {
    "a.one": {"owner":[0,0],"reads":{"/etc/x":"sha256:ab"},"type":"file"},
    "a.two": {}
  },
  "held": {}
}"#;
        assert_eq!(String::from_utf8(out).unwrap(), expected);
    }

    /// A store written indented (as before) is read, and written again a record to a line with
    /// the same records: `grep` of an id finds its whole record.
    #[test]
    fn a_store_written_a_record_to_a_line_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = store_at(&dir, WRITTEN_BEFORE);
        store.record("a.one", file_record(1));
        let recorded = store.get("a.one").cloned();
        store.save().unwrap();
        let path = dir.path().join("state.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let line = text.lines().find(|l| l.contains("\"a.one\"")).unwrap();
        let (_, record) = line.trim_end_matches(',').split_once(": ").unwrap();
        let record: serde_json::Value = serde_json::from_str(record).unwrap();
        assert_eq!(record["target"], "/srv/1", "{line}");
        assert!(
            text.lines().all(|l| !l.starts_with("      ")),
            "nothing is indented inside a record:\n{text}"
        );
        let before: serde_json::Value = serde_json::from_str(WRITTEN_BEFORE).unwrap();
        let after: serde_json::Value = serde_json::from_str(&text).unwrap();
        for (id, record) in before["records"].as_object().unwrap() {
            assert_eq!(&after["records"][id], record, "{id} came through");
        }
        let again = Store::read_only(&path).unwrap();
        assert_eq!(again.get("a.one").cloned(), recorded);
    }

    /// More records than one chunk of the load (`RECORDS_CHUNK`): every
    /// one comes back, once, intact, and a store of one more than a chunk as well.
    #[test]
    #[allow(clippy::disallowed_methods, reason = "the test writes the store it loads")]
    fn a_store_of_several_chunks_loads_every_record() {
        for n in [RECORDS_CHUNK as u32 * 2 + 7, RECORDS_CHUNK as u32 + 1] {
            let dir = tempfile::tempdir().unwrap();
            let records: Vec<(String, Record)> = (0..n).map(|i| (format!("f.{i}"), file_record(i))).collect();
            let text = serde_json::json!({
                "schema": SCHEMA,
                "records": records.iter().map(|(id, r)| (id.clone(), serde_json::to_value(r).unwrap())).collect::<serde_json::Map<_, _>>(),
            });
            let path = dir.path().join("state.json");
            std::fs::write(&path, serde_json::to_vec(&text).unwrap()).unwrap();
            let store = Store::read_only(&path).unwrap();
            assert_eq!(store.records().count(), n as usize);
            for i in [0, 1, RECORDS_CHUNK as u32 - 1, RECORDS_CHUNK as u32, n - 1] {
                assert_eq!(store.get(&format!("f.{i}")), Some(&file_record(i)), "record f.{i}");
            }
            let ids: Vec<&str> = store.records().map(|(id, _)| id).collect();
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "in order");
        }
    }

    fn file_record(n: u32) -> Record {
        Record {
            origin: Origin::Declared,
            kind: Kind::File,
            target: format!("/srv/{n}").into(),
            position: n,
            declared: Digest::of(&n.to_le_bytes()),
            applied_at: 0,
            wrote: None,
            mode: None,
            owner: None,
            sig: None,
            more: None,
        }
    }

    /// A daemon holds a record of every resource for as long as it runs: at 100,000 of them
    /// each byte here is 100 KB there (docs/memory.md).
    #[test]
    fn a_record_is_held_in_few_bytes() {
        use std::mem::size_of;
        assert!(
            size_of::<Option<fs::Sig>>() <= 28,
            "an Option<Sig> is {} bytes",
            size_of::<Option<fs::Sig>>()
        );
        assert!(size_of::<Record>() <= 144, "a Record is {} bytes", size_of::<Record>());
    }

    /// A mode, a uid and a change time's nanoseconds are held as one more than they are (so that
    /// the `None` of their `Option` costs nothing) and read, written and printed as they are.
    #[test]
    fn modes_owners_and_nanoseconds_read_back_as_they_were_given() {
        for bits in [0, 0o644, 0o7777] {
            let m = mode_bits(bits);
            assert_eq!(u32::from(m), bits);
            assert_eq!(serde_json::to_string(&m).unwrap(), bits.to_string());
            assert_eq!(serde_json::from_str::<ModeBits>(&bits.to_string()).unwrap(), m);
        }
        assert_eq!(u32::from(mode_bits(0o100644)), 0o644, "the type's bits are not kept");
        assert!(serde_json::from_str::<ModeBits>("4096").is_err(), "above 0o7777: not a mode the host left");
        assert_eq!(format!("{:?}", mode_bits(0o640)), "0640");
        for ids in [(0, 0), (1000, 100), (u32::MAX - 1, u32::MAX)] {
            let o = owned(ids);
            assert_eq!(<(u32, u32)>::from(o), ids);
            let text = serde_json::to_string(&o).unwrap();
            assert_eq!(text, format!("[{},{}]", ids.0, ids.1), "written as the pair");
            assert_eq!(serde_json::from_str::<Owned>(&text).unwrap(), o);
        }
        for nanos in [0, 1, 999_999_999] {
            let sig = fs::Sig::from((7, 1_000, nanos, 3));
            assert_eq!(<(u64, i64, u32, u64)>::from(sig), (7, 1_000, nanos, 3));
        }
    }

    /// A record read from the file has its own copy of its target; recorded again unchanged,
    /// as a daemon's first pass records every resource, it takes the text it was given (the
    /// declaration's own, `Spec::target_shared`) and the copy goes, without dirtying the store.
    #[test]
    fn a_record_recorded_unchanged_takes_the_declarations_text() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = store_at(&dir, WRITTEN_BEFORE);
        store.record("a.one", file_record(1));
        store.save().unwrap();
        drop(store);
        let mut again = Store::open(&dir.path().join("state.json")).unwrap();
        let declared = file_record(1);
        let text = Arc::clone(&declared.target);
        assert!(!Arc::ptr_eq(&again.get("a.one").unwrap().target, &text), "read from the file");
        again.record("a.one", declared);
        assert!(Arc::ptr_eq(&again.get("a.one").unwrap().target, &text));
        assert!(!again.dirty, "nothing changed that the file holds");
    }

    #[test]
    fn a_lent_copy_gives_back_only_the_ids_it_claimed_and_keeps_the_journal_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = store_at(&dir, WRITTEN_BEFORE);
        store.record("a.mine", file_record(1));
        store.record("a.gone", file_record(2));
        store.save().unwrap();
        let mut copy = store.lend();
        // The copy's reconcile changes its claim, and (as a pass may) looks at or touches
        // others; the owner meanwhile records another resource itself.
        copy.record("a.mine", file_record(7));
        copy.forget("a.gone");
        copy.record("a.new", file_record(3));
        copy.record("web.conf", file_record(9));
        copy.journaled();
        store.record("a.owner", file_record(4));
        // While the copy is out, a save keeps the journal of intent it may have written to.
        let journal = store.journal_path();
        std::fs::write(&journal, "").unwrap();
        store.journaled();
        store.save().unwrap();
        assert!(journal.exists(), "kept while a copy is lent");
        store.take_back(copy, Some(&["a.mine", "a.gone", "a.new"]));
        assert_eq!(store.get("a.mine").unwrap().target.as_ref(), "/srv/7");
        assert!(store.get("a.gone").is_none(), "forgotten in the copy, forgotten here");
        assert!(store.get("a.new").is_some());
        assert!(store.holds_target(Kind::File, "/srv/7") && !store.holds_target(Kind::File, "/srv/1"));
        assert_eq!(
            store.get("web.conf").unwrap().target.as_ref(),
            "/etc/web/web.conf",
            "not claimed: not taken back"
        );
        assert!(store.get("a.owner").is_some(), "the owner's own record stays");
        store.save().unwrap();
        assert!(!journal.exists(), "removed once every copy is back and the store written");
        let read = Store::read_only(store.path()).unwrap();
        assert_eq!(read.get("a.mine").unwrap().target.as_ref(), "/srv/7", "and written");

        // A copy given up (its reconcile panicked) gives nothing back.
        let mut copy = store.lend();
        copy.forget("a.mine");
        store.take_back(copy, None);
        assert!(store.get("a.mine").is_some());
        assert_eq!(store.lent, 0);
    }

    #[test]
    fn holds_target_follows_records_recorded_moved_and_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = store_at(&dir, WRITTEN_BEFORE);
        assert!(store.holds_target(Kind::File, "/etc/web/web.conf"), "read from the file");
        assert!(store.holds_target(Kind::Container, "web"));
        assert!(!store.holds_target(Kind::Directory, "/etc/web/web.conf"), "of its type only");
        store.record("a.one", file_record(1));
        store.record("a.two", file_record(1));
        store.forget("a.one");
        assert!(store.holds_target(Kind::File, "/srv/1"), "a.two still holds it");
        // An id whose target moved no longer holds the old one.
        store.record("a.two", file_record(2));
        assert!(!store.holds_target(Kind::File, "/srv/1"));
        assert!(store.holds_target(Kind::File, "/srv/2"));
        store.save().unwrap();
        let again = Store::read_only(&dir.path().join("state.json")).unwrap();
        assert!(again.holds_target(Kind::File, "/srv/2") && !again.holds_target(Kind::File, "/srv/1"));
    }

    /// Adopting a node asks `holds_target` of every found file while the store grows by one
    /// record per file: a scan per lookup made 10,000 files 50 million comparisons (7.7 s here,
    /// against 58 ms for 1,000). Timed against a tenth of the work, so a slow shared machine
    /// moves both sides alike: linear work grows ten times, quadratic a hundred; the second of
    /// slack absorbs a busy machine's preemptions, and is far below the quadratic cost.
    #[test]
    fn adopting_ten_thousand_found_files_is_not_quadratic() {
        fn adopt(n: u32) -> std::time::Duration {
            let dir = tempfile::tempdir().unwrap();
            let mut store = Store::open(&dir.path().join("state.json")).unwrap();
            let t = std::time::Instant::now();
            for i in 0..n {
                let target = format!("/srv/{i}");
                assert!(!store.holds_target(Kind::File, &target));
                store.record(&format!("a.f{i}"), file_record(i));
                assert!(store.holds_target(Kind::File, &target));
            }
            t.elapsed()
        }
        let small = (0..3).map(|_| adopt(1_000)).min().unwrap();
        let large = (0..3).map(|_| adopt(10_000)).min().unwrap();
        assert!(
            large < small * 40 + std::time::Duration::from_secs(1),
            "10,000 found files took {large:?}, 1,000 took {small:?}: more than linear"
        );
    }

    #[test]
    fn a_hold_is_kept_in_the_store_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = store_at(&dir, WRITTEN_BEFORE);
        let held = Held { kind: Kind::Directory, target: "/srv/theirs".into(), origin: Origin::Declared };
        store.hold("app.data", held.clone());
        store.save().unwrap();
        drop(store);
        let mut again = Store::open(&dir.path().join("state.json")).unwrap();
        assert_eq!(again.held("app.data"), Some(&held));
        assert!(again.get("app.data").is_none(), "a hold is not a record: nothing was applied");
        again.release("app.data");
        again.save().unwrap();
        drop(again);
        assert!(Store::read_only(&dir.path().join("state.json")).unwrap().held("app.data").is_none());
    }

    #[test]
    fn a_store_written_with_string_digests_reads_and_writes_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = store_at(&dir, WRITTEN_BEFORE);
        let app = store.get("web.app").unwrap();
        assert_eq!(
            app.spec(),
            Some("sha256:60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752")
        );
        assert_eq!(app.schedule(), Some("0 3 * * *"));
        assert_eq!(app.reads().map(BTreeMap::len), Some(1));
        let conf = store.get("web.conf").unwrap();
        assert!(conf.more.is_none(), "a file's record has nothing boxed");
        assert_eq!(
            conf.wrote.map(|d| d.to_string()).as_deref(),
            Some("sha256:b5bb9d8014a0f9b1d61e21e796d78dccdf1352f23cd32812f4850b878ae4944c")
        );

        // Saved again, the file says exactly what it said.
        store.dirty = true;
        store.save().unwrap();
        let again: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("state.json")).unwrap()).unwrap();
        let before: serde_json::Value = serde_json::from_str(WRITTEN_BEFORE).unwrap();
        assert_eq!(again, before);
    }

    #[test]
    fn what_an_into_key_held_is_a_string_a_sealed_value_or_null() {
        // A store written before sealed values still reads: its values are plain strings.
        let text = r#"{"format": "env", "was": {"A": "80", "B": null, "C": {"sealed": "-----BEGIN AGE ENCRYPTED FILE-----\nx"}}}"#;
        let merged: Merged = serde_json::from_str(text).unwrap();
        assert_eq!(merged.was["A"], Some(Was::Plain("80".into())));
        assert_eq!(merged.was["B"], None);
        assert_eq!(
            merged.was["C"],
            Some(Was::Sealed { sealed: "-----BEGIN AGE ENCRYPTED FILE-----\nx".into() })
        );
        let again: serde_json::Value = serde_json::to_value(&merged).unwrap();
        assert_eq!(again, serde_json::from_str::<serde_json::Value>(text).unwrap(), "written as read");
    }

    #[test]
    fn a_newer_store_is_told_newer_whether_its_records_read_here_or_not_and_garbage_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let open = |text: &str| {
            std::fs::write(&path, text).unwrap();
            Store::read_only(&path).err().expect("refused")
        };
        // Records this build reads, under a newer schema.
        let readable = WRITTEN_BEFORE.replacen("\"schema\": 1", "\"schema\": 9", 1);
        assert_ne!(readable, WRITTEN_BEFORE, "the fixture names its schema");
        assert!(matches!(open(&readable), Error::Newer { found: 9, .. }));
        // Records it does not, under a newer schema, the schema last.
        let unreadable = r#"{"records": {"a.b": {"shape": "of the future"}}, "schema": 9}"#;
        assert!(matches!(open(unreadable), Error::Newer { found: 9, .. }));
        // The same records under this schema, and no schema at all: corrupt.
        let corrupt = r#"{"records": {"a.b": {"shape": "of the future"}}, "schema": 1}"#;
        assert!(matches!(open(corrupt), Error::Corrupt { .. }));
        let err = open(r#"{"records": {}}"#);
        assert!(matches!(&err, Error::Corrupt { reason, .. } if reason.contains("schema")), "{err}");
    }

    #[test]
    fn a_record_whose_digest_is_not_one_refuses_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        std::fs::write(&path, WRITTEN_BEFORE.replace("sha256:fcde2b", "sha256:zzzz2b")).unwrap();
        let err = Store::open(&path).err().expect("refused");
        assert!(matches!(err, Error::Corrupt { .. }), "{err}");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            WRITTEN_BEFORE.replace("sha256:fcde2b", "sha256:zzzz2b")
        );
    }

    #[test]
    fn compacting_keeps_every_record_and_the_latest_of_each() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = store_at(&dir, WRITTEN_BEFORE);
        let record = |n: u32| Record {
            origin: Origin::Declared,
            kind: Kind::File,
            target: format!("/srv/{n}").into(),
            position: n,
            declared: Digest::of(&n.to_le_bytes()),
            applied_at: 0,
            wrote: Some(Digest::of(b"x")),
            mode: Some(mode_bits(0o644)),
            owner: None,
            sig: None,
            more: None,
        };
        // Out of order, as a declaration's ids are, and one written twice.
        for n in (0..3000).rev().chain([7]) {
            store.record(&format!("m.f{n:05}"), record(n));
        }
        store.save().unwrap();
        assert_eq!(store.grown, 0, "saving after many new ids compacts");
        let reread = Store::read_only(&dir.path().join("state.json")).unwrap();
        assert_eq!(reread.records().count(), 3002);
        for n in [0u32, 7, 1500, 2999] {
            let got = reread.get(&format!("m.f{n:05}")).unwrap();
            assert_eq!(*got.target, format!("/srv/{n}"));
            assert_eq!(got.declared, Digest::of(&n.to_le_bytes()));
        }
        assert!(reread.get("web.app").is_some() && reread.get("m.f03000").is_none());
    }

    #[test]
    fn a_signature_alone_is_written_with_the_next_whole_save_not_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let mut store = store_at(&dir, WRITTEN_BEFORE);
        let mut conf = store.get("web.conf").unwrap().clone();
        conf.sig = Some((42, 1_764_480_000, 0, 8).into());
        store.record("web.conf", conf.clone());
        assert_eq!(store.get("web.conf").unwrap().sig, conf.sig, "held at once");
        assert_eq!(store.get("web.conf").unwrap().applied_at, 1764480000, "not a change of what it says");
        store.save_changes().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), WRITTEN_BEFORE, "not written for a signature");
        store.save().unwrap();
        let written = Store::read_only(&path).unwrap();
        assert_eq!(written.get("web.conf").unwrap().sig, conf.sig, "written with the whole save");

        // A change of what a record says is written at once.
        conf.mode = Some(mode_bits(0o600));
        store.record("web.conf", conf);
        store.save_changes().unwrap();
        assert_eq!(Store::read_only(&path).unwrap().get("web.conf").unwrap().mode, Some(mode_bits(0o600)));
    }

    /// A store whose records are `(id, type, target, applied-at)`.
    fn store_of(dir: &tempfile::TempDir, records: &[(&str, &str, &str, u64)]) -> Writer {
        let records: serde_json::Map<String, serde_json::Value> = records
            .iter()
            .enumerate()
            .map(|(position, (id, kind, target, at))| {
                let record = serde_json::json!({
                    "origin": "declared", "type": kind, "target": target, "position": position,
                    "declared": Digest::of(id.as_bytes()).to_string(), "applied-at": at,
                });
                ((*id).to_owned(), record)
            })
            .collect();
        store_at(dir, &serde_json::json!({"schema": 1, "records": records}).to_string())
    }

    /// The record found by target is the one applied last, under whatever id, whatever the
    /// order of the ids; records of another type or target are not in the running, however
    /// recent. Two applied in the same second (the resolution of `applied-at`) go to the id
    /// last in order, the store's map being sorted: the same on every read, never random.
    #[test]
    fn the_record_by_target_is_the_most_recently_applied() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_of(
            &dir,
            &[
                ("a.first", "file", "/srv/app.env", 1_764_480_100),
                ("m.latest", "file", "/srv/app.env", 1_764_480_300),
                ("z.between", "file", "/srv/app.env", 1_764_480_200),
                ("b.other-path", "file", "/srv/other.env", 1_764_480_900),
                ("c.directory", "directory", "/srv/app.env", 1_764_480_900),
            ],
        );
        let found = |kind, target| store.latest_at(kind, target).map(|(id, _)| id.to_owned());
        assert_eq!(found(Kind::File, "/srv/app.env").as_deref(), Some("m.latest"));
        assert_eq!(found(Kind::Directory, "/srv/app.env").as_deref(), Some("c.directory"));
        assert_eq!(found(Kind::File, "/srv/none.env"), None);
        assert_eq!(found(Kind::Container, "/srv/app.env"), None);

        let dir = tempfile::tempdir().unwrap();
        let tied = store_of(
            &dir,
            &[
                ("m.one", "file", "/srv/app.env", 1_764_480_300),
                ("c.two", "file", "/srv/app.env", 1_764_480_300),
            ],
        );
        assert_eq!(tied.latest_at(Kind::File, "/srv/app.env").map(|(id, _)| id), Some("m.one"));
    }
}
