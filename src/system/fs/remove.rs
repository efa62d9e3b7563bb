//! Removing: files and directories at managed paths (each removal durable before it is
//! reported), the agent's own trees and files under its state directory, and the temporary
//! files a crashed pass left.

use std::collections::HashSet;
use std::path::Path;

use rustix::fs::{self as rfs, AtFlags};
use rustix::io::Errno;

use super::{durable, split, Error, Fs, Kind, Result, TMP_MARK};

impl Fs {
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
    use super::remove_temporaries;

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
}
