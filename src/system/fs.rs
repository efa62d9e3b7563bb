//! The filesystem, touched without ever following a symlink.
//!
//! Every path is reached by opening its parent directory with `openat2(RESOLVE_NO_SYMLINKS)`
//! and then working relative to that descriptor with `O_NOFOLLOW`. The agent is root: a symlink
//! planted by anyone who can write to a managed directory would otherwise turn "write the web
//! server's config" into "overwrite /etc/shadow". Resolving through a descriptor also closes the
//! window between checking a path and writing it.
//!
//! Writes are staged and committed in batches: every temporary file is written, the data is made
//! durable once per filesystem (`syncfs`) instead of once per file, the renames are done, and
//! each directory touched is synced. Each file is still replaced atomically and durably; 10,000
//! files cost one data sync and a thousand directory syncs rather than ten thousand fsyncs.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use sha2::Digest as _;

use super::durable;

/// What a regular file holds, as `Fs::read_up_to` found it.
#[derive(Debug)]
pub enum Content {
    /// Not a regular file: nothing was read.
    NotFile,
    /// Its bytes, at most the limit asked for.
    Bytes(Vec<u8>),
    /// Larger than the limit: its SHA-256 and size, read as a stream and never held.
    Large {
        /// The SHA-256 of its bytes.
        sum: [u8; 32],
        /// Its size in bytes.
        size: u64,
    },
}

impl Content {
    /// The SHA-256 of the bytes, `None` for what is not a regular file.
    pub fn sum(&self) -> Option<[u8; 32]> {
        match self {
            Content::NotFile => None,
            Content::Bytes(b) => Some(sha2::Sha256::digest(b).into()),
            Content::Large { sum, .. } => Some(*sum),
        }
    }

    /// How many bytes the file holds (0 for what is not a regular file).
    pub fn size(&self) -> u64 {
        match self {
            Content::NotFile => 0,
            Content::Bytes(b) => b.len() as u64,
            Content::Large { size, .. } => *size,
        }
    }
}

/// Feeds everything left in `reader` to `hasher`, 64 KiB at a time. Returns how many bytes.
pub fn hash_stream(reader: &mut dyn io::Read, hasher: &mut sha2::Sha256) -> io::Result<u64> {
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0;
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => {
                hasher.update(&buf[..n]);
                total += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// What is at a path, as read without following a symlink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symlink, never followed.
    Symlink,
    /// Anything else: a FIFO, a socket, a device.
    Other,
}

/// Metadata of one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    /// What is at the path.
    pub kind: Kind,
    /// Permission bits, `0o7777` at most.
    pub mode: u32,
    /// The owning user's id.
    pub uid: u32,
    /// The owning group's id.
    pub gid: u32,
    /// The device of the filesystem it is on.
    pub dev: u64,
    /// How many names the file has. A file with more than one is never changed in place: a
    /// chmod or chown would reach every other name too, outside the declared path.
    pub links: u64,
    /// What changes whenever anything about the file does: inode, change time (which only the
    /// kernel sets, to now, on any write, chmod, chown or rename), size. Equal signatures
    /// mean the file was not touched in between.
    pub sig: Sig,
}

/// A file's change signature: what moves whenever anything about the file does. The store
/// keeps it as the array `[inode, ctime seconds, ctime nanoseconds, size]`.
///
/// Aligned to 4 rather than 8, and its nanoseconds never zero inside (`Nanos`): 28 bytes, and
/// `Option<Sig>` in every record of a file 28 rather than 40 (docs/memory.md). Its fields are
/// read by value, never borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(from = "(u64, i64, u32, u64)", into = "(u64, i64, u32, u64)")]
#[repr(C, packed(4))]
pub struct Sig {
    /// The inode number: a rename over the file gives it another.
    pub inode: u64,
    /// The change time, which only the kernel sets: seconds and nanoseconds.
    pub ctime: i64,
    /// The nanoseconds of the change time.
    pub ctime_nsec: Nanos,
    /// The size in bytes.
    pub size: u64,
}

impl From<(u64, i64, u32, u64)> for Sig {
    fn from((inode, ctime, ctime_nsec, size): (u64, i64, u32, u64)) -> Sig {
        Sig { inode, ctime, ctime_nsec: Nanos::new(ctime_nsec), size }
    }
}

impl From<Sig> for (u64, i64, u32, u64) {
    fn from(s: Sig) -> Self {
        (s.inode, s.ctime, s.ctime_nsec.get(), s.size)
    }
}

/// The nanoseconds of a change time (below 10^9), held as one more than they are so that the
/// value is never zero: `Option<Sig>` keeps its `None` there instead of in 4 more bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Nanos(std::num::NonZeroU32);

impl Nanos {
    /// These nanoseconds.
    pub const fn new(nanos: u32) -> Nanos {
        Nanos(std::num::NonZeroU32::MIN.saturating_add(nanos))
    }

    /// The nanoseconds.
    pub const fn get(self) -> u32 {
        self.0.get() - 1
    }
}

impl std::fmt::Debug for Nanos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.get())
    }
}

impl Meta {
    /// The signature, if it can be trusted to change on the next change. The kernel stamps
    /// ctime from a coarse clock (a few milliseconds), so a second write within the same tick
    /// keeps the same ctime: a signature is only trusted once its ctime is older than that
    /// (git's "racily clean" problem). `None` means: compare the content next time.
    pub fn trusted_sig(&self) -> Option<Sig> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?;
        let ctime = std::time::Duration::new(u64::try_from(self.sig.ctime).ok()?, self.sig.ctime_nsec.get());
        (now.checked_sub(ctime)? > std::time::Duration::from_millis(50)).then_some(self.sig)
    }
}

/// A failure, always naming the path.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A component of the path is a symlink; nothing was done through it.
    #[error("{path} is reached through a symlink at {link}; mesh-host never writes through a symlink: declare the real path")]
    Symlink {
        /// The path asked for.
        path: PathBuf,
        /// The symlink met on the way.
        link: PathBuf,
    },
    /// A component of the path is not a directory.
    #[error("{path} is reached through {parent}, which is not a directory")]
    NotDirectory {
        /// The path asked for.
        path: PathBuf,
        /// The component that is not a directory.
        parent: PathBuf,
    },
    /// The path's parent directory does not exist; the host makes only what is declared.
    #[error("{path} is missing its parent directory")]
    NoParent {
        /// The path asked for.
        path: PathBuf,
    },
    /// A system call failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// What the host was doing, as words that follow "cannot" ("chmod", "look at").
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    fn io(op: &'static str, path: &Path, errno: Errno) -> Error {
        Error::Io { op, path: path.to_owned(), source: io::Error::from_raw_os_error(errno.raw_os_error()) }
    }
}

/// What a filesystem call returns.
pub type Result<T> = std::result::Result<T, Error>;

// The stat fields' types differ between architectures; the casts are not all no-ops everywhere.
#[allow(clippy::unnecessary_cast)]
fn meta_of(st: &rfs::Stat) -> Meta {
    let fmt = st.st_mode & libc_s_ifmt();
    let kind = if fmt == 0o100000 {
        Kind::File
    } else if fmt == 0o040000 {
        Kind::Directory
    } else if fmt == 0o120000 {
        Kind::Symlink
    } else {
        Kind::Other
    };
    Meta {
        kind,
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        dev: st.st_dev,
        links: st.st_nlink as u64,
        sig: Sig {
            inode: st.st_ino,
            ctime: st.st_ctime as i64,
            ctime_nsec: Nanos::new(st.st_ctime_nsec as u32),
            size: st.st_size as u64,
        },
    }
}

const fn libc_s_ifmt() -> u32 {
    0o170000
}

fn split(path: &Path) -> (&Path, &OsStr) {
    let parent = path.parent().unwrap_or(Path::new("/"));
    let name = path.file_name().unwrap_or(OsStr::new("."));
    (parent, name)
}

/// A file written to a temporary name beside its target, waiting for `commit`.
///
/// Dropped without being committed (a later failure in the pass, a panic), it removes its
/// temporary file: nothing the host half-made is left beside a target.
pub struct Staged {
    dir: PathBuf,
    tmp: PathBuf,
    name: std::ffi::OsString,
    fd: OwnedFd,
    /// The filesystem it is on (its directory's).
    dev: u64,
    /// Whether a syncfs of that filesystem reaches its storage (not FUSE).
    trusted: bool,
    /// Committed, or its temporary file already removed.
    done: bool,
}

/// What the first step of a commit (`Fs::sync_data`) leaves for the rest: a result per staged
/// file, so far; the filesystem of each; how the syncfs of each filesystem went, for the
/// journal to know whether it was covered; and whether a batch of one is to be synced after its
/// rename instead of before it.
struct DataSynced {
    results: Vec<Result<()>>,
    devs: Vec<u64>,
    synced_devs: HashMap<u64, std::result::Result<(), Errno>>,
    synced_after: bool,
}

/// A single file renamed before its data was synced (see `Fs::sync_data`), synced now.
fn sync_after_rename(staged: &[Staged], results: &mut [Result<()>]) {
    for (s, result) in staged.iter().zip(results.iter_mut()).filter(|(_, r)| r.is_ok()) {
        // In place, but not known to survive a crash until this returns: a failed sync
        // fails the file, so nothing reports or records it as done.
        let synced = if failpoint_named("sync-eio") { Err(Errno::IO) } else { durable::fsync(&s.fd) };
        if let Err(e) = synced {
            *result =
                Err(Error::io("make the file durable (fsync after its rename)", &s.dir.join(&s.name), e));
        }
    }
}

/// What marks the host's own temporary files: `.NAME` + this + `PID-N`.
pub const TMP_MARK: &str = ".mesh-host-";

impl Drop for Staged {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC;
        if let Ok(dir) = rfs::openat2(rfs::CWD, &self.dir, flags, Mode::empty(), ResolveFlags::NO_SYMLINKS) {
            if let Some(name) = self.tmp.file_name() {
                let _ = rfs::unlinkat(&dir, name, AtFlags::empty());
            }
        }
    }
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes straight to a borrowed descriptor, for `Fs::stage_writing`.
struct Writer<'a>(std::os::fd::BorrowedFd<'a>);

impl io::Write for Writer<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(rustix::io::write(self.0, buf)?)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// This process's id, asked of the kernel once.
fn pid() -> u32 {
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *PID.get_or_init(std::process::id)
}

/// One session of filesystem work: it caches directory descriptors, so a batch of files in the
/// same directories resolves each directory once. A session lives for one apply or reconcile,
/// never longer, so a directory replaced on the machine is seen at the next one.
#[derive(Default)]
pub struct Fs {
    /// Each directory held open, with what is known of its filesystem.
    dirs: HashMap<PathBuf, HeldDir>,
    /// Where the directories of temporary files and the intent of each batch are noted, for a
    /// pass that writes (see `system::journal`).
    journal: Option<super::journal::Journal>,
    /// Directories this session made whose entries are not durable yet, with the filesystem
    /// each is on: the next batch's commit, or `make_durable`, syncs them (see `make_dirs`).
    unsynced: Vec<(u64, PathBuf)>,
    /// The directories themselves that this session made and no sync has covered yet, with
    /// their filesystems: a mode or owner set on one is made durable with the directory (by
    /// the next batch's syncfs, or by `make_durable`), not by an fsync of its own each time.
    fresh: HashMap<PathBuf, u64>,
    /// Set when the last pass did not finish (`after_a_crash`): the directories already cleared
    /// of the temporary files it left, and how many were removed.
    sweep: Option<(HashSet<PathBuf>, usize)>,
    /// After a crash: the filesystems already synced for what the unfinished pass left on
    /// them, with how the sync ended (see `found_in_flight`).
    settled: HashMap<u64, std::result::Result<(), Errno>>,
    /// Per filesystem, whether its syncfs reaches storage (`syncfs_reaches_storage`): asked once
    /// each, when a first directory on it is opened, not for every file of a batch.
    trust: HashMap<u64, bool>,
    /// Files staged since the last `durable::start_writeback` (see `WRITEBACK_EVERY`).
    unhinted: usize,
}

/// A directory `Fs` holds open, and the filesystem it is on: found once when it is opened, so
/// that a file staged in it needs no fstat or fstatfs of its own.
struct HeldDir {
    fd: OwnedFd,
    dev: u64,
    /// Whether a syncfs of `dev` reaches its storage (not FUSE).
    trusted: bool,
}

/// How many directory descriptors a session keeps. Resources in one directory are usually
/// declared together, so a small cache gets most of the benefit without nearing the default
/// limit of 1,024 open files.
const DIR_CACHE: usize = 256;

/// How many files staged on a filesystem between two hints to start writing its data back
/// (`durable::start_writeback`), so that the disk writes a batch while the rest of it is made
/// rather than all of it in the commit's syncfs. A cold apply of 100,000 files of 1 KiB on ext4
/// went from 7.6 to 8.3 s to 6.6 to 6.8 s with a hint every 128 (every 64 or 32: no faster);
/// 10,000 from 0.82 to 0.72 s (BENCHMARKS.md, "The cold apply's writeback").
const WRITEBACK_EVERY: usize = 128;

/// Past how many directories to make durable one syncfs of their filesystem is cheaper than an
/// fsync of each (every fsync of a directory is a journal commit on ext4).
const DIRS_BEFORE_SYNCFS: usize = 8;

impl Fs {
    /// A new session, with no directory held open yet.
    pub fn new() -> Fs {
        Fs::default()
    }

    /// A session whose staged writes are noted in the journal at `journal`.
    pub fn journaled(journal: PathBuf) -> Fs {
        Fs { journal: Some(super::journal::Journal::new(journal)), ..Fs::default() }
    }

    /// A session for the first pass after one that did not finish: each directory it stages in
    /// is first cleared of the temporary files another process of the host left there, and
    /// `sweep` clears the others the pass names. The journal names the directories a crashed
    /// pass staged in, but its lines are appended without a sync, while a file's fsync or the
    /// filesystem's own periodic commit can make a temporary file's entry durable: after a
    /// power cut, the temporaries can outlive the lines that name their directories.
    pub fn after_a_crash(mut self) -> Fs {
        self.sweep = Some((HashSet::new(), 0));
        self
    }

    /// Clears `dir` of the host's temporary files that another process left, once per session
    /// and only after a crash (`after_a_crash`); otherwise does nothing. A directory that is
    /// not there has nothing to clear.
    pub fn sweep(&mut self, dir: &Path) -> Result<()> {
        let Some((swept, total)) = &mut self.sweep else { return Ok(()) };
        if swept.insert(dir.to_owned()) {
            *total += remove_temporaries(dir)?;
        }
        Ok(())
    }

    /// How many directories were cleared after a crash, and how many temporary files removed.
    pub fn swept(&self) -> Option<(usize, usize)> {
        self.sweep.as_ref().map(|(dirs, removed)| (dirs.len(), *removed))
    }

    /// Whether this session wrote to its journal.
    pub fn journal_written(&self) -> bool {
        self.journal.as_ref().is_some_and(|j| j.written())
    }

    /// Notes in the journal, durably, what a batch is about to leave. Call before `commit`.
    pub fn intend(&mut self, intents: Vec<super::journal::Intent>) -> Result<()> {
        match &mut self.journal {
            Some(j) => j.intend(intents).map_err(Error::from),
            None => Ok(()),
        }
    }

    /// Opens a directory without following any symlink on the way. `Ok(None)` when it (or an
    /// ancestor) does not exist.
    fn open_dir(&mut self, dir: &Path) -> Result<Option<&OwnedFd>> {
        Ok(self.held_dir(dir)?.map(|held| &held.fd))
    }

    /// `open_dir`, with the filesystem the directory is on and whether its syncfs is trusted.
    fn held_dir(&mut self, dir: &Path) -> Result<Option<&HeldDir>> {
        if !self.dirs.contains_key(dir) {
            let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC;
            let fd = match rfs::openat2(rfs::CWD, dir, flags, Mode::empty(), ResolveFlags::NO_SYMLINKS) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => return Ok(None),
                Err(Errno::LOOP) => return Err(self.explain_symlink(dir)),
                Err(Errno::NOTDIR) => return Err(self.explain_notdir(dir)),
                Err(e) => return Err(Error::io("open the directory", dir, e)),
            };
            if self.dirs.len() >= DIR_CACHE {
                self.dirs.clear();
            }
            let dev = rfs::fstat(&fd).map(|st| st.st_dev).unwrap_or(0);
            let trusted = *self.trust.entry(dev).or_insert_with(|| syncfs_reaches_storage(&fd));
            self.dirs.insert(dir.to_owned(), HeldDir { fd, dev, trusted });
        }
        Ok(self.dirs.get(dir))
    }

    /// Names the first symlink on the way to `path`, for an error a person can act on.
    fn explain_symlink(&self, path: &Path) -> Error {
        match first_ancestor(path, |kind| kind == Kind::Symlink) {
            Some(link) => Error::Symlink { path: path.to_owned(), link },
            None => Error::io("open", path, Errno::LOOP),
        }
    }

    fn explain_notdir(&self, path: &Path) -> Error {
        match first_ancestor(path, |kind| kind != Kind::Directory) {
            Some(parent) => Error::NotDirectory { path: path.to_owned(), parent },
            None => Error::io("open", path, Errno::NOTDIR),
        }
    }

    /// Makes a directory and any missing ancestors, each with `mode` (ancestors 0755), root-owned.
    /// Returns whether `dir` itself was made.
    pub fn make_dirs(&mut self, dir: &Path, mode: u32) -> Result<bool> {
        if self.open_dir(dir)?.is_some() {
            return Ok(false);
        }
        let mut missing = Vec::new();
        let mut cur = dir;
        loop {
            let (parent, name) = split(cur);
            missing.push(name.to_owned());
            if parent == cur {
                return Err(Error::NoParent { path: dir.to_owned() });
            }
            if self.open_dir(parent)?.is_some() {
                cur = parent;
                break;
            }
            cur = parent;
        }
        let mut at = cur.to_owned();
        for (i, name) in missing.iter().rev().enumerate() {
            let fd = self.open_dir(&at)?.ok_or_else(|| Error::NoParent { path: dir.to_owned() })?;
            let last = i + 1 == missing.len();
            let want = if last { mode } else { 0o755 };
            match rfs::mkdirat(fd, name.as_os_str(), Mode::from_raw_mode(want)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(Error::io("make the directory", &at.join(name), e)),
            }
            // The new entry is made durable later, with everything else this session does on
            // that filesystem: by the next batch's syncfs, or by `make_durable` at the end of
            // the pass, either way before the store records it. Until then a crash loses the
            // directory and whatever was put in it, which leaves every path as it was before.
            let dev = rfs::fstat(fd).map(|st| st.st_dev).unwrap_or(0);
            if self.unsynced.last().is_none_or(|(_, p)| p != &at) {
                self.unsynced.push((dev, at.clone()));
            }
            at.push(name);
            self.fresh.insert(at.clone(), dev);
            // mkdir is subject to the umask; the declared mode is set explicitly.
            self.set_mode(&at, want)?;
        }
        Ok(true)
    }

    /// Metadata of a path, without following a symlink at it. `Ok(None)` when absent.
    pub fn meta(&mut self, path: &Path) -> Result<Option<Meta>> {
        let (parent, name) = split(path);
        let Some(dir) = self.open_dir(parent)? else {
            return Ok(None);
        };
        match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(meta_of(&st))),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(Error::io("look at", path, e)),
        }
    }

    /// Opens what is at `path` itself (never a symlink's target) for reading or fchmod/fchown.
    fn open_at(&mut self, path: &Path, dir: bool) -> Result<Option<OwnedFd>> {
        let (parent, name) = split(path);
        let Some(pfd) = self.open_dir(parent)? else {
            return Ok(None);
        };
        let mut flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        if dir {
            flags |= OFlags::DIRECTORY;
        }
        match rfs::openat(pfd, name, flags, Mode::empty()) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::NOENT) => Ok(None),
            Err(Errno::LOOP) => Err(Error::Symlink { path: path.to_owned(), link: path.to_owned() }),
            Err(e) => Err(Error::io("open", path, e)),
        }
    }

    /// Reads a regular file whose size is at most `max` bytes; a larger one (or one that grows
    /// past `max` while it is read) is hashed as a stream instead, so what sits at a managed path
    /// never sizes an allocation. `Ok(None)` when absent.
    pub fn read_up_to(&mut self, path: &Path, max: u64) -> Result<Option<(Meta, Content)>> {
        let Some(fd) = self.open_at(path, false)? else {
            return Ok(None);
        };
        let st = rfs::fstat(&fd).map_err(|e| Error::io("look at", path, e))?;
        let meta = meta_of(&st);
        if meta.kind != Kind::File {
            return Ok(Some((meta, Content::NotFile)));
        }
        let mut file = std::fs::File::from(fd);
        let io = |e: io::Error| Error::Io { op: "read", path: path.to_owned(), source: e };
        let mut bytes = Vec::new();
        if meta.sig.size <= max {
            use std::io::Read as _;
            // One byte more than the limit proves the end, or shows the file grew past it.
            let cap = usize::try_from(meta.sig.size).unwrap_or(0).saturating_add(1);
            bytes.reserve_exact(cap);
            (&mut file).take(max.saturating_add(1)).read_to_end(&mut bytes).map_err(io)?;
            if bytes.len() as u64 <= max {
                return Ok(Some((meta, Content::Bytes(bytes))));
            }
        }
        let mut hasher = sha2::Sha256::new();
        hasher.update(&bytes);
        let mut size = bytes.len() as u64;
        drop(bytes);
        size += hash_stream(&mut file, &mut hasher).map_err(io)?;
        Ok(Some((meta, Content::Large { sum: hasher.finalize().into(), size })))
    }

    /// The SHA-256 of a regular file's bytes, read as a stream. `Ok(None)` when absent; a sum of
    /// `None` when what is there is not a regular file.
    pub fn digest(&mut self, path: &Path) -> Result<Option<(Meta, Option<[u8; 32]>)>> {
        Ok(self.read_up_to(path, 0)?.map(|(meta, content)| (meta, content.sum())))
    }

    /// Makes durable a file found after a crash holding what the unfinished pass was writing
    /// (the journal names it), before the store records it as the host's. That pass may have
    /// died between its renames and their sync: the file is in place, but its new name is
    /// not known to survive a power cut, and recording it unsynced would leave the store
    /// ahead of the disk if one came. ext4 and XFS commit a rename before any later fsync's
    /// transaction, so the store's own sync happened to cover it there; btrfs logs an fsync
    /// per inode and does not (the VM power-loss lane; docs/durability.md, "Crashes"). One
    /// syncfs per filesystem covers every such file at once, since all of them were left
    /// before this process started; where a syncfs reaches nothing (FUSE), the file and its
    /// directory are synced each.
    pub fn found_in_flight(&mut self, path: &Path) -> Result<()> {
        let (parent, _) = split(path);
        let Some(fd) = self.open_at(path, false)? else {
            return Err(Error::io("make durable what the unfinished pass left", path, Errno::NOENT));
        };
        if syncfs_reaches_storage(&fd) {
            let dev = rfs::fstat(&fd).map_err(|e| Error::io("look at", path, e))?.st_dev;
            let synced = *self.settled.entry(dev).or_insert_with(|| durable::syncfs(&fd));
            return synced
                .map_err(|e| Error::io("make durable what the unfinished pass left (syncfs)", path, e));
        }
        durable::fsync(&fd)
            .map_err(|e| Error::io("make durable what the unfinished pass left (fsync)", path, e))?;
        let synced = match self.open_dir(parent)? {
            Some(dir) => durable::fsync(dir),
            None => Err(Errno::NOENT),
        };
        synced.map_err(|e| {
            Error::io("make durable what the unfinished pass left (fsync of its directory)", path, e)
        })
    }

    /// Sets the permission bits of what is at `path` (file or directory, never through a link).
    pub fn set_mode(&mut self, path: &Path, mode: u32) -> Result<()> {
        let fd = self.open_at(path, false)?.ok_or_else(|| Error::io("chmod", path, Errno::NOENT))?;
        rfs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| Error::io("chmod", path, e))?;
        // Durable before it is reported or recorded: a change in place is in no batch, and no
        // syncfs follows it; without this a power cut can undo a mode the store records (the
        // FUSE power-loss lane, `a_change_in_place_is_durable_before_it_is_recorded`). A
        // directory this session made is made durable whole, mode and owner with it, before
        // anything in it is recorded (`make_durable`): an fsync of each cost a cold apply of
        // 10,000 files 2,000 fsyncs, a second of its 1.8.
        if self.is_fresh(path) {
            return Ok(());
        }
        durable::fsync(&fd).map_err(|e| Error::io("make the mode durable (fsync)", path, e))
    }

    /// Sets the owner of what is at `path`, never through a link. The mode is set again after,
    /// because the kernel clears set-id bits on chown.
    pub fn set_owner(&mut self, path: &Path, uid: u32, gid: u32) -> Result<()> {
        let fd = self.open_at(path, false)?.ok_or_else(|| Error::io("chown", path, Errno::NOENT))?;
        let mode = rfs::fstat(&fd).map_err(|e| Error::io("chown", path, e))?.st_mode & 0o7777;
        rfs::fchown(&fd, Some(rfs::Uid::from_raw(uid)), Some(rfs::Gid::from_raw(gid)))
            .map_err(|e| Error::io("chown", path, e))?;
        rfs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| Error::io("chmod", path, e))?;
        // Durable before it is recorded, as a mode is (`set_mode`).
        if self.is_fresh(path) {
            return Ok(());
        }
        durable::fsync(&fd).map_err(|e| Error::io("make the owner durable (fsync)", path, e))
    }

    /// Whether `path` is a directory this session made that no sync has covered yet.
    fn is_fresh(&self, path: &Path) -> bool {
        self.fresh.contains_key(path)
    }

    /// Writes `content` to a temporary file beside `path`, with its final mode and owner, not yet
    /// visible at `path`. Parents are made (0755) when missing.
    pub fn stage(
        &mut self,
        path: &Path,
        content: &[u8],
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<Staged> {
        self.stage_from(path, &mut &*content, mode, owner)
    }

    /// `stage`, with the content streamed from `reader`: an archive's entry, a copy of a file
    /// too large to hold. A failure part-way (a full disk, a reader's error) removes the
    /// temporary file before it returns.
    pub fn stage_from(
        &mut self,
        path: &Path,
        reader: &mut dyn io::Read,
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<Staged> {
        self.stage_writing(path, &mut |file| io::copy(reader, file).map(drop), mode, owner)
    }

    /// `stage`, with the content written by `write` into the temporary file as it is made: the
    /// state store serialised straight into it, never held whole in memory first (56 MB at
    /// 100,000 records). A failure part-way removes the temporary file before it returns.
    pub fn stage_writing(
        &mut self,
        path: &Path,
        write: &mut dyn FnMut(&mut dyn io::Write) -> io::Result<()>,
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<Staged> {
        let (parent, name) = split(path);
        self.make_dirs(parent, 0o755)?;
        self.sweep(parent)?;
        if let Some(journal) = &mut self.journal {
            journal.note_dir(parent)?;
        }
        // The temporary file is made in `parent`, so it is on its filesystem: the directory's,
        // as found when it was opened, not an fstat and an fstatfs of each file.
        let held = self.held_dir(parent)?.ok_or_else(|| Error::NoParent { path: path.to_owned() })?;
        let (dir, dev, trusted) = (&held.fd, held.dev, held.trusted);
        let (tmp_name, fd) = loop {
            let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let mut tmp = std::ffi::OsString::from(".");
            tmp.push(name);
            tmp.push(format!("{TMP_MARK}{}-{n}", pid()));
            let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            match rfs::openat(dir, &tmp, flags, Mode::from_raw_mode(0o600)) {
                Ok(fd) => break (tmp, fd),
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(Error::io("write", path, e)),
            }
        };
        // From here the temporary file is removed again if anything fails, when `staged` drops.
        let staged = Staged {
            dir: parent.to_owned(),
            tmp: parent.join(&tmp_name),
            name: name.to_owned(),
            fd,
            dev,
            trusted,
            done: false,
        };
        // Written through the staged descriptor itself: no duplicate to make and close.
        write(&mut Writer(staged.fd.as_fd())).map_err(|e| Error::Io {
            op: "write",
            path: path.to_owned(),
            source: e,
        })?;
        if let Some((uid, gid)) = owner {
            rfs::fchown(&staged.fd, Some(rfs::Uid::from_raw(uid)), Some(rfs::Gid::from_raw(gid)))
                .map_err(|e| Error::io("chown", path, e))?;
        }
        rfs::fchmod(&staged.fd, Mode::from_raw_mode(mode)).map_err(|e| Error::io("chmod", path, e))?;
        if trusted {
            self.unhinted += 1;
            if self.unhinted >= WRITEBACK_EVERY {
                self.unhinted = 0;
                if let Ok(Some(dir)) = self.open_dir(parent) {
                    durable::start_writeback(dir, dev);
                }
            }
        }
        Ok(staged)
    }

    /// Stages a copy of the regular file at `from` (reached without following a symlink) to
    /// `to`, streamed: for keeping the original of a file before the host first writes over it,
    /// however large it is.
    pub fn stage_copy(&mut self, from: &Path, to: &Path, mode: u32) -> Result<Staged> {
        let fd = self.open_at(from, false)?.ok_or_else(|| Error::io("copy", from, Errno::NOENT))?;
        let st = rfs::fstat(&fd).map_err(|e| Error::io("copy", from, e))?;
        if meta_of(&st).kind != Kind::File {
            return Err(Error::io("copy", from, Errno::INVAL));
        }
        self.stage_from(to, &mut std::fs::File::from(fd), mode, None)
    }

    /// Makes staged files durable and puts each in place. Returns one result per staged file, in
    /// order: a failure of one (a rename refused) does not stop the others.
    ///
    /// Durability order: data first (fsync for one file, syncfs once per filesystem for more),
    /// then the renames, then an fsync of each directory, so after a crash each path holds either
    /// its old content or its complete new content, never a torn one.
    pub fn commit(&mut self, staged: Vec<Staged>) -> Vec<Result<()>> {
        self.commit_batch(staged, true)
    }

    /// `commit` for copies the host keeps (originals, before it writes over them), not managed
    /// files: the same durability, without the batch failpoints.
    pub fn commit_copies(&mut self, staged: Vec<Staged>) -> Vec<Result<()>> {
        self.commit_batch(staged, false)
    }

    /// `commit`, with the batch failpoints (`batch-staged`, `batch-renamed`) only where asked:
    /// the store's own write is not a batch of managed files.
    fn commit_batch(&mut self, mut staged: Vec<Staged>, failpoints: bool) -> Vec<Result<()>> {
        if failpoints {
            failpoint("batch-staged");
        }
        let DataSynced { mut results, devs, synced_devs, synced_after } = self.sync_data(&staged);
        // The batch's intents must be durable before any rename. The syncfs above covered them
        // if the journal is on a filesystem it synced; otherwise the journal is synced itself.
        // Not for a batch of one, which is not synced there (see `Journal::intend`).
        if staged.len() > 1 {
            self.journal_before_renames(&staged, &mut results, &synced_devs);
        }
        let dirs = self.rename_into_place(&mut staged, &mut results);
        if failpoints {
            failpoint("batch-renamed");
        }
        if synced_after {
            sync_after_rename(&staged, &mut results);
        }
        if staged.len() > 1 {
            self.sync_renames(&staged, &mut results, &devs);
        } else {
            // A batch of one: its own directory is cheaper to sync than the filesystem.
            self.sync_dirs(dirs, &staged, &mut results);
        }
        self.fail_in_undurable_dirs(&staged, &mut results);
        results
    }

    /// The first step of a commit: each staged file's data made durable before anything is
    /// renamed (an fsync for a batch of one, one syncfs per filesystem for more), so that no
    /// rename can put a torn file in place. A file whose sync failed is failed, not renamed.
    fn sync_data(&mut self, staged: &[Staged]) -> DataSynced {
        let mut results: Vec<Result<()>> = Vec::with_capacity(staged.len());
        let mut synced_devs: HashMap<u64, std::result::Result<(), Errno>> = HashMap::new();
        let mut devs: Vec<u64> = Vec::with_capacity(staged.len());
        // A single file put over an existing one on a filesystem that orders a replacing
        // rename after the new file's data (ext4, data=ordered, auto_da_alloc) is renamed first
        // and synced after: the correction is in place without waiting on the disk, and a crash
        // in between still leaves the old content or the new, whole ("Durability at scale").
        let mut synced_after = false;
        for s in staged {
            let dev = s.dev;
            devs.push(dev);
            let r = if staged.len() == 1 {
                synced_after = self.replaces_in_order(dev, &s.dir, &s.name);
                if synced_after {
                    Ok(())
                } else {
                    durable::fsync(&s.fd)
                }
            } else if !s.trusted {
                // FUSE: a syncfs never reaches the server, so each file is synced itself.
                durable::fsync(&s.fd)
            } else {
                *synced_devs.entry(dev).or_insert_with(|| durable::syncfs(&s.fd))
            };
            results.push(r.map_err(|e| Error::io("sync", &s.dir.join(&s.name), e)));
        }
        DataSynced { results, devs, synced_devs, synced_after }
    }

    /// Makes the journal's intents for a batch durable before any of it is renamed, syncing the
    /// journal itself unless a syncfs of the data already covered it. If it cannot be, every
    /// file not already failed fails: a write the journal cannot account for is not made.
    fn journal_before_renames(
        &mut self,
        staged: &[Staged],
        results: &mut [Result<()>],
        synced_devs: &HashMap<u64, std::result::Result<(), Errno>>,
    ) {
        let Some(journal) = &mut self.journal else { return };
        if let Err(e) = journal.make_durable(|dev| synced_devs.get(&dev).is_some_and(|r| r.is_ok())) {
            // Nothing is renamed: a write the journal cannot account for is not made.
            let why = e.to_string();
            for (s, r) in staged.iter().zip(results.iter_mut()).filter(|(_, r)| r.is_ok()) {
                *r = Err(Error::Io {
                    op: "put in place",
                    path: s.dir.join(&s.name),
                    source: io::Error::other(why.clone()),
                });
            }
        }
    }

    /// Renames each staged file that has not failed into place, and removes the temporary file
    /// of each that has (or whose rename failed). Every staged file is done after this, so none
    /// is removed again when it drops. Returns the directories renamed into, for a batch of one
    /// to sync.
    fn rename_into_place(&mut self, staged: &mut [Staged], results: &mut [Result<()>]) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for (s, result) in staged.iter_mut().zip(results.iter_mut()) {
            let target = s.dir.join(&s.name);
            let tmp_name = s.tmp.file_name().unwrap_or_default().to_owned();
            let Ok(Some(dir)) = self.open_dir(&s.dir) else {
                *result = Err(Error::NoParent { path: target });
                continue;
            };
            if result.is_ok() {
                // A symlink planted at the target since it was checked is replaced, not followed:
                // rename never follows the link at its destination.
                if let Err(e) = rfs::renameat(dir, &tmp_name, dir, &s.name) {
                    *result = Err(Error::io("rename into place", &target, e));
                } else if dirs.last() != Some(&s.dir) {
                    dirs.push(s.dir.clone());
                }
            }
            if result.is_err() {
                let _ = rfs::unlinkat(dir, &tmp_name, AtFlags::empty());
            }
            s.done = true;
        }
        dirs
    }

    /// The renames of a batch of more than one made durable, and each file on a filesystem
    /// whose sync failed failed with it; the filesystems synced no longer owe the directories
    /// this session made on them.
    fn sync_renames(&mut self, staged: &[Staged], results: &mut [Result<()>], devs: &[u64]) {
        // The renames made durable: one syncfs per filesystem the batch renamed on, instead
        // of an fsync of each directory (a journal commit each on ext4: a thousand of them
        // for 10,000 files in 1,000 directories). It covers the directories this session
        // made on those filesystems too.
        // A sync that fails fails every file it was to make durable: in place, but not
        // known to survive a crash, so not reported (nor recorded) as done.
        let mut renamed: Vec<(u64, std::result::Result<(), Errno>)> = Vec::new();
        // On a filesystem whose syncfs does not reach its storage (FUSE), each directory renamed
        // into is fsynced instead; a file whose directory's sync failed fails.
        let mut dirs_synced: Vec<(PathBuf, std::result::Result<(), Errno>)> = Vec::new();
        for (s, result) in staged.iter().zip(results.iter_mut()) {
            if result.is_err() || s.trusted {
                continue;
            }
            let synced = match dirs_synced.iter().find(|(d, _)| d == &s.dir) {
                Some((_, r)) => *r,
                None => {
                    let r = if failpoint_named("sync-eio") {
                        Err(Errno::IO)
                    } else {
                        match self.open_dir(&s.dir) {
                            Ok(Some(fd)) => durable::fsync(fd),
                            _ => Err(Errno::NOENT),
                        }
                    };
                    dirs_synced.push((s.dir.clone(), r));
                    r
                }
            };
            if let Err(e) = synced {
                *result = Err(Error::io(
                    "make the rename durable (fsync of its directory)",
                    &s.dir.join(&s.name),
                    e,
                ));
            }
        }
        for ((s, result), dev) in staged.iter().zip(results.iter()).zip(devs) {
            if result.is_ok() && s.trusted && !renamed.iter().any(|(d, _)| d == dev) {
                // `sync-eio`: the failpoint a test needs to show a failed sync fails its files.
                let synced =
                    if failpoint_named("sync-eio") { Err(Errno::IO) } else { durable::syncfs(&s.fd) };
                renamed.push((*dev, synced));
            }
        }
        for ((s, result), dev) in staged.iter().zip(results.iter_mut()).zip(devs) {
            if let Some((_, Err(e))) = renamed.iter().find(|(d, _)| d == dev) {
                if result.is_ok() {
                    *result = Err(Error::io("make the rename durable (syncfs)", &s.dir.join(&s.name), *e));
                }
            }
        }
        self.unsynced.retain(|(dev, _)| !renamed.iter().any(|(d, r)| d == dev && r.is_ok()));
        self.fresh.retain(|_, dev| !renamed.iter().any(|(d, r)| d == dev && r.is_ok()));
    }

    /// The rename of a batch of one made durable by an fsync of its directory; the file fails
    /// if that sync does, since it is then in place but not known to survive a crash.
    fn sync_dirs(&mut self, mut dirs: Vec<PathBuf>, staged: &[Staged], results: &mut [Result<()>]) {
        dirs.sort();
        dirs.dedup();
        for d in dirs {
            let synced = match self.open_dir(&d) {
                Ok(Some(fd)) => durable::fsync(fd),
                _ => Err(Errno::NOENT),
            };
            if let Err(e) = synced {
                for (s, result) in staged.iter().zip(results.iter_mut()).filter(|(s, _)| s.dir == d) {
                    if result.is_ok() {
                        *result = Err(Error::io(
                            "make the rename durable (fsync of its directory)",
                            &s.dir.join(&s.name),
                            e,
                        ));
                    }
                }
            }
        }
    }

    /// The last step of a commit: directories made since the last sync that the files of this
    /// batch are in, made durable; a file in one that could not be fails, for the same reason
    /// as a failed sync of its own.
    fn fail_in_undurable_dirs(&mut self, staged: &[Staged], results: &mut [Result<()>]) {
        for (made, why) in self.make_durable() {
            for (s, result) in staged.iter().zip(results.iter_mut()).filter(|(s, _)| s.dir.starts_with(&made))
            {
                if result.is_ok() {
                    *result = Err(Error::Io {
                        op: "make durable the new directory holding",
                        path: s.dir.join(&s.name),
                        source: io::Error::other(why.to_string()),
                    });
                }
            }
        }
    }

    /// Whether a file renamed over `dir/name` may be synced after its rename: the name holds a
    /// regular file now, and the filesystem guarantees that a rename replacing a file is not
    /// committed before the new file's data (see `replace_waits_for_data`).
    fn replaces_in_order(&mut self, dev: u64, dir: &Path, name: &OsStr) -> bool {
        if !replace_waits_for_data(dev) {
            return false;
        }
        let Ok(Some(fd)) = self.open_dir(dir) else { return false };
        rfs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::RegularFile)
    }

    /// Makes durable the directories this session made that no batch has synced yet: an fsync
    /// of each parent, or one syncfs per filesystem when there are many. Called after each
    /// commit and at the end of a pass, before the store records what the pass did. Returns
    /// the parents whose new entries could not be made durable, with why: what was made in
    /// them is in place but not known to survive a crash.
    pub fn make_durable(&mut self) -> Vec<(PathBuf, Error)> {
        let unsynced = std::mem::take(&mut self.unsynced);
        let fresh = std::mem::take(&mut self.fresh);
        let mut failed = Vec::new();
        let sync = |fs: &mut Fs, parent: &Path, whole: bool| {
            // `dir-sync-eio`: the failpoint a test needs to show that what is in a directory
            // that cannot be made durable is neither reported done nor recorded.
            if failpoint_named("dir-sync-eio") {
                return Some(Errno::IO);
            }
            let r = match fs.open_dir(parent) {
                Ok(Some(fd)) if whole => durable::syncfs(fd),
                Ok(Some(fd)) => durable::fsync(fd),
                _ => Err(Errno::NOENT),
            };
            r.err()
        };
        let trusted = unsynced.iter().all(|(_, parent)| match self.held_dir(parent) {
            Ok(Some(held)) => held.trusted,
            _ => true,
        });
        if unsynced.len() > DIRS_BEFORE_SYNCFS && trusted {
            let mut devs: Vec<(u64, Option<Errno>)> = Vec::new();
            for (dev, parent) in &unsynced {
                let r = match devs.iter().find(|(d, _)| d == dev) {
                    Some((_, r)) => *r,
                    None => {
                        let r = sync(self, parent, true);
                        devs.push((*dev, r));
                        r
                    }
                };
                if let Some(e) = r {
                    failed.push((parent.clone(), e));
                }
            }
        } else {
            for (_, parent) in &unsynced {
                if let Some(e) = sync(self, parent, false) {
                    failed.push((parent.clone(), e));
                }
            }
            // An fsync of the parent makes the new entry durable; the new directory's own
            // inode (the mode and owner set after mkdir) is synced itself, since a filesystem
            // that logs per inode (XFS, btrfs) need not carry it with the parent's.
            for dir in fresh.keys() {
                if let Some(e) = sync(self, dir, false) {
                    failed.push((dir.clone(), e));
                }
            }
        }
        failed
            .into_iter()
            .map(|(parent, e)| {
                let why = Error::io("make the new directories durable in", &parent, e);
                (parent, why)
            })
            .collect()
    }

    /// Removes a file (or a symlink: the link itself). Absent is success.
    pub fn remove_file(&mut self, path: &Path) -> Result<()> {
        let (parent, name) = split(path);
        let Some(dir) = self.open_dir(parent)? else {
            return Ok(());
        };
        match rfs::unlinkat(dir, name, AtFlags::empty()) {
            // Durable before it is reported: a removal a crash could undo must not be recorded
            // as done (an orphan forgotten by the store, back on the disk).
            Ok(()) | Err(Errno::NOENT) => durable::fsync(dir)
                .map_err(|e| Error::io("make the removal durable (fsync of its parent)", path, e)),
            Err(e) => Err(Error::io("remove", path, e)),
        }
    }

    /// Removes an empty directory. Absent is success.
    pub fn remove_dir(&mut self, path: &Path) -> Result<()> {
        self.dirs.remove(path);
        let (parent, name) = split(path);
        let Some(dir) = self.open_dir(parent)? else {
            return Ok(());
        };
        match rfs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
            // Made durable as a file's removal is: the parent synced, so a crash cannot bring
            // back a directory the store no longer records.
            Ok(()) | Err(Errno::NOENT) => durable::fsync(dir)
                .map_err(|e| Error::io("make the removal durable (fsync of its parent)", path, e)),
            Err(e) => Err(Error::io("remove the directory", path, e)),
        }
    }

    /// The names inside a directory (without `.` and `..`).
    pub fn list(&mut self, path: &Path) -> Result<Vec<std::ffi::OsString>> {
        let fd = self.open_at(path, true)?.ok_or_else(|| Error::io("list", path, Errno::NOENT))?;
        let dir = rfs::Dir::read_from(&fd).map_err(|e| Error::io("list", path, e))?;
        let mut names = Vec::new();
        for entry in dir {
            let entry = entry.map_err(|e| Error::io("list", path, e))?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(OsStr::from_bytes(name).to_owned());
            }
        }
        Ok(names)
    }

    /// Makes a symlink at `path` pointing at `target` (created, never followed). Replaces a
    /// symlink already there.
    pub fn symlink(&mut self, path: &Path, target: &Path) -> Result<()> {
        let (parent, name) = split(path);
        self.make_dirs(parent, 0o755)?;
        let dir = self.open_dir(parent)?.ok_or_else(|| Error::NoParent { path: path.to_owned() })?;
        if let Ok(st) = rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            if meta_of(&st).kind == Kind::Symlink {
                let _ = rfs::unlinkat(dir, name, AtFlags::empty());
            }
        }
        rfs::symlinkat(target, dir, name).map_err(|e| Error::io("make the symlink", path, e))
    }

    /// Where a symlink at `path` points.
    pub fn read_link(&mut self, path: &Path) -> Result<PathBuf> {
        let (parent, name) = split(path);
        let dir = self.open_dir(parent)?.ok_or_else(|| Error::NoParent { path: path.to_owned() })?;
        let target =
            rfs::readlinkat(dir, name, Vec::new()).map_err(|e| Error::io("read the link", path, e))?;
        Ok(PathBuf::from(OsStr::from_bytes(target.as_bytes())))
    }

    /// Makes a hard link at `path` to the existing file `existing` (both reached without links).
    pub fn hard_link(&mut self, existing: &Path, path: &Path) -> Result<()> {
        let (eparent, ename) = split(existing);
        let (parent, name) = split(path);
        self.make_dirs(parent, 0o755)?;
        let efd = self
            .open_dir(eparent)?
            .ok_or_else(|| Error::NoParent { path: existing.to_owned() })?
            .try_clone()
            .map_err(|e| Error::Io { op: "link", path: existing.to_owned(), source: e })?;
        let dir = self.open_dir(parent)?.ok_or_else(|| Error::NoParent { path: path.to_owned() })?;
        let _ = rfs::unlinkat(dir, name, AtFlags::empty());
        rfs::linkat(efd.as_fd(), ename, dir, name, AtFlags::empty()).map_err(|e| Error::io("link", path, e))
    }
}

/// Aborts the process, as a crash would, when `MESH_HOST_FAILPOINT` names this point. For the
/// crash tests and the reliability battery (RELIABILITY.md); the variable is read once. Points:
/// `batch-staged` (a batch's files written to their temporary names, nothing synced or renamed),
/// `batch-renamed` (renamed into place, directories not yet synced), `store-write` (the store's
/// new file durable, not yet renamed).
pub fn failpoint(name: &str) {
    if failpoint_named(name) {
        std::process::abort();
    }
}

/// The first of `path` and its ancestors, from the root down, whose kind (not followed, as
/// `lstat` sees it) `matches`: what a refused open names as the reason.
fn first_ancestor(path: &Path, matches: impl Fn(Kind) -> bool) -> Option<PathBuf> {
    let mut prefix = PathBuf::from("/");
    for part in path.components().skip(1) {
        prefix.push(part);
        if let Ok(st) = rfs::statat(rfs::CWD, &prefix, AtFlags::SYMLINK_NOFOLLOW) {
            if matches(meta_of(&st).kind) {
                return Some(prefix);
            }
        }
    }
    None
}

/// Whether the filesystem on device `dev` commits a rename that replaces a file only with, or
/// after, the new file's data: ext4 mounted `data=ordered` (its default) or `data=journal`,
/// with `auto_da_alloc` (its default). ext4 then allocates the new file's delayed blocks at the
/// rename, and its ordered mode writes a transaction's data before the transaction's commit
/// block, so after a crash the name holds the old file or the new one whole, never an empty or
/// short one (the kernel's ext4 documentation, `auto_da_alloc`). Read from
/// `/proc/self/mountinfo` once per device; any doubt (another filesystem, options not found)
/// answers no, and the file is synced before its rename as everywhere else.
fn replace_waits_for_data(dev: u64) -> bool {
    static SEEN: std::sync::Mutex<Vec<(u64, bool)>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, yes)) = seen.iter().find(|(d, _)| *d == dev) {
        return *yes;
    }
    let numbers = format!("{}:{}", rfs::major(dev), rfs::minor(dev));
    let yes = std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|table| table.lines().any(|line| orders_replacing_renames(line, &numbers)));
    seen.push((dev, yes));
    yes
}

/// One line of mountinfo: whether it is the mount of the device `numbers` (`MAJOR:MINOR`) and
/// says ext4 with the options that order a replacing rename after the data.
fn orders_replacing_renames(line: &str, numbers: &str) -> bool {
    let mut fields = line.split(' ');
    if fields.nth(2) != Some(numbers) {
        return false;
    }
    // After the optional fields, " - " then the filesystem type, the source, the super options.
    let Some((_, rest)) = line.split_once(" - ") else { return false };
    let mut rest = rest.split(' ');
    let (Some(kind), _, Some(options)) = (rest.next(), rest.next(), rest.next()) else { return false };
    kind == "ext4" && !options.split(',').any(|o| o == "data=writeback" || o == "noauto_da_alloc")
}

/// The magic number `statfs(2)` gives for every FUSE filesystem (sshfs, rclone, s3fs, the
/// power-loss lane's own...).
const FUSE_SUPER_MAGIC: u64 = 0x6573_5546;

/// Whether a `syncfs(2)` of the filesystem holding `fd` reaches its storage, so that one
/// syncfs can stand for an fsync of each file and directory it wrote. Not on FUSE: the kernel
/// sends the server `FUSE_SYNCFS` only for virtiofs (`fuse_sync_fs` returns at once unless the
/// connection set `sync_fs`), so a syncfs there writes back the kernel's dirty pages to the
/// server and asks it to make nothing durable, while each fsync and fsyncdir is forwarded
/// (docs/durability.md, "Filesystems whose syncfs promises nothing"). Found by the FUSE
/// power-loss lane (`syncfs_on_fuse_is_not_trusted`). Anything else, or a statfs that fails,
/// is trusted as before.
fn syncfs_reaches_storage(fd: impl AsFd) -> bool {
    // The field's type differs between architectures.
    #[allow(clippy::unnecessary_cast)]
    rfs::fstatfs(fd).map_or(true, |st| st.f_type as u64 != FUSE_SUPER_MAGIC)
}

/// Whether `MESH_HOST_FAILPOINT` names this point (read once), for a failpoint that does
/// something other than abort (the controller's `panic-reconcile`).
pub fn failpoint_named(name: &str) -> bool {
    static POINT: std::sync::OnceLock<Option<std::ffi::OsString>> = std::sync::OnceLock::new();
    POINT.get_or_init(|| std::env::var_os("MESH_HOST_FAILPOINT")).as_deref() == Some(OsStr::new(name))
}

/// Writes a private file (mode 0600) atomically and durably: temporary file in the same
/// directory, fsync, rename, fsync of the directory. For the agent's own files (the state
/// store), which are not managed targets; the directory is made 0700 when missing.
///
/// The failpoint `store-write` aborts the process after the temporary file is durable and before
/// the rename: the crash a test needs in order to show the previous file survives.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    write_private_with(path, &mut |file| file.write_all(bytes))
}

/// `write_private`, with the content written by `write` as the file is made (`stage_writing`):
/// how the store is written without its whole text in memory.
pub fn write_private_with(
    path: &Path,
    write: &mut dyn FnMut(&mut dyn io::Write) -> io::Result<()>,
) -> Result<()> {
    let mut fs = Fs::new();
    let (parent, _) = split(path);
    fs.make_dirs(parent, 0o700)?;
    let staged = fs.stage_writing(path, write, 0o600, None)?;
    // `store-write-eio`: the failpoint a test needs to show a store that cannot be written is
    // reported as such, apart from every resource's outcome.
    let synced = if failpoint_named("store-write-eio") { Err(Errno::IO) } else { durable::fsync(&staged.fd) };
    synced.map_err(|e| Error::io("sync", path, e))?;
    failpoint("store-write");
    fs.commit_batch(vec![staged], false).pop().unwrap_or(Ok(()))
}

/// `write_private` for the agent's files other than the store (the generations' records, the
/// rollback hold): the same atomic and durable write, without the store's failpoints, so that a
/// test crashing the store's write crashes it there and nowhere before.
pub fn write_own(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut fs = Fs::new();
    let (parent, _) = split(path);
    fs.make_dirs(parent, 0o700)?;
    let staged = fs.stage(path, bytes, 0o600, None)?;
    durable::fsync(&staged.fd).map_err(|e| Error::io("sync", path, e))?;
    fs.commit_batch(vec![staged], false).pop().unwrap_or(Ok(()))
}

/// Every regular file below `dir`, sorted; symlinks are listed as what they are (never
/// followed). An absent `dir` has none.
pub fn files_under(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                todo.push(entry.path());
            } else {
                found.push(entry.path());
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Makes `dir` (and its parents) if missing, private to root: the fleet cache's home.
pub fn private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Replaces the directory `dir` with one holding exactly `files` (name, bytes), in one step: the
/// new directory is written beside it, made durable, and exchanged with the old one by a single
/// rename (`RENAME_EXCHANGE`): the path names the old set of files or the new, never a mix.
/// (A reader that lists, then opens each name, can still straddle the swap: the fleet's file
/// names carry the revision so that such a reader finds a name missing rather than a mix.)
/// The files are private to root (a declaration can hold sealed values and paths worth hiding).
/// Reached by path, not through `Fs`'s descriptors: the directory is the agent's own, under the
/// state directory and private to root, as the store is.
pub fn replace_dir<B: AsRef<[u8]>>(dir: &std::path::Path, files: &[(String, B)]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let name = dir.file_name().ok_or_else(|| std::io::Error::other("the directory has no name"))?;
    let parent = dir.parent().unwrap_or(std::path::Path::new("/"));
    let new = parent.join(format!(".{}.new", name.to_string_lossy()));
    if new.exists() {
        std::fs::remove_dir_all(&new)?;
    }
    std::fs::DirBuilder::new().mode(0o700).create(&new)?;
    for (file, bytes) in files {
        let mut f =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(new.join(file))?;
        f.write_all(bytes.as_ref())?;
        durable::file(&f)?;
    }
    durable::file(&std::fs::File::open(&new)?)?;
    if dir.exists() {
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            &new,
            rustix::fs::CWD,
            dir,
            rustix::fs::RenameFlags::EXCHANGE,
        )?;
        // The old set is now at `new`.
        std::fs::remove_dir_all(&new)?;
    } else {
        std::fs::rename(&new, dir)?;
    }
    durable::file(&std::fs::File::open(parent)?)
}

/// The names of the directories directly under `dir` (not followed through symlinks), sorted;
/// an absent `dir` has none. For the agent's own directories under the state directory (the
/// generations), never for managed paths.
pub fn dir_names(dir: &std::path::Path) -> std::io::Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Removes a tree the agent made under its state directory (an old generation), then syncs
/// its parent so the removal survives a crash. Never called on a managed path.
pub fn remove_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    durable::file(&std::fs::File::open(dir.parent().unwrap_or(std::path::Path::new("/")))?)
}

/// Removes one of the agent's own files under its state directory (the rollback hold), then
/// syncs its directory. An absent file is already removed: `Ok(false)`.
pub fn remove_private_file(path: &std::path::Path) -> std::io::Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    }
    durable::file(&std::fs::File::open(path.parent().unwrap_or(std::path::Path::new("/")))?)?;
    Ok(true)
}

/// An exclusive advisory lock on a file, held while the value lives.
pub struct Lock {
    _fd: OwnedFd,
}

/// Takes the lock at `path` without waiting. `Ok(None)` when another process holds it.
pub fn try_lock(path: &Path) -> Result<Option<Lock>> {
    let mut fs = Fs::new();
    let (parent, name) = split(path);
    fs.make_dirs(parent, 0o700)?;
    let dir = fs.open_dir(parent)?.ok_or_else(|| Error::NoParent { path: path.to_owned() })?;
    let fd = rfs::openat(
        dir,
        name,
        OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| Error::io("open the lock", path, e))?;
    match rfs::flock(&fd, rfs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(Lock { _fd: fd })),
        Err(Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(Error::io("lock", path, e)),
    }
}

impl From<super::journal::Error> for Error {
    fn from(e: super::journal::Error) -> Error {
        Error::Io { op: e.op, path: e.path, source: e.source }
    }
}

/// Removes the host's temporary files in `dir` that another process of the host left: named
/// `.NAME.mesh-host-PID-N` with a PID not this process's. Only called with the store's lock
/// held, so the process that made them is gone. Returns how many.
pub fn remove_temporaries(dir: &Path) -> Result<usize> {
    let mut fs = Fs::new();
    if fs.meta(dir)?.is_none_or(|m| m.kind != Kind::Directory) {
        return Ok(0);
    }
    let ours = format!("{}", std::process::id());
    let mut removed = 0;
    for name in fs.list(dir)? {
        let Some(name) = name.to_str() else { continue };
        let Some((_, tail)) = name.rsplit_once(TMP_MARK) else { continue };
        let Some((pid, n)) = tail.split_once('-') else { continue };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if name.starts_with('.') && digits(pid) && digits(n) && pid != ours {
            let path = dir.join(name);
            if fs.meta(&path)?.is_some_and(|m| m.kind == Kind::File) {
                fs.remove_file(&path)?;
                removed += 1;
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::{orders_replacing_renames, remove_temporaries};

    #[test]
    fn only_ext4_with_ordered_data_and_auto_da_alloc_lets_a_replacing_rename_go_first() {
        let line = |kind: &str, options: &str| {
            format!("29 1 254:0 / / rw,relatime shared:1 - {kind} /dev/vda {options}")
        };
        assert!(orders_replacing_renames(&line("ext4", "rw,errors=remount-ro"), "254:0"));
        assert!(orders_replacing_renames(&line("ext4", "rw,data=journal"), "254:0"));
        assert!(!orders_replacing_renames(&line("ext4", "rw,data=writeback"), "254:0"));
        assert!(!orders_replacing_renames(&line("ext4", "rw,noauto_da_alloc"), "254:0"));
        assert!(!orders_replacing_renames(&line("xfs", "rw,attr2"), "254:0"));
        assert!(!orders_replacing_renames(&line("ext3", "rw"), "254:0"));
        assert!(!orders_replacing_renames(&line("ext4", "rw"), "254:1"), "another device");
        // No optional fields at all, and a line cut short.
        assert!(orders_replacing_renames("30 29 8:1 / /srv rw - ext4 /dev/sda1 rw", "8:1"));
        assert!(!orders_replacing_renames("30 29 8:1 / /srv rw - ext4", "8:1"));
    }

    #[test]
    fn only_another_process_s_temporary_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let names = [
            (".app.conf.mesh-host-1-7".to_owned(), true),
            (format!(".app.conf.mesh-host-{}-7", std::process::id()), false),
            (".app.conf.mesh-host-x-7".to_owned(), false),
            ("app.conf.mesh-host-1-7".to_owned(), false),
            ("app.conf".to_owned(), false),
        ];
        for (name, _) in &names {
            std::fs::write(dir.path().join(name), "x").unwrap();
        }
        assert_eq!(remove_temporaries(dir.path()).unwrap(), 1);
        for (name, gone) in &names {
            assert_eq!(!dir.path().join(name).exists(), *gone, "{name}");
        }
    }

    #[test]
    #[allow(clippy::disallowed_methods, reason = "the test looks at what it wrote")]
    fn a_directory_is_replaced_whole() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("declaration.d");
        super::replace_dir(
            &dir,
            &[("0001-a.json".into(), b"1".to_vec()), ("0002-b.json".into(), b"2".to_vec())],
        )
        .unwrap();
        super::replace_dir(&dir, &[("0001-c.json".into(), b"3".to_vec())]).unwrap();
        let names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names, ["0001-c.json"]);
        assert_eq!(std::fs::read(dir.join("0001-c.json")).unwrap(), b"3");
        // Nothing is left beside it.
        assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 1);
    }
}
