//! Who wrote a path, through fanotify: the kernel hands over the writer's pid with each event,
//! and the writer is looked at in `/proc` at once (it may exit a moment later). This watcher
//! sends no [`crate::Change`]: inotify (`file.rs`) still says *that* a path moved; this one only
//! keeps, for each path of interest, the latest writer it saw, for the owner to take when it
//! corrects the path.
//!
//! The group is `FAN_CLASS_NOTIF` with `FAN_REPORT_FID | FAN_REPORT_DFID_NAME` (Linux 5.9):
//! each event names the directory (by its file handle) and the entry's name, so that a write in
//! place, a chmod or chown, and a directory-entry change (an editor's rename over the path, a
//! delete, a create) are all seen, on marks made on the paths' parent directories only. It needs
//! `CAP_SYS_ADMIN`; without it (or on a kernel without fanotify, or a filesystem without file
//! handles) [`Writers::start`] fails and the owner attributes every change to no one known.
//!
//! The agent's own writes are never attributed: events whose pid is this process are dropped.

// fanotify has no safe wrapper in the crates this workspace already takes (nix 0.30 has no
// FID reporting, rustix none at all): the four calls below are raw `libc` ones, each with
// the reason it is sound beside it. Everything read from the kernel is parsed from bytes.
#![allow(unsafe_code)]

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::io::{self, Read as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::PathSet;

/// What the writer did, as the event said it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moved {
    /// The content was written (`FAN_MODIFY`, `FAN_CLOSE_WRITE`).
    Content,
    /// Mode, owner or another attribute (`FAN_ATTRIB`).
    Attributes,
    /// The directory entry: created, removed, or renamed over or away (`FAN_CREATE`,
    /// `FAN_DELETE`, `FAN_MOVED_TO`, `FAN_MOVED_FROM`).
    Entry,
}

impl Moved {
    /// The word for it: `content`, `attributes`, `entry`.
    pub fn as_str(self) -> &'static str {
        match self {
            Moved::Content => "content",
            Moved::Attributes => "attributes",
            Moved::Entry => "entry",
        }
    }
}

/// The process that made a change, as it was when the event was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Writer {
    /// The pid the kernel gave with the event.
    pub pid: i32,
    /// `/proc/PID/comm`.
    pub comm: Option<String>,
    /// `/proc/PID/exe`.
    pub exe: Option<PathBuf>,
    /// The effective uid (`/proc/PID/status`).
    pub uid: Option<u32>,
    /// Its name, from `/etc/passwd`.
    pub user: Option<String>,
    /// The audit login uid, when the process descends from a login (`/proc/PID/loginuid`).
    pub loginuid: Option<u32>,
    /// The audit session id, when there is one (`/proc/PID/sessionid`).
    pub session: Option<u32>,
    /// The systemd unit its cgroup is (`cron.service`, `session-3.scope`), not a container's.
    pub unit: Option<String>,
    /// The id of the Docker or Podman container its cgroup is (`docker-<id>.scope`,
    /// `libpod-<id>.scope`, `/docker/<id>`): the owner may name it.
    pub container: Option<String>,
    /// The process had exited before it could be looked at: only the pid is known.
    pub exited: bool,
    /// What the event said was changed.
    pub moved: Moved,
    /// When the event was read.
    pub at: SystemTime,
    /// The same, on the monotonic clock.
    pub seen: Instant,
}

impl Writer {
    /// The kind of writer, for a metric's label: `container`, `session` (a login's: its session
    /// scope, or, where logind makes none, an audit session id), `unit` (any other systemd unit)
    /// or `unknown`. Never a name or a pid.
    ///
    /// The audit session comes before the unit: a login on a machine without logind (sshd's
    /// children in `sshd.service`) is a person's session, and a unit's own processes have none,
    /// since PID 1 has no login uid to hand down.
    pub fn kind(&self) -> WriterKind {
        if self.container.is_some() {
            WriterKind::Container
        } else if self.unit.as_deref().is_some_and(|u| u.starts_with("session-") && u.ends_with(".scope"))
            || self.session.is_some()
        {
            WriterKind::Session
        } else if self.unit.is_some() {
            WriterKind::Unit
        } else {
            WriterKind::Unknown
        }
    }
}

/// The kinds of writer ([`Writer::kind`]), and `Unknown` also for a change with no writer: the
/// `writer` label of the correction counter, a closed set so that the counter is made at 0 for
/// each (`ALL`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WriterKind {
    /// A login's process: its session scope, or its audit session.
    Session,
    /// A process of any other systemd unit.
    Unit,
    /// A process in a container.
    Container,
    /// Nothing more is known (or no writer at all).
    #[default]
    Unknown,
}

impl WriterKind {
    /// Every kind, in the order the metric lists them.
    pub const ALL: [WriterKind; 4] =
        [WriterKind::Session, WriterKind::Unit, WriterKind::Container, WriterKind::Unknown];

    /// The label's word.
    pub fn as_str(self) -> &'static str {
        match self {
            WriterKind::Session => "session",
            WriterKind::Unit => "unit",
            WriterKind::Container => "container",
            WriterKind::Unknown => "unknown",
        }
    }

    /// The kind a word names (`as_str`'s), if any.
    pub fn named(word: &str) -> Option<WriterKind> {
        WriterKind::ALL.into_iter().find(|k| k.as_str() == word)
    }
}

/// What the reading thread shares with the owner.
struct Shared {
    /// The paths to keep a writer for, shared with the file watcher (`Writers::set_paths`).
    interest: Mutex<Arc<PathSet>>,
    /// Marked directories by their file handle (type and bytes).
    dirs: Mutex<HashMap<Box<[u8]>, Arc<Path>>>,
    /// Marked directories that were removed: their mark is gone.
    lost: Mutex<Vec<Arc<Path>>>,
    /// The latest writer of each path of interest; at most one per managed path.
    latest: Mutex<HashMap<PathBuf, Writer>>,
    /// Woken when a writer is kept.
    kept: Condvar,
    /// Muted paths (`Writers::mute`).
    muted: Mutex<HashMap<PathBuf, Mute>>,
    /// The last writer `take` gave, and of which path: kept with a mute that follows it.
    taken: Mutex<Option<(PathBuf, Writer)>>,
    stop: AtomicBool,
}

/// One muted path: an ignore mark on its inode until `until`, then, for `GRACE`, its writer.
struct Mute {
    until: Instant,
    /// The file marked (opened read-only): the mark is removed through it, so it is removed
    /// from that inode even when another is at the path by then. `None` once removed.
    file: Option<std::fs::File>,
    /// Its device and inode, to tell a second mute of the same file from one of a new file.
    inode: (u64, u64),
    /// The writer of the change that began the contest: the kernel says nothing of writes to
    /// the file while it is muted, and whoever fights the agent over it is taken to be the one
    /// still writing it.
    writer: Option<Writer>,
}

/// How long a mute's writer is kept after the mark is removed: the key's retry at the end of
/// its hold, and that correction's question of who wrote it, come just after.
const GRACE: Duration = Duration::from_secs(1);

/// What a mute ignores: the writes and attribute changes of the file itself. Directory-entry
/// changes (a rename over the path) are events of the directory and are still seen.
const IGNORED: u64 = libc::FAN_MODIFY | libc::FAN_ATTRIB | libc::FAN_CLOSE_WRITE;

/// Keeps the latest writer of each path of interest.
pub struct Writers {
    fd: Arc<OwnedFd>,
    shared: Arc<Shared>,
    /// Directories marked: the file watcher's own names of them (`set_paths`), one copy for
    /// both watchers.
    marked: HashSet<Arc<Path>>,
    /// Directories wanted and not marked.
    pending: HashSet<Arc<Path>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

const MASK: u64 = libc::FAN_MODIFY
    | libc::FAN_ATTRIB
    | libc::FAN_CLOSE_WRITE
    | libc::FAN_MOVED_FROM
    | libc::FAN_MOVED_TO
    | libc::FAN_CREATE
    | libc::FAN_DELETE
    | libc::FAN_DELETE_SELF
    | libc::FAN_EVENT_ON_CHILD
    | libc::FAN_ONDIR;

impl Writers {
    /// Makes the fanotify group and starts the thread that reads it. Fails without
    /// `CAP_SYS_ADMIN` (`EPERM`), on a kernel without fanotify or FID reporting (`ENOSYS`,
    /// `EINVAL`): the error says which.
    ///
    /// `CAP_SYS_ADMIN` is checked before the group is asked for: Linux 5.13 and later give a
    /// group to a process without it, but one whose events carry pid 0 for every other
    /// process's change, which would name every writer as a pid 0 that had exited.
    pub fn start() -> io::Result<Writers> {
        if !may_see_pids() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "this process has no CAP_SYS_ADMIN, without which fanotify gives no writer's pid",
            ));
        }
        let flags = libc::FAN_CLASS_NOTIF
            | libc::FAN_CLOEXEC
            | libc::FAN_NONBLOCK
            | libc::FAN_REPORT_FID
            | libc::FAN_REPORT_DFID_NAME;
        let event_flags = (libc::O_RDONLY | libc::O_CLOEXEC) as libc::c_uint;
        // SAFETY: fanotify_init takes two integers and returns a new descriptor or -1; nothing
        // is borrowed.
        let raw = unsafe { libc::fanotify_init(flags, event_flags) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor fanotify_init just returned, owned by nothing else.
        let fd = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
        let shared = Arc::new(Shared {
            interest: Mutex::new(Arc::default()),
            dirs: Mutex::new(HashMap::new()),
            lost: Mutex::new(Vec::new()),
            latest: Mutex::new(HashMap::new()),
            kept: Condvar::new(),
            muted: Mutex::new(HashMap::new()),
            taken: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let (thread_fd, thread_shared) = (Arc::clone(&fd), Arc::clone(&shared));
        let thread = std::thread::Builder::new()
            .name("fanotify".into())
            .spawn(move || read_loop(&thread_fd, &thread_shared))?;
        Ok(Writers { fd, shared, marked: HashSet::new(), pending: HashSet::new(), thread: Some(thread) })
    }

    /// Keeps writers for exactly the paths of `interest` from now on, marking `dirs`, their
    /// parent directories. Both as the file watcher holds them (`FileWatcher::interest`,
    /// `FileWatcher::dirs`): one copy for both watchers. Returns the directories that could not
    /// be marked (absent, or on a filesystem without file handles); `rewatch` tries them again.
    pub fn set_paths(
        &mut self,
        interest: Arc<PathSet>,
        dirs: impl IntoIterator<Item = Arc<Path>>,
    ) -> Vec<(PathBuf, io::Error)> {
        let wanted: HashSet<Arc<Path>> = dirs.into_iter().collect();
        *lock(&self.shared.interest) = interest;
        {
            let interest = lock(&self.shared.interest);
            lock(&self.shared.latest).retain(|p, _| interest.contains(p));
            lock(&self.shared.muted).retain(|p, m| {
                let keep = interest.contains(p);
                if !keep {
                    unignore(&self.fd, m);
                }
                keep
            });
        }
        for dir in self.marked.iter().filter(|d| !wanted.contains(*d)) {
            let _ = self.mark(libc::FAN_MARK_REMOVE, dir);
        }
        self.marked.retain(|d| wanted.contains(d));
        lock(&self.shared.dirs).retain(|_, d| wanted.contains(d));
        self.pending = wanted.into_iter().filter(|d| !self.marked.contains(d)).collect();
        self.mark_pending()
    }

    /// Marks again the directories whose mark was lost (removed and made again) or could not
    /// be made before. Cheap when there is nothing to do.
    pub fn rewatch(&mut self) -> Vec<(PathBuf, io::Error)> {
        for dir in std::mem::take(&mut *lock(&self.shared.lost)) {
            if self.marked.remove(&dir) {
                self.pending.insert(dir);
            }
        }
        if self.pending.is_empty() {
            return Vec::new();
        }
        self.mark_pending()
    }

    fn mark_pending(&mut self) -> Vec<(PathBuf, io::Error)> {
        let mut failed = Vec::new();
        for dir in std::mem::take(&mut self.pending) {
            let marked = handle_of(&dir).and_then(|h| {
                self.mark(libc::FAN_MARK_ADD, &dir)?;
                Ok(h)
            });
            match marked {
                Ok(handle) => {
                    lock(&self.shared.dirs).insert(handle.into_boxed_slice(), Arc::clone(&dir));
                    self.marked.insert(dir);
                }
                Err(e) => {
                    failed.push((dir.to_path_buf(), e));
                    self.pending.insert(dir);
                }
            }
        }
        failed
    }

    fn mark(&self, how: libc::c_uint, dir: &Path) -> io::Result<()> {
        let path = CString::new(dir.as_os_str().as_bytes())?;
        // SAFETY: the group's descriptor is alive (self holds it) and `path` is a NUL-ended
        // string that outlives the call; the kernel only reads it.
        let r = unsafe { libc::fanotify_mark(self.fd.as_raw_fd(), how, MASK, libc::AT_FDCWD, path.as_ptr()) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Asks the kernel to say nothing of writes to the file at `path` until `until`
    /// (`Taker::mute`, which says more).
    pub fn mute(&self, path: &Path, until: Instant) -> io::Result<()> {
        self.taker().mute(path, until)
    }

    /// How many paths are muted now, ignore mark in place.
    pub fn muted(&self) -> usize {
        lock(&self.shared.muted).values().filter(|m| m.file.is_some()).count()
    }

    /// Takes the latest writer of `path` seen since `since` (`Taker::take`, which says more).
    pub fn take(&self, path: &Path, since: Instant, wait: Duration) -> Option<Writer> {
        self.taker().take(path, since, wait)
    }

    /// A handle that takes writers and mutes paths from another thread than the one that owns
    /// the marks, in the order that thread asks.
    pub fn taker(&self) -> Taker {
        Taker { fd: Arc::clone(&self.fd), shared: Arc::clone(&self.shared) }
    }

    /// How many directories are marked.
    pub fn marked(&self) -> usize {
        self.marked.len()
    }
}

/// What [`Writers::taker`] hands out: `take` and `mute` of the same group, for a thread of the
/// caller's (the daemon asks who made each drift on a thread of its own, so the next correction
/// never waits for fanotify). A mute keeps the writer last taken for its path, so a caller
/// that takes and mutes on two threads should do both through one taker, in order.
#[derive(Clone)]
pub struct Taker {
    fd: Arc<OwnedFd>,
    shared: Arc<Shared>,
}

impl Taker {
    /// Takes the latest writer of `path` seen since `since`, waiting up to `wait` for one if
    /// none is kept yet (the event and inotify's leave the kernel together, but are read on two
    /// threads). An older one is dropped: it belongs to a change that needed no correction.
    /// While the path is muted (and for a second after), the writer kept with the mute is given
    /// when no newer one is: the kernel said nothing of writes meanwhile.
    pub fn take(&self, path: &Path, since: Instant, wait: Duration) -> Option<Writer> {
        let got = self.take_seen(path, since, wait);
        if let Some(w) = &got {
            *lock(&self.shared.taken) = Some((path.to_path_buf(), w.clone()));
        }
        got
    }

    fn take_seen(&self, path: &Path, since: Instant, wait: Duration) -> Option<Writer> {
        let deadline = Instant::now() + wait;
        let mut latest = lock(&self.shared.latest);
        loop {
            if let Some(w) = latest.remove(path) {
                if w.seen >= since {
                    return Some(w);
                }
            }
            if let Some(w) = lock(&self.shared.muted).get(path).and_then(|m| m.writer.clone()) {
                return Some(w);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            latest = self.shared.kept.wait_timeout(latest, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Asks the kernel to say nothing of writes to the file at `path` until `until` (an ignore
    /// mark on its inode, `FAN_MARK_IGNORED_SURV_MODIFY`): a writer rewriting it as fast as it
    /// can then wakes no thread of this process. Meant for a path its owner holds anyway, and
    /// only for a regular file of interest; a later mute of the same file extends this one.
    /// Until shortly after the mute ends, `take` gives the writer last taken for the path.
    pub fn mute(&self, path: &Path, until: Instant) -> io::Result<()> {
        if !lock(&self.shared.interest).contains(path) {
            return Ok(());
        }
        use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
        #[allow(
            clippy::disallowed_methods,
            reason = "read-only, following no link and never blocking, only to name the inode to fanotify; nothing is read"
        )]
        let file = std::fs::OpenOptions::new()
            .read(true)
            // Not `O_PATH`: fanotify_mark refuses such a descriptor (EBADF). `O_NONBLOCK` so
            // that a FIFO planted at the path does not hold the agent; it is not marked.
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Ok(());
        }
        let inode = (meta.dev(), meta.ino());
        let mut muted = lock(&self.shared.muted);
        if let Some(m) = muted.get_mut(path) {
            if m.inode == inode && m.file.is_some() {
                m.until = until;
                return Ok(());
            }
            unignore(&self.fd, m);
        }
        ignore(
            &self.fd,
            libc::FAN_MARK_ADD | libc::FAN_MARK_IGNORED_MASK | libc::FAN_MARK_IGNORED_SURV_MODIFY,
            &file,
        )?;
        let writer = match lock(&self.shared.taken).take() {
            Some((p, w)) if p == path => Some(w),
            _ => muted.get_mut(path).and_then(|m| m.writer.take()),
        };
        muted.insert(path.to_path_buf(), Mute { until, file: Some(file), inode, writer });
        Ok(())
    }
}

impl Drop for Writers {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Adds or removes the ignore mark of a mute on `file`'s inode.
fn ignore(group: &OwnedFd, how: libc::c_uint, file: &std::fs::File) -> io::Result<()> {
    // SAFETY: both descriptors are alive for the call (borrowed); a null path with a
    // descriptor marks the descriptor's own inode, and the kernel reads nothing else.
    let r =
        unsafe { libc::fanotify_mark(group.as_raw_fd(), how, IGNORED, file.as_raw_fd(), std::ptr::null()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Removes a mute's ignore mark, if it is still there.
fn unignore(group: &OwnedFd, m: &mut Mute) {
    if let Some(file) = m.file.take() {
        let _ = ignore(group, libc::FAN_MARK_REMOVE | libc::FAN_MARK_IGNORED_MASK, &file);
    }
}

/// Ends the mutes that are due (their marks removed), and forgets them after `GRACE`; when
/// the next one is due.
fn end_mutes(group: &OwnedFd, shared: &Shared) -> Option<Instant> {
    let mut muted = lock(&shared.muted);
    let now = Instant::now();
    let mut next: Option<Instant> = None;
    muted.retain(|_, m| {
        if m.file.is_some() {
            if m.until <= now {
                unignore(group, m);
            } else {
                next = Some(next.map_or(m.until, |n| n.min(m.until)));
                return true;
            }
        }
        m.until + GRACE > now
    });
    next
}

/// Whether this process has `CAP_SYS_ADMIN` in effect (`/proc/self/status`, `CapEff`).
fn may_see_pids() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let caps = s.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(caps.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `name_to_handle_at`'s buffer: a `struct file_handle` with room for the largest handle.
#[repr(C)]
struct Handle {
    bytes: libc::c_uint,
    kind: libc::c_int,
    data: [u8; 128],
}

/// A directory's file handle, as fanotify reports it: its type then its bytes.
fn handle_of(dir: &Path) -> io::Result<Vec<u8>> {
    let path = CString::new(dir.as_os_str().as_bytes())?;
    let mut h = Handle { bytes: 128, kind: 0, data: [0; 128] };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `h` is a `struct file_handle` whose `handle_bytes` says the room behind it (128,
    // MAX_HANDLE_SZ); `path` and `mount_id` are valid for the call. The kernel writes at most
    // that much.
    let r = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            path.as_ptr(),
            std::ptr::from_mut(&mut h).cast::<libc::file_handle>(),
            &mut mount_id,
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = (h.bytes as usize).min(128);
    Ok(handle_key(h.kind, &h.data[..n]))
}

fn handle_key(kind: i32, bytes: &[u8]) -> Vec<u8> {
    let mut key = kind.to_ne_bytes().to_vec();
    key.extend_from_slice(bytes);
    key
}

/// Reads events until told to stop, keeping the writer of each path of interest.
fn read_loop(fd: &OwnedFd, shared: &Shared) {
    let mut file = std::fs::File::from(match fd.try_clone() {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(error = %e, "fanotify: cannot read events; writers are unknown");
            return;
        }
    });
    let me = std::process::id() as i32;
    let mut buf = vec![0u8; 64 * 1024];
    // The last process looked at: a writer rewriting a file as fast as it can is looked at
    // once a second, not at every write.
    let mut recent: Option<Writer> = None;
    while !shared.stop.load(Ordering::Relaxed) {
        // A mute's mark is removed when it is due, not up to the 200 ms the stop check allows.
        let timeout = end_mutes(fd, shared).map_or(200, |at| {
            let left = at.saturating_duration_since(Instant::now()).as_millis() + 1;
            i32::try_from(left.min(200)).unwrap_or(200)
        });
        let mut poll = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, for the length given; the descriptor is alive (`fd` is
        // borrowed for the whole loop).
        let ready = unsafe { libc::poll(&mut poll, 1, timeout) };
        if ready <= 0 {
            continue;
        }
        let n = match file.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {
                continue
            }
            Err(e) => {
                tracing::warn!(error = %e, "fanotify: reading events failed; writers are unknown from now on");
                return;
            }
        };
        for event in parse(&buf[..n]) {
            // Pid 0 is no writer: it is what a group without CAP_SYS_ADMIN is given for another
            // process's change (`start` refuses to make one, should the capability go).
            if event.pid == me || event.pid <= 0 {
                continue;
            }
            if event.mask & libc::FAN_Q_OVERFLOW != 0 {
                tracing::debug!("fanotify: the queue overflowed; some writers are unknown");
                continue;
            }
            let dir = lock(&shared.dirs).get(event.dir.as_slice()).cloned();
            let Some(dir) = dir else { continue };
            if event.name.is_empty() || event.name == b"." {
                if event.mask & libc::FAN_DELETE_SELF != 0 {
                    lock(&shared.lost).push(dir);
                }
                continue;
            }
            let path = dir.join(std::ffi::OsString::from_vec(event.name));
            if !lock(&shared.interest).contains(&path) {
                continue;
            }
            let moved = if event.mask & (libc::FAN_MODIFY | libc::FAN_CLOSE_WRITE) != 0 {
                Moved::Content
            } else if event.mask & libc::FAN_ATTRIB != 0 {
                Moved::Attributes
            } else {
                Moved::Entry
            };
            let writer = match recent.as_ref() {
                Some(w) if w.pid == event.pid && w.seen.elapsed() < Duration::from_secs(1) && !w.exited => {
                    Writer { moved, at: SystemTime::now(), seen: Instant::now(), ..w.clone() }
                }
                _ => look_at(event.pid, moved),
            };
            recent = Some(writer.clone());
            lock(&shared.latest).insert(path, writer);
            shared.kept.notify_all();
        }
    }
}

/// One event, as much of it as is used.
struct Event {
    mask: u64,
    pid: i32,
    /// The directory's handle (type and bytes), from the DFID_NAME record.
    dir: Vec<u8>,
    /// The entry's name in it.
    name: Vec<u8>,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Parses a read's bytes: `fanotify_event_metadata` (24 bytes: event_len u32, vers u8,
/// reserved u8, metadata_len u16, mask u64, fd i32, pid i32), then info records, each a header
/// (type u8, pad u8, len u16), the fsid (8 bytes) and a `file_handle` (bytes u32, type i32,
/// the handle), and for `DFID_NAME` the entry's name, NUL-ended.
fn parse(buf: &[u8]) -> Vec<Event> {
    let mut events = Vec::new();
    let mut at = 0;
    while let (Some(len), Some(meta_len)) = (u32_at(buf, at), u16_at(buf, at + 6)) {
        let len = len as usize;
        if len < 24 || at + len > buf.len() || buf.get(at + 4) != Some(&libc::FANOTIFY_METADATA_VERSION) {
            break;
        }
        let event = &buf[at..at + len];
        let (Some(mask), Some(pid)) = (u64_at(event, 8), u32_at(event, 20)) else { break };
        let mut e = Event { mask, pid: pid as i32, dir: Vec::new(), name: Vec::new() };
        let mut r = meta_len as usize;
        while let (Some(&kind), Some(rlen)) = (event.get(r), u16_at(event, r + 2)) {
            let rlen = rlen as usize;
            if rlen < 4 || r + rlen > event.len() {
                break;
            }
            let record = &event[r..r + rlen];
            if kind == libc::FAN_EVENT_INFO_TYPE_DFID_NAME
                || (kind == libc::FAN_EVENT_INFO_TYPE_FID && e.dir.is_empty())
            {
                // header 4, fsid 8, then the handle.
                if let (Some(hbytes), Some(htype)) = (u32_at(record, 12), u32_at(record, 16)) {
                    let start = 20;
                    let end = start + hbytes as usize;
                    if let Some(handle) = record.get(start..end) {
                        e.dir = handle_key(htype as i32, handle);
                        e.name = if kind == libc::FAN_EVENT_INFO_TYPE_DFID_NAME {
                            let rest = &record[end..];
                            rest[..rest.iter().position(|&c| c == 0).unwrap_or(rest.len())].to_vec()
                        } else {
                            Vec::new()
                        };
                    }
                }
            }
            r += rlen;
        }
        events.push(e);
        at += len;
    }
    events
}

/// Looks at the process behind a pid in `/proc`, at once.
fn look_at(pid: i32, moved: Moved) -> Writer {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let read = |name: &str| std::fs::read_to_string(proc.join(name)).ok();
    let comm = read("comm").map(|s| s.trim_end().to_owned());
    let exe = std::fs::read_link(proc.join("exe")).ok();
    let uid = read("status").and_then(|s| {
        s.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
    });
    let audit = |name: &str| read(name).and_then(|s| s.trim().parse::<u32>().ok()).filter(|&v| v != u32::MAX);
    let (unit, container) = read("cgroup").map(|c| cgroup_owner(&c)).unwrap_or_default();
    Writer {
        pid,
        exited: comm.is_none(),
        comm,
        exe,
        user: uid.and_then(user_name),
        uid,
        loginuid: audit("loginuid"),
        session: audit("sessionid"),
        unit,
        container,
        moved,
        at: SystemTime::now(),
        seen: Instant::now(),
    }
}

/// The systemd unit or the container a process's cgroups name: the unified hierarchy's line
/// (`0::/system.slice/cron.service`) first, then, on a hybrid or v1 machine, systemd's named
/// hierarchy (`1:name=systemd:/docker/<id>`), then any controller's (`4:pids:/docker/<id>`).
fn cgroup_owner(cgroup: &str) -> (Option<String>, Option<String>) {
    let lines: Vec<(&str, &str)> = cgroup
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(_, rest)| rest.split_once(':'))
        .collect();
    let unified = lines.iter().filter(|(c, _)| c.is_empty());
    let named = lines.iter().filter(|(c, _)| *c == "name=systemd");
    let others = lines.iter().filter(|(c, _)| !c.is_empty() && *c != "name=systemd");
    let ordered: Vec<&str> = unified.chain(named).chain(others).map(|(_, p)| *p).collect();
    for path in &ordered {
        if let Some(id) = container_of(path) {
            return (None, Some(id));
        }
    }
    let unit = ordered.iter().find_map(|path| {
        path.split('/').rev().find(|p| p.ends_with(".service") || p.ends_with(".scope")).map(str::to_owned)
    });
    (unit, None)
}

/// The container id a cgroup path names, if it names one: `docker-<id>.scope` (systemd's
/// driver), `libpod-<id>` (Podman's cgroupfs driver, under `libpod_parent`), `/docker/<id>`.
/// An id is 64 hex digits, so that `libpod-conmon-<id>.scope` (Podman's monitor, not the
/// container) is not taken for one.
fn container_of(path: &str) -> Option<String> {
    let is_id = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    for (i, p) in parts.iter().enumerate().rev() {
        for prefix in ["docker-", "libpod-", "crio-"] {
            if let Some(id) = p.strip_prefix(prefix).map(|s| s.strip_suffix(".scope").unwrap_or(s)) {
                if is_id(id) {
                    return Some(id.to_owned());
                }
            }
        }
        if i > 0 && (parts[i - 1] == "docker" || parts[i - 1] == "libpod") && p.len() == 64 {
            return Some((*p).to_owned());
        }
    }
    None
}

/// A uid's name in `/etc/passwd`.
fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        (f.nth(1)?.parse::<u32>().ok()? == uid).then(|| name.to_owned())
    })
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "the test writes the files it watches")]
mod tests {
    use super::*;

    #[test]
    fn cgroups_name_their_unit_session_or_container() {
        assert_eq!(cgroup_owner("0::/system.slice/cron.service\n"), (Some("cron.service".into()), None));
        assert_eq!(
            cgroup_owner("0::/user.slice/user-0.slice/session-4.scope\n"),
            (Some("session-4.scope".into()), None)
        );
        let id = "a".repeat(64);
        assert_eq!(cgroup_owner(&format!("0::/system.slice/docker-{id}.scope\n")), (None, Some(id.clone())));
        assert_eq!(cgroup_owner(&format!("0::/docker/{id}\n")), (None, Some(id)));
        assert_eq!(cgroup_owner("0::/\n"), (None, None));
        let id = "c".repeat(64);
        let podman = format!("9:name=systemd:/libpod_parent/libpod-{id}\n0::/libpod_parent/libpod-{id}\n");
        assert_eq!(cgroup_owner(&podman), (None, Some(id.clone())));
        assert_eq!(
            cgroup_owner(&format!("0::/machine.slice/libpod-conmon-{id}.scope\n")),
            (Some(format!("libpod-conmon-{id}.scope")), None),
            "Podman's monitor is not the container"
        );
        let id = "b".repeat(64);
        let hybrid = format!("9:name=systemd:/docker/{id}\n8:pids:/docker/{id}\n0::/\n");
        assert_eq!(cgroup_owner(&hybrid), (None, Some(id)));
        assert_eq!(
            cgroup_owner("9:name=systemd:/system.slice/cron.service\n0::/\n"),
            (Some("cron.service".into()), None)
        );
    }

    #[test]
    fn a_writer_is_of_one_kind() {
        let w = Writer {
            pid: 1,
            comm: None,
            exe: None,
            uid: None,
            user: None,
            loginuid: None,
            session: None,
            unit: None,
            container: None,
            exited: false,
            moved: Moved::Content,
            at: SystemTime::now(),
            seen: Instant::now(),
        };
        assert_eq!(w.kind(), WriterKind::Unknown);
        let unit = Writer { unit: Some("cron.service".into()), ..w.clone() };
        assert_eq!(unit.kind(), WriterKind::Unit);
        assert_eq!(Writer { unit: Some("session-3.scope".into()), ..w.clone() }.kind(), WriterKind::Session);
        // A login without logind: the audit session says it is a person's.
        let login = Writer { loginuid: Some(1000), session: Some(5), ..unit };
        assert_eq!(login.kind(), WriterKind::Session);
        assert_eq!(Writer { container: Some("c".into()), ..login }.kind(), WriterKind::Container);
    }

    /// As root: a write by a child process is attributed to it, by name; this process's own
    /// writes are not.
    #[test]
    fn a_writer_is_named_and_our_own_writes_are_not() {
        let mut w = Writers::start()
            .expect("fanotify needs root (CAP_SYS_ADMIN) and a kernel with FAN_REPORT_DFID_NAME: run the tests as root, as tests/run.sh does");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "a").unwrap();
        assert!(w.set_paths(Arc::new(PathSet::of([&path])), [Arc::from(dir.path())]).is_empty());
        let since = Instant::now();
        std::fs::write(&path, "b").unwrap();
        assert_eq!(w.take(&path, since, Duration::from_millis(300)), None, "our own write");
        // The writer stays a moment after its write, so that it is still there to be looked at
        // (one that exits at once is told as exited, with its pid and nothing the kernel did not
        // carry).
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("echo c > {}; sleep 0.5", path.display()))
            .status();
        assert!(status.unwrap().success());
        let got = w.take(&path, since, Duration::from_secs(2)).expect("the shell's write is seen");
        assert_eq!(got.moved, Moved::Content);
        assert_eq!(got.uid, Some(0));
        assert!(got.comm.is_none() || got.comm.as_deref() == Some("sh"), "{got:?}");
    }

    /// As root: while a file is muted the kernel tells nothing of writes to it (nothing is kept
    /// for it however often another process writes it), `take` gives the writer the mute began
    /// with, and once the mute ends a write is seen again.
    #[test]
    fn a_muted_file_wakes_nothing_until_its_mute_ends() {
        let mut w = Writers::start()
            .expect("fanotify needs root (CAP_SYS_ADMIN) and a kernel with FAN_REPORT_DFID_NAME: run the tests as root, as tests/run.sh does");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "a").unwrap();
        assert!(w.set_paths(Arc::new(PathSet::of([&path])), [Arc::from(dir.path())]).is_empty());
        let write = |times: u32| {
            let script = format!(
                "i=0; while [ $i -lt {times} ]; do echo $i > {}; i=$((i+1)); done; sleep 0.3",
                path.display()
            );
            assert!(std::process::Command::new("sh").arg("-c").arg(script).status().unwrap().success());
        };
        let since = Instant::now();
        write(1);
        let first = w.take(&path, since, Duration::from_secs(2)).expect("the shell's write is seen");

        let until = Instant::now() + Duration::from_millis(1500);
        w.mute(&path, until).unwrap();
        assert_eq!(w.muted(), 1);
        write(50);
        assert!(lock(&w.shared.latest).get(&path).is_none(), "a write to a muted file was reported");
        assert_eq!(w.take(&path, Instant::now(), Duration::ZERO).map(|g| g.pid), Some(first.pid));

        std::thread::sleep(until.saturating_duration_since(Instant::now()) + Duration::from_millis(300));
        assert_eq!(w.muted(), 0, "the mark is removed when the mute ends");
        let since = Instant::now();
        write(1);
        let again = w.take(&path, since, Duration::from_secs(2)).expect("a write after the mute is seen");
        assert_ne!(again.pid, first.pid);
        assert!(again.seen >= since);
    }
}
