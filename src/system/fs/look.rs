//! Looking and reading: a path's metadata, a file's content or digest, a directory's names, a
//! link's target; never following a symlink at a managed path.

use std::ffi::OsStr;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use rustix::io::Errno;
use sha2::Digest as _;

use super::{hash_stream, meta_of, split, Content, Error, Fs, Kind, Meta, Result};

impl Fs {
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
    pub(super) fn open_at(&mut self, path: &Path, dir: bool) -> Result<Option<OwnedFd>> {
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
        self.read_bounded(path, max, u64::MAX)
    }

    /// `read_up_to`, hashing no file larger than `hash_max` bytes: one larger is
    /// `Content::Unhashed`, its size only (issue 45, point 3). For what sits at a managed path,
    /// which anyone who can write its directory may have made a sparse 100 GiB file.
    pub fn read_bounded(&mut self, path: &Path, max: u64, hash_max: u64) -> Result<Option<(Meta, Content)>> {
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
        if meta.sig.size > max && meta.sig.size > hash_max {
            return Ok(Some((meta, Content::Unhashed { size: meta.sig.size })));
        }
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
        // Bounded as it is read too: a file grown past the bound meanwhile is not hashed on.
        let bound = hash_max.saturating_sub(size).saturating_add(1);
        size += hash_stream(&mut std::io::Read::take(&mut file, bound), &mut hasher).map_err(io)?;
        if size > hash_max {
            return Ok(Some((meta, Content::Unhashed { size })));
        }
        Ok(Some((meta, Content::Large { sum: hasher.finalize().into(), size })))
    }

    /// The SHA-256 of a regular file's bytes, read as a stream, when it is no larger than
    /// `hash_max` bytes. `Ok(None)` when absent; a sum of `None` when what is there is not a
    /// regular file, or is larger (`read_bounded`).
    pub fn digest_bounded(&mut self, path: &Path, hash_max: u64) -> Result<Option<(Meta, Option<[u8; 32]>)>> {
        Ok(self.read_bounded(path, 0, hash_max)?.map(|(meta, content)| (meta, content.sum())))
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

    /// Where a symlink at `path` points.
    pub fn read_link(&mut self, path: &Path) -> Result<PathBuf> {
        let (parent, name) = split(path);
        let dir = self.open_dir(parent)?.ok_or_else(|| Error::NoParent { path: path.to_owned() })?;
        let target =
            rfs::readlinkat(dir, name, Vec::new()).map_err(|e| Error::io("read the link", path, e))?;
        Ok(PathBuf::from(OsStr::from_bytes(target.as_bytes())))
    }
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
