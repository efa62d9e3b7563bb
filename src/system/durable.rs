//! Making what was written durable: every fsync, fdatasync and syncfs the agent makes goes
//! through here.
//!
//! One place so that the power-loss lanes (`tests/powerloss/`) can prove they are able to see a
//! loss: built with the feature `powerloss-mutant` (used by those lanes only, never in a
//! release), each of these returns at once without asking the kernel for anything, and the
//! lanes must then report files lost or torn. Without the feature they are the system calls.

use std::os::fd::AsFd;

use rustix::io::Errno;

/// Whether this build is the power-loss lanes' mutant, which never syncs.
pub const MUTANT: bool = cfg!(feature = "powerloss-mutant");

/// `fsync(2)`: the file's data and metadata (or a directory's entries) on disk.
pub fn fsync(fd: impl AsFd) -> Result<(), Errno> {
    if MUTANT {
        return Ok(());
    }
    rustix::fs::fsync(fd)
}

/// `syncfs(2)`: everything written on the filesystem that holds `fd`.
pub fn syncfs(fd: impl AsFd) -> Result<(), Errno> {
    if MUTANT {
        return Ok(());
    }
    rustix::fs::syncfs(fd)
}

/// `fsync(2)` of an open file or directory, for code that holds a `std::fs::File`.
pub fn file(file: &std::fs::File) -> std::io::Result<()> {
    fsync(file).map_err(std::io::Error::from)
}

/// `fdatasync(2)`: the file's data, and the metadata needed to read it back.
pub fn data(file: &std::fs::File) -> std::io::Result<()> {
    if MUTANT {
        return Ok(());
    }
    rustix::fs::fdatasync(file).map_err(std::io::Error::from)
}

/// Starts the writing back of what is dirty on the filesystem of `dir` (on `dev`) and returns
/// at once: a syncfs on a thread of its own, so that the disk works while the caller goes on
/// making files, and the syncfs a batch's commit waits on finds most of its data already
/// written. A hint only, which promises nothing: durability still rests on that commit's own
/// sync, which is why an error here is not reported (see `writeback`).
///
/// The thread syncs through a description of the directory opened for it, never a duplicate
/// of the caller's descriptor: the kernel reports a writeback error to a syncfs once per open
/// description (`errseq`), and a duplicate would share the commit's and could take the error
/// the commit must see.
pub fn start_writeback(dir: impl AsFd, dev: u64) {
    if MUTANT {
        return;
    }
    let Some(queue) = writeback() else { return };
    if let Ok(own) = own_description(dir) {
        let _ = queue.send((dev, own));
    }
}

/// The directory `dir` is, opened anew: a description of its own, which shares neither the
/// file offset, the status flags nor the writeback error cursor of `dir`'s (as `dup` would).
fn own_description(dir: impl AsFd) -> Result<std::os::fd::OwnedFd, Errno> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    rustix::fs::openat(dir, ".", flags, Mode::empty())
}

/// The queue of the thread `start_writeback` hands its syncs to, started the first time it is
/// needed (a pass that stages few files never starts it). Requests waiting while a sync runs are
/// folded into one per filesystem. `None` when the thread could not be started: the hints are
/// then not given, and nothing else changes.
fn writeback() -> Option<&'static std::sync::mpsc::Sender<(u64, std::os::fd::OwnedFd)>> {
    use std::os::fd::OwnedFd;
    use std::sync::mpsc;
    static QUEUE: std::sync::OnceLock<Option<mpsc::Sender<(u64, OwnedFd)>>> = std::sync::OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<(u64, OwnedFd)>();
            let run = move || {
                while let Ok(first) = rx.recv() {
                    let mut due: Vec<(u64, OwnedFd)> = vec![first];
                    while let Ok((dev, fd)) = rx.try_recv() {
                        match due.iter_mut().find(|(d, _)| *d == dev) {
                            Some(slot) => slot.1 = fd,
                            None => due.push((dev, fd)),
                        }
                    }
                    for (_, fd) in due {
                        // A hint: the commit's own sync reports what failed.
                        let _ = rustix::fs::syncfs(&fd);
                    }
                }
            };
            std::thread::Builder::new().name("writeback".into()).spawn(run).ok().map(|_| tx)
        })
        .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::{Mode, OFlags};

    /// The writeback thread's syncs go through a description of their own: were it a duplicate
    /// (`dup`, `try_clone`), a flag set on the caller's would show on it, and so would the
    /// writeback error a syncfs reports once per description.
    #[test]
    fn the_writeback_hint_syncs_through_a_description_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let theirs = rustix::fs::open(dir.path(), flags, Mode::empty()).unwrap();
        let own = own_description(&theirs).unwrap();
        let same = rustix::fs::fstat(&theirs).unwrap();
        let opened = rustix::fs::fstat(&own).unwrap();
        assert_eq!((same.st_dev, same.st_ino), (opened.st_dev, opened.st_ino), "the same directory");
        rustix::fs::fcntl_setfl(&theirs, OFlags::NONBLOCK).unwrap();
        assert!(rustix::fs::fcntl_getfl(&theirs).unwrap().contains(OFlags::NONBLOCK));
        assert!(
            !rustix::fs::fcntl_getfl(&own).unwrap().contains(OFlags::NONBLOCK),
            "the hint's descriptor shares the caller's description"
        );
        // A duplicate does share it: what the check above tells apart.
        let dup = theirs.try_clone().unwrap();
        assert!(rustix::fs::fcntl_getfl(&dup).unwrap().contains(OFlags::NONBLOCK));
    }
}
