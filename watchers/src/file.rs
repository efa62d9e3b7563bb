//! Paths, through inotify. Parent directories are watched, not the paths themselves: an editor
//! saves by writing a new file and renaming it over the old one, which a watch on the old
//! file's inode would never see.
//!
//! One inotify instance, read on a thread of its own ("inotify"); watches are added and removed
//! from the owner's thread directly (a system call each, no round trip to the reader). Only the
//! events that can change what the controller compares are asked for: a write, a chmod or chown,
//! a create, delete or rename in the directory, and the directory's own removal or move. Opens
//! and closes are not: the agent's own read-backs would wake the reader for nothing.
//!
//! Watches are a per-user resource (`fs.inotify.max_user_watches`, shared by every process of
//! the user; 8,192 on many machines). When the limit is met, the directories left over are not
//! watched, and `coverage` says how many paths that leaves unseen: the owner says so and leaves
//! them to its periodic resync. Adding stops at the first refusal for want of watches (every
//! further add would be refused the same way), and is tried again at the next `set_paths`, or
//! when one of this watcher's own watches is freed. The instance itself is per-user too
//! (`fs.inotify.max_user_instances`): a watcher that cannot make one watches nothing, says why
//! (`no_instance`, `coverage`), and makes one at a later `set_paths` or `rewatch`.
//!
//! A path can be muted until a deadline ([`FileWatcher::mute`]): the owner does so for a path
//! it is holding anyway (a writer fighting the agent over it, docs/concurrency.md, "Contested
//! resources"). Changes at a muted path are not sent; one [`Change::Path`] is sent when the
//! mute ends if it moved meanwhile. While a muted path is moving, the reader reads in batches
//! (one read per [`BATCH`]) instead of waking for every event: a writer rewriting a file as
//! fast as it can costs the agent two thousand wakes a second at most, not one per write.

// poll(2) on two descriptors, and the eventfd that stops the reader: raw `libc` calls, each
// with the reason it is sound beside it.
#![allow(unsafe_code)]

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use tokio::sync::mpsc::UnboundedSender;

use crate::{path_hash, PathSet};

use crate::Change;

/// While a muted path is moving, the reader waits this long after each read, so that the
/// kernel gathers what comes meanwhile (and merges repeated identical events) into the next.
/// Changes at other paths wait at most this much longer while it lasts.
pub const BATCH: Duration = Duration::from_micros(500);

/// What is asked of inotify for each directory.
const MASK: WatchMask = WatchMask::MODIFY
    .union(WatchMask::ATTRIB)
    .union(WatchMask::CREATE)
    .union(WatchMask::DELETE)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::ONLYDIR);

/// What the reading thread shares with the owner.
struct Shared {
    /// The paths to report on, by their hash. Events for anything else in a watched directory
    /// (a temporary file, a neighbour) are dropped here, before they cost the controller
    /// anything. Shared with the writers' watcher (`interest`).
    interest: RwLock<Arc<PathSet>>,
    /// Watched directories by watch descriptor. Written by the owner under this lock around
    /// each add and remove, so the reader never sees an event of a watch it cannot name.
    wds: Mutex<Wds>,
    /// Watched directories whose watch is gone (removed, moved away, unmounted): it must be
    /// made again.
    lost: Mutex<Vec<Arc<Path>>>,
    /// Muted paths, by their hash.
    muted: Mutex<HashMap<u64, Mute>>,
}

/// Directories by watch descriptor. Two directories are one watch when they are one inode
/// (a bind mount, a symlinked parent): the kernel gives the same descriptor, and an event in
/// it is reported under each.
#[derive(Default)]
struct Wds {
    first: HashMap<i32, Arc<Path>>,
    /// The second and further directories of a descriptor; almost always empty.
    more: HashMap<i32, Vec<Arc<Path>>>,
}

impl Wds {
    fn dirs(&self, wd: i32) -> impl Iterator<Item = &Arc<Path>> + '_ {
        self.first.get(&wd).into_iter().chain(self.more.get(&wd).into_iter().flatten())
    }

    fn insert(&mut self, wd: i32, dir: Arc<Path>) {
        match self.first.get(&wd) {
            None => {
                self.first.insert(wd, dir);
            }
            Some(d) if *d == dir => {}
            Some(_) => {
                let more = self.more.entry(wd).or_default();
                if !more.contains(&dir) {
                    more.push(dir);
                }
            }
        }
    }

    /// Forgets one directory of a descriptor; whether none is left (the watch may go).
    fn remove(&mut self, wd: i32, dir: &Path) -> bool {
        if let Some(more) = self.more.get_mut(&wd) {
            more.retain(|d| &**d != dir);
            if self.first.get(&wd).is_some_and(|d| &**d == dir) {
                let next = more.pop();
                match next {
                    Some(n) => {
                        self.first.insert(wd, n);
                    }
                    None => {
                        self.first.remove(&wd);
                    }
                }
            }
            if more.is_empty() {
                self.more.remove(&wd);
            }
            return !self.first.contains_key(&wd);
        }
        if self.first.get(&wd).is_some_and(|d| &**d == dir) {
            self.first.remove(&wd);
        }
        !self.first.contains_key(&wd)
    }

    /// Forgets a descriptor whose watch the kernel removed; its directories.
    fn take(&mut self, wd: i32) -> Vec<Arc<Path>> {
        let mut dirs: Vec<Arc<Path>> = self.first.remove(&wd).into_iter().collect();
        dirs.extend(self.more.remove(&wd).into_iter().flatten());
        dirs
    }
}

/// One muted path.
struct Mute {
    path: PathBuf,
    until: Instant,
    /// It moved while muted: said once when the mute ends.
    moved: bool,
}

/// The inotify instance and the thread that reads it.
struct Instance {
    watches: Watches,
    /// An eventfd the reader polls beside inotify: written once to tell it to stop.
    stop: Arc<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Instance {
    fn start(shared: &Arc<Shared>, tx: &UnboundedSender<Change>) -> io::Result<Instance> {
        let inotify = Inotify::init().map_err(instance_said)?;
        let watches = inotify.watches();
        // SAFETY: eventfd takes two integers and returns a new descriptor or -1; nothing is
        // borrowed.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor eventfd just returned, owned by nothing else.
        let stop = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
        let (thread_stop, thread_shared, tx) = (Arc::clone(&stop), Arc::clone(shared), tx.clone());
        let thread = std::thread::Builder::new()
            .name("inotify".into())
            .spawn(move || read_loop(inotify, &thread_stop, &thread_shared, &tx))?;
        Ok(Instance { watches, stop, thread: Some(thread) })
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // An eventfd is written eight bytes at a time: a counter, which the reader only polls.
        let one = 1u64.to_ne_bytes();
        // SAFETY: the descriptor is alive (self holds it) and `one` is eight readable bytes.
        let wrote = unsafe { libc::write(self.stop.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        // Not told, the reader would never end: it is left to end with the process.
        if wrote == 8 {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// Reports changes at a set of paths.
pub struct FileWatcher {
    /// `None` while no inotify instance could be made (the user's instances, or this
    /// process's descriptors, all taken): every path is then unwatched, and each `set_paths`
    /// and `rewatch` tries again.
    instance: Option<Instance>,
    /// Why the last attempt to make the instance failed, while there is none.
    no_instance: Option<String>,
    /// For the reader of an instance made later.
    tx: UnboundedSender<Change>,
    shared: Arc<Shared>,
    /// Directories with a live watch, and its descriptor.
    watched: HashMap<Arc<Path>, WatchDescriptor>,
    /// Directories that should have one: the parents of the paths of interest, each with how
    /// many of those paths it holds (so that what is unseen is counted in paths, as the
    /// operator declared them, not in directories).
    wanted: HashMap<Arc<Path>, usize>,
    /// Wanted directories without a watch (lost, absent, or refused for want of watches): all
    /// that `rewatch` looks at, so a correction costs the same on a node of ten directories or
    /// of ten thousand.
    pending: HashSet<Arc<Path>>,
    /// The paths of interest in watched directories: kept as watches come and go, so that
    /// `coverage` costs nothing after each correction.
    watched_paths: usize,
    /// The paths of interest.
    paths: usize,
    /// The last attempt to add a watch was refused for want of watches (ENOSPC: the user's
    /// `max_user_watches` is reached), and no attempt since has got through every directory.
    out_of_watches: bool,
    /// Directories whose watch was made since the owner last took them (`take_armed`).
    armed: Vec<Arc<Path>>,
}

/// How much of what was asked for is watched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Paths whose directory is watched: a change to them is seen at once.
    pub watched: usize,
    /// Paths whose directory is not watched (absent, or no watch left to add): a change to them
    /// is seen only by the owner's next full look.
    pub unwatched: usize,
    /// Directories that are wanted and not watched.
    pub unwatched_dirs: usize,
    /// The last attempt to add a watch was refused because the user's limit of inotify watches
    /// is reached.
    pub out_of_watches: bool,
    /// No inotify instance could be made (`FileWatcher::no_instance` says why): nothing is
    /// watched.
    pub no_instance: bool,
}

impl FileWatcher {
    /// Starts a watcher that sends into `tx`. It watches nothing until `set_paths`. When no
    /// inotify instance can be made now, it is made at a later `set_paths` or `rewatch`; until
    /// then nothing is watched, and `coverage` and `no_instance` say so.
    pub fn new(tx: UnboundedSender<Change>) -> FileWatcher {
        let shared = Arc::new(Shared {
            interest: RwLock::new(Arc::default()),
            wds: Mutex::new(Wds::default()),
            lost: Mutex::new(Vec::new()),
            muted: Mutex::new(HashMap::new()),
        });
        let mut w = FileWatcher {
            instance: None,
            no_instance: None,
            tx,
            shared,
            watched: HashMap::new(),
            wanted: HashMap::new(),
            pending: HashSet::new(),
            watched_paths: 0,
            paths: 0,
            out_of_watches: false,
            armed: Vec::new(),
        };
        w.make_instance();
        w
    }

    /// Makes the inotify instance when there is none.
    fn make_instance(&mut self) {
        if self.instance.is_none() {
            match Instance::start(&self.shared, &self.tx) {
                Ok(i) => {
                    self.instance = Some(i);
                    self.no_instance = None;
                }
                Err(e) => self.no_instance = Some(e.to_string()),
            }
        }
    }

    /// Why no inotify instance could be made, while there is none.
    pub fn no_instance(&self) -> Option<&str> {
        self.no_instance.as_deref()
    }

    /// Reports on exactly these paths from now on, watching their parent directories. Returns
    /// the directories that could not be watched for a reason other than the limit of watches
    /// (absent, for instance; those left for want of watches are counted in `coverage`);
    /// calling again later retries them. Idempotent and cheap when nothing changed.
    pub fn set_paths<P: AsRef<Path>>(
        &mut self,
        paths: impl IntoIterator<Item = P>,
    ) -> Vec<(PathBuf, io::Error)> {
        // Only while the paths are counted: a path given twice (a directory and an archive
        // unpacked into it) counts once. A hash collision would count one path too few, never
        // leave a directory unwatched.
        let mut seen = HashSet::new();
        let mut wanted: HashMap<Arc<Path>, usize> = HashMap::new();
        let mut paths_given = Vec::new();
        for path in paths {
            let path = path.as_ref();
            let hash = path_hash(path);
            paths_given.push(hash);
            let new = usize::from(seen.insert(hash));
            if let Some(parent) = path.parent() {
                match wanted.get_mut(parent) {
                    Some(n) => *n += new,
                    None => {
                        // The directory already watched lends its name, so each is kept once.
                        let dir = self
                            .watched
                            .get_key_value(parent)
                            .map_or_else(|| Arc::from(parent), |(d, _)| Arc::clone(d));
                        wanted.insert(dir, new);
                    }
                }
            }
        }
        drop(seen);
        let interest = Arc::new(PathSet::of_hashes(paths_given));
        self.paths = wanted.values().sum();
        self.wanted = wanted;
        {
            let mut muted = lock(&self.shared.muted);
            muted.retain(|h, _| interest.holds(*h));
        }
        *self.shared.interest.write().unwrap_or_else(|e| e.into_inner()) = interest;
        let stale: Vec<Arc<Path>> =
            self.watched.keys().filter(|d| !self.wanted.contains_key(*d)).cloned().collect();
        for dir in stale {
            self.unwatch(&dir);
        }
        self.watched_paths = self.watched.keys().map(|d| self.wanted.get(d).copied().unwrap_or(0)).sum();
        self.take_lost();
        self.pending = self.wanted.keys().filter(|d| !self.watched.contains_key(*d)).cloned().collect();
        self.add_missing()
    }

    /// The paths of interest given to the last `set_paths`, for the writers' watcher to share
    /// (`writers::Writers::set_paths`).
    pub fn interest(&self) -> Arc<PathSet> {
        Arc::clone(&self.shared.interest.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The directories of the paths given to the last `set_paths`, watched or not: this
    /// watcher's own names of them, for the writers' watcher to share.
    pub fn dirs(&self) -> impl Iterator<Item = Arc<Path>> + '_ {
        self.wanted.keys().cloned()
    }

    /// Watches again the directories whose watch was lost (removed and made again) or could
    /// not be made before. Cheap when there is nothing to do: call it after every change. While
    /// the limit of watches is reached it adds nothing unless one of this watcher's own watches
    /// was freed since (the next `set_paths` tries again in any case), so that a correction
    /// does not pay for a refused add each time.
    pub fn rewatch(&mut self) -> Vec<(PathBuf, io::Error)> {
        let freed = self.take_lost();
        // Never set without an instance, so a watcher without one always goes on to try again.
        if self.out_of_watches && !freed {
            return Vec::new();
        }
        self.add_missing()
    }

    /// Sends nothing for `path` until `until`; then, if it moved meanwhile, one
    /// [`Change::Path`]. A later mute of the same path replaces this one; a path that is not
    /// of interest is not muted. While a muted path moves, every path's changes are read in
    /// batches ([`BATCH`]).
    pub fn mute(&self, path: &Path, until: Instant) {
        let hash = path_hash(path);
        if !self.shared.interest.read().unwrap_or_else(|e| e.into_inner()).holds(hash) {
            return;
        }
        let mut muted = lock(&self.shared.muted);
        match muted.get_mut(&hash) {
            Some(m) => m.until = until,
            None => {
                muted.insert(hash, Mute { path: path.to_path_buf(), until, moved: false });
            }
        }
    }

    /// How many paths are muted now (ended mutes are dropped by the reader).
    pub fn muted(&self) -> usize {
        lock(&self.shared.muted).len()
    }

    /// Removes the watch of one directory (if no other directory shares it).
    fn unwatch(&mut self, dir: &Arc<Path>) {
        let Some(wd) = self.watched.remove(dir) else { return };
        let mut wds = lock(&self.shared.wds);
        if wds.remove(wd.get_watch_descriptor_id(), dir) {
            // The reader no longer knows the descriptor: the kernel's IN_IGNORED for it is
            // dropped. The kernel counts descriptors up, so no new watch takes its number soon.
            if let Some(i) = &mut self.instance {
                let _ = i.watches.remove(wd);
            }
        }
    }

    /// Forgets the watches of directories that were removed; whether there was one.
    fn take_lost(&mut self) -> bool {
        let lost: Vec<Arc<Path>> = std::mem::take(&mut *lock(&self.shared.lost));
        let mut freed = false;
        for dir in lost {
            if self.watched.contains_key(&dir) {
                self.unwatch(&dir);
                self.watched_paths -= self.wanted.get(&dir).copied().unwrap_or(0);
                freed = true;
                if self.wanted.contains_key(&dir) {
                    self.pending.insert(dir);
                }
            }
        }
        freed
    }

    /// Adds a watch on every wanted directory that has none (`pending`), until the limit refuses
    /// one.
    fn add_missing(&mut self) -> Vec<(PathBuf, io::Error)> {
        self.make_instance();
        let Some(instance) = &mut self.instance else { return Vec::new() };
        let mut failed = Vec::new();
        let mut refused = false;
        let mut added = Vec::new();
        for dir in &self.pending {
            let paths = self.wanted.get(dir).copied().unwrap_or(0);
            // The lock is held across the add: an event of the new watch waits for its name.
            let mut wds = lock(&self.shared.wds);
            match instance.watches.add(&**dir, MASK) {
                Ok(wd) => {
                    let n = wd.get_watch_descriptor_id();
                    wds.insert(n, Arc::clone(dir));
                    drop(wds);
                    self.watched.insert(Arc::clone(dir), wd);
                    self.watched_paths += paths;
                    added.push(Arc::clone(dir));
                }
                // ENOSPC from inotify_add_watch: the user's watches are all in use. Every other
                // directory would be refused the same way.
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                    refused = true;
                    break;
                }
                Err(e) => failed.push((dir.to_path_buf(), e)),
            }
        }
        for dir in added {
            self.pending.remove(&dir);
            self.armed.push(dir);
        }
        self.out_of_watches = refused;
        failed
    }

    /// How many of the paths asked for are watched, and whether the limit of watches stopped
    /// the last attempt to add one.
    pub fn coverage(&self) -> Coverage {
        Coverage {
            watched: self.watched_paths,
            unwatched: self.paths - self.watched_paths,
            unwatched_dirs: self.wanted.len() - self.watched.len(),
            out_of_watches: self.out_of_watches,
            no_instance: self.instance.is_none(),
        }
    }

    /// The directories whose watch was made since the last call (by `set_paths` or `rewatch`).
    /// A change in one of them before its watch was made was seen by no one: the owner looks
    /// once at its paths of interest after the watch is there (list after watch, as client-go's
    /// informers do), since a change from then on is reported.
    pub fn take_armed(&mut self) -> Vec<Arc<Path>> {
        std::mem::take(&mut self.armed)
    }

    /// How many directories are watched.
    pub fn watched(&self) -> usize {
        self.watched.len()
    }
}

/// An inotify instance that could not be made, said with the limit behind it. EMFILE from
/// `inotify_init1` is either the user's instances all taken (`fs.inotify.max_user_instances`,
/// counted across every process of the user: for root, systemd, udev and every container's
/// processes too) or this process's descriptors (`RLIMIT_NOFILE`); "Too many open files" alone
/// points only at the second.
pub(crate) fn instance_said(e: io::Error) -> io::Error {
    if e.raw_os_error() != Some(libc::EMFILE) {
        return e;
    }
    // Read now, it needs a descriptor too: when there is none, that says which limit it is.
    let max = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances").map_or_else(
        |_| "fs.inotify.max_user_instances could not be read either, which points at the second".to_owned(),
        |s| format!("fs.inotify.max_user_instances is {} here", s.trim()),
    );
    let mut files = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct it is given and reads nothing else.
    let nofile = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut files) } == 0 {
        files.rlim_cur.to_string()
    } else {
        "unknown".to_owned()
    };
    io::Error::new(
        e.kind(),
        format!(
            "{e}: no inotify instance could be made. Either the user's instances are all taken \
             (counted across every process of the user, containers' included: raise \
             fs.inotify.max_user_instances with sysctl) or this process's open files are (its \
             limit is {nofile}: LimitNOFILE= in the unit); {max}"
        ),
    )
}

/// Reads events until told to stop, sending the changes at paths of interest.
fn read_loop(mut inotify: Inotify, stop: &OwnedFd, shared: &Shared, tx: &UnboundedSender<Change>) {
    // Room for a few hundred events per read; a name is at most 255 bytes.
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let timeout = next_deadline(shared).map_or(-1, |at| {
            let left = at.saturating_duration_since(Instant::now());
            // Rounded up: waking a little late is harmless, waking early spins.
            i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX)
        });
        let mut fds = [
            libc::pollfd { fd: inotify.as_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: stop.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: two valid pollfds, for the length given; both descriptors are alive (owned by
        // this function's arguments for the whole loop).
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
        if ready < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            tracing::warn!(error = %e, "inotify: waiting for events failed; resyncing");
            let _ = tx.send(Change::Resynced { watcher: crate::Watcher::File });
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        end_mutes(shared, tx);
        if fds[0].revents == 0 {
            continue;
        }
        let events = match inotify.read_events(&mut buf) {
            Ok(events) => events,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => continue,
            Err(e) => {
                // Nothing more will be read: say so, and let the periodic resync cover it all.
                tracing::warn!(error = %e, "inotify: reading events failed; changes are seen by the resync only");
                let _ = tx.send(Change::Resynced { watcher: crate::Watcher::File });
                return;
            }
        };
        let mut contested = false;
        // The last muted entry this read named: a writer's rewrites come one after another,
        // and each of them is known muted without a path made, hashed and looked up.
        let mut last_muted: Option<(i32, &OsStr)> = None;
        let mut wds = lock(&shared.wds);
        let interest = Arc::clone(&shared.interest.read().unwrap_or_else(|e| e.into_inner()));
        for event in events {
            if event.mask.contains(EventMask::Q_OVERFLOW) {
                // The kernel's queue overflowed: what happened in the gap is unknown.
                let _ = tx.send(Change::Resynced { watcher: crate::Watcher::File });
                continue;
            }
            let wd = event.wd.get_watch_descriptor_id();
            if event.mask.contains(EventMask::IGNORED) {
                // The watch is gone (its directory removed or unmounted), unless the owner
                // removed it, in which case it no longer names the descriptor.
                lock(&shared.lost).extend(wds.take(wd));
                continue;
            }
            if event.mask.contains(EventMask::MOVE_SELF) {
                // Moved away: the watch follows the directory to where it is not wanted.
                lock(&shared.lost).extend(wds.dirs(wd).cloned());
                continue;
            }
            let Some(name) = event.name else { continue };
            if last_muted == Some((wd, name)) {
                continue;
            }
            let mut muted = false;
            for dir in wds.dirs(wd) {
                muted |= report(shared, &interest, tx, &dir.join(name));
            }
            contested |= muted;
            last_muted = muted.then_some((wd, name));
        }
        drop(interest);
        drop(wds);
        if contested {
            std::thread::sleep(BATCH);
        }
    }
}

/// Sends a change at `path` if it is of interest and not muted; whether it is muted.
fn report(shared: &Shared, interest: &PathSet, tx: &UnboundedSender<Change>, path: &Path) -> bool {
    let hash = path_hash(path);
    if !interest.holds(hash) {
        return false;
    }
    {
        let mut muted = lock(&shared.muted);
        if let Some(m) = muted.get_mut(&hash) {
            if Instant::now() < m.until {
                m.moved = true;
                return true;
            }
            muted.remove(&hash);
        }
    }
    tracing::trace!(path = %path.display(), "inotify: a path of interest moved");
    let _ = tx.send(Change::Path(path.to_path_buf()));
    false
}

/// Ends the mutes that are due, sending a change for each path that moved while muted.
fn end_mutes(shared: &Shared, tx: &UnboundedSender<Change>) {
    let mut muted = lock(&shared.muted);
    if muted.is_empty() {
        return;
    }
    let now = Instant::now();
    muted.retain(|_, m| {
        if m.until > now {
            return true;
        }
        if m.moved {
            let _ = tx.send(Change::Path(std::mem::take(&mut m.path)));
        }
        false
    });
}

/// When the next mute ends.
fn next_deadline(shared: &Shared) -> Option<Instant> {
    lock(&shared.muted).values().map(|m| m.until).min()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "the test makes and removes the directories it watches")]
mod tests {
    use super::*;

    use tokio::sync::mpsc::UnboundedReceiver;

    /// Waits up to `wait` for the lost list to fill.
    fn wait_lost(w: &FileWatcher) {
        let start = Instant::now();
        while lock(&w.shared.lost).is_empty() && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The paths received within `wait`.
    async fn received(rx: &mut UnboundedReceiver<Change>, wait: Duration) -> Vec<PathBuf> {
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + wait;
        while let Ok(Some(c)) = tokio::time::timeout_at(deadline, rx.recv()).await {
            if let Change::Path(p) = c {
                got.push(p);
            }
        }
        got
    }

    /// After each correction `rewatch` looks only at the directories without a watch, not at
    /// every one wanted: none while all are watched, the one lost once it is removed, and none
    /// again once it is watched anew.
    #[tokio::test]
    async fn rewatch_looks_only_at_directories_without_a_watch() {
        let root = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = (0..50).map(|i| root.path().join(format!("d{i}"))).collect();
        for d in &dirs {
            std::fs::create_dir(d).unwrap();
        }
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let mut w = FileWatcher::new(tx);
        assert!(w.set_paths(dirs.iter().map(|d| d.join("f"))).is_empty());
        assert_eq!((w.watched(), w.pending.len()), (50, 0), "all watched, nothing pending");
        std::fs::remove_dir(&dirs[7]).unwrap();
        wait_lost(&w);
        assert!(w.rewatch().len() == 1, "the removed directory cannot be watched yet");
        assert_eq!(w.pending.iter().map(|d| d.to_path_buf()).collect::<Vec<_>>(), vec![dirs[7].clone()]);
        std::fs::create_dir(&dirs[7]).unwrap();
        assert!(w.rewatch().is_empty());
        assert_eq!((w.watched(), w.pending.len()), (50, 0));
    }

    /// A watched directory moved away is watched again at its path once one is there: the
    /// watch does not follow the old directory to where it is no longer wanted.
    #[tokio::test]
    async fn a_directory_moved_away_is_watched_again_at_its_path() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("d");
        std::fs::create_dir(&dir).unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut w = FileWatcher::new(tx);
        assert!(w.set_paths([dir.join("f")]).is_empty());
        std::fs::rename(&dir, root.path().join("away")).unwrap();
        wait_lost(&w);
        assert_eq!(w.rewatch().len(), 1, "nothing at the path yet");
        std::fs::write(root.path().join("away/f"), "x").unwrap();
        assert!(
            received(&mut rx, Duration::from_millis(200)).await.is_empty(),
            "the moved directory is not reported"
        );
        std::fs::create_dir(&dir).unwrap();
        assert!(w.rewatch().is_empty());
        std::fs::write(dir.join("f"), "y").unwrap();
        let got = received(&mut rx, Duration::from_millis(300)).await;
        assert!(!got.is_empty() && got.iter().all(|p| *p == dir.join("f")), "{got:?}");
    }

    /// `take_armed` gives each directory once, when its watch is made: the one `set_paths`
    /// could watch, then nothing, then one made later, once `rewatch` watches it; a
    /// `set_paths` that changes nothing arms nothing.
    #[tokio::test]
    async fn each_directory_armed_is_given_once() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let mut w = FileWatcher::new(tx);
        assert_eq!(w.set_paths([a.join("f"), b.join("f")]).len(), 1, "b is absent");
        assert_eq!(w.take_armed(), vec![Arc::from(a.as_path())]);
        assert!(w.take_armed().is_empty(), "given once");
        assert_eq!(w.rewatch().len(), 1, "b is still absent");
        assert!(w.take_armed().is_empty());
        std::fs::create_dir(&b).unwrap();
        assert!(w.rewatch().is_empty());
        assert_eq!(w.take_armed(), vec![Arc::from(b.as_path())]);
        assert!(w.set_paths([a.join("f"), b.join("f")]).is_empty());
        assert!(w.take_armed().is_empty(), "nothing new watched");
    }

    /// A muted path sends nothing until its deadline however often it moves, its neighbours are
    /// still reported meanwhile, one change is sent when the mute ends, and after it the path is
    /// reported as before.
    #[tokio::test]
    async fn a_muted_path_is_said_once_when_its_mute_ends() {
        let root = tempfile::tempdir().unwrap();
        let (f, g) = (root.path().join("f"), root.path().join("g"));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut w = FileWatcher::new(tx);
        assert!(w.set_paths([&f, &g]).is_empty());
        std::fs::write(&f, "0").unwrap();
        assert!(received(&mut rx, Duration::from_millis(200)).await.contains(&f), "reported before the mute");

        // Long enough that 200 writes fit inside it on a loaded machine (a CI run saw them take
        // over half a second); every wait below is measured from the mute's end, never
        // subtracted from what is left of it.
        let until = Instant::now() + Duration::from_millis(2000);
        w.mute(&f, until);
        assert_eq!(w.muted(), 1);
        for i in 0..200 {
            std::fs::write(&f, i.to_string()).unwrap();
        }
        std::fs::write(&g, "g").unwrap();
        let before_end = until - Duration::from_millis(200);
        let during = received(&mut rx, before_end.saturating_duration_since(Instant::now())).await;
        assert!(!during.contains(&f), "a muted path was reported: {during:?}");
        assert!(during.contains(&g), "a neighbour was not reported during the mute: {during:?}");

        let after =
            received(&mut rx, until.saturating_duration_since(Instant::now()) + Duration::from_millis(400))
                .await;
        assert_eq!(after, vec![f.clone()], "one change when the mute ends");
        assert_eq!(w.muted(), 0, "the mute is dropped when it ends");
        std::fs::write(&f, "again").unwrap();
        assert!(received(&mut rx, Duration::from_millis(200)).await.contains(&f), "reported after the mute");
    }

    /// A mute that ends with nothing moved sends nothing, and a path not of interest is never
    /// muted.
    #[tokio::test]
    async fn a_quiet_mute_sends_nothing() {
        let root = tempfile::tempdir().unwrap();
        let f = root.path().join("f");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut w = FileWatcher::new(tx);
        assert!(w.set_paths([&f]).is_empty());
        w.mute(&root.path().join("other"), Instant::now() + Duration::from_secs(60));
        assert_eq!(w.muted(), 0, "a path not of interest is not muted");
        w.mute(&f, Instant::now() + Duration::from_millis(100));
        assert!(received(&mut rx, Duration::from_millis(400)).await.is_empty());
    }
}
