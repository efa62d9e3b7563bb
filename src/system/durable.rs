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
