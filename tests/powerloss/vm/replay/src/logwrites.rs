//! The on-disk log of the kernel's `dm-log-writes` target, read from its documentation
//! (`Documentation/admin-guide/device-mapper/log-writes.rst`) and the structs of
//! `drivers/md/dm-log-writes.c`.
//!
//! At byte 0 the super (`magic`, `version`, `nr_entries`, `sectorsize`, little endian); from the
//! second sector (of `sectorsize` bytes) one entry after another: a header sector
//! (`sector`, `nr_sectors`, `flags`, `data_len`; for a mark, its name follows the header in
//! the same sector), then `nr_sectors` sectors of the data written (none for a discard, a flush
//! or a mark). `sector` and `nr_sectors` count the data device's logical blocks
//! (`sectorsize` bytes). Writes are logged when they complete, a flush after every write that
//! completed before it: replaying entries `0..=i` gives the disk as a power cut just after
//! entry `i` could leave it, when entry `i` is a flush or a FUA write.

use std::fs::File;
#[cfg(test)]
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;

pub const MAGIC: u64 = 0x006a_7366_7773_6872;
pub const VERSION: u64 = 1;
pub const FLUSH: u64 = 1 << 0;
pub const FUA: u64 = 1 << 1;
pub const DISCARD: u64 = 1 << 2;
pub const MARK: u64 = 1 << 3;

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("eight bytes"))
}

/// One entry of the log.
#[derive(Debug, Clone)]
pub struct Entry {
    pub index: u64,
    /// Byte offset of the entry's header sector in the log.
    pub offset: u64,
    pub sector: u64,
    pub nr_sectors: u64,
    pub flags: u64,
    pub mark: Option<String>,
}

impl Entry {
    /// Whether the entry changes the data device (a write or a discard).
    pub fn writes(&self) -> bool {
        self.nr_sectors > 0 && self.mark.is_none()
    }
    pub fn kind(&self) -> &'static str {
        if self.flags & MARK != 0 {
            "mark"
        } else if self.flags & FUA != 0 {
            "fua"
        } else if self.flags & FLUSH != 0 {
            "flush"
        } else if self.flags & DISCARD != 0 {
            "discard"
        } else {
            "write"
        }
    }
}

pub struct Log {
    file: File,
    pub nr_entries: u64,
    pub sectorsize: u64,
}

impl Log {
    pub fn open(path: &str) -> io::Result<Log> {
        let file = File::open(path)?;
        let mut sup = [0u8; 28];
        file.read_exact_at(&mut sup, 0)?;
        if le64(&sup, 0) != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path}: not a dm-log-writes log (bad magic)"),
            ));
        }
        if le64(&sup, 8) != VERSION {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path}: log version {} unknown", le64(&sup, 8)),
            ));
        }
        let sectorsize = u64::from(u32::from_le_bytes(sup[24..28].try_into().expect("four bytes")));
        if sectorsize < 512 || !sectorsize.is_power_of_two() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path}: sector size {sectorsize}"),
            ));
        }
        Ok(Log { file, nr_entries: le64(&sup, 16), sectorsize })
    }

    /// Every entry, in the order logged.
    pub fn entries(&self) -> io::Result<Vec<Entry>> {
        let ss = self.sectorsize;
        let mut out = Vec::with_capacity(self.nr_entries as usize);
        let mut offset = ss;
        let mut head = vec![0u8; ss as usize];
        for index in 0..self.nr_entries {
            self.file.read_exact_at(&mut head, offset)?;
            let (sector, nr_sectors, flags, data_len) =
                (le64(&head, 0), le64(&head, 8), le64(&head, 16), le64(&head, 24));
            let mark = if flags & MARK != 0 {
                let len = (data_len as usize).min(ss as usize - 32);
                Some(String::from_utf8_lossy(&head[32..32 + len]).into_owned())
            } else {
                None
            };
            let e = Entry { index, offset, sector, nr_sectors, flags, mark };
            offset += ss;
            if flags & DISCARD == 0 {
                offset += nr_sectors * ss;
            }
            out.push(e);
        }
        Ok(out)
    }

    /// Puts one entry's effect on `dev`: its data written at its sector, a discard as zeros.
    pub fn apply(&self, e: &Entry, dev: &File) -> io::Result<()> {
        if !e.writes() {
            return Ok(());
        }
        let ss = self.sectorsize;
        let total = e.nr_sectors * ss;
        let chunk = 1u64 << 20;
        let mut buf = vec![0u8; chunk.min(total) as usize];
        let mut done = 0;
        while done < total {
            let n = chunk.min(total - done) as usize;
            if e.flags & DISCARD == 0 {
                self.file.read_exact_at(&mut buf[..n], e.offset + ss + done)?;
            } else {
                buf[..n].fill(0);
            }
            dev.write_all_at(&buf[..n], e.sector * ss + done)?;
            done += n as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(buf: &mut Vec<u8>, ss: usize, sector: u64, nr: u64, flags: u64, mark: &[u8], data: &[u8]) {
        let mut head = vec![0u8; ss];
        for (i, v) in [sector, nr, flags, mark.len() as u64].iter().enumerate() {
            head[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        head[32..32 + mark.len()].copy_from_slice(mark);
        buf.extend_from_slice(&head);
        buf.extend_from_slice(data);
    }

    /// A log laid out as `dm-log-writes` writes it: a write of two sectors, a flush, a discard
    /// (no data follows it), a mark, a FUA write; read back and replayed.
    #[test]
    fn a_log_in_the_kernel_s_layout_is_read_and_replayed() {
        let ss = 512;
        let mut log = vec![0u8; ss];
        log[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        log[8..16].copy_from_slice(&VERSION.to_le_bytes());
        log[16..24].copy_from_slice(&5u64.to_le_bytes());
        log[24..28].copy_from_slice(&512u32.to_le_bytes());
        put(&mut log, ss, 2, 2, 0, b"", &[0xaa; 1024]);
        put(&mut log, ss, 0, 0, FLUSH, b"", &[]);
        put(&mut log, ss, 3, 1, DISCARD, b"", &[]);
        put(&mut log, ss, 0, 0, MARK, b"cold-done", &[]);
        put(&mut log, ss, 5, 1, FUA, b"", &[0xbb; 512]);
        let dir = std::env::temp_dir().join(format!("plvm-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("log"), &log).unwrap();
        std::fs::write(dir.join("dev"), vec![0x11u8; 8 * 512]).unwrap();
        let l = Log::open(dir.join("log").to_str().unwrap()).unwrap();
        let es = l.entries().unwrap();
        let kinds: Vec<_> = es.iter().map(Entry::kind).collect();
        assert_eq!(kinds, ["write", "flush", "discard", "mark", "fua"]);
        assert_eq!(es[3].mark.as_deref(), Some("cold-done"));
        assert_eq!(es[4].offset, 512 + 512 * 3 + 512 * 3);
        let dev = OpenOptions::new().write(true).open(dir.join("dev")).unwrap();
        for e in &es {
            l.apply(e, &dev).unwrap();
        }
        let got = std::fs::read(dir.join("dev")).unwrap();
        let sector = |i: usize| got[i * 512];
        assert_eq!(
            [sector(0), sector(1), sector(2), sector(3), sector(4), sector(5)],
            [0x11, 0x11, 0xaa, 0, 0x11, 0xbb]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
