//! The FUSE server: an in-memory filesystem over `model::Tree` that logs every operation.
//!
//! Attributes and entries are served with a zero time to live, so the kernel asks again each
//! time and never answers from a cache a tree that was swapped under it. Writes are
//! write-through (no writeback cache), so each `write(2)` reaches the log when it is made.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyWrite, Request, WriteFlags,
};

use crate::model::{Ino, Inode, Kind, Op, Tree};

/// What the server holds: the tree as it is, the tree it started from, and the log between.
#[derive(Default)]
pub struct State {
    /// The tree it started from.
    pub base: Tree,
    /// The tree now.
    pub tree: Tree,
    /// Every operation since `base`, in the order the server applied them.
    pub log: Vec<Op>,
}

impl State {
    /// A state starting from `tree`, with an empty log.
    pub fn from_tree(tree: Tree) -> State {
        State { base: tree.clone(), tree, log: Vec::new() }
    }

    fn push(&mut self, op: Op) {
        self.tree.apply(&op);
        self.log.push(op);
    }

    /// Writes a mark in the log: a boundary the harness names.
    pub fn mark(&mut self, label: &str) {
        self.log.push(Op::Mark(label.to_owned()));
    }
}

/// The filesystem, sharing its state with the harness.
pub struct PowerFs {
    state: Arc<Mutex<State>>,
}

/// The kernel caches nothing: every lookup and getattr comes back here.
const TTL: Duration = Duration::ZERO;

fn attr(ino: Ino, i: &Inode) -> FileAttr {
    let kind = match i.kind {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
    };
    FileAttr {
        ino: INodeNo(ino),
        size: i.data.len() as u64,
        blocks: (i.data.len() as u64).div_ceil(512),
        atime: i.mtime,
        mtime: i.mtime,
        ctime: i.ctime,
        crtime: i.ctime,
        kind,
        perm: (i.mode & 0o7777) as u16,
        nlink: i.nlink.max(1),
        uid: i.uid,
        gid: i.gid,
        rdev: 0,
        flags: 0,
        blksize: 4096,
    }
}

impl PowerFs {
    /// A filesystem over `state`.
    pub fn new(state: Arc<Mutex<State>>) -> PowerFs {
        PowerFs { state }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new entry `name` in `parent`: checks, births the inode, links it.
    fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        kind: Kind,
        mode: u32,
        target: Vec<u8>,
    ) -> Result<FileAttr, Errno> {
        let mut s = self.lock();
        if !s.tree.dirs.contains_key(&parent.0) {
            return Err(Errno::ENOTDIR);
        }
        if s.tree.lookup(parent.0, name).is_some() {
            return Err(Errno::EEXIST);
        }
        let ino = s.tree.next;
        s.push(Op::Birth { ino, kind, mode: mode & 0o7777, uid: req.uid(), gid: req.gid(), target });
        s.push(Op::Link { dir: parent.0, name: name.to_owned(), ino });
        Ok(attr(ino, &s.tree.inodes[&ino]))
    }
}

impl Filesystem for PowerFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let s = self.lock();
        match s.tree.lookup(parent.0, name) {
            Some(ino) => reply.entry(&TTL, &attr(ino, &s.tree.inodes[&ino]), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let s = self.lock();
        match s.tree.inodes.get(&ino.0) {
            Some(i) => reply.attr(&TTL, &attr(ino.0, i)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut s = self.lock();
        let Some(i) = s.tree.inodes.get(&ino.0) else { return reply.error(Errno::ENOENT) };
        let (old_uid, old_gid) = (i.uid, i.gid);
        if let Some(size) = size {
            s.push(Op::Truncate { ino: ino.0, size });
        }
        if uid.is_some() || gid.is_some() {
            s.push(Op::Chown { ino: ino.0, uid: uid.unwrap_or(old_uid), gid: gid.unwrap_or(old_gid) });
        }
        if let Some(mode) = mode {
            s.push(Op::Chmod { ino: ino.0, mode: mode & 0o7777 });
        }
        reply.attr(&TTL, &attr(ino.0, &s.tree.inodes[&ino.0]));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let s = self.lock();
        match s.tree.inodes.get(&ino.0) {
            Some(i) if i.kind == Kind::Symlink => reply.data(&i.data),
            Some(_) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        match self.make(req, parent, name, Kind::Dir, mode & !umask, Vec::new()) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = self.lock();
        match s.tree.lookup(parent.0, name) {
            Some(ino) if s.tree.inodes[&ino].kind == Kind::Dir => reply.error(Errno::EISDIR),
            Some(_) => {
                s.push(Op::Unlink { dir: parent.0, name: name.to_owned() });
                reply.ok()
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = self.lock();
        match s.tree.lookup(parent.0, name) {
            Some(ino) if s.tree.inodes[&ino].kind != Kind::Dir => reply.error(Errno::ENOTDIR),
            Some(ino) if !s.tree.dirs[&ino].is_empty() => reply.error(Errno::ENOTEMPTY),
            Some(_) => {
                s.push(Op::Unlink { dir: parent.0, name: name.to_owned() });
                reply.ok()
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        match self.make(req, parent, link_name, Kind::Symlink, 0o777, target.as_os_str().as_bytes().to_vec())
        {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut s = self.lock();
        let Some(src) = s.tree.lookup(parent.0, name) else { return reply.error(Errno::ENOENT) };
        if !s.tree.dirs.contains_key(&newparent.0) {
            return reply.error(Errno::ENOTDIR);
        }
        let dst = s.tree.lookup(newparent.0, newname);
        let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
        if exchange && dst.is_none() {
            return reply.error(Errno::ENOENT);
        }
        if flags.contains(RenameFlags::RENAME_NOREPLACE) && dst.is_some() {
            return reply.error(Errno::EEXIST);
        }
        if let (false, Some(dst)) = (exchange, dst) {
            let (sk, dk) = (s.tree.inodes[&src].kind, s.tree.inodes[&dst].kind);
            if dk == Kind::Dir && sk != Kind::Dir {
                return reply.error(Errno::EISDIR);
            }
            if sk == Kind::Dir && dk != Kind::Dir {
                return reply.error(Errno::ENOTDIR);
            }
            if dk == Kind::Dir && !s.tree.dirs[&dst].is_empty() && dst != src {
                return reply.error(Errno::ENOTEMPTY);
            }
        }
        s.push(Op::Rename {
            from_dir: parent.0,
            from: name.to_owned(),
            to_dir: newparent.0,
            to: newname.to_owned(),
            exchange,
        });
        reply.ok()
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let mut s = self.lock();
        if s.tree.lookup(newparent.0, newname).is_some() {
            return reply.error(Errno::EEXIST);
        }
        if !s.tree.inodes.contains_key(&ino.0) {
            return reply.error(Errno::ENOENT);
        }
        s.push(Op::Link { dir: newparent.0, name: newname.to_owned(), ino: ino.0 });
        reply.entry(&TTL, &attr(ino.0, &s.tree.inodes[&ino.0]), Generation(0));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut s = self.lock();
        if !s.tree.inodes.contains_key(&ino.0) {
            return reply.error(Errno::ENOENT);
        }
        if flags.0 & libc_o_trunc() != 0 {
            s.push(Op::Truncate { ino: ino.0, size: 0 });
        }
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let s = self.lock();
        let Some(i) = s.tree.inodes.get(&ino.0) else { return reply.error(Errno::ENOENT) };
        let start = (offset as usize).min(i.data.len());
        let end = (start + size as usize).min(i.data.len());
        reply.data(&i.data[start..end]);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut s = self.lock();
        if !s.tree.inodes.contains_key(&ino.0) {
            return reply.error(Errno::ENOENT);
        }
        s.push(Op::Write { ino: ino.0, off: offset, data: data.to_vec() });
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        self.lock().log.push(Op::Fsync { ino: ino.0, data_only: datasync });
        reply.ok();
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let s = self.lock();
        let Some(entries) = s.tree.dirs.get(&ino.0) else { return reply.error(Errno::ENOTDIR) };
        let mut all: Vec<(Ino, FileType, &OsStr)> = vec![
            (ino.0, FileType::Directory, OsStr::new(".")),
            (ino.0, FileType::Directory, OsStr::new("..")),
        ];
        for (name, child) in entries {
            let kind = match s.tree.inodes[child].kind {
                Kind::File => FileType::RegularFile,
                Kind::Dir => FileType::Directory,
                Kind::Symlink => FileType::Symlink,
            };
            all.push((*child, kind, name.as_os_str()));
        }
        for (n, (child, kind, name)) in all.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), n as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.lock().log.push(Op::Fsyncdir { ino: ino.0 });
        reply.ok();
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        match self.make(req, parent, name, Kind::File, mode & !umask, Vec::new()) {
            Ok(a) => reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }
}

/// `O_TRUNC` on Linux.
const fn libc_o_trunc() -> i32 {
    0o1000
}

/// A mounted `PowerFs`; unmounted when dropped.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    /// The state the server works on, shared with the harness.
    pub state: Arc<Mutex<State>>,
}

impl Mounted {
    /// Mounts a filesystem starting from `tree` at `at` (an empty directory).
    pub fn mount(at: &Path, tree: Tree) -> std::io::Result<Mounted> {
        let state = Arc::new(Mutex::new(State::from_tree(tree)));
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("powerloss".into()),
            fuser::MountOption::Subtype("powerloss".into()),
        ];
        config.acl = fuser::SessionACL::All;
        let session = fuser::spawn_mount(PowerFs::new(state.clone()), at, &config)?;
        Ok(Mounted { session: Some(session), state })
    }

    /// The state, locked.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Unmounts and waits for the server to stop.
    pub fn unmount(mut self) -> std::io::Result<()> {
        match self.session.take() {
            Some(s) => s.umount_and_join(),
            None => Ok(()),
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = s.umount_and_join();
        }
    }
}
