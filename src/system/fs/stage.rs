//! Staging and committing: each file written to a temporary name beside its target, then a
//! batch made durable and renamed into place, with the journal of intent noted before any
//! rename; and the agent's own files and directories written with the same discipline.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::{
    durable, failpoint, failpoint_named, meta_of, split, syncfs_reaches_storage, Error, Fs, Kind, Result,
    DIRS_BEFORE_SYNCFS, WRITEBACK_EVERY,
};

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

impl Fs {
    /// A session whose staged writes are noted in the journal at `journal`.
    pub fn journaled(journal: PathBuf) -> Fs {
        Fs { journal: Some(crate::system::journal::Journal::new(journal)), ..Fs::default() }
    }

    /// Whether this session wrote to its journal.
    pub fn journal_written(&self) -> bool {
        self.journal.as_ref().is_some_and(|j| j.written())
    }

    /// Notes in the journal, durably, what a batch is about to leave. Call before `commit`.
    pub fn intend(&mut self, intents: Vec<crate::system::journal::Intent>) -> Result<()> {
        match &mut self.journal {
            Some(j) => j.intend(intents).map_err(Error::from),
            None => Ok(()),
        }
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
    // `trust init --out policy` names a file in the working directory: its parent is "".
    let path = &std::path::absolute(path).map_err(|source| Error::Io {
        op: "resolve",
        path: path.to_owned(),
        source,
    })?;
    let mut fs = Fs::new();
    let (parent, _) = split(path);
    fs.make_dirs(parent, 0o700)?;
    let staged = fs.stage(path, bytes, 0o600, None)?;
    durable::fsync(&staged.fd).map_err(|e| Error::io("sync", path, e))?;
    fs.commit_batch(vec![staged], false).pop().unwrap_or(Ok(()))
}

/// Makes `dir` (and its parents) if missing, private to root (the fleet cache's home, a
/// generation's), durably: each directory made is synced, with its entries, and so is the one
/// above the first it made, so that a power cut after the return cannot lose them (a file
/// synced in a directory whose own entry was not is lost with it). The directory above `dir` is
/// synced even when nothing was made: `dir` may be left from a run that stopped before it
/// synced it. By path, as `replace_dir` is: the agent's own directories, under the state
/// directory.
pub fn private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    let mut missing = Vec::new();
    let mut at = dir;
    while let Err(e) = std::fs::symlink_metadata(at) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(e);
        }
        missing.push(at);
        match at.parent() {
            Some(up) if !up.as_os_str().is_empty() => at = up,
            _ => break,
        }
    }
    for made in missing.iter().rev() {
        match std::fs::DirBuilder::new().mode(0o700).create(made) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
    }
    // Bottom up: each one's own mode and its entry for the one below, then the one above them.
    for made in &missing {
        durable::file(&std::fs::File::open(made)?)?;
    }
    let top = missing.last().copied().unwrap_or(dir);
    sync_parent(top)
}

/// Syncs the directory holding `path`'s entry.
fn sync_parent(path: &std::path::Path) -> std::io::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        Some(_) => std::path::Path::new("."),
        None => return Ok(()),
    };
    durable::file(&std::fs::File::open(parent)?)
}

/// Replaces the directory `dir` with one holding exactly `files` (name, bytes), in one step: the
/// new directory is written beside it, each file staged and synced, the directory synced, and
/// exchanged with the old one by a single rename (`RENAME_EXCHANGE`): the path names the old
/// set of files or the new, never a mix. The directory holding both is synced after the
/// exchange and before the old set is removed, so a power cut leaves one set or the other
/// whole, and the new one once this returns (its parent made durable by `private_dir`).
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
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(OFlags::NOFOLLOW.bits() as i32)
            .open(new.join(file))?;
        f.write_all(bytes.as_ref())?;
        durable::file(&f)?;
    }
    durable::file(&std::fs::File::open(&new)?)?;
    let exchanged = dir.exists();
    if exchanged {
        rfs::renameat_with(rfs::CWD, &new, rfs::CWD, dir, rfs::RenameFlags::EXCHANGE)?;
    } else {
        rfs::renameat_with(rfs::CWD, &new, rfs::CWD, dir, rfs::RenameFlags::NOREPLACE)?;
    }
    durable::file(&std::fs::File::open(parent)?)?;
    if exchanged {
        // The old set is now at `new`: gone once durable or not, and removed at the next
        // replace if a crash leaves it.
        std::fs::remove_dir_all(&new)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::orders_replacing_renames;

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

    /// The fleet's cache as the daemon makes it (`private_dir` of `fleet/`, then `replace_dir`
    /// of `fleet/declaration.d` at each new declaration), on the power-loss lane's filesystem
    /// (tests/powerloss/: it keeps what was written apart from what was synced, POSIX-strictly),
    /// and a power cut at every sync boundary of a loop of replaces, each both ways (all that
    /// was not synced lost, and seeded subsets of it kept): once a replace has returned, the
    /// cache is there, whole, as that replace left it or as the next one in flight leaves it;
    /// never missing, never a mix. Before the cache's writes were made durable up to the state
    /// directory, `fleet/` itself was lost: made, never synced into its parent.
    #[test]
    #[allow(clippy::disallowed_methods, reason = "the test makes the scratch mount")]
    fn the_fleet_cache_is_whole_at_every_power_cut_of_a_loop_of_replaces() {
        use mesh_host_powerloss::check::{snapshot_tree, sum, Snapshot};
        use mesh_host_powerloss::fuse::Mounted;
        use mesh_host_powerloss::model::{crash_state, Crash, Op, Tree};
        assert!(
            std::path::Path::new("/dev/fuse").exists(),
            "needs /dev/fuse (modprobe fuse) and root, as the power-loss lane does"
        );
        let scratch = tempfile::tempdir().unwrap();
        let at = scratch.path().join("mnt");
        std::fs::create_dir(&at).unwrap();
        let m = Mounted::mount(&at, Tree::new()).expect("the FUSE filesystem mounts");
        std::fs::create_dir(at.join("state")).unwrap();
        crate::system::durable::file(&std::fs::File::open(&at).unwrap()).unwrap();
        let files = |round: usize| -> Vec<(String, Vec<u8>)> {
            (0..=round % 3)
                .map(|i| {
                    (
                        format!("{round:04}-{i}.json"),
                        format!("{{\"round\": {round}, \"file\": {i}}}").into_bytes(),
                    )
                })
                .collect()
        };
        let cache = at.join("state/fleet/declaration.d");
        super::private_dir(&at.join("state/fleet")).unwrap();
        const ROUNDS: usize = 6;
        for round in 0..ROUNDS {
            super::replace_dir(&cache, &files(round)).unwrap();
            m.lock().mark(&format!("replaced {round}"));
        }
        let state = m.lock();
        let whole = |round: usize| -> Snapshot {
            let mut want = Snapshot::new();
            for (name, bytes) in files(round) {
                want.insert(
                    name,
                    mesh_host_powerloss::check::Entry {
                        kind: "file".into(),
                        sum: Some(sum(&bytes)),
                        mode: 0o600,
                        uid: 0,
                        gid: 0,
                    },
                );
            }
            want
        };
        let mut checked = 0;
        for boundary in 0..=state.log.len() {
            if boundary > 0
                && !matches!(state.log[boundary - 1], Op::Fsync { .. } | Op::Fsyncdir { .. } | Op::Mark(_))
            {
                continue;
            }
            // How many replaces had returned at this boundary.
            let done = state.log[..boundary].iter().filter(|op| matches!(op, Op::Mark(_))).count();
            for crash in
                [Crash::DropAll, Crash::Random(boundary as u64), Crash::Random(7 * boundary as u64 + 1)]
            {
                let crashed = crash_state(&state.base, &state.log, boundary, crash);
                let found = snapshot_tree(&crashed, "state/fleet/declaration.d");
                let mut allowed = Vec::new();
                if done > 0 {
                    allowed.push(whole(done - 1));
                } else {
                    allowed.push(Snapshot::new());
                }
                if done < ROUNDS {
                    allowed.push(whole(done));
                }
                assert!(
                    allowed.contains(&found),
                    "a power cut after {done} replaces returned ({crash:?} at operation {boundary}) left the cache as {:?}",
                    found.keys().collect::<Vec<_>>()
                );
                checked += 1;
            }
        }
        assert!(checked > 3 * ROUNDS, "{checked} crash states");
    }
}
