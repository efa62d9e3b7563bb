//! The filesystem, touched without ever following a symlink.
//!
//! Every path is reached by opening its parent directory with `openat2(RESOLVE_NO_SYMLINKS)`
//! and then working relative to that descriptor with `O_NOFOLLOW`. The agent is root: a symlink
//! planted by anyone who can write to a managed directory would otherwise turn "write the web
//! server's config" into "overwrite /etc/shadow". Resolving through a descriptor also closes the
//! window between checking a path and writing it: a write goes to a temporary file renamed
//! into place, and a mode or owner set in place goes to a descriptor checked to be the file or
//! directory that was looked at (`Fs::change_in_place`), never to whatever the name holds by then.
//!
//! Writes are staged and committed in batches: every temporary file is written, the data is made
//! durable once per filesystem (`syncfs`) instead of once per file, the renames are done, and
//! each directory touched is synced. Each file is still replaced atomically and durably; 10,000
//! files cost one data sync and a thousand directory syncs rather than ten thousand fsyncs.
//!
//! The module is split by what it does: `look` reads (metadata, content, listings), `stage`
//! writes through temporary files and commits them with the journal of intent, `remove` takes
//! away (files, directories, the temporary files a crashed pass left). This file holds the
//! session (`Fs`) and its directory descriptors, the types they share, and what changes a path
//! in place (directories made, modes and owners, links).

mod look;
mod remove;
mod stage;

pub use look::{dir_names, files_under};
pub use remove::{remove_private_dir, remove_private_file, remove_temporaries};
pub use stage::{private_dir, replace_dir, write_own, write_private, write_private_with, Staged, TMP_MARK};

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

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
    /// Larger than the bound on hashing too (`Fs::read_bounded`): its size only, and nothing
    /// of it read. A sparse 100 GiB file planted at a managed path costs a stat, not minutes.
    Unhashed {
        /// Its size in bytes.
        size: u64,
    },
}

impl Content {
    /// The SHA-256 of the bytes, `None` for what is not a regular file or was not hashed.
    pub fn sum(&self) -> Option<[u8; 32]> {
        match self {
            Content::NotFile => None,
            Content::Bytes(b) => Some(sha2::Sha256::digest(b).into()),
            Content::Large { sum, .. } => Some(*sum),
            Content::Unhashed { .. } => None,
        }
    }

    /// How many bytes the file holds (0 for what is not a regular file).
    pub fn size(&self) -> u64 {
        match self {
            Content::NotFile => 0,
            Content::Bytes(b) => b.len() as u64,
            Content::Large { size, .. } | Content::Unhashed { size } => *size,
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
    /// What is at the path is not what the host looked at and decided on: something was put
    /// at the name in between (or it is a file with other names). Nothing was changed.
    #[error("{path} changed while the host was about to set its mode or owner in place: the name now holds {found}; nothing was changed, and the next pass looks again")]
    Swapped {
        /// The path asked for.
        path: PathBuf,
        /// What the name holds now.
        found: String,
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

/// A kind in words, for a message.
fn kind_word(kind: Kind) -> &'static str {
    match kind {
        Kind::File => "regular file",
        Kind::Directory => "directory",
        Kind::Symlink => "symlink",
        Kind::Other => "FIFO, socket or device",
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

/// What a change in place must find at its path (`Fs::change_in_place`).
#[derive(Clone, Copy, Debug)]
pub enum Expect<'a> {
    /// The file or directory the caller looked at and decided on: the same device, inode and
    /// kind, and for a file one name.
    Checked(&'a Meta),
    /// A directory, any (one the host has just made).
    Directory,
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
    journal: Option<crate::system::journal::Journal>,
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
            self.set_dir_mode(&at, want)?;
        }
        Ok(true)
    }

    /// Sets the permission bits of the directory at `path`, never through a link: on the
    /// descriptor opened `O_DIRECTORY`, so a file swapped in at the name is never changed.
    pub fn set_dir_mode(&mut self, path: &Path, mode: u32) -> Result<()> {
        self.change_in_place(path, Expect::Directory, None, Some(mode))
    }

    /// Sets the owner and the mode of what is at `path` in place (issue 45, point 5; security
    /// review F7). `checked` is what the caller decided on (its `meta` or `read_up_to`): the
    /// path is opened once more, never through a link, and the descriptor itself is checked to
    /// be that file or directory (device, inode, kind) and, for a file, to have one name;
    /// `fchown` and `fchmod` then act on that descriptor, so nothing swapped in at the name
    /// between the decision and the change (a hard link to `/etc/shadow`, another file renamed
    /// in, a symlink) is ever changed: the resource fails, naming what was found, and the next
    /// pass looks again. `Expect::Directory`: any directory (one the host just made).
    /// The mode is set again after a chown, because the kernel clears set-id bits on chown.
    pub fn change_in_place(
        &mut self,
        path: &Path,
        checked: Expect<'_>,
        owner: Option<(u32, u32)>,
        mode: Option<u32>,
    ) -> Result<()> {
        pause_in_place();
        let (fd, now) = self.open_to_change(path, checked)?;
        if let Some((uid, gid)) = owner {
            rfs::fchown(&fd, Some(rfs::Uid::from_raw(uid)), Some(rfs::Gid::from_raw(gid)))
                .map_err(|e| Error::io("chown", path, e))?;
        }
        if let Some(mode) = mode.or(owner.map(|_| now.mode)) {
            rfs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| Error::io("chmod", path, e))?;
        }
        // Durable before it is reported or recorded: a change in place is in no batch, and no
        // syncfs follows it; without this a power cut can undo a mode the store records (the
        // FUSE power-loss lane, `a_change_in_place_is_durable_before_it_is_recorded`). A
        // directory this session made is made durable whole, mode and owner with it, before
        // anything in it is recorded (`make_durable`): an fsync of each cost a cold apply of
        // 10,000 files 2,000 fsyncs, a second of its 1.8.
        if self.is_fresh(path) {
            return Ok(());
        }
        durable::fsync(&fd).map_err(|e| Error::io("make the mode and owner durable (fsync)", path, e))
    }

    /// Opens what is at `path` to change it in place, and checks the descriptor: a directory
    /// (opened `O_DIRECTORY`) or a regular file with one name, the very one `checked`
    /// describes. Returns the descriptor and what it is.
    fn open_to_change(&mut self, path: &Path, checked: Expect<'_>) -> Result<(OwnedFd, Meta)> {
        let (dir, checked) = match checked {
            Expect::Checked(m) => (m.kind == Kind::Directory, Some(m)),
            Expect::Directory => (true, None),
        };
        let fd = self.open_at(path, dir)?.ok_or_else(|| Error::io("change in place", path, Errno::NOENT))?;
        let now = meta_of(&rfs::fstat(&fd).map_err(|e| Error::io("look at", path, e))?);
        let refuse = |found: String| Err(Error::Swapped { path: path.to_owned(), found });
        if let Some(c) = checked {
            let (was, is) = ({ c.sig.inode }, { now.sig.inode });
            if (c.kind, c.dev, was) != (now.kind, now.dev, is) {
                return refuse(format!("another {} (inode {is}, it was {was})", kind_word(now.kind)));
            }
        }
        match now.kind {
            Kind::Directory => Ok((fd, now)),
            Kind::File if now.links == 1 => Ok((fd, now)),
            Kind::File => refuse(format!("a file with {} names (hard links)", now.links)),
            Kind::Symlink | Kind::Other => refuse(kind_word(now.kind).to_owned()),
        }
    }

    /// Whether `path` is a directory this session made that no sync has covered yet.
    fn is_fresh(&self, path: &Path) -> bool {
        self.fresh.contains_key(path)
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

/// Holds the agent for 300 ms just before a change in place when `MESH_HOST_FAILPOINT` is
/// `in-place-pause`: the window a test's racing swapper needs (`tests/it/attacks.rs`).
fn pause_in_place() {
    if failpoint_named("in-place-pause") {
        std::thread::sleep(std::time::Duration::from_millis(300));
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

impl From<crate::system::journal::Error> for Error {
    fn from(e: crate::system::journal::Error) -> Error {
        Error::Io { op: e.op, path: e.path, source: e.source }
    }
}

#[cfg(test)]
mod tests {
    use super::{Error, Expect, Fs};
    use std::os::unix::fs::PermissionsExt as _;

    fn mode(path: &std::path::Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn file(path: &std::path::Path, mode: u32) {
        std::fs::write(path, "x\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Issue 45, point 5: what the host looked at and decided on is what a change in place
    /// reaches, or nothing is changed. Another file of one name renamed in (a credential in the
    /// same directory), a hard link, or a file where a directory was made, is refused untouched.
    #[test]
    fn a_file_renamed_in_after_the_check_is_not_changed() {
        let scratch = tempfile::tempdir().unwrap();
        let (managed, other) = (scratch.path().join("app.conf"), scratch.path().join("secret.key"));
        file(&managed, 0o600);
        file(&other, 0o600);
        let mut fs = Fs::new();
        let checked = fs.meta(&managed).unwrap().unwrap();
        std::fs::rename(&other, &managed).unwrap();
        let e = fs.change_in_place(&managed, Expect::Checked(&checked), None, Some(0o644)).unwrap_err();
        assert!(matches!(e, Error::Swapped { .. }), "{e}");
        assert!(e.to_string().contains("nothing was changed"), "{e}");
        assert_eq!(mode(&managed), 0o600, "the file renamed in was chmodded");

        // A hard link to a file outside: the same inode was not checked, and two names refuse.
        let outside = scratch.path().join("shadow");
        file(&outside, 0o640);
        std::fs::remove_file(&managed).unwrap();
        std::fs::hard_link(&outside, &managed).unwrap();
        let linked = fs.meta(&managed).unwrap().unwrap();
        let e =
            fs.change_in_place(&managed, Expect::Checked(&linked), Some((65534, 65534)), None).unwrap_err();
        assert!(e.to_string().contains("2 names"), "{e}");
        assert_eq!(mode(&outside), 0o640);

        // Where a directory is expected, a file is never changed.
        let e = fs.set_dir_mode(&managed, 0o755).unwrap_err();
        assert!(e.to_string().contains(&managed.display().to_string()), "{e}");
        assert_eq!(mode(&outside), 0o640);

        // The file itself, checked, is changed.
        std::fs::remove_file(&managed).unwrap();
        file(&managed, 0o600);
        let checked = fs.meta(&managed).unwrap().unwrap();
        fs.change_in_place(&managed, Expect::Checked(&checked), None, Some(0o644)).unwrap();
        assert_eq!(mode(&managed), 0o644);
    }
}
