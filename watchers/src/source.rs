//! The declaration's source: a file, or a directory of `*.json` files. It reports that the
//! source settled (no event for a quiet period) after a change, so a declaration being written is
//! not read half-way; reading it, and what the bytes mean, is the controller's business. A
//! reader that still gets a torn file (a writer pausing longer than the quiet period) hands it to
//! a parser that refuses it whole.
//!
//! The source's parent directory is always watched, so the source's own name is followed: a
//! file written in place, or renamed over, and a directory removed and made again, renamed away,
//! or swapped in by a rename. A directory source is watched as well, for its files; inotify
//! watches an inode, not a name, so after every settle that watch is made again on whatever
//! directory is at the source's path now. Without that, a directory replaced under the daemon
//! was never seen again (issue 12, fault 5).

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{Event, EventKind, RecursiveMode, Watcher as _};
use tokio::sync::mpsc::{self, UnboundedSender};

use crate::Change;

/// How often a source whose parent directory does not exist yet is looked for. A fresh install
/// (no `/etc/mesh-host` yet) waits here; a stat a second costs nothing, where watching every
/// missing ancestor up to `/` would be code for a moment that passes once.
const PARENT_POLL: Duration = Duration::from_secs(1);

/// Watches a declaration source and sends `Change::SourceChanged` each time it has settled after a
/// change. When the source's parent directory does not exist yet, waits for it, then watches
/// and reports the source changed (it now may be there). Where inotify cannot watch it (the
/// user's watches or instances are all in use, shared by every process of the user), the
/// source is looked at every second instead, said once, until a watch can be made: a node
/// short of watches still runs, and still follows its declaration. Ends when the receiver is
/// dropped.
pub fn spawn(
    source: PathBuf,
    quiet: Duration,
    tx: UnboundedSender<Change>,
) -> notify::Result<tokio::task::JoinHandle<()>> {
    let parent = source.parent().unwrap_or(Path::new("/")).to_path_buf();
    if parent.is_dir() {
        return Ok(tokio::spawn(follow(source, quiet, tx)));
    }
    Ok(tokio::spawn(async move {
        let mut tick = tokio::time::interval(PARENT_POLL);
        while !parent.is_dir() {
            if tx.is_closed() {
                return;
            }
            tick.tick().await;
        }
        // Whatever was made with the parent is read now.
        if tx.send(Change::SourceChanged { source: source.clone() }).is_ok() {
            follow(source, quiet, tx).await;
        }
    }))
}

/// How the source is followed: by inotify, or, where a watch cannot be made, by looking.
struct Follower {
    source: PathBuf,
    watcher: Option<notify::RecommendedWatcher>,
    /// Why the source is looked at rather than watched, while it is.
    polled: Option<String>,
}

impl Follower {
    /// Watches the source's parent (its name: made, removed, renamed, written) and, for a
    /// directory, the source itself; where either cannot be, the source is polled.
    fn new(source: PathBuf, raw_tx: &mpsc::UnboundedSender<()>) -> Follower {
        let mut f = Follower { source, watcher: None, polled: None };
        match watcher(&f.source, raw_tx.clone()) {
            Ok(w) => f.watcher = Some(w),
            Err(e) => f.poll_because(e.to_string()),
        }
        f.rewatch();
        f
    }

    /// Makes the watch on a directory source follow what is at its path now. notify drops the
    /// watch itself when the directory is removed or renamed away (its parent reports the name
    /// leaving), and does not add one for a directory that appears, so it is always removed and
    /// added again rather than compared by inode: a directory made again can get the inode
    /// number of the one it replaced. Neither removing a watch nor adding one causes an event,
    /// so this cannot feed itself. A directory there that cannot be watched is polled.
    fn rewatch(&mut self) {
        let Some(watcher) = &mut self.watcher else { return };
        // Not watched (a file source, or a watch notify already dropped) is the usual failure
        // here, and the wanted state either way.
        let _ = watcher.unwatch(&self.source);
        let result = if self.source.is_dir() {
            watcher.watch(&self.source, RecursiveMode::NonRecursive)
        } else {
            Ok(())
        };
        match result {
            Ok(()) => {
                if self.polled.take().is_some() {
                    tracing::info!(source = %self.source.display(), "the declaration is watched again");
                }
            }
            // Removed again since: its parent's watch reports when it is back.
            Err(e) if !self.source.is_dir() => {
                tracing::debug!(source = %self.source.display(), error = %e, "cannot watch the declaration directory yet");
            }
            Err(e) => self.poll_because(e.to_string()),
        }
    }

    /// Tries again to watch a source that is polled: the watcher made anew if there is none,
    /// the directory's own watch added again otherwise. Says nothing while it still fails.
    fn retry(&mut self, raw_tx: &mpsc::UnboundedSender<()>) {
        if self.watcher.is_none() {
            match watcher(&self.source, raw_tx.clone()) {
                Ok(w) => self.watcher = Some(w),
                Err(_) => return,
            }
        }
        self.rewatch();
    }

    fn poll_because(&mut self, why: String) {
        if self.polled.is_none() {
            tracing::warn!(source = %self.source.display(), error = %why, "cannot watch the declaration (inotify): it is looked at every second instead until it can be; raise fs.inotify.max_user_watches or max_user_instances to watch it");
        }
        self.polled = Some(why);
    }
}

/// Follows the source until the receiver is dropped: each change, once the source has been
/// still for `quiet`, is sent as `Change::SourceChanged`. While it is watched nothing here
/// wakes but an event; while it is polled, once a second, and a watch is tried again once a
/// minute.
async fn follow(source: PathBuf, quiet: Duration, tx: UnboundedSender<Change>) {
    let (raw_tx, mut raw_rx) = mpsc::unbounded_channel::<()>();
    let mut f = Follower::new(source.clone(), &raw_tx);
    let mut seen = fingerprint(&source);
    let mut tick = tokio::time::interval(PARENT_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks = 0u32;
    loop {
        tokio::select! {
            event = raw_rx.recv() => if event.is_none() { return },
            _ = tick.tick(), if f.polled.is_some() => {
                if tx.is_closed() {
                    return;
                }
                ticks = ticks.wrapping_add(1);
                if ticks % RETRY_WATCH_TICKS == 0 {
                    f.retry(&raw_tx);
                }
                if fingerprint(&source) == seen {
                    continue;
                }
            }
        }
        // Wait for quiet: every further event, or while polled every change seen, restarts the
        // wait.
        loop {
            let before = f.polled.is_some().then(|| fingerprint(&source));
            match tokio::time::timeout(quiet, raw_rx.recv()).await {
                Ok(Some(())) => continue,
                Ok(None) => return,
                Err(_) if before.is_some_and(|b| b != fingerprint(&source)) => continue,
                Err(_) => break,
            }
        }
        // Before the controller is told, so that a file written in the new directory after
        // its read is seen, and one written before is in what it reads.
        f.rewatch();
        seen = fingerprint(&source);
        if tx.send(Change::SourceChanged { source: source.clone() }).is_err() {
            return;
        }
    }
}

/// While polled, how many seconds between attempts to watch the source again.
const RETRY_WATCH_TICKS: u32 = 60;

/// The inotify watcher on the source's parent, reporting the source's own events.
fn watcher(source: &Path, raw_tx: mpsc::UnboundedSender<()>) -> notify::Result<notify::RecommendedWatcher> {
    let parent = source.parent().unwrap_or(Path::new("/")).to_path_buf();
    let target = source.to_path_buf();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<Event>| {
        let Ok(event) = res else {
            let _ = raw_tx.send(());
            return;
        };
        // Opens and reads are not changes, and the controller's own reads of the source would
        // otherwise trigger the next read.
        if matches!(event.kind, EventKind::Access(_)) {
            return;
        }
        // The source itself (its name in the parent: made, removed, renamed, written) or
        // anything in it. `starts_with` compares whole components, so a neighbour such as
        // `declaration.d.new` is not taken for the source.
        if event.need_rescan() || event.paths.iter().any(|p| p.starts_with(&target)) {
            let _ = raw_tx.send(());
        }
    })?;
    watcher.watch(&parent, RecursiveMode::NonRecursive)?;
    Ok(watcher)
}

/// What polling compares: the source's identity and times, and for a directory those of each
/// entry, by name. A write, a rename over, a new or removed file all change it.
fn fingerprint(source: &Path) -> Vec<(std::ffi::OsString, u64, i64, i64, i64, i64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    let of = |name: std::ffi::OsString, m: &std::fs::Metadata| {
        (name, m.ino(), m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec(), m.size())
    };
    let Ok(meta) = std::fs::symlink_metadata(source) else { return Vec::new() };
    let mut all = vec![of(std::ffi::OsString::new(), &meta)];
    if meta.is_dir() {
        if let Ok(entries) = std::fs::read_dir(source) {
            for e in entries.flatten() {
                if let Ok(m) = e.metadata() {
                    all.push(of(e.file_name(), &m));
                }
            }
        }
        all.sort();
    }
    all
}
