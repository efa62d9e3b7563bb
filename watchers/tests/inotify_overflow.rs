//! The file watcher's inotify overflow, in a test binary of its own: it lowers the machine-wide
//! `fs.inotify.max_queued_events`, and every inotify instance made while it is low (another
//! test's watcher, a daemon a test started) gets the tiny queue too and resyncs for nothing.
//! `cargo test` runs test binaries one after another, so nothing of this suite runs beside it
//! there; under nextest, `.config/nextest.toml` gives it every test thread (and a test group of
//! its own), so nothing runs beside it either.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use mesh_host_watchers::{Change, FileWatcher};
use tokio::sync::mpsc;

const KNOB: &str = "/proc/sys/fs/inotify/max_queued_events";

/// Sets the sysctl, and puts the value it found back when dropped: at the end of the window, or
/// when the test panics inside it, so a failure does not leave the machine with a 1-event queue
/// for every inotify instance made afterwards.
struct Lowered {
    before: String,
}

impl Lowered {
    fn to(value: &str) -> Lowered {
        let before = std::fs::read_to_string(KNOB).expect("the inotify sysctl is readable (Linux)");
        std::fs::write(KNOB, value).expect("tests run as root, able to set fs.inotify.max_queued_events");
        Lowered { before: before.trim().to_owned() }
    }
}

impl Drop for Lowered {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(KNOB, &self.before) {
            // Not a panic: one during an unwind aborts, and the message would be lost.
            eprintln!("cannot restore {KNOB} to {}: {e}; set it by hand", self.before);
        }
    }
}

/// The kernel's queue for one inotify instance is sized when the instance is made, from
/// `fs.inotify.max_queued_events`. The test makes a watcher while the limit is tiny, restores
/// it at once, and floods the watcher: the overflow must come out as a resync.
#[tokio::test]
async fn an_inotify_overflow_is_reported_as_a_resync() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("flood");
    let (tx, mut rx) = mpsc::unbounded_channel();
    // One event: each write is a modify and a close, so nearly every write overflows it. With
    // eight, a reader that kept up with the flood (as it did after its lookups got cheaper)
    // saw no overflow in 20,000 writes about one run in eight.
    let lowered = Lowered::to("1");
    let mut w = FileWatcher::new(tx);
    w.set_paths([f.clone()]);
    drop(lowered);
    assert_eq!(w.no_instance(), None, "the watcher has its inotify instance");
    // Batches of writes until the watcher says it lost events; each batch overflows the queue
    // unless the watcher thread happens to keep up with it.
    for batch in 0..100 {
        for i in 0..200 {
            std::fs::write(dir.path().join(format!("n{}", (batch + i) % 50)), "x").unwrap();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        while let Ok(change) = rx.try_recv() {
            if change == (Change::Resynced { watcher: mesh_host_watchers::Watcher::File }) {
                return;
            }
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(Change::Resynced { watcher: mesh_host_watchers::Watcher::File })) => break,
            Ok(Some(_)) => continue,
            _ => panic!("no resync after flooding a 1-event queue"),
        }
    }
}
