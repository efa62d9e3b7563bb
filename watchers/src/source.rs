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
/// and reports the source changed (it now may be there). Fails when the parent exists and cannot
/// be watched. Ends when the receiver is dropped.
pub fn spawn(
    source: PathBuf,
    quiet: Duration,
    tx: UnboundedSender<Change>,
) -> notify::Result<tokio::task::JoinHandle<()>> {
    let parent = source.parent().unwrap_or(Path::new("/")).to_path_buf();
    if parent.is_dir() {
        return watch(source, quiet, tx);
    }
    Ok(tokio::spawn(async move {
        let mut tick = tokio::time::interval(PARENT_POLL);
        while !parent.is_dir() {
            if tx.is_closed() {
                return;
            }
            tick.tick().await;
        }
        match watch(source.clone(), quiet, tx.clone()) {
            Ok(task) => {
                // Whatever was made with the parent is read now.
                if tx.send(Change::SourceChanged { source }).is_ok() {
                    let _ = task.await;
                }
            }
            // The full resync reads the source anyway; it is only no longer watched.
            Err(e) => {
                tracing::warn!(source = %source.display(), error = %e, "cannot watch the declaration; it is read again at each resync")
            }
        }
    }))
}

fn watch(
    source: PathBuf,
    quiet: Duration,
    tx: UnboundedSender<Change>,
) -> notify::Result<tokio::task::JoinHandle<()>> {
    let (raw_tx, mut raw_rx) = mpsc::unbounded_channel::<()>();
    let parent = source.parent().unwrap_or(Path::new("/")).to_path_buf();
    let target = source.clone();
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
    rewatch(&mut watcher, &source);
    Ok(tokio::spawn(async move {
        while raw_rx.recv().await.is_some() {
            // Wait for quiet: every further event restarts the wait.
            loop {
                match tokio::time::timeout(quiet, raw_rx.recv()).await {
                    Ok(Some(())) => continue,
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            // Before the controller is told, so that a file written in the new directory after
            // its read is seen, and one written before is in what it reads.
            rewatch(&mut watcher, &source);
            if tx.send(Change::SourceChanged { source: source.clone() }).is_err() {
                return;
            }
        }
    }))
}

/// Makes the watch on a directory source follow what is at its path now. notify drops the watch
/// itself when the directory is removed or renamed away (its parent reports the name leaving),
/// and does not add one for a directory that appears, so it is always removed and added again
/// rather than compared by inode: a directory made again can get the inode number of the one it
/// replaced. Neither removing a watch nor adding one causes an event, so this cannot feed itself.
fn rewatch(watcher: &mut notify::RecommendedWatcher, source: &Path) {
    // Not watched (a file source, or a watch notify already dropped) is the usual failure here,
    // and the wanted state either way.
    let _ = watcher.unwatch(source);
    if source.is_dir() {
        if let Err(e) = watcher.watch(source, RecursiveMode::NonRecursive) {
            // Removed again since: its parent's watch reports when it is back.
            tracing::debug!(source = %source.display(), error = %e, "cannot watch the declaration directory yet");
        }
    }
}
