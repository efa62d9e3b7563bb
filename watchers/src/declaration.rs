//! The declaration's files: a file, or a directory of `*.json` files. Their bytes are handed
//! over only once they have settled (no event for a quiet period), so a declaration being
//! written is not read half-way. What the bytes mean is the controller's business: a reader that
//! still gets a torn file (a writer pausing longer than the quiet period) hands it to a parser
//! that refuses it whole.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{Event, EventKind, RecursiveMode, Watcher as _};
use tokio::sync::mpsc::{self, UnboundedSender};

use crate::Change;

/// The files of a declaration source, read now: the file itself, or every `*.json` in the
/// directory (not hidden), sorted by name.
pub fn read_source(source: &Path) -> std::io::Result<Vec<(PathBuf, Vec<u8>)>> {
    if source.is_dir() {
        let mut names: Vec<PathBuf> = std::fs::read_dir(source)?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.extension().is_some_and(|e| e == "json")
                    && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'))
                    && p.is_file()
            })
            .collect();
        names.sort();
        names.into_iter().map(|p| std::fs::read(&p).map(|b| (p, b))).collect()
    } else {
        Ok(vec![(source.to_path_buf(), std::fs::read(source)?)])
    }
}

/// Watches a declaration source and sends `Change::Settled` with its files each time they
/// have settled after a change. Ends when the receiver is dropped.
pub fn spawn(
    source: PathBuf,
    quiet: Duration,
    tx: UnboundedSender<Change>,
) -> notify::Result<tokio::task::JoinHandle<()>> {
    let (raw_tx, mut raw_rx) = mpsc::unbounded_channel::<()>();
    let is_dir = source.is_dir();
    let watch_dir =
        if is_dir { source.clone() } else { source.parent().unwrap_or(Path::new("/")).to_path_buf() };
    let target = source.clone();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<Event>| {
        let Ok(event) = res else {
            let _ = raw_tx.send(());
            return;
        };
        if matches!(event.kind, EventKind::Access(_)) {
            return;
        }
        let relevant = event.need_rescan()
            || event.paths.iter().any(|p| if is_dir { p.starts_with(&target) } else { *p == target });
        if relevant {
            let _ = raw_tx.send(());
        }
    })?;
    watcher.watch(&watch_dir, RecursiveMode::NonRecursive)?;
    Ok(tokio::spawn(async move {
        // The watcher lives as long as this task.
        let _watcher = watcher;
        while raw_rx.recv().await.is_some() {
            // Wait for quiet: every further event restarts the wait.
            loop {
                match tokio::time::timeout(quiet, raw_rx.recv()).await {
                    Ok(Some(())) => continue,
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            match read_source(&source) {
                Ok(files) => {
                    if tx.send(Change::Settled { files }).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(source = %source.display(), error = %e, "cannot read the declaration source")
                }
            }
        }
    }))
}
