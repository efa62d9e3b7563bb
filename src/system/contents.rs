//! Declared content kept in a file instead of in the daemon's memory.
//!
//! The daemon holds the declared bytes of every file for months, only to put back the few that
//! drift: ten thousand files of a few kilobytes are tens of megabytes of heap, on machines
//! people run their own work on. So when a declaration is accepted the daemon writes those bytes
//! once into an unlinked file (`O_TMPFILE`) in the state directory, and keeps only where each
//! body is and a checksum of it. Unlinked, the file has no name anyone else can open, and it
//! goes when the process does, crash included. Its pages are the kernel's page cache: clean,
//! reclaimable under memory pressure, and read back from disk when needed, which a page of
//! heap never is.

use std::fs::File;
use std::hash::Hasher as _;
use std::io::{self, Write as _};
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::Path;

/// The written content file, read at offsets.
pub struct ContentFile {
    file: File,
    len: u64,
}

/// Where one body is in a content file, and its checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// Where the body starts, from the file's beginning.
    pub at: u64,
    /// The body's length in bytes.
    pub len: u32,
    /// The body's checksum, checked when it is read back.
    pub sum: u64,
}

/// Fills a content file: bodies are appended through a buffer, then `finish` writes the rest.
pub struct ContentWriter {
    file: File,
    buf: Vec<u8>,
    at: u64,
}

const BUFFER: usize = 1 << 20;

impl ContentWriter {
    /// Makes an unlinked file in `dir`, mode 0600. Fails where the filesystem has no
    /// `O_TMPFILE` (the caller then keeps the content in memory).
    pub fn create(dir: &Path) -> io::Result<ContentWriter> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::TMPFILE.bits() as i32)
            .open(dir)?;
        Ok(ContentWriter { file, buf: Vec::with_capacity(BUFFER), at: 0 })
    }

    /// Appends a body; returns where it is.
    pub fn push(&mut self, bytes: &[u8]) -> io::Result<Place> {
        let len = u32::try_from(bytes.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a body of 4 GiB or more"))?;
        let stored = Place { at: self.at + self.buf.len() as u64, len, sum: checksum(bytes) };
        if self.buf.len() + bytes.len() > BUFFER {
            self.file.write_all(&self.buf)?;
            self.at += self.buf.len() as u64;
            self.buf.clear();
        }
        if bytes.len() > BUFFER {
            self.file.write_all(bytes)?;
            self.at += bytes.len() as u64;
        } else {
            self.buf.extend_from_slice(bytes);
        }
        Ok(stored)
    }

    /// Writes what is buffered. No fsync: the file dies with the process, and a new process
    /// writes its own from the declaration.
    pub fn finish(mut self) -> io::Result<ContentFile> {
        self.file.write_all(&self.buf)?;
        let len = self.at + self.buf.len() as u64;
        let written = self.file.metadata()?.len();
        if written != len {
            return Err(io::Error::other(format!("the content file holds {written} bytes, not {len}")));
        }
        Ok(ContentFile { file: self.file, len })
    }
}

impl ContentFile {
    /// Reads a body back, and refuses it if it is not what was written.
    pub fn read(&self, s: &Place) -> io::Result<Vec<u8>> {
        let mut out = vec![0; s.len as usize];
        self.file.read_exact_at(&mut out, s.at)?;
        if checksum(&out) != s.sum {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the content file no longer holds what was written to it",
            ));
        }
        Ok(out)
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for ContentFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ContentFile({} bytes)", self.len)
    }
}

/// SipHash with std's fixed keys: enough to catch a file changed or damaged under the daemon,
/// which is all it is for (the file has no name to be opened by).
fn checksum(bytes: &[u8]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    h.write(bytes);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_come_back_as_written_and_the_file_has_no_name() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = ContentWriter::create(dir.path()).unwrap();
        let big = vec![7u8; BUFFER + 10];
        let bodies: Vec<Vec<u8>> =
            vec![b"first\n".to_vec(), Vec::new(), big.clone(), vec![1; BUFFER - 3], b"last".to_vec()];
        let stored: Vec<Place> = bodies.iter().map(|b| w.push(b).unwrap()).collect();
        let file = w.finish().unwrap();
        for (body, s) in bodies.iter().zip(&stored) {
            assert_eq!(&file.read(s).unwrap(), body);
        }
        assert_eq!(file.len(), bodies.iter().map(|b| b.len() as u64).sum::<u64>());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing in the directory by name");
    }

    #[test]
    fn a_body_changed_under_the_daemon_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = ContentWriter::create(dir.path()).unwrap();
        let s = w.push(b"port=80\n").unwrap();
        let file = w.finish().unwrap();
        file.file.write_all_at(b"9", 5).unwrap();
        let err = file.read(&s).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
