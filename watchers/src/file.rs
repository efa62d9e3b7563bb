//! Paths, through inotify (notify). Parent directories are watched, not the paths themselves:
//! an editor saves by writing a new file and renaming it over the old one, which a watch on the
//! old file's inode would never see.

use std::collections::HashSet;
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
    /// Directories that should have one: the parents of the paths of interest.
    wanted: HashSet<PathBuf>,
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
        Ok(FileWatcher { watcher, shared, watched: HashSet::new(), wanted: HashSet::new() })
    }

    /// Reports on exactly these paths from now on, watching their parent directories. Returns
    /// the directories that could not be watched (absent, for instance); calling again later
    /// retries them. Idempotent and cheap when nothing changed.
    pub fn set_paths<P: AsRef<Path>>(
        &mut self,
        paths: impl IntoIterator<Item = P>,
    ) -> Vec<(PathBuf, notify::Error)> {
        let mut interest = HashSet::new();
        let mut wanted = HashSet::new();
        for path in paths {
            let path = path.as_ref();
            interest.insert(path_hash(path));
            if let Some(parent) = path.parent() {
                if !wanted.contains(parent) {
                    wanted.insert(parent.to_path_buf());
                }
            }
        }
        interest.shrink_to_fit();
        self.wanted = wanted;
        *self.shared.interest.write().unwrap_or_else(|e| e.into_inner()) = interest;
        let stale: Vec<PathBuf> = self.watched.difference(&self.wanted).cloned().collect();
        for dir in stale {
            let _ = self.watcher.unwatch(&dir);
            self.watched.remove(&dir);
        }
        self.rewatch()
    }

    /// Watches again the directories whose watch was lost (removed and made again) or could
    /// not be made before. Cheap when there is nothing to do: call it after every change.
    pub fn rewatch(&mut self) -> Vec<(PathBuf, notify::Error)> {
        let lost: Vec<PathBuf> =
            std::mem::take(&mut *self.shared.lost.lock().unwrap_or_else(|e| e.into_inner()));
        for dir in lost {
            if self.watched.remove(&dir) {
                let _ = self.watcher.unwatch(&dir);
            }
        }
        let mut failed = Vec::new();
        for dir in &self.wanted {
            if self.watched.contains(dir) {
                continue;
            }
            match self.watcher.watch(dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    self.watched.insert(dir.clone());
                }
                Err(e) => failed.push((dir.clone(), e)),
            }
        }
        failed
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
