//! The filesystem as a log of operations, and the crash states that log allows.
//!
//! The live tree is the base tree with every operation applied. A crash state at a boundary
//! (the log's length at an fsync, an fsyncdir or a mark) is the base tree with only the
//! operations that were durable there applied, plus, for a random crash, a seeded subset of the
//! rest. Durability is POSIX-strict, as LazyFS and ALICE model it: a file's data and metadata
//! are durable at an fsync of that file (its data and size only at an fdatasync); a directory's
//! entries (a create, link, unlink or rename in it) at an fsync of that directory, and a rename
//! between two directories only once both are synced. Nothing else syncs: `syncfs(2)` never
//! reaches a FUSE server (the kernel sends `FUSE_SYNCFS` only for virtiofs), and a close or a
//! flush makes nothing durable.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::time::SystemTime;

/// An inode number; 1 is the root directory.
pub type Ino = u64;

/// The root directory's inode.
pub const ROOT: Ino = 1;

/// What an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symlink.
    Symlink,
}

/// One inode: its content and attributes.
#[derive(Clone, Debug)]
pub struct Inode {
    /// What it is.
    pub kind: Kind,
    /// A file's bytes, a symlink's target.
    pub data: Vec<u8>,
    /// Permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// How many entries name it.
    pub nlink: u32,
    /// Last change of anything about it.
    pub ctime: SystemTime,
    /// Last change of its content.
    pub mtime: SystemTime,
}

/// One operation, as the FUSE server saw it.
#[derive(Clone, Debug)]
pub enum Op {
    /// An inode made (by a create, mkdir or symlink), with its first attributes. It takes
    /// effect with the entry that names it: an inode no durable entry names is unreachable.
    Birth {
        /// Its number.
        ino: Ino,
        /// What it is.
        kind: Kind,
        /// Permission bits.
        mode: u32,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
        /// A symlink's target.
        target: Vec<u8>,
    },
    /// Bytes written at an offset.
    Write {
        /// The file.
        ino: Ino,
        /// Where.
        off: u64,
        /// What.
        data: Vec<u8>,
    },
    /// A new size.
    Truncate {
        /// The file.
        ino: Ino,
        /// Its size after.
        size: u64,
    },
    /// New permission bits.
    Chmod {
        /// The inode.
        ino: Ino,
        /// The bits.
        mode: u32,
    },
    /// A new owner.
    Chown {
        /// The inode.
        ino: Ino,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
    },
    /// An entry naming an inode (create, mkdir, symlink, link).
    Link {
        /// The directory.
        dir: Ino,
        /// The name.
        name: OsString,
        /// What it names.
        ino: Ino,
    },
    /// An entry removed (unlink, rmdir).
    Unlink {
        /// The directory.
        dir: Ino,
        /// The name.
        name: OsString,
    },
    /// A rename, kept or dropped as a unit.
    Rename {
        /// From this directory.
        from_dir: Ino,
        /// This name.
        from: OsString,
        /// To this directory.
        to_dir: Ino,
        /// This name.
        to: OsString,
        /// `RENAME_EXCHANGE`: the two entries swapped.
        exchange: bool,
    },
    /// `fsync(2)` (or `fdatasync(2)`) of a file.
    Fsync {
        /// The file.
        ino: Ino,
        /// Only the data and size (fdatasync).
        data_only: bool,
    },
    /// `fsync(2)` of a directory.
    Fsyncdir {
        /// The directory.
        ino: Ino,
    },
    /// A point the harness marks: what it says was reported done by then.
    Mark(String),
}

impl Op {
    /// Whether a crash state is taken here.
    pub fn is_boundary(&self) -> bool {
        matches!(self, Op::Fsync { .. } | Op::Fsyncdir { .. } | Op::Mark(_))
    }
}

/// A tree of inodes and directory entries.
#[derive(Clone, Debug)]
pub struct Tree {
    /// Every inode ever made (unreachable ones included).
    pub inodes: HashMap<Ino, Inode>,
    /// Each directory's entries.
    pub dirs: HashMap<Ino, BTreeMap<OsString, Ino>>,
    /// The next inode number to give.
    pub next: Ino,
}

impl Default for Tree {
    fn default() -> Tree {
        Tree::new()
    }
}

impl Tree {
    /// An empty root directory, 0755, root's.
    pub fn new() -> Tree {
        let now = SystemTime::now();
        let root = Inode {
            kind: Kind::Dir,
            data: Vec::new(),
            mode: 0o755,
            uid: 0,
            gid: 0,
            nlink: 2,
            ctime: now,
            mtime: now,
        };
        Tree {
            inodes: HashMap::from([(ROOT, root)]),
            dirs: HashMap::from([(ROOT, BTreeMap::new())]),
            next: 2,
        }
    }

    /// The inode `name` names in `dir`.
    pub fn lookup(&self, dir: Ino, name: &std::ffi::OsStr) -> Option<Ino> {
        self.dirs.get(&dir)?.get(name).copied()
    }

    fn unname(&mut self, ino: Ino) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.nlink = i.nlink.saturating_sub(1);
            i.ctime = SystemTime::now();
        }
    }

    fn name(&mut self, ino: Ino) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.nlink += 1;
            i.ctime = SystemTime::now();
        }
    }

    /// Applies one operation. What no longer makes sense in a crash state (a rename of an entry
    /// whose creation was lost, a write to an inode never born) is skipped, as a filesystem's
    /// recovery would leave it.
    pub fn apply(&mut self, op: &Op) {
        let now = SystemTime::now();
        match op {
            Op::Birth { ino, kind, mode, uid, gid, target } => {
                let inode = Inode {
                    kind: *kind,
                    data: target.clone(),
                    mode: *mode,
                    uid: *uid,
                    gid: *gid,
                    nlink: 0,
                    ctime: now,
                    mtime: now,
                };
                self.inodes.insert(*ino, inode);
                if *kind == Kind::Dir {
                    self.dirs.insert(*ino, BTreeMap::new());
                }
                self.next = self.next.max(ino + 1);
            }
            Op::Write { ino, off, data } => {
                if let Some(i) = self.inodes.get_mut(ino) {
                    let off = *off as usize;
                    if i.data.len() < off + data.len() {
                        i.data.resize(off + data.len(), 0);
                    }
                    i.data[off..off + data.len()].copy_from_slice(data);
                    i.mtime = now;
                    i.ctime = now;
                }
            }
            Op::Truncate { ino, size } => {
                if let Some(i) = self.inodes.get_mut(ino) {
                    i.data.resize(*size as usize, 0);
                    i.mtime = now;
                    i.ctime = now;
                }
            }
            Op::Chmod { ino, mode } => {
                if let Some(i) = self.inodes.get_mut(ino) {
                    i.mode = *mode;
                    i.ctime = now;
                }
            }
            Op::Chown { ino, uid, gid } => {
                if let Some(i) = self.inodes.get_mut(ino) {
                    i.uid = *uid;
                    i.gid = *gid;
                    i.ctime = now;
                }
            }
            Op::Link { dir, name, ino } => {
                if !self.inodes.contains_key(ino) || !self.dirs.contains_key(dir) {
                    return;
                }
                let old = self.dirs.get_mut(dir).and_then(|d| d.insert(name.clone(), *ino));
                if let Some(old) = old {
                    self.unname(old);
                }
                self.name(*ino);
            }
            Op::Unlink { dir, name } => {
                if let Some(old) = self.dirs.get_mut(dir).and_then(|d| d.remove(name)) {
                    self.unname(old);
                }
            }
            Op::Rename { from_dir, from, to_dir, to, exchange } => {
                let Some(src) = self.lookup(*from_dir, from) else { return };
                if !self.dirs.contains_key(to_dir) {
                    return;
                }
                if *exchange {
                    let Some(dst) = self.lookup(*to_dir, to) else { return };
                    self.dirs.get_mut(from_dir).map(|d| d.insert(from.clone(), dst));
                    self.dirs.get_mut(to_dir).map(|d| d.insert(to.clone(), src));
                } else {
                    self.dirs.get_mut(from_dir).map(|d| d.remove(from));
                    let old = self.dirs.get_mut(to_dir).and_then(|d| d.insert(to.clone(), src));
                    if let Some(old) = old.filter(|o| *o != src) {
                        self.unname(old);
                    }
                }
                if let Some(i) = self.inodes.get_mut(&src) {
                    i.ctime = now;
                }
            }
            Op::Fsync { .. } | Op::Fsyncdir { .. } | Op::Mark(_) => {}
        }
    }
}

/// How a crash state treats what was written but not yet durable at its boundary.
#[derive(Clone, Copy, Debug)]
pub enum Crash {
    /// All of it lost.
    DropAll,
    /// A seeded subset kept, as SQLite's crash VFS does: each pending write or attribute change
    /// of a file kept or not on its own, and in each directory a prefix of its pending entry
    /// changes (a journalling filesystem commits a directory's changes in order; a rename is one
    /// change, kept or lost whole).
    Random(u64),
}

/// A small, seeded pseudo-random generator (xorshift64*): the crash states of a seed are the
/// same on every run, so a failure can be replayed.
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (any value).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next value.
    pub fn draw(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value below `n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.draw() % n
    }
}

/// What an operation's durability waits for.
enum Needs {
    /// An fsync of this inode after it (`true`: an fdatasync is enough).
    File(Ino, bool),
    /// An fsync of this directory after it (and of the second one too, for a rename across).
    Dirs(Ino, Option<Ino>),
    /// Nothing: it takes effect with what names it (a birth), or it changes nothing.
    Nothing,
}

fn needs(op: &Op) -> Needs {
    match op {
        Op::Write { ino, .. } | Op::Truncate { ino, .. } => Needs::File(*ino, true),
        Op::Chmod { ino, .. } | Op::Chown { ino, .. } => Needs::File(*ino, false),
        Op::Link { dir, .. } | Op::Unlink { dir, .. } => Needs::Dirs(*dir, None),
        Op::Rename { from_dir, to_dir, .. } => {
            Needs::Dirs(*to_dir, (from_dir != to_dir).then_some(*from_dir))
        }
        Op::Birth { .. } | Op::Fsync { .. } | Op::Fsyncdir { .. } | Op::Mark(_) => Needs::Nothing,
    }
}

/// The crash state at `boundary` (how many operations of `log` had happened): `base` with the
/// durable operations applied, and, for `Crash::Random`, a seeded subset of the others.
pub fn crash_state(base: &Tree, log: &[Op], boundary: usize, crash: Crash) -> Tree {
    let log = &log[..boundary];
    // Walking back from the boundary: what has been synced after each operation.
    let mut synced_full: HashSet<Ino> = HashSet::new();
    let mut synced_data: HashSet<Ino> = HashSet::new();
    let mut synced_dirs: HashSet<Ino> = HashSet::new();
    let mut durable = vec![false; log.len()];
    for (i, op) in log.iter().enumerate().rev() {
        match op {
            Op::Fsync { ino, data_only } => {
                synced_data.insert(*ino);
                if !data_only {
                    synced_full.insert(*ino);
                }
            }
            Op::Fsyncdir { ino } => {
                // An fsync of a directory makes its entries durable and, as of any inode, its
                // own attributes (a chmod or chown of the directory itself): the kernel sends
                // FUSE_FSYNCDIR, never FUSE_FSYNC, for a directory's descriptor, so without
                // this a directory's mode could never be made durable here.
                synced_dirs.insert(*ino);
                synced_full.insert(*ino);
            }
            _ => {}
        }
        durable[i] = match needs(op) {
            Needs::File(ino, data_ok) => {
                synced_full.contains(&ino) || (data_ok && synced_data.contains(&ino))
            }
            Needs::Dirs(a, b) => synced_dirs.contains(&a) && b.is_none_or(|b| synced_dirs.contains(&b)),
            Needs::Nothing => true,
        };
    }
    if let Crash::Random(seed) = crash {
        let mut rng = Rng::new(seed);
        // Each directory's pending entry changes: how many of them (a prefix) survive.
        let mut pending_in: HashMap<Ino, usize> = HashMap::new();
        for (i, op) in log.iter().enumerate() {
            if let (false, Needs::Dirs(dir, _)) = (durable[i], needs(op)) {
                *pending_in.entry(dir).or_default() += 1;
            }
        }
        let mut keep_in: HashMap<Ino, usize> =
            pending_in.iter().map(|(d, n)| (*d, rng.below(*n as u64 + 1) as usize)).collect();
        for (i, op) in log.iter().enumerate() {
            if durable[i] {
                continue;
            }
            match needs(op) {
                Needs::File(..) => durable[i] = rng.below(2) == 0,
                Needs::Dirs(dir, _) => {
                    let left = keep_in.entry(dir).or_default();
                    if *left > 0 {
                        *left -= 1;
                        durable[i] = true;
                    }
                }
                Needs::Nothing => {}
            }
        }
    }
    let mut tree = base.clone();
    for (op, keep) in log.iter().zip(durable) {
        if keep {
            tree.apply(op);
        }
    }
    tree
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(tree: &Tree, name: &str) -> Option<Vec<u8>> {
        let ino = tree.lookup(ROOT, std::ffi::OsStr::new(name))?;
        Some(tree.inodes[&ino].data.clone())
    }

    #[test]
    fn only_what_was_synced_survives_a_crash() {
        let base = Tree::new();
        let born = |ino| Op::Birth { ino, kind: Kind::File, mode: 0o600, uid: 0, gid: 0, target: vec![] };
        let log = vec![
            born(2),
            Op::Link { dir: ROOT, name: "a".into(), ino: 2 },
            Op::Write { ino: 2, off: 0, data: b"old".to_vec() },
            Op::Fsync { ino: 2, data_only: false },
            Op::Fsyncdir { ino: ROOT },
            born(3),
            Op::Link { dir: ROOT, name: ".a.tmp".into(), ino: 3 },
            Op::Write { ino: 3, off: 0, data: b"new".to_vec() },
            Op::Rename {
                from_dir: ROOT,
                from: ".a.tmp".into(),
                to_dir: ROOT,
                to: "a".into(),
                exchange: false,
            },
            Op::Fsyncdir { ino: ROOT },
        ];
        // The rename is durable, the data is not: the name holds an empty file (what a
        // missing fsync before a rename costs).
        let torn = crash_state(&base, &log, log.len(), Crash::DropAll);
        assert_eq!(file(&torn, "a").unwrap(), b"");
        let before = crash_state(&base, &log, 5, Crash::DropAll);
        assert_eq!(file(&before, "a").unwrap(), b"old");
        assert_eq!(file(&before, ".a.tmp"), None);
        for seed in 0..20 {
            let t = crash_state(&base, &log, 9, Crash::Random(seed));
            let a = file(&t, "a").unwrap();
            assert!(a == b"old" || a == b"new" || a.is_empty(), "{a:?}");
        }
    }

    #[test]
    fn a_directory_s_mode_is_durable_after_an_fsync_of_the_directory() {
        let base = Tree::new();
        let log = vec![
            Op::Birth { ino: 2, kind: Kind::Dir, mode: 0o755, uid: 0, gid: 0, target: vec![] },
            Op::Link { dir: ROOT, name: "d".into(), ino: 2 },
            Op::Fsyncdir { ino: ROOT },
            Op::Chmod { ino: 2, mode: 0o775 },
            Op::Fsyncdir { ino: 2 },
        ];
        let mode = |t: &Tree| t.inodes[&t.lookup(ROOT, std::ffi::OsStr::new("d")).unwrap()].mode & 0o7777;
        // Not yet synced: the chmod is lost with a crash; synced, it survives.
        assert_eq!(mode(&crash_state(&base, &log, 4, Crash::DropAll)), 0o755);
        assert_eq!(mode(&crash_state(&base, &log, 5, Crash::DropAll)), 0o775);
    }
}
