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
use tokio::time::Instant;

use crate::Change;

/// How often a source whose parent directory does not exist yet is looked for. A fresh install
/// (no `/etc/mesh-host` yet) waits here; a stat a second costs nothing, where watching every
/// missing ancestor up to `/` would be code for a moment that passes once.
const PARENT_POLL: Duration = Duration::from_secs(1);

/// How often a watcher that could not be made for want of an inotify instance is tried again.
const INSTANCE_RETRY: Duration = Duration::from_secs(10);

/// Watches declaration sources, all on one inotify instance, and sends
/// `Change::SourceChanged` for one each time it has settled after a change (each settles on its
/// own). A source whose parent directory does not exist yet is waited for, then watched and
/// reported changed (it now may be there). Fails when a parent exists and cannot be watched.
/// Ends when the receiver is dropped.
///
/// When no inotify instance can be made (the user's instances, or this process's descriptors,
/// all taken), it says so (naming both limits), tries again every 10 s, and once
/// it has one reports every source changed, for what moved meanwhile; the controller's resync
/// reads the sources in between.
///
/// One instance for every source, not one each: inotify instances are counted per user
/// (`fs.inotify.max_user_instances`, 128 by default) across every process of that user, and for
/// root that is systemd, udev, every container's processes and this agent together.
pub fn spawn(
    sources: Vec<PathBuf>,
    quiet: Duration,
    tx: UnboundedSender<Change>,
) -> notify::Result<tokio::task::JoinHandle<()>> {
    let watched = match Watched::make(&sources) {
        Ok(w) => w,
        Err(Unmade::NoInstance(e)) => {
            tracing::warn!(
                error = %e,
                "cannot watch the declaration: tried again every {} s; until then it is read at each resync",
                INSTANCE_RETRY.as_secs()
            );
            return Ok(tokio::spawn(async move {
                loop {
                    tokio::time::sleep(INSTANCE_RETRY).await;
                    if tx.is_closed() {
                        return;
                    }
                    // A parent that cannot be watched for another reason is tried again too:
                    // there is no caller left to fail to.
                    let Ok(watched) = Watched::make(&sources) else { continue };
                    tracing::info!("the declaration is watched again");
                    for source in &sources {
                        if tx.send(Change::SourceChanged { source: source.clone() }).is_err() {
                            return;
                        }
                    }
                    return watched.follow(sources, quiet, tx).await;
                }
            }));
        }
        Err(Unmade::Watch(e)) => return Err(e),
    };
    Ok(tokio::spawn(watched.follow(sources, quiet, tx)))
}

/// Why a watcher could not be made.
enum Unmade {
    /// For want of an inotify instance (or of a descriptor), said with the limits behind it.
    NoInstance(notify::Error),
    /// Anything else: a parent that cannot be watched.
    Watch(notify::Error),
}

/// One watcher for every source, with what it has seen and which parents are not there yet.
struct Watched {
    watcher: notify::RecommendedWatcher,
    raw_rx: mpsc::UnboundedReceiver<usize>,
    /// Sources whose parent is not there yet.
    waiting: Vec<bool>,
}

fn parent_of(source: &Path) -> PathBuf {
    source.parent().unwrap_or(Path::new("/")).to_path_buf()
}

impl Watched {
    fn make(sources: &[PathBuf]) -> Result<Watched, Unmade> {
        let (raw_tx, raw_rx) = mpsc::unbounded_channel::<usize>();
        let targets = sources.to_vec();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<Event>| {
            let Ok(event) = res else {
                for i in 0..targets.len() {
                    let _ = raw_tx.send(i);
                }
                return;
            };
            // Opens and reads are not changes, and the controller's own reads of a source would
            // otherwise trigger the next read.
            if matches!(event.kind, EventKind::Access(_)) {
                return;
            }
            // A source itself (its name in the parent: made, removed, renamed, written) or
            // anything in it. `starts_with` compares whole components, so a neighbour such as
            // `declaration.d.new` is not taken for the source.
            for (i, target) in targets.iter().enumerate() {
                if event.need_rescan() || event.paths.iter().any(|p| p.starts_with(target)) {
                    let _ = raw_tx.send(i);
                }
            }
        })
        .map_err(|e| match e.kind {
            notify::ErrorKind::Io(io) if matches!(io.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                Unmade::NoInstance(notify::Error::io(crate::file::instance_said(io)))
            }
            _ => Unmade::Watch(e),
        })?;
        let mut waiting = vec![false; sources.len()];
        for (i, source) in sources.iter().enumerate() {
            let parent = parent_of(source);
            if parent.is_dir() {
                watcher.watch(&parent, RecursiveMode::NonRecursive).map_err(Unmade::Watch)?;
                rewatch(&mut watcher, source);
            } else {
                waiting[i] = true;
            }
        }
        Ok(Watched { watcher, raw_rx, waiting })
    }

    /// Reports each source as it settles, until the receiver is dropped.
    async fn follow(self, sources: Vec<PathBuf>, quiet: Duration, tx: UnboundedSender<Change>) {
        let Watched { mut watcher, mut raw_rx, mut waiting } = self;
        // When each source that moved is due to be reported: every further event restarts its
        // wait for quiet.
        let mut due: Vec<Option<Instant>> = vec![None; sources.len()];
        let mut poll = tokio::time::interval(PARENT_POLL);
        loop {
            let next = due.iter().flatten().min().copied();
            tokio::select! {
                moved = raw_rx.recv() => {
                    // The sender lives in the watcher, which lives here: never `None`.
                    let Some(i) = moved else { return };
                    due[i] = Some(Instant::now() + quiet);
                }
                () = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                    let now = Instant::now();
                    for (i, source) in sources.iter().enumerate() {
                        if due[i].is_some_and(|at| at <= now) {
                            due[i] = None;
                            // Before the controller is told, so that a file written in the new
                            // directory after its read is seen, and one written before is in
                            // what it reads.
                            rewatch(&mut watcher, source);
                            if tx.send(Change::SourceChanged { source: source.clone() }).is_err() {
                                return;
                            }
                        }
                    }
                }
                _ = poll.tick(), if waiting.contains(&true) => {
                    if tx.is_closed() {
                        return;
                    }
                    for (i, source) in sources.iter().enumerate() {
                        let parent = parent_of(source);
                        if !waiting[i] || !parent.is_dir() {
                            continue;
                        }
                        waiting[i] = false;
                        match watcher.watch(&parent, RecursiveMode::NonRecursive) {
                            Ok(()) => {
                                rewatch(&mut watcher, source);
                                // Whatever was made with the parent is read now.
                                if tx.send(Change::SourceChanged { source: source.clone() }).is_err() {
                                    return;
                                }
                            }
                            // The full resync reads the source anyway; it is only no longer
                            // watched.
                            Err(e) => tracing::warn!(
                                source = %source.display(), error = %e,
                                "cannot watch the declaration; it is read again at each resync"
                            ),
                        }
                    }
                }
            }
        }
    }
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
