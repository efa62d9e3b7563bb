//! Paths, through inotify (notify). Parent directories are watched, not the paths themselves:
//! an editor saves by writing a new file and renaming it over the old one, which a watch on the
//! old file's inode would never see.
//!
//! Watches are a per-user resource (`fs.inotify.max_user_watches`, shared by every process of
//! the user; 8,192 on many machines). When the limit is met, the directories left over are not
//! watched, and `coverage` says how many paths that leaves unseen: the owner says so and leaves
//! them to its periodic resync. Adding stops at the first refusal for want of watches (every
//! further add would be refused the same way, each a round trip to notify's thread), and is
//! tried again at the next `set_paths`, or when one of this watcher's own watches is freed.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};
use tokio::sync::mpsc::UnboundedSender;

use crate::Change;

/// What the event handler (on notify's thread) shares with the owner.
struct Shared {
    /// The paths to report on, by their hash. Events for anything else in a watched directory
    /// (a temporary file, a neighbour) are dropped here, before they cost the controller
    /// anything. Hashes rather than the paths: 8 bytes each instead of a copy of each of ten
    /// thousand paths; a collision only lets through an event the controller then ignores.
    interest: RwLock<HashSet<u64>>,
    /// Watched directories that were removed: their watch is gone and must be made again.
    lost: Mutex<Vec<PathBuf>>,
}

/// Reports changes at a set of paths.
pub struct FileWatcher {
    watcher: RecommendedWatcher,
    shared: Arc<Shared>,
    /// Directories with a live watch.
    watched: HashSet<PathBuf>,
    /// Directories that should have one: the parents of the paths of interest, each with how
    /// many of those paths it holds (so that what is unseen is counted in paths, as the
    /// operator declared them, not in directories).
    wanted: HashMap<PathBuf, usize>,
    /// Wanted directories without a watch (lost, absent, or refused for want of watches): all
    /// that `rewatch` looks at, so a correction costs the same on a node of ten directories or
    /// of ten thousand.
    pending: HashSet<PathBuf>,
    /// The paths of interest in watched directories: kept as watches come and go, so that
    /// `coverage` costs nothing after each correction.
    watched_paths: usize,
    /// The paths of interest.
    paths: usize,
    /// The last attempt to add a watch was refused for want of watches (ENOSPC: the user's
    /// `max_user_watches` is reached), and no attempt since has got through every directory.
    out_of_watches: bool,
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
}

impl FileWatcher {
    /// Starts a watcher that sends into `tx`. It watches nothing until `set_paths`.
    pub fn new(tx: UnboundedSender<Change>) -> notify::Result<FileWatcher> {
        let shared = Arc::new(Shared { interest: RwLock::new(HashSet::new()), lost: Mutex::new(Vec::new()) });
        let handler_shared = Arc::clone(&shared);
        let watcher = notify::recommended_watcher(move |res: notify::Result<Event>| {
            let event = match res {
                Ok(event) => event,
                Err(e) => {
                    // An error from the watcher means events may have been lost.
                    tracing::warn!(error = %e, "file watcher error; resyncing");
                    let _ = tx.send(Change::Resynced { watcher: "file" });
                    return;
                }
            };
            if event.need_rescan() {
                // The kernel's queue overflowed: what happened in the gap is unknown.
                let _ = tx.send(Change::Resynced { watcher: "file" });
                return;
            }
            if matches!(event.kind, EventKind::Access(_)) {
                return;
            }
            let interest = handler_shared.interest.read().unwrap_or_else(|e| e.into_inner());
            for path in &event.paths {
                if matches!(event.kind, EventKind::Remove(_)) {
                    handler_shared.lost.lock().unwrap_or_else(|e| e.into_inner()).push(path.clone());
                }
                if interest.contains(&path_hash(path)) {
                    let _ = tx.send(Change::Path(path.clone()));
                }
            }
        })?;
        Ok(FileWatcher {
            watcher,
            shared,
            watched: HashSet::new(),
            wanted: HashMap::new(),
            pending: HashSet::new(),
            watched_paths: 0,
            paths: 0,
            out_of_watches: false,
        })
    }

    /// Reports on exactly these paths from now on, watching their parent directories. Returns
    /// the directories that could not be watched for a reason other than the limit of watches
    /// (absent, for instance; those left for want of watches are counted in `coverage`);
    /// calling again later retries them. Idempotent and cheap when nothing changed.
    pub fn set_paths<P: AsRef<Path>>(
        &mut self,
        paths: impl IntoIterator<Item = P>,
    ) -> Vec<(PathBuf, notify::Error)> {
        let mut interest = HashSet::new();
        let mut wanted: HashMap<PathBuf, usize> = HashMap::new();
        for path in paths {
            let path = path.as_ref();
            // A path given twice (a directory and an archive unpacked into it) counts once. A
            // hash collision would count one path too few, never leave a directory unwatched.
            let new = usize::from(interest.insert(path_hash(path)));
            if let Some(parent) = path.parent() {
                match wanted.get_mut(parent) {
                    Some(n) => *n += new,
                    None => {
                        wanted.insert(parent.to_path_buf(), new);
                    }
                }
            }
        }
        interest.shrink_to_fit();
        self.paths = wanted.values().sum();
        self.wanted = wanted;
        *self.shared.interest.write().unwrap_or_else(|e| e.into_inner()) = interest;
        let stale: Vec<PathBuf> =
            self.watched.iter().filter(|d| !self.wanted.contains_key(*d)).cloned().collect();
        for dir in stale {
            let _ = self.watcher.unwatch(&dir);
            self.watched.remove(&dir);
        }
        self.watched_paths = self.watched.iter().map(|d| self.wanted.get(d).copied().unwrap_or(0)).sum();
        self.take_lost();
        self.pending = self.wanted.keys().filter(|d| !self.watched.contains(*d)).cloned().collect();
        self.add_missing()
    }

    /// Watches again the directories whose watch was lost (removed and made again) or could
    /// not be made before. Cheap when there is nothing to do: call it after every change. While
    /// the limit of watches is reached it adds nothing unless one of this watcher's own watches
    /// was freed since (the next `set_paths` tries again in any case), so that a correction
    /// does not pay for a refused add each time.
    pub fn rewatch(&mut self) -> Vec<(PathBuf, notify::Error)> {
        let freed = self.take_lost();
        if self.out_of_watches && !freed {
            return Vec::new();
        }
        self.add_missing()
    }

    /// Forgets the watches of directories that were removed; whether there was one.
    fn take_lost(&mut self) -> bool {
        let lost: Vec<PathBuf> =
            std::mem::take(&mut *self.shared.lost.lock().unwrap_or_else(|e| e.into_inner()));
        let mut freed = false;
        for dir in lost {
            if self.watched.remove(&dir) {
                let _ = self.watcher.unwatch(&dir);
                self.watched_paths -= self.wanted.get(&dir).copied().unwrap_or(0);
                freed = true;
                self.pending.insert(dir);
            }
        }
        freed
    }

    /// Adds a watch on every wanted directory that has none (`pending`), until the limit refuses
    /// one.
    fn add_missing(&mut self) -> Vec<(PathBuf, notify::Error)> {
        let mut failed = Vec::new();
        let mut refused = false;
        let mut added = Vec::new();
        for dir in &self.pending {
            let paths = self.wanted.get(dir).copied().unwrap_or(0);
            match self.watcher.watch(dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    self.watched.insert(dir.clone());
                    self.watched_paths += paths;
                    added.push(dir.clone());
                }
                // ENOSPC from inotify_add_watch: the user's watches are all in use. Every other
                // directory would be refused the same way.
                Err(e) if matches!(e.kind, notify::ErrorKind::MaxFilesWatch) => {
                    refused = true;
                    break;
                }
                Err(e) => failed.push((dir.clone(), e)),
            }
        }
        for dir in added {
            self.pending.remove(&dir);
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
        }
    }

    /// How many directories are watched.
    pub fn watched(&self) -> usize {
        self.watched.len()
    }
}

/// The hash a path of interest is known by: std's SipHash with its fixed keys, the same for
/// the path given to `set_paths` and the path an event names.
fn path_hash(path: &Path) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    path.hash(&mut h);
    h.finish()
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "the test makes and removes the directories it watches")]
mod tests {
    use super::*;

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
        let mut w = FileWatcher::new(tx).unwrap();
        assert!(w.set_paths(dirs.iter().map(|d| d.join("f"))).is_empty());
        assert_eq!((w.watched(), w.pending.len()), (50, 0), "all watched, nothing pending");
        std::fs::remove_dir(&dirs[7]).unwrap();
        let lost = || !w.shared.lost.lock().unwrap().is_empty();
        let start = std::time::Instant::now();
        while !lost() && start.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(w.rewatch().len() == 1, "the removed directory cannot be watched yet");
        assert_eq!(w.pending.iter().collect::<Vec<_>>(), vec![&dirs[7]], "only the lost one is pending");
        std::fs::create_dir(&dirs[7]).unwrap();
        assert!(w.rewatch().is_empty());
        assert_eq!((w.watched(), w.pending.len()), (50, 0));
    }
}
